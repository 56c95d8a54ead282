"""Per-worker limits of the reward sandbox by cgroup v2: `memory.max` and `pids.max` hold for a
worker and every process it starts, where the rlimits of `poise.rewards.confine` hold per process
(a reward that forks multiplies `reward.memory_mb` by its task limit).

Used where this process's own cgroup v2 directory allows it: the memory and pids controllers are
enabled for its children (`cgroup.subtree_control`: e.g. the root cgroup, or a delegated one such as
a systemd scope with `Delegate=yes` whose processes sit in a leaf below it) and it is writable. The
pool makes one child per worker, `poise-reward-<driver pid>-<slot>`, writes its limits, moves the
worker's process there before the worker reads its set-up (so every process it forks starts
inside), and removes the child with the worker. Elsewhere `locate` says why not, in the words of
the pool's one start-up line; a machine whose cgroup v2 has no memory or pids controller (cgroup v1
hosts them, or the container does not delegate them) is the common case, and cgroup v1 is not used.

Limits: `memory.max` = 2 x reward.memory_mb + WORKER_BASE_MB (a call's memory, its scratch tmpfs,
which the kernel charges to the worker that writes it, and the worker's own three interpreters),
`memory.swap.max` = 0, `pids.max` = PIDS_MAX.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

WORKER_BASE_MB = 96  # the watcher, PID 1 and the server: three small interpreters
PIDS_MAX = 64  # a worker's tasks (processes and threads): its own few, its call processes, what they fork
NEEDED = ("memory", "pids")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def own_cgroup_dir(proc: str = "/proc/self") -> tuple[str | None, str]:
    """(this process's cgroup v2 directory, '') or (None, why there is none)."""
    mountinfo, membership = _read(f"{proc}/mountinfo"), _read(f"{proc}/cgroup")
    if mountinfo is None or membership is None:
        return None, "no /proc cgroup information (not Linux?)"
    mount = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            mount = fields[4].replace("\\040", " ")
            break
    path = next((line[3:] for line in membership.splitlines() if line.startswith("0::")), None)
    if mount is None or path is None:
        return None, "no cgroup v2 is mounted"
    return os.path.normpath(mount + "/" + path.lstrip("/")), ""


def locate(proc: str = "/proc/self") -> tuple[str | None, str]:
    """(the directory under which the pool makes its workers' cgroups, '') or (None, why not)."""
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


@dataclass
class WorkerCgroup:
    """One worker's cgroup: made with its limits, the worker's pid moved in, removed after it."""

    path: str

    @classmethod
    def make(cls, parent: str, name: str, memory_mb: int) -> "WorkerCgroup":
        """Raises OSError when the kernel refuses (the caller goes on with per-process limits)."""
        path = os.path.join(parent, name)
        os.mkdir(path)
        group = cls(path)
        try:
            group._write("memory.max", str((2 * memory_mb + WORKER_BASE_MB) * 2**20))
            group._write("pids.max", str(PIDS_MAX))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                group._write("memory.swap.max", "0")
        except OSError:
            group.remove()
            raise
        return group

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def remove(self) -> None:
        """rmdir once its processes are gone (a killed worker's may take a moment); best effort."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            try:  # not a live cgroupfs (tests) or still busy: a cgroup directory holds only kernel files
                for entry in os.listdir(self.path):
                    os.unlink(os.path.join(self.path, entry))
                os.rmdir(self.path)
            except OSError:
                pass

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)


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
