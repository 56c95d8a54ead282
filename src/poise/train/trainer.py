"""The policy trainer: canonical micro-batches, per-micro-batch gradients, one exact update.

The step plan (poise.policy.plan) cuts a step's samples, in sample-id order, into mini-batches
and micro-batches of `micro_batch_size` (never by arrival order, invariant 3). Each
micro-batch's gradient of its *summed* loss is computed on its own; a mini-batch's gradient is
their fixed-order tree sum (train/reduce.py) divided once by the plan's normaliser, so the
update does not depend on how micro-batches were spread over devices or when they arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from poise.algo.losses import grpo_loss
from poise.config import AlgorithmConfig
from poise.policy.plan import MicroStats, loss_normaliser, plan_step, step_stats
from poise.train.reduce import tree_sum


class SampleLike(Protocol):
    sample_id: tuple[int, int, int]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-probs from the rollout engine (the "old" policy)


@dataclass
class MicroBatchResult:
    index: int
    grads: list[torch.Tensor]  # one per trainable parameter, in named_parameters order
    normaliser: float
    loss_sum: float
    clipped_tokens: int
    kl_sum: float
    tokens: int

    def stats(self) -> MicroStats:
        return MicroStats(self.loss_sum, self.normaliser, self.clipped_tokens, self.kl_sum, self.tokens)


def pad_batch(samples: Sequence[SampleLike], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [B, L] input ids and attention mask, and the [B, T] response mask.

    The response of row b occupies positions len(prompt_b) .. len(prompt_b) + len(resp_b) - 1;
    its tokens are predicted from the logits one position earlier.
    """
    lengths = [len(s.prompt_ids) + len(s.token_ids) for s in samples]
    longest = max(lengths)
    t_max = max(1, max(len(s.token_ids) for s in samples))
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), longest), dtype=torch.long)
    resp_mask = torch.zeros((len(samples), t_max), dtype=torch.float32)
    for b, s in enumerate(samples):
        seq = list(s.prompt_ids) + list(s.token_ids)
        ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, :len(seq)] = 1
        resp_mask[b, :len(s.token_ids)] = 1.0
    return ids, attn, resp_mask


def response_logprobs(model: torch.nn.Module, samples: Sequence[SampleLike], pad_id: int,
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each response token under `model` at `temperature`: ([B, T], mask [B, T])."""
    device = next(model.parameters()).device
    ids, attn, resp_mask = (t.to(device) for t in pad_batch(samples, pad_id))
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    t_max = resp_mask.shape[1]
    rows = []
    for b, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.token_ids)
        targets = torch.tensor(list(s.token_ids), dtype=torch.long, device=device)
        row = logp_all[b, p - 1:p - 1 + n].gather(-1, targets[:, None]).squeeze(-1)
        rows.append(torch.nn.functional.pad(row, (0, t_max - n)))
    out = torch.stack(rows)
    return out, resp_mask


class PolicyTrainer:
    """Holds the policy, the optional frozen reference, and the AdamW optimizer."""

    def __init__(self, model: torch.nn.Module, cfg: AlgorithmConfig, pad_id: int,
                 ref_model: torch.nn.Module | None = None):
        self.model = model
        self.cfg = cfg
        self.pad_id = pad_id
        self.ref_model = ref_model
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.params = [p for p in model.parameters() if p.requires_grad]
        # foreach=False: one fixed per-parameter update order on every device.
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           foreach=False)

    def micro_batch_grad(self, index: int, samples: Sequence[SampleLike],
                         advantages: torch.Tensor) -> MicroBatchResult:
        """Gradient of the summed GRPO loss of one micro-batch. advantages: [B] float32."""
        self.model.train()
        advantages = advantages.to(self.params[0].device)
        temperature = self.cfg.sampling.temperature
        logp, mask = response_logprobs(self.model, samples, self.pad_id, temperature)
        ref = None
        if self.cfg.kl_coef > 0:
            with torch.no_grad():
                ref, _ = response_logprobs(self.ref_model, samples, self.pad_id, temperature)
        # The old policy is the behaviour policy that sampled the tokens (its log-probs come with
        # the sample): exact for async staleness 1 and for several updates per step, without an
        # extra forward pass. Departure from verl, which recomputes them with the trainer.
        old = torch.zeros_like(logp)
        for b, s in enumerate(samples):
            old[b, :len(s.logprobs)] = torch.tensor(list(s.logprobs), dtype=torch.float32, device=old.device)
        loss = grpo_loss(logp, old, advantages, mask, self.cfg.clip_eps, self.cfg.kl_coef, ref,
                         self.cfg.loss_agg)
        grads = torch.autograd.grad(loss.total, self.params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.params)]
        return MicroBatchResult(index, grads, loss.normaliser, float(loss.total.detach()), loss.clipped_tokens,
                                loss.kl_sum, int(mask.sum()))

    def apply_update(self, summed_grads: list[torch.Tensor], normaliser: float) -> float:
        """Divide the tree-summed gradient by the step's normaliser, clip, and take one AdamW step.

        Returns the gradient norm before clipping.
        """
        for p, g in zip(self.params, summed_grads):
            p.grad = g / normaliser
        if self.cfg.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm, foreach=False)
        else:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.params))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
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
            batch = [self.micro_batch_grad(i, [by_id[sid] for sid in ids],
                                           torch.tensor([advantages[sid] for sid in ids], dtype=torch.float32))
                     for i, ids in enumerate(mini.micro)]
            summed = tree_sum([r.grads for r in batch], lambda a, b: [x + y for x, y in zip(a, b)])
            lengths = [[len(by_id[sid].token_ids) for sid in ids] for ids in mini.micro]
            norms.append(self.apply_update(summed, loss_normaliser(lengths, cfg.loss_agg)))
            results.extend(batch)
        return step_stats([r.stats() for r in results], norms)
