"""The `rollout:` section: the rollout engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from poise.schema import check, help_field


@dataclass(frozen=True)
class EngineConfig:
    backend: Literal["poise", "vllm"] = help_field(
        "poise", "poise: Poise's engine (bit-exact with batch_invariant; the default, and what CPU runs want); "
                 "vllm: vLLM (paged KV cache, prefix sharing, CUDA graphs: what GPU runs want), needs "
                 "determinism: semantic and the vllm extra (make vllm)")
    num_slots: int = help_field(32, "sequences decoded together (the continuous batch size)")
    max_context: int = help_field(0, "prompt + response tokens per slot; 0 = what the run needs: its longest "
                                     "prompt + max_new_tokens, rounded up to a power of two, at most the model's "
                                     "max_position_embeddings (an engine built without a run: the model's maximum)")
    batch_invariant: bool = help_field(False, "bit-identical tokens and logprobs regardless of batch, slot and "
                                              "co-batched requests (fixed reduction orders: on CPU about the "
                                              "fast mode's cost; fixed-shape tiles on CUDA, slower)")
    invariant_tile: int = help_field(16, "rows per fixed-shape decode tile, used by batch_invariant where the "
                                         "matmul has no row quantum (CUDA); engines must share it (and "
                                         "max_context) to agree bit for bit. One forward per tile with a live "
                                         "slot: set it to num_slots when every engine has the same slots")
    max_prefill_tokens: int = help_field(2048, "prompt tokens admitted per step at most (bounds a step's work)")
    stop_strings: tuple[str, ...] = help_field((), "a response ends once its text contains one of these "
                                                   "(needs a tokenizer); the completing token is kept")
    weight_bucket_mb: float = help_field(64.0, "load_weights stages at most this many MiB at a time")
    kv_cache_gb: float = help_field(0.0, "largest KV cache of one engine, in GiB: an engine runs fewer than "
                                         "num_slots slots to fit it (never a shorter context); 0 = no limit")

    def __post_init__(self) -> None:
        check(self.num_slots >= 1, "num_slots", self.num_slots, "must be >= 1")
        check(self.max_context >= 0, "max_context", self.max_context, "must be >= 0 (0 = model's maximum)")
        check(self.invariant_tile >= 2, "invariant_tile", self.invariant_tile,
              "must be >= 2 (a 1-row matmul takes a different kernel than a multi-row one)")
        check(self.max_prefill_tokens >= 1, "max_prefill_tokens", self.max_prefill_tokens, "must be >= 1")
        check(all(isinstance(s, str) and s for s in self.stop_strings), "stop_strings", self.stop_strings,
              "must be non-empty strings")
        check(self.weight_bucket_mb > 0, "weight_bucket_mb", self.weight_bucket_mb, "must be > 0")
        check(self.kv_cache_gb >= 0 and math.isfinite(self.kv_cache_gb), "kv_cache_gb", self.kv_cache_gb,
              "must be >= 0 GiB (0 = no limit), e.g. 20")
