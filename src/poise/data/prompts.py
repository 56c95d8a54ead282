"""A run's prompts: where they come from, the tokenizer, and the token ids of prompt and answer.

Shared by the colocated loop, the Ray driver and SFT. Torch-free, so the driver of an emulated
job and the tokenizer-only callers never load torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from poise.config import DataConfig, ModelConfig
from poise.data.tasks import DatasetSource, Problem, TaskSource
from poise.data.tokenizer import SEPARATOR, HFTokenizer, Tokenizer, load_tokenizer
from poise.errors import DataError, PoiseError
from poise.rewards.scorer import PendingRewards, RewardInput, RewardScorer
from poise.types import final_turn


def make_tokenizer(data: DataConfig, model: ModelConfig) -> Tokenizer:
    tokenizer = load_tokenizer(data.tokenizer, model.path)
    if data.chat_template and not isinstance(tokenizer, HFTokenizer):
        raise PoiseError(f"data.chat_template needs an HF tokenizer, but data.tokenizer '{data.tokenizer}' is the "
                         "built-in char tokenizer; point data.tokenizer at an HF tokenizer directory or set "
                         "data.chat_template=false")
    if data.chat_template and not tokenizer.has_chat_template:
        raise PoiseError(f"tokenizer '{tokenizer.name}' has no chat_template; add one to its tokenizer_config.json "
                         "or set data.chat_template=false")
    return tokenizer


def make_prompt_source(data: DataConfig, seed: int) -> TaskSource | DatasetSource:
    if data.dataset is not None:
        from poise.data.dataset import load_dataset

        return DatasetSource(seed, load_dataset(data.dataset, data.prompt_key, data.answer_key))
    return TaskSource(seed, data.phases or None, data.pool_size)


def encode_prompt(tokenizer: Tokenizer, problem: Problem, chat_template: bool = False,
                  system_prompt: str | None = None) -> list[int]:
    if chat_template:  # the template places BOS and the turn markers itself
        if not isinstance(tokenizer, HFTokenizer):
            raise PoiseError("data.chat_template needs an HF tokenizer; set data.tokenizer to a tokenizer directory")
        return tokenizer.chat_ids(problem.prompt, system_prompt)
    return [tokenizer.bos_id] + tokenizer.encode(problem.prompt) + tokenizer.encode(SEPARATOR)


def encode_answer(tokenizer: Tokenizer, problem: Problem) -> list[int]:
    return tokenizer.encode(problem.answer) + [tokenizer.eos_id]


class TaskSteps:
    """The step source of a real job: each step's prompts from the tasks or the dataset, their
    token ids, and each sample's exact reward (the emulated job's is runtime.emulated.Emulation)."""

    def __init__(self, data: DataConfig, model: ModelConfig, seed: int, prompts_per_step: int,
                 rewards: RewardScorer | None = None):
        self.data = data
        self.rewards = rewards  # the reward sandbox (submit_scores); its owner closes it
        self.tokenizer = make_tokenizer(data, model)
        self.source = make_prompt_source(data, seed)
        self.prompts_per_step = prompts_per_step

    def problems(self, step: int) -> list[Problem]:
        return self.source.prompts_for_step(step, self.prompts_per_step)

    def draws(self, step: int, draws: list[int]) -> list[Problem]:
        """Dynamic sampling: the problems of draws `draws` of step `step`; draw d < prompts_per_step
        is the step's own prompt d, a later one a function of (seed, step, d)."""
        own = self.problems(step) if any(d < self.prompts_per_step for d in draws) else []
        return [own[d] if d < self.prompts_per_step else self.source.prompt_for_draw(step, d) for d in draws]

    def prompt_ids(self, problem: Problem) -> list[int]:
        return encode_prompt(self.tokenizer, problem, self.data.chat_template, self.data.system_prompt)

    def check_fit(self, context: int, max_new_tokens: int, limit: int | None = None) -> None:
        """Every prompt plus a full response fits in the engine's context (`limit`: the model's
        positions, for the hint): fail on the first dataset row that does not, naming its file:line
        (or row), or on the built-in tasks' longest prompt, before any work."""
        room = context - max_new_tokens
        if not isinstance(self.source, DatasetSource):
            n = self.longest_prompt()
            if n > room:
                raise DataError(f"the built-in tasks' longest prompt of {n} tokens + algorithm.sampling."
                                f"max_new_tokens ({max_new_tokens}) exceeds the context of {context} tokens; "
                                f"{fit_hint(context, limit)}")
            return
        for problem in self.source.problems:
            n = len(self.prompt_ids(problem))
            if n > room:
                raise DataError(f"{problem.origin or problem.uid}: prompt of {n} tokens + "
                                f"algorithm.sampling.max_new_tokens ({max_new_tokens}) exceeds the context of "
                                f"{context} tokens; {fit_hint(context, limit)}")

    def longest_prompt(self) -> int:
        """Tokens of the longest prompt the run can draw: every dataset row, or every built-in
        task pool (a function of data config and seed)."""
        if isinstance(self.source, DatasetSource):
            problems = self.source.problems
        else:
            problems = [p for i in range(len(self.source.phases)) for p in self.source.pool(i)]
        return max(len(self.prompt_ids(p)) for p in problems)

    def submit_scores(self, problems: list[Problem], samples) -> PendingRewards:
        """Queue `samples` (of the step whose prompts are `problems`) in the reward sandbox; returns
        at once. Each function sees the prompt, the decoded response (without EOS) and the row's
        columns: `answer`, `reward_kind` and a dataset row's other columns. An episode's response is its
        last model turn."""
        eos = self.tokenizer.eos_id
        inputs = []
        for s in samples:
            p = problems[s.sample_id[1]]
            inputs.append(RewardInput(tuple(s.sample_id), p.prompt,
                                      self.tokenizer.decode([t for t in final_turn(s) if t != eos]),
                                      {**p.columns, "answer": p.answer, "reward_kind": p.reward_name}))
        return self.rewards.submit(inputs)


