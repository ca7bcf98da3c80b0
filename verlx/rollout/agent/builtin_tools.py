"""Built-in tools: `calculator` (exact arithmetic, no code execution) and `python` (code in the sandbox)."""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from verlx.rollout.agent.sandbox import SandboxLimits, run_python
from verlx.rollout.agent.tools import BaseTool, ToolResult, check_config_keys, schema_from_function

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
MAX_EXPONENT = 64
MAX_DIGITS = 60


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise ValueError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        result = _OPS[type(node.op)](left, right)
        return Fraction(result)
    raise ValueError(f"unsupported expression element {type(node).__name__}; use numbers and + - * / // % **")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: numbers combined with + - * / // % ** and parentheses, e.g. "12*(3+4)"
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _evaluate(tree.body)
    except SyntaxError:
        return ToolResult(f"error: cannot parse {expression!r} as arithmetic", error=True)
    except (ValueError, ZeroDivisionError, OverflowError) as e:
        return ToolResult(f"error: {e}", error=True)
    text = _format(value)
    if len(text.lstrip("-")) > MAX_DIGITS:
        return ToolResult(f"error: the result has more than {MAX_DIGITS} digits", error=True)
    return text


class PythonTool(BaseTool):
    """Runs the model's code in the sandbox; config keys: cpu_time_s, memory_mb, wall_s, max_output_bytes."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return what it prints (stdout, then stderr on failure).",
            "parameters": {"type": "object", "properties": {"code": {"type": "string",
                                                                     "description": "the code to run"}},
                           "required": ["code"]},
        },
    }

    def __init__(self, config: dict | None = None, schema: dict | None = None):
        super().__init__(config, schema or self.default_schema)
        check_config_keys(self.name, self.config, set(SandboxLimits.__dataclass_fields__))
        self.limits = SandboxLimits(**self.config)

    def context_parameters(self) -> set[str]:
        return set()

    async def execute(self, arguments: dict, **tools_kwargs) -> ToolResult:
        result = await run_python(arguments["code"], self.limits)
        if result.timed_out:
            return ToolResult(f"error: the code ran longer than {self.limits.wall_s:g} s and was stopped", error=True)
        text = result.stdout if result.ok else (result.stdout + result.stderr)
        if result.output_truncated:
            text += "\n...(output truncated)"
        if not result.ok and not text.strip():
            text = f"error: the code exited with status {result.returncode}"
        return ToolResult(text, error=not result.ok)


CALCULATOR_SCHEMA = schema_from_function(calculator)
