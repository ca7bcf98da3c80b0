"""veRL's example command lines (tests/data/verl_scripts, written by benchmarks/verl_scripts_extract.py) composed,
typed and preflighted by verlx, without Ray, downloads or GPUs.

Each command keeps its argv as written, with `verl.` read as `verlx.`. The config directory of a script's own YAML
(a recipe's dapo_trainer.yaml) is its stored copy; veRL's own (verl/trainer/config) is verlx's. After composing,
the paths the preflight opens are pointed at tiny local stand-ins (`Fixtures`): every data file, the model, critic
and reward-model directories (and the reward model's input tokenizer), the reward-function file. Everything else is
checked as written: the batch arithmetic of the scripts' GPU counts, the names of estimators, losses and engines,
the refused and unknown keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections import Counter
from typing import Any

import yaml

REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = os.path.join(REPO_DIR, "tests", "data", "verl_scripts")
SETS = ("2026-01", "2026-08")
VERL_OWN_CONFIG_DIR = "verl/trainer/config"
HYDRA_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
# veRL entry point → (what verlx runs, the kind of config it composes)
ENTRY_POINTS = {
    "verl.trainer.main_ppo": ("verlx.trainer.main_ppo", "ppo"),
    "verl.trainer.fsdp_sft_trainer": ("verlx.trainer.fsdp_sft_trainer", "sft"),
    "verl.trainer.sft_trainer": ("verlx.trainer.sft_trainer", "sft"),
    "verl.trainer.main_generation": ("verlx.trainer.main_generation", "generation"),
    "verl.trainer.main_generation_server": ("verlx.trainer.main_generation_server", "generation_server"),
    "verl.trainer.main_eval": ("verlx.trainer.main_eval", "evaluation"),
}
PPO_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")


@dataclasses.dataclass(frozen=True)
class Command:
    set_name: str
    script: str
    module: str
    config_dir: str | None
    config_name: str | None
    argv: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.set_name}:{self.script}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    command: Command
    status: str  # "pass", "refused" (an error naming what to change) or "crash" (anything else)
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Fixtures:
    """The tiny local files that stand in for the scripts' data, models and reward functions."""

    home: str
    data_file: str
    model_dir: str
    reward_file: str


def load_commands(set_name: str) -> list[Command]:
    """The set's commands: veRL's trainer entry points (verl.trainer.*), and recipes' or experimental trainers whose
    config composes veRL's ppo_trainer (the others are trainers of their own: GKD, data preparation, ...)."""
    with open(os.path.join(DATA_DIR, set_name, "commands.json")) as f:
        data = json.load(f)
    commands = [Command(set_name, c["script"], c["module"], c["config_dir"], c["config_name"], tuple(c["argv"]))
                for c in data["commands"]]
    return [c for c in commands if c.module.startswith("verl.trainer.") or composes_ppo_trainer(c)]


def source(set_name: str) -> dict:
    with open(os.path.join(DATA_DIR, set_name, "commands.json")) as f:
        return json.load(f)["source"]


def stored_config_dir(command: Command) -> str | None:
    if command.config_dir in (None, VERL_OWN_CONFIG_DIR):
        return None
    return os.path.join(DATA_DIR, command.set_name, "configs", command.config_dir)


def composes_ppo_trainer(command: Command) -> bool:
    """The command's config is veRL's ppo_trainer, or a script's YAML whose defaults list leads to it."""
    name = (command.config_name or "").removesuffix(".yaml")
    directory = stored_config_dir(command)
    for _ in range(4):
        if name in PPO_CONFIGS:
            return True
        path = os.path.join(directory, f"{name}.yaml") if directory else None
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


# Values a cluster's environment gives a few scripts (SLURM_JOB_NUM_NODES, ARNOLD_WORKER_GPU, DIST_CKPT_PATH), empty
# in the stored commands: filled as such an environment would.
ENVIRONMENT_VALUES = {
    "trainer.nnodes": "2", "trainer.n_gpus_per_node": "8",
    "actor_rollout_ref.actor.megatron.dist_checkpointing_path": "{HOME}/dist_ckpt",
    "actor_rollout_ref.ref.megatron.dist_checkpointing_path": "{HOME}/dist_ckpt",
}


