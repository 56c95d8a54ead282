"""The disaggregated runtime reproduces the colocated reference exactly, and fails loudly.

Every run starts from the session's SFT warm start, so rewards differ within groups, every step
has a non-zero gradient and moves the weights (asserted before anything is compared); runs are
compared by every sample's tokens, logprobs and weights version, and by the bytes of the model
and optimizer checkpoints after every step. Each distinct run is made once per module (`runs`).
"""

import shutil
import time
from dataclasses import replace

import pytest
import torch

from poise.config import load_train_config
from poise.errors import ConfigError, PoiseError
from poise.policy.dispatch import DispatchPlan, RoundRobinDispatcher
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

from fault_runs import baseline, crashed
from run_shapes import GROUP, PROMPTS, RunMemo, tiny_job

pytestmark = pytest.mark.ray

STEPS = 3
TINY = tiny_job(STEPS)
RUNTIME = ["run.verify_sync=true"]  # every rollout device's weights digest checked after each sync
# Each split sums a different set of aligned tree nodes, so a wrong reduction order shows in some
# splits only: summing the gathered nodes left to right equals the tree order for 1+3 and 3+1 with
# 6 micro-batches, but not for 2+2 (checked by breaking train/reduce.py on purpose).
SPLITS = [(1, 3), (2, 2), (3, 1)]


def _cfg(run_dir, *extra):
    return load_train_config(None, [*TINY, f"run.dir={run_dir}", *extra])


class Runs:
    """Each distinct run of the module, made once (a Ray run costs seconds here) and shared; the
    plain 2+2 runs are the session's (tests/runtime/fault_runs.py `baseline`, the same config), which
    the fault, resume and multi-node tests compare with too."""

    def __init__(self, tmp_path_factory, warm_start, read_run):
        self.factory, self.warm, self.read = tmp_path_factory, warm_start, read_run
        self.memo = RunMemo(tmp_path_factory.mktemp("runs"),
                            lambda run_dir, *extra: _cfg(run_dir, *warm_start.overrides, *extra), read_run)

    def _run(self, key, train, *extra):
        return self.memo.get("-".join(map(str, key)), train, *extra)

    def colocated(self):
        return self._run(("colocated",), train_colocated, "pipeline.mode=colocated")

    def colocated_with(self, *extra: str):
        return self._run(("colocated", *extra), train_colocated, "pipeline.mode=colocated", *extra)

    def disaggregated(self, mode: str, split: tuple[int, int], *extra: str):
        if split == (2, 2) and not extra:
            return baseline(mode, self.factory, self.warm, self.read)
        return self._run((mode, *split, *extra), train_disaggregated, *RUNTIME, f"pipeline.mode={mode}",
                         f"cluster.split=[{split[0]},{split[1]}]", *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm_start, read_run):
    return Runs(tmp_path_factory, warm_start, read_run)


@pytest.fixture(scope="module")
def reference(runs, warm_start):
    """The colocated loop: the semantic reference of every split, which must itself learn."""
    ref = runs.colocated()
    ref.assert_learned(warm_start)
    assert len(ref.samples) == STEPS * PROMPTS * GROUP
    assert {v for _, _, v in ref.samples.values()} == set(range(STEPS))  # sync: step k uses version k
    return ref


def _assert_syncs(record, split) -> None:
    """One verified sync per step, publishing version k + 1 after step k to every rollout device;
    the rollout devices see new weights every step. Checked against what the devices reported
    and against the weights the run saved after step k (a digest computed here, apart from the run)."""
    assert [(e["step"], e["version"]) for e in record.syncs] == [(k, k + 1) for k in range(STEPS)], record.syncs
    for e in record.syncs:
        saved = _weights_digest(record.checkpoint(e["step"] + 1))
        assert e["digest"] == saved, (e, saved)
        reported = {int(d): digest for d, digest in e["rollout_digests"].items()}
        assert sorted(reported) == list(range(split[0])), e  # every rollout device answered for itself
        assert set(reported.values()) == {saved}, e
    digests = [e["digest"] for e in record.syncs]
    assert len(set(digests)) == STEPS, digests


_DIGESTS: dict = {}


def _weights_digest(checkpoint) -> str:
    """`weights_digest` of the model a checkpoint holds (its config.json and model.safetensors,
    loaded as a model directory of their own: the optimizer file beside them is no model's)."""
    import shutil
    import tempfile

    from poise.model.loading import load_model
    from poise.training.state.digest import weights_digest

    if checkpoint not in _DIGESTS:
        with tempfile.TemporaryDirectory() as model_dir:
            for name in ("config.json", "model.safetensors"):
                shutil.copyfile(checkpoint / name, f"{model_dir}/{name}")
            _DIGESTS[checkpoint] = weights_digest(load_model(model_dir))
    return _DIGESTS[checkpoint]


