"""The veRL compatibility table: every key of veRL 0.9.1's configs has its answer, and each kind of row does what
docs/verl_compat.md says (mapped with a note, ignored with a warning, refused naming the feature and where the key
was set). veRL's keys come from tests/data/verl_keys.json (benchmarks/verl_keys_extract.py), never from veRL."""

from __future__ import annotations

import json
import logging
import os

import pytest

from verlx.config.legacy_keys import KeyTable, Moved, Refused, in_free_form, is_declared
from verlx.config.loader import CONFIG_DIR, ConfigError
from verlx.config.verl_compat import TABLES, VERL_VERSION
from verlx.config.verl_compat.compose import compose_config, resolve_config_dir
from verlx.config.verl_compat.docs import render
from verlx.trainer.preflight import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(REPO, "tests", "data", "verl_keys.json")) as _f:
    VERL_KEYS = json.load(_f)
# which verlx config answers each veRL config's keys
SCHEMA_OF = {"ppo_trainer": "PPOConfig", "sft_trainer_engine": "SFTConfig", "sft_trainer": "SFTConfig",
             "evaluation": "EvaluationConfig", "generation": "GenerationConfig"}


def _schema(name: str) -> type:
    from verlx.config.evaluation import EvaluationConfig
    from verlx.config.generation import GenerationConfig
    from verlx.config.schema import PPOConfig
    from verlx.config.sft import SFTConfig

    return {c.__name__: c for c in (PPOConfig, SFTConfig, EvaluationConfig, GenerationConfig)}[name]


def _every_config():
    for label, keys in VERL_KEYS["configs"].items():
        label = f"{VERL_KEYS['verl_version']} {label}"
        yield pytest.param(label, SCHEMA_OF[label.split()[1]], keys, id=label)
    for label, keys in VERL_KEYS["older_configs"].items():
        yield pytest.param(f"older {label}", SCHEMA_OF[label], keys, id=f"older {label}")


@pytest.mark.parametrize("label,schema_name,keys", list(_every_config()))
def test_every_key_of_verls_configs_is_implemented_or_has_a_row(label, schema_name, keys):
    schema, table = _schema(schema_name), TABLES[schema_name]
    implemented = [k for k in keys if is_declared(schema, k) or in_free_form(schema, k)]
    unanswered = [k for k in keys if k not in implemented and table.row_for(k) is None]
    assert unanswered == [], f"{label}: {len(unanswered)} keys without a row"


def test_the_table_covers_the_release_the_data_was_written_from():
    assert VERL_KEYS["verl_version"] == VERL_VERSION


def test_docs_page_is_current():
    with open(os.path.join(REPO, "docs", "verl_compat.md")) as f:
        assert f.read() == render(), "regenerate: python -m verlx.config.verl_compat.docs > docs/verl_compat.md"


def test_the_most_specific_row_wins_and_a_key_is_listed_once():
    table = KeyTable([Refused("a.b", "B"), Refused("a.b.c", "C"), Refused("**.t", "T"), Moved("x", "y", "why")])
    assert table.row_for("a.b.d").missing == "B"
    assert table.row_for("a.b.c.d").missing == "C"
    assert table.row_for("a.b.t").missing == "B"  # two literal parts beat one
    assert table.row_for("q.r.t").missing == "T"
    assert table.row_for("x.z").new == "y" and table.row_for("xx") is None
    with pytest.raises(ValueError, match=r"listed twice: \['a.b'\]"):
        KeyTable([Refused("a.b", "B"), Refused("a.b", "C")])


def test_moved_rows_name_literal_keys():
    for table in TABLES.values():
        for row in table.rows:
            if isinstance(row, Moved):
                assert "*" not in row.old, row


# ---------------------------------------------------------------------- what each kind of row does
def ppo(overrides, config_dir=CONFIG_DIR, name="ppo_trainer"):
    from verlx.config.schema import PPOConfig

    return compose_config(name, overrides, PPOConfig, config_dir)


