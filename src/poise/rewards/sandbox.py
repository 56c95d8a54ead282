"""The reward sandbox: a pool of confined worker processes that run reward functions.

    pool = SandboxPool(specs, SandboxLimits(timeout_s=10, memory_mb=2048, cpu_s=10, workers=2))
    batch = pool.submit([Call(fn_index, prompt, completion, columns), ...])   # returns at once
    outcomes = batch.result()                                                # one Outcome per call
    pool.close()

Workers are started once (`python -c` running poise.rewards.worker in a fresh scratch directory,
with a scrubbed environment, in a session of their own) and confine themselves before any user
code runs (poise.rewards.confine says what holds with and without root). User code runs only in
the workers' call processes, never in the driver nor in the worker process that talks to the
pool (poise.rewards.worker). Each submitted batch is cut into chunks; one driver thread per
worker sends a chunk and reads one JSON line per call, tagged with the call's id. Each call has
its own wall-clock deadline (`timeout_s` after the previous call's answer): past it, or when the
worker dies, the worker's process group and PID namespace are killed, the call gets a failed
Outcome, a fresh worker starts and the rest of the chunk goes on there. A bad answer (not one
finite number) is a failed Outcome too; a line that is not the answer to the call awaited (another
id, not JSON) fails the call and replaces the worker. The pool itself never raises on a reward's
behaviour. A chunk holds the calls of one reward function: a worker never runs two functions in one
call process, so one function cannot fail another's calls. `close` kills every worker at once,
whatever its calls are doing, answers every call not yet answered (failed) and starts no worker
after.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import pickle
import queue
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Sequence

from poise import start_up
from poise.errors import ConfigError, PoiseError
from poise.rewards.cgroup import WorkerCgroup, layer_line, remove_stale, weaker_line
from poise.rewards.cgroup import locate as locate_cgroup
from poise.rewards.functions import FunctionSpec
from poise.rewards.worker import _HEADER

POISE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the poise package's directory
START_TIMEOUT_S = 60.0  # a worker's confinement and its imports of the reward functions
MAX_LINE = 1 << 16  # a longer answer line is a broken worker
CHUNK = 64  # calls per message at most
CLOSE_WAIT_S = 5.0  # for the serving threads, once close has killed their workers
CLOSED = "the reward sandbox was closed (the run is stopping); not scored"
UID_BASE = 1_500_000_000  # root drops each worker to a uid of its own from here (confine.drop_root)


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    memory_mb: int = 2048
    cpu_s: float = 10.0
    workers: int = 2
    per_child: int = CHUNK  # calls per fresh call process: CHUNK (reward.isolation batch) or 1 (call)


class Call(NamedTuple):
    fn_index: int
    prompt: str
    completion: str
    columns: dict[str, Any]


class Outcome(NamedTuple):
    value: float | None  # None when the call failed; an environment call's: the turn's reward
    error: str | None = None  # why: "timed out after 10 s", "ZeroDivisionError: ...", "returned NaN"
    env: tuple[str, bool, dict] | None = None  # an environment call's (observation, done, info)


class Batch:
    """The outcomes of one `submit`, filled in by the pool's threads."""

    def __init__(self, n: int):
        self._outcomes: list[Outcome | None] = [None] * n
        self._left = n
        self._lock = threading.Lock()
        self._done = threading.Event()
        if n == 0:
            self._done.set()

    def _set(self, index: int, outcome: Outcome) -> None:
        with self._lock:
            self._outcomes[index] = outcome
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def done(self, wait_s: float = 0.0) -> bool:
        return self._done.wait(wait_s) if wait_s > 0 else self._done.is_set()

    def result(self, timeout: float | None = None) -> list[Outcome]:
        if not self._done.wait(timeout):
            raise TimeoutError("reward batch not finished")
        return list(self._outcomes)  # type: ignore[arg-type]


def _checked(message: Any, call_id: int, env: bool = False) -> Outcome | None:
    """A worker's answer to call `call_id` (an environment's turn where `env`), checked on the
    driver's side; None when it is not one (a line for another call, malformed): the worker is
    broken and gets replaced."""
    if not isinstance(message, list) or len(message) != 3 or type(message[0]) is not int or message[0] != call_id \
            or message[1] not in ("ok", "err"):
        return None
    _, kind, payload = message
    if kind == "err":
        return Outcome(None, str(payload)[:300])
    if env:
        if not (isinstance(payload, list) and len(payload) == 4 and isinstance(payload[0], str)
                and type(payload[1]) in (int, float) and math.isfinite(payload[1]) and type(payload[2]) is bool
                and isinstance(payload[3], dict)):
            return None
        return Outcome(float(payload[1]), None, (payload[0], payload[2], payload[3]))
    if isinstance(payload, bool) or not isinstance(payload, (int, float)):
        return Outcome(None, f"returned {payload!r:.40}, not a number")
    if not math.isfinite(payload):
        return Outcome(None, f"returned {payload}")
    return Outcome(float(payload))


