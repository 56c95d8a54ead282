"""LoRA keeps the bitwise promise: colocated = sync 3+1 resized live to 1+3 after step 0 (the
joiners' optimizer state streams in); in bfloat16, colocated = sync 1+3 with the optimizer sharded
over its three train devices (the adapter's fp32 masters and moments split among owners).

From the session's SFT warm start (rewards differ within groups), so the adapter moves every step
(asserted: B leaves zero at step 0, A moves from step 1 on, and every checkpoint's adapter differs
from the one before it). Compared by every sample's tokens and logprobs (the engine applies the
adapter: from step 1 on they are the adapter's) and the bytes of the checkpoints' adapter and
optimizer state after every step. A checkpoint holds the adapter alone, and the live resize moves
the adapter's optimizer state alone.
"""

import pytest
import torch
from safetensors.torch import load_file

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

from run_shapes import tiny_job

pytestmark = pytest.mark.ray

STEPS = 2
LORA = ["model.lora.r=4", "model.lora.alpha=8", "algorithm.lr=3e-3"]


def _run(train, run_dir, warm_start, read_run, *extra):
    train(load_train_config(None, [*tiny_job(STEPS), f"run.dir={run_dir}", *warm_start.overrides, *LORA, *extra]))
    return read_run(run_dir)


def _assert_adapter_moved(record) -> dict[str, int]:
    """Every step trained a non-zero gradient and moved the adapter; returns its tensors' sizes."""
    assert [r["step"] for r in record.rows] == list(range(STEPS))
    assert all(r["grad_norm"] > 0 for r in record.rows), [r["grad_norm"] for r in record.rows]
    states = [load_file(str(record.checkpoint(k) / "model.safetensors")) for k in record.checkpoint_steps()]
    assert len(states) == STEPS
    for state in states:
        assert state and all(".lora_A." in name or ".lora_B." in name for name in state), sorted(state)[:4]
    b_moved = [name for name, t in states[0].items() if ".lora_B." in name and t.abs().max() > 0]
    assert b_moved, "step 0 left every lora_B at its initial zero"
    for before, after in zip(states, states[1:]):
        assert before.keys() == after.keys()
        moved = {name.split(".lora_")[1][0] for name in before if not before[name].equal(after[name])}
        assert moved == {"A", "B"}, f"{record.run_dir}: only lora_{moved} moved between checkpoints"
    optimizer = load_file(str(record.checkpoint(STEPS) / "optimizer.safetensors"))
    assert {key.split("::")[0] for key in optimizer} == set(states[0]), "optimizer state of a frozen weight"
    return {name: t.numel() for name, t in states[0].items()}


def test_lora_bitwise_equal_across_splits_and_a_live_resize(ray_session, tmp_path, warm_start, read_run):
    ref = _run(train_colocated, tmp_path / "colocated", warm_start, read_run, "pipeline.mode=colocated")
    sizes = _assert_adapter_moved(ref)
    resized = _run(train_disaggregated, tmp_path / "sync-3-1-resized", warm_start, read_run, "run.verify_sync=true",
                   "pipeline.mode=sync", "cluster.split=[3,1]", "resize.schedule=[{at_step: 1, split: [1, 3]}]")
    assert [r["split"] for r in resized.rows] == [[3, 1], [1, 3]]
    resized.assert_bitwise_equal(ref, "LoRA: sync 3+1 -> 1+3 vs colocated")
    # each of the two joiners received the adapter's AdamW state (step, exp_avg, exp_avg_sq per tensor),
    # not the model's
    (event,) = [e for e in resized.events if e["kind"] == "resize"]
    assert event["optimizer_bytes"] == 2 * 4 * (len(sizes) + 2 * sum(sizes.values())), event


def test_lora_bfloat16_equals_the_bfloat16_colocated_loop(ray_session, tmp_path, warm_start, read_run):
    """model.dtype=bfloat16: a bf16 adapter on the bf16 base, its fp32 master in the optimizer state
    beside the moments; the promise holds within the dtype, with the optimizer sharded."""
    bf16 = "model.dtype=bfloat16"
    ref = _run(train_colocated, tmp_path / "colocated", warm_start, read_run, "pipeline.mode=colocated", bf16)
    _assert_adapter_moved(ref)
    got = _run(train_disaggregated, tmp_path / "sync-1-3-sharded", warm_start, read_run, "run.verify_sync=true",
               "pipeline.mode=sync", "cluster.split=[1,3]", "cluster.shard=optimizer", bf16)
    got.assert_bitwise_equal(ref, "LoRA bf16: sync 1+3 sharded vs colocated")
    state = load_file(str(got.checkpoint(STEPS) / "optimizer.safetensors"))
    masters = [k for k in state if k.endswith("::master")]
    assert masters and all(state[k].dtype == torch.float32 for k in masters)
    assert {t.dtype for t in load_file(str(got.checkpoint(STEPS) / "model.safetensors")).values()} == {torch.bfloat16}
