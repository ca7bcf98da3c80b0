"""veRL's `code_interpreter` tool (verl.tools.sandbox_fusion_tools.SandboxFusionTool): the model's code runs on a
SandboxFusion service (POST `sandbox_fusion_url`, its /run_code API) and the model reads what it printed.

As veRL's: one request {compile_timeout, run_timeout (both the call's timeout), code, stdin: null, memory_limit_MB,
language, files: {}, fetch_files: []} with an HTTP timeout of 2 × timeout + 10 s, sent again after 1 s and 2 s when
the service answers 504 (three tries), given up on any other failure. A run the service reports `Finished` answers
its stdout followed by its stderr (a non-zero exit status included); anything else (the code ran out of time, did not
compile, an unsupported language, the service down or failing) answers veRL's "no stdout here". The model may pass
`timeout` and `language` where the tool schema declares them.

Differences from veRL: a call that reached no answer from the service is flagged as an error (counted in
tool/errors, the text unchanged) and logged with the URL; `num_workers` and `rate_limit` bound the calls in flight
per rollout worker process, where veRL's rate limit is one Ray actor shared by the cluster; an unsupported
`default_language` is refused when the tool file loads."""

from __future__ import annotations

import asyncio
import logging

from verlx.rollout.agent.http_service import HttpCallError, JsonService
from verlx.rollout.agent.tools import BaseTool, ToolResult, check_verl_tool_config, config_number, config_url
from verlx.utils.registry import did_you_mean

logger = logging.getLogger(__name__)
NO_OUTPUT = "no stdout here"
# the languages SandboxFusion's run_code accepts
LANGUAGES = ("python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql", "rust",
             "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script", "jest",
             "verilog", "python_gpu", "lean", "swift", "racket")
CONFIG_KEYS = {"sandbox_fusion_url", "num_workers", "enable_global_rate_limit", "rate_limit", "default_timeout",
               "default_language", "memory_limit_mb"}


class SandboxFusionTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "A tool for executing code.",
            "parameters": {"type": "object",
                           "properties": {"code": {"type": "string", "description": "The code to execute."}},
                           "required": ["code"]},
        },
    }
    attempts = 3  # veRL's: tries when the service answers 504 (Gateway Timeout)
    retry_delay_s = 1.0  # the wait before try k + 1 is k × this

    def __init__(self, config: dict | None = None, schema: dict | None = None):
        super().__init__(config, schema or self.default_schema)
        check_verl_tool_config(self.name, self.config, CONFIG_KEYS)
        url = config_url(self.name, self.config, "sandbox_fusion_url", "http://localhost:8080/run_code")
        self.default_timeout = config_number(self.name, self.config, "default_timeout", 30)
        self.memory_limit_mb = config_number(self.name, self.config, "memory_limit_mb", 1024)
        self.default_language = self.config.get("default_language", "python")
        if self.default_language not in LANGUAGES:
            raise ValueError(f"tool {self.name}: config default_language={self.default_language!r} is not a "
                             f"language SandboxFusion runs.{did_you_mean(self.default_language, LANGUAGES)}")
        workers = int(config_number(self.name, self.config, "num_workers", 10))
        if self.config.get("enable_global_rate_limit", True):
            workers = min(workers, int(config_number(self.name, self.config, "rate_limit", 10)))
        self.service = JsonService(url, workers)
        self.answer_within_s = 2 * self.default_timeout + 10  # one try of a call without `timeout`

    def context_parameters(self) -> set[str]:
        return set()

    async def execute(self, arguments: dict, **tools_kwargs) -> ToolResult:
        code = arguments.get("code", "")
        timeout = arguments.get("timeout", self.default_timeout)
        language = arguments.get("language", self.default_language)
        if language not in LANGUAGES:
            return ToolResult(NO_OUTPUT)
        payload = {"compile_timeout": timeout, "run_timeout": timeout, "code": code if isinstance(code, str) else
                   str(code), "stdin": None, "memory_limit_MB": self.memory_limit_mb, "language": language,
                   "files": {}, "fetch_files": []}
        try:
            answer = await self._post(payload, 2 * timeout + 10)
        except HttpCallError as e:
            logger.warning("tool %s: SandboxFusion call failed: %s", self.name, e)
            return ToolResult(NO_OUTPUT, error=True)
        run = answer.get("run_result") if isinstance(answer, dict) else None
        if isinstance(run, dict) and run.get("status") == "Finished":
            return ToolResult((run.get("stdout") or "") + (run.get("stderr") or ""))
        return ToolResult(NO_OUTPUT)

    async def _post(self, payload: dict, timeout_s: float):
        for attempt in range(1, self.attempts + 1):
            try:
                return await self.service.post(payload, timeout_s)
            except HttpCallError as e:
                if e.status != 504 or attempt == self.attempts:
                    raise
            await asyncio.sleep(self.retry_delay_s * attempt)
