"""The tool file (multi_turn.tool_config_path): which tools the agent loops may call.

    tools:
      - name: calculator                      # a registered tool (built-in or @tool-decorated, imported by
                                              #   `function`/`class_name` below or by your code)
      - function: my_pkg.tools:lookup         # a plain function: schema from its signature and docstring
      - class_name: my_pkg.tools:Search       # a BaseTool subclass, built with config and tool_schema
        config: {top_k: 3}
        tool_schema: {type: function, function: {name: search, description: ..., parameters: {...}}}

Every error names the file and the entry (tools[i]) before any rollout starts.
"""

from __future__ import annotations

from verlx.rollout.agent.entry_files import load_named_entries, verlx_class_for
from verlx.rollout.agent.tools import TOOLS, BaseTool, FunctionTool, ToolSchemaError, as_tool, validate_schema
from verlx.utils.errors import InputError
from verlx.utils.registry import import_object

ENTRY_KEYS = {"name", "function", "class_name", "config", "tool_schema"}
# veRL's tool classes verlx has its own of (each said once, at info level, when a tool file names it)
VERL_TOOLS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "verlx.reward.gsm8k_tool:Gsm8kTool",
    "verl.tools.geo3k_tool.Geo3kTool": "verlx.reward.geo3k_tool:Geo3kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "verlx.rollout.agent.sandbox_fusion_tool:SandboxFusionTool",
    "verl.tools.search_tool.SearchTool": "verlx.rollout.agent.search_tool:SearchTool",
}
# veRL's tool classes verlx has none of, with what they need
VERL_TOOLS_LACKING = {"verl.tools.mcp_search_tool.MCPSearchTool": "an MCP client (veRL's MCPSearchTool calls tools "
                                                                   "of the MCP servers its `mcp:` entry names)"}


class ToolConfigError(InputError, ValueError):
    """The tool file does not load; the message names the file and the entry."""


def _entry_tool(entry: dict, where: str) -> BaseTool:
    class_name = entry.get("class_name")
    if isinstance(class_name, str) and class_name in VERL_TOOLS_LACKING:
        raise ToolConfigError(f"{where}.class_name: verlx does not support veRL's own classes ({class_name}) yet: "
                              f"it needs {VERL_TOOLS_LACKING[class_name]}; give a tool class of your own code or "
                              "one of verlx's (docs/multi_turn.md)")
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise ToolConfigError(f"{where}: unknown keys {unknown}; an entry has {sorted(ENTRY_KEYS)}")
    if not any(k in entry for k in ("name", "function", "class_name")):
        raise ToolConfigError(f"{where}: needs one of name (a registered tool), function or class_name")
    schema = entry.get("tool_schema")
    if schema is not None:
        validate_schema(schema, f"{where}.tool_schema")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}.config must be a mapping, got {config!r:.80}")
    if "class_name" in entry:
        cls = import_object(verlx_class_for(entry["class_name"], VERL_TOOLS, "tool"), f"{where}.class_name")
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise ToolConfigError(f"{where}.class_name={entry['class_name']} is not a BaseTool subclass")
        schema = schema or getattr(cls, "default_schema", None)
        if schema is None:
            raise ToolConfigError(f"{where}: {entry['class_name']} has no default_schema; add a tool_schema")
        made = cls(config, schema)
    elif "function" in entry:
        fn = import_object(entry["function"], f"{where}.function")
        made = as_tool(fn, entry["function"])
    else:
        made = as_tool(TOOLS.get(entry["name"]), entry["name"])
        if config and type(made) is not FunctionTool:
            made = type(made)(config, schema or made.schema)
    if schema is not None and isinstance(made, FunctionTool):
        made = FunctionTool(made.fn, schema, config)
    if "name" in entry and made.name != entry["name"]:
        raise ToolConfigError(f"{where}: name {entry['name']!r} but the tool calls itself {made.name!r}")
    return made


def load_tools(path: str) -> dict[str, BaseTool]:
    """name → tool for every entry of the file; raises ToolConfigError naming the file and the entry."""
    return load_named_entries(path, config_key="actor_rollout_ref.rollout.multi_turn.tool_config_path",
                              section="tools", noun="tool", error=ToolConfigError, build=_entry_tool,
                              caught=(ToolSchemaError,))
