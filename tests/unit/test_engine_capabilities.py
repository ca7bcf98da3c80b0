"""What a run needs of its rollout engine is checked before Ray against what the engine's class declares, each
refusal naming the key, the engine and the capability, and listing the engines that have it."""

from __future__ import annotations

import pytest

from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.rollout.capabilities import capability_problems

R = "actor_rollout_ref.rollout"


def problems(*overrides) -> list[str]:
    return capability_problems(build(PPOConfig, to_container(load_yaml(overrides=list(overrides)))))


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_tensor_parallelism_on_an_engine_without_it_is_refused_before_ray(engine):
    cls = {"native": "NativeEngine", "hf": "HFEngine"}[engine]
    assert problems(f"{R}.name={engine}", f"{R}.tensor_model_parallel_size=2") == [
        f"{R}.tensor_model_parallel_size=2 needs a rollout engine that shards a replica over several GPUs, but "
        f"{R}.name={engine} cannot ({cls}.supports_tensor_parallel is False); set it to 1 (each GPU then generates "
        f"its own data-parallel shard) or use {R}.name=sglang or {R}.name=vllm"]


def test_what_every_engine_can_do_is_accepted():
    for engine in ("native", "sglang", "vllm"):
        assert problems(f"{R}.name={engine}", "trainer.partial_rollout=true", f"{R}.multi_turn.enable=true") == []
    for engine in ("sglang", "vllm"):  # in server mode vLLM's tensor-parallel peers are not in lockstep
        assert problems(f"{R}.name={engine}", f"{R}.tensor_model_parallel_size=2", "trainer.partial_rollout=true",
                        f"{R}.server.enable=true", "trainer.n_gpus_per_node=2") == []
    assert problems(f"{R}.name=auto", "trainer.partial_rollout=true") == []  # checked once auto is resolved


def test_vllm_partial_rollout_with_tensor_parallelism_is_refused():
    (problem,) = problems(f"{R}.name=vllm", "trainer.partial_rollout=true", f"{R}.tensor_model_parallel_size=2",
                          "trainer.n_gpus_per_node=2")
    assert problem.startswith(f"trainer.partial_rollout=true with {R}.name=vllm needs {R}.tensor_model_parallel_size=1 "
                              "(got 2)")
    assert problem.endswith(f"break; set {R}.server.enable=true (the group's first rank alone drives the engine's "
                            f"server), or use {R}.name=sglang")


def test_the_alternatives_come_from_the_engines_declarations():
    from verlx.rollout.capabilities import alternatives

    assert alternatives("supports_tensor_parallel") == f"{R}.name=sglang or {R}.name=vllm"
    assert alternatives("supports_partial_rollout") == f"{R}.name=native or {R}.name=sglang or {R}.name=vllm"
    assert alternatives("supports_server") == f"{R}.name=sglang or {R}.name=vllm"
