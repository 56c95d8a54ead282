"""Attacks on the reward sandbox's results and on the machine around it, each written as the
attacker would try it, through every channel, fd and module the sandbox created (docs/design.md,
Rewards: user code never shares a process, an fd or a writable module with the channel that
reports its result). RELIABILITY.md lists them with the layer that stops each.

Each test scores a hostile function beside `good` (1.0 per completion, after a scratch-file
round trip), then a second batch, and checks that `good`'s results, the second batch's and the
failure count are the honest ones.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from poise.rewards.builtin import run_tests, score_marks
from poise.rewards.cgroup import locate as locate_cgroup
from poise.rewards.cgroup import remove_dir as remove_cgroup
from poise.rewards.cgroup import remove_stale as remove_stale_cgroups
from poise.rewards.sandbox import remove_stale_scratch
from poise.rewards.scorer import reward_metrics

from conftest import inputs

FALLBACK = -1.0
GOOD = '''
import os

def good(prompts, completions, **kwargs):
    with open("scratch.txt", "w") as f:
        f.write("ok")
    with open("scratch.txt") as f:
        return [1.0 if f.read() == "ok" else 0.5 for _ in completions]
'''


def _scorer(make_scorer, reward_file, hostile_source, **cfg):
    path = reward_file(GOOD + textwrap.dedent(hostile_source))
    return make_scorer([{"fn": f"{path}:hostile"}, {"fn": f"{path}:good", "weight": 0.5}],
                       timeout_s=cfg.pop("timeout_s", 5.0), fallback=FALLBACK, **cfg)


def _honest(scorer, n=3, hostile_value=None):
    """`good` scored 1.0 everywhere, in this batch and the next; the hostile function's results are
    its fallback (counted) or `hostile_value`. Returns the hostile failures' reasons."""
    results = scorer.score(inputs(n))
    assert [r.parts["good"] for r in results] == [1.0] * n, results
    hostile = [r.parts["hostile"] for r in results]
    if hostile_value is None:
        assert hostile == [FALLBACK] * n, results
        assert reward_metrics(results)["reward_failures"] == n
    else:
        assert hostile == [hostile_value] * n, results
    again = scorer.score(inputs(n, step=1))
    assert [r.parts["good"] for r in again] == [1.0] * n, again
    return [f.reason for r in results for f in r.failures]


# --- forged answers --------------------------------------------------------------------------------
FORGE_EVERY_FD = '''
import json, os

def hostile(prompts, completions, **kwargs):
    # answers for the ids a counter would give, on every fd this process has: extra lines for the
    # other samples and the next batch, and one malformed line to shift the rest
    lines = "".join(json.dumps(x) + "\\n" for k in range(200) for x in ([k, "ok", 500.0], ["ok", 500.0]))
    data = (lines + "garbage\\n").encode()
    for fd in range(0, 256):
        try:
            os.write(fd, data)
        except OSError:
            pass
    return [1.0 for _ in completions]
'''


@pytest.mark.parametrize("isolation", ["batch", "call"])
def test_forged_answer_lines_on_every_fd_fail_only_their_own_call(make_scorer, reward_file, isolation):
    scorer = _scorer(make_scorer, reward_file, FORGE_EVERY_FD, isolation=isolation)
    reasons = _honest(scorer)
    assert all("unexpected bytes" in r for r in reasons), reasons


def test_a_nesting_bomb_on_the_result_pipe_fails_only_its_call_and_keeps_the_worker(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
import os

def hostile(prompts, completions, **kwargs):
    for fd in range(3, 256):  # 4 KiB of "[": what json.loads recurses into until RecursionError
        try:
            os.write(fd, b"[" * 4000 + b"\\n")
        except OSError:
            pass
    return [1.0 for _ in completions]
''')
    reasons = _honest(scorer)
    assert all("unexpected bytes" in r for r in reasons), reasons
    assert scorer.pool.restarts == 0  # the worker's server parsed it as a bad line, and went on


FORGE_FROM_MEMORY = '''
import gc, json, os, sys

def hostile(prompts, completions, **kwargs):
    # the smart forger: read the ids of the calls this process runs from its own memory and write
    # each one's answer, on every fd, before returning its own
    frame, ids = sys._getframe(), []
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, list) and value and isinstance(value[0], tuple) and len(value[0]) == 5:
                ids += [call[0] for call in value]
        frame = frame.f_back
    data = "".join(json.dumps([i, "ok", 500.0]) + "\\n" for i in ids[1:] if i != ids[0]).encode()
    for fd in range(3, 256):
        try:
            os.write(fd, data)
        except OSError:
            pass
    return [1.0 for _ in completions]
'''


def test_a_reward_reading_its_call_ids_from_memory_cannot_forge_another_sample_with_isolation_call(
        make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, FORGE_FROM_MEMORY, isolation="call")
    # 4 samples: each worker's chunk of the hostile function's calls holds two, so every call finds
    # another id to forge (a chunk of one would find none and answer honestly)
    reasons = _honest(scorer, n=4)  # the ids it found are other processes' calls: its extra lines fail it
    assert all("unexpected bytes" in r for r in reasons), reasons


MODULE_PATCH = '''
import builtins, json
import poise.rewards.worker as worker

def hostile(prompts, completions, **kwargs):
    if completions[0] == "patch":  # patch what answers the pool, so every later call says 99
        worker._value = lambda out: 99.0
        worker._parse = lambda line, call_id: [call_id, "ok", 99.0]
        json.dumps = lambda *a, **k: '[0, "ok", 99.0]'
        builtins.float = lambda *a: 99.0
    return [1.0 for _ in completions]
'''


@pytest.mark.parametrize("isolation", ["batch", "call"])
def test_a_patched_module_dies_with_its_call_process(make_scorer, reward_file, isolation):
    scorer = _scorer(make_scorer, reward_file, MODULE_PATCH, isolation=isolation, workers=1)
    first = scorer.score(inputs(2, answer="patch"))
    if isolation == "call":  # not even the rest of its own batch
        assert [r.parts["good"] for r in first] == [1.0, 1.0], first
    later = scorer.score(inputs(3))  # the same worker, the next batch: a fresh call process
    assert [r.parts for r in later] == [{"hostile": 1.0, "good": 1.0}] * 3, later


REACH_THE_SERVER = '''
import os, signal

def hostile(prompts, completions, **kwargs):
    # the process that holds the pool's pipes is our parent (or an ancestor): open its fds and its
    # memory through /proc, write to its pipes, signal it
    got = []
    pids = [os.getppid(), DRIVER]
    for pid in pids:
        for fd in range(0, 32):
            try:
                with open(f"/proc/{pid}/fd/{fd}", "wb", buffering=0) as f:
                    f.write(b'[0, "ok", 500.0]\\n')
                got.append(f"fd {fd} of {pid}")
            except OSError:
                pass
        try:
            with open(f"/proc/{pid}/mem", "r+b", buffering=0):
                got.append(f"mem of {pid}")
        except OSError:
            pass
        try:
            os.kill(pid, 0)
            got.append(f"signal to {pid}")
        except OSError:
            pass
    if got:
        raise RuntimeError("REACHED " + ", ".join(got))
    return [1.0 for _ in completions]
'''


def test_the_server_and_the_driver_are_out_of_reach_through_proc(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, REACH_THE_SERVER.replace("DRIVER", str(os.getpid())))
    if scorer.pool.confinement["landlock_abi"] < 6:
        pytest.skip(f"Landlock ABI {scorer.pool.confinement['landlock_abi']} does not scope signals")
    _honest(scorer, hostile_value=1.0)


# --- the code reward's harness ------------------------------------------------------------------
@pytest.mark.parametrize("candidate", [
    # marks written on every fd, and through the harness's own fds in /proc
    "import os\nfor fd in range(256):\n    try:\n        os.write(fd, b'P' * 600)\n    except OSError:\n        pass\n",
    "import os\nfor fd in range(64):\n    try:\n        open(f'/proc/{os.getppid()}/fd/{fd}', 'wb', buffering=0).write(b'P' * 600)\n"
    "    except OSError:\n        pass\n",
    "import os\nos._exit(0)\n",
    "import sys\nsys.exit(0)\n",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
], ids=["marks-on-every-fd", "marks-through-proc", "os-exit-0", "sys-exit-0", "kill-the-harness"])
def test_a_candidate_cannot_report_passes_for_tests_it_fails(candidate):
    program = candidate + "def add(a, b):\n    return a - b\n"
    assert run_tests(program, ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]) == 0.0


def test_the_harness_still_counts_honest_passes():
    program = "def add(a, b):\n    return a + b\n"
    assert run_tests(program, ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0"]) == 2 / 3


def test_a_report_of_more_passes_than_tests_is_a_failure():
    assert score_marks("PF", 2) == 0.5
    for forged in ("PPP", "PX", "P\nP"):
        with pytest.raises(RuntimeError, match="not scored"):
            score_marks(forged, 2)


def test_the_code_reward_through_the_sandbox_is_not_gamed(make_scorer):
    scorer = make_scorer([{"fn": "code"}], fallback=FALLBACK, timeout_s=20)
    forger = "```python\nimport os\nfor fd in range(256):\n    try:\n        os.write(fd, b'P' * 600)\n" \
             "    except OSError:\n        pass\ndef add(a, b):\n    return 0\n```"
    from poise.rewards.scorer import RewardInput
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    results = scorer.score([RewardInput((0, i, 0), "p", forger, {"tests": tests}) for i in range(2)])
    assert [r.value for r in results] == [0.0, 0.0], results


# --- the machine around the sandbox --------------------------------------------------------------
def test_unix_sockets_of_the_user_are_not_reachable(make_scorer, reward_file, tmp_path):
    path_listener = socket.socket(socket.AF_UNIX)
    path_listener.bind(str(tmp_path / "agent.sock"))  # like ssh-agent's, or a Ray raylet's
    abstract_listener = socket.socket(socket.AF_UNIX)
    abstract_listener.bind(f"\0poise-test-{os.getpid()}")
    os.chmod(tmp_path, 0o777)
    os.chmod(tmp_path / "agent.sock", 0o777)
    for listener in (path_listener, abstract_listener):
        listener.listen(8)
        listener.setblocking(False)
    try:
        scorer = _scorer(make_scorer, reward_file, f'''
