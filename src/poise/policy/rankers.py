"""Output-length rankers (StreamRL §5.2): predict which prompts will produce the longest outputs,
so the dispatcher can isolate the long tail.

Interface (dispatcher, simulator, runtime's stream generation service):

    ranker.scores(prompts)    -> list[float]   predicted output length in tokens, one per prompt;
                                               only the order matters to the dispatcher, but
                                               length-like values let it size the tail group
    ranker.observe(finished)  -> None          learn from finished samples (prompt, length)

Four rankers: `OracleRanker` (true lengths: the upper bound), `RandomRanker` (the baseline),
`HistoryRanker` (a prompt's mean length in earlier epochs — RhymeRL's observation that a prompt's
length repeats across epochs) and `LearnedRanker` (online ridge regression from prompt features
to log length, trained on finished samples). Departure from the paper: StreamRL fine-tunes a
small LLM as the ranker offline; ours are cheap online models with no weights to ship. The fifth,
`lm` (a small transformer trained online, StreamRL's kind of ranker), needs torch, so it lives in
`poise.model.length_ranker` and reaches `make_ranker` only as an injected factory (`factories`,
which the torch side of the runtime passes); a torch-free process that asks for it gets a one-line
error. Held-out recall of every ranker: benchmarks/rankers.py.
`recall_at` is the paper's metric: the share of the true longest 20% that the ranker puts in
its predicted longest 20%. Pure Python; randomness only from a `random.Random` passed in.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class Prompt:
    """A prompt as a ranker and a dispatcher see it: a stable id, its text and/or precomputed
    features, and its length in tokens (0 = unknown; the dispatcher then assumes its default)."""

    prompt_id: str
    text: str = ""
    features: Mapping[str, float] = field(default_factory=dict)
    tokens: int = 0


@dataclass(frozen=True)
class Finished:
    prompt: Prompt
    output_length: int


class LengthRanker(Protocol):
    name: str

    def scores(self, prompts: Sequence[Prompt]) -> list[float]: ...

    def observe(self, finished: Sequence[Finished]) -> None: ...


class OracleRanker:
    """Knows each prompt's true output length (simulation and tests only)."""

    name = "oracle"

    def __init__(self, true_length: Callable[[Prompt], float]):
        self._true = true_length

    def scores(self, prompts: Sequence[Prompt]) -> list[float]:
        return [float(self._true(p)) for p in prompts]

    def observe(self, finished: Sequence[Finished]) -> None:
        pass


class RandomRanker:
    """Uniform random scores scaled to the mean length seen so far (the no-information baseline)."""

    name = "random"

    def __init__(self, rng: random.Random):
        self._rng = rng
        self._total = 0.0
        self._count = 0

    def scores(self, prompts: Sequence[Prompt]) -> list[float]:
        scale = 2 * self._total / self._count if self._count else 1.0
        return [self._rng.random() * scale for _ in prompts]

    def observe(self, finished: Sequence[Finished]) -> None:
        for f in finished:
            self._total += f.output_length
            self._count += 1


class HistoryRanker:
    """A prompt's mean output length over its earlier samples; unseen prompts get the global mean."""

    name = "history"

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._total = 0.0
        self._count = 0

    def scores(self, prompts: Sequence[Prompt]) -> list[float]:
        default = self._total / self._count if self._count else 0.0
        return [self._sum[p.prompt_id] / self._n[p.prompt_id] if p.prompt_id in self._n else default
                for p in prompts]

    def observe(self, finished: Sequence[Finished]) -> None:
        for f in finished:
            pid = f.prompt.prompt_id
            self._sum[pid] = self._sum.get(pid, 0.0) + f.output_length
            self._n[pid] = self._n.get(pid, 0) + 1
            self._total += f.output_length
            self._count += 1


_NUMBER = re.compile(r"-?\d+")
_WORD = re.compile(r"[A-Za-z]+")


def text_features(prompt: Prompt) -> dict[str, float]:
    """Generic prompt features: size of the text, the numbers in it, and the leading word (which
    usually names the task). Numeric features are also crossed with the leading word so a linear
    model can fit one slope per kind of task. Precomputed `prompt.features` are passed through."""
    text = prompt.text
    feats: dict[str, float] = {"bias": 1.0}
    nums = [int(x) for x in _NUMBER.findall(text)]
    words = _WORD.findall(text.lower())
    digits = sum(len(str(abs(n))) for n in nums)
    span = abs(nums[1] - nums[0]) if len(nums) >= 2 else 0
    biggest = max((abs(n) for n in nums), default=0)
    numeric = {
        "chars": len(text) / 100.0,
        "numbers": float(len(nums)),
        "digits": float(digits),
        "log_max": math.log1p(biggest),
        "span": span / 10.0,
        "span_digits": span * len(str(biggest)) / 10.0,
        "log_span": math.log1p(span),
    }
    feats.update(numeric)
    head = words[0] if words else "_"
    feats[f"w={head}"] = 1.0
    for k, v in numeric.items():
        feats[f"w={head}*{k}"] = v
    for k, v in prompt.features.items():
        feats[f"f:{k}"] = float(v)
    return feats


