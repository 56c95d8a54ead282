"""Device types and cross-datacenter links in the simulator (scenarios streamrl-hetero and
streamrl-crossdc; benchmarks/sim_hetero.py prints the full tables)."""

from __future__ import annotations

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.sim import load_scenario, simulate
from poise.sim.driver import Simulation

QUIET = ["log.samples=false", "log.intervals=none"]


def pinned(d) -> list[str]:
    return [f"split=[{d.split.rollout},{d.split.train}]", f"cluster.rollout_type={d.rollout_type}",
            f"cluster.train_type={d.train_type}", f"cluster.batch_cap={d.batch_cap}"]


def test_one_device_type_on_the_reference_reproduces_the_homogeneous_run():
    plain = simulate(load_scenario("streamrl-pipeline", QUIET + ["steps=12", "split=[10,6]"]))
    typed = simulate(load_scenario("streamrl-pipeline", QUIET + [
        "steps=12", "split=[10,6]", "cluster.device_types=[{name: h800, count: 16}]", "cost.device=h800"]))
    assert typed.as_dict() == plain.as_dict()
    h20 = simulate(load_scenario("streamrl-pipeline", QUIET + [
        "steps=12", "split=[10,6]", "cluster.device_types=[{name: h20, count: 16}]", "cost.device=h800"]))
    assert h20.total_s != plain.total_s  # the type is priced: the equality above is not vacuous


def test_streamrl_hetero_per_type_split_beats_the_best_single_type_split_per_dollar():
    steps = ["steps=10"]
    sim = Simulation(load_scenario("streamrl-hetero", QUIET + steps))
    plan, fleet = sim.device_plan, sim.sc.fleet()
    assert plan is not None and fleet is not None
    assert (plan.best.rollout_type, plan.best.train_type) == ("h20", "h800")
    assert sim.split == plan.best.split and sim.roles == ("h20", "h800")

    def per_dollar(d) -> float:
        s = simulate(load_scenario("streamrl-hetero", QUIET + steps + pinned(d)))
        return s.tokens_per_s * 3600.0 / fleet.split_price(d.rollout_type, d.split.rollout, d.train_type, d.split.train)

    best = per_dollar(plan.best)
    assert all(d.price_per_hour <= 32.0 for d in [plan.best, *plan.single_type.values()])
    assert best > 1.05 * max(per_dollar(d) for d in plan.single_type.values())


def test_streamrl_crossdc_sync_crosses_the_link_and_async_hides_most_of_it():
    sim = Simulation(load_scenario("streamrl-crossdc", QUIET + ["steps=8"]))
    assert sim.device_plan is not None
    pin = QUIET + ["steps=8"] + pinned(sim.device_plan.best)

    def run(gbps: float, mode: str, free: bool = False) -> tuple[float, float]:
        over = pin + [f"cluster.links[0].gbps={gbps}", f"pipeline.mode={mode}"]
        over += ["cost.weight_bytes=0", "cost.sync_latency_s=0"] if free else []
        s = Simulation(load_scenario("streamrl-crossdc", over))
        return s.sync_s, s.run().step_s_mean

    slow, fast = run(10, "async"), run(400, "async")
    assert slow[0] > 10 * fast[0]  # 15.2 GB over 10 vs 400 Gbps
    _, free_async = run(10, "async", free=True)
    sync_slow, free_sync = run(10, "sync")[1], run(10, "sync", free=True)[1]
    exposed_async, exposed_sync = slow[1] - free_async, sync_slow - free_sync
    assert 0 < exposed_async < 0.6 * exposed_sync  # async overlaps the sync with the next step
    assert exposed_sync == pytest.approx(slow[0] * 7 / 8, rel=0.02)  # sync waits for all of it (steps 1..7)


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_bad_device_types_and_links_are_one_line_errors(command, tmp_path):
    out = ["--out", str(tmp_path / "run")] if command == "simulate" else []
    assert_one_line_error(poise(command, "streamrl-crossdc", "cluster.device_types[1].name=h900", *out),
                          "cluster.device_types[1].name", "'h900'", "unknown device type", "h20, h800")
    assert_one_line_error(poise(command, "streamrl-crossdc", "cluster.device_types[0].price_per_hour=0", *out),
                          "cluster.device_types[0].price_per_hour", "must be > 0")
    assert_one_line_error(poise(command, "streamrl-crossdc", "cluster.links[0].between=[dc-train, dc-moon]", *out),
                          "cluster.links[0].between", "unknown device group 'dc-moon'", "dc-gen, dc-train")
    assert_one_line_error(poise(command, "streamrl-hetero", "cluster.rollout_type=h900", *out),
                          "cluster.rollout_type", "'h900'", "h800, h20")
    assert not (tmp_path / "run").exists()


def test_poise_plan_reports_step_time_and_throughput_per_dollar():
    r = poise("plan", "streamrl-hetero", "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert "planner" in r.stdout and "h800 only" in r.stdout and "h20 only" in r.stdout
    assert "sim s/step" in r.stdout and "sim tok/$" in r.stdout
    assert "recommended: " in r.stdout and "h20 rollout +" in r.stdout
    assert "x the throughput per dollar of the best single-type split" in r.stdout