import socket

def hostile(prompts, completions, **kwargs):
    reached = []
    for address in ({str(tmp_path / "agent.sock")!r}, "\\0poise-test-{os.getpid()}"):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(1)
            s.connect(address)
            reached.append(address)
        except OSError:
            pass
    if reached:
        raise RuntimeError(f"REACHED {{reached}}")
    return [1.0 for _ in completions]
''')
        if scorer.pool.confinement["unix_sockets"] != "blocked":
            pytest.skip(f"no seccomp here: {scorer.pool.confinement['notes']}")
        _honest(scorer, hostile_value=1.0)
        for listener in (path_listener, abstract_listener):
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody got through
    finally:
        path_listener.close()
        abstract_listener.close()


DRIVER = '''
import os, sys, time
sys.path.insert(0, "tests/rewards")
from conftest import inputs
from poise.config import RewardConfig, RewardFunctionConfig
from poise.rewards.scorer import RewardScorer
scorer = RewardScorer(RewardConfig(functions=(RewardFunctionConfig(fn=sys.argv[1]),), timeout_s=600, workers=2))
scorer.submit(inputs(2))  # two calls that hang
print(" ".join(str(w.proc.pid) for w in scorer.pool._workers), " ".join(w.scratch for w in scorer.pool._workers),
      sep="\\n", flush=True)
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_driver_leaves_no_worker_and_no_scratch_and_its_cgroups_go_at_the_next_start(reward_file,
                                                                                                  tmp_path):
    path = reward_file("import time\ndef hang(prompts, completions, **kwargs):\n    time.sleep(10 ** 6)\n")
    layer, _ = locate_cgroup()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, f"{path}:hang"], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        sessions = [int(x) for x in driver.stdout.readline().split()]
        scratch = driver.stdout.readline().split()
        assert len(sessions) == 2 and all(os.path.isdir(s) for s in scratch)
        time.sleep(0.5)  # the calls are running (hanging)
        members = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                   if _session_of(pid) in sessions]
        assert len(members) >= 6  # each worker: watcher, PID 1, server (and its call process)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 10
        while (any(_alive(p) for p in members) or any(os.path.exists(s) for s in scratch)) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in members if _alive(p)] == []
        assert [s for s in scratch if os.path.exists(s)] == []
        if layer is not None:  # its workers' cgroups stay (a cgroup cannot remove itself): the next pool's start
            left = [os.path.join(parent, f"poise-reward-{driver.pid}-{pid}") for parent in layer.parents
                    for pid in sessions]
            assert all(os.path.isdir(p) for p in left), left
            assert set(left) <= set(remove_stale_cgroups(layer))
            assert not any(os.path.exists(p) for p in left)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for parent in layer.parents if layer is not None else ():
            for name in os.listdir(parent):
                if name.startswith(f"poise-reward-{driver.pid}-"):
                    remove_cgroup(os.path.join(parent, name))


def _session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError):
        return None


