"""The `eval:` section: held-out evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass

from poise.schema import check, help_field


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation between steps (poise.evaluation): it never changes a training bit."""

    every: int = help_field(0, "evaluate on held-out problems after every N steps and after the last; 0 = off "
                               "(`poise eval` evaluates a checkpoint whatever this is)")
    dataset: str | None = help_field(None, "held-out dataset: a .jsonl or .parquet file or a `datasets` "
                                           "save_to_disk directory with data.prompt_key and data.answer_key columns; "
                                           "null = held-out problems of the built-in tasks (a pool disjoint from "
                                           "training's); needed when data.dataset is set")
    problems: int = help_field(64, "held-out problems per evaluation: the dataset's first N rows (0 = all rows) or "
                                   "N problems of the built-in tasks")
    greedy: bool = help_field(True, "one greedy (temperature 0) response per problem: eval/greedy/...")
    k: int = help_field(0, "sampled responses per problem at algorithm.sampling's temperature: eval/sampled/... "
                           "and eval/pass@k (a problem passes if one of its k responses does); 0 = none")
    pass_threshold: float = help_field(1.0, "a response passes when its reward is >= this (eval/.../pass_rate, "
                                         "eval/pass@k)")

    def __post_init__(self) -> None:
        check(self.every >= 0, "every", self.every, "must be >= 0 (0 = off), e.g. 10")
        check(self.problems >= 0, "problems", self.problems, "must be >= 0 (0 = every row of eval.dataset)")
        check(self.k >= 0, "k", self.k, "must be >= 0 (0 = greedy only), e.g. 4")
        check(self.greedy or self.k >= 1, "k", self.k, "with greedy=false there is nothing to evaluate; set k >= 1 "
                                                      "or greedy=true")
        check(math.isfinite(self.pass_threshold), "pass_threshold", self.pass_threshold, "must be a finite number, e.g. 1.0")
        check(self.dataset is None or bool(self.dataset.strip()), "dataset", self.dataset,
              "name a held-out file or directory, or null for the built-in tasks")
