"""RayWorkerGroup with real Ray actors on CPU: dispatch modes, colocation, overlap, errors and deaths."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from runtime_workers import (
    CriticLikeGroup,
    CriticLikeWorker,
    EchoGroup,
    EchoWorker,
    TensorParallelGroup,
    TensorParallelWorker,
)
from verlx.protocol import DataProto
from verlx.single_controller import PhaseTimeoutError, WorkerCallError, WorkerDiedError
from verlx.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)


@pytest.fixture(scope="module")
def echo_group(ray_cpu):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="echo")
    group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker, tag="t"), name="echo")
    yield group
    group.shutdown()
    pool.release()


def test_one_to_all_reaches_every_rank_with_env(echo_group):
    out = echo_group.whoami("!")
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["world"] == 2 and o["tag"] == "t!" for o in out)
    assert [o["local_rank"] for o in out] == [0, 1]
    assert out[0]["pid"] != out[1]["pid"]
    # rank 0's address and port are what every rank sees
    assert out[0]["master"] == out[1]["master"] and out[0]["master"][1] is not None


def test_workers_keep_state_between_calls(echo_group):
    first = echo_group.add(3)
    second = echo_group.add(4)
    assert [b - a for a, b in zip(first, second)] == [4, 4]


def test_dp_compute_gives_each_rank_its_item(echo_group):
    assert echo_group.take_mine(["a", "b"]) == [(0, "a"), (1, "b")]
    with pytest.raises(TypeError, match="one entry per rank"):
        echo_group.take_mine(["only-one"])


def test_dp_compute_proto_splits_pads_and_concats(echo_group):
    x = torch.arange(5, dtype=torch.float32)
    out = echo_group.double(DataProto({"x": x}))
    assert len(out) == 5  # padding row removed
    assert torch.equal(out.batch["x2"], x * 2)
    # 5 rows padded to 6: rank 0 gets rows 0-2, rank 1 rows 3-4 plus the pad
    assert out.batch["seen_by"].tolist() == [0, 0, 0, 1, 1]


def test_dp_compute_proto_rejects_bad_input(echo_group):
    with pytest.raises(ValueError, match="1 rows cannot be split across 2"):
        echo_group.double(DataProto({"x": torch.zeros(1)}))
    with pytest.raises(TypeError, match="must be a DataProto"):
        echo_group.double({"x": torch.zeros(4)})


def test_rank_zero_calls_only_rank_zero(echo_group):
    assert echo_group.only_zero() == 0


def test_non_blocking_calls_overlap(echo_group):
    future = echo_group.sleep_span(1.0)
    returned_at = time.monotonic()
    (start0, end0), (start1, end1) = future.get()
    assert returned_at < min(end0, end1), "the call returned only after the work finished"
    assert max(start0, start1) < min(end0, end1), "the two ranks did not sleep at the same time"


def test_worker_exception_carries_rank_and_traceback(echo_group):
    with pytest.raises(WorkerCallError) as info:
        echo_group.fail_on(1)
    err = info.value
    assert err.rank == 1 and err.group == "echo" and err.method == "fail_on"
    assert "deliberate failure on rank 1" in str(err) and "in fail_on" in str(err)  # the remote frame
    assert "\x1b[" not in str(err)  # no terminal colour codes in logs
    # the group still works afterwards
    assert echo_group.only_zero() == 0


def test_gloo_all_reduce_inside_group(echo_group):
    # rank r contributes 10*(r+1): 10 + 20
    assert echo_group.all_reduce(10.0) == [30.0, 30.0]


def test_timeout_reports_phase_ranks_and_stacks(ray_cpu):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="hang")
    group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker), name="hang")
    group.set_timeouts(hang_in_function_named_stuck_here=1.0)
    start = time.monotonic()
    with pytest.raises(PhaseTimeoutError) as info:
        group.hang_in_function_named_stuck_here(30)
    assert time.monotonic() - start < 25
    err = info.value
    assert err.running_ranks == [0, 1] and err.method == "hang_in_function_named_stuck_here"
    assert "hang_in_function_named_stuck_here" in err.stacks[0]
    group.shutdown()
    pool.release()


def test_shutdown_closes_the_workers_unless_a_call_timed_out_or_still_runs(ray_cpu, tmp_path):
    """A closed worker stops what it started (an engine server, its log removed); a group that timed out may be
    stuck, and one still running a call (a stop signal interrupted the driver's wait, or a call in flight) would
    close only after it: both are killed at once without closing."""
    for name in ("healthy", "stuck", "busy"):
        pool = RayResourcePool([2], use_gpu=False, name_prefix=name)
        group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker, close_marker=str(tmp_path / name)), name=name)
        group.set_timeouts(hang_in_function_named_stuck_here=1.0)
        if name == "stuck":
            with pytest.raises(PhaseTimeoutError):
                group.hang_in_function_named_stuck_here(30)
        elif name == "busy":
            group.sleep(60)  # non-blocking: still running at shutdown
        else:
            assert group.add(1) == [1, 1]
        start = time.monotonic()
        group.shutdown()
        assert time.monotonic() - start < 20, name
        pool.release()
    assert sorted(os.listdir(tmp_path)) == ["healthy.0", "healthy.1"]


def test_dead_worker_is_named_within_seconds(ray_cpu):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="die")
    group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker), name="die")
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        group.die_on(1, 0.2)
    assert info.value.rank == 1
    assert time.monotonic() - start < 15
    group.shutdown()
    pool.release()


def test_killed_worker_is_named(ray_cpu):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="kill")
    group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker), name="kill")
    future = group.sleep(30)
    time.sleep(1.0)
    os.kill(group.identities[0].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        future.get()
    assert info.value.rank == 0
    assert time.monotonic() - start < 15
    group.shutdown()
    pool.release()


def test_collateral_error_of_a_dead_peer_reports_the_death(ray_cpu):
    """Rank 0's call fails first (its collective lost a peer); rank 1 dies 0.5 s later. The driver must report the
    death (which triggers trainer.max_restarts), not rank 0's collateral error."""
    pool = RayResourcePool([2], use_gpu=False, name_prefix="peer")
    group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker), name="peer")
    with pytest.raises(WorkerDiedError) as info:
        group.peer_dies_after_error(1, 0.5)
    assert info.value.rank == 1
    group.shutdown()
    pool.release()


