"""rollout.mode=async (veRL's agent-loop rollout) on the native engine: a single-turn agent loop gives exactly the
batch a synchronous generate gives (same columns, same tokens, greedy and sampled with the same seed), and
over_sample_rate cancels exactly the samples still running once int(N × (1 - rate)) have finished."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.float_tolerance import decoder_reduction_length, reorder_tolerance
from native_models import EOS, ragged_prompts, rollout_context, save_tiny_model, with_meta
from verlx.config.roles import AgentLoopConfig
from verlx.models.tiny import build_tokenizer
from verlx.rollout.agent.oversampling import samples_to_keep
from verlx.rollout.agent.runner import AgentLoopRunner
from verlx.rollout.base import SamplingParams
from verlx.rollout.native.engine import NativeEngine
from verlx.rollout.stream import Finished, RequestStream, StreamLimits

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 16
TOKENIZER = build_tokenizer()  # a byte-level tokenizer: every id of the 96-token test model decodes


def native_engine(path, **overrides):
    _, config = save_tiny_model("qwen2", path)
    fields = dict(response_length=NEW, max_num_seqs=16, mode="async")
    fields.update(overrides)
    return NativeEngine(rollout_context(path, config, **fields))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return native_engine(tmp_path_factory.mktemp("qwen2"), engine_kwargs={"native": {"sync_interval": 4}})


def runner_for(config) -> AgentLoopRunner:
    return AgentLoopRunner(config, TOKENIZER, [EOS], 0)


def assert_same_batch(sync, agent, engine):
    """The same columns and tokens; log-probs within what another batch composition's summation order allows."""
    assert sorted(sync.batch.keys()) == sorted(agent.batch.keys())
    assert sorted(sync.non_tensor_batch) == sorted(agent.non_tensor_batch)
    context = engine.config.prompt_length + engine.config.response_length
    for key in sync.batch:
        a, b = sync.batch[key], agent.batch[key]
        assert (a.shape, a.dtype) == (b.shape, b.dtype), key
        if key == "rollout_log_probs":
            tolerance = reorder_tolerance(decoder_reduction_length(engine.ctx.hf_config, context), a.abs().max())
            torch.testing.assert_close(a, b, atol=tolerance, rtol=0)
        else:
            assert torch.equal(a, b), key


@pytest.mark.parametrize("meta", [{"do_sample": False, "seed": 7},
                                  {"do_sample": True, "temperature": 1.0, "seed": 7, "n": 2}],
                         ids=["greedy", "sampled_n2"])
def test_single_turn_agent_loop_gives_the_synchronous_batch(engine, meta):
    prompts = with_meta(ragged_prompts(6, 16, seed=3), **meta)
    sync = engine.generate(prompts)
    agent = runner_for(engine.config).generate(engine, prompts)
    assert_same_batch(sync, agent, engine)
    lengths = sync.batch["response_mask"].sum(-1)
    assert lengths.min() >= 1 and len(sync) == 6 * meta.get("n", 1)


def test_a_loop_named_in_verls_agent_loop_config_file_runs(engine, tmp_path):
    """rollout.agent.agent_loop_config_path (veRL's {name, _target_} list): default_agent_loop names its entry."""
    path = tmp_path / "agent.yaml"
    path.write_text("- name: three_tokens\n  _target_: helpers.async_loops.ThreeTokenLoop\n")
    agent = dataclasses.replace(engine.config.agent, default_agent_loop="three_tokens",
                                agent_loop_config_path=str(path))
    prompts = with_meta(ragged_prompts(4, 16, seed=3), do_sample=False, seed=7)
    sync = engine.generate(prompts)
    short = runner_for(dataclasses.replace(engine.config, agent=agent)).generate(engine, prompts)
    lengths = short.batch["response_mask"].sum(-1)
    assert lengths.max() == 3 and torch.equal(lengths, sync.batch["response_mask"].sum(-1).clamp(max=3))
    # greedy: the first 3 tokens of the full single-turn responses
    assert torch.equal(short.batch["responses"][:, :3] * (lengths[:, None] > torch.arange(3)),
                       sync.batch["responses"][:, :3] * (lengths[:, None] > torch.arange(3)))


class RoundsStream(RequestStream):
    """An engine double: sample k's request finishes after rounds[k] steps with rounds[k] tokens."""

    def __init__(self, rounds: list[int]):
        super().__init__(SamplingParams(), StreamLimits(NEW, 10**6), want_log_probs=True)
        self.rounds, self.live, self.released = rounds, {}, []

    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows):
        sample = int(key.split("/")[0])
        self.live[key] = [self.rounds[sample], sample]

    def _step(self):
        done = []
        for key, entry in list(self.live.items()):
            entry[0] -= 1
            if entry[0] == 0:
                tokens = [10 + entry[1]] * self.rounds[entry[1]]
                done.append(Finished(key, tokens, [-0.5] * len(tokens), "length"))
                del self.live[key]
        return done

    def _cancel(self, keys):
        self.released += sorted(keys & set(self.live), key=lambda k: int(k.split("/")[0]))
        for key in keys:
            self.live.pop(key, None)
        return [Finished(key, [], [], "abort") for key in keys]


