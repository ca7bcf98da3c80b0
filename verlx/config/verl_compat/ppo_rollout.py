"""Compatibility rows of actor_rollout_ref.rollout (veRL 0.9.1 and older)."""

from __future__ import annotations

from verlx.config.legacy_keys import Alias, Ignored, Moved, Refused
from verlx.config.verl_compat.ppo_roles import role_profiler_rows

R = "actor_rollout_ref.rollout"

ROWS = [
    Refused(f"{R}.agent.custom_async_server", "custom async rollout servers"),
    Moved(f"{R}.checkpoint_engine.update_weights_bucket_megabytes", f"{R}.update_weights_bucket_megabytes",
          "verlx keeps the weight-sync bucket on the rollout", current=True),
    Refused(f"{R}.checkpoint_engine", "other weight-sync backends (checkpoint_engine)",
            inert=(None, {}, "naive")),
    Refused(f"{R}.cudagraph_capture_sizes", "cudagraph_capture_sizes as a rollout key (pass it to the engine: "
            "engine_kwargs.vllm.cudagraph_capture_sizes)"),
    Refused(f"{R}.data_parallel_size", "data-parallel rollout engines (one engine spanning several data-parallel "
            "ranks)", inert=(None, 1)),
    Refused(f"{R}.expert_parallel_size", "expert-parallel rollout engines", inert=(None, 1)),
    Refused(f"{R}.pipeline_model_parallel_size", "pipeline-parallel rollout engines", inert=(None, 1)),
    Refused(f"{R}.disaggregation", "prefill/decode disaggregation", switch=f"{R}.disaggregation.enabled"),
    Refused(f"{R}.enable_rollout_routing_replay", "MoE routing replay"),
    Refused(f"{R}.engine_kwargs.trtllm", "the TensorRT-LLM rollout engine", inert=(None, {})),
    Refused(f"{R}.full_determinism", "bitwise-deterministic rollout engines"),
    Refused(f"{R}.logprobs_mode", "other rollout log-prob modes", inert=(None, "processed_logprobs")),
    Refused(f"{R}.moe_load_balance_metrics_interval", "MoE load-balance metrics", inert=(None, 0)),
    Refused(f"{R}.mtp", "multi-token prediction (MTP) drafts in the rollout"),
    Refused(f"{R}.quantization", "quantized rollout engines (e.g. FP8)"),
    Refused(f"{R}.quantization_config_file", "quantized rollout engines (e.g. FP8)"),
    Refused(f"{R}.qat", "quantization-aware training"),
    Refused(f"{R}.router_config_path", "rollout routers"),
    Refused(f"{R}.scheduling_policy", "other request scheduling policies", inert=(None, "fcfs")),
    Refused(f"{R}.skip_rollout", "rollout skipping (replaying dumped rollouts)"),
    Ignored(f"{R}.skip_dump_dir", "read only with skip_rollout, which verlx refuses"),
    Ignored(f"{R}.skip_tokenizer_init", "verlx's engines exchange token ids; their tokenizer is not used"),
    Refused(f"{R}.prometheus", "Prometheus metrics of the rollout servers", switch=f"{R}.prometheus.enable"),
    Refused(f"{R}.trace", "rollout tracing (trace.backend)", switch=f"{R}.trace.backend"),
    *role_profiler_rows(f"{R}.profiler"),
    Moved(f"{R}.nnodes", "rollout.nnodes", "verlx's separate rollout worker group is the top-level rollout "
          "section", current=True),
    Moved(f"{R}.n_gpus_per_node", "rollout.n_gpus_per_node", "verlx's separate rollout worker group is the "
          "top-level rollout section", current=True),
    Refused(f"{R}.multi_turn.function_tool_path", "tools given as a Python file of functions", inert=(None,)),
    Refused(f"{R}.multi_turn.num_repeat_rollouts", "repeated multi-turn rollouts", inert=(None,)),
    Refused(f"{R}.multi_turn.use_inference_chat_template", "the inference chat template in multi-turn training"),
    Ignored(f"{R}.multi_turn.tokenization_sanity_check_mode", "verlx always checks the re-tokenisation of "
            "multi-turn samples; multi_turn.on_template_mismatch says what happens on a mismatch"),
    Alias(f"{R}.log_prob_micro_batch_size",
          "veRL's deprecated global micro-batch size; it is read as "
          f"{R}.log_prob_micro_batch_size_per_gpu = this value / the data-parallel size"),
]