def test_a_mapped_key_is_read_as_verlx_key_with_an_info_line(caplog):
    caplog.set_level(logging.INFO)
    cfg = ppo(["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
               "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096"])
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert cfg.actor_rollout_ref.rollout.update_weights_bucket_megabytes == 4096
    lines = [r for r in caplog.records if "fsdp_config.ulysses_sequence_parallel_size" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "is read as 'actor_rollout_ref.actor.ulysses_sequence_parallel_size=2'" in lines[0].getMessage()


def test_an_ignored_key_is_dropped_with_a_warning_saying_why(caplog):
    cfg = ppo(["trainer.use_legacy_worker_impl=disable"])
    assert cfg.trainer.total_epochs == 30
    assert "'trainer.use_legacy_worker_impl=disable' is ignored: verlx has one worker implementation" in caplog.text


def test_a_refused_key_names_the_missing_feature_and_the_override():
    with pytest.raises(ConfigError) as e:
        ppo(["data.video_key=clips", "trainer.nnodes=1"])
    assert ("data.video_key='clips' (set at command line: 'data.video_key=clips'): verlx does not support "
            "video inputs of vision-language models yet") in str(e.value)


def test_a_refused_key_that_asks_for_nothing_is_accepted_with_a_warning(caplog):
    ppo(["+actor_rollout_ref.rollout.data_parallel_size=1", "actor_rollout_ref.rollout.mode=sync"])
    assert "actor_rollout_ref.rollout.data_parallel_size=1 is accepted and has no effect" in caplog.text


def test_a_refused_section_is_accepted_while_its_switch_is_off(caplog):
    ppo(["+algorithm.pf_ppo.reweight_method=pow", "+algorithm.use_pf_ppo=False"])
    assert "algorithm.pf_ppo has no effect: it is read only with algorithm.use_pf_ppo on" in caplog.text
    with pytest.raises(ConfigError, match=r"algorithm.use_pf_ppo=True .*preference-feedback PPO"):
        ppo(["+algorithm.use_pf_ppo=True"])


def test_the_merged_features_keys_map_onto_verlx_and_are_said_once(caplog):
    caplog.set_level(logging.INFO)
    cfg = ppo(["reward.reward_model.enable=True", "reward.reward_model.model_path=/models/rm",
               "reward.reward_model.rollout.gpu_memory_utilization=0.8", "reward.reward_kwargs.max_resp_len=96",
               "+actor_rollout_ref.actor.policy_loss.tau_pos=2.5", "reward_model.use_reward_loop=True",
               "global_profiler.global_tool_config.nsys.discrete=True"])
    assert (cfg.reward_model.enable, cfg.reward_model.model.path) == (True, "/models/rm")
    assert cfg.reward_model.reward_kwargs.max_resp_len == 96 and cfg.actor_rollout_ref.actor.tau_pos == 2.5
    assert cfg.global_profiler.global_tool_config.nsys.discrete is True  # declared: not swallowed by its section's row
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sum("reward.reward_model.model_path" in m and "reward_model.model.path" in m for m in infos) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'reward.reward_model.rollout.gpu_memory_utilization=0.8' is ignored: settings of the inference "
               "server" in m for m in warnings)
    assert any("reward_model.use_reward_loop=True' is ignored" in m for m in warnings)


def test_gen_batch_size_without_dynamic_sampling_is_the_training_batch_as_in_verl(caplog):
    caplog.set_level(logging.INFO)
    cfg = ppo(["data.gen_batch_size=32", "data.train_batch_size=16"])
    assert (cfg.data.gen_batch_size, cfg.data.train_batch_size) == (32, 32)
    assert "data.gen_batch_size=32 without algorithm.filter_groups.enable: veRL trains on every prompt it " \
           "generates, so data.train_batch_size=16 is read as 32" in caplog.text
    dapo = ppo(["data.gen_batch_size=32", "data.train_batch_size=16", "algorithm.filter_groups.enable=true"])
    assert (dapo.data.gen_batch_size, dapo.data.train_batch_size) == (32, 16)


def test_an_npu_device_is_refused_rather_than_run_on_the_cpu():
    with pytest.raises(ConfigError, match=r"trainer.device='npu' .*verlx does not support Ascend NPUs"):
        ppo(["trainer.device=npu"])
    cfg = ppo([])
    cfg.trainer.device = "npu"  # a config built without the table: the preflight refuses it too
    with pytest.raises(ConfigError, match=r"trainer.device='npu' is not one of \['auto', 'cpu', 'cuda'\]"):
        validate(cfg, check_files=False)


