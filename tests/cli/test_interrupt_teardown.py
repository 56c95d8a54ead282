"""A Ctrl-C after the command returned, while exit handlers (Ray's shutdown, the reward sandbox's)
still run: the teardown finishes and the process exits 130 (poise/interrupt.py `command`). Without
it the process died by the signal mid-teardown (exit status -2), seen in the start-up sweep when the
Ctrl-C came as a short run was exiting."""

import subprocess
import sys

from terminal import as_from_a_terminal, terminal_env

SCRIPT = """
import atexit, os, signal, sys, time
from poise import interrupt

def ray_like_shutdown():  # registered by the command, as ray.init registers its shutdown
    for _ in range({signals}):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    open({marker!r}, "w").write("torn down")

def command():
    atexit.register(ray_like_shutdown)
    return 0

sys.exit(interrupt.command(command) if {wrapped} else command())
"""


def _run(tmp_path, wrapped: bool, signals: int = 1):
    marker = tmp_path / "marker"
    code = SCRIPT.format(signals=signals, marker=str(marker), wrapped=wrapped)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=terminal_env(), preexec_fn=as_from_a_terminal)
    return done, marker.exists()


def test_a_ctrl_c_during_the_exit_handlers_lets_them_finish_then_exits_130(tmp_path):
    done, torn_down = _run(tmp_path, wrapped=True)
    assert (done.returncode, torn_down) == (130, True), done.stderr
    assert done.stderr.strip().splitlines() == ["poise: interrupted"]


def test_without_the_guard_the_signal_kills_the_teardown(tmp_path):
    """The failure the guard removes, so this test shows it is real on this interpreter."""
    done, torn_down = _run(tmp_path, wrapped=False)
    assert done.returncode != 130 and not torn_down


def test_a_second_ctrl_c_during_the_teardown_stops_at_once_with_130(tmp_path):
    done, torn_down = _run(tmp_path, wrapped=True, signals=2)
    assert (done.returncode, torn_down) == (130, False), done.stderr
