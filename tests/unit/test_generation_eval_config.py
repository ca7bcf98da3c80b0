"""generation.yaml / evaluation.yaml: a comment above every key, defaults equal to the dataclasses', typos named."""

from __future__ import annotations

import dataclasses

import pytest

from verlx.config.evaluation import EvaluationConfig
from verlx.config.generation import GenerationConfig
from verlx.config.loader import ConfigError, build, load_yaml, to_container

CONFIGS = [("generation", GenerationConfig), ("evaluation", EvaluationConfig)]


@pytest.mark.parametrize("name,schema", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_yaml_lists_every_key_with_the_dataclass_default(name, schema):
    loaded = to_container(load_yaml(name, schema=schema))
    assert dataclasses.asdict(build(schema, loaded)) == dataclasses.asdict(schema())

    def keys(tree, prefix=""):
        for k, v in tree.items():
            if isinstance(v, dict) and v and not k.endswith(("_kwargs", "override_config")) and k not in (
                    "vllm", "sglang", "native"):
                yield from keys(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    assert set(keys(loaded)) == set(keys(dataclasses.asdict(schema())))  # every key overridable without '+'


def test_unknown_keys_are_named_with_a_suggestion():
    with pytest.raises(ConfigError, match="unknown key 'rollout.temprature'. Did you mean 'temperature'?"):
        load_yaml("generation", ["rollout.temprature=0.5"], schema=GenerationConfig)
    with pytest.raises(ConfigError, match="unknown key 'data.respose_key'. Did you mean 'response_key'?"):
        load_yaml("evaluation", ["data.respose_key=x"], schema=EvaluationConfig)
    with pytest.raises(ConfigError, match="'data.n_samples' = 'many' must be int"):
        build(GenerationConfig, {"data": {"n_samples": "many"}})


def test_a_value_given_to_a_section_is_a_config_error():
    """rollout is composed from a config group, so rollout=x reads as a group choice: a config error naming the
    group's options (exit 2), not Hydra's traceback; a value given to a plain section is refused as such."""
    with pytest.raises(ConfigError, match=r"Could not find 'rollout/vllm'\n\nAvailable options in 'rollout'"):
        load_yaml("generation", ["rollout=vllm"], schema=GenerationConfig)
    with pytest.raises(ConfigError, match="data: expected a section of keys, got 'x'"):
        build(EvaluationConfig, to_container(load_yaml("evaluation", ["data=x"], schema=EvaluationConfig)))
    load_yaml("generation", ["rollout.name=vllm", "data.path=x.parquet"], schema=GenerationConfig)


def test_verl_generation_command_line_is_accepted():
    """The keys of veRL's generation.yaml that verlx implements, as a veRL user would pass them."""
    overrides = ["trainer.nnodes=1", "trainer.n_gpus_per_node=8", "data.path=/home/user/data/rlhf/math/test.parquet",
                 "data.prompt_key=prompt", "data.n_samples=5", "data.output_path=/tmp/out.parquet",
                 "data.batch_size=128", "model.path=/home/user/models/Qwen2-7B-Instruct", "model.external_lib=null",
                 "rollout.name=vllm", "rollout.temperature=1.0", "rollout.top_k=50", "rollout.top_p=0.7",
                 "rollout.prompt_length=1536", "rollout.response_length=512", "rollout.dtype=bfloat16",
                 "rollout.gpu_memory_utilization=0.5", "rollout.tensor_model_parallel_size=1",
                 "rollout.log_prob_micro_batch_size_per_gpu=8", "rollout.max_num_seqs=1024",
                 "rollout.enforce_eager=True", "rollout.free_cache_engine=True", "rollout.load_format=auto",
                 "rollout.calculate_log_probs=False", "ray_kwargs.ray_init.num_cpus=null"]
    load_yaml("generation", overrides, schema=GenerationConfig)
    config = build(GenerationConfig, to_container(load_yaml("generation", overrides, schema=GenerationConfig)))
    assert (config.data.n_samples, config.rollout.top_k, config.rollout.prompt_length) == (5, 50, 1536)