def test_a_strategy_only_verl_has_is_refused_naming_it_and_verlxs_own_pass():
    with pytest.raises(ConfigError) as e:
        ppo(["actor_rollout_ref.actor.strategy=fsdp_turbo", "critic.strategy=fsdp_turbo"])
    for key in ("actor_rollout_ref.actor.strategy", "critic.strategy"):
        assert (f"{key}='fsdp_turbo' (set at command line: '{key}=fsdp_turbo'): verlx does not support veRL's "
                "FSDP-Turbo engine") in str(e.value)
    assert ppo(["actor_rollout_ref.actor.strategy=fsdp2"]).actor_rollout_ref.actor.strategy == "fsdp2"
    cfg = ppo(["actor_rollout_ref.actor.strategy=fsdp1"])  # not veRL's: verlx's own check names the choices
    with pytest.raises(ConfigError, match=r"actor.strategy='fsdp1' is not one of \['fsdp', 'fsdp2', 'megatron'\]"):
        validate(cfg, check_files=False)


def test_a_reward_model_pool_of_its_own_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"reward_model.enable_resource_pool=True .*a GPU pool of the reward "
                       r"model's own"):
        ppo(["reward_model.enable=True", "+reward_model.enable_resource_pool=True", "+reward_model.nnodes=2"])


def test_an_unknown_key_names_the_release_the_table_covers():
    with pytest.raises(ConfigError) as e:
        ppo(["+trainer.n_gpu_per_node=2"])
    message = str(e.value)
    assert "unknown key 'trainer.n_gpu_per_node'. Did you mean 'n_gpus_per_node'?" in message
    assert f"nor of veRL {VERL_VERSION}, the release verlx's compatibility table covers" in message


