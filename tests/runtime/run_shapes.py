"""The small real-compute job the runtime tests share: 4 CPU devices, 4 prompts x 4 samples per
step, 12 new tokens, a checkpoint per step, 16 samples cut into 6 uneven micro-batches of 3 (so
each split reduces a different set of tree nodes). Each test module adds its own steps and
settings."""

import contextlib

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


class RunMemo:
    """Each named run of a test module, made once (a Ray run costs seconds here) and shared: every
    test that needs it gets the same RunRecord, or the same failure re-raised. `config(run_dir,
    *extra)` makes a run's TrainConfig; `faults` are tests/fault_injection.py `injected`'s
    arguments; other keyword arguments go to `train`."""

    def __init__(self, root, config, read_run):
        self.root, self.config, self.read = root, config, read_run
        self._done: dict = {}

    def get(self, name: str, train, *extra, faults: dict | None = None, **kwargs):
        from fault_injection import injected  # tests/fault_injection.py

        if name not in self._done:
            run_dir = self.root / name
            try:
                with injected(**faults) if faults else contextlib.nullcontext():
                    train(self.config(run_dir, *extra), **kwargs)
                self._done[name] = self.read(run_dir)
            except Exception as e:  # noqa: BLE001 - every test that needs this run reports the same failure
                self._done[name] = e
        if isinstance(self._done[name], Exception):
            raise self._done[name]
        return self._done[name]
