"""The supervisor's pure pieces (issue 29): model ids, routing by a body's
``model``, ``keep_alive`` durations, the flags, a child's settings file and the
document served with and without a unix socket."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.config import ServeConfig
from mlxspec.openapi import served_spec
from mlxspec.supervisor.pool import keep_alive_seconds
from mlxspec.supervisor.routing import model_id, route
from mlxspec.supervisor.worker import child_config, read_config, write_config

IDS = ["SmolLM2-135M-Instruct", "tiny-llama", "org/repo"]


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("tiny-llama", "tiny-llama"),
        ("org/repo", "org/repo"),
        ("/models/tiny-llama", "tiny-llama"),  # the spec as typed is an alias
        ("gpt-4o", "SmolLM2-135M-Instruct"),  # unknown: the default decides
        (None, "SmolLM2-135M-Instruct"),
        (42, "SmolLM2-135M-Instruct"),
    ],
)
def test_route_picks_the_child_by_model(requested: object, expected: str) -> None:
    aliases = {"/models/tiny-llama": "tiny-llama"}
    assert route(requested, IDS, IDS[0], aliases) == expected


def test_model_ids_follow_the_loader(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert model_id(str(folder)) == "my-model"
    assert model_id(str(tmp_path / "Qwen3-0.6B-Q4_K_M.gguf")) == "Qwen3-0.6B"
    assert model_id("mlx-community/Qwen3-0.6B-4bit") == "mlx-community/Qwen3-0.6B-4bit"
    assert model_id(None) == "SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (-1, -1.0),
        ("5m", 300.0),
        ("2s", 2.0),
        ("1h", 3600.0),
        ("250ms", 0.25),
        ("soon", None),
        (True, None),
        (None, None),
    ],
)
def test_keep_alive_reads_ollamas_durations(value: object, seconds: float | None) -> None:
    assert keep_alive_seconds(value) == seconds


def test_pool_flags_parse_into_the_config() -> None:
    config = parse_config(
        [
            "serve",
            "m",
            "--isolate",
            "--model-pool",
            "a",
            "b",
            "--pool-max-resident",
            "1",
            "--pool-idle-unload",
            "60",
            "--pool-pin",
            "a",
            "--strict-model",
        ]
    )
    assert config.isolate and config.model_pool == ("a", "b")
    assert config.pool_max_resident == 1 and config.pool_idle_unload == 60.0
    assert config.pool_pin == ("a",) and config.strict_model


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--model-pool", "a"],
        ["serve", "--pool-max-resident", "2"],
        ["serve", "--pool-idle-unload", "60"],
        ["serve", "--unix", "/tmp/x.sock", "--isolate"],
    ],
)
def test_pool_flags_need_isolate_and_a_worker_is_not_a_parent(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_config(argv)
    assert exit_.value.code == 2


def test_a_childs_settings_round_trip_as_a_worker(tmp_path: Path) -> None:
    parent = ServeConfig(
        isolate=True,
        model_pool=("b",),
        allowed_origins=("http://x",),
        chat_template_args={"k": 1},
        api_key="secret",
    )
    child = child_config(parent, "b", str(tmp_path / "e.sock"))
    write_config(child, tmp_path / "c.json")
    assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600  # it holds the key
    again = read_config(tmp_path / "c.json")
    assert again == child
    assert again.unix == str(tmp_path / "e.sock") and again.model == "b"
    assert not again.isolate and again.model_pool == ()


def test_the_worker_routes_are_served_only_on_a_unix_socket() -> None:
    tcp, unix = served_spec()["paths"], served_spec(unix=True)["paths"]
    for path in ("/admin/drain", "/admin/lease"):
        assert path not in tcp and path in unix
        assert "x-mlxspec-unix-only" not in unix[path]["post"]
    assert "/engine" not in tcp and "/engine" not in unix  # the parent answers it itself


def _pool(tmp_path: Path, **flags: object) -> object:
    """A pool over three folders whose children never start: ``ready``, ``stop``
    only change their state (what the eviction rules read)."""

    from mlxspec.supervisor.child import ChildState
    from mlxspec.supervisor.pool import Pool

    folders = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        folders.append(str(tmp_path / name))
    config = ServeConfig(model=folders[0], isolate=True, model_pool=tuple(folders[1:]), **flags)
    pool = Pool(config, tmp_path)
    for child in pool.children.values():

        async def ready(child: object = child) -> object:
            child.state = ChildState.READY  # type: ignore[attr-defined]
            return None

        async def stop(drain: bool = True, child: object = child) -> None:
            child.state = ChildState.STOPPED  # type: ignore[attr-defined]

        child.ready, child.stop = ready, stop  # type: ignore[method-assign]
    return pool


def _use(pool: object, mid: str, keep_alive: float | None = None) -> None:
    import asyncio

    async def go() -> None:
        child = pool.children[mid]  # type: ignore[attr-defined]
        await pool.acquire(child)  # type: ignore[attr-defined]
        pool.release(child, keep_alive)  # type: ignore[attr-defined]
        await asyncio.sleep(0)  # a keep_alive 0 stop runs

    asyncio.run(go())


def test_lru_eviction_spares_the_pinned_model(tmp_path: Path) -> None:
    pool = _pool(tmp_path, pool_max_resident=2, pool_pin=("a",))
    for mid in ("a", "b", "c", "b"):
        _use(pool, mid)
        time.sleep(0.01)  # distinct last-use times
    # b then c then b: c was least recently used when b came back; a is pinned
    assert pool.resident() == ["a", "b"]  # type: ignore[attr-defined]


def test_lru_eviction_under_one_resident(tmp_path: Path) -> None:
    pool = _pool(tmp_path, pool_max_resident=1)
    for mid, resident in (("a", ["a"]), ("b", ["b"]), ("a", ["a"]), ("c", ["c"])):
        _use(pool, mid)
        assert pool.resident() == resident  # type: ignore[attr-defined]


def test_keep_alive_zero_stops_after_the_request_unless_pinned(tmp_path: Path) -> None:
    pool = _pool(tmp_path, pool_pin=("a",))
    _use(pool, "b", keep_alive=0)
    _use(pool, "a", keep_alive=0)
    assert pool.resident() == ["a"]  # type: ignore[attr-defined]
