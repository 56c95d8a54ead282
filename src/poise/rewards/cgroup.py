"""Per-worker limits of the reward sandbox by cgroup: a memory and a task limit that hold for a
worker and every process it starts, where the rlimits of `poise.rewards.confine` hold per process
(a reward that forks multiplies `reward.memory_mb` by its task limit).

Two layers, the first usable one is taken (`locate`):

- cgroup v2, where this process's own cgroup v2 directory enables the memory and pids controllers
  for its children (`cgroup.subtree_control`: e.g. the root cgroup, or a delegated one such as a
  systemd scope with `Delegate=yes` whose processes sit in a leaf below it) and is writable:
  `memory.max`, `memory.swap.max` = 0, `pids.max`.
- cgroup v1, where v2 is not usable and this process's own cgroups in the v1 `memory` and `pids`
  hierarchies (read from /proc/self/cgroup) are writable: a cgroup in each,
  `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` (the same: no swap) where the kernel
  accounts swap, `pids.max`.

The pool makes one cgroup per worker (one in each hierarchy for v1), named
`poise-reward-<driver pid>-<worker pid>` below its own, writes its limits, moves the worker's
process in before the worker reads its set-up (so every process it forks starts inside), and
removes it with the worker. A driver that dies without closing its pool leaves its cgroups
behind (empty: its workers kill themselves); the next pool's start removes those whose driver's
pid is gone (`remove_stale`). Where neither layer is usable `locate` says why, in the words of the
pool's one start-up line, which names the layer that holds in every case (`layer_line`; it goes
to RUN_DIR/start_up.log, and the console hears a short `weaker_line` only where no cgroup holds).

Limits: memory = 2 x reward.memory_mb + WORKER_BASE_MB (a call's memory, its scratch tmpfs, which
the kernel charges to the worker that writes it, and the worker's own three interpreters), no
swap, tasks = PIDS_MAX.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from dataclasses import dataclass

WORKER_BASE_MB = 96  # the watcher, PID 1 and the server: three small interpreters
PIDS_MAX = 64  # a worker's tasks (processes and threads): its own few, its call processes, what they fork
NEEDED = ("memory", "pids")
NAME = re.compile(r"poise-reward-(\d+)-(\d+)")  # the driver's pid, then the worker's
REMOVE_WAIT_S = 2.0  # a killed worker's cgroup stays busy until the kernel has freed its tasks


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _mounts(mountinfo: str, fstype: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, root of the mount, super options) of each mount of `fstype`."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if tail[:1] == [fstype] and len(fields) >= 5 and len(tail) >= 3:
            found.append((fields[4].replace("\\040", " "), fields[3], set(tail[2].split(","))))
    return found


def _join(mount: str, root: str, path: str) -> str:
    """The directory of cgroup `path` (as /proc/<pid>/cgroup names it) under a mount of `root`."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.normpath(mount + "/" + path.lstrip("/"))


def own_cgroup_dir(proc: str = "/proc/self") -> tuple[str | None, str]:
    """(this process's cgroup v2 directory, '') or (None, why there is none)."""
    mountinfo, membership = _read(f"{proc}/mountinfo"), _read(f"{proc}/cgroup")
    if mountinfo is None or membership is None:
        return None, "no /proc cgroup information (not Linux?)"
    mounts = _mounts(mountinfo, "cgroup2")
    path = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if not mounts or path is None:
        return None, "no cgroup v2 is mounted"
    mount, root, _ = mounts[0]
    return _join(mount, root, path), ""


def locate_v2(proc: str = "/proc/self") -> tuple[str | None, str]:
    """(the cgroup v2 directory under which the pool makes its workers' cgroups, '') or (None, why not)."""
    where, why = own_cgroup_dir(proc)
    if where is None:
        return None, why
    offered = (_read(f"{where}/cgroup.controllers") or "").split()
    enabled = (_read(f"{where}/cgroup.subtree_control") or "").split()
    missing = [c for c in NEEDED if c not in enabled]
    if missing:
        have = ", ".join(offered) or "none"
        return None, (f"cgroup v2 {where} does not enable the {' and '.join(missing)} controller"
                      f"{'s' if len(missing) > 1 else ''} for its children (it offers: {have})")
    if not os.access(where, os.W_OK):
        return None, f"cgroup v2 {where} is not writable by this user"
    return where, ""


