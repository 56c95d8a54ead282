"""vLLM as a rollout backend (`rollout.backend: vllm`): the `RolloutEngine` Protocol over vLLM.

What GPU users run for throughput (paged KV cache, prefix sharing across a GRPO group, CUDA
graphs, tuned attention). Its contract is `determinism: semantic`: the same prompts, the same
algorithm, the same weights versions, and tokens that depend on the batch they ran in (vLLM is not
batch-invariant here: its batch-invariant kernels are Triton, GPU only), so TrainConfig refuses
`bitwise` with it. Poise's own engine stays the bit-exact one.

How it sits in a device worker:

- vLLM runs in a process of its own (its engine-core process). In the worker's process it would
  build its torch.distributed groups inside the job's world, and `new_group` is collective over
  the whole world: every other device would have to join.
- The weights' source is the worker's module tree (the one the trainer updates and the weight sync
  writes into: `load_weights` and `set_weights_version` work as on Poise's engine). vLLM holds its
  own copy; before the first step under a weights version it does not hold, the tree's tensors go
  to vLLM through a safetensors file in a private directory on /dev/shm and vLLM's in-place
  `reload_weights` (no re-allocation). Two workarounds: `model.load_weights` on the live model is
  not used (vLLM's CPU backend re-packs layers after loading), and no Python callable crosses to
  the engine process (that needs vLLM's pickle serialization on its local sockets: code execution
  for any process that can reach them, the reward sandbox's included).
- Started at its first step (a train device never starts one) and shut down by `release` (vLLM's
  sleep mode, which keeps the process, is GPU-only): a device leaving the rollout role gives back
  the KV cache and the process, and so does the end of a run (colocated, or a device's shutdown).
- /dev/shm outlives every process: the weights directory and vLLM's shared-memory message queues
  (`psm_*`, hundreds of MB) stay until reboot unless someone removes them. The directory is named
  after the owning process (`poise-vllm-<pid>-*`) and lists the segments vLLM's processes map;
  `release` removes both, and `sweep_stale_shm` (at every engine start, and at the end of a
  runtime job) removes what a process that died without `release` (a crash, a kill) left.
- Sampling: each request's seed is a function of (seed, sample id, tokens already generated), so
  what a sample draws does not depend on the engine that ran it, up to vLLM's batch variance.
- Abort hands on each sequence's tokens and log-probs received so far; resume continues a partial
  as a new request, prompt + partial tokens (vLLM recomputes the cache; prefix caching shares the
  prompt's blocks).
- Log-probs are vLLM's `processed_logprobs`: after the temperature, and with top_k/top_p of the
  filtered distribution (Poise's engine reports the unfiltered one). `algorithm.old_logprobs:
  recompute` and `algorithm.rollout_is` correct for what differs from the trainer's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch

from poise.config import EngineConfig, ModelConfig, SamplingConfig
from poise.errors import PoiseError
from poise.rollout.engine import EngineBusyError, check_resumable
from poise.rollout.occupancy import Occupancy
from poise.rollout.requests import RequestError, admit
from poise.rollout.weights import check_named_weights, copy_named_weights
from poise.rollout.sampling import turn_key_prefix
from poise.types import FinishReason, Request, Sample, SampleId

_REASONS: dict[str, FinishReason] = {"stop": "eos", "length": "length", "abort": "abort"}


@dataclass
class _Request:
    sample_id: SampleId
    prompt: list[int]
    max_new: int
    submit_time: float
    tokens: list[int] = field(default_factory=list)  # a resumed partial's, then what vLLM returns
    logprobs: list[float] = field(default_factory=list)
    resumed: int = 0  # tokens it had before this engine's request (its seed's position)
    turn: int = 0  # an episode's turn (Request.turn): its seeds are those of (sample id, turn)


class VllmEngine:
    """A RolloutEngine over vLLM, on the weights of `model` (the worker's module tree).

    model: the `...ForCausalLM` the trainer and the weight sync update in place; its config and
    dtype are vLLM's. cfg: `rollout` (num_slots: vLLM's max_num_seqs; kv_cache_gb: its KV cache,
    1 GiB when 0; max_context: its max_model_len). eos_id ends a response (kept in it, as Poise's
    engine does)."""

    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, sampling: SamplingConfig, seed: int,
                 eos_id: int | None, *, clock: Callable[[], float] = time.perf_counter, weights_version: int = 0):
        self.model = model
        self.cfg, self.sampling, self.seed, self.eos_id, self.clock = cfg, sampling, seed, eos_id, clock
        self.version = weights_version
        self.context = cfg.max_context or model.config.max_position_embeddings
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.num_slots = cfg.num_slots
        self._llm = None  # vllm.LLM, started at the first step
        self._dir: Path | None = None  # the private directory vLLM reads its weights from
        self._loaded: int | None = None  # the weights version vLLM holds
        self._pending: deque[_Request] = deque()  # submitted, not yet handed to vLLM
        self._live: dict[str, _Request] = {}  # vLLM request id -> its request
        self._known: set[SampleId] = set()
        self._ids = 0
        self.steps = 0
        self.tokens_generated = 0
        self.weight_loads: list[float] = []  # seconds of each weights update into vLLM
        self.start_seconds = 0.0

    # ---- requests -------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        budget = self.sampling.max_new_tokens if request.max_new_tokens is None else request.max_new_tokens
        self._pending.append(self._check(request.sample_id, list(request.prompt_ids), budget, [], request.turn))

    def _check(self, sample_id: SampleId, prompt: list[int], budget, tokens: list[int], turn: int = 0) -> _Request:
        prompt = admit(sample_id, prompt, budget, tokens, turn, known=self._known, vocab_size=self.vocab_size,
                       context=self.context)
        self._known.add(sample_id)
        return _Request(sample_id, prompt, budget, self.clock(), list(tokens), resumed=len(tokens), turn=turn)

    @property
    def occupancy(self) -> Occupancy:
        """vLLM schedules beyond the slots: what it holds past them waits."""
        running = min(len(self._live), self.num_slots)
        return Occupancy(running, len(self._pending) + len(self._live) - running)

    def step(self) -> list[Sample]:
        """Hand queued requests to vLLM and take one engine step; the samples that finished in it."""
        if self.occupancy.idle:
            return []
        self._start()
        if self._loaded != self.version:
            self._push_weights()
        engine = self._llm.llm_engine
        while self._pending:
            self._add(engine, self._pending.popleft())
        finished = []
        for out in engine.step():
            req = self._live.get(out.request_id)
            if req is None:
                continue
            done = out.outputs[0]
            new = list(done.token_ids)  # DELTA: the tokens since the last output
            req.tokens += new
            req.logprobs += [entry[token].logprob for entry, token in zip(done.logprobs or [], new)]
            self.tokens_generated += len(new)
            if out.finished:
                del self._live[out.request_id]
                finished.append(self._retire(req, _REASONS.get(done.finish_reason, "length")))
        self.steps += 1
        return finished

    def generate(self, requests: Iterable[Request]) -> list[Sample]:
        """Serve `requests` to completion (the colocated loop's entry point); sorted by sample id.
        Every request is checked before any runs."""
        if not self.occupancy.idle:
            raise EngineBusyError(self.occupancy.busy("generate"))
        checked = []
        try:
            for request in requests:
                budget = self.sampling.max_new_tokens if request.max_new_tokens is None else request.max_new_tokens
                checked.append(self._check(request.sample_id, list(request.prompt_ids), budget, []))
        except RequestError:
            for req in checked:
                self._known.discard(req.sample_id)
            raise
        self._pending.extend(checked)
        out: list[Sample] = []
        while not self.occupancy.idle:
            out += self.step()
        return sorted(out, key=lambda s: s.sample_id)

    def _add(self, engine, req: _Request) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        prompt = req.prompt + req.tokens
        s = self.sampling
        params = SamplingParams(
            n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else -1,
            max_tokens=min(req.max_new - len(req.tokens), self.context - len(prompt)),
            seed=request_seed(self.seed, req.sample_id, len(req.tokens), req.turn), logprobs=0,
            stop_token_ids=[self.eos_id] if self.eos_id is not None else None, ignore_eos=self.eos_id is None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA)
        self._ids += 1
        rid = f"{'-'.join(map(str, req.sample_id))}#{self._ids}"
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
        self._live[rid] = req

    def _retire(self, req: _Request, reason: FinishReason) -> Sample:
        self._known.discard(req.sample_id)
        return Sample(req.sample_id, tuple(req.prompt), tuple(req.tokens), tuple(req.logprobs), reason,
                      self.version, req.submit_time, self.clock(), req.max_new, turn=req.turn)

    # ---- migration --------------------------------------------------------------------------

    def abort(self) -> list[Sample]:
        """Stop every queued and running sequence; their partial samples (finish_reason 'abort')."""
        if self._live:
            self._llm.llm_engine.abort_request(list(self._live))
        partials = [self._retire(req, "abort") for req in [*self._live.values(), *self._pending]]
        self._live, self._pending = {}, deque()
        return sorted(partials, key=lambda s: s.sample_id)

    def resume(self, partials: Iterable[Sample]) -> None:
        """Continue partial samples (from `abort` on any engine holding the same weights version),
        ahead of new requests."""
        reqs: list[_Request] = []
        try:
            for partial in partials:
                check_resumable(partial, self.version)
                req = self._check(partial.sample_id, list(partial.prompt_ids), partial.max_new_tokens,
                                  list(partial.token_ids), partial.turn)
                req.logprobs, req.submit_time = list(partial.logprobs), partial.submit_time
                reqs.append(req)
        except RequestError:
            for req in reqs:
                self._known.discard(req.sample_id)
            raise
        self._pending.extendleft(reversed(reqs))

    # ---- weights ----------------------------------------------------------------------------

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                     version: int) -> None:
        """Replace every parameter of the module tree by name (checked as Poise's engine checks
        them); vLLM takes them before its next step."""
        items, params, aliases = check_named_weights(self.model, named_tensors)
        self.set_weights_version(version)
        copy_named_weights(items, params, aliases, self.cfg.weight_bucket_mb)

    def set_weights_version(self, version: int) -> None:
        """The module tree holds weights `version` (the trainer or the sync wrote them); vLLM
        reloads them before its next step."""
        if not isinstance(version, int):
            raise PoiseError(f"weights version must be an int, got {version!r}")
        in_flight = len(self._live) + sum(1 for req in self._pending if req.tokens)
        if in_flight and version != self.version:
            raise EngineBusyError(f"changing weights with {in_flight} sequences in flight would mix weights "
                                  f"versions {self.version} and {version} in one sample; abort them first")
        self.version = version
        if self._loaded is not None:
            self._loaded = None  # the tree may have changed even at the same version number (a resume)

    def release(self) -> None:
        """Shut vLLM down (its process and KV cache) and remove what it had on /dev/shm; the next
        step starts it again."""
        if not self.occupancy.idle:
            raise EngineBusyError(self.occupancy.busy("release"))
        if self._llm is not None:
            _record_segments(self._dir)  # any queue made since the start
            self._llm.llm_engine.engine_core.shutdown()
            self._llm = None
            self._loaded = None
        if self._dir is not None:
            _remove_owned(self._dir)
            self._dir = None

    @property
    def cache_bytes(self) -> int:
        """Bytes vLLM holds for its KV cache (0 when it is not running)."""
        return self._kv_bytes() if self._llm is not None else 0

    def _kv_bytes(self) -> int:
        return int((self.cfg.kv_cache_gb or 1.0) * 2**30)

    # ---- the vLLM process ---------------------------------------------------------------------

    def _start(self) -> None:
        if self._llm is not None:
            return
        t = time.perf_counter()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # its own process: see the module docstring
        _quiet_vllm()
        shm = SHM if os.path.isdir(SHM) else None
        if shm is not None:
            sweep_stale_shm(Path(shm))
        self._dir = Path(tempfile.mkdtemp(prefix=f"poise-vllm-{os.getpid()}-", dir=shm))
        config = self.model.config
        if not config.architectures:  # a model built from a config (the seeded tiny one) names none
            config.architectures = [type(self.model).__name__]
        config.save_pretrained(self._dir)
        self._write_weights()
        from vllm import LLM

        device = next(self.model.parameters()).device
        before = set(os.listdir(shm)) if shm is not None else set()
        try:
            self._llm = self._launch(LLM, device)
        except BaseException:
            _remove_owned(self._dir)  # a failed start leaves nothing behind either
            self._dir = None
            raise
        # its message queues' segments (mapped), and multiprocessing's semaphores made meanwhile
        # (held by no mapping we can read), for release or a later sweep
        made = set(os.listdir(shm)) - before if shm is not None else set()
        _record_segments(self._dir, {name for name in made if name.startswith("sem.mp-")})
        self._loaded = self.version
        self.start_seconds = time.perf_counter() - t

    def _launch(self, LLM, device: torch.device):
        """vLLM's engine on the directory's model, in a process of its own."""
        return LLM(model=str(self._dir), skip_tokenizer_init=True, dtype=str(self.model.dtype).split(".")[-1],
                        seed=self.seed, max_model_len=self.context, max_num_seqs=self.num_slots,
                        # prompts are never chunked: seeded sampling on CPU fails on a chunked prefill
                        max_num_batched_tokens=max(self.cfg.max_prefill_tokens, self.context),
                        kv_cache_memory_bytes=self._kv_bytes(), enforce_eager=device.type != "cuda",
                        logprobs_mode="processed_logprobs", load_format="safetensors",
                        distributed_executor_backend="uni", enable_prefix_caching=True,
                        disable_log_stats=True)

    def _write_weights(self) -> None:
        """The module tree's weights as the directory's model.safetensors (renamed into place)."""
        from safetensors.torch import save_file

        state = {name: tensor.detach().to("cpu").clone().contiguous()  # tied aliases become copies
                 for name, tensor in self.model.state_dict().items()}
        part = self._dir / "weights.part"  # not *.safetensors: vLLM loads every such file it finds
        save_file(state, str(part))
        part.replace(self._dir / "model.safetensors")

    def _push_weights(self) -> None:
        t = time.perf_counter()
        self._write_weights()
        self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._dir)})
        self._loaded = self.version
        self.weight_loads.append(time.perf_counter() - t)


SHM = "/dev/shm"
SEGMENTS = "segments"  # in an engine's directory: the shared-memory segments its processes mapped


def _process_tree() -> list[int]:
    """This process and its descendants (vLLM's engine-core process and its helpers)."""
    import psutil  # a vLLM dependency

    me = psutil.Process()
    return [me.pid] + [child.pid for child in me.children(recursive=True)]


def _mapped_segments(pids: Iterable[int]) -> set[str]:
    """Names of the /dev/shm files (not directories) that `pids` map or hold open."""
    names: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths = [line.split(maxsplit=5)[-1].strip() for line in f if f" {SHM}/" in line]
            paths += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        names |= {path[len(SHM) + 1:] for path in paths
                  if path.startswith(SHM + "/") and "/" not in path[len(SHM) + 1:] and not path.endswith("(deleted)")}
    return names


def _record_segments(directory: Path | None, extra: set[str] = frozenset()) -> None:
    """Add the segments this process tree maps, and `extra`, to `directory`'s list (never the
    engines' own directories: those are removed as a whole)."""
    if directory is None or not directory.is_dir():
        return
    listed = directory / SEGMENTS
    known = set(listed.read_text().split()) if listed.is_file() else set()
    found = {name for name in _mapped_segments(_process_tree()) | set(extra) if not name.startswith("poise-vllm-")}
    if found - known:
        part = directory / (SEGMENTS + ".part")
        part.write_text("\n".join(sorted(known | found)) + "\n")
        part.replace(listed)


def _remove_owned(directory: Path) -> list[str]:
    """Unlink the segments `directory` lists (those still there) and remove it; what went."""
    root, gone = directory.parent, []
    listed = directory / SEGMENTS
    for name in (listed.read_text().split() if listed.is_file() else []):
        with contextlib.suppress(FileNotFoundError):
            (root / name).unlink()
            gone.append(name)
    shutil.rmtree(directory, ignore_errors=True)
    return gone + [directory.name]


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process of that pid: alive
        return True
    return True


def sweep_stale_shm(root: Path = Path(SHM)) -> list[str]:
    """Remove what vLLM engines of processes that are gone left in `root` (a crash, a killed
    actor: no `release` ran): each `poise-vllm-<pid>-*` directory whose process is dead, and the
    shared-memory segments it lists. Returns the names removed."""
    removed: list[str] = []
    for directory in sorted(root.glob("poise-vllm-*")):
        owner = directory.name.split("-")[2]
        if owner.isdigit() and not _owner_alive(int(owner)):
            removed += _remove_owned(directory)
    return removed


def vllm_installed() -> bool:
    """Whether this Python can import vLLM (a folder named vllm on the path, a namespace package with
    no code, does not count)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except ImportError:  # a finder that refuses it
        return False
    return spec is not None and spec.origin is not None


_TINY_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                       "mistral": "MistralForCausalLM"}


def check_vllm(model: ModelConfig, device: str) -> None:
    """Before the run directory and Ray: vLLM is importable here, knows the model's architecture
    and, on CPU, has an attention kernel for its head size. Raises PoiseError with the fix."""
    if not vllm_installed():
        raise PoiseError("rollout.backend=vllm needs vLLM, which this Python does not have: run `make vllm` and "
                         "train from its venv (.venv-vllm/bin/poise train ...), or set rollout.backend=poise")
    config = Path(model.path or "") / "config.json"
    if model.path is None or not config.exists():  # the seeded tiny model, or the one sft_if_missing makes
        tiny = model.tiny
        archs, head_dim = [_TINY_ARCHITECTURES[tiny.arch]], tiny.hidden_size // tiny.num_heads
    else:
        found = json.loads(config.read_text())
        # a model Poise built from a config (the tiny one, after `poise sft`) names no architecture:
        # the engine names its class's when it starts vLLM, and that follows from the model type
        archs = found.get("architectures") or [_TINY_ARCHITECTURES.get(found.get("model_type"), "(none)")]
        head_dim = found.get("head_dim") or found.get("hidden_size", 0) // max(1, found.get("num_attention_heads", 1))
    _quiet_vllm()
    with contextlib.redirect_stderr(io.StringIO()):  # a note vLLM prints at import, before its logging is set up
        import vllm
        from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if not any(arch in supported for arch in archs):
        raise PoiseError(f"rollout.backend=vllm cannot load model.path={model.path}: vLLM {vllm.__version__} knows no "
                         f"architecture of {archs} (config.json 'architectures'); set rollout.backend=poise")
    if device == "cpu":
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            what = f"model.path={model.path}" if model.path and config.exists() else "the tiny model (model.tiny)"
            raise PoiseError(f"rollout.backend=vllm cannot run {what} on CPU: its attention head size {head_dim} is "
                             f"not one of vLLM's CPU kernels' {sizes}; choose a model whose hidden size / heads is "
                             "one of them, or set rollout.backend=poise")


def _quiet_vllm() -> None:
    """vLLM logs at ERROR only (unless VLLM_LOGGING_LEVEL says otherwise): its start-up notes are about
    serving (tokenizers, chat templates, preloaded allocators), not this use, and bury Poise's lines."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def request_seed(seed: int, sample_id: SampleId, position: int, turn: int = 0) -> int:
    """vLLM's per-request seed: a function of the run's seed, the sample id (and an episode's turn)
    and the tokens already generated (a resumed partial draws from its own position on).
    Non-negative, below 2^63."""
    return (turn_key_prefix(seed, sample_id, turn) ^ (position * 0x9E3779B97F4A7C15)) & (2**63 - 1)
