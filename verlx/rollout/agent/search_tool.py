"""veRL's `search` tool (verl.tools.search_tool.SearchTool, Search-R1's retriever): the model's queries go to a
retrieval server (POST `retrieval_service_url` {"queries": [...], "topk": k, "return_scores": true}) and the model
reads the passages, as veRL formats them: a JSON object {"result": text} whose text is, per query, "Doc i (Title:
<first line>)\\n<the other lines>" per passage, queries separated by "\\n---\\n".

As veRL's: up to 10 tries, the k-th retry after k s, while the server answers 500/502/503/504, cannot be reached or
does not answer within `timeout`; any other failure ends the tries. The model then reads {"result": "Search error:
API Call Failed: <why>"}; an answer without passages reads "No search results found.", an empty query list veRL's
error. The tool reward is veRL's 0.0 (verlx records none).

Differences from veRL: the failure text of a connection error, a timeout or an answer that is not JSON is urllib's
(with the URL), where veRL's is the requests library's, and such a call is flagged as an error (counted in
tool/errors); `num_workers` and `rate_limit` bound the calls in flight per rollout worker process, where veRL's rate
limit is one Ray actor shared by the cluster; veRL's per-call metrics (query_count, total_results) are not logged."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from verlx.rollout.agent.http_service import HttpCallError, JsonService
from verlx.rollout.agent.tools import BaseTool, ToolResult, check_verl_tool_config, config_number, config_url

logger = logging.getLogger(__name__)
CONFIG_KEYS = {"retrieval_service_url", "num_workers", "rate_limit", "timeout", "topk", "enable_global_rate_limit"}
RETRIED_STATUS = {500, 502, 503, 504}


def _as_json(text: str) -> str:
    return json.dumps({"result": text}, ensure_ascii=False)


def format_passages(passages: list) -> str:
    """One query's passages as the model reads them (the first line of a passage's contents is its title)."""
    blocks = []
    for i, passage in enumerate(passages):
        title, _, text = passage["document"]["contents"].partition("\n")
        blocks.append(f"Doc {i + 1} (Title: {title})\n{text}\n\n")
    return "".join(blocks).strip()


def format_answer(answer: Any) -> str:
    """The server's JSON answer as the model reads it."""
    if not answer:
        return _as_json("Unknown API state (no response and no error message).")
    try:
        per_query = answer.get("result", [])
        if not per_query:
            return _as_json("No search results found.")
        return _as_json("\n---\n".join(format_passages(passages) for passages in per_query))
    except Exception as e:  # a malformed answer is the model's to read, as in veRL
        return _as_json(f"Error processing search results: {e}")


class SearchTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches for relevant information based on queries.",
            "parameters": {"type": "object",
                           "properties": {"query_list": {"type": "array", "items": {"type": "string"},
                                                         "description": "List of search queries"}},
                           "required": ["query_list"]},
        },
    }
    attempts = 10  # veRL's
    retry_delay_s = 1.0  # the wait before try k + 1 is k × this

    def __init__(self, config: dict | None = None, schema: dict | None = None):
        super().__init__(config, schema or self.default_schema)
        check_verl_tool_config(self.name, self.config, CONFIG_KEYS)
        url = config_url(self.name, self.config, "retrieval_service_url", "http://127.0.0.1:8000/retrieve")
        self.timeout = config_number(self.name, self.config, "timeout", 30)
        self.topk = int(config_number(self.name, self.config, "topk", 3))
        workers = int(config_number(self.name, self.config, "num_workers", 120))
        if self.config.get("enable_global_rate_limit", True):
            workers = min(workers, int(config_number(self.name, self.config, "rate_limit", 120)))
        self.service = JsonService(url, workers)
        self.answer_within_s = self.timeout  # one try

    def context_parameters(self) -> set[str]:
        return set()

    async def execute(self, arguments: dict, **tools_kwargs) -> ToolResult:
        queries = arguments.get("query_list")
        if not queries or not isinstance(queries, list):
            return ToolResult(_as_json("Error: 'query_list' is missing, empty, or not a list in parameters."))
        payload = {"queries": queries, "topk": self.topk, "return_scores": True}
        last_error = ""
        for attempt in range(1, self.attempts + 1):
            try:
                return ToolResult(format_answer(await self.service.post(payload, self.timeout)))
            except HttpCallError as e:
                last_error = self._describe(e, attempt)
                if e.kind == "json" or (e.kind == "status" and e.status not in RETRIED_STATUS):
                    break
            if attempt < self.attempts:
                await asyncio.sleep(self.retry_delay_s * attempt)
        logger.warning("tool %s: retrieval call failed: %s", self.name, last_error)
        return ToolResult(_as_json(f"Search error: API Call Failed: {last_error}"), error=True)

    def _describe(self, error: HttpCallError, attempt: int) -> str:
        if error.kind == "status" and error.status in RETRIED_STATUS:
            return f"API Request Error: Server Error ({error.status}) on attempt {attempt}/{self.attempts}"
        prefix = {"status": "API Request Error", "timeout": "Timeout Error", "connection": "Connection Error",
                  "json": "API Response JSON Decode Error"}[error.kind]
        return f"{prefix}: {error}"
