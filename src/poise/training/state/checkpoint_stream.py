"""A sharded state's checkpoint parts: every owner's optimizer state (and under `shard: full` its
weights) reaches the writer's files, either streamed to the writer tensor by tensor in file order
(so no device holds more than its run and one tensor of another's) or written by each owner into
the writer's files in place (every train device sees the run directory). Either way the files
have the bytes a whole model's save writes (training/tensor_files.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from poise.training import tensor_files
from poise.training.tensor_files import optimizer_entries_of, safetensors_order


class CheckpointStream:
    """The checkpoint parts of train device `rank`. `weights` (`shard: full`, while sharded): the
    `ParameterShards` whose owners hold the weights; None: the writer holds every weight."""

    def __init__(self, rank: int, trainer, names: list[str], comm, device: torch.device) -> None:
        self.rank, self.trainer, self.names, self.comm, self.device = rank, trainer, names, comm, device

    def listing(self, ranks: list[int]) -> list:
        """Every train device's optimizer state entries, (parameter index, name, dtype, shape,
        owner), in the optimizer file's order (collective over the train group)."""
        group = self.comm.get(sorted(ranks))
        local = optimizer_entries_of(self.trainer.model, self.trainer.optimizer)
        listed = [None] * len(ranks)
        dist.all_gather_object(listed, [(name, str(dtype).removeprefix("torch."), shape)
                                        for name, dtype, shape, _ in local], group=group)
        order = {n: i for i, n in enumerate(self.names)}
        return sorted(((order[name.split("::")[0]], name, getattr(torch, dtype), tuple(shape), sorted(ranks)[r])
                       for r, entries in enumerate(listed) for name, dtype, shape in entries),
                      key=lambda e: (e[0], e[1]))

    def write_parts(self, ranks: list[int], writer: int, listing: list, tmp: Path | None, weights=None) -> set[str]:
        """Collective over the train group `ranks`: the writer (`tmp`: its checkpoint's temporary
        directory) creates the optimizer file, and with `weights` the model file, with their
        headers and sizes; every owner then writes its own tensors into them in place. A failure
        anywhere (a full disk) reaches the writer, which raises it. Returns the files written."""
        ranks = sorted(ranks)
        group = self.comm.get(ranks)
        mine = {name: value for name, _, _, value in optimizer_entries_of(self.trainer.model, self.trainer.optimizer)}
        state = [(name, dtype, shape, mine.get(name)) for _, name, dtype, shape, _ in listing]
        files = {"optimizer.safetensors": (state, set(mine))}
        if weights is not None:
            params = self.trainer.params
            entries = safetensors_order([(n, p.dtype, tuple(p.shape), lambda p=p: p.detach())
                                         for n, p in zip(self.names, params)])
            files["model.safetensors"] = (entries, {self.names[i] for i in range(len(params)) if weights.owns(i)})
        # any exception, not only an OSError, is caught and shared: a rank that raised before the
        # broadcast or the all-gather would leave the others waiting there for step_timeout_s
        failure = None
        try:
            if self.rank == writer:
                for name, (entries, _) in files.items():
                    tensor_files.create_tensor_file(tmp / name, entries)
        except Exception as e:  # noqa: BLE001 - re-raised below, once every rank knows
            failure = e
        where = [str(tmp) if self.rank == writer and failure is None else None]
        dist.broadcast_object_list(where, src=writer, group=group)
        if where[0] is not None:
            try:
                for name, (entries, owned) in files.items():
                    tensor_files.write_tensor_parts(Path(where[0]) / name, entries, owned)
            except Exception as e:  # noqa: BLE001 - re-raised below, once every rank knows
                failure = e
        failures = [None] * len(ranks)
        dist.all_gather_object(failures, _part_failure(failure), group=group)
        if failure is not None and not isinstance(failure, OSError):
            raise failure  # its own error, with its traceback, now that no rank waits for this one
        if self.rank == writer:
            found = next(((r, f) for r, f in zip(ranks, failures) if f is not None), None)
            if found is not None:
                raise _part_error(*found)
        return set(files)

    def weight_entries(self, writer: int, weights):
        """`shard: full`: the weights as the writer's model file entries, in safetensors' order (the
        file `save_file` would write of the whole model): on the writer, those of other owners
        arrive when due; on the others, each of their own is sent in that order."""
        group = weights.group
        index = {name: i for i, name in enumerate(self.names)}
        order = [index[e[0]] for e in safetensors_order([(n, p.dtype, tuple(p.shape), None)
                                                          for n, p in zip(self.names, self.trainer.params)])]
        if self.rank != writer:
            for i in order:
                if weights.owner[i] == self.rank:
                    self.comm.transport.send(self.trainer.params[i].data, writer, group)
            return None

        params = self.trainer.params
        return [(self.names[i], params[i].dtype, tuple(params[i].shape),
                 (lambda p=params[i]: p.detach()) if weights.owns(i)
                 else self._arriving(params[i].dtype, tuple(params[i].shape), weights.owner[i], group))
                for i in order]

    def _arriving(self, dtype: torch.dtype, shape: tuple[int, ...], owner: int, group):
        """A file entry's value on the writer: the tensor received from its owner when it is due."""
        def value():
            out = torch.empty(shape, dtype=dtype, device=self.device)
            self.comm.transport.recv(out, owner, group)
            return out
        return value

    def state_entries(self, ranks: list[int], writer: int, before_sends=None):
        """Every train device's optimizer state as the writer's file entries (training/tensor_files.py
        `write_tensors`), in parameter order: on the writer, entries whose values arrive from
        their owners when due; on the others, each of their own entries sent in that same order
        (so the writer's receives meet the owners' sends one by one; nothing else is held), after
        `before_sends()` (what the writer's earlier file needs of them)."""
        ranks = sorted(ranks)
        group = self.comm.get(ranks)
        every = self.listing(ranks)
        mine = {name: value for name, _, _, value in optimizer_entries_of(self.trainer.model, self.trainer.optimizer)}
        if self.rank != writer:
            if before_sends is not None:
                before_sends()
            for _, name, _, _, owner in every:
                if owner == self.rank:
                    self.comm.transport.send(mine[name]().to(self.device).contiguous(), writer, group)
            return None

        return [(name, dtype, shape,
                 mine[name] if owner == self.rank else self._arriving(dtype, shape, owner, group))
                for _, name, dtype, shape, owner in every]


def _part_failure(e: Exception | None) -> tuple | None:
    """What the writer needs of a device's failed checkpoint write: an OSError's errno, text and
    file (a full disk becomes CheckpointSaveError there), or any other error's type and text."""
    if e is None:
        return None
    if isinstance(e, OSError):
        return ("os", e.errno, e.strerror, e.filename)
    return ("other", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _part_error(rank: int, failure: tuple) -> Exception:
    if failure[0] == "os":
        return OSError(*failure[1:])
    return RuntimeError(f"device {rank} failed to write its part of the checkpoint ({failure[1]})")
