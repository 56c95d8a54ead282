"""One sandboxed reward worker process (started by poise.rewards.sandbox; not a user entry point).

Protocol. The pool writes length-prefixed pickles to the worker's stdin (the trusted direction):
first `{"functions", "reads", "memory_mb", "cpu_s", "uid", "per_child"}`, then lists of calls
`(call_id, fn_index, prompt, completion, columns)`. The worker answers with one JSON line per
message on its stdout (JSON, not pickle: nothing the worker writes can run code in the driver):
`["ready", confinement]` or `["error", fn_index, reason]` once, then one `[call_id, "ok", value]`
or `[call_id, "err", reason]` per call, in order, each as soon as its call returns, so the pool
can time every call on its own.

Processes. With a PID namespace: this process (outside it: the pool kills it; it watches the
driver and kills the worker when the driver dies), its child PID 1 (reaps orphans; dies with its
parent, taking the namespace along) and PID 2, the *server*, which alone holds the pool's pipes.
The server never imports or runs user code: for each batch of calls (or each call, `per_child`
1) it forks a fresh *call process* that closes every fd but the write end of a pipe of its own,
enters a Landlock domain of its own (it can neither ptrace, read /proc/<pid>/mem or fd/ of, nor
signal the server), imports the reward functions and runs the calls, writing `[call_id, kind,
payload]` lines to that pipe. The server parses each line strictly (one per call, the expected
id, one finite number or a reason) and writes its own line to the pool; any other byte ends the
call process and fails its current call. So user code shares no process, fd or module with the
pool's channel, a reward cannot answer for a call of another batch (or, `per_child` 1, of
another sample), and a patched module dies with its call process. After each call process the
server kills what it left (PID namespace) and empties the scratch directory. A call process runs the
calls of one reward function only: one function can fail no other function's calls.

Start-up order: read the first message, confine (poise.rewards.confine: namespaces, the mount
skeleton that lets the dropped uid read without a capability, then the privilege drop, limits,
Landlock and seccomp), then check in a call process that the reward
functions import, so user code, even at import time, runs confined and never in the server.
Each call gets one sample (lists of length 1): a reward is a function of its own sample, never of
which samples shared its batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import math
import os
import pickle
import select
import shutil
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


def _env_answer(cls: Callable[..., Any], env: dict, history: str, row: dict) -> list:
    """One environment call: build the environment, reset it with the row and the episode's seed,
    replay the episode's earlier actions and step the last one; returns [observation, reward, done,
    info] of that step (of `reset` when there is no action yet). Replaying keeps no state between
    calls, so an episode continues the same on any worker, after a restart or a worker's death: an
    environment is a function of (row, seed, actions), as docs/design.md asks."""
    spec = json.loads(history)
    seed, actions = spec["seed"], spec["actions"]
    for module in env.get("preload", ()):  # the tools' modules, by file, before the environment imports them
        _load(module)
    instance = cls(**env["args"])
    first = instance.reset(row, seed)
    if not actions:
        answer = [_observation(first, env), 0.0, False, {}]
    else:
        for action in actions[:-1]:
            instance.step(action)
        answer = _step_answer(instance.step(actions[-1]), env)
    if len(json.dumps(answer)) > ENV_ANSWER:
        raise ValueError(f"returned {len(json.dumps(answer))} bytes (observation and info); the limit is {ENV_ANSWER}")
    return answer


def _check_environment(cls: Callable[..., Any], env: dict) -> None:
    """At start-up: the environment builds from env.args and has callable reset and step."""
    for module in env.get("preload", ()):
        _load(module)
    instance = cls(**env["args"])
    for method in ("reset", "step"):
        if not callable(getattr(instance, method, None)):
            raise TypeError(f"{getattr(cls, '__name__', cls)}.{method} is not callable; an environment needs "
                            "reset(row, seed) and step(action)")


def _observation(observation: Any, env: dict) -> str:
    if not isinstance(observation, str):
        raise TypeError(f"returned an observation of type {type(observation).__name__}, not str")
    if len(observation) > env["max_observation_chars"]:
        raise ValueError(f"returned an observation of {len(observation)} characters; the limit is "
                         f"{env['max_observation_chars']} (env.max_observation_chars)")
    return observation


def _step_answer(result: Any, env: dict) -> list:
    """`step`'s return (a (observation, reward, done, info) tuple or a StepResult), checked."""
    if hasattr(result, "observation") and hasattr(result, "done"):
        result = (result.observation, getattr(result, "reward", 0.0), result.done, getattr(result, "info", {}))
    if not isinstance(result, tuple) or len(result) != 4:
        raise TypeError(f"step returned {type(result).__name__}, not (observation, reward, done, info)")
    observation, reward, done, info = result
    if hasattr(reward, "item") and not isinstance(reward, (int, float)):
        reward = reward.item()
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward) \
            or abs(reward) > 1e6:
        raise ValueError(f"returned reward {reward!r:.40}; it must be a finite number within +-1e6")
    if not isinstance(done, bool):
        raise TypeError(f"returned done={done!r:.40}; it must be a bool")
    if not isinstance(info, dict):
        raise TypeError(f"returned info of type {type(info).__name__}, not dict")
    info = {str(k): v for k, v in info.items() if isinstance(v, (bool, int, float, str)) and not
            (isinstance(v, float) and not math.isfinite(v))}
    return [_observation(observation, env), float(reward), done, info]


