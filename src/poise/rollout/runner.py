"""Forward passes of an HF Llama/Qwen2/Qwen3/Mistral decoder against the engine's own slot KV cache.

The runner calls the model's own modules (embedding, norms, q/k/v/o projections, rotary
embedding, MLP, lm_head), so the math is the transformers math and the parameters keep their
HF names; only attention and the cache are ours. One call mixes decode rows (one new token for
each of several slots) and prefill segments (a whole prompt for one slot each): every token-wise
operation runs once over all tokens of the step flattened to [N, hidden], all new keys and
values go to the cache in one scatter per layer, and attention runs for the decode rows (over
the cache, masked per slot) and for the prefill segments (a prefill always starts at position 0,
so it attends to its own fresh keys: a few prompts one by one, many padded into one batch).
Mixing prefill into the decode step keeps an admission from costing a whole extra forward
(Sarathi-style piggybacking).

Decode attention is ragged in the fast path. Continuous batching on a long tail keeps a few long
sequences beside many short ones, and attending every row over the longest live context would
spend most of the attention on masked keys (torch has no varlen SDPA on CPU). So the rows are
sorted by context length and cut into a few groups (`plan_decode_groups`), each attending only
over its own longest context: a view of the cache where the group's slots are (nearly)
consecutive, else a copy of just its slots' rows, which costs far less than attending over them.
On CPU a decode group's attention is two batched matmuls and a softmax (`_attend`), not SDPA:
with a few queries per head the flash kernel cost 1.6-4x more at two threads.

Families differ only in what the runner calls: Qwen3 RMS-normalises each head's queries and keys
before RoPE (`q_norm`, `k_norm`); Mistral (and Qwen2/Qwen3 with every layer sliding) attends over
a sliding window: a query at position p sees keys p - window < k <= p, as HF's
`sliding_window_overlay`. The window is a mask over the same keys (shapes unchanged, so the
batch-invariant tiles stay fixed-shape); it saves no compute.

Batch-invariant rows (`StepInputs.row_quantum`, the engine's `batch_invariant` mode on CPU) keep
this one packed forward per step and fix, instead of shapes, every reduction order a row sees: the
token rows are padded to a multiple of the quantum in which the BLAS computes every row alike
(`DecoderRunner.row_quantum`), a decode row attends over `key_bucket(position)` keys whatever its
group, and prompts attend one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from poise.errors import PoiseError
from poise.rollout.decode_groups import (GROUP_OVERHEAD, MAX_DECODE_GROUPS, key_bucket, plan_bucket_groups,
                                         plan_decode_groups)
from poise.rollout.kv_cache import CacheShape, KVCache
from poise.rollout.transfer import to_device
from poise.model.files import check_model_type
from poise.model.lora import lora_parts

QK_NORM_MODEL_TYPES = ("qwen3",)  # per-head RMS norm of q and k, before RoPE


def sliding_window(config: object) -> int | None:
    """The attention window of every layer (None: full attention); refuses a mix of layer types."""
    if getattr(config, "model_type", None) == "mistral":  # every layer slides; Mistral ignores layer_types
        return getattr(config, "sliding_window", None)
    layer_types = set(getattr(config, "layer_types", None) or [])
    if layer_types <= {"full_attention"}:
        return None
    if layer_types == {"sliding_attention"}:
        return config.sliding_window
    raise PoiseError(f"model mixes attention layer types {sorted(layer_types)}; the engine runs one type for "
                     "all layers (in config.json set use_sliding_window: false, or max_window_layers: 0)")


@dataclass
class StepInputs:
    """What one forward computes.

    decode_*: one row per decoding slot, in increasing slot order; the row's token is written to
    the cache at `decode_positions` and attends to positions [0, position] of its slot.
    prefills: (slot, tokens) pairs; tokens go to positions 0..L-1 of the slot.

    fixed_shape: decode runs over every slot of [attend_lo, attend_hi), all slots within it: a
    slot with no decode row gets a padding row (writes to the scratch row), and the logits keep
    one row per slot of the range. A row at position p attends over the first
    `key_bucket(p, attend_len)` cache positions (masked beyond p): one attention call per bucket
    that the tile's rows fall in, each over the whole tile, whose rows of that bucket keep its
    result. Batch-invariant tiles rely on this: every shape a row meets is a function of the range
    and of its own position, never of which slots are live or where they are. Otherwise (the fast path) only the decode rows are computed and attention is ragged
    (see the module docstring); attend_* are then ignored.

    row_quantum > 0: batch-invariant rows (see `row_quantum`): every row-wise matmul runs over a
    multiple of this many rows (padding rows write to the scratch row), a decode row at position p
    attends over exactly `key_bucket(p)` keys, and each prompt attends alone, so no number a row
    gets depends on the other rows of the step.
    """

    decode_slots: list[int] = field(default_factory=list)
    decode_tokens: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    prefills: list[tuple[int, list[int]]] = field(default_factory=list)
    attend_lo: int = 0
    attend_hi: int = 0
    attend_len: int = 0
    fixed_shape: bool = False
    row_quantum: int = 0


# Up to this many prompts in one forward attend one by one (views, one SDPA each); more are
# padded into one batch. On CPU, padding 2-4 short prompts (three gathers, a mask, a scatter back)
# cost more than their separate calls.
PREFILL_ONE_BY_ONE = 4
# Row quanta tried by `DecoderRunner.row_quantum`, and the most rows its probe multiplies.
ROW_QUANTA = (4, 8, 16, 32)
PROBE_ROWS = 256
_row_quanta: dict[tuple, int] = {}  # probe results by (device, dtype, threads, matmul shapes)


@dataclass
class _DecodeGroup:
    """A DecodeGroupPlan as device tensors. rows: where the group's rows sit in q (None: all, in
    order); gather: their slots; rel: their offsets in [lo, hi); mask: [queries, 1, 1, length]."""

    length: int
    lo: int
    hi: int
    rows: torch.Tensor | None = None
    gather: torch.Tensor | None = None
    rel: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    keep: torch.Tensor | None = None  # fixed-shape tile: [tile, 1] bool, the rows that keep this group's result


def _rows_invariant(weights: list[torch.Tensor], rows: torch.Tensor, quantum: int) -> bool:
    """Whether every row of x @ w.T has the same bits in batches of 1..16 quanta at offsets 0, 1, 3
    (x: rows of `rows`) as in one batch of PROBE_ROWS."""
    for w in weights:
        x = rows[:, :w.shape[1]]
        reference = F.linear(x, w)
        for m in range(quantum, min(16 * quantum, PROBE_ROWS - quantum) + 1, quantum):
            for offset in (0, 1, 3):
                if not torch.equal(F.linear(x[offset:offset + m], w), reference[offset:offset + m]):
                    return False
    return True


# transformers' RMSNorm classes that compute exactly F.rms_norm in float32
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


class _Norm:
    """An RMSNorm module with its weight and epsilon looked up once."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.weight = module, module.weight
        self.eps = getattr(module, "variance_epsilon", None)


