"""`cluster.shard: full`: the parameters are sharded too, not only their AdamW state.

Ownership is `optimizer`'s (training/state/placement.py: contiguous runs of whole tensors). At rest a train
device holds the storage of its own run alone; every other parameter keeps its shape with an
empty storage. The forward and the backward gather each module's parameters just before the module
runs, by broadcast from the owner over the train group, and free them right after (a forward hook;
a hook on the module's output gathers them again when its gradient arrives, for the module's
backward; with gradient checkpointing the recompute inside the backward gathers what the hooks
have not, and frees nothing: each parameter goes once its gradient is sent). Each parameter's
gradient goes to its owner point to point as soon as the backward produces it, and the owner
folds every device's micro-batch gradient, one at a time as it arrives, into that parameter's
tree (bitwise: `TreeAccumulator`, leaf = micro-batch index, so the additions are the flat tree's,
element for element) or running sum (semantic). No device ever holds a whole gradient, and
between modules none holds the whole model. The trainer knows none of this: a round hands it
these shards as the micro-batch's `GradientConsumer` (train/trainer.py), and the hooks sit on
the model's modules, not in its code.

The gathers are collectives, so the train devices run rounds in lockstep: round k is every
device's k-th micro-batch of the mini-batch (micro-batches kW .. kW + W - 1: device d computes every
W-th), and a device with none left runs a one-token stand-in whose gradient its owners drop
(the runtime's trainer group dispatches rounds). Every device runs the same modules in the same
order, so the broadcasts and gathers meet one by one.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from poise.training.reduce import TreeAccumulator, combine
from poise.training.state.placement import owner_of_each, owner_runs


class ParameterShards:
    """The parameters of one train device's `PolicyTrainer` under `cluster.shard: full`; during a
    round, the trainer's `GradientConsumer` too (`begin_backward`, `take`, `end_backward`)."""

    def __init__(self, trainer, comm, device: torch.device, rank: int, bitwise: bool):
        self.trainer, self.comm, self.device, self.rank, self.bitwise = trainer, comm, device, rank, bitwise
        self.params = trainer.params
        self.sizes = [p.numel() for p in self.params]
        self.ranks: list[int] | None = None  # the train group the weights are sharded over; None: all held here
        self.owner: list[int] = []  # per parameter, the rank that owns it
        self.gathered = [False] * len(self.params)  # per parameter, held for the module running now
        self.leaves: list[int] = []  # this round's micro-batch index per group position (-1: a stand-in)
        self.sums: dict[int, object] = {}  # owned parameter -> its tree (bitwise) or running sum
        self.received = 0  # bytes of gradient this owner received since the last update
        self.weight_bytes = 0  # bytes of other owners' weights this device received since the last update
        self._hooks: list = []
        self._group = None  # the train group's communicator, while sharded
        self._active = False
        self._in_backward = False  # the round's backward runs: a forward now is gradient checkpointing's recompute
        for p in self.params:  # each tensor its own resizable storage, so it can be freed alone
            storage = p.data.untyped_storage()
            if storage.nbytes() and (not storage.resizable() or storage.nbytes() != p.numel() * p.element_size()):
                p.data = p.data.clone()

    # ---- which device holds what --------------------------------------------------------------
    def owns(self, i: int) -> bool:
        return self.ranks is None or self.owner[i] == self.rank

    def shard_over(self, ranks: list[int]) -> None:
        """Keep the runs this device owns among train devices `ranks` and free the rest (the whole
        model must be held here: a fresh start, a rollout device joining, a resize or a resume)."""
        ranks = sorted(ranks)
        if self.ranks == ranks:
            return
        if self.ranks is not None:
            raise RuntimeError(f"device {self.rank}: parameters sharded over {self.ranks}, asked for {ranks} "
                               "without gathering them first")
        for i, p in enumerate(self._own(ranks)):
            if not self.owns(i):
                _free(p)
        self._install_hooks()

    def _own(self, ranks: list[int]) -> list[torch.Tensor]:
        """Take ownership of the runs among sorted `ranks` (training/state/placement.py); the parameters."""
        self.owner = owner_of_each(self.sizes, ranks)
        self.ranks, self._group = ranks, None
        return self.params

    @property
    def group(self):
        """The train group's communicator (CommunicatorCache: created once, collectively)."""
        if self._group is None:
            self._group = self.comm.get(self.ranks)
        return self._group

    def adopt(self, ranks: list[int]) -> None:
        """Sharded over train devices `ranks` from the start: the model was loaded with this
        device's run alone (the runtime's worker), every other parameter has no storage. No
        collective: the group's communicator is taken at the first round."""
        self._own(sorted(ranks))
        for i, p in enumerate(self.params):
            if self.owns(i) != bool(p.data.untyped_storage().nbytes()):
                raise RuntimeError(f"device {self.rank}: parameter {i} is {'not ' if self.owns(i) else ''}its own "
                                   f"but {'has no' if self.owns(i) else 'has'} storage")
        self._install_hooks()

    def hold_run(self, ranks: list[int]) -> None:
        """Sharded over train devices `ranks` from here on, no collective but the group's creation:
        room for this device's run (a checkpoint load fills it), every other parameter freed."""
        self._unshard()
        ranks = sorted(ranks)
        for i, p in enumerate(self._own(ranks)):
            if self.owns(i):
                _allocate(p)
            elif p.data.untyped_storage().nbytes():
                _free(p)
        self._install_hooks()

    def hold_all(self) -> None:
        """Room for every parameter here, no collective (a checkpoint load fills it)."""
        for p in self.params:
            _allocate(p)
        self._unshard()

    def gather_all(self, keep: bool = True, on_each=None) -> None:
        """Collective over the train group: every parameter, in order, broadcast by its owner.
        `keep`: every device keeps them all (sharding ends: a resize or a checkpoint load follows);
        otherwise each is freed again once `on_each(name index, tensor)` has seen it."""
        if self.ranks is None:
            if on_each is not None:
                for i, p in enumerate(self.params):
                    on_each(i, p.detach())
            return
        for i, p in enumerate(self.params):
            self._fetch(i)
            if on_each is not None:
                on_each(i, p.detach())
            if not keep and not self.owns(i):
                _free(p)
        if keep:
            self._unshard()

    def reshard(self, new_ranks: list[int]) -> tuple[int, int]:
        """A live resize, collective over the old train group: every parameter broadcast by its
        old owner, kept by a device that leaves the trainer (its engine needs the whole model) or
        that owns it among `new_ranks`, and freed by the others right away, so a device that stays
        never holds the whole model. A staying device ends sharded over `new_ranks`, a leaving
        one holding everything. Returns the most weight bytes this device held at once, and the
        weight bytes it received."""
        new = sorted(new_ranks)
        first, end = 0, len(self.params)
        if self.rank in new:
            first, end = owner_runs(self.sizes, len(new))[new.index(self.rank)]
        held = sum(p.untyped_storage().nbytes() for p in self.params)
        peak, received = held, 0
        for i, p in enumerate(self.params):
            if self.ranks is not None:  # sharded over the old group: its owner broadcasts it
                received += self._fetch(i)
                held += 0 if self.owns(i) else p.numel() * p.element_size()
                peak = max(peak, held)
            if not first <= i < end and p.untyped_storage().nbytes():
                _free(p)
                held -= p.numel() * p.element_size()
        self._unshard()
        if self.rank in new:
            self._own(new)
            self._install_hooks()
        return peak, received

    def _unshard(self) -> None:
        """Every parameter is held here now: no owners, no hooks."""
        self.ranks, self.owner, self._group = None, [], None
        self._remove_hooks()

    def digest(self, names: list[str]) -> str | None:
        """`digest.weights_digest` of the whole model, computed on the group's first rank as
        the owners broadcast their parameters (collective; the others return None)."""
        h = hashlib.sha256()
        first = self.ranks is None or self.rank == self.ranks[0]

        def add(i: int, p: torch.Tensor) -> None:
            if first:
                h.update(names[i].encode())
                h.update(p.cpu().contiguous().view(-1).view(torch.uint8).clone().numpy().tobytes())
        self.gather_all(keep=False, on_each=add)
        return h.hexdigest() if first else None

    # ---- one round of lockstep forward/backward ------------------------------------------------
    def begin_round(self, ranks: list[int], index: int | None) -> None:
        """Every train device's micro-batch index of this round (a small all-gather), then the
        hooks gather, free and send (`take` is the trainer's gradient consumer)."""
        self.shard_over(ranks)
        mine = torch.tensor([-1.0 if index is None else float(index)], device=self.device)
        pieces = [torch.empty_like(mine) for _ in self.ranks]
        dist.all_gather(pieces, mine, group=self.group)
        self.leaves = [int(p.item()) for p in pieces]
        self._active = True

    def end_round(self) -> None:
        """Free whatever the backward left gathered (a tied weight's second use); the same on every
        device, as every device ran the same modules."""
        self._release(range(len(self.params)))
        self._active = False

    def summed(self, m: int, first: int, end: int) -> list[torch.Tensor]:
        """This owner's parameters [first, end): each one's gradient summed over the mini-batch's m
        micro-batches (bitwise: in the fixed tree order), shaped; cleared for the next update."""
        out = []
        for i in range(first, end):
            p = self.params[i]
            acc = self.sums.pop(i, None)
            if acc is None:  # no micro-batch gave it a gradient (as the flat buffer's zeros)
                out.append(torch.zeros(p.shape, dtype=torch.float32, device=self.device))
                continue
            if self.bitwise:
                if acc.leaves != set(range(m)):
                    raise RuntimeError(f"device {self.rank}: parameter {i} has gradients of micro-batches "
                                       f"{sorted(acc.leaves)}, expected 0..{m - 1}")
                acc = combine(acc.nodes(m), m, torch.add)
            out.append(acc.view(p.shape))
        if self.sums:
            raise RuntimeError(f"device {self.rank}: gradients of parameters {sorted(self.sums)} it does not own")
        return out

    # ---- hooks ----------------------------------------------------------------------------------
    def _install_hooks(self) -> None:
        if self._hooks:
            return
        index = {id(p): i for i, p in enumerate(self.params)}
        for module in self.trainer.model.modules():
            ids = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if not ids:
                continue
            self._hooks += [module.register_forward_pre_hook(lambda m, args, ids=ids: self._gather(ids)),
                            module.register_forward_hook(lambda m, args, out, ids=ids: self._after_forward(ids, out))]

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _gather(self, ids: list[int]) -> None:
        if not self._active:
            return
        for i in ids:
            if not self.gathered[i]:
                self.weight_bytes += self._fetch(i)
                self.gathered[i] = True

    def _fetch(self, i: int) -> int:
        """Parameter i from its owner, by broadcast over the train group (collective); returns
        the bytes this device received."""
        p = self.params[i]
        owned = self.owns(i)
        if not owned:
            _allocate(p)
        dist.broadcast(p.data, src=self.owner[i], group=self.group)
        return 0 if owned else p.numel() * p.element_size()

    def _after_forward(self, ids: list[int], out) -> None:
        """Free the module's parameters; its output's gradient hook gathers them again for the
        module's backward. A tensor hook, not a module backward hook: those put identity nodes
        on the module's inputs, which changes the order autograd sums a shared input's gradients
        in (the bits of the q/k/v projections' input gradient)."""
        if not self._active:
            return
        if self._in_backward:  # gradient checkpointing's recompute: the backward needs them next
            return
        self._release(ids)
        if torch.is_tensor(out) and out.requires_grad:
            out.register_hook(lambda grad, ids=ids: self._gather(ids))
        elif not torch.is_tensor(out):
            raise RuntimeError(f"cluster.shard=full: a module with parameters returned {type(out).__name__}, not a "
                               "tensor; its backward would run without them")

    def _release(self, ids) -> None:
        if not self._active:
            return
        for i in ids:
            if self.gathered[i]:
                self.gathered[i] = False
                if not self.owns(i):
                    _free(self.params[i])

    # ---- the trainer's gradient consumer during a round -------------------------------------
    def begin_backward(self) -> None:
        self._in_backward = True

    def end_backward(self) -> None:
        self._in_backward = False

    def take(self, i: int, grad: torch.Tensor) -> None:
        """Parameter i's gradient of this round's micro-batch, to its owner (fp32, the reduction's
        dtype), point to point; the owner takes each device's in group order and folds it in at
        once (one arriving gradient held at a time, not W), keeping the real micro-batches' and
        dropping the stand-ins'."""
        owner, group = self.owner[i], self.group
        g = grad.detach().to(torch.float32).reshape(-1).contiguous()
        if owner != self.rank:
            self.comm.transport.send(g, owner, group)
        else:
            for position, leaf in enumerate(self.leaves):
                source = self.ranks[position]
                if source == self.rank:
                    piece = g.clone()  # its own: a buffer of its own, not autograd's gradient
                else:
                    piece = torch.empty_like(g)
                    self.comm.transport.recv(piece, source, group)
                if leaf < 0:
                    continue
                if source != self.rank:
                    self.received += 4 * g.numel()
                if self.bitwise:
                    self.sums.setdefault(i, TreeAccumulator(torch.add)).push(leaf, piece)
                else:
                    self.sums[i] = piece if i not in self.sums else self.sums[i].add_(piece)
                del piece
        self._release([i])


def _free(p: torch.Tensor) -> None:
    """Release a parameter's storage (its shape stays). NaN first: a read of the freed bytes (a
    backward that needs a weight the hooks did not gather again) would otherwise see the stale
    values, by luck, and pass unnoticed; this way the loss is NaN."""
    if not p.data.untyped_storage().resizable():  # its bytes were lent to numpy (a digest): a storage of its own
        p.data = torch.empty_like(p.data)
    p.data.fill_(float("nan"))
    p.data.untyped_storage().resize_(0)


def _allocate(p: torch.Tensor) -> None:
    storage = p.data.untyped_storage()
    if storage.nbytes() == 0:
        storage.resize_(p.numel() * p.element_size())
