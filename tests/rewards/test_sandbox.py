"""Hostile reward functions, each a user reward file: stopped or refused within its timeout, scored
by the fallback, counted in reward_failures, and the pool keeps working (docs/design.md, Rewards).

Every test pairs the hostile function with a well-behaved one (`good`: 1.0 for each completion,
after writing and reading back a file in its scratch directory) in the same pool, and scores a
second batch afterwards, so "the pool keeps working" is checked, not assumed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from poise.rewards.scorer import log_failures, reward_metrics
from poise.rewards.sandbox import UID_BASE

from conftest import inputs

FALLBACK = -1.0
TIMEOUT_S = 1.5

GOOD = '''
import os

def good(prompts, completions, **kwargs):
    with open("scratch.txt", "w") as f:  # the working directory is the worker's scratch
        f.write("ok")
    with open(os.path.join(os.environ["HOME"], "scratch.txt")) as f:  # and so is HOME
        return [1.0 if f.read() == "ok" else 0.5 for _ in completions]
'''


def _scorer(make_scorer, reward_file, hostile_source, **limits):
    path = reward_file(GOOD + hostile_source)
    return make_scorer([{"fn": f"{path}:hostile"}, {"fn": f"{path}:good", "weight": 0.5}],
                       timeout_s=limits.pop("timeout_s", TIMEOUT_S), fallback=FALLBACK, **limits)


def _assert_contained(scorer, n=2, reason="", within_s=None, again=3):
    """The hostile function failed on every sample (fallback, counted, with a reason) while `good`
    scored; then a second batch still scores. Returns the failure reasons."""
    start = time.monotonic()
    results = scorer.score(inputs(n))
    elapsed = time.monotonic() - start
    if within_s is not None:
        assert elapsed < within_s, f"{n} hostile calls took {elapsed:.1f} s"
    assert [r.parts for r in results] == [{"hostile": FALLBACK, "good": 1.0}] * n, results
    assert [r.value for r in results] == [FALLBACK + 0.5] * n
    metrics = reward_metrics(results)
    assert metrics["reward_failures"] == n and metrics["reward/hostile"] == FALLBACK and metrics["reward/good"] == 1.0
    reasons = [f.reason for r in results for f in r.failures]
    assert all(f.function == "hostile" for r in results for f in r.failures)
    assert all(reason in x for x in reasons), reasons
    results = scorer.score(inputs(again, step=1))  # the pool keeps working
    assert [r.parts["good"] for r in results] == [1.0] * again
    return reasons


def _session_members(sid: int) -> list[int]:
    members = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                members.append(int(pid))
    return members


def _sandbox_processes() -> dict[int, int]:
    """{pid: session} of every process whose working directory is a scratch directory of a reward
    pool of this process (other test runs on the machine have theirs)."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if f"poise-reward-{os.getpid()}-" in os.readlink(f"/proc/{pid}/cwd"):  # this test's pools
                    with open(f"/proc/{pid}/stat") as f:
                        out[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[3])
            except OSError:
                continue
    return out


def _assert_only_live_workers(scorer, within_s: float = 5.0) -> None:
    """Every sandbox process left is a live worker's: the worker, its PID 1 and its server (three
    with a PID namespace), nothing a reward started (killed processes may take a moment to go)."""
    live = {w.proc.pid for w in scorer.pool._workers if w.proc is not None}
    deadline = time.monotonic() + within_s
    while True:
        procs = _sandbox_processes()
        stray = {pid: sid for pid, sid in procs.items() if sid not in live}
        per_worker = [sum(1 for sid in procs.values() if sid == w) for w in live]
        if not stray and all(n <= 3 for n in per_worker):
            return
        assert time.monotonic() < deadline, (stray, per_worker)
        time.sleep(0.1)


def test_sleep_forever_times_out_and_the_worker_is_replaced(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
import time
def hostile(prompts, completions, **kwargs):
    time.sleep(10 ** 6)
''')
    # 2 timeouts over 2 workers: about one timeout each, plus a worker's restart
    _assert_contained(scorer, reason="timed out after 1.5 s", within_s=2 * TIMEOUT_S + 3)
    assert scorer.pool.restarts == 2 + 3  # one per timed-out call, the second batch's 3 included


def test_fork_bomb_is_contained_and_leaves_no_process(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
import os
def hostile(prompts, completions, **kwargs):
    while True:  # each copy forks on, ignoring the errors: only the task limit and the kill stop it
        try:
            os.fork()
        except OSError:
            pass
''')
    _assert_contained(scorer, reason="timed out", within_s=2 * TIMEOUT_S + 5)
    _assert_only_live_workers(scorer)


