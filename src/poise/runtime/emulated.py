"""Emulated compute (`cluster.compute: emulated`): the real runtime with its compute replaced by
sleeps priced by the cost model, so 16-64 devices run on a 2-core machine (docs/design.md, "Emulated
compute").

Everything that is control plane stays real: the worker actors and the placement group, the
stream generation service with its dispatcher and per-instance caps, the poll/submit RPCs,
the trainer group's ledger, canonical micro-batches, contiguous ranges and normaliser, the
update and sync fan-outs and the driver loop. What a device would compute is a sleep:

    EmulatedEngine   continuous batching over `num_slots` slots, stepped by the simulator's
                     kernel (`policy.cost.ContinuousBatch`): an admission sleeps its prefill, the
                     live batch sleeps the decode up to the next finish; output lengths come from
                     the scenario workload by sample id.
    EmulatedTrainShard  a micro-batch sleeps `cost.train_compute_s(tokens, 1)` (one data-parallel
                     device holds it), an update `cost.train_fixed_s(train devices)`.
    EmulatedSync     a weight sync sleeps `cost.sync_s()`.
    Emulation        the driver's side: the scenario's prompts, prompt sizes and rewards, the
                     config's dispatch policy and ranker (`build_dispatch`, as the simulator
                     builds them), and the split the allocator picks for it. Partial rollouts'
                     over-provisioned groups are the simulator's extra groups (`draws`).

Sleeps are cost-model seconds times `emulation.time_scale`, so a run's wall times divided by the
scale are directly comparable with `poise simulate` of the same scenario (the simulator is linear
in the costs; its allocator and dispatcher choices do not change when every cost is scaled).

Departures, each on purpose:
- One sleep per finish event, not one per token: the engine sleeps the whole decode segment
  between two finishes (`decode_segment_s`, the exact sum of `decode_step_s` over those steps for
  the linear model). Thousands of sub-millisecond sleeps would measure the OS timer, not the
  control plane; finishes and slot refills still land on the same decode step as token by token,
  which is the only point where the real engine hands a sample out or admits a request.
- Weight sync is a sleep of `cost.sync_s()` plus the real fan-out and barrier over the leader and
  every rollout worker; no tensor moves. A tiny gloo broadcast between CPU processes on one
  2-core host would price nothing a real interconnect does, and would make every emulated
  worker join a torch.distributed world (a 16-64 process rendezvous) for no information. The
  weights version still travels with the sync call and is stamped on every later sample, and an
  engine with sequences in flight refuses it, as the real one does.
- Samples carry their real token count (zeros, as one int32 buffer) and prompt ids but no
  logprobs: the trainer side needs only the counts, and the payload stays the size of the token
  ids a real engine ships (4 bytes a token).
- Rewards are a deterministic coin per sample id (the scenario has no task to score), so group
  advantages, the ledger and the metrics run on real numbers.
"""

from __future__ import annotations

import dataclasses
from array import array
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from poise.data.tasks import Problem
from poise.errors import PoiseError
from poise.policy.cost import ContinuousBatch, CostModel
from poise.policy.dispatch import DispatchPlan, InstanceInfo, build_dispatch
from poise.policy.plan import micro_normaliser
from poise.policy.rankers import Finished, Prompt
from poise.rollout.occupancy import Occupancy
from poise.runtime.roles import BackgroundTask
from poise.rewards.scorer import PendingRewards, RewardResult
from poise.sim.scenario import ScenarioConfig, load_scenario
from poise.sim.workload import _seed, make_workload
from poise.types import Request, Sample, SampleId, trained_tokens


@dataclass(frozen=True)
class EmulatedSpec:
    """What an emulated worker needs instead of a model: the scenario and the time scale."""

    scenario: ScenarioConfig
    time_scale: float
    loss_agg: str  # "token" | "sequence": the normaliser the trainer group also computes


