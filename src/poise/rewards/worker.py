"""One sandboxed reward worker process (started by poise.rewards.sandbox; not a user entry point).

Protocol. The pool writes length-prefixed pickles to the worker's stdin (the trusted direction):
first `{"functions", "reads", "memory_mb", "cpu_s", "uid"}`, then lists of calls
`(fn_index, prompt, completion, columns)`. The worker answers with one JSON line per message on
its stdout (JSON, not pickle: a hostile reward must not be able to run code in the driver by
writing to it): `["ready", confinement]` or `["error", fn_index, reason]` once, then one
`["ok", value]` or `["err", reason]` per call, in order, each as soon as its call returns, so the
pool can time every call on its own.

Start-up order: read the first message, confine (poise.rewards.confine: namespaces, then the
privilege drop, limits and Landlock), then import the reward functions, so user code, even at
import time, runs confined. Each call gets one sample (lists of length 1): a reward is a function
of its own sample, never of which samples shared its batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import pickle
import signal
import struct
import sys
from typing import Any, Callable

from poise.rewards import confine

_HEADER = struct.Struct("<Q")


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return pickle.loads(_read_exact(fd, size))


def write_message(fd: int, message: list) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _load(spec: dict) -> Callable[..., Any]:
    """Import one function as `poise.rewards.functions.FunctionSpec` describes it."""
    module_name, origin = spec["module"], spec["origin"]
    top = module_name.split(".")[0]
    if origin is not None and top not in sys.modules:  # load the top-level module from its file
        locations = [spec["package_dir"]] if spec["package_dir"] else None
        file_spec = importlib.util.spec_from_file_location(top if "." in module_name or locations else module_name,
                                                           origin, submodule_search_locations=locations)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[file_spec.name] = module
        file_spec.loader.exec_module(module)
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in spec["attr"].split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec['fn']} is a {type(obj).__name__}, not a function")
    return obj


def _accepted(fn: Callable[..., Any]) -> set[str] | None:
    """The keyword columns `fn` takes; None when it takes **kwargs (TRL's convention: all)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _value(out: Any) -> Any:
    """The one number a call returned, or raise with what is wrong (the pool checks it again)."""
    if not isinstance(out, (list, tuple)):
        raise TypeError(f"returned a {type(out).__name__}, not a list of floats")
    if len(out) != 1:
        raise ValueError(f"returned {len(out)} rewards for 1 completion")
    value = out[0]
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # numpy scalars
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"returned {type(value).__name__} {value!r:.40}, not a number")
    return float(value)


def _reap(own_namespace: bool) -> None:
    """Nothing a call started outlives it: in a PID namespace of our own, kill every other process
    in it (kill(-1) spares PID 1 and the caller) and reap them: as a child subreaper, every process
    a call started is our descendant until we reap it. Without a namespace, only reap what has
    exited; the pool's kill of the process group gets the rest when the worker is replaced or
    closed."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return  # the common case: the call started no process
    if own_namespace:
        os.kill(-1, signal.SIGKILL)
    try:
        while True:
            pid, _ = os.waitpid(-1, 0 if own_namespace else os.WNOHANG)
            if pid == 0:
                return
    except ChildProcessError:
        pass


def _pass_on_exit(commands: int, results: int, watched: int | None = None) -> None:
    """Wait for the child (reaping any orphan meanwhile) and exit as it did: 128 + signal, or its code."""
    for fd in (commands, results):
        os.close(fd)
    while True:
        pid, status = os.wait()
        if watched is None or pid == watched:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def main() -> None:
    commands, results = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # a reward's prints must not land in the protocol
    init = read_message(commands)
    report = confine.Confinement()
    if confine.enter_namespaces(report):
        # Three processes: this one stays outside the PID namespace (the pool kills it); its child,
        # PID 1 there, dies with it (taking the namespace along) and reaps orphans; PID 2 serves.
        # Not PID 1 itself: the kernel spares PID 1 the signals it has no handler for (SIGXCPU,
        # a reward's own kill), which must end the server like any process.
        if os.fork():
            _pass_on_exit(commands, results)
        confine.after_fork_in_namespace()
        server = os.fork()
        if server:
            _pass_on_exit(commands, results, server)
    confine.drop_root(init["uid"], report)
    confine.adopt_orphans()  # whatever a call leaves behind stays our child, for _reap
    # the task limit counts only this worker's tasks in a user namespace of its own, or as a uid of its own
    own_user = (os.geteuid() != 0 and report.network == "namespace") or report.uid == init["uid"]
    confine.set_limits(init["memory_mb"], report, own_user)
    scratch = os.getcwd()
    confine.landlock(confine.system_reads() + list(init["reads"]), [scratch, "/dev/null"], report)
    functions = []
    for index, spec in enumerate(init["functions"]):
        try:
            fn = _load(spec)
        except BaseException as e:  # noqa: BLE001 - user code may raise anything, SystemExit included
            write_message(results, ["error", index, f"{type(e).__name__}: {e}"[:500]])
            os._exit(1)
        functions.append((fn, _accepted(fn)))
    write_message(results, ["ready", report.as_dict()])
    me, own_namespace = os.getpid(), report.pid_namespace
    cpu_s = init["cpu_s"]
    while True:
        try:
            calls = read_message(commands)
        except EOFError:
            os._exit(0)
        for fn_index, prompt, completion, columns in calls:
            fn, accepted = functions[fn_index]
            kwargs = {k: [v] for k, v in columns.items() if accepted is None or k in accepted}
            try:
                confine.limit_cpu(cpu_s)
                message = ["ok", _value(fn([prompt], [completion], **kwargs))]
            except BaseException as e:  # noqa: BLE001
                message = ["err", f"{type(e).__name__}: {e}"[:300]]
            finally:
                if os.getpid() != me:  # a process the reward forked came back here: it ends now
                    os._exit(0)
            _reap(own_namespace)
            write_message(results, message)


if __name__ == "__main__":
    main()
