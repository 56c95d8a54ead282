"""Per-worker cgroup limits of the reward sandbox (poise.rewards.cgroup): cgroup v2 where this
process's cgroup v2 hands memory and pids to its children, else cgroup v1 where this process's
memory and pids cgroups are writable, else one start-up line that says which limits hold per
process. The detection and the pool's use of a cgroup directory run on a fake cgroupfs here; the
attacks (a forked memory hog, a fork bomb) run against the kernel where a usable cgroup exists
(cgroup v1 on these machines: their cgroup v2 has no memory or pids controller), and are skipped,
with the reason, elsewhere. Every cgroup a test makes in the kernel's cgroupfs is removed after it."""

from __future__ import annotations

import os
import subprocess

import pytest

from poise import start_up
from poise.rewards import cgroup, sandbox
from poise.rewards.cgroup import (PIDS_MAX, WORKER_BASE_MB, Layer, WorkerCgroup, locate, locate_v1, locate_v2,
                                  own_cgroup_dir, remove_stale)

from conftest import inputs

GOOD = '''
def good(prompts, completions, **kwargs):
    return [1.0 for _ in completions]
'''


def _fake(tmp_path, subtree: str, offered: str = "cpu memory pids", mounted: bool = True, v1: bool = False) -> str:
    """A /proc/self with this process in cgroup /job of a cgroup2 mounted at tmp_path/cg and, with
    `v1`, in /job of a v1 memory hierarchy at tmp_path/memory and in / of a v1 pids hierarchy
    mounted from its /box at tmp_path/pids (as a container sees a bind-mounted subtree)."""
    proc, job = tmp_path / "proc", tmp_path / "cg" / "job"
    proc.mkdir()
    job.mkdir(parents=True)
    fstype = "cgroup2" if mounted else "cgroup"
    mountinfo = (f"30 22 0:26 / /proc rw - proc proc rw\n"
                 f"35 24 0:30 / {tmp_path / 'cg'} rw,nosuid - {fstype} cgroup2 rw\n")
    membership = "0::/job\n"
    if v1:
        (tmp_path / "memory" / "job").mkdir(parents=True)
        (tmp_path / "pids" / "sub").mkdir(parents=True)
        mountinfo += (f"36 24 0:31 / {tmp_path / 'memory'} rw - cgroup cgroup rw,memory\n"
                      f"37 24 0:32 /box {tmp_path / 'pids'} rw - cgroup cgroup rw,pids\n")
        membership = "9:cpu,cpuacct:/\n4:memory:/job\n8:pids:/box/sub\n" + membership
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(membership)
    (job / "cgroup.controllers").write_text(offered + "\n")
    (job / "cgroup.subtree_control").write_text(subtree + "\n")
    return str(proc)


def test_a_cgroup_without_memory_and_pids_for_its_children_is_refused_with_the_reason(tmp_path):
    proc = _fake(tmp_path, subtree="cpu")
    why_v2 = (f"cgroup v2 {tmp_path / 'cg' / 'job'} does not enable the memory and pids controllers for its "
              "children (it offers: cpu, memory, pids)")
    assert locate_v2(proc) == (None, why_v2)
    assert locate(proc) == (None, f"{why_v2}; no cgroup v1 memory hierarchy is mounted")


def test_no_cgroup_v2_mounted_is_said(tmp_path):
    assert locate_v2(_fake(tmp_path, subtree="memory pids", mounted=False)) == (None, "no cgroup v2 is mounted")


def test_a_delegated_cgroup_is_found(tmp_path):
    assert locate(_fake(tmp_path, subtree="memory pids")) == (Layer(2, (str(tmp_path / "cg" / "job"),)), "")


def test_cgroup_v1_is_taken_where_v2_has_no_memory_and_pids_for_the_children(tmp_path):
    proc = _fake(tmp_path, subtree="", v1=True)
    memory, pids = str(tmp_path / "memory" / "job"), str(tmp_path / "pids" / "sub")
    assert locate_v1(proc) == ((memory, pids), "")
    layer, why = locate(proc)
    assert layer == Layer(1, (memory, pids))
    assert why.startswith(f"cgroup v2 {tmp_path / 'cg' / 'job'} does not enable"), why  # said in the start-up line


def test_a_v2_that_can_be_used_is_preferred_to_v1(tmp_path):
    assert locate(_fake(tmp_path, subtree="memory pids", v1=True)) == (Layer(2, (str(tmp_path / "cg" / "job"),)), "")


