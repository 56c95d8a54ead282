"""Tools for multi-turn episodes: schemas, loading by import path, call parsing, an environment.

A tool is a plain typed Python function with a Google-style docstring. Its schema is the
OpenAI/HF function schema that chat templates render (`apply_chat_template(tools=...)`); the
model calls it in one of two text formats (docs/tools.md):

- `hermes` (Qwen, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks;
  each result comes back as `<tool_response>\\n...\\n</tool_response>`.
- `plain`, for the built-in character tokenizer (no `<>{}_` in its vocabulary): the turn is one
  call `name(arguments)`; the result comes back as the line `= result`.

`ToolEnvironment` implements `poise.episodes.protocol.Environment`: a turn without a call ends
the episode (the run's reward functions score that answer); a turn with calls gets their results.
Model text is adversarial: every malformed call becomes an observation the model can read, never
an exception out of `step`. Torch-free and ray-free; tools run in the process of the environment
(the reward sandbox), the `python` tool adds a process of its own.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence, Union

from poise.data.tokenizer import CHARS
from poise.episodes.protocol import StepResult
from poise.errors import ConfigError

FORMATS = ("hermes", "plain")
BUILTIN_TOOLS = ("calculator", "python")  # names load_tool resolves in poise.episodes.builtin_tools
HINTS = "str, int, float, bool, list[...], dict, Optional[...] / X | None or Literal[...]"
SECTIONS = ("Args", "Arguments", "Parameters", "Returns", "Return", "Yields", "Raises", "Examples", "Example",
            "Note", "Notes")
TRUNCATED = " ...(truncated)"
PLAIN_NAME = re.compile(r"[a-z][a-z0-9]*")  # what the character tokenizer can write before '('
PLAIN_TYPES = ("string", "integer", "number", "boolean")  # what a comma-separated plain value can be


class ToolCallError(Exception):
    """A model's tool call that cannot run; the message is the observation the model reads next."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


# --- schema -------------------------------------------------------------------------------------


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The function schema of `fn`, as `transformers.utils.get_json_schema` derives it (without
    its `return` entry, which the chat templates do not need). Raises ConfigError in one line."""
    name = getattr(fn, "__name__", type(fn).__name__)
    description, arg_docs = _docstring(fn)
    if not description:
        raise ConfigError(f"tool {name}", "no docstring", "add a docstring whose first line says what the tool "
                                                          "does (the model reads it)")
    try:
        hints = typing.get_type_hints(fn, include_extras=False)
    except Exception as e:  # an annotation that names something undefined
        raise ConfigError(f"tool {name}", _one_line(str(e)), "its type hints must name types that exist") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        where = f"tool {name}, parameter {p.name}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ConfigError(where, str(p), "tools are called with named arguments: give each one a name and a "
                                             "type hint (no *args, **kwargs or positional-only parameters)")
        if p.name not in hints:
            raise ConfigError(where, "no type hint", f"give it a type hint: {HINTS}")
        prop = _hint_schema(hints[p.name], where)
        if p.name in arg_docs:
            prop["description"] = arg_docs[p.name]
        properties[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _hint_schema(hint: Any, where: str) -> dict[str, Any]:
    """JSON schema of one type hint; anything outside HINTS raises ConfigError naming it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    scalars = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in scalars:
        return {"type": scalars[hint]}
    if hint in (list, dict):
        return {"type": "array" if hint is list else "object"}
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _hint_schema(args[0], where)}
    if origin is dict and len(args) == 2 and args[0] is str:
        return {"type": "object", "additionalProperties": _hint_schema(args[1], where)}
    if origin is Literal and args and all(type(a) in scalars for a in args):
        kinds = list(dict.fromkeys(scalars[type(a)] for a in args))
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        (inner,) = [a for a in args if a is not type(None)]
        return {**_hint_schema(inner, where), "nullable": True}
    raise ConfigError(where, _hint_name(hint), f"supported type hints: {HINTS}")


