"""LoRA adapters without a model: the ``adapter`` spec grammar, adapter ids, a
folder's errors and ``--adapter-dirs`` containment."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxspec.engine.adapters.files import inside, read_folder
from mlxspec.engine.adapters.spec import AdapterError, check_id, parse_spec


@pytest.mark.parametrize(
    ("spec", "ids"),
    [
        ("a", ("a",)),
        ("a+b", ("a", "b")),
        ("a,b", ("a", "b")),
        (" a + b , c ", ("a", "b", "c")),
        ("none", ()),
        ("", ()),
    ],
)
def test_spec_names_ids_in_order(spec: str, ids: tuple[str, ...]) -> None:
    assert parse_spec(spec) == ids


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("a++b", "empty id"),
        ("a+none", "'none' cannot be stacked"),
        ("a+b+a", "adapter 'a' is named twice"),
    ],
)
def test_spec_refuses(spec: str, message: str) -> None:
    with pytest.raises(AdapterError, match=message) as caught:
        parse_spec(spec)
    assert caught.value.param == "adapter"


@pytest.mark.parametrize("bad", ["none", "available", "", "-a", "a b", "a+b", "x" * 65])
def test_ids_are_plain_tokens(bad: str) -> None:
    with pytest.raises(AdapterError):
        check_id(bad)


def test_folder_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="is not a directory"):
        read_folder(tmp_path / "missing")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterError, match="has no adapters.safetensors"):
        read_folder(tmp_path / "half")
    (tmp_path / "half" / "adapters.safetensors").write_bytes(b"")
    (tmp_path / "half" / "adapter_config.json").write_text("[")
    with pytest.raises(AdapterError, match="not readable JSON"):
        read_folder(tmp_path / "half")


def test_inside_resolves_links(tmp_path: Path) -> None:
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "link").symlink_to(tmp_path)
    assert inside(tmp_path / "allowed" / "x", [tmp_path / "allowed"])
    assert not inside(tmp_path / "allowed" / "link" / "x", [tmp_path / "allowed"])
    assert inside("/etc", [])  # no --adapter-dirs: any path


def test_a_stack_past_max_stack_is_refused_before_any_other_check() -> None:
    from mlxspec.engine.adapters.spec import AdapterStackError

    assert parse_spec("a+b", max_stack=2) == ("a", "b")
    with pytest.raises(AdapterStackError, match=r"stacks 3 adapters; at most 2") as info:
        parse_spec("a+a+", max_stack=2)  # the count first: no "named twice", no "empty id"
    assert info.value.error_kind == "adapter_stack_too_deep" and info.value.param == "adapter"
    with pytest.raises(AdapterError, match="named twice"):
        parse_spec("+".join(["a"] * 100_000))  # no limit: linear, not quadratic
