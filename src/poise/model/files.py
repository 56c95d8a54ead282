"""A local model directory at load time (torch-free). What it may hold is the config layer's rule
(poise.config.model.model_dir_problem: the config checks `model.path` with it before any work);
`check_model_dir` refuses a directory that breaks it, in one line.
"""

from __future__ import annotations

from pathlib import Path

from poise.config.model import model_dir_problem
from poise.errors import PoiseError


def check_model_dir(path: str | Path) -> None:
    problem = model_dir_problem(path)
    if problem is not None:
        raise PoiseError(f"model '{path}' is {problem}")