def test_start_up_removes_the_scratch_of_dead_drivers_only(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid nobody has now
    stale = tempfile.mkdtemp(prefix=f"poise-reward-{dead.pid}-", dir=tmp_path)
    (open(os.path.join(stale, "left.txt"), "w")).close()
    live = tempfile.mkdtemp(prefix=f"poise-reward-{os.getpid()}-", dir=tmp_path)
    other = tmp_path / "poise-rewards-not-ours"
    other.mkdir()
    assert remove_stale_scratch(str(tmp_path)) == [stale]
    assert os.path.isdir(live) and other.is_dir() and not os.path.exists(stale)


def test_a_disk_filler_stops_at_the_scratch_limit_and_leaves_nothing(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, '''
import os

def hostile(prompts, completions, **kwargs):
    if os.listdir("."):
        raise RuntimeError(f"FOUND {os.listdir('.')}")  # what an earlier call wrote is gone
    block = b"x" * (32 << 20)
    for i in range(12):  # 384 MiB in files of 32 MiB (each under RLIMIT_FSIZE): 3x the scratch
        with open(f"fill-{i}", "wb") as f:
            f.write(block)
    return [1.0 for _ in completions]
''', memory_mb=128, timeout_s=30)
    if scorer.pool.confinement["scratch"] != "tmpfs":
        pytest.skip("the scratch directory is a size-limited tmpfs only as root; per file (RLIMIT_FSIZE) here")
    reasons = _honest(scorer, n=2)
    assert all("No space left on device" in r for r in reasons), reasons


# --- a candidate's reach over its neighbours (the `code` reward, one batch) ---------------------------
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
SABOTEUR = '''```python
import os, signal, time

def add(a, b):
    return a - b

# a daemon, double-forked out of the test's process group, that SIGKILLs every new pid above its own:
# the harnesses and tests of the candidates scored after this one
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        me, end = os.getpid(), time.monotonic() + 20
        while time.monotonic() < end:
            for pid in range(me + 1, me + 400):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.002)
    os._exit(0)
```'''
# reads the exit status its harness drew for this test from the memory it was forked with, and exits with it
EXIT_STATUS_READER = '''```python
import os, sys

def add(a, b):
    return a - b

frame = sys._getframe()
while frame is not None:
    if "code" in frame.f_locals and isinstance(frame.f_locals["code"], int):
        os._exit(frame.f_locals["code"])
    frame = frame.f_back
```'''
# kills every process it may signal: its harness, the call process, its neighbours'
KILL_EVERYTHING = "```python\nimport os, signal\n\ndef add(a, b):\n    return a - b\n\n" \
                  "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n```"
CODE_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]


@pytest.mark.parametrize("isolation", ["batch", "call"])
@pytest.mark.parametrize("attacker", [SABOTEUR, EXIT_STATUS_READER, KILL_EVERYTHING],
                         ids=["saboteur-daemon", "exit-status-from-memory", "kill-everything"])
def test_a_hostile_candidate_scores_itself_only_never_a_neighbour(make_scorer, isolation, attacker):
    """[right, attacker, right, right, right] in one batch: every right candidate scores 1.0 and no
    failure is counted for it, whatever the attacker did to the processes around its tests."""
    from poise.rewards.scorer import RewardInput

    scorer = make_scorer([{"fn": "code"}], fallback=FALLBACK, timeout_s=30, isolation=isolation)
    candidates = [RIGHT, attacker, RIGHT, RIGHT, RIGHT]
    results = scorer.score([RewardInput((0, i, 0), "p", c, {"tests": CODE_TESTS}) for i, c in enumerate(candidates)])
    neighbours = [r for i, r in enumerate(results) if i != 1]
    assert [r.value for r in neighbours] == [1.0] * 4, results
    assert [r.failures for r in neighbours] == [()] * 4, results
    again = scorer.score([RewardInput((1, i, 0), "p", RIGHT, {"tests": CODE_TESTS}) for i in range(3)])
    assert [r.value for r in again] == [1.0] * 3, again


