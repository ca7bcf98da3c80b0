"""Tools: the registry, the `@tool` decorator (schema from signature and docstring) and schema validation.

A tool is called with the JSON arguments the model wrote (checked against its OpenAI-style function schema) plus
the sample's `extra_info.tools_kwargs[<tool name>]`, which fill the function's keyword-only parameters: those
never appear in the schema, so the model cannot set them (e.g. the ground truth a checker tool compares with).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verlx.utils.errors import InputError
from verlx.utils.registry import Registry, did_you_mean

TOOLS: Registry[BaseTool | Callable] = Registry("tool", "multi_turn.tool_config_path", import_paths=True)
JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
_PY_TO_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolSchemaError(InputError, ValueError):
    """A tool's schema is not a valid OpenAI function schema (the message names the tool and the field)."""


@dataclass
class ToolResult:
    """What a tool returns to the model: text (tools may also return a plain str), and whether it failed."""

    text: str
    error: bool = False


class BaseTool:
    """Subclass for a stateful tool declared in a tool YAML file (`class_name`); `execute` may be sync or async."""

    answer_within_s: float | None = None  # declared by tools that bound their own calls (a service's timeout)

    def __init__(self, config: dict | None, schema: dict):
        self.config = dict(config or {})
        self.schema = validate_schema(schema)
        self.name = self.schema["function"]["name"]

    def execute(self, arguments: dict, **tools_kwargs) -> ToolResult | str:
        raise NotImplementedError

    def context_parameters(self) -> set[str] | None:
        """Names this tool accepts from tools_kwargs; None: any."""
        return None

    @property
    def is_async(self) -> bool:
        """Whether execute returns a coroutine (run on the event loop) rather than a value (run in a thread)."""
        return asyncio.iscoroutinefunction(self.execute)


class FunctionTool(BaseTool):
    """A plain (sync or async) Python function as a tool; keyword-only parameters come from tools_kwargs."""

    def __init__(self, fn: Callable, schema: dict, config: dict | None = None):
        super().__init__(config, schema)
        self.fn = fn
        params = inspect.signature(fn).parameters.values()
        self._context = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def context_parameters(self) -> set[str]:
        return self._context

    def execute(self, arguments: dict, **tools_kwargs):
        return self.fn(**arguments, **{k: v for k, v in tools_kwargs.items() if k in self._context})

    @property
    def is_async(self) -> bool:
        return asyncio.iscoroutinefunction(self.fn)


def tool(fn: Callable | None = None, *, name: str | None = None, register: bool = True):
    """Decorator: make `fn` a FunctionTool whose schema comes from its signature (type hints) and docstring
    (first paragraph = description; `Args:` lines `name: text` describe parameters). Registered under its name
    unless register=False. Use as `@tool` or `@tool(name="calc")`."""

    def wrap(f: Callable) -> FunctionTool:
        made = FunctionTool(f, schema_from_function(f, name))
        if register:
            TOOLS.register(made.name, override=True)(made)
        return made

    return wrap(fn) if fn is not None else wrap


def _json_type(annotation: Any, where: str) -> dict:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _json_type(args[0], where)
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _PY_TO_JSON[type(values[0])], "enum": values}
    base = origin or annotation
    if base in _PY_TO_JSON:
        return {"type": _PY_TO_JSON[base]}
    raise ToolSchemaError(f"{where}: type {annotation!r} has no JSON-schema equivalent; use str, int, float, bool, "
                          "list, dict or a Literal")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:")
    described = {}
    for line in rest.splitlines():
        match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)", line)
        if match:
            described[match.group(1)] = match.group(2).strip()
    return " ".join(head.split("\n\n")[0].split()), described