def locate_v1(proc: str = "/proc/self") -> tuple[tuple[str, str] | None, str]:
    """((memory directory, pids directory) of this process in cgroup v1, '') or (None, why not)."""
    mountinfo, membership = _read(f"{proc}/mountinfo"), _read(f"{proc}/cgroup")
    if mountinfo is None or membership is None:
        return None, "no /proc cgroup information (not Linux?)"
    mounts = _mounts(mountinfo, "cgroup")
    paths = {}  # controller -> this process's cgroup in its hierarchy
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] != "0":
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    dirs = []
    for controller in NEEDED:
        mount = next((m for m in mounts if controller in m[2]), None)
        if mount is None or controller not in paths:
            return None, f"no cgroup v1 {controller} hierarchy is mounted"
        where = _join(mount[0], mount[1], paths[controller])
        if not os.path.isdir(where) or not os.access(where, os.W_OK):
            return None, f"cgroup v1 {where} is not writable by this user"
        dirs.append(where)
    return (dirs[0], dirs[1]), ""


@dataclass(frozen=True)
class Layer:
    """Where the pool makes its workers' cgroups: `version` 2 (one directory in `parents`) or 1
    (the memory hierarchy's directory, then the pids hierarchy's)."""

    version: int
    parents: tuple[str, ...]


def locate(proc: str = "/proc/self") -> tuple[Layer | None, str]:
    """(the first usable layer, why cgroup v2 is not used or '') or (None, why neither is usable)."""
    v2, why_v2 = locate_v2(proc)
    if v2 is not None:
        return Layer(2, (v2,)), ""
    v1, why_v1 = locate_v1(proc)
    if v1 is not None:
        return Layer(1, v1), why_v2
    return None, f"{why_v2}; {why_v1}"


@dataclass
class WorkerCgroup:
    """One worker's cgroup (one directory per hierarchy: a single one on v2, memory's then pids'
    on v1): made with its limits, the worker's pid moved in, removed after it."""

    paths: tuple[str, ...]
    version: int = 2
    swap: bool = True  # False once the kernel was told: no swap

    @classmethod
    def make(cls, layer: Layer, name: str, memory_mb: int) -> "WorkerCgroup":
        """Raises OSError when the kernel refuses (the caller goes on with per-process limits)."""
        group = cls((), layer.version)
        limit = str(memory_limit_mb(memory_mb) * 2**20)
        try:
            for parent in layer.parents:
                os.mkdir(os.path.join(parent, name))
                group.paths += (os.path.join(parent, name),)
            if layer.version == 2:
                (path,) = group.paths
                group._write(path, "memory.max", limit)
                group._write(path, "pids.max", str(PIDS_MAX))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    group._write(path, "memory.swap.max", "0")
                    group.swap = False
            else:
                memory, pids = group.paths
                group._write(memory, "memory.limit_in_bytes", limit)  # first: memsw may not go below it
                if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")):
                    group._write(memory, "memory.memsw.limit_in_bytes", limit)  # memory + swap: no swap
                    group.swap = False
                group._write(pids, "pids.max", str(PIDS_MAX))
        except OSError:
            group.remove()
            raise
        return group

    def add(self, pid: int) -> None:
        """Move `pid` into every directory; where one refuses, back into the parents (the worker
        goes on under per-process limits, and this cgroup can go) and raise OSError."""
        moved = []
        try:
            for path in self.paths:
                self._write(path, "cgroup.procs", str(pid))
                moved.append(path)
        except OSError:
            for path in moved:
                try:
                    self._write(os.path.dirname(path), "cgroup.procs", str(pid))
                except OSError:
                    pass
            raise

    def remove(self) -> bool:
        """Each directory removed (`remove_dir`); True if none is left."""
        return all([remove_dir(path) for path in self.paths])

    @staticmethod
    def _write(path: str, name: str, value: str) -> None:
        with open(os.path.join(path, name), "w") as f:
            f.write(value)


def memory_limit_mb(memory_mb: int) -> int:
    return 2 * memory_mb + WORKER_BASE_MB


