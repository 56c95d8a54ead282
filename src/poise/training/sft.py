"""Supervised warm start: teach the tiny model the built-in tasks' reference answers.

RL then starts from a policy that solves some prompts but not most. SFT draws its own prompt
stream (seed `model.sft.seed`), so RL prompts are not memorised answers.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from poise.config import DataConfig, ModelConfig
from poise.data.prompts import encode_answer, encode_prompt
from poise.data.tasks import Problem, TaskSource, derive_seed
from poise.data.tokenizer import SEPARATOR, CharTokenizer
from poise.episodes.guess import transcript
from poise.model.loading import build_tiny, save_model
from poise.training.progress import StepProgress


def sft_loss(model: torch.nn.Module, prompts: list[list[int]], answers: list[list[int]], pad_id: int,
             masks: list[list[int]] | None = None) -> torch.Tensor:
    """Mean cross-entropy over answer tokens (prompt tokens are not trained; nor an episode
    transcript's observation tokens, where `masks` has 0)."""
    seqs = [p + a for p, a in zip(prompts, answers)]
    longest = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), longest), -100, dtype=torch.long)
    attn = torch.zeros((len(seqs), longest), dtype=torch.long)
    for b, (p, a) in enumerate(zip(prompts, answers)):
        ids[b, :len(p) + len(a)] = torch.tensor(p + a)
        attn[b, :len(p) + len(a)] = 1
        labels[b, len(p):len(p) + len(a)] = torch.tensor(a)
        if masks is not None:
            labels[b, len(p):len(p) + len(a)][torch.tensor(masks[b]) == 0] = -100
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                             ignore_index=-100)


def encode_transcript(tokenizer: CharTokenizer, problem: Problem, rng: random.Random) -> tuple[list[int], list[int]]:
    """A multi-turn task's warm-start answer: a played episode in the format the episode loop makes
    (poise.episodes.episode: each turn ends with EOS, each observation with the separator), and its
    mask (observations 0: the model does not learn to predict the environment)."""
    ids: list[int] = []
    mask: list[int] = []
    for action, observation in transcript(int(problem.answer), rng):
        turn = tokenizer.encode(action) + [tokenizer.eos_id]
        ids += turn
        mask += [1] * len(turn)
        if observation:
            seen = tokenizer.encode(observation + SEPARATOR)
            ids += seen
            mask += [0] * len(seen)
    return ids, mask


def _whole(answer: list[int]) -> tuple[list[int], list[int]]:
    return answer, [1] * len(answer)


def run_sft(model_cfg: ModelConfig, data_cfg: DataConfig, out_dir: Path, threads: int | None = None,
            progress: bool = True) -> Path:
    """The warm start, written to `out_dir`, on `threads` torch threads (default `model.sft.threads`);
    the process's thread count is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or model_cfg.sft.threads)
    try:
        return _train(model_cfg, data_cfg, out_dir, progress)
    finally:
        torch.set_num_threads(before)


def _train(model_cfg: ModelConfig, data_cfg: DataConfig, out_dir: Path, progress: bool) -> Path:
    cfg = model_cfg.sft
    tokenizer = CharTokenizer()
    model = build_tiny(model_cfg.tiny, tokenizer.vocab_size, cfg.seed, tokenizer.eos_id, tokenizer.pad_id,
                       tokenizer.bos_id)
    source = TaskSource(derive_seed("sft", cfg.seed), data_cfg.phases or None, pool_size=max(4096, cfg.batch_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=False)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 20))
    model.train()
    with StepProgress("sft", cfg.steps, enabled=progress) as bar:
        for step in range(cfg.steps):
            problems = source.prompts_for_step(step, cfg.batch_size)
            rng = random.Random(derive_seed("sft-transcripts", cfg.seed, step))
            answers = [encode_transcript(tokenizer, p, rng) if p.family == "guess" else _whole(encode_answer(tokenizer, p))
                       for p in problems]
            loss = sft_loss(model, [encode_prompt(tokenizer, p) for p in problems], [a for a, _ in answers],
                            tokenizer.pad_id, [m for _, m in answers])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            bar.advance(loss=float(loss.detach()))
    save_model(model, out_dir, tokenizer)
    return out_dir
