"""The Python API: `poise.train`, `poise.load_config`, `poise.simulate`.

Each does what its command does (`poise train`, `poise config`, `poise simulate`), with the same
checks before any work. Overrides are keyword arguments, one per config section, holding a
mapping of that section's keys (nested sections nest): `train(run={"steps": 5}, algorithm={"loss":
"dapo", "sampling": {"max_new_tokens": 20}})`; a top-level key takes its value (`determinism=...`).
Importing this module imports neither torch nor ray: training imports them when it starts.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from poise.config import TrainConfig, build_train_config
from poise.errors import PoiseError
from poise.schema import read_yaml, to_dict


@dataclass(frozen=True)
class RunResult:
    """What a finished `poise.train` run left: its directory, resolved config and metrics rows."""

    run_dir: Path
    config: TrainConfig
    metrics: list[dict]  # RUN_DIR/metrics.jsonl: one row per step (step, reward_mean, loss, ...)

    @property
    def rewards(self) -> list[float]:
        """The mean training reward of each step."""
        return [row["reward_mean"] for row in self.metrics]


ConfigLike = str | Path | Mapping[str, Any] | TrainConfig | None


def load_config(config: ConfigLike = None, **overrides: Any) -> TrainConfig:
    """The resolved training config: `config` is a YAML path, a mapping as the YAML would hold,
    a TrainConfig (taken as resolved: its loss knobs are set) or None (the defaults); each
    keyword overrides a section (a mapping, merged key by key) or a top-level key. Bad keys and
    values raise `poise.errors.ConfigError` naming the dotted key and the fix."""
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, TrainConfig):
        data = to_dict(config)
    elif isinstance(config, Mapping):
        data = copy.deepcopy(dict(config))
    else:
        data = read_yaml(config)
    _merge(data, overrides)
    return build_train_config(data)


def _merge(data: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(data.get(key), dict):
            _merge(data[key], value)
        else:
            data[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value


def check_before_work(cfg: TrainConfig) -> None:
    """What `poise train` checks before it creates the run directory or starts Ray: the optional
    packages the config asks for, the device, every prompt and every reward function."""
    if cfg.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise PoiseError("run.tensorboard=true needs the tensorboard package; pip install 'poise[tensorboard]', or set "
                         "run.tensorboard=false")
    if cfg.run.wandb is not None and importlib.util.find_spec("wandb") is None:
        raise PoiseError("run.wandb needs the wandb package; pip install 'poise[wandb]', or drop run.wandb")
    if cfg.eval.every:
        from poise.evaluation.heldout import load_heldout

        load_heldout(cfg.eval, cfg.data, cfg.run.seed)  # a missing eval.dataset or column, before the run directory
    if cfg.rollout.backend == "vllm":
        from poise.rollout.vllm_engine import check_vllm

        check_vllm(cfg.model, cfg.cluster.device)  # installed, and it can run this model
    if cfg.model.lora is not None and importlib.util.find_spec("peft") is None:
        raise PoiseError("model.lora needs the peft package; pip install 'poise[lora]', or drop model.lora")
    if cfg.cluster.compute == "real":
        from poise.training.setup import check_device

        check_device(cfg.cluster, cfg.pipeline.mode == "colocated")  # a GPU (and NCCL), before Ray starts
    if cfg.cluster.compute == "real" or cfg.pipeline.mode == "colocated":  # emulated prompts are a scenario's
        from poise.data.prompts import check_prompts

        # a bad dataset row, a prompt too long for the context or a tokenizer larger than the
        # model's vocabulary stops here, before the run directory
        check_prompts(cfg.data, cfg.model, cfg.run.seed, cfg.rollout.max_context,
                      cfg.algorithm.sampling.max_new_tokens)
        from poise.rewards.scorer import check_rewards

        check_rewards(cfg.reward, cfg.env)  # each reward function (and the environment) loads in the sandbox, first
    if cfg.eval.every and cfg.cluster.compute == "real":
        from poise.evaluation.heldout import HeldOut

        HeldOut(cfg.eval, cfg.data, cfg.model, cfg.run.seed, None).check_fit(
            cfg.model, cfg.rollout.max_context, cfg.algorithm.sampling.max_new_tokens)  # each held-out prompt fits


def run_training(cfg: TrainConfig, resume: bool = False) -> list[dict]:
    """Train by `cfg.pipeline.mode` (colocated, or disaggregated over Ray); the metrics rows."""
    from poise.rundir import absolute_paths

    cfg = absolute_paths(cfg)  # RUN_DIR/config.yaml then resumes from any working directory
    if cfg.pipeline.mode == "colocated":
        from poise.training.colocated import train_colocated

        return train_colocated(cfg, resume=resume)
    from poise.runtime.driver import train_disaggregated

    return train_disaggregated(cfg, resume=resume)


def train(config: ConfigLike = None, **overrides: Any) -> RunResult:
    """Run RL post-training as `poise train` does and return its RunResult. `config` and
    `overrides` as `load_config`'s. Ctrl-C stops the run at once (the command line's graceful
    stop after a step, with a checkpoint, is the command's)."""
    from poise.runlog import read_jsonl

    cfg = load_config(config, **overrides)
    check_before_work(cfg)
    run_training(cfg)
    rows = sorted(read_jsonl(Path(cfg.run.dir) / "metrics.jsonl"), key=lambda r: r["step"])
    return RunResult(Path(cfg.run.dir), cfg, rows)


def simulate(scenario: str, out: str | Path | None = None, **overrides: Any):
    """Simulate a scenario (a built-in name or a YAML file) on the virtual clock as `poise
    simulate` does, writing its run directory to `out` (default runs/sim-<name>); overrides as
    `load_config`'s, for the scenario's sections. Returns the simulation's `poise.sim.Summary`."""
    from poise.sim import load_scenario
    from poise.sim import simulate as run_simulation

    sc = load_scenario(scenario, _dotted(overrides))
    return run_simulation(sc, Path(out) if out is not None else Path(f"runs/sim-{sc.name}"))


def _dotted(overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Nested keyword overrides as the command line's `a.b=value` strings (values as YAML)."""
    import yaml

    out = []
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _dotted(value, name + ".")
        else:
            out.append(f"{name}={yaml.safe_dump(value, default_flow_style=True, width=10 ** 6).strip()}"
                       .removesuffix("\n..."))
    return out


__all__ = ["RunResult", "load_config", "train", "simulate", "check_before_work", "run_training"]
