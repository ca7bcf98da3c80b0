"""Weight sync helpers: HF names, dtype, tied embeddings, DTensor gathering, buckets, statuses, checkpoint names."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from verlx.rollout.weight_sync import (
    WeightSyncError,
    bucket_bytes_of,
    check_update_status,
    engine_dtype,
    expected_push_names,
    iter_buckets,
    iter_engine_weights,
    update_status,
)
from verlx.utils.distributed import free_port


def test_engine_weights_names_dtype_and_tied_head():
    named = [
        ("model._orig_mod.embed_tokens.weight", torch.ones(2, 2)),
        ("model.layers.0._checkpoint_wrapped_module.mlp._fsdp_wrapped_module.up_proj.weight", torch.full((2,), 0.5)),
        ("model.step", torch.tensor([3])),
        ("lm_head.weight", torch.ones(2, 2)),
    ]
    out = list(iter_engine_weights(named, torch.bfloat16, tie_word_embeddings=True))
    assert [n for n, _ in out] == ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.step"]
    assert [t.dtype for _, t in out] == [torch.bfloat16, torch.bfloat16, torch.int64]
    untied = list(iter_engine_weights(named, None, tie_word_embeddings=False))
    assert untied[-1][0] == "lm_head.weight" and untied[0][1].dtype == torch.float32


def test_sharded_parameters_are_gathered():
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        sharded = distribute_tensor(full, DeviceMesh("cpu", [0]), [Shard(0)])
        [(name, tensor)] = list(iter_engine_weights([("w", sharded)], torch.float16, False))
        assert name == "w" and type(tensor) is torch.Tensor and torch.equal(tensor, full.half())
    finally:
        dist.destroy_process_group()


def test_buckets_respect_the_byte_budget():
    # fp32 sizes in bytes: 40, 40, 80, 200, 4 with a 100-byte budget -> [40+40], [80], [200 alone], [4]
    sizes = [10, 10, 20, 50, 1]
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate(sizes)]
    buckets = [[name for name, _ in b] for b in iter_buckets(named, 100)]
    assert buckets == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]
    with pytest.raises(ValueError, match="bucket size must be positive"):
        list(iter_buckets(named, 0))


def test_bucket_megabytes_and_dtype_names():
    assert bucket_bytes_of(SimpleNamespace(update_weights_bucket_megabytes=512)) == 512 * 1024 * 1024
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes=0 must be positive"):
        bucket_bytes_of(SimpleNamespace(update_weights_bucket_megabytes=0))
    assert engine_dtype("bf16") is torch.bfloat16 and engine_dtype("float32") is torch.float32
    with pytest.raises(ValueError, match="rollout.dtype='int8'"):
        engine_dtype("int8")


@pytest.mark.parametrize(
    "result,expected",
    [
        ((True, "Success"), (True, "Success")),
        ((False, "bad shape"), (False, "bad shape")),
        ({"success": False, "message": "busy"}, (False, "busy")),
        (SimpleNamespace(success=True), (True, "")),
        (False, (False, "")),
        (None, None),
    ],
)
def test_status_shapes(result, expected):
    assert update_status(result) == expected


def test_failed_status_raises_with_engine_names_and_message():
    names = [f"layer{i}.weight" for i in range(10)]
    with pytest.raises(WeightSyncError) as info:
        check_update_status((False, "Failed to update weights: shape mismatch"), "sglang", names)
    err = info.value
    assert str(err) == (
        "sglang rejected the weight update of [layer0.weight, layer1.weight, layer2.weight, layer3.weight, "
        "layer4.weight, layer5.weight, layer6.weight, layer7.weight, ... (10 in all)]: Failed to update weights: "
        "shape mismatch"
    )
    copy = pickle.loads(pickle.dumps(err))
    message = "Failed to update weights: shape mismatch"
    assert (copy.engine, copy.names, copy.engine_message) == ("sglang", names, message)
    with pytest.raises(WeightSyncError, match="returned no status"):
        check_update_status(None, "sglang", ["a"])
    check_update_status(None, "sglang", ["a"], required=False)
    with pytest.raises(TypeError, match="unrecognised engine status"):
        update_status("ok")


def test_expected_push_names_from_checkpoints(tmp_path):
    single = tmp_path / "single"
    single.mkdir()
    save_file({"a.weight": torch.zeros(1), "lm_head.weight": torch.zeros(1), "rotary_emb.inv_freq": torch.zeros(1)},
              str(single / "model.safetensors"))
    assert expected_push_names(str(single), tie_word_embeddings=False) == {"a.weight", "lm_head.weight"}
    assert expected_push_names(str(single), tie_word_embeddings=True) == {"a.weight"}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x.weight": "model-00001.safetensors", "y.weight": "model-00002.safetensors"}})
    )
    assert expected_push_names(str(sharded), False) == {"x.weight", "y.weight"}
    assert expected_push_names(str(tmp_path), False) is None
