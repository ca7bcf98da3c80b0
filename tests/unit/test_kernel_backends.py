"""Attention/sampling backends chosen from the installed kernel libraries and the GPU, overridable by the user."""

from __future__ import annotations

import dataclasses
import logging
import sys

import pytest

from engine_fakes.contexts import make_ctx
from verlx.config.roles import EngineKwargs
from verlx.rollout.engine_layout import plan_engine_layout
from verlx.rollout.kernel_backends import KernelInventory, inventory, sglang_backends, vllm_backends
from verlx.rollout.sglang_adapter import build_server_args
from verlx.rollout.vllm_adapter import build_llm_args

HOPPER, AMPERE, ADA = (9, 0), (8, 0), (8, 9)


@pytest.mark.parametrize(
    "inv,expected",
    [
        # the GPU machine's bundle: H100, no FA3 library, flashinfer that would JIT-compile
        (KernelInventory(HOPPER, sglang_fa3=False, flashinfer=True),
         {"attention_backend": "triton", "sampling_backend": "pytorch"}),
        (KernelInventory(HOPPER, sglang_fa3=True, flashinfer=True), {"sampling_backend": "pytorch"}),
        (KernelInventory(HOPPER, sglang_fa3=True, flashinfer=True, flashinfer_precompiled=True), {}),
        (KernelInventory(AMPERE, sglang_fa3=True, flashinfer=True),
         {"attention_backend": "triton", "sampling_backend": "pytorch"}),
        (KernelInventory(AMPERE, flashinfer=False), {}),  # SGLang's own default is already triton + pytorch
        ((KernelInventory((10, 0), flashinfer=True)), {"sampling_backend": "pytorch"}),  # trtllm_mha attention
        (KernelInventory(None, flashinfer=True), {"sampling_backend": "pytorch"}),
    ],
    ids=["hopper_bundle", "hopper_fa3", "hopper_complete", "ampere_jit", "ampere_plain", "blackwell", "cpu"],
)
def test_sglang_choices(inv, expected):
    assert sglang_backends(inv, {}).args == expected


def test_sglang_user_setting_wins_and_reasons_name_the_missing_library():
    inv = KernelInventory(HOPPER, sglang_fa3=False, flashinfer=True)
    choice = sglang_backends(inv, {"attention_backend": "flashinfer"})
    assert choice.args == {"sampling_backend": "pytorch"}
    choice = sglang_backends(inv, {})
    assert "sm90" in choice.reasons[0] and "flash_ops" in choice.reasons[0]
    assert "flashinfer-jit-cache" in choice.reasons[1]


def test_sglang_vision_tower_leaves_fa3_only_where_the_library_is_missing():
    """SGLang 0.5.17 gives a vision tower on sm90 FA3 of its own (mm_attention_backend), independent of the text
    attention_backend: the 2B vision-language run of 2026-11-27 died at its first image on `flash_ops`."""
    bundle = KernelInventory(HOPPER, sglang_fa3=False, flashinfer=True)
    choice = sglang_backends(bundle, {}, vision=True)
    assert choice.args == {"attention_backend": "triton", "sampling_backend": "pytorch",
                           "mm_attention_backend": "triton_attn"}
    assert "vision tower" in choice.reasons[2] and "flash_ops" in choice.reasons[2]
    assert "mm_attention_backend" not in sglang_backends(bundle, {}).args  # a text model
    assert sglang_backends(bundle, {"mm_attention_backend": "sdpa"}, vision=True).args == {
        "attention_backend": "triton", "sampling_backend": "pytorch"}
    complete = KernelInventory(HOPPER, sglang_fa3=True, flashinfer=True, flashinfer_precompiled=True)
    assert sglang_backends(complete, {}, vision=True).args == {}
    assert sglang_backends(KernelInventory(AMPERE), {}, vision=True).args == {}  # SGLang picks triton_attn there


