"""Ahead-of-time compilation of every native-engine Triton kernel for sm_90 (H100), on a machine without a GPU.

The interpreter runs kernels as numpy and accepts things the compiler rejects (globals that are not
constexpr, type mismatches in loop-carried values, ...); compiling to a cubin with the ptxas bundled in the
triton wheel catches those here. Pointer arguments get the 16-byte divisibility a real launch with aligned
tensors gets, so the compiled code is the vectorised variant the GPU runs. `compile_all` is None when this
triton has no CUDA backend or ptxas.
"""

from __future__ import annotations

import os

import triton

_PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def _compile(kernel, types: dict, constexprs: dict):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(name, "i32")  # strides, sizes: i32 unless named
        if signature[name].startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32))


def _variants():
    from verlx.rollout.native import triton_ops as ops
    from verlx.rollout.native import triton_sampling as smp

    bf16 = "*bf16"
    rope = dict(qkv_ptr=bf16, q_out_ptr=bf16, k_cache_ptr=bf16, v_cache_ptr=bf16, cos_ptr=bf16, sin_ptr=bf16,
                pos_ptr="*i64", norm_ptr=bf16, eps="fp32")
    for qk_norm in (False, True):
        yield "rope_cache", ops._rope_cache_kernel, rope, dict(HQ=14, HKV=2, D=64, QK_NORM=qk_norm, HEADS=32)
    attention = dict(q_ptr=bf16, k_cache_ptr=bf16, v_cache_ptr=bf16, pos_ptr="*i64", out_ptr=bf16,
                     part_acc_ptr="*fp32", part_ml_ptr="*fp32", scale="fp32")
    for splits in (1, 4):
        yield "decode_attention", ops._decode_attention_kernel, attention, dict(G=7, G_PAD=16, D=64, BLOCK=64,
                                                                                 SPLITS=splits)
    yield "combine", ops._combine_kernel, dict(part_acc_ptr="*fp32", part_ml_ptr="*fp32", out_ptr=bf16), dict(
        G=7, G_PAD=16, D=64, SPLITS=4)
    yield "swiglu", ops._swiglu_kernel, dict(gate_up_ptr=bf16, out_ptr=bf16), dict(BLOCK=1024)
    yield "rms_norm", ops._rms_norm_kernel, dict(x_ptr=bf16, w_ptr=bf16, out_ptr=bf16, eps="fp32"), dict(BLOCK=1024)
    stats = dict(logits_ptr=bf16, steps_ptr="*i64", stop_ptr="*i64", stats_ptr="*fp32", scale2="fp32")
    for greedy, blocked in ((False, 0), (True, 0), (False, 2), (True, 1)):
        yield "group_stats", smp._group_stats_kernel, stats, dict(GREEDY=greedy, NUM_BLOCKED=blocked, GROUP=1024)
    finish = dict(logits_ptr=bf16, seeds_ptr="*i64", steps_ptr="*i64", stop_ptr="*i64", stats_ptr="*fp32",
                  token_ptr="*i64", logprob_ptr="*fp32", done_ptr="*i1", pos_ptr="*i64", out_tokens_ptr="*i64",
                  out_logprobs_ptr="*fp32", scale2="fp32", inv_temperature="fp32")
    for greedy, blocked, stopping, record, pad in ((False, 0, 0, True, 256), (False, 0, 1, True, 256),
                                                   (True, 2, 2, True, 256), (False, 1, 0, False, 1)):
        yield "finish", smp._finish_kernel, finish, dict(GREEDY=greedy, NUM_BLOCKED=blocked, NUM_STOPPING=stopping,
                                                         RECORD=record, GROUPS_PAD=pad, GROUP=1024)


def _compile_all() -> list[str]:
    return [name for name, kernel, types, constexprs in _variants() if _compile(kernel, types, constexprs)]


compile_all = _compile_all if os.path.exists(_PTXAS) and "nvidia" in triton.backends.backends else None