def over_sampling_runner(rate: float) -> AgentLoopRunner:
    from verlx.config.roles import RolloutConfig

    config = RolloutConfig(prompt_length=16, response_length=NEW, mode="async", over_sample_rate=rate,
                           agent=AgentLoopConfig(num_workers=2))
    return AgentLoopRunner(config, TOKENIZER, [EOS], 0)


@pytest.mark.parametrize("rounds, rate, cancelled", [
    ([3, 1, 8, 2, 7, 4, 6, 5], 0.25, {2, 4}),          # keep int(8 × 0.75) = 6: the two slowest go
    ([1, 1, 2, 2, 3, 3, 3, 3], 0.5, {4, 5, 6, 7}),     # 4 done after round 2
    ([1, 1, 2, 2, 3, 3, 3, 3], 0.3, set()),            # keep 5: round 3 finishes the last 4 at once, all kept
    ([5, 4, 3, 2, 1, 6, 7, 8], 0.99, {0, 1, 2, 3, 5, 6, 7}),  # int(0.08) = 0: still one sample is kept
    ([2, 1, 3, 4, 5, 6, 7, 8], 0.0, set()),            # off
])
def test_over_sample_rate_cancels_exactly_the_unfinished_samples(rounds, rate, cancelled):
    prompts = with_meta(ragged_prompts(8, 16, seed=5), do_sample=True)
    backend = RoundsStream(rounds)
    batch = over_sampling_runner(rate).generate_with(backend, prompts, n=1)
    width = batch.batch["prompts"].shape[1]
    lengths = batch.batch["attention_mask"][:, width:].sum(-1).tolist()
    assert {k for k, n in enumerate(lengths) if n == 0} == cancelled
    for k in range(8):  # the kept samples as generated; the cancelled ones empty and out of the loss
        want = 0 if k in cancelled else rounds[k]
        assert lengths[k] == want and batch.batch["response_mask"][k].sum() == want
        assert batch.batch["responses"][k, :want].tolist() == [10 + k] * want
        assert batch.batch["rollout_log_probs"][k].sum() == pytest.approx(-0.5 * want)
    prompt_mask = prompts.batch["attention_mask"].bool()
    for k in range(8):  # every prompt stays in the batch
        assert batch.batch["prompts"][k][batch.batch["attention_mask"][k, :width].bool()].tolist() == \
            prompts.batch["input_ids"][k][prompt_mask[k]].tolist()
    # the engine aborted the cancelled samples' requests, after one more round (the cut reaches it then)
    last_kept_round = sorted(rounds)[samples_to_keep(8, rate) - 1]
    assert not backend.live
    assert {int(r.split("/")[0]) for r in backend.released} == {k for k in cancelled if rounds[k] > last_kept_round + 1}
    assert batch.non_tensor_batch == {}  # mode=async without multi_turn: the synchronous layout
    assert len(cancelled) == (0 if rate == 0 else max(0, 8 - len([r for r in rounds if r <= sorted(rounds)[
        samples_to_keep(8, rate) - 1]])))


@pytest.mark.parametrize("meta", [{"validate": True, "do_sample": True}, {"do_sample": False}])
def test_validation_and_greedy_calls_are_never_cut(meta):
    prompts = with_meta(ragged_prompts(4, 16, seed=6), **meta)
    batch = over_sampling_runner(0.5).generate_with(RoundsStream([1, 2, 3, 4]), prompts, n=1)
    assert batch.batch["response_mask"].sum(-1).tolist() == [1, 2, 3, 4]


def test_over_sampling_on_the_native_engine_keeps_the_first_finishers(tmp_path):
    """One decode step per round: a sample finishes in the round of its length, so which are cancelled follows
    from the lengths of the uncut run, and the kept samples have exactly its tokens."""
    stop_ids = [EOS, *range(20, 40)]  # many stop tokens: the sampled lengths spread out
    engine = native_engine(tmp_path / "m", engine_kwargs={"native": {"sync_interval": 1}})
    uncut = AgentLoopRunner(engine.config, TOKENIZER, stop_ids, 0)
    over_sampling = AgentLoopRunner(dataclasses.replace(engine.config, over_sample_rate=0.25), TOKENIZER, stop_ids, 0)
    prompts = with_meta(ragged_prompts(6, 16, seed=4), do_sample=True, temperature=1.0, seed=11, n=2)
    full = uncut.generate(engine, prompts)
    cut = over_sampling.generate(engine, prompts)
    width = full.batch["prompts"].shape[1]
    lengths = full.batch["attention_mask"][:, width:].sum(-1)
    keep = samples_to_keep(12, 0.25)
    last_kept = lengths.sort().values[keep - 1]
    want_cancelled = lengths > last_kept
    assert 0 < want_cancelled.sum() < 12 - keep + 1
    got = cut.batch["attention_mask"][:, width:].sum(-1)
    assert torch.equal(got == 0, want_cancelled)
    kept = ~want_cancelled
    assert torch.equal(cut.batch["responses"][kept], full.batch["responses"][kept])
    assert torch.equal(got[kept], lengths[kept])
    again = uncut.generate(engine, prompts)  # the cancelled requests left nothing behind in the engine
    assert torch.equal(again.batch["responses"], full.batch["responses"])
