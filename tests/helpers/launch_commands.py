"""Launch command lines written for veRL (`python -m verl.trainer.<entry point> ...`) composed, typed and
preflighted by verlx in this process, without Ray, downloads or GPUs.

Each command keeps its argv as written, with `verl.` read as `verlx.`. After composing, the paths the preflight
opens are pointed at tiny local stand-ins (`Fixtures`): every data file, the model, critic and reward-model
directories (and the reward model's input tokenizer), the reward-function file. Everything else is checked as
written: the batch arithmetic of the GPU counts, the names of estimators, losses and engines, the refused and
unknown keys. Used by tests/unit/test_launch_commands.py (our own corpus) and benchmarks/verl_scripts.py (veRL's
example scripts, extracted from a checkout at run time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re

import yaml

# veRL entry point → (what verlx runs, the kind of config it composes)
ENTRY_POINTS = {
    "verl.trainer.main_ppo": ("verlx.trainer.main_ppo", "ppo"),
    "verl.trainer.fsdp_sft_trainer": ("verlx.trainer.fsdp_sft_trainer", "sft"),
    "verl.trainer.sft_trainer": ("verlx.trainer.sft_trainer", "sft"),
    "verl.trainer.main_generation": ("verlx.trainer.main_generation", "generation"),
    "verl.trainer.main_generation_server": ("verlx.trainer.main_generation_server", "generation_server"),
    "verl.trainer.main_eval": ("verlx.trainer.main_eval", "evaluation"),
}
# The config each entry point composes when the command names none (veRL's fsdp_sft_trainer defaults to its
# sft_trainer.yaml, which verlx calls fsdp_sft_trainer.yaml)
DEFAULT_CONFIGS = {"verl.trainer.main_ppo": "ppo_trainer", "verl.trainer.fsdp_sft_trainer": "fsdp_sft_trainer",
                   "verl.trainer.sft_trainer": "sft_trainer_engine", "verl.trainer.main_generation": "generation",
                   "verl.trainer.main_generation_server": "ppo_trainer", "verl.trainer.main_eval": "evaluation"}
PPO_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")


@dataclasses.dataclass(frozen=True)
class Command:
    """One launch: `module` (veRL's name), its argv after the module, the directory of a config of the command's
    own (None: verlx's config directory) and the config name (None: the entry point's default). `root` is the
    working directory relative paths are read from, and what `{ROOT}` in the argv stands for."""

    label: str
    module: str
    argv: tuple[str, ...]
    root: str
    config_dir: str | None = None
    config_name: str | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
    command: Command
    status: str  # "pass", "refused" (an input error, exit 2: the message names what to change) or "crash"
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Fixtures:
    """The tiny local files that stand in for the commands' data, models and reward functions."""

    home: str
    data_file: str
    model_dir: str
    reward_file: str
    #: stand-ins of vision-language checkpoints by model_type (VISION_STAND_INS)
    vision_model_dirs: dict[str, str] = dataclasses.field(default_factory=dict)
    #: stand-ins of other text architectures by the pattern of their names (ARCHITECTURE_STAND_INS)
    architecture_model_dirs: dict[str, str] = dataclasses.field(default_factory=dict)

    def model_for(self, path: str | None) -> str:
        """The stand-in of the model a command names: a vision-language one of the family its name says, or one
        with the architecture, layers and experts of the text model it names, else the Qwen2 text model."""
        name = os.path.basename(str(path or "").rstrip("/")).lower()
        for pattern, model_type in VISION_STAND_INS.items():
            if re.search(pattern, name) and model_type in self.vision_model_dirs:
                return self.vision_model_dirs[model_type]
        for pattern in ARCHITECTURE_STAND_INS:
            if re.search(pattern, name) and pattern in self.architecture_model_dirs:
                return self.architecture_model_dirs[pattern]
        return self.model_dir


def command_from_line(label: str, module: str, argv: list[str], root: str) -> Command:
    """A command as verlx's entry point reads its Hydra flags: `--config-name`, and `--config-path` relative to the
    working directory `root` (`config`, as veRL's scripts write it for veRL's own configs, is verlx's)."""
    from verlx.config.loader import CONFIG_DIR
    from verlx.config.verl_compat.compose import resolve_config_dir
    from verlx.trainer.entrypoint import split_command_line

    flags, _ = split_command_line(list(argv))
    name = flags[flags.index("--config-name") + 1] if "--config-name" in flags else None
    path = flags[flags.index("--config-path") + 1] if "--config-path" in flags else None
    with working_dir(root):
        directory = resolve_config_dir(path, name or DEFAULT_CONFIGS.get(module, "ppo_trainer"))
    return Command(label, module, tuple(argv), root, None if directory == CONFIG_DIR else directory, name)


def composes_ppo_trainer(command: Command) -> bool:
    """The command's config is veRL's ppo_trainer, or a YAML of its own whose defaults list leads to it."""
    name = (command.config_name or "").removesuffix(".yaml")
    for _ in range(4):
        if name in PPO_CONFIGS:
            return True
        path = os.path.join(command.config_dir, f"{name}.yaml") if command.config_dir else None
        if path is None or not os.path.isfile(path):
            return False
        with open(path) as f:
            defaults = (yaml.safe_load(f) or {}).get("defaults") or []
        names = [d for d in defaults if isinstance(d, str) and d != "_self_"]
        if not names:
            return False
        name = names[0]
    return False


def kind_of(command: Command) -> str | None:
    """ppo, sft, generation, generation_server or evaluation; None for a recipe's own trainer."""
    if command.module in ENTRY_POINTS:
        return ENTRY_POINTS[command.module][1]
    return "ppo" if composes_ppo_trainer(command) else None


def overrides_of(command: Command, fixtures: Fixtures) -> list[str]:
    """The key=value overrides, `{HOME}` and `{ROOT}` filled, Hydra's flags left out (Hydra's own parser)."""
    from verlx.trainer.entrypoint import override_args

    argv = [a.replace("{HOME}", fixtures.home).replace("{ROOT}", command.root) for a in command.argv]
    return override_args(argv)


def config_location(command: Command) -> tuple[str, str]:
    from verlx.config.loader import CONFIG_DIR

    name = command.config_name or DEFAULT_CONFIGS.get(command.module, "ppo_trainer")
    return command.config_dir or CONFIG_DIR, name.removesuffix(".yaml")


def run_command(command: Command, fixtures: Fixtures) -> Outcome:
    """Compose, type and preflight one command; what stopped it, if anything."""
    from verlx.utils.errors import VerlxError

    kind = kind_of(command)
    if kind is None:
        return Outcome(command, "refused", f"verlx does not support the recipe's own trainer {command.module} (its "
                       "config does not compose veRL's ppo_trainer)")
    try:
        with working_dir(command.root):  # relative paths (tool configs) as the command's working directory has them
            PREFLIGHTS[kind](command, fixtures)
    except VerlxError as e:
        return Outcome(command, "refused" if e.exit_code == 2 else "crash", str(e))
    except Exception as e:  # noqa: BLE001 - a crash is what the measure exists to find
        return Outcome(command, "crash", f"{type(e).__name__}: {e}")
    return Outcome(command, "pass")


def _compose(command: Command, fixtures: Fixtures, schema: type):
    from verlx.config.verl_compat.compose import compose_config

    config_dir, name = config_location(command)
    return compose_config(name, overrides_of(command, fixtures), schema, config_dir, log=False)


def _preflight_ppo(command: Command, fixtures: Fixtures) -> None:
    from verlx.config.schema import PPOConfig
    from verlx.trainer.preflight import validate

    cfg = _compose(command, fixtures, PPOConfig)
    point_ppo_paths_at(cfg, fixtures)
    validate(cfg)


def point_ppo_paths_at(cfg, fixtures: Fixtures) -> None:
    d, model = cfg.data, cfg.actor_rollout_ref.model
    d.train_files = fixtures.data_file
    d.val_files = None if d.val_files is None else fixtures.data_file
    model.path = fixtures.model_for(model.path)
    model.tokenizer_path = None if model.tokenizer_path is None else fixtures.model_dir
    if cfg.critic.model.path is not None:
        cfg.critic.model.path = fixtures.model_dir
    cfg.critic.model.tokenizer_path = None
    if cfg.custom_reward_function.path is not None:
        cfg.custom_reward_function.path = fixtures.reward_file
    rm = cfg.reward_model.model
    rm.path = None if rm.path is None else fixtures.model_dir
    for teacher in cfg.distillation.teacher_models.values():
        teacher.model_path = None if teacher.model_path is None else fixtures.model_for(teacher.model_path)
    rm.input_tokenizer = None if rm.input_tokenizer is None else fixtures.model_dir


def _preflight_sft(command: Command, fixtures: Fixtures) -> None:
    from verlx.config.sft import SFTConfig
    from verlx.trainer.preflight_sft import validate_sft

    cfg = _compose(command, fixtures, SFTConfig)
    cfg.data.train_files = fixtures.data_file
    cfg.data.val_files = None if cfg.data.val_files is None else fixtures.data_file
    cfg.model.partial_pretrain = fixtures.model_dir
    t = cfg.trainer
    validate_sft(cfg, (t.nnodes or 1) * (t.n_gpus_per_node or 8))


def _preflight_generation(command: Command, fixtures: Fixtures) -> None:
    from verlx.config.generation import GenerationConfig
    from verlx.trainer.main_generation import validate

    cfg = _compose(command, fixtures, GenerationConfig)
    cfg.data.path = fixtures.data_file
    cfg.model.path = fixtures.model_dir
    cfg.model.tokenizer_path = None
    validate(cfg)


def _preflight_generation_server(command: Command, fixtures: Fixtures) -> None:
    from verlx.trainer.main_generation import validate
    from verlx.trainer.main_generation_server import generation_config, load_server_config

    config_dir, name = config_location(command)
    ppo, output_path = load_server_config(name, overrides_of(command, fixtures), config_dir)
    point_ppo_paths_at(ppo, fixtures)
    validate(generation_config(ppo, output_path))


def _preflight_evaluation(command: Command, fixtures: Fixtures) -> None:
    """main_eval checks its input file as it reads it; composing and typing the config is its preflight."""
    from verlx.config.evaluation import EvaluationConfig

    _compose(command, fixtures, EvaluationConfig)


PREFLIGHTS = {"ppo": _preflight_ppo, "sft": _preflight_sft, "generation": _preflight_generation,
              "generation_server": _preflight_generation_server, "evaluation": _preflight_evaluation}


@contextlib.contextmanager
def working_dir(path: str):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def names_a_missing_feature(outcome: Outcome) -> bool:
    """A refusal every problem of which names a feature verlx lacks (a row of docs/verl_compat.md, or a preflight
    check of something verlx does not support), rather than a key it does not know."""
    if outcome.status != "refused":
        return False
    problems = [line for line in outcome.detail.splitlines() if line.strip().startswith("- ")] or [outcome.detail]
    return all("does not support" in p or "not supported" in p for p in problems)


# The stand-in model's shape: the preflight checks tensor, pipeline and Ulysses sizes against the model's heads and
# layers, so the stand-in admits the layouts used for 0.5B-671B models (heads and key/value heads divisible by
# 1-32, layers by pipeline × virtual-pipeline sizes up to 96).
# max_position_embeddings: the longest of the scripts' models (Llama 3.1's), so that the preflight's context check
# refuses nothing here that the real checkpoint would accept.
STAND_IN_SHAPE = {"hidden_size": 2048, "num_attention_heads": 64, "num_key_value_heads": 32,
                  "num_hidden_layers": 96, "intermediate_size": 4096, "vocab_size": 1024,
                  "max_position_embeddings": 131072}


def shaped_model_dir(path: str, architecture: dict | None = None) -> str:
    """The tiny model's tokenizer with a config.json of STAND_IN_SHAPE (no weights: nothing here loads them), and
    the fields of another `architecture` (ARCHITECTURE_STAND_INS) on top."""
    from helpers.tiny_tokenizer import save_tiny_qwen2

    save_tiny_qwen2(path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config.update(STAND_IN_SHAPE)
    config["head_dim"] = STAND_IN_SHAPE["hidden_size"] // STAND_IN_SHAPE["num_attention_heads"]
    config.update(architecture or {})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            os.remove(os.path.join(path, name))
    return path


# Hub names of vision-language checkpoints → the model_type of their stand-in (a config.json with a vision_config,
# which is what the preflight reads to tell a vision-language model), first match. Qwen3.5's checkpoints are
# vision-language ones; Qwen3-VL's mixtures of experts (30B-A3B, 235B-A22B) are qwen3_vl_moe.
VISION_STAND_INS = {r"qwen2\.5-vl|qwen2_5_vl": "qwen2_5_vl", r"qwen2-vl|qwen2_vl": "qwen2_vl",
                    r"qwen3-vl-\d+b-a\d+b|qwen3_vl_moe": "qwen3_vl_moe", r"qwen3-vl|qwen3_vl": "qwen3_vl",
                    r"glm-4\.1v|glm4v": "glm4v", r"kimi-vl": "kimi_vl", r"minicpm-[ov]": "minicpmo",
                    r"qwen3\.5|qwen3_5": "qwen3_5"}


# Hub names of text checkpoints whose architecture is not the Qwen2 stand-in's → what of their config.json the
# preflight reads (architecture, layers, experts; the stand-in's heads, which divide every script's layout), from
# the checkpoints' published configs, first match. Dense Qwen2/Qwen2.5/Qwen3/Llama models keep the Qwen2 stand-in:
# every path verlx takes for them is the same.
ARCHITECTURE_STAND_INS = {
    r"deepseek-(v3|r1)|dsv3": dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                              num_hidden_layers=61, n_routed_experts=256, num_experts_per_tok=8,
                              moe_intermediate_size=2048),
    r"moonlight": dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=27,
                       n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408),
    r"deepseek-v2-lite": dict(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"],
                              num_hidden_layers=27, n_routed_experts=64, num_experts_per_tok=6,
                              moe_intermediate_size=1408),
    r"gpt-oss-20b": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], num_hidden_layers=24,
                         num_local_experts=32, num_experts_per_tok=4),
    r"gpt-oss-120b": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], num_hidden_layers=36,
                          num_local_experts=128, num_experts_per_tok=4),
    r"qwen3-next": dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], num_hidden_layers=48,
                        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512),
    r"qwen3-235b-a22b": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=94,
                             num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536),
    r"qwen3-30b-a3b": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=48,
                           num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    r"qwen1\.5-moe-a2\.7b": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_hidden_layers=24,
                                num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408),
    r"mixtral-8x7b": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], num_hidden_layers=32,
                          num_local_experts=8, num_experts_per_tok=2),
    r"seed-oss-36b": dict(model_type="seed_oss", architectures=["SeedOssForCausalLM"], num_hidden_layers=64),
}


