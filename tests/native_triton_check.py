"""The triton decode backend against the torch backend, one decode step of a tiny model with random weights.

As a script with TRITON_INTERPRET=1 (tests/unit/test_native_triton.py runs it) it checks CPU float16 through the
Triton interpreter and prints OK; test_native_engine_gpu.py calls `check` on CUDA in bfloat16."""

from __future__ import annotations

import os

import torch

from native_models import VOCAB, tiny_config
from verlx.rollout.native import triton_ops
from verlx.rollout.native.architectures import model_spec
from verlx.rollout.native.kv_cache import KVCache, plan_cache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.rope import rope_tables
from verlx.rollout.native.triton_ops import self_test
from verlx.rollout.native.weights import WeightStore


def _scalar_index_patch():
    """Triton 3.6's interpreter turns loop bounds into ints with int(1-element array), which numpy >= 2.4
    rejects; give its tensors an __index__ that takes the single element (GPU compilation is unaffected)."""
    import triton.runtime.interpreter as interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _scalar_index_patch()


def build(kind: str, max_len: int, device: torch.device, dtype: torch.dtype):
    config = tiny_config(kind)
    spec = model_spec(config)
    weights = WeightStore(spec, dtype, device)
    weights.allocate()
    weights.init_random(0)
    gen = torch.Generator(device=device).manual_seed(2)
    for name, view in weights.params.items():  # non-trivial norm weights, so q/k norm is really exercised
        if "norm" in name:
            view.uniform_(0.5, 1.5, generator=gen)
    cos, sin = rope_tables(config, spec.head_dim, max_len, dtype, device)
    plan = plan_cache(spec, dtype, device, max_len=max_len, max_num_seqs=6, kv_cache_tokens=None,
                      gpu_memory_utilization=0.5, weight_bytes=0, prefill_tokens=64)
    models = {b: NativeModel(spec, weights, cos, sin, b) for b in ("torch", "triton")}
    return spec, plan, models


def check(kind: str, device=torch.device("cpu"), dtype=torch.float16) -> None:
    """float16 on CPU: the interpreter's bfloat16 dot is broken; the kernels are dtype-generic."""
    max_len = 192
    spec, plan, models = build(kind, max_len, device, dtype)
    gen = torch.Generator().manual_seed(1)
    caches = {name: KVCache(spec, plan, dtype, device) for name in models}
    noise = torch.randn(caches["torch"].data.shape, generator=gen).to(device, dtype)
    for cache in caches.values():
        cache.data.copy_(noise)
    pos = torch.tensor([0, 1, 63, 64, 150, 191], device=device)  # BLOCK_N=64 edges, window 6, the last row
    tokens = torch.randint(0, VOCAB, (6,), generator=gen).to(device)
    expected = models["torch"].decode(tokens, pos, caches["torch"], kv_len=max_len).float()
    tile = triton_ops.ROPE_TILE
    for splits, rope_tile in ((None, tile), (1, tile), (3, 2 * spec.head_dim)):  # the last: 2 heads a program
        caches["triton"].data.copy_(noise)
        models["triton"].decode_ops.forced_splits = splits
        triton_ops.ROPE_TILE = rope_tile
        try:
            got = models["triton"].decode(tokens, pos, caches["triton"], kv_len=max_len).float()
        finally:
            triton_ops.ROPE_TILE = tile
        err = (got - expected).abs().max().item()
        # logits after two layers of dtype rounding, done in a different order by each backend
        tolerance = 0.02 if dtype == torch.float16 else 0.06
        assert err < tolerance * expected.abs().max().item(), f"{kind} splits={splits}: logits differ by {err}"
        # both backends wrote the same K/V rows (to rounding) and nothing else
        diff = (caches["triton"].data.float() - caches["torch"].data.float()).abs().max().item()
        scale = caches["torch"].data.float().abs().max().item()
        ulps = 4 * torch.finfo(dtype).eps  # the torch backend rounds after each of its 3-4 RoPE ops
        assert diff <= ulps * scale, f"{kind}: cache writes differ by {diff} (values up to {scale})"
    assert self_test(models["triton"], caches["triton"]) is None


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1 (or call check on a GPU)"
    for kind in ("qwen3", "mistral_window"):
        check(kind)
    print("OK")
