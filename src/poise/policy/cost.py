"""Cost model: seconds for decode, prefill, train, weight sync and each phase of a resize.

One object answers every "how long would this take" question the policy asks, so the
allocator, the resize controller, the dispatcher, the simulator and the runtime
all price work the same way. Two sources, one interface:

    cost = CostModel(CostConfig(...))                 # written by hand (scenario YAML `cost:`)
    cost = CostModel.from_profile(profile_dict, cfg)  # fitted from `poise profile` JSON
                                                      # (docs/profile-format.md); the caller
                                                      # reads the file, this module does no I/O

    cost.decode_step_s(batch, context)    one batched decode step: a token for each of `batch`
                                          live sequences whose mean context is `context` tokens
    cost.decode_segment_s(batch, ctx_sum, steps)
                                          `steps` decode steps with a constant batch whose
                                          contexts sum to `ctx_sum` at the first step
    cost.prefill_s(tokens)                prefill of one request
    cost.train_s(tokens, devices)         forward+backward+optimizer over `tokens`, data-parallel
    cost.sync_s(nbytes=None)              trainer -> rollout weight broadcast (default: whole model)
    cost.resize(mode)                     ResizeCost: phases on the critical path and behind it
    cost.on_devices(ref, rollout, train, link)
                                          the same model with each role priced on its device
                                          type and weight sync across a link (policy/devices.py)

`ContinuousBatch` is the continuous-batching kernel (Orca-style iteration-level batching: a
finished sequence's slot is refilled at the next step); `instance_finish_times` runs it over a
queue. The estimators here, the dispatcher, the simulator's rollout instances and the emulated
engine all price generation through it. Pure Python: no torch, no clock, no global random.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from poise.errors import ConfigError, PoiseError
from poise.policy.devices import DeviceType, Link
from poise.schema import check, help_factory, help_field

ResizeMode = Literal["live", "hard"]

# DynaResize Fig. 6 (Exp#2), 8xH20, Qwen3-8B: live 187.2 s and hard 254.8 s on the critical
# path. The four bars are read off the figure; the last phase absorbs the rounding so the
# totals match the paper. The deferred optimizer restore (§3.3) runs behind the first
# forward/backward on the new topology; its length is ours (not reported in the paper).
_LIVE = {"state_export": 60.7, "worker_reinit": 32.6, "weight_restore_comm_prewarm": 45.8,
         "resize_postprocess": 48.1}
_LIVE_BACKGROUND = {"optimizer_restore": 30.0}
_HARD = {"state_export": 59.7, "worker_reinit": 60.3, "weight_restore": 104.1,
         "resize_postprocess": 30.7}


@dataclass(frozen=True)
class CostConfig:
    """Hand-written cost coefficients; a profile JSON (if given) replaces the decode/prefill/
    train/sync tables, and the resize phases where it measured them (`poise profile --resize`)."""

    decode_base_s: float = help_field(0.012, "seconds of one decode step independent of batch "
                                      "(reading the weights: memory-bound)")
    decode_per_seq_s: float = help_field(1.5e-4, "extra seconds per live sequence in the batch (its "
                                         "matmuls: compute-bound)")
    decode_per_kv_token_s: float = help_field(4e-8, "extra seconds per context token held in the "
                                              "KV cache of the batch (attention reads)")
    prefill_per_token_s: float = help_field(4e-5, "prefill seconds per prompt token")
    train_per_token_s: float = help_field(1.0e-3, "forward+backward seconds per token on one device")
    train_fixed_s: float = help_field(1.0, "per-step optimizer and bookkeeping seconds")
    train_allreduce_s: float = help_field(0.5, "gradient all-reduce seconds per step when more "
                                          "than one train device")
    weight_bytes: float = help_field(16e9, "bytes of weights broadcast trainer -> rollout per step")
    sync_bandwidth: float = help_field(25e9, "weight-sync bandwidth, bytes per second")
    sync_latency_s: float = help_field(0.05, "fixed seconds per weight sync")
    sync_bucket_bytes: float = help_field(1e9, "bytes per weight-sync bucket; across a link between device "
                                          "groups each bucket is one blocking send that pays the link latency")
    device: str | None = help_field(None, "device type these coefficients were measured on (a preset or a "
                                    "cluster.device_types name); other types are priced by spec ratios to it. "
                                    "Default: the first of cluster.device_types")
    resize_live: dict[str, float] = help_factory(lambda: dict(_LIVE),
                                                 "live resize phases on the critical path, seconds")
    resize_live_background: dict[str, float] = help_factory(
        lambda: dict(_LIVE_BACKGROUND), "live resize phases that run behind the first train "
        "step on the new topology; the optimizer step waits for them")
    resize_hard: dict[str, float] = help_factory(lambda: dict(_HARD),
                                                 "hard (stop, checkpoint, rebuild) resize phases")
    profile: str | None = help_field(None, "path of a `poise profile` JSON; its tables replace "
                                     "the decode/prefill/train/sync coefficients above")

    def __post_init__(self) -> None:
        for name in ("decode_base_s", "decode_per_seq_s", "decode_per_kv_token_s",
                     "prefill_per_token_s", "train_per_token_s", "train_fixed_s",
                     "train_allreduce_s", "weight_bytes", "sync_latency_s"):
            value = getattr(self, name)
            check(value >= 0, f"cost.{name}", value, "must be >= 0 seconds (or bytes)")
        check(self.decode_base_s > 0 or self.decode_per_seq_s > 0, "cost.decode_base_s",
              self.decode_base_s, "decode must cost something: set decode_base_s > 0")
        check(self.sync_bandwidth > 0, "cost.sync_bandwidth", self.sync_bandwidth,
              "must be > 0 bytes per second")
        check(self.sync_bucket_bytes > 0, "cost.sync_bucket_bytes", self.sync_bucket_bytes, "must be > 0 bytes")
        for table in ("resize_live", "resize_live_background", "resize_hard"):
            for phase, seconds in getattr(self, table).items():
                check(seconds >= 0, f"cost.{table}.{phase}", seconds, "must be >= 0 seconds")


class PiecewiseLinear:
    """y(x) by linear interpolation over sorted points, extrapolating the end segments."""

    def __init__(self, points: Sequence[tuple[float, float]], name: str):
        pts = sorted((float(x), float(y)) for x, y in points)
        if not pts:
            raise PoiseError(f"profile table '{name}' is empty; rerun `poise profile`")
        self.xs = [p[0] for p in pts]
        self.ys = [p[1] for p in pts]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0] * (x / xs[0] if xs[0] else 1.0)  # one point: proportional
        i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        if x1 == x0:
            return y0
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class ResizeCost:
    """Priced resize: `phases` run one after another on the critical path (everything stops);
    `background` phases overlap the first train step on the new topology (DynaResize §3.3)."""

    mode: str
    phases: tuple[tuple[str, float], ...]
    background: tuple[tuple[str, float], ...]

    @property
    def critical_path_s(self) -> float:
        return sum(s for _, s in self.phases)

    @property
    def background_s(self) -> float:
        return sum(s for _, s in self.background)


class CostModel:
    """Prices work in seconds; see the module docstring for the interface."""

    def __init__(self, cfg: CostConfig | None = None, tables: Mapping[str, Any] | None = None):
        self.cfg = cfg or CostConfig()
        self._decode_grid: list[tuple[float, PiecewiseLinear]] | None = None
        self._prefill = self._train = self._sync = None
        self._train_allreduce_s: float | None = None  # set by a profile's train table
        self._resize: dict[str, ResizeCost] = {}  # measured resize phases (`poise profile --resize`)
        # set by on_devices: the link weight sync crosses, the model as written (on the reference
        # type) and the factors on a profile's decode, prefill and train tables
        self.link: Link | None = None
        self._written: CostModel | None = None
        self._table_scale = (1.0, 1.0, 1.0)
        self._decode_floor_s = 0.0  # seconds per live sequence: its matmuls at this type's TFLOPS
        if tables:
            self._load_tables(tables)

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any], cfg: CostConfig | None = None) -> "CostModel":
        """A cost model whose decode/prefill/train/sync come from profile JSON (already parsed)."""
        if profile.get("format") != "poise-profile/1":
            raise PoiseError(f"profile format {profile.get('format')!r} is not 'poise-profile/1'; "
                             "regenerate it with `poise profile`")
        return cls(cfg, tables=profile)

    def _load_tables(self, p: Mapping[str, Any]) -> None:
        try:
            by_ctx: dict[float, list[tuple[float, float]]] = {}
            for row in p["decode"]:
                by_ctx.setdefault(float(row.get("context", 0)), []).append(
                    (float(row["batch"]), float(row["seconds_per_step"])))
            self._decode_grid = [(c, PiecewiseLinear(pts, "decode")) for c, pts in sorted(by_ctx.items())]
            self._prefill = PiecewiseLinear([(r["tokens"], r["seconds"]) for r in p["prefill"]], "prefill")
            if p.get("train"):
                self._train = PiecewiseLinear([(r["tokens"], r["seconds"]) for r in p["train"]], "train")
                # each row times a whole update (optimizer step included): the fixed part is the
                # table's intercept; only a measured all-reduce is added for >1 train devices
                self._train_allreduce_s = float(p.get("train_allreduce_s", 0.0))
            for mode, r in (p.get("resize") or {}).items():
                self._resize[mode] = ResizeCost(mode, tuple((k, float(v)) for k, v in r["phases"].items()),
                                                tuple((k, float(v)) for k, v in r.get("background", {}).items()))
            if p.get("weight_sync"):
                self._sync = PiecewiseLinear([(r["bytes"], r["seconds"]) for r in p["weight_sync"]],
                                             "weight_sync")
        except (KeyError, TypeError, ValueError) as e:
            raise PoiseError(f"profile JSON is missing or has a bad field ({e!r}); see "
                             "docs/profile-format.md or regenerate it with `poise profile`") from None

    # --- generation -------------------------------------------------------------------------
    def decode_step_s(self, batch: int, context: float) -> float:
        if batch <= 0:
            return 0.0
        if self._decode_grid is not None:
            grid = self._decode_grid
            ctxs = [c for c, _ in grid]
            if len(grid) == 1:
                return self._table_scale[0] * grid[0][1](batch)
            i = min(max(bisect.bisect_right(ctxs, context) - 1, 0), len(grid) - 2)
            (c0, f0), (c1, f1) = grid[i], grid[i + 1]
            y0, y1 = f0(batch), f1(batch)
            return self._table_scale[0] * max(0.0, y0 + (y1 - y0) * (context - c0) / (c1 - c0))
        c = self.cfg
        step = c.decode_base_s + c.decode_per_seq_s * batch + c.decode_per_kv_token_s * batch * context
        return max(step, self._decode_floor_s * batch) if self._decode_floor_s else step

    def decode_segment_s(self, batch: int, ctx_sum: float, steps: int) -> float:
        """`steps` decode steps at constant `batch`; contexts sum to `ctx_sum` at the first step
        and grow by `batch` per step. Exact for the linear model (the mean context over the
        segment is its midpoint), midpoint-interpolated for a profile table."""
        if steps <= 0 or batch <= 0:
            return 0.0
        if self._decode_grid is None:  # decode_step_s's linear model summed in closed form (the hot path)
            c = self.cfg
            if self._decode_floor_s:  # a placed type: the roofline's compute floor may bind
                return self._floored_segment_s(batch, ctx_sum, steps)
            return steps * (c.decode_base_s + c.decode_per_seq_s * batch
                            + c.decode_per_kv_token_s * (ctx_sum + batch * (steps - 1) / 2.0))
        mean_ctx = ctx_sum / batch + (steps - 1) / 2.0
        return steps * self.decode_step_s(batch, mean_ctx)

    def _floored_segment_s(self, batch: int, ctx_sum: float, steps: int) -> float:
        """`decode_segment_s` when each step is max(memory-bound step, compute floor): the
        segment is compute-bound until the growing KV reads (per_kv x batch more each step)
        catch up with the floor, memory-bound after; both parts in closed form."""
        c = self.cfg
        first = c.decode_base_s + c.decode_per_seq_s * batch + c.decode_per_kv_token_s * ctx_sum
        floor = self._decode_floor_s * batch
        grow = c.decode_per_kv_token_s * batch
        if first >= floor:
            bound = 0
        else:
            bound = steps if grow <= 0 else min(steps, math.ceil((floor - first) / grow))
        return bound * floor + (steps - bound) * (first + grow * (bound + steps - 1) / 2.0)

    def prefill_s(self, tokens: float) -> float:
        if self._prefill is not None:
            return self._table_scale[1] * self._prefill(tokens)
        return self.cfg.prefill_per_token_s * tokens

    # --- training and sync ------------------------------------------------------------------
    def train_compute_s(self, tokens: float, devices: int) -> float:
        """Forward+backward seconds for `tokens` split evenly over `devices` (no fixed part)."""
        if devices < 1:
            raise ConfigError("train devices", devices, "need at least one train device")
        per_device = tokens / devices
        if self._train is not None:
            return self._table_scale[2] * self._train(per_device)
        return self.cfg.train_per_token_s * per_device

    def train_fixed_s(self, devices: int) -> float:
        """Per-step seconds that do not shrink with devices: optimizer step and all-reduce."""
        if self._train_allreduce_s is not None:  # a profile's train table holds the optimizer step
            return self._train_allreduce_s if devices > 1 else 0.0
        return self.cfg.train_fixed_s + (self.cfg.train_allreduce_s if devices > 1 else 0.0)

    def train_s(self, tokens: float, devices: int) -> float:
        return self.train_compute_s(tokens, devices) + self.train_fixed_s(devices)

    def sync_s(self, nbytes: float | None = None) -> float:
        """Broadcast of `nbytes` (default: the whole model, `weight_bytes`) trainer -> rollout."""
        nbytes = self.cfg.weight_bytes if nbytes is None else nbytes
        if self.link is not None:
            return self.link_sync_s(nbytes)
        if self._sync is not None:
            return self._sync(nbytes)
        return self.cfg.sync_latency_s + nbytes / self.cfg.sync_bandwidth

    def link_sync_s(self, nbytes: float) -> float:
        """Weight sync from the train group across `self.link` to the rollout group (StreamRL
        §7.3: point-to-point across datacenters). The weights go in `sync_bucket_bytes` buckets,
        each one blocking send over the link (its latency + bytes / bandwidth) to one rollout
        device, which broadcasts it inside its group (the local sync) while the next bucket
        crosses: a two-stage pipeline, so the slower stage sets the pace."""
        link, c = self.link, self.cfg
        assert link is not None
        buckets = math.ceil(nbytes / c.sync_bucket_bytes)
        if buckets == 0:
            return 0.0 if self._sync is not None else c.sync_latency_s
        size = nbytes / buckets
        cross = link.latency_s + size / link.bytes_per_s
        local = self._sync(size) if self._sync is not None else size / c.sync_bandwidth
        fixed = 0.0 if self._sync is not None else c.sync_latency_s  # a profile's rows include it
        return fixed + buckets * max(cross, local) + min(cross, local)

    # --- device types -----------------------------------------------------------------------
    def on_devices(self, reference: DeviceType, rollout: DeviceType, train: DeviceType,
                   link: Link | None = None) -> "CostModel":
        """This model (coefficients measured on `reference`) with each role priced on its type.

        Decode is a roofline: the reference's decode step is memory traffic (weights and KV
        cache read once per step; StreamRL §2.2), so on `rollout` it takes the bandwidth ratio
        times as long, but no less than its sequences' matmuls at `rollout`'s TFLOPS
        (`decode_per_seq_s` x batch x the TFLOPS ratio): a type with little compute (H20)
        becomes compute-bound at large batches. Prefill and forward/backward are compute-bound
        (TFLOPS ratio); the optimizer step streams parameters and moments (bandwidth ratio); the
        all-reduce and the local sync are network (unchanged). A profile's decode table is
        scaled by bandwidth alone (no compute floor: it does not separate the matmuls), its
        train table (optimizer step included) by TFLOPS. `link`: the one weight sync crosses
        (None: the roles share a group). Placing a placed model places the model as written;
        placing on the reference type changes no number."""
        base = self._written or self
        c = base.cfg
        rollout_bw = reference.mem_bw_tbps / rollout.mem_bw_tbps  # type: ignore[operator]
        rollout_flops = reference.tflops / rollout.tflops  # type: ignore[operator]
        train_flops = reference.tflops / train.tflops  # type: ignore[operator]
        train_bw = reference.mem_bw_tbps / train.mem_bw_tbps  # type: ignore[operator]
        placed = copy.copy(base)
        placed.cfg = dataclasses.replace(
            c, decode_base_s=c.decode_base_s * rollout_bw, decode_per_seq_s=c.decode_per_seq_s * rollout_bw,
            decode_per_kv_token_s=c.decode_per_kv_token_s * rollout_bw,
            prefill_per_token_s=c.prefill_per_token_s * rollout_flops,
            train_per_token_s=c.train_per_token_s * train_flops, train_fixed_s=c.train_fixed_s * train_bw)
        placed._table_scale = (rollout_bw, rollout_flops, train_flops)
        # the floor can bind only on a type with less compute per unit of bandwidth than the
        # reference (never on the reference itself, whose numbers stay exactly as written)
        binds = rollout_flops > rollout_bw and base._decode_grid is None
        placed._decode_floor_s = c.decode_per_seq_s * rollout_flops if binds else 0.0
        placed.link = link
        placed._written = base
        return placed

    # --- resizing ---------------------------------------------------------------------------
    def resize(self, mode: str) -> ResizeCost:
        if mode in self._resize:  # measured on this machine
            return self._resize[mode]
        if mode == "live":
            return ResizeCost("live", tuple(self.cfg.resize_live.items()),
                              tuple(self.cfg.resize_live_background.items()))
        if mode == "hard":
            return ResizeCost("hard", tuple(self.cfg.resize_hard.items()), ())
        raise ConfigError("resize.mode", mode, "allowed: 'live', 'hard'")


class ContinuousBatch:
    """One rollout instance's continuous batching (Orca-style iteration-level batching), one
    finish at a time: the only statement of its timing rule. The estimators here, the dispatcher,
    the simulator's instances (`instance_finish_times`) and the emulated engine (which sleeps
    what it returns) all step it.

        batch = ContinuousBatch(cost, cap)
        seconds = batch.admit(key, prompt_len, length)   # the prefill; needs batch.free > 0
        seconds, done = batch.advance()                  # decode up to the next finish

    Every live sequence gains a token per decode step; between two finishes the batch is
    constant, so the decode of that segment is priced in one call (`decode_segment_s`). `done`
    lists the keys that finished, in admission order; their slots are free for the next admit.
    """

    def __init__(self, cost: CostModel, cap: int):
        if cap < 1:
            raise ConfigError("batch_cap", cap, "must be >= 1 slot")
        self.cap = cap
        self._prefill, self._segment = cost.prefill_s, cost.decode_segment_s
        self._step = 0  # decode steps taken so far
        self._live: list[tuple[int, int, int, Any]] = []  # heap: (finish step, admission no, ctx base, key)
        self._ctx_base = 0  # sum over live of (prompt_len - admission step): context sum = base + live * step
        self._admitted = 0
        self._admit_step: dict[Any, int] = {}  # key -> decode step it was admitted at

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def free(self) -> int:
        return self.cap - len(self._live)

    def admit(self, key: Any, prompt_len: int, length: int, prefill_tokens: int | None = None) -> float:
        """Start `key` (a `prompt_len`-token context that will generate `length` tokens, at least 1);
        returns its prefill seconds: of the whole context, or of `prefill_tokens` of it when the
        rest is still cached (an episode that kept its slot)."""
        if len(self._live) >= self.cap:
            raise RuntimeError(f"continuous batch: all {self.cap} slots are live; advance before admitting")
        base = prompt_len - self._step
        self._admit_step[key] = self._step
        heapq.heappush(self._live, (self._step + max(1, int(length)), self._admitted, base, key))
        self._admitted += 1
        self._ctx_base += base
        return self._prefill(prompt_len if prefill_tokens is None else prefill_tokens)

    def next_finish_s(self) -> float:
        """Seconds of decode up to the next finish (what `advance()` would take), 0 when empty."""
        if not self._live:
            return 0.0
        b, step = len(self._live), self._step
        return self._segment(b, self._ctx_base + b * step, self._live[0][0] - step)

    def advance(self, limit_s: float | None = None) -> tuple[float, list[Any]]:
        """Decode until the next sequence finishes: (seconds, the keys that finished then). With
        `limit_s`, stop instead at the first step boundary at or after `limit_s` seconds when that
        comes first: where a request that arrived meanwhile joins the batch (iteration-level)."""
        if not self._live:
            return 0.0, []
        live, step = self._live, self._step
        end = live[0][0]
        b = len(live)
        ctx = self._ctx_base + b * step
        if limit_s is not None and self._segment(b, ctx, end - step) > limit_s:
            steps = self._steps_to_reach(b, ctx, end - step, limit_s)
            self._step = step + steps
            return self._segment(b, ctx, steps), []
        seconds = self._segment(b, ctx, end - step)
        self._step = end
        done = []
        while live and live[0][0] == end:
            _, _, base, key = heapq.heappop(live)
            self._ctx_base -= base
            self._admit_step.pop(key, None)
            done.append(key)
        return seconds, done

    def _steps_to_reach(self, batch: int, ctx_sum: float, most: int, limit_s: float) -> int:
        """The fewest decode steps (1..`most`) whose segment takes at least `limit_s` seconds
        (a binary search: the segment grows with its steps)."""
        lo, hi = 1, most
        while lo < hi:
            mid = (lo + hi) // 2
            if self._segment(batch, ctx_sum, mid) >= limit_s:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def drain(self) -> list[tuple[Any, int]]:
        """Remove every live sequence (an abort); returns (key, tokens generated so far) each."""
        out = []
        for _, _, base, key in sorted(self._live, key=lambda e: e[1]):
            out.append((key, self._step - self._admit_step[key]))
        self._live.clear()
        self._ctx_base = 0
        self._admit_step.clear()
        return out


def instance_finish_times(cost: CostModel, lengths: Sequence[int], prompt_lens: Sequence[int],
                          batch_cap: int, start: float = 0.0,
                          admitted: list[float] | None = None) -> list[float]:
    """Finish time of each request on one rollout instance with continuous batching
    (`ContinuousBatch`), every request queued at `start`.

    Requests are admitted in the given order whenever a slot is free (FIFO queue, at most
    `batch_cap` live); each admission costs its prefill. Returns finish times in the input order
    (and, if `admitted` is a list, fills in when each one's prefill began). Used by the
    allocator's estimate, the dispatcher's makespan and the simulator's rollout instances.
    """
    n = len(lengths)
    finish = [0.0] * n
    if n == 0:
        return finish
    batch = ContinuousBatch(cost, batch_cap)
    admit, advance = batch.admit, batch.advance  # the simulator's hot loop: no attribute lookups
    t = start
    nxt = live = 0
    while nxt < n or live:
        while nxt < n and live < batch_cap:
            if admitted is not None:
                admitted[nxt] = t
            t += admit(nxt, prompt_lens[nxt], lengths[nxt])
            nxt += 1
            live += 1
        seconds, done = advance()
        t += seconds
        live -= len(done)
        for i in done:
            finish[i] = t
    return finish


def predict_rollout_s(cost: CostModel, lengths: Sequence[int], prompt_len: int, instances: int,
                      batch_cap: int) -> float:
    """Generation makespan of one step: requests dealt longest-first round-robin over
    `instances` (a balanced dispatch); instance 0 gets the longest of each round, so its
    finish is the makespan. Cost is O(n/instances log n)."""
    if instances < 1:
        raise ConfigError("rollout instances", instances, "need at least one rollout instance")
    if not lengths:
        return 0.0
    ordered = sorted(lengths, reverse=True)[::instances]
    times = instance_finish_times(cost, ordered, [prompt_len] * len(ordered), batch_cap)
    return max(times)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return float(s[k])