def test_this_machines_cgroup_is_read_as_it_is():
    """Whatever this machine has, locate names a layer or a reason for none, and a v1 layer
    names why v2 is not used."""
    layer, why = locate()
    assert layer is not None or why, why
    if layer is not None:
        assert len(layer.parents) == (1 if layer.version == 2 else 2), layer
        assert (layer.version == 1) == (why != ""), (layer, why)
        assert all(os.path.isdir(p) for p in layer.parents), layer
    elif own_cgroup_dir()[0] is not None:
        assert "controller" in why or "writable" in why, why


def test_a_v2_worker_cgroup_holds_its_limits_and_goes_with_it(tmp_path):
    group = WorkerCgroup.make(Layer(2, (str(tmp_path),)), "poise-reward-1-2", memory_mb=256)
    assert (tmp_path / "poise-reward-1-2" / "memory.max").read_text() == str((512 + WORKER_BASE_MB) * 2**20)
    assert (tmp_path / "poise-reward-1-2" / "pids.max").read_text() == str(PIDS_MAX)
    group.add(4242)
    assert (tmp_path / "poise-reward-1-2" / "cgroup.procs").read_text() == "4242"
    assert group.remove()
    assert not (tmp_path / "poise-reward-1-2").exists()


def test_a_v1_worker_cgroup_is_made_in_both_hierarchies_and_goes_with_it(tmp_path):
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    memory.mkdir()
    pids.mkdir()
    group = WorkerCgroup.make(Layer(1, (str(memory), str(pids))), "poise-reward-1-2", memory_mb=256)
    assert (memory / "poise-reward-1-2" / "memory.limit_in_bytes").read_text() == str((512 + WORKER_BASE_MB) * 2**20)
    assert (pids / "poise-reward-1-2" / "pids.max").read_text() == str(PIDS_MAX)
    assert group.swap  # a fake: no memory.memsw.limit_in_bytes to say no swap with
    group.add(4242)
    assert [(d / "poise-reward-1-2" / "cgroup.procs").read_text() for d in (memory, pids)] == ["4242", "4242"]
    assert group.remove()
    assert not (memory / "poise-reward-1-2").exists() and not (pids / "poise-reward-1-2").exists()


def test_a_worker_a_hierarchy_refuses_is_moved_back_where_it_was(tmp_path):
    """v1: moved into the memory cgroup, refused by the pids one: back into the memory parent, so
    the worker goes on (per process) and the cgroup can go."""
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    memory.mkdir()
    pids.mkdir()
    group = WorkerCgroup.make(Layer(1, (str(memory), str(pids))), "poise-reward-1-2", memory_mb=256)
    (pids / "poise-reward-1-2" / "cgroup.procs").mkdir()  # a write there fails
    with pytest.raises(OSError):
        group.add(4242)
    assert (memory / "poise-reward-1-2" / "cgroup.procs").read_text() == "4242"
    assert (memory / "cgroup.procs").read_text() == "4242"


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid nobody has now
    return dead.pid


def test_start_up_removes_the_cgroups_of_dead_drivers_only(tmp_path):
    """On a fake cgroupfs; the same on the kernel's: test_the_kernel_lets_stale_cgroups_be_removed."""
    layer = Layer(1, (str(tmp_path / "memory"), str(tmp_path / "pids")))
    for parent in layer.parents:
        os.mkdir(parent)
    dead = _dead_pid()
    stale = WorkerCgroup.make(layer, f"poise-reward-{dead}-7", memory_mb=64)
    live = WorkerCgroup.make(layer, f"poise-reward-{os.getpid()}-8", memory_mb=64)
    (tmp_path / "memory" / f"other-{dead}-7").mkdir()
    assert sorted(remove_stale(layer)) == sorted(stale.paths)
    assert all(os.path.isdir(p) for p in live.paths) and (tmp_path / "memory" / f"other-{dead}-7").is_dir()


