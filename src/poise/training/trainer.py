"""The policy trainer: canonical micro-batches, per-micro-batch gradients, one exact update.

The step plan (poise.policy.plan) cuts a step's samples, in sample-id order, into mini-batches
and micro-batches of `micro_batch_size` (never by arrival order, invariant 3). Each
micro-batch's gradient of its *summed* loss is computed on its own and folded into the
fixed-order tree as it comes (train/reduce.py `TreeAccumulator`: about log2(M) + 1 gradients
held, not M); a mini-batch's gradient is the tree's root divided once by the plan's normaliser,
so the update does not depend on how micro-batches were spread over devices or when they arrived.

A micro-batch runs as one packed forward: its sequences share rows by `pack_rows`
(a function of their lengths in sample-id order, so still canonical), positions restart per
sequence so attention stays within it, and the output head runs only where a response token is
predicted. No padding between sequences, no per-sample tensor work, one forward per micro-batch
(plus the reference's when kl_coef > 0). The old log-probs come with the samples
(`old_logprobs: rollout`) or are that forward's own, detached (`recompute`: see micro_batch_grad).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
from torch.optim.adam import adam

from poise.algo.corrections import Correction, correction_weights
from poise.algo.losses import policy_loss, token_entropy
from poise.config import AlgorithmConfig
from poise.policy.mismatch import LOG_RATIO_BINS, MAGNITUDE_BINS, MAGNITUDE_EDGES, ZERO_BIN, MismatchStats
from poise.policy.plan import MicroStats, loss_normaliser, mini_of_prompt, pack_rows, plan_step, step_stats
from poise.rollout.sampling import tempered
from poise.training.reduce import TreeAccumulator, combine


class SampleLike(Protocol):
    sample_id: tuple[int, int, int]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-probs from the rollout engine (the PPO "old" ones with old_logprobs rollout)
    loss_mask: tuple[int, ...] | None  # an episode's: 1 on model tokens, 0 on observation tokens (types.Sample)


def loss_mask(sample: SampleLike) -> tuple[int, ...] | list[int]:
    mask = getattr(sample, "loss_mask", None)  # a single answer (or a stand-in without the field): all 1
    return mask if mask is not None else [1] * len(sample.token_ids)


def trained_tokens(sample: SampleLike) -> int:
    """The tokens the loss trains on and the normaliser counts (types.trained_tokens, for any SampleLike)."""
    mask = getattr(sample, "loss_mask", None)
    return len(sample.token_ids) if mask is None else sum(mask)


class GradientConsumer(Protocol):
    """Takes a micro-batch's gradient parameter by parameter as the backward produces it, in place
    of the trainer's flat buffer (a fully sharded state sends each to its owner:
    training/state/parameter_shards.py). Given per call to `micro_batch_grad`, never set on the
    trainer."""

    def begin_backward(self) -> None:
        """The backward starts: a forward from here on is gradient checkpointing's recompute."""
        ...

    def take(self, index: int, grad: torch.Tensor) -> None:
        """Parameter `index`'s gradient (of `PolicyTrainer.params`), valid during the call only."""
        ...

    def end_backward(self) -> None: ...


@dataclass
class MicroBatchResult:
    index: int
    flat_grad: torch.Tensor  # [P] float32: every trainable parameter's gradient, in named_parameters order
    normaliser: float
    loss_sum: float
    clipped_tokens: int
    kl_sum: float
    tokens: int
    shapes: tuple[torch.Size, ...] = ()  # of the parameters, to view flat_grad per parameter
    entropy_sum: float = 0.0  # summed policy entropy over the response tokens (a metric)
    mismatch: MismatchStats = MismatchStats()  # the rollout/trainer log-prob mismatch (a metric)
    clipped_responses: int = 0  # responses with a clipped token
    responses: int = 0

    @property
    def grads(self) -> list[torch.Tensor]:
        """flat_grad as one view per parameter."""
        return param_views(self.flat_grad, self.shapes)

    def stats(self) -> MicroStats:
        return MicroStats(self.loss_sum, self.normaliser, self.clipped_tokens, self.kl_sum, self.tokens,
                          self.entropy_sum, self.mismatch, self.clipped_responses, self.responses)