def substituted_argv(command: Command, fixtures: Fixtures) -> tuple[list[str], list[str]]:
    """(Hydra flags, overrides): placeholders filled ({HOME}, {VERL_ROOT}, ENVIRONMENT_VALUES, and a script's own
    `<path_to_x>` quoted so that Hydra reads it as text), the config-path flags left to `config_location`."""
    root = checkout_dir(command)
    argv = [_environment_value(a) for a in command.argv]
    argv = [_quote_placeholder(a.replace("{HOME}", fixtures.home).replace("{VERL_ROOT}", root)) for a in argv
            if a.strip()]  # a lone " " is a `\ ` typo at a line end: veRL's Hydra refuses it just the same
    flags, overrides, skip = [], [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in HYDRA_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{f}=" for f in HYDRA_FLAGS)):
            (flags if arg.startswith("-") else overrides).append(arg)
    return flags, overrides


def _environment_value(arg: str) -> str:
    key, sep, value = arg.partition("=")
    return f"{key}={ENVIRONMENT_VALUES[key]}" if sep and not value and key in ENVIRONMENT_VALUES else arg


def _quote_placeholder(arg: str) -> str:
    key, sep, value = arg.partition("=")
    return f"{key}='{value}'" if sep and value.startswith("<") and value.endswith(">") else arg


def checkout_dir(command: Command) -> str:
    """Where the stored copies of the scripts' own files live, as in the veRL checkout the scripts run from."""
    return os.path.join(DATA_DIR, command.set_name, "configs")


def config_location(command: Command, default_name: str) -> tuple[str, str]:
    """(config directory, config name) as verlx's entry point composes them: the script's own --config-path and
    --config-name when it passes them, else the entry point's default (veRL's fsdp_sft_trainer defaults to its
    sft_trainer.yaml, which verlx.trainer.fsdp_sft_trainer calls fsdp_sft_trainer.yaml)."""
    from verlx.config.loader import CONFIG_DIR

    named = any(a.split("=")[0] in ("--config-name", "-cn") for a in command.argv)
    name = command.config_name if named or stored_config_dir(command) else default_name
    return stored_config_dir(command) or CONFIG_DIR, (name or default_name).removesuffix(".yaml")


def run_command(command: Command, fixtures: Fixtures) -> Outcome:
    """Compose, type and preflight one command; what stopped it, if anything."""
    from verlx.config.loader import ConfigError, DataError
    from verlx.utils.registry import UnknownNameError

    kind = kind_of(command)
    if kind is None:
        return Outcome(command, "refused", f"verlx does not support the recipe's own trainer {command.module} (its "
                       "config does not compose veRL's ppo_trainer)")
    try:
        with _working_dir(checkout_dir(command)):  # relative paths of the scripts (tool configs) as in veRL
            PREFLIGHTS[kind](command, fixtures)
    except (ConfigError, DataError, UnknownNameError) as e:
        return Outcome(command, "refused", str(e))
    except Exception as e:  # noqa: BLE001 - a crash is what the suite exists to find
        return Outcome(command, "crash", f"{type(e).__name__}: {e}")
    return Outcome(command, "pass")


def _compose(command: Command, fixtures: Fixtures, schema: type, default_name: str):
    from verlx.config.verl_compat.compose import compose_config

    _, overrides = substituted_argv(command, fixtures)
    config_dir, name = config_location(command, default_name)
    return compose_config(name, overrides, schema, config_dir, log=False)


def _preflight_ppo(command: Command, fixtures: Fixtures) -> None:
    from verlx.config.schema import PPOConfig
    from verlx.trainer.preflight import validate

    cfg = _compose(command, fixtures, PPOConfig, "ppo_trainer")
    point_ppo_paths_at(cfg, fixtures)
    validate(cfg)


def point_ppo_paths_at(cfg, fixtures: Fixtures) -> None:
    d, model = cfg.data, cfg.actor_rollout_ref.model
    d.train_files = fixtures.data_file
    d.val_files = None if d.val_files is None else fixtures.data_file
    model.path = fixtures.model_dir
    model.tokenizer_path = None if model.tokenizer_path is None else fixtures.model_dir
    if cfg.critic.model.path is not None:
        cfg.critic.model.path = fixtures.model_dir
    cfg.critic.model.tokenizer_path = None
    if cfg.custom_reward_function.path is not None:
        cfg.custom_reward_function.path = fixtures.reward_file
    rm = cfg.reward_model.model
    rm.path = None if rm.path is None else fixtures.model_dir
    rm.input_tokenizer = None if rm.input_tokenizer is None else fixtures.model_dir


def _preflight_sft(command: Command, fixtures: Fixtures) -> None:
    from verlx.config.sft import SFTConfig
    from verlx.trainer.preflight_sft import validate_sft

    cfg = _compose(command, fixtures, SFTConfig, ENTRY_POINT_CONFIGS[command.module])
    cfg.data.train_files = fixtures.data_file
    cfg.data.val_files = None if cfg.data.val_files is None else fixtures.data_file
    cfg.model.partial_pretrain = fixtures.model_dir
    t = cfg.trainer
    validate_sft(cfg, (t.nnodes or 1) * (t.n_gpus_per_node or 8))


def _preflight_generation(command: Command, fixtures: Fixtures) -> None:
    from verlx.config.generation import GenerationConfig
    from verlx.trainer.main_generation import validate

    cfg = _compose(command, fixtures, GenerationConfig, "generation")
    cfg.data.path = fixtures.data_file
    cfg.model.path = fixtures.model_dir
    cfg.model.tokenizer_path = None
    validate(cfg)


def _preflight_generation_server(command: Command, fixtures: Fixtures) -> None:
    from verlx.trainer.main_generation import validate
    from verlx.trainer.main_generation_server import generation_config, load_server_config

    _, overrides = substituted_argv(command, fixtures)
    config_dir, name = config_location(command, "ppo_trainer")
    ppo, output_path = load_server_config(name, overrides, config_dir)
    point_ppo_paths_at(ppo, fixtures)
    validate(generation_config(ppo, output_path))


def _preflight_evaluation(command: Command, fixtures: Fixtures) -> None:
    """main_eval checks its input file as it reads it; composing and typing the config is its preflight."""
    from verlx.config.evaluation import EvaluationConfig

    _compose(command, fixtures, EvaluationConfig, "evaluation")


PREFLIGHTS = {"ppo": _preflight_ppo, "sft": _preflight_sft, "generation": _preflight_generation,
              "generation_server": _preflight_generation_server, "evaluation": _preflight_evaluation}
ENTRY_POINT_CONFIGS = {"verl.trainer.fsdp_sft_trainer": "fsdp_sft_trainer",
                       "verl.trainer.sft_trainer": "sft_trainer_engine"}


@contextlib.contextmanager
def _working_dir(path: str):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def run_set(set_name: str, fixtures: Fixtures) -> list[Outcome]:
    """Every command of the set, in this process (warnings silenced: thousands of "ignored" lines)."""
    import logging

    logging.disable(logging.WARNING)
    return [run_command(c, fixtures) for c in load_commands(set_name)]


def run_sets(fixtures: Fixtures, sets: tuple[str, ...] = SETS) -> dict[str, list[Outcome]]:
    """run_set for each set, in a process of its own (one per CPU core CI has): composing is CPU-bound Python."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(len(sets), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {s: pool.submit(run_set, s, fixtures) for s in sets}
        return {s: f.result() for s, f in futures.items()}


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts per status, and the most frequent first problem lines of the refusals and crashes."""
    counts = Counter(o.status for o in outcomes)
    reasons = Counter(_first_problem(o.detail) for o in outcomes if o.status != "pass")
    return {"total": len(outcomes), **{s: counts.get(s, 0) for s in ("pass", "refused", "crash")},
            "reasons": reasons.most_common()}


def _first_problem(detail: str) -> str:
    lines = [line.strip(" -") for line in detail.splitlines() if line.strip()]
    text = lines[1] if len(lines) > 1 and lines[0].startswith("invalid config") else (lines[0] if lines else "")
    return text.split(" (set at ")[0].split("=")[0] if "verlx does not support" in text else text[:160]


def blockers(outcome: Outcome) -> set[str]:
    """What stops a command, one name per missing feature (or per other problem)."""
    import re

    names = set()
    lines = [line.strip()[2:] for line in outcome.detail.splitlines() if line.strip().startswith("- ")]
    for line in lines or [outcome.detail]:
        feature = re.search(r"does not support (.*?) yet", line)
        names.add(feature.group(1) if feature else line.split(" (set at ")[0][:120])
    return names


def blocker_table(outcomes: list[Outcome]) -> list[tuple[str, int, int]]:
    """(blocker, commands it blocks, commands it alone blocks), most blocking first."""
    blocked = [blockers(o) for o in outcomes if o.status != "pass"]
    names = Counter(name for found in blocked for name in found)
    alone = Counter(next(iter(found)) for found in blocked if len(found) == 1)
    return [(name, n, alone.get(name, 0)) for name, n in names.most_common()]


# Stored commands that veRL itself refuses at their commit (read from its configs and the scripts), with why: verlx
# refuses them too, naming the key, and they are counted apart from the refusals of what verlx lacks.
_NOT_IN_STRUCT = "Hydra refuses to override a key veRL's config does not have (no '+')"
REFUSED_BY_VERL = {
    ("2026-01", "examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh"):
        f"actor_rollout_ref.model.torch_dtype is no key of veRL's hf_model.yaml at b178a3cd5: {_NOT_IN_STRUCT}",
    ("2026-01", "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh"):
        "actor_rollout_ref.actor.use_kl_loss=${use_kl_loss} with use_kl_loss never set in the script: '' is no "
        "boolean for veRL's typed ActorConfig",
    **{("2026-01", f"examples/rollout_correction/{name}.sh"):
       "veRL's FSDP worker (trainer.use_legacy_worker_impl=auto at b178a3cd5) asserts that "
       "ppo_micro_batch_size_per_gpu=8 divides the 32 × 1 / 8 = 4 samples each GPU gets per mini-batch"
       for name in ("run_with_rollout_corr", "run_with_rollout_corr_multi_rs")},
    ("2026-08", "examples/router_replay/run_qwen3_30b_a3b_megatron.sh"):
        f"actor_rollout_ref.actor.model_engine is no key of veRL's actor config at 1dda039b9: {_NOT_IN_STRUCT}",
    ("2026-08", "examples/tuning/scaling/run_qwen2_5_32b_megatron.sh"):
        f"actor_rollout_ref.actor.model_engine is no key of veRL's actor config at 1dda039b9: {_NOT_IN_STRUCT}",
}


def refused_by_verl(outcome: Outcome) -> bool:
    return outcome.status == "refused" and (outcome.command.set_name, outcome.command.script) in REFUSED_BY_VERL


def documented_refusal(outcome: Outcome) -> bool:
    """Every problem of the refusal names a feature verlx lacks (a row of docs/verl_compat.md, or a preflight check
    of something verlx does not support) rather than a key it does not know or a crash; or veRL refuses the command
    too (REFUSED_BY_VERL)."""
    if outcome.status != "refused":
        return False
    if refused_by_verl(outcome):
        return True
    problems = [line for line in outcome.detail.splitlines() if line.strip().startswith("- ")] or [outcome.detail]
    return all("does not support" in p or "not supported" in p for p in problems)


# The stand-in model's shape: the preflight checks the scripts' tensor, pipeline and Ulysses sizes against the
# model's heads and layers, so the stand-in admits the layouts the scripts use for their 0.5B-671B models
# (heads and key/value heads divisible by 1-32, layers by pipeline × virtual-pipeline sizes up to 96).
STAND_IN_SHAPE = {"hidden_size": 2048, "num_attention_heads": 64, "num_key_value_heads": 32,
                  "num_hidden_layers": 96, "intermediate_size": 4096, "vocab_size": 1024}


def shaped_model_dir(path: str) -> str:
    """The tiny model's tokenizer with a config.json of STAND_IN_SHAPE (no weights: nothing here loads them)."""
    from helpers.tiny_tokenizer import save_tiny_qwen2

    save_tiny_qwen2(path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config.update(STAND_IN_SHAPE)
    config["head_dim"] = STAND_IN_SHAPE["hidden_size"] // STAND_IN_SHAPE["num_attention_heads"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            os.remove(os.path.join(path, name))
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
    return Fixtures(home, data_file, model_dir, reward_file)


def main() -> None:
    """Print the counts per set and the most frequent reasons (`python tests/helpers/verl_scripts.py`)."""
    import argparse
    import logging
    import sys
    import tempfile

    sys.path[:0] = [REPO_DIR, os.path.join(REPO_DIR, "tests")]
    logging.disable(logging.WARNING)
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--json", help="write every outcome here")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    everything = []
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = make_fixtures(tmp)
        for set_name, outcomes in run_sets(fixtures).items():
            everything += outcomes
            s = summary(outcomes)
            print(f"{set_name}: {s['pass']}/{s['total']} compose and pass preflight, {s['refused']} refused "
                  f"({sum(documented_refusal(o) for o in outcomes)} naming a missing feature or refused by veRL too: "
                  f"{sum(refused_by_verl(o) for o in outcomes)}), {s['crash']} crashed")
            print("  blocks  alone  blocker")
            for name, n, alone in blocker_table(outcomes)[:args.top]:
                print(f"  {n:6d} {alone:6d}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"set": o.command.set_name, "script": o.command.script, "module": o.command.module,
                        "status": o.status, "detail": o.detail} for o in everything], f, indent=1)


if __name__ == "__main__":
    main()
