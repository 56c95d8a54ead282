"""Fault injection (poise/injection.py): the product names no test hook, does nothing by default,
and calls the injector at each named moment; an injector comes from `install` or POISE_FAULTS.
The deaths themselves are tested where they happen (tests/runtime/test_faults.py,
tests/training/test_checkpoint_durable.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from poise import injection
from poise.errors import PoiseError
from poise.injection import ENV, FaultInjector, NoFaults

from fault_injection import Faults  # tests/fault_injection.py

SRC = Path(__file__).resolve().parent.parent / "src"
# the names the fault tests' hooks had when they lived in product code
TEST_HOOKS = re.compile(r"POISE_TEST|test_kill|test_hang|_maybe_hang|kill_hooks|hang_hook|SyncKill|KILL_AT")


def _moments(cls) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def test_the_product_names_no_test_hook():
    found = [f"{path.relative_to(SRC)}:{n}: {line.strip()}" for path in sorted(SRC.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if TEST_HOOKS.search(line)]
    assert found == [], "\n".join(found)


def test_no_faults_and_the_tests_injector_have_every_moment():
    moments = _moments(FaultInjector)
    assert {"phase_reached", "deaths", "before_submit", "before_train", "sync_started", "sync_finished",
            "checkpoint_part_written"} <= moments
    assert moments <= _moments(NoFaults) and moments <= _moments(Faults)
    for name in moments:  # the same arguments, so a call site fits every implementation
        want = list(inspect.signature(getattr(FaultInjector, name)).parameters)
        assert list(inspect.signature(getattr(NoFaults, name)).parameters) == want, name
        assert list(inspect.signature(getattr(Faults, name)).parameters) == want, name


def test_a_process_runs_with_no_faults_unless_one_is_installed_or_named(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert isinstance(injection.current(), NoFaults)
    faults = Faults(checkpoint="model:1")
    injection.install(faults)
    try:
        assert injection.current() is faults
    finally:
        injection.install(None)
    monkeypatch.setenv(ENV, "fault_injection:from_environment")  # a module on sys.path, and a factory
    monkeypatch.setenv("FAULTS_CHECKPOINT", "state:3")
    assert injection.current().checkpoint == "state:3"


def test_an_injector_loads_from_a_file_by_its_object_or_factory(tmp_path):
    (tmp_path / "mine.py").write_text("class Mine:\n    def phase_reached(self, phase, step, workers):\n"
                                      "        pass\n\nONE = Mine()\n\ndef make():\n    return Mine()\n")
    one = injection.load(f"{tmp_path / 'mine.py'}:ONE")
    assert type(one).__name__ == "Mine"
    assert type(injection.load(f"{tmp_path / 'mine.py'}:make")) is type(one)
    assert type(injection.load(f"{tmp_path / 'mine.py'}:Mine")) is type(one)


@pytest.mark.parametrize("spec,why", [("nocolon", "expected"), ("no_such_module_xyz:X", "cannot load"),
                                      ("/no/such/file.py:X", "cannot load"), ("poise.injection:Missing", "has no"),
                                      ("poise.injection:ENV", "neither an injector")])
def test_a_bad_poise_faults_is_one_line_naming_it(spec, why):
    with pytest.raises(PoiseError) as e:
        injection.load(spec)
    message = str(e.value)
    assert "\n" not in message and f"{ENV}={spec!r}" in message and why in message, message


class _Recorder(NoFaults):
    """Notes each checkpoint moment with what is on disk at that moment."""

    def __init__(self, root: Path):
        self.root, self.seen = root, []

    def checkpoint_part_written(self, part: str, step: int) -> None:
        entries = sorted(re.sub(r"-\d+$", "", p.name) for p in self.root.iterdir())  # less the writer's pid
        self.seen.append((part, step, entries))


def test_a_checkpoint_save_reaches_each_moment_between_its_writes(tmp_path):
    import torch

    from poise.config import TinyModelConfig
    from poise.model.loading import build_tiny
    from poise.training.checkpoint import TrainState, save_checkpoint

    model = build_tiny(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                       intermediate_size=32, max_positions=32), 40, seed=0)
    save_checkpoint(tmp_path, model, torch.optim.AdamW(model.parameters()), TrainState(1, 1))
    recorder = _Recorder(tmp_path / "checkpoints")
    injection.install(recorder)
    try:
        save_checkpoint(tmp_path, model, torch.optim.AdamW(model.parameters()), TrainState(2, 2))
    finally:
        injection.install(None)
    partial = [".tmp-step_000002", "latest", "step_000001"]
    assert recorder.seen == [("model", 2, partial), ("optimizer", 2, partial), ("state", 2, partial),
                             ("marker", 2, [".tmp-latest", "latest", "step_000001", "step_000002"])]


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_a_poise_faults_that_does_not_load_stops_the_run_before_any_work(tmp_path, monkeypatch, mode):
    from poise.config import load_train_config
    from poise.runtime.driver import train_disaggregated
    from poise.training.colocated import train_colocated

    monkeypatch.setenv(ENV, "no_such_module_xyz:Faults")
    cfg = load_train_config(None, [f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(PoiseError, match=f"{ENV}='no_such_module_xyz:Faults'"):
        (train_colocated if mode == "colocated" else train_disaggregated)(cfg)
    assert not (tmp_path / "run").exists()  # nothing was started or written