def schema_from_function(fn: Callable, name: str | None = None) -> dict:
    """The OpenAI function schema of `fn` (positional-or-keyword parameters; keyword-only ones are context)."""
    tool_name = name or fn.__name__
    description, described = _docstring_parts(fn.__doc__ or "")
    if not description:
        raise ToolSchemaError(f"tool {tool_name}: the function has no docstring to describe it to the model")
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            continue
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolSchemaError(f"tool {tool_name}: *args/**kwargs cannot be described to the model")
        if p.name not in hints:
            raise ToolSchemaError(f"tool {tool_name}: parameter {p.name!r} needs a type hint")
        prop = _json_type(hints[p.name], f"tool {tool_name}, parameter {p.name!r}")
        if p.name in described:
            prop["description"] = described[p.name]
        properties[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    schema = {"type": "function", "function": {"name": tool_name, "description": description,
                                               "parameters": {"type": "object", "properties": properties,
                                                              "required": required}}}
    return validate_schema(schema)


def validate_schema(schema: Any, where: str = "tool schema") -> dict:
    """Check an OpenAI function schema; raise ToolSchemaError naming the field that is wrong."""
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        raise ToolSchemaError(f"{where}: expected {{'type': 'function', 'function': {{...}}}}, got {schema!r:.200}")
    fn = schema["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", name):
        raise ToolSchemaError(f"{where}: function.name must be an identifier-like string, got {name!r}")
    where = f"{where} '{name}'"
    if not isinstance(fn.get("description", ""), str):
        raise ToolSchemaError(f"{where}: function.description must be a string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict) or params.get("type") != "object":
        raise ToolSchemaError(f"{where}: function.parameters must be a JSON schema of type 'object'")
    props = params.get("properties", {})
    if not isinstance(props, dict):
        raise ToolSchemaError(f"{where}: function.parameters.properties must be a mapping")
    for pname, prop in props.items():
        if not isinstance(prop, dict) or prop.get("type") not in JSON_TYPES:
            raise ToolSchemaError(f"{where}: parameter {pname!r} needs a 'type' among {sorted(JSON_TYPES)}, "
                                  f"got {prop!r:.120}")
    required = params.get("required", [])
    unknown = [r for r in required if r not in props] if isinstance(required, list) else required
    if unknown:
        raise ToolSchemaError(f"{where}: function.parameters.required names {unknown}, which are not properties")
    return schema


def check_arguments(schema: dict, arguments: Any) -> str | None:
    """Why `arguments` do not fit the schema (a message for the model), or None when they do."""
    params = schema["function"].get("parameters", {})
    props = params.get("properties", {})
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    missing = [r for r in params.get("required", []) if r not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument(s) {unknown}; expected {sorted(props)}"
    for key, value in arguments.items():
        expected = props[key]["type"]
        is_bool_as_number = expected in ("integer", "number") and isinstance(value, bool)
        if not isinstance(value, JSON_TYPES[expected]) or is_bool_as_number:
            return f"argument {key!r} must be {expected}, got {type(value).__name__}"
        if "enum" in props[key] and value not in props[key]["enum"]:
            return f"argument {key!r} must be one of {props[key]['enum']}"
    return None


def check_config_keys(tool: str, config: dict, known: set[str]) -> None:
    """ValueError naming the keys of `config` the tool does not read (the tool file adds its path and entry)."""
    unknown = sorted(set(config) - known, key=str)
    if unknown:
        hints = "".join(did_you_mean(key, known) for key in unknown)
        raise ValueError(f"tool {tool}: unknown config keys {unknown}.{hints} Known: {sorted(known)}")


def check_verl_tool_config(tool: str, config: dict, known: set[str]) -> None:
    """The config of one of veRL's tool classes: its keys, plus veRL's `type` (only `native` runs here)."""
    check_config_keys(tool, config, known | {"type"})
    kind = config.get("type", "native")
    if kind != "native":
        raise ValueError(f"tool {tool}: config type={kind!r}; verlx runs veRL's native tools only (veRL's 'mcp' "
                         "tools talk to MCP servers, which verlx has no client for)")


def config_number(tool: str, config: dict, key: str, default: float) -> float:
    """config[key] (or the default), which must be a positive number."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"tool {tool}: config {key} must be a positive number, got {value!r}")
    return value


def config_url(tool: str, config: dict, key: str, example: str) -> str:
    """config[key], which must be an http(s) URL (the service a tool calls)."""
    url = config.get(key) or ""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"tool {tool}: config {key} must be the service's http(s) URL (e.g. {example}), got {url!r}")
    return url


def as_tool(entry: Any, name: str) -> BaseTool:
    """A registry entry (a BaseTool, a BaseTool subclass with a default schema, or a plain function) → a tool."""
    if isinstance(entry, BaseTool):
        return entry
    if isinstance(entry, type) and issubclass(entry, BaseTool):
        schema = getattr(entry, "default_schema", None)
        if schema is None:
            raise ToolSchemaError(f"tool {name}: {entry.__name__} has no default_schema; declare it in the tool "
                                  "config file with a tool_schema")
        return entry({}, schema)
    if callable(entry):
        return FunctionTool(entry, schema_from_function(entry))
    raise ToolSchemaError(f"tool {name}: {entry!r} is neither a BaseTool nor a function")


TOOLS.register_lazy("calculator", "verlx.rollout.agent.builtin_tools:calculator")
TOOLS.register_lazy("python", "verlx.rollout.agent.builtin_tools:PythonTool")