def _hint_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(the text before the first section, {parameter: its `Args:` description})."""
    lines = (inspect.getdoc(fn) or "").splitlines()
    header = re.compile(r"\s*(" + "|".join(SECTIONS) + r"):\s*$")
    starts = [i for i, line in enumerate(lines) if header.fullmatch(line)]
    description = "\n".join(lines[:starts[0] if starts else len(lines)]).strip()
    arg_docs: dict[str, str] = {}
    for i in starts:
        if header.fullmatch(lines[i]).group(1) in ("Args", "Arguments", "Parameters"):  # type: ignore[union-attr]
            arg_docs.update(_arg_lines(lines[i + 1:]))
    return description, arg_docs


def _arg_lines(lines: list[str]) -> dict[str, str]:
    """`name (type): text` entries of one Args section; deeper-indented lines continue the entry."""
    docs: dict[str, str] = {}
    indent, current = None, None
    for line in lines:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent or depth == 0:
            break  # the section ended
        entry = re.fullmatch(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
        if depth == indent and entry:
            current = entry.group(1)
            docs[current] = entry.group(2).strip()
        elif current is not None:
            docs[current] = (docs[current] + " " + line.strip()).strip()
    return docs


# --- loading ------------------------------------------------------------------------------------


def load_tool(path: str) -> Tool:
    """A tool by import path (`package.module:function`) or built-in name (calculator, python).
    Imports the module (run this where user code may run: the reward sandbox)."""
    key = "env.args.tools"
    fix = f"give 'module:function' (a typed function with a docstring) or a built-in ({', '.join(BUILTIN_TOOLS)})"
    if not isinstance(path, str):
        raise ConfigError(key, path, fix)
    if path in BUILTIN_TOOLS:
        path = f"poise.episodes.builtin_tools:{path}"
    module_name, _, attr = path.partition(":")
    names_ok = all(part.isidentifier() for part in module_name.split(".") + attr.split("."))
    if not names_ok:
        raise ConfigError(key, path, fix)
    module = _import(module_name, path, key)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(key, path, f"module '{module_name}' has no attribute '{attr}'; {fix}")
        obj = getattr(obj, part)
    if inspect.isclass(obj) or not callable(obj):
        raise ConfigError(key, path, f"'{attr}' is a {type(obj).__name__}, not a function; {fix}")
    return Tool(getattr(obj, "__name__", attr.split(".")[-1]), obj, tool_schema(obj))


def _import(module_name: str, path: str, key: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigError(key, path, f"no module named '{e.name}' on the Python path; check the spelling or "
                                         "install it") from None
        raise ConfigError(key, path, f"importing '{module_name}' failed: {_one_line(repr(e))}; install what it "
                                     "imports") from None
    except Exception as e:  # the user's module raised at import time
        raise ConfigError(key, path, f"importing '{module_name}' failed: {type(e).__name__}: "
                                     f"{_one_line(str(e))}; fix the module") from None


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


# --- parsing ------------------------------------------------------------------------------------


def parse_tool_calls(text: str, fmt: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
    """The tool calls in one model turn, checked against the tools' schemas; [] when there is
    none. A malformed call raises ToolCallError with a sentence meant for the model."""
    if fmt == "hermes":
        return _parse_hermes(text, tools)
    if fmt == "plain":
        return _parse_plain(text, tools)
    raise ConfigError("env.args.format", fmt, f"choose one of {', '.join(FORMATS)}")


def _parse_hermes(text: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
    calls, at = [], text.find("<tool_call>")
    while at >= 0:
        end = text.find("</tool_call>", at)
        if end < 0:
            raise ToolCallError("error: <tool_call> is not closed by </tool_call>")
        body = text[at + len("<tool_call>"):end].strip()
        calls.append(_hermes_call(body, tools))
        at = text.find("<tool_call>", end)
    return calls


def _hermes_call(body: str, tools: Mapping[str, Tool]) -> ToolCall:
    shape = 'write {"name": "<tool>", "arguments": {...}}'
    call = _json(body, "tool call", shape)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ToolCallError(f"error: tool call has no \"name\"; {shape}")
    tool = _tool(call["name"], tools)
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        arguments = _json(arguments, f"\"arguments\" of {tool.name}", shape)
    if not isinstance(arguments, dict):
        raise ToolCallError(f"error: \"arguments\" of {tool.name} must be an object; {shape}")
    _check_arguments(tool, arguments)
    return ToolCall(tool.name, arguments)


def _json(text: str, what: str, shape: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"error: {what} is not valid JSON: {e.msg} at character {e.pos}; {shape}") from None
    except RecursionError:  # model text is adversarial: [[[[... must not end the episode's process
        raise ToolCallError(f"error: {what} is nested too deeply; {shape}") from None


def _parse_plain(text: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
    start = re.match(r"\s*([a-z][a-z0-9]*)\(", text)
    if start is None:
        return []
    tool = _tool(start.group(1), tools)
    call = text.rstrip()
    if not call.endswith(")"):
        raise ToolCallError(f"error: a call is {tool.name}(...) alone on its turn; end it with ')'")
    inner = call[start.end():-1]
    if _raw_parameter(tool) is not None:
        arguments: dict[str, Any] = {_raw_parameter(tool): inner}
    else:
        arguments = _plain_arguments(tool, inner)
    _check_arguments(tool, arguments)
    return [ToolCall(tool.name, arguments)]


def _raw_parameter(tool: Tool) -> str | None:
    """The parameter a plain call passes its whole text to: a tool's only parameter, a required str."""
    props, required = tool.parameters["properties"], tool.parameters["required"]
    if len(props) != 1 or not required:
        return None
    schema = props[required[0]]
    plain_str = schema["type"] == "string" and "enum" not in schema and not schema.get("nullable")
    return required[0] if plain_str else None


