"""Token sampling whose randomness is a pure function of (seed, sample id, token position).

docs/design.md invariant 2. Each (seed, step, prompt_index, sample_index, position, vocab id) is
hashed with a counter-based mixer (splitmix64) to a uniform u, and the token is chosen by the
Gumbel-max rule over the tempered, top-k/top-p-filtered log-probabilities:

    token = argmax_i  log p_i - log(-log u_i)

which samples exactly from p (Gumbel 1954). No generator state exists, so a sample's tokens do
not depend on the engine, its slot, its batch, or where it was aborted and resumed — only on
its logits, which batch-invariant decoding makes independent of the batch too.

The noise is float64 and stays so: the argmax runs over float64 log-probabilities less float64
noise made from 53 random bits a uniform, and float32 noise would round both otherwise and so change
the tokens that every seed samples. Nor would it save much: at a vocabulary of 151,936 and 32 rows
(one CPU thread) a step's noise costs 185 ms, of which the int64 hash is 157 ms and the two float64
logs 28 ms (float32 logs: 11 ms).
"""

from __future__ import annotations

import torch

from poise.config import SamplingConfig  # torch-free; stays importable from here
from poise.rollout.transfer import to_device

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> k).bitwise_and_((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (wrapping two's-complement arithmetic), in place:
    `x` is a temporary of the caller's (the per-step sampling path runs on tiny tensors, where each
    allocation costs about what the op does)."""
    x ^= _shr(x, 30)
    x *= _MIX1
    x ^= _shr(x, 27)
    x *= _MIX2
    x ^= _shr(x, 31)
    return x


def _mix_u64(x: int) -> int:
    """`_mix` on a plain unsigned 64-bit int (the same bits as torch's wrapping int64)."""
    x = ((x ^ (x >> 30)) * (_MIX1 & _MASK64)) & _MASK64
    x = ((x ^ (x >> 27)) * (_MIX2 & _MASK64)) & _MASK64
    return x ^ (x >> 31)


def key_prefix(seed: int, sample_id: tuple[int, int, int]) -> int:
    """The part of a sample's keys that does not change along its response (plain Python: an
    engine computes it once per sequence), as a signed int64: the splitmix64 chain of
    `sample_keys` over the seed and the sample id."""
    golden = _GOLDEN & _MASK64
    h = _mix_u64((seed + golden) & _MASK64)
    for part in sample_id:
        h = _mix_u64(h ^ ((part + golden) & _MASK64))
    return _signed(h)


def turn_key_prefix(seed: int, sample_id: tuple[int, int, int], turn: int) -> int:
    """`key_prefix` of an episode's turn: turn 0 keeps the sample's own keys (a single answer is an
    episode of one turn), turn t > 0 those of (sample id, t), so every turn draws fresh noise whatever
    device or batch runs it (positions restart at each turn's first token)."""
    return key_prefix(seed, sample_id) if turn == 0 else key_prefix(seed, (*sample_id, turn))


def position_keys(prefixes: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B] keys from [B] `key_prefix` values and [B] positions (int64)."""
    return _mix((positions.to(torch.int64) + _GOLDEN).bitwise_xor_(prefixes))


def sample_keys(seed: int, sample_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per-row 64-bit keys from (seed, sample id, position).

    sample_ids: [B, 3] int64 (step, prompt_index, sample_index); positions: [B] int64, the index
    of the token being sampled within the response (0 for the first response token).
    Returns [B] int64.
    """
    h = torch.full((sample_ids.shape[0],), _signed(seed), dtype=torch.int64, device=sample_ids.device)
    h = _mix(h + _GOLDEN)
    for column in (sample_ids[:, 0], sample_ids[:, 1], sample_ids[:, 2]):
        h = _mix(h ^ (column.to(torch.int64) + _GOLDEN))
    return position_keys(h, positions)


_vocab_salts: dict[tuple[int, str], torch.Tensor] = {}


def _vocab_salt(vocab_size: int, device: torch.device) -> torch.Tensor:
    """(1..V) * golden, the per-token salt of `uniforms` (made once per vocabulary and device)."""
    key = (vocab_size, str(device))
    if key not in _vocab_salts:
        _vocab_salts[key] = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=device) * _GOLDEN
    return _vocab_salts[key]


def uniforms(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B] keys -> [B, V] float64 uniforms in (0, 1), one per vocabulary entry."""
    bits = _mix(keys[:, None] ^ _vocab_salt(vocab_size, keys.device)[None, :])
    mantissa = _shr(bits, 11).to(torch.float64)  # 53 random bits
    return mantissa.add_(0.5).mul_(1.0 / (1 << 53))  # a power of two: the same bits as dividing


def gumbel_offsets(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B] keys -> [B, V] float64 log(-log u): the Gumbel noise, negated, that sampling subtracts
    from the log-probabilities. Element-wise, so a row's values do not depend on the other rows or
    on how many rows are made at once (`NoiseTable` makes them ahead)."""
    return uniforms(keys, vocab_size).log_().neg_().log_()


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature; at 1 (and at 0, greedy) the logits themselves: x / 1 == x, so skipping
    the division changes no bit."""
    return logits if temperature in (0, 1) else logits / temperature


def filtered_logprobs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """[B, V] logits -> [B, V] float32 log-probabilities after temperature, top-k and top-p.

    Removed tokens get -inf. Every operation is row-wise, so a row's result does not depend on
    the other rows.
    """
    logp = torch.log_softmax(tempered(logits.float(), cfg.temperature), dim=-1)
    if cfg.top_k > 0 and cfg.top_k < logp.shape[-1]:
        kth = torch.topk(logp, cfg.top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()
        drop_sorted = mass_before >= cfg.top_p  # keep tokens until the mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return logp


def sample_next(logits: torch.Tensor, seed: int, sample_ids: torch.Tensor | None, positions: torch.Tensor | None,
                cfg: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the next token of each row.

    logits: [B, V] (any float dtype); sample_ids: [B, 3] int64; positions: [B] int64 (both unused,
    and may be None, when greedy).
    Returns (tokens [B] int64, logprobs [B] float32) where logprobs are under the tempered,
    unfiltered distribution log_softmax(logits / T) — what the trainer recomputes.
    """
    if cfg.temperature == 0:
        return sample_with_keys(logits, None, cfg)
    if sample_ids is None or positions is None:
        raise ValueError(f"sampling at temperature {cfg.temperature} needs sample_ids and positions")
    return sample_with_keys(logits, sample_keys(seed, sample_ids, positions), cfg)


def sample_with_keys(logits: torch.Tensor, keys: torch.Tensor | None,
                     cfg: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_next` with each row's key already made (`sample_keys`, or `position_keys` over an
    engine's per-sequence `key_prefix`); keys may be None when greedy."""
    if cfg.temperature == 0:
        return sample_with_noise(logits, None, cfg)
    if keys is None:
        raise ValueError(f"sampling at temperature {cfg.temperature} needs a key per row")
    return sample_with_noise(logits, gumbel_offsets(keys, logits.shape[-1]), cfg)


def sample_with_noise(logits: torch.Tensor, noise: torch.Tensor | None,
                      cfg: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_with_keys` with each row's `gumbel_offsets` already made ([B, V] float64; None
    when greedy)."""
    logits = logits.float()
    if cfg.temperature == 0:
        tokens = torch.argmax(logits, dim=-1)
        logp_full = torch.log_softmax(logits, dim=-1)
    else:
        if noise is None:
            raise ValueError(f"sampling at temperature {cfg.temperature} needs Gumbel noise per row")
        logp_full = torch.log_softmax(tempered(logits, cfg.temperature), dim=-1)
        filters = 0 < cfg.top_k < logits.shape[-1] or cfg.top_p < 1.0
        logp = filtered_logprobs(logits, cfg) if filters else logp_full  # the same ops when nothing is filtered
        # Gumbel noise -log(-log u), added as the subtraction of log(-log u) (the same bits)
        tokens = torch.argmax(logp.double().sub_(noise), dim=-1)
    return tokens, logp_full.gather(-1, tokens[:, None]).squeeze(-1)


class NoiseTable:
    """Each slot's `gumbel_offsets` for the next `span` response positions of its sequence, made
    `span` positions at a time for every sequence that needs them in one batch.

    Why: at decode sizes making a step's noise costs about what the step's matmuls do (some
    twenty ops on a few rows; ~70 us of a ~1 ms step on the peer workload), and most of that is
    per-op cost, which making `span` positions at once pays once. The values are those of
    `sample_with_keys` bit for bit (element-wise ops give an element the same bits in any
    tensor), so tokens do not change. Memory: (slots + 1) x span x vocab float64, so
    `NoiseTable.span_for` shrinks the span for large vocabularies (0: not worth a table).
    """

    SPAN = 32  # positions made at once: a refill costs about one step's noise per 2-4 positions here
    BYTES = 32 << 20  # the table's budget
    MIN_SPAN = 4  # below this the per-step keys cost about what the table saves

    @classmethod
    def span_for(cls, rows: int, vocab_size: int) -> int:
        span = min(cls.SPAN, cls.BYTES // (rows * vocab_size * 8))
        return span if span >= cls.MIN_SPAN else 0

    def __init__(self, rows: int, span: int, vocab_size: int, device: torch.device):
        self.span, self.vocab_size, self.device = span, vocab_size, device
        self.table = torch.zeros((rows, span, vocab_size), dtype=torch.float64, device=device)
        # what each table row holds: the noise of key prefix owner[r] at positions first[r] ...
        # first[r] + span - 1. A prefix is the sample's whole identity in the noise (keys are a
        # function of prefix and position), so a match needs no other bookkeeping.
        self.owner: list[int | None] = [None] * rows
        self.first = [0] * rows
        self.refilled = 0  # table rows made (for tests and benchmarks)

    def rows(self, picks: list[tuple[int, int, int]]) -> torch.Tensor:
        """[B, V] noise of the rows given as (table row, key prefix, position); a table row that
        does not hold that prefix at that position first gets the `span` positions from there."""
        stale = {r: (r, prefix, at) for r, prefix, at in picks  # a row once (padding rows share one)
                 if self.owner[r] != prefix or not 0 <= at - self.first[r] < self.span}
        if stale:
            self._refill(list(stale.values()))
        span, first = self.span, self.first
        index = to_device([r * span + at - first[r] for r, _, at in picks], self.device)
        return self.table.view(-1, self.vocab_size).index_select(0, index)

    def _refill(self, stale: list[tuple[int, int, int]]) -> None:
        """Make the `span` positions from `at` of each (row, prefix, at), all in one batch."""
        spec = to_device([(prefix, at) for _, prefix, at in stale], self.device)
        offsets = torch.arange(self.span, dtype=torch.int64, device=self.device)
        positions = (spec[:, 1:] + offsets).reshape(-1)
        keys = position_keys(spec[:, 0].repeat_interleave(self.span), positions)
        noise = gumbel_offsets(keys, self.vocab_size).view(len(stale), self.span, self.vocab_size)
        table_rows = [r for r, _, _ in stale]
        self.table[to_device(table_rows, self.device)] = noise
        for r, prefix, at in stale:
            self.owner[r], self.first[r] = prefix, at
        self.refilled += len(stale)
