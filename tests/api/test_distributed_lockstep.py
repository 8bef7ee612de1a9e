"""The parts of a sharded server that need no second process (issue 33): the
step plan rank 0 broadcasts and what a follower makes of it, agreed
cancellations, the 503s of a lost group in each surface's shape, ``/health``,
the ``distributed`` block, the watchdog, and what is refused up front.

The broadcast here is a wire in one process (rank 0's turn, then a follower's);
``test_distributed.py`` runs the real one over ``mlx.launch``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import pytest

from mlxspec.cli.group_serve import group_problem, group_timeout
from mlxspec.cli.main import main
from mlxspec.config import ServeConfig
from mlxspec.engine import Engine, Failed, GenerationRequest
from mlxspec.engine.distributed import GroupLost, detect_launch
from mlxspec.engine.distributed.group import GroupInfo, RankShare
from mlxspec.engine.distributed.lockstep import FollowerJobs, LeaderJobs, StepPlan
from mlxspec.engine.distributed.shards import shard_problem
from mlxspec.engine.distributed.watchdog import Watchdog
from mlxspec.engine.loop.handles import RequestHandle
from mlxspec.engine.loop.jobs import Generate, Stop
from mlxspec.engine.types import GroupUnavailableError, NotShardableError
from mlxspec.errors import from_exception
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.helpers import anthropic_sdk

REQUEST = GenerationRequest(prompt=(5, 6, 7), max_tokens=4)


class Wire:
    """Rank 0's payload, handed to the follower's next turn (one process)."""

    def __init__(self) -> None:
        self.payload = b""
        self.turns = 0
        self.last_done = time.monotonic()

    def share(self, payload: bytes | None) -> bytes:
        if payload is not None:  # rank 0 goes first in these tests
            self.payload = payload
        self.turns += 1
        return self.payload


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture()
def pair() -> tuple[queue.Queue, LeaderJobs, FollowerJobs, list, list]:
    """Rank 0's queue and job source, a follower's, what the follower's KV ledger
    was handed, and the reasons ``on_lost`` got."""
    wire, jobs, ledger, lost = Wire(), queue.Queue(), [], []
    leader = LeaderJobs(jobs, wire, lost.append, tick=0.01)  # type: ignore[arg-type]
    follower = FollowerJobs(wire, lost.append, ledger.append, tick=0.01)  # type: ignore[arg-type]
    return jobs, leader, follower, ledger, lost


def both_turn(leader: LeaderJobs, follower: FollowerJobs) -> None:
    leader.turn(False)
    follower.turn(False)


def events(loop: asyncio.AbstractEventLoop, handle: RequestHandle) -> list:
    async def read() -> list:
        return [event async for event in handle]

    return loop.run_until_complete(read())


def test_launchers_are_read_from_their_variables() -> None:
    assert detect_launch({}) is None
    assert detect_launch({"MLX_RANK": "1", "MLX_HOSTFILE": "/tmp/h.json"}) == "ring"
    assert detect_launch({"OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"
    assert detect_launch({"NCCL_HOST_IP": "10.0.0.1", "MLX_WORLD_SIZE": "2"}) == "nccl"
    assert detect_launch({"MLX_JACCL_COORDINATOR": "10.0.0.1:5000", "MLX_RANK": "0"}) == "jaccl"


def test_an_empty_plan_is_no_bytes_and_a_plan_round_trips() -> None:
    assert StepPlan().encode() == b""
    assert StepPlan.decode(b"") == StepPlan()
    plan = StepPlan(jobs=[(3, REQUEST, 4)], cancels=[1, 2], stop=True)
    assert StepPlan.decode(plan.encode()) == plan


def test_the_follower_gets_rank_0s_requests_in_order(pair, loop) -> None:
    jobs, leader, follower, ledger, _ = pair
    other = GenerationRequest(prompt=(9,), max_tokens=2)
    for req, budget in ((REQUEST, 4), (other, 2)):
        jobs.put(Generate(RequestHandle(req, loop, agreed=True), budget))
    both_turn(leader, follower)
    mine = [leader.get(False), leader.get(False)]
    theirs = [follower.get(False), follower.get(False)]
    assert [(j.handle.request, j.budget) for j in theirs] == [(REQUEST, 4), (other, 2)]
    assert [(j.handle.request, j.budget) for j in mine] == [(REQUEST, 4), (other, 2)]
    assert ledger == theirs  # the follower's KV ledger saw them before its loop
    assert leader.empty() and follower.empty() and leader.get(False) is None


def test_a_cancel_reaches_every_loop_only_through_a_plan(pair, loop) -> None:
    jobs, leader, follower, _, _ = pair
    handle = RequestHandle(REQUEST, loop, agreed=True)
    jobs.put(Generate(handle, 4))
    both_turn(leader, follower)
    shadow = follower.get(False).handle
    handle.cancel()
    assert handle.cancel_wanted and not handle.cancelled  # rank 0's loop still runs it
    both_turn(leader, follower)
    assert handle.cancelled and shadow.cancelled  # both drop it at the same turn
    assert StepPlan.decode(leader.broadcast.payload).cancels == [0]
    both_turn(leader, follower)
    assert StepPlan.decode(leader.broadcast.payload) == StepPlan()  # said once


def test_an_ended_request_is_forgotten_and_stop_reaches_the_follower(pair, loop) -> None:
    jobs, leader, follower, _, _ = pair
    handle = RequestHandle(REQUEST, loop, agreed=True)
    jobs.put(Generate(handle, 4))
    both_turn(leader, follower)
    leader.ended(leader.get(False).handle)
    follower.ended(follower.get(False).handle)
    handle.cancel()
    jobs.put(Stop())
    both_turn(leader, follower)
    assert StepPlan.decode(leader.broadcast.payload) == StepPlan(stop=True)
    assert isinstance(leader.get(False), Stop) and isinstance(follower.get(False), Stop)


def test_a_handle_of_one_process_cancels_at_once(loop) -> None:
    handle = RequestHandle(REQUEST, loop)
    handle.cancel()
    assert handle.cancelled and handle.cancel_wanted


def test_a_lost_group_answers_held_and_queued_requests_503(pair, loop) -> None:
    jobs, leader, follower, _, lost = pair
    held = RequestHandle(REQUEST, loop, agreed=True)
    jobs.put(Generate(held, 4))
    both_turn(leader, follower)
    queued = RequestHandle(REQUEST, loop, agreed=True)
    jobs.put(Generate(queued, 4))
    assert not leader.lost(ValueError("a bad request"))
    assert leader.lost(RuntimeError("[ring] connection to a peer was lost"))
    assert lost == ["[ring] connection to a peer was lost"]
    assert leader.fail_all("gone") == 2
    for handle in (held, queued):
        assert events(loop, handle) == [Failed("gone", error="group_unavailable")]
    refused = from_exception(GroupUnavailableError("gone"))
    assert (refused.status, refused.spec.type) == (503, "engine_unavailable")


def test_a_failed_broadcast_reports_the_group_lost(loop) -> None:
    class Broken(Wire):
        def share(self, payload: bytes | None) -> bytes:
            raise GroupLost("[ring] connection to a peer was lost")

    lost: list[str] = []
    leader = LeaderJobs(queue.Queue(), Broken(), lost.append, tick=0.01)  # type: ignore[arg-type]
    with pytest.raises(GroupLost):
        leader.turn(True)
    assert lost == ["[ring] connection to a peer was lost"]


def test_the_watchdog_gives_up_a_stalled_group_but_spares_the_start_up() -> None:
    stalled = Wire()
    stalled.turns, stalled.last_done = 5, time.monotonic() - 10
    fired = threading.Event()
    reasons: list[str] = []
    dog = Watchdog(stalled, lambda r: (reasons.append(r), fired.set()), timeout=0.2)  # type: ignore[arg-type]
    dog.start()
    assert fired.wait(5)
    assert reasons[0].startswith("a process of the group did not answer for")
    starting = Wire()  # no broadcast completed yet: the ranks are still starting
    starting.last_done = time.monotonic() - 10
    quiet = threading.Event()
    early = Watchdog(starting, lambda r: quiet.set(), timeout=0.2)  # type: ignore[arg-type]
    early.start()
    assert not quiet.wait(1.0)
    early.stop()


def test_what_one_rank_cannot_do_is_refused_before_loading() -> None:
    assert group_problem(ServeConfig(), "ring") is None
    assert "mlx.launch" in str(group_problem(ServeConfig(pipeline=True), None))
    for config, flag in (
        (ServeConfig(draft_kind="ngram"), "--draft-kind"),
        (ServeConfig(adapter_path="/a"), "--adapter-path"),
        (ServeConfig(ssd_cache="/s"), "--ssd-cache"),
        (ServeConfig(kv_budget=1 << 20), "--kv-budget"),
        (ServeConfig(isolate=True), "--isolate"),
        (ServeConfig(unix="/tmp/w.sock"), "--unix"),
    ):
        assert str(group_problem(config, "ring")).startswith(f"{flag} is not supported")


def test_a_bad_group_timeout_is_refused_not_ignored(monkeypatch) -> None:
    for bad in ("abc", "0", "-5", "inf", "nan"):
        monkeypatch.setenv("MLXSPEC_DIST_TIMEOUT", bad)
        assert str(group_problem(ServeConfig(), "ring")) == (
            f"MLXSPEC_DIST_TIMEOUT={bad}: not a finite number of seconds above 0"
        )
    monkeypatch.setenv("MLXSPEC_DIST_TIMEOUT", "7.5")
    assert group_problem(ServeConfig(), "ring") is None
    assert group_timeout() == 7.5


def test_pipeline_without_a_launcher_is_one_line_exit_2(capsys, monkeypatch) -> None:
    for name in ("MLX_RANK", "MLX_HOSTFILE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "--pipeline", "/nowhere"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "mlxspec: error: --pipeline: needs a process group (start with mlx.launch -n N ...)\n"
    )


def test_head_counts_that_do_not_split_are_named_with_what_works_instead() -> None:
    class Smol:  # SmolLM2-135M: a Llama, 9 heads, 3 KV heads; mlx-lm cannot pipeline it
        __module__ = "mlx_lm.models.llama"
        args = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3)
        model = SimpleNamespace(layers=[None] * 30)

        def shard(self, group: Any) -> None: ...

    class Qwen(Smol):  # a Qwen2 pipelines (model.model.pipeline)
        __module__ = "mlx_lm.models.qwen2"
        args = SimpleNamespace(num_attention_heads=14, num_key_value_heads=2)
        model = SimpleNamespace(layers=[None] * 24, pipeline=lambda group: None)

    def problem(model: Any, size: int, pipeline: bool = False) -> str | None:
        return shard_problem(model, SimpleNamespace(size=size, pipeline=pipeline))  # type: ignore[arg-type]

    assert problem(Smol(), 2) == (
        "num_attention_heads 9 and num_key_value_heads 3 do not split over 2 processes "
        "(mlx.launch -n 3 splits its heads)"  # never --pipeline: a Llama cannot
    )
    assert problem(Smol(), 3) is None
    assert problem(Smol(), 2, pipeline=True) == (
        "llama models cannot be pipelined by mlx-lm "
        "(without --pipeline, mlx.launch -n 3 splits its heads)"
    )
    assert problem(Qwen(), 4) == (
        "num_attention_heads 14 and num_key_value_heads 2 do not split over 4 processes "
        "(--pipeline splits its layers over 4 processes; mlx.launch -n 2 splits its heads)"
    )
    assert problem(Qwen(), 4, pipeline=True) is None


def test_a_refusal_names_what_the_user_passed_and_is_said_once(
    tiny_model_dir: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlxspec.cli.group_serve import join, refused_on_every_rank
    from mlxspec.cli.main import load_engine
    from mlxspec.engine.model.loader import ModelLoadError

    monkeypatch.chdir(tiny_model_dir.parent)  # the user passed a relative path
    three = SimpleNamespace(size=3, pipeline=False, rank=1, group=None)  # 4 heads: not in 3
    with pytest.raises(ModelLoadError) as refused:
        load_engine(ServeConfig(model=tiny_model_dir.name), three)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"cannot shard {tiny_model_dir.name} over 3 processes: num_attention_heads 4 and "
        "num_key_value_heads 2 do not split over 3 processes (mlx.launch -n 2 splits its heads)"
    )
    assert refused_on_every_rank(refused.value)  # a follower leaves it to rank 0
    assert not refused_on_every_rank(ModelLoadError("a file is missing on this host"))
    drafts = ServeConfig(draft_kind="ngram")
    for rank, said in (("1", ""), ("0", "mlxspec: error: --draft-kind is not supported")):
        monkeypatch.setenv("MLX_RANK", rank)
        assert join(drafts, "ring") == 2
        assert capsys.readouterr().err.startswith(said)


def test_work_outside_the_step_plan_is_400_and_a_lost_group_503(tiny_engine: Any) -> None:
    group = SimpleNamespace(info=SimpleNamespace(world_size=2), failure=None)
    engine = Engine(
        tiny_engine.model, tiny_engine.tokenizer, tiny_engine.info, tiny_engine.defaults,
        group=group,  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(NotShardableError) as refused:
        asyncio.run(engine.run_exclusive(lambda: 1))  # embeddings, scoring, adapter mounts
    assert from_exception(refused.value).spec.status == 400
    assert "sharded over 2 processes" in refused.value.message
    group.failure = "the sharded model is unavailable: gone"

    async def submit() -> None:
        engine.submit(REQUEST)

    with pytest.raises(GroupUnavailableError):
        asyncio.run(submit())


BLOCK = {
    **GroupInfo(
        2, "ring", "tensor", (RankShare(0, 100, (0, 1), (0, 1), (0, 0)), RankShare(1, 100, (0, 1)))
    ).block(),
    "plan_turns": 3,
    "plan_collectives": 4,
    "plan_ms_mean": 0.5,
    "healthy": True,
}


@pytest.fixture(scope="module")
def sharded(tiny_engine: Any) -> Iterator[tuple[FakeEngine, str]]:
    engine = FakeEngine(tiny_engine.tokenizer, tiny_engine.info, tiny_engine.defaults)
    with LiveServer(create_app(engine, validate_responses=True)) as server:
        yield engine, server.base


def test_stats_shows_the_group_and_health_turns_503(sharded) -> None:
    engine, base = sharded
    engine.group_block = dict(BLOCK)
    try:
        got = httpx.get(f"{base}/stats", timeout=30).json()
        block = got["distributed"]
        assert block["ranks"] == [  # the document's schema is checked too
            {
                "rank": 0,
                "weights_bytes": 100,
                "layers": [0, 1],
                "attention_heads": [0, 1],
                "kv_heads": [0, 0],
            },
            {"rank": 1, "weights_bytes": 100, "layers": [0, 1]},
        ]
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200
        engine.group_block = {**BLOCK, "healthy": False, "failure": "a rank is gone"}
        health = httpx.get(f"{base}/health", timeout=30)
        assert health.status_code == 503
        assert health.json()["error"] == {
            "message": "a rank is gone",
            "type": "engine_unavailable",
            "param": None,
            "code": "engine_unavailable",
        }
    finally:
        engine.group_block = None


def test_the_503_of_a_lost_group_in_each_surfaces_shape(sharded) -> None:
    engine, base = sharded
    engine.script = ["Hi", Failed("the sharded model is unavailable", error="group_unavailable")]
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 503
    assert chat.json()["error"]["type"] == "engine_unavailable"
    with anthropic_sdk(base, timeout=30) as sdk:
        with pytest.raises(anthropic.APIStatusError) as exc:
            sdk.messages.create(
                model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
    assert exc.value.status_code == 503
    assert exc.value.body["type"] == "error"  # type: ignore[index]
    assert exc.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_a_ranks_prompt_cache_counts_the_whole_models_bytes() -> None:
    """Each rank holds a fixed share of every KV cache; counting the whole model's
    bytes makes every rank keep and evict the same entries."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from mlxspec.engine.caches.prompt_cache import CacheNamespace, PromptCache

    def stored(scale: tuple[int, int]) -> int:
        kv = KVCache()
        k = mx.zeros((1, 2, 8, 4))
        kv.update_and_fetch(k, k)
        cache = PromptCache(max_bytes=1 << 20)
        cache.byte_scale = scale
        cache.store(CacheNamespace("m"), tuple(range(8)), [kv])
        return cache.stats()["bytes"]

    assert stored((2, 1)) == 2 * stored((1, 1)) > 0
    assert stored((3, 2)) == stored((1, 1)) * 3 // 2