class LearnedRanker:
    """Online ridge regression of log(1 + length) on prompt features, refit from the running
    sufficient statistics (X^T X, X^T y) whenever new samples arrived. Features are discovered
    as they appear, so new task kinds need no configuration."""

    name = "learned"

    def __init__(self, featurize: Callable[[Prompt], Mapping[str, float]] = text_features,
                 l2: float = 1.0):
        self._featurize = featurize
        self._l2 = l2
        self._index: dict[str, int] = {}
        self._xtx: list[list[float]] = []
        self._xty: list[float] = []
        self._w: list[float] | None = None
        self._count = 0

    def _vector(self, prompt: Prompt, grow: bool) -> list[tuple[int, float]]:
        out = []
        for name, value in self._featurize(prompt).items():
            if value == 0.0:
                continue
            i = self._index.get(name)
            if i is None:
                if not grow:
                    continue
                i = self._index[name] = len(self._index)
                for row in self._xtx:
                    row.append(0.0)
                self._xtx.append([0.0] * (i + 1))
                self._xty.append(0.0)
            out.append((i, float(value)))
        return out

    def observe(self, finished: Sequence[Finished]) -> None:
        for f in finished:
            x = self._vector(f.prompt, grow=True)
            y = math.log1p(max(0, f.output_length))
            for i, a in x:
                self._xty[i] += a * y
                row = self._xtx[i]
                for j, b in x:
                    row[j] += a * b
            self._count += 1
        if finished:
            self._w = None

    def _weights(self) -> list[float]:
        if self._w is None:
            self._w = _solve_ridge(self._xtx, self._xty, self._l2)
        return self._w

    def scores(self, prompts: Sequence[Prompt]) -> list[float]:
        if not self._count:
            return [0.0] * len(prompts)
        w = self._weights()
        return [math.expm1(min(30.0, sum(w[i] * v for i, v in self._vector(p, grow=False))))
                for p in prompts]


def _solve_ridge(xtx: list[list[float]], xty: list[float], l2: float) -> list[float]:
    """Solve (X^T X + l2 I) w = X^T y by Gaussian elimination with partial pivoting."""
    n = len(xty)
    a = [row[:] + [xty[i]] for i, row in enumerate(xtx)]
    for i in range(n):
        a[i][i] += l2
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[piv] = a[piv], a[col]
        p = a[col][col]
        if abs(p) < 1e-12:
            continue
        inv = 1.0 / p
        row_c = a[col]
        for r in range(n):
            if r != col and a[r][col] != 0.0:
                f = a[r][col] * inv
                row_r = a[r]
                for k in range(col, n + 1):
                    row_r[k] -= f * row_c[k]
    return [a[i][n] / a[i][i] if abs(a[i][i]) > 1e-12 else 0.0 for i in range(n)]


def recall_at(scores: Sequence[float], true_lengths: Sequence[float], fraction: float = 0.2) -> float:
    """Share of the predicted longest `fraction` that belong to the true longest `fraction`.

    k = ceil(fraction * n). The true set is every item at least as long as the k-th longest, so
    ties at the boundary never count against a ranker; predicted ties break by position.
    """
    n = len(true_lengths)
    if n != len(scores):
        raise ValueError(f"{len(scores)} scores for {n} lengths")
    if n == 0:
        return 0.0
    k = max(1, math.ceil(fraction * n))
    cutoff = sorted(true_lengths, reverse=True)[k - 1]
    predicted = sorted(range(n), key=lambda i: (-scores[i], i))[:k]
    return sum(1 for i in predicted if true_lengths[i] >= cutoff) / k


RANKER_NAMES = ("oracle", "random", "history", "learned", "lm")


def make_ranker(name: str, rng: random.Random,
                true_length: Callable[[Prompt], float] | None = None,
                factories: Mapping[str, Callable[[random.Random], LengthRanker]] | None = None) -> LengthRanker:
    """A ranker by config name: oracle (needs `true_length`), random, history, learned, or one of
    `factories` (name -> factory taking `rng`: how the torch layer injects `lm` without policy/
    importing torch)."""
    from poise.errors import ConfigError

    if factories and name in factories:
        return factories[name](rng)
    if name == "lm":
        raise ConfigError("dispatch.ranker", name, "the language-model ranker needs torch and runs only in "
                          "`poise train` with cluster.compute=real; the simulator and emulated compute "
                          "use 'learned' or 'history'")
    if name == "oracle":
        if true_length is None:
            raise ConfigError("dispatch.ranker", name, "the oracle ranker needs true lengths "
                              "(simulation only); use history or learned for real runs")
        return OracleRanker(true_length)
    if name == "random":
        return RandomRanker(rng)
    if name == "history":
        return HistoryRanker()
    if name == "learned":
        return LearnedRanker()
    raise ConfigError("dispatch.ranker", name, "allowed: " + ", ".join(repr(n) for n in RANKER_NAMES))
