"""A local model at load time (torch-free): the model families the rollout engine runs, and the
directory. What a directory may hold is the config layer's rule (poise.config.model.model_dir_problem:
the config checks `model.path` with it before any work); `check_model_dir` refuses a directory that
breaks it, in one line.
"""

from __future__ import annotations

from pathlib import Path

from poise.config.model import model_dir_problem
from poise.errors import PoiseError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def check_model_type(model_type: object) -> None:
    """Refuse, in one line, a model type the runner cannot run (at load time, before any rollout)."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise PoiseError(f"rollout engine supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; got "
                         f"{model_type!r}: load a checkpoint of one of these families")


def check_model_dir(path: str | Path) -> None:
    problem = model_dir_problem(path)
    if problem is not None:
        raise PoiseError(f"model '{path}' is {problem}")