@pytest.fixture
def start_up_log(tmp_path):
    """A run's start-up report open on tmp_path/run: `read()` gives the lines of its start_up.log."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    start_up.begin(run_dir)
    yield lambda: [line.split(" ", 2)[2] for line in (run_dir / start_up.LOG).read_text().splitlines()[1:]]
    start_up.end()


def test_the_pool_says_once_at_the_first_batch_which_limits_are_per_process(make_scorer, reward_file, monkeypatch,
                                                                              capfd, start_up_log):
    """The console: one short line (a weaker defence than the default); the run directory: the details."""
    monkeypatch.setattr(sandbox, "locate_cgroup", lambda: (None, "cgroup v2 /x offers no memory controller"))
    scorer = make_scorer([{"fn": f"{reward_file(GOOD)}:good"}], workers=1)
    assert "reward sandbox" not in capfd.readouterr().err  # not before the run starts: an up-front error stays alone
    scorer.score(inputs(2))
    scorer.score(inputs(2, step=1))
    lines = [x for x in capfd.readouterr().err.splitlines() if "reward sandbox" in x]
    assert lines == [cgroup.weaker_line(None, None)], lines
    assert len(lines[0]) <= start_up.MAX_LINE
    details = [x for x in start_up_log() if "reward sandbox" in x]
    assert details[0].startswith("poise: reward sandbox: no per-worker cgroup (cgroup v2 /x offers no memory "
                                 "controller): reward.memory_mb (RLIMIT_AS) and reward.cpu_s (RLIMIT_CPU) hold per "
                                 "process"), details
    assert details[1:] == [lines[0]]  # what the console said, in the log too
    assert scorer.pool.confinement["cgroup"] is None


def test_the_pool_puts_each_worker_in_a_cgroup_of_its_own_where_it_can(make_scorer, reward_file, monkeypatch, capfd,
                                                                         tmp_path, start_up_log):
    """On a fake cgroupfs (v2): the files the kernel would read, written before the worker starts
    work; one start-up line naming the layer, in the run directory only (the default defence: the
    console says nothing of it); the directory gone once the pool closes."""
    tmp_path = tmp_path / "cgroupfs"
    tmp_path.mkdir()
    monkeypatch.setattr(sandbox, "locate_cgroup", lambda: (Layer(2, (str(tmp_path),)), ""))
    scorer = make_scorer([{"fn": f"{reward_file(GOOD)}:good"}], workers=1, memory_mb=128)
    assert [r.value for r in scorer.score(inputs(2))] == [1.0, 1.0]
    assert "reward sandbox" not in capfd.readouterr().err
    lines = [x for x in start_up_log() if "reward sandbox" in x]
    assert lines == [f"poise: reward sandbox: each worker in a cgroup v2 of its own below {tmp_path}: memory.max "
                     f"{256 + WORKER_BASE_MB} MiB (2 x reward.memory_mb + {WORKER_BASE_MB}) and pids.max {PIDS_MAX} "
                     "hold for the worker and every process it starts; reward.cpu_s (RLIMIT_CPU) per process, the "
                     "wall-clock timeout per call"], lines  # a fake: no memory.swap.max, so no "no swap"
    worker = scorer.pool._workers[0]
    (path,) = scorer.pool.confinement["cgroup"]
    assert path == os.path.join(str(tmp_path), f"poise-reward-{os.getpid()}-{worker.proc.pid}")
    assert open(os.path.join(path, "cgroup.procs")).read() == str(worker.proc.pid)
    assert open(os.path.join(path, "memory.max")).read() == str((256 + WORKER_BASE_MB) * 2**20)
    scorer.close()
    assert not os.path.exists(path)


def test_a_cgroup_the_kernel_refuses_leaves_per_process_limits_and_the_line_says_why(make_scorer, reward_file,
                                                                                      monkeypatch, capfd, tmp_path,
                                                                                      start_up_log):
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    memory.mkdir()
    pids.write_text("")  # not a directory: mkdir below it fails
    monkeypatch.setattr(sandbox, "locate_cgroup", lambda: (Layer(1, (str(memory), str(pids))), "no v2 here"))
    scorer = make_scorer([{"fn": f"{reward_file(GOOD)}:good"}], workers=1)
    assert [r.value for r in scorer.score(inputs(2))] == [1.0, 1.0]
    assert [x for x in capfd.readouterr().err.splitlines() if "reward sandbox" in x] == [cgroup.weaker_line(None, None)]
    lines = [x for x in start_up_log() if "reward sandbox" in x][:1]
    name = f"poise-reward-{os.getpid()}-{scorer.pool._workers[0].proc.pid}"
    assert len(lines) == 1 and lines[0].startswith(
        f"poise: reward sandbox: no per-worker cgroup (cgroup v1 {pids / name}: Not a directory): "), lines
    assert scorer.pool.confinement["cgroup"] is None
    assert os.listdir(memory) == []  # the memory half, made first, went with the refusal


@pytest.fixture
def kernel_layer():
    """The cgroup layer this machine's kernel offers (the test is skipped where none is usable);
    `(layer, names)`: after the test, pass or fail, every cgroup there named for this process's
    pid (the pools it started) or in `names` (appended by the test) is removed."""
    layer, why = locate()
    if layer is None:
        pytest.skip(f"no usable cgroup here: {why}")
    names: list[str] = []
    yield layer, names
    for parent in layer.parents:
        for name in os.listdir(parent):
            if name.startswith(f"poise-reward-{os.getpid()}-") or name in names:
                cgroup.remove_dir(os.path.join(parent, name))


def test_the_kernel_lets_stale_cgroups_be_removed(kernel_layer):
    layer, names = kernel_layer
    names += [f"poise-reward-{_dead_pid()}-7", f"poise-reward-{os.getpid()}-8"]
    stale, live = (WorkerCgroup.make(layer, name, memory_mb=64) for name in names)
    assert sorted(remove_stale(layer)) == sorted(stale.paths)
    assert all(os.path.isdir(p) for p in live.paths)
    assert live.remove() and not any(os.path.exists(p) for p in live.paths)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except OSError:
            continue
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def test_every_process_of_a_worker_starts_in_its_cgroup(make_scorer, reward_file, kernel_layer, capfd, start_up_log):
    layer, _ = kernel_layer
    scorer = make_scorer([{"fn": f"{reward_file(GOOD)}:good"}], workers=1)
    scorer.score(inputs(1))
    assert "reward sandbox" not in capfd.readouterr().err  # the default defence holds: nothing on the console
    line = [x for x in start_up_log() if "reward sandbox" in x]
    assert len(line) == 1 and f"in a cgroup v{layer.version} of its own below {layer.parents[0]}" in line[0], line
    worker = scorer.pool._workers[0]
    paths = scorer.pool.confinement["cgroup"]
    assert paths == [os.path.join(p, f"poise-reward-{os.getpid()}-{worker.proc.pid}") for p in layer.parents]
    processes = [worker.proc.pid, *_descendants(worker.proc.pid)]
    if scorer.pool.confinement["pid_namespace"]:
        assert len(processes) >= 3, processes  # the watcher, PID 1, the server
    for path in paths:
        inside = {int(x) for x in open(os.path.join(path, "cgroup.procs")).read().split()}
        assert set(processes) <= inside, (path, processes, inside)
    scorer.close()
    assert not any(os.path.exists(p) for p in paths)


HOG = '''
import os

def hog(prompts, completions, **kwargs):
    """Eight children, each holding 120 MiB (under RLIMIT_AS at memory_mb 256): 960 MiB in all,
    held at once (each says so on `ready`, then waits for `go`). 1.0 if all eight held it."""
    size = 120 * 2**20
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    kids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            block = bytearray(size)
            for i in range(0, size, 4096):
                block[i] = 1
            os.write(ready_w, b"x")
            os.close(ready_w)
            os.read(go_r, 1)  # until the parent closes go: every child holds its block till then
            os._exit(0)
        kids.append(pid)
    os.close(ready_w)
    held = b""
    while True:  # until every child has said it holds its block, or died
        chunk = os.read(ready_r, 8)
        if not chunk:
            break
        held += chunk
    os.close(go_w)
    statuses = [os.waitpid(pid, 0)[1] for pid in kids]
    return [1.0 if len(held) == 8 and all(s == 0 for s in statuses) else 0.0 for _ in completions]
'''


def test_a_forked_memory_hog_is_held_by_the_workers_cgroup(make_scorer, reward_file, kernel_layer):
    """Children that together hold far more than reward.memory_mb. Under the worker's cgroup
    (2 x 256 + 96 MiB) some of them are killed (reward 0 or a failed call); with per-process limits
    alone every child holds its block (reward 1: seen on these machines with the cgroup layer
    disabled)."""
    scorer = make_scorer([{"fn": f"{reward_file(HOG)}:hog"}], workers=1, memory_mb=256, timeout_s=20, fallback=-1.0)
    assert scorer.pool.confinement["cgroup"] is not None
    result = scorer.score(inputs(1))[0]
    assert result.value != 1.0, result


BOMB = '''
import os

def bomb(prompts, completions, **kwargs):
    """Fork until the kernel says no (200 at most); returns how many children lived at once."""
    r, w = os.pipe()
    kids = []
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # until the parent closes its end: every child holds its task till then
            os._exit(0)
        kids.append(pid)
    os.close(w)
    for pid in kids:
        os.waitpid(pid, 0)
    return [float(len(kids)) for _ in completions]
'''


def test_a_fork_bomb_is_held_by_the_workers_pids_max(make_scorer, reward_file, kernel_layer, monkeypatch):
    """pids.max counts the worker's own tasks (watcher, PID 1, server, the call process) and all
    they fork. Set below the per-worker RLIMIT_NPROC (32 tasks beyond the worker's own, which alone
    lets the bomb have about 30 children) so that the cgroup is what stops it."""
    monkeypatch.setattr(cgroup, "PIDS_MAX", 8)
    scorer = make_scorer([{"fn": f"{reward_file(BOMB)}:bomb"}], workers=1, timeout_s=20)
    (path,) = [p for p in scorer.pool.confinement["cgroup"] if os.path.exists(os.path.join(p, "pids.max"))]
    assert open(os.path.join(path, "pids.max")).read().strip() == "8"
    result = scorer.score(inputs(1))[0]
    assert result.value is not None and 0 < result.value < 8, result
