"""Server mode of the vllm engine (actor_rollout_ref.rollout.server.enable): each engine replica is vLLM's own
OpenAI-compatible HTTP server (vllm.entrypoints.openai.api_server, what `vllm serve` runs), one process per replica
on its node, started by the replica's first rank with the arguments an in-process LLM would get, health-checked
(/health) before its first call and stopped with the worker.

`VLLMServer` is the client, over endpoints read from vLLM 0.26.0's source:
- /inference/v1/generate (vllm/entrypoints/scale_out/token_in_token_out): token ids in, token ids and per-token
  log-probs out, one request per prompt with n samples; the server names it "generate-tokens-<request_id>".
- development endpoints, served when VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/dev): /abort_requests (by
  those names; an aborted request answers with the tokens it had), /sleep?level=, /wake_up?tags=, /is_sleeping,
  /reset_prefix_cache, and /collective_rpc, which calls verlx's weight receiver in every vLLM worker
  (vllm_weight_receiver.py: CUDA-IPC handles in, model.load_weights, the loaded names back).
While the rollout runs, the server also answers an agent framework's own requests. Starting, health-checking and
stopping the process: engine_server.py.

`python -m verlx.rollout.vllm_server '<server arguments as JSON>'` is the server process.
"""

from __future__ import annotations

import json
import urllib.parse

from verlx.rollout.engine_server import EngineServer
from verlx.rollout.vllm_weight_receiver import INFO_METHOD, LOAD_METHOD

#: the request id the server gives a /inference/v1/generate request: this prefix + the request_id sent
TOKENS_REQUEST_PREFIX = "generate-tokens-"
#: variables of the server process: its development endpoints on; the engine core in a process of its own (the
#: in-process engine turns this off in the worker) with workers spawned, as `vllm serve` does
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
              "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


class VLLMServer(EngineServer):
    engine = "vllm"
    module = "verlx.rollout.vllm_server"
    health_path = "/health"

    def _refusal(self, endpoint: str, status: int, body: str) -> str:
        message = super()._refusal(endpoint, status, body)
        if status == 404:
            message += (f"; this vLLM release's server has no /{endpoint.split('?')[0]}: verlx's server mode uses the "
                        "endpoints of vLLM 0.26.0, the development ones only served with VLLM_SERVER_DEV_MODE=1 "
                        "(which verlx sets for the server); use a release that has them or turn "
                        "actor_rollout_ref.rollout.server.enable off")
        return message

    # ------------------------------------------------------------------ generation
    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict) -> dict:
        return await self._post_json("inference/v1/generate", {"request_id": request_id, "token_ids": prompt_ids,
                                                               "sampling_params": sampling_params})

    def abort(self, request_ids: list[str]) -> None:
        """Abort these requests (by the request_id they were sent with); each answers with the tokens it had."""
        self._call("abort_requests", {"request_ids": [TOKENS_REQUEST_PREFIX + r for r in request_ids]})

    # ------------------------------------------------------------------ memory
    def sleep(self, level: int) -> None:
        self._call(f"sleep?level={int(level)}")

    def wake_up(self, tags: list[str]) -> bool:
        """Wake these tags; whether the engine is then fully awake (no tag asleep, scheduling resumed)."""
        self._call("wake_up?" + urllib.parse.urlencode([("tags", tag) for tag in tags]))
        return not json.loads(self._call("is_sleeping", method="GET"))["is_sleeping"]

    def reset_prefix_cache(self) -> bool:
        return bool(json.loads(self._call("reset_prefix_cache"))["success"])

    # ------------------------------------------------------------------ weights
    def load_weights(self, bucket: str) -> list[list[str] | None]:
        """One encoded bucket (vllm_weight_receiver.encode_bucket) into every worker: the names each loaded."""
        return self._rpc(LOAD_METHOD, [bucket])

    def model_info(self) -> dict:
        """Parameter names and packed_modules_mapping of the model (tensor-parallel rank 0's)."""
        return self._rpc(INFO_METHOD, [])[0]

    def _rpc(self, method: str, args: list[str]) -> list:
        """/collective_rpc: the method's result on every worker, in rank order."""
        return json.loads(self._call("collective_rpc", {"method": method, "args": args}))["results"]


def main() -> None:
    """The server process: vLLM's OpenAI-compatible server with the arguments given as JSON (started by verlx's
    server-mode rollout, rollout.server.enable=true; not a command users run themselves)."""
    import argparse
    import asyncio

    parser = argparse.ArgumentParser(description="vLLM's HTTP server for verlx's server-mode rollout "
                                     "(actor_rollout_ref.rollout.server.enable=true starts one per engine replica).")
    parser.add_argument("server_args", help="vLLM engine and server arguments as a JSON object")
    server_args = json.loads(parser.parse_args().server_args)
    try:
        from vllm.entrypoints.openai.api_server import run_server
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as e:
        parser.exit(2, f"error: the vLLM server needs vllm ({e}); install it with pip install 'verlx[vllm]'\n")
    # `vllm serve`'s defaults, then the arguments an in-process LLM gets (the same names: EngineArgs' fields)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    unknown = sorted(key for key in server_args if not hasattr(args, key))
    if unknown:
        parser.exit(2, f"error: {unknown} are not arguments of this vLLM release's server\n")
    for key, value in server_args.items():
        setattr(args, key, value)
    validate_parsed_serve_args(args)
    asyncio.run(run_server(args))


if __name__ == "__main__":
    main()
