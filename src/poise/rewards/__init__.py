"""Reward functions and the sandbox that runs them (docs/design.md, Layers: `rewards/`, no torch).

- `builtin`: the built-in functions (`task`, `exact`, `items`, `math`, `code`), TRL-compatible:
  `fn(prompts, completions, **columns) -> list[float]`.
- `functions`: `reward.functions` entries resolved to what the sandbox imports (`module:attr`,
  `path/to/file.py:attr` or a built-in name), checked without running user code in the driver.
- `sandbox`: the pool of confined worker processes (`worker`, `confine`) that runs them.
- `scorer`: per-sample rewards of several weighted functions, with fallback and failure counts.

Kept free of imports here: `poise.data.tasks` imports `builtin`, and `poise.config` is loaded
before `scorer` is.
"""