def test_a_key_in_a_free_form_section_needs_no_plus():
    cfg = ppo(["actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=flashinfer",
               "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.sglang == {"attention_backend": "flashinfer"}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm == {"swap_space": 4}


def test_plus_plus_and_tilde_work_as_in_verl(caplog):
    caplog.set_level(logging.INFO)
    from verlx.config.run import DataConfig

    cfg = ppo(["++trainer.nnodes=2", "data.val_files=/v.parquet", "~data.val_files",
               "~actor_rollout_ref.rollout.data_parallel_size"])
    assert cfg.trainer.nnodes == 2 and cfg.data.val_files == DataConfig().val_files  # deleted: the default
    assert "verlx has no key actor_rollout_ref.rollout.data_parallel_size to delete" in caplog.text


def test_model_engine_megatron_is_verls_config_group():
    cfg = ppo(["model_engine=megatron", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
               "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2"])
    arr = cfg.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy, cfg.critic.strategy) == ("megatron",) * 3
    # the reference follows the actor key by key, and a command line may still set one of them
    assert (arr.ref.megatron.tensor_model_parallel_size, arr.ref.megatron.pipeline_model_parallel_size) == (2, 2)
    assert cfg.critic.megatron.tensor_model_parallel_size == 2
    assert ppo([], name="ppo_megatron_trainer") == ppo(["model_engine=megatron"])
    with pytest.raises(ConfigError, match=r"model_engine=torchtitan: verlx does not support veRL's torchtitan"):
        ppo(["model_engine=torchtitan"])


def test_model_engine_under_the_actor_is_the_config_group(caplog):
    """veRL's examples README and two of its scripts write actor_rollout_ref.actor.model_engine=megatron."""
    caplog.set_level(logging.INFO)
    under_actor = ["actor_rollout_ref.actor.model_engine=megatron",
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"]
    assert ppo(under_actor) == ppo(["model_engine=megatron", *under_actor[1:]])
    assert "'actor_rollout_ref.actor.model_engine=megatron' is read as 'model_engine=megatron'" in caplog.text
    assert ppo(["actor_rollout_ref.actor.model_engine=dp"]) == ppo([])
    with pytest.raises(ConfigError, match=r"model_engine=veomni: verlx does not support veRL's VeOmni"):
        ppo(["actor_rollout_ref.actor.model_engine=veomni"])


def test_ray_init_keys_reach_ray_init(monkeypatch):
    import ray

    from verlx.trainer.ray_startup import start_ray

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    cfg = ppo(["ray_kwargs.ray_init.runtime_env.py_executable=uv run python",
               "+ray_kwargs.ray_init.runtime_env.env_vars.TOKENIZERS_PARALLELISM=true",
               "+ray_kwargs.ray_init.num_gpus=4", "ray_kwargs.ray_init.num_cpus=6"])
    start_ray(cfg, use_gpu=False)
    assert seen["runtime_env"]["py_executable"] == "uv run python"
    assert seen["runtime_env"]["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"  # the user's wins over verlx's
    assert seen["runtime_env"]["env_vars"]["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert (seen["num_gpus"], seen["num_cpus"]) == (4, 6)


# ---------------------------------------------------------------------- a script's own YAML
DAPO_LIKE = """\
hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_trainer
  - _self_

data:
  max_prompt_length: 7
  _target_: verl.trainer.config.DataConfig
reward_model:
  reward_manager: dapo
  overlong_buffer:
    enable: False
actor_rollout_ref:
  rollout:
    data_parallel_size: 2
"""


def test_a_scripts_yaml_composes_against_verlx_and_a_refused_key_names_its_file_and_line(tmp_path):
    (tmp_path / "dapo_trainer.yaml").write_text(DAPO_LIKE)
    with pytest.raises(ConfigError) as e:
        ppo([], config_dir=str(tmp_path), name="dapo_trainer")
    assert (f"actor_rollout_ref.rollout.data_parallel_size=2 (set at {tmp_path}/dapo_trainer.yaml:18): verlx does "
            "not support data-parallel rollout engines") in str(e.value)
    cfg = ppo(["actor_rollout_ref.rollout.data_parallel_size=1"], config_dir=str(tmp_path), name="dapo_trainer")
    assert (cfg.data.max_prompt_length, cfg.reward_model.reward_manager) == (7, "dapo")
    assert cfg.actor_rollout_ref.rollout.prompt_length == 7  # verlx's interpolation follows the script's value


def test_an_unknown_key_of_a_scripts_yaml_names_its_file_and_line(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_megatron_trainer\n  - _self_\n\ntrainer:\n"
                                        "  totl_epochs: 3\n")
    with pytest.raises(ConfigError, match=rf"unknown key 'trainer.totl_epochs'\. Did you mean 'total_epochs'\?.*"
                       rf"\(set at {tmp_path}/mine.yaml:6\)"):
        ppo([], config_dir=str(tmp_path), name="mine")


def test_verls_own_config_directory_is_verlx_and_a_scripts_is_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_dir("config", "ppo_megatron_trainer") == CONFIG_DIR
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "mine.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\n")
    assert resolve_config_dir("config", "mine") == str(tmp_path / "config")
    with pytest.raises(ConfigError, match="--config-path=nowhere: there is no directory"):
        resolve_config_dir("nowhere", "mine")


def test_veRLs_config_groups_in_a_scripts_defaults_list_are_explained(tmp_path):
    (tmp_path / "full.yaml").write_text("defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n")
    with pytest.raises(ConfigError, match=r"(?s)actor/dp_actor.*a config group of veRL's own ppo_trainer.yaml"):
        ppo([], config_dir=str(tmp_path), name="full")


def test_an_interpolation_to_a_key_verlx_lacks_is_explained(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\n\ndata:\n"
                                        "  max_prompt_length: ${data.video_key}\n")
    with pytest.raises(ConfigError, match=r"(?s)Interpolation key 'data.video_key' not found.*\(written at "
                       rf"{tmp_path}/mine.yaml:6\); an interpolation"):
        ppo([], config_dir=str(tmp_path), name="mine")


# ---------------------------------------------------------------------- SFT
def sft(overrides, name="fsdp_sft_trainer"):
    from verlx.config.sft import SFTConfig

    return compose_config(name, overrides, SFTConfig)


def test_verls_sft_dict_keys_become_dotted_paths():
    cfg = sft(["data.prompt_key=extra_info", "data.response_key=extra_info", "data.prompt_dict_keys=[question]",
               "+data.response_dict_keys=[answer]", "use_remove_padding=true", "ulysses_sequence_parallel_size=1"])
    assert (cfg.data.prompt_key, cfg.data.response_key) == ("extra_info.question", "extra_info.answer")
    assert (cfg.optim.lr, cfg.trainer.total_training_steps, cfg.trainer.target_val_accuracy) == (1e-5, None, None)


def test_verls_sft_engine_keys_map_or_are_refused():
    cfg = sft(["model.path=/models/x", "engine.ulysses_sequence_parallel_size=2", "data.messages_key=chat"],
              name="sft_trainer_engine")
    assert cfg.model.partial_pretrain == "/models/x" and cfg.model.ulysses_sequence_parallel_size == 2
    # veRL 0.9.1's sft_trainer reads conversations with token-budget, unpadded micro-batches
    assert (cfg.data.multiturn.enable, cfg.data.multiturn.messages_key) == (True, "chat")
    assert (cfg.data.use_dynamic_bsz, cfg.data.max_token_len_per_gpu, cfg.model.use_remove_padding) == (True, 8192,
                                                                                                         True)
    legacy = sft(["model.lora_rank=32", "model.lora_alpha=16", "ulysses_sequence_parallel_size=2",
                  "data.multiturn.enable=true", "data.micro_batch_size=16", "trainer.save_freq=100"])
    assert (legacy.model.lora_rank, legacy.model.ulysses_sequence_parallel_size) == (32, 2)
    assert (legacy.data.multiturn.enable, legacy.data.micro_batch_size_per_gpu, legacy.trainer.save_freq) == (
        True, 4, 100)  # veRL's fsdp_sft_trainer does not read data.micro_batch_size either
    with pytest.raises(ConfigError, match="verlx does not support resuming SFT from a checkpoint yet"):
        sft(["+trainer.resume_from_path=/ckpt/global_step_5"])
    assert sft(["engine=fsdp", "optim=fsdp"], name="sft_trainer_engine") == sft([], name="sft_trainer_engine")
    with pytest.raises(ConfigError, match=r"engine=megatron: verlx does not support megatron SFT yet"):
        sft(["engine=megatron"], name="sft_trainer_engine")


# ---------------------------------------------------------------------- main_generation_server
def test_verls_generation_server_command_becomes_a_batch_generation():
    from verlx.trainer.main_generation_server import generation_config, load_server_config

    ppo_cfg, output = load_server_config("ppo_trainer", [
        "trainer.n_gpus_per_node=8", "actor_rollout_ref.model.path=/models/m", "actor_rollout_ref.rollout.n=32",
        "actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.rollout.name=vllm",
        "data.train_files=['/d/a.parquet', '/d/b.parquet']", "+data.output_path=/d/out.parquet"])
    gen = generation_config(ppo_cfg, output)
    assert (gen.data.path, gen.data.n_samples, gen.data.output_path) == (["/d/a.parquet", "/d/b.parquet"], 32,
                                                                          "/d/out.parquet")
    assert (gen.model.path, gen.rollout.n, gen.rollout.temperature, gen.rollout.name) == ("/models/m", 1, 0.7, "vllm")
    assert (gen.rollout.load_format, gen.trainer.n_gpus_per_node) == ("auto", 8)


def test_mindspeeds_transformer_fields_are_refused_naming_ascend_npus():
    from verlx.workers.megatron.overrides import transformer_override_problems

    problems = transformer_override_problems("actor_rollout_ref.actor.megatron",
                                             {"use_flash_attn": True, "recompute_granularity": "full", "no_such": 1},
                                             te_available=False, fields={"recompute_granularity"})
    assert problems == [
        "actor_rollout_ref.actor.megatron.override_transformer_config.use_flash_attn: a field of MindSpeed's "
        "TransformerConfig (megatron on Ascend NPUs); verlx does not support Ascend NPUs yet",
        "actor_rollout_ref.actor.megatron.override_transformer_config.no_such is not a megatron TransformerConfig "
        "field."]
