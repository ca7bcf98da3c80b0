"""veRL's tool classes named in a tool file (as veRL's example YAML files name them) load as verlx's own and answer
what veRL's answer for the same calls: Geo3kTool, SandboxFusionTool and SearchTool (the HTTP ones against a local
stand-in of their service: tests/engine_fakes/fake_tool_services.py); MCPSearchTool is refused."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
import time

import pytest

from engine_fakes.fake_tool_services import ToolServices
from verlx.reward.geo3k_tool import Geo3kTool
from verlx.rollout.agent.execution import ToolExecutor
from verlx.rollout.agent.parsers import ParsedTurn, ToolCall
from verlx.rollout.agent.sandbox_fusion_tool import SandboxFusionTool
from verlx.rollout.agent.search_tool import SearchTool
from verlx.rollout.agent.tool_config import ToolConfigError, load_tools

SANDBOX_ENTRY = """\
      - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
        config:
          sandbox_fusion_url: "{url}"
          num_workers: 4
          enable_global_rate_limit: true
          rate_limit: 2
          default_timeout: {timeout}
          default_language: "python"
          memory_limit_mb: 512
          type: native
        tool_schema:
          type: function
          function:
            name: code_interpreter
            description: Runs the code it is given (ours).
            parameters: {{type: object, properties: {{code: {{type: string}}}}, required: [code]}}
"""
SEARCH_ENTRY = """\
      - class_name: verl.tools.search_tool.SearchTool
        config:
          retrieval_service_url: {url}
          num_workers: 8
          rate_limit: 8
          timeout: {timeout}
          topk: 2
          type: native
        tool_schema:
          type: function
          function:
            name: search
            description: Looks passages up (ours).
            parameters:
              type: object
              properties:
                query_list: {{type: array, item: {{type: string}}, description: the queries}}
              required: [query_list]
"""
GEO3K_ENTRY = """\
      - class_name: "verl.tools.geo3k_tool.Geo3kTool"
        config: {type: native}
        tool_schema:
          type: function
          function:
            name: calc_geo3k_reward
            description: Scores a geometry answer (ours).
            parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
