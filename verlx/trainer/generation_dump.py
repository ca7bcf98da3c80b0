"""Writing generations (prompt, response, score) as JSONL, for rollout_data_dir and validation_data_dir."""

from __future__ import annotations

import json
import os

import torch

from verlx.protocol import DataProto
from verlx.utils.errors import storage_errors
from verlx.utils.paths import expand_path


def decode_texts(batch: DataProto, tokenizer) -> tuple[list[str], list[str]]:
    """Prompt and response texts without padding or special tokens, in one batch_decode each."""
    prompts = batch.batch["prompts"]
    prompt_len = prompts.shape[1]
    prompt_mask = batch.batch["attention_mask"][:, :prompt_len].bool()
    response_mask = batch.batch["response_mask"].bool()
    prompt_ids = [row[m].tolist() for row, m in zip(prompts, prompt_mask)]
    response_ids = [row[m].tolist() for row, m in zip(batch.batch["responses"], response_mask)]
    return (tokenizer.batch_decode(prompt_ids, skip_special_tokens=True),
            tokenizer.batch_decode(response_ids, skip_special_tokens=True))


def generation_records(batch: DataProto, tokenizer, scores: torch.Tensor) -> list[dict]:
    prompts, responses = decode_texts(batch, tokenizer)
    data_sources = batch.non_tensor_batch.get("data_source")
    reward_models = batch.non_tensor_batch.get("reward_model")
    statuses = batch.non_tensor_batch.get("reward_status")
    versions = _policy_versions(batch)
    records = []
    for i, (p, r, s) in enumerate(zip(prompts, responses, scores.tolist())):
        record = {"prompt": p, "response": r, "score": s}
        if data_sources is not None:
            record["data_source"] = str(data_sources[i])
        if reward_models is not None and isinstance(reward_models[i], dict):
            record["ground_truth"] = reward_models[i].get("ground_truth")
        if statuses is not None:
            record["reward_status"] = str(statuses[i])  # ok, error or timeout: a failed scoring is not a wrong answer
        if versions is not None:
            record.update(versions[i])
        records.append(record)
    return records


def _policy_versions(batch: DataProto) -> list[dict] | None:
    """Per sample: the policy versions that generated it (first and last token; per token after a partial
    rollout), see trainer/rollout_modes/staleness.py."""
    from verlx.batch_columns import POLICY_VERSION, POLICY_VERSION_LAST, TOKEN_VERSIONS

    if POLICY_VERSION not in batch.batch:
        return None
    first, last = batch.batch[POLICY_VERSION].tolist(), batch.batch[POLICY_VERSION_LAST].tolist()
    out = [{POLICY_VERSION: f, POLICY_VERSION_LAST: la} for f, la in zip(first, last)]
    if TOKEN_VERSIONS in batch.batch:
        mask = batch.batch["response_mask"].bool()
        for record, row, m in zip(out, batch.batch[TOKEN_VERSIONS], mask):
            record[TOKEN_VERSIONS] = row[m].tolist()
    return out


def write_jsonl(path: str, records: list[dict]) -> None:
    """Written under a temporary name and renamed, so a reader never sees half a file; a failed write is a
    StorageError naming the file."""
    tmp = path + ".tmp"
    with storage_errors("the generation dump", path, "Free space, or set the dump directory (trainer.rollout_data_dir "
                        "/ trainer.validation_data_dir) elsewhere or to null"):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, path)


def dump_generations(directory: str, step: int, batch: DataProto, tokenizer) -> str:
    scores = batch.batch["token_level_scores"].sum(-1)
    path = os.path.join(expand_path(directory), f"{step}.jsonl")
    write_jsonl(path, generation_records(batch, tokenizer, scores))
    return path
