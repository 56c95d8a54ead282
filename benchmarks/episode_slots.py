"""Multi-turn episodes: a rollout device's use when a turn frees its slot during the environment's
wait (Poise: `refill`) vs when the episode holds it (the naive scheme: `hold`).

    PYTHONPATH=src .venv/bin/python benchmarks/episode_slots.py [--episodes 48] [--slots 8] [--no-real]

Both parts run the same episodes, drawn from a parametric workload with `workload.episode`
(turns uniform 2-6, ~24 tokens a turn, 16 observation tokens, environment calls lognormal with a
0.25 s median), on one rollout instance of `--slots` slots priced by one cost model:

(a) simulator: `policy.turns.episode_times`, the kernel the simulator's instances run (virtual
    clock), plus the same comparison over environment latencies from 0 to 1 s, and a whole job
    (scenario agent-episodes, `workload.episode.slots=refill|hold`).
(b) real control plane: `poise.episodes.runner.EpisodeRunner` drives `EmulatedEngine` (the engine
    the emulated runtime runs: continuous batching that sleeps the cost model's seconds); the
    environment is a class whose calls sleep their latency in a thread pool (the sandbox's place).
    Poise: every answer's next turn (the whole episode so far) goes to the engine at once. Naive: at
    most `--slots` episodes run, each keeps its slot until its last answer, and a next turn is
    submitted with its observation alone as the prompt (its KV cache was kept: only that is prefilled).

Figures per scheme: makespan (first turn to last answer), generated tokens per second, device busy
(share of the time the engine prefilled or decoded anything) and slots busy (share of slot-seconds
decoding a sequence: the batch the device fills). Ratios are Poise / naive. Device busy hardly
differs: a naive engine keeps stepping with the one or two of its episodes not waiting, and a
memory-bound decode step costs nearly as much for one sequence as for eight; slots busy and
tokens per second show what those steps yield. Departures of (b) from (a), in both schemes: the
emulated engine admits a turn that arrives mid-decode at its next finish, not its next step, and
the turns that finish together go to the environment as one batch answered as one (the sandbox's
way). Writes
bench-results/episode_slots-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from results import write_results  # benchmarks/results.py
from poise.config import EnvConfig
from poise.data.tasks import Problem, derive_seed
from poise.episodes.runner import EpisodeRunner
from poise.policy.cost import CostConfig, CostModel
from poise.policy.turns import EpisodeWork, episode_times
from poise.rewards.sandbox import Call, Outcome
from poise.runtime.emulated import EmulatedEngine
from poise.schema import build
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.workload import ParametricWorkload, WorkloadConfig
from poise.types import Request, SampleId

# a small model's decode: 4 ms a step whatever the batch (weights read once), 0.2 ms per sequence
COST = CostConfig(decode_base_s=0.004, decode_per_seq_s=0.0002, decode_per_kv_token_s=0.0, prefill_per_token_s=1e-5)
SEED = 0


def workload(prompts: int, group: int, latency_s: float) -> dict:
    return {"prompts_per_step": prompts, "samples_per_prompt": group, "pool_size": prompts, "sample_sigma": 0.3,
            "episode": {"turns": {"dist": "uniform", "low": 2, "high": 6}, "max_turns": 8,
                        "observation_tokens": {"dist": "fixed", "value": 16},
                        "env_latency_s": {"dist": "lognormal", "value": latency_s, "sigma": 0.5}},
            "phases": [{"mix": [{"name": "tool", "dist": "lognormal", "median": 24, "sigma": 0.3,
                                 "prompt_len": 64, "max_len": 256}]}]}


def draw_episodes(prompts: int, group: int, latency_s: float) -> dict[SampleId, EpisodeWork]:
    samples = ParametricWorkload(build(WorkloadConfig, workload(prompts, group, latency_s)), SEED).step(0)
    return {s.sample_id: s.episode for s in samples if s.episode is not None}


@dataclass
class Figures:
    makespan_s: float
    tokens_per_s: float
    device_busy: float
    slots_busy: float


def simulated(episodes: dict[SampleId, EpisodeWork], slots: int, rule: str) -> Figures:
    eps = [episodes[sid] for sid in sorted(episodes)]
    times = episode_times(CostModel(COST), eps, [list(range(len(eps)))], [slots], 0.0, rule)
    span = max(times.finish)
    return Figures(span, sum(e.model_tokens for e in eps) / span, times.busy_s[0] / span,
                   times.slot_s[0] / (slots * span))


# --- (b): the real episode runner and the emulated engine ------------------------------------------
class SleepingEnvironment:
    """One episode's environment: its answer to turn i comes after `env_s[i]` seconds, with
    `observations[i]` tokens; the answer to the last turn says done."""

    def __init__(self, work: EpisodeWork):
        self.work = work

    def step(self, turn: int) -> tuple[str, float, bool, dict]:
        time.sleep(self.work.env_s[turn])
        last = turn == len(self.work.turns) - 1
        return ("" if last else "o" * self.work.observations[turn]), 0.0, last, {}


class _Pending:
    def __init__(self, futures: list):
        self.futures = futures

    def done(self, wait_s: float = 0.0) -> bool:
        return not wait(self.futures, timeout=wait_s).not_done

    def result(self) -> list[Outcome]:
        return [f.result() for f in self.futures]


class ThreadSandbox:
    """The part of the reward sandbox the runner uses: each environment call runs in a thread (the
    environments sleep, they do not compute). A reset answers at once (the simulator prices none)."""

    env_index = 0

    def __init__(self, by_seed: dict[int, SleepingEnvironment]):
        self.by_seed = by_seed
        self.pool = ThreadPoolExecutor(max_workers=256)

    def submit_env(self, calls: list[Call]) -> _Pending:
        return _Pending([self.pool.submit(self._call, call) for call in calls])

    def _call(self, call: Call) -> Outcome:
        history = json.loads(call.completion)
        turn = len(history["actions"]) - 1  # the call answers the latest turn
        if turn < 0:
            return Outcome(0.0, env=("", False, {}))
        observation, reward, done, info = self.by_seed[history["seed"]].step(turn)
        return Outcome(reward, env=(observation, done, info))


class Codec:
    def action_text(self, token_ids) -> str:
        return "a"

    def observation_ids(self, observation: str) -> list[int]:
        return [0] * len(observation)


class MeteredEngine:
    """EmulatedEngine with its busy time and slot-seconds counted around each `step`."""

    def __init__(self, engine: EmulatedEngine, slots: int):
        self.engine, self.slots = engine, slots
        self.busy_s = self.slot_s = 0.0

    def step(self):
        occupancy = self.engine.occupancy
        live = min(self.slots, occupancy.running + occupancy.queued)  # the batch after admission
        t0 = time.perf_counter()
        out = self.engine.step()
        dt = time.perf_counter() - t0
        self.busy_s += dt
        self.slot_s += dt * live
        return out


def real(episodes: dict[SampleId, EpisodeWork], prompts: int, group: int, slots: int, rule: str) -> Figures:
    by_seed = {derive_seed(SEED, "env", sid): SleepingEnvironment(work) for sid, work in episodes.items()}
    runner = EpisodeRunner(EnvConfig(name="bench:SleepingEnvironment", max_turns=8), ThreadSandbox(by_seed),
                           Codec(), max_new_tokens=4096, context=1 << 20, seed=SEED)
    engine = EmulatedEngine(CostModel(COST), lambda sid: episodes[sid].turns[runner.episodes[sid].turn], slots, 1.0)
    metered = MeteredEngine(engine, slots)
    problems = [Problem(f"p{i}", "tool", "go", "", "none") for i in range(prompts)]
    first = runner.first_turns(0, problems, [[1] * 64] * prompts, group, version=0)
    waiting = [first[sid] for sid in sorted(first)]
    active = 0
    t0 = time.perf_counter()

    def turn_request(request: Request) -> Request:
        """Naive: the slot kept the episode's KV cache, so a next turn prefills its observation alone."""
        if rule != "hold" or request.turn == 0:
            return request
        sid = tuple(request.sample_id)
        keep = len(request.prompt_ids) - episodes[sid].observations[request.turn - 1]
        return Request(sid, request.prompt_ids[keep:], turn=request.turn)

    def hand_out(requests: list[Request], ended: int) -> None:
        nonlocal active
        active -= ended
        for request in requests:
            engine.submit(turn_request(request))
        limit = slots if rule == "hold" else len(first)  # naive: one slot per running episode, held
        while waiting and active < limit:
            engine.submit(waiting.pop(0))
            active += 1

    hand_out([], 0)
    while runner.active:
        if not engine.occupancy.idle:
            done = metered.step()
            if done:
                runner.turns_done(done)
            requests, finished = runner.poll(0.0)
        else:
            requests, finished = runner.poll(wait_s=0.05)
        hand_out(requests, len(finished))
    span = time.perf_counter() - t0
    tokens = sum(e.model_tokens for e in episodes.values())
    return Figures(span, tokens / span, metered.busy_s / span, metered.slot_s / (slots * span))


