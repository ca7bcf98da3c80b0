"""GSM8K → train.parquet / test.parquet in the veRL schema (7,473 / 1,319 rows).

    python examples/data_preprocess/gsm8k.py --local_dataset_path /path/to/gsm8k --local_save_dir ~/data/gsm8k

--local_dataset_path is a directory holding train/test files (train.jsonl, train.parquet or the hub's
main/train-00000-of-00001.parquet layout) or one such file; without it the data comes from the HF hub
(`datasets.load_dataset("openai/gsm8k", "main")`, needs the `datasets` package and network access).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections.abc import Iterable

try:
    from verlx.config.loader import DataError
    from verlx.data.parquet import read_parquet_table, write_parquet_atomic
except ImportError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from verlx.config.loader import DataError
    from verlx.data.parquet import read_parquet_table, write_parquet_atomic

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def final_answer(solution: str, where: str) -> str:
    """The number after "####" in a GSM8K solution, commas removed."""
    match = _FINAL_ANSWER.search(solution)
    if match is None:
        raise DataError(f"{where}: the answer has no '#### <number>' line: {solution[-200:]!r}")
    return match.group(1).replace(",", "")


def to_row(example: dict, split: str, index: int, where: str) -> dict:
    if not (isinstance(example, dict) and isinstance(example.get("question"), str)
            and isinstance(example.get("answer"), str)):
        raise DataError(f"{where}: expected an object with string fields 'question' and 'answer', got "
                         f"{str(example)[:200]!r}")
    question, answer = example["question"], example["answer"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(answer, where)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def read_examples(path: str) -> list[dict]:
    """question/answer records of a .jsonl or .parquet file."""
    if path.endswith(".parquet"):
        return read_parquet_table(path, columns=["question", "answer"]).to_pylist()
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path} line {number}: not valid JSON ({e.msg}, column {e.colno}); each line must be one JSON "
                    "object with 'question' and 'answer' (JSON Lines): fix or delete that line"
                ) from None
    return records


def find_split_file(directory: str, split: str) -> str | None:
    for pattern in (f"{split}.jsonl", f"{split}.parquet", f"**/{split}-*.parquet"):
        found = sorted(glob.glob(os.path.join(directory, pattern), recursive=True))
        if found:
            return found[0]
    return None


def local_splits(path: str) -> dict[str, str]:
    """split name → file, from a directory (both splits) or a single file (its split, from its name)."""
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        split = next((s for s in SPLITS if os.path.basename(path).startswith(s)), None)
        if split is None:
            raise DataError(f"cannot tell the split of {path}: its name should start with 'train' or 'test'")
        return {split: path}
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--local_dataset_path {path} is neither a file nor a directory")
    files = {split: find_split_file(path, split) for split in SPLITS}
    missing = [s for s, f in files.items() if f is None]
    if missing:
        raise FileNotFoundError(
            f"{path} has no {' or '.join(missing)} file (looked for <split>.jsonl, <split>.parquet, "
            "**/<split>-*.parquet)"
        )
    return files


def hub_splits() -> dict[str, Iterable[dict]]:
    try:
        import datasets
    except ImportError:
        raise SystemExit(
            "loading GSM8K from the hub needs the `datasets` package (pip install datasets); "
            "or pass --local_dataset_path to a local copy"
        ) from None
    dataset = datasets.load_dataset("openai/gsm8k", "main")
    return {split: dataset[split] for split in SPLITS}


def main(argv: list[str] | None = None, make_row=to_row, save_dir: str = "~/data/gsm8k",
         description: str = __doc__) -> dict[str, str]:
    """The CLI; gsm8k_tool.py runs it with its own row builder, save directory and description."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dataset_path", default=None, help="directory or file of the GSM8K data")
    parser.add_argument("--local_save_dir", default=save_dir, help="where train.parquet/test.parquet go")
    args = parser.parse_args(argv)

    if args.local_dataset_path:
        sources = {split: (read_examples(f), f) for split, f in local_splits(args.local_dataset_path).items()}
    else:
        sources = {split: (examples, f"openai/gsm8k:{split}") for split, examples in hub_splits().items()}
    written = {}
    for split, (examples, origin) in sources.items():
        rows = [make_row(ex, split, i, f"{origin} row {i}") for i, ex in enumerate(examples)]
        written[split] = write_parquet_atomic(
            rows, os.path.join(os.path.expanduser(args.local_save_dir), f"{split}.parquet")
        )
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    try:
        main()
    except (DataError, FileNotFoundError) as error:  # bad input: the message names the file (and line)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