MAX_ANSWER = 16384  # bytes of one answer line from a call process; a longer one is tampering
ENV_ANSWER = 12288  # bytes an environment's answer may take; a larger one fails its call (an honest error)
_SIGNAL_REASONS = {signal.SIGXCPU: "exceeded reward.cpu_s ({cpu_s:g} CPU seconds)",
                   signal.SIGXFSZ: "wrote a file larger than reward.memory_mb"}


def _reap(own_namespace: bool) -> None:
    """Nothing a call process started outlives it: in a PID namespace of our own, kill every other
    process in it (kill(-1) spares PID 1 and the caller) and reap them: as a child subreaper,
    every process a call started is our descendant until we reap it. Without a namespace, only
    reap what has exited; the pool's kill of the process group gets the rest when the worker is
    replaced or closed."""
    if own_namespace:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return  # the common case: nothing left
    try:
        while True:
            pid, _ = os.waitpid(-1, 0 if own_namespace else os.WNOHANG)
            if pid == 0:
                return
    except ChildProcessError:
        pass


def _wipe(scratch: str) -> None:
    """Empty the scratch directory: nothing one batch wrote is there for the next."""
    for entry in os.scandir(scratch):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _watch(child: int, driver: int) -> None:
    """Outside the namespace: exit as `child` (PID 1 there) does, 128 + signal or its code; when
    the driver dies first (SIGKILLed: no close), kill the worker's whole process group, this
    process included (PID 1 dies with us and takes the namespace along)."""
    try:
        watched = [os.pidfd_open(child), os.pidfd_open(driver)]
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): PDEATHSIG on the fork's thread only
        confine.die_with_parent()
        watched = None
    if os.getppid() != driver:  # the driver died before we watched it
        _driver_died(child)
    while True:
        if watched is not None:
            ready, _, _ = select.select(watched, [], [])
            if watched[1] in ready and watched[0] not in ready:
                _driver_died(child)
        pid, status = os.waitpid(child, 0 if watched is None else os.WNOHANG)
        if pid == child:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _driver_died(child: int) -> None:
    """The driver is gone and will never close us: end PID 1 (the namespace goes with it), remove
    the scratch directory (our cwd; what a process still dying writes there is removed by the next
    pool's start), and kill the rest of our process group, ourselves last."""
    scratch = os.getcwd()
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    confine.unmount(scratch)  # the driver's tmpfs on it, if any (root)
    shutil.rmtree(scratch, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)


def _pass_on_exit(watched: int) -> None:
    """Wait for the child (reaping any orphan meanwhile) and exit as it did: 128 + signal, or its code."""
    while True:
        pid, status = os.wait()
        if pid == watched:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