@dataclass
class PackedBatch:
    """One micro-batch packed into rows for a single forward (policy/plan.py `pack_rows`).

    R rows of C = the longest sequence's tokens; N response tokens over B samples, T the
    longest response. Each sequence's positions restart at 0, which makes HF attention mask
    every sequence off from its row neighbours (and from the row's trailing filler).
    """

    input_ids: torch.Tensor  # [R, C] long
    position_ids: torch.Tensor  # [R, C] long
    predict_at: torch.Tensor  # [N] long: flat index into R * C of the position predicting each response token
    targets: torch.Tensor  # [N] long: the response tokens, sample by sample
    old_logprobs: torch.Tensor  # [N] float32: their behaviour log-probs
    scatter_at: torch.Tensor  # [N] long: flat index into B * T where each response token's value goes
    mask: torch.Tensor  # [B, T] float32: 1 on the response tokens that train (an episode's observations: 0)
    rows: int  # R: padded token positions are R * C, against B * C unpacked


def pack_batch(samples: Sequence[SampleLike], pad_id: int) -> PackedBatch:
    """The packed tensors of one micro-batch (samples in sample-id order), built from flat lists:
    one tensor per field, no per-sample tensor work."""
    prompt_lens = [len(s.prompt_ids) for s in samples]
    resp_lens = [len(s.token_ids) for s in samples]
    lengths = [p + n for p, n in zip(prompt_lens, resp_lens)]
    rows = pack_rows(lengths)
    capacity = max(lengths)
    start = [0] * len(samples)  # where each sequence starts in the flat [R * C] layout
    ids: list[int] = []
    positions: list[int] = []
    for r, row in enumerate(rows):
        at = r * capacity
        for b in row:
            start[b] = at
            s = samples[b]
            ids += s.prompt_ids
            ids += s.token_ids
            at += lengths[b]
        filler = (r + 1) * capacity - at
        ids += [pad_id] * filler
        positions += [i for b in row for i in range(lengths[b])] + list(range(filler))
    b_count, t_max = len(samples), max(1, max(resp_lens))
    n_resp = torch.tensor(resp_lens, dtype=torch.long)
    first = torch.cumsum(n_resp, 0) - n_resp  # each sample's first token in the flat [N] order
    sample_of = torch.repeat_interleave(torch.arange(b_count), n_resp)  # [N]
    column = torch.arange(int(n_resp.sum())) - first[sample_of]  # [N]: token index within its response
    # token t of sample b is predicted at position prompt_b - 1 + t of its sequence
    predict_at = (torch.tensor(start) + torch.tensor(prompt_lens) - 1)[sample_of] + column
    mask = torch.zeros(b_count * t_max, dtype=torch.float32)
    scatter_at = sample_of * t_max + column
    if any(getattr(s, "loss_mask", None) is not None for s in samples):  # episodes: observation tokens stay 0
        mask[scatter_at] = torch.tensor([m for s in samples for m in loss_mask(s)], dtype=torch.float32)
    else:
        mask[scatter_at] = 1.0
    return PackedBatch(
        input_ids=torch.tensor(ids, dtype=torch.long).view(len(rows), capacity),
        position_ids=torch.tensor(positions, dtype=torch.long).view(len(rows), capacity),
        predict_at=predict_at,
        targets=torch.tensor([t for s in samples for t in s.token_ids], dtype=torch.long),
        old_logprobs=torch.tensor([x for s in samples for x in s.logprobs], dtype=torch.float32),
        scatter_at=scatter_at, mask=mask.view(b_count, t_max), rows=len(rows))


def packed_logits(model: torch.nn.Module, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """Tempered logits [N, V] predicting each response token, from one forward over the packed
    rows. The output head runs on the N predicting positions only, not on every row position
    (prompts and filler need no logits)."""
    device = next(model.parameters()).device
    hidden = model.get_decoder()(input_ids=batch.input_ids.to(device), position_ids=batch.position_ids.to(device),
                                 use_cache=False).last_hidden_state
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.predict_at.to(device))
    return tempered(model.get_output_embeddings()(picked).float(), temperature)


