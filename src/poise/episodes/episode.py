"""One episode as one token sequence: the prompt, then model turns and observations alternating.

Token in, token out: a model turn's tokens are kept exactly as the engine sampled them (its EOS
included), never decoded and encoded again; an observation is encoded once and appended. The
trainer sees one sample whose `loss_mask` is 1 on model tokens and 0 on observation tokens.

What the model reads (docs/episodes.md): with the built-in tokenizer,

    <bos>guess\n  4<eos>  higher\n  6<eos>  lower\n  5<eos>
    prompt        turn 0  obs       turn 1  obs      turn 2

and with an HF chat template, each observation is a user message in the template's own markers,
ending with the assistant's generation prompt (`HFTokenizer.chat_observation_ids`).

Each turn is a request whose prompt is the episode so far and whose sampling keys are those of
(sample id, turn) (`Request.turn`), so a turn's tokens are a function of the episode's history
alone: any device may run any turn, and an interrupted turn resumes like any partial sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from poise.types import Request, Sample, SampleId

ENDS = ("done", "max_turns", "max_tokens", "env_failure")  # why an episode ended


@dataclass
class Episode:
    sample_id: SampleId
    prompt_ids: tuple[int, ...]  # the prompt, with the environment's first observation if it gave one
    budget: int  # tokens after the prompt at most, model and observation tokens together
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # each model turn's text, as the environment saw it
    env_reward: float = 0.0
    end: str | None = None  # one of ENDS once over
    failure: str | None = None  # why an environment call failed (end 'env_failure')
    version: int | None = None
    submit_time: float = 0.0
    finish_time: float = 0.0
    finish_reason: str = "eos"
    max_new_tokens: int = 0
    env_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0

    @property
    def turn(self) -> int:
        """Model turns so far."""
        return len(self.actions)

    @property
    def over(self) -> bool:
        return self.end is not None

    def request(self, max_new_tokens: int) -> Request:
        """The next model turn: the episode so far as its prompt, within the episode's budget."""
        room = self.budget - len(self.tokens)
        return Request(self.sample_id, self.prompt_ids + tuple(self.tokens), min(max_new_tokens, room), turn=self.turn)

    def add_turn(self, sample: Sample, text: str) -> None:
        """A finished model turn: its tokens as sampled (the model's), its text for the environment."""
        if sample.turn != self.turn:
            raise RuntimeError(f"episode {self.sample_id}: got turn {sample.turn}, expected turn {self.turn}")
        if self.version is not None and sample.weights_version != self.version:
            raise RuntimeError(f"episode {self.sample_id}: turn {sample.turn} was generated under weights version "
                               f"{sample.weights_version}, its earlier turns under {self.version}")
        if not self.actions:
            self.submit_time = sample.submit_time
        self.version = sample.weights_version
        self.tokens += sample.token_ids
        self.mask += [1] * len(sample.token_ids)
        self.logprobs += sample.logprobs
        self.actions.append(text)
        self.finish_time, self.finish_reason = sample.finish_time, sample.finish_reason
        self.max_new_tokens = max(self.max_new_tokens, sample.max_new_tokens)
        if len(self.tokens) >= self.budget:
            self.end = "max_tokens"

    def add_observation(self, ids: list[int]) -> None:
        """An observation's tokens (trained by nobody); one that leaves no room for a model token
        ends the episode instead (`max_tokens`)."""
        if len(self.tokens) + len(ids) >= self.budget:
            self.end = "max_tokens"
            return
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def sample(self) -> Sample:
        """The episode as the trainer sees it: one sample with a loss mask (observations 0)."""
        return Sample(self.sample_id, self.prompt_ids, tuple(self.tokens), tuple(self.logprobs),
                      self.finish_reason, self.version if self.version is not None else 0, self.submit_time,
                      self.finish_time, self.max_new_tokens, turn=self.turn, loss_mask=tuple(self.mask))


__all__ = ["Episode", "ENDS"]
