"""torch.compile for training: each decoder layer's forward, and the log-softmax arithmetic of each vocabulary chunk.

What is compiled is the layer's own forward, installed as the instance's `forward`, so that FSDP2's hooks (which
run around `forward` in `Module.__call__`) stay outside the graph: compile first, then `fully_shard` (the
torchtitan order). Inductor fuses the RMSNorms, the rotary embedding, SwiGLU and the residual adds; matmuls stay
cuBLAS calls. The packed attention is opaque to the compiler (see `verlx.models.attention`), so each layer is two
graphs around the attention kernel.

Shapes are dynamic (`dynamic=True`): the packed token count changes every micro-batch, and nothing that varies per
micro-batch reaches the layers as a Python number, so there is one compilation for all layers and all batches.

Activation checkpointing wraps the compiled forward (non-reentrant). transformers' own checkpointing sits in
`__call__` or in a `forward` wrapper depending on its version; it is switched off on compiled layers so that it
runs exactly once, here. A compiler failure (TorchDynamoException) falls back to the eager forward with one warning.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from verlx.models.policy import PolicyModel, decoder_layers
from verlx.models.vision import vision_tower

logger = logging.getLogger(__name__)

_compiled_forwards: dict[object, object] = {}
_failed: list[str] = []  # the first compiler error, once one happened: every layer runs eagerly from then on


def _own_forward(layer: nn.Module):
    """The layer class's forward without transformers' checkpointing wrapper (5.2x wraps `forward` itself)."""
    forward = type(layer).forward
    if getattr(forward, "__code__", None) is not None and forward.__code__.co_name == "forward_with_checkpointing":
        return forward.__wrapped__
    return forward


def _compiled(forward):
    if forward not in _compiled_forwards:
        _compiled_forwards[forward] = torch.compile(forward, dynamic=True)
    return _compiled_forwards[forward]


def _run(layer: nn.Module, forward, *args, **kwargs):
    if not _failed:
        try:
            return _compiled(forward)(layer, *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:
            _failed.append(f"{type(e).__name__}: {e}")
            logger.warning("torch.compile of %s failed; running the decoder layers eagerly: %s",
                           type(layer).__name__, _failed[0].splitlines()[0])
    return forward(layer, *args, **kwargs)


def _layer_forward(layer: nn.Module, forward, checkpointing: bool, *args, **kwargs):
    if checkpointing and layer.training and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        return checkpoint(functools.partial(_run, layer, forward), *args, use_reentrant=False, **kwargs)
    return _run(layer, forward, *args, **kwargs)


def compile_model(model: nn.Module) -> int:
    """Compile every decoder layer of a PolicyModel / ValueModel in place (before FSDP); returns the layer count.

    A PolicyModel also switches its log-prob chunks to the compiled kernels. A vision-language model's vision blocks
    stay eager: every set of image sizes is another shape, which would compile again.
    """
    inner = model.hf_model if isinstance(model, PolicyModel) else model.decoder
    layers = decoder_layers(inner)
    if isinstance(model, PolicyModel) and model.vision is not None:
        tower = set(vision_tower(inner).modules())
        layers = [layer for layer in layers if layer not in tower]
    for layer in layers:
        checkpointing = bool(getattr(layer, "gradient_checkpointing", False))
        if checkpointing:
            layer.gradient_checkpointing = False
        layer.forward = functools.partial(_layer_forward, layer, _own_forward(layer), checkpointing)
    if isinstance(model, PolicyModel):
        model.compiled = True
    return len(layers)


def compile_failure() -> str | None:
    """The compiler error that switched layers back to eager, if one did."""
    return _failed[0] if _failed else None