def test_work_a_sharded_engine_refuses_keeps_each_surfaces_envelope(sharded) -> None:
    """/v1/systemone answers its own validation errors as 422 ``detail``s; a
    sharded server's refusal is no validation error: a 400 in the error envelope."""
    engine, base = sharded

    async def refuse(messages: list, answers: Any) -> Any:
        raise NotShardableError("not available with the model sharded over 2 processes")

    engine.score = refuse
    try:
        systemone = {
            "model": "m",
            "state": "late",
            "questions": {"late": {"type": "noul", "instructions": "Is it late?"}},
        }
        reply = httpx.post(f"{base}/v1/systemone", json=systemone, timeout=30)
        assert reply.status_code == 400, reply.text
        assert reply.json() == {
            "error": {
                "message": "not available with the model sharded over 2 processes",
                "type": "invalid_request_error",
                "param": None,
                "code": "not_supported_when_sharded",
            }
        }
    finally:
        del engine.score


def test_an_idle_group_pauses_longer_each_empty_turn_alike_on_every_rank(pair, loop) -> None:
    """Each rank waits inside a collective by spinning: an idle group meets at
    agreed, growing pauses (10 ms doubling up to the tick), the same on both sides."""
    from mlxspec.engine.distributed.lockstep import FIRST_PAUSE_S, idle_pause

    assert [idle_pause(q, 0.25) for q in range(6)] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.25]
    assert idle_pause(10_000, 0.25) == 0.25
    jobs, leader, follower, _, _ = pair  # tick=0.01 on both
    for _ in range(3):
        both_turn_idle(leader, follower)
    assert leader.quiet == follower.quiet == 3
    jobs.put(Generate(RequestHandle(REQUEST, loop, agreed=True), 4))
    start = time.monotonic()
    both_turn_idle(leader, follower)  # a request ends the quiet spell at once
    assert time.monotonic() - start < 1.0
    assert leader.quiet == follower.quiet == 0
    assert leader.pause(True) == follower.pause(True) == FIRST_PAUSE_S


