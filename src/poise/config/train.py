"""`TrainConfig`, the whole `poise train` config: its sections, the checks across them, and loading."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from poise.config.algorithm import AlgorithmConfig
from poise.config.cluster import ClusterConfig, EmulationConfig
from poise.config.data import DataConfig
from poise.config.engine import EngineConfig
from poise.config.env import EnvConfig
from poise.config.eval import EvalConfig
from poise.config.model import ModelConfig
from poise.config.policy import ControllerConfig, DispatchConfig, PipelineConfig, ResizeConfig, ScaleConfig
from poise.config.reward import RewardConfig
from poise.config.run import RunConfig
from poise.config.split import parse_splits
from poise.errors import ConfigError
from poise.schema import apply_overrides, build, check, help_factory, help_field, read_yaml


def config_notes(cfg: TrainConfig) -> list[str]:
    """One line each for a setting that is valid but does less than its name says (printed before
    any work): a full shard over one train device holds the whole model there."""
    notes = []
    split, resizes = cfg.cluster.split, bool(cfg.resize.schedule) or cfg.resize.policy != "static"
    train = split[1] if split else (1 if cfg.cluster.devices == 2 else 0)  # 0: the allocator decides
    if cfg.cluster.shard == "full" and cfg.pipeline.mode != "colocated" and train == 1 and not resizes:
        notes.append(f"poise: note: cluster.shard=full with one train device (split {list(split) or [1, 1]}) "
                     "shards nothing: that device holds the whole model; give train 2+ devices, or set "
                     "cluster.shard=none")
    return notes


def _installed(package: str) -> bool:
    """Whether this Python can import `package` (a finder that refuses it counts as missing)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = help_factory(RunConfig, "run-level settings")
    model: ModelConfig = help_factory(ModelConfig, "policy model")
    data: DataConfig = help_factory(DataConfig, "prompts and tokenizer")
    algorithm: AlgorithmConfig = help_factory(AlgorithmConfig, "RL algorithm")
    rollout: EngineConfig = help_factory(EngineConfig, "rollout engine (batch_invariant is forced on in "
                                                       "determinism: bitwise)")
    pipeline: PipelineConfig = help_factory(PipelineConfig, "how rollout and training are arranged")
    cluster: ClusterConfig = help_factory(ClusterConfig, "devices")
    dispatch: DispatchConfig = help_factory(DispatchConfig, "stream generation service dispatch")
    emulation: EmulationConfig = help_factory(EmulationConfig, "scenario and time scale of cluster.compute: emulated")
    reward: RewardConfig = help_factory(RewardConfig, "reward functions and the sandbox they run in")
    resize: ResizeConfig = help_factory(ResizeConfig, "live resizing: static split, a forced schedule, or the "
                                        "resize controller")
    controller: ControllerConfig = help_factory(ControllerConfig, "resize controller hysteresis "
                                                "(resize.policy: controller)")
    scale: ScaleConfig = help_factory(ScaleConfig, "elastic scale-out: reserve devices (cluster.reserve_devices) "
                                      "join as rollout instances, by a schedule or the scale controller")
    determinism: Literal["bitwise", "semantic"] = help_field(
        "bitwise", "bitwise: results identical bit for bit across splits and restarts; semantic: faster")
    eval: EvalConfig = help_factory(EvalConfig, "held-out evaluation every N steps and at the end (off by default)")
    env: EnvConfig = help_factory(EnvConfig, "multi-turn episodes: the environment that answers each model turn "
                                  "(off by default)")

    def __post_init__(self) -> None:
        self._check_backend()
        if self.determinism == "bitwise" and not self.rollout.batch_invariant:
            # bitwise trajectories need batch-invariant decoding (docs/design.md invariant 1)
            object.__setattr__(self, "rollout", dataclasses.replace(self.rollout, batch_invariant=True))
        # only a simulated or emulated workload knows its output lengths before generating them
        check(self.dispatch.ranker != "oracle" or self.cluster.compute == "emulated", "dispatch.ranker", "oracle",
              "needs the true output lengths, which only the simulator and cluster.compute=emulated have; "
              "use history or learned")
        self._check_resize()
        self._check_scale()
        a = self.algorithm
        check(not self.pipeline.assist or a.old_logprobs == "rollout" or a.updates_per_step == 1, "pipeline.assist",
              True, "with algorithm.old_logprobs=recompute and updates_per_step > 1 is not built (a helping rollout "
              "device keeps no step-start weights); set updates_per_step=1 or pipeline.assist=false")
        check(not self.pipeline.assist or self.cluster.shard == "none", "pipeline.assist", True,
              f"is not built with cluster.shard={self.cluster.shard} (a helping rollout device owns no optimizer "
              "state); drop one of them")
        self._check_lora()
        self._check_full_shard()
        check(not self.pipeline.assist or self.pipeline.mode == "sync", "pipeline.assist", True,
              f"needs pipeline.mode=sync (with {self.pipeline.mode}, no rollout device is idle while the trainer "
              "works); set it false")
        check(not self.algorithm.dynamic_sampling or self.cluster.compute == "real", "algorithm.dynamic_sampling",
              True, "needs real rewards to drop groups by; cluster.compute=emulated has none: set it false")
        self._check_eval()
        self._check_env()
        self._check_partial()
        s = self.algorithm.sampling
        if self.model.path is None:
            need = self.model.tiny.max_positions
            check(s.max_new_tokens < need, "algorithm.sampling.max_new_tokens", s.max_new_tokens,
                  f"must leave room for the prompt within model.tiny.max_positions ({need})")


    def _check_partial(self) -> None:
        """Partial rollouts (pipeline.partial_tokens) train tokens of several weights versions: the
        decoupled objective (proximal = the weights before the update) needs the trainer's own old
        log-probs; what they do not run with yet is refused in one line."""
        if not self.pipeline.partial:
            return
        check(self.algorithm.old_logprobs == "recompute", "algorithm.old_logprobs", self.algorithm.old_logprobs,
              f"pipeline.partial_tokens={self.pipeline.partial_tokens} trains tokens of several weights versions, "
              "which needs the decoupled objective: set algorithm.old_logprobs=recompute (and rollout_is=token)")
        p = self.pipeline
        # emulated compute takes its prompts per step from the scenario, which checks this when it loads
        check(self.cluster.compute == "emulated" or p.overprovision <= self.algorithm.prompts_per_step,
              "pipeline.overprovision", p.overprovision,
              f"must be <= algorithm.prompts_per_step ({self.algorithm.prompts_per_step}): the surplus groups that "
              "must finish in a step have to fit in its batch, or their tokens would lag more than "
              "pipeline.max_staleness versions")
        for on, key, value, why in (
                (self.algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True, "set it false"),
                (self.env.name is not None, "env.name", self.env.name, "drop env.name")):
            check(not on, key, value, "is not built with partial rollouts (pipeline.partial_tokens > 0) yet; "
                                      f"{why} or set pipeline.partial_tokens=0")

    def _check_env(self) -> None:
        """What episodes (env.name) do not run with yet: each refused in one line, before any work."""
        if self.env.name is None:
            return
        for on, key, value, why in (
                (self.algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True, "set it false"),
                (self.cluster.compute == "emulated", "cluster.compute", "emulated", "use cluster.compute=real"),
                (self.eval.every > 0, "eval.every", self.eval.every, "set eval.every=0 (held-out evaluation "
                 "generates single answers)"),
                (self.pipeline.assist, "pipeline.assist", True, "set it false")):
            check(not on, key, value, f"is not built with multi-turn episodes (env.name={self.env.name}) yet; {why}")

    def _check_full_shard(self) -> None:
        """What `cluster.shard: full` does not shard yet: the models beside the policy."""
        if self.cluster.shard != "full":
            return
        a = self.algorithm
        check(a.kl_coef == 0, "cluster.shard", "full", f"with algorithm.kl_coef={a.kl_coef} is not built (the "
              "reference model would be a whole copy on every train device); use cluster.shard=optimizer")
        check(a.old_logprobs == "rollout" or a.updates_per_step == 1, "cluster.shard", "full",
              "with algorithm.old_logprobs=recompute and updates_per_step > 1 is not built (the step-start "
              "weights would be a whole copy); set updates_per_step=1 or cluster.shard=optimizer")
        check(self.pipeline.mode != "colocated", "cluster.shard", "full", "with pipeline.mode=colocated has one "
              "device and nothing to shard over; set cluster.shard=none")

    def _check_backend(self) -> None:
        """What the vLLM backend needs (rollout/vllm_engine.py), every unmet need in one line; a
        missing vLLM alone is check_vllm's (before Ray), which also checks the model."""
        if self.rollout.backend != "vllm":
            return
        needs = [need for unmet, need in (
            (self.determinism != "semantic", "determinism=semantic (vLLM is not batch-invariant: its batch-invariant "
                                             "kernels are Triton, GPU only)"),
            (self.cluster.compute != "real", "cluster.compute=real (emulated devices hold no model)"),
            (self.model.lora is not None, "no model.lora (vLLM does not take Poise's LoRA adapters yet)"),
            (bool(self.rollout.stop_strings), "no rollout.stop_strings (they are not passed to vLLM; end responses "
                                              "with EOS)")) if unmet]
        if needs and not _installed("vllm"):
            needs.append("vLLM installed (make vllm; train from .venv-vllm/bin/poise)")
        check(not needs, "rollout.backend", "vllm",
              f"needs {'; '.join(needs)}; or set rollout.backend=poise for bit-exact runs")

    def _check_lora(self) -> None:
        """What model.lora needs, every unmet need in one line; a missing peft alone is
        check_before_work's."""
        lora = self.model.lora
        if lora is None:
            return
        needs = [need for unmet, need in (
            (lora.dropout != 0 and self.determinism == "bitwise",
             f"model.lora.dropout 0 (got {lora.dropout}: it draws from torch's global generator, not from the "
             "sample id: bitwise needs 0, or set determinism: semantic)"),
            (self.cluster.shard == "full", "cluster.shard=optimizer or none (cluster.shard=full with model.lora is "
                                           "not built; the adapter is small)")) if unmet]
        if needs and not _installed("peft"):
            needs.append("the peft package (pip install 'poise[lora]')")
        check(not needs, "model.lora", f"r={lora.r}", f"needs {'; '.join(needs)}")

    def _check_resize(self) -> None:
        """A schedule or a controller needs a disaggregated pipeline and splits of this job."""
        r = self.resize
        if not r.schedule and r.policy == "static":
            return
        what = "resize.schedule" if r.schedule else "resize.policy"
        check(self.pipeline.mode != "colocated", what, list(r.schedule) or r.policy,
              "pipeline.mode=colocated has one device and nothing to resize; use sync or async, or drop it")
        devices = self.cluster.devices
        for at, split in r.scheduled().items():
            check(split.rollout + split.train == devices, f"resize.schedule (at_step {at}).split", split.as_list(),
                  f"must add up to cluster.devices={devices}")
            check(at < self.run.steps, f"resize.schedule (at_step {at}).at_step", at,
                  f"is beyond run.steps={self.run.steps} (steps 0..{self.run.steps - 1}); schedule an earlier step")
        for i, split in enumerate(parse_splits(r.allowed_splits, "resize.allowed_splits")):
            check(split.rollout + split.train == devices, f"resize.allowed_splits[{i}]", split.as_list(),
                  f"must add up to cluster.devices={devices}")


    def _check_eval(self) -> None:
        """Held-out problems exist for this run: a dataset run needs its own held-out rows."""
        e = self.eval
        if not e.every:
            return
        check(self.data.dataset is None or e.dataset is not None, "eval.dataset", None,
              "data.dataset is set, so the built-in tasks are not this run's task; name a held-out file with the "
              "same columns (eval.dataset=path) or set eval.every=0")
        check(e.dataset is not None or e.problems >= 1, "eval.problems", e.problems,
              "must be >= 1 for the built-in tasks (0 means every row of an eval.dataset)")
        check(self.cluster.compute == "real", "eval.every", e.every,
              "needs cluster.compute=real (emulated devices hold no model to evaluate); set eval.every=0")

    def _check_scale(self) -> None:
        """Joins need reserve devices, a disaggregated pipeline and a fixed split (runtime/scale.py)."""
        sc = self.scale
        if not sc.active:
            return
        what = "scale.schedule" if sc.schedule else "scale.policy"
        check(self.pipeline.mode != "colocated", what, list(sc.schedule) or sc.policy,
              "pipeline.mode=colocated has no rollout instances to add; use sync or async, or drop it")
        reserve = self.cluster.reserve_devices
        check(reserve >= 1, "cluster.reserve_devices", reserve, f"{what} needs reserve devices to join; set it >= 1")
        check(sc.most_added(reserve) <= reserve, "scale.schedule", list(sc.schedule),
              f"adds more devices than cluster.reserve_devices={reserve}; add reserve devices or join fewer")
        for after in sc.scheduled():
            check(after < self.run.steps - 1, "scale.schedule.after_step", after,
                  f"a join after step {after} serves no step of run.steps={self.run.steps}; schedule an earlier step")
        check(not self.resize.schedule and self.resize.policy == "static", what, list(sc.schedule) or sc.policy,
              "scale-out and resizing (resize.schedule or resize.policy=controller) exclude each other for now; "
              "drop one")


