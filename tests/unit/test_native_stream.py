"""The native engine's request stream: requests submitted while others decode get exactly the tokens (and
log-probs) a batch generate gives the same prompt with the same seed; per-request limits are honoured; the agent
loop's driver drives it from coroutines."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from helpers.float_tolerance import decoder_reduction_length, reorder_tolerance
from native_models import EOS, ragged_prompts, rollout_context, save_tiny_model, with_meta
from verlx.rollout.agent.driver import StreamDriver
from verlx.rollout.base import resolve_sampling
from verlx.rollout.native.engine import NativeEngine
from verlx.rollout.seeds import row_seed

NEW = 24


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    _, config = save_tiny_model("qwen2", path)
    return NativeEngine(rollout_context(path, config, response_length=NEW, max_num_seqs=4,
                                        engine_kwargs={"native": {"sync_interval": 4}}))


def lp_tolerance(engine, *log_prob_lists) -> float:
    """Log-probs of one request computed in batches of another composition differ only by the order of their
    float32 sums (helpers/float_tolerance.py): the bound for this model, its context and these values' size."""
    context = engine.config.prompt_length + engine.config.response_length
    magnitude = max((abs(v) for lps in log_prob_lists for v in lps), default=1.0)
    return reorder_tolerance(decoder_reduction_length(engine.ctx.hf_config, context), magnitude)


def reference(engine, prompts, seeds):
    """engine.generate with one seed per prompt (row seed = row_seed(seed, 0))."""
    batch = with_meta(prompts, temperature=1.0)
    batch.non_tensor_batch["seed"] = np.array(seeds, dtype=object)
    out = engine.generate(batch)
    mask = out.batch["response_mask"].bool()
    return ([out.batch["responses"][i][mask[i]].tolist() for i in range(len(prompts))],
            [out.batch["rollout_log_probs"][i][mask[i]].tolist() for i in range(len(prompts))])


def token_lists(prompts):
    return [row[m.bool()].tolist() for row, m in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]


def test_requests_joining_mid_decode_get_the_batch_tokens(engine):
    prompts = ragged_prompts(6, 12, seed=2)
    seeds = [11, 12, 13, 14, 15, 16]
    want_ids, want_lps = reference(engine, prompts, seeds)
    params = resolve_sampling(engine.config, {"temperature": 1.0}, [EOS])
    stream = engine.open_stream(params)
    ids = token_lists(prompts)
    got = {}
    for k in range(2):
        stream.submit(str(k), ids[k], NEW, row_seed(seeds[k], 0))
    for _ in range(2):  # the first two decode a few rounds alone
        got.update({f.key: (f.token_ids, f.log_probs) for f in stream.step()})
    for k in range(2, 6):  # more than the 4 slots: some wait for a free slot
        stream.submit(str(k), ids[k], NEW, row_seed(seeds[k], 0))
    while stream.busy:
        got.update({f.key: (f.token_ids, f.log_probs) for f in stream.step()})
    assert sorted(got) == [str(k) for k in range(6)]
    tolerance = lp_tolerance(engine, *want_lps)
    for k in range(6):
        assert got[str(k)][0] == want_ids[k]
        assert got[str(k)][1] == pytest.approx(want_lps[k], abs=tolerance)
    assert stream.stats.rounds > 2


def test_per_request_limit_and_bad_requests(engine):
    prompts = ragged_prompts(2, 10, seed=4)
    params = resolve_sampling(engine.config, {"temperature": 1.0, "ignore_eos": True}, [EOS])
    stream = engine.open_stream(params)
    ids = token_lists(prompts)
    stream.submit("short", ids[0], 5, 3)
    stream.submit("long", ids[0], NEW, 3)
    got = {}
    while stream.busy:
        got.update({f.key: f.token_ids for f in stream.step()})
    assert len(got["short"]) == 5 and len(got["long"]) == NEW
    assert got["long"][:5] == got["short"]  # the same seed draws the same tokens; the limit only cuts
    with pytest.raises(ValueError, match="max_new_tokens=0 must be in"):
        stream.submit("x", ids[0], 0, 1)
    with pytest.raises(ValueError, match="exceed the engine's max_model_len"):
        stream.submit("x", ids[0] * 10, NEW, 1)


def test_the_agent_driver_serves_concurrent_coroutines(engine):
    prompts = ragged_prompts(5, 12, seed=5)
    ids = token_lists(prompts)
    params = resolve_sampling(engine.config, {"temperature": 1.0, "seed": 99}, [EOS])

    async def run():
        driver = StreamDriver(engine.open_stream(params), n=1)
        await driver.start()

        async def sample(k):
            await asyncio.sleep(0.01 * k)  # arrive one by one
            return await driver.generate(ids[k], NEW - k, (k, 0))

        outs = await asyncio.gather(*(sample(k) for k in range(5)))
        await driver.stop()
        return outs

    outs = asyncio.run(run())
    stream = engine.open_stream(params)
    for k in range(5):
        stream.submit(str(k), ids[k], NEW - k, row_seed(row_seed(99, k), 0))  # what batch generate gives row k
    want = {}
    while stream.busy:
        want.update({f.key: f.token_ids for f in stream.step()})
    for k, out in enumerate(outs):
        assert out.token_ids == want[str(k)] and len(out.token_ids) <= NEW - k
        assert out.finish_reason == ("stop" if out.token_ids[-1] == EOS else "length")
        assert len(out.log_probs) == len(out.token_ids)


