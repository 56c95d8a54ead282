"""Held-out evaluation on the rollout devices, between steps (poise.evaluation).

After step k's weights (version k+1) reached every rollout device, the held-out requests are split
over the rollout devices by prompt index and each device answers its share with engines of its own
(`Device.evaluate`); the rewards come from the run's reward sandbox. Which device runs a request
changes no token (ids of their own, batch-invariant decoding), so the numbers are the colocated
loop's, and training's samples and updates are those of a run without evaluation.
"""

from __future__ import annotations

import dataclasses
import time

from poise.config import TrainConfig
from poise.errors import PoiseError
from poise.evaluation.heldout import HeldOut
from poise.runtime import faults


class RolloutEvaluation:
    """`eval.every`: the run's held-out problems, evaluated on the rollout devices of `rt`."""

    def __init__(self, cfg: TrainConfig, heldout: HeldOut):
        self.heldout = heldout
        self.steps, self.sampling, self.timeout_s = cfg.run.steps, cfg.algorithm.sampling, cfg.cluster.step_timeout_s
        self.rollout = dataclasses.replace(cfg.rollout, max_context=heldout.context(
            cfg.model, cfg.rollout.max_context, cfg.algorithm.sampling))

    @classmethod
    def of(cls, cfg: TrainConfig, source) -> "RolloutEvaluation | None":
        """The run's evaluation (None with eval.every=0); `source`: its data.prompts.TaskSteps."""
        if not cfg.eval.every:
            return None
        return cls(cfg, HeldOut(cfg.eval, cfg.data, cfg.model, cfg.run.seed, source.rewards))

    def after_step(self, rt, step: int, version: int) -> dict:
        """`{"eval": ...}` of weights `version` (made by step `step`) when eval.every says so, else {}."""
        if not self.heldout.due(step, self.steps):
            return {}
        t = time.perf_counter()
        greedy, sampled = self.heldout.requests(version)
        ranks = list(rt.rollout_ranks)
        share = lambda requests, n: [r for r in requests if r.sample_id[1] % len(ranks) == n]  # noqa: E731
        parts = faults.wait([rt.workers[d].evaluate.remote(share(greedy, n), share(sampled, n), self.rollout,
                                                           self.sampling) for n, d in enumerate(ranks)],
                            ranks, f"held-out evaluation after step {step}", self.timeout_s, rt)
        samples = [s for part in parts for s in part]
        stale = sorted({s.weights_version for s in samples} - {version})
        if stale:  # the sync of this step's weights must be done on every rollout device
            raise PoiseError(f"held-out evaluation after step {step} ran on weights versions {stale}, not {version}")
        return self.heldout.metrics(samples, t)
