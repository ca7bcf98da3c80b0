"""Attention and sampling kernels for the external engines: their defaults assume kernels that may be missing.

SGLang picks FA3 attention on Hopper and flashinfer sampling whenever the flashinfer package is importable; vLLM
picks FlashAttention (FA3 on Hopper, FA2 elsewhere). A lean install (the GPU machine's bundle drops sgl-kernel's
1 GB FA3 library and vLLM's FA2 one) or a GPU those kernels do not support then fails deep inside the engine, or
spends minutes JIT-compiling flashinfer. Here the installed files and the GPU's compute capability decide a
backend that runs; the choice is logged with its reason, and `engine_kwargs` still overrides it.

Detection reads package directories only (no import of the engine or its CUDA libraries), so it is cheap and
testable without a GPU.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelInventory:
    """What is installed and what the GPU is."""

    capability: tuple[int, int] | None  # (major, minor); None without a CUDA GPU
    sglang_fa3: bool = False  # sgl_kernel's flash_ops library (FA3, sm80-sm90)
    flashinfer: bool = False
    flashinfer_precompiled: bool = False  # flashinfer-jit-cache / flashinfer-cubin: no JIT at first use
    vllm_fa2: bool = False
    vllm_fa3: bool = False


@dataclass
class BackendChoice:
    """Engine arguments to add, each with the reason that is logged."""

    args: dict[str, str] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def choose(self, key: str, value: str, reason: str) -> None:
        self.args[key] = value
        self.reasons.append(f"{key}={value} ({reason})")


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _has_library(package: str, stem: str) -> bool:
    directory = _package_dir(package)
    return directory is not None and bool(glob.glob(os.path.join(directory, f"{stem}*.so")))


def _gpu_capability() -> tuple[int, int] | None:
    import torch

    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def inventory() -> KernelInventory:
    return KernelInventory(
        capability=_gpu_capability(),
        sglang_fa3=_has_library("sgl_kernel", "flash_ops"),
        flashinfer=_package_dir("flashinfer") is not None,
        flashinfer_precompiled=any(_package_dir(p) for p in ("flashinfer_jit_cache", "flashinfer_cubin")),
        vllm_fa2=_has_library("vllm.vllm_flash_attn", "_vllm_fa2_C"),
        vllm_fa3=_has_library("vllm.vllm_flash_attn", "_vllm_fa3_C"),
    )


def _arch(capability: tuple[int, int] | None) -> str:
    return "no GPU" if capability is None else f"sm{capability[0]}{capability[1]}"


def sglang_backends(inv: KernelInventory, user_args: dict, vision: bool = False) -> BackendChoice:
    """attention_backend / sampling_backend for sglang.Engine (and mm_attention_backend for a vision-language
    model's vision tower), unless the user set them."""
    choice = BackendChoice()
    major = inv.capability[0] if inv.capability else None
    jit_only = inv.flashinfer and not inv.flashinfer_precompiled
    fa3_missing = f"{_arch(inv.capability)}: SGLang's default FA3 needs sgl_kernel's flash_ops library, which is " \
                  "not installed"
    if "attention_backend" not in user_args:
        if major == 9 and not inv.sglang_fa3:
            choice.choose("attention_backend", "triton", fa3_missing)
        elif major is not None and major not in (9, 10) and jit_only:
            choice.choose("attention_backend", "triton",
                          f"{_arch(inv.capability)}: SGLang's default there, flashinfer, has no precompiled kernels "
                          "here and would JIT-compile them at start-up")
    if "sampling_backend" not in user_args and jit_only:
        choice.choose("sampling_backend", "pytorch",
                      "flashinfer has no precompiled kernels here (flashinfer-jit-cache / flashinfer-cubin not "
                      "installed) and would JIT-compile its sampling kernels")
    if vision and "mm_attention_backend" not in user_args and major == 9 and not inv.sglang_fa3:
        choice.choose("mm_attention_backend", "triton_attn", f"the vision tower's attention; {fa3_missing}")
    return choice


def vllm_backends(inv: KernelInventory, user_args: dict) -> BackendChoice:
    """attention_backend for vllm.LLM, unless the user set it (or an attention_config)."""
    choice = BackendChoice()
    if "attention_backend" in user_args or "attention_config" in user_args or inv.capability is None:
        return choice
    major = inv.capability[0]
    fa_available = inv.vllm_fa3 if major == 9 else inv.vllm_fa2
    if not fa_available:
        library = "FA3" if major == 9 else "FA2"
        choice.choose("attention_backend", "TRITON_ATTN",
                      f"{_arch(inv.capability)}: vLLM's FlashAttention backend needs its {library} library "
                      "(vllm_flash_attn), which is not installed")
    return choice