def _sync_digests(record) -> dict[int, str]:
    return {e["step"]: e["digest"] for e in record.syncs}


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"{s[0]}+{s[1]}")
def test_sync_bitwise_equals_colocated_for_every_split(ray_session, runs, reference, warm_start, split):
    got = runs.disaggregated("sync", split)
    got.assert_learned(warm_start)
    _assert_syncs(got, split)
    got.assert_bitwise_equal(reference, f"sync {split} vs colocated")


def test_train_devices_hold_log_m_gradients_and_receive_a_few_gradients_an_update(ray_session, runs, reference):
    """The streaming tree and the slice exchange, seen in the event log: a device that computes k
    of the step's micro-batches holds at most floor(log2 k) + 1 of their gradients, and receives
    at most 2.5 gradients' bytes per update at 2 and 3 train devices (an all-gather of every
    device's nodes received 2 x 2 = 4 and 3 x 1 = 3)."""
    for split in [(2, 2), (1, 3)]:
        got = runs.disaggregated("sync", split)
        micro = [e for e in got.events if e["kind"] == "interval" and e["phase"] == "micro_batch"]
        updates = [e for e in got.events if e["kind"] == "interval" and e["phase"] == "update"]
        assert micro and updates
        per_device = {}
        for e in micro:
            per_device.setdefault((e["step"], e["device"]), []).append(e["held_grads"])
        for (step, device), held in per_device.items():
            assert max(held) <= len(held).bit_length(), (split, step, device, held)
        for e in updates:
            assert 0 < e["received_bytes"] <= 2.5 * e["grad_bytes"], (split, e)


# gradient checkpointing: the recompute inside the backward gathers too; 4 micro-batches on 3 train
# devices: the second round has two stand-ins
STAND_INS = ("algorithm.gradient_checkpointing=true", "algorithm.micro_batch_size=4")
SHARDED = [((1, 3), "optimizer", ()), ((2, 2), "optimizer", ()), ((1, 3), "full", ()), ((2, 2), "full", ()),
           ((3, 1), "full", ()), ((1, 3), "full", STAND_INS)]


@pytest.mark.parametrize("split,shard,extra", SHARDED,
                         ids=[f"{a}+{b}-{s}{'-checkpointing-stand-ins' if e else ''}" for (a, b), s, e in SHARDED])
def test_sharded_state_equals_colocated_for_every_split(ray_session, runs, reference, warm_start, split, shard,
                                                        extra):
    """cluster.shard=optimizer: each train device steps the AdamW state of its run of parameters
    alone, the checkpoints (written by the leader from every owner's part) hold the same bytes as
    the colocated loop's, and each device holds its part of the state, not all of it. full: the
    same, and each device holds the weights of its run alone (gathered module by module in lockstep
    rounds, each gradient sent to its owner); the weight sync comes from every owner."""
    if extra:  # the colocated loop with the same settings (checkpointing changes no bit there either)
        reference = runs.colocated_with(*extra)
        reference.assert_learned(warm_start)
    got = runs.disaggregated("sync", split, f"cluster.shard={shard}", *extra)
    got.assert_learned(warm_start)
    if extra:  # 4 micro-batches a step on 3 devices: one computed two, the others a stand-in in round 2
        per_device = {}
        for e in got.events:
            if e["kind"] == "interval" and e["phase"] == "micro_batch":
                per_device.setdefault(e["step"], {}).setdefault(e["device"], []).append(e["micro_batch"])
        assert all(sorted(map(len, d.values())) == [1, 1, 2] for d in per_device.values()), per_device
    _assert_syncs(got, split)
    got.assert_bitwise_equal(reference, f"sync {split} sharded vs colocated")
    # the global norm, from every owner's per-tensor norms, is the colocated one (clipping or not)
    assert [r["grad_norm"] for r in got.rows] == [r["grad_norm"] for r in reference.rows]
    whole = runs.disaggregated("sync", (3, 1))
    full = max(e["optimizer_bytes"] for e in whole.events if e["kind"] == "interval" and e["phase"] == "update")
    held = {}
    for e in got.events:
        if e["kind"] == "interval" and e["phase"] == "update":
            held.setdefault(e["device"], set()).add(e["optimizer_bytes"])
    assert len(held) == split[1], held
    parts = [max(b) for b in held.values()]
    assert sum(parts) == full, (parts, full)  # every parameter's state once, nowhere twice
    if split[1] > 1:
        assert max(parts) < full, (parts, full)
    weights = {}  # the parameter bytes each train device held at its updates
    for e in got.events:
        if e["kind"] == "interval" and e["phase"] == "update":
            weights.setdefault(e["device"], set()).add(e["parameter_bytes"])
    whole_weights = {b for e in whole.events if e["kind"] == "interval" and e["phase"] == "update"
                     for b in [e["parameter_bytes"]]}
    if shard == "full":
        assert sum(max(b) for b in weights.values()) == max(whole_weights), (weights, whole_weights)
        if split[1] > 1:
            assert all(max(b) < max(whole_weights) for b in weights.values()), (weights, whole_weights)
    else:
        assert all(b == whole_weights for b in weights.values()), (weights, whole_weights)


