"""Forward passes of an HF Llama/Qwen2 decoder against the engine's own slot KV cache.

The runner calls the model's own modules (embedding, norms, q/k/v/o projections, rotary
embedding, MLP, lm_head), so the math is the transformers math and the parameters keep their
HF names; only attention and the cache are ours. One call mixes decode rows (one new token for
each of several slots) and prefill segments (a whole prompt for one slot each): every token-wise
operation runs once over all tokens of the step flattened to [N, hidden], all new keys and
values go to the cache in one scatter per layer, and attention runs once for the decode rows
(over a view of the cache, masked per slot) and once for all prefill segments (padded to the
longest; a prefill always starts at position 0, so it attends to its own fresh keys). Mixing
prefill into the decode step keeps an admission from costing a whole extra forward
(Sarathi-style piggybacking).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from poise.errors import PoiseError
from poise.rollout.kv_cache import CacheShape, KVCache

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


@dataclass
class StepInputs:
    """What one forward computes.

    decode_*: one row per decoding slot, in increasing slot order, all within
    [attend_lo, attend_hi); the row's token is written to the cache at `decode_positions` and
    attends to positions [0, position] of its slot over cache positions [0, attend_len).
    prefills: (slot, tokens) pairs; tokens go to positions 0..L-1 of the slot.

    fixed_shape: decode runs over every slot of [attend_lo, attend_hi): a slot with no decode
    row gets a padding row (writes to the scratch row), and the logits keep one row per slot of
    the range. Batch-invariant tiles rely on this: the shapes depend on the range, never on which
    slots are live. Otherwise only the decode rows are computed (a padding row costs as much as a
    real one) and only attention spans the range.
    """

    decode_slots: list[int] = field(default_factory=list)
    decode_tokens: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    prefills: list[tuple[int, list[int]]] = field(default_factory=list)
    attend_lo: int = 0
    attend_hi: int = 0
    attend_len: int = 0
    fixed_shape: bool = False


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderRunner:
    """Runs `model` (a transformers LlamaForCausalLM / Qwen2ForCausalLM) over a `KVCache`."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise PoiseError(f"rollout engine supports model types {SUPPORTED_MODEL_TYPES}, got {model_type!r}; "
                             "load a Llama- or Qwen2-family checkpoint")
        layer_types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            raise PoiseError(f"model uses attention layer types {sorted(set(layer_types))}; the engine supports "
                             "full attention only (set use_sliding_window: false)")
        self.model = model
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.group = self.num_heads // self.num_kv_heads  # query heads per key/value head
        self.scale = first.scaling
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        self.dtype = model.lm_head.weight.dtype
        self.device = model.lm_head.weight.device

    def cache_shape(self, slots: int, context: int) -> CacheShape:
        return CacheShape(len(self.layers), slots, self.num_kv_heads, context, self.head_dim)

    def _ids(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def forward(self, step: StepInputs, cache: KVCache) -> torch.Tensor:
        """Logits [rows, vocab] (float32): the decode rows (with fixed_shape, one per slot of the
        attended range, padding included), then each prefill's last token."""
        n_attend = step.attend_hi - step.attend_lo
        compact = not step.fixed_shape and len(step.decode_slots) < n_attend
        if step.fixed_shape:
            tokens, positions, slots = self._dense_decode_rows(step, cache.scratch)
        else:
            tokens, positions, slots = list(step.decode_tokens), list(step.decode_positions), list(step.decode_slots)
        n_decode = len(tokens)
        seg_lengths = [len(seg) for _, seg in step.prefills]
        for (slot, seg), length in zip(step.prefills, seg_lengths):
            tokens.extend(seg)
            positions.extend(range(length))
            slots.extend([slot] * length)
        n = len(tokens)
        # one host->device transfer for all per-token indices
        token_ids, position_ids, slot_ids = self._ids(tokens + positions + slots).view(3, n)

        x = self.decoder.embed_tokens(token_ids)
        cos, sin = self.decoder.rotary_emb(x, position_ids[None])  # [1, N, head_dim], HF's rope variants
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        rel = gather = None
        if n_decode:
            attend_pos = position_ids[:n_decode]
            if compact and 2 * n_decode <= n_attend:
                # few live rows spread over the range (the drain tail): copy just their cache rows
                # rather than attend over every idle slot between them
                gather = slot_ids[:n_decode]
            elif compact:  # decode rows -> their slots' offsets in the attended range
                rel = slot_ids[:n_decode] - step.attend_lo
                attend_pos = attend_pos.new_zeros(n_attend).index_copy_(0, rel, attend_pos)
            key_pos = torch.arange(step.attend_len, device=self.device)
            # [slots, 1, 1, keys]: a slot attends to its own positions 0..current (idle slots: 0)
            decode_mask = (key_pos[None, :] <= attend_pos[:, None])[:, None, None, :]
        prefill = self._prefill_plan(seg_lengths) if len(seg_lengths) > 1 else None

        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(n, self.num_heads, self.head_dim)
            k = attn.k_proj(h).view(n, self.num_kv_heads, self.head_dim)
            v = attn.v_proj(h).view(n, self.num_kv_heads, self.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            cache.write_tokens(index, slot_ids, position_ids, k, v)  # every new token, one scatter

            parts = []
            if n_decode:
                parts.append(self._decode_attention(q[:n_decode], cache, index, step, decode_mask, rel, gather))
            if seg_lengths:
                parts.append(self._prefill_attention(q[n_decode:], k[n_decode:], v[n_decode:], seg_lengths, prefill))
            attn_out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            x = x + attn.o_proj(attn_out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))

        if seg_lengths:
            rows, end = list(range(n_decode)), n_decode
            for length in seg_lengths:
                end += length
                rows.append(end - 1)
            x = x.index_select(0, self._ids(rows))
        return self.model.lm_head(self.decoder.norm(x)).float()

    def _dense_decode_rows(self, step: StepInputs, scratch: int) -> tuple[list[int], list[int], list[int]]:
        """(tokens, positions, write slots), one row for every attended slot."""
        n_attend = step.attend_hi - step.attend_lo
        if len(step.decode_slots) == n_attend:  # every attended slot decodes: no padding
            return list(step.decode_tokens), list(step.decode_positions), list(step.decode_slots)
        tokens, positions, slots = [0] * n_attend, [0] * n_attend, [scratch] * n_attend
        for slot, token, position in zip(step.decode_slots, step.decode_tokens, step.decode_positions):
            row = slot - step.attend_lo
            tokens[row], positions[row], slots[row] = token, position, slot
        return tokens, positions, slots

    def _decode_attention(self, q: torch.Tensor, cache: KVCache, layer: int, step: StepInputs,
                          mask: torch.Tensor, rel: torch.Tensor | None, gather: torch.Tensor | None) -> torch.Tensor:
        """q: [decode rows, heads, head_dim] -> [decode rows, heads * head_dim].

        mask: [attended slots (gather: decode rows), 1, 1, attend_len] bool, True where a row may
        attend. rel: [decode rows] offsets of their slots in the range (q is scattered into it), or
        None. gather: [decode rows] their slots, whose cache rows are copied out, or None.
        """
        if gather is not None:
            rows = q.shape[0]
            keys = cache.keys[layer][:, :, :step.attend_len].index_select(0, gather)
            values = cache.values[layer][:, :, :step.attend_len].index_select(0, gather)
            q = q.view(rows, self.num_kv_heads, self.group, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
            return out.reshape(rows, self.num_heads * self.head_dim)
        n_attend = step.attend_hi - step.attend_lo
        if rel is not None:
            q = q.new_zeros((n_attend, self.num_heads, self.head_dim)).index_copy_(0, rel, q)
        # GQA without copying the cache: the `group` query heads that share a key/value head become
        # `group` query rows against it (HF's repeat_kv maps head h to kv head h // group).
        q = q.view(n_attend, self.num_kv_heads, self.group, self.head_dim)
        keys = cache.keys[layer][step.attend_lo:step.attend_hi, :, :step.attend_len]
        values = cache.values[layer][step.attend_lo:step.attend_hi, :, :step.attend_len]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        out = out.reshape(n_attend, self.num_heads * self.head_dim)
        return out if rel is None else out.index_select(0, rel)

    def _prefill_plan(self, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padding several prompts to one [segments, L_max] batch: (gather, scatter-back, mask)."""
        width = max(lengths)
        gather, back, offset = [], [], 0
        for i, length in enumerate(lengths):
            # padded positions re-read the segment's first token: harmless, their outputs are dropped
            gather.extend(offset + min(j, length - 1) for j in range(width))
            back.extend(i * width + j for j in range(length))
            offset += length
        index = self._ids(gather + back)
        pos = torch.arange(width, device=self.device)
        valid = pos[None, :] < torch.tensor(lengths, device=self.device)[:, None]  # [segments, keys]
        mask = (pos[None, :, None] >= pos[None, None, :]) & valid[:, None, :]  # causal & real keys
        return index[: len(gather)], index[len(gather):], mask[:, None]

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                           plan: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Causal self-attention of each prompt alone (prompts start at position 0).

        q: [T, heads, d]; k, v: [T, kv_heads, d], the prompts concatenated -> [T, heads * d].
        """
        if plan is None:  # one prompt: no padding
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                 v.transpose(0, 1)[None], is_causal=True, scale=self.scale,
                                                 enable_gqa=self.group > 1)
            return out[0].transpose(0, 1).reshape(q.shape[0], self.num_heads * self.head_dim)
        gather, back, mask = plan
        segments, width = len(lengths), max(lengths)

        def padded(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, gather).view(segments, width, t.shape[1], self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), attn_mask=mask, scale=self.scale,
                                             enable_gqa=self.group > 1)
        out = out.transpose(1, 2).reshape(segments * width, self.num_heads * self.head_dim)
        return out.index_select(0, back)