def _projection(module: torch.nn.Module) -> tuple:
    """(weight, bias, adapter) of a projection: adapter = (A [r, in], B [out, r], scaling) of a
    LoRA layer (peft's, train/lora.py; its weight and bias are the frozen base layer's), else None."""
    lora = lora_parts(module)
    base = module.base_layer if lora is not None else module
    return base.weight, base.bias, lora


def _linear(x: torch.Tensor, projection: tuple) -> torch.Tensor:
    """A projection of x [N, in]: W x + b, plus scaling * B (A x) under LoRA (peft's LoRA layer
    formula, adapter unmerged: the canonical form every device computes)."""
    weight, bias, lora = projection
    y = F.linear(x, weight, bias)
    if lora is None:
        return y
    a, b, scaling = lora
    return y + F.linear(F.linear(x, a), b) * scaling


def _function_of(module: torch.nn.Module):
    """The plain function a module's forward is, where it is exactly one (a module call costs ~5 us
    more than the op at decode sizes, four of them a step): SiLU, an Embedding without max_norm, a
    Linear; anything else (a LoRA wrapper, a kernel from the hub) stays the module."""
    kind = type(module)
    hf_silu = kind.__name__ == "SiLUActivation" and kind.forward.__qualname__ == "SiLUActivation.forward"
    if kind is torch.nn.SiLU or hf_silu:
        return F.silu
    if kind is torch.nn.Embedding and module.max_norm is None:
        return lambda ids: F.embedding(ids, module.weight)
    if kind is torch.nn.Linear:
        return lambda x: F.linear(x, module.weight, module.bias)
    return module