def vision_stand_in(path: str, model_type: str) -> str:
    """The text stand-in's files with a vision-language config.json: `model_type`, its shape as text_config, the
    vision fields the engines read (the hub's Qwen2-VL configs carry in_chans beside in_channels)."""
    shaped_model_dir(path)
    with open(os.path.join(path, "config.json")) as f:
        text = json.load(f)
    config = {"model_type": model_type, "architectures": [f"{model_type}_stand_in"], "text_config": text,
              "vision_config": {"depth": 2, "spatial_merge_size": 2, "in_chans": 3, "in_channels": 3},
              "image_token_id": 1}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def make_fixtures(directory: str) -> Fixtures:
    """A tiny model, a parquet file in veRL's RL schema and a reward-function file, under `directory`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = os.path.join(directory, "home")
    os.makedirs(home, exist_ok=True)
    model_dir = shaped_model_dir(os.path.join(directory, "model"))
    data_file = os.path.join(directory, "data.parquet")
    pq.write_table(pa.table({
        "prompt": [[{"role": "user", "content": "1+1=?"}]], "data_source": ["openai/gsm8k"],
        "reward_model": [{"ground_truth": "2", "style": "rule"}], "extra_info": [{"question": "1+1=?",
                                                                                 "answer": "#### 2"}]}), data_file)
    reward_file = os.path.join(directory, "reward.py")
    with open(reward_file, "w") as f:
        f.write("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    vision = {t: vision_stand_in(os.path.join(directory, f"model_{t}"), t) for t in set(VISION_STAND_INS.values())}
    architectures = {pattern: shaped_model_dir(os.path.join(directory, f"model_arch{i}"), fields)
                     for i, (pattern, fields) in enumerate(ARCHITECTURE_STAND_INS.items())}
    return Fixtures(home, data_file, model_dir, reward_file, vision, architectures)
