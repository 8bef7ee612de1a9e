"""One scan of the model caches into :class:`LocalModel` rows.

The Hugging Face hub cache through ``huggingface_hub.scan_cache_dir`` (one row per
repo: the snapshot ``refs/main`` names, else the newest), then mlxspec's own
caches: GGUF conversions (``gguf/<digest>-v<N>``), Whisper conversions
(``whisper/<digest>-v<N>``) and adapters (``adapters/<name>``). Per model only
``config.json`` and ``model.safetensors.index.json`` are read; sizes come from
``stat``. Nothing here reads tensor bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxspec.library.paths import hub_cache_dir, mlxspec_cache_dir
from mlxspec.library.support import media, quantization, support_tier

#: A GGUF file's quantisation suffix, dropped from its id (the loader's rule).
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d\w*|[Ff]16|[Ff]32|[Bb][Ff]16)$")
#: Weight file suffixes counted as weights when there is no safetensors index.
WEIGHT_SUFFIXES = (".safetensors", ".npz")


@dataclass(frozen=True)
class LocalModel:
    """One model on disk.

    Attributes:
        repo_id (str): the id to serve it by: ``org/name`` for the hub cache, the
            GGUF's model name, ``whisper/<folder>`` or ``adapter/<folder>``.
        path (str): the folder ``mlxspec serve`` loads (a snapshot folder).
        source (str): ``"hf-cache"``, ``"gguf"``, ``"whisper"`` or ``"adapter"``.
        model_type (str | None): ``config.json``'s ``model_type``.
        size_bytes (int): bytes on disk of the chosen snapshot (blobs, deduplicated).
        weights_bytes (int): the weights' bytes: the safetensors index's
            ``total_size``, else the weight files' sizes.
        quant_bits (int | None): bits of mlx-lm's ``quantization`` section.
        quant_group_size (int | None): its ``group_size``.
        vision (bool): a ``vision_config`` section.
        audio (bool): an ``audio_config`` section (or a Whisper checkpoint).
        support_tier (str | None): :func:`~.support.support_tier`.
        revisions (int): snapshots the hub cache holds for the repo.
        config (dict): the parsed ``config.json`` (``{}`` when unreadable).
    """

    repo_id: str
    path: str
    source: str
    model_type: str | None
    size_bytes: int
    weights_bytes: int
    quant_bits: int | None
    quant_group_size: int | None
    vision: bool
    audio: bool
    support_tier: str | None
    revisions: int = 1
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def supported(self) -> bool:
        """Whether mlxspec can serve it (a known architecture)."""
        return self.support_tier is not None

    @property
    def chat(self) -> bool:
        """Whether ``mlxspec serve`` serves it as a chat model (a supported
        hub or GGUF model, not a Whisper checkpoint or an adapter)."""
        return self.supported and self.source in ("hf-cache", "gguf")


def read_json(path: Path) -> dict[str, Any]:
    """``path`` parsed as a JSON object; ``{}`` when missing or unreadable."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _weights_bytes(folder: Path, files: list[tuple[str, int]]) -> int:
    index = read_json(folder / "model.safetensors.index.json")
    total = (index.get("metadata") or {}).get("total_size") if index else None
    if isinstance(total, int) and total > 0:
        return total
    return sum(size for name, size in files if name.endswith(WEIGHT_SUFFIXES))


def _row(
    repo_id: str, folder: Path, source: str, files: list[tuple[str, int]], **extra: Any
) -> LocalModel:
    config = read_json(folder / "config.json")
    bits, group = quantization(config)
    vision, audio = media(config)
    audio = extra.pop("audio", False) or audio
    size = extra.pop("size_bytes", sum(s for _, s in files))
    tier = extra.pop("tier") if "tier" in extra else (support_tier(config) if config else None)
    model_type = config.get("model_type")
    return LocalModel(
        repo_id=repo_id,
        path=str(folder),
        source=source,
        model_type=model_type if isinstance(model_type, str) else None,
        size_bytes=size,
        weights_bytes=_weights_bytes(folder, files),
        quant_bits=bits,
        quant_group_size=group,
        vision=vision,
        audio=audio,
        support_tier=tier,
        config=config,
        **extra,
    )


def scan_hub(root: Path | None = None) -> list[LocalModel]:
    """The hub cache's model repos, one row per repo (datasets and spaces skipped).

    Args:
        root (Path | None): the hub cache. Default: :func:`~.paths.hub_cache_dir`.
    """
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(root or hub_cache_dir())
    except (CacheNotFound, OSError):
        return []
    rows = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        chosen = next((r for r in repo.revisions if "main" in r.refs), None)
        chosen = chosen or max(repo.revisions, key=lambda r: r.last_modified)
        files = [(f.file_name, f.size_on_disk) for f in chosen.files]
        rows.append(
            _row(
                repo.repo_id,
                chosen.snapshot_path,
                "hf-cache",
                files,
                size_bytes=chosen.size_on_disk,
                revisions=len(repo.revisions),
            )
        )
    return rows


def _folder_files(folder: Path) -> list[tuple[str, int]]:
    return [(p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file()]


def _own_folders(root: Path, kind: str) -> Iterator[Path]:
    base = root / kind
    if base.is_dir():
        yield from sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())


def scan_own(root: Path | None = None) -> list[LocalModel]:
    """mlxspec's caches: GGUF conversions, Whisper conversions, adapters.

    Args:
        root (Path | None): mlxspec's cache. Default: :func:`~.paths.mlxspec_cache_dir`.
    """
    root = root or mlxspec_cache_dir()
    rows = []
    for folder in _own_folders(root, "gguf"):
        marker = read_json(folder / "mlxspec-gguf.json")
        if not marker or not (folder / "config.json").is_file():
            continue  # a conversion still in progress, or not ours
        stem = Path(str(marker.get("gguf", folder.name))).stem
        rows.append(
            _row(_QUANT_SUFFIX.sub("", stem) or stem, folder, "gguf", _folder_files(folder))
        )
    for folder in _own_folders(root, "whisper"):
        if (folder / "mlxspec-whisper.json").is_file():
            files = _folder_files(folder)
            rows.append(
                _row(
                    f"whisper/{folder.name}", folder, "whisper", files, audio=True, tier="targeted"
                )
            )
    for folder in _own_folders(root, "adapters"):
        if (folder / "adapter_config.json").is_file():
            files = _folder_files(folder)
            rows.append(_row(f"adapter/{folder.name}", folder, "adapter", files, tier="targeted"))
    return rows


def folder_row(folder: Path) -> LocalModel:
    """A model folder anywhere (``mlxspec fit ./folder``) as a row, by its name."""
    return _row(folder.name, folder, "local", _folder_files(folder))


def scan(hub: Path | None = None, own: Path | None = None) -> list[LocalModel]:
    """Every model on disk: the hub cache's, then mlxspec's caches', sorted by id
    within each (one row per id; a later duplicate is dropped).

    Args:
        hub (Path | None): the hub cache. Default: :func:`~.paths.hub_cache_dir`.
        own (Path | None): mlxspec's cache. Default: :func:`~.paths.mlxspec_cache_dir`.
    """
    seen: set[str] = set()
    rows = []
    for row in [*sorted(scan_hub(hub), key=lambda r: r.repo_id), *scan_own(own)]:
        if row.repo_id not in seen:
            seen.add(row.repo_id)
            rows.append(row)
    return rows
