"""Pure policy core shared verbatim by the Ray runtime and the simulator (docs/design.md, "Layers").

Events in, actions out; the caller passes `now`. No torch, ray, asyncio, clock reads or global
random state (tests/policy/test_purity.py imports this package with those blocked).

  split.py       Split(rollout, train), all_splits
  cost.py        CostModel / CostConfig: decode, prefill, train, weight sync, resize phases;
                 ContinuousBatch (the continuous-batching kernel), instance_finish_times
  turns.py       EpisodeWork, episode_times: multi-turn episodes on continuous batching, the slot
                 freed during environment waits (refill) or held (the naive scheme)
  allocator.py   allocate(): initial split and batch cap (StreamRL §4.2); predict_step();
                 plan_devices(): per-type split for a budget, by throughput per dollar (§7.3)
  devices.py     DeviceType (presets h20, h800, h100, a100), Link, Fleet: device types, groups
                 (datacenters) and links; Fleet.place prices each role on its type
  decision.py    Decision: a controller's hold or move after a step, with its reason and estimate
  hysteresis.py  Hysteresis: the cooldown and consecutive-signal rules both controllers apply
  controller.py  ResizeController / StaticSplit .observe(StepObservation) -> ResizeDecision
                 (DynaResize §3.4); both satisfy the ResizePolicy protocol
  scale.py       ScaleController / ScheduledJoins / StaticPool .observe(ScaleObservation, now)
                 -> ScaleDecision: reserve devices join as rollout instances (StreamRL §4.2)
  dispatch.py    DispatchConfig, build_dispatch: round_robin / random / least_loaded / skew_aware
                 dispatchers of prompt groups (StreamRL §5.3)
  rankers.py     oracle / random / history / learned length rankers, recall_at (StreamRL §5.2)
  pipeline.py    PipelineConfig, pipeline_kind, weights_version (staleness rule)
  plan.py        plan_step: a step's sample ids, mini- and micro-batches, owners, normaliser, stats
  mismatch.py    MismatchStats: the rollout/trainer log-prob mismatch as sums and a fixed-grid
                 histogram of the log-ratio, the same bits however micro-batches are split
  seeds.py       stable_seed: named sub-seeds

The sections these objects take (PipelineConfig, DispatchConfig, ResizeConfig, ControllerConfig,
ScaleConfig) and `Split` are the config layer's (poise.config.policy, poise.config.split): the
modules here import them from there, a layer down.
"""

from poise.policy.allocator import (Allocation, DevicePlan, DeviceSplit, StepPrediction, StepWorkload, allocate,
                                    plan_devices, predict_step)
from poise.policy.devices import PRESETS, DeviceType, Fleet, Link
from poise.policy.controller import (NO_HYSTERESIS, ControllerConfig, ResizeController, ResizeDecision,
                                     ResizeEstimate, ResizePolicy, StaticSplit, StepObservation)
from poise.policy.decision import Decision
from poise.policy.cost import CostConfig, CostModel, ContinuousBatch, ResizeCost, instance_finish_times
from poise.policy.dispatch import (DispatchConfig, DispatchPlan, Dispatcher, InstanceInfo, LeastLoadedDispatcher,
                                   RandomDispatcher, RoundRobinDispatcher, SkewAwareDispatcher,
                                   build_dispatch, make_dispatcher)
from poise.policy.rankers import (Finished, HistoryRanker, LearnedRanker, LengthRanker,
                                  OracleRanker, Prompt, RandomRanker, make_ranker, recall_at)
from poise.policy.pipeline import PipelineConfig, pipeline_kind, weights_version
from poise.policy.scale import (ScaleConfig, ScaleController, ScaleDecision, ScaleEstimate, ScaleObservation,
                                ScalePolicy, ScheduledJoins, StaticPool, make_scale_policy)
from poise.policy.plan import MiniBatch, MicroStats, StepPlan, plan_step, step_stats
from poise.policy.split import Split, all_splits
from poise.policy.turns import EpisodeTimes, EpisodeWork, episode_times

__all__ = [
    "DevicePlan", "DeviceSplit", "plan_devices", "PRESETS", "DeviceType", "Fleet", "Link",
    "Allocation", "StepPrediction", "StepWorkload", "allocate", "predict_step",
    "NO_HYSTERESIS", "ControllerConfig", "Decision", "ResizeController", "ResizeDecision", "ResizeEstimate",
    "ResizePolicy", "StaticSplit", "StepObservation",
    "CostConfig", "CostModel", "ContinuousBatch", "ResizeCost", "instance_finish_times",
    "DispatchConfig", "DispatchPlan", "Dispatcher", "InstanceInfo", "LeastLoadedDispatcher", "RandomDispatcher",
    "RoundRobinDispatcher", "SkewAwareDispatcher", "build_dispatch", "make_dispatcher",
    "Finished", "HistoryRanker", "LearnedRanker", "LengthRanker", "OracleRanker", "Prompt",
    "RandomRanker", "make_ranker", "recall_at", "Split", "all_splits",
    "PipelineConfig", "pipeline_kind", "weights_version",
    "ScaleConfig", "ScaleController", "ScaleDecision", "ScaleEstimate", "ScaleObservation", "ScalePolicy",
    "ScheduledJoins", "StaticPool", "make_scale_policy",
    "MiniBatch", "MicroStats", "StepPlan", "plan_step", "step_stats",
    "EpisodeTimes", "EpisodeWork", "episode_times",
]
