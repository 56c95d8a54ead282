"""Fault injection: the named moments of a run at which a fault can be made to happen on purpose (a
device's process killed or stalled, the process killed inside a checkpoint write), to test and
measure recovery with real deaths, not mocks (docs/fault-injection.md). Torch-free and Ray-free.

The product calls a `FaultInjector` at each moment; `NoFaults`, which does nothing, is what a run
gets unless one is installed. A process has one injector: the one `install` set, else the one the
environment variable POISE_FAULTS names, `<module or path/to/file.py>:<name>`, where `<name>` is an
injector or a function of no arguments that returns one. The driver hands its injector to every
device in the device's WorkerSpec, where it is installed too, so an injector must pickle (a class
from a file that the device processes cannot import has its module pickled by value:
`ray.cloudpickle.register_pickle_by_value`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Protocol, Sequence

from poise.errors import PoiseError

ENV = "POISE_FAULTS"


class FaultInjector(Protocol):
    """What a run calls at each moment where a fault can be injected. Each call may kill or stall
    the process it runs in (or, from the driver, a device's); returning changes nothing."""

    def phase_reached(self, phase: str, step: int, workers: Sequence) -> None:
        """The driver at `phase` of `step`: generate (the step's first samples arrived), train
        (its generation over, its micro-batches queued or running), publish (its update done, the
        weight sync in flight), checkpoint (before its checkpoint is written), resize (as the
        resize after it starts). `workers[d]` is device d's actor."""

    def deaths(self) -> list[tuple[float, str | None]]:
        """The driver, as it recovers: (wall time, where in the step, if known) of each death this
        injector caused since it was last asked."""

    def before_submit(self, device: int, steps: Sequence[int]) -> None:
        """Device `device`, about to queue generation requests of `steps`."""

    def before_train(self, device: int, steps: Sequence[int]) -> None:
        """Device `device`, about to run micro-batches holding samples of `steps`."""

    def sync_started(self, device: int, version: int) -> None:
        """Device `device`, entering the weight sync of weights `version` (sender or receiver)."""

    def sync_finished(self, device: int, version: int) -> None:
        """Device `device`, its part of the sync of weights `version` done, before it answers."""

    def checkpoint_part_written(self, part: str, step: int) -> None:
        """The process saving checkpoint `step`, after writing `part`: model, optimizer, state (the
        temporary directory complete, not yet renamed), marker (the new `latest` marker's
        temporary file written, not yet in place)."""


class NoFaults:
    """The product's injector: nothing happens at any moment."""

    def phase_reached(self, phase: str, step: int, workers: Sequence) -> None:
        pass

    def deaths(self) -> list[tuple[float, str | None]]:
        return []

    def before_submit(self, device: int, steps: Sequence[int]) -> None:
        pass

    def before_train(self, device: int, steps: Sequence[int]) -> None:
        pass

    def sync_started(self, device: int, version: int) -> None:
        pass

    def sync_finished(self, device: int, version: int) -> None:
        pass

    def checkpoint_part_written(self, part: str, step: int) -> None:
        pass


class DriverFaults:
    """The driver's side of an injector: each phase it reaches, and when the death that a recovery
    follows happened (its detection time), with where in the step (`where`)."""

    def __init__(self, faults: FaultInjector) -> None:
        self.faults = faults
        self.where: str | None = None

    def at(self, rt, phase: str, step: int) -> None:
        self.faults.phase_reached(phase, step, rt.workers)

    def kill_time(self) -> float | None:
        """The newest death since the last call (None if the injector caused none)."""
        when, self.where = max(self.faults.deaths(), key=lambda death: death[0], default=(None, None))
        return when


_installed: FaultInjector | None = None  # per process by nature, like the signal state of poise.interrupt
_from_env: dict[str, FaultInjector] = {}  # POISE_FAULTS value -> its injector, loaded once


def install(faults: FaultInjector | None) -> None:
    """Make `faults` this process's injector (None: back to POISE_FAULTS, else `NoFaults`)."""
    global _installed
    _installed = faults


def current() -> FaultInjector:
    """This process's injector: the installed one, else the one POISE_FAULTS names, else NoFaults."""
    if _installed is not None:
        return _installed
    spec = os.environ.get(ENV, "")
    if not spec:
        return NoFaults()
    if spec not in _from_env:
        _from_env[spec] = load(spec)
    return _from_env[spec]


def load(spec: str) -> FaultInjector:
    """The injector `<module or path/to/file.py>:<name>` names (a function is called for it)."""
    where, _, name = spec.rpartition(":")
    fix = f"{ENV}={spec!r}: expected <module or path/to/file.py>:<name>"
    if not where or not name.isidentifier():
        raise PoiseError(f"{fix}; unset it to run without injected faults")
    try:
        module = _load_file(where) if where.endswith(".py") else importlib.import_module(where)
    except (ImportError, OSError) as e:
        raise PoiseError(f"{fix}: cannot load {where!r} ({e}); unset it to run without injected faults") from None
    found = getattr(module, name, None)
    if found is None:
        raise PoiseError(f"{fix}: {where!r} has no {name!r}; unset it to run without injected faults")
    if hasattr(found, "phase_reached") and not isinstance(found, type):
        return found
    if not callable(found):
        raise PoiseError(f"{fix}: {where}:{name} is neither an injector nor a function returning one")
    return found()


def _load_file(path: str):
    file = Path(path).resolve()
    if not file.is_file():
        raise OSError(f"no such file {file}")
    module_name = f"poise_faults_{file.stem}"
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(file):
        return loaded
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python file: {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before it runs: pickling by value looks it up there
    spec.loader.exec_module(module)
    return module
