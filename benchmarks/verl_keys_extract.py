"""Write the keys (with their defaults) of veRL's own trainer configs out as test data (run once, from local copies).

Composes, with Hydra, each config of the veRL 0.9.1 wheel's verl/trainer/config (ppo_trainer with every
model_engine, sft_trainer_engine, evaluation) and of the 2026-01 veRL repository's older configs that 0.9.1 dropped
(sft_trainer.yaml of fsdp_sft_trainer, generation.yaml, and its ppo_trainer with the reward_model section of that
time); every leaf key is written with its default as written (interpolations unresolved). The config groups a
command line can pick (model_engine=megatron, engine=fsdp, ...) are listed too.
tests/unit/test_verl_compat.py checks that the compatibility table (verlx.config.verl_compat) has a row for each.

    python benchmarks/verl_keys_extract.py --wheel /tmp/verl091      # rewrites tests/data/verl_keys.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data", "verl_keys.json")
OLDER = {"mirror": "/work/.mirror/volcengine+verl/repo", "commit": "b178a3cd56f58b2d502255daba591e92833930a7"}
# (label, config name, overrides) composed from the 0.9.1 wheel
WHEEL_CONFIGS = [
    ("ppo_trainer", "ppo_trainer", []),
    ("ppo_trainer model_engine=megatron", "ppo_trainer", ["model_engine=megatron"]),
    ("ppo_trainer model_engine=torchtitan", "ppo_trainer", ["model_engine=torchtitan"]),
    ("ppo_trainer model_engine=veomni", "ppo_trainer", ["model_engine=veomni"]),
    ("sft_trainer_engine", "sft_trainer_engine", []),
    ("sft_trainer_engine engine=megatron", "sft_trainer_engine", ["engine=megatron", "optim=megatron"]),
    ("evaluation", "evaluation", []),
]
OLDER_CONFIGS = [("ppo_trainer", "ppo_trainer", []), ("sft_trainer", "sft_trainer", []),
                 ("generation", "generation", [])]


def leaves(node, prefix: str = "") -> dict[str, object]:
    """Dotted key → default of every leaf; an empty mapping is a leaf ({}), a list is a value."""
    if isinstance(node, dict) and node:
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def compose(config_dir: str, name: str, overrides: list[str]) -> dict[str, object]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = hydra_compose(config_name=name, overrides=overrides)
    return leaves(OmegaConf.to_container(cfg, resolve=False))


def config_groups(config_dir: str) -> dict[str, list[str]]:
    return {group: sorted(f[:-5] for f in os.listdir(os.path.join(config_dir, group)) if f.endswith(".yaml"))
            for group in sorted(os.listdir(config_dir)) if os.path.isdir(os.path.join(config_dir, group))
            and not group.startswith("_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", default="/tmp/verl091", help="the unpacked veRL 0.9.1 wheel")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    wheel_dir = os.path.join(args.wheel, "verl", "trainer", "config")
    with open(os.path.join(args.wheel, "verl-0.9.1.dist-info", "METADATA")) as f:
        version = next(line.split(":", 1)[1].strip() for line in f if line.startswith("Version:"))
    data = {"verl_version": version,
            "source": f"veRL {version} wheel, verl/trainer/config; older configs from veRL commit {OLDER['commit']}",
            "configs": {label: compose(wheel_dir, name, overrides) for label, name, overrides in WHEEL_CONFIGS},
            "groups": config_groups(wheel_dir), "older_configs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", OLDER["mirror"], "archive", OLDER["commit"], "verl/trainer/config"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        older_dir = os.path.join(tmp, "verl", "trainer", "config")
        data["older_configs"] = {label: compose(older_dir, name, overrides) for label, name, overrides in OLDER_CONFIGS}
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    counts = {label: len(keys) for label, keys in {**data["configs"], **data["older_configs"]}.items()}
    print(f"veRL {version}: {counts}")


if __name__ == "__main__":
    main()
