"""Which layers keep their KV cache quantised, and the one hook the lanes use.

``--kv-quant bf16|kv8|kv4|config`` (or mlx_lm.server's ``--kv-bits 4|8``),
``--kv-group-size`` and ``--quantized-kv-start`` are resolved once, against the
loaded model, into a :class:`KvScheme`: per KV-cache layer, ``None`` (full
precision, the activation dtype) or 4 or 8 bits. Only full-attention layers
(mlx-lm's ``KVCache``) are quantised; sliding-window and recurrent layers keep
their own caches (as the reference's ``kv_quant.attention`` /
``recurrent_layers`` separate them).

The scheme is what the lanes ask for a cache (:meth:`KvScheme.make_cache`),
what the batch merges rows and joins groups through (:meth:`KvScheme.merge`,
:meth:`KvScheme.extend`) and where a cache that passes
``--quantized-kv-start`` is converted (:meth:`KvScheme.settle`, mlx-lm's
``maybe_quantize_kv_cache`` rule: a layer is quantised once it holds that many
tokens). Its :attr:`KvScheme.tag` goes into the prompt cache's namespace, so a
kv4 entry (in RAM or on the SSD tier) never serves a bf16 server or the reverse.

``kv_config.json`` (``--kv-quant config``; in the model folder, or the file
``--kv-config`` names) gives per-layer schemes, layer ``i`` being the model's
``i``-th KV cache::

    {"group_size": 64, "default": "bf16", "layers": {"0": "kv8", "29": "kv8"}}
    {"layers": ["kv8", "kv4", "kv4", ..., "kv8"]}       # one per layer

Each scheme is ``"bf16"`` (full precision), ``"kv8"`` or ``"kv4"``;
``group_size`` (32, 64 or 128) defaults to ``--kv-group-size``, ``default`` to
``"bf16"``; a list names every layer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxspec.engine.caches.batch_kv import RowsKVCache, merge_layer
from mlxspec.engine.caches.quantized_kv import (
    QuantizedRowsKVCache,
    attention_on_any_device,
    full_precision,
    is_quantized,
    single_row,
    to_quantized,
)

if TYPE_CHECKING:
    from mlxspec.engine.model.fit import ModelMemory

#: ``--kv-quant`` values.
KV_QUANT_MODES = ("bf16", "kv8", "kv4", "config")
#: Group sizes ``mx.quantize`` takes.
GROUP_SIZES = (32, 64, 128)
#: Bits of each per-layer scheme name (``None``: full precision).
SCHEME_BITS: dict[str, int | None] = {"bf16": None, "kv8": 8, "kv4": 4}
#: The file ``--kv-quant config`` reads from the model folder.
KV_CONFIG_NAME = "kv_config.json"


class KvQuantError(ValueError):
    """A KV quantisation setting this model cannot take; the message starts
    with the flag to change (a one-line start-up error, exit 2)."""


@dataclass(frozen=True)
class KvOptions:
    """The KV quantisation flags, as parsed (not yet checked against a model).

    Args:
        mode (str): one of :data:`KV_QUANT_MODES`. Default: ``"bf16"``.
        group_size (int): ``--kv-group-size``. Default: ``64``.
        start (int): ``--quantized-kv-start``: tokens a layer holds before it is
            quantised. Default: ``0`` (from the first token).
        config_path (str | None): ``--kv-config``, the ``kv_config.json`` of
            ``mode="config"``. Default: ``None`` (the model folder's).
    """

    mode: str = "bf16"
    group_size: int = 64
    start: int = 0
    config_path: str | None = None


@dataclass(frozen=True)
class KvScheme:
    """Per KV-cache layer, its bits (``None``: full precision), and the rules
    that make, merge, join and convert caches with them.

    Attributes:
        mode (str): ``"bf16"``, ``"kv8"``, ``"kv4"`` or ``"config"``.
        layer_bits (tuple[int | None, ...]): per cache layer; empty when off.
        kinds (tuple[str, ...]): per cache layer, ``"global"``,
            ``"sliding_window"`` or ``"recurrent"``.
        group_size (int): elements per scale and bias.
        start (int): tokens a layer holds before it is quantised.
    """

    mode: str = "bf16"
    layer_bits: tuple[int | None, ...] = ()
    kinds: tuple[str, ...] = ()
    group_size: int = 64
    start: int = 0

    @property
    def active(self) -> bool:
        """Whether any layer is quantised."""
        return any(b is not None for b in self.layer_bits)

    @property
    def tag(self) -> str:
        """The prompt cache's ``kv_quant`` namespace field: ``"bf16"`` when off,
        else the per-layer bits, group size and start (``"kv4/g64/s0"``,
        ``"8,4,-,.../g64/s0"`` for a mixed scheme)."""
        if not self.active:
            return "bf16"
        bits = set(self.layer_bits)
        if len(bits) == 1:
            layers = f"kv{self.layer_bits[0]}"
        else:
            layers = ",".join("-" if b is None else str(b) for b in self.layer_bits)
        return f"{layers}/g{self.group_size}/s{self.start}"

    def bits(self, layer: int) -> int | None:
        """Layer ``layer`` 's bits, ``None`` for full precision."""
        return self.layer_bits[layer] if layer < len(self.layer_bits) else None

    def make_cache(self, model: Any) -> list[Any]:
        """A fresh single-row cache (``make_prompt_cache``), quantised from the
        first token where :attr:`start` is ``0``."""
        from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

        cache = make_prompt_cache(model)
        if not self.active or self.start > 0:
            return cache
        for i, c in enumerate(cache):
            bits = self.bits(i)
            if bits is not None and type(c) is KVCache:
                cache[i] = QuantizedKVCache(group_size=self.group_size, bits=bits)
        return cache

    def merge(self, caches: Sequence[list[Any]]) -> list[Any]:
        """One batch cache per layer from per-row caches (each a
        :meth:`make_cache` list); a quantised layer is a
        :class:`~.quantized_kv.QuantizedRowsKVCache` once any row is quantised
        or the rows reach :attr:`start`.

        Raises:
            ValueError: a layer's cache kind cannot be batched (mlx-lm's rule).
        """
        merged = []
        for i, layer in enumerate(zip(*caches, strict=True)):
            bits = self.bits(i)
            if bits is not None and self._due(layer):
                merged.append(QuantizedRowsKVCache.merge_quantized(layer, self.group_size, bits))
            else:
                merged.append(merge_layer(layer))
        return merged

    def _due(self, layer: Sequence[Any]) -> bool:
        if self.start == 0 or any(is_quantized(c) for c in layer):
            return True
        return max((getattr(c, "offset", 0) for c in layer), default=0) >= self.start

    def extend(self, mine: list[Any], theirs: list[Any]) -> None:
        """Append a prefill group's batch cache (``theirs``) to the batch's
        (``mine``, changed in place), layer by layer; where one side is already
        quantised the other is quantised too."""
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            bits = self.bits(i)
            if bits is not None and is_quantized(b) and not is_quantized(a):
                a = mine[i] = to_quantized(a, self.group_size, bits)
            a.extend(b)

    def settle(self, cache: list[Any]) -> None:
        """Quantise, in place, each layer of ``cache`` (single-row or batch)
        that holds :attr:`start` tokens or more and is not quantised yet
        (mlx-lm's ``maybe_quantize_kv_cache``); nothing when :attr:`start` is
        ``0`` (caches are made quantised)."""
        if self.start == 0 or not self.active:
            return
        for i, c in enumerate(cache):
            bits = self.bits(i)
            if bits is None or not full_precision(c):
                continue
            if isinstance(c, RowsKVCache):
                if c.size() >= self.start:
                    cache[i] = to_quantized(c, self.group_size, bits)
            elif c.offset >= self.start:
                cache[i] = single_row(c, self.group_size, bits)

    def layer_bytes(self, full: float, dtype_bytes: int, bits: int | None) -> float:
        """Bytes per token of one layer: ``full`` (the layer's K and V in the
        activation dtype) when unquantised, else the packed values plus a scale
        and a bias per group in the activation dtype (``mx.quantize``'s layout):
        ``full * (bits / 8 + 2 * dtype_bytes / group_size) / dtype_bytes``."""
        if bits is None:
            return full
        return full * (bits / 8 + 2 * dtype_bytes / self.group_size) / dtype_bytes

    def bytes_per_token(self, full: int, layers: int, dtype_bytes: int) -> int:
        """KV bytes one token adds under this scheme, from the full-precision
        figure (:class:`~mlxspec.engine.model.fit.ModelMemory`). With a
        positive :attr:`start` the full-precision figure stands (the first
        tokens of every row stay unquantised), so admission never over-admits.

        Args:
            full (int): bytes per token with every layer in the activation dtype.
            layers (int): layers ``full`` covers.
            dtype_bytes (int): bytes of one activation element.

        Returns:
            int: bytes per token (rounded up).
        """
        if not self.active or self.start > 0 or layers <= 0:
            return full
        per_layer = full / layers
        total = sum(self.layer_bytes(per_layer, dtype_bytes, self.bits(i)) for i in range(layers))
        return int(-(-total // 1))

    def applied(self, memory: ModelMemory) -> ModelMemory:
        """``memory`` with its KV bytes per token under this scheme
        (:meth:`bytes_per_token`): what ``/fit``, ``/stats`` and KV admission
        (``--kv-budget``) count."""
        import mlx.core as mx

        size = getattr(mx, memory.kv_dtype).size
        per_token = self.bytes_per_token(memory.kv_bytes_per_token, memory.layers, size)
        return dataclasses.replace(memory, kv_bytes_per_token=per_token)

    def describe(self, dtype: str, bytes_per_token: int) -> dict[str, Any]:
        """``GET /stats`` ``kv_quant`` (the reference's shape, plus ours: the
        activation ``dtype``, ``group_size``, ``quantized_kv_start`` and the
        ``bytes_per_token`` admission uses)."""
        mode = {"bf16": "bf16", "kv8": "uniform-kv8", "kv4": "uniform-kv4"}.get(
            self.mode, "mixed (kv_config.json)"
        )
        if not self.active:
            mode = "bf16"
        counts: dict[str, int] = {}
        attention = {"global": 0, "sliding_window": 0}
        for i, kind in enumerate(self.kinds):
            if kind in attention:
                attention[kind] += 1
                bits = self.bits(i)
                name = "bf16" if bits is None else f"kv{bits}"
                counts[name] = counts.get(name, 0) + 1
        return {
            "mode": mode,
            "layers": counts,
            "attention": attention,
            "recurrent_layers": sum(k == "recurrent" for k in self.kinds),
            "dtype": dtype,
            "group_size": self.group_size if self.active else None,
            "quantized_kv_start": self.start if self.active else None,
            "bytes_per_token": bytes_per_token,
        }


def _kind(cache: Any) -> str:
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    if isinstance(cache, RotatingKVCache):
        return "sliding_window"
    if isinstance(cache, KVCache):
        return "global"
    return "recurrent"


def resolve_scheme(options: KvOptions, model: Any, folder: Path | None) -> KvScheme:
    """Check the flags against ``model`` and give its :class:`KvScheme`.

    Args:
        options (KvOptions): the parsed flags.
        model: the loaded mlx-lm model.
        folder (Path | None): the model folder (its ``kv_config.json``).

    Returns:
        KvScheme: per cache layer, its bits.

    Raises:
        KvQuantError: no full-attention layer to quantise, a group size that
            does not divide the head dimension, or an unreadable or malformed
            ``kv_config.json`` (the message names the flag).
    """
    from mlx_lm.models.cache import make_prompt_cache

    kinds = tuple(_kind(c) for c in make_prompt_cache(model))
    group = options.group_size
    if options.mode == "bf16":
        return KvScheme("bf16", (), kinds, group, options.start)
    if options.mode == "config":
        bits, group = _read_config(options, folder, len(kinds))
    else:
        bits = (SCHEME_BITS[options.mode],) * len(kinds)
    bits = tuple(b if kinds[i] == "global" else None for i, b in enumerate(bits))
    flag = "--kv-quant config" if options.mode == "config" else "--kv-quant"
    if not any(b is not None for b in bits):
        raise KvQuantError(f"{flag}: this model has no full-attention KV cache layer to quantise")
    head_dim = _head_dim(model)
    if head_dim % group:
        raise KvQuantError(
            f"--kv-group-size: {group} does not divide the model's head dimension {head_dim}"
        )
    attention_on_any_device()  # MLX's CUDA quantized_matmul has no attention kernels
    return KvScheme(options.mode, bits, kinds, group, options.start)


def _head_dim(model: Any) -> int:
    args = getattr(model, "args", None)
    head_dim = getattr(args, "head_dim", None)
    if head_dim:
        return int(head_dim)
    heads = int(getattr(args, "num_attention_heads", 1) or 1)
    return int(getattr(args, "hidden_size", 0)) // heads


def _read_config(
    options: KvOptions, folder: Path | None, layers: int
) -> tuple[tuple[int | None, ...], int]:
    """Per-layer bits and the group size from ``kv_config.json``."""
    path = Path(options.config_path) if options.config_path else None
    if path is None and folder is not None:
        path = folder / KV_CONFIG_NAME
    flag = "--kv-config" if options.config_path else "--kv-quant config"
    if path is None or not path.is_file():
        raise KvQuantError(f"{flag}: no {KV_CONFIG_NAME} at {path}")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KvQuantError(f"{flag}: {path} is not JSON ({exc})") from exc

    def bad(why: str) -> KvQuantError:
        return KvQuantError(f"{flag}: {path}: {why}")

    if not isinstance(doc, dict) or "layers" not in doc:
        raise bad('expected an object with "layers"')
    group = doc.get("group_size", options.group_size)
    if group not in GROUP_SIZES or type(group) is not int:
        raise bad(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))}")

    def scheme(value: Any, where: str) -> int | None:
        if not isinstance(value, str) or value not in SCHEME_BITS:
            raise bad(f"{where} must be one of {', '.join(SCHEME_BITS)}, not {value!r}")
        return SCHEME_BITS[value]

    spec = doc["layers"]
    if isinstance(spec, list):
        if len(spec) != layers:
            raise bad(f"layers lists {len(spec)} schemes; the model has {layers} KV cache layers")
        return tuple(scheme(v, f"layers[{i}]") for i, v in enumerate(spec)), group
    if not isinstance(spec, dict):
        raise bad("layers must be a list or an object")
    default = scheme(doc.get("default", "bf16"), "default")
    bits = [default] * layers
    for key, value in spec.items():
        if not key.isdigit() or int(key) >= layers:
            raise bad(f"layer {key!r} is not one of 0..{layers - 1}")
        bits[int(key)] = scheme(value, f"layers[{key}]")
    return tuple(bits), group
