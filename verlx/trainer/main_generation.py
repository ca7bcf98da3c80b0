"""`python -m verlx.trainer.main_generation data.path=... model.path=... key=value ...`: batch generation.

Samples data.n_samples responses per prompt of a parquet file with any rollout engine, through the same Ray worker
group as training (ActorRolloutRefWorker with role "rollout": its engine loads the weights from model.path), and
writes the input rows plus a `responses` column (a list of n_samples strings per row) atomically.

Prompts are sorted by length into batches of data.batch_size (less padding per generate call); the output keeps the
input's row order. Batch i samples with seed rollout.seed + i, so a run is reproducible.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict

import numpy as np
import torch

from verlx.config.engine import ModelConfig
from verlx.config.generation import GenerationConfig
from verlx.config.loader import Findings
from verlx.config.roles import ActorRolloutRefConfig
from verlx.config.run import TrainerConfig
from verlx.config.schema import PPOConfig
from verlx.protocol import DataProto
from verlx.trainer.entrypoint import hydra_command
from verlx.utils.paths import expand_path

logger = logging.getLogger("verlx")
RESPONSES_COLUMN = "responses"
#: schema metadata key under which the output parquet records the config that produced it
METADATA_KEY = b"verlx.generation_config"


def default_output_path(data_path: str | list[str]) -> str:
    first = data_path if isinstance(data_path, str) else data_path[0]
    return f"{expand_path(first, absolute=True).removesuffix('.parquet')}.generations.parquet"


# ---------------------------------------------------------------------- checks
def validate(config: GenerationConfig) -> None:
    """Every problem with the config at once, before Ray starts."""
    from verlx.data.rl_dataset import PROMPT_TRUNCATIONS
    from verlx.rollout.base import ROLLOUT_ENGINES
    from verlx.utils.registry import did_you_mean

    d, r, t = config.data, config.rollout, config.trainer
    f = Findings()
    for path in [d.path] if isinstance(d.path, str) else d.path:
        f.require(os.path.isfile(expand_path(path, absolute=True)), f"data.path: file {path!r} does not exist")
    model_dir = expand_path(config.model.path, absolute=True)
    f.require(os.path.isfile(os.path.join(model_dir, "config.json")),
              f"model.path: {config.model.path!r} is not a HuggingFace model directory (no config.json)")
    f.require(d.n_samples >= 1, f"data.n_samples={d.n_samples} must be >= 1")
    f.require(d.batch_size >= 1, f"data.batch_size={d.batch_size} must be >= 1")
    greedy = not r.do_sample or r.temperature <= 0
    f.require(not (greedy and d.n_samples > 1),
              f"data.n_samples={d.n_samples} with greedy decoding (rollout.do_sample={r.do_sample}, "
              f"rollout.temperature={r.temperature}) gives {d.n_samples} identical responses; "
              "sample (temperature > 0) or set n_samples=1")
    f.choice("data.truncation", d.truncation, ["error", *PROMPT_TRUNCATIONS.names()])
    f.require(r.n == 1, f"rollout.n={r.n}: the number of samples per prompt is data.n_samples; leave rollout.n at 1")
    f.require(not r.multi_turn.enable,
              "rollout.multi_turn.enable=true: main_generation writes single-turn responses; multi-turn agent loops "
              "(tools) run in training (main_ppo); set rollout.multi_turn.enable=false")
    f.choice("rollout.mode", r.mode, ("sync", "async"))
    f.require(r.over_sample_rate == 0,
              f"rollout.over_sample_rate={r.over_sample_rate}: main_generation writes a response for every prompt, and "
              "over-sampling would leave some empty; set it to 0")
    f.require(not r.load_format.startswith("dummy"),
              f"rollout.load_format={r.load_format}: nothing pushes weights into the engine here, so it must load them "
              "from model.path; use load_format=auto")
    f.require(not (r.free_cache_engine and r.sleep_level == 2),
              "rollout.free_cache_engine=true with rollout.sleep_level=2 discards the weights between batches and "
              "nothing can push them back; use sleep_level=1 or free_cache_engine=false")
    f.require(r.prompt_length >= 1 and r.response_length >= 1,
              f"rollout.prompt_length={r.prompt_length} and rollout.response_length={r.response_length} must be >= 1")
    f.require(t.nnodes >= 1 and t.n_gpus_per_node >= 1,
              f"trainer.nnodes={t.nnodes} and trainer.n_gpus_per_node={t.n_gpus_per_node} must be >= 1")
    world = t.nnodes * t.n_gpus_per_node
    f.require(r.tensor_model_parallel_size >= 1 and world % r.tensor_model_parallel_size == 0,
              f"rollout.tensor_model_parallel_size={r.tensor_model_parallel_size} must divide the {world} workers "
              "(trainer.nnodes × trainer.n_gpus_per_node)")
    f.require(r.name == "auto" or r.name in ROLLOUT_ENGINES,
              f"rollout.name={r.name!r} is not a registered engine: {', '.join(ROLLOUT_ENGINES.names())}."
              + did_you_mean(r.name, ROLLOUT_ENGINES.names()))
    f.raise_problems()


def worker_config(config: GenerationConfig) -> PPOConfig:
    """The PPOConfig the rollout-only ActorRolloutRefWorker reads: the model, the rollout and where it runs."""
    m, t = config.model, config.trainer
    model = ModelConfig(path=m.path, tokenizer_path=m.tokenizer_path, trust_remote_code=m.trust_remote_code,
                        external_lib=m.external_lib, override_config=dict(m.override_config),
                        custom_chat_template=m.custom_chat_template)
    trainer = TrainerConfig(nnodes=t.nnodes, n_gpus_per_node=t.n_gpus_per_node, device=t.device,
                            seed=config.rollout.seed, phase_timeout_s=t.phase_timeout_s)
    return PPOConfig(actor_rollout_ref=ActorRolloutRefConfig(model=model, rollout=config.rollout), trainer=trainer,
                     ray_kwargs=config.ray_kwargs)


# ---------------------------------------------------------------------- prompts
def tokenize_prompts(table, config: GenerationConfig, tokenizer) -> list[list[int]]:
    """Token ids of every row's chat-templated prompt (one batched call), checked and fitted to prompt_length."""
    from verlx.data.rl_dataset import (
        PROMPT_TRUNCATIONS,
        prompt_problem,
        render_and_tokenize,
    )

    d = config.data
    if d.prompt_key not in table.column_names:
        raise KeyError(f"{d.path} has no column '{d.prompt_key}' (data.prompt_key); its columns are "
                       f"{sorted(table.column_names)}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template to turn the prompt messages into text; use a "
                         "chat/instruct model's tokenizer (model.tokenizer_path) or set model.custom_chat_template")
    prompts = table.column(d.prompt_key).to_pylist()
    for row, prompt in enumerate(prompts):
        problem = prompt_problem(prompt)
        if problem is not None:
            raise ValueError(f"{d.path} row {row}: {problem[0]} in column '{d.prompt_key}': {problem[1]}")
    _, ids = render_and_tokenize(tokenizer, prompts, dict(d.apply_chat_template_kwargs))
    limit = config.rollout.prompt_length
    over = [row for row, x in enumerate(ids) if len(x) > limit]
    if over and d.truncation == "error":
        raise ValueError(
            f"{d.path} row {over[0]}: the prompt is {len(ids[over[0]])} tokens, longer than rollout.prompt_length="
            f"{limit} ({len(over)} prompts are). Raise rollout.prompt_length or set data.truncation to left, right "
            "or middle."
        )
    if over:
        truncate = PROMPT_TRUNCATIONS.get(d.truncation)
        for row in over:
            ids[row] = truncate(ids[row], limit)
        logger.warning("%d of %d prompts were longer than rollout.prompt_length=%d and were cut (data.truncation=%s)",
                       len(over), len(ids), limit, d.truncation)
    return ids