def _plain_arguments(tool: Tool, inner: str) -> dict[str, Any]:
    """Comma-separated values, in the order of the signature, each converted by its schema."""
    values = _split_commas(inner) if inner.strip() else []
    names = list(tool.parameters["properties"])
    if len(values) > len(names):
        raise ToolCallError(f"error: {tool.name} takes {len(names)} arguments ({', '.join(names)}), "
                            f"got {len(values)}")
    return {n: _plain_value(tool, n, v) for n, v in zip(names, values)}


def _split_commas(text: str) -> list[str]:
    """Split at commas outside '...' and "..." quotes; a quote opens only at a value's start, so
    an apostrophe inside text (don't) is text."""
    parts, current, quote = [], "", None
    for ch in text:
        if quote is None and ch == ",":
            parts.append(current)
            current = ""
            continue
        if ch == quote:
            quote = None
        elif quote is None and ch in "'\"" and not current.strip():
            quote = ch
        current += ch
    if quote is not None:
        raise ToolCallError(f"error: a quote {quote} is not closed")
    return [p.strip() for p in parts + [current]]


def _plain_value(tool: Tool, name: str, text: str) -> Any:
    schema = tool.parameters["properties"][name]
    if schema.get("nullable") and text == "none":
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]  # quoted: a string, whatever it looks like
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    for kind in kinds:  # the first kind the text converts to
        if kind == "string":
            return text
        if kind == "boolean" and text in ("true", "false"):
            return text == "true"
        if kind in ("integer", "number") and re.fullmatch(r"-?\d+", text):
            return int(text)
        if kind == "number" and re.fullmatch(r"-?(\d+\.?\d*|\.\d+)(e-?\d+)?", text):
            return float(text)
    raise ToolCallError(f"error: argument '{name}' of {tool.name} must be {_kind_words(schema)}, got '{text}'")


def _tool(name: str, tools: Mapping[str, Tool]) -> Tool:
    if name not in tools:
        raise ToolCallError(f"error: unknown tool '{name}'; tools: {', '.join(tools)}")
    return tools[name]


