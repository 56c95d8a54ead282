"""The colocated reference loop: determinism, exact resume, and its run-log format.

Every run starts from the session's SFT warm start, so each step has rewards that differ within
groups, a non-zero gradient and new weights (asserted): a byte-identical checkpoint means the same
training, not the same untouched initial weights.
"""

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from poise.config import load_train_config
from poise.training import colocated
from poise.training.colocated import train_colocated

STEPS = 4
FAST = [
    "pipeline.mode=colocated",
    "run.progress=false",
    "run.log_tokens=true",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.micro_batch_size=3",  # uneven micro-batches exercise the tree reduction
    "algorithm.sampling.max_new_tokens=12",
    "rollout.num_slots=8",
]


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _cfg(run_dir, warm_start, *extra):
    return load_train_config(None, [*FAST, *warm_start.overrides, f"run.dir={run_dir}", *extra])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm_start, read_run):
    run_dir = tmp_path_factory.mktemp("colocated") / "reference"
    train_colocated(_cfg(run_dir, warm_start, f"run.steps={STEPS}", "run.checkpoint_every=1"))
    ref = read_run(run_dir)
    ref.assert_learned(warm_start)
    return ref


def test_same_seed_gives_byte_identical_checkpoints(tmp_path, reference, warm_start, read_run):
    train_colocated(_cfg(tmp_path / "b", warm_start, f"run.steps={STEPS}", "run.checkpoint_every=1"))
    again = read_run(tmp_path / "b")
    again.assert_learned(warm_start)
    again.assert_bitwise_equal(reference, "same seed")
    a, b = _digest(reference.checkpoint(STEPS)), _digest(again.checkpoint(STEPS))
    assert {"config.json", "model.safetensors", "optimizer.safetensors", "state.json"} <= set(a)
    assert a == b
    # and the seed matters, so this comparison could fail
    train_colocated(_cfg(tmp_path / "c", warm_start, "run.steps=2", "run.seed=1"))
    other = read_run(tmp_path / "c")
    other.assert_learned(warm_start)
    assert other.digest(2, "model.safetensors") != reference.digest(2, "model.safetensors")


def test_resume_after_a_crash_ends_byte_identical(tmp_path, monkeypatch, reference, warm_start, read_run):
    original = colocated.ColocatedLoop.run_step

    def crash_in_step_3(self, step, log):
        if step == 3:
            raise RuntimeError("simulated crash")
        return original(self, step, log)

    monkeypatch.setattr(colocated.ColocatedLoop, "run_step", crash_in_step_3)
    # a checkpoint every 2 steps: step 2 ran before the crash and runs again after the resume
    cfg = _cfg(tmp_path / "resumed", warm_start, f"run.steps={STEPS}", "run.checkpoint_every=2")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_colocated(cfg)
    monkeypatch.setattr(colocated.ColocatedLoop, "run_step", original)
    assert (tmp_path / "resumed/checkpoints/latest").read_text().strip() == "step_000002"
    train_colocated(cfg, resume=True)

    resumed = read_run(tmp_path / "resumed")  # a replayed step's samples must equal its first run's
    resumed.assert_learned(warm_start)
    resumed.assert_bitwise_equal(reference, "crashed and resumed vs uninterrupted")
    assert _digest(resumed.checkpoint(STEPS)) == _digest(reference.checkpoint(STEPS))
    assert [r["step"] for r in resumed.rows] == list(range(STEPS))
    for key in ("reward_mean", "grad_norm", "loss"):
        assert [r[key] for r in resumed.rows] == [r[key] for r in reference.rows], key


