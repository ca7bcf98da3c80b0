"""Weights into a vLLM server (server mode): the trainer's tensors travel as handles, bucket by bucket, through the
server's /collective_rpc to `VLLMWeightReceiver`, a worker extension (vLLM's worker_extension_cls: its methods are
mixed into every vLLM worker, one per tensor-parallel rank), which opens them and loads them with the model's own
load_weights, as the in-process engine does, and returns the names it loaded so the trainer checks them as
in-process.

A handle names the device it lives on: a CUDA tensor travels as its CUDA-IPC handle keyed by its GPU's UUID (each
tensor-parallel rank of the trainer sends one for its own full copy; the vLLM worker on that GPU opens that one, so
no tensor crosses GPUs); a CPU tensor travels by value. The producer keeps its tensors alive until the call
returned. This module runs inside vLLM's worker processes too: it imports nothing from verlx.
"""

from __future__ import annotations

import base64
import pickle

import torch

#: vLLM's worker_extension_cls (a qualified name: module.Class)
EXTENSION = "verlx.rollout.vllm_weight_receiver.VLLMWeightReceiver"
LOAD_METHOD = "verlx_load_weights"
INFO_METHOD = "verlx_model_info"
CPU = "cpu"
#: the device index in the arguments torch's reduce_tensor gives for a CUDA tensor
_DEVICE_ARG = 6


def device_key(device: torch.device) -> str:
    """The GPU's UUID (the same on every process, whatever its CUDA_VISIBLE_DEVICES), or "cpu"."""
    if device.type != "cuda":
        return CPU
    return str(torch.cuda.get_device_properties(device).uuid)


def tensor_handle(tensor: torch.Tensor) -> dict:
    """{device key: what opens the tensor there}: CUDA-IPC arguments, or the CPU tensor itself."""
    if tensor.device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        return {device_key(tensor.device): reduce_tensor(tensor.detach())[1]}
    return {CPU: tensor.detach()}


def encode_bucket(named_handles: list[tuple[str, dict]]) -> str:
    """[(HF name, {device key: handle})] → the text /collective_rpc carries (its arguments must be strings)."""
    return base64.b64encode(pickle.dumps(named_handles)).decode()


def open_bucket(text: str, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """The tensors of an encoded bucket on `device` (the one whose handle each name has for it)."""
    key = device_key(device)
    out = []
    for name, handles in pickle.loads(base64.b64decode(text)):
        if key not in handles:
            raise ValueError(f"weight {name}: no handle for this worker's device {key} (the trainer sent handles "
                             f"for {sorted(handles)}); each trainer rank of the group must share the engine's GPUs")
        handle = handles[key]
        if key == CPU:
            out.append((name, handle))
            continue
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        args = list(handle)
        args[_DEVICE_ARG] = device.index  # the same GPU, numbered as this process sees it
        out.append((name, rebuild_cuda_tensor(*args)))
    return out


class VLLMWeightReceiver:
    """Mixed into vLLM's worker class (it has `model_runner` and `device`); names carry a verlx_ prefix because vLLM
    refuses an extension whose attributes the worker class already has."""

    def _verlx_model(self) -> torch.nn.Module:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def verlx_load_weights(self, bucket: str) -> list[str] | None:
        """Load one bucket with model.load_weights; the vLLM parameter names it reports loaded (None: the model
        class does not report them)."""
        weights = open_bucket(bucket, torch.device(self.device))
        loaded = self._verlx_model().load_weights(weights=weights)
        return None if loaded is None else sorted(loaded)

    def verlx_model_info(self) -> dict:
        """The model's parameter names and packed_modules_mapping (the fused q/k/v and gate/up), which the trainer
        needs to check a push."""
        model = self._verlx_model()
        return {"param_names": [name for name, _ in model.named_parameters()],
                "packed_modules_mapping": packed_modules_mapping_of(model)}


def packed_modules_mapping_of(model: torch.nn.Module) -> dict[str, list[str]]:
    """The fused parameters (qkv_proj ← q/k/v_proj, gate_up_proj ← gate/up_proj) of the model and every module in
    it: vLLM's multimodal classes declare them on their text model only (0.26's Qwen2-VL: `language_model`), so
    the top-level attribute alone missed them and every fused shard of a push looked unloaded."""
    packed: dict[str, list[str]] = {}
    for module in model.modules():
        for fused, shards in dict(getattr(module, "packed_modules_mapping", None) or {}).items():
            packed.setdefault(fused, list(shards))
    return packed
