"""poise.interrupt without Ray: a Ctrl-C inside `held()` (where ray.init runs) is raised when the
section ends, not where it lands; each moment says its own line, and only a second Ctrl-C while
the loop runs says that steps are lost. Each case runs in a fresh process (signal handlers are
per process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(body: str, tmp_path) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from poise import interrupt
        interrupt.install(Path({str(tmp_path)!r}))
        def ctrl_c():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_ctrl_c_inside_held_is_raised_at_its_end(tmp_path):
    done = _run("""
        reached = []
        try:
            with interrupt.held():
                ctrl_c()
                reached.append("rest of the section")
                ctrl_c()  # a second one there: still one stop, one line
                reached.append("its end")
        except KeyboardInterrupt:
            print(reached, "stopped after the section")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['rest of the section', 'its end'] stopped after the section"
    assert done.stderr.splitlines() == ["poise: SIGINT: stopping the start-up (no step trained yet)"]


def test_outside_held_a_ctrl_c_while_starting_stops_where_it_lands(tmp_path):
    done = _run("""
        try:
            ctrl_c()
            print("not stopped")
        except KeyboardInterrupt:
            print("stopped", interrupt.stopped_at_once())
    """, tmp_path)
    assert done.stdout.strip() == "stopped True"
    assert done.stderr.splitlines() == ["poise: SIGINT: stopping the start-up (no step trained yet)"]


def test_only_a_second_ctrl_c_in_the_loop_says_steps_are_lost(tmp_path):
    done = _run("""
        with interrupt.graceful(Path('.')):
            ctrl_c()
            print("asked", interrupt.requested() == signal.SIGINT)
            try:
                ctrl_c()
            except KeyboardInterrupt:
                print("stopped")
        try:
            ctrl_c()
        except KeyboardInterrupt:
            print("stopped after the loop")
    """, tmp_path)
    assert done.stdout.split("\n")[:3] == ["asked True", "stopped", "stopped after the loop"], done.stdout
    first, second, after = done.stderr.splitlines()
    assert "Ctrl-C again to stop at once" in first
    assert "stopping at once (steps since the last checkpoint are lost)" in second
    assert after == "poise: SIGINT: stopping now, as the run shuts down"