def test_metrics_and_events_follow_the_run_log_format(reference):
    rows = reference.rows
    for key in ("step", "reward_mean", "response_len_mean", "response_len_p50", "response_len_p99",
                "response_len_max", "step_s", "phases", "tokens_per_s", "grad_norm", "loss"):
        assert key in rows[0]
    assert [r["weights_version"] for r in rows] == list(range(STEPS))  # sync: samples of step k use version k
    kinds = {e["kind"] for e in reference.events}
    assert {"interval", "sample", "step"} <= kinds
    assert sorted(reference.samples) == [(s, p, g) for s in range(STEPS) for p in range(4) for g in range(4)]
    for e in reference.events:
        if e["kind"] == "sample":
            assert len(e["tokens"]) == len(e["logprobs"]) == e["output_length"] >= 1, e
            assert all(isinstance(x, float) and x <= 0 for x in e["logprobs"]), e


def test_bitwise_threads_set_deterministic_algorithms_without_the_compiler():
    """pin_threads(bitwise) turns torch's deterministic algorithms on (warn only) in a fresh process,
    and does not import torch._inductor as torch.use_deterministic_algorithms would (~2 s, ~70 MB
    for every device process)."""
    import subprocess
    import sys

    code = ("import sys, torch; from poise.training.setup import pin_threads; pin_threads(1, True); "
            "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
            " 'torch._inductor' in sys.modules, torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False", "1"], out


def test_gradient_checkpointing_changes_no_bit(tmp_path, reference, warm_start, read_run):
    """algorithm.gradient_checkpointing ends a run on the reference's bytes."""
    train_colocated(_cfg(tmp_path / "gc", warm_start, f"run.steps={STEPS}", "run.checkpoint_every=1",
                         "algorithm.gradient_checkpointing=true"))
    got = read_run(tmp_path / "gc")
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(reference, "gradient checkpointing vs without")
    assert _digest(got.checkpoint(STEPS)) == _digest(reference.checkpoint(STEPS))


def test_gradient_checkpointing_keeps_fewer_activations_for_the_same_gradient(warm_start):
    """It is on (the forward keeps fewer bytes for the backward pass) and the gradient is the same."""
    import torch

    from poise.model.loading import load_model
    from poise.training.trainer import PolicyTrainer
    from poise.types import Sample

    cfg = _cfg("unused", warm_start)
    samples = [Sample((0, 0, j), tuple(range(3, 13)), tuple(range(20, 20 + 8 + j)), tuple([-1.5] * (8 + j)), "stop", 0, 0.0, 0.0, 16)
               for j in range(4)]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    grads, kept = {}, {}
    for on in (False, True):
        model = load_model(warm_start.path)
        trainer = PolicyTrainer(model, replace(cfg.algorithm, gradient_checkpointing=on), 0)
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = trainer.micro_batch_grad(0, samples, advantages)
        grads[on], kept[on] = result.grads, sum(saved)
    assert kept[True] < 0.8 * kept[False], kept
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))


def test_completions_show_each_steps_samples_as_text(reference, warm_start):
    """RUN_DIR/completions.jsonl: run.log_completions (4) samples a step, chosen by id (sample 0 of
    each prompt), each the decoded text of the tokens the sample event logged, with its reward, every
    reward function's value, length and finish reason."""
    from poise.completions import read_completions
    from poise.data.prompts import make_tokenizer

    cfg = _cfg(reference.run_dir, warm_start)
    tokenizer = make_tokenizer(cfg.data, cfg.model)
    rows = read_completions(reference.run_dir)
    assert [tuple(r["id"]) for r in rows] == [(k, i, 0) for k in range(STEPS) for i in range(4)]
    events = {tuple(e["id"]): e for e in reference.events if e["kind"] == "sample"}
    functions = {k for r in reference.rows for k in r if k.startswith("reward/")}
    for r in rows:
        e = events[tuple(r["id"])]
        assert r["completion"] == tokenizer.decode([t for t in e["tokens"] if t != tokenizer.eos_id]), r
        assert (r["reward"], r["length"], r["prompt_id"]) == (e["reward"], e["output_length"], e["prompt_id"])
        assert {f"reward/{k}" for k in r["rewards"]} == functions and r["finish_reason"] in ("eos", "stop", "length")
        assert r["prompt"] and not r["truncated"]
    assert any(r["completion"] for r in rows)
