"""The disaggregated runtime reproduces the colocated reference exactly, and fails loudly."""

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from poise.config import load_train_config
from poise.errors import ConfigError, PoiseError
from poise.policy.dispatch import DispatchPlan, RoundRobinDispatcher
from poise.runtime.driver import train_disaggregated
from poise.runtime.trainer_group import SampleSetError
from poise.train.colocated import train_colocated

pytestmark = pytest.mark.ray

TINY = [
    "run.progress=false",
    "run.log_tokens=true",
    "run.steps=3",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.micro_batch_size=3",  # 16 samples -> 6 uneven micro-batches
    "algorithm.sampling.max_new_tokens=12",
    "model.tiny.hidden_size=32",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_positions=96",
    "rollout.num_slots=8",
    "cluster.devices=4",
]


def _cfg(run_dir, *extra):
    return load_train_config(None, [*TINY, f"run.dir={run_dir}", *extra])


def _tokens(run_dir: Path) -> dict:
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return {tuple(e["id"]): (e["tokens"], e["weights_version"]) for e in events if e["kind"] == "sample"}


def _final(run_dir: Path, steps: int = 3) -> dict:
    ckpt = run_dir / "checkpoints" / f"step_{steps:06d}"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ckpt.iterdir())
            if p.name in ("model.safetensors", "optimizer.safetensors")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("colocated")
    train_colocated(_cfg(run_dir, "pipeline.mode=colocated"))
    return _tokens(run_dir), _final(run_dir)


@pytest.mark.parametrize("split", [[1, 3], [2, 2], [3, 1]])
def test_sync_bitwise_equals_colocated_for_every_split(ray_session, tmp_path, reference, split):
    tokens, final = reference
    train_disaggregated(_cfg(tmp_path, "pipeline.mode=sync", f"cluster.split={split}"))
    got = _tokens(tmp_path)
    assert set(got) == set(tokens)
    assert got == tokens  # every sample's token ids, and the weights version it was made under
    assert _final(tmp_path) == final  # final weights and optimizer state, byte for byte


def test_async_samples_carry_weights_version_k_minus_1(ray_session, tmp_path):
    train_disaggregated(_cfg(tmp_path, "pipeline.mode=async", "cluster.split=[2,2]", "run.steps=4"))
    versions = {sid: v for sid, (_, v) in _tokens(tmp_path).items()}
    assert len(versions) == 4 * 16
    for (step, _, _), version in versions.items():
        assert version == max(0, step - 1), (step, version)


class _Reversed(RoundRobinDispatcher):
    """Submits each step's prompts in reverse order: arrival order changes, results must not."""

    def plan(self, prompts, instances):
        plan = super().plan(prompts, instances)
        return replace(plan, order=tuple(reversed(plan.order)))


class _Lossy(RoundRobinDispatcher):
    """Forgets the last prompt of every step."""

    def plan(self, prompts, instances):
        plan = super().plan(prompts, instances)
        return DispatchPlan(order=plan.order[:-1], batch_caps=plan.batch_caps)


def test_reordering_dispatcher_changes_nothing(ray_session, tmp_path, reference):
    tokens, final = reference
    train_disaggregated(_cfg(tmp_path, "pipeline.mode=sync", "cluster.split=[2,2]"), dispatcher=_Reversed())
    assert _tokens(tmp_path) == tokens
    assert _final(tmp_path) == final


def test_dropping_dispatcher_fails_loudly(ray_session, tmp_path):
    with pytest.raises(SampleSetError, match=r"step 0: 4 of 16 samples never arrived \(\(0, 3, 0\)"):
        train_disaggregated(_cfg(tmp_path, "pipeline.mode=sync", "cluster.split=[2,2]"), dispatcher=_Lossy())


def test_more_devices_than_the_cluster_has(ray_session, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(PoiseError, match="cluster.devices=64 but the Ray cluster has 8 CPUs"):
        train_disaggregated(_cfg(tmp_path, "pipeline.mode=sync", "cluster.devices=64"))
    assert time.monotonic() - t0 < 30


def test_cluster_address_that_does_not_answer(ray_session, tmp_path):
    from poise.runtime.cluster import free_port

    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(PoiseError, match=f"cluster.address '{address}' does not answer"):
        train_disaggregated(_cfg(tmp_path, "pipeline.mode=sync", f"cluster.address={address}",
                                 "cluster.connect_timeout_s=5"))
    assert time.monotonic() - t0 < 30


def test_split_with_zero_train_devices(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster.split.*both roles need at least one device"):
        _cfg(tmp_path, "cluster.split=[4,0]")


def test_sync_resume_after_a_crash_ends_byte_identical(ray_session, tmp_path, reference, monkeypatch):
    from poise.runtime import driver

    tokens, final = reference
    original = driver.Driver.log_step

    def crash_in_step_2(self, log, step, *args):
        if step == 2:
            raise RuntimeError("simulated crash")
        return original(self, log, step, *args)

    cfg = _cfg(tmp_path, "pipeline.mode=sync", "cluster.split=[2,2]", "run.checkpoint_every=1")
    monkeypatch.setattr(driver.Driver, "log_step", crash_in_step_2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_disaggregated(cfg)
    monkeypatch.setattr(driver.Driver, "log_step", original)
    assert (tmp_path / "checkpoints/latest").read_text().strip() == "step_000002"
    train_disaggregated(cfg, resume=True)
    assert _final(tmp_path) == final
    assert _tokens(tmp_path) == tokens  # steps 0-1 from the first run, step 2 from the resumed one


def test_async_resume_is_refused_before_any_work(tmp_path):
    with pytest.raises(PoiseError, match="--resume of pipeline.mode=async is not supported yet"):
        train_disaggregated(_cfg(tmp_path / "run", "pipeline.mode=async"), resume=True)
    assert not (tmp_path / "run").exists()
