"""The held-out problems, their sample ids and their metrics, checked by hand (torch-free)."""

import json

import pytest

from poise.config import DataConfig, EvalConfig, ModelConfig, RewardConfig
from poise.data.tasks import Phase, TaskSource
from poise.errors import ConfigError
from poise.evaluation.heldout import HeldOut, eval_sample_id, load_heldout
from poise.types import Sample


def test_builtin_heldout_problems_are_outside_every_training_pool():
    phases = (Phase({"arith": 1.0}, until_step=3), Phase({"arith": 0.5, "sort": 0.5}))
    data = DataConfig(phases=phases, pool_size=300)
    problems = load_heldout(EvalConfig(every=1, problems=50), data, seed=7)
    training = TaskSource(7, phases, 300)
    seen = {p.prompt for i in range(2) for p in training.pool(i)}
    assert len(problems) == 50 and len({p.prompt for p in problems}) == 50
    assert not seen & {p.prompt for p in problems}
    assert {p.family for p in problems} == {"arith", "sort"}  # the last phase's mix
    assert problems == load_heldout(EvalConfig(every=1, problems=50), data, seed=7)  # a function of the seed
    # arith a+b with a, b in 0..20 has 441 prompts; 512 draws for the pool leave about 140 outside it
    with pytest.raises(ConfigError, match="outside the training pool"):
        load_heldout(EvalConfig(every=1, problems=200), DataConfig(phases=(Phase({"arith": 1.0}),)), seed=0)


def test_eval_ids_never_equal_training_ids():
    assert eval_sample_id(0, 3, 1) == (-1, 3, 1)
    assert all(eval_sample_id(v, 0, 0)[0] < 0 for v in range(100))  # training's steps are >= 0
    assert len({eval_sample_id(v, i, j) for v in range(5) for i in range(3) for j in range(3)}) == 45


def test_due_every_n_and_after_the_last_step():
    due = HeldOut(EvalConfig(every=2, problems=1), DataConfig(), ModelConfig(), 0, None, problems=[]).due
    assert [k for k in range(5) if due(k, 5)] == [1, 3, 4]


def test_dataset_rows_in_file_order(tmp_path):
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(5)))
    assert [p.answer for p in load_heldout(EvalConfig(every=1, dataset=str(path), problems=3), DataConfig(), 0)] \
        == ["0", "1", "2"]
    assert len(load_heldout(EvalConfig(every=1, dataset=str(path), problems=0), DataConfig(), 0)) == 5


def test_metrics_by_hand(tmp_path):
    """Two problems (answers 1 and 2), a greedy and k=2 sampled responses each, exact reward:
    greedy 1/2 right; sampled: problem 0 once of twice, problem 1 never -> mean 1/4, pass@2 1/2."""
    from poise.rewards.scorer import RewardScorer

    path = tmp_path / "held.jsonl"
    path.write_text(json.dumps({"prompt": "arith 0+1", "answer": "1"}) + "\n"
                    + json.dumps({"prompt": "arith 1+1", "answer": "2"}) + "\n")
    cfg = EvalConfig(every=1, dataset=str(path), problems=0, greedy=True, k=2)
    rewards = RewardScorer(RewardConfig())
    try:
        heldout = HeldOut(cfg, DataConfig(), ModelConfig(), 0, rewards)
        greedy, sampled = heldout.requests(version=4)
        assert [r.sample_id for r in greedy] == [(-5, 0, 0), (-5, 1, 0)]
        assert [r.sample_id for r in sampled] == [(-5, 0, 1), (-5, 0, 2), (-5, 1, 1), (-5, 1, 2)]
        tok = heldout.steps.tokenizer
        answers = {(-5, 0, 0): "1", (-5, 1, 0): "3", (-5, 0, 1): "7", (-5, 0, 2): "1", (-5, 1, 1): "22",
                   (-5, 1, 2): "0"}
        samples = [Sample(sid, (1,), tuple(tok.encode(text)) + (tok.eos_id,), (0.0,) * (len(text) + 1), "eos", 4,
                          0.0, 0.0, 8) for sid, text in answers.items()]
        e = heldout.metrics(samples, 0.0)["eval"]
    finally:
        rewards.close()
    assert e["problems"] == 2 and e["version"] == 4
    assert e["greedy"]["reward_mean"] == 0.5 and e["greedy"]["pass_rate"] == 0.5
    assert e["greedy"]["reward/task"] == 0.5 and e["greedy"]["response_len_mean"] == 2.0
    assert e["sampled"]["reward_mean"] == 0.25 and e["sampled"]["pass_rate"] == 0.25
    assert e["pass@2"] == 0.5
