"""`reward.functions` entries resolved to what a sandbox worker imports, without running user code.

Three forms (RewardFunctionConfig.fn):

- a built-in name (`task`, `exact`, `items`, `math`, `code`): `poise.rewards.builtin.<name>`;
- `path/to/file.py:function`: the file, relative to the working directory, loaded as a module of
  its own inside the sandbox (it may import the standard library, installed packages and poise;
  sibling files are not readable there: put helpers in a package and use the next form);
- `package.module:function`: found on the driver's Python path (working directory first) by
  `importlib.machinery.PathFinder`, which reads directories but executes nothing. The sandbox may
  read that top-level module's file, or its package directory.

Whatever can be checked here (the file exists, the module is on the path) fails with one line
naming the key and the fix; that the attribute exists and is callable is checked by the sandbox
itself when its workers start (poise.rewards.sandbox), before any sample is scored.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from poise.config import RewardConfig
from poise.errors import ConfigError
from poise.rewards.builtin import BUILTINS

FORMS = "a built-in (task, exact, items, math, code), 'module:function' or 'path/to/file.py:function'"
ENV_FORMS = "a built-in (guess, tools), 'module:Class' or 'path/to/file.py:Class'"
TOOL_FORMS = "a built-in tool (calculator, python) or 'module:function'"


@dataclass(frozen=True)
class FunctionSpec:
    """Where a worker finds one reward function."""

    key: str  # config key, for errors: "reward.functions[0].fn"
    fn: str  # as configured
    name: str  # metrics key reward/<name>
    weight: float
    module: str  # the module name to import it under
    attr: str  # dotted attribute within the module
    origin: str | None  # the file to load the top-level module from (None: import `module` by name)
    package_dir: str | None  # the top-level package's directory (origin is its __init__.py)
    reads: tuple[str, ...]  # paths the sandbox must let the worker read
    # an environment class (poise.episodes), not a reward function: {"args": constructor kwargs,
    # "max_observation_chars": n}; the worker replays an episode's actions on it (worker._env_answer)
    env: dict | None = None


def resolve_functions(cfg: RewardConfig, cwd: str | None = None) -> tuple[FunctionSpec, ...]:
    """`cfg.resolved` as FunctionSpecs; a missing file or module raises ConfigError."""
    cwd = cwd or os.getcwd()
    return tuple(_resolve(i, f.fn, f.label, f.weight, cwd) for i, f in enumerate(cfg.resolved))


def resolve_environment(path: str, args: dict, max_observation_chars: int, cwd: str | None = None,
                        name: str | None = None) -> FunctionSpec:
    """An environment class (env.name, resolved) as a FunctionSpec the sandbox loads like a reward
    function; its calls are episode turns (worker._env_answer). A missing file or module raises
    ConfigError naming env.name."""
    cwd = cwd or os.getcwd()
    spec = _resolve(0, path, "env", 0.0, cwd, key="env.name", forms=ENV_FORMS)
    # the modules of the tools it names (env.args.tools: module:function), found here like reward
    # functions and imported by the worker before the environment, which may then import them by name
    tools = args.get("tools") if isinstance(args.get("tools"), (list, tuple)) else ()
    preload = [_resolve(i, t, "tool", 0.0, cwd, key=f"env.args.tools[{i}]", forms=TOOL_FORMS)
               for i, t in enumerate(tools) if isinstance(t, str) and ":" in t]
    reads = tuple(sorted({*spec.reads, *(r for p in preload for r in p.reads)}))
    return dataclasses.replace(spec, fn=name or path, reads=reads,
                               env={"args": dict(args), "max_observation_chars": max_observation_chars,
                                    "preload": [dataclasses.asdict(p) for p in preload]})


def _resolve(i: int, fn: str, name: str, weight: float, cwd: str, key: str | None = None,
             forms: str = FORMS) -> FunctionSpec:
    key = key or f"reward.functions[{i}].fn"
    if fn in BUILTINS:
        return FunctionSpec(key, fn, name, weight, "poise.rewards.builtin", fn, None, None, ())
    where, _, attr = fn.rpartition(":")
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(cwd, where).resolve()
        if not path.is_file():
            raise ConfigError(key, fn, f"file '{where}' does not exist (relative to {cwd}); give {forms}")
        module = "poise_user_reward_" + "".join(c if c.isalnum() else "_" for c in path.stem) + f"_{i}"
        return FunctionSpec(key, fn, name, weight, module, attr, str(path), None, (str(path),))
    top = where.split(".")[0]
    if not all(part.isidentifier() for part in where.split(".")):
        raise ConfigError(key, fn, f"'{where}' is not a module name; give {forms}")
    if top in sys.builtin_module_names:
        return FunctionSpec(key, fn, name, weight, where, attr, None, None, ())
    search = [cwd if p in ("", ".") else p for p in sys.path]
    if cwd not in search:
        search.insert(0, cwd)
    spec = importlib.machinery.PathFinder.find_spec(top, search)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise ConfigError(key, fn, f"no module named '{top}' in the working directory ({cwd}) or on the Python "
                                   f"path; give {forms}")
    locations = list(spec.submodule_search_locations or [])
    if locations:  # a package: the worker may read its directory
        package_dir = locations[0]
        origin = spec.origin if spec.origin and os.path.isfile(spec.origin) else None
        if origin is None:  # a namespace package: import it by name from its directory
            return FunctionSpec(key, fn, name, weight, where, attr, None, None, tuple(locations))
        return FunctionSpec(key, fn, name, weight, where, attr, origin, package_dir, (package_dir,))
    return FunctionSpec(key, fn, name, weight, where, attr, spec.origin, None, (spec.origin,))


__all__ = ["FunctionSpec", "resolve_functions", "resolve_environment", "FORMS"]