def row(label: str, poise: Figures, naive: Figures) -> dict:
    ratio = {k: getattr(poise, k) / getattr(naive, k) for k in ("tokens_per_s", "device_busy", "slots_busy")}
    print(f"{label:<22} {'poise':>6} {poise.makespan_s:>9.2f} {poise.tokens_per_s:>8.0f} {poise.device_busy:>7.0%} "
          f"{poise.slots_busy:>7.0%}")
    print(f"{'':<22} {'naive':>6} {naive.makespan_s:>9.2f} {naive.tokens_per_s:>8.0f} {naive.device_busy:>7.0%} "
          f"{naive.slots_busy:>7.0%}")
    print(f"{'':<22} {'ratio':>6} {'':>9} {ratio['tokens_per_s']:>7.2f}x {ratio['device_busy']:>6.2f}x "
          f"{ratio['slots_busy']:>6.2f}x")
    return {"label": label, "poise": poise.__dict__, "naive": naive.__dict__, "ratio": ratio}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=48, help="episodes (a multiple of 8: prompts x 8 samples)")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.25, help="median environment seconds per call")
    ap.add_argument("--no-real", action="store_true", help="skip (b), the real runner on the emulated engine")
    args = ap.parse_args()
    group = 8
    prompts = max(1, args.episodes // group)
    load = os.getloadavg()
    t0 = time.perf_counter()
    episodes = draw_episodes(prompts, group, args.latency)
    turns = sum(len(e.turns) for e in episodes.values())
    print(f"{len(episodes)} episodes, {turns} turns, {sum(e.model_tokens for e in episodes.values())} model "
          f"tokens, {sum(sum(e.env_s) for e in episodes.values()):.1f} s of environment calls; 1 instance, "
          f"{args.slots} slots; load average {load[0]:.2f}")
    print(f"\n{'':<22} {'scheme':>6} {'makespan':>9} {'tok/s':>8} {'device':>7} {'slots':>7}")
    out: dict = {"episodes": len(episodes), "turns": turns, "slots": args.slots, "latency_median_s": args.latency,
                 "cost": COST.__dict__, "load_before": load}
    out["simulated"] = row("(a) simulator", simulated(episodes, args.slots, "refill"),
                           simulated(episodes, args.slots, "hold"))
    if not args.no_real:
        cpu0 = time.process_time()
        out["real"] = row("(b) runner + emulated", real(episodes, prompts, group, args.slots, "refill"),
                          real(episodes, prompts, group, args.slots, "hold"))
        out["real_cpu_s"] = time.process_time() - cpu0
    print(f"\n(a) over environment latency (median s per call)")
    out["latency_sweep"] = []
    for latency in (0.0, 0.05, 0.1, 0.25, 0.5, 1.0):
        eps = draw_episodes(prompts, group, latency)
        if latency == 0.0:
            eps = {sid: EpisodeWork(e.prompt_len, e.turns, e.observations, (0.0,) * len(e.turns))
                   for sid, e in eps.items()}
        out["latency_sweep"].append({"latency_median_s": latency, **row(
            f"    {latency:g} s", simulated(eps, args.slots, "refill"), simulated(eps, args.slots, "hold"))})
    print(f"\n(a) whole job: scenario agent-episodes (8 devices, 7B-like, split 4:4, 5 steps)")
    print(f"{'scheme':<8} {'step s':>7} {'rollout s':>9} {'tok/s':>7}")
    out["scenario"] = {}
    for rule, label in (("refill", "poise"), ("hold", "naive")):
        s = Simulation(load_scenario("agent-episodes", ["steps=5", "split=[4,4]", "cluster.batch_cap=32",
                                                        f"workload.episode.slots={rule}", "log.samples=false",
                                                        "log.intervals=none"])).run()
        out["scenario"][label] = {"step_s": s.step_s_mean, "rollout_s": s.rollout_s_mean, "tokens_per_s": s.tokens_per_s}
        print(f"{label:<8} {s.step_s_mean:>7.1f} {s.rollout_s_mean:>9.1f} {s.tokens_per_s:>7,.0f}")
    out["wall_s"] = time.perf_counter() - t0
    out["load_after"] = os.getloadavg()
    print(f"\n({out['wall_s']:.1f} s wall; load average {out['load_after'][0]:.2f} after)")
    write_results("episode_slots", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
