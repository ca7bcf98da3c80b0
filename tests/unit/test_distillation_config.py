"""veRL's distillation.* keys composed from a command line like examples/on_policy_distillation_trainer/
run_qwen3_8b_fsdp.sh (small values), checked before Ray: what verlx runs passes with one line saying where the
teacher runs, and what it lacks is refused naming the key and the feature."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers.distillation import script_distillation_overrides
from helpers.e2e import make_config
from helpers.tiny_tokenizer import save_tiny_qwen2
from verlx.config.loader import ConfigError, Findings
from verlx.trainer.distillation_checks import check_distillation
from verlx.trainer.preflight import validate
from verlx.trainer.verl_mappings import apply_verl_mappings


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny_teacher"), seed=1)


def _script(teacher: str, *extra: str) -> list[str]:
    """The script's EXTRA overrides (and its GRPO keys), with a tiny teacher."""
    return ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False", "actor_rollout_ref.rollout.n=2",
            *script_distillation_overrides(teacher), *extra]


def _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher, *extra):
    return make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *_script(teacher, *extra))


def _problems(cfg) -> list[str]:
    findings = Findings()
    check_distillation(cfg, findings)
    return findings.problems


def test_the_scripts_keys_compose_typed_and_pass_preflight_with_one_mapping_line(
        tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir):
    cfg = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir)
    d = cfg.distillation
    assert d.enabled and d.teacher.model_path == teacher_dir and list(d.teacher_models) == ["teacher_model"]
    loss = d.distillation_loss
    assert (loss.loss_mode, loss.topk, loss.use_task_rewards, loss.use_policy_gradient) == ("k1", 64, False, True)
    assert (loss.loss_max_clamp, loss.log_prob_min_clamp, loss.clip_low, loss.clip_high) == (10.0, -10.0, 0.2, 0.2)
    # veRL's interpolations into the rollout section resolve against verlx's
    assert (d.teacher.inference.prompt_length, d.teacher.inference.response_length) == (32, 8)
    validate(cfg)
    lines = [line for line in apply_verl_mappings(cfg) if line.startswith("distillation:")]
    assert len(lines) == 1
    assert ("distillation.n_gpus_per_node=4, nnodes=1" in lines[0] and "tensor_model_parallel_size=2" in lines[0]
            and "frozen FSDP model in the training workers" in lines[0]
            and "teacher_key=data_source routes nothing" in lines[0])


def test_distillation_off_checks_nothing_and_says_nothing(tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "distillation.distillation_loss.loss_mode=k1",
                      "distillation.distillation_loss.loss_mode=forward_kl_topk")
    assert _problems(cfg) == [] and not any(line.startswith("distillation") for line in apply_verl_mappings(cfg))


def test_a_top_k_loss_composes_and_says_what_the_policy_gradient_loses(tiny_model_dir, arithmetic_data_dir,
                                                                        tmp_path, teacher_dir):
    """forward_kl_topk runs (the teacher's top-k: verlx.models.topk_distillation); with use_policy_gradient=true
    (the script's setting) the start says, as veRL warns, that only the sampled tokens' gradient is used; topk must
    be at least 1."""
    cfg = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir,
                  "distillation.distillation_loss.loss_mode=forward_kl_topk")
    assert _problems(cfg) == []
    validate(cfg)
    lines = [line for line in apply_verl_mappings(cfg) if line.startswith("distillation")]
    assert len(lines) == 2 and "use_policy_gradient=true uses the top-k loss only as a per-token reward" in lines[1]
    direct = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir,
                     "distillation.distillation_loss.loss_mode=forward_kl_topk",
                     "distillation.distillation_loss.use_policy_gradient=false")
    assert len([line for line in apply_verl_mappings(direct) if line.startswith("distillation")]) == 1
    none = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir,
                   "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=0")
    assert _problems(none) == ["distillation.distillation_loss.topk=0 must be at least 1 with "
                               "loss_mode=forward_kl_topk (the teacher's tokens the forward KL runs over)"]


def test_an_unknown_key_of_the_section_is_an_error_with_did_you_mean(tiny_model_dir, arithmetic_data_dir, tmp_path,
                                                                      teacher_dir):
    with pytest.raises(ConfigError, match=r"distillation.distillation_loss.loss_mod.*Did you mean 'loss_mode'"):
        _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir,
                "+distillation.distillation_loss.loss_mod=k3")


