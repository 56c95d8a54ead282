"""A child process started as from a user's terminal, whatever the test process did before.

A test worker that already ran Ray tests carries what `ray.init` left in its environment
(`RAY_AUTH_MODE=token`, which a fresh `poise train` then takes as given instead of deciding and
logging it), and a signal disposition or mask that a library changed is inherited by children.
The Ctrl-C tests need the child a terminal would start: SIGINT at its default, unblocked, and no
Ray variables from the test process."""

from __future__ import annotations

import os
import signal


def terminal_env() -> dict[str, str]:
    """The test process's environment without what a Ray session in it added."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_MODE", "RAY_ADDRESS"))}


def as_from_a_terminal() -> None:
    """preexec_fn: SIGINT at its default and unblocked, as a shell leaves it for a foreground job."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
