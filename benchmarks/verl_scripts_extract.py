"""Extract the trainer command lines of veRL's example launch scripts from a veRL checkout, into a temporary directory.

A copy of the checkout (a directory, or a commit of a git repository written out with `git archive`; its recipe
submodule likewise) is made under the caller's temporary directory, and every `*.sh` under examples/ and recipe/
runs there with bash under a PATH whose `python`, `python3`, `uv`, `torchrun`, `ray`, `hf`, `nvidia-smi`, `pip`,
... are recording shims: each writes its argv and working directory as one JSON line and exits 0 (nvidia-smi
reports 8 GPUs; `python -c` probes fail, as without torch_npu). Shell variables fall back to the scripts' own
defaults; HOME and the checkout are temporary and written as the placeholders {HOME} and {ROOT}. Invocations of
veRL trainer entry points are kept with the argv after the module, and the config directory their Hydra config
comes from (relative to the checkout) and the config name. Nothing is written into this repository: veRL's files
are read to measure verlx against them (benchmarks/verl_scripts.py), never stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile


@dataclasses.dataclass(frozen=True)
class Source:
    """A directory (copied as it is), or a git repository (bare or not) and a commit of it."""

    location: str
    commit: str | None = None

    def describe(self) -> str:
        return f"{self.location}@{self.commit}" if self.commit else self.location

SHIMMED = ("python", "python3", "python3.10", "python3.11", "python3.12", "uv", "uvx", "torchrun", "ray",
           "huggingface-cli", "hf", "nvidia-smi", "npu-smi", "pip", "pip3", "wget", "curl", "git", "sudo", "docker",
           "srun", "sbatch", "scontrol", "ssh", "scp", "sleep", "modelscope", "wandb", "mlflow", "tensorboard",
           "apt", "apt-get", "conda", "deepspeed", "accelerate", "vllm", "sglang", "nohup", "pkill", "kill",
           "aws", "hdfs", "hadoop", "ossutil", "tmux", "screen",
           # what would touch this machine outside the scripts' work directory (a 2026-08 recipe runs
           # `rm -rf /tmp/ray/*`, which took a running Ray's session with it)
           "rm", "killall")
ENTRY = re.compile(r"^(verl\.trainer\.[\w.]+|verl\.experimental\.[\w.]+|recipe\.[\w.]+|verl\.recipe\.[\w.]+)$")
# Positional arguments for scripts that print a usage without them: devices per node, a save path.
POSITIONAL = ["8", "/tmp/verl_ckpt"]
# Sourced by every non-interactive bash: builtins that would stop a script here for reasons unrelated to its command
BASH_ENV = """ulimit() { :; }
cp() { command cp "$@" 2>/dev/null; return 0; }
cd() { builtin cd "$@" 2>/dev/null; return 0; }
"""
HYDRA_MAIN = re.compile(r"@hydra\.main\((?P<args>[^)]*)\)")

SHIM = r'''#!/usr/bin/python3
import json, os, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
if name == "nvidia-smi":
    print("\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3" if "--list-gpus" in args or "-L" in args else "0"
                    for i in range(8)))
    sys.exit(0)
if name.startswith("python") and args[:1] == ["-c"]:
    if "device_count" in args[1]:
        print(8)
        sys.exit(0)
    sys.exit(1)
with open(os.environ["VERL_EXTRACT_LOG"], "a") as f:
    f.write(json.dumps({"program": name, "argv": args, "cwd": os.getcwd()}) + "\n")
'''


def checkout(source: Source, dest: str) -> None:
    """Write the source's files into `dest` (the scripts run there, never in the source itself)."""
    if source.commit is None:
        shutil.copytree(source.location, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        return
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "-C", source.location, "archive", source.commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def submodule_commit(source: Source, path: str = "recipe") -> str | None:
    """The commit a git source's tree pins its submodule at (None for a directory, or without one)."""
    if source.commit is None:
        return None
    listing = subprocess.run(["git", "-C", source.location, "ls-tree", source.commit, path], check=True,
                             capture_output=True, text=True).stdout.split()
    return listing[2] if len(listing) >= 3 and listing[1] == "commit" else None


def make_shims(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    for name in SHIMMED:
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(SHIM)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


def run_script(root: str, script: str, workdir: str, env_vars: dict[str, str], args: list[str]) -> str:
    """Run the script once; returns its stderr (where bash names a variable it needed)."""
    env = {"PATH": f"{workdir}/shims:/usr/bin:/bin", "HOME": f"{workdir}/home", "USER": "user", "LANG": "C.UTF-8",
           "TERM": "dumb", "VERL_EXTRACT_LOG": f"{workdir}/log.jsonl", "BASH_ENV": f"{workdir}/bash_env",
           **env_vars}
    # stderr into a file: the script's end is its process's exit, not the end of a pipe that what it started in the
    # background (a server with `&`) holds open; that goes with the script's process group
    with tempfile.TemporaryFile("w+") as stderr, subprocess.Popen(
            ["bash", script, *args], cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=stderr, start_new_session=True) as proc:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        stderr.seek(0)
        return stderr.read()


def plausible_value(name: str, home: str) -> str:
    """A value for a variable a script requires without a default: a count for counts, a path for the rest."""
    if re.search(r"NODES|GPUS|NPUS|_NUM|NUM_|SIZE|_TP|_PP|_EP|_CP|STEPS|EPOCHS", name):
        return "1" if "NODE" in name else "8"
    if re.search(r"ADDR|HOST|IP$", name):
        return "127.0.0.1"
    if "PORT" in name:
        return "6379"
    if re.search(r"BACKEND|ENGINE", name):
        return "vllm"
    return f"{home}/{name.lower()}"


def recorded(workdir: str) -> list[dict]:
    log = os.path.join(workdir, "log.jsonl")
    if not os.path.exists(log):
        return []
    with open(log) as f:
        records = [json.loads(line) for line in f]
    os.remove(log)
    return records


def run_until_launch(root: str, script: str, workdir: str) -> tuple[list[dict], list[tuple]]:
    """Run the script, giving it the variables it stops for and, when it prints a usage, two positional
    arguments (devices per node, a save path); returns what the shims recorded and the launches among them."""
    env_vars: dict[str, str] = {}
    args: list[str] = []
    records: list[dict] = []
    for _ in range(12):
        stderr = run_script(root, script, workdir, env_vars, args)
        records = recorded(workdir)
        found = [(r, *entry_module(root, r)) for r in records]
        found = [f for f in found if f[1] is not None]
        if found:
            return records, found
        missing = re.findall(r"line \d+: ([A-Za-z_][A-Za-z0-9_]*): ", stderr)
        missing = [m for m in missing if m not in env_vars]
        if missing:
            env_vars[missing[-1]] = plausible_value(missing[-1], f"{workdir}/home")
        elif len(args) < len(POSITIONAL):
            args = POSITIONAL[:len(args) + 1]
        else:
            break
    return records, []


def entry_module(root: str, record: dict) -> tuple[str | None, list[str]]:
    """(module, argv after it) of a recorded command: `-m module ...` or `path/to/module.py ...` anywhere in it; a
    module relative to the working directory (or ray's --working-dir) is named from the checkout's root."""
    argv = record["argv"]
    bases = [record["cwd"], *[argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--working-dir"],
             *[a.split("=", 1)[1] for a in argv if a.startswith("--working-dir=")], os.path.join(root, "recipe")]
    for i, token in enumerate(argv):
        if token == "-m" and i + 1 < len(argv):
            module = argv[i + 1]
            if not ENTRY.match(module):
                module = next((_module_of(root, os.path.join(b, module.replace(".", "/") + ".py")) for b in bases
                               if os.path.isfile(os.path.join(b, module.replace(".", "/") + ".py"))), module)
            if ENTRY.match(module):
                return module, argv[i + 2:]
        if token.endswith(".py"):
            path = next((os.path.join(b, token) for b in bases if os.path.isfile(os.path.join(b, token))), token)
            module = _module_of(root, path)
            if ENTRY.match(module):
                return module, argv[i + 1:]
    return None, []


def _module_of(root: str, path: str) -> str:
    return os.path.relpath(os.path.abspath(path), root)[:-3].replace("/", ".")


def hydra_defaults(root: str, module: str) -> tuple[str | None, str | None]:
    """(config_path, config_name) of the module's @hydra.main, relative to the module's directory."""
    path = os.path.join(root, module.replace(".", "/") + ".py")
    if not os.path.isfile(path):
        return None, None
    with open(path) as f:
        match = HYDRA_MAIN.search(f.read())
    if match is None:
        return None, None
    found = dict(re.findall(r"(config_path|config_name)\s*=\s*[\"']([^\"']*)[\"']", match.group("args")))
    return found.get("config_path"), found.get("config_name")


def hydra_flag(argv: list[str], long: str, short: str) -> str | None:
    value = None
    for i, token in enumerate(argv):
        if token in (long, short) and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(long + "="):
            value = token.split("=", 1)[1]
    return value


def placeholders(text: str, root: str, home: str) -> str:
    return text.replace(root, "{ROOT}").replace(home, "{HOME}")


def config_location(root: str, record: dict, module: str, argv: list[str]) -> tuple[str | None, str | None]:
    """The config directory (relative to the checkout) and name the command composes, as Hydra resolves them."""
    default_path, default_name = hydra_defaults(root, module)
    path = hydra_flag(argv, "--config-path", "-cp") or default_path
    name = hydra_flag(argv, "--config-name", "-cn") or default_name
    if path is None:
        return None, name
    if path.startswith("pkg://"):
        return path[len("pkg://"):].replace(".", "/"), name
    base = os.path.dirname(os.path.join(root, module.replace(".", "/")))
    directory = path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))
    if not os.path.isdir(directory):  # e.g. $HOME/verl/verl/trainer/config: the same directory of this checkout
        parts = directory.strip("/").split("/")
        tails = ["/".join(parts[i:]) for i in range(len(parts))]
        directory = next((os.path.join(root, t) for t in tails if os.path.isdir(os.path.join(root, t))), directory)
    return os.path.relpath(directory, root), name


def extract(verl: Source, recipe: Source | None, workdir: str, only: str | None = None
            ) -> tuple[str, list[dict], list[dict]]:
    """(the checkout's directory under `workdir`, the trainer commands, the scripts that launched none)."""
    root, home = os.path.join(workdir, "verl"), os.path.join(workdir, "home")
    checkout(verl, root)
    if recipe is not None:
        shutil.rmtree(os.path.join(root, "recipe"), ignore_errors=True)
        checkout(recipe, os.path.join(root, "recipe"))
    os.makedirs(home)
    make_shims(os.path.join(workdir, "shims"))
    with open(os.path.join(workdir, "bash_env"), "w") as f:
        f.write(BASH_ENV)
    scripts = sorted(os.path.relpath(os.path.join(d, f), root) for top in ("examples", "recipe")
                     for d, _, files in os.walk(os.path.join(root, top)) for f in files if f.endswith(".sh"))
    scripts = [s for s in scripts if only is None or re.search(only, s)]
    commands, skipped = [], []
    for script in scripts:
        records, found = run_until_launch(root, script, workdir)
        if not found:
            programs = sorted({" ".join([r["program"], *r["argv"][:2]]) for r in records})
            skipped.append({"script": script, "programs": programs})
        seen = set()
        for record, module, argv in found:
            key = (module, tuple(argv))
            if key in seen:
                continue
            seen.add(key)
            config_dir, config_name = config_location(root, record, module, argv)
            commands.append({
                "script": script, "program": record["program"], "module": module,
                "cwd": placeholders(record["cwd"], root, home),
                "config_dir": config_dir, "config_name": config_name,
                "argv": [placeholders(a, root, home) for a in argv if a not in POSITIONAL or "=" in a],
            })
    return root, commands, skipped
