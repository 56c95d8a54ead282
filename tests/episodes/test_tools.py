"""Tools for multi-turn episodes (poise.episodes.tools, poise.episodes.builtin_tools): schemas as
transformers derives them, loading by import path, both call formats, the built-in tools and the
tool environment. Every error path is checked by the message it must give."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any, List, Literal, Optional, Union

import pytest

from blocker import blocker_source  # tests/blocker.py
from poise.episodes.builtin_tools import MAX_EXPONENT, calculator, run_python
from poise.episodes.protocol import Environment, StepResult
from poise.episodes.tools import (Tool, ToolCall, ToolCallError, ToolEnvironment, format_tool_call, load_tool,
                                  parse_tool_calls, tool_schema)
from poise.data.tokenizer import CharTokenizer
from poise.errors import ConfigError


# --- tools the tests call -----------------------------------------------------------------------


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def search(query: str, limit: Optional[int] = None, order: Literal["new", "old"] = "new",
           exact: bool = False, weights: list[float] | None = None) -> str:
    """Search the notes for a query.

    Results come newest first unless told otherwise.

    Args:
        query (str): what to look for,
            over several lines
        limit: at most this many results
        order: which results come first
        exact: match the whole query only
        weights: a weight per field
    """
    return f"{query}|{limit}|{order}|{exact}|{weights}"


def tag(labels: List[str], meta: dict, level: Literal[1, 2, 3] = 1, ratio: float = 0.5,
        extra: dict[str, int] | None = None):
    """Attach labels to the current item.

    Args:
        labels: the labels
        meta: free-form metadata
        level: how important
        ratio: a fraction
        extra: counts by name
    """
    return "ok"


def mixed(choice: Literal["auto", 0, 1], grid: list[list[int]] | None = None, names: dict[str, str] = None):
    """Pick a mode.

    Args:
        choice: the mode, or a fixed value
        grid: rows of numbers
        names: labels by key
    """
    return "ok"


def fail(reason: str) -> str:
    """Always fail.

    Args:
        reason: what to say
    """
    raise RuntimeError(reason)


def tools_of(*fns: Any) -> dict[str, Tool]:
    return {fn.__name__: Tool(fn.__name__, fn, tool_schema(fn)) for fn in fns}


TOOLS = tools_of(multiply, search, tag, fail, calculator)


# --- schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [multiply, search, tag, mixed, calculator])
def test_schema_is_what_transformers_derives(fn):
    from transformers.utils import get_json_schema  # the reference; the product never imports it

    expected = get_json_schema(fn)
    expected["function"].pop("return", None)  # Poise leaves the return value out of the schema
    assert tool_schema(fn) == expected


def test_schema_shape_by_hand():
    schema = tool_schema(search)["function"]
    assert schema["description"] == "Search the notes for a query.\n\nResults come newest first unless told otherwise."
    assert schema["parameters"]["required"] == ["query"]
    props = schema["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for, over several lines"}
    assert props["limit"] == {"type": "integer", "nullable": True, "description": "at most this many results"}
    assert props["order"]["enum"] == ["new", "old"]
    assert props["weights"] == {"type": "array", "items": {"type": "number"}, "nullable": True,
                                "description": "a weight per field"}


def _no_hint(x, y: int) -> str:
    """A tool.

    Args:
        x: x
        y: y
    """


def _set_hint(x: set[int]) -> str:
    """A tool."""


def _union_hint(x: Union[int, str]) -> str:
    """A tool."""


def _any_hint(x: Any) -> str:
    """A tool."""


def _tuple_hint(x: tuple[int, int]) -> str:
    """A tool."""


def _int_keys(x: dict[int, str]) -> str:
    """A tool."""


def _star_args(*x: int) -> str:
    """A tool."""


def _star_kwargs(**x: int) -> str:
    """A tool."""


def _no_doc(x: int) -> str:
    pass


@pytest.mark.parametrize("fn, param, fix", [
    (_no_hint, "x", "give it a type hint"),
    (_set_hint, "x", "supported type hints"),
    (_union_hint, "x", "supported type hints"),
    (_any_hint, "x", "supported type hints"),
    (_tuple_hint, "x", "supported type hints"),
    (_int_keys, "x", "supported type hints"),
    (_star_args, "x", "no *args"),
    (_star_kwargs, "x", "no *args, **kwargs"),
    (_no_doc, "", "add a docstring"),
])
def test_schema_refuses_what_it_cannot_describe(fn, param, fix):
    with pytest.raises(ConfigError) as e:
        tool_schema(fn)
    message = str(e.value)
    assert "\n" not in message and fn.__name__ in message and fix in message
    assert f"parameter {param}" in message if param else "parameter" not in message


# --- loading ------------------------------------------------------------------------------------

USER_TOOLS = '''
from typing import Optional

def lookup(key: str, default: Optional[int] = None) -> str:
    """Look a key up.

    Args:
        key: the key
        default: what to return when it is missing
    """
    return {"a": "1"}.get(key, str(default))

def untyped(key):
    """Look a key up."""

NOT_A_FUNCTION = 3

class Thing:
    """A class."""
    def __init__(self, key: str) -> None:
        pass
'''


@pytest.fixture
def user_tools(tmp_path, monkeypatch):
    (tmp_path / "user_tools_mod.py").write_text(USER_TOOLS)
    (tmp_path / "user_tools_broken.py").write_text("raise RuntimeError('broken at import')\n")
    (tmp_path / "user_tools_dep.py").write_text("import poise_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("user_tools_mod", "user_tools_broken", "user_tools_dep"):
        sys.modules.pop(name, None)


def test_load_tool_by_path_and_by_builtin_name(user_tools):
    tool = load_tool("user_tools_mod:lookup")
    assert tool.name == "lookup" and tool.fn("a") == "1"
    assert tool.schema["function"]["parameters"]["required"] == ["key"]
    assert load_tool("calculator").fn is calculator
    assert load_tool("poise.episodes.builtin_tools:calculator").schema == tool_schema(calculator)


@pytest.mark.parametrize("path, says", [
    ("no_such_module_xyz:fn", "no module named 'no_such_module_xyz'"),
    ("user_tools_mod:missing", "has no attribute 'missing'"),
    ("user_tools_mod:NOT_A_FUNCTION", "is a int, not a function"),
    ("user_tools_mod:Thing", "is a type, not a function"),
    ("user_tools_mod:untyped", "parameter key"),
    ("user_tools_mod", "give 'module:function'"),
    ("user_tools_mod:", "give 'module:function'"),
    ("user_tools_broken:fn", "importing 'user_tools_broken' failed: RuntimeError: broken at import"),
    ("user_tools_dep:fn", "importing 'user_tools_dep' failed"),
])
def test_load_tool_errors_are_one_line(user_tools, path, says):
    with pytest.raises(ConfigError) as e:
        load_tool(path)
    assert "\n" not in str(e.value) and says in str(e.value)


# --- the hermes format --------------------------------------------------------------------------


def test_hermes_calls_with_text_around_them():
    text = ('let me compute <tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call> and '
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\", \\"limit\\": null}"}</tool_call>'
            ' then answer')
    assert parse_tool_calls(text, "hermes", TOOLS) == [ToolCall("multiply", {"a": 6, "b": 7}),
                                                       ToolCall("search", {"query": "x", "limit": None})]
    assert parse_tool_calls("the answer is 42", "hermes", TOOLS) == []


@pytest.mark.parametrize("body, says", [
    ('{"name": "multiply", "arguments": {"a": 6, "b": 7}', "error: tool call is not valid JSON: "),
    ('["multiply"]', 'error: tool call has no "name"'),
    ('{"name": "divide", "arguments": {}}', "error: unknown tool 'divide'; tools: multiply, search"),
    ('{"name": "divide", "arguments": [1]}', "error: unknown tool 'divide'; tools: multiply, search"),
    ('{"name": "multiply", "arguments": {"a": 6}}', "error: multiply needs the argument 'b'"),
    ('{"name": "multiply", "arguments": {"a": 6, "b": 7, "c": 1}}', "error: multiply has no argument 'c'"),
    ('{"name": "multiply", "arguments": {"a": "6", "b": 7}}', "error: argument 'a' of multiply must be an integer"),
    ('{"name": "multiply", "arguments": {"a": true, "b": 7}}', "error: argument 'a' of multiply must be an integer"),
    ('{"name": "multiply", "arguments": {"a": 6.5, "b": 7}}', "error: argument 'a' of multiply must be an integer"),
    ('{"name": "multiply", "arguments": "{\\"a\\": 6,"}', 'error: "arguments" of multiply is not valid JSON'),
    ('{"name": "multiply", "arguments": [6, 7]}', 'error: "arguments" of multiply must be an object'),
    ('{"name": "search", "arguments": {"query": "q", "order": "newest"}}',
     "error: argument 'order' of search must be one of \"new\", \"old\""),
    ('{"name": "search", "arguments": {"query": null}}', "error: argument 'query' of search must be a string"),
    ('{"name": "tag", "arguments": {"labels": ["a", 2], "meta": {}}}',
     "error: argument 'labels' of tag must be a list"),
    ('{"name": "tag", "arguments": {"labels": [], "meta": [1]}}', "error: argument 'meta' of tag must be an object"),
    ('{"name": "tag", "arguments": {"labels": [], "meta": {}, "level": 4}}',
     "error: argument 'level' of tag must be one of 1, 2, 3, got 4"),
    ('{"name": "tag", "arguments": {"labels": [], "meta": {}, "extra": {"n": "x"}}}',
     "error: argument 'extra' of tag must be an object or null"),
])
def test_hermes_malformed_calls_raise_a_sentence_for_the_model(body, says):
    with pytest.raises(ToolCallError) as e:
        parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>", "hermes", TOOLS)
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


@pytest.mark.parametrize("body", ["[" * 100_000, '{"name": "multiply", "arguments": "' + "[" * 100_000 + '"}'])
def test_hermes_deeply_nested_json_is_a_malformed_call(body):
    with pytest.raises(ToolCallError, match="error: .*nested too deeply"):
        parse_tool_calls(f"<tool_call>{body}</tool_call>", "hermes", TOOLS)


def test_hermes_unclosed_call_is_an_error():
    with pytest.raises(ToolCallError, match="is not closed by </tool_call>"):
        parse_tool_calls('<tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 2}}', "hermes", TOOLS)


ROUND_TRIPS = [
    ("multiply", {"a": 6, "b": -7}),
    ("search", {"query": "tea, coffee"}),
    ("search", {"query": "none", "limit": None, "order": "old", "exact": True}),
    ("search", {"query": " padded 'quoted' ", "limit": 3}),
    ("calculator", {"expression": "2*(3+4), (5)"}),
    ("fail", {"reason": "it's \"bad\""}),
]


@pytest.mark.parametrize("fmt", ["hermes", "plain"])
@pytest.mark.parametrize("name, arguments", ROUND_TRIPS)
def test_calls_round_trip(fmt, name, arguments):
    text = format_tool_call(TOOLS[name], arguments, fmt)
    assert parse_tool_calls(text, fmt, TOOLS) == [ToolCall(name, arguments)]


def test_hermes_call_is_what_qwen_template_renders():
    text = format_tool_call(TOOLS["multiply"], {"a": 1, "b": 2}, "hermes")
    assert text == '<tool_call>\n{"name": "multiply", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


# --- the plain format ---------------------------------------------------------------------------


def test_plain_calls():
    assert parse_tool_calls("  calculator(2*(3+4))  \n", "plain", TOOLS) == [
        ToolCall("calculator", {"expression": "2*(3+4)"})]
    assert parse_tool_calls("multiply(6, -7)", "plain", TOOLS) == [ToolCall("multiply", {"a": 6, "b": -7})]
    assert parse_tool_calls("search(tea, 2, old, true)", "plain", TOOLS) == [
        ToolCall("search", {"query": "tea", "limit": 2, "order": "old", "exact": True})]
    assert parse_tool_calls("search(don't panic, 2)", "plain", TOOLS) == [  # a quote inside text is text
        ToolCall("search", {"query": "don't panic", "limit": 2})]
    assert parse_tool_calls("search(tea, none)", "plain", TOOLS) == [
        ToolCall("search", {"query": "tea", "limit": None})]
    for answer in ("56088", "the answer is f(3)", "(2, 3)", "", "x = multiply(2, 3)"):
        assert parse_tool_calls(answer, "plain", TOOLS) == []


@pytest.mark.parametrize("text, says", [
    ("divide(6, 7)", "error: unknown tool 'divide'"),
    ("multiply(6, 7", "error: a call is multiply(...) alone on its turn; end it with ')'"),
    ("multiply(6, 7) is 42", "error: a call is multiply(...) alone on its turn"),
    ("multiply(6, 7, 8)", "error: multiply takes 2 arguments (a, b), got 3"),
    ("multiply(6)", "error: multiply needs the argument 'b'"),
    ("multiply()", "error: multiply needs the argument 'a'"),
    ("multiply(six, 7)", "error: argument 'a' of multiply must be an integer, got 'six'"),
    ("multiply(6.5, 7)", "error: argument 'a' of multiply must be an integer, got '6.5'"),
    ("search(q, 1, newest)", "error: argument 'order' of search must be one of \"new\", \"old\""),
    ("search(q, 1, old, maybe)", "error: argument 'exact' of search must be true or false, got 'maybe'"),
    ("search('q, 1)", "error: a quote ' is not closed"),
])
def test_plain_malformed_calls(text, says):
    with pytest.raises(ToolCallError) as e:
        parse_tool_calls(text, "plain", TOOLS)
    assert str(e.value).startswith(says)


def test_unknown_format_is_a_config_error():
    with pytest.raises(ConfigError, match="config key 'env.args.format': got 'json'; choose one of hermes, plain"):
        parse_tool_calls("x", "json", TOOLS)


# --- calculator ---------------------------------------------------------------------------------


@pytest.mark.parametrize("expression, value", [
    ("2 ** 200 + 1", 2 ** 200 + 1),
    ("123456789123456789 * 987654321987654321", 123456789123456789 * 987654321987654321),
    ("10 ** 30 / 10 ** 10", 10 ** 20),
    ("(3 ** 40 - 1) // 2 % 1000007", (3 ** 40 - 1) // 2 % 1000007),
    ("-3 ** 2", -9),
    ("+(7) - -2", 9),
    ("-7 // 2", -4),
    ("7 / 2", 3.5),
    ("2 ** -2", 0.25),
    ("0.1 + 0.2", 0.1 + 0.2),
    ("1.5e3 * 2", 3000.0),
])
def test_calculator_is_exact(expression, value):
    assert calculator(expression) == (str(value) if isinstance(value, int) else repr(value))


@pytest.mark.parametrize("expression, says", [
    ("9**9**9", f"the exponent 387420489 is above the limit of {MAX_EXPONENT}"),
    ("2 ** 100000", f"the exponent 100000 is above the limit of {MAX_EXPONENT}"),
    ("99 ** 9999", "the power has more than 13000 bits"),
    ("(2 ** 9000) * (2 ** 9000)", "the product has more than 13000 bits"),
    ("2 ** 9000 * 2 ** 9000", "the product has more than 13000 bits"),
    ("3 ** 9000", "the result has more than 13000 bits"),
    ("__import__('os').system('echo hi')", "function calls are not allowed"),
    ("__import__", "names are not allowed: __import__"),
    ("(1).__class__", "attributes are not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("'a' * 3", "only numbers are allowed, not 'a'"),
    ("True + 1", "only numbers are allowed, not True"),
    ("1 < 2", "Compare is not allowed"),
    ("1 << 9999", "LShift is not allowed"),
    ("~1", "Invert is not allowed"),
    ("1e308 * 10", "the result is too large for a decimal number"),
    ("1e400", "the result is too large for a decimal number"),
    ("10.0 ** 400", "the result is too large for a decimal number"),
    ("(-8) ** 0.5", "the result is not a real number"),
    ("1 +", "not an arithmetic expression"),
    ("import os", "not an arithmetic expression"),
    ("1 + " * 200 + "1", "the expression has 801 characters; the limit is 500"),
])
def test_calculator_refuses(expression, says):
    with pytest.raises(ValueError) as e:
        calculator(expression)
    assert says in str(e.value)


def test_calculator_division_by_zero():
    with pytest.raises(ZeroDivisionError):
        calculator("1 / (2 - 2)")


# --- python -------------------------------------------------------------------------------------


def test_python_returns_stdout_then_the_tail_of_stderr():
    out = run_python("import sys\nprint(6 * 7)\nprint('warned', file=sys.stderr)")
    assert out == "42\nwarned\n"
    out = run_python("x = 1\nraise ValueError('bad value')")
    assert out.endswith("ValueError: bad value\n") and "Traceback" in out
    assert run_python("import sys; sys.exit(3)") == "(exit status 3)"
    assert run_python("x = 1") == "(no output)"


def test_python_runs_isolated_in_a_scratch_directory():
    code = textwrap.dedent("""
        import os, sys
        print(os.getcwd())
        print(sorted(os.environ))
        print(sys.flags.no_user_site, sys.flags.no_site, sys.flags.safe_path,
              any("site-packages" in p for p in sys.path))
        try:
            import poise  # on the caller's PYTHONPATH and in the venv's site-packages: neither reaches here
        except ImportError:
            print("no poise")
    """)
    cwd, names, flags, poise = run_python(code).splitlines()
    assert os.path.basename(cwd).startswith("poise-python-tool-") and not os.path.exists(cwd)
    assert "PYTHONPATH" not in names and flags == "1 1 True False" and poise == "no poise"


def test_python_output_does_not_depend_on_hash_randomization():
    # an episode resumed elsewhere must see the same observation: set order of strings is hash order
    code = "print(hash('episode'), list({'a', 'b', 'c', 'd', 'e', 'f'}))"
    assert len({run_python(code) for _ in range(3)}) == 1


def test_python_caps_output_and_memory():
    out = run_python("print('a' * 100000)", max_output_chars=50)
    assert out == "a" * 50 + "...(output cut at 50 characters)\n"
    out = run_python("x = bytearray(2 ** 30)\nprint('allocated')", memory_mb=256)
    assert "MemoryError" in out and "allocated" not in out


def test_python_times_out():
    start = time.monotonic()
    assert run_python("while True:\n    pass", timeout_s=1.0) == "error: timed out after 1 s"
    assert time.monotonic() - start < 10  # a deadline, not the 5 s default nor a hang


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"  # a zombie waits for init to reap it
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_python_kills_every_process_the_program_started(tmp_path):
    code = textwrap.dedent(f"""
        import os
        for _ in range(3):
            os.fork()
        open(os.path.join({str(tmp_path)!r}, str(os.getpid())), "w").close()
        while True:
            pass
    """)
    start = time.monotonic()
    assert run_python(code, timeout_s=1.0) == "error: timed out after 1 s"
    assert time.monotonic() - start < 10
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 8
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


# --- the environment ----------------------------------------------------------------------------

TEST_MODULE = __name__  # this file: its tools load by import path like a user's


def env_of(*names: str, **kwargs: Any) -> ToolEnvironment:
    return ToolEnvironment([n if n in ("calculator", "python") else f"{TEST_MODULE}:{n}" for n in names], **kwargs)


def test_environment_protocol_and_hermes_turns():
    env = env_of("calculator", "multiply", "fail")
    assert isinstance(env, Environment)
    assert env.reset({"prompt": "what is 123*456?"}, seed=7) == ""
    assert [s["function"]["name"] for s in env.schemas()] == ["calculator", "multiply", "fail"]
    call = format_tool_call(env.tools["calculator"], {"expression": "123*456"}, "hermes")
    twice = call + "\n" + format_tool_call(env.tools["multiply"], {"a": 2, "b": 3}, "hermes")
    assert env.step(twice) == StepResult("<tool_response>\n56088\n</tool_response>\n<tool_response>\n6\n"
                                         "</tool_response>", 0.0, False, {"tool_calls": 2, "tool_errors": 0})
    failing = format_tool_call(env.tools["fail"], {"reason": "no luck"}, "hermes")
    assert env.step(failing) == StepResult("<tool_response>\nerror: RuntimeError: no luck\n</tool_response>", 0.0,
                                           False, {"tool_calls": 1, "tool_errors": 1})
    broken = env.step("<tool_call>{oops}</tool_call>")
    assert broken.observation.startswith("<tool_response>\nerror: tool call is not valid JSON")
    assert (broken.done, broken.info) == (False, {"tool_calls": 1, "tool_errors": 1})
    assert env.step("the answer is 56088") == StepResult("", 0.0, True, {"tool_calls": 0, "tool_errors": 0})


def test_environment_plain_turns():
    env = env_of("calculator", "multiply", format="plain")
    env.reset({}, 0)
    assert env.step("calculator(123*456)") == StepResult("= 56088\n", 0.0, False, {"tool_calls": 1, "tool_errors": 0})
    assert env.step("calculator(1/0)").observation == "= error: ZeroDivisionError: division by zero\n"
    assert env.step("multiply(6)").observation == "= error: multiply needs the argument 'b'\n"
    assert env.step("56088").done
    line = env.describe_plain()
    assert "\n" not in line and line.startswith("tools: calculator(expression) ") and "multiply(a, b) " in line
    assert CharTokenizer().decode(CharTokenizer().encode(line)) == line  # every character is in its vocabulary


def test_environment_spends_max_calls_then_ends():
    env = env_of("calculator", max_calls=3)
    env.reset({}, 0)
    call = format_tool_call(env.tools["calculator"], {"expression": "1+1"}, "hermes")
    first = env.step(call + call)
    assert (first.observation.count("\n2\n"), first.done) == (2, False)
    second = env.step(call + call)  # one call left: the second is refused, the episode goes on
    assert second.observation.count("\n2\n") == 1 and "error: no tool calls left (at most 3 per episode)" \
        in second.observation
    assert (second.done, second.info) == (False, {"tool_calls": 2, "tool_errors": 1})
    third = env.step(call)
    assert third.done and "no tool calls left" in third.observation and "\n2\n" not in third.observation
    env.reset({}, 0)  # a new episode has its calls again
    assert env.step(call).observation == "<tool_response>\n2\n</tool_response>"
    broken = [env.step("<tool_call>{oops</tool_call>") for _ in range(3)]  # malformed calls spend calls too
    assert [b.done for b in broken] == [False, False, True]


def test_environment_truncates_results():
    env = env_of("calculator", format="plain", max_result_chars=10)
    assert env.step("calculator(2**100)").observation == "= 1267650600 ...(truncated)\n"
    assert env.step("calculator(2**10)").observation == "= 1024\n"


@pytest.mark.parametrize("kwargs, says", [
    ({"tools": ["calculator"], "format": "xml"}, "config key 'env.args.format': got 'xml'; choose one of hermes"),
    ({"tools": ["calculator"], "max_calls": 0}, "config key 'env.args.max_calls': got 0; must be an integer >= 1"),
    ({"tools": ["calculator"], "max_calls": 2.5}, "config key 'env.args.max_calls': got 2.5"),
    ({"tools": ["calculator"], "max_result_chars": 0}, "config key 'env.args.max_result_chars': got 0"),
    ({"tools": []}, "config key 'env.args.tools': got []; give a list of tools"),
    ({"tools": "calculator"}, "config key 'env.args.tools': got 'calculator'; give a list of tools"),
    ({"tools": ["calculator", "poise.episodes.builtin_tools:calculator"]}, "two tools have the same name"),
    ({"tools": [f"{TEST_MODULE}:_underscored"], "format": "plain"}, "writes only a-z and 0-9"),
    ({"tools": [f"{TEST_MODULE}:tag"], "format": "plain"}, "parameter labels': got 'array'; the plain format"),
])
def test_environment_config_errors(kwargs, says):
    with pytest.raises(ConfigError) as e:
        ToolEnvironment(**kwargs)
    assert "\n" not in str(e.value) and says in str(e.value)


def _underscored(x: int) -> int:
    """A tool whose name the character tokenizer cannot write.

    Args:
        x: a number
    """
    return x


def test_environment_hermes_allows_any_tool_name():
    assert ToolEnvironment([f"{TEST_MODULE}:_underscored", f"{TEST_MODULE}:tag"]).tools.keys() == {"_underscored",
                                                                                                   "tag"}


# --- torch-free and ray-free --------------------------------------------------------------------

SCRIPT = blocker_source("torch", "transformers", "ray") + r'''
from poise.episodes.tools import ToolEnvironment
env = ToolEnvironment(["calculator", "python"], format="plain")
env.reset({}, 0)
print("OBSERVATION", env.step("calculator(6*7)").observation.strip())
print("MODULES", " ".join(sorted(m for m in sys.modules if m.startswith("poise.episodes."))))
print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
'''


def test_tools_import_and_run_with_torch_transformers_and_ray_blocked():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    modules = set(out.stdout.split("MODULES ", 1)[1].split("\n", 1)[0].split())
    assert {"poise.episodes.tools", "poise.episodes.builtin_tools"} <= modules
    assert "OBSERVATION = 42" in out.stdout and "LOADED []" in out.stdout
