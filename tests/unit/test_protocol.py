"""DataProto: round trips are exact, conflicts raise, Ray-style pickling keeps tensors as buffers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from verlx.protocol import DataProto


def make(n: int, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return DataProto(
        {
            "ids": torch.randint(0, 100, (n, 7), generator=g),
            "mask": torch.rand(n, 7, generator=g) > 0.3,
            "bf": torch.randn(n, 3, generator=g).to(torch.bfloat16),
        },
        {"uid": [f"u{i}" for i in range(n)], "gt": [{"ground_truth": str(i), "list": [i, i]} for i in range(n)]},
        {"temperature": 0.7},
    )


def assert_same(a: DataProto, b: DataProto):
    assert set(a.batch) == set(b.batch) and set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for k in a.batch:
        assert a.batch[k].dtype == b.batch[k].dtype and torch.equal(a.batch[k], b.batch[k]), k
    for k in a.non_tensor_batch:
        assert list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k]), k
    assert a.meta_info == b.meta_info


@pytest.mark.parametrize("n,k", [(12, 1), (12, 3), (12, 4), (12, 12), (7, 7)])
def test_chunk_concat_round_trip(n, k):
    data = make(n)
    parts = data.chunk(k)
    assert [len(p) for p in parts] == [n // k] * k
    assert_same(DataProto.concat(parts), data)


@pytest.mark.parametrize("n,d", [(10, 4), (3, 8), (8, 8), (1, 3)])
def test_pad_chunk_concat_unpad_round_trip(n, d):
    data = make(n, seed=n)
    padded, pad = data.pad_to_divisor(d)
    assert len(padded) % d == 0 and pad == (-n) % d
    assert_same(DataProto.concat(padded.chunk(d)).unpad(pad), data)


def test_chunk_that_does_not_divide_says_what_to_do():
    with pytest.raises(ValueError, match="pad_to_divisor"):
        make(10).chunk(4)


def test_split_keeps_order_and_remainder():
    data = make(10)
    parts = data.split(4)
    assert [len(p) for p in parts] == [4, 4, 2]
    assert_same(DataProto.concat(parts), data)


@pytest.mark.parametrize("interleave", [True, False])
def test_repeat_then_index_recovers_original(interleave):
    data = make(5)
    rep = data.repeat(3, interleave=interleave)
    assert len(rep) == 15
    if interleave:
        assert list(rep.non_tensor_batch["uid"][:6]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
        originals = rep[np.arange(0, 15, 3)]
    else:
        assert list(rep.non_tensor_batch["uid"][:6]) == ["u0", "u1", "u2", "u3", "u4", "u0"]
        originals = rep[slice(0, 5)]
    assert_same(originals, data)


def test_int_index_returns_row_with_python_values():
    row = make(4)[2]
    assert row.non_tensor_batch["uid"] == "u2"
    assert row.non_tensor_batch["gt"]["list"] == [2, 2]
    assert row.batch["ids"].shape == (7,)


def test_boolean_and_tensor_index():
    data = make(6)
    keep = torch.tensor([True, False, True, False, False, True])
    sub = data[keep]
    assert list(sub.non_tensor_batch["uid"]) == ["u0", "u2", "u5"]
    assert_same(sub, data[torch.tensor([0, 2, 5])])
    with pytest.raises(IndexError):
        data[torch.tensor([6])]


def test_select_and_pop():
    data = make(3)
    sel = data.select(["ids"], ["uid"], [])
    assert list(sel.batch) == ["ids"] and list(sel.non_tensor_batch) == ["uid"] and sel.meta_info == {}
    popped = data.pop(["mask"], ["gt"], ["temperature"])
    assert "mask" not in data.batch and "gt" not in data.non_tensor_batch and "temperature" not in data.meta_info
    assert list(popped.batch) == ["mask"]
    with pytest.raises(KeyError, match="no batch key"):
        data.select(["nope"])


def test_union_merges_and_conflicts_raise():
    a = make(4)
    b = DataProto({"new": torch.ones(4), "ids": a.batch["ids"].clone()}, {"uid": list(a.non_tensor_batch["uid"])})
    a.union(b)
    assert "new" in a.batch
    with pytest.raises(ValueError, match="batch key 'ids' differs"):
        a.union(DataProto({"ids": torch.zeros(4, 7, dtype=torch.long)}))
    with pytest.raises(ValueError, match="non_tensor_batch key 'uid' differs"):
        a.union(DataProto(non_tensor_batch={"uid": ["x"] * 4}))
    with pytest.raises(ValueError, match="meta_info key 'temperature'"):
        a.union(DataProto(meta_info={"temperature": 1.0}))
    with pytest.raises(ValueError, match="4 and 3 rows"):
        a.union(make(3))


def test_union_compares_rows_of_tensor_dicts_by_value_after_a_round_trip():
    """A vision-language row's multi_modal_inputs ({pixel_values, image_grid_thw}) comes back from a worker as new
    objects holding equal tensors (REMAX's greedy baseline unions such a batch with the sampled one)."""
    pixels = torch.arange(12.0).reshape(3, 4)
    rows = np.array([{"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, 2, 2]])}, {}], dtype=object)
    a = DataProto(non_tensor_batch={"multi_modal_inputs": rows})
    a.union(pickle.loads(pickle.dumps(DataProto(non_tensor_batch={"multi_modal_inputs": rows}))))
    changed = pickle.loads(pickle.dumps(rows))
    changed[0]["pixel_values"][1, 2] = -1.0
    with pytest.raises(ValueError, match="non_tensor_batch key 'multi_modal_inputs' differs"):
        a.union(DataProto(non_tensor_batch={"multi_modal_inputs": changed}))
    nested = np.array([[torch.ones(2), (1, 2)], [torch.ones(2), (1, 2)]] + [None], dtype=object)[:2]
    b = DataProto(non_tensor_batch={"n": nested})
    b.union(pickle.loads(pickle.dumps(DataProto(non_tensor_batch={"n": nested}))))
    with pytest.raises(ValueError, match="key 'n' differs"):
        b.union(DataProto(non_tensor_batch={"n": np.array([[torch.ones(2), [1, 2]], [torch.ones(2), (1, 2)]] + [None],
                                                           dtype=object)[:2]}))


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="disagree on the number of rows"):
        DataProto({"a": torch.zeros(3)}, {"b": ["x", "y"]})


def test_pickle_round_trip_including_bfloat16():
    data = make(6)
    restored = pickle.loads(pickle.dumps(data, protocol=5))
    assert_same(restored, data)


def test_pickle_ships_tensors_as_out_of_band_buffers():
    data = DataProto({"big": torch.zeros(1000, 1000)})
    buffers = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    assert len(payload) < 10_000  # the 4 MB tensor is not inside the pickle stream
    assert sum(memoryview(b).nbytes for b in buffers) == 4_000_000
    restored = pickle.loads(payload, buffers=buffers)
    restored.batch["big"] += 1  # writable after a round trip
    assert float(restored.batch["big"].sum()) == 1e6


def test_save_load_round_trip(tmp_path):
    data = make(5)
    path = tmp_path / "sub" / "batch.pt"
    data.save(path)
    assert_same(DataProto.load(path), data)
    assert [p.name for p in path.parent.iterdir()] == ["batch.pt"]  # no temp file left behind


def test_to_device_keeps_values():
    data = make(2)
    moved = data.to("cpu")
    assert_same(moved, data)


def test_concat_rejects_different_keys():
    with pytest.raises(ValueError, match="part 1 has keys"):
        DataProto.concat([make(2), make(2).select(["ids"])])