# Names TRL's GRPOConfig and verl's trainer config use, and where the same setting lives here: an
# unknown key with one of these names gets this hint instead of a spelling suggestion.
FOREIGN_KEYS = {
    "beta": "TRL's beta is algorithm.kl_coef",
    "kl_loss_coef": "verl's kl_loss_coef is algorithm.kl_coef",
    "kl_loss_type": "verl's kl_loss_type is algorithm.kl_estimator (kl = k1, mse = k2, low_var_kl = k3)",
    "num_generations": "TRL's num_generations is algorithm.group_size",
    "learning_rate": "TRL's learning_rate is algorithm.lr",
    "epsilon": "TRL's epsilon is algorithm.clip_eps (or clip_eps_low)",
    "epsilon_high": "TRL's epsilon_high is algorithm.clip_eps_high",
    "clip_ratio": "verl's clip_ratio is algorithm.clip_eps",
    "clip_ratio_low": "verl's clip_ratio_low is algorithm.clip_eps_low",
    "clip_ratio_high": "verl's clip_ratio_high is algorithm.clip_eps_high",
    "loss_type": "TRL's loss_type is algorithm.loss_agg: its grpo (a mean per response) is loss_agg=sequence, not "
                 "algorithm.loss=grpo (a mean over every token of the step: TRL's dapo with epsilon_high = epsilon); "
                 "its dapo is loss_agg=token, its dr_grpo loss_agg=constant; its bnpo has no equivalent (use "
                 "loss_agg=token)",
    "loss_agg_mode": "verl's loss_agg_mode is algorithm.loss_agg (token-mean = token, seq-mean-token-mean = "
                     "sequence, seq-mean-token-sum = sequence_sum, seq-mean-token-sum-norm = constant)",
    "adv_estimator": "verl's adv_estimator is algorithm.advantage (grpo, dr_grpo, rloo, reinforce_pp)",
    "entropy_coeff": "verl's entropy_coeff is algorithm.entropy_coef",
    "importance_sampling_level": "TRL's importance_sampling_level is algorithm.ratio_level (token, sequence)",
    "max_completion_length": "TRL's max_completion_length is algorithm.sampling.max_new_tokens",
    "response_length": "verl's response_length is algorithm.sampling.max_new_tokens",
    "temperature": "temperature is algorithm.sampling.temperature",
    "top_p": "top_p is algorithm.sampling.top_p",
    "top_k": "top_k is algorithm.sampling.top_k",
    "per_device_train_batch_size": "TRL's per_device_train_batch_size is algorithm.micro_batch_size (samples)",
    "ppo_micro_batch_size_per_gpu": "verl's ppo_micro_batch_size_per_gpu is algorithm.micro_batch_size",
    "train_batch_size": "verl's train_batch_size is algorithm.prompts_per_step",
    "max_steps": "TRL's max_steps is run.steps",
    "total_training_steps": "verl's total_training_steps is run.steps",
    "output_dir": "TRL's output_dir is run.dir",
    "save_steps": "TRL's save_steps is run.checkpoint_every",
    "save_total_limit": "TRL's save_total_limit is run.keep_checkpoints",
    "eval_steps": "TRL's eval_steps is eval.every (held-out evaluation every N steps)",
    "eval_strategy": "TRL's eval_strategy is eval.every (0 = no evaluation)",
    "eval_dataset": "the held-out dataset is eval.dataset",
    "test_freq": "verl's test_freq is eval.every",
    "model_name_or_path": "model_name_or_path is model.path (a local HF directory)",
    "report_to": "report_to is run.tensorboard",
    "lora": "LoRA is model.lora: {r, alpha, dropout, target_modules}",
    "lora_r": "TRL's lora_r is model.lora.r",
    "lora_alpha": "TRL's lora_alpha is model.lora.alpha",
    "lora_dropout": "TRL's lora_dropout is model.lora.dropout",
    "lora_target_modules": "TRL's lora_target_modules is model.lora.target_modules",
    "use_peft": "LoRA is model.lora: {r, alpha, dropout, target_modules}",
}


# TRL's bnpo divides each micro-batch by its own token count: its update depends on how the batch
# is cut into micro-batches, which Poise keeps free (any split, any number of train devices).
BNPO_REFUSAL = ("TRL's bnpo divides each micro-batch by its own token count, so its update depends on how the "
                "batch is cut into micro-batches; use algorithm.loss_agg=token (the step's token count, TRL's dapo)")


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """The config of YAML file `path` (None: the defaults) with dotted `overrides` applied."""
    data = read_yaml(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return build_train_config(data)


def build_train_config(data: Mapping[str, Any]) -> TrainConfig:
    """The config of a mapping as a YAML file holds it; a TRL or verl key name gets its Poise name."""
    try:
        return build(TrainConfig, data)
    except ConfigError as e:
        if e.key in ("algorithm.loss", "algorithm.loss_agg") and e.value == "bnpo":
            raise ConfigError(e.key, e.value, BNPO_REFUSAL) from None
        foreign = FOREIGN_KEYS.get(e.key.rpartition(".")[2])
        if foreign is None or not e.allowed.startswith("unknown key"):
            raise
        raise ConfigError(e.key, e.value, f"unknown key; {foreign}") from None