@pytest.mark.parametrize(
    "inv,user,expected",
    [
        (KernelInventory(HOPPER, vllm_fa2=False, vllm_fa3=True), {}, {}),  # the bundle on an H100
        (KernelInventory(HOPPER, vllm_fa2=True, vllm_fa3=False), {}, {"attention_backend": "TRITON_ATTN"}),
        (KernelInventory(ADA, vllm_fa2=False, vllm_fa3=True), {}, {"attention_backend": "TRITON_ATTN"}),
        (KernelInventory(ADA, vllm_fa2=True), {}, {}),
        (KernelInventory(ADA), {"attention_backend": "FLASHINFER"}, {}),
        (KernelInventory(ADA), {"attention_config": {"backend": "FLASHINFER"}}, {}),
        (KernelInventory(None), {}, {}),
    ],
    ids=["hopper_fa3", "hopper_no_fa3", "ada_no_fa2", "ada_fa2", "user_backend", "user_config", "cpu"],
)
def test_vllm_choices(inv, user, expected):
    assert vllm_backends(inv, user).args == expected


def test_inventory_reads_package_directories_without_importing_them(tmp_path, monkeypatch):
    kernel = tmp_path / "sgl_kernel"
    kernel.mkdir()
    (kernel / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (kernel / "flash_ops.abi3.so").write_bytes(b"")
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = inventory()
    assert found.sglang_fa3 and found.flashinfer and not found.flashinfer_precompiled
    assert "sgl_kernel" not in sys.modules and "flashinfer" not in sys.modules
    (kernel / "flash_ops.abi3.so").unlink()
    assert not inventory().sglang_fa3


def test_server_args_take_the_choice_and_the_user_override(tmp_path, caplog):
    fields = frozenset({"model_path", "attention_backend", "sampling_backend"})
    layout = plan_engine_layout(0, 1, 1, 1, 1)
    bundle = KernelInventory(HOPPER, sglang_fa3=False, flashinfer=True)
    with caplog.at_level(logging.WARNING, logger="verlx.rollout.sglang_adapter"):
        args = build_server_args(make_ctx(str(tmp_path)), layout, fields, base_gpu_id=0, dist_init_addr=None,
                                 weights_cpu_backup=True, kernels=bundle)
    assert (args["attention_backend"], args["sampling_backend"]) == ("triton", "pytorch")
    assert "engine_kwargs.sglang.<key> to override" in caplog.text
    ctx = make_ctx(str(tmp_path), engine_kwargs=EngineKwargs(sglang={"attention_backend": "fa3"}))
    args = build_server_args(ctx, layout, fields, base_gpu_id=0, dist_init_addr=None, weights_cpu_backup=True,
                             kernels=bundle)
    assert (args["attention_backend"], args["sampling_backend"]) == ("fa3", "pytorch")


def test_server_args_give_a_vision_language_model_a_vision_backend(tmp_path):
    from transformers import Qwen2VLConfig

    fields = frozenset({"model_path", "attention_backend", "sampling_backend", "mm_attention_backend"})
    bundle = KernelInventory(HOPPER, sglang_fa3=False, flashinfer=True)
    ctx = dataclasses.replace(make_ctx(str(tmp_path)), hf_config=Qwen2VLConfig())
    args = build_server_args(ctx, plan_engine_layout(0, 1, 1, 1, 1), fields, base_gpu_id=0, dist_init_addr=None,
                             weights_cpu_backup=True, kernels=bundle)
    assert args["mm_attention_backend"] == "triton_attn"


def test_llm_args_take_the_choice_only_where_the_release_has_the_argument(tmp_path):
    layout = plan_engine_layout(0, 1, 1, 1, 1)
    no_fa2 = KernelInventory(ADA, vllm_fa2=False)
    args = build_llm_args(make_ctx(str(tmp_path)), layout, ["attention_backend"], no_fa2)
    assert args["attention_backend"] == "TRITON_ATTN"
    assert "attention_backend" not in build_llm_args(make_ctx(str(tmp_path)), layout, [], no_fa2)