def _harness_of_this_process(timeout_s: float = 10.0) -> int:
    """The pid of the `code` harness (`python -I -c ...`) this test process started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except (OSError, ValueError):
                continue
            if ppid == os.getpid() and b"-I" in argv:
                return int(pid)
        time.sleep(0.01)
    raise AssertionError("no harness started")


def test_a_harness_killed_from_outside_is_a_counted_failure_not_a_zero():
    """A harness that dies before reporting every test (SIGKILLed, as a neighbour's daemon did) fails
    the call, counted; a score of 0 for the tests it never reported would hide the attack."""
    import threading

    outcome: dict = {}

    def score() -> None:
        try:
            outcome["value"] = run_tests("import time\n", ["time.sleep(1.5)", "pass"])
        except RuntimeError as e:
            outcome["error"] = str(e)

    scoring = threading.Thread(target=score)
    scoring.start()
    os.kill(_harness_of_this_process(), signal.SIGKILL)
    scoring.join(10)
    assert "harness" in outcome.get("error", ""), outcome


# --- one reward function's calls against another's (isolation batch) ------------------------------------
FAIL_THE_NEXT_CALL = '''
import json, os, sys

def hostile(prompts, completions, **kwargs):
    # answer its own call (its id, from the call process's frame), then a garbage line: the next
    # call of the same call process (another function's) would read it as its answer
    frame = sys._getframe()
    while frame is not None and "call_id" not in frame.f_locals:
        frame = frame.f_back
    data = (json.dumps([frame.f_locals["call_id"], "ok", 1.0]) + "\\ngarbage\\n").encode()
    for fd in range(3, 256):
        try:
            os.write(fd, data)
        except OSError:
            pass
    return [1.0 for _ in completions]
'''


def test_a_hostile_function_cannot_fail_another_functions_calls(make_scorer, reward_file):
    scorer = _scorer(make_scorer, reward_file, FAIL_THE_NEXT_CALL, isolation="batch")
    for step in range(2):
        results = scorer.score(inputs(4, step=step))
        assert [r.parts["good"] for r in results] == [1.0] * 4, results
        assert [f.function for r in results for f in r.failures if f.function != "hostile"] == [], results


# --- what a call process may learn about files it may not read ---------------------------------------
PRIVILEGE_PROBES = '''
import ctypes, os

class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

def capabilities(prompts, completions, **kwargs):
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (bits 0-31, 32-63)
    ctypes.CDLL(None).capget(ctypes.byref(Header(0x20080522, 0)), data)
    return [float((data[0] | data[1]) + ((data[3] | data[4]) << 32))]

def probe(prompts, completions, **kwargs):
    try:  # where the run's `latest` marker points
        os.readlink(os.path.join(RUN_DIR, "checkpoints", "latest"))
        return [2.0]
    except OSError as e:
        present = e.errno
    try:
        os.stat(os.path.join(RUN_DIR, "checkpoints", "absent"))
        return [3.0]
    except OSError as e:
        absent = e.errno
    return [1.0 if present == absent else 0.0]  # the same refusal: nothing says which files exist
'''


@pytest.fixture(params=["below-a-private-directory", "in-the-open"])
def private_run_dir(request, tmp_path):
    """A run directory of mode 0700: below pytest's private tmp (covered by the worker's skeleton
    mount) or right in /tmp (not covered: its own mode must hold)."""
    if request.param == "below-a-private-directory":
        yield tmp_path / "run"
        return
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="poise-test-run-") as where:
        yield Path(where) / "run"


@pytest.mark.parametrize("isolation", ["batch", "call"])
def test_a_call_process_holds_no_capability_and_cannot_look_into_private_directories(make_scorer, reward_file,
                                                                                      private_run_dir, isolation):
    run_dir = private_run_dir
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").symlink_to("step_000042")
    run_dir.chmod(0o700)
    path = reward_file(PRIVILEGE_PROBES.replace("RUN_DIR", repr(str(run_dir))))
    scorer = make_scorer([{"fn": f"{path}:capabilities"}, {"fn": f"{path}:probe"}], fallback=FALLBACK,
                         isolation=isolation)
    for results in (scorer.score(inputs(2)), scorer.score(inputs(2, step=1))):
        assert [r.parts["capabilities"] for r in results] == [0.0, 0.0], results
        if os.geteuid() == 0:  # as root the worker runs as a uid of its own, which may not enter run_dir
            assert [r.parts["probe"] for r in results] == [1.0, 1.0], results


def test_each_test_of_a_code_candidate_is_pid_1_of_its_own_namespace_inside_the_sandbox(make_scorer):
    """The layer that holds the saboteur, checked where it must hold: inside a worker's call process
    (its uid, no capability, Landlock, seccomp), not only in the test process."""
    from poise.rewards.scorer import RewardInput

    scorer = make_scorer([{"fn": "code"}], fallback=FALLBACK, timeout_s=30)
    tests = ["import os\nassert os.getpid() == 1", "import os\nassert os.getppid() == 0"]
    results = scorer.score([RewardInput((0, 0, 0), "p", RIGHT, {"tests": tests})])
    assert [r.value for r in results] == [1.0], results
