"""Pure policy core shared verbatim by the Ray runtime and the simulator (DESIGN.md, "Layers").

Events in, actions out; the caller passes `now`. No torch, ray, asyncio, clock reads or global
random state (tests/policy/test_purity.py imports this package with those blocked).

  split.py       Split(rollout, train), all_splits
  cost.py        CostModel / CostConfig: decode, prefill, train, weight sync, resize phases;
                 instance_finish_times (continuous-batching kernel)
  allocator.py   allocate(): initial split and batch cap (StreamRL §4.2); predict_step()
  controller.py  ResizeController / StaticSplit .observe(StepObservation) -> Decision
                 (DynaResize §3.4); both satisfy the ResizePolicy protocol
  dispatch.py    round_robin / random / least_loaded / skew_aware dispatchers (StreamRL §5.3)
  rankers.py     oracle / random / history / learned length rankers, recall_at (StreamRL §5.2)
  pipeline.py    weights_version (staleness rule), micro_batch_of (canonical micro-batches)
"""

from poise.policy.allocator import Allocation, StepPrediction, StepWorkload, allocate, predict_step
from poise.policy.controller import (NO_HYSTERESIS, ControllerConfig, Decision, ResizeController,
                                     ResizePolicy, StaticSplit, StepObservation)
from poise.policy.cost import CostConfig, CostModel, ResizeCost, instance_finish_times
from poise.policy.dispatch import (DispatchPlan, Dispatcher, InstanceInfo, LeastLoadedDispatcher,
                                   RandomDispatcher, RoundRobinDispatcher, SkewAwareDispatcher,
                                   make_dispatcher)
from poise.policy.rankers import (Finished, HistoryRanker, LearnedRanker, LengthRanker,
                                  OracleRanker, Prompt, RandomRanker, make_ranker, recall_at)
from poise.policy.pipeline import micro_batch_of, weights_version
from poise.policy.split import Split, all_splits

__all__ = [
    "Allocation", "StepPrediction", "StepWorkload", "allocate", "predict_step",
    "NO_HYSTERESIS", "ControllerConfig", "Decision", "ResizeController", "ResizePolicy",
    "StaticSplit", "StepObservation",
    "CostConfig", "CostModel", "ResizeCost", "instance_finish_times",
    "DispatchPlan", "Dispatcher", "InstanceInfo", "LeastLoadedDispatcher", "RandomDispatcher",
    "RoundRobinDispatcher", "SkewAwareDispatcher", "make_dispatcher",
    "Finished", "HistoryRanker", "LearnedRanker", "LengthRanker", "OracleRanker", "Prompt",
    "RandomRanker", "make_ranker", "recall_at", "Split", "all_splits", "micro_batch_of",
    "weights_version",
]