def left_padded_batch(rows: list[list[int]], pad_token_id: int) -> DataProto:
    """input_ids / attention_mask / position_ids, left-padded to the longest prompt of the batch."""
    width = max(len(r) for r in rows)
    input_ids = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, tokens in enumerate(rows):
        input_ids[i, width - len(tokens):] = tokens
        attention_mask[i, width - len(tokens):] = 1
    position_ids = np.clip(attention_mask.cumsum(-1) - 1, 0, None)
    return DataProto({"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
                      "position_ids": torch.from_numpy(position_ids)})


def batches_by_length(ids: list[list[int]], batch_size: int) -> list[np.ndarray]:
    """Row indices in batches of similar prompt length (stable for ties)."""
    order = np.argsort(np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids)), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def decode_responses(out: DataProto, tokenizer) -> list[str]:
    """Each response up to and including its stop token, special tokens dropped, in one batch_decode."""
    lengths = out.batch["response_mask"].sum(-1).tolist()
    rows = out.batch["responses"].numpy()
    return tokenizer.batch_decode([row[:n].tolist() for row, n in zip(rows, lengths)], skip_special_tokens=True)


# ---------------------------------------------------------------------- the run
def generate_all(config: GenerationConfig, wg, ids: list[list[int]], tokenizer) -> list[list[str]]:
    """n_samples responses per prompt, in the prompts' order."""
    n = config.data.n_samples
    responses: list[list[str]] = [[] for _ in ids]
    batches = batches_by_length(ids, config.data.batch_size)
    start, done = time.perf_counter(), 0
    for index, rows in enumerate(batches):
        batch = left_padded_batch([ids[r] for r in rows.tolist()], tokenizer.pad_token_id).repeat(n, interleave=True)
        batch, pad = batch.pad_to_divisor(wg.world_size)  # a last batch smaller than the worker count
        batch.meta_info.update({"do_sample": config.rollout.do_sample, "seed": config.rollout.seed + index})
        texts = decode_responses(wg.generate_sequences(batch).unpad(pad), tokenizer)
        for position, row in enumerate(rows.tolist()):
            responses[row] = texts[position * n:(position + 1) * n]
        done += len(rows)
        logger.info("[%d/%d] %d of %d prompts done (%d responses each), %.1fs", index + 1, len(batches), done,
                    len(ids), n, time.perf_counter() - start)
    return responses