def both_turn_idle(leader: LeaderJobs, follower: FollowerJobs) -> None:
    leader.turn(True)
    follower.turn(True)
    while leader.get(False) is not None or follower.get(False) is not None:
        pass


def test_a_closed_ring_connection_is_seen_at_once_without_reading_it() -> None:
    """The peer watch peeks: MLX's queued bytes stay, and a peer that exits
    (its end closed, or reset) gives the group up within the interval."""
    import socket

    from mlxspec.engine.distributed.peers import PeerWatch, closed, ring_connections

    server = socket.create_server(("127.0.0.1", 0))
    address = server.getsockname()[:2]
    client = socket.create_connection(address)
    accepted, _ = server.accept()
    mine = ring_connections({address})
    try:  # the accepted end (local) and the client's (peer)
        assert sorted(s.getsockname()[1] for s in mine) == sorted(
            [accepted.getsockname()[1], client.getsockname()[1]]
        )
        assert not any(closed(s) for s in mine)
        client.sendall(b"x")
        time.sleep(0.05)
        assert not closed(mine[0]) and not closed(mine[1])
        assert accepted.recv(1) == b"x"  # peeking left the byte for its reader
        fired = threading.Event()
        reasons: list[str] = []
        ours = [m for m in mine if m.getsockname()[:2] == address]  # rank 0's end
        theirs = [m for m in mine if m not in ours]
        watch = PeerWatch(ours, lambda r: (reasons.append(r), fired.set()), interval=0.05)
        watch.start()
        assert not fired.wait(0.3)
        for sock in (client, *theirs):  # the peer process exited: all its descriptors close
            sock.close()
        assert fired.wait(5)
        assert reasons == ["a process of the group exited (its ring connection closed)"]
        assert ring_connections(set()) == []
    finally:
        for sock in (server, client, accepted, *mine):
            sock.close()