@pytest.mark.parametrize("split,shard", [((1, 3), "optimizer"), ((2, 2), "full")], ids=["1+3-optimizer", "2+2-full"])
def test_bfloat16_equals_the_bfloat16_colocated_loop(ray_session, runs, warm_start, split, shard):
    """model.dtype=bfloat16: bf16 compute in the engine and the trainer, fp32 masters and moments
    (in the optimizer state, so they reshard and checkpoint with it); the bitwise promise holds
    within the dtype, sharded or not, and the run is not the fp32 one."""
    reference = runs.colocated_with("model.dtype=bfloat16")
    reference.assert_learned(warm_start)
    got = runs.disaggregated("sync", split, "model.dtype=bfloat16", f"cluster.shard={shard}")
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(reference, f"sync {split} bf16 shard={shard} vs colocated bf16")
    assert [r["grad_norm"] for r in got.rows] == [r["grad_norm"] for r in reference.rows]
    fp32 = runs.colocated()
    assert reference.samples != fp32.samples  # bf16 computes something else
    from safetensors import safe_open

    with safe_open(str(got.checkpoint(STEPS) / "optimizer.safetensors"), framework="pt") as f:
        masters = [k for k in f.keys() if k.endswith("::master")]
        assert masters and all(f.get_tensor(k).dtype == torch.float32 for k in masters)
    with safe_open(str(got.checkpoint(STEPS) / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def _helped_steps(run, split) -> set[int]:
    """Steps in which a rollout device (0..R-1) computed a micro-batch (pipeline.assist)."""
    return {e["step"] for e in run.events if e["kind"] == "interval" and e["phase"] == "micro_batch"
            and e["device"] < split[0]}


@pytest.mark.parametrize("split", [(1, 3), (3, 1)], ids=lambda s: f"{s[0]}+{s[1]}")
def test_devices_assisting_the_other_role_change_nothing(ray_session, runs, reference, warm_start, split):
    """pipeline.assist: the train devices generate beside the rollout devices (they hold the same
    weights), and when generation ends the rollout devices compute a share of the micro-batches
    not yet started; samples and update are still the colocated loop's, bit for bit."""
    got = runs.disaggregated("sync", split, "pipeline.assist=true")
    got.assert_learned(warm_start)
    _assert_syncs(got, split)
    # (whether a rollout device trains depends on how many micro-batches streamed to the train
    # devices before generation ended: asserted where none can, in the non-streaming test below)
    lent = {(e["step"], e["instance"]) for e in got.events if e["kind"] == "sample" and e["instance"] >= split[0]}
    assert {k for k, _ in lent} == set(range(STEPS)), f"no train device generated in some step: {sorted(lent)}"
    got.assert_bitwise_equal(reference, f"sync {split} with assist vs colocated")


def test_assist_with_two_updates_a_step_equals_colocated(ray_session, runs, warm_start):
    """Two mini-batches, two updates a step: samples a train device generates carry the step's
    weights version (not a count of updates), and its updates wait for its engine to be idle
    (EngineLoop.wait_idle, tests/runtime/test_roles.py), so no sample mixes weights."""
    ref = runs.colocated_with("algorithm.updates_per_step=2")
    got = runs.disaggregated("sync", (2, 2), "pipeline.assist=true", "algorithm.updates_per_step=2")
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(ref, "sync 2+2 with assist and 2 updates a step vs colocated")


@pytest.mark.parametrize("split, extra", [((2, 2), ()), ((1, 3), ("pipeline.assist=true",))],
                         ids=["2+2", "1+3-assist"])
def test_non_streaming_sync_with_samples_sent_ahead_changes_nothing(ray_session, runs, reference, warm_start,
                                                                    split, extra):
    """pipeline.streaming=false: every micro-batch complete before the batch is goes to its owner
    ahead of the call that trains it (with assist, some then go to a rollout device instead);
    the update is still the colocated loop's, bit for bit."""
    got = runs.disaggregated("sync", split, "pipeline.streaming=false", *extra)
    got.assert_learned(warm_start)
    _assert_syncs(got, split)
    if extra:  # every micro-batch is unstarted when generation ends: the rollout device takes a share
        assert _helped_steps(got, split) == set(range(STEPS)), "no rollout device trained in some step"
    got.assert_bitwise_equal(reference, f"non-streaming sync {split} {extra} vs colocated")


def test_sync_weight_digests_agree_across_splits(ray_session, runs):
    digests = [_sync_digests(runs.disaggregated("sync", split)) for split in SPLITS]
    assert digests[0] == digests[1] == digests[2]


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"{s[0]}+{s[1]}")
def test_async_samples_carry_weights_version_k_minus_1(ray_session, runs, reference, warm_start, split):
    got = runs.disaggregated("async", split)
    got.assert_learned(warm_start)
    _assert_syncs(got, split)
    assert len(got.samples) == STEPS * PROMPTS * GROUP
    for (step, p, g), (tokens, logprobs, version) in got.samples.items():
        assert version == max(0, step - 1), ((step, p, g), version)
        ref_tokens, ref_logprobs, _ = reference.samples[(step, p, g)]
        if step == 0:  # the same prompts under the same initial weights: the sync run's samples
            assert (tokens, logprobs) == (ref_tokens, ref_logprobs), (step, p, g)
    # from step 1 on they were made under older weights than sync's, and it shows
    later = [sid for sid in got.samples if sid[0] >= 1]
    assert any(got.samples[sid][1] != reference.samples[sid][1] for sid in later)


@pytest.mark.parametrize("split", [(1, 3), (3, 1)], ids=lambda s: f"{s[0]}+{s[1]}")
def test_async_bitwise_identical_across_splits(ray_session, runs, warm_start, split):
    base = runs.disaggregated("async", (2, 2))
    got = runs.disaggregated("async", split)
    base.assert_learned(warm_start)
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(base, f"async {split} vs async (2, 2)")
    assert _sync_digests(got) == _sync_digests(base)


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


def test_reordering_dispatcher_changes_nothing(ray_session, tmp_path, reference, warm_start, read_run):
    train_disaggregated(_cfg(tmp_path, *warm_start.overrides, *RUNTIME, "pipeline.mode=sync", "cluster.split=[2,2]"),
                        dispatcher=_Reversed())
    got = read_run(tmp_path)
    got.assert_learned(warm_start)
    _assert_syncs(got, (2, 2))
    got.assert_bitwise_equal(reference, "reversed dispatch vs colocated")
    # what the model wrote: the same samples, chosen by id whatever arrived first, as the colocated loop's
    from poise.completions import read_completions

    rows = read_completions(tmp_path)
    assert [tuple(r["id"]) for r in rows] == [(k, i, 0) for k in range(STEPS) for i in range(PROMPTS)], rows
    assert rows == read_completions(reference.run_dir) and any(r["completion"] for r in rows)


def test_dropping_dispatcher_fails_loudly(ray_session, tmp_path, warm_start):
    # two devices: half the start-up of four, and the loss is the same
    with pytest.raises(PoiseError, match=r"step 0: 4 of 16 samples never arrived \(\(0, 3, 0\)"):
        train_disaggregated(_cfg(tmp_path, *warm_start.overrides, *RUNTIME, "pipeline.mode=sync",
                                 "cluster.devices=2", "cluster.split=[1,1]"), dispatcher=_Lossy())


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


def test_sync_resume_after_a_crash_ends_byte_identical(ray_session, tmp_path, tmp_path_factory, reference,
                                                       warm_start, read_run):
    # the session's 2+2 run crashed at step 2's dispatch (tests/runtime/fault_runs.py `crashed`:
    # this module's config, as `baseline` is), copied: tests/runtime/test_resume.py resumes it too
    shutil.copytree(crashed("sync", tmp_path_factory.getbasetemp(), warm_start), tmp_path, dirs_exist_ok=True)
    assert (tmp_path / "checkpoints/latest").read_text().strip() == "step_000002"
    cfg = _cfg(tmp_path, *warm_start.overrides, *RUNTIME, "pipeline.mode=sync", "cluster.split=[2,2]")
    train_disaggregated(cfg, resume=True)  # the default dispatcher: dispatch must not matter either
    got = read_run(tmp_path)  # steps 0-1 from the first run, step 2 from the resumed one
    got.assert_learned(warm_start)
    _assert_syncs(got, (2, 2))
    got.assert_bitwise_equal(reference, "crashed and resumed vs colocated")

# An async run resumes too (issue 11): tests/runtime/test_resume.py.


def test_semantic_full_shard_learns_and_its_first_update_is_the_bitwise_one_up_to_rounding(ray_session, runs,
                                                                                            reference, warm_start):
    """determinism=semantic with cluster.shard=full: each owner keeps a running sum of the arriving
    gradients (reassociation allowed) instead of the fixed tree. The first step's samples come from
    the same weights, so its gradient norm is the bitwise run's up to rounding; the run learns."""
    got = runs.disaggregated("sync", (2, 2), "determinism=semantic", "cluster.shard=full")
    got.assert_learned(warm_start)
    first, exact = got.rows[0]["grad_norm"], reference.rows[0]["grad_norm"]
    assert first == pytest.approx(exact, rel=1e-4), (first, exact)
