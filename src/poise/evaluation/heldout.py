"""The held-out problems of a run, their requests and their metrics. Torch-free.

Problems: the first `eval.problems` rows of `eval.dataset` (a DatasetDict's test or validation split), of
a dataset run's own DatasetDict's test or validation split, or problems of the built-in tasks drawn
from a seed of their own, the mix of training's last phase, keeping only prompts that no training
pool holds (training never sees them). Requests: greedy response j=0, sampled responses j=1..k, all
with ids `(-1 - version, prompt index, j)`, which no training sample has (training's steps are >= 0).
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

from poise.config import DataConfig, EvalConfig, ModelConfig, SamplingConfig
from poise.data.prompts import TaskSteps, engine_context, fit_hint, fitted_context
from poise.data.tasks import Problem, TaskSource, derive_seed, make_problem
from poise.errors import ConfigError, DataError, PoiseError
from poise.rewards.scorer import RewardResult, RewardScorer, reward_metrics
from poise.types import Request, Sample, SampleId

DRAWS_PER_PROBLEM = 200  # the built-in pool: give up (one line) after this many draws per problem asked


def eval_sample_id(version: int, prompt_index: int, j: int) -> SampleId:
    """The id of held-out response j to problem `prompt_index` under weights `version`: its step
    field is negative, so it never equals a training sample's id, nor its sampling randomness."""
    return (-1 - version, prompt_index, j)


def load_heldout(eval_cfg: EvalConfig, data: DataConfig, seed: int) -> list[Problem]:
    """The held-out problems; a missing file, a row without data.prompt_key/answer_key, a dataset run
    without held-out rows or a pool too small to hold them fails here with one line (before any work)."""
    from poise.data.dataset import HELD_OUT_SPLITS, held_out_split, load_dataset

    if eval_cfg.dataset is None and data.dataset is not None:  # the built-in problems are another task
        split = held_out_split(data.dataset)
        if split is None:
            raise PoiseError(f"data.dataset '{data.dataset}' is this run's task and eval.dataset names no held-out "
                             "rows of it (the built-in problems are another task); name a file of held-out rows with "
                             "the same columns: poise eval --data PATH, or eval.dataset=PATH")
        rows = load_dataset(data.dataset, data.prompt_key, data.answer_key, (split,))
        return rows[:eval_cfg.problems] if eval_cfg.problems else rows
    if eval_cfg.dataset is not None:
        if not Path(eval_cfg.dataset).exists():
            raise PoiseError(f"eval.dataset '{eval_cfg.dataset}' does not exist; name a .jsonl or .parquet file or "
                             "a `datasets` save_to_disk directory of held-out rows, or set eval.every=0")
        try:
            rows = load_dataset(eval_cfg.dataset, data.prompt_key, data.answer_key, HELD_OUT_SPLITS)
        except PoiseError as e:
            raise type(e)(f"eval.dataset: {e}") from None
        return rows[:eval_cfg.problems] if eval_cfg.problems else rows
    if eval_cfg.problems < 1:
        raise ConfigError("eval.problems", eval_cfg.problems, "must be >= 1 for the built-in tasks")
    training = TaskSource(seed, data.phases or None, data.pool_size)
    seen = {p.prompt for i in range(len(training.phases)) for p in training.pool(i)}
    mix = training.phases[-1].mix
    names = sorted(mix)
    weights = [mix[n] for n in names]
    rng = random.Random(derive_seed("eval-pool", seed))
    out: list[Problem] = []
    for _ in range(DRAWS_PER_PROBLEM * eval_cfg.problems):
        p = make_problem(rng.choices(names, weights)[0], rng, f"e-{len(out):06d}")
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
            if len(out) == eval_cfg.problems:
                return out
    raise ConfigError("eval.problems", eval_cfg.problems,
                      f"only {len(out)} problems of the built-in mix {dict(mix)} are outside the training pool; "
                      "ask for fewer, or hold out an eval.dataset")


