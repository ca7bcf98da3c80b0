"""StatefulSampler and PromptDataLoader: seeded epochs, exact resume (also across epoch boundaries)."""

from __future__ import annotations

import pytest

from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.run import DataConfig
from verlx.data import (
    PromptDataLoader,
    RLHFDataset,
    StatefulSampler,
    build_train_dataloader,
    build_val_dataloader,
    write_parquet_atomic,
)
from verlx.protocol import DataProto


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"{i}+1=?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(10)
    ]
    path = write_parquet_atomic(rows, tmp_path_factory.mktemp("d") / "train.parquet")
    return RLHFDataset(path, build_tiny_tokenizer(), DataConfig(max_prompt_length=32))


def ids(batch: DataProto) -> list[int]:
    return [int(i) for i in batch.non_tensor_batch["index"]]


def test_sampler_epochs_are_seeded_permutations():
    s = StatefulSampler(10, shuffle=True, seed=5)
    e0, e1 = s.order(0).tolist(), s.order(1).tolist()
    assert sorted(e0) == sorted(e1) == list(range(10))
    assert e0 != e1  # seed + epoch
    assert StatefulSampler(10, True, 5).order(1).tolist() == e1
    assert StatefulSampler(10, True, 6).order(0).tolist() != e0
    assert StatefulSampler(10, shuffle=False).order(3).tolist() == list(range(10))


def test_loader_epoch_drop_last_and_len(dataset):
    loader = PromptDataLoader(dataset, 3, StatefulSampler(10, shuffle=True, seed=1))
    assert len(loader) == 3  # 10 // 3, the last row of each epoch is dropped
    batches = [ids(b) for b in loader]
    order = StatefulSampler(10, True, 1).order(0).tolist()
    assert batches == [order[0:3], order[3:6], order[6:9]]
    assert loader.epoch == 1 and loader.state_dict()["sampler"]["position"] == 0
    second = [ids(b) for b in loader]
    order1 = StatefulSampler(10, True, 1).order(1).tolist()
    assert second == [order1[0:3], order1[3:6], order1[6:9]]
    assert isinstance(next(iter(loader)), DataProto)


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 5, 6])
def test_resume_continues_with_exactly_the_next_batch(dataset, stop_after):
    """Save after `stop_after` batches (3 is the end of epoch 0, 6 the end of epoch 1), resume in a new loader."""
    reference = build_train_dataloader(dataset, 3, shuffle=True, seed=7)
    expected = [ids(b) for _ in range(3) for b in reference]  # 3 epochs, 9 batches

    first = build_train_dataloader(dataset, 3, shuffle=True, seed=7)
    seen, state = [], None
    while len(seen) < stop_after:
        for b in first:
            seen.append(ids(b))
            if len(seen) == stop_after:
                state = first.state_dict()
                break
    resumed = build_train_dataloader(dataset, 3, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    assert resumed.epoch == stop_after // 3
    rest = []
    while len(seen) + len(rest) < 9:
        before = len(rest)
        rest.extend(ids(b) for b in resumed)
        assert len(rest) > before, "an epoch loop must never yield 0 steps"
    assert seen + rest == expected


def test_val_loader_covers_every_row_each_time(dataset):
    loader = build_val_dataloader(dataset, batch_size=4)
    assert len(loader) == 3
    for _ in range(2):
        assert [ids(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    whole = build_val_dataloader(dataset, batch_size=None)
    assert [ids(b) for b in whole] == [list(range(10))]


def test_loader_errors(dataset):
    with pytest.raises(ValueError, match="fewer than one batch of 11 \\(data.train_batch_size\\)"):
        PromptDataLoader(dataset, 11, StatefulSampler(10))
    with pytest.raises(ValueError, match="the sampler has 7 rows \\(the dataset 10\\), fewer than one batch of 8 "
                       "\\(data.gen_batch_size\\)"):
        PromptDataLoader(dataset, 8, StatefulSampler(7), batch_key="data.gen_batch_size")
    # an epoch is one pass of the sampler (a data.sampler may be shorter or longer than the dataset)
    assert len(PromptDataLoader(dataset, 2, StatefulSampler(9))) == 4


def test_resume_with_another_batch_size_still_moves_on(dataset):
    loader = build_train_dataloader(dataset, 3, shuffle=False, seed=0)
    it = iter(loader)
    next(it), next(it), next(it)  # 9 rows: epoch 1 starts
    state = loader.state_dict()
    state["sampler"].update(epoch=0, position=8)  # as if saved mid-epoch by a run with batch size 4
    bigger = build_train_dataloader(dataset, 4, shuffle=False, seed=0)
    bigger.load_state_dict(state)
    # rows 8..9 cannot make a batch of 4, so epoch 0 is over: the loop runs epoch 1 rather than 0 steps
    assert [ids(b) for b in bigger] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert bigger.epoch == 2
