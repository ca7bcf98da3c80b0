"""How many of veRL's own example launch scripts verlx composes and preflights, read from a veRL checkout given on
the command line (issue 23's measure; nothing of veRL is stored in this repository).

For each set, the checkout (and its recipe submodule) is written into a temporary directory, its scripts' trainer
command lines are extracted there (benchmarks/verl_scripts_extract.py), and each one is composed, typed and
preflighted by verlx in this process, `verl.` read as `verlx.`, without Ray, downloads or GPUs
(tests/helpers/launch_commands.py). Printed per set: how many pass, how many are refused naming a feature verlx lacks
(or refused by veRL itself), how many crash, and the features that block the others.

    python benchmarks/verl_scripts.py --set 2026-01 --set 2026-08          # the local mirrors of the two sets
    python benchmarks/verl_scripts.py --verl-git ~/verl.git --verl-commit b178a3cd5 --recipe-git ~/verl-recipe.git
    python benchmarks/verl_scripts.py --verl-checkout ~/verl                # a work tree, recipe/ included
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests"), os.path.dirname(os.path.abspath(__file__))]

from verl_scripts_extract import Source, extract, submodule_commit  # noqa: E402

from helpers.launch_commands import (  # noqa: E402
    DEFAULT_CONFIGS,
    Command,
    Fixtures,
    Outcome,
    kind_of,
    make_fixtures,
    names_a_missing_feature,
    run_command,
)

MIRRORS = "/work/.mirror"
# The two sets issue 23 names: veRL before and after its 2026 config layout (the recipe commit is the submodule's)
SETS = {
    "2026-01": (Source(f"{MIRRORS}/volcengine+verl/repo", "b178a3cd56f58b2d502255daba591e92833930a7"),
                f"{MIRRORS}/verl-project+verl-recipe/repo"),
    "2026-08": (Source(f"{MIRRORS}/verl-project+verl/repo", "1dda039b9c6311889a9c9a26040677e1254814f9"),
                f"{MIRRORS}/verl-project+verl-recipe/repo"),
}
VERL_OWN_CONFIG_DIR = "verl/trainer/config"
HYDRA_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
# Values a cluster's environment gives a few scripts (SLURM_JOB_NUM_NODES, ARNOLD_WORKER_GPU, DIST_CKPT_PATH), empty
# in the extracted commands: filled as such an environment would.
ENVIRONMENT_VALUES = {
    "trainer.nnodes": "2", "trainer.n_gpus_per_node": "8",
    "actor_rollout_ref.actor.megatron.dist_checkpointing_path": "{HOME}/dist_ckpt",
    "actor_rollout_ref.ref.megatron.dist_checkpointing_path": "{HOME}/dist_ckpt",
}
# Commands that veRL itself refuses at their commit (read from its configs and the scripts), with why: where verlx
# refuses them too, naming the key, they are counted apart from the refusals of what verlx lacks (verlx reads the
# two scripts' actor_rollout_ref.actor.model_engine as the model_engine group their authors meant).
_NOT_IN_STRUCT = "Hydra refuses to override a key veRL's config does not have (no '+')"
REFUSED_BY_VERL = {
    ("b178a3cd5", "examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh"):
        f"actor_rollout_ref.model.torch_dtype is no key of veRL's hf_model.yaml at b178a3cd5: {_NOT_IN_STRUCT}",
    ("b178a3cd5", "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh"):
        "actor_rollout_ref.actor.use_kl_loss=${use_kl_loss} with use_kl_loss never set in the script: '' is no "
        "boolean for veRL's typed ActorConfig",
    **{("b178a3cd5", f"examples/rollout_correction/{name}.sh"):
       "veRL's FSDP worker (trainer.use_legacy_worker_impl=auto at b178a3cd5) asserts that "
       "ppo_micro_batch_size_per_gpu=8 divides the 32 × 1 / 8 = 4 samples each GPU gets per mini-batch"
       for name in ("run_with_rollout_corr", "run_with_rollout_corr_multi_rs")},
    **{("1dda039b9", f"examples/rollout_correction/{name}.sh"):
       "veRL's engine worker (verl/workers/engine/utils.py prepare_micro_batches at 1dda039b9) asserts that "
       "ppo_micro_batch_size_per_gpu=8 divides the 32 × 1 / 8 = 4 samples each GPU gets per mini-batch"
       for name in ("run_qwen2_5_7b_fsdp", "run_qwen2_5_7b_fsdp_multi_rs")},
    ("1dda039b9", "examples/router_replay/run_qwen3_30b_a3b_megatron.sh"):
        f"actor_rollout_ref.actor.model_engine is no key of veRL's actor config at 1dda039b9: {_NOT_IN_STRUCT}",
    ("1dda039b9", "examples/tuning/scaling/run_qwen2_5_32b_megatron.sh"):
        f"actor_rollout_ref.actor.model_engine is no key of veRL's actor config at 1dda039b9: {_NOT_IN_STRUCT}",
    ("1dda039b9", "recipe/dapo/run_dapo_qwen2.5_32b_rollout_corr.sh"):
        "algorithm.rollout_correction.rollout_rs_threshold_lower and rollout_token_veto_threshold are no keys of "
        f"veRL's algorithm/rollout_correction.yaml at 1dda039b9 nor of the DAPO recipe's config: {_NOT_IN_STRUCT}",
    ("1dda039b9", "examples/remax_trainer/run_qwen2.5_math_7b_sync_fsdp.sh"):
        "python3 -m verl.trainer.main_ppo_sync: no such module in veRL at 1dda039b9 (verl/trainer/ has main_ppo and "
        "main_ppo_v0)",
}


def as_command(extracted: dict, root: str, label: str) -> Command:
    """An extracted command as the measure runs it: veRL's own config directory read as verlx's, a script's own in
    the checkout; the config name kept where the script names it, has a config directory of its own or runs a
    recipe's trainer (else the entry point's default: veRL's fsdp_sft_trainer names sft_trainer, verlx's its own);
    the overrides only, with cluster-given values and `<placeholders>` filled."""
    config_dir = extracted["config_dir"]
    own = config_dir not in (None, VERL_OWN_CONFIG_DIR)
    named = any(a.split("=")[0] in ("--config-name", "-cn") for a in extracted["argv"])
    argv = [_environment_value(a).replace("{ROOT}", root) for a in extracted["argv"]]
    overrides, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in HYDRA_FLAGS:
            skip = True
        elif arg.strip() and not arg.startswith("-"):  # a lone " " is a `\ ` typo at a line end, refused by veRL too
            overrides.append(_quote_placeholder(arg))
    return Command(f"{label}:{extracted['script']}", extracted["module"], tuple(overrides),
                   extracted["cwd"].replace("{ROOT}", root), os.path.join(root, config_dir) if own else None,
                   extracted["config_name"] if named or own or extracted["module"] not in DEFAULT_CONFIGS else None)


def _environment_value(arg: str) -> str:
    key, sep, value = arg.partition("=")
    return f"{key}={ENVIRONMENT_VALUES[key]}" if sep and not value and key in ENVIRONMENT_VALUES else arg


def _quote_placeholder(arg: str) -> str:
    """A script's own `key=<path_to_x>` quoted, so that Hydra reads it as text."""
    key, sep, value = arg.partition("=")
    return f"{key}='{value}'" if sep and value.startswith("<") and value.endswith(">") else arg