def write_output(table, responses: list[list[str]], config: GenerationConfig) -> str:
    """The input table plus the responses column, with the generating config in the schema metadata."""
    import pyarrow as pa

    from verlx.data.parquet import write_parquet_atomic

    if RESPONSES_COLUMN in table.column_names:
        logger.warning("%s already has a '%s' column; it is replaced in the output", config.data.path,
                       RESPONSES_COLUMN)
        table = table.drop_columns([RESPONSES_COLUMN])
    table = table.append_column(RESPONSES_COLUMN, pa.array(responses, type=pa.list_(pa.string())))
    metadata = dict(table.schema.metadata or {})
    metadata[METADATA_KEY] = json.dumps(asdict(config), default=str).encode()
    table = table.replace_schema_metadata(metadata)
    d = config.data
    output = expand_path(d.output_path, absolute=True) if d.output_path else default_output_path(d.path)
    return write_parquet_atomic(table, output)


def run_generation(config: GenerationConfig) -> str:
    """Validate, generate, write; returns the output path."""
    import ray

    from verlx.config.hf_paths import resolve_model_paths
    from verlx.data.sft_dataset import read_parquet_rows
    from verlx.rollout.base import resolve_engine_name
    from verlx.single_controller.ray import RayClassWithInitArgs, RayResourcePool
    from verlx.trainer.ray_startup import start_ray, use_gpus
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker, WorkerRole
    from verlx.workers.groups import ActorRolloutRefGroup
    from verlx.workers.tokenizer import load_tokenizer

    resolve_model_paths([(f"model.{a}", config.model, a) for a in ("path", "tokenizer_path")])
    validate(config)
    config.rollout.name = resolve_engine_name(config.rollout.name)
    ppo_config = worker_config(config)
    use_gpu = use_gpus(ppo_config)
    m = config.model
    tokenizer = load_tokenizer(expand_path(m.tokenizer_path or m.path, absolute=True), m.trust_remote_code,
                               m.custom_chat_template, "model.tokenizer_path" if m.tokenizer_path else "model.path")
    table = read_parquet_rows(config.data.path, config.data.max_samples, "data.path").table
    ids = tokenize_prompts(table, config, tokenizer)
    logger.info("generating %d × %d responses with the %s engine on %d workers", len(ids), config.data.n_samples,
                config.rollout.name, config.trainer.nnodes * config.trainer.n_gpus_per_node)
    start_ray(ppo_config, use_gpu)
    t = config.trainer
    pool = RayResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=use_gpu, name_prefix="verlx_generation")
    wg = None
    try:
        wg = ActorRolloutRefGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=ppo_config,
                                                             role=WorkerRole(rollout=True)), name="generation")
        wg.set_timeouts(t.phase_timeout_s)
        wg.init_model()
        responses = generate_all(config, wg, ids, tokenizer)
    finally:
        if wg is not None:
            wg.shutdown()
        pool.release()
    output = write_output(table, responses, config)
    if config.ray_kwargs.timeline_json_file:
        ray.timeline(filename=expand_path(config.ray_kwargs.timeline_json_file, absolute=True))
    print(f"wrote {len(responses)} rows × {config.data.n_samples} responses to {output}")
    return output


main = hydra_command("generation", GenerationConfig, run_generation,
                     stopped="; nothing was written (the output file is written once every response is generated)")

if __name__ == "__main__":
    main()