def test_fork_that_raises_returns_and_kills_what_it_started(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
import os, time
def hostile(prompts, completions, **kwargs):
    if os.fork() == 0:
        time.sleep(10 ** 6)  # a child left behind
    while True:
        os.fork()  # BlockingIOError once the task limit is reached
''')
    if scorer.pool.confinement["nproc_limit"] < 0:
        pytest.skip(f"no task limit here: {scorer.pool.confinement['notes']}")
    _assert_contained(scorer, reason="BlockingIOError", within_s=2 * TIMEOUT_S)
    if scorer.pool.confinement["pid_namespace"]:  # the sleeping child was killed after the call
        _assert_only_live_workers(scorer)


def test_spinning_past_the_cpu_limit_kills_the_call(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
def hostile(prompts, completions, **kwargs):
    while True:
        pass
''', cpu_s=1, timeout_s=30)
    # RLIMIT_CPU (SIGXCPU after 1-2 CPU seconds), long before the wall-clock timeout
    _assert_contained(scorer, n=1, reason="exceeded reward.cpu_s", within_s=20, again=1)


def test_allocating_50_gb_is_refused(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
def hostile(prompts, completions, **kwargs):
    block = bytearray(50 * 2 ** 30)
    return [float(len(block))]
''', memory_mb=512)
    _assert_contained(scorer, reason="MemoryError", within_s=2 * TIMEOUT_S)


def test_secrets_of_the_driver_are_not_visible(make_scorer, reward_file, tmp_path, monkeypatch):
    secret = "poise-test-secret-4242"
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(secret)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("POISE_TEST_SECRET", secret)
    path = reward_file(f'''
import os

def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""

def hostile(prompts, completions, **kwargs):
    seen = {{
        "environ": " ".join(f"{{k}}={{v}}" for k, v in os.environ.items()),
        "home": _read(os.path.expanduser("~/.ssh/id_rsa")),
        "absolute": _read({str(home / ".ssh" / "id_rsa")!r}),
        "driver": _read("/proc/{os.getpid()}/environ"),
    }}
    leaked = sorted(k for k, v in seen.items() if {secret!r} in v)
    if leaked:
        raise RuntimeError("LEAKED " + ",".join(leaked))
    return [0.5 for _ in completions]
''')
    scorer = make_scorer([{"fn": f"{path}:hostile"}], fallback=FALLBACK)
    results = scorer.score(inputs(2))
    leaks = [f.reason for r in results for f in r.failures]
    if not scorer.pool.confinement["filesystem"]:  # without Landlock only env and HOME are scrubbed
        assert not any("environ" in x or "home" in x.split("LEAKED ")[-1].split(",") for x in leaks), leaks
        pytest.skip(f"no Landlock here, absolute paths stay readable: {scorer.pool.confinement['notes']}")
    assert leaks == [] and [r.value for r in results] == [0.5, 0.5], leaks


def test_writing_outside_the_scratch_directory_fails(make_scorer, reward_file, tmp_path):
    target = tmp_path / "escaped.txt"
    scorer = _scorer(make_scorer, reward_file, f'''
def hostile(prompts, completions, **kwargs):
    with open({str(target)!r}, "w") as f:
        f.write("escaped")
    return [1.0 for _ in completions]
''')
    c = scorer.pool.confinement
    if not c["filesystem"] and c["uid"] == os.getuid():
        pytest.skip(f"no Landlock and no uid of its own: the worker writes what the user can ({c['notes']})")
    _assert_contained(scorer, reason="PermissionError")
    assert not target.exists()


def test_connecting_to_a_listener_of_the_driver_fails(make_scorer, reward_file):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        scorer = _scorer(make_scorer, reward_file, f'''
import socket
import subprocess
def hostile(prompts, completions, **kwargs):
    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
    return [1.0 for _ in completions]
''')
        if scorer.pool.confinement["network"] == "open":
            pytest.skip(f"no network namespace nor Landlock TCP rules here: {scorer.pool.confinement['notes']}")
        _assert_contained(scorer, reason="Error", within_s=2 * TIMEOUT_S)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody got through
    finally:
        listener.close()


@pytest.mark.parametrize("body, reason", [
    ("raise ValueError('boom')", "ValueError: boom"),
    ("return [float('nan') for _ in completions]", "returned nan"),
    ("return [float('inf') for _ in completions]", "returned inf"),
    ("return [1.0, 2.0]", "returned 2 rewards for 1 completion"),
    ("return ['high' for _ in completions]", "not a number"),
    ("return 1.0", "not a list"),
    ("import os; os._exit(3)", "exited with status 3"),
    ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "SIGTERM"),
], ids=["raise", "nan", "inf", "wrong-count", "not-a-number", "not-a-list", "exit", "segfault", "sigterm"])
def test_bad_answers_and_crashes_get_the_fallback(make_scorer, reward_file, body, reason):
    scorer = _scorer(make_scorer, reward_file, f'''
def hostile(prompts, completions, **kwargs):
    {body}
''')
    _assert_contained(scorer, reason=reason, within_s=2 * TIMEOUT_S)


def test_failures_are_logged_with_the_sample_id(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
def hostile(prompts, completions, **kwargs):
    raise ValueError("boom")
''')
    batch = inputs(2, step=7)
    results = scorer.score(batch)

    class Log:
        events = []

        def event(self, kind, t, **fields):
            self.events.append((kind, fields))

    log = Log()
    log_failures(log, 1.0, 7, [(x.sample_id, r) for x, r in zip(batch, results)], FALLBACK)
    assert log.events == [("reward_failure", {"step": 7, "id": [7, i, 0], "function": "hostile",
                                              "reason": "ValueError: boom", "fallback": FALLBACK}) for i in range(2)]


