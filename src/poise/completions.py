"""Completions you can read: a few of each step's samples as text, in RUN_DIR/completions.jsonl.

    completions = Completions.of(cfg.run.log_completions, tokenizer)   # None: off, or no text
    log.completions(completions.rows(step, samples, problems, rewards, results))

Which samples: `pick`, by sample id alone (the first sample of each prompt, then the second, ...),
never by arrival, so a run logs the same rows on any split and after a resume. Each text is cut at
`MAX_CHARS` characters, the cut said in the text and by `truncated`. An episode (a sample with a
loss mask) shows its whole transcript after the prompt: model turns and environment observations,
each marked with its role. Torch-free: the colocated loop and the Ray driver both call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from poise.types import Sample, SampleId

class Prompted(Protocol):
    """What a row needs of a problem (data.tasks.Problem has it; this layer sits below data/)."""

    uid: str
    prompt: str


FILE = "completions.jsonl"
MAX_CHARS = 2000  # per text (prompt, completion): a long answer stays readable in a terminal and a page
OBSERVATION = ("[observation]\n", "\n[/observation]")  # how a transcript's observations are marked in `completion`


def pick(sample_ids: Iterable[SampleId], n: int) -> list[SampleId]:
    """The `n` ids of a step shown: sample 0 of each prompt in prompt order, then sample 1, ...; a
    function of the ids alone, so the same on every split and dispatch."""
    return sorted(sample_ids, key=lambda i: (i[2], i[1], i[0]))[:n]


def capped(text: str, max_chars: int = MAX_CHARS) -> tuple[str, bool]:
    """`text` cut at `max_chars` characters with the cut said at its end; (text, whether it was cut)."""
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}... [{len(text) - max_chars} more characters cut]", True


def transcript(sample: Sample, decode: Callable[[list[int]], str], eos_id: int | None) -> list[tuple[str, str]]:
    """(role, text) segments of a sample's tokens after the prompt: one `model` segment for a single
    answer; an episode's runs of model tokens (loss mask 1) and `observation` tokens (mask 0). EOS
    tokens are left out of the text (the finish reason says how a turn ended)."""
    mask = sample.loss_mask if sample.loss_mask is not None else (1,) * len(sample.token_ids)
    segments: list[tuple[str, list[int]]] = []
    for token, m in zip(sample.token_ids, mask):
        role = "model" if m else "observation"
        if not segments or segments[-1][0] != role:
            segments.append((role, []))
        if token != eos_id:
            segments[-1][1].append(token)
    return [(role, decode(ids)) for role, ids in segments] or [("model", "")]


@dataclass(frozen=True)
class Completions:
    """Builds a step's completions.jsonl rows: `per_step` samples (run.log_completions) decoded."""

    per_step: int
    decode: Callable[[list[int]], str]
    eos_id: int | None
    max_chars: int = MAX_CHARS

    @classmethod
    def of(cls, per_step: int, tokenizer: Any) -> "Completions | None":
        """None when off (`per_step` 0) or when there is no text (emulated compute has no tokenizer)."""
        if per_step <= 0 or tokenizer is None:
            return None
        return cls(per_step, tokenizer.decode, tokenizer.eos_id)

    def rows(self, step: int, samples: Sequence[Sample], problems: Sequence[Prompted],
             rewards: Mapping[SampleId, float], results: Mapping[SampleId, Any]) -> list[dict]:
        """The rows of step `step`. `rewards`: each sample's reward as trained on; `results`: each
        sample's RewardResult (its `parts`: every reward function's value)."""
        by_id = {tuple(s.sample_id): s for s in samples}
        return [self.row(step, by_id[i], problems[i[1]], rewards[i], results[i])
                for i in pick(by_id, self.per_step)]

    def row(self, step: int, sample: Sample, problem: Prompted, reward: float, result: Any) -> dict:
        prompt, prompt_cut = capped(problem.prompt, self.max_chars)
        segments = transcript(sample, self.decode, self.eos_id)
        text = "".join(t if role == "model" else f"{OBSERVATION[0]}{t}{OBSERVATION[1]}" for role, t in segments)
        completion, completion_cut = capped(text, self.max_chars)
        row = {"step": step, "id": list(sample.sample_id), "prompt_id": problem.uid, "prompt": prompt,
               "completion": completion, "reward": reward, "rewards": dict(getattr(result, "parts", {}) or {}),
               "length": len(sample.token_ids), "finish_reason": sample.finish_reason,
               "weights_version": sample.weights_version, "truncated": prompt_cut or completion_cut}
        if sample.loss_mask is not None:  # an episode: its turns, each capped by what the cap leaves
            left, turns = self.max_chars, []
            for role, t in segments:
                part, cut = capped(t, max(left, 0))
                turns.append({"role": role, "text": part})
                left -= len(t)
                if cut:
                    break
            row["turns"] = turns
        return row


def read_completions(run_dir: str | Path) -> list[dict]:
    """RUN_DIR/completions.jsonl's rows, a replayed step's (after --resume) once, in step and pick order."""
    from poise.runlog import read_jsonl

    path = Path(run_dir) / FILE
    if not path.is_file():
        return []
    by_id = {tuple(r["id"]): r for r in read_jsonl(path) if isinstance(r.get("id"), list)}
    order = {i: n for n, i in enumerate(pick(by_id, len(by_id)))}
    return sorted(by_id.values(), key=lambda r: (r["step"], order[tuple(r["id"])]))


__all__ = ["Completions", "FILE", "MAX_CHARS", "pick", "capped", "transcript", "read_completions"]