class _Server:
    """PID 2: holds the pool's pipes; forks a call process per batch (see the module docstring)."""

    def __init__(self, init: dict, results: int, report: confine.Confinement, ruleset: int | None):
        self.init, self.results, self.report, self.ruleset = init, results, report, ruleset
        self.scratch = os.getcwd()
        # root dropped to init["uid"] keeps this capability only where expose_reads could not do without it
        kept = report.uid == init["uid"] and not report.reads_exposed
        self.keep_caps = 1 << confine.CAP_DAC_READ_SEARCH if kept else 0

    # --- the call process ----------------------------------------------------------------------
    def _call_process(self, calls: list, out: int) -> None:
        """In the fork: cut every tie to the server, then run `calls`, one line each on `out`."""
        try:
            confine.nest(self.ruleset)  # closes it
            os.closerange(3, out)  # the pool's pipes and anything else of the server's
            os.closerange(out + 1, 1 << 16)
            confine.drop_capabilities(self.keep_caps)
        except BaseException:  # noqa: BLE001 - never run user code half-cut from the server
            os._exit(70)
        me, functions = os.getpid(), {}
        for call in calls:
            if not isinstance(call, tuple):  # the start-up check: load every function
                try:
                    for index, spec in enumerate(self.init["functions"]):
                        failed = index
                        loaded = _load(spec)
                        if spec.get("env") is not None:
                            _check_environment(loaded, spec["env"])
                    message = ["ready"]
                except BaseException as e:  # noqa: BLE001 - user code may raise anything, SystemExit included
                    message = ["error", failed, f"{type(e).__name__}: {e}"[:500]]
                finally:
                    if os.getpid() != me:
                        os._exit(0)
                write_message(out, message)
                os._exit(0)
            call_id, fn_index, prompt, completion, columns = call
            try:
                confine.limit_cpu(self.init["cpu_s"])
                if fn_index not in functions:
                    fn = _load(self.init["functions"][fn_index])
                    functions[fn_index] = (fn, _accepted(fn))
                fn, accepted = functions[fn_index]
                env = self.init["functions"][fn_index].get("env")
                if env is not None:  # an environment's turn (poise.episodes): replayed, see _env_answer
                    message = [call_id, "ok", _env_answer(fn, env, completion, columns)]
                else:
                    kwargs = {k: [v] for k, v in columns.items() if accepted is None or k in accepted}
                    message = [call_id, "ok", _value(fn([prompt], [completion], **kwargs))]
            except BaseException as e:  # noqa: BLE001
                message = [call_id, "err", f"{type(e).__name__}: {e}"[:300]]
            finally:
                if os.getpid() != me:  # a process the reward forked came back here: it ends now
                    os._exit(0)
            _wipe(self.scratch)  # the next call of this batch finds it empty (the server wipes it again)
            write_message(out, message)
        os._exit(0)

    def _fork(self, calls: list) -> tuple[int, "_Lines"]:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            self._call_process(calls, write_end)
        os.close(write_end)
        return pid, _Lines(read_end)

    def _died(self, pid: int) -> str:
        """Why a call process ended before answering, from its status."""
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return _SIGNAL_REASONS.get(sig, "the reward's process was killed by {name}").format(
                cpu_s=self.init["cpu_s"], name=signal.Signals(sig).name)
        return f"the reward's process exited with status {os.WEXITSTATUS(status)}"

    def _end(self, pid: int, lines: "_Lines", own_namespace: bool) -> bool:
        """After the last answer: the call process ends, what it left is killed, the scratch is
        emptied. True if nothing more came on its pipe (anything more is tampering)."""
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        _reap(own_namespace)
        clean = lines.empty()
        lines.close()
        _wipe(self.scratch)
        return clean

    # --- the pool's side -----------------------------------------------------------------------
    def check_functions(self) -> list:
        """["ready"] or ["error", index, reason]: the functions imported in a call process."""
        pid, lines = self._fork([None])
        line = lines.next()
        message = _parse(line, None) if line is not None else None
        clean = self._end(pid, lines, self.report.pid_namespace)
        if message is None or not clean:
            return ["error", 0, "the reward sandbox's start-up check gave no answer"]
        return message

    def serve(self, calls: list) -> None:
        """Run `calls` in call processes, forwarding one checked line per call to the pool."""
        per_child, own_namespace = self.init["per_child"], self.report.pid_namespace
        i = 0
        while i < len(calls):
            group = _one_function(calls[i:i + per_child])
            pid, lines = self._fork(group)
            ended = False
            for j, call in enumerate(group):
                line = lines.next()
                answer = None if line is None else _parse(line, call[0])
                broken = answer is None  # the process is gone or lied: the rest goes to a fresh one
                if line is None and lines.eof and not lines.buf:  # it died before answering this call
                    answer = [call[0], "err", self._died(pid)]
                elif answer is None:  # a malformed, foreign or overlong line: tampering
                    os.kill(pid, signal.SIGKILL)
                    answer = [call[0], "err", TAMPERED]
                elif j == len(group) - 1:  # the last answer counts once the process is gone, silent
                    ended = True
                    if not self._end(pid, lines, own_namespace):
                        answer = [call[0], "err", TAMPERED]
                write_message(self.results, answer)
                if broken:
                    break
            i += j + 1
            if not ended:
                self._end(pid, lines, own_namespace)


