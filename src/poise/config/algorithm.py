"""The `algorithm:` section: the loss, its presets, the advantage, batching and sampling."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from poise.schema import check, help_factory, help_field

# The one definition of the micro-batching knob (`algorithm.micro_batch_size` of `poise train`,
# `cluster.micro_batch_size` of a scenario).
MICRO_BATCH_SIZE_HELP = ("samples per micro-batch: the step's samples in sample-id order (never arrival order) "
                         "cut every N; each micro-batch trains on one train device (contiguous ranges), so fewer "
                         "micro-batches than train devices leaves devices idle")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = help_field(1.0, "softmax temperature; 0 means greedy")
    top_p: float = help_field(1.0, "nucleus sampling: keep the smallest set of tokens with this much mass")
    top_k: int = help_field(0, "keep only the k most likely tokens; 0 keeps all")
    max_new_tokens: int = help_field(80, "longest response in tokens")

    def __post_init__(self) -> None:
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(self.top_k >= 0, "top_k", self.top_k, "must be >= 0 (0 = no top-k)")
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be >= 1")


# What `algorithm.loss` sets, knob by knob, where the config leaves the knob null; a knob a preset
# does not name takes the grpo default (clip_eps both sides, token ratio, loss_agg token, advantage grpo).
LOSS_PRESETS: dict[str, dict[str, float | str]] = {
    "grpo": {},
    # Yu et al. 2025: decoupled clip (eps_low 0.2, eps_high 0.28), token-level loss. Its dynamic sampling
    # and overlong reward shaping are not part of the preset.
    "dapo": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_agg": "token"},
    # Liu et al. 2025: no std in the advantage, a constant normaliser instead of each response's length
    "dr_grpo": {"advantage": "dr_grpo", "loss_agg": "constant"},
    # Zheng et al. 2025: sequence-level ratio, clipped as a whole with the paper's ranges, averaged per response
    "gspo": {"ratio_level": "sequence", "loss_agg": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
}


# The band [rollout_is_low, rollout_is_high] each masking correction keeps where the config leaves it null.
CORRECTION_BANDS: dict[str, tuple[float, float]] = {
    "sequence_mask": (0.5, 2.0),  # verl's rollout_rs sequence: threshold 2.0, lower bound its reciprocal
    "geometric_reject": (0.999, 1.001),  # verl's rollout_rs geometric preset (decoupled_geo_rs)
    "icepop": (0.5, 5.0),  # IcePop's alpha and beta (Ring-1T)
}


@dataclass(frozen=True)
class AlgorithmConfig:
    name: Literal["grpo"] = help_field("grpo", "RL algorithm")
    prompts_per_step: int = help_field(16, "prompts per step")
    group_size: int = help_field(8, "responses per prompt (G); GRPO normalises rewards within a group")
    lr: float = help_field(1e-3, "AdamW learning rate")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    max_grad_norm: float = help_field(1.0, "clip the global gradient norm; 0 disables")
    loss: Literal["grpo", "dapo", "dr_grpo", "gspo"] = help_field(
        "grpo", "preset of the loss knobs left unset (null) below: grpo (clip_eps both sides, loss_agg token, "
                "advantage grpo); dapo (clip 0.2 low / 0.28 high); dr_grpo (advantage dr_grpo, loss_agg "
                "constant); gspo (ratio_level sequence, loss_agg sequence, clip 3e-4 low / 4e-4 high). A knob "
                "you set wins over its preset")
    clip_eps: float = help_field(0.2, "PPO clip range epsilon, both sides (clip_eps_low/high, if set or preset, "
                                      "replace it)")
    clip_eps_low: float | None = help_field(None, "the ratio is clipped below at 1 - clip_eps_low; null = the "
                                                  "preset's (grpo: clip_eps)")
    clip_eps_high: float | None = help_field(None, "the ratio is clipped above at 1 + clip_eps_high (DAPO's "
                                                   "clip-higher: above clip_eps_low); null = the preset's "
                                                   "(grpo: clip_eps)")
    ratio_level: Literal["token", "sequence"] | None = help_field(
        None, "token: each token's own ratio (PPO, GRPO); sequence: each response's length-normalised "
              "sequence ratio, clipped as a whole (GSPO); null = the preset's")
    kl_coef: float = help_field(0.0, "weight of the KL penalty to the frozen initial policy (TRL's beta); "
                                     "0 disables")
    kl_estimator: Literal["k1", "k2", "k3"] = help_field(
        "k3", "estimator of the KL penalty per token: k1 = logp - ref, k2 = (logp - ref)^2 / 2, "
              "k3 = exp(ref - logp) - (ref - logp) - 1 (GRPO's)")
    entropy_coef: float = help_field(0.0, "weight of an entropy bonus: the loss minus entropy_coef times each "
                                          "response token's policy entropy (aggregated like the loss); 0 disables")
    loss_agg: Literal["token", "sequence", "sequence_sum", "constant"] | None = help_field(
        None, "how per-token losses become the step's loss. token: mean over all response tokens of the step "
              "(DAPO; verl token-mean); sequence: mean per response, then over responses (GRPO paper; verl "
              "seq-mean-token-mean); sequence_sum: sum per response, mean over responses (verl "
              "seq-mean-token-sum); constant: sum over tokens / (responses x sampling.max_new_tokens) "
              "(Dr. GRPO; TRL dr_grpo); null = the preset's")
    advantage: Literal["grpo", "grpo_batch", "dr_grpo", "rloo", "reinforce_pp"] | None = help_field(
        None, "outcome advantage of each response: grpo (centred in its group, divided by the group's std); "
              "grpo_batch (centred in its group, divided by the std of every reward of the step: TRL's "
              "scale_rewards batch; training waits for every reward of the step); dr_grpo (centred only); rloo "
              "(minus the mean of the group's other rewards); reinforce_pp (centred in its group, then divided "
              "by the std of the step's centred values: training waits for every reward of the step); null = "
              "the preset's, or what scale_rewards names")
    scale_rewards: bool | Literal["group", "batch", "none"] = help_field(
        True, "TRL's spelling of algorithm.advantage: true or group = advantage grpo, batch = grpo_batch, "
              "false or none = dr_grpo")
    std_eps: float = help_field(1e-6, "added to the std that grpo, grpo_batch and reinforce_pp divide by (TRL "
                                      "adds 1e-4: set 1e-4 to match it)")
    dynamic_sampling: bool = help_field(False, "DAPO's dynamic sampling: a prompt group whose rewards are all equal "
                                               "(no advantage) is dropped as soon as it is scored and another prompt "
                                               "is drawn in its place, until the step has prompts_per_step groups "
                                               "that teach something (extra prompts: a function of seed, step and "
                                               "draw index, so every split trains on the same ones)")
    max_prompt_draws: int = help_field(0, "with dynamic_sampling, prompt groups a step may generate at most, kept "
                                          "and dropped (verl's max_num_gen_batches x batch); once spent, the "
                                          "earliest dropped groups fill the step; 0 = 4 x prompts_per_step")
    overlong_buffer: int = help_field(0, "DAPO's overlong reward shaping: a response longer than "
                                         "sampling.max_new_tokens - overlong_buffer tokens loses up to "
                                         "overlong_penalty of reward, linearly in the tokens past that mark; "
                                         "0 disables")
    overlong_penalty: float = help_field(1.0, "the reward a response of max_new_tokens tokens loses with "
                                              "overlong_buffer > 0")
    micro_batch_size: int = help_field(16, MICRO_BATCH_SIZE_HELP)
    updates_per_step: int = help_field(1, "optimizer updates per step: the step's samples, in sample-id order, "
                                          "are cut into this many mini-batches of whole groups (PPO mini-batches)")
    old_logprobs: Literal["rollout", "recompute"] = help_field(
        "rollout", "the PPO ratio's old log-probs. rollout: the rollout engine's, which come with each sample "
                   "(exact where engine and trainer agree bit for bit, as Poise's engine in fp32); recompute: "
                   "the trainer's own under the step-start weights, as verl recomputes them, so another backend "
                   "(vLLM) or bf16 leaves the first update's ratio at exactly 1 (departure from verl: the first "
                   "mini-batch's are its own forward's, detached, not a separate forward; with updates_per_step > 1 "
                   "each train device keeps a copy of the step-start weights for the later mini-batches, one more "
                   "forward each). In async "
                   "mode the samples come from the weights one update older: recompute makes the trainer's "
                   "current weights the proximal policy (decoupled PPO, as AReaL and verl) and rollout_is "
                   "corrects behaviour -> proximal")
    rollout_is: Literal["none", "token", "sequence", "sequence_mask", "geometric_reject", "icepop"] = help_field(
        "none", "off-policy correction of the rollout (behaviour) policy towards the proximal one, rho = exp(old - "
                "rollout logp) per token: each token's clipped surrogate (not the KL or entropy terms) times a "
                "weight without gradient (docs/corrections.md). token: min(rho, rollout_is_cap) (TIS, Yao et al. "
                "2025; verl's rollout_is); sequence: min(prod over the response of rho, rollout_is_cap) for all its "
                "tokens; sequence_mask: 1, or 0 for the whole response where prod rho is outside [rollout_is_low, "
                "rollout_is_high]; geometric_reject: the same with the geometric mean exp(mean(old - rollout logp)); "
                "icepop: rho, or 0 where the token's rho is outside [rollout_is_low, rollout_is_high] (IcePop). "
                "Masked tokens stay in the loss normaliser. Needs old_logprobs recompute")
    rollout_is_cap: float = help_field(2.0, "the largest rollout_is weight of token and sequence (truncation); must "
                                            "be >= 1")
    rollout_is_low: float | None = help_field(
        None, "the lowest ratio sequence_mask, geometric_reject and icepop keep (in (0, 1]); null = the preset's: "
              "sequence_mask 0.5, geometric_reject 0.999, icepop 0.5")
    rollout_is_high: float | None = help_field(
        None, "the highest ratio sequence_mask, geometric_reject and icepop keep (>= 1); null = the preset's: "
              "sequence_mask 2.0, geometric_reject 1.001, icepop 5.0")
    gradient_checkpointing: bool = help_field(False, "recompute each decoder layer's activations in the backward "
                                                     "pass instead of keeping them (less memory, ~1/3 more "
                                                     "compute; the same bits)")
    sampling: SamplingConfig = help_factory(SamplingConfig, "rollout sampling")

    def __post_init__(self) -> None:
        check(self.prompts_per_step >= 1, "prompts_per_step", self.prompts_per_step, "must be >= 1")
        check(self.group_size >= 2, "group_size", self.group_size,
              "GRPO needs at least 2 responses per prompt to normalise rewards within a group; set group_size >= 2")
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        check(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "must be >= 0 (0 disables)")
        check(0 < self.clip_eps < 1, "clip_eps", self.clip_eps, "must be in (0, 1)")
        check(0 < self.std_eps <= 1, "std_eps", self.std_eps, "must be in (0, 1], e.g. 1e-6 (TRL: 1e-4)")
        self._resolve_loss_preset()
        check(0 < self.clip_eps_low < 1, "clip_eps_low", self.clip_eps_low, "must be in (0, 1), e.g. 0.2")
        check(self.clip_eps_high >= self.clip_eps_low, "clip_eps_high", self.clip_eps_high,
              f"must be >= clip_eps_low ({self.clip_eps_low}): clip-higher widens the upper side, e.g. 0.28")
        check(self.entropy_coef >= 0, "entropy_coef", self.entropy_coef, "must be >= 0 (0 disables)")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0")
        check(self.max_prompt_draws == 0 or self.max_prompt_draws >= self.prompts_per_step, "max_prompt_draws",
              self.max_prompt_draws, f"must be 0 (= 4 x prompts_per_step) or >= prompts_per_step "
                                     f"({self.prompts_per_step})")
        check(0 <= self.overlong_buffer < self.sampling.max_new_tokens, "overlong_buffer", self.overlong_buffer,
              f"must be in [0, sampling.max_new_tokens) = [0, {self.sampling.max_new_tokens}); 0 disables")
        check(self.overlong_penalty >= 0, "overlong_penalty", self.overlong_penalty, "must be >= 0")
        check(self.micro_batch_size >= 1, "micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(self.updates_per_step >= 1, "updates_per_step", self.updates_per_step, "must be >= 1")
        check(self.prompts_per_step % self.updates_per_step == 0, "updates_per_step", self.updates_per_step,
              f"must divide prompts_per_step ({self.prompts_per_step}) so each update gets whole groups")
        check(self.rollout_is == "none" or self.old_logprobs == "recompute", "rollout_is", self.rollout_is,
              "needs algorithm.old_logprobs=recompute: with old_logprobs rollout every weight is exactly 1; set "
              "it, or rollout_is=none")
        check(self.rollout_is_cap >= 1 and math.isfinite(self.rollout_is_cap), "rollout_is_cap",
              self.rollout_is_cap, "must be >= 1 (a finite truncation), e.g. 2.0")
        self._resolve_correction_band()

    def _resolve_correction_band(self) -> None:
        """Fill rollout_is_low / _high left null from the masking preset (verl's rollout_rs sequence
        2.0 with the reciprocal below, verl's geometric 1.001 / 0.999, IcePop's [0.5, 5]); a preset
        without a band takes neither."""
        band = CORRECTION_BANDS.get(self.rollout_is)
        if band is None:
            for key in ("rollout_is_low", "rollout_is_high"):
                check(getattr(self, key) is None, key, getattr(self, key),
                      f"applies to rollout_is {', '.join(CORRECTION_BANDS)} only, not {self.rollout_is}; drop it")
            return
        low = band[0] if self.rollout_is_low is None else self.rollout_is_low
        high = band[1] if self.rollout_is_high is None else self.rollout_is_high
        check(0 < low <= 1, "rollout_is_low", low, f"must be in (0, 1], e.g. {band[0]} for {self.rollout_is}")
        check(1 <= high and math.isfinite(high), "rollout_is_high", high,
              f"must be >= 1 and finite, e.g. {band[1]} for {self.rollout_is}")
        object.__setattr__(self, "rollout_is_low", float(low))
        object.__setattr__(self, "rollout_is_high", float(high))

    def _resolve_loss_preset(self) -> None:
        """Fill each loss knob left null from the `loss` preset (a knob set explicitly wins), so the
        resolved config (RUN_DIR/config.yaml) names every knob and loads back to the same run."""
        preset = LOSS_PRESETS[self.loss]
        scale = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        named = {"none": "dr_grpo", "batch": "grpo_batch"}.get(scale)  # what a scale_rewards other than group spells
        check(named is None or self.advantage in (None, named, "rloo", "reinforce_pp"), "scale_rewards",
              self.scale_rewards, f"means advantage {named}, but algorithm.advantage is {self.advantage}; drop one "
                                  "of them")
        values = {
            "clip_eps_low": self.clip_eps_low if self.clip_eps_low is not None else preset.get("clip_eps_low",
                                                                                             self.clip_eps),
            "clip_eps_high": self.clip_eps_high if self.clip_eps_high is not None else preset.get("clip_eps_high",
                                                                                                self.clip_eps),
            "ratio_level": self.ratio_level or preset.get("ratio_level", "token"),
            "loss_agg": self.loss_agg or preset.get("loss_agg", "token"),
            "advantage": self.advantage or named or preset.get("advantage", "grpo"),
        }
        values["scale_rewards"] = "batch" if values["advantage"] == "grpo_batch" else values["advantage"] == "grpo"
        for name, value in values.items():
            object.__setattr__(self, name, value)


def preset_filled_knobs(algo: AlgorithmConfig) -> frozenset[str]:
    """The loss knobs of `algo` that hold what its `loss` preset gives them (set or not): a written-out
    template leaves these null, so changing `loss` in it applies the new preset instead of pinning
    this one's values under the new name. `scale_rewards` is not among them: its false only spells
    advantage dr_grpo, which `advantage` carries."""
    knobs = ("clip_eps_low", "clip_eps_high", "ratio_level", "loss_agg", "advantage")
    base = dataclasses.replace(algo, scale_rewards=True, **{k: None for k in knobs})
    return frozenset(k for k in knobs if getattr(base, k) == getattr(algo, k))