def token_logprobs(logits: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Log-probs [N] of the response tokens under `packed_logits`' logits [N, V]."""
    return torch.log_softmax(logits, dim=-1).gather(-1, batch.targets.to(logits.device)[:, None]).squeeze(-1)


def packed_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """Log-probs [N] of each response token under `model` at `temperature` (one packed forward)."""
    return token_logprobs(packed_logits(model, batch, temperature), batch)


def unflatten(flat: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """[N] per-token values as the [B, T] response layout of algo/losses.py (0 past each response)."""
    out = torch.zeros(batch.mask.numel(), dtype=flat.dtype, device=flat.device)
    return out.index_put((batch.scatter_at.to(flat.device),), flat).view_as(batch.mask)


def log_ratio_histogram(log_ratio: torch.Tensor) -> tuple[int, ...]:
    """Counts of `log_ratio` [N] in the fixed grid of policy/mismatch.py (LOG_RATIO_BINS bins: the
    negative magnitudes from the largest down, the zero bin, the positive magnitudes upwards)."""
    log_ratio = torch.nan_to_num(log_ratio.detach(), nan=0.0)  # a NaN log-prob shows in the loss, not here
    magnitude = log_ratio.double().abs()
    edges = torch.tensor(MAGNITUDE_EDGES, dtype=torch.float64, device=magnitude.device)
    above = torch.bucketize(magnitude, edges, right=True)  # 0: below the first edge; k + 1: magnitude bin k
    offset = torch.clamp(above, max=MAGNITUDE_BINS)  # |d| >= the last edge counts in the top bin
    index = ZERO_BIN + torch.sign(log_ratio).long() * offset
    return tuple(torch.bincount(index.cpu(), minlength=LOG_RATIO_BINS).tolist())


def param_views(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """A flat [P] tensor as one view per parameter shape, in order."""
    views, offset = [], 0
    for shape in shapes:
        n = shape.numel()
        views.append(flat[offset:offset + n].view(shape))
        offset += n
    return views


def _trained(flat: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """[N] per response token -> the trained ones (an episode's observation tokens left out)."""
    on = batch.mask.view(-1)[batch.scatter_at] > 0
    return flat if bool(on.all()) else flat[on.to(flat.device)]


def mismatch_stats(log_ratio: torch.Tensor | None, correction: Correction | None, mask: torch.Tensor) -> MismatchStats:
    """One micro-batch's MismatchStats (policy/mismatch.py). log_ratio: [N] trainer logp at the
    step-start weights minus rollout logp of its response tokens, or None outside the step's first
    mini-batch; correction: the rollout_is preset's ([B, T] fields, algo/corrections.py), or None;
    mask: [B, T]."""
    measured = {}
    if log_ratio is not None and log_ratio.numel():
        magnitude = log_ratio.double().abs()
        measured = {"tokens": log_ratio.numel(), "abs_sum": float(magnitude.sum()), "abs_max": float(magnitude.max()),
                    "hist": log_ratio_histogram(log_ratio)}
    if correction is None:
        return MismatchStats(**measured)
    on = mask.bool()
    weights = correction.weights.detach()[on]
    positive = weights > 0
    # a weight of 0 (masked) has no log: counted apart, below every bin of the log-weight histogram
    return MismatchStats(**measured, is_tokens=int(on.sum()), is_weight_sum=float(weights.double().sum()),
                         is_truncated=int((correction.truncated & on).sum()),
                         is_masked=int((correction.masked & on).sum()), is_zero=int((~positive).sum()),
                         is_weight_max=float(weights.max()) if weights.numel() else 0.0,
                         is_hist=log_ratio_histogram(torch.log(weights[positive].double())))


class PolicyTrainer:
    """Holds the policy, the optional frozen reference, and the AdamW optimizer.

    A micro-batch's gradient lands in one flat buffer parameter by parameter as the backward pass
    produces it (a post-accumulate-grad hook copies it and frees it): the backward never holds a
    per-parameter gradient list beside the flat copy the reduction needs.
    """

    def __init__(self, model: torch.nn.Module, cfg: AlgorithmConfig, pad_id: int,
                 ref_model: torch.nn.Module | Callable[[], torch.nn.Module] | None = None):
        """`ref_model`: the frozen reference (kl_coef > 0), or a function that builds it at the first
        micro-batch that needs it: a device that never trains never holds one."""
        self.model = model
        self.cfg = cfg
        self.pad_id = pad_id
        built = isinstance(ref_model, torch.nn.Module)
        self._ref = ref_model if built else None
        self._ref_factory = None if built else ref_model
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        if cfg.gradient_checkpointing:
            # non-reentrant: recomputes each layer with the same kernels in the backward pass (same bits)
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shapes = tuple(p.shape for p in self.params)
        self.numel = sum(p.numel() for p in self.params)
        self._grad_target: torch.Tensor | None = None  # the flat buffer of the backward in progress
        self._consumer: GradientConsumer | None = None  # or the backward's consumer, which takes each gradient
        offset = 0
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._flat_hook(i, offset))
            offset += p.numel()
        # foreach=False: one fixed per-parameter update order on every device.
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           foreach=False)
        # model.dtype below float32 (bfloat16): the parameters are the compute weights; each one's
        # fp32 master copy lives in its optimizer state beside the moments (`master`), made from the
        # compute weights at its first update, so it moves, reshards and checkpoints with them
        self.mixed = self.params[0].dtype != torch.float32
        self.updates = 0  # updates this trainer took: a multiple of updates_per_step between two steps
        self._step_start: torch.nn.Module | None = None  # old_logprobs recompute, updates_per_step > 1
        self._step_start_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def fresh_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """Zeroed optimizer state of parameter `p`, to receive a transfer into (fp32 moments, and
        the fp32 master in mixed precision)."""
        state = {"step": torch.zeros((), dtype=torch.float32),
                 "exp_avg": torch.zeros(p.shape, dtype=torch.float32, device=p.device),
                 "exp_avg_sq": torch.zeros(p.shape, dtype=torch.float32, device=p.device)}
        if self.mixed:
            state["master"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        return state

    def state_fields(self) -> tuple[str, ...]:
        """The tensor fields of a parameter's optimizer state besides `step`, in transfer order."""
        return ("exp_avg", "exp_avg_sq", "master") if self.mixed else ("exp_avg", "exp_avg_sq")

    @property
    def ref_model(self) -> torch.nn.Module | None:
        if self._ref is None and self._ref_factory is not None:
            self._ref = self._ref_factory()
        return self._ref

    def release_reference(self) -> None:
        """Free a reference model built on demand and the step-start copy (a device leaving the
        trainer); the next micro-batch or update that needs one builds it again."""
        if self._ref_factory is not None:
            self._ref = None
        self._step_start, self._step_start_pairs = None, []

    def _keep_step_start(self) -> None:
        """`old_logprobs: recompute` with several updates a step: before the step's first update,
        copy the weights it starts from, whose log-probs the later mini-batches' ratios need (their
        micro-batches train after that update). A copy of the module made once (frozen weights are
        never copied again: LoRA's base), then its trained parameters refreshed each step."""
        if self._step_start is None:
            import copy

            self._step_start = copy.deepcopy(self.model).requires_grad_(False).eval()
            copies = dict(self._step_start.named_parameters())
            self._step_start_pairs = [(copies[name], p) for name, p in self.model.named_parameters() if p.requires_grad]
            return
        with torch.no_grad():
            for copy_, p in self._step_start_pairs:
                copy_.copy_(p)

    def micro_batch_grad(self, index: int, samples: Sequence[SampleLike], advantages: torch.Tensor,
                         consumer: GradientConsumer | None = None) -> MicroBatchResult:
        """Gradient of the summed policy loss (algo/losses.py `policy_loss`, knobs from the
        algorithm config) of one micro-batch. advantages: [B] float32. `consumer`: takes each
        parameter's gradient as the backward produces it; the result's flat gradient is then empty."""
        self.model.train()
        device = self.params[0].device
        advantages = advantages.to(device)
        temperature = self.cfg.sampling.temperature
        batch = pack_batch(samples, self.pad_id)  # one forward per micro-batch, no padding between sequences
        logits = packed_logits(self.model, batch, temperature)
        flat_logp = token_logprobs(logits, batch)
        logp = unflatten(flat_logp, batch)
        mask = batch.mask.to(device)
        if self.cfg.entropy_coef > 0:
            entropy = unflatten(token_entropy(logits), batch)
            entropy_sum = float((entropy.detach() * mask).sum())
        else:  # the metric alone: no graph kept for it
            entropy = None
            with torch.no_grad():
                entropy_sum = float((unflatten(token_entropy(logits.detach()), batch) * mask).sum())
        ref = None
        if self.cfg.kl_coef > 0:
            with torch.no_grad():
                ref = unflatten(packed_logprobs(self.ref_model, batch, temperature), batch)
        c = self.cfg
        behaviour = unflatten(batch.old_logprobs.to(device), batch)
        # the step's first mini-batch trains at the step-start weights (the plan gives each update whole
        # prompt groups in prompt order; a train device reads the mini-batch off the sample ids)
        first = mini_of_prompt(samples[0].sample_id[1], c.prompts_per_step, c.updates_per_step) == 0
        if c.old_logprobs == "rollout":
            # the behaviour policy that sampled the tokens (its log-probs come with the sample): exact
            # for async staleness 1 and for several updates per step where engine and trainer agree
            old = behaviour
        elif first:
            # the trainer's log-probs at the step-start weights, which this forward is: its own, detached,
            # so the first update's ratio is exactly 1. Departure from verl, which runs a separate forward.
            old = logp.detach()
        else:  # a later mini-batch: the step-start weights' copy, taken before the step's first update
            if self._step_start is None:
                raise RuntimeError(f"old_logprobs recompute: micro-batch {index} of a later mini-batch came before "
                                   "this device took the step's first update (no step-start weights here)")
            with torch.no_grad():
                old = unflatten(packed_logprobs(self._step_start, batch, temperature), batch)
        correction = None
        if c.rollout_is != "none":
            correction = correction_weights(old, behaviour, mask, c.rollout_is, cap=c.rollout_is_cap,
                                            low=c.rollout_is_low, high=c.rollout_is_high)
        loss = policy_loss(logp, old, advantages, mask, clip_eps_low=c.clip_eps_low, clip_eps_high=c.clip_eps_high,
                           ratio_level=c.ratio_level, agg=c.loss_agg, max_response=c.sampling.max_new_tokens,
                           kl_coef=c.kl_coef, kl_estimator=c.kl_estimator, ref_logprobs=ref,
                           entropy_coef=c.entropy_coef, entropy=entropy,
                           is_weights=None if correction is None else correction.weights)
        mismatch = mismatch_stats(_trained(flat_logp.detach() - batch.old_logprobs.to(device), batch) if first else None,
                                  correction, mask)
        # a parameter without gradient: 0 (consumed, none is made: its owner sums what arrives)
        flat = torch.zeros(0 if consumer is not None else self.numel, dtype=torch.float32, device=device)
        for p in self.params:
            p.grad = None  # the hook must see this backward's gradient alone
        self._grad_target, self._consumer = flat, consumer
        if consumer is not None:
            consumer.begin_backward()
        try:
            loss.total.backward()
        finally:
            self._grad_target, self._consumer = None, None
            if consumer is not None:
                consumer.end_backward()
        return MicroBatchResult(index, flat, loss.normaliser, float(loss.total.detach()), loss.clipped_tokens,
                                loss.kl_sum, int(mask.sum()), self.shapes, entropy_sum, mismatch,
                                loss.clipped_responses, len(samples))

    def _flat_hook(self, index: int, offset: int):
        def hook(p: torch.Tensor) -> None:
            if self._grad_target is None:
                return
            if self._consumer is not None:  # sharded parameters: to the owner at once
                self._consumer.take(index, p.grad)
            else:  # a backward of micro_batch_grad: move the gradient into the buffer
                self._grad_target[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            p.grad = None
        return hook

    def apply_update(self, summed_grads: list[torch.Tensor], normaliser: float, first: int = 0,
                     gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
        """Divide the tree-summed gradient by the step's normaliser, clip, and take one AdamW step.

        Returns the gradient norm before clipping. Sharded (`cluster.shard: optimizer`): the
        gradients are those of parameters `first`, `first + 1`, ... (this owner's run) and `gather`
        turns this owner's per-parameter norms into every parameter's, in order. The norm is then
        `clip_grad_norm_`'s own arithmetic (each tensor's norm, then the norm of their stack), so it
        has the unsharded bits; AdamW steps only the parameters given a gradient, so an owner holds
        and updates the state of its run alone.
        """
        c = self.cfg
        if c.old_logprobs == "recompute" and c.updates_per_step > 1 and self.updates % c.updates_per_step == 0:
            self._keep_step_start()  # every train device takes every update, so this is the step's first
        self.updates += 1
        params = self.params[first:first + len(summed_grads)]
        if self.mixed:
            return self._mixed_update(params, [g / normaliser for g in summed_grads], gather)
        for p, g in zip(params, summed_grads):
            p.grad = g / normaliser
        grads = [p.grad for p in params]
        if gather is None:
            if self.cfg.max_grad_norm > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm, foreach=False)
            else:
                norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        elif self.cfg.max_grad_norm > 0:
            norms = gather(torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]) if grads
                           else torch.zeros(0, device=self.params[0].device))
            norm = torch.linalg.vector_norm(norms, 2.0)  # = clip_grad_norm_'s vector_norm(stack(norms))
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, norm, foreach=False)
        else:
            squares = gather(torch.stack([(g.double() ** 2).sum() for g in grads]) if grads
                             else torch.zeros(0, dtype=torch.float64, device=self.params[0].device))
            norm = torch.sqrt(sum(squares.unbind()))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _mixed_update(self, params: list[torch.Tensor], grads: list[torch.Tensor],
                      gather: Callable[[torch.Tensor], torch.Tensor] | None) -> float:
        """Mixed precision: clip the fp32 gradients by their global norm (the arithmetic of the fp32
        path: each tensor's norm, the norm of their stack), step AdamW's own function on the fp32
        masters, and round them into the compute weights."""
        device = self.params[0].device
        norms = torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]) if grads \
            else torch.zeros(0, device=device)
        norms = gather(norms) if gather is not None else norms
        norm = torch.linalg.vector_norm(norms, 2.0)
        if self.cfg.max_grad_norm > 0:
            scale = torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0)
            for g in grads:
                g.mul_(scale)
        states = []
        for p in params:
            state = self.optimizer.state[p]
            if not state:  # the first update: the master starts as the compute weights, exactly
                state.update(self.fresh_state(p))
                state["master"].copy_(p.detach())
            states.append(state)
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        with torch.no_grad():
            adam([s["master"] for s in states], grads, [s["exp_avg"] for s in states],
                 [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states], foreach=False,
                 capturable=False, differentiable=False, fused=None, grad_scale=None, found_inf=None,
                 has_complex=False, decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                 lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
            for p, s in zip(params, states):
                p.copy_(s["master"])
        return float(norm)

    def train_step(self, samples: Sequence[SampleLike], advantages: dict[tuple[int, int, int], float]) -> dict:
        """One colocated step by its plan: per mini-batch, every micro-batch, tree sum, one update."""
        cfg = self.cfg
        plan = plan_step(samples[0].sample_id[0], cfg.prompts_per_step, cfg.group_size,
                         updates_per_step=cfg.updates_per_step, micro_batch_size=cfg.micro_batch_size)
        by_id = {tuple(s.sample_id): s for s in samples}
        if len(by_id) != len(samples) or by_id.keys() != set(plan.sample_ids):
            raise RuntimeError(f"step {plan.step}: got {len(samples)} samples ({len(by_id)} distinct ids) but the "
                               f"plan expects exactly {len(plan.sample_ids)} ids, (step, 0..{plan.prompts - 1}, "
                               f"0..{plan.group_size - 1})")
        results, norms = [], []
        for mini in plan.minis:
            m = len(mini.micro)
            tree = TreeAccumulator(torch.add)  # about log2(m) + 1 gradients held, never m
            for i, ids in enumerate(mini.micro):
                result = self.micro_batch_grad(i, [by_id[sid] for sid in ids],
                                               torch.tensor([advantages[sid] for sid in ids], dtype=torch.float32))
                tree.push(i, result.flat_grad, m)
                result.flat_grad = torch.empty(0)
                results.append(result)
            summed = param_views(combine(tree.nodes(m), m, torch.add), self.shapes)
            lengths = [[trained_tokens(by_id[sid]) for sid in ids] for ids in mini.micro]
            norms.append(self.apply_update(summed, loss_normaliser(lengths, cfg.loss_agg)))
        return step_stats([r.stats() for r in results], norms)
