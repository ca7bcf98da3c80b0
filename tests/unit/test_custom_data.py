"""veRL's data keys: data.gen_batch_size (the loader's round), data.custom_cls (a Dataset class from a user file,
built with veRL's constructor arguments) and data.sampler (a curriculum sampler whose update(batch) follows each
step, resumed as torchdata's StatefulDataLoader resumes it), checked against verlx's own dataset and by hand."""

from __future__ import annotations

import textwrap

import pytest
import torch

from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.loader import ConfigError, DataError
from verlx.config.schema import PPOConfig
from verlx.data import RLHFDataset, build_dataloaders, write_parquet_atomic
from verlx.protocol import DataProto
from verlx.trainer.preflight import validate

ROWS = 10


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{i}+1=?" + "?" * (i % 3)}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(ROWS)]
    return str(write_parquet_atomic(rows, tmp_path_factory.mktemp("d") / "train.parquet"))


def _config(train_file, **data) -> PPOConfig:
    config = PPOConfig()
    config.data.train_files, config.data.val_files = train_file, None
    config.data.max_prompt_length, config.data.shuffle = 32, False
    for key, value in data.items():
        setattr(config.data, key, value)
    return config


def _write(tmp_path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def rows(batch: DataProto) -> list[int]:
    return [int(i) for i in batch.non_tensor_batch["index"]]


def test_gen_batch_size_is_the_loaders_round(train_file):
    config = _config(train_file, train_batch_size=2, gen_batch_size=4)
    loader, _ = build_dataloaders(config, build_tiny_tokenizer())
    assert loader.batch_size == 4 and len(loader) == ROWS // 4
    assert [rows(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_gen_batch_size_checks():
    config = PPOConfig()
    config.data.train_batch_size, config.data.gen_batch_size = 8, 24
    config.trainer.n_gpus_per_node, config.actor_rollout_ref.rollout.n = 8, 2
    with pytest.raises(ConfigError, match=r"data.gen_batch_size=24 differs from data.train_batch_size=8 without "
                       r"algorithm.filter_groups.enable=true"):
        validate(config, check_files=False)
    config.algorithm.filter_groups.enable = True
    config.data.gen_batch_size = 3  # 3 × 2 samples over 8 workers
    with pytest.raises(ConfigError, match=r"data.gen_batch_size × rollout.n = 3×2 = 6 samples per generation round"):
        validate(config, check_files=False)


VERL_091_DATASET = """
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import Dataset

    class ChatRows(Dataset):
        '''veRL 0.9.1's style: rows carry the chat (raw_prompt); the template is the rollout's business.'''

        def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
            files = data_files if isinstance(data_files, list) else [data_files]
            self.rows = pq.read_table(files[0]).to_pylist()[: max_samples if max_samples > 0 else None]
            self.prompt_key = config.get("prompt_key", "prompt")  # veRL hands over a DictConfig
            assert processor is None and tokenizer is not None

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, item):
            row = dict(self.rows[item])
            row["raw_prompt"] = row.pop(self.prompt_key)
            row["dummy_tensor"] = torch.tensor([0], dtype=torch.uint8)
            row["index"] = row["extra_info"]["index"]
            return row
"""


def test_a_custom_dataset_gives_the_batches_verlx_builds_itself(tmp_path, train_file):
    tokenizer = build_tiny_tokenizer()
    path = _write(tmp_path, "chat_rows.py", VERL_091_DATASET)
    config = _config(train_file, train_batch_size=4, train_max_samples=8)
    config.data.custom_cls = type(config.data.custom_cls)(path=path, name="ChatRows")
    loader, _ = build_dataloaders(config, tokenizer)
    reference = RLHFDataset(train_file, tokenizer, config.data)
    assert len(loader) == 2
    for batch, expected in zip(loader, ([0, 1, 2, 3], [4, 5, 6, 7])):
        own = reference.get_batch(expected)
        for key in ("input_ids", "attention_mask", "position_ids"):
            assert torch.equal(batch.batch[key], own.batch[key]), key
        assert rows(batch) == expected
        assert [r["ground_truth"] for r in batch.non_tensor_batch["reward_model"]] == [str(i + 1) for i in expected]
        assert list(batch.non_tensor_batch["data_source"]) == ["arithmetic"] * 4


def test_a_subclass_of_rlhf_dataset_is_built_with_verls_arguments(tmp_path, train_file):
    path = _write(tmp_path, "sub.py", """
        from verlx.data import RLHFDataset

        class Tagged(RLHFDataset):
            def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
                super().__init__(data_files, tokenizer, config, max_samples, processor=processor)
                self.tag = config.get("reward_fn_key")

        class Plain(RLHFDataset):
            pass
    """)
    config = _config(train_file, train_batch_size=5)
    config.data.custom_cls = type(config.data.custom_cls)(path=path, name="Tagged")
    loader, _ = build_dataloaders(config, build_tiny_tokenizer())
    assert type(loader.dataset).__name__ == "Tagged" and loader.dataset.tag == "data_source"
    assert [rows(b) for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    config.data.custom_cls = type(config.data.custom_cls)(path=path, name="Plain")  # RLHFDataset's own constructor
    loader, _ = build_dataloaders(config, build_tiny_tokenizer())
    assert type(loader.dataset).__name__ == "Plain" and len(loader) == 2


def test_custom_class_errors(tmp_path, train_file):
    path = _write(tmp_path, "bad.py", """
        class NotADataset:
            pass

        class NoChat:
            def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
                pass

            def __len__(self):
                return 4

            def __getitem__(self, i):
                return {"data_source": "x"}

        import torch
        class NoChatDataset(NoChat, torch.utils.data.Dataset):
            pass
    """)
    config = _config(train_file, train_batch_size=2)
    config.data.custom_cls = type(config.data.custom_cls)(path=path, name="NotADataset")
    with pytest.raises(TypeError, match="must be a class subclassing torch.utils.data.Dataset"):
        build_dataloaders(config, build_tiny_tokenizer())
    config.data.custom_cls = type(config.data.custom_cls)(path=path, name="Missing")
    with pytest.raises(AttributeError, match="data.custom_cls.name=Missing is not defined in data.custom_cls.path="):
        build_dataloaders(config, build_tiny_tokenizer())
    config.data.custom_cls = type(config.data.custom_cls)(path=path, name="NoChatDataset")
    loader, _ = build_dataloaders(config, build_tiny_tokenizer())
    with pytest.raises(DataError, match="have neither input_ids tensors nor the chat"):
        next(iter(loader))
    config.data.custom_cls = type(config.data.custom_cls)(path=str(tmp_path / "nope.py"), name=None)
    with pytest.raises(ConfigError) as e:
        validate(config)
    assert "needs data.custom_cls.name" in str(e.value) and "file" in str(e.value) and "does not exist" in str(e.value)


CURRICULUM = """
    from verlx.experimental.dataset.sampler import AbstractCurriculumSampler

    class FrontThenBack(AbstractCurriculumSampler):
        '''Takes rows from the front until a step's batch is reported, then alternates ends: what comes next
        depends on update(batch), so the loader must draw lazily.'''

        def __init__(self, data_source, data_config):
            self.n = len(data_source)
            self.updates = []
            assert data_config.get("shuffle") is False  # veRL hands over a DictConfig

        def __len__(self):
            return self.n

        def __iter__(self):
            remaining = list(range(self.n))
            while remaining:
                yield remaining.pop(-1 if len(self.updates) % 2 else 0)

        def update(self, batch):
            self.updates.append([int(i) for i in batch.non_tensor_batch["index"]])
"""
STATEFUL = CURRICULUM + """
    class Resumable(FrontThenBack):
        def __iter__(self):
            taken = set(sum(self.updates, []))
            remaining = [i for i in range(self.n) if i not in taken]
            while remaining:
                row = remaining.pop(-1 if len(self.updates) % 2 else 0)
                yield row

        def state_dict(self):
            return {"updates": [list(u) for u in self.updates]}

        def load_state_dict(self, state):
            self.updates = [list(u) for u in state["updates"]]
"""


def _curriculum_loader(tmp_path, train_file, code: str, name: str):
    path = _write(tmp_path, f"{name}.py", code)
    config = _config(train_file, train_batch_size=2)
    config.data.sampler = type(config.data.sampler)(class_path=path, class_name=name)
    loader, _ = build_dataloaders(config, build_tiny_tokenizer())
    return loader


def test_a_curriculum_sampler_learns_from_each_step(tmp_path, train_file):
    loader = _curriculum_loader(tmp_path, train_file, CURRICULUM, "FrontThenBack")
    seen = []
    for batch in loader:
        seen.append(rows(batch))
        loader.after_step(batch)  # what the trainer does after every step
    assert seen == [[0, 1], [9, 8], [2, 3], [7, 6], [4, 5]]
    assert loader.sampler.sampler.updates == seen and loader.epoch == 1


@pytest.mark.parametrize("code,name", [(CURRICULUM, "FrontThenBack"), (STATEFUL, "Resumable")],
                         ids=["replayed", "stateful"])
def test_a_curriculum_resumes_where_it_stopped(tmp_path, train_file, code, name):
    first = _curriculum_loader(tmp_path, train_file, code, name)
    batches = iter(first)
    for _ in range(2):
        batch = next(batches)
        first.after_step(batch)
    state = first.state_dict()
    rest = []
    for batch in batches:
        rest.append(rows(batch))
        first.after_step(batch)
    resumed = _curriculum_loader(tmp_path, train_file, code, name)
    resumed.load_state_dict(state)
    again = []
    for batch in resumed:
        again.append(rows(batch))
        resumed.after_step(batch)
    if name == "Resumable":  # its own state (the steps it learned from) comes back: the same rows follow
        assert again == rest == [[2, 3], [7, 6], [4, 5]]
    else:  # no state of its own: the epoch is replayed from a fresh sampler and the 4 rows consumed are skipped,
        # as torchdata does; the curriculum then goes on learning from the resumed steps
        assert again == [[4, 5], [9, 8], [6, 7]]


def test_a_sampler_must_subclass_the_abstract_sampler(tmp_path, train_file):
    path = _write(tmp_path, "plain.py", """
        class Plain:
            def __init__(self, data_source, data_config):
                self.n = len(data_source)

            def __iter__(self):
                return iter(range(self.n))

            def __len__(self):
                return self.n
    """)
    config = _config(train_file, train_batch_size=2)
    config.data.sampler = type(config.data.sampler)(class_path=path, class_name="Plain")
    with pytest.raises(TypeError, match="must subclass verlx.data.custom_sampler.AbstractSampler"):
        build_dataloaders(config, build_tiny_tokenizer())
    config.data.sampler = type(config.data.sampler)(class_path="pkg://no_such_module_here", class_name="X")
    with pytest.raises(ImportError, match="data.sampler.class_path=pkg://no_such_module_here: cannot import"):
        build_dataloaders(config, build_tiny_tokenizer())