class HeldOut:
    """The held-out problems with their prompt ids and reward scoring (the run's reward sandbox)."""

    def __init__(self, eval_cfg: EvalConfig, data: DataConfig, model: ModelConfig, seed: int,
                 rewards: RewardScorer | None, problems: list[Problem] | None = None):
        self.cfg = eval_cfg
        self.problems = problems if problems is not None else load_heldout(eval_cfg, data, seed)
        # the tokenizer, prompt encoding and scoring of training's source; its own prompts are not used
        self.steps = TaskSteps(dataclasses.replace(data, dataset=None), model, seed, 1, rewards)
        self.prompt_ids = [self.steps.prompt_ids(p) for p in self.problems]

    def check_fit(self, model: ModelConfig, max_context: int, max_new_tokens: int) -> None:
        """Every held-out prompt plus a full response fits in the engine's context (before any work)."""
        context = engine_context(model, max_context)
        if context is None:
            return
        for p, ids in zip(self.problems, self.prompt_ids):
            if len(ids) + max_new_tokens > context:
                raise DataError(f"eval.dataset {p.origin or p.uid}: prompt of {len(ids)} tokens + "
                                f"algorithm.sampling.max_new_tokens ({max_new_tokens}) exceeds the context of "
                                f"{context} tokens; {fit_hint(context, engine_context(model, 0))}")

    def due(self, step: int, steps: int) -> bool:
        """Evaluate after step `step` (0-based) of a run of `steps`: every eval.every and after the last."""
        every = self.cfg.every
        return bool(every) and ((step + 1) % every == 0 or step + 1 == steps)

    def requests(self, version: int) -> tuple[list[Request], list[Request]]:
        """(greedy, sampled) requests of the evaluation of weights `version`."""
        greedy = [Request(eval_sample_id(version, i, 0), ids) for i, ids in enumerate(self.prompt_ids)] \
            if self.cfg.greedy else []
        sampled = [Request(eval_sample_id(version, i, j), ids) for i, ids in enumerate(self.prompt_ids)
                   for j in range(1, self.cfg.k + 1)]
        return greedy, sampled

    def context(self, model: ModelConfig, max_context: int, sampling: SamplingConfig) -> int:
        """The eval engines' context: what the held-out prompts need (as training's engine is sized)."""
        return fitted_context(model, max_context, max(map(len, self.prompt_ids)), sampling.max_new_tokens)

    def metrics(self, samples: list[Sample], seconds_from: float) -> dict:
        """`{"eval": {...}}` of one evaluation: per mode (greedy, sampled) the mean reward, each reward
        function's mean, the pass rate and the response length; pass@k over each problem's k samples."""
        samples = sorted(samples, key=lambda s: s.sample_id)
        results = self.steps.submit_scores(self.problems, samples).result() if samples else []
        by_mode: dict[str, list[tuple[Sample, RewardResult]]] = {"greedy": [], "sampled": []}
        for s, r in zip(samples, results):
            by_mode["greedy" if s.sample_id[2] == 0 else "sampled"].append((s, r))
        out: dict = {"problems": len(self.problems), "version": -1 - samples[0].sample_id[0] if samples else None}
        for mode, pairs in by_mode.items():
            if not pairs:
                continue
            values = [r.value for _, r in pairs]
            out[mode] = {"reward_mean": sum(values) / len(values),
                         "pass_rate": sum(v >= self.cfg.pass_threshold for v in values) / len(values),
                         "response_len_mean": sum(len(s.token_ids) for s, _ in pairs) / len(pairs),
                         **reward_metrics(r for _, r in pairs)}
        if by_mode["sampled"]:
            passed = {s.sample_id[1] for s, r in by_mode["sampled"] if r.value >= self.cfg.pass_threshold}
            out[f"pass@{self.cfg.k}"] = len(passed) / len(self.problems)
        out["seconds"] = time.perf_counter() - seconds_from
        return {"eval": out}


__all__ = ["HeldOut", "load_heldout", "eval_sample_id"]
