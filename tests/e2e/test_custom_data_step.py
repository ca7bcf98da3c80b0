"""Two GRPO steps through main_ppo on 2 CPU workers with a veRL 0.9.1-style dataset class (data.custom_cls) and a
curriculum sampler (data.sampler) from user files: the trainer draws the sampler's rows lazily and calls its
update(batch) after each step with the step's scored batch, so step 2 trains on the rows the curriculum chose."""

from __future__ import annotations

import json
import textwrap

from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import run_ppo

USER_CODE = """
    import json

    import pyarrow.parquet as pq
    from torch.utils.data import Dataset

    from verlx.experimental.dataset.sampler import AbstractCurriculumSampler

    LOG = {log!r}


    class ChatRows(Dataset):
        def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
            files = data_files if isinstance(data_files, list) else [data_files]
            self.rows = pq.read_table(files[0]).to_pylist()
            self.prompt_key = config.get("prompt_key", "prompt")

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, item):
            row = dict(self.rows[item])
            row["raw_prompt"] = row.pop(self.prompt_key)
            row["index"] = item
            return row


    class BackAfterFirstStep(AbstractCurriculumSampler):
        def __init__(self, data_source, data_config):
            self.n, self.updates = len(data_source), 0

        def __len__(self):
            return self.n

        def __iter__(self):
            remaining = list(range(self.n))
            while remaining:
                yield remaining.pop(-1 if self.updates else 0)

        def update(self, batch):
            self.updates += 1
            rewards = batch.batch["token_level_scores"].sum(-1).tolist()
            with open(LOG, "a") as f:
                f.write(json.dumps({{"index": [int(i) for i in batch.non_tensor_batch["index"]],
                                    "rewards": len(rewards)}}) + "\\n")
"""


def test_custom_dataset_and_curriculum_through_two_steps(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    log = tmp_path / "updates.jsonl"
    code = tmp_path / "user_data.py"
    code.write_text(textwrap.dedent(USER_CODE.format(log=str(log))))
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2",
                      f"data.custom_cls.path={code}", "data.custom_cls.name=ChatRows",
                      f"data.sampler.class_path={code}", "data.sampler.class_name=BackAfterFirstStep")
    run_ppo(cfg)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    updates = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(updates) == 2 and all(u["rewards"] == 16 for u in updates)
    # 64 training rows: step 1 takes the first 8, the update turns the curriculum around, step 2 takes the last 8
    # (each prompt twice: rollout.n=2; balance_batch may reorder the rows)
    assert sorted(updates[0]["index"]) == sorted(list(range(8)) * 2)
    assert sorted(updates[1]["index"]) == sorted(list(range(56, 64)) * 2)
