"""The real device roles: a torch train shard with the fixed-order reduction, and the bucketed
weight broadcast over cached communicators. Imported only by a worker with real compute.

A train shard computes the gradient of each canonical micro-batch it is given and folds it into
the fixed tree at once (train/reduce.py `TreeAccumulator`: the aligned nodes of the micro-batches
it holds, about log2(M) + 1 flat gradients, never M). The reduction is transport plus one fixed
order: every rank of the group combines one contiguous slice of the flat gradient, receiving that
slice of every rank's nodes point to point and adding them in the tree order; the combined slices
then return to every rank by all-gather. So each rank receives about (nodes / W + 1) model
gradients per update, not W x nodes, and the update is the colocated loop's, bit for bit, for any
number of train devices (addition is element-wise: a slice's sums are the whole tensor's).
"""

from __future__ import annotations

import bisect
import hashlib
import time
from pathlib import Path

import torch
import torch.distributed as dist

from poise.rollout.engine import EngineBusyError
from poise.runtime.roles import BackgroundTask
from poise.training.checkpoint import TrainState, has_optimizer_state, load_checkpoint, save_checkpoint
from poise.training.tensor_files import optimizer_entries_of, safetensors_order
from poise.training.lora import trained_parameters
from poise.runtime.full_shard import ParameterShards
from poise.runtime.transport import Direct, Transport
from poise.training.reduce import TreeAccumulator, combine, index_nodes
from poise.training.sharding import element_bounds, owner_runs
from poise.training.trainer import PolicyTrainer, param_views

PARAMETER_CHUNK = 4 * 2**20  # elements per owner per all-gather of updated parameters (16 MB in fp32)