class _Lengths:
    """Output length of each sample id, from the scenario workload (deterministic per step); an
    over-provisioned group's (prompt index >= prompts_per_step, pipeline.overprovision) is the
    simulator's extra group of that id (`workload.extra_groups`), so both generate the same work."""

    def __init__(self, sc: ScenarioConfig):
        self._workload = make_workload(sc.workload, sc.seed)
        self._prompts = sc.workload.prompts_per_step
        self._steps: dict[int, dict[SampleId, int]] = {}
        self._extra: dict[tuple[int, int], dict[SampleId, int]] = {}  # (step, prompt index) -> lengths

    def __call__(self, sid: SampleId) -> int:
        step = sid[0]
        if sid[1] >= self._prompts:
            return self._extra_length(sid)
        if step not in self._steps:
            if len(self._steps) >= 4:  # at most two steps are in flight (async); keep a few
                del self._steps[min(self._steps)]
            self._steps[step] = {s.sample_id: s.output_length for s in self._workload.step(step)}
        try:
            return self._steps[step][sid]
        except KeyError:
            raise KeyError(f"sample {sid} is not in step {step} of the scenario workload "
                           f"({len(self._steps[step])} samples); the driver and the workers disagree "
                           "on emulation.scenario") from None

    def _extra_length(self, sid: SampleId) -> int:
        group = (sid[0], sid[1])
        if group not in self._extra:
            if len(self._extra) >= 1024:  # partial rollouts keep a few steps' extra groups in flight
                del self._extra[next(iter(self._extra))]
            self._extra[group] = {s.sample_id: s.output_length
                                  for s in self._workload.extra_groups(sid[0], [sid[1]])}  # type: ignore[union-attr]
        return self._extra[group][sid]


@dataclass
class _Live:
    request: Request
    length: int  # tokens it will generate in all
    submit_time: float
    done: int = 0  # tokens a partial already had (resumed after an abort elsewhere)
    window: int = 0  # partial rollouts: tokens it may decode here before it is handed back; 0 = to its end
    versions: tuple[int, ...] | None = None  # partial rollouts: the versions of the `done` tokens

    @property
    def run(self) -> int:
        """Tokens it decodes here: to its end, or its window."""
        left = self.length - self.done
        return min(left, self.window) if self.window else left


def _zeros(n: int) -> array:
    """n token ids (all 0) as one int32 buffer: what an engine ships per sample, pickled as 4n
    bytes instead of n Python ints (a reasoning workload's samples run to thousands of tokens)."""
    return array("i", bytes(4 * n))


