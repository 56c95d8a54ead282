"""The small real-compute job the runtime tests share: 4 CPU devices, 4 prompts x 4 samples per
step, 12 new tokens, a checkpoint per step, 16 samples cut into 6 uneven micro-batches of 3 (so
each split reduces a different set of tree nodes). Each test module adds its own steps and
settings."""

PROMPTS, GROUP = 4, 4


def tiny_job(steps: int) -> list[str]:
    return [
        "run.progress=false",
        "run.log_tokens=true",
        f"run.steps={steps}",
        "run.checkpoint_every=1",  # a checkpoint per step: weights must move, and match, at every one
        f"algorithm.prompts_per_step={PROMPTS}",
        f"algorithm.group_size={GROUP}",
        "algorithm.micro_batch_size=3",  # 16 samples -> 6 uneven micro-batches
        "algorithm.sampling.max_new_tokens=12",
        "rollout.num_slots=8",
        "cluster.devices=4",
    ]
