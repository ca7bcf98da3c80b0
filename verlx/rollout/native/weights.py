"""The engine's parameters: one flat device buffer, fused qkv and gate_up, addressed by HF names.

One buffer makes sleep/wake a single free/alloc (or one host copy), and in-place copies keep every view —
and so every captured CUDA graph — valid across weight pushes. The trainer speaks HF names; `hf_targets`
maps each onto a row range of a fused engine parameter.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator

import torch

from verlx.rollout.native.architectures import ModelSpec
from verlx.rollout.weight_sync import hf_param_name
from verlx.utils.registry import did_you_mean

_ALIGN = 128  # elements; keeps every view 256-byte aligned for the matmul kernels
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints carry


def _param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    h, d, inter, f = spec.hidden_size, spec.head_dim, spec.intermediate_size, spec.features
    shapes: dict[str, tuple[int, ...]] = {"embed": (spec.vocab_size, h), "norm": (h,)}
    if not spec.tie_word_embeddings:
        shapes["lm_head"] = (spec.vocab_size, h)
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        shapes[p + "qkv_w"] = (spec.qkv_rows, h)
        shapes[p + "o_w"] = (h, spec.num_heads * d)
        shapes[p + "gate_up_w"] = (2 * inter, h)
        shapes[p + "down_w"] = (h, inter)
        shapes[p + "in_norm"] = (h,)
        shapes[p + "post_norm"] = (h,)
        if f.qkv_bias:
            shapes[p + "qkv_b"] = (spec.qkv_rows,)
        if f.o_bias:
            shapes[p + "o_b"] = (h,)
        if f.mlp_bias:
            shapes[p + "gate_up_b"] = (2 * inter,)
            shapes[p + "down_b"] = (h,)
        if f.qk_norm:  # per-head weights of q heads then k heads: one multiply after a joint normalisation
            shapes[p + "qk_norm"] = (spec.num_heads + spec.num_kv_heads, d)
    return shapes


def _hf_targets(spec: ModelSpec) -> dict[str, tuple[str, int, int]]:
    """HF name -> (engine parameter, first row, end row). A 1-D HF tensor aimed at 2-D rows (q/k norm) is
    broadcast over those rows."""
    q_rows = spec.num_heads * spec.head_dim
    kv_rows = spec.num_kv_heads * spec.head_dim
    inter = spec.intermediate_size
    targets = {
        "model.embed_tokens.weight": ("embed", 0, spec.vocab_size),
        "model.norm.weight": ("norm", 0, spec.hidden_size),
    }
    if not spec.tie_word_embeddings:
        targets["lm_head.weight"] = ("lm_head", 0, spec.vocab_size)
    fused = {
        "self_attn.q_proj": ("qkv", 0, q_rows),
        "self_attn.k_proj": ("qkv", q_rows, q_rows + kv_rows),
        "self_attn.v_proj": ("qkv", q_rows + kv_rows, q_rows + 2 * kv_rows),
        "self_attn.o_proj": ("o", 0, spec.hidden_size),
        "mlp.gate_proj": ("gate_up", 0, inter),
        "mlp.up_proj": ("gate_up", inter, 2 * inter),
        "mlp.down_proj": ("down", 0, spec.hidden_size),
    }
    has_bias = {"qkv": spec.features.qkv_bias, "o": spec.features.o_bias}
    has_bias["gate_up"] = has_bias["down"] = spec.features.mlp_bias
    for i in range(spec.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for module, (param, r0, r1) in fused.items():
            targets[f"{hf}{module}.weight"] = (f"{ours}{param}_w", r0, r1)
            if has_bias[param]:
                targets[f"{hf}{module}.bias"] = (f"{ours}{param}_b", r0, r1)
        targets[f"{hf}input_layernorm.weight"] = (f"{ours}in_norm", 0, spec.hidden_size)
        targets[f"{hf}post_attention_layernorm.weight"] = (f"{ours}post_norm", 0, spec.hidden_size)
        if spec.features.qk_norm:
            heads = spec.num_heads
            targets[f"{hf}self_attn.q_norm.weight"] = (f"{ours}qk_norm", 0, heads)
            targets[f"{hf}self_attn.k_norm.weight"] = (f"{ours}qk_norm", heads, heads + spec.num_kv_heads)
    return targets


class WeightStore:
    """Fused parameters as views of one flat buffer; `params` is empty while the weights sleep."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device):
        self.spec, self.dtype, self.device = spec, dtype, device
        self.shapes = _param_shapes(spec)
        self.hf_targets = _hf_targets(spec)
        self.offsets: dict[str, int] = {}
        total = 0
        for name, shape in self.shapes.items():
            self.offsets[name] = total
            numel = 1
            for s in shape:
                numel *= s
            total += -(-numel // _ALIGN) * _ALIGN
        self.numel = total
        self.flat: torch.Tensor | None = None
        self.params: dict[str, torch.Tensor] = {}
        self._layers: list[dict[str, torch.Tensor]] = []
        self._host_copy: torch.Tensor | None = None
        self._host_valid = False

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def is_allocated(self) -> bool:
        return self.flat is not None

    def allocate(self) -> None:
        self._bind(torch.empty(self.numel, dtype=self.dtype, device=self.device))

    def _bind(self, flat: torch.Tensor) -> None:
        self.flat = flat
        self.params = {}
        for name, shape in self.shapes.items():
            numel = 1
            for s in shape:
                numel *= s
            start = self.offsets[name]
            self.params[name] = flat[start : start + numel].view(shape)
        if self.spec.tie_word_embeddings:
            self.params["lm_head"] = self.params["embed"]
        self._layers = [
            {k[len(f"layers.{i}.") :]: v for k, v in self.params.items() if k.startswith(f"layers.{i}.")}
            for i in range(self.spec.num_layers)
        ]

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's parameters by short name (qkv_w, o_w, gate_up_w, down_w, in_norm, ...)."""
        return self._layers[i]

    def init_random(self, seed: int) -> None:
        """load_format=dummy: N(0, initializer_range) matrices, unit norms, zero biases (like HF's init)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, view in self.params.items():
            if name == "lm_head" and self.spec.tie_word_embeddings:
                continue
            if view.dim() == 2:
                view.normal_(0.0, self.spec.initializer_range, generator=gen)
            elif "norm" in name:
                view.fill_(1.0)
            else:
                view.zero_()

    def copy_named(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy HF-named tensors in place (any dtype/device; cast on copy). Returns the HF names copied."""
        if self.flat is None:
            raise RuntimeError("native engine weights are asleep; call wake_up(['weights']) before update_weights")
        copied = []
        for raw_name, tensor in named_tensors:
            name = hf_param_name(raw_name)
            if name.endswith(_IGNORED_SUFFIXES) or (self.spec.tie_word_embeddings and name == "lm_head.weight"):
                continue
            target = self.hf_targets.get(name)
            if target is None:
                raise KeyError(
                    f"native engine got unknown weight '{raw_name}' for {self.spec.architecture}."
                    + did_you_mean(name, self.hf_targets)
                    + " Is the trainer's model the same architecture as the engine's config?"
                )
            param, r0, r1 = target
            view = self.params[param][r0:r1]
            expected = tuple(view.shape[1:]) if name.endswith(("q_norm.weight", "k_norm.weight")) else tuple(view.shape)
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"native engine weight '{name}' has shape {tuple(tensor.shape)}, expected {expected} "
                    f"(from the engine's model config: {self.spec.architecture}, hidden {self.spec.hidden_size}, "
                    f"{self.spec.num_layers} layers)"
                )
            view.copy_(tensor)
            copied.append(name)
        return copied

    def expected_hf_names(self) -> set[str]:
        return set(self.hf_targets)

    def sleep(self, keep_host_copy: bool) -> None:
        """Free the device buffer; with keep_host_copy the values survive in host memory (pinned on CUDA,
        allocated once and reused by later sleeps: pinning a buffer costs more than the copy)."""
        if self.flat is None:
            return
        self._host_valid = False
        if keep_host_copy:
            if self._host_copy is None:
                self._host_copy = torch.empty(self.numel, dtype=self.dtype, pin_memory=self.device.type == "cuda")
            self._host_copy.copy_(self.flat)
            self._host_valid = True
        self.params, self._layers = {}, []
        self.flat = None

    def wake(self) -> bool:
        """Re-allocate the buffer; returns True if the values were restored from the host copy."""
        if self.flat is not None:
            return True
        self.allocate()
        if not self._host_valid:
            return False
        self.flat.copy_(self._host_copy)
        return True


def checkpoint_files(model_path: str) -> list[str]:
    """The weight files of an HF checkpoint directory: those its safetensors index names, else model.safetensors
    / model-*.safetensors, else pytorch_model*.bin (other files, e.g. Mistral's consolidated.safetensors, are not
    HF-named and are left alone)."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_path, n) for n in names]
    for pattern in ("model.safetensors", "model-*.safetensors", "pytorch_model*.bin"):
        files = sorted(glob.glob(os.path.join(model_path, pattern)))
        if files:
            return files
    raise FileNotFoundError(
        f"load_format=auto: no model*.safetensors or pytorch_model*.bin in {model_path}; point "
        "actor_rollout_ref.model.path at an HF checkpoint directory or use rollout.load_format=dummy"
    )


def iter_checkpoint(model_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors of a checkpoint directory, one file at a time."""
    for path in checkpoint_files(model_path):
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 - a safetensors file handle, not a dict
                    yield key, f.get_tensor(key)
        else:
            yield from torch.load(path, map_location="cpu", weights_only=True).items()
