"""The runs the fault, resume and multi-node tests compare (issue 11), each made once per session.

Every run starts from the session's SFT warm start (rewards differ within groups, every step has a
non-zero gradient and moves the weights) on 4 CPU devices split 2+2, 3 steps, a checkpoint per
step: the undisturbed sync and async runs here are what a run with killed workers, a resumed run
or a run spread over two Ray nodes must equal byte for byte.
"""

from __future__ import annotations

import ipaddress
import os
import threading

from poise.config import load_train_config
from poise.data.tasks import TaskSource
from poise.policy.dispatch import RoundRobinDispatcher

from fault_injection import injected  # tests/fault_injection.py
from run_shapes import GROUP, PROMPTS, tiny_job

STEPS = 3
TINY = [
    *tiny_job(STEPS),  # 6 uneven micro-batches over the 2 train devices
    "cluster.split=[2,2]",
    "run.verify_sync=true",
]

_done: dict = {}  # (name) -> RunRecord (a crashed run: its directory) or the exception it raised, for the session


def config(run_dir, warm_start, *extra):
    return load_train_config(None, [*TINY, f"run.dir={run_dir}", *warm_start.overrides, *extra])


def run_once(name: str, root, warm_start, read_run, train, *extra, faults: dict | None = None):
    """Run `train(config)` once per session under `name`, with `faults` injected (the arguments of
    tests/fault_injection.py `injected`); every test that needs it gets the same RunRecord (or the
    same failure). Listening sockets are probed all along (`listening[name]`)."""
    if name not in _done:
        run_dir = root / name
        try:
            with injected(**(faults or {})), SocketProbe() as probe:
                train(config(run_dir, warm_start, *extra))
            listening[name] = probe.found
            _done[name] = read_run(run_dir)
        except Exception as e:  # noqa: BLE001 - reported by every test that needs this run
            _done[name] = e
    if isinstance(_done[name], Exception):
        raise _done[name]
    return _done[name]


def baseline(mode: str, tmp_path_factory, warm_start, read_run):
    """The undisturbed 2+2 run of `mode` (sync or async)."""
    from poise.runtime.driver import train_disaggregated

    return run_once(f"{mode}-straight", tmp_path_factory.getbasetemp(), warm_start, read_run, train_disaggregated,
                    f"pipeline.mode={mode}")


def crashed(mode: str, root, warm_start, *extra):
    """The 2+2 run of `mode` stopped by a crash as step 2's prompts are dispatched (`CrashAtStep`),
    made once per session: its run directory, which a test copies before it resumes from it.
    Sync stops after step 1's checkpoint; async, which dispatches step 2 during step 1, after step 0's."""
    from poise.runtime.driver import train_disaggregated

    name = "-".join([mode, *extra, "crashed"])
    if name not in _done:
        run_dir = root / name
        cfg = config(run_dir, warm_start, f"pipeline.mode={mode}", *extra)
        try:
            train_disaggregated(cfg, dispatcher=CrashAtStep(cfg, 2))
            _done[name] = AssertionError(f"{run_dir}: the run did not crash at step 2")
        except RuntimeError as e:
            _done[name] = run_dir if "simulated crash" in str(e) else e
        except Exception as e:  # noqa: BLE001 - reported by every test that needs this run
            _done[name] = e
    if isinstance(_done[name], Exception):
        raise _done[name]
    return _done[name]


class CrashAtStep(RoundRobinDispatcher):
    """Raises when asked to dispatch the prompts of `step` (a crash after an earlier checkpoint)."""

    def __init__(self, cfg, step: int):
        super().__init__()
        source = TaskSource(cfg.run.seed, cfg.data.phases, cfg.data.pool_size)  # the run's own prompts
        self.crash_on = [p.uid for p in source.prompts_for_step(step, cfg.algorithm.prompts_per_step)]

    def plan(self, prompts, instances):
        if [p.prompt_id for p in prompts] == self.crash_on:
            raise RuntimeError("simulated crash")
        return super().plan(prompts, instances)


def assert_logged_once(record) -> None:
    """events.jsonl holds each step's `step` event and each sample's `sample` event exactly once."""
    steps = [e["step"] for e in record.events if e["kind"] == "step"]
    assert steps == list(range(STEPS)), steps
    ids = [tuple(e["id"]) for e in record.events if e["kind"] == "sample"]
    assert len(ids) == len(set(ids)) == STEPS * PROMPTS * GROUP, (len(ids), len(set(ids)))


listening: dict[str, set[tuple[int, str, int]]] = {}  # run name -> (pid, address, port) of every listener seen


class SocketProbe:
    """Every TCP socket in LISTEN state owned by this process or its descendants (Ray's GCS, raylet,
    workers, the device actors and their torch.distributed store and gloo pairs), sampled from
    /proc every 0.2 s while the `with` block runs."""

    def __init__(self) -> None:
        self.found: set[tuple[int, str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SocketProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.found |= listeners(descendants(os.getpid()))
            if self._stop.wait(0.2):
                return


def beyond_loopback(found) -> set[tuple[int, str, int]]:
    """The listeners whose address is not loopback (an IPv4-mapped ::ffff:127.0.0.1 is)."""
    def loopback(address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return (ip.ipv4_mapped or ip).is_loopback if ip.version == 6 else ip.is_loopback

    return {x for x in found if not loopback(x[1])}


def descendants(root: int) -> set[int]:
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        children = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(children)
        frontier += children
    return out


def listeners(pids: set[int]) -> set[tuple[int, str, int]]:
    """(pid, local address, port) of the LISTEN sockets of `pids` (/proc/net/tcp and tcp6)."""
    owner = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:
            pass
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owner:  # 0A: LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add((owner[fields[9]], str(ipaddress.ip_address(raw)), int(hex_port, 16)))
    return out
