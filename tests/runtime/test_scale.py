"""Elastic scale-out on the runtime (runtime/scale.py): a reserve device joins the running job as
a rollout instance, loses nothing and changes no sampled token.

Real compute: from the session's SFT warm start (rewards differ within groups, every step moves
the weights), 3 sync steps on 1+1 CPU devices, one reserve device joining after step 0 (it
generates step 2 with the first device), end with the tokens, logprobs and the model and optimizer bytes of the
same job without a reserve. Emulated compute: a device joins mid-job and every sample id of
every step arrives exactly once.
"""

import json
from collections import Counter

import pytest

from poise.config import load_train_config
from poise.errors import ConfigError, PoiseError
from poise.runtime.driver import train_disaggregated
from poise.sim.scenario import load_scenario
from poise.sim.workload import make_workload

pytestmark = pytest.mark.ray

STEPS = 3
TINY = [
    "run.progress=false",
    "run.log_tokens=true",
    f"run.steps={STEPS}",
    "run.checkpoint_every=2",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.micro_batch_size=4",
    "algorithm.sampling.max_new_tokens=12",
    "rollout.num_slots=8",
    "cluster.devices=2",
    "cluster.split=[1,1]",
    "pipeline.mode=sync",
    "run.verify_sync=true",  # every weight sync: each rollout device's digest equals the trainer's
]
JOIN = ["cluster.reserve_devices=1", "scale.schedule=[{after_step: 0, add: 1}]"]


def _events(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_joining_device_changes_no_token(ray_session, tmp_path, warm_start, read_run):
    runs = {}
    for name, extra in (("fixed", []), ("join", JOIN)):
        run_dir = tmp_path / name
        train_disaggregated(load_train_config(None, [*TINY, f"run.dir={run_dir}", *warm_start.overrides, *extra]))
        runs[name] = read_run(run_dir)
    fixed, joined = runs["fixed"], runs["join"]
    fixed.assert_learned(warm_start)
    joined.assert_learned(warm_start)
    assert [r["split"] for r in joined.rows] == [[1, 1]] + [[2, 1]] * (STEPS - 1)  # the devices held in the step
    samples = [e for e in joined.events if e["kind"] == "sample"]
    instances = {k: {e["instance"] for e in samples if e["step"] == k} for k in range(STEPS)}
    assert instances[0] == instances[1] == {0}
    assert instances[2] == {0, 2}, instances  # the joined device generated step 2 with device 0
    joins = [e for e in joined.events if e["kind"] == "join"]
    assert [(e["step"], e["devices"], e["first_step"], e["groups_created"]) for e in joins] == [(0, [2], 2, 0)]
    syncs = joined.syncs  # from step 1's sync on, device 2 holds the trainer's digest
    assert [s["devices"] for s in syncs] == [[1, 0]] + [[1, 0, 2]] * (STEPS - 1)
    joined.assert_bitwise_equal(fixed, "sync: a device joining after step 0 vs the fixed 1+1 pool")
    decisions = [e for e in joined.events if e["kind"] == "decision" and e["what"] == "scale"]
    assert [(d["step"], d["action"]) for d in decisions] == [(0, "add"), (1, "hold")]


EMULATED = [
    "run.progress=false",
    "run.steps=5",
    "cluster.compute=emulated",
    "cluster.devices=4",
    "cluster.split=[2,2]",
    "cluster.reserve_devices=2",
    "algorithm.micro_batch_size=8",
    "rollout.num_slots=16",
    "emulation.scenario=streamrl-pipeline",
    "emulation.overrides=[workload.prompts_per_step=8]",
    "emulation.time_scale=0.002",
    "pipeline.mode=async",
    "scale.schedule=[{after_step: 0, add: 1}, {after_step: 1, add: 1}]",
]


@pytest.mark.slow
def test_emulated_devices_join_mid_job_and_nothing_is_lost(ray_session, tmp_path):
    rows = train_disaggregated(load_train_config(None, [*EMULATED, f"run.dir={tmp_path}"]))
    assert [r["step"] for r in rows] == list(range(5))
    assert [r["split"] for r in rows] == [[2, 2], [3, 2], [4, 2], [4, 2], [4, 2]]  # the devices held in the step
    sc = load_scenario("streamrl-pipeline", ["workload.prompts_per_step=8"])
    workload = make_workload(sc.workload, sc.seed)
    expected = {s.sample_id: s.output_length for k in range(5) for s in workload.step(k)}
    events = _events(tmp_path)
    samples = [e for e in events if e["kind"] == "sample"]
    ids = Counter(tuple(e["id"]) for e in samples)
    assert set(ids) == set(expected) and set(ids.values()) == {1}  # every id of every step, exactly once
    assert {tuple(e["id"]): e["output_length"] for e in samples} == expected
    for e in samples:  # exact staleness holds on the joined devices too (async: k-1)
        assert e["weights_version"] == max(0, e["step"] - 1), e
    joins = [e for e in events if e["kind"] == "join"]
    assert [(e["step"], e["devices"], e["first_step"]) for e in joins] == [(0, [4], 3), (1, [5], 4)]
    by_step = {k: {e["instance"] for e in samples if e["step"] == k} for k in range(5)}
    assert by_step[2] <= {0, 1} and 4 in by_step[3] and {4, 5} <= by_step[4], by_step
    assert all(e["groups_created"] == 0 for e in joins)


def test_bad_scale_config_fails_with_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cluster.reserve_devices.*needs reserve devices"):
        load_train_config(None, ["scale.policy=controller"])
    with pytest.raises(ConfigError, match="scale.schedule.*adds more devices"):
        load_train_config(None, ["cluster.reserve_devices=1", "scale.schedule=[{after_step: 0, add: 2}]"])
    with pytest.raises(ConfigError, match="serves no step"):
        load_train_config(None, ["run.steps=3", "cluster.reserve_devices=1",
                                 "scale.schedule=[{after_step: 2, add: 1}]"])
    with pytest.raises(ConfigError, match="exclude each other"):
        load_train_config(None, ["cluster.reserve_devices=1", "scale.policy=controller", "resize.policy=controller"])
    cfg = load_train_config(None, [*TINY, *JOIN, f"run.dir={tmp_path}"])
    with pytest.raises(PoiseError, match="--resume with scale"):
        train_disaggregated(cfg, resume=True)
