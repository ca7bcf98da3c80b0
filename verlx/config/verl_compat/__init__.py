"""veRL compatibility table: what verlx does with every key of veRL's configs and example scripts.

A key of veRL's that verlx's typed config declares under the same name is implemented; every other one has a row
(verlx.config.legacy_keys says the kinds). The table covers veRL 0.9.1 (VERL_VERSION) and the older keys its
example scripts still use; tests/unit/test_verl_compat.py checks that every key of veRL 0.9.1's trainer configs
has a row, and `python -m verlx.config.verl_compat.docs` renders docs/verl_compat.md. Adding a feature = changing
its row (a Refused row becomes a Moved row, or goes away once the key is verlx's own).
"""

from __future__ import annotations

from verlx.config.legacy_keys import KeyTable
from verlx.config.verl_compat import generation, ppo_recipes, ppo_roles, ppo_rollout, ppo_run, sft

VERL_VERSION = "0.9.1"

PPO_TABLE = KeyTable(ppo_roles.ROWS + ppo_rollout.ROWS + ppo_run.ROWS + ppo_recipes.ROWS)
SFT_TABLE = KeyTable(sft.ROWS)
GENERATION_TABLE = KeyTable(generation.GENERATION)
EVALUATION_TABLE = KeyTable(generation.EVALUATION)
TABLES = {"PPOConfig": PPO_TABLE, "SFTConfig": SFT_TABLE, "GenerationConfig": GENERATION_TABLE,
          "EvaluationConfig": EVALUATION_TABLE}

# veRL's config-group options (`model_engine=megatron`, `engine=fsdp`, ...) per entry point, and what verlx has
# for each: None for an option verlx runs (a group of verlx/config, or what verlx always does), else the feature
# verlx lacks.
GROUP_OPTIONS = {
    "PPOConfig": {
        "model_engine": {"dp": None, "megatron": None, "torchtitan": "veRL's torchtitan training engine",
                         "veomni": "veRL's VeOmni training engine"},
        "actor": {"mlite_actor": "veRL's Megatron-Lite engine"},
        "ref": {"mlite_ref": "veRL's Megatron-Lite engine"},
        "critic": {"mlite_critic": "veRL's Megatron-Lite engine"},
    },
    "SFTConfig": {
        "engine": {"fsdp": None, "megatron": "megatron SFT", "torchtitan": "veRL's torchtitan training engine",
                   "veomni": "veRL's VeOmni training engine", "automodel": "veRL's AutoModel training engine"},
        "optim": {"fsdp": None, "megatron": "megatron SFT", "torchtitan": "veRL's torchtitan training engine",
                  "veomni": "veRL's VeOmni training engine", "automodel": "veRL's AutoModel training engine"},
        "model": {"hf_model": None},
    },
}


def table_for(schema: type) -> KeyTable:
    """The rows of the entry point whose typed config is `schema`."""
    return TABLES.get(schema.__name__, KeyTable(()))


def group_options(schema: type) -> dict[str, dict[str, str | None]]:
    return GROUP_OPTIONS.get(schema.__name__, {})


def group_option_problem(hydra_message: str) -> str | None:
    """The missing feature behind Hydra's "Could not find 'group/option'", when the option is veRL's."""
    for options_of in GROUP_OPTIONS.values():
        for group, options in options_of.items():
            for option, missing in options.items():
                if missing and f"{group}/{option}" in hydra_message:
                    return option_problem(group, option, options)
    return None


def option_problem(group: str, option: str, options: dict[str, str | None]) -> str:
    have = [o for o, m in options.items() if m is None]
    missing = options.get(option)
    what = f"verlx does not support {missing} yet" if missing else "veRL has no such option"
    return f"{group}={option}: {what}; verlx's {group} options are {have} (docs/verl_compat.md)"
