"""The sglang / vllm engines are registered, import their packages lazily, and say how to install them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from verlx.rollout.base import ROLLOUT_ENGINES
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.rollout.vllm_engine import VLLMRolloutEngine
from verlx.utils.registry import UnknownNameError


def test_importing_the_adapters_imports_neither_package():
    code = (
        "import sys, verlx, verlx.rollout.sglang_engine, verlx.rollout.vllm_engine; "
        "print(sorted(m for m in ('sglang', 'vllm', 'msgspec') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registered_with_install_hints():
    assert ROLLOUT_ENGINES.get("sglang") is SGLangRolloutEngine
    assert ROLLOUT_ENGINES.get("vllm") is VLLMRolloutEngine
    assert (SGLangRolloutEngine.requires_package, VLLMRolloutEngine.requires_package) == ("sglang", "vllm")
    assert "pip install 'verlx[sglang]'" in SGLangRolloutEngine.install_hint
    assert "pip install 'verlx[vllm]'" in VLLMRolloutEngine.install_hint


def test_unknown_engine_lists_the_registered_ones():
    with pytest.raises(UnknownNameError) as info:
        ROLLOUT_ENGINES.get("sglangg")
    assert "actor_rollout_ref.rollout.name" in str(info.value) and "sglang, vllm" in str(info.value)
    assert "Did you mean 'sglang'?" in str(info.value)


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_choosing_an_uninstalled_engine_fails_with_the_install_command(name):
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    pytest.importorskip("verlx.rollout.hf_engine", reason="resolve_engine_name imports every built-in engine")
    from verlx.rollout.base import resolve_engine_name

    with pytest.raises(RuntimeError, match=rf"needs the '{name}' package.*pip install 'verlx\[{name}\]'"):
        resolve_engine_name(name)


def test_an_unsupported_release_fails_before_ray_and_auto_skips_it(tmp_path):
    pytest.importorskip("verlx.rollout.hf_engine", reason="resolve_engine_name imports every built-in engine")
    from engine_fakes.fake_sglang import install_fake_sglang
    from verlx.rollout.base import resolve_engine_name
    from verlx.rollout.engine_versions import UnsupportedEngineVersion

    state = install_fake_sglang("0.6.1", str(tmp_path))
    try:
        with pytest.raises(UnsupportedEngineVersion, match=r"sglang 0\.6\.1 is not supported"):
            resolve_engine_name("sglang")
        assert resolve_engine_name("auto") != "sglang"
    finally:
        state.undo()
    state = install_fake_sglang("0.5.23", str(tmp_path / "ok"))
    try:
        assert resolve_engine_name("sglang") == "sglang" == resolve_engine_name("auto")
    finally:
        state.undo()
