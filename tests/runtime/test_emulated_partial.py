"""Partial rollouts on emulated compute (cluster.compute=emulated, docs/partial-rollouts.md): the
emulated step source draws the over-provisioned groups the simulator draws, with the simulator's
output lengths, so an emulated run and `poise simulate` of the same scenario and knobs batch the
same groups at the same steps and train the same tokens at each lag."""

import json

import pytest

from poise.config import load_train_config
from poise.errors import ConfigError
from poise.runtime.driver import train_disaggregated
from poise.runtime.emulated import Emulation, _Lengths
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.workload import make_workload

PROMPTS, GROUP, STEPS = 8, 4, 5
SCENARIO = ["workload.prompts_per_step=8", "workload.samples_per_prompt=4"]
KNOBS = ["pipeline.mode=async", "pipeline.max_staleness=2", "pipeline.partial_tokens=1024",
         "pipeline.overprovision=4"]
EMULATED = [
    "run.progress=false", f"run.steps={STEPS}", "run.checkpoint_every=0", "cluster.compute=emulated",
    "cluster.devices=4", "cluster.split=[2,2]", "algorithm.micro_batch_size=8", "rollout.num_slots=16",
    "emulation.scenario=streamrl-pipeline", f"emulation.overrides=[{', '.join(SCENARIO)}]",
    "emulation.time_scale=0.002", "algorithm.old_logprobs=recompute", "algorithm.rollout_is=token", *KNOBS,
]


def _emulation(tmp_path) -> Emulation:
    return Emulation.from_config(load_train_config(None, [*EMULATED, f"run.dir={tmp_path}"]))


def test_extra_groups_are_the_simulators(tmp_path):
    """Index < prompts_per_step is the step's own prompt; a later one the simulator's extra group
    of that id: its prompt on the driver, its output lengths on the devices."""
    em = _emulation(tmp_path)
    workload = make_workload(em.scenario.workload, em.scenario.seed)
    extra = workload.extra_groups(3, [PROMPTS, PROMPTS + 2])
    got = em.draws(3, [1, PROMPTS, PROMPTS + 2])
    assert got[0] == em.problems(3)[1]
    assert [p.uid for p in got[1:]] == [extra[0].prompt.prompt_id, extra[GROUP].prompt.prompt_id]
    assert len(em.prompt_ids(got[1])) == extra[0].prompt_len > 0
    lengths = _Lengths(em.scenario)
    assert {s.sample_id: lengths(s.sample_id) for s in extra} == {s.sample_id: s.output_length for s in extra}
    own = {s.sample_id: s.output_length for s in workload.step(3)}
    assert {sid: lengths(sid) for sid in own} == own
    assert len(set(s.output_length for s in extra)) > 1  # real lengths, not a constant


def _batches(events: list[dict]) -> dict:
    """Per step: each trained sample's (slot, sample index) -> (its group (origin step, prompt
    index), prompt id, output length)."""
    out: dict = {}
    for e in events:
        if e["kind"] == "sample":
            step, slot, j = e["id"]
            out.setdefault(step, {})[(slot, j)] = (tuple(e["draw"]), e["prompt_id"], e["output_length"])
    return out


def _partial_metrics(rows: list[dict]) -> list[dict]:
    """Each step's partial/ metrics: tokens by lag, carried and waiting groups, windows."""
    return [{k: float(v) for k, v in r.items() if k.startswith("partial/")} for r in rows]


def _read(run_dir) -> tuple[list[dict], list[dict]]:
    lines = lambda name: [json.loads(x) for x in (run_dir / name).read_text().splitlines()]  # noqa: E731
    return lines("events.jsonl"), lines("metrics.jsonl")


@pytest.mark.ray
@pytest.mark.slow
def test_an_emulated_run_batches_what_the_simulator_batches(ray_session, tmp_path):
    train_disaggregated(load_train_config(None, [*EMULATED, f"run.dir={tmp_path / 'emulated'}"]))
    events, rows = _read(tmp_path / "emulated")
    sim = Simulation(load_scenario("streamrl-pipeline", [*SCENARIO, *KNOBS, f"steps={STEPS}", "cluster.devices=4",
                                                          "split=[2,2]", "log.samples=true"]), tmp_path / "sim")
    sim.run()
    sim_events, sim_rows = _read(tmp_path / "sim")

    got, want = _batches(events), _batches(sim_events)
    assert sorted(got) == list(range(STEPS)) and all(len(b) == PROMPTS * GROUP for b in got.values())
    # the run exercised what it claims to: groups carried across steps, extra groups trained, tokens at lag 2
    groups = {step: {g for g, _, _ in b.values()} for step, b in got.items()}
    assert any(origin < step for step, g in groups.items() for origin, _ in g)
    assert any(index >= PROMPTS for g in groups.values() for _, index in g)
    assert sum(r.get("partial/staleness_2", 0) for r in rows) > 0
    assert got == want
    assert _partial_metrics(rows) == _partial_metrics(sim_rows)


def test_a_trace_scenario_is_refused_before_ray(tmp_path):
    """A trace has no extra draws: refused in one line when the emulation is built (before Ray)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_id": "a", "step": 0, "output_length": 5}\n')
    cfg = load_train_config(None, [*EMULATED, f"run.dir={tmp_path / 'run'}",
                                   f"emulation.overrides=[workload.trace={trace}]"])
    with pytest.raises(ConfigError, match="partial rollouts with a trace are not simulated"):
        Emulation.from_config(cfg)


def test_overprovision_is_checked_against_the_scenarios_prompts(tmp_path):
    """Emulated compute takes prompts per step from the scenario (64 in streamrl-pipeline, not the
    algorithm section's 16): overprovision is held to the scenario's, when the emulation is built."""
    base = [k for k in EMULATED if not k.startswith("emulation.overrides")] + [f"run.dir={tmp_path}"]
    assert Emulation.from_config(load_train_config(None, [*base, "pipeline.overprovision=32"])).scenario.pipeline \
        .overprovision == 32
    with pytest.raises(ConfigError, match=r"pipeline.overprovision.*got 65.*workload.prompts_per_step \(64\)"):
        Emulation.from_config(load_train_config(None, [*base, "pipeline.overprovision=65"]))
