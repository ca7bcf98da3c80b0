"""FLOPs for MFU against hand-computed numbers, and the device peak table."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from verlx.utils.flops import dense_decoder_flops, device_peak_tflops, estimate_flops
from verlx.utils.registry import UnknownNameError


def test_tiny_config_by_hand():
    cfg = Qwen2Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                      num_hidden_layers=2, vocab_size=10)
    # head_dim 4: q and o are 8 wide, k and v 4 → attention params 8·(8+4+4+8) = 192; MLP 3·8·16 = 384
    # dense params (192 + 384)·2 layers + 2·10·8 (embedding + lm_head) = 1152 + 160 = 1312
    # dense FLOPs 6·1312·(3+5) = 62976; attention 6·2 layers·2 heads·4·(3² + 5²) = 96·34 = 3264
    assert dense_decoder_flops(cfg, [3, 5]) == 62976 + 3264
    achieved, peak = estimate_flops(cfg, [3, 5], seconds=2.0, device_name="CPU")
    assert achieved == pytest.approx((62976 + 3264) / 2.0 / 1e12, rel=1e-12) and peak is None


def test_qwen25_05b_shape_by_hand():
    cfg = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                      num_hidden_layers=24, vocab_size=151936, tie_word_embeddings=True)
    # head_dim 64: attention 896·(2·896 + 2·128) = 1,835,008; MLP 3·896·4864 = 13,074,432
    # dense params 24·14,909,440 + 2·151936·896 = 357,826,560 + 272,269,312 = 630,095,872
    # one 1024-token sequence: 6·630,095,872·1024 = 3,871,309,037,568; attention 6·24·14·64·1024² = 135,291,469,824
    flops = dense_decoder_flops(cfg, [1024])
    assert flops == 3_871_309_037_568 + 135_291_469_824
    achieved, peak = estimate_flops(cfg, [1024], seconds=0.5, device_name="NVIDIA H100 80GB HBM3")
    assert achieved == pytest.approx(flops / 0.5 / 1e12) and peak == 989.0


def test_explicit_head_dim_and_families():
    # Qwen3 sets head_dim independently of hidden / heads: 4 heads of 16 on hidden 32
    qwen3 = Qwen3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=64, num_hidden_layers=1, vocab_size=5)
    # attention 32·(2·64 + 2·32) = 6144; MLP 3·32·64 = 6144; + 2·5·32 = 320 → 12608 params
    # 6·12608·2 tokens = 151296; attention 6·1·4·16·(2²) = 1536
    assert dense_decoder_flops(qwen3, [2]) == 151296 + 1536
    for cls in (LlamaConfig, MistralConfig):
        cfg = cls(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                  num_hidden_layers=2, vocab_size=10)
        assert estimate_flops(cfg, [3, 5], 1.0, "CPU")[0] == pytest.approx((62976 + 3264) / 1e12)


def test_unknown_model_type_and_bad_time():
    from transformers import GPT2Config

    with pytest.raises(UnknownNameError, match="unknown FLOPs estimator .* 'gpt2'.*registered: llama, mistral"):
        estimate_flops(GPT2Config(), [4], 1.0)
    with pytest.raises(ValueError, match="seconds must be positive"):
        estimate_flops(Qwen2Config(), [4], 0.0)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L40S", 362.0),
    ("NVIDIA L40", 181.0),
    ("CPU", None),
    ("NVIDIA GeForce GTX 1080", None),
])
def test_device_peaks(name, peak):
    assert device_peak_tflops(name) == peak


def test_peak_from_the_environment(monkeypatch):
    """VERLX_PEAK_TFLOPS answers for any device (unlisted GPUs, CPU); a non-number is named."""
    monkeypatch.setenv("VERLX_PEAK_TFLOPS", "120.5")
    assert device_peak_tflops("NVIDIA GeForce GTX 1080") == 120.5 and device_peak_tflops("CPU") == 120.5
    monkeypatch.setenv("VERLX_PEAK_TFLOPS", "fast")
    with pytest.raises(ValueError, match="VERLX_PEAK_TFLOPS='fast' is not a number of TFLOP/s"):
        device_peak_tflops("CPU")
