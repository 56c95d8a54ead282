"""The rollout engine: continuous batching over a fixed number of slots, streaming each sample out.

A request waits in a FIFO queue until a slot is free; its prompt is prefilled into the slot's
preallocated KV cache in the same forward as the decode step of the slots already running
(so an admission costs extra tokens, not an extra forward); every running slot gains one token
per step; a sequence leaves on EOS, a stop string, its token budget or the end of the context,
and the freed slot goes to the next request. Each finished sample goes out at once (the
`on_sample` callback, `stream()`, or `step()`'s return value) — StreamRL's stream generation.

Determinism (docs/design.md invariants 1 and 2). Sampling randomness is a pure function of
(seed, sample id, position) (`poise.rollout.sampling`), so a sample's tokens depend only on its
logits; each slot's noise is made 32 positions ahead (`NoiseTable`: the same bits, fewer small
ops per step). With `batch_invariant: true` the logits are bit-identical whatever else runs. Batch
invariance comes from fixing every reduction order a row sees, not from fixed shapes (vLLM's and
SGLang's batch-invariant kernels fix split sizes the same way), so a step costs about what the
fast mode's does (the one forward per step with every live row, `StepInputs.row_quantum`):

- matmuls: the step's token rows are padded to a multiple of `runner.row_quantum()` (4 with MKL
  on CPU), a batch size in which the BLAS computes every row with one kernel and one K order
  (probed once per device and thread count: 1-3 rows, or a thread's share of them, take other
  kernels); norms, activations and sampling are row-wise;
- decode attention stays ragged, but a row at position p attends over exactly
  `runner.key_bucket(p)` keys (a power of two, masked beyond p), a function of the row alone:
  attention's bits may change with the key length even where the extra keys are masked, so the
  fast mode's "longest context of the group" would make a row depend on its company;
- each admitted prompt attends alone (never padded to another prompt's length);
- a resumed partial is prefilled with its prompt only and its generated tokens are replayed
  through decode rows, so its cache is bit-identical to the uninterrupted run's.

Where the matmul has no row quantum (cuBLAS picks kernels by M, so CUDA), batch_invariant falls
back to fixed-shape tiles: decode runs in tiles of `invariant_tile` consecutive slots, always at
the full tile, one forward per tile, prefill one forward per request; every matmul has one fixed
shape, and a row at position p attends over `runner.key_bucket(p)` keys (one attention call per
bucket the tile's rows fall in, each over the whole tile), so attention reads the positions in
use, bucketed, not the whole context, and its shapes are a function of the row's position.

Host syncs. A step makes the host wait for the device once: it reads the sampled tokens and
logprobs, in one [2, rows] copy, because the scheduler needs them to plan the next step (EOS, stop
strings, budgets, which slots free up). Every copy to the device in a step (token ids, positions,
slots, decode groups, output rows, noise rows, sampling keys: a few small copies a forward) goes
through `rollout/transfer.py`, pinned and non-blocking, so on a GPU it costs a launch, not a wait.

The fast mode (default) packs only live rows, attends each over about its own context (the
runner's ragged decode groups) and resumes by prefilling prompt + generated tokens; tokens then
match up to floating-point near-ties, as they would between batch sizes.

Weights versions (invariant 4): every token of a sample is generated under one version, the
one it is stamped with. `load_weights` therefore refuses while sequences are in flight, and
`resume` refuses a partial made under another version.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Protocol

import torch

# The engine's config, requests and samples are torch-free (emulated workers and the driver use
# them without torch); they stay importable from here.
from poise.config import EngineConfig
from poise.errors import PoiseError
from poise.rollout.kv_cache import KVCache
from poise.rollout.occupancy import Occupancy
from poise.rollout.requests import RequestError, admit
from poise.rollout.weights import WeightsError, check_named_weights, copy_named_weights
from poise.rollout.runner import DecoderRunner, StepInputs
from poise.rollout.transfer import to_device
from poise.rollout.sampling import (NoiseTable, SamplingConfig, position_keys, sample_with_keys, sample_with_noise,
                                    turn_key_prefix)
from poise.types import FinishReason, Request, Sample, SampleId


class EngineBusyError(PoiseError):
    """An operation that needs no sequence in flight was called with some in flight."""


class TokenDecoder(Protocol):
    """What stop strings need of a tokenizer (poise.data.tokenizer.Tokenizer satisfies it)."""

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class _Sequence:
    sample_id: SampleId
    prompt: list[int]
    max_new: int
    submit_time: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)  # tokens to replay (batch_invariant resume)
    forced_logprobs: list[float] = field(default_factory=list)
    slot: int = -1
    cached: int = 0  # tokens of this sequence in its slot's cache
    text_len: int = 0  # length of decoded response text (stop strings)
    key_prefix: int = 0  # sampling.turn_key_prefix(seed, sample_id, turn): the keys less the position
    turn: int = 0  # an episode's turn (Request.turn)
    window_end: int = 0  # partial rollouts: hand back unfinished (finish_reason 'abort') at this many tokens
    versions: list[int] | None = None  # partial rollouts: the versions of the tokens it came with


class Engine:
    """Continuous-batching rollout engine over a transformers Llama/Qwen2/Qwen3/Mistral model.

    model: a `...ForCausalLM` of a type in `poise.model.files.SUPPORTED_MODEL_TYPES`; its parameters are the
    engine's weights and keep their HF names (the engine never changes its mode: it calls the projections, norms and MLPs, none of
    which use dropout, so a colocated trainer may share the module). eos_id: the token that ends a response, or None for an
    EOS-free workload. tokenizer: needed only for stop strings. clock: seconds, injectable.
    on_sample: called with each finished sample as soon as it finishes.
    """

    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, sampling: SamplingConfig, seed: int,
                 eos_id: int | None, *, tokenizer: TokenDecoder | None = None,
                 clock: Callable[[], float] = time.perf_counter, weights_version: int = 0,
                 on_sample: Callable[[Sample], None] | None = None):
        if cfg.stop_strings and tokenizer is None:
            raise PoiseError(f"stop_strings {cfg.stop_strings} need a tokenizer; pass tokenizer= to Engine")
        self.model = model
        self.cfg, self.sampling, self.seed, self.eos_id = cfg, sampling, seed, eos_id
        self.tokenizer, self.clock, self.on_sample = tokenizer, clock, on_sample
        self.version = weights_version
        self.runner = DecoderRunner(model)
        self.context = cfg.max_context or self.runner.max_positions
        if self.context > self.runner.max_positions:
            raise PoiseError(f"max_context {self.context} exceeds the model's max_position_embeddings "
                             f"{self.runner.max_positions}; lower engine max_context")
        # batch_invariant: rows padded to this quantum, or (0) fixed-shape tiles (runner.row_quantum)
        self.row_quantum = self.runner.row_quantum() if cfg.batch_invariant else 0
        live, slots = self._fit_slots(cfg)
        self.num_slots = live  # slots that run sequences (cfg.num_slots, or fewer within kv_cache_gb)
        # Built at the first step, so a device that never generates (a train device) holds none, and
        # freed by `release` when the device leaves the rollout role.
        self.cache: KVCache | None = None
        self._cache_shape = self.runner.cache_shape(slots, self.context)
        # every slot's Gumbel noise, made NoiseTable.SPAN positions ahead (None: made per step);
        # row `cache.scratch` serves the padding rows of fixed-shape tiles
        vocab = self.model.lm_head.weight.shape[0]  # the logits' width
        self._noise_span = NoiseTable.span_for(slots + 1, vocab) if sampling.temperature > 0 else 0
        self.noise = NoiseTable(slots + 1, self._noise_span, vocab, self.runner.device) if self._noise_span else None
        self._noise_released = False
        self._free = list(range(live))  # a heap: lowest slot first keeps live slots packed
        self._slots: dict[int, _Sequence] = {}
        self._queue: deque[_Sequence] = deque()
        self._known: set[SampleId] = set()  # queued or running
        self.replay_mismatches = 0  # batch_invariant resume: replayed tokens the logits disagreed with
        self.steps = 0
        self.tokens_generated = 0  # new tokens sampled (replayed ones excluded)

    def _fit_slots(self, cfg: EngineConfig) -> tuple[int, int]:
        """(slots that run sequences, slots the cache holds): `num_slots`, or as many as fit in
        `kv_cache_gb` (the context is never shortened: that would change what is generated).
        Fixed-shape tiles (batch_invariant without a row quantum) hold whole tiles."""
        tile = cfg.invariant_tile if cfg.batch_invariant and not self.row_quantum else 1
        live = cfg.num_slots
        if cfg.kv_cache_gb:
            budget = cfg.kv_cache_gb * 2**30
            per_slot = self.runner.cache_shape(1, self.context).bytes(self.runner.dtype) / 2  # bytes() counts scratch
            fit = (int(budget // per_slot) - 1) // tile * tile  # less the scratch row
            if fit < 1:
                raise PoiseError(f"rollout.kv_cache_gb={cfg.kv_cache_gb:g} holds no {'tile' if tile > 1 else 'slot'} "
                                 f"of {self.context} tokens ({tile * per_slot / 2**30:.3g} GiB); raise "
                                 "rollout.kv_cache_gb or lower rollout.max_context")
            live = min(live, fit)
        return live, math.ceil(live / tile) * tile

    @property
    def cache_bytes(self) -> int:
        """Bytes this engine holds for generation now: the KV cache and the noise table."""
        held = self.cache.shape.bytes(self.runner.dtype) if self.cache is not None else 0
        return held + (self.noise.table.numel() * self.noise.table.element_size() if self.noise is not None else 0)

    def _ensure_cache(self) -> None:
        if self.cache is None:
            self.cache = KVCache(self._cache_shape, self.runner.dtype, self.runner.device)
        if self._noise_released:
            slots, vocab = self._cache_shape.slots, self.model.lm_head.weight.shape[0]
            self.noise = NoiseTable(slots + 1, self._noise_span, vocab, self.runner.device)
            self._noise_released = False

    def release(self) -> None:
        """Free the KV cache and the noise table (the device leaves the rollout role); the next
        step builds them again. Needs an idle engine."""
        if not self.occupancy.idle:
            raise EngineBusyError(self.occupancy.busy("release"))
        self.cache = None
        if self.noise is not None:
            self.noise, self._noise_released = None, True
        if self.runner.device.type == "cuda":  # hand the blocks back to the device, not just to torch's pool
            torch.cuda.empty_cache()
        else:  # and on the host to the OS: glibc may keep freed pages in its arenas after a long process life
            _trim_host_heap()

    # ---- requests -------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue a request; raises RequestError (naming it) if it cannot be served."""
        self._queue.append(self._admit_check(request.sample_id, list(request.prompt_ids), request.max_new_tokens,
                                             turn=request.turn))

    def _admit_check(self, sample_id: SampleId, prompt: list[int], max_new: int | None,
                     tokens: list[int] | None = None, turn: int = 0) -> _Sequence:
        budget = self.sampling.max_new_tokens if max_new is None else max_new
        prompt = admit(sample_id, prompt, budget, tokens or [], turn, known=self._known,
                       vocab_size=self.runner.vocab_size, context=self.context)
        seq = _Sequence(sample_id, prompt, budget, self.clock(), key_prefix=turn_key_prefix(self.seed, sample_id, turn),
                        turn=turn)
        if tokens:
            seq.tokens = list(tokens)
        self._known.add(sample_id)
        return seq

    @property
    def occupancy(self) -> Occupancy:
        return Occupancy(len(self._slots), len(self._queue))

    # ---- the scheduling loop --------------------------------------------------------------

    def step(self) -> list[Sample]:
        """One scheduling iteration: admit queued requests, decode one token for every running
        sequence. Returns the samples that finished in it (also passed to `on_sample`)."""
        if self.occupancy.idle:
            return []
        self._ensure_cache()
        if self.cfg.batch_invariant and not self.row_quantum:
            rows, tokens, logprobs = self._step_tiles()
        else:
            rows, logits = self._step_rows() if self.cfg.batch_invariant else self._step_packed()
            tokens, logprobs = self._read_samples([self._sample_pairs(logits, rows)])
        self.steps += 1
        finished = self._advance(rows, tokens, logprobs)
        if self.on_sample is not None:
            for sample in finished:
                self.on_sample(sample)
        return finished

    def _admissions(self) -> list[_Sequence]:
        admitted, budget = [], self.cfg.max_prefill_tokens
        while self._queue and self._free:
            seq = self._queue[0]
            need = len(seq.prompt) + (0 if self.cfg.batch_invariant else len(seq.tokens))
            if admitted and need > budget:
                break  # the first admission always goes, so a long prompt cannot starve
            self._queue.popleft()
            seq.slot = heapq.heappop(self._free)
            self._slots[seq.slot] = seq
            admitted.append(seq)
            budget -= need
        return admitted

    def _decode_rows(self, step: StepInputs) -> tuple[StepInputs, list[_Sequence | None], list[_Sequence]]:
        """A decode row for every running slot (in slot order), then admit queued requests; the
        caller adds the admitted requests' prefills."""
        running = sorted(self._slots)  # before admission: these decode
        rows: list[_Sequence | None] = [self._slots[slot] for slot in running]
        admitted = self._admissions()
        step.decode_slots += running
        step.decode_tokens += [seq.tokens[-1] for seq in rows]
        step.decode_positions += [seq.cached for seq in rows]
        return step, rows, admitted

    def _step_packed(self) -> tuple[list[_Sequence | None], torch.Tensor]:
        """Fast mode: the running slots' decode rows and the new prefills in one forward."""
        step, rows, admitted = self._decode_rows(StepInputs())
        for seq in admitted:  # a resumed partial re-prefills prompt + generated tokens at once
            step.prefills.append((seq.slot, seq.prompt + seq.tokens))
            rows.append(seq)
        return rows, self.runner.forward(step, self.cache)

    def _step_rows(self) -> tuple[list[_Sequence | None], torch.Tensor]:
        """batch_invariant mode: as the fast mode, with batch-invariant rows (`StepInputs.row_quantum`)."""
        step, rows, admitted = self._decode_rows(StepInputs(row_quantum=self.row_quantum))
        for seq in admitted:
            # replay what a partial had: a prompt-only prefill + decode rows rebuild its exact cache
            seq.forced, seq.forced_logprobs, seq.tokens, seq.logprobs = seq.tokens, seq.logprobs, [], []
            step.prefills.append((seq.slot, seq.prompt))
            rows.append(seq)
        return rows, self.runner.forward(step, self.cache)

    def _step_tiles(self) -> tuple[list[_Sequence | None], list[int], list[float]]:
        """batch_invariant mode where matmuls are not row-invariant (CUDA): fixed-shape decode
        tiles, then one prefill per admitted request. Returns rows and their tokens and logprobs."""
        tile = self.cfg.invariant_tile
        rows: list[_Sequence | None] = []
        logits: list[torch.Tensor] = []
        for lo in range(0, self.cache.shape.slots, tile):
            members = [self._slots.get(s) for s in range(lo, lo + tile)]
            if not any(members):
                continue
            step = StepInputs(attend_lo=lo, attend_hi=lo + tile, attend_len=self.context, fixed_shape=True)
            for seq in members:
                if seq:  # idle slots get padding rows: the runner keeps the tile at its full shape
                    step.decode_slots.append(seq.slot)
                    step.decode_tokens.append(seq.tokens[-1])
                    step.decode_positions.append(seq.cached)
            rows.extend(members)
            logits.append(self._sample_pairs(self.runner.forward(step, self.cache), members))
        for seq in self._admissions():
            # replay what a partial had: prompt-only prefill + decode tiles rebuild its exact cache
            seq.forced, seq.forced_logprobs, seq.tokens, seq.logprobs = seq.tokens, seq.logprobs, [], []
            out = self.runner.forward(StepInputs(prefills=[(seq.slot, seq.prompt)]), self.cache)
            # sample at the tile's shape too, so sampling sees one shape whatever else is live
            padded = torch.zeros((tile, out.shape[1]), dtype=out.dtype, device=out.device)
            padded[0] = out[0]
            rows.append(seq)
            logits.append(self._sample_pairs(padded, [seq] + [None] * (tile - 1))[:, :1])
        tokens, logprobs = self._read_samples(logits)
        return rows, tokens, logprobs

    def _sample_pairs(self, logits: torch.Tensor, members: list[_Sequence | None]) -> torch.Tensor:
        """[2, rows] float64 (tokens; logprobs): both in one tensor, so the host reads them in one
        copy, as two lists. Exact: a token id is below 2^53 and a float32 is a float64."""
        tokens, logprobs = self._sample(logits, members)
        return torch.stack([tokens.double(), logprobs.double()])

    @staticmethod
    def _read_samples(pairs: list[torch.Tensor]) -> tuple[list[int], list[float]]:
        """The step's one device-to-host read (and so its one host sync on a GPU): the tokens
        decide what the next step runs (EOS, stop strings, budgets), so the host waits for them."""
        tokens, logprobs = torch.cat(pairs, dim=1).tolist() if len(pairs) > 1 else pairs[0].tolist()
        return list(map(int, tokens)), logprobs

    def _sample(self, logits: torch.Tensor, members: list[_Sequence | None]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sampling.temperature == 0:  # greedy draws no randomness: no keys to send
            return sample_with_keys(logits, None, self.sampling)
        if self.noise is not None:  # padding rows (None) take the scratch row's noise, and are dropped
            picks = [(seq.slot, seq.key_prefix, len(seq.tokens)) if seq else (self.cache.scratch, 0, 0)
                     for seq in members]
            return sample_with_noise(logits, self.noise.rows(picks), self.sampling)
        # one host->device copy: (key prefix of the sample id, position) per row
        keys = to_device([(seq.key_prefix, len(seq.tokens)) if seq else (0, 0) for seq in members], logits.device)
        return sample_with_keys(logits, position_keys(keys[:, 0], keys[:, 1]), self.sampling)

    def _advance(self, rows: list[_Sequence | None], tokens: list[int], logprobs: list[float]) -> list[Sample]:
        """Append each row's new token, and retire the sequences that finished (None: padding row)."""
        finished = []
        now = None
        for seq, token, logprob in zip(rows, tokens, logprobs):
            if seq is None:
                continue
            seq.cached = len(seq.prompt) + len(seq.tokens)  # the row's input token is now cached
            if seq.forced:
                # replay: the logits are bit-identical to the original run's, so the sample must agree
                expected, expected_logprob = seq.forced.pop(0), seq.forced_logprobs.pop(0)
                if token != expected or logprob != expected_logprob:
                    self.replay_mismatches += 1
                    token, logprob = expected, expected_logprob
            else:
                self.tokens_generated += 1
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            reason = None if seq.forced else self._finish_reason(seq, token)
            if reason is not None:
                now = self.clock() if now is None else now
                finished.append(self._retire(seq, reason, now))
        return finished

    def _finish_reason(self, seq: _Sequence, token: int) -> FinishReason | None:
        if self.eos_id is not None and token == self.eos_id:
            return "eos"
        if self.cfg.stop_strings and self._hit_stop(seq):
            return "stop"
        if len(seq.tokens) >= seq.max_new or len(seq.prompt) + len(seq.tokens) >= self.context:
            return "length"
        if seq.window_end and len(seq.tokens) >= seq.window_end:
            return "abort"  # partial rollouts: its window is spent; it continues in a later one
        return None

    def _hit_stop(self, seq: _Sequence) -> bool:
        text = self.tokenizer.decode(seq.tokens)
        start = seq.text_len
        seq.text_len = len(text)
        for stop in self.cfg.stop_strings:
            if text.find(stop, max(0, start - len(stop) + 1)) >= 0:
                return True
        return False

    def _retire(self, seq: _Sequence, reason: FinishReason, now: float) -> Sample:
        if seq.slot >= 0:
            del self._slots[seq.slot]
            heapq.heappush(self._free, seq.slot)
        self._known.discard(seq.sample_id)
        tokens, logprobs = seq.tokens, seq.logprobs
        if seq.forced:  # aborted mid-replay: hand on what the partial had, with its logprobs
            tokens, logprobs = seq.tokens + seq.forced, seq.logprobs + seq.forced_logprobs
        versions = None if seq.versions is None else \
            tuple(seq.versions + [self.version] * (len(tokens) - len(seq.versions)))
        return Sample(seq.sample_id, tuple(seq.prompt), tuple(tokens), tuple(logprobs), reason, self.version,
                      seq.submit_time, now, seq.max_new, turn=seq.turn, token_versions=versions)

    # ---- streaming and batch entry points -------------------------------------------------

    def stream(self) -> Iterator[Sample]:
        """Run until nothing is queued or running, yielding each sample the step it finishes."""
        while not self.occupancy.idle:
            yield from self.step()

    def generate(self, requests: Iterable[Request]) -> list[Sample]:
        """Serve `requests` to completion; all samples, sorted by sample id.

        The colocated training loop's entry point. Every request is checked before any runs, so
        one bad request raises (naming it) and leaves the engine as it was.
        """
        occupancy = self.occupancy
        if not occupancy.idle:
            raise EngineBusyError(f"{occupancy.busy('generate')} (drain them with stream() first)")
        requests = list(requests)
        seqs = []
        try:
            for request in requests:
                seqs.append(self._admit_check(request.sample_id, list(request.prompt_ids), request.max_new_tokens,
                                              turn=request.turn))
        except RequestError:
            for seq in seqs:
                self._known.discard(seq.sample_id)
            raise
        self._queue.extend(seqs)
        return sorted(self.stream(), key=lambda s: s.sample_id)

    # ---- migration --------------------------------------------------------------------------

    def abort(self, ids: Iterable[SampleId] | None = None) -> list[Sample]:
        """Stop the given (default: all) queued or running sequences; returns their partial samples
        (finish_reason 'abort'), which `resume` on any engine with the same weights continues."""
        wanted = None if ids is None else set(ids)
        if wanted is not None:
            unknown = wanted - self._known
            if unknown:
                raise PoiseError(f"abort: sample ids {sorted(unknown)} are neither queued nor running here "
                                 "(finished samples were already delivered)")
        now = self.clock()
        partials = []
        for seq in [self._slots[s] for s in sorted(self._slots)] + list(self._queue):
            if wanted is None or seq.sample_id in wanted:
                partials.append(self._retire(seq, "abort", now))
        self._queue = deque(seq for seq in self._queue if seq.sample_id in self._known)
        return sorted(partials, key=lambda s: s.sample_id)

    def resume(self, partials: Iterable[Sample], windows: Mapping[SampleId, int] | None = None) -> None:
        """Queue partial samples (from `abort` on this or another engine) to continue, ahead of
        new requests. The continued sample equals the one an uninterrupted run produces.
        `windows` (partial rollouts): a sample named there decodes at most that many more tokens,
        then comes back unfinished (finish_reason 'abort')."""
        seqs: list[_Sequence] = []
        try:
            for partial in partials:
                seqs.append(self._resume_check(partial))
                if windows and partial.sample_id in windows:
                    seqs[-1].window_end = len(partial.token_ids) + windows[partial.sample_id]
        except RequestError:
            for seq in seqs:  # all or nothing: the engine stays as it was
                self._known.discard(seq.sample_id)
            raise
        self._queue.extendleft(reversed(seqs))

    def _resume_check(self, partial: Sample) -> _Sequence:
        check_resumable(partial, self.version)
        seq = self._admit_check(partial.sample_id, list(partial.prompt_ids), partial.max_new_tokens,
                                list(partial.token_ids), turn=partial.turn)
        seq.logprobs = list(partial.logprobs)
        seq.submit_time = partial.submit_time
        if partial.token_versions is not None:  # partial rollouts: its prefix's cache is rebuilt under these weights
            seq.versions = list(partial.token_versions)
        return seq

    # ---- weights ----------------------------------------------------------------------------

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The engine's weights under their HF names (what `load_weights` expects)."""
        return self.model.named_parameters()

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> None:
        """Replace every parameter by name, between steps; samples after it carry `version`.

        All names and shapes are checked before anything is copied, so a missing, unknown or
        mis-shaped tensor raises WeightsError naming it and the engine keeps its old weights and
        keeps serving. Copies go in buckets of at most `weight_bucket_mb`: only one bucket is
        staged on the engine's device (cast to its dtype) at a time. Tied aliases (e.g.
        `lm_head.weight` tied to the embedding) may be sent or left out.
        """
        items, params, aliases = check_named_weights(self.model, named_tensors)
        if not isinstance(version, int):
            raise PoiseError(f"load_weights version must be an int, got {version!r}")
        self._check_not_in_flight(version)
        copy_named_weights(items, params, aliases, self.cfg.weight_bucket_mb)
        self.version = version

    def set_weights_version(self, version: int) -> None:
        """Colocated use: the trainer updated the shared model in place; stamp later samples with
        `version`. Same in-flight rule as `load_weights`."""
        if not isinstance(version, int):
            raise PoiseError(f"weights version must be an int, got {version!r}")
        self._check_not_in_flight(version)
        self.version = version

    def _check_not_in_flight(self, version: int) -> None:
        in_flight = len(self._slots) + sum(1 for seq in self._queue if seq.tokens)
        if in_flight:
            raise EngineBusyError(f"changing weights with {in_flight} sequences in flight would mix weights "
                                  f"versions {self.version} and {version} in one sample; drain them (stream()) "
                                  "or abort them first")

def check_resumable(partial: Sample, version: int) -> None:
    """A partial sample an engine holding weights `version` may continue, or RequestError naming it:
    an aborted one, generated (if at all) under the same version."""
    if partial.finish_reason != "abort":
        raise RequestError(partial.sample_id, f"finish_reason is {partial.finish_reason!r}; only "
                                              "aborted partial samples can be resumed")
    if partial.token_versions is not None:  # partial rollouts: it continues under these or newer weights
        if partial.token_versions and partial.token_versions[-1] > version:
            raise RequestError(partial.sample_id, f"has tokens of weights version {partial.token_versions[-1]} "
                                                  f"but this engine holds the older version {version}")
    elif partial.token_ids and partial.weights_version != version:
        raise RequestError(partial.sample_id, f"was generated under weights version {partial.weights_version} "
                                              f"but this engine holds version {version}; resume it where the "
                                              "weights match")


def _trim_host_heap() -> None:
    """glibc's malloc_trim(0): return free heap pages to the OS (a no-op elsewhere)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass

