"""Server mode of the sglang engine (actor_rollout_ref.rollout.server.enable): each engine replica is SGLang's own
HTTP server, one process per replica on its node, started by the replica's first rank with the arguments an
in-process Engine would get, health-checked before its first call and stopped with the worker.

`SGLangServer` is the part of sglang.Engine's API verlx uses, over that server's HTTP endpoints: /generate (one
request per call, on this process's event loop), /abort_request, /release_memory_occupation and
/resume_memory_occupation, /update_weights_from_tensor (CUDA-IPC handles, as in-process: SGLang's TP rank i opens
handle i), /flush_cache, /begin_weight_update and /end_weight_update. So the engine adapter and its request stream
are the same in both modes. While the rollout runs, the server also answers an agent framework's own requests.
Starting, health-checking and stopping the process: engine_server.py.

`python -m verlx.rollout.sglang_server '<ServerArgs as JSON>'` is the server process.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from verlx.rollout.engine_server import EngineServer
from verlx.rollout.image_requests import base64_png


class SGLangServer(EngineServer):
    """A running SGLang HTTP server, driven like an in-process sglang.Engine."""

    engine = "sglang"
    module = "verlx.rollout.sglang_server"
    health_path = "/health_generate"

    def __init__(self, url, process, log_path, tp_size: int):
        super().__init__(url, process, log_path)
        self.tp_size = tp_size
        #: sglang.Engine.tokenizer_manager.abort_request's counterpart
        self.tokenizer_manager = SimpleNamespace(abort_request=self._abort_request)

    # ------------------------------------------------------------------ generation
    async def async_generate(self, input_ids: list[int], sampling_params: dict, return_logprob: bool = False,
                             rid: str | list[str] | None = None, image_data: list | None = None) -> dict | list[dict]:
        payload = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob,
                   "rid": rid}
        if image_data is not None:
            payload["image_data"] = encoded_image_data(image_data)
        return await self._post_json("generate", payload)

    def _abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self._call("abort_request", {"rid": rid, "abort_all": abort_all})

    # ------------------------------------------------------------------ memory and weights
    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._call("release_memory_occupation", {"tags": tags})

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._call("resume_memory_occupation", {"tags": tags})

    def update_weights_from_tensor(self, named_tensors: list, load_format: str | None = None,
                                   flush_cache: bool = True) -> tuple[bool, str]:
        """The handles of every TP rank in one message per rank, as sglang.Engine sends them to its schedulers."""
        from sglang.srt.utils import MultiprocessingSerializer

        serialized = [MultiprocessingSerializer.serialize(named_tensors, output_str=True)
                      for _ in range(self.tp_size)]
        return self._status("update_weights_from_tensor", {"serialized_named_tensors": serialized,
                                                           "load_format": load_format, "flush_cache": flush_cache})

    def flush_cache(self) -> tuple[bool, str]:
        return self._status("flush_cache", None)

    def begin_weight_update(self) -> tuple[bool, str]:
        return self._status("begin_weight_update", {})

    def end_weight_update(self) -> tuple[bool, str]:
        return self._status("end_weight_update", {})

    def _status(self, endpoint: str, payload: dict | None) -> tuple[bool, str]:
        """(success, message) of a control call: a JSON status, or the HTTP status with the body."""
        status, body = self._request(endpoint, payload)
        try:
            answer = json.loads(body)
        except json.JSONDecodeError:
            answer = None
        if isinstance(answer, dict) and "success" in answer:
            return bool(answer["success"]), str(answer.get("message", ""))
        return status == 200, body[:500]


def encoded_image_data(image_data: list) -> list:
    """A request's image_data (images, or one list of images per prompt) with each image as base64 PNG text: what
    the server's JSON carries and its image loader decodes."""
    return [encoded_image_data(item) if isinstance(item, list) else base64_png(item) for item in image_data]


def main() -> None:
    """The server process: SGLang's HTTP server with the ServerArgs given as JSON (started by verlx's server-mode
    rollout, rollout.server.enable=true; not a command users run themselves)."""
    import argparse

    parser = argparse.ArgumentParser(description="SGLang's HTTP server for verlx's server-mode rollout "
                                     "(actor_rollout_ref.rollout.server.enable=true starts one per engine replica).")
    parser.add_argument("server_args", help="sglang ServerArgs as a JSON object")
    args = parser.parse_args()
    try:
        from sglang.srt.entrypoints.http_server import launch_server
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:
        parser.exit(2, f"error: the SGLang server needs sglang ({e}); install it with pip install 'verlx[sglang]'\n")
    launch_server(ServerArgs(**json.loads(args.server_args)))


if __name__ == "__main__":
    main()
