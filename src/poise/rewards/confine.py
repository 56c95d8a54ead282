"""Linux confinement of a reward worker: namespaces, privilege drop, Landlock, resource limits.

Called by `poise.rewards.worker` in the fresh worker process, before any user code is imported.
Each layer is tried on its own and reported (`Confinement`); one that the kernel or the user's
privileges refuse is skipped, never fatal. What holds where:

| layer | as root | not root |
| --- | --- | --- |
| network | new network namespace (nothing reachable, not even 127.0.0.1) | the same inside a new user namespace, if unprivileged user namespaces are allowed; else Landlock (ABI >= 4) refuses TCP connect/bind (UDP stays open); else none |
| processes | new PID namespace: killing the worker kills everything it started; leftovers are killed after every call | the same inside the user namespace; else the worker's process group is killed on timeout (a process that leaves the group survives) |
| fork bombs | the worker's server drops to a uid of its own so RLIMIT_NPROC applies (root ignores it), with no capability (what it must read under a directory that uid may not enter, e.g. the interpreter under /root, is bind-mounted into a tmpfs covering that directory, in the server's own mount namespace: `expose_reads`; only where a read path is itself private does it keep CAP_DAC_READ_SEARCH, and its notes say so); the worker's cgroup, where one is made, adds pids.max | RLIMIT_NPROC (per user namespace, or the user's current task count + margin without one) |
| files | Landlock (ABI >= 1): read-only access to the interpreter, poise and the reward's own file or package, read-write to the scratch directory only; so ~/.ssh, the run directory and other paths are neither readable nor writable | the same |
| memory, CPU | RLIMIT_AS, RLIMIT_CPU (per call), RLIMIT_FSIZE, RLIMIT_CORE=0: per process; also a memory and a task limit per worker and all its children in a cgroup of its own, v2 where this process's cgroup v2 hands memory and pids to its children, else v1 where its memory and pids cgroups are writable (poise.rewards.cgroup; one start-up line names the layer that holds) | the same where the user may write those cgroups (a delegated one) |
| unix sockets | seccomp: socket(AF_UNIX) and io_uring refused, so no socket file (ssh-agent, Ray's raylet, D-Bus) is reachable | the same |
| scratch | a tmpfs of memory_mb mounted by the pool (poise.rewards.sandbox), emptied after every call | on the disk, RLIMIT_FSIZE per file |
| the result channel | the server holds the pool's pipes; each call process (nested Landlock domain, no capabilities, not dumpable) has only a pipe of its own (poise.rewards.worker) | the same |

Without Landlock (kernels before 5.13, or LSM disabled) the files row falls back to: the working
directory and HOME are the scratch directory and the run directory's path is never passed, but a
reward that names an absolute path can read what the user can (as root, with the uid drop, it can
read but not write outside scratch). Signals and abstract unix sockets outside the worker are
scoped off with Landlock ABI >= 6.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import asdict, dataclass, field

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Landlock (linux/landlock.h); the syscall numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE = 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

NPROC_MARGIN = 32  # tasks (processes and threads) one worker may have beyond its own

LINUX = sys.platform.startswith("linux")  # elsewhere every layer below is skipped but the rlimits
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclass
class Confinement:
    """What holds for one worker (sent to the driver as the `ready` message)."""

    network: str = "open"  # "namespace" | "tcp-blocked" | "open"
    unix_sockets: str = "open"  # "blocked" (seccomp) | "open"
    pid_namespace: bool = False
    uid: int = -1  # the uid the worker runs as
    nproc_limit: int = -1
    landlock_abi: int = 0
    filesystem: bool = False  # Landlock confines reads and writes
    reads_exposed: bool = False  # root: what the worker reads is reachable without CAP_DAC_READ_SEARCH
    notes: list[str] = field(default_factory=list)  # why a layer did not hold

    def as_dict(self) -> dict:
        return asdict(self)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg2: int, arg3: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0)),
           f"prctl({option})")


def enter_namespaces(report: Confinement) -> bool:
    """A new network and PID namespace (and, unprivileged, the user namespace they need).

    Returns True when a PID namespace was made: the caller must fork, and the child, its PID 1,
    goes on (`become_pid1`)."""
    if not LINUX:
        report.notes.append(f"{sys.platform}: no namespaces, no Landlock, no privilege drop")
        return False
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    user = 0 if root else CLONE_NEWUSER
    for flags in (user | CLONE_NEWNET | CLONE_NEWPID, user | CLONE_NEWNET):
        if _libc.unshare(flags) == 0:
            break
    else:
        report.notes.append(f"unshare: {os.strerror(ctypes.get_errno())} (no network or PID namespace)")
        return False
    if user:  # map our own ids, or the worker could not create files (an unmapped fsuid)
        for path, text in (("/proc/self/uid_map", f"{uid} {uid} 1"), ("/proc/self/setgroups", "deny"),
                           ("/proc/self/gid_map", f"{gid} {gid} 1")):
            try:
                with open(path, "w") as f:
                    f.write(text)
            except OSError as e:
                report.notes.append(f"{path}: {e.strerror}")
    report.network = "namespace"
    report.pid_namespace = bool(flags & CLONE_NEWPID)
    return report.pid_namespace


def drop_root(uid: int, report: Confinement) -> None:
    """Root ignores RLIMIT_NPROC: run as `uid` instead, with no capability where `expose_reads`
    made what the worker reads reachable; else keeping CAP_DAC_READ_SEARCH (also across exec, as
    an ambient capability) so the interpreter and libraries stay readable wherever they are
    installed (e.g. under /root; the call processes keep it too, and the one start-up line's
    notes say so). Landlock then decides what may actually be read."""
    if os.geteuid() != 0 or not LINUX:
        report.uid = os.getuid()
        return
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        _prctl(PR_SET_KEEPCAPS, 1)
        os.setresuid(uid, uid, uid)
        bit = 0 if report.reads_exposed else 1 << CAP_DAC_READ_SEARCH
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)(_CapData(bit, bit, bit), _CapData(0, 0, 0))
        _check(_libc.capset(ctypes.byref(header), data), "capset")
        if bit:
            _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH)
    except OSError as e:
        report.notes.append(f"privilege drop: {e}")
    report.uid = os.getuid()


MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18


def _searchable(st: os.stat_result, uid: int) -> bool:
    """`uid` (no groups: `drop_root` clears them, its gid is its uid) may enter the directory."""
    return bool(st.st_mode & 0o100) if st.st_uid == uid else bool(st.st_mode & 0o001)


def _blocked_ancestor(path: str, uid: int) -> str | None:
    """The outermost directory above `path` that `uid` may not enter, or None."""
    parts = path.strip("/").split("/")[:-1]
    for k in range(len(parts)):
        ancestor = "/" + "/".join(parts[:k + 1])
        if not _searchable(os.stat(ancestor), uid):
            return ancestor
    return None


def expose_reads(paths: list[str], uid: int, report: Confinement) -> None:
    """Root, before `drop_root`: in a mount namespace of this process's own, make every path in
    `paths` reachable by `uid` without CAP_DAC_READ_SEARCH: each outermost directory above one
    that `uid` may not enter (/root, a private run directory) is covered by a skeleton (a
    root-owned tmpfs holding only the directories down to those paths) with each path bind-mounted in.
    The rest of that directory is hidden: not there, whatever exists. Sets `report.reads_exposed`
    when every path is reachable; else the worker keeps the capability (`drop_root`)."""
    if os.geteuid() != 0 or not LINUX:
        return
    under: dict[str, list[str]] = {}
    for path in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
        blocked = _blocked_ancestor(path, uid)
        if blocked is None:
            continue
        if blocked == "/" or any(path.startswith(q + "/") for q in under.get(blocked, [])):
            continue  # "/" cannot be covered; a path below one already exposed comes with it
        under.setdefault(blocked, []).append(path)
    try:
        if under:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            _check(_libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "mount private")
        for blocked, inside in under.items():
            _skeleton(blocked, inside)
        unreachable = [p for p in paths if os.path.exists(p) and not _reachable(os.path.realpath(p), uid)]
        if unreachable:  # e.g. a reward file of mode 0600: only the capability reads it
            raise OSError(f"{unreachable[0]} is not readable by other users")
    except OSError as e:
        report.notes.append(f"exposing the reads: {e} (the worker keeps CAP_DAC_READ_SEARCH)")
        return
    report.reads_exposed = True


def _reachable(path: str, uid: int) -> bool:
    st = os.stat(path)
    need = (0o500 if os.path.isdir(path) else 0o400) >> (0 if st.st_uid == uid else 6)
    return _blocked_ancestor(path, uid) is None and st.st_mode & need == need


def _skeleton(blocked: str, inside: list[str]) -> None:
    """Cover `blocked` with a tmpfs that holds only `inside`, each bind-mounted from where it was."""
    held = [os.open(p, os.O_PATH | os.O_CLOEXEC) for p in inside]  # reachable still once covered
    try:
        _check(_libc.mount(b"tmpfs", blocked.encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV),
                           b"size=1m,mode=0755"), f"mount tmpfs on {blocked}")
        for path, fd in zip(inside, held):
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                               ctypes.c_ulong(MS_BIND | MS_REC), None), f"bind {path}")
    finally:
        for fd in held:
            os.close(fd)


def after_fork_in_namespace() -> None:
    """In PID 1 of the new namespace: die with the parent (the process the pool kills), which
    takes every process of the namespace with it."""
    _prctl(PR_SET_PDEATHSIG, 9)


def die_with_parent() -> None:
    """Without a PID namespace to watch from: SIGKILL when the parent dies (the kernel sends it
    when the thread that started us exits)."""
    if LINUX:
        _prctl(PR_SET_PDEATHSIG, 9)
        if os.getppid() == 1:
            os._exit(1)


def unmount(path: str) -> None:
    """Detach the mount on `path`, if any (lazily; errors ignored)."""
    if LINUX:
        _libc.umount2(path.encode(), 2)  # MNT_DETACH


def adopt_orphans() -> None:
    """Become a child subreaper: orphans of the processes we start are re-parented to us."""
    if not LINUX:
        return
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass


def _user_tasks(uid: int) -> int:
    """Tasks (threads included) the kernel counts against RLIMIT_NPROC for `uid`."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip())
    return count