def _check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> None:
    """Missing, extra or mistyped arguments against the tool's schema raise ToolCallError."""
    props, required = tool.parameters["properties"], tool.parameters["required"]
    extra = [k for k in arguments if k not in props]
    if extra:
        raise ToolCallError(f"error: {tool.name} has no argument '{extra[0]}'; its arguments: {', '.join(props)}")
    missing = [k for k in required if k not in arguments]
    if missing:
        raise ToolCallError(f"error: {tool.name} needs the argument '{missing[0]}'")
    for name, value in arguments.items():
        if not _fits(props[name], value):
            raise ToolCallError(f"error: argument '{name}' of {tool.name} must be {_kind_words(props[name])}, "
                                f"got {_one_line(json.dumps(value), 60)}")


def _fits(schema: Mapping[str, Any], value: Any) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    if "enum" in schema:
        return any(type(value) is type(e) and value == e for e in schema["enum"])
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return any(_fits_kind(kind, schema, value) for kind in kinds)


def _fits_kind(kind: str, schema: Mapping[str, Any], value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and ("items" not in schema or all(_fits(schema["items"], v) for v in value))
    if kind == "object":
        inner = schema.get("additionalProperties")
        return isinstance(value, dict) and (inner is None or all(_fits(inner, v) for v in value.values()))
    return False


def _kind_words(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(e) for e in schema["enum"])
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    words = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
             "array": "a list", "object": "an object"}
    return " or ".join(words[k] for k in kinds) + (" or null" if schema.get("nullable") else "")


# --- writing calls and results ------------------------------------------------------------------


def format_tool_call(tool: Tool, arguments: Mapping[str, Any], fmt: str) -> str:
    """The text a model writes to call `tool` (for prompts, examples and SFT data)."""
    if fmt == "hermes":
        return "<tool_call>\n" + json.dumps({"name": tool.name, "arguments": dict(arguments)}) + "\n</tool_call>"
    raw = _raw_parameter(tool)
    if raw is not None:
        return f"{tool.name}({arguments[raw]})"
    values = [_plain_text(arguments[n]) for n in tool.parameters["properties"] if n in arguments]
    return f"{tool.name}({', '.join(values)})"


def _plain_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (int, float)):
        return repr(value)
    # a string is quoted where it would read as another value or split at a comma
    plain = not re.search(r"[,'\"]", value) and value == value.strip() and value != "none"
    return value if plain else ("'" + value + "'" if "'" not in value else '"' + value + '"')


def format_results(results: Sequence[str], fmt: str) -> str:
    """The observation after a turn's calls, in the format's convention."""
    if fmt == "hermes":  # as Qwen's chat template renders consecutive tool messages
        return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return "".join(f"= {r.rstrip()}\n" for r in results)


# --- the environment ----------------------------------------------------------------------------