def remove_dir(path: str, kill: bool = True) -> bool:
    """rmdir one cgroup directory (best effort; True once it is gone). A killed worker's tasks take
    a moment to leave it; with `kill`, any still inside after a moment are killed (only a worker of
    ours runs there)."""
    start = time.monotonic()
    killed = not kill
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY:
                break
        waited = time.monotonic() - start
        if waited > REMOVE_WAIT_S:
            return False
        if not killed and waited > REMOVE_WAIT_S / 2:  # still inside: nothing of the worker's may outlive it
            killed = True
            for pid in (_read(os.path.join(path, "cgroup.procs")) or "").split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        time.sleep(0.01)
    try:  # not a live cgroupfs (tests): a cgroup directory holds only kernel files
        for entry in os.listdir(path):
            os.unlink(os.path.join(path, entry))
        os.rmdir(path)
        return True
    except OSError:
        return False


def remove_stale(layer: Layer) -> list[str]:
    """Remove the workers' cgroups of drivers that died without closing their pool (SIGKILLed:
    their workers kill themselves, but the cgroups stay); returns those removed. One whose
    driver's pid is alive (or taken again) is left alone, and so is one that still holds a process
    after a moment (nothing is killed here: a driver in another PID namespace looks dead from ours)."""
    removed = []
    for parent in layer.parents:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            match = NAME.fullmatch(entry.name)
            if not match or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                os.kill(int(match.group(1)), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except OSError:
                continue
            if remove_dir(entry.path, kill=False):
                removed.append(entry.path)
    return removed


def layer_line(layer: Layer | None, why: str, group: WorkerCgroup | None, memory_mb: int,
               confinement: dict) -> str:
    """The pool's start-up line: which layer holds the limits of each worker (`group`: the first
    worker's cgroup, None where none was made; `why`: why cgroup v2, or every cgroup, is not used;
    `confinement`: a worker's report)."""
    if layer is None or group is None:
        return per_process_line(why, confinement)
    swap = "" if group.swap else ", no swap"
    limit = f"{memory_limit_mb(memory_mb)} MiB (2 x reward.memory_mb + {WORKER_BASE_MB}{swap})"
    if layer.version == 2:
        where, memory, not_v2 = f"v2 of its own below {layer.parents[0]}", f"memory.max {limit}", ""
    else:
        where = f"v1 of its own below {layer.parents[0]} and {layer.parents[1]}"
        memory = f"memory.limit_in_bytes {limit}"
        not_v2 = f" (not cgroup v2: {why})"
    return (f"poise: reward sandbox: each worker in a cgroup {where}: {memory} and pids.max {PIDS_MAX} hold for the "
            f"worker and every process it starts; reward.cpu_s (RLIMIT_CPU) per process, the wall-clock timeout "
            f"per call{not_v2}")


def weaker_line(layer: Layer | None, group: WorkerCgroup | None) -> str | None:
    """The console's short line where the default defence does not hold (no per-worker cgroup:
    memory limits hold per process); None where it does (`layer_line` has the details)."""
    if layer is not None and group is not None:
        return None
    return "poise: reward sandbox: no per-worker cgroup here, so memory limits hold per process (RELIABILITY.md)"


def per_process_line(why: str, confinement: dict) -> str:
    """The pool's start-up line where no cgroup holds the limits (`confinement`: a worker's report)."""
    nproc = confinement.get("nproc_limit", -1)
    tasks = f"each of its up to {nproc} tasks" if nproc > 0 else "every process it starts"
    own = confinement.get("uid", 0) != 0 or confinement.get("network") == "namespace"
    task_limit = ("the task limit (RLIMIT_NPROC) holds per worker" if nproc > 0 and own else
                  "the task limit (RLIMIT_NPROC) counts the user's tasks" if nproc > 0 else "no task limit holds")
    return (f"poise: reward sandbox: no per-worker cgroup ({why}): reward.memory_mb (RLIMIT_AS) and "
            f"reward.cpu_s (RLIMIT_CPU) hold per process, so a reward that forks may use memory_mb in {tasks}; "
            f"{task_limit}, the wall-clock timeout per call")
