"""The trainer's table of `poise profile`: whole updates timed with the trainer's own code."""

from __future__ import annotations

import torch

from poise.model.loading import TinyModelConfig, build_tiny
from poise.policy.cost import CostModel
from poise.training.profile import TrainProfileConfig, profile_train


def test_train_rows_time_updates_and_leave_the_model_alone():
    torch.set_num_threads(1)
    model = build_tiny(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                       intermediate_size=64), vocab_size=20, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = profile_train(model, TrainProfileConfig(micro_batches=(1, 2), micro_batch_size=2, seq_len=12,
                                                   prompt_len=4, repeats=1), vocab_size=20)
    assert [r["tokens"] for r in rows] == [24, 48] and [r["micro_batches"] for r in rows] == [1, 2]
    assert all(r["seconds"] > 0 for r in rows)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained a copy
    cost = CostModel.from_profile({"format": "poise-profile/1", "train": rows,
                                   "decode": [{"batch": 1, "context": 8, "seconds_per_step": 0.001}],
                                   "prefill": [{"tokens": 4, "seconds": 0.001}]})
    assert cost.train_s(48, 1) == rows[1]["seconds"]  # an update of 48 tokens costs what it measured
