"""Pre-flight checks of the data keys verlx takes from veRL: data.gen_batch_size, data.custom_cls and data.sampler
(run before Ray by trainer/preflight; the classes themselves are loaded when the loaders are built, still before
Ray)."""

from __future__ import annotations

import os

from verlx.config.loader import Findings
from verlx.utils.paths import expand_path
from verlx.utils.user_code import PKG_PREFIX


def check_data_features(cfg, f: Findings, world_size: int, check_files: bool = True) -> None:
    data = cfg.data
    gen = data.gen_batch_size
    if gen is not None and f.require(gen > 0, f"data.gen_batch_size={gen} must be positive or null"):
        if cfg.algorithm.filter_groups.enable:
            samples = gen * cfg.actor_rollout_ref.rollout.n
            f.require(samples % world_size == 0,
                      f"data.gen_batch_size × rollout.n = {gen}×{cfg.actor_rollout_ref.rollout.n} = {samples} samples "
                      f"per generation round do not split over {world_size} workers; make it a multiple of "
                      f"{world_size}")
        else:
            f.require(gen == data.train_batch_size,
                      f"data.gen_batch_size={gen} differs from data.train_batch_size={data.train_batch_size} without "
                      "algorithm.filter_groups.enable=true: verlx generates more prompts than it trains on only to "
                      "replace the groups dynamic sampling drops. Set data.gen_batch_size=null, or "
                      f"data.train_batch_size={gen} to train on {gen} prompts per step (what veRL then does)")
    for key, location, name_key, name in (
            ("data.custom_cls.path", data.custom_cls.path, "data.custom_cls.name", data.custom_cls.name),
            ("data.sampler.class_path", data.sampler.class_path, "data.sampler.class_name", data.sampler.class_name)):
        if location is None:
            continue
        f.require(bool(name), f"{key}={location} needs {name_key} (the class to load from it)")
        if check_files and not location.startswith(PKG_PREFIX):
            path = expand_path(location.removeprefix("file://"))
            f.require(os.path.isfile(path), f"{key}: file {location!r} does not exist (a Python file, or "
                      "pkg://package.module)")