class _Layer:
    """A decoder layer's parameters, looked up once (a module attribute is a dict walk per
    access, ~80 of them per step): the Parameter objects themselves, which load_weights, the
    optimizer and Module.to update in place."""

    def __init__(self, layer: torch.nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        self.attn = attn
        self.norm_in, self.norm_post = _Norm(layer.input_layernorm), _Norm(layer.post_attention_layernorm)
        self.q, self.k, self.v, self.o = (_projection(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj,
                                                                   attn.o_proj))
        self.gate, self.up, self.down = (_projection(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act = _function_of(mlp.act_fn)


class DecoderRunner:
    """Runs `model` (a transformers Llama/Qwen2/Qwen3/Mistral ...ForCausalLM) over a `KVCache`."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        model_type = getattr(config, "model_type", None)
        check_model_type(model_type)
        self.window = sliding_window(config)
        self.qk_norm = model_type in QK_NORM_MODEL_TYPES
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
        self.group_overhead, self.max_decode_groups = GROUP_OVERHEAD, MAX_DECODE_GROUPS  # plan_decode_groups
        # HF's RMSNorm in float32 is F.rms_norm bit for bit (tests/rollout/test_runner.py), in one op
        norms = [m for layer in self.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
        self.fused_norm = self.dtype == torch.float32 and all(
            type(m).__name__ in RMS_NORMS for m in norms + [self.decoder.norm])
        self._layers = [_Layer(layer) for layer in self.layers]
        self._final_norm = _Norm(self.decoder.norm)
        self._embed, self._head = _function_of(self.decoder.embed_tokens), _function_of(model.lm_head)
        self.rope_table = self._rope_table()
        # made once, not per step: the key positions a decode mask compares, and its two bias values
        self._key_positions = torch.arange(self.max_positions, device=self.device)
        self._bias_values = (torch.zeros((), dtype=self.dtype, device=self.device),
                             torch.full((), float("-inf"), dtype=self.dtype, device=self.device))

    def _rope_table(self) -> torch.Tensor | None:
        """cos and sign-folded sin of every position ([max_positions, 2, head_dim]), from the model's
        own rotary embedding, once: a step looks its positions up (one lookup for both) instead of
        recomputing them. None for RoPE types whose frequencies change with the sequence length
        (dynamic, longrope)."""
        rotary = self.decoder.rotary_emb
        if any(kind in str(getattr(rotary, "rope_type", "default")) for kind in ("dynamic", "longrope")):
            return None
        with torch.no_grad():
            positions = torch.arange(self.max_positions, device=self.device)[None]
            cos, sin = rotary(torch.zeros((), dtype=self.dtype, device=self.device), positions)
        return torch.stack((cos[0], self._fold_sign(sin[0])), dim=1)

    def _fold_sign(self, sin: torch.Tensor) -> torch.Tensor:
        """HF rotates by q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1]; with the sign
        folded into sin, [q2, q1] * [-sin1, sin2] (a roll of q) gives the same bits: (-a) * b == -(a * b)."""
        half = self.head_dim // 2
        return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def _rope(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and folded sin of the step's tokens, [N, 1, head_dim]."""
        if self.rope_table is not None:
            both = self.rope_table.index_select(0, position_ids)
            return both[:, :1], both[:, 1:]
        cos, sin = self.decoder.rotary_emb(x, position_ids[None])  # [1, N, head_dim], HF's rope variants
        return cos[0][:, None, :], self._fold_sign(sin[0])[:, None, :]

    def _norm(self, norm: _Norm, x: torch.Tensor) -> torch.Tensor:
        if self.fused_norm:
            return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)
        return norm.module(x)

    @torch.inference_mode()
    def row_quantum(self) -> int:
        """Rows q such that this device's matmuls give a row the same bits in any batch of a
        multiple of q rows; 0 if no quantum in ROW_QUANTA does (then batch invariance needs
        fixed-shape tiles).

        Why it exists: a GEMM's bits for one row depend on the batch only through the kernel's
        choice of row blocking. MKL's sgemm (AVX2, 1 or 2 threads) computes every row of a
        multiple of 4 rows alike, but takes other kernels for 1-3 rows or for a thread's share of
        fewer than 4; cuBLAS picks kernels (and split-K) by M, so CUDA gets 0 without probing.
        The probe multiplies random rows by each of the model's distinct weight shapes, in
        batches of 1..16 quanta and at three row offsets, against one batch of PROBE_ROWS rows, at
        the current thread count. q is also a multiple of 64 / gcd(64, MLP width), so that
        element-wise kernels (SiLU's vector loop computes a non-multiple-of-its-width tail with
        the scalar formula, which differs in the last bit) never see a tail.
        """
        if self.device.type != "cpu":
            return 0
        linears = [module for module in self.layers[0].modules() if isinstance(module, torch.nn.Linear)]
        shapes = sorted({tuple(m.weight.shape) for m in linears + [self.model.lm_head]})
        key = (str(self.device), self.dtype, torch.get_num_threads(), tuple(shapes))
        if key not in _row_quanta:
            width = getattr(self.model.config, "intermediate_size", 64)
            tail = 64 // math.gcd(64, width)
            g = torch.Generator().manual_seed(0)
            weights = [torch.randn(shape, generator=g).to(self.dtype) for shape in shapes]
            rows = torch.randn((PROBE_ROWS, max(shape[1] for shape in shapes)), generator=g).to(self.dtype)
            _row_quanta[key] = next((q for q in (q * tail // math.gcd(q, tail) for q in ROW_QUANTA)
                                     if _rows_invariant(weights, rows, q)), 0)
        return _row_quanta[key]

    def cache_shape(self, slots: int, context: int) -> CacheShape:
        return CacheShape(len(self.layers), slots, self.num_kv_heads, context, self.head_dim)

    def _ids(self, values: list[int]) -> torch.Tensor:
        return to_device(values, self.device)  # no host sync (rollout/transfer.py)

    @torch.inference_mode()
    def forward(self, step: StepInputs, cache: KVCache) -> torch.Tensor:
        """Logits [rows, vocab] (float32): the decode rows (with fixed_shape, one per slot of the
        attended range, padding included), then each prefill's last token."""
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
        n_real = len(tokens)
        pad = -n_real % step.row_quantum if step.row_quantum else 0
        if pad:  # padding rows: token 0 at position 0 of the scratch row
            tokens.extend([0] * pad)
            positions.extend([0] * pad)
            slots.extend([cache.scratch] * pad)
        n = len(tokens)
        # one host->device transfer for all per-token indices
        token_ids, position_ids, slot_ids = self._ids(tokens + positions + slots).view(3, n)

        x = self._embed(token_ids)
        cos, sin = self._rope(x, position_ids)
        heads, half = self.num_heads, self.head_dim // 2
        groups = self._decode_groups(step, position_ids[:n_decode], cache.shape.context) if n_decode else []
        # a few prompts attend one by one (views, no copies); many at once pay for padding them
        # (not batch-invariant: the padded width depends on the other prompts)
        batched_prefill = len(seg_lengths) > PREFILL_ONE_BY_ONE and not step.row_quantum
        prefill = self._prefill_plan(seg_lengths) if batched_prefill else None

        for index, layer in enumerate(self._layers):
            h = self._norm(layer.norm_in, x)
            # the modules' own math, called as functions (a module call costs more than these ops)
            q = _linear(h, layer.q).view(n, heads, self.head_dim)
            k = _linear(h, layer.k).view(n, self.num_kv_heads, self.head_dim)
            v = _linear(h, layer.v).view(n, self.num_kv_heads, self.head_dim)
            if self.qk_norm:
                q, k = layer.attn.q_norm(q), layer.attn.k_norm(k)
            qk = torch.cat((q, k), dim=1)  # RoPE on queries and keys at once, elementwise as HF's
            qk = qk * cos + qk.roll(half, -1) * sin
            q, k = qk[:, :heads], qk[:, heads:]
            cache.write_tokens(index, slot_ids, position_ids, k, v)  # every new token, one scatter

            parts = []
            if n_decode:
                parts.append(self._decode_attention(q[:n_decode], cache, index, groups))
            if seg_lengths:
                real = slice(n_decode, n_real)
                parts.append(self._prefill_attention(q[real], k[real], v[real], seg_lengths, prefill))
            if pad:
                parts.append(q.new_zeros((pad, self.num_heads * self.head_dim)))
            attn_out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            x = x + _linear(attn_out, layer.o)
            h = self._norm(layer.norm_post, x)  # HF's gated MLP: down(act(gate(h)) * up(h))
            x = x + _linear(layer.act(_linear(h, layer.gate)) * _linear(h, layer.up), layer.down)

        rows, end = list(range(n_decode)), n_decode
        for length in seg_lengths:
            end += length
            rows.append(end - 1)
        out_rows = len(rows)
        if step.row_quantum:  # the head's matmul too runs over a multiple of the quantum
            rows.extend([0] * (-out_rows % step.row_quantum))
        if rows != list(range(n)):
            x = x.index_select(0, self._ids(rows))
        return self._head(self._norm(self._final_norm, x)).float()[:out_rows]

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

    def _decode_groups(self, step: StepInputs, positions: torch.Tensor, context: int) -> list[_DecodeGroup]:
        """How the decode rows attend this step (computed once, used by every layer).

        positions: [decode rows] int64 on the device (fixed shape: one row per slot of the range,
        padding rows at 0). context: the cache's positions per slot.
        """
        if step.fixed_shape:
            return self._tile_groups(step, positions)
        slots, pos = step.decode_slots, step.decode_positions
        invariant = step.row_quantum > 0  # always masked: one kernel path whatever the company
        if invariant:
            plans = plan_bucket_groups(slots, pos, context)
        else:
            plans = plan_decode_groups(slots, pos, self.group_overhead, self.max_decode_groups)
        if len(plans) == 1 and not plans[0].gather and plans[0].hi - plans[0].lo == len(slots):
            # the common case: consecutive slots in one group, no index to send
            plan = plans[0]
            lockstep = all(p == plan.length - 1 for p in pos) and not self._windowed(plan.length) and not invariant
            mask = None if lockstep else self._decode_mask(plan.length, positions)
            return [_DecodeGroup(plan.length, plan.lo, plan.hi, mask=mask)]
        reorder = len(plans) > 1
        # every index the groups need, in one host->device transfer
        flat: list[int] = []
        for plan in plans:
            if reorder:
                flat.extend(plan.rows)
            if plan.gather:
                flat.extend(slots[r] for r in plan.rows)
                flat.extend(pos[r] for r in plan.rows)
            elif plan.hi - plan.lo > len(plan.rows):  # idle slots inside the range attend key 0
                flat.extend(slots[r] - plan.lo for r in plan.rows)
                span = [0] * (plan.hi - plan.lo)
                for r in plan.rows:
                    span[slots[r] - plan.lo] = pos[r]
                flat.extend(span)
            else:
                flat.extend(pos[r] for r in plan.rows)
        ids = self._ids(flat)
        groups, offset = [], 0

        def take(count: int) -> torch.Tensor:
            nonlocal offset
            offset += count
            return ids[offset - count:offset]

        for plan in plans:
            n = len(plan.rows)
            rows = take(n) if reorder else None
            gather = take(n) if plan.gather else None
            rel = take(n) if not plan.gather and plan.hi - plan.lo > n else None
            group_pos = take(n if plan.gather else plan.hi - plan.lo)
            mask = None  # every query attends every key: lockstep rows need no mask
            if (invariant or any(pos[r] != plan.length - 1 for r in plan.rows) or rel is not None
                    or self._windowed(plan.length)):
                mask = self._decode_mask(plan.length, group_pos)
            groups.append(_DecodeGroup(plan.length, plan.lo, plan.hi, rows, gather, rel, mask))
        return groups

    def _tile_groups(self, step: StepInputs, positions: torch.Tensor) -> list[_DecodeGroup]:
        """A fixed-shape tile's decode attention: one group per key bucket of its live rows,
        longest first, each over the whole tile at the bucket's length, so attention reads the
        positions in use (bucketed) instead of the whole context, and no shape depends on which
        slots are live. The first group's result stands for every row, and each later group's
        replaces it on its own rows (`keep`); padding rows, in no bucket, keep what they get."""
        row_buckets = [key_bucket(p, step.attend_len) for p in step.decode_positions]
        lengths = sorted(set(row_buckets), reverse=True)
        keep = None
        if len(lengths) > 1:  # each row's bucket, by tile row (padding rows: 0, in no bucket)
            by_row = [0] * (step.attend_hi - step.attend_lo)
            for slot, length in zip(step.decode_slots, row_buckets):
                by_row[slot - step.attend_lo] = length
            keep = self._ids(by_row)[:, None]
        return [_DecodeGroup(length, step.attend_lo, step.attend_hi, mask=self._decode_mask(length, positions),
                             keep=None if i == 0 else keep == length) for i, length in enumerate(lengths)]

    def _windowed(self, keys: int) -> bool:
        """Whether the sliding window hides some of `keys` consecutive keys from a query."""
        return self.window is not None and keys > self.window

    def _decode_mask(self, length: int, positions: torch.Tensor) -> torch.Tensor:
        """[rows, 1, 1, length]: a row at position p attends keys 0..p of its slot (the last
        `window` of them with a sliding window). Bool for SDPA; on CPU the additive bias (0 or
        -inf) of `_attend`, made once per step instead of once per layer."""
        key_pos = self._key_positions[:length]
        if length > self.max_positions:  # a cache longer than the model's positions (benchmarks may make one)
            key_pos = torch.arange(length, device=self.device)
        mask = key_pos[None, :] <= positions[:, None]
        if self._windowed(length):
            mask &= key_pos[None, :] > positions[:, None] - self.window
        if self.device.type != "cpu":
            return mask[:, None, None, :]
        return torch.where(mask, *self._bias_values)[:, None, None, :]  # the bias in one op, not three

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Decode attention: q [rows, kv_heads, group, d] over keys/values [rows, kv_heads, L, d].

        On CPU, two batched matmuls and a softmax instead of SDPA: a decode row has `group` queries
        per head, too few for the flash kernel's blocking, which cost 1.6-4x more at 2 threads (32
        rows, 64-256 keys: 170-190 us against 40-120 us; about equal at 1 thread). Every (row,
        kv head) is its own GEMM of one shape, softmax is row-wise, so a row's bits depend only on
        its queries, its keys and their number, as with SDPA (batch invariance keeps the number a
        function of the row).
        """
        if self.device.type != "cpu":
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        scores = torch.matmul(q * self.scale, keys.transpose(-1, -2))
        if mask is not None:
            scores += mask
        return torch.matmul(scores.softmax(-1), values)

    def _causal_window_mask(self, length: int) -> torch.Tensor:
        """[length, length] bool: query i attends keys i - window < j <= i."""
        pos = torch.arange(length, device=self.device)
        offset = pos[:, None] - pos[None, :]
        return (offset >= 0) & (offset < self.window)

    def _decode_attention(self, q: torch.Tensor, cache: KVCache, layer: int,
                          groups: list[_DecodeGroup]) -> torch.Tensor:
        """q: [decode rows, heads, head_dim] -> [decode rows, heads * head_dim].

        GQA without copying the cache: the `group` query heads that share a key/value head
        become `group` query rows against it (HF's repeat_kv maps head h to kv head h // group).
        """
        outs = []
        for g in groups:
            if g.keep is not None:  # a fixed-shape tile's shorter bucket: its rows take its result
                outs[0] = torch.where(g.keep, self._attend_group(q, cache, layer, g), outs[0])
            else:
                outs.append(self._attend_group(q, cache, layer, g))
        if len(outs) == 1:
            return outs[0]
        out = torch.cat(outs)  # groups in length order -> rows in slot order
        return torch.empty_like(out).index_copy_(0, torch.cat([g.rows for g in groups]), out)

    def _attend_group(self, q: torch.Tensor, cache: KVCache, layer: int, g: _DecodeGroup) -> torch.Tensor:
        """One decode group's attention: [its rows, heads * head_dim]."""
        qg = q if g.rows is None else q.index_select(0, g.rows)
        if g.gather is not None:  # scattered slots: copy just their cache rows
            keys = cache.keys[layer][:, :, :g.length].index_select(0, g.gather)
            values = cache.values[layer][:, :, :g.length].index_select(0, g.gather)
        else:
            keys = cache.keys[layer][g.lo:g.hi, :, :g.length]
            values = cache.values[layer][g.lo:g.hi, :, :g.length]
            if g.rel is not None:  # idle slots inside the range get zero queries
                qg = qg.new_zeros((g.hi - g.lo, *qg.shape[1:])).index_copy_(0, g.rel, qg)
        n = qg.shape[0]
        out = self._attend(qg.view(n, self.num_kv_heads, self.group, self.head_dim), keys, values, g.mask)
        out = out.reshape(n, self.num_heads * self.head_dim)
        return out if g.rel is None else out.index_select(0, g.rel)

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
        valid = pos[None, :] < to_device(lengths, self.device)[:, None]  # [segments, keys]
        mask = (pos[None, :, None] >= pos[None, None, :]) & valid[:, None, :]  # causal & real keys
        if self._windowed(width):
            mask &= self._causal_window_mask(width)[None]
        return index[: len(gather)], index[len(gather):], mask[:, None]

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                           plan: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Causal self-attention of each prompt alone (prompts start at position 0).

        q: [T, heads, d]; k, v: [T, kv_heads, d], the prompts concatenated -> [T, heads * d].
        """
        if plan is None:  # each prompt alone: no padding
            outs, offset = [], 0
            for length in lengths:
                seg = slice(offset, offset + length)
                offset += length
                mask = self._causal_window_mask(length) if self._windowed(length) else None
                out = F.scaled_dot_product_attention(q[seg].transpose(0, 1)[None], k[seg].transpose(0, 1)[None],
                                                     v[seg].transpose(0, 1)[None], attn_mask=mask,
                                                     is_causal=mask is None, scale=self.scale,
                                                     enable_gqa=self.group > 1)
                outs.append(out[0].transpose(0, 1).reshape(length, self.num_heads * self.head_dim))
            return outs[0] if len(outs) == 1 else torch.cat(outs)
        gather, back, mask = plan
        segments, width = len(lengths), max(lengths)

        def padded(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, gather).view(segments, width, t.shape[1], self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), attn_mask=mask, scale=self.scale,
                                             enable_gqa=self.group > 1)
        out = out.transpose(1, 2).reshape(segments * width, self.num_heads * self.head_dim)
        return out.index_select(0, back)
