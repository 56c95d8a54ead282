"""What a local model directory may hold (issue 11, input hardening). Torch-free: the config
checks `model.path` with it before any work.

Weights load from safetensors only (`use_safetensors=True` in poise.model.loading): a pickle
file (`pytorch_model.bin`, `*.pt`, ...) can run code when unpickled, so a directory holding one
is refused outright, even beside a `*.safetensors` file that might be a decoy.
"""

from __future__ import annotations

from pathlib import Path

from poise.errors import PoiseError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def model_dir_problem(path: str | Path) -> str | None:
    """None if `path` may be a model directory (it need not exist yet), else what it is and the fix."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return ("a file, not a directory: point it at a local HF checkpoint directory (config.json + "
                "*.safetensors), or at where model.sft_if_missing should write one")
    if path.is_dir():
        try:
            pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
        except OSError:
            return None  # unreadable: the loader says so when it gets there
        if pickles:
            shown = ", ".join(pickles[:3]) + (", ..." if len(pickles) > 3 else "")
            return (f"a directory holding pickle files ({shown}); Poise loads safetensors weights only: "
                    "convert them (save_pretrained(..., safe_serialization=True)) and remove the pickle files")
    return None


def check_model_dir(path: str | Path) -> None:
    problem = model_dir_problem(path)
    if problem is not None:
        raise PoiseError(f"model '{path}' is {problem}")