def test_what_verlx_lacks_is_refused_before_ray(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir):
    multi = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir,
                    "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
                    f"+distillation.teacher_models.gsm8k.model_path={teacher_dir}",
                    "+distillation.teacher_models.math.key=math",
                    f"+distillation.teacher_models.math.model_path={teacher_dir}")
    with pytest.raises(ConfigError, match=r"distillation.teacher_models has the teachers \['gsm8k', 'math'\] \(veRL "
                       r"drops the default teacher_model entry once others are added\): verlx does not support "
                       r"multi-teacher distillation"):
        validate(multi)
    assert len(_problems(multi)) == 1  # nothing else is judged of several teachers
    cfg = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir)
    cfg.actor_rollout_ref.actor.strategy = "megatron"  # what model_engine=megatron composes
    assert _problems(cfg) == ["distillation.enabled=true with actor_rollout_ref.actor.strategy=megatron: verlx does "
                              "not support distillation on the megatron engine yet (its teacher is an FSDP model "
                              "colocated with the actor)"]
    no_teacher = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, "null")
    assert _problems(no_teacher) == ["distillation.enabled=true needs distillation.teacher_models.teacher_model."
                                     "model_path (the teacher's HF model directory or hub id)"]


def test_one_added_teacher_entry_is_the_teacher_as_in_verl(tiny_model_dir, arithmetic_data_dir, tmp_path,
                                                           teacher_dir):
    """veRL's VeOmni OPD script names its one teacher (+distillation.teacher_models.gsm8k.*): veRL drops the default
    teacher_model entry (its model_path left null) once another is added, and routes every sample to a single
    teacher whatever its key."""
    cfg = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, "null",
                  "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
                  f"+distillation.teacher_models.gsm8k.model_path={teacher_dir}")
    d = cfg.distillation
    assert sorted(d.teacher_models) == ["gsm8k", "teacher_model"] and list(d.teachers) == ["gsm8k"]
    assert (d.teacher_name, d.teacher.model_path, d.teacher.key) == ("gsm8k", teacher_dir, "openai/gsm8k")
    assert _problems(cfg) == []
    validate(cfg)
    cfg = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, "null",
                  "+distillation.teacher_models.gsm8k.inference.max_model_len=8")
    inference = cfg.distillation.teacher.inference
    needed = inference.prompt_length + inference.response_length + 1
    assert _problems(cfg) == [  # messages name the entry the teacher is read from
        "distillation.enabled=true needs distillation.teacher_models.gsm8k.model_path (the teacher's HF model "
        "directory or hub id)",
        f"distillation.teacher_models.gsm8k.inference.max_model_len=8 is shorter than prompt_length + "
        f"response_length + 1 = {needed} (veRL refuses it: the teacher reads the whole prompt and response)"]


def test_a_teacher_with_another_vocabulary_is_refused(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir):
    other = tmp_path / "other_vocab"
    shutil.copytree(teacher_dir, other)
    config = json.loads((other / "config.json").read_text())
    student_vocab = config["vocab_size"]
    config["vocab_size"] = student_vocab + 64
    (other / "config.json").write_text(json.dumps(config))
    cfg = _config(tiny_model_dir, arithmetic_data_dir, tmp_path, str(other))
    (problem,) = _problems(cfg)
    assert problem.startswith(f"distillation.teacher_models.teacher_model.model_path: the teacher's vocab_size "
                              f"{student_vocab + 64} differs from the student's {student_vocab}")


def test_verls_own_rules_of_the_section(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir):
    def problems(*extra):
        return _problems(_config(tiny_model_dir, arithmetic_data_dir, tmp_path, teacher_dir, *extra))

    (k1,) = problems("distillation.distillation_loss.use_policy_gradient=False")
    assert "loss_mode=k1 with use_policy_gradient=false" in k1
    assert problems("distillation.distillation_loss.use_policy_gradient=False",
                    "distillation.distillation_loss.loss_mode=k3") == []
    (mode,) = problems("distillation.distillation_loss.policy_loss_mode=gspo")
    assert "policy_loss_mode='gspo': veRL's distillation has the vanilla policy loss only" in mode
    (unknown,) = problems("distillation.distillation_loss.loss_mode=k4")
    assert ("loss_mode='k4' is not one of ['kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3', 'forward_kl_topk']"
            in unknown)
    # the teacher reads prompt (32) and response (8) and veRL asks room for one more token
    (short,) = problems("distillation.teacher_models.teacher_model.inference.max_model_len=40")
    assert "max_model_len=40 is shorter than prompt_length + response_length + 1 = 41" in short
