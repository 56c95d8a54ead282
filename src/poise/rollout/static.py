"""A plain static-batch generator: the colocated loop's interim rollout.

Prefills every request of a batch together (left-padded) and decodes with the HF KV cache
until all finish. Correct and deterministic for a given batch, but not batch-invariant and it
waits for its longest sequence — exactly what the continuous-batching engine removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from poise.rollout.sampling import SamplingConfig, sample_next


@dataclass
class GeneratedSample:
    sample_id: tuple[int, int, int]
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    weights_version: int = 0


@torch.no_grad()
def generate_static(model: torch.nn.Module, requests: list[tuple[tuple[int, int, int], list[int]]],
                    sampling: SamplingConfig, seed: int, eos_id: int, pad_id: int,
                    weights_version: int = 0) -> list[GeneratedSample]:
    from transformers import DynamicCache

    model.eval()
    n = len(requests)
    longest = max(len(p) for _, p in requests)
    ids = torch.full((n, longest), pad_id, dtype=torch.long)
    attn = torch.zeros((n, longest), dtype=torch.long)
    for b, (_, prompt) in enumerate(requests):
        ids[b, longest - len(prompt):] = torch.tensor(prompt)
        attn[b, longest - len(prompt):] = 1
    sample_ids = torch.tensor([list(sid) for sid, _ in requests], dtype=torch.long)
    out = [GeneratedSample(tuple(sid), list(p), weights_version=weights_version) for sid, p in requests]
    done = torch.zeros(n, dtype=torch.bool)
    cache = DynamicCache()
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, cache=cache,
                   use_cache=True).logits[:, -1]
    for t in range(sampling.max_new_tokens):
        tokens, logps = sample_next(logits, seed, sample_ids, torch.full((n,), t, dtype=torch.long), sampling)
        for b in range(n):
            if done[b]:
                continue
            tok = int(tokens[b])
            out[b].token_ids.append(tok)  # EOS included: the policy must learn to stop
            out[b].logprobs.append(float(logps[b]))
            if tok == eos_id:
                out[b].finish_reason = "eos"
                done[b] = True
        if bool(done.all()):
            break
        tokens = torch.where(done, torch.full_like(tokens, pad_id), tokens)
        attn = torch.cat([attn, (~done).long()[:, None]], dim=1)
        positions = positions[:, -1:] + 1
        logits = model(input_ids=tokens[:, None], attention_mask=attn, position_ids=positions,
                       cache=cache, use_cache=True).logits[:, -1]
    return out
