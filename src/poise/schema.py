"""Typed, frozen configs built from YAML with dotted overrides.

Every config section is a frozen dataclass whose fields carry their help text in
`metadata["help"]` and whose `__post_init__` validates ranges by raising `ConfigError`.
`build(cls, data)` turns a plain mapping into such a dataclass, failing on an unknown key
or a wrong type with the dotted key, the value, and what is allowed. Pure Python: no torch,
so `poise.policy` and `poise.sim` may use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar, Union, get_args, get_origin

import yaml

from poise.errors import ConfigError, PoiseError

T = TypeVar("T")


def help_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its help text next to it (TRL-style)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple or default_factory for mutable defaults")
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def help_factory(factory: Any, help: str) -> Any:
    return dataclasses.field(default_factory=factory, metadata={"help": help})


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    if origin in (tuple, list):
        args = get_args(tp)
        return f"a list of {_type_name(args[0])}" if args else "a list"
    if origin in (dict, Mapping):
        k, v = get_args(tp)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Convert a YAML value to `tp` or raise ConfigError naming `key`."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(key, value, f"allowed: {_type_name(tp)}")
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as e:
                if dataclasses.is_dataclass(arg) and isinstance(value, Mapping):
                    raise  # a mapping meant as this section: its own error names the bad key
                errors.append(e)
        raise ConfigError(key, value, f"expected {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(key, value, f"expected {_type_name(tp)}")
        return build(tp, value, prefix=key)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, f"expected {_type_name(tp)}")
        (item_tp, *rest) = get_args(tp) or (Any,)
        return tuple(_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(key, value, f"expected {_type_name(tp)}")
        kt, vt = get_args(tp)
        return {_convert(kt, k, f"{key}.{k}"): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(key, value, "expected an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(key, value, "expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, value, "expected a string")
    raise TypeError(f"unsupported config type {tp!r} at {key}")


def build(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types raise ConfigError."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "allowed keys: " + ", ".join(sorted(fields))
            raise ConfigError(dotted, data[key], f"unknown key; {hint}")
    kwargs = {}
    for name, value in data.items():
        dotted = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _convert(hints[name], value, dotted)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if prefix and not e.key.startswith(prefix + "."):
            raise ConfigError(f"{prefix}.{e.key}", e.value, e.allowed) from None
        raise


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Range validation for `__post_init__`: raise ConfigError unless `ok`."""
    if not ok:
        raise ConfigError(key, value, allowed)


def to_dict(obj: Any) -> Any:
    """A dataclass config as plain YAML-able data (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or a syntax error is a one-line PoiseError."""
    path = Path(path)
    if not path.is_file():
        raise PoiseError(f"config file '{path}' does not exist; pass a YAML file such as configs/demo.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PoiseError(f"YAML syntax error at {where}: {problem}; fix the file and rerun") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PoiseError(f"config file '{path}' must hold a mapping at top level, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a nested mapping, in place."""
    for item in overrides:
        if "=" not in item:
            raise PoiseError(f"override '{item}' is not key=value; write e.g. algorithm.lr=3e-4")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node: Any = data
        steps = _override_path(key.strip())
        for step, following in zip(steps, steps[1:]):
            node = _descend(node, step, following, key, value)
        last = steps[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or not -len(node) <= last < len(node):
                raise ConfigError(key, value, f"index [{last}] is out of range; the list has "
                                              f"{len(node) if isinstance(node, list) else 0} items")
        elif not isinstance(node, dict):
            raise ConfigError(key, value, f"'{last}' is not inside a section")
        node[last] = value
    return data


def _override_path(key: str) -> list[str | int]:
    """'a.b[2].c' -> ['a', 'b', 2, 'c']."""
    steps: list[str | int] = []
    for part in key.split("."):
        name, _, rest = part.partition("[")
        if name:
            steps.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            if not index.lstrip("-").isdigit():
                raise PoiseError(f"override key '{key}': '[{index}]' is not a list index; write e.g. phases[0].steps=3")
            steps.append(int(index))
            rest = rest.removeprefix("[")
    return steps


def _descend(node: Any, step: str | int, following: str | int, key: str, value: Any) -> Any:
    if isinstance(step, int):
        if not isinstance(node, list) or not -len(node) <= step < len(node):
            raise ConfigError(key, value, f"index [{step}] is out of range; the list has "
                                          f"{len(node) if isinstance(node, list) else 0} items")
        return node[step]
    if not isinstance(node, dict):
        raise ConfigError(key, value, f"'{step}' is not inside a section")
    child = node.setdefault(step, [] if isinstance(following, int) else {})
    if not isinstance(child, (dict, list)):
        raise ConfigError(key, value, f"'{step}' is not a section")
    return child


def load(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Load `cls` from a YAML file (or defaults when `path` is None) plus dotted overrides."""
    data = read_yaml(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return build(cls, data)


def dump(obj: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(obj), sort_keys=False))