# Refusal families: problems that name one missing feature in different words (a key per role, per value) counted
# as one. A problem in none of these is its own family: the feature a table row names, else its first words.
FAMILIES = (
    (r"optimizer_cpu_offload", "megatron CPU offload"),
    (r"needs transformer-engine", "transformer-engine options (not installed here)"),
    (r"needs DeepEP", "DeepEP options (not installed here)"),
    (r"context_parallel_size|context-parallel", "megatron context parallelism"),
    (r"multi_turn\.enable=true with actor_rollout_ref\.rollout\.name=vllm", "multi-turn tools on vLLM without async"),
    (r"=nsys: the nsys command", "Nsight Systems (nsys) not installed here"),
    (r"profiler\.tool=", "profiler tools verlx lacks (npu, precision_debugger)"),
    (r"in_pipeline_split", "megatron's uneven pipeline split"),
    (r"megatron engine does not support that architecture", "megatron with other architectures (DeepSeek-V3, "
     "GPT-OSS, Qwen3-Next, Qwen1.5-MoE)"),
    (r"veRL's own classes", "veRL's own classes (tools, agent loops, reward managers)"),
    (r"needs a rollout engine that takes image inputs", "image input of the rollout engine (vision-language models on "
     "the native engine, or vLLM in server mode)"),
)


def family(problem: str) -> str:
    for pattern, name in FAMILIES:
        if re.search(pattern, problem):
            return name
    feature = re.search(r"does not support (.*?) yet", problem)
    return feature.group(1) if feature else re.sub(r"actor_rollout_ref\.(actor|ref|rollout)\.", "",
                                                   problem.split(" (set at ")[0])[:110]


def families(outcome: Outcome) -> set[str]:
    problems = [line.strip()[2:] for line in outcome.detail.splitlines() if line.strip().startswith("- ")]
    return {family(p) for p in problems or [outcome.detail]}


