"""Peak GPU memory of a 1.5B GRPO step with and without param + optimizer offload, against the arithmetic.

    python benchmarks/offload_memory.py            # one GPU, ~5 minutes on an H100
    python benchmarks/offload_memory.py --smoke    # CPU, tiny model, 1 step: the pipeline runs (no memory numbers)

Writes a random-weight Qwen2.5-1.5B-shaped checkpoint (bf16 safetensors, tied embeddings, the quick start's
byte-level tokenizer), then runs each variant in a fresh subprocess (clean CUDA state): the in-process
ActorRolloutRefWorker (role actor_rollout_ref, native engine, KV cache sized by rollout.gpu_memory_utilization)
for `--steps` GRPO steps: generate (n samples per prompt, full-length responses: ignore_eos) → old log-probs →
reference log-probs → GRPO advantages of random scores in [0, 1) → actor update (low_var_kl loss).
  A `no_offload`: everything stays on the GPU.
  B `offload`: actor param_offload + optimizer_offload, reference param_offload.
In the last step (Adam state exists only after the first update) it records memory_allocated when generation
starts (what stays resident between phases; the engine is asleep), the peak of every phase (the worker's
perf/max_memory_allocated_gb/<phase>, reset per phase) and the step peak (max over phases).

The arithmetic: N parameters, fp32 master weights (fsdp_config.model_dtype) and Adam's m and v (fp32) cost
N × (4 + 8) bytes for the actor and N × 4 for the fp32 reference; offload takes them off the GPU between phases,
and each phase brings back only what it computes with. Expected drop per phase: generation 16N (the KV cache
is the same: sized from gpu_memory_utilization × total − engine weights, not from free memory), old log-probs
12N (Adam + reference), reference 12N (actor + Adam), update 4N (reference). The expected B step peak is the
largest A phase peak less its expected drop.

Time: each phase of the last step with offload against without (the issue's target: the offloaded step within
1.5× of the resident one). Offload moves storages through pinned host buffers and overlaps the copies to the GPU
with compute (verlx/workers/fsdp/offload.py); the 2026-11-22 run (pageable copies, module.to) is the reference:
update 24.8 s offloaded against 3.5 s resident. Both variants run with the same gradient checkpointing
(--gradient-checkpointing, on as in that run), so that the automatic decision, which sees more free memory with
offload, does not change the compute between them. Prints tables; writes $OUT/offload_memory.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from verlx.protocol import DataProto  # noqa: E402 - after the sys.path entry above

GIB = 2**30
SHAPES = {
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 512},
}
VARIANTS = ("no_offload", "offload")
PHASES = ("gen", "actor_infer", "ref", "actor")  # the step's order, named as the worker's metrics name them
PHASE_LABELS = {"gen": "generate", "actor_infer": "old log-probs", "ref": "ref log-probs", "actor": "update"}


def build_checkpoint(path: str, shape: str) -> None:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from verlx.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=4096)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, tie_word_embeddings=True,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, eos_token_id=im_end,
                         pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    GenerationConfig(eos_token_id=[im_end, tokenizer.eos_token_id],
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(path)


def make_config(args, offload: bool):
    from verlx.config.loader import build, load_yaml, to_container
    from verlx.config.schema import PPOConfig

    flag = str(offload).lower()
    overrides = [
        "algorithm.adv_estimator=grpo", f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_length}", f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={args.model_dir}", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",  # one optimizer step per update
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.max_token_len}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.actor.use_torch_compile={str(args.compile).lower()}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={args.gradient_checkpointing}",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={flag}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={flag}",
        f"actor_rollout_ref.ref.fsdp_config.param_offload={flag}",
        "actor_rollout_ref.rollout.name=native", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        # more slots than the budget holds: the KV cache is what gpu_memory_utilization leaves, as in vLLM
        f"actor_rollout_ref.rollout.max_num_seqs={args.max_num_seqs}",
        "actor_rollout_ref.rollout.ignore_eos=true", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={args.steps}", "trainer.logger=[console]",
    ]
    return build(PPOConfig, to_container(load_yaml(overrides=overrides)))


def synthetic_prompts(rows: int, length: int, seed: int) -> DataProto:
    """Left-padded prompts of 3/4 to full `length` byte tokens (ids < 256: printable for the tokenizer)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(length * 3 // 4, length + 1, (rows,), generator=g)
    ids = torch.randint(32, 127, (rows, length), generator=g)
    mask = (torch.arange(length)[None, :] >= length - lens[:, None]).long()
    return DataProto({"input_ids": ids * mask, "attention_mask": mask,
                      "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)})


def _allocated_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) / GIB


def grpo_step(worker, cfg, step: int) -> dict:
    """One GRPO step through the worker's methods, as the trainer calls them; the step's memory and timings."""
    import numpy as np

    from verlx.algorithms.advantages import compute_advantage
    from verlx.batch_columns import LOG_PROB_INPUTS
    from verlx.metrics.phases import MEMORY_PREFIX

    n, device = cfg.actor_rollout_ref.rollout.n, worker.device
    prompts = synthetic_prompts(cfg.data.train_batch_size, cfg.data.max_prompt_length, seed=step)
    prompts = prompts.repeat(n, interleave=True)  # the trainer repeats, the engine samples once per row
    prompts.meta_info.update(do_sample=True, seed=step)
    record = {"step": step, "resident_at_gen_gib": _allocated_gib(device), "phase_peak_gib": {}, "timing_s": {}}
    start = time.perf_counter()
    batch = worker.generate_sequences(prompts)
    record["timing_s"]["gen"] = time.perf_counter() - start
    metrics = batch.meta_info.pop("metrics")
    batch.non_tensor_batch["uid"] = np.repeat(np.arange(len(prompts) // n), n).astype(str)
    start = time.perf_counter()
    old = worker.compute_log_prob(batch.select(list(LOG_PROB_INPUTS), [], []))
    record["timing_s"]["actor_infer"] = time.perf_counter() - start
    batch.batch["old_log_probs"] = old.batch["old_log_probs"]
    metrics.update(old.meta_info["metrics"])
    start = time.perf_counter()
    ref = worker.compute_ref_log_prob(batch.select(list(LOG_PROB_INPUTS), [], []))
    record["timing_s"]["ref"] = time.perf_counter() - start
    batch.batch["ref_log_prob"] = ref.batch["ref_log_prob"]
    metrics.update(ref.meta_info["metrics"])
    mask = batch.batch["response_mask"]
    scores = torch.rand(len(batch), generator=torch.Generator().manual_seed(step))  # no group has equal scores
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(batch)), mask.sum(-1) - 1] = scores  # the outcome reward on the last token
    batch.batch["token_level_rewards"] = rewards
    compute_advantage(batch, cfg.algorithm)
    start = time.perf_counter()
    out = worker.update_actor(batch.select([*LOG_PROB_INPUTS, "old_log_probs", "advantages", "ref_log_prob"], [], []))
    record["timing_s"]["actor"] = time.perf_counter() - start
    metrics.update(out.meta_info["metrics"])
    for phase in PHASES:
        if MEMORY_PREFIX + phase in metrics:
            record["phase_peak_gib"][phase] = metrics[MEMORY_PREFIX + phase]
    record["resident_after_update_gib"] = _allocated_gib(device)
    record["response_tokens"] = int(mask.sum())
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/optimizer_state_gb"):
        record[key] = metrics.get(key)
    return record


def run_variant(args) -> None:
    """Child process: build the worker of one variant, run the steps, write the records to args.result."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from verlx.utils.dtypes import torch_dtype
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    cfg = make_config(args, offload=args.variant == "offload")
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout_ref")
    start = time.perf_counter()
    worker.init_model()
    arr = cfg.actor_rollout_ref
    out = {
        "variant": args.variant, "init_s": time.perf_counter() - start,
        "parameters": sum(p.numel() for p in worker.actor.engine.module.parameters()),
        "actor_param_bytes": torch.empty((), dtype=torch_dtype(arr.actor.fsdp_config.model_dtype)).element_size(),
        "ref_param_bytes": torch.empty((), dtype=torch_dtype(arr.ref.fsdp_config.model_dtype)).element_size(),
        "device": torch.cuda.get_device_name() if worker.device.type == "cuda" else "cpu",
        "engine_weights_gib": worker.engine.weights.nbytes / GIB,
        "kv_cache_gib": worker.engine.cache_plan.nbytes / GIB, "kv_slots": worker.engine.cache_plan.slots,
        "steps": [grpo_step(worker, cfg, step) for step in range(1, args.steps + 1)],
        "offloaded_gib": sum(m.engine.offloader.bytes_moved for m in (worker.actor, worker.ref)) / GIB,
    }
    if worker.device.type == "cuda":
        out["total_memory_gib"] = torch.cuda.get_device_properties(worker.device).total_memory / GIB
    with open(args.result, "w") as f:
        json.dump(out, f, indent=1)
    torch.distributed.destroy_process_group()


def expected_drops(n_params: int, actor_bytes: int, ref_bytes: int) -> dict[str, float]:
    """GiB that offload should take off each phase's peak and off the memory resident at generation."""
    actor, adam, ref = n_params * actor_bytes / GIB, n_params * 8 / GIB, n_params * ref_bytes / GIB
    return {"resident_at_gen": actor + adam + ref, "gen": actor + adam + ref, "actor_infer": adam + ref,
            "ref": actor + adam, "actor": ref, "actor_params": actor, "adam_state": adam, "ref_params": ref}


def device_state_gib(variant: str, phase: str, exp: dict, run: dict) -> float:
    """What the arithmetic puts on the device at a phase's peak: the training state the phase holds, plus the
    engine's weights and KV cache (generation) or the fp32 gradients (update); the rest of a measured peak is
    activations and workspace, which offload does not change."""
    everything = exp["actor_params"] + exp["adam_state"] + exp["ref_params"]
    held = {"gen": 0.0, "actor_infer": exp["actor_params"], "ref": exp["ref_params"],
            "actor": exp["actor_params"] + exp["adam_state"]}
    state = everything if variant == "no_offload" else held[phase]
    if phase == "gen":
        state += run["engine_weights_gib"] + run["kv_cache_gib"]
    if phase == "actor":
        state += exp["actor_params"]  # gradients: the parameters' dtype and shards
    return state


def compare(results: dict) -> dict:
    """Measured vs expected drops from the last step of each variant (None where memory is not measured: CPU)."""
    a, b = (results[v]["steps"][-1] for v in VARIANTS)
    base = results["no_offload"]
    exp = expected_drops(base["parameters"], base["actor_param_bytes"], base["ref_param_bytes"])
    out = {"expected_drop_gib": exp, "measured_drop_gib": {}, "step_peak": {}, "breakdown_gib": {}}
    if a["resident_at_gen_gib"] is None:
        return out
    for name, rec in zip(VARIANTS, (a, b)):
        states = {p: device_state_gib(name, p, exp, results[name]) for p in PHASES}
        out["breakdown_gib"][name] = {p: {"state": states[p], "rest": rec["phase_peak_gib"][p] - states[p]}
                                      for p in PHASES}
    out["measured_drop_gib"]["resident_at_gen"] = a["resident_at_gen_gib"] - b["resident_at_gen_gib"]
    for phase in PHASES:
        out["measured_drop_gib"][phase] = a["phase_peak_gib"][phase] - b["phase_peak_gib"][phase]
    for name, rec in zip(VARIANTS, (a, b)):
        phase = max(rec["phase_peak_gib"], key=rec["phase_peak_gib"].get)
        out["step_peak"][name] = {"gib": rec["phase_peak_gib"][phase], "phase": phase}
    predicted = {p: a["phase_peak_gib"][p] - exp[p] for p in PHASES}
    phase = max(predicted, key=predicted.get)
    out["step_peak"]["offload_expected"] = {"gib": predicted[phase], "phase": phase}
    out["measured_drop_gib"]["step_peak"] = out["step_peak"]["no_offload"]["gib"] - out["step_peak"]["offload"]["gib"]
    out["expected_drop_gib"]["step_peak"] = out["step_peak"]["no_offload"]["gib"] - predicted[phase]
    return out


def time_comparison(results: dict) -> dict[str, dict[str, float]]:
    """Seconds of each phase (and of the step: their sum) in the last step of each variant, and offload / resident."""
    last = {v: results[v]["steps"][-1]["timing_s"] for v in VARIANTS}
    out = {}
    for phase in (*PHASES, "step"):
        times = {v: (sum(last[v][p] for p in PHASES) if phase == "step" else last[v][phase]) for v in VARIANTS}
        out[phase] = {**times, "ratio": times["offload"] / times["no_offload"]}
    return out


def report_times(results: dict) -> None:
    times = time_comparison(results)
    print("\n| seconds (last step) | no_offload | offload | offload / no_offload |\n|---|---|---|---|")
    for phase, row in times.items():
        label = "step (these phases)" if phase == "step" else PHASE_LABELS[phase]
        print(f"| {label} | {row['no_offload']:.2f} | {row['offload']:.2f} | {row['ratio']:.2f}× |")
    verdict = "within" if times["step"]["ratio"] <= 1.5 else "over"
    print(f"offload moves {results['offload']['offloaded_gib']:.2f} GiB to the host and back per phase set; the "
          f"offloaded step is {times['step']['ratio']:.2f}× the resident one ({verdict} the 1.5× target)")


def _gib(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def report(results: dict, comparison: dict) -> None:
    first = results["no_offload"]
    n = first["parameters"]
    exp = comparison["expected_drop_gib"]
    print(f"\ndevice {first['device']}; {n:,} parameters; engine weights {_gib(first['engine_weights_gib'])} GiB, "
          f"KV cache {_gib(first['kv_cache_gib'])} GiB ({first['kv_slots']} slots)")
    print(f"expected: actor fp32 master weights {n:,} × {first['actor_param_bytes']} B = {_gib(exp['actor_params'])} "
          f"GiB, Adam m+v {n:,} × 8 B = {_gib(exp['adam_state'])} GiB, reference {n:,} × {first['ref_param_bytes']} B "
          f"= {_gib(exp['ref_params'])} GiB; resident drop = {_gib(exp['resident_at_gen'])} GiB "
          f"(actor param+optimizer alone: {_gib(exp['actor_params'] + exp['adam_state'])} GiB)")
    print(f"\n| GiB (last step) | {' | '.join(VARIANTS)} | measured drop | expected drop |")
    print("|---|---|---|---|---|")
    last = {v: results[v]["steps"][-1] for v in VARIANTS}
    drops = comparison["measured_drop_gib"]
    rows = [("resident at generation start", "resident_at_gen", lambda r: r["resident_at_gen_gib"])]
    rows += [(f"peak: {PHASE_LABELS[p]}", p, lambda r, p=p: r["phase_peak_gib"].get(p)) for p in PHASES]
    for label, key, get in rows:
        print(f"| {label} | {' | '.join(_gib(get(last[v])) for v in VARIANTS)} | {_gib(drops.get(key))} | "
              f"{_gib(exp[key])} |")
    peaks = comparison["step_peak"]
    if peaks:
        cells = [f"{_gib(peaks[v]['gib'])} ({PHASE_LABELS[peaks[v]['phase']]})" for v in VARIANTS]
        print(f"| step peak | {' | '.join(cells)} | {_gib(drops['step_peak'])} | {_gib(exp['step_peak'])} |")
        print("\n| phase peak = arithmetic state + rest (activations, workspace) | "
              + " | ".join(VARIANTS) + " |")
        print("|---|---|---|")
        for p in PHASES:
            cells = [comparison["breakdown_gib"][v][p] for v in VARIANTS]
            print(f"| {PHASE_LABELS[p]} | " + " | ".join(f"{_gib(c['state'])} + {_gib(c['rest'])}" for c in cells)
                  + " |")
        print("state: no_offload holds actor + Adam + reference throughout; offload holds only what the phase "
              "computes with (update: actor + Adam); generation adds the engine's weights and KV cache, the "
              "update the fp32 gradients")
        guess = peaks["offload_expected"]
        print(f"\nexpected offload step peak: {_gib(guess['gib'])} GiB in {PHASE_LABELS[guess['phase']]} (each "
              "no-offload phase peak less its expected drop)")
    for v in VARIANTS:
        rec = last[v]
        times = ", ".join(f"{PHASE_LABELS[p]} {rec['timing_s'][p]:.1f} s" for p in PHASES)
        print(f"{v}: {times}; pg_loss {rec['actor/pg_loss']:.4g}, kl_loss {rec['actor/kl_loss']:.4g}, "
              f"{rec['response_tokens']} response tokens; init {results[v]['init_s']:.1f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, 1 step, small batch")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    p.add_argument("--max-num-seqs", type=int, default=8192)
    p.add_argument("--max-token-len", type=int, default=16384, help="ppo_max_token_len_per_gpu")
    p.add_argument("--compile", action="store_true", help="use_torch_compile (off: memory is the point, not speed)")
    p.add_argument("--gradient-checkpointing", choices=("true", "false"), default="true",
                   help="model.enable_gradient_checkpointing of both variants (on, as in the 2026-11-22 run)")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child mode
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        args.steps, args.prompts, args.n, args.prompt_length, args.response_length = 1, 2, 2, 8, 4
        args.max_num_seqs = 8  # on the CPU the slot count is the only KV budget
    if args.variant:
        run_variant(args)
        return 0
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("offload_memory.py needs a CUDA GPU (or --smoke on the CPU)")
    work = tempfile.mkdtemp(prefix="verlx-offload-")
    model_dir = os.path.join(work, "model")
    start = time.perf_counter()
    build_checkpoint(model_dir, "tiny" if args.smoke else "1.5b")
    print(f"checkpoint written in {time.perf_counter() - start:.0f} s", flush=True)
    results = {}
    for variant in VARIANTS:
        path = os.path.join(work, f"{variant}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--model-dir", model_dir,
               "--result", path, *sys.argv[1:]]
        if subprocess.run(cmd, cwd=ROOT, check=False).returncode:
            print(f"variant {variant} failed", file=sys.stderr)
            return 1
        with open(path) as f:
            results[variant] = json.load(f)
    shutil.rmtree(work, ignore_errors=True)
    comparison = compare(results)
    report(results, comparison)
    report_times(results)
    comparison["time_s"] = time_comparison(results)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "offload_memory.json"), "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "variants": results, **comparison}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
