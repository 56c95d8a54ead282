"""Session-wide test settings: one torch thread (bitwise results), tiny models made per test, and
the short supervised warm start that every bitwise test trains from (STYLE.md rule 9).

A random-init tiny model scores 0 on every prompt: all advantages are 0, the gradient is 0, and a
bitwise comparison of its checkpoints compares the initial weights with themselves. The bitwise
tests therefore start from `warm_start` (a short SFT on sort prompts, whose 'items' reward gives
partial credit, so the rewards within a group differ from RL step 0 on) and check, with
`RunRecord.assert_learned`, that every step had a non-zero gradient and moved the weights before
they compare anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import importlib.util

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/vllm_backend needs vLLM, which lives in a venv of its own (`make test-vllm`, which .ci/run runs
# too); where this Python has no vLLM they are not collected.
# (poise.rollout.vllm_engine.vllm_installed's test, without importing torch here)
_vllm = importlib.util.find_spec("vllm")
collect_ignore = [] if _vllm is not None and _vllm.origin is not None else ["vllm_backend"]
# Ray in loopback-only mode (see poise/runtime/__init__.py), whichever test imports ray first
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from warm_shape import WARM_START, WARM_START_DATA  # noqa: E402 (tests/warm_shape.py)


@pytest.fixture(autouse=True, scope="session")
def _pin_torch_threads():
    try:
        import torch
    except ImportError:  # policy-only environments
        yield
        return
    torch.set_num_threads(1)
    yield


@dataclass(frozen=True)
class WarmStart:
    path: Path  # HF checkpoint directory (config.json + model.safetensors + tokenizer marker)
    overrides: tuple[str, ...]  # train from it, on the prompt mix it was trained for


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory) -> WarmStart:
    """A short supervised warm start of the tiny model, made once per test session."""
    from poise.config import load_train_config
    from poise.training.sft import run_sft

    cfg = load_train_config(None, WARM_START)
    path = tmp_path_factory.mktemp("warm-start") / "tiny-qwen2-sft"
    run_sft(cfg.model, cfg.data, path, threads=1, progress=False)  # restores the session's one thread after
    return WarmStart(path, (f"model.path={path}", f"data.phases={WARM_START_DATA}"))


@dataclass(frozen=True)
class RunRecord:
    """What a finished run wrote, as the bitwise tests compare it.

    Needs `run.log_tokens=true` (sample events carry `tokens` and the engine's `logprobs`).
    """

    run_dir: Path
    samples: dict[tuple[int, int, int], tuple[list[int], list[float], int]]  # id -> tokens, logprobs, version
    rows: list[dict]  # metrics.jsonl
    events: list[dict]  # events.jsonl

    @property
    def syncs(self) -> list[dict]:
        """The `sync` events (runtime with run.verify_sync), in order."""
        return [e for e in self.events if e["kind"] == "sync"]

    @classmethod
    def read(cls, run_dir: Path) -> "RunRecord":
        run_dir = Path(run_dir)
        events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        samples = {}
        for e in events:
            if e["kind"] != "sample":
                continue
            assert "tokens" in e and "logprobs" in e, (
                f"sample event without tokens/logprobs in {run_dir}: {sorted(e)}; run with run.log_tokens=true")
            sid, value = tuple(e["id"]), (e["tokens"], e["logprobs"], e["weights_version"])
            # a step replayed after --resume logs its samples again: they must be the same
            assert samples.setdefault(sid, value) == value, f"{run_dir}: sample {sid} differs when replayed"
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return cls(run_dir, samples, rows, events)

    # --- checkpoints ---------------------------------------------------------------------------
    def checkpoint(self, step: int) -> Path:
        path = self.run_dir / "checkpoints" / f"step_{step:06d}"
        assert path.is_dir(), f"no checkpoint after step {step} in {self.run_dir}"
        return path

    def checkpoint_steps(self) -> list[int]:
        names = [p.name for p in (self.run_dir / "checkpoints").glob("step_*")]
        return sorted(int(n[5:]) for n in names if n[5:].isdigit())

    def digest(self, step: int, name: str) -> str:
        return hashlib.sha256((self.checkpoint(step) / name).read_bytes()).hexdigest()

    @property
    def steps(self) -> int:
        return len(self.rows)

    # --- the checks ----------------------------------------------------------------------------
    def assert_learned(self, warm_start: WarmStart) -> None:
        """Every step trained on a non-zero gradient and every checkpoint holds new weights, so a
        comparison of this run's tokens, logprobs and bytes with another's could fail."""
        from safetensors.torch import load_file

        assert [r["step"] for r in self.rows] == list(range(self.steps)), [r["step"] for r in self.rows]
        norms = [r["grad_norm"] for r in self.rows]
        assert all(n > 0 for n in norms), f"grad_norm per step {norms}: a zero gradient trains nothing"
        states = [("warm start", warm_start.path / "model.safetensors")]
        states += [(f"step_{k:06d}", self.checkpoint(k) / "model.safetensors") for k in self.checkpoint_steps()]
        assert len(states) >= 2
        for (name_a, a), (name_b, b) in zip(states, states[1:]):
            wa, wb = load_file(str(a)), load_file(str(b))
            assert wa.keys() == wb.keys()
            moved = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
            assert moved > 0, f"{self.run_dir}: the weights of {name_b} equal those of {name_a}"

    def assert_bitwise_equal(self, other: "RunRecord", what: str = "") -> None:
        """Same samples (ids, tokens, logprobs, weights version) and byte-identical checkpoints."""
        where = f"{what}: {self.run_dir} vs {other.run_dir}"
        assert self.samples.keys() == other.samples.keys(), where
        for sid in sorted(self.samples):
            (t_a, lp_a, v_a), (t_b, lp_b, v_b) = self.samples[sid], other.samples[sid]
            assert t_a == t_b, f"{where}: sample {sid} tokens {t_a} != {t_b}"
            assert lp_a == lp_b, f"{where}: sample {sid} logprobs {lp_a} != {lp_b}"
            assert v_a == v_b, f"{where}: sample {sid} weights version {v_a} != {v_b}"
        common = sorted(set(self.checkpoint_steps()) & set(other.checkpoint_steps()))
        assert common and common[-1] == self.steps == other.steps, (where, common)  # the final one at least
        for k in common:
            for name in ("model.safetensors", "optimizer.safetensors"):
                assert self.digest(k, name) == other.digest(k, name), f"{where}: step_{k:06d}/{name} differs"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole test session (ray.init costs seconds here)."""
    from poise.runtime.cluster import start_local  # first: it puts Ray in loopback-only mode

    import ray

    start_local(num_cpus=8)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def read_run():
    """`read_run(run_dir) -> RunRecord`: a finished run's samples, metrics, syncs and checkpoints."""
    return RunRecord.read