class CommunicatorCache:
    """torch.distributed groups keyed by frozenset(ranks), each created once (DynaResize §3.2).

    `dist.new_group` is collective over the whole world: every worker must call `get` for the
    same rank sets in the same order, which `DeviceWorker.prewarm_groups` guarantees.
    `transport`: how every point-to-point transfer on these groups moves its tensors, decided once
    by the worker for the world's backend and its device (runtime/transport.py `transport_for`).
    """

    def __init__(self, timeout=None, transport: Transport | None = None) -> None:
        self.timeout = timeout  # of every collective on these groups (cluster.step_timeout_s)
        self.transport: Transport = transport or Direct()
        self._groups: dict[frozenset[int], object] = {}
        self.created_after_prewarm = 0  # groups a resize had to create on its critical path
        self.warmed = 0  # groups of this rank that ran a collective at pre-warm (NCCL's set-up done)
        self._prewarmed = False

    def get(self, ranks: list[int] | tuple[int, ...]):
        key = frozenset(ranks)
        if key not in self._groups:
            self._groups[key] = dist.new_group(sorted(key), timeout=self.timeout)
            self.created_after_prewarm += self._prewarmed
        return self._groups[key]

    def prewarmed(self) -> None:
        self._prewarmed = True

    def __len__(self) -> int:
        return len(self._groups)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every named parameter's name and bytes: equal digests, equal weights."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def slice_bounds(numel: int, parties: int) -> list[tuple[int, int]]:
    """The contiguous slice of a flat gradient that each of `parties` ranks combines."""
    return [(numel * i // parties, numel * (i + 1) // parties) for i in range(parties)]


def exchange_and_combine(nodes: dict[tuple[int, int], torch.Tensor], m: int, ranks: list[int], rank: int, group,
                         numel: int, device: torch.device, rows: int,
                         bounds: list[tuple[int, int]] | None = None, gather: bool = True,
                         transport: Transport | None = None) -> tuple[torch.Tensor, int]:
    """The root of the tree over m micro-batches whose nodes the `ranks` hold between them (this
    rank's are `nodes`, `rows` the most any rank holds); returns it, flat, and the bytes this rank
    received. `bounds`: the slice each rank combines (default: equal slices); `gather=False`
    (sharded: each owner needs its own slice only) returns this rank's combined slice and skips
    step 4. `transport`: of the point-to-point slices (runtime/transport.py; default: direct).

    1. Node names: an all-gather of each rank's (level, index) pairs, `rows` of them (a few floats).
    2. Slices: rank i gets slice i of every other rank's nodes, point to point (transport only).
    3. Combine: rank i adds its slice of all nodes in the fixed tree order (`combine`).
    4. All-gather of the combined slices (padded to the longest by at most one element).
    """
    ranks = sorted(ranks)  # the group's own rank order, which all_gather follows
    transport = transport or Direct()
    parties, me = len(ranks), ranks.index(rank)
    bounds = bounds or slice_bounds(numel, parties)
    mine = sorted(nodes)
    if len(mine) > rows:
        raise RuntimeError(f"device {rank} holds {len(mine)} tree nodes, more than the {rows} the reduction was "
                           "planned for")
    names = torch.full((max(1, rows), 2), -1.0, device=device)
    for i, (level, index) in enumerate(mine):
        names[i, 0], names[i, 1] = level, index
    gathered = [torch.empty_like(names) for _ in ranks]
    dist.all_gather(gathered, names, group=group)
    received = 4 * parties * names.numel()
    lo, hi = bounds[me]
    table: dict[tuple[int, int], torch.Tensor] = {node: nodes[node][lo:hi] for node in mine}
    pending = []
    for peer, peer_names in enumerate(gathered):
        if peer == me:
            for node in mine:  # the other ranks' slices of this rank's nodes, in node order
                for other in range(parties):
                    a, b = bounds[other]
                    if other != me and b > a:  # an owner of no parameter gets nothing
                        pending.append(transport.isend(nodes[node][a:b].contiguous(), ranks[other], group))
            continue
        for row in peer_names.tolist():
            if row[0] < 0:
                continue
            node = (int(row[0]), int(row[1]))
            if node in table:
                raise RuntimeError(f"tree node {node} is held by two devices")
            table[node] = torch.empty(hi - lo, dtype=torch.float32, device=device)
            if hi > lo:
                pending.append(transport.irecv(table[node], ranks[peer], group))
                received += 4 * (hi - lo)
    for work in pending:
        work.wait()
    part = combine(table, m, torch.add) if hi > lo else torch.zeros(0, device=device)
    if not gather:
        return part, received
    width = max(b - a for a, b in bounds)
    padded = torch.zeros(width, dtype=torch.float32, device=device)
    padded[:hi - lo] = part
    pieces = [torch.empty_like(padded) for _ in ranks]
    dist.all_gather(pieces, padded, group=group)
    received += 4 * width * parties
    total = torch.cat([piece[:b - a] for piece, (a, b) in zip(pieces, bounds)])
    return total, received


class TorchTrainShard:
    """`shard`: `none` (every train device holds the whole AdamW state), `optimizer` (each owns
    the state of one run of whole parameters, train/sharding.py: its slice of the reduction is its
    run, it clips and steps its run, and the updated parameters return by all-gather) or `full`
    (each holds its run's parameters alone too: runtime/full_shard.py; micro-batches run in
    lockstep rounds, `train_round`, and the updated parameters stay with their owners)."""

    def __init__(self, rank: int, trainer: PolicyTrainer, comm: CommunicatorCache, bitwise: bool,
                 device: torch.device, on_version, shard: str = "none") -> None:
        self.rank, self.trainer, self.comm, self.bitwise, self.device = rank, trainer, comm, bitwise, device
        self.on_version = on_version  # the worker stamps restored versions on its engine
        self.sharded = shard in ("optimizer", "full")
        self.full = ParameterShards(trainer, comm, device, rank, bitwise) if shard == "full" else None
        self.numel = trainer.numel
        self.sizes = [shape.numel() for shape in trainer.shapes]
        names = {p: n for n, p in trainer.model.named_parameters()}
        self.names = [names[p] for p in trainer.params]
        self.stepped = False  # sharded: whether the optimizer state exists (somewhere) yet
        self._tree = TreeAccumulator(torch.add)  # bitwise: the held micro-batches' tree nodes
        self._sum: torch.Tensor | None = None  # semantic: their running sum (reassociation allowed)
        self._held: set[int] = set()
        self._staging: OptimizerStaging | None = None  # a live resize's optimizer transfer in flight
        self._barrier_s = 0.0  # seconds this update's rounds waited for it (shard: full)

    def train_micro_batch(self, index: int, samples, advantages) -> dict:
        start = time.time()
        result = self.trainer.micro_batch_grad(index, samples, torch.tensor(advantages, dtype=torch.float32))
        flat, result.flat_grad = result.flat_grad, torch.empty(0)
        if index in self._held:
            raise RuntimeError(f"device {self.rank}: micro-batch {index} computed twice in one update")
        self._held.add(index)
        if self.bitwise:
            self._tree.push(index, flat)
        else:
            self._sum = flat if self._sum is None else self._sum.add_(flat)
        return self._record(result, start, len(self._tree))

    def _record(self, result, start: float, held_grads: int) -> dict:
        """What the driver logs of one micro-batch (its stats, its interval, the gradients held)."""
        return {"index": result.index, "loss_sum": result.loss_sum, "normaliser": result.normaliser,
                "clipped": result.clipped_tokens, "kl_sum": result.kl_sum, "tokens": result.tokens,
                "entropy_sum": result.entropy_sum, "mismatch": result.mismatch,  # ~200 ints of histogram at most
                "start": start, "end": time.time(), "device": self.rank, "held_grads": held_grads}

    def train_round(self, index: int | None, samples, advantages, ranks: list[int]) -> dict | None:
        """`shard: full`: this device's micro-batch of a lockstep round over train devices `ranks`
        (None: it has none left in this mini-batch, and runs the stand-in with the others)."""
        start = time.time()
        if index is not None and index in self._held:
            raise RuntimeError(f"device {self.rank}: micro-batch {index} computed twice in one update")
        # a resize's optimizer reshard runs its transfers on a thread of its own over another
        # communicator: the round's collectives wait for it, so two communicators never run at once
        # (NCCL can hang when two threads use two communicators in an order the ranks do not share)
        self._barrier_s += self.wait_staging()
        self.full.begin_round(ranks, index)
        try:
            if index is None:
                samples, advantages = self.full.stand_in(self.trainer.pad_id), [0.0]
            result = self.trainer.micro_batch_grad(-1 if index is None else index, samples,
                                                   torch.tensor(advantages, dtype=torch.float32))
        finally:
            self.full.end_round()
        if index is None:
            return None
        self._held.add(index)
        return self._record(result, start, 0)  # each gradient went to its owner

    def apply_update(self, num_micro_batches: int, indices: list[int], normaliser: float, ranks: list[int],
                     rows: int, inputs_ready: float | None = None) -> dict:
        """Reduce the mini-batch's micro-batch gradients over `ranks` and take one step.

        `indices`: the micro-batches this device computed; `ranks`: every device holding some (the
        train devices, and with `pipeline.assist` the rollout devices that `contribute`).
        bitwise: each rank combines its slice of every rank's tree nodes in the fixed tree order,
        then the slices are all-gathered; semantic: an ordinary all-reduce. `rows`: the most tree
        nodes any of `ranks` holds (the size of the node names each rank sends).
        """
        start = time.time()
        barrier_s = self._barrier_s + self.wait_staging()  # the optimizer state must be whole before the step
        self._barrier_s = 0.0
        gathered = None
        if self.full is not None:
            gathered = self.full.weight_bytes  # of `received`: the weights the rounds gathered
            norm, received = self._full_update(num_micro_batches, indices, normaliser, ranks)
        elif self.sharded:
            norm, received = self._sharded_update(num_micro_batches, indices, normaliser, ranks, rows)
        else:
            total, received = self._reduce(num_micro_batches, indices, ranks, rows)
            norm = self.trainer.apply_update(param_views(total, self.trainer.shapes), normaliser)
        traffic = {} if received is None else {"received_bytes": received, "grad_bytes": 4 * self.numel}
        if gathered is not None and received is not None:
            traffic["weight_bytes"] = gathered
        traffic["optimizer_bytes"] = sum(t.numel() * t.element_size() for st in self.trainer.optimizer.state.values()
                                         for t in st.values() if torch.is_tensor(t))
        traffic["parameter_bytes"] = sum(p.untyped_storage().nbytes() for p in self.trainer.params)  # held here
        return {"grad_norm": norm, "start": start, "end": time.time(), "device": self.rank, "barrier_s": barrier_s,
                **traffic}

    def contribute(self, num_micro_batches: int, indices: list[int], ranks: list[int], rows: int) -> dict:
        """`pipeline.assist`: a rollout device's part of the reduction (the gradients of `indices`,
        computed with the weights the train devices hold before their step); it takes no step."""
        start = time.time()
        self._reduce(num_micro_batches, indices, ranks, rows)
        return {"start": start, "end": time.time(), "device": self.rank}

    def _sharded_update(self, m: int, indices: list[int], normaliser: float, ranks: list[int], rows: int
                        ) -> tuple[float, int | None]:
        """This owner's slice of the reduction, its clip (the norm from every owner's per-tensor
        norms, in parameter order) and AdamW step, then every owner's updated run by all-gather."""
        ranks = sorted(ranks)
        group, me = self.comm.get(ranks), ranks.index(self.rank)
        runs = owner_runs(self.sizes, len(ranks))
        bounds = element_bounds(self.sizes, runs)
        first, end = runs[me]
        self._check_state(first, end)
        part, received = self._reduce(m, indices, ranks, rows, bounds)
        if not self.bitwise:  # the all-reduced whole gradient: this owner's slice of it
            lo, hi = bounds[me]
            part, received = part[lo:hi], None
        norm, norm_bytes = self._step_run(param_views(part, self.trainer.shapes[first:end]), normaliser, runs, me,
                                          group)
        gathered = gather_runs(self.trainer.params, bounds, me, group)
        if received is not None:
            received += norm_bytes + gathered
        return norm, received

    def _step_run(self, grads: list[torch.Tensor], normaliser: float, runs: list[tuple[int, int]], me: int,
                  group) -> tuple[float, int]:
        """Clip and step owner `me`'s run (the global norm from every owner's per-tensor norms, in
        parameter order); returns the norm and the bytes the norms' all-gather received."""
        counts = [b - a for a, b in runs]
        norm = self.trainer.apply_update(grads, normaliser, runs[me][0],
                                         lambda mine: _gather_ragged(mine, counts, me, group))
        self.stepped = True
        return norm, 4 * max(counts) * len(runs)

    def _full_update(self, m: int, indices: list[int], normaliser: float, ranks: list[int]) -> tuple[float, int]:
        """`shard: full`: the owner's gradients already sit in its trees (sent during the rounds);
        clip and step its run as `optimizer` does. The parameters stay with their owners."""
        if self._held != set(indices):
            raise RuntimeError(f"device {self.rank}: expected micro-batches {sorted(indices)}, "
                               f"got {sorted(self._held)}")
        self._held = set()
        ranks = sorted(ranks)
        self.full.shard_over(ranks)  # a mini-batch of this device's micro-batches alone has had no round
        group, me = self.comm.get(ranks), ranks.index(self.rank)
        runs = owner_runs(self.sizes, len(ranks))
        first, end = runs[me]
        self._check_state(first, end)
        norm, norm_bytes = self._step_run(self.full.summed(m, first, end), normaliser, runs, me, group)
        # the gradients and norms it received, and the weights the rounds gathered (the price of sharding them)
        received = self.full.received + norm_bytes + self.full.weight_bytes
        self.full.received = self.full.weight_bytes = 0
        return norm, received

    def gather_weights(self, new_ranks: list[int]) -> tuple[int, int]:
        """`shard: full`, before a live resize (collective over the old train group): a device
        leaving for rollout takes the whole model, one that stays its run among train devices
        `new_ranks` alone (runtime/full_shard.py `reshard`). Returns the most weight bytes it held
        at once and the weight bytes it received."""
        self.wait_staging()  # its collectives never beside a transfer still on its own thread
        return self.full.reshard(new_ranks) if self.full is not None else (0, 0)

    def shard_weights(self, ranks: list[int]) -> None:
        """`shard: full`: a device joining the trainer (it holds the whole model, as a rollout
        device) keeps its run among train devices `ranks` and frees the rest; no collective."""
        if self.full is not None:
            self.full.shard_over(ranks)

    def _check_state(self, first: int, end: int) -> None:
        """An owner steps with the state of exactly its run (all of it once any update happened):
        AdamW would start a missing moment from zero without a word."""
        state = self.trainer.optimizer.state
        held = [i for i, p in enumerate(self.trainer.params) if p in state]
        want = list(range(first, end)) if self.stepped else []
        if held != want:
            raise RuntimeError(f"device {self.rank} holds the optimizer state of parameters {_spans(held)} but owns "
                               f"{_spans(list(range(first, end)))}{'' if self.stepped else ' (before any update)'}: "
                               "a reshard of the optimizer state is missing")

    def _reduce(self, num_micro_batches: int, indices: list[int], ranks: list[int], rows: int,
                bounds: list[tuple[int, int]] | None = None) -> tuple[torch.Tensor, int | None]:
        """The mini-batch's summed gradient (flat) and the bytes this rank received for it (bitwise);
        with `bounds` (sharded, bitwise) only this rank's slice of it."""
        if self._held != set(indices):
            raise RuntimeError(f"device {self.rank}: expected micro-batches {sorted(indices)}, "
                               f"got {sorted(self._held)}")
        group = self.comm.get(ranks)
        self._held = set()
        if not self.bitwise:
            total = self._sum if self._sum is not None else torch.zeros(self.numel, device=self.device)
            self._sum = None
            dist.all_reduce(total, group=group)
            return total, None  # what the backend's all-reduce moves is its own
        m = num_micro_batches
        nodes = self._tree.nodes(m)
        if sorted(nodes) != sorted(index_nodes(indices, m)):  # the tree's invariant, checked where it is used
            raise RuntimeError(f"device {self.rank}: tree nodes {sorted(nodes)} are not the aligned nodes of "
                               f"micro-batches {sorted(indices)}")
        return exchange_and_combine(nodes, m, ranks, self.rank, group, self.numel, self.device, rows, bounds,
                                    gather=bounds is None, transport=self.comm.transport)

    # ---- live resize ------------------------------------------------------------------------
    def stage_optimizer(self, src: int, ranks: list[int], buffer_bytes: int) -> None:
        """Start sending (rank == src) or receiving this shard's optimizer state over the cached
        group of `ranks`, in the background; the next update or checkpoint waits for it."""
        self.wait_staging()
        self._staging = OptimizerStaging(self.rank, src, self.comm.get(ranks), self.trainer, buffer_bytes,
                                         self.device)

    def reshard_optimizer(self, old_ranks: list[int], new_ranks: list[int], buffer_bytes: int) -> None:
        """Sharded live resize: hand the state of every parameter whose owner changes from its
        owner among `old_ranks` to its owner among `new_ranks`, in the background (DynaResize's
        optimizer migration through a bounded buffer); the next update or checkpoint waits for it."""
        self.wait_staging()
        self._staging = OptimizerReshard(self, sorted(old_ranks), sorted(new_ranks), buffer_bytes)

    def wait_staging(self) -> float:
        """Block until a staging transfer is done (the explicit barrier); returns seconds waited."""
        return self._staging.task.join() if self._staging is not None else 0.0

    def staging_report(self) -> dict:
        """What the last staging moved (bytes, seconds, peak host buffer); empty if none."""
        return self._staging.report if self._staging is not None else {}

    def drop_optimizer(self) -> None:
        """Leaving the trainer: free the optimizer state (a peer re-sends it if this device returns)
        and the reference model (rebuilt if it trains again)."""
        self.wait_staging()
        if self.full is not None and self.full.ranks is not None:
            raise RuntimeError(f"device {self.rank} leaves the trainer holding only its shard of the weights; "
                               "gather_weights must run on every train device first")
        self.trainer.optimizer.state.clear()
        self.trainer.release_reference()

    def save_checkpoint(self, run_dir: str, step: int, version: int, extra: dict[str, bytes] | None = None,
                        ranks: list[int] | None = None, parallel: bool = False) -> str:
        """Write the weights, optimizer and RNG (the colocated loop's format). Sharded, `ranks`
        are the train devices: every other one runs `send_optimizer_state` meanwhile. `parallel`
        (every train device sees `run_dir`): this device lays the files out and each owner writes
        its own tensors into them in place, at once (`_write_parts`); otherwise the owners' state
        streams into this device's files tensor by tensor, in file order, and under `shard: full`
        the weights too, so no device holds more than its run and one tensor of another's."""
        self.wait_staging()
        if parallel and self.sharded and ranks:
            listing = self._listing(ranks)
            return str(save_checkpoint(run_dir, self.trainer.model, self.trainer.optimizer, TrainState(step, version),
                                       extra, owners_write=lambda tmp: self._write_parts(ranks, self.rank, listing,
                                                                                         tmp)))
        streamed = self.full is not None and self.full.ranks is not None and bool(ranks)
        weights = self._weight_entries(self.rank) if streamed else None
        entries = self._state_entries(ranks, self.rank) if self.sharded and ranks else None
        return str(save_checkpoint(run_dir, self.trainer.model, self.trainer.optimizer, TrainState(step, version),
                                   extra, entries, weights))

    def send_optimizer_state(self, writer: int, ranks: list[int], parallel: bool = False) -> None:
        """Sharded: this owner's part of the checkpoint train device `writer` writes: written into
        its files in place (`parallel`), or sent to it (under `shard: full` its weights first,
        then its optimizer state)."""
        self.wait_staging()
        if parallel:
            self._write_parts(ranks, writer, self._listing(ranks), None)
            return
        streamed = self.full is not None and self.full.ranks is not None
        self._state_entries(ranks, writer, (lambda: self._weight_entries(writer)) if streamed else None)

    def _write_parts(self, ranks: list[int], writer: int, listing: list, tmp: Path | None) -> set[str]:
        """Collective over the train group `ranks`: the writer (`tmp`: its checkpoint's temporary
        directory) creates the optimizer file, and under `shard: full` the model file, with
        their headers and sizes; every owner then writes its own tensors into them in place.
        A failure anywhere (a full disk) reaches the writer, which raises it. Returns the files
        written."""
        from poise.training import tensor_files

        ranks = sorted(ranks)
        group = self.comm.get(ranks)
        mine = {name: value for name, _, _, value in optimizer_entries_of(self.trainer.model, self.trainer.optimizer)}
        state = [(name, dtype, shape, mine.get(name)) for _, name, dtype, shape, _ in listing]
        files = {"optimizer.safetensors": (state, set(mine))}
        if self.full is not None and self.full.ranks is not None:
            params = self.trainer.params
            weights = safetensors_order([(n, p.dtype, tuple(p.shape), lambda p=p: p.detach())
                                         for n, p in zip(self.names, params)])
            files["model.safetensors"] = (weights, {self.names[i] for i in range(len(params)) if self.full.owns(i)})
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

    def _listing(self, ranks: list[int]) -> list:
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

    def _weight_entries(self, writer: int):
        """`shard: full`: the weights as the writer's model file entries, in safetensors' order (the
        file `save_file` would write of the whole model): on the writer, those of other owners
        arrive when due; on the others, each of their own is sent in that order."""
        full, group = self.full, self.full.group
        index = {name: i for i, name in enumerate(self.names)}
        order = [index[e[0]] for e in safetensors_order([(n, p.dtype, tuple(p.shape), None)
                                                          for n, p in zip(self.names, self.trainer.params)])]
        if self.rank != writer:
            for i in order:
                if full.owner[i] == self.rank:
                    self.comm.transport.send(self.trainer.params[i].data, writer, group)
            return None

        params = self.trainer.params
        return [(self.names[i], params[i].dtype, tuple(params[i].shape),
                 (lambda p=params[i]: p.detach()) if full.owns(i)
                 else self._arriving(params[i].dtype, tuple(params[i].shape), full.owner[i], group))
                for i in order]

    def _arriving(self, dtype: torch.dtype, shape: tuple[int, ...], owner: int, group):
        """A file entry's value on the writer: the tensor received from its owner when it is due."""
        def value():
            out = torch.empty(shape, dtype=dtype, device=self.device)
            self.comm.transport.recv(out, owner, group)
            return out
        return value

    def _state_entries(self, ranks: list[int], writer: int, before_sends=None):
        """Every train device's optimizer state as the writer's file entries (train/checkpoint.py
        `write_tensors`), in parameter order: on the writer, entries whose values arrive from
        their owners when due; on the others, each of their own entries sent in that same order
        (so the writer's receives meet the owners' sends one by one; nothing else is held), after
        `before_sends()` (what the writer's earlier file needs of them)."""
        ranks = sorted(ranks)
        group = self.comm.get(ranks)
        every = self._listing(ranks)
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

    def load_checkpoint(self, path: str, train_ranks: list[int] | None = None) -> tuple[int, int]:
        """`train_ranks`: the train devices the run goes on with. A device among them takes the
        optimizer state of what it owns (all of it unsharded), any other device none; default:
        all of it."""
        owned = None
        if train_ranks is not None:
            ranks = sorted(train_ranks)
            owned = set()
            if self.rank in ranks:
                first, end = owner_runs(self.sizes, len(ranks))[ranks.index(self.rank)] if self.sharded \
                    else (0, len(self.names))
                owned = set(self.names[first:end])
        self.trainer.optimizer.state.clear()
        weights = None
        if self.full is not None:
            if train_ranks is not None and self.rank in train_ranks:  # it reads its own run of the weights alone
                self.full.hold_run(train_ranks)
                weights = {self.names[i] for i in range(len(self.names)) if self.full.owns(i)}
            else:  # a rollout device (or no train group named): the whole model
                self.full.hold_all()
        state = load_checkpoint(Path(path), self.trainer.model, self.trainer.optimizer, owned, weights)
        self.stepped = has_optimizer_state(Path(path))
        self.on_version(state.weights_version)
        return state.step, state.weights_version

    def digest(self) -> str | None:
        """The weights' digest; `shard: full` while sharded: collective over the train group, the
        group's first device returns it (the others None)."""
        if self.full is not None and self.full.ranks is not None:
            self.wait_staging()  # a collective: never beside a transfer still on its own thread
            return self.full.digest(self.names)
        return weights_digest(self.trainer.model)


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


class OptimizerReshard:
    """The state of each parameter whose owner changes, sent by its old owner to its new one point to
    point over the larger of the two train groups (a prewarmed one: train groups are suffixes of the
    devices, so it holds both), in parameter order on every device (so each pair's sends and
    receives meet in order), chunk by chunk through one buffer of `buffer_bytes`. A sender frees
    what it sent; a receiver allocates what it receives. The parameter's `step` goes first, -1
    when no update has happened yet (nothing more follows)."""

    def __init__(self, shard: TorchTrainShard, old: list[int], new: list[int], buffer_bytes: int):
        self.shard, self.old, self.new, self.buffer_bytes = shard, old, new, buffer_bytes
        self.report: dict = {}
        self.task = BackgroundTask(self._run, f"device {shard.rank}: optimizer reshard {old} -> {new}")

    def _run(self) -> None:
        t0 = time.time()
        shard, me = self.shard, self.shard.rank
        group = shard.comm.get(self.old if len(self.old) >= len(self.new) else self.new)
        owner_of = []
        for ranks in (self.old, self.new):
            runs = owner_runs(shard.sizes, len(ranks))
            owner_of.append([ranks[r] for r, (a, b) in enumerate(runs) for _ in range(a, b)])
        opt, device = shard.trainer.optimizer, shard.device
        buf = torch.empty(max(1, min(max(shard.sizes), self.buffer_bytes // 4)), dtype=torch.float32, device=device)
        side = _side_stream(device)
        moved = {"received": 0, "sent": 0}
        for i, p in enumerate(shard.trainer.params):
            src, dst = owner_of[0][i], owner_of[1][i]
            if src == dst or me not in (src, dst):
                continue
            if me == src:
                moved["sent"] += self._send_state(p, dst, group, buf, side)
            else:
                moved["received"] += self._receive_state(p, src, group, buf, side)
        if me not in self.new:
            opt.state.clear()
        else:
            shard.stepped = shard.stepped or bool(opt.state)
        self.report = {"bytes": moved["received"], "sent_bytes": moved["sent"], "seconds": time.time() - t0,
                       "peak_buffer_bytes": 4 * buf.numel()}

    def _send_state(self, p: torch.Tensor, dst: int, group, buf: torch.Tensor, side: "_SideStream") -> int:
        """Parameter p's state to its new owner `dst`, then freed here; returns the bytes sent."""
        shard = self.shard
        transport, device = shard.comm.transport, shard.device
        state = shard.trainer.optimizer.state.pop(p, None)
        transport.send(torch.tensor([-1.0 if state is None else float(state["step"])], device=device), dst, group)
        if state is None:
            return 4
        sent = 4
        with side:  # the chunk copies out of the state, beside the training stream
            for key in shard.trainer.state_fields():
                flat = state[key].view(-1)
                for lo in range(0, flat.numel(), buf.numel()):
                    chunk = buf[:min(buf.numel(), flat.numel() - lo)]
                    chunk.copy_(flat[lo:lo + chunk.numel()])
                    transport.send(chunk, dst, group)
                    sent += 4 * chunk.numel()
            del flat
        # the side stream's copies read the state: they must be done before its memory goes back to
        # the allocator, which would hand it to the training stream's next allocation at once
        side.synchronize()
        del state
        return sent

    def _receive_state(self, p: torch.Tensor, src: int, group, buf: torch.Tensor, side: "_SideStream") -> int:
        """Parameter p's state from its old owner `src` into fresh state here; returns the bytes."""
        shard = self.shard
        transport, device = shard.comm.transport, shard.device
        step = torch.empty(1, dtype=torch.float32, device=device)
        transport.recv(step, src, group)
        if step.item() < 0:
            return 4
        received = 4
        state = shard.trainer.fresh_state(p)  # on the training stream, where the state lives on
        state["step"].fill_(step.item())
        with side:  # waits for the training stream's work on the fresh state, then writes it
            for key in shard.trainer.state_fields():
                flat = state[key].view(-1)
                for lo in range(0, flat.numel(), buf.numel()):
                    chunk = buf[:min(buf.numel(), flat.numel() - lo)]
                    transport.recv(chunk, src, group)
                    flat[lo:lo + chunk.numel()].copy_(chunk)
                    received += 4 * chunk.numel()
        side.synchronize()  # whole before the step (or a checkpoint) reads it on the training stream
        shard.trainer.optimizer.state[p] = state
        return received


@torch.no_grad()
def gather_runs(params: list[torch.Tensor], bounds: list[tuple[int, int]], me: int, group,
                chunk: int = PARAMETER_CHUNK) -> int:
    """Every owner's run (`bounds`: element ranges of the flat parameters, in the group's rank
    order; this rank is `me`) into `params`, by all-gathers of at most `chunk` elements per owner:
    one buffer of W x chunk, never a second copy of the model. Returns the bytes received."""
    flat = _FlatParameters(params)
    width = max(b - a for a, b in bounds)
    received = 0
    for offset in range(0, width, chunk):
        n = min(chunk, width - offset)
        mine = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)
        lo, hi = bounds[me]
        if lo + offset < hi:
            flat.read(lo + offset, mine[:min(n, hi - lo - offset)])
        pieces = [torch.empty_like(mine) for _ in bounds]
        dist.all_gather(pieces, mine, group=group)
        received += mine.element_size() * n * len(bounds)
        for owner, ((a, b), piece) in enumerate(zip(bounds, pieces)):
            if owner != me and a + offset < b:
                flat.write(a + offset, piece[:min(n, b - a - offset)])
        del pieces
    return received


class _FlatParameters:
    """The parameters as one flat vector, read and written by element range without building it."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.starts = [0]
        for p in params:
            self.starts.append(self.starts[-1] + p.numel())

    def _spans(self, lo: int, n: int):
        i = bisect.bisect_right(self.starts, lo) - 1
        done = 0
        while done < n:
            p, at = self.params[i], lo + done - self.starts[i]
            k = min(p.numel() - at, n - done)
            yield p.view(-1)[at:at + k], done, k
            done += k
            i += 1

    def read(self, lo: int, out: torch.Tensor) -> None:
        for view, done, k in self._spans(lo, out.numel()):
            out[done:done + k].copy_(view)

    def write(self, lo: int, values: torch.Tensor) -> None:
        for view, done, k in self._spans(lo, values.numel()):
            view.copy_(values[done:done + k])


def _gather_ragged(mine: torch.Tensor, counts: list[int], me: int, group) -> torch.Tensor:
    """Every rank's 1-D tensor (rank i's has counts[i] elements), concatenated in rank order: an
    all-gather padded to the longest (transport only)."""
    padded = torch.zeros(max(1, max(counts)), dtype=mine.dtype, device=mine.device)
    padded[:counts[me]] = mine
    pieces = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([piece[:n] for piece, n in zip(pieces, counts)])


def _spans(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'; '(none)' when empty."""
    out: list[str] = []
    for i in indices:
        if out and int(out[-1].split("-")[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out) or "(none)"


class OptimizerStaging:
    """A live resize's optimizer transfer from train rank `src` to the devices joining the trainer
    (DynaResize §3.3), on a background thread: the AdamW state of every parameter, in parameter
    order (step, exp_avg, exp_avg_sq), flows through one bounded buffer of `buffer_bytes`, chunk by
    chunk, by broadcast over the cached group. The joiner meanwhile runs its first forward/backward;
    its optimizer step waits on `task.join()` (so the update is exact: the state is a bitwise copy)."""

    def __init__(self, rank: int, src: int, group, trainer: PolicyTrainer, buffer_bytes: int,
                 device: torch.device):
        self.rank, self.src, self.group, self.trainer, self.device = rank, src, group, trainer, device
        self.buffer_bytes = buffer_bytes
        self.report: dict = {}
        self.task = BackgroundTask(self._run, f"device {rank}: optimizer staging from device {src}")

    def _views(self) -> list[torch.Tensor]:
        """The state as flat float32 views, in the one canonical order both sides agree on."""
        opt = self.trainer.optimizer
        views = []
        for p in self.trainer.params:
            if self.rank != self.src:  # the receiver writes straight into fresh state tensors
                opt.state[p] = self.trainer.fresh_state(p)
            st = opt.state[p]
            views += [st["step"].view(1)] + [st[key].view(-1) for key in self.trainer.state_fields()]
        return views

    def _run(self) -> None:
        t0 = time.time()
        opt, sending = self.trainer.optimizer, self.rank == self.src
        has = torch.tensor([1.0 if sending and opt.state else 0.0], device=self.device)
        dist.broadcast(has, src=self.src, group=self.group)  # before the first update there is none
        if not has.item():
            opt.state.clear()
            self.report = {"bytes": 0, "seconds": time.time() - t0, "peak_buffer_bytes": 0}
            return
        # the state is allocated on the training stream (it lives on there); only the chunk copies
        # run on the transfer's own stream, so they overlap the joiner's first forward/backward
        views = self._views()
        total = sum(v.numel() for v in views)
        with _side_stream(self.device):
            buf = torch.empty(min(total, max(1, self.buffer_bytes // 4)), dtype=torch.float32, device=self.device)
            cursor = (0, 0)  # (view, offset in it)
            moved = 0
            while moved < total:
                n = min(buf.numel(), total - moved)
                if sending:
                    cursor = _copy_chunk(views, cursor, buf[:n], into_buffer=True)
                dist.broadcast(buf[:n], src=self.src, group=self.group)
                if not sending:
                    cursor = _copy_chunk(views, cursor, buf[:n], into_buffer=False)
                moved += n
            _sync(self.device)  # the time of the transfer, not of its enqueue; the step reads the state next
        self.report = {"bytes": 4 * total, "seconds": time.time() - t0, "peak_buffer_bytes": 4 * buf.numel()}


def _copy_chunk(views: list[torch.Tensor], cursor: tuple[int, int], buf: torch.Tensor, into_buffer: bool
                ) -> tuple[int, int]:
    """Copy len(buf) elements between the views, from `cursor` on, and the buffer; returns where
    the next chunk starts."""
    filled = 0
    vi, off = cursor
    while filled < buf.numel():
        v = views[vi]
        n = min(v.numel() - off, buf.numel() - filled)
        if into_buffer:
            buf[filled:filled + n].copy_(v[off:off + n])
        else:
            v[off:off + n].copy_(buf[filled:filled + n])
        filled += n
        vi, off = (vi + 1, 0) if off + n == v.numel() else (vi, off + n)
    return vi, off


class BroadcastSync:
    """Bucketed broadcast from train rank `src` to every rank of `ranks` over a cached group.

    Receivers load the buckets into their engine by name (`Engine.load_weights`), so the engine
    validates them and stamps `version` on every later sample.
    """

    def __init__(self, rank: int, model: torch.nn.Module, comm: CommunicatorCache, device: torch.device,
                 engine_call) -> None:
        self.rank, self.model, self.comm, self.device = rank, model, comm, device
        self.engine_call = engine_call  # runs fn(engine) with the engine loop paused

    def prewarm(self, rank_sets: list[list[int]]) -> int:
        """Create every group of `rank_sets` and run one tiny collective on each this rank belongs
        to: NCCL builds a communicator at its first collective, not at `new_group`, so without it
        the first use after a resize pays the set-up on the critical path. Every rank walks the same
        list in the same order, so the collectives cannot wait on each other in a cycle."""
        for ranks in rank_sets:
            group = self.comm.get(ranks)
            if self.rank in ranks:
                dist.all_reduce(torch.zeros(1, device=self.device), group=group)
                self.comm.warmed += 1
        _sync(self.device)
        self.comm.prewarmed()
        return len(self.comm)

    def groups_created_after_prewarm(self) -> int:
        return self.comm.created_after_prewarm

    def publish(self, src: int, ranks: list[int], version: int, bucket_mb: float,
                sender_ready: float | None = None, sources: list[int] | None = None) -> float:
        """`sources` (`shard: full`): the train devices, each of which sends the parameters it owns
        to every other rank of `ranks`, point to point; no device assembles the model to send it."""
        start = time.time()  # the broadcast itself waits for the sender: `sender_ready` is not needed
        if sources:
            self._publish_from_owners(sorted(sources), ranks, version, bucket_mb)
            _sync(self.device)
            return time.time() - start
        group = self.comm.get(ranks)
        if self.rank == src:  # the leader's engine shares its weights
            self._broadcast(src, group, bucket_mb)
            self.engine_call(lambda engine: engine.set_weights_version(version))
        else:
            self.engine_call(lambda engine: self._receive(engine, src, group, bucket_mb, version))
        _sync(self.device)  # a CUDA broadcast returns at enqueue: time the transfer itself
        return time.time() - start

    def _buckets(self, bucket_mb: float, owner: list[int] | None = None):
        """Consecutive runs of named parameters of at most `bucket_mb` (one parameter at least):
        what training changes (train/lora.py `trained_parameters`: the adapter alone under LoRA).
        `owner` (per parameter, its owner's rank): a bucket holds one owner's parameters alone."""
        named = trained_parameters(self.model)
        limit = max(1, int(bucket_mb * 2**20) // 4)
        first = 0
        while first < len(named):
            last, size = first, 0
            while last < len(named) and (size == 0 or size + named[last][1].numel() <= limit) and (
                    owner is None or owner[last] == owner[first]):
                size += named[last][1].numel()
                last += 1
            yield named[first:last], size
            first = last

    def _owners(self, sources: list[int]) -> list[int]:
        """Per trained parameter, the train device that owns it (train/sharding.py)."""
        runs = owner_runs([p.numel() for _, p in trained_parameters(self.model)], len(sources))
        return [sources[r] for r, (a, b) in enumerate(runs) for _ in range(a, b)]

    @torch.no_grad()
    def _publish_from_owners(self, sources: list[int], ranks: list[int], version: int, bucket_mb: float) -> None:
        owner = self._owners(sources)
        if self.rank not in sources:
            self.engine_call(lambda engine: self._receive(engine, None, None, bucket_mb, version, owner))
            return
        receivers = [r for r in ranks if r not in sources]
        at = 0
        for bucket, _ in self._buckets(bucket_mb, owner):
            mine, at = owner[at] == self.rank, at + len(bucket)
            if mine:  # one bucket in flight at a time, to every receiver (the default group: any pair)
                flat = torch.cat([p.detach().reshape(-1) for _, p in bucket])
                for work in [self.comm.transport.isend(flat, r) for r in receivers]:
                    work.wait()
                del flat
        self.engine_call(lambda engine: engine.set_weights_version(version))

    def _broadcast(self, src: int, group, bucket_mb: float) -> None:
        for bucket, _ in self._buckets(bucket_mb):
            flat = torch.cat([p.detach().reshape(-1) for _, p in bucket])
            dist.broadcast(flat, src=src, group=group)

    @torch.no_grad()
    def _receive(self, engine, src: int | None, group, bucket_mb: float, version: int,
                 owner: list[int] | None = None) -> None:
        """Receive each bucket and copy it into the engine's weights (this device's model) at once,
        so at most one bucket is held beside the model, never a second copy of it. Runs with the
        engine loop paused; the engine's in-flight check comes first, and a refused device still
        takes part in every broadcast (the sender would otherwise wait out the collective timeout)."""
        try:
            engine.set_weights_version(version)  # raises, touching nothing, if sequences are in flight
            refused = None
        except EngineBusyError as e:  # re-raised once the collective is done
            refused = e
        at = 0
        for bucket, size in self._buckets(bucket_mb, owner):
            flat = torch.empty(size, dtype=bucket[0][1].dtype, device=self.device)
            if owner is None:
                dist.broadcast(flat, src=src, group=group)
            else:  # shard: full: from the bucket's owner
                self.comm.transport.recv(flat, owner[at])
            at += len(bucket)
            if refused is None:
                offset = 0
                for _, p in bucket:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            del flat  # before the next bucket is allocated
        if refused is not None:
            raise refused


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work before a time is taken: CUDA collectives and copies return
    at enqueue, so an unsynchronised time measures the launch. A no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _SideStream:
    """A CUDA stream of its own for a background transfer's copies: each entry (`with`) runs after
    the work already queued on the current stream (the state it reads or the fresh state it
    fills), and `synchronize` waits for the copies it queued. A no-op on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._entered: list = []

    def __enter__(self) -> "_SideStream":
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
            context = torch.cuda.stream(self.stream)
            context.__enter__()
            self._entered.append(context)
        return self

    def __exit__(self, *exc) -> None:
        if self._entered:
            self._entered.pop().__exit__(*exc)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def _side_stream(device: torch.device) -> _SideStream:
    """A side stream for a background transfer on `device` (`_SideStream`)."""
    return _SideStream(device)