def _one_function(calls: list) -> list:
    """The leading calls of `calls` that run the same reward function: a call process never runs two
    functions, so what one function does to its process (a forged line, a kill, a patched module)
    can fail only its own calls, never another function's (whose failures would be logged against
    it)."""
    fn_index = calls[0][1]
    n = next((k for k, call in enumerate(calls) if call[1] != fn_index), len(calls))
    return calls[:n]


TAMPERED = "the reward wrote to its result channel (unexpected bytes); its process was replaced"


class _Lines:
    """Lines from a call process's pipe, each at most MAX_ANSWER bytes."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def next(self) -> bytes | None:
        """The next line without its newline; None at the end of the pipe or past MAX_ANSWER."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_ANSWER:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.eof = True
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line if len(line) <= MAX_ANSWER else None

    def empty(self) -> bool:
        """Nothing more on the pipe (called once its writers are dead or done)."""
        if self.buf:
            return False
        os.set_blocking(self.fd, False)
        try:
            return os.read(self.fd, 1) == b""
        except BlockingIOError:  # a leftover (no PID namespace) still holds it open, silent so far
            return True

    def close(self) -> None:
        os.close(self.fd)


def _parse(line: bytes, call_id: int | None) -> list | None:
    """The checked answer to call `call_id` (None: the start-up check), or None for anything a
    call process of ours does not write."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: 4 KiB of "[[[[" would end the server
        return None
    if not isinstance(message, list):
        return None
    if call_id is None:
        if message == ["ready"]:
            return message
        if len(message) == 3 and message[0] == "error" and type(message[1]) is int and isinstance(message[2], str):
            return ["error", message[1], message[2][:500]]
        return None
    if len(message) != 3 or type(message[0]) is not int or message[0] != call_id:
        return None
    kind, payload = message[1], message[2]
    if kind == "ok" and _env_shaped(payload):
        return [call_id, "ok", payload]
    if kind == "ok" and type(payload) in (int, float):
        return [call_id, "ok", float(payload)] if math.isfinite(payload) else [call_id, "err", f"returned {payload}"]
    if kind == "err" and isinstance(payload, str):
        return [call_id, "err", payload[:300]]
    return None


def _env_shaped(payload: Any) -> bool:
    """An environment's answer: [observation, finite reward, done, info] (checked by type, not trusted
    further: the pool checks it against the call's kind)."""
    return isinstance(payload, list) and len(payload) == 4 and isinstance(payload[0], str) \
        and type(payload[1]) in (int, float) and math.isfinite(payload[1]) and type(payload[2]) is bool \
        and isinstance(payload[3], dict)


def main() -> None:
    commands, results = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # nothing printed lands in the protocol
    init = read_message(commands)
    driver = os.getppid()
    report = confine.Confinement()
    if confine.enter_namespaces(report):
        # Three processes: this one stays outside the PID namespace (the pool kills it); its child,
        # PID 1 there, dies with it (taking the namespace along) and reaps orphans; PID 2 serves.
        # Not PID 1 itself: the kernel spares PID 1 the signals it has no handler for (SIGXCPU,
        # a reward's own kill), which must end the server like any process.
        child = os.fork()
        if child:
            for fd in (commands, results):
                os.close(fd)
            _watch(child, driver)
        confine.after_fork_in_namespace()
        server = os.fork()
        if server:
            for fd in (commands, results):
                os.close(fd)
            _pass_on_exit(server)
    else:
        confine.die_with_parent()
    reads = confine.system_reads() + list(init["reads"])
    confine.expose_reads(reads + [os.getcwd()], init["uid"], report)  # the server's mount namespace, not the watcher's
    confine.drop_root(init["uid"], report)
    confine.adopt_orphans()  # whatever a call process leaves behind stays our child, for _reap
    # the task limit counts only this worker's tasks in a user namespace of its own, or as a uid of its own
    own_user = (os.geteuid() != 0 and report.network == "namespace") or report.uid == init["uid"]
    confine.set_limits(init["memory_mb"], report, own_user)
    ruleset = confine.landlock(reads, [os.getcwd(), "/dev/null"], report)
    confine.block_unix_sockets(report)
    confine.not_dumpable()
    import poise.rewards.builtin  # noqa: F401 - ours, not user code: imported once, shared by every call process

    server = _Server(init, results, report, ruleset)
    message = server.check_functions()
    if message[0] != "ready":
        write_message(results, message)
        os._exit(1)
    write_message(results, ["ready", report.as_dict()])
    while True:
        try:
            calls = read_message(commands)
        except EOFError:
            os._exit(0)
        server.serve(calls)


if __name__ == "__main__":
    main()