def _env(scratch: str) -> dict[str, str]:
    """The worker's whole environment: nothing of the driver's but PATH and the locale."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "HOME": scratch, "TMPDIR": scratch, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class _Worker:
    """One worker process and the pipe protocol to it (used by one pool thread only)."""

    def __init__(self, pool: "SandboxPool", slot: int):
        self.pool, self.slot = pool, slot
        self.proc: subprocess.Popen | None = None
        self.scratch: str | None = None
        self.buf = b""
        self.lines: list[bytes] = []
        self.confinement: dict | None = None
        self.scratch_tmpfs = False
        self.cgroup: WorkerCgroup | None = None  # a memory and a task limit for the worker and its children
        self._kill_lock = threading.Lock()  # its serving thread and `close` may both kill it

    def start(self) -> None:
        """Start the process and send its set-up; `wait_ready` reads the answer."""
        self.scratch = tempfile.mkdtemp(prefix=f"poise-reward-{os.getpid()}-")  # the driver's pid: whose it is
        uid = None
        if os.geteuid() == 0:
            uid = UID_BASE + (os.getpid() % 100_000) * 64 + self.slot % 64
            os.chown(self.scratch, uid, uid)
            # a tmpfs of reward.memory_mb: one call cannot fill the disk under the run's checkpoints
            self.scratch_tmpfs = mount_tmpfs(self.scratch, self.pool.limits.memory_mb, uid)
        poise_parent = os.path.dirname(POISE_DIR)
        boot = f"import sys; sys.path.insert(0, {poise_parent!r}); from poise.rewards.worker import main; main()"
        self.proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=self.scratch, env=_env(self.scratch),
                                     start_new_session=True)
        layer = self.pool.cgroup_layer
        if layer is not None:  # before the worker reads its set-up: it forks nothing yet
            try:
                self.cgroup = WorkerCgroup.make(layer, f"poise-reward-{os.getpid()}-{self.proc.pid}",
                                                self.pool.limits.memory_mb)
                self.cgroup.add(self.proc.pid)
            except OSError as e:  # refused: the rlimits alone hold, per process (the start-up line says so)
                if self.cgroup is not None:
                    self.cgroup.remove()
                self.cgroup = None
                self.pool.cgroup_why = f"cgroup v{layer.version} {e.filename or layer.parents[0]}: {e.strerror or e}"
        self.buf, self.lines = b"", []
        self.send({"functions": [asdict(s) for s in self.pool.specs], "reads": self.pool.reads, "uid": uid,
                   "memory_mb": self.pool.limits.memory_mb, "cpu_s": self.pool.limits.cpu_s,
                   "per_child": self.pool.limits.per_child})

    def wait_ready(self) -> None:
        """The worker's `ready` (its confinement) or a PoiseError naming the function it cannot load."""
        try:
            message = self.read(time.monotonic() + max(START_TIMEOUT_S, self.pool.limits.timeout_s))
        except EOFError:
            message = None
        if isinstance(message, list) and message and message[0] == "ready" and isinstance(message[1], dict):
            self.confinement = {**message[1], "scratch": "tmpfs" if self.scratch_tmpfs else "disk",
                                "cgroup": list(self.cgroup.paths) if self.cgroup is not None else None}
            return
        self.kill()
        if isinstance(message, list) and len(message) == 3 and message[0] == "error" and \
                isinstance(message[1], int) and 0 <= message[1] < len(self.pool.specs):
            spec = self.pool.specs[message[1]]
            if spec.env is not None:
                raise ConfigError(spec.key, spec.fn, f"cannot be built in the reward sandbox ({message[2]}); check "
                                                     "the module, the class's name and env.args")
            raise ConfigError(spec.key, spec.fn, f"cannot be loaded in the reward sandbox ({message[2]}); check "
                                                 "the module, the function's name and that it is a function")
        raise PoiseError("the reward sandbox's worker did not start "
                         f"({'no answer' if message is None else 'a malformed answer'}); this is a bug in "
                         "poise.rewards, please report it with your platform")

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)
        self.proc.stdin.flush()

    def read(self, deadline: float) -> Any:
        """The next JSON line, or None at the deadline; EOFError when the worker is gone."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while not self.lines:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            *complete, self.buf = (self.buf + chunk).split(b"\n")
            self.lines = complete
            if len(self.buf) > MAX_LINE:
                raise EOFError
        line = self.lines.pop(0)
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return line  # bytes: never a valid answer, the worker gets replaced

    def exit_reason(self) -> str:
        """Why the worker died, from its exit status (its PID 1's, passed on)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "the reward worker stopped answering"
        sig = -code if code < 0 else code - 128 if code > 128 else 0
        if sig == signal.SIGXCPU:
            return f"exceeded reward.cpu_s ({self.pool.limits.cpu_s:g} CPU seconds)"
        if sig == signal.SIGXFSZ:
            return "wrote a file larger than reward.memory_mb"
        if sig:
            return f"the reward worker was killed by {signal.Signals(sig).name}"
        return f"the reward worker exited with status {code}"

    def interrupt(self) -> None:
        """SIGKILL the worker's process group, from any thread: its serving thread, reading, sees the
        end of the pipe at once and cleans up (`kill`)."""
        proc = self.proc
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """Kill the worker's whole process group (its PID 1 dies with the worker: PDEATHSIG, and
        the namespace with it) and remove its scratch directory."""
        with self._kill_lock:
            self._kill()

    def _kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.scratch is not None:
            _wait_until_gone(str(self.scratch), timeout_s=5.0)
            if self.scratch_tmpfs:
                unmount(self.scratch)
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        if self.cgroup is not None:  # empty by now: its processes died with the worker's PID 1
            self.cgroup.remove()
            self.cgroup = None


class SandboxPool:
    """`limits.workers` confined processes running `specs`; see the module docstring."""

    def __init__(self, specs: Sequence[FunctionSpec], limits: SandboxLimits):
        self.specs, self.limits = tuple(specs), limits
        poise_dir = POISE_DIR
        self.reads = sorted({poise_dir, *(p for s in self.specs for p in s.reads)})
        remove_stale_scratch()
        # per-worker limits where a cgroup allows (v2, else v1); cgroup_why: why v2 (or any) is not used
        self.cgroup_layer, self.cgroup_why = locate_cgroup()
        if self.cgroup_layer is not None:
            remove_stale(self.cgroup_layer)
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        # every call's own id, drawn at random so a reward cannot guess another call's (it can
        # still read the ids of its own call process's calls from memory: reward.isolation)
        self._ids = iter(lambda: secrets.randbits(53), None)
        self._workers = [_Worker(self, slot) for slot in range(limits.workers)]
        self._closed = False
        self._lock = threading.Lock()  # `close` against a serving thread starting a worker
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)  # no leaked processes, even unclosed
        try:
            for w in self._workers:  # start them all, then wait: they confine and import in parallel
                w.start()
            for w in self._workers:
                w.wait_ready()
        except BaseException:
            _kill_all(self._workers)
            raise
        self.confinement = self._workers[0].confinement or {}
        # which layer holds each worker's limits (cgroup v2, v1, or per process only): said with the
        # first batch (the run has started: an up-front error that follows the pool's start stays
        # the only line), to the run directory, and to the console only where no cgroup holds
        first = self._workers[0].cgroup
        self.notice: str | None = layer_line(self.cgroup_layer, self.cgroup_why, first, limits.memory_mb,
                                             self.confinement)
        self.weaker = weaker_line(self.cgroup_layer, first)  # the console's, where no cgroup holds the limits
        self._threads = [threading.Thread(target=self._serve, args=(w,), name=f"reward-sandbox-{w.slot}", daemon=True)
                         for w in self._workers]
        for t in self._threads:
            t.start()
        self.restarts = 0

    def submit(self, calls: Sequence[Call]) -> Batch:
        """Queue `calls`; returns at once. Chunks spread one batch over every worker."""
        if self.notice is not None:  # the details to the run directory; the console only hears of a weaker defence
            start_up.sandbox(self.notice, self.weaker)
            self.notice = None
        batch = Batch(len(calls))
        for fn_index in sorted({c.fn_index for c in calls}):  # one function per chunk (the module docstring)
            indices = [i for i, c in enumerate(calls) if c.fn_index == fn_index]
            size = max(1, min(CHUNK, -(-len(indices) // len(self._workers))))
            for start in range(0, len(indices), size):
                chunk = indices[start:start + size]
                self._tasks.put((batch, chunk, [calls[i] for i in chunk]))
        return batch

    def run(self, calls: Sequence[Call]) -> list[Outcome]:
        return self.submit(calls).result()

    def close(self) -> None:
        """Kill every worker now, whatever its calls are doing (a second Ctrl-C ends a run through
        here: nothing waits for a reward's timeout), answer every call not yet answered (failed:
        CLOSED), stop the threads; no worker starts after (idempotent)."""
        with self._lock:
            self._closed = True
        for w in self._workers:
            w.interrupt()
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._finalizer()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one thread per worker ------------------------------------------------------------------
    def _serve(self, w: _Worker) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            batch, indices, calls = task
            i = 0
            while i < len(calls):
                try:
                    i = self._run_chunk(w, batch, indices, calls, i)
                except Exception as e:  # a bug here must not leave the batch waiting forever
                    w.kill()
                    for j in range(i, len(calls)):
                        batch._set(indices[j], Outcome(None, f"reward sandbox error: {type(e).__name__}: {e}"))
                    break

    def _start(self, w: _Worker) -> bool:
        """Start a fresh worker in `w`'s slot, or False once the pool is closed: under the lock `close`
        takes, so a worker started meanwhile exists by the time `close` kills them all."""
        with self._lock:
            if self._closed:
                return False
            w.start()
        w.wait_ready()
        return True

    def _run_chunk(self, w: _Worker, batch: Batch, indices: list[int], calls: list[Call], i: int) -> int:
        """Run calls[i:] on `w` (the batch's calls `indices`); returns the index of the first call not
        yet answered."""
        if w.proc is None:
            try:
                started = self._start(w)
            except (PoiseError, OSError) as e:  # a worker that cannot restart fails its call, not the run
                w.kill()
                batch._set(indices[i], Outcome(None, CLOSED if self._closed else
                                               f"the reward worker could not restart: {e}"))
                return i + 1
            if not started:
                for j in range(i, len(calls)):
                    batch._set(indices[j], Outcome(None, CLOSED))
                return len(calls)
        ids = [next(self._ids) for _ in calls[i:]]
        try:  # plain tuples: unpickling a Call would import this module there
            w.send([(call_id, *c) for call_id, c in zip(ids, calls[i:])])
        except OSError:  # died while idle: start a fresh one and send again
            w.kill()
            self.restarts += 1
            return i
        deadline = time.monotonic() + self.limits.timeout_s
        for call_id in ids:
            try:
                message = w.read(deadline)
            except EOFError:
                reason = CLOSED if self._closed else w.exit_reason()
                w.kill()
                self.restarts += 1
                batch._set(indices[i], Outcome(None, reason))
                return i + 1
            if message is None:
                w.kill()
                self.restarts += 1
                batch._set(indices[i], Outcome(None, f"timed out after {self.limits.timeout_s:g} s (reward.timeout_s)"))
                return i + 1
            outcome = _checked(message, call_id, self.specs[calls[i].fn_index].env is not None)
            if outcome is None:  # any unexpected byte: this worker is done
                w.kill()
                self.restarts += 1
                batch._set(indices[i], Outcome(None, "unexpected answer from the reward worker; it was replaced"))
                return i + 1
            batch._set(indices[i], outcome)
            i += 1
            deadline = time.monotonic() + self.limits.timeout_s
        return i


def _wait_until_gone(scratch: str, timeout_s: float) -> None:
    """The processes of a killed worker's PID namespace die with its PID 1, but asynchronously:
    wait (bounded) until none runs in its scratch directory, so none outlives `close`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = False
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    alive = os.readlink(f"/proc/{pid}/cwd").startswith(scratch)
                except OSError:
                    continue
                if alive:
                    break
        if not alive:
            return
        time.sleep(0.01)


_libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def mount_tmpfs(path: str, size_mb: int, uid: int) -> bool:
    """Mount a tmpfs of `size_mb` MiB, owned by `uid`, on `path` (root only); False if refused."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return False
    options = f"size={size_mb}m,mode=0700,uid={uid},gid={uid}".encode()
    return _libc.mount(b"tmpfs", path.encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV), options) == 0


def unmount(path: str) -> None:
    """Detach a scratch tmpfs (lazily: a process still dying there does not hold it up)."""
    if sys.platform.startswith("linux"):
        _libc.umount2(path.encode(), MNT_DETACH)


SCRATCH = re.compile(r"poise-reward-(\d+)-\w+")  # tempfile.mkdtemp's name: the driver's pid first


def remove_stale_scratch(root: str | None = None) -> list[str]:
    """Remove the scratch directories of drivers that died without closing their pool (SIGKILLed:
    their workers kill themselves, but what they wrote stays); returns those removed. A directory
    whose driver's pid is alive (or taken again) is left alone, as is one we do not own."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = SCRATCH.fullmatch(entry.name)
        try:
            if not match or not entry.is_dir(follow_symlinks=False):
                continue
            owner = entry.stat(follow_symlinks=False).st_uid
            if owner != os.geteuid() and not (os.geteuid() == 0 and owner >= UID_BASE):
                continue
            os.kill(int(match.group(1)), 0)
            continue  # alive
        except ProcessLookupError:
            unmount(entry.path)  # its tmpfs, if it had one (root)
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        except OSError:
            continue
    return removed


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()


__all__ = ["SandboxPool", "SandboxLimits", "Call", "Outcome", "Batch", "remove_stale_scratch"]
