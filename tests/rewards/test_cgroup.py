"""Per-worker cgroup v2 limits of the reward sandbox (poise.rewards.cgroup): found where this
process's cgroup v2 hands memory and pids to its children, else one start-up line that says which
limits hold per process. The detection and the pool's use of a cgroup directory run on a fake
cgroupfs here (these machines' cgroup v2 has no memory or pids controller); the forked memory hog
runs against the kernel where a usable cgroup exists, and is skipped, with the reason, elsewhere."""

from __future__ import annotations

import os

import pytest

from poise.rewards import cgroup, sandbox
from poise.rewards.cgroup import PIDS_MAX, WORKER_BASE_MB, WorkerCgroup, locate, own_cgroup_dir

from conftest import inputs

GOOD = '''
def good(prompts, completions, **kwargs):
    return [1.0 for _ in completions]
'''


def _fake(tmp_path, subtree: str, offered: str = "cpu memory pids", mounted: bool = True) -> str:
    """A /proc/self with this process in cgroup /job of a cgroup2 mounted at tmp_path/cg."""
    proc, job = tmp_path / "proc", tmp_path / "cg" / "job"
    proc.mkdir()
    job.mkdir(parents=True)
    fstype = "cgroup2" if mounted else "cgroup"
    (proc / "mountinfo").write_text(f"30 22 0:26 / /proc rw - proc proc rw\n"
                                    f"35 24 0:30 / {tmp_path / 'cg'} rw,nosuid - {fstype} cgroup2 rw\n")
    (proc / "cgroup").write_text("4:memory:/elsewhere\n0::/job\n")
    (job / "cgroup.controllers").write_text(offered + "\n")
    (job / "cgroup.subtree_control").write_text(subtree + "\n")
    return str(proc)


def test_a_cgroup_without_memory_and_pids_for_its_children_is_refused_with_the_reason(tmp_path):
    proc = _fake(tmp_path, subtree="cpu")
    where, why = locate(proc)
    assert where is None
    assert why == (f"cgroup v2 {tmp_path / 'cg' / 'job'} does not enable the memory and pids controllers for its "
                   "children (it offers: cpu, memory, pids)")


def test_no_cgroup_v2_mounted_is_said(tmp_path):
    assert locate(_fake(tmp_path, subtree="memory pids", mounted=False)) == (None, "no cgroup v2 is mounted")


def test_a_delegated_cgroup_is_found(tmp_path):
    assert locate(_fake(tmp_path, subtree="memory pids")) == (str(tmp_path / "cg" / "job"), "")


def test_this_machines_cgroup_is_read_as_it_is():
    """Whatever this machine has, locate names a directory or a reason, never both, never neither."""
    where, why = locate()
    assert (where is None) != (why == ""), (where, why)
    if where is None and own_cgroup_dir()[0] is not None:
        assert "controller" in why or "writable" in why, why


def test_a_worker_cgroup_holds_its_limits_and_goes_with_it(tmp_path):
    group = WorkerCgroup.make(str(tmp_path), "poise-reward-1-2", memory_mb=256)
    assert (tmp_path / "poise-reward-1-2" / "memory.max").read_text() == str((512 + WORKER_BASE_MB) * 2**20)
    assert (tmp_path / "poise-reward-1-2" / "pids.max").read_text() == str(PIDS_MAX)
    group.add(4242)
    assert (tmp_path / "poise-reward-1-2" / "cgroup.procs").read_text() == "4242"
    group.remove()
    assert not (tmp_path / "poise-reward-1-2").exists()


def test_the_pool_says_once_at_the_first_batch_which_limits_are_per_process(make_scorer, reward_file, monkeypatch, capfd):
    monkeypatch.setattr(sandbox, "locate_cgroup", lambda: (None, "cgroup v2 /x offers no memory controller"))
    scorer = make_scorer([{"fn": f"{reward_file(GOOD)}:good"}], workers=1)
    assert "reward sandbox" not in capfd.readouterr().err  # not before the run starts: an up-front error stays alone
    scorer.score(inputs(2))
    scorer.score(inputs(2, step=1))
    lines = [x for x in capfd.readouterr().err.splitlines() if "reward sandbox" in x]
    assert len(lines) == 1, lines
    assert lines[0].startswith("poise: reward sandbox: no per-worker cgroup (cgroup v2 /x offers no memory "
                               "controller): reward.memory_mb (RLIMIT_AS) and reward.cpu_s (RLIMIT_CPU) hold per "
                               "process"), lines[0]
    assert scorer.pool.confinement["cgroup"] is None


def test_the_pool_puts_each_worker_in_a_cgroup_of_its_own_where_it_can(make_scorer, reward_file, monkeypatch, capfd,
                                                                         tmp_path):
    """On a fake cgroupfs: the files the kernel would read, written before the worker starts work;
    no start-up line; the directory gone once the pool closes."""
    monkeypatch.setattr(sandbox, "locate_cgroup", lambda: (str(tmp_path), ""))
    scorer = make_scorer([{"fn": f"{reward_file(GOOD)}:good"}], workers=1, memory_mb=128)
    assert [r.value for r in scorer.score(inputs(2))] == [1.0, 1.0]
    assert "reward sandbox" not in capfd.readouterr().err
    worker = scorer.pool._workers[0]
    path = scorer.pool.confinement["cgroup"]
    assert path == os.path.join(str(tmp_path), f"poise-reward-{os.getpid()}-{worker.proc.pid}")
    assert open(os.path.join(path, "cgroup.procs")).read() == str(worker.proc.pid)
    assert open(os.path.join(path, "memory.max")).read() == str((256 + WORKER_BASE_MB) * 2**20)
    scorer.close()
    assert not os.path.exists(path)


HOG = '''
import os, time

def hog(prompts, completions, **kwargs):
    """Eight children, each holding 120 MiB (under RLIMIT_AS at memory_mb 256): 960 MiB in all."""
    size = 120 * 2**20
    kids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            block = bytearray(size)
            for i in range(0, size, 4096):
                block[i] = 1
            time.sleep(1.0)
            os._exit(0)
        kids.append(pid)
    statuses = [os.waitpid(pid, 0)[1] for pid in kids]
    return [1.0 if all(s == 0 for s in statuses) else 0.0 for _ in completions]
'''


def test_a_forked_memory_hog_is_held_by_the_workers_cgroup(make_scorer, reward_file):
    """The attack of issue item 'limits per process': children that together hold far more than
    reward.memory_mb. Under a per-worker memory.max (2 x 256 + 96 MiB) some of them are killed
    (reward 0 or a failed call); with per-process limits alone every child succeeds (reward 1: seen
    on these machines with the cgroup check removed)."""
    where, why = cgroup.locate()
    if where is None:
        pytest.skip(f"no usable cgroup v2 here: {why}")
    scorer = make_scorer([{"fn": f"{reward_file(HOG)}:hog"}], workers=1, memory_mb=256, timeout_s=20, fallback=-1.0)
    assert scorer.pool.confinement["cgroup"] is not None
    result = scorer.score(inputs(1))[0]
    assert result.value != 1.0, result
