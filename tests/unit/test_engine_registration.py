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


def test_the_registry_names_engines_without_importing_their_modules():
    code = (
        "import sys; from verlx.rollout.base import ROLLOUT_ENGINES; names = ROLLOUT_ENGINES.names(); "
        "loaded = [m for m in sys.modules if m.startswith('verlx.rollout.') and m.endswith(('_engine', 'engine'))]; "
        "print(names, loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['hf', 'native', 'sglang', 'vllm'] []"


def test_registered_with_install_commands_for_the_users_torch():
    from verlx.rollout.engine_versions import install_command

    assert ROLLOUT_ENGINES.get("sglang") is SGLangRolloutEngine
    assert ROLLOUT_ENGINES.get("vllm") is VLLMRolloutEngine
    assert (SGLangRolloutEngine.requires_package, VLLMRolloutEngine.requires_package) == ("sglang", "vllm")
    assert install_command("sglang", "2.11.0+cu130").startswith("pip install 'sglang>=0.5.14,<0.5.19'")
    assert install_command("vllm", "2.11.0").startswith("pip install 'vllm>=0.20,<0.27'")
    assert install_command("sglang", "2.14.1+cu128").startswith("pip install 'sglang==0.5.23'")
    assert install_command("vllm", "2.14.0").startswith("pip install 'vllm==0.33.0'")
    other = install_command("vllm", "2.13.0+cpu")
    assert other.startswith("pip install 'verlx[vllm]'") and "pins your torch 2.13.0" in other
    assert "separate environment" in other


def test_a_release_in_range_but_never_run_here_warns_once_naming_the_tested_ones(caplog):
    from verlx.rollout import engine_versions

    engine_versions._warned_untested.discard("vllm")
    with caplog.at_level("WARNING"):
        engine_versions.check_engine_version("vllm", "0.30.1")
        engine_versions.check_engine_version("vllm", "0.30.1")
        engine_versions.check_engine_version("vllm", "0.26.0")
    warnings = [r.message for r in caplog.records if "not among the releases run inside verlx" in r.message]
    assert len(warnings) == 1 and "vllm 0.30.1" in warnings[0] and "(0.26.0)" in warnings[0]


def test_a_user_engine_class_by_path():
    from verlx.rollout.base import resolve_engine_name

    assert resolve_engine_name("verlx.rollout.hf_engine:HFEngine") == "verlx.rollout.hf_engine:HFEngine"
    with pytest.raises(TypeError, match="is not a RolloutEngine subclass"):
        resolve_engine_name("verlx.protocol:DataProto")
    with pytest.raises(ValueError, match="cannot import Nope from verlx.protocol"):
        resolve_engine_name("verlx.protocol:Nope")


def test_unknown_engine_lists_the_registered_ones():
    with pytest.raises(UnknownNameError) as info:
        ROLLOUT_ENGINES.get("sglangg")
    assert "actor_rollout_ref.rollout.name" in str(info.value) and "sglang, vllm" in str(info.value)
    assert "Did you mean 'sglang'?" in str(info.value)


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_choosing_an_uninstalled_engine_fails_with_the_install_command(name):
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    from verlx.rollout.base import resolve_engine_name

    with pytest.raises(RuntimeError, match=rf"needs the '{name}' package.*Install it with: pip install '"):
        resolve_engine_name(name)


def test_an_unsupported_release_fails_before_ray_and_auto_skips_it(tmp_path):
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


def test_auto_for_a_vision_language_model_takes_an_engine_with_image_input(tmp_path):
    """A vision-language run (main_ppo asks for supports_image_input, and supports_server_image_input in server
    mode): auto takes vLLM in process, but not for server mode (its server takes no images), where it falls back to
    hf when SGLang is not installed."""
    from engine_fakes.fake_vllm import install_fake_vllm
    from verlx.rollout.base import resolve_engine_name

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    state = install_fake_vllm("0.26.0", str(tmp_path))
    try:
        assert resolve_engine_name("auto", ("supports_image_input",)) == "vllm"
        assert resolve_engine_name("auto", ("supports_image_input", "supports_server_image_input")) == "hf"
    finally:
        state.undo()
