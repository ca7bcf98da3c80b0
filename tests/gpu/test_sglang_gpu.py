"""SGLang on a GPU (skipped where sglang is not installed): generate → sleep → push → wake → generate."""

from __future__ import annotations

import pytest

from engine_fakes.constant_model import run_cycle

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_weights_pushed_while_asleep_take_effect(tmp_path, sleep_level):
    pytest.importorskip("sglang", reason="sglang not installed")
    from verlx.rollout.sglang_engine import SGLangRolloutEngine

    run_cycle(SGLangRolloutEngine, tmp_path, {"sleep_level": sleep_level})
