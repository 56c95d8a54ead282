"""Checkpoints in the driver's `run.dir`, wherever the devices run, on one node or many.

A device that saves or loads a checkpoint (the train leader's periodic save, a hard resize, a
recovery, `--resume`) works on files. When its Ray node sees the driver's `run.dir` (the
driver's own node, or storage shared by every node), it reads and writes there itself. When it
does not, the bytes go through the driver:

    save   the device writes the checkpoint into a staging directory on its own node; the
           driver pulls it file by file in `CHUNK_BYTES` pieces into a temporary directory of its
           `run.dir` and commits it there (fsync, rename, marker: train/checkpoint.py's durable
           protocol); the staging directory is removed
    load   the driver pushes the checkpoint's files, in the same pieces, into a staging
           directory on the device's node; the device loads from there; `release` removes it

So at most one piece of a checkpoint is in flight at a time (the device's memory holds no second
copy of the model), and a resume reads the driver's `run.dir` wherever the leader ran before.
Sharded (`cluster.shard: optimizer | full`), the saving device lays the files out and, when every
train device sees `run.dir`, each writes its own tensors into them in place, all at once;
otherwise their tensors stream to the saving device, which writes them.

Whether a node sees `run.dir` (`cluster.storage: auto`) is probed once per node: the driver
writes a file with a random token into `run.dir`, and a device on that node reads it back.
`shared` trusts every node to see it; `driver` sends every checkpoint byte through the driver
(storage that the probe cannot judge, and the tests of this path on one machine).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import ray

from poise.runtime import faults
from poise.runtime.topology import Devices

CHUNK_BYTES = 32 << 20  # one piece of a file in flight between a device and the driver
PROBE_FILE = ".poise-storage-probe"


class FileEndpoint:
    """The file side of a device actor (mixed into DeviceWorker): what the driver's
    `CheckpointStore` calls on a node that does not see `run.dir`. Torch-free, as emulated
    devices are."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def sees_file(self, path: str, token: str) -> bool:
        """Whether `path` exists here and holds `token`: this node sees the driver's directory."""
        try:
            return Path(path).read_text() == token
        except (OSError, ValueError):
            return False

    def make_stage(self) -> str:
        """A fresh staging directory on this node."""
        return tempfile.mkdtemp(prefix="poise-stage-")

    def list_files(self, directory: str) -> list[tuple[str, int]]:
        return sorted((p.name, p.stat().st_size) for p in Path(directory).iterdir() if p.is_file())

    def read_chunk(self, path: str, offset: int, size: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def write_chunk(self, path: str, offset: int, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.write(data)

    def remove_stage(self, path: str) -> None:
        if Path(path).name.startswith("poise-stage-"):  # never anything else
            shutil.rmtree(path, ignore_errors=True)


class CheckpointStore:
    """Saves and loads checkpoints for the driver, directly or through it (module docstring).
    Every device call has the job's deadline and reaches the fault handler as the device's own
    failure (`faults.get`)."""

    def __init__(self, run_dir: Path, mode: str, timeout_s: float, rt: Devices | None = None):
        """`rt`: the job's devices, whose train group writes a sharded checkpoint together."""
        self.run_dir = Path(run_dir).resolve()
        self.mode, self.timeout_s, self.rt = mode, timeout_s, rt
        self._sees: dict[str, bool] = {}  # Ray node id -> whether it sees run_dir
        self._staged: list[tuple[object, str]] = []  # (worker, staging dir) of loads not yet released
        self.pulled = self.pushed = 0  # checkpoints that went through the driver (tests read them)

    def _get(self, ref, device: int, what: str):
        return faults.get(ref, device, what, self.timeout_s, self.rt)

    def sees_run_dir(self, device: int, worker) -> bool:
        """Whether device `device`'s node reads and writes the driver's run.dir itself; the first
        time a node does not, one line says so on stderr."""
        if self.mode == "shared":
            return True
        node = self._get(worker.node_id.remote(), device, "asking a device for its node")
        if node not in self._sees:
            if self.mode == "driver":
                self._sees[node] = False
            else:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                probe, token = self.run_dir / PROBE_FILE, uuid.uuid4().hex
                probe.write_text(token)
                try:
                    self._sees[node] = self._get(worker.sees_file.remote(str(probe), token), device,
                                                 "probing whether a device sees run.dir")
                finally:
                    probe.unlink(missing_ok=True)
            if not self._sees[node]:
                why = "cluster.storage=driver" if self.mode == "driver" else "it does not see it"
                print(f"poise: checkpoints of Ray node {node[:12]} (device {device}) go through the driver to "
                      f"'{self.run_dir}' ({why})", file=sys.stderr)
        return self._sees[node]

    def save(self, device: int, worker, run_dir: Path, step: int, version: int, extra: dict | None = None,
             what: str = "a checkpoint") -> Path:
        """Device `device` saves its weights, optimizer and RNG as checkpoint `step` of `run_dir`
        (a directory as the driver sees it); returns the checkpoint's path."""
        from poise.training.checkpoint import begin_checkpoint, commit_checkpoint, verify_checkpoint  # torch: driver only

        run_dir = Path(run_dir).resolve()
        args = (step, version, extra) if extra else (step, version)
        rt = self.rt
        if rt is not None and rt.sharded and device in rt.topology.train:
            # cluster.shard: optimizer | full: every train device writes its part of the files in place
            # (all of them see run.dir) or streams it to `device`
            ranks = list(rt.topology.train)
            parallel = self.sees_run_dir(device, worker) and all(self.sees_run_dir(d, rt.workers[d]) for d in ranks)
            args = (step, version, extra, ranks, parallel)
            peers = [(d, rt.workers[d].send_optimizer_state.remote(device, ranks, parallel))
                     for d in ranks if d != device]
        else:
            peers = []
        if self.sees_run_dir(device, worker):
            path = Path(self._get(worker.save_checkpoint.remote(str(run_dir), *args), device, what))
            for d, ref in peers:
                self._get(ref, d, what)
            return path
        stage = self._get(worker.make_stage.remote(), device, what)
        try:
            remote = self._get(worker.save_checkpoint.remote(stage, *args), device, what)
            for d, ref in peers:
                self._get(ref, d, what)
            tmp = begin_checkpoint(run_dir, step)
            for name, size in self._get(worker.list_files.remote(remote), device, what):
                with open(tmp / name, "wb") as f:
                    for offset in range(0, size, CHUNK_BYTES):
                        f.write(self._get(worker.read_chunk.remote(f"{remote}/{name}", offset, CHUNK_BYTES),
                                          device, what))
            problem = verify_checkpoint(tmp, step)
            if problem is not None:  # the temporary directory stays, and the next save removes it
                raise faults.RunFailure(f"{what}: the checkpoint device {device} sent is incomplete ({problem})")
            path = commit_checkpoint(tmp, run_dir, step)
        finally:
            _remove_stages([(worker, stage)])
        self.pulled += 1
        return path

    def readable(self, device: int, worker, path: Path, what: str = "loading a checkpoint") -> str:
        """Checkpoint `path` (as the driver sees it) as device `device` can open it: the path
        itself, or a copy pushed into a staging directory on its node (removed by `release`)."""
        path = Path(path).resolve()
        if self.sees_run_dir(device, worker):
            return str(path)
        stage = self._get(worker.make_stage.remote(), device, what)
        self._staged.append((worker, stage))
        target = f"{stage}/{path.name}"
        for entry in sorted(p for p in path.iterdir() if p.is_file()):
            with open(entry, "rb") as f:
                offset, data = 0, f.read(CHUNK_BYTES)
                while True:  # an empty file is one empty piece: it exists there too
                    self._get(worker.write_chunk.remote(f"{target}/{entry.name}", offset, data), device, what)
                    offset += len(data)
                    data = f.read(CHUNK_BYTES)
                    if not data:
                        break
        self.pushed += 1
        return target

    def release(self) -> None:
        """Remove the staging copies of loaded checkpoints."""
        _remove_stages(self._staged)
        self._staged.clear()


def _remove_stages(stages: list[tuple[object, str]], timeout_s: float = 30.0) -> None:
    """Remove staging directories and wait for it, briefly: best effort, since a device that died
    cannot remove its own (its node's /tmp keeps it)."""
    refs = [worker.remove_stage.remote(stage) for worker, stage in stages]
    try:
        ray.get(refs, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - a dead or hung device: the run goes on without the clean-up
        pass