def test_tensor_parallel_peers_share_a_shard_and_one_returns(ray_cpu):
    pool = RayResourcePool([4], use_gpu=False, name_prefix="tp")
    group = TensorParallelGroup(pool, RayClassWithInitArgs(TensorParallelWorker, tp=2), name="tp")
    x = torch.arange(6)
    out = group.tag(DataProto({"x": x}))
    assert torch.equal(out.batch["x"], x)
    # dp rank 0 = ranks {0,1} (rank 0 returns), dp rank 1 = ranks {2,3} (rank 2 returns)
    assert out.batch["rank"].tolist() == [0, 0, 0, 2, 2, 2]
    group.shutdown()
    pool.release()


def test_colocated_roles_share_one_process_and_keep_state(ray_cpu):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="colo")
    worker_dict_cls = create_colocated_worker_cls(
        {
            "actor": RayClassWithInitArgs(EchoWorker, tag="actor"),
            "critic": RayClassWithInitArgs(CriticLikeWorker, scale=3),
        }
    )
    group = RayWorkerGroup(pool, worker_dict_cls, name="colocated")
    views = group.spawn({"actor": (EchoGroup, EchoWorker), "critic": (CriticLikeGroup, CriticLikeWorker)})
    actor, critic = views["actor"], views["critic"]
    actor_pids = [o["pid"] for o in actor.whoami("")]
    assert [o["tag"] for o in actor.whoami("")] == ["actor", "actor"]
    critic.pid_and_calls()
    pids, calls, scales = zip(*critic.pid_and_calls())
    assert list(pids) == actor_pids  # same process per rank
    assert calls == (2, 2) and scales == (3, 3)
    actor.add(5)
    assert actor.add(1) == [6, 6]
    out = critic.scaled(DataProto({"x": torch.arange(4)}))
    assert out.batch["y"].tolist() == [0, 3, 6, 9]
    group.shutdown()
    pool.release()