def set_limits(memory_mb: int, report: Confinement, own_user: bool) -> None:
    """Address space, file size, no core files, a task limit. `own_user`: this worker's uid (or
    user namespace) runs nothing else, so the task limit counts only the worker's own tasks."""
    mib = memory_mb * 2**20
    for limit, value in ((resource.RLIMIT_AS, mib), (resource.RLIMIT_FSIZE, mib), (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit, (value, value))
        except (OSError, ValueError) as e:
            report.notes.append(f"setrlimit({limit}): {e}")
    if os.getuid() == 0:
        report.notes.append("running as root: RLIMIT_NPROC does not apply")
        return
    if not LINUX:
        return  # no /proc to count the user's tasks in
    nproc = NPROC_MARGIN + (1 if own_user else _user_tasks(os.getuid()))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        report.nproc_limit = nproc
    except (OSError, ValueError) as e:
        report.notes.append(f"RLIMIT_NPROC: {e}")


def limit_cpu(seconds: float) -> None:
    """Let the next call use `seconds` more CPU: the soft RLIMIT_CPU, over what was used so far
    (SIGXCPU kills the worker past it). The hard limit stays, so the next call can be granted its
    own; a call that raises its soft limit is still stopped by the wall-clock timeout."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime + seconds) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def landlock(reads: list[str], writes: list[str], report: Confinement) -> int | None:
    """Allow reading (and executing) `reads`, everything in `writes`, and nothing else of the
    filesystem; refuse TCP connect/bind (ABI >= 4) and signals and abstract unix sockets to
    processes outside (ABI >= 6). Returns the ruleset (a close-on-exec fd) for `nest`, or None
    when Landlock did not hold."""
    if not LINUX:
        return None
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        report.notes.append(f"landlock unavailable: {os.strerror(ctypes.get_errno())}")
        return None
    report.landlock_abi = abi
    fs = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        fs |= 1 << 13  # refer
    if abi >= 3:
        fs |= FS_TRUNCATE
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                            ctypes.c_uint32(0))
    if ruleset < 0:
        report.notes.append(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
        return None
    file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    try:
        for paths, rights in ((reads, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR), (writes, fs)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # not on this system
                try:
                    allowed = rights if os.path.isdir(path) else rights & file_rights
                    rule = _PathBeneathAttr(allowed, fd)
                    if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                                     ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                        report.notes.append(f"landlock rule {path}: {os.strerror(ctypes.get_errno())}")
                finally:
                    os.close(fd)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            report.notes.append(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
            os.close(ruleset)
            return None
    except BaseException:
        os.close(ruleset)
        raise
    report.filesystem = True
    if abi >= 4 and report.network == "open":
        report.network = "tcp-blocked"
    return ruleset


def nest(ruleset: int | None) -> None:
    """Enter a Landlock domain of our own, nested in the worker's (the same rules once more): a
    process that did this can no longer ptrace, read the memory or fds of (/proc/PID/mem, fd/), or
    signal (ABI >= 6) the process it was forked from, whose domain is less restricted, nor any
    sibling. Closes `ruleset`. Raises OSError when the kernel refuses (the caller must not go on)."""
    if ruleset is None:
        return
    try:
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)


def not_dumpable() -> None:
    """A process of the same uid may not ptrace us nor open /proc/<us>/mem or /proc/<us>/fd/*
    (unless it holds CAP_SYS_PTRACE: `drop_capabilities` in the children). Inherited by fork."""
    if LINUX:
        _prctl(PR_SET_DUMPABLE, 0)


def drop_capabilities(keep: int = 0) -> None:
    """Keep only the capabilities in the bit mask `keep` (an unprivileged worker holds every
    capability inside its user namespace, CAP_SYS_PTRACE included, until it drops them)."""
    if not LINUX:
        return
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)(_CapData(keep, keep, keep), _CapData(0, 0, 0))
    _check(_libc.capset(ctypes.byref(header), data), "capset")


# seccomp: a classic BPF filter (linux/seccomp.h, linux/filter.h) on the syscall number and arch.
SECCOMP_SET_MODE_FILTER, SYS_SECCOMP = 1, {"x86_64": 317, "aarch64": 277}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYS_SOCKET = {"x86_64": 41, "aarch64": 198}
_SYS_IO_URING_SETUP = 425  # io_uring's IORING_OP_SOCKET would make a socket behind seccomp's back
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same syscalls under other numbers
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
AF_UNIX = 1


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def block_unix_sockets(report: Confinement) -> None:
    """seccomp: socket(AF_UNIX, ...) fails with EACCES, so no socket file (a Ray raylet's, an
    ssh-agent's, D-Bus's) can be connected to: neither the network namespace nor Landlock covers
    connect() on a path. socketpair() stays (it reaches nobody); io_uring is refused (it could
    make sockets without the socket syscall). Needs no_new_privs (set by `landlock`)."""
    arch = os.uname().machine
    if not LINUX or arch not in _AUDIT_ARCH:
        report.notes.append(f"seccomp: not on {sys.platform}/{arch} (unix sockets stay reachable)")
        return
    ld_w, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    jset = 0x45  # BPF_JMP|BPF_JSET|BPF_K
    deny = SECCOMP_RET_ERRNO | 13  # EACCES
    prog = [
        (ld_w, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, _AUDIT_ARCH[arch]),
        (ret, 0, 0, SECCOMP_RET_KILL_PROCESS),  # another ABI (i386 on x86_64): numbers differ
        (ld_w, 0, 0, 0),  # seccomp_data.nr
        (jset, 5, 0, _X32_BIT if arch == "x86_64" else 0),
        (jeq, 4, 0, _SYS_IO_URING_SETUP),
        (jeq, 0, 2, _SYS_SOCKET[arch]),
        (ld_w, 0, 0, 16),  # seccomp_data.args[0], low 32 bits (little-endian): the family
        (jeq, 1, 0, AF_UNIX),
        (ret, 0, 0, SECCOMP_RET_ALLOW),
        (ret, 0, 0, deny),
    ]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _check(_libc.syscall(ctypes.c_long(SYS_SECCOMP[arch]), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                             ctypes.c_uint(0), ctypes.byref(fprog)), "seccomp")
    except OSError as e:
        report.notes.append(f"seccomp: {e} (unix sockets stay reachable)")
        return
    report.unix_sockets = "blocked"


def system_reads() -> list[str]:
    """What any Python interpreter and its child processes need to read: the interpreter's
    installation, shared libraries, a few files of /etc, and device files."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
              "/etc/ld.so.conf.d", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
              "/etc/alternatives", "/etc/ssl", "/dev/urandom", "/dev/random", "/dev/zero"}
    return sorted(paths)


__all__ = ["Confinement", "enter_namespaces", "expose_reads", "drop_root", "after_fork_in_namespace", "die_with_parent",
           "adopt_orphans", "set_limits",
           "limit_cpu", "landlock", "nest", "not_dumpable", "drop_capabilities", "block_unix_sockets", "system_reads"]
