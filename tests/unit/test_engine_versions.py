"""Supported SGLang / vLLM release ranges and the release-dependent SGLang behaviour."""

from __future__ import annotations

import pytest
from packaging.version import Version

from verlx.rollout.engine_versions import UnsupportedEngineVersion, at_least, check_engine_version, installed_version
from verlx.rollout.sglang_adapter import SGLangFeatures


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23", "0.5.23.post1", "0.5.21rc0", "0.5.20+cu128"])
def test_sglang_accepted(version):
    assert check_engine_version("sglang", version) == Version(version)


@pytest.mark.parametrize("version", ["0.5.8", "0.4.10", "0.6", "0.6.0", "0.6.0rc1", "1.0.0"])
def test_sglang_refused_with_range_and_reason(version):
    with pytest.raises(UnsupportedEngineVersion) as info:
        check_engine_version("sglang", version)
    text = str(info.value)
    assert f"sglang {version} is not supported" in text
    assert "supported: sglang>=0.5.9,<0.6" in text and "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK" in text
    assert "pip install 'verlx[sglang]'" in text


@pytest.mark.parametrize("version", ["0.11", "0.11.0", "0.20.1", "0.33.0", "0.33.0+cu128"])
def test_vllm_accepted(version):
    check_engine_version("vllm", version)


@pytest.mark.parametrize("version", ["0.10.2", "0.8.5", "0.34.0", "1.0"])
def test_vllm_refused(version):
    with pytest.raises(UnsupportedEngineVersion, match=r"supported: vllm>=0\.11\.0,<0\.34.*processed_logprobs"):
        check_engine_version("vllm", version)


def test_unparsable_and_missing():
    with pytest.raises(UnsupportedEngineVersion, match="cannot parse the installed sglang version 'banana'"):
        check_engine_version("sglang", "banana")
    with pytest.raises(RuntimeError, match=r"'vllm' package is not installed; install it with: pip install 'verlx"):
        installed_version("vllm")


def test_release_comparison_ignores_tags():
    assert at_least(Version("0.5.21.post2"), "0.5.21")
    assert at_least(Version("0.5.21rc0"), "0.5.21")
    assert not at_least(Version("0.5.20.post9"), "0.5.21")


@pytest.mark.parametrize(
    "version,msgspec,session", [("0.5.9", False, False), ("0.5.19", False, False), ("0.5.20", True, False),
                                ("0.5.21", True, True), ("0.5.23", True, True)]
)
def test_sglang_feature_gates(version, msgspec, session):
    features = SGLangFeatures(Version(version))
    assert (features.msgspec_server_args, features.weight_update_session) == (msgspec, session)
    assert features.construction_env()["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] == "false"