class EmulatedEngine:
    """The part of `poise.rollout.engine.Engine` that DeviceWorker uses, with sleeps for compute.

    Continuous batching as the real engine does it, timed by the kernel the simulator runs
    (`policy.cost.ContinuousBatch`): FIFO admission into free slots, every live sequence gains a
    token per decode step, a finished sequence frees its slot for the next request.
    """

    def __init__(self, cost: CostModel, lengths: Callable[[SampleId], int], num_slots: int, time_scale: float,
                 now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        # `now`/`sleep` are the wall clock; a test passes a virtual one to compare with the simulator
        self.cost, self.lengths, self.num_slots, self.scale = cost, lengths, num_slots, time_scale
        self._now, self._sleep_fn = now, sleep
        self.version = 0
        self._queue: deque[_Live] = deque()
        self._batch = ContinuousBatch(cost, num_slots)
        self._live: dict[int, _Live] = {}  # admission number -> sequence
        self._admitted = 0
        # While busy, the engine keeps a schedule: each segment ends `cost x scale` after the last
        # one did, not after the OS woke us up, so wake-up latency (ms on a loaded host, dozens of
        # finishes a step) is not charged to the control plane. An idle engine starts afresh.
        self._deadline: float | None = None

    def submit(self, request: Request) -> None:
        now = self._now()
        if self._deadline is None:
            # the schedule starts when work arrives: looking up a new step's lengths in the
            # scenario workload (tens of ms on a loaded host) is the emulator's cost, not a device's
            self._deadline = now
        self._queue.append(_Live(request, self.lengths(tuple(request.sample_id)), now))

    @property
    def occupancy(self) -> Occupancy:
        return Occupancy(len(self._live), len(self._queue))

    def step(self) -> list[Sample]:
        """Admit into free slots, decode up to the next finish, return the finished samples."""
        prefill = 0.0
        while self._queue and self._batch.free:
            seq = self._queue.popleft()
            self._live[self._admitted] = seq
            # a resumed partial re-prefills prompt + its tokens, as the real engine does
            prefill += self._batch.admit(self._admitted, len(seq.request.prompt_ids) + seq.done, seq.run)
            self._admitted += 1
        if not self._live:
            return []
        decode, done = self._batch.advance()
        if self._deadline is None:
            self._deadline = self._now()
        self._deadline += (prefill + decode) * self.scale
        wait = self._deadline - self._now()
        if wait > 0:
            self._sleep_fn(wait)
        now = self._now()
        finished = [self._live.pop(key) for key in done]
        if self.occupancy.idle:
            self._deadline = None
        return [self._sample(s, s.run, now) for s in finished]

    def _sample(self, seq: _Live, n: int, now: float, reason: str | None = None) -> Sample:
        """`seq` after `n` more tokens here: finished, or (not at its end) a partial sample."""
        made = seq.done + n
        versions = None if seq.versions is None else seq.versions + (self.version,) * n
        return Sample(tuple(seq.request.sample_id), tuple(seq.request.prompt_ids), _zeros(made), (),
                      reason or ("length" if made >= seq.length else "abort"), self.version, seq.submit_time, now,
                      seq.length, turn=seq.request.turn, token_versions=versions)

    def abort(self) -> list[Sample]:
        """Stop every queued and running sequence (between two decode segments: the engine loop
        holds the engine lock); returns their partial samples, tokens so far included."""
        now = self._now()
        progress = dict(self._batch.drain())  # admission number -> tokens generated here
        seqs = [(self._live[key], progress.get(key, 0)) for key in sorted(self._live)]
        seqs += [(seq, 0) for seq in self._queue]
        self._live.clear()
        self._queue.clear()
        self._deadline = None
        return sorted((self._sample(seq, n, now, "abort") for seq, n in seqs), key=lambda s: s.sample_id)

    def resume(self, partials: Sequence[Sample], windows: Mapping[SampleId, int] | None = None) -> None:
        """Continue partial samples from `abort` (here or on another engine), ahead of the queue;
        one named in `windows` (partial rollouts) comes back unfinished after that many more tokens,
        and one carrying per-token versions may continue under newer weights."""
        now = self._now()
        if self._deadline is None:
            self._deadline = now
        for partial in reversed(list(partials)):
            versions = partial.token_versions
            if versions is None and partial.token_ids and partial.weights_version != self.version:
                raise RuntimeError(f"emulated engine: partial {partial.sample_id} was made under weights version "
                                   f"{partial.weights_version}, this engine holds {self.version}")
            if versions and versions[-1] > self.version:
                raise RuntimeError(f"emulated engine: partial {partial.sample_id} has tokens of weights version "
                                   f"{versions[-1]}, this engine holds the older {self.version}")
            sid = tuple(partial.sample_id)
            request = Request(sid, tuple(partial.prompt_ids), turn=partial.turn)
            self._queue.appendleft(_Live(request, self.lengths(sid), partial.submit_time, len(partial.token_ids),
                                         (windows or {}).get(sid, 0), versions))

    def load_weights(self, named_tensors, version: int) -> None:
        occupancy = self.occupancy
        if not occupancy.idle:
            # the real engine refuses too: a sample's tokens must all come from one version
            raise RuntimeError(f"emulated engine: {occupancy.busy(f'load_weights(version={version})')}; "
                               "sync only between generations")
        self.version = version

    def release(self) -> None:
        """Nothing to free: an emulated engine holds no cache."""

    def set_weights_version(self, version: int) -> None:
        self.load_weights((), version)


class EmulatedTrainShard:
    """A train shard's bookkeeping (micro-batch indices, contiguous ranges, normaliser) with the
    forward/backward and the reduction + optimizer step as sleeps."""

    def __init__(self, rank: int, cost: CostModel, time_scale: float, loss_agg: str):
        self.rank, self.cost, self.scale, self.loss_agg = rank, cost, time_scale, loss_agg
        self._normalisers: dict[int, float] = {}  # micro-batch index -> its normaliser
        self.version = 0
        self._transfer: BackgroundTask | None = None
        self._transfer_report: dict = {}

    def train_micro_batch(self, index: int, samples: Sequence[Sample], advantages: Sequence[float]) -> dict:
        start = time.time()
        if len(advantages) != len(samples):
            raise ValueError(f"device {self.rank}: micro-batch {index} has {len(samples)} samples but "
                             f"{len(advantages)} advantages; the trainer group must send one per sample")
        if index in self._normalisers:
            raise RuntimeError(f"device {self.rank}: micro-batch {index} trained twice in one update")
        tokens = sum(len(s.token_ids) for s in samples)
        normaliser = micro_normaliser([trained_tokens(s) for s in samples], self.loss_agg)
        # the simulator prices forward+backward over prompt + response tokens
        self._sleep(self.cost.train_compute_s(tokens + sum(len(s.prompt_ids) for s in samples), 1))
        self._normalisers[index] = normaliser
        return {"index": index, "loss_sum": 0.0, "normaliser": normaliser, "clipped": 0, "kl_sum": 0.0,
                "tokens": tokens, "start": start, "end": time.time(), "device": self.rank}

    def apply_update(self, num_micro_batches: int, indices: list[int], normaliser: float, ranks: list[int],
                     rows: int, inputs_ready: float | None = None) -> dict:
        # timed from when the last micro-batch ended (a real all-gather starts then; an emulated
        # shard hears of it one notification later), as EmulatedSync.publish
        start = time.time() if inputs_ready is None else min(time.time(), inputs_ready)
        self._check_indices(indices)
        own = sum(self._normalisers.values())
        if normaliser < own or normaliser <= 0:
            raise RuntimeError(f"device {self.rank}: step normaliser {normaliser} is below this device's own "
                               f"micro-batches' {own}; the trainer group summed the wrong samples")
        barrier_s = self.wait_optimizer_transfer()
        if barrier_s > 0:  # the step itself starts once the optimizer state is whole
            start = time.time()
        wait = start + self.cost.train_fixed_s(len(ranks)) * self.scale - time.time()  # reduction + step
        if wait > 0:
            time.sleep(wait)
        self._normalisers.clear()
        self.version += 1
        return {"grad_norm": 0.0, "start": start, "end": time.time(), "device": self.rank, "barrier_s": barrier_s}

    def contribute(self, num_micro_batches: int, indices: list[int], ranks: list[int], rows: int) -> dict:
        """A helping rollout device's part of the reduction: its cost is in the train devices' update."""
        start = time.time()
        self._check_indices(indices)
        self._normalisers.clear()
        return {"start": start, "end": time.time(), "device": self.rank}

    def _check_indices(self, indices: list[int]) -> None:
        if set(self._normalisers) != set(indices):
            raise RuntimeError(f"device {self.rank}: expected micro-batches {sorted(indices)}, "
                               f"got {sorted(self._normalisers)}")

    def transfer_optimizer(self, src: int, ranks: list[int], buffer_bytes: int) -> None:
        """The joiner's optimizer restore, priced by the cost model's live-resize background phases,
        on a background thread that the next update waits for (as the real transfer)."""
        self.wait_optimizer_transfer()
        seconds = self.cost.resize("live").background_s if self.rank != src else 0.0

        def run() -> None:
            t = time.time()
            self._sleep(seconds)
            self._transfer_report = {"bytes": 0, "seconds": time.time() - t, "peak_buffer_bytes": 0}

        self._transfer = BackgroundTask(run, f"device {self.rank}: optimizer transfer")

    def wait_optimizer_transfer(self) -> float:
        return self._transfer.join() if self._transfer is not None else 0.0

    def optimizer_transfer_report(self) -> dict:
        return dict(self._transfer_report)

    def drop_optimizer(self) -> None:
        self.wait_optimizer_transfer()

    def save_checkpoint(self, run_dir: str, step: int, version: int, extra: dict[str, bytes] | None = None,
                        ranks: list[int] | None = None, parallel: bool = False) -> str:
        return ""  # an emulated device holds no weights

    def load_checkpoint(self, path: str, train_ranks: list[int] | None = None) -> tuple[int, int]:
        raise PoiseError("an emulated device holds no weights to restore")

    def digest(self) -> str:
        return f"emulated-v{self.version}"

    def _sleep(self, model_seconds: float) -> None:
        if model_seconds > 0:
            time.sleep(model_seconds * self.scale)


class EmulatedSync:
    """The weight sync's fan-out and barrier stay real (every rank gets the call); the transfer
    is a sleep of `cost.sync_s()` and the version is stamped on the engine."""

    def __init__(self, cost: CostModel, time_scale: float, engine_call):
        self.cost, self.scale, self.engine_call = cost, time_scale, engine_call

    def prewarm(self, rank_sets: list[list[int]]) -> int:
        return len(rank_sets)  # no torch.distributed world: nothing to create

    def groups_created_after_prewarm(self) -> int:
        return 0

    def publish(self, src: int, ranks: list[int], version: int, bucket_mb: float,
                sender_ready: float | None = None, sources: list[int] | None = None) -> float:
        # A real broadcast starts when the sender enters it (receivers wait inside the
        # collective); an emulated receiver learns of that moment one notification later, so the
        # transfer is timed from `sender_ready`, not from when the notification arrived.
        start = time.time() if sender_ready is None else min(time.time(), sender_ready)
        wait = start + self.cost.sync_s() * self.scale - time.time()
        if wait > 0:
            time.sleep(wait)
        self.engine_call(lambda engine: engine.set_weights_version(version))
        return time.time() - start


def emulated_roles(rank: int, spec: EmulatedSpec, num_slots: int, engine_call):
    """The emulated RolloutEngine, TrainShard and WeightSync of one device (runtime/roles.py)."""
    from poise.sim.driver import make_cost

    cost = make_cost(spec.scenario)
    engine = EmulatedEngine(cost, _Lengths(spec.scenario), num_slots, spec.time_scale)
    return engine, EmulatedTrainShard(rank, cost, spec.time_scale, spec.loss_agg), EmulatedSync(
        cost, spec.time_scale, engine_call)


# ---- driver side ------------------------------------------------------------------------------

def _problem(prompt: Prompt) -> Problem:
    """The driver's Problem record of a scenario prompt (no text: the workload is lengths only)."""
    family = next((k.split("=", 1)[1] for k in prompt.features if k.startswith("family=")), "trace")
    return Problem(prompt.prompt_id, family, "", "", "emulated")


class _ScenarioDispatcher:
    """The dispatcher, seeing the scenario's own Prompts (features, token counts) for the
    service's prompt ids; the service plans per prompt (all G samples on one instance)."""

    def __init__(self, inner, prompts: dict[str, Prompt]):
        self.inner, self.prompts = inner, prompts
        self.name = inner.name

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan:
        return self.inner.plan([self.prompts[p.prompt_id] for p in prompts], instances)


class _ScenarioRanker:
    def __init__(self, inner, prompts: dict[str, Prompt]):
        self.inner, self.prompts = inner, prompts
        self.name = inner.name

    def scores(self, prompts: Sequence[Prompt]) -> list[float]:
        return self.inner.scores([self.prompts[p.prompt_id] for p in prompts])

    def observe(self, finished: Sequence[Finished]) -> None:
        self.inner.observe([Finished(self.prompts[f.prompt.prompt_id], f.output_length) for f in finished])


@dataclass
class Emulation:
    """The driver's side of emulated compute, built from a TrainConfig with compute: emulated.

    The scenario supplies the workload (prompts per step and group size replace the algorithm
    section's, so the ledger expects exactly the scenario's samples) and the cost model; the
    TrainConfig keeps devices, split, pipeline, micro-batch size, dispatch policy and ranker,
    resize policy and controller, slots, seed, steps and the run directory, and `scenario` is
    updated to match them (so the
    allocator and `poise simulate` of it price the same job).
    """

    cfg: object  # poise.config.TrainConfig, algorithm sizes replaced by the scenario's
    scenario: ScenarioConfig
    device_spec: EmulatedSpec
    prompts: dict[str, Prompt] = field(default_factory=dict)  # prompt id -> the scenario's Prompt
    oracle: dict[str, float] = field(default_factory=dict)  # prompt id -> mean length (oracle ranker)
    _problems: dict[int, list[Problem]] = field(default_factory=dict, repr=False)  # step -> problems (recent)

    @classmethod
    def from_config(cls, cfg, resume: bool = False) -> "Emulation":
        if resume:
            raise PoiseError("--resume with cluster.compute=emulated: emulated devices hold no weights to "
                             "checkpoint; start the run again (it is a timing emulation, not training)")
        e = cfg.emulation
        sc = load_scenario(e.scenario, list(e.overrides))
        sc = dataclasses.replace(sc, pipeline=cfg.pipeline, dispatch=cfg.dispatch, resize=cfg.resize,
                                 controller=cfg.controller, cluster=dataclasses.replace(
                                     sc.cluster, micro_batch_size=cfg.algorithm.micro_batch_size))
        w = sc.workload
        algorithm = dataclasses.replace(cfg.algorithm, prompts_per_step=w.prompts_per_step,
                                        group_size=w.samples_per_prompt)
        cfg = dataclasses.replace(cfg, algorithm=algorithm)
        return cls(cfg, sc, EmulatedSpec(sc, e.time_scale, algorithm.loss_agg))

    def __post_init__(self) -> None:
        from poise.sim.driver import make_cost

        sc = self.scenario
        if sc.workload.drop_rate:
            raise PoiseError(f"scenario workload.drop_rate={sc.workload.drop_rate}: emulated compute has no rewards "
                             "to drop groups by (the simulator prices it: poise simulate); set it 0")
        self.workload = make_workload(sc.workload, sc.seed)
        self.cost = make_cost(sc)
        first = self.workload.step(0)
        self.prompt_len = int(round(sum(s.prompt_len for s in first) / len(first)))
        ranker, dispatcher = build_dispatch(self.cfg.dispatch, self.cfg.run.seed, self.cost, self.prompt_len,
                                            self.cfg.algorithm.group_size,
                                            oracle=lambda p: self.oracle[p.prompt_id])
        self.ranker = _ScenarioRanker(ranker, self.prompts)
        self.dispatcher = _ScenarioDispatcher(dispatcher, self.prompts)

    def split(self) -> tuple[int, int]:
        """`cluster.split`, or the simulator allocator's split for this scenario on cluster.devices."""
        c = self.cfg.cluster
        if c.split:
            return c.split[0], c.split[1]
        from poise.sim.driver import Simulation

        sc = dataclasses.replace(self.scenario, split="auto",
                                 cluster=dataclasses.replace(self.scenario.cluster, devices=c.devices))
        s = Simulation(sc).split
        return s.rollout, s.train

    # --- the driver's data hooks ----------------------------------------------------------------
    def problems(self, step: int) -> list[Problem]:
        """Step `step`'s prompts, one per prompt index, as the driver's Problem records."""
        if step in self._problems:
            return list(self._problems[step])
        samples = self.workload.step(step)
        by_prompt: dict[int, list[int]] = {}
        out: list[Problem] = []
        for s in samples:
            by_prompt.setdefault(s.sample_id[1], []).append(s.output_length)
            if s.sample_id[2] == 0:
                self.prompts[s.prompt.prompt_id] = s.prompt
                out.append(_problem(s.prompt))
        for i, lengths in by_prompt.items():
            self.oracle[out[i].uid] = sum(lengths) / len(lengths)
        if len(self._problems) >= 8:  # partial rollouts ask for a few recent steps' problems, again and again
            del self._problems[min(self._problems)]
        self._problems[step] = out
        return out

    def draws(self, step: int, indices: list[int]) -> list[Problem]:
        """The problems of prompt groups `indices` of step `step`: index < prompts_per_step is the
        step's own prompt, a later one (pipeline.overprovision) the scenario's extra group of that id,
        the one the simulator draws (`workload.extra_groups`), so both generate the same work."""
        own = self.problems(step) if any(i < self.cfg.algorithm.prompts_per_step for i in indices) else []
        return [own[i] if i < len(own) else self._extra_problem(step, i) for i in indices]

    def _extra_problem(self, step: int, index: int) -> Problem:
        group = self.workload.extra_groups(step, [index])  # type: ignore[union-attr] - partial needs parametric
        prompt = group[0].prompt
        self.prompts[prompt.prompt_id] = prompt
        self.oracle.setdefault(prompt.prompt_id, sum(s.output_length for s in group) / len(group))
        return _problem(prompt)

    def prompt_ids(self, problem: Problem) -> tuple[int, ...]:
        """A prompt of the scenario's length: the engine prefills and holds that many tokens."""
        return _zeros(self.prompts[problem.uid].tokens)

    def score(self, problem: Problem, sample: Sample) -> float:
        # a Random per id: the FNV seed's low bit is a parity of the id's characters, not a coin
        return float(random.Random(_seed("reward", self.scenario.seed, tuple(sample.sample_id))).random() < 0.5)

    def submit_scores(self, problems: list[Problem], samples: Sequence[Sample]) -> PendingRewards:
        """`score` of each sample, already known: an emulated job runs no reward functions."""
        return PendingRewards.ready([RewardResult(self.score(problems[s.sample_id[1]], s)) for s in samples])
