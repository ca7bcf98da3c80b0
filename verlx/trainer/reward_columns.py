"""The columns the built-in reward scores read, checked in every row when the data is loaded (before Ray): a
data_source they know and a reward_model.ground_truth to compare with. Without this a missing ground truth was
found by the reward step, after the model was built and a batch generated, and named by batch sample instead of
file row. A custom reward function (custom_reward_function.path) or a reward model decides for itself."""

from __future__ import annotations

from verlx.config.loader import DataError


def reward_column_problems(config, dataset, files_key: str) -> list[str]:
    """One problem per kind (the first row named, the rows counted) for the rows built-in scores cannot score."""
    from verlx.reward.scores import SCORE_FUNCTIONS

    if config.custom_reward_function.path or config.reward_model.enable or not hasattr(dataset, "column"):
        return []
    source_key = config.data.reward_fn_key
    sources, infos = dataset.column(source_key), dataset.column("reward_model")
    if sources is None:
        return []  # the loader names a missing data.reward_fn_key column
    known = set(SCORE_FUNCTIONS.names())
    unknown = [i for i, source in enumerate(sources) if source not in known]
    no_truth = [i for i in range(len(sources)) if not _has_ground_truth(None if infos is None else infos[i])]
    problems = []
    if unknown:
        problems.append(f"{_where(dataset, unknown[0], files_key)}: {source_key}={sources[unknown[0]]!r} has no "
                        f"built-in reward score ({len(unknown)} of {len(sources)} rows; built-in: "
                        f"{', '.join(sorted(known))}). Set custom_reward_function.path to a file with "
                        "compute_score(data_source, solution_str, ground_truth, extra_info), or fix data.reward_fn_key")
    if no_truth:
        problems.append(f"{_where(dataset, no_truth[0], files_key)}: no reward_model.ground_truth, which the built-in "
                        f"score compares responses with ({len(no_truth)} of {len(sources)} rows). Add it (the scripts "
                        "in examples/data_preprocess write it), or score with custom_reward_function.path")
    return problems


def _has_ground_truth(info) -> bool:
    return isinstance(info, dict) and info.get("ground_truth") is not None


def _where(dataset, i: int, files_key: str) -> str:
    if hasattr(dataset, "origin"):
        file, row = dataset.origin(i)
        return f"{file} row {row}"
    return f"{files_key} row {i}"


def check_reward_columns(config, train_dataset, val_dataset) -> None:
    problems = reward_column_problems(config, train_dataset, "data.train_files")
    if val_dataset is not None:
        problems += reward_column_problems(config, val_dataset, "data.val_files")
    if problems:
        raise DataError("; ".join(problems))