def family_table(outcomes: list[Outcome]) -> list[tuple[str, int, int]]:
    """(family, commands it blocks, commands it alone blocks), most blocking first."""
    blocked = [families(o) for o in outcomes if o.status != "pass"]
    names = Counter(name for found in blocked for name in found)
    alone = Counter(next(iter(found)) for found in blocked if len(found) == 1)
    return [(name, n, alone.get(name, 0)) for name, n in names.most_common()]


def refused_by_verl(outcome: Outcome, commit: str) -> bool:
    script = outcome.command.label.split(":", 1)[1]
    return outcome.status == "refused" and (commit[:9], script) in REFUSED_BY_VERL


def measure(verl: Source, recipe: Source | None, fixtures: Fixtures, label: str, only: str | None
            ) -> tuple[list[Outcome], int]:
    """The outcome of each trainer command whose config is veRL's (recipes' own trainers are left out), and the
    number of scripts that launched no trainer."""
    with tempfile.TemporaryDirectory() as workdir:
        root, extracted, skipped = extract(verl, recipe, workdir, only)
        commands = [as_command(c, root, label) for c in extracted]
        commands = [c for c in commands if c.module.startswith("verl.trainer.") or kind_of(c) is not None]
        return [run_command(c, fixtures) for c in commands], len(skipped)


def report(label: str, verl: Source, recipe: Source | None, outcomes: list[Outcome], skipped: int, top: int) -> None:
    s = Counter(o.status for o in outcomes)
    s["total"] = len(outcomes)
    by_verl = sum(refused_by_verl(o, verl.commit or "") for o in outcomes)
    feature = sum(names_a_missing_feature(o) for o in outcomes if not refused_by_verl(o, verl.commit or ""))
    print(f"{label}: veRL {verl.describe()}, recipe {recipe.describe() if recipe else '(in the checkout)'}")
    print(f"  {s['pass']}/{s['total']} compose and pass preflight ({s['pass'] / max(s['total'], 1):.0%}); "
          f"{s['refused']} refused: {feature} naming a missing feature, {by_verl} refused by veRL too, "
          f"{s['refused'] - feature - by_verl} otherwise; {s['crash']} crashed; {skipped} scripts launch no trainer")
    print("  blocks  alone  refusal family")
    for name, n, alone in family_table(outcomes)[:top]:
        print(f"  {n:6d} {alone:6d}  {name}")


def sources(args) -> list[tuple[str, Source, Source | None]]:
    chosen = []
    for name in args.set or []:
        verl, recipe_git = SETS[name]
        chosen.append((name, verl, Source(recipe_git, submodule_commit(verl))))
    if args.verl_checkout or args.verl_git:
        verl = Source(args.verl_checkout) if args.verl_checkout else Source(args.verl_git, args.verl_commit)
        recipe = None
        if args.recipe_checkout:
            recipe = Source(args.recipe_checkout)
        elif args.recipe_git:
            recipe = Source(args.recipe_git, args.recipe_commit or submodule_commit(verl))
        chosen.append((args.label, verl, recipe))
    if not chosen:
        raise SystemExit("give --set, --verl-checkout DIR or --verl-git DIR --verl-commit COMMIT")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", choices=sorted(SETS), help="a set issue 23 names (local mirrors)")
    parser.add_argument("--verl-checkout", help="a veRL work tree (copied; recipe/ as it is, or --recipe-*)")
    parser.add_argument("--verl-git", help="a veRL git repository (bare or not), with --verl-commit")
    parser.add_argument("--verl-commit")
    parser.add_argument("--recipe-checkout", help="a verl-recipe work tree, put at recipe/")
    parser.add_argument("--recipe-git", help="a verl-recipe git repository; --recipe-commit, else the submodule's")
    parser.add_argument("--recipe-commit")
    parser.add_argument("--label", default="checkout")
    parser.add_argument("--only", help="a regex of script paths: measure those alone")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", help="write every outcome here")
    args = parser.parse_args()
    if args.verl_git and not args.verl_commit:
        parser.error("--verl-git needs --verl-commit")
    logging.disable(logging.WARNING)  # thousands of "ignored" and "mapped" lines
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    everything = []
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = make_fixtures(tmp)
        for label, verl, recipe in sources(args):
            outcomes, skipped = measure(verl, recipe, fixtures, label, args.only)
            report(label, verl, recipe, outcomes, skipped, args.top)
            everything += outcomes
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"command": o.command.label, "module": o.command.module, "status": o.status,
                        "detail": o.detail} for o in everything], f, indent=1)


if __name__ == "__main__":
    main()
