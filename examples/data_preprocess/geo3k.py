"""Geometry3K (hiyouga/geometry3k) → train.parquet / test.parquet in veRL's vision-language schema.

    python examples/data_preprocess/geo3k.py --local_dataset_path /path/to/geometry3k --local_save_dir ~/data/geo3k

Each row of the source has `images` (a list of {"bytes", "path"}), `problem` (text with one `<image>` per image)
and `answer`. The output rows are veRL's geo3k rows: the problem and an instruction to think in <think></think>
and box the answer as the one user message, the images as they are (data.image_key=images), data_source
hiyouga/geometry3k (scored by verlx's geo3k rule), the answer as ground truth. --local_dataset_path is a directory
with train and test parquet files (train.parquet or the hub's data/train-00000-of-00001.parquet layout) or one such
file; without it the data comes from the HF hub (needs the `datasets` package and network access).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

try:
    from verlx.config.loader import DataError
    from verlx.data.parquet import read_parquet_table, write_parquet_atomic
except ImportError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from verlx.config.loader import DataError
    from verlx.data.parquet import read_parquet_table, write_parquet_atomic

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE "
               "put in \\boxed{}.")
SPLITS = ("train", "test")
COLUMNS = ("images", "problem", "answer")


def to_row(example: dict, split: str, index: int, where: str) -> dict:
    problem, answer, images = example.get("problem"), example.get("answer"), example.get("images")
    if not (isinstance(problem, str) and isinstance(answer, str) and isinstance(images, list)):
        raise DataError(f"{where}: expected 'problem' and 'answer' strings and an 'images' list, got "
                        f"{str({k: type(v).__name__ for k, v in example.items()})}")
    if problem.count("<image>") != len(images):
        raise DataError(f"{where}: the problem has {problem.count('<image>')} <image> placeholders for "
                        f"{len(images)} images")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def local_splits(path: str) -> dict[str, str]:
    """split name → parquet file, from a directory (both splits) or one file (its split, from its name)."""
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        split = next((s for s in SPLITS if os.path.basename(path).startswith(s)), None)
        if split is None:
            raise DataError(f"cannot tell the split of {path}: its name should start with 'train' or 'test'")
        return {split: path}
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--local_dataset_path {path} is neither a file nor a directory")
    files = {}
    for split in SPLITS:
        found = sorted(glob.glob(os.path.join(path, f"{split}.parquet")) +
                       glob.glob(os.path.join(path, "**", f"{split}-*.parquet"), recursive=True))
        if not found:
            raise FileNotFoundError(f"{path} has no {split} file (looked for {split}.parquet, **/{split}-*.parquet)")
        files[split] = found[0]
    return files


def hub_splits() -> dict[str, list[dict]]:
    try:
        import datasets
    except ImportError:
        raise SystemExit("loading Geometry3K from the hub needs the `datasets` package (pip install datasets); or "
                         "pass --local_dataset_path to a local copy") from None
    dataset = datasets.load_dataset(DATA_SOURCE).cast_column("images", datasets.Sequence(datasets.Image(decode=False)))
    return {split: list(dataset[split]) for split in SPLITS}


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dataset_path", default=None, help="directory or file of the Geometry3K data")
    parser.add_argument("--local_save_dir", default="~/data/geo3k", help="where train.parquet/test.parquet go")
    args = parser.parse_args(argv)
    if args.local_dataset_path:
        sources = {split: (read_parquet_table(f, columns=list(COLUMNS)).to_pylist(), f)
                   for split, f in local_splits(args.local_dataset_path).items()}
    else:
        sources = {split: (examples, f"{DATA_SOURCE}:{split}") for split, examples in hub_splits().items()}
    written = {}
    for split, (examples, origin) in sources.items():
        rows = [to_row(ex, split, i, f"{origin} row {i}") for i, ex in enumerate(examples)]
        written[split] = write_parquet_atomic(rows, os.path.join(os.path.expanduser(args.local_save_dir),
                                                                 f"{split}.parquet"))
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    try:
        main()
    except (DataError, FileNotFoundError) as error:  # bad input: the message names the file and row
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
