"""Tools: schemas from signatures, the YAML tool file and its errors, tool-call parsers, the calculator and the
sandbox's limits."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Literal

import pytest

from verlx.rollout.agent.builtin_tools import PythonTool, calculator
from verlx.rollout.agent.execution import ToolExecutor
from verlx.rollout.agent.parsers import TOOL_PARSERS, ParsedTurn, ToolCall
from verlx.rollout.agent.sandbox import SandboxLimits, run_python
from verlx.rollout.agent.tool_config import ToolConfigError, load_tools
from verlx.rollout.agent.tools import TOOLS, FunctionTool, ToolSchemaError, check_arguments, tool, validate_schema


def lookup(city: str, days: int = 1, unit: Literal["C", "F"] = "C", *, api_key: str = "") -> str:
    """Weather forecast for a city.

    More text that is not part of the description.

    Args:
        city: the city's name
        days (int): how many days ahead
    """
    return f"{city}:{days}:{unit}:{bool(api_key)}"


def test_schema_from_signature_and_docstring():
    made = tool(lookup, register=False)
    assert made.schema == {"type": "function", "function": {
        "name": "lookup", "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "days": {"type": "integer", "description": "how many days ahead"},
            "unit": {"type": "string", "enum": ["C", "F"]}}}}}
    assert made.context_parameters() == {"api_key"}
    assert made.execute({"city": "Oslo"}, api_key="k", other="ignored") == "Oslo:1:C:True"


def test_decorator_registers_and_bad_functions_are_refused():
    @tool(name="shout_test")
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    assert TOOLS.get("shout_test") is shout
    def unhinted(x):
        """Echo."""
        return x

    with pytest.raises(ToolSchemaError, match="parameter 'x' needs a type hint"):
        tool(unhinted, register=False)

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolSchemaError, match="no docstring"):
        tool(undocumented, register=False)


def test_argument_checks():
    schema = tool(lookup, register=False).schema
    assert check_arguments(schema, {"city": "Oslo", "days": 2}) is None
    assert check_arguments(schema, {"days": 2}) == "missing required argument(s) ['city']"
    assert check_arguments(schema, {"city": "Oslo", "dayz": 2}).startswith("unknown argument(s) ['dayz']")
    assert check_arguments(schema, {"city": "Oslo", "days": "2"}) == "argument 'days' must be integer, got str"
    assert check_arguments(schema, {"city": "Oslo", "days": True}) == "argument 'days' must be integer, got bool"
    assert check_arguments(schema, {"city": "Oslo", "unit": "K"}) == "argument 'unit' must be one of ['C', 'F']"
    assert check_arguments(schema, ["Oslo"]) == "arguments must be a JSON object, got list"


@pytest.mark.parametrize("schema, message", [
    ({"type": "function"}, "expected"),
    ({"type": "function", "function": {"name": "has space"}}, "identifier-like"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}, "type 'object'"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "float"}}}}}, "parameter 'x' needs a 'type'"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {},
                                                                    "required": ["y"]}}}, r"names \['y'\]"),
])
def test_invalid_schemas_name_the_field(schema, message):
    with pytest.raises(ToolSchemaError, match=message):
        validate_schema(schema)


def write(tmp_path, text):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_tool_file_loads_registered_function_and_class_entries(tmp_path):
    path = write(tmp_path, """
        tools:
          - name: calculator
          - function: tests.unit.test_agent_tools:lookup
          - class_name: verlx.rollout.agent.builtin_tools:PythonTool
            config: {wall_s: 3, memory_mb: 256}
    """)
    tools = load_tools(path)
    assert sorted(tools) == ["calculator", "lookup", "python"]
    assert isinstance(tools["lookup"], FunctionTool)
    assert tools["python"].limits == SandboxLimits(wall_s=3, memory_mb=256)


@pytest.mark.parametrize("body, message", [
    ("tools: []", "expected a top-level 'tools:' list"),
    ("tools:\n  - nme: calculator", r"tools\[0\]: unknown keys \['nme'\]"),
    ("tools:\n  - name: calculater", r"tools\[0\]: unknown tool 'calculater'.*Did you mean 'calculator'"),
    ("tools:\n  - function: no_such_module:f", r"tools\[0\].function=no_such_module:f: cannot import"),
    ("tools:\n  - name: calculator\n  - name: calculator", r"tools\[1\]: a second tool named 'calculator'"),
    ("tools:\n  - class_name: verlx.rollout.agent.builtin_tools:PythonTool\n    config: {walls: 3}",
     r"tools\[0\]: tool python: unknown config keys \[.walls.\]. Did you mean .wall_s."),
    ("tools:\n  - class_name: verlx.rollout.agent.builtin_tools:PythonTool\n    tool_schema: {type: function}",
     r"tools\[0\].tool_schema: expected"),
    ("tools: [", "not valid YAML"),
])
def test_tool_file_errors_name_the_file_and_entry(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ToolConfigError, match=message) as e:
        load_tools(path)
    assert path in str(e.value)


def test_missing_tool_file_names_the_key(tmp_path):
    with pytest.raises(ToolConfigError, match="tool_config_path: file .*nope.yaml' does not exist"):
        load_tools(str(tmp_path / "nope.yaml"))


def test_verls_gsm8k_tool_is_read_as_verlxs_and_answers_as_veRL_does(tmp_path, caplog, monkeypatch):
    """A tool file in veRL's format naming veRL's GSM8K tool class (written here, as a user's multi-turn run has)."""
    import logging

    from verlx.reward.gsm8k_tool import Gsm8kTool

    caplog.set_level(logging.INFO)
    monkeypatch.setattr("verlx.rollout.agent.entry_files._said", set())  # said once a process: say it here
    path = write(tmp_path, """\
        tools:
          - class_name: verl.tools.gsm8k_tool.Gsm8kTool
            config:
              type: native
            tool_schema:
              type: function
              function:
                name: calc_gsm8k_reward
                description: Scores the final answer to a grade-school math question (ours, 1.0 when right).
                parameters:
                  type: object
                  properties:
                    answer:
                      type: string
                      description: the final answer
                  required: [answer]
        """)
    tool = load_tools(path)["calc_gsm8k_reward"]
    assert isinstance(tool, Gsm8kTool) and "Scores the final answer to a grade-school math question (ours" in \
        tool.schema["function"]["description"]  # the file's own schema
    assert "tool class verl.tools.gsm8k_tool.Gsm8kTool (veRL's) is read as verlx's" in caplog.text
    kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    executor = ToolExecutor({"calc_gsm8k_reward": tool}, max_parallel_calls=2, timeout_s=5.0,
                            max_response_chars=256, truncate_side="middle")
    try:
        outcomes = asyncio.run(executor.run(ParsedTurn(calls=[
            ToolCall("calc_gsm8k_reward", {"answer": "72"}), ToolCall("calc_gsm8k_reward", {"answer": "#### 7,2"})]),
            kwargs))
        wrong = asyncio.run(executor.run(ParsedTurn(calls=[ToolCall("calc_gsm8k_reward", {"answer": "70"})]), kwargs))
    finally:
        executor.close()
    assert [o.text for o in outcomes] == ["Current parsed answer='72' reward=1.0",
                                          "Current parsed answer='#### 7,2' reward=1.0"]  # commas dropped, as veRL
    assert wrong[0].text == "Current parsed answer='70' reward=0.0"


def test_hermes_parser():
    parse = TOOL_PARSERS.get("hermes")
    turn = parse('a <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> b '
                 '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert turn.calls == [ToolCall("f", {"x": 1}), ToolCall("g", {"y": 2})] and not turn.malformed
    assert not parse("The answer is 4.").has_calls
    bad = parse('<tool_call>{"name": "f", "arguments": {</tool_call><tool_call>[1]</tool_call><tool_call>{"name"')
    assert bad.calls == [] and len(bad.malformed) == 3
    assert bad.malformed[0].startswith("not valid JSON") and "string 'name'" in bad.malformed[1]
    assert "without </tool_call>" in bad.malformed[2]


def test_sglangs_qwen_format_names_read_qwen_tool_calls():
    """Older veRL scripts set multi_turn.format=qwen (SGLang's name of Qwen 2.5's parser): hermes's format."""
    text = '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}}\n</tool_call>'
    for name in ("qwen", "qwen25"):
        assert TOOL_PARSERS.get(name)(text).calls == [ToolCall("calc", {"expression": "1+2"})]


def test_llama3_json_parser():
    parse = TOOL_PARSERS.get("llama3_json")
    turn = parse('<|python_tag|>{"name": "f", "parameters": {"s": "a;b"}}; {"name": "g", "parameters": {}}')
    assert turn.calls == [ToolCall("f", {"s": "a;b"}), ToolCall("g", {})]
    assert not parse("It is 4.").has_calls
    assert parse('{"name": f}').malformed


def test_calculator_is_exact_and_refuses_code():
    assert calculator("12*34") == "408"
    assert calculator("2**10 - 1/4") == "1023.75"
    assert calculator("123456789*987654321") == "121932631112635269"
    assert calculator("__import__('os')").error
    assert "division by zero" in calculator("1/0").text
    assert calculator("9**9**9").error  # no exponent bombs


def sandbox(code, **limits):
    return asyncio.run(run_python(textwrap.dedent(code), SandboxLimits(**limits)))


def test_sandbox_runs_code_and_reports_failures():
    assert sandbox("print(sum(range(10)))").stdout == "45\n"
    failed = sandbox("raise ValueError('bad')")
    assert failed.returncode == 1 and "ValueError: bad" in failed.stderr


def test_sandbox_limits_wall_cpu_memory_output_and_network():
    hung = sandbox("import time\ntime.sleep(30)", wall_s=0.5)
    assert hung.timed_out and hung.wall_s < 10
    spin = sandbox("while True: pass", cpu_time_s=1, wall_s=20)
    assert not spin.timed_out and spin.returncode != 0  # killed by RLIMIT_CPU, not by the wall clock
    hog = sandbox("x = bytearray(600 * 2**20)\nprint('allocated')", memory_mb=256)
    assert hog.returncode != 0 and "allocated" not in hog.stdout
    flood = sandbox("print('z' * 100000)", max_output_bytes=1000)
    assert flood.output_truncated and len(flood.stdout) == 1000
    net = sandbox("""
        import socket
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1)
            print("connected")
        except OSError as e:
            print("refused:", type(e).__name__)
    """)
    assert net.stdout.startswith("refused:")


def test_python_tool_turns_outcomes_into_text():
    tool_ = PythonTool({"wall_s": 0.5})
    assert asyncio.run(tool_.execute({"code": "print(6*7)"})).text == "42\n"
    slow = asyncio.run(tool_.execute({"code": "import time\ntime.sleep(5)"}))
    assert slow.error and "longer than 0.5 s" in slow.text