class ToolEnvironment:
    """Environment whose only effect is tools: the model calls them until it answers.

    A turn without a call ends the episode with reward 0.0 (the run's reward functions score the
    answer). Every call (a malformed turn counts as one) spends one of `max_calls`; calls past
    the limit are not run and say so; a turn that calls with nothing left ends the episode.
    `info` per step: {"tool_calls": calls made, "tool_errors": those that answered with an error}.
    """

    def __init__(self, tools: Sequence[str], format: str = "hermes", max_calls: int = 4,
                 max_result_chars: int = 1000, describe: bool = False):
        if not isinstance(describe, bool):
            raise ConfigError("env.args.describe", describe, "must be true or false")
        self.describe = describe
        if format not in FORMATS:
            raise ConfigError("env.args.format", format, f"choose one of {', '.join(FORMATS)}")
        for key, value in (("env.args.max_calls", max_calls), ("env.args.max_result_chars", max_result_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(key, value, "must be an integer >= 1")
        if isinstance(tools, str) or not isinstance(tools, Sequence) or not tools:
            raise ConfigError("env.args.tools", tools, "give a list of tools: ['calculator', 'module:function']")
        loaded = [load_tool(path) for path in tools]
        self.tools = {t.name: t for t in loaded}
        if len(self.tools) < len(loaded):
            raise ConfigError("env.args.tools", list(tools), "two tools have the same name; rename one")
        if format == "plain":
            for tool in loaded:
                _check_plain(tool)
        self.format, self.max_calls, self.max_result_chars = format, max_calls, max_result_chars
        self._calls = 0

    def schemas(self) -> list[dict[str, Any]]:
        """For `tokenizer.apply_chat_template(messages, tools=env.schemas())`."""
        return [t.schema for t in self.tools.values()]

    def describe_plain(self) -> str:
        """One line for a plain-format prompt: the tools and how to call them."""
        entries = [f"{name}({', '.join(t.parameters['properties'])}) "
                   f"{t.schema['function']['description'].splitlines()[0].rstrip('.')}"
                   for name, t in self.tools.items()]
        line = "tools: " + "; ".join(entries) + ". call one as name(arguments) alone on a turn; the result comes " \
                                                "back as = result."
        # the character tokenizer would read what it cannot write as '?': leave such characters out
        return " ".join("".join(ch for ch in line.lower() if ch in CHARS).split())

    def reset(self, row: Mapping[str, Any], seed: int) -> str:
        """The first observation: the tools and how to call them where `describe` (it joins the
        prompt: the plain format's one line, or hermes' `<tools>` block of schemas as Qwen's template
        writes it), else nothing."""
        self._calls = 0
        if not self.describe:
            return ""
        if self.format == "plain":
            return self.describe_plain()
        schemas = "\n".join(json.dumps(s) for s in self.schemas())
        return ("You may call one or more functions to assist with the user query.\n<tools>\n" + schemas +
                "\n</tools>\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags.")

    def step(self, action: str) -> StepResult:
        left = self.max_calls - self._calls
        try:
            calls = parse_tool_calls(action, self.format, self.tools)
        except ToolCallError as e:
            self._calls += 1
            return StepResult(self._observation([str(e)]), 0.0, left <= 0, {"tool_calls": 1, "tool_errors": 1})
        if not calls:
            return StepResult("", 0.0, True, {"tool_calls": 0, "tool_errors": 0})
        self._calls += len(calls)
        refused = f"error: no tool calls left (at most {self.max_calls} per episode); answer now"
        results = [self._run(call) if i < left else refused for i, call in enumerate(calls)]
        errors = sum(r.startswith("error: ") for r in results)
        return StepResult(self._observation(results), 0.0, left <= 0,
                          {"tool_calls": len(calls), "tool_errors": errors})

    def _run(self, call: ToolCall) -> str:
        try:
            value = self.tools[call.name].fn(**call.arguments)
        except Exception as e:  # the tool's failure is the model's observation, not the run's
            return f"error: {type(e).__name__}: {e}"
        if isinstance(value, str):
            return value
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)

    def _observation(self, results: list[str]) -> str:
        cut = [r if len(r) <= self.max_result_chars else r[:self.max_result_chars] + TRUNCATED for r in results]
        return format_results(cut, self.format)


def _check_plain(tool: Tool) -> None:
    """The plain format writes names with [a-z0-9] and passes one raw string or scalar values."""
    if not PLAIN_NAME.fullmatch(tool.name):
        raise ConfigError("env.args.tools", tool.name, "the plain format's tokenizer writes only a-z and 0-9 "
                                                       "before '(': rename the function or use format: hermes")
    if _raw_parameter(tool) is not None:
        return
    for name, schema in tool.parameters["properties"].items():
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not set(kinds) <= set(PLAIN_TYPES):
            raise ConfigError(f"tool {tool.name}, parameter {name}", schema["type"],
                              "the plain format passes only str, int, float, bool and Literal values; "
                              "use format: hermes")


__all__ = ["FORMATS", "Tool", "ToolCall", "ToolCallError", "ToolEnvironment", "format_results", "format_tool_call",
           "load_tool", "parse_tool_calls", "tool_schema"]