def engine_context(model: ModelConfig, max_context: int) -> int | None:
    """The rollout engine's context in tokens: rollout.max_context, else the model's
    max_position_embeddings; None while the model does not exist yet and will not be made from
    model.tiny (its loader reports that)."""
    if max_context:
        return max_context
    if model.path is None:
        return model.tiny.max_positions
    config = Path(model.path, "config.json")
    if not config.is_file():
        return model.tiny.max_positions if model.sft_if_missing else None
    try:
        return int(json.loads(config.read_text())["max_position_embeddings"])
    except (ValueError, KeyError, TypeError):
        return None  # a broken config.json: the model loader says what is wrong


def fitted_context(model: ModelConfig, max_context: int, longest_prompt: int, max_new_tokens: int) -> int:
    """The engine's context of a run: rollout.max_context, else the run's need, the longest prompt +
    max_new_tokens, rounded up to a power of two (at least 64), at most the model's
    max_position_embeddings. A slot of a 32k-position model no longer holds 32k tokens of cache for
    a few hundred. A power of two keeps every batch-invariant key bucket (runner.key_bucket: 64, 128,
    ... capped at the context) what it is under any larger context, so the tokens do not change."""
    if max_context:
        return max_context
    need = max(64, 1 << (longest_prompt + max_new_tokens - 1).bit_length())
    limit = engine_context(model, 0)
    return need if limit is None else min(need, limit)


def fit_hint(context: int, limit: int | None) -> str:
    """The fix of a prompt that does not fit in `context`: raising rollout.max_context only helps
    below the model's `limit` positions (past it the engine refuses to start)."""
    if limit is None:
        return "shorten the prompt, lower max_new_tokens or raise rollout.max_context"
    if context < limit:
        return (f"shorten the prompt, lower max_new_tokens or raise rollout.max_context (at most {limit}, the "
                "model's positions)")
    return f"shorten the prompt or lower max_new_tokens (the model holds {limit} positions)"


def check_context(model: ModelConfig, max_context: int) -> int | None:
    """rollout.max_context within the model's positions (the engine refuses more after Ray has
    started); the model's positions, None where not known yet."""
    limit = engine_context(model, 0)
    if max_context and limit is not None and max_context > limit:
        raise PoiseError(f"rollout.max_context {max_context} exceeds the model's {limit} positions "
                         f"(max_position_embeddings); set it at most {limit}, or 0 for what the run needs")
    return limit


def check_prompts(data: DataConfig, model: ModelConfig, seed: int, max_context: int, max_new_tokens: int) -> None:
    """The input errors of a run, before any work: the tokenizer loads, every dataset row is well
    formed, rollout.max_context is within the model's positions, and each prompt plus
    max_new_tokens fits in the engine's context."""
    steps = TaskSteps(data, model, seed, prompts_per_step=1)
    check_vocab(data, model, steps.tokenizer)
    limit = check_context(model, max_context)
    context = engine_context(model, max_context)
    if context is not None:
        steps.check_fit(context, max_new_tokens, limit)


def check_vocab(data: DataConfig, model: ModelConfig, tokenizer: Tokenizer) -> None:
    """The tokenizer's ids all index the model's embedding, read from config.json (no weights):
    otherwise the first prompt fails deep in the engine, after Ray and the model have started."""
    if model.path is None:
        return  # the tiny model is built with the tokenizer's vocabulary
    config = Path(model.path, "config.json")
    if not config.is_file():
        return  # SFT makes it from this tokenizer (model.sft_if_missing), or the loader reports it missing
    try:
        model_vocab = int(json.loads(config.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # a broken config.json: the model loader says what is wrong
    if tokenizer.vocab_size > model_vocab:
        raise PoiseError(f"data.tokenizer '{data.tokenizer}' has {tokenizer.vocab_size} tokens but model.path "
                         f"'{model.path}' embeds {model_vocab}; use the model's own tokenizer (data.tokenizer: model) "
                         "or a model trained with this tokenizer")
