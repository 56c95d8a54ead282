"""The `poise train` / `poise sft` configuration: small frozen sections, each validated.

Each component receives only its own section, never the whole config. Load with
`load_train_config(path, overrides)`; every bad key, type or value fails here, before any work.
Torch-free, down to the engine, sampling and tiny-model sections (docs/design.md, Layers): the driver
and emulated workers load and unpickle every section without importing torch.
"""

from __future__ import annotations

from poise.config.algorithm import LOSS_PRESETS, AlgorithmConfig, SamplingConfig, preset_filled_knobs
from poise.config.cluster import AUTO_EMULATED_PROCESSES, ClusterConfig, EmulationConfig
from poise.config.data import DataConfig
from poise.config.engine import EngineConfig
from poise.config.env import ENV_BUILTINS, EnvConfig
from poise.config.eval import EvalConfig
from poise.config.model import LORA_PROJECTIONS, LoraConfig, ModelConfig, SFTConfig, TinyModelConfig
from poise.config.policy import ControllerConfig, DispatchConfig, PipelineConfig, ResizeConfig, ScaleConfig
from poise.config.reward import REWARD_LIMIT, REWARD_WEIGHT_LIMIT, RewardConfig, RewardFunctionConfig
from poise.config.run import RunConfig, WandbConfig
from poise.config.train import FOREIGN_KEYS, TrainConfig, build_train_config, config_notes, load_train_config
from poise.errors import ConfigError

__all__ = ["TrainConfig", "RunConfig", "WandbConfig", "ModelConfig", "TinyModelConfig", "DataConfig",
           "AlgorithmConfig", "SamplingConfig", "EngineConfig", "PipelineConfig", "ClusterConfig", "EmulationConfig",
           "DispatchConfig", "SFTConfig", "EvalConfig", "LoraConfig", "RewardConfig", "RewardFunctionConfig", "LOSS_PRESETS", "load_train_config",
           "build_train_config", "ConfigError"]