"""


def write(tmp_path, body: str) -> str:
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n" + textwrap.indent(textwrap.dedent(body), "  "))
    return str(path)


def call(tools, calls, kwargs=None, timeout_s=20.0):
    executor = ToolExecutor(tools, timeout_s=timeout_s, max_parallel_calls=8, max_response_chars=4096)
    try:
        outcomes = asyncio.run(executor.run(ParsedTurn(calls=[ToolCall(*c) for c in calls]), kwargs))
    finally:
        executor.close()
    return [(o.text, o.status) for o in outcomes]


def test_each_verl_tool_class_loads_as_verlxs_and_is_said_once(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("verlx.rollout.agent.entry_files._said", set())
    path = write(tmp_path, GEO3K_ENTRY + SANDBOX_ENTRY.format(url="https://sandbox.invalid/run_code", timeout=30)
                 + SEARCH_ENTRY.format(url="http://127.0.0.1:9/retrieve", timeout=30))
    tools = load_tools(path)
    load_tools(path)
    assert [type(t) for t in tools.values()] == [Geo3kTool, SandboxFusionTool, SearchTool]
    assert tools["search"].schema["function"]["description"] == "Looks passages up (ours)."
    for verl, ours in [("verl.tools.geo3k_tool.Geo3kTool", "verlx.reward.geo3k_tool:Geo3kTool"),
                       ("verl.tools.sandbox_fusion_tools.SandboxFusionTool",
                        "verlx.rollout.agent.sandbox_fusion_tool:SandboxFusionTool"),
                       ("verl.tools.search_tool.SearchTool", "verlx.rollout.agent.search_tool:SearchTool")]:
        assert caplog.text.count(f"tool class {verl} (veRL's) is read as verlx's {ours}") == 1
    assert tools["code_interpreter"].service.concurrency == 2  # min(num_workers, rate_limit)


@pytest.mark.parametrize("body, message", [
    (SANDBOX_ENTRY.format(url="http://x/run_code", timeout=30).replace("default_timeout", "default_timout"),
     r"tools\[0\]: tool code_interpreter: unknown config keys \['default_timout'\]. Did you mean 'default_timeout'"),
    (SEARCH_ENTRY.format(url="http://x/retrieve", timeout=30).replace("topk", "top_k"),
     r"tools\[0\]: tool search: unknown config keys \['top_k'\]. Did you mean 'topk'"),
    (GEO3K_ENTRY.replace("{type: native}", "{type: native, ground_truth: 3}"),
     r"tools\[0\]: tool calc_geo3k_reward: unknown config keys \['ground_truth'\]"),
    (SEARCH_ENTRY.format(url="http://x/retrieve", timeout=30).replace("type: native", "type: mcp"),
     r"tools\[0\]: tool search: config type='mcp'; verlx runs veRL's native tools only"),
    (SANDBOX_ENTRY.format(url="", timeout=30), r"tools\[0\]: tool code_interpreter: config sandbox_fusion_url must"),
    (SEARCH_ENTRY.format(url="127.0.0.1:8000/retrieve", timeout=30),
     r"tool search: config retrieval_service_url must be the service's http\(s\) URL \(e.g. http://127.0.0.1:8000/"
     r"retrieve\), got '127.0.0.1:8000/retrieve'"),
    (SANDBOX_ENTRY.format(url="http://x", timeout=30).replace('"python"', '"pyton"'),
     r"default_language='pyton' is not a language SandboxFusion runs. Did you mean 'python'"),
    (SEARCH_ENTRY.format(url="http://x/retrieve", timeout=0), r"tool search: config timeout must be a positive"),
    ("- class_name: verl.tools.mcp_search_tool.MCPSearchTool\n  config: {type: mcp}\n  mcp: {}\n",
     r"tools\[0\].class_name: verlx does not support veRL's own classes \(verl.tools.mcp_search_tool.MCPSearchTool\) "
     r"yet: it needs an MCP client"),
])
def test_bad_verl_tool_entries_name_the_file_the_entry_and_the_key(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ToolConfigError, match=message) as e:
        load_tools(path)
    assert str(e.value).startswith(path)


def test_geo3k_tool_scores_the_bare_answer_as_verl():
    """The rewards are those of veRL's grader (mathruler 0.1.0's grade_answer, run on these pairs on 2026-11-26)."""
    tool = Geo3kTool({"type": "native"})
    kwargs = {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": "2\\sqrt{3}"}}}
    answers = ["2\\sqrt{3}", "2\\sqrt3", "\\boxed{2\\sqrt{3}}", "The answer is \\boxed{2\\sqrt{3}}", "3.46"]
    assert call({"calc_geo3k_reward": tool}, [("calc_geo3k_reward", {"answer": a}) for a in answers], kwargs) == [
        ("Current parsed answer='2\\\\sqrt{3}' reward=1.0", "ok"),
        ("Current parsed answer='2\\\\sqrt3' reward=1.0", "ok"),
        ("Current parsed answer='\\\\boxed{2\\\\sqrt{3}}' reward=1.0", "ok"),  # the answer as a whole is boxed
        ("Current parsed answer='The answer is \\\\boxed{2\\\\sqrt{3}}' reward=0.0", "ok"),  # not looked for
        ("Current parsed answer='3.46' reward=0.0", "ok")]
    kwargs = {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": "45"}}}
    answers = ["45 degrees", "45^\\circ", "{45}", "45 m", "46"]
    assert [text.split()[-1] for text, _ in call({"calc_geo3k_reward": tool}, [
        ("calc_geo3k_reward", {"answer": a}) for a in answers], kwargs)] == \
        ["reward=1.0", "reward=1.0", "reward=1.0", "reward=0.0", "reward=0.0"]
    missing = call({"calc_geo3k_reward": tool}, [("calc_geo3k_reward", {"answer": "3"})], {})
    assert missing == [("error: calc_geo3k_reward needs the sample's ground truth in extra_info.tools_kwargs."
                        "calc_geo3k_reward.create_kwargs.ground_truth", "error")]


def sandbox_tool(url, **config):
    return SandboxFusionTool({"sandbox_fusion_url": url, **config})


def test_sandbox_fusion_tool_answers_stdout_and_stderr_and_sends_verls_request():
    with ToolServices() as services:
        tool = sandbox_tool(services.url + "/run_code", default_timeout=7, memory_limit_mb=256)
        got = call({"code_interpreter": tool}, [
            ("code_interpreter", {"code": "print(6 * 7)"}),
            ("code_interpreter", {"code": "import sys\nprint('a')\nsys.stderr.write('b\\n')\nraise SystemExit(3)"}),
        ])
        assert got == [("42\n", "ok"), ("a\nb\n", "ok")]  # a non-zero exit status still answers its output
        path, body = next(r for r in services.requests if r[1]["code"] == "print(6 * 7)")  # calls run concurrently
        assert path == "/run_code" and body == {"compile_timeout": 7, "run_timeout": 7, "code": "print(6 * 7)",
                                                "stdin": None, "memory_limit_MB": 256, "language": "python",
                                                "files": {}, "fetch_files": []}


def test_sandbox_fusion_tool_says_no_stdout_when_the_run_or_the_service_fails(monkeypatch):
    monkeypatch.setattr(SandboxFusionTool, "retry_delay_s", 0.01)
    with ToolServices(failures=2) as services:
        ran_too_long = sandbox_tool(services.url + "/run_code", default_timeout=0.5)
        other_language = sandbox_tool(services.url + "/run_code", default_language="bash")
        assert call({"code_interpreter": ran_too_long}, [("code_interpreter", {"code": "while True: pass"})]) == \
            [("no stdout here", "ok")]
        assert call({"code_interpreter": other_language}, [("code_interpreter", {"code": "echo 1"})]) == \
            [("no stdout here", "ok")]  # the service's SandboxError
        gateway = sandbox_tool(services.url + "/status/504")
        assert call({"code_interpreter": gateway}, [("code_interpreter", {"code": "print(1)"})]) == [("1\n", "ok")]
        assert [p for p, _ in services.requests[-3:]] == ["/status/504"] * 3  # two 504s, then an answer
        services.failures_left = 1
        refused = sandbox_tool(services.url + "/status/503")
        before = len(services.requests)
        assert call({"code_interpreter": refused}, [("code_interpreter", {"code": "print(1)"})]) == \
            [("no stdout here", "error")]
        assert len(services.requests) == before + 1  # only 504 is tried again
        slow = sandbox_tool(services.url + "/slow/3", default_timeout=0.25)  # HTTP timeout 2 × 0.25 + 10 s
        start = time.monotonic()
        assert call({"code_interpreter": slow}, [("code_interpreter", {"code": "print(1)"})], timeout_s=1.0) == \
            [("error: code_interpreter did not answer within 1 s", "timeout")]
        assert time.monotonic() - start < 2.5
    down = sandbox_tool(services.url + "/run_code")  # the server is closed now
    assert call({"code_interpreter": down}, [("code_interpreter", {"code": "print(1)"})]) == \
        [("no stdout here", "error")]


def search_tool(url, **config):
    return SearchTool({"retrieval_service_url": url, "topk": 2, **config})


def result(text):
    return json.dumps({"result": text}, ensure_ascii=False)


def test_search_tool_formats_passages_as_verl():
    with ToolServices() as services:
        tool = search_tool(services.url + "/retrieve")
        got = call({"search": tool}, [("search", {"query_list": ["Paris France?", "Europe", "Mars"]}),
                                      ("search", {"query_list": []})])
        assert services.requests[0] == ("/retrieve", {"queries": ["Paris France?", "Europe", "Mars"], "topk": 2,
                                                      "return_scores": True})
    assert got == [
        (result("Doc 1 (Title: Paris)\nParis is the capital of France.\n\n"
                "Doc 2 (Title: France)\nFrance is a country in Europe.\n---\n"
                "Doc 1 (Title: Europe)\nEurope is a continent.\nIt has 44 countries.\n---\n"), "ok"),
        (result("Error: 'query_list' is missing, empty, or not a list in parameters."), "ok")]


def test_search_tool_reports_service_failures_as_verl(monkeypatch):
    monkeypatch.setattr(SearchTool, "retry_delay_s", 0.01)
    monkeypatch.setattr(SearchTool, "attempts", 3)
    query = [("search", {"query_list": ["Paris"]})]
    with ToolServices(failures=2) as services:
        assert call({"search": search_tool(services.url + "/status/503/retrieve")}, query) == [(result(
            "Doc 1 (Title: Paris)\nParis is the capital of France."), "ok")]  # two 503s, then an answer
        services.failures_left = 10
        assert call({"search": search_tool(services.url + "/status/502/retrieve")}, query) == [(result(
            "Search error: API Call Failed: API Request Error: Server Error (502) on attempt 3/3"), "error")]
        url = services.url + "/status/404/retrieve"
        assert call({"search": search_tool(url)}, query) == [(result(
            f"Search error: API Call Failed: API Request Error: 404 Client Error: Not Found for url: {url}"),
            "error")]
        assert call({"search": search_tool(services.url + "/not_json")}, query)[0][0].startswith(result(
            f"Search error: API Call Failed: API Response JSON Decode Error: {services.url}/not_json answered "
            "with no JSON")[:-2])
        url = services.url + "/slow/2/retrieve"
        assert call({"search": search_tool(url, timeout=0.2)}, query) == [(result(
            f"Search error: API Call Failed: Timeout Error: no answer from {url} within 0.2 s"), "error")]
    got = call({"search": search_tool(url)}, query)  # the server is closed now
    assert got[0][0].startswith(result(f"Search error: API Call Failed: Connection Error: cannot reach {url}: ")[:-2])
    assert got[0][1] == "error"


def test_a_tool_that_may_outlast_tool_timeout_s_is_warned_about(tmp_path):
    from verlx.config.loader import build, load_yaml, to_container
    from verlx.config.schema import PPOConfig
    from verlx.rollout.agent.config_checks import agent_loop_findings

    path = write(tmp_path, SANDBOX_ENTRY.format(url="http://127.0.0.1:9/run_code", timeout=30)
                 + SEARCH_ENTRY.format(url="http://127.0.0.1:9/retrieve", timeout=30))
    overrides = ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
                 "actor_rollout_ref.rollout.name=native",
                 f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}"]
    found = agent_loop_findings(build(PPOConfig, to_container(load_yaml(overrides=overrides))))
    assert found.problems == []
    assert found.warnings == [  # the search tool's 30 s fit the default 30 s; code_interpreter's 2 × 30 + 10 do not
        "actor_rollout_ref.rollout.multi_turn.tool_timeout_s=30 is shorter than the 70 s tool code_interpreter may "
        "take by its config: a call that slow is answered 'error: code_interpreter did not answer within 30 s'; "
        "raise tool_timeout_s to 70 to wait as long as the tool does"]
    longer = overrides + ["actor_rollout_ref.rollout.multi_turn.tool_timeout_s=70"]
    assert agent_loop_findings(build(PPOConfig, to_container(load_yaml(overrides=longer)))).warnings == []
