"""Poise: RL post-training of LLMs on disaggregated devices.

See docs/design.md for the layers; `poise.policy` is pure and never imports torch or ray.

The Python API (poise/api.py): `poise.train(config, **overrides) -> RunResult`,
`poise.load_config(config, **overrides)`, `poise.simulate(scenario, out, **overrides)`. They load
on first use, so `import poise` (and every `poise` command) stays as light as it was.
"""

__version__ = "0.1.0"
_API = ("RunResult", "load_config", "simulate")
__all__ = ["RunResult", "load_config", "simulate", "train"]


def train(config=None, **overrides):
    """Run RL post-training as `poise train` does and return a `RunResult` (poise/api.py `train`).

    `config` is a YAML path, a mapping or `poise.load_config(...)`; each keyword overrides one
    config section with a mapping of its keys: `poise.train("mine.yaml", run={"steps": 5})`.
    """
    from poise.api import train as run

    return run(config, **overrides)


def __getattr__(name: str):
    if name in _API:
        from poise import api

        return getattr(api, name)
    raise AttributeError(f"module 'poise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