def test_extend_prefill_matches_a_full_prefill(engine):
    """Two sequences continued in one batched pass (different cached lengths and new lengths) give the hidden
    states and K/V of a full prefill."""
    a, b = token_lists(ragged_prompts(2, 14, seed=6))
    b = (b * 3)[:12]
    cache, model = engine.cache, engine.model
    with torch.no_grad():
        full = [model.forward_prompt(torch.tensor([ids]), cache, torch.tensor([slot]), torch.tensor([0]))[0, -1]
                for ids, slot in ((a, 0), (b, 1))]
        model.forward_prompt(torch.tensor([a[:9]]), cache, torch.tensor([2]), torch.tensor([0]))
        model.forward_prompt(torch.tensor([b[:4]]), cache, torch.tensor([3]), torch.tensor([0]))
        new = torch.zeros(2, 8, dtype=torch.long)
        new[0, : len(a) - 9], new[1, : len(b) - 4] = torch.tensor(a[9:]), torch.tensor(b[4:])
        hidden = model.forward_extend(new, torch.tensor([len(a) - 9, len(b) - 4]), torch.tensor([9, 4]), cache,
                                      torch.tensor([2, 3]))
        logits = model.logits(torch.stack(full))
        tolerance = reorder_tolerance(decoder_reduction_length(engine.ctx.hf_config, len(a)), logits.abs().max())
        torch.testing.assert_close(model.logits(hidden), logits, atol=tolerance, rtol=0)
        for extended, reference, n in ((2, 0, len(a)), (3, 1, len(b))):
            torch.testing.assert_close(cache.data[:, :, extended, :, :n], cache.data[:, :, reference, :, :n],
                                       atol=tolerance, rtol=0)


def test_a_later_turn_reuses_the_parked_kv_and_gets_the_same_tokens(engine):
    params = resolve_sampling(engine.config, {"temperature": 1.0}, [EOS])

    def conversation(reuse: bool):
        stream = engine.open_stream(params)
        ids = token_lists(ragged_prompts(6, 10, seed=8))
        out, tools = {}, []  # tools: [rounds left, follow-up request] (a tool call taking a few rounds)
        for k in range(6):  # 6 conversations on 4 slots: parked slots must be given up for waiting ones
            stream.submit(f"{k}/0", ids[k], 4 + 2 * k, 100 + k)
        while stream.busy or tools:
            for entry in tools:
                entry[0] -= 1
            for _, request in [t for t in tools if t[0] <= 0]:
                stream.submit(*request)
            tools = [t for t in tools if t[0] > 0]
            for f in stream.step():  # others decode while a conversation waits for its tool
                key, tokens = f.key, f.token_ids
                out[key] = (tokens, f.log_probs)
                k, turn = (int(x) for x in key.split("/"))
                if turn == 0:
                    follow_up = (f"{k}/1", ids[k] + tokens + [5, 6, 7, 8, 9], 6, 200 + k, key if reuse else None)
                    tools.append([2, follow_up])
        return out, stream

    plain, plain_stream = conversation(reuse=False)
    reused, stream = conversation(reuse=True)
    assert sorted(reused) == sorted(plain) and len(plain) == 12
    tolerance = lp_tolerance(engine, *(lps for _, lps in plain.values()))
    for key in plain:
        assert reused[key][0] == plain[key][0]
        assert reused[key][1] == pytest.approx(plain[key][1], abs=tolerance)
    assert plain_stream.reused_tokens == 0
    assert stream.reused_tokens > 0  # some second turns prefilled only their 5 new tokens
    assert stream.stats.prompt_tokens < plain_stream.stats.prompt_tokens


def test_requests_with_the_same_prompt_share_one_prefill(engine):
    prompts = ragged_prompts(2, 12, seed=9)
    ids = token_lists(prompts)
    seeds = [31, 32, 33, 34]
    want_ids, want_lps = reference(engine, with_meta(prompts).repeat(2, interleave=True), seeds)
    params = resolve_sampling(engine.config, {"temperature": 1.0}, [EOS])
    stream = engine.open_stream(params)
    for k in range(4):  # rows 0, 1 share prompt 0; rows 2, 3 prompt 1
        stream.submit(str(k), ids[k // 2], NEW, row_seed(seeds[k], 0))
    got = {}
    while stream.busy:
        got.update({f.key: (f.token_ids, f.log_probs) for f in stream.step()})
    tolerance = lp_tolerance(engine, *want_lps)
    for k in range(4):
        assert got[str(k)][0] == want_ids[k]
        assert got[str(k)][1] == pytest.approx(want_lps[k], abs=tolerance)
    assert stream.stats.prompt_tokens == len(ids[0]) + len(ids[1])
