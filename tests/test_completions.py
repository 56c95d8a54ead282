"""poise.completions: which samples a step shows (by sample id, never by arrival), their text (an
episode's observations marked), the character cap, and RUN_DIR/completions.jsonl through RunLog,
cut back on --resume like the other logs."""

from __future__ import annotations

import json
import random

from poise.completions import MAX_CHARS, Completions, pick, read_completions
from poise.data.tasks import Problem
from poise.data.tokenizer import CharTokenizer
from poise.rewards.scorer import RewardResult
from poise.rundir import truncate_logs
from poise.runlog import RunLog
from poise.types import Sample

TOK = CharTokenizer()


def _sample(sid, text, finish="eos", mask=None, eos=True):
    ids = tuple(TOK.encode(text)) + ((TOK.eos_id,) if eos else ())
    if mask is not None and eos:
        mask = (*mask, 1)
    return Sample(sid, (5, 6), ids, tuple([-0.5] * len(ids)), finish, sid[0], 0.0, 1.0, 64,
                  loss_mask=None if mask is None else tuple(mask))


def _step(step=3, prompts=3, group=2):
    problems = [Problem(f"p-{i}", "arith", f"arith {i}+{i}", str(2 * i), "arith") for i in range(prompts)]
    samples = [_sample((step, i, j), f"answer {i} {j}") for i in range(prompts) for j in range(group)]
    rewards = {s.sample_id: float(s.sample_id[1] + s.sample_id[2]) for s in samples}
    results = {s.sample_id: RewardResult(rewards[s.sample_id], {"task": rewards[s.sample_id], "format": 1.0})
               for s in samples}
    return samples, problems, rewards, results


def test_a_step_shows_one_sample_of_each_prompt_first_chosen_by_id_not_arrival():
    samples, problems, rewards, results = _step()
    log = Completions(4, TOK.decode, TOK.eos_id)
    rows = log.rows(3, samples, problems, rewards, results)
    assert [r["id"] for r in rows] == [[3, 0, 0], [3, 1, 0], [3, 2, 0], [3, 0, 1]]
    arrived = samples[:]
    random.Random(7).shuffle(arrived)  # another split or dispatch: another arrival order
    assert arrived != samples and log.rows(3, arrived, problems, rewards, results) == rows
    assert pick([(0, 1, 1), (0, 0, 1), (0, 1, 0)], 2) == [(0, 1, 0), (0, 0, 1)]


def test_a_row_holds_the_prompt_the_text_and_every_reward():
    samples, problems, rewards, results = _step()
    row = Completions(1, TOK.decode, TOK.eos_id).rows(3, samples, problems, rewards, results)[0]
    assert row == {"step": 3, "id": [3, 0, 0], "prompt_id": "p-0", "prompt": "arith 0+0",
                   "completion": "answer 0 0", "reward": 0.0, "rewards": {"task": 0.0, "format": 1.0},
                   "length": len("answer 0 0") + 1, "finish_reason": "eos", "weights_version": 3, "truncated": False}


def test_long_text_is_cut_and_says_so():
    problems = [Problem("p-0", "arith", "q" * 10, "", "arith")]
    long = _sample((0, 0, 0), "x" * (MAX_CHARS + 123), finish="length", eos=False)
    row = Completions(4, TOK.decode, TOK.eos_id).rows(0, [long], problems, {long.sample_id: 1.0},
                                                      {long.sample_id: RewardResult(1.0)})[0]
    assert row["truncated"] is True and row["finish_reason"] == "length"
    assert row["completion"] == "x" * MAX_CHARS + "... [123 more characters cut]"
    assert row["prompt"] == "q" * 10


def test_an_episode_shows_its_whole_transcript_with_observations_marked():
    problems = [Problem("p-0", "arith", "play", "", "arith")]
    turns = [("go left", 1), ("you see a wall", 0), ("go right", 1)]
    text = "".join(t for t, _ in turns)
    mask = [m for t, m in turns for _ in t]
    episode = _sample((0, 0, 0), text, mask=mask)
    row = Completions(4, TOK.decode, TOK.eos_id).rows(0, [episode], problems, {episode.sample_id: 0.5},
                                                      {episode.sample_id: RewardResult(0.5, {"env": 0.5})})[0]
    assert row["turns"] == [{"role": "model", "text": "go left"}, {"role": "observation", "text": "you see a wall"},
                            {"role": "model", "text": "go right"}]
    assert row["completion"] == "go left[observation]\nyou see a wall\n[/observation]go right"


def test_off_or_without_a_tokenizer_nothing_is_built():
    assert Completions.of(0, TOK) is None and Completions.of(4, None) is None
    assert Completions.of(2, TOK).per_step == 2


def test_runlog_writes_completions_jsonl_and_resume_cuts_it_back(tmp_path):
    samples, problems, rewards, results = _step(step=0)
    builder = Completions(2, TOK.decode, TOK.eos_id)
    for background in (False, True):
        run = tmp_path / f"bg-{background}"
        with RunLog(run, background=background) as log:
            for step in range(3):
                shifted = [Sample((step, *s.sample_id[1:]), *(getattr(s, f) for f in Sample.__dataclass_fields__
                                                               if f != "sample_id")) for s in samples]
                log.completions(builder.rows(step, shifted, problems,
                                             {(step, *k[1:]): v for k, v in rewards.items()},
                                             {(step, *k[1:]): v for k, v in results.items()}))
        lines = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
        assert [(r["step"], r["id"]) for r in lines] == [(k, [k, i, 0]) for k in range(3) for i in range(2)]
        truncate_logs(run, 1)  # --resume from step 1's checkpoint: steps 1 and 2 log again
        assert [r["step"] for r in read_completions(run)] == [0, 0]
    with RunLog(tmp_path / "none") as log:  # a run that logs none has no file
        log.metrics({"step": 0})
    assert not (tmp_path / "none" / "completions.jsonl").exists()