def test_user_code_runs_confined_even_at_import(make_scorer, reward_file, tmp_path):
    target = tmp_path / "at-import.txt"
    path = reward_file(f'''
import os
try:
    open({str(target)!r}, "w").write("escaped")  # module top level: already inside the sandbox
except OSError:
    pass
DRIVER = os.getpid()

def pid(prompts, completions, **kwargs):
    return [float(DRIVER) for _ in completions]
''')
    scorer = make_scorer([{"fn": f"{path}:pid"}])
    (result,) = scorer.score(inputs(1))
    assert result.value != os.getpid()  # imported in a worker, not in the driver
    if scorer.pool.confinement["filesystem"] or scorer.pool.confinement["uid"] >= UID_BASE:
        assert not target.exists()


def test_pool_shuts_down_without_leaving_processes(make_scorer):
    scorer = make_scorer(["exact"])
    sessions = [w.proc.pid for w in scorer.pool._workers]
    assert all(_session_members(sid) for sid in sessions)
    scorer.close()
    deadline = time.monotonic() + 5  # SIGKILLed processes may take a moment to be gone
    while any(_session_members(sid) for sid in sessions) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [_session_members(sid) for sid in sessions] == [[] for _ in sessions]


def _landlock_abi() -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))


def _can_mount_tmpfs() -> bool:
    import tempfile

    from poise.rewards.sandbox import mount_tmpfs, unmount

    with tempfile.TemporaryDirectory() as where:
        if not mount_tmpfs(where, 1, os.getuid()):
            return False
        unmount(where)
        return True


def test_every_layer_the_kernel_offers_holds(make_scorer):
    """The tests above skip a check only where the kernel refuses its layer: probe the kernel here,
    so a layer that silently stopped working fails instead of skipping."""
    c = make_scorer(["exact"]).pool.confinement
    if _landlock_abi() >= 1:
        assert c["filesystem"], c["notes"]
    namespaces = os.geteuid() == 0 or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    if namespaces:
        assert c["network"] == "namespace" and c["pid_namespace"], c["notes"]
    if os.geteuid() == 0:
        assert c["uid"] >= UID_BASE and c["nproc_limit"] > 0, c["notes"]
        assert c["reads_exposed"], c["notes"]  # so no process of the worker keeps CAP_DAC_READ_SEARCH
        if _can_mount_tmpfs():  # size-limited: test_a_disk_filler_stops_at_the_scratch_limit
            assert c["scratch"] == "tmpfs"
    if sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64"):
        assert c["unix_sockets"] == "blocked", c["notes"]
    assert c["notes"] == [] or not namespaces or _landlock_abi() < 1, c["notes"]


HANG = '''
import time
def hostile(prompts, completions, **kwargs):
    time.sleep(10 ** 6)
'''


def _hanging_calls(n: int) -> list:
    from poise.rewards.sandbox import Call

    return [Call(0, f"prompt {i}", "c", {}) for i in range(n)]


def test_close_with_hanging_calls_returns_at_once_and_answers_every_call(make_scorer, reward_file):
    """What a second Ctrl-C needs: closing a pool whose calls all hang (far from their timeout) kills
    the workers at once, answers every call (failed: nothing is left waiting) and leaves nothing."""
    scorer = _scorer(make_scorer, reward_file, HANG, timeout_s=30.0)
    batch = scorer.pool.submit(_hanging_calls(6))
    time.sleep(1.0)  # both workers are inside a call
    start = time.monotonic()
    scorer.close()
    took = time.monotonic() - start
    assert took < 5.0, f"close took {took:.1f} s with hanging calls"
    outcomes = batch.result(timeout=1.0)
    assert all(o.value is None and "closed" in o.error for o in outcomes), outcomes
    assert _sandbox_processes() == {}


def test_no_worker_starts_after_close(make_scorer, reward_file):
    """Serving threads replace a timed-out worker while `close` kills them: no thread may die of
    the race (its calls would never be answered) and none may start a worker after close."""
    scorer = _scorer(make_scorer, reward_file, HANG, timeout_s=0.5)
    batch = scorer.pool.submit(_hanging_calls(200))
    time.sleep(1.5)  # timeouts and restarts under way
    scorer.close()
    outcomes = batch.result(timeout=1.0)  # every call answered
    assert all(o.value is None for o in outcomes) and sum("closed" in o.error for o in outcomes) > 100, outcomes
    assert not any(t.is_alive() for t in scorer.pool._threads)
    time.sleep(3.0)  # a thread still serving would have restarted a worker by now
    assert _sandbox_processes() == {}
    assert all(w.proc is None for w in scorer.pool._workers)