def test_a_sigterm_after_a_rank_exited_is_the_groups_loss_not_a_drain() -> None:
    """``mlx.launch`` sends SIGTERM to rank 0 once another rank exited: rank 0
    asks its ring connections first, and a closed one gives the group up (503s,
    exit 4) instead of a drain that waits for steps that never end."""
    import socket

    from mlxspec.engine.distributed.peers import PeerWatch
    from mlxspec.engine.distributed.serving import ShardedServing

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname()[:2])
    accepted, _ = server.accept()
    topology = SimpleNamespace(rank=0, size=2)
    info = GroupInfo(2, "ring", "tensor", (RankShare(0, 1, (0, 0)), RankShare(1, 1, (0, 0))))
    group = ShardedServing(topology, info, peers=PeerWatch([accepted], lambda r: None))  # type: ignore[arg-type]
    told: list[str] = []
    group.on_lost(told.append)
    try:
        assert group.check_now() is False and group.failure is None  # a plain stop: drain
        client.close()
        assert group.check_now() is True
        assert told == [
            "the sharded model is unavailable: "
            "a process of the group exited (its ring connection closed)"
        ]
        assert group.block()["healthy"] is False
    finally:
        for sock in (server, client, accepted):
            sock.close()


def test_each_rank_says_which_layers_and_heads_it_holds() -> None:
    """Not a fraction of the group's bytes (0.5 told a user nothing): the layers
    and heads, as mlx-lm's ``shard()`` and ``pipeline()`` split them."""
    from mlxspec.engine.distributed.serving import own_share

    args = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    model = SimpleNamespace(args=args, model=SimpleNamespace(layers=[None] * 30))
    tensor = [
        own_share(SimpleNamespace(rank=r, size=3, pipeline=False), model, 7) for r in range(3)
    ]  # type: ignore[arg-type]
    assert [(s.layers, s.attention_heads, s.kv_heads) for s in tensor] == [
        ((0, 29), (0, 2), (0, 0)),
        ((0, 29), (3, 5), (1, 1)),
        ((0, 29), (6, 8), (2, 2)),
    ]
    # mlx-lm's pipeline(): rank 0 runs the last layers, the low ranks one extra
    piped = SimpleNamespace(args=args, model=SimpleNamespace(layers=[], start_idx=15, end_idx=30))
    share = own_share(SimpleNamespace(rank=0, size=2, pipeline=True), piped, 7)  # type: ignore[arg-type]
    assert (share.layers, share.attention_heads, share.kv_heads) == ((15, 29), (0, 8), (0, 2))
    assert RankShare.from_row(1, tensor[1].row()) == RankShare(1, 7, (0, 29), (3, 5), (1, 1))
    assert RankShare.from_row(0, RankShare(0, 5, (0, 3)).row()) == RankShare(0, 5, (0, 3))
    info = GroupInfo(3, "ring", "tensor", tuple(tensor), (9, 3))
    assert (
        info.lines()[1]
        == "mlxspec: rank 1 holds layers 0-29, heads 3-5 of 9 (KV 1-1 of 3), 0.0 MiB"
    )
