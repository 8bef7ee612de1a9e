"""The mounted adapters of one served model: ids, slots, leases and the default.

:class:`AdapterRegistry` is what the engine and the routes share. Mounting and
unmounting run on the engine thread (``Engine.run_exclusive``), between decode
steps, so they never race a forward pass; the routes read the listing from any
thread under a lock. Each mount gets a fresh global *slot* (the index the
:class:`~.mixing.AdapterLinear` stacks know it by) and a digest of its numbers.

A request names adapters by id; the ids become slots when it starts
(:meth:`AdapterRegistry.acquire`, on the engine thread), and the request holds
a lease on them until it ends (:meth:`AdapterRegistry.release`). An adapter
unmounted while a running request uses it leaves the listing at once (its id
may be mounted again) but keeps its matrices until the last such request
ends, so no running output changes weights mid-answer. The prompt cache is
namespaced by the digests of the leased slots, in order (:attr:`AdapterPick.tag`):
an id replaced by other weights never meets KV computed with the old ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mlxspec.engine.adapters.files import AdapterFolder, compatible
from mlxspec.engine.adapters.mixing import AdapterLinear, AdapterMix
from mlxspec.engine.adapters.mount import (
    describe_layers,
    mount_weights,
    read_lora,
    unmount_slot,
    weights_digest,
)
from mlxspec.engine.adapters.spec import (
    AdapterDuplicateError,
    AdapterError,
    AdapterLimitError,
    check_id,
    stack_error,
)

#: ``--max-adapters``' default: each mount keeps its matrices resident and one more
#: slot in every wrapped layer; 32 covers a library of task adapters.
DEFAULT_MAX_ADAPTERS = 32
#: ``--max-adapter-stack``' default: summed residuals drift off the base model as
#: they pile up (a 200-stack answered U+FFFD), each costs a matmul per layer and step.
DEFAULT_MAX_STACK = 8


@dataclass(frozen=True)
class AdapterLimits:
    """What the operator allows (``--max-adapters``, ``--max-adapter-stack``).

    Args:
        max_mounted (int): adapters mounted at once; a mount past it is a 429
            ``too_many_adapters`` (replacing a mounted id adds none). Default: 32.
        max_stack (int): adapters one request may stack (``"a+b+..."``); more is
            a 400 ``adapter_stack_too_deep``. Default: 8.
    """

    max_mounted: int = DEFAULT_MAX_ADAPTERS
    max_stack: int = DEFAULT_MAX_STACK


@dataclass(frozen=True)
class AdapterPick:
    """A started request's adapters: global slots in summing order and the
    prompt-cache namespace tag of those weights (``None`` for the base model)."""

    slots: tuple[int, ...] = ()
    tag: str | None = None


#: The base model: no adapter.
NO_ADAPTER = AdapterPick()


@dataclass(frozen=True)
class Mounted:
    """One mounted adapter, as ``GET /v1/adapters`` lists it.

    Args:
        id (str): its id.
        folder (AdapterFolder): the folder it was read from.
        slot (int): its global slot.
        digest (str): BLAKE2b digest of its mounted numbers.
        rank (int): its LoRA rank (the largest of its layers).
        scale (float): its LoRA scale.
        mounted_layers (int): layers it modifies.
    """

    id: str
    folder: AdapterFolder
    slot: int
    digest: str
    rank: int
    scale: float
    mounted_layers: int


class AdapterRegistry:
    """The adapters mounted on ``model`` (see the module docstring).

    Args:
        model: the served mlx-lm model (``None`` for an engine without one: a
            fake in tests; nothing can be mounted then).
        model_id (str): the served model's id (adapters list it as ``parent``).
    """

    def __init__(self, model: Any, model_id: str) -> None:
        self.model, self.model_id = model, model_id
        #: The selection every wrapper layer of ``model`` reads.
        self.mix = AdapterMix()
        #: The id requests that name no adapter get (``--adapter-path``), if mounted.
        self.default: str | None = None
        #: The operator's caps (``mlxspec serve`` sets them from its flags).
        self.limits = AdapterLimits()
        self._mounted: dict[str, Mounted] = {}
        self._wrappers: dict[str, AdapterLinear] = {}
        self._next_slot = 1
        self._refs: dict[int, int] = {}
        self._retired: set[int] = set()
        self._leases: dict[int, tuple[Any, tuple[int, ...]]] = {}
        self._digests: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether any layer carries an adapter (otherwise calls skip selection)."""
        return bool(self._wrappers)

    # Any thread.
    def ids(self) -> list[str]:
        """The mounted ids, in mount order."""
        with self._lock:
            return list(self._mounted)

    def check(self, ids: Sequence[str], param: str = "adapter") -> tuple[str, ...]:
        """``ids`` if every one is mounted now, else raise naming the first that is not.

        Raises:
            AdapterStackError: more ids than ``limits.max_stack``.
            AdapterError: an id that is not mounted.
        """
        if len(ids) > self.limits.max_stack:
            raise stack_error(len(ids), self.limits.max_stack, param)
        with self._lock:
            unknown = next((i for i in ids if i not in self._mounted), None)
        if unknown is not None:
            raise AdapterError(f"unknown adapter '{unknown}': not mounted", param)
        return tuple(ids)

    def listing(self) -> list[dict[str, Any]]:
        """``GET /v1/adapters`` rows: id, path, rank, scale, size_bytes,
        mounted_layers, ram_bytes (resident bytes of its stacked matrices)."""
        with self._lock:
            mounted = list(self._mounted.values())
            wrappers = list(self._wrappers.values())
        return [
            {
                "id": m.id,
                "path": str(m.folder.path),
                "rank": m.rank,
                "scale": m.scale,
                "size_bytes": m.folder.size_bytes,
                "mounted_layers": m.mounted_layers,
                "ram_bytes": sum(w.nbytes(m.slot) for w in wrappers),
            }
            for m in mounted
        ]

    def describe(self, folder: AdapterFolder) -> dict[str, Any]:
        """A ``GET /v1/adapters/available`` row for ``folder``."""
        with self._lock:
            mounted = any(m.folder.path == folder.path for m in self._mounted.values())
        return {
            "id": folder.path.name,
            "path": str(folder.path),
            "rank": folder.rank,
            "scale": folder.scale,
            "base_model": folder.base_model,
            "mounted": mounted,
            "compatible": compatible(folder, self.model_id),
        }

    # Engine thread.
    def mount(self, adapter_id: str, folder: AdapterFolder) -> dict[str, Any]:
        """Mount ``folder`` as ``adapter_id``, all or nothing; an id already
        mounted is replaced (the old weights stay for requests still using them).

        Returns:
            dict: ``{id, mounted_layers, rank, scale, ram_bytes}``.

        Raises:
            AdapterLimitError: ``limits.max_mounted`` adapters are mounted and
                ``adapter_id`` is none of them.
            AdapterDuplicateError: another id holds the same numbers (the same
                folder, or a copy): one mount of them is enough.
            AdapterError: a bad id, no model, a recorded base model other than the
                served one, or an adapter that does not fit (:func:`~.mount.read_lora`).
        """
        check_id(adapter_id)
        if self.model is None:
            raise AdapterError("this engine has no model to mount adapters on", "path")
        cap = self.limits.max_mounted
        with self._lock:
            full = adapter_id not in self._mounted and len(self._mounted) >= cap
        if full:
            raise AdapterLimitError(
                f"{cap} adapters are mounted, the most allowed (--max-adapters {cap}): "
                "unmount one first",
                "id",
            )
        if not compatible(folder, self.model_id):
            raise AdapterError(
                f"adapter {folder.path} was trained on {folder.base_model}, not on the "
                f"served model {self.model_id}",
                "path",
            )
        weights = read_lora(self.model, self._wrappers, folder)
        digest = weights_digest(weights)
        with self._lock:
            twin = next(
                (m.id for m in self._mounted.values() if m.digest == digest and m.id != adapter_id),
                None,
            )
        if twin is not None:
            raise AdapterDuplicateError(
                f"adapter {folder.path} holds the same weights as the mounted adapter "
                f"'{twin}': use '{twin}' (or unmount it first)",
                "path",
            )
        slot = self._next_slot
        self._next_slot += 1
        with self._lock:
            mount_weights(self.model, self._wrappers, self.mix, slot, weights)
            self._digests[slot] = digest
            previous = self._mounted.pop(adapter_id, None)
            about = describe_layers(weights)
            self._mounted[adapter_id] = Mounted(
                adapter_id, folder, slot, self._digests[slot], **about
            )
        if previous is not None:
            self._retire(previous.slot)
        ram = sum(w.nbytes(slot) for w in self._wrappers.values())
        return {"id": adapter_id, **about, "ram_bytes": ram}

    def unmount(self, adapter_id: str) -> int | None:
        """Unmount ``adapter_id``; returns the layers it held, ``None`` if it was
        not mounted. Running requests keep its matrices until they end."""
        with self._lock:
            gone = self._mounted.pop(adapter_id, None)
            if gone is not None and self.default == adapter_id:
                self.default = None
        if gone is None:
            return None
        self._retire(gone.slot)
        return gone.mounted_layers

    def _retire(self, slot: int) -> None:
        self._retired.add(slot)
        if not self._refs.get(slot):
            self._drop(slot)

    def _drop(self, slot: int) -> None:
        with self._lock:
            unmount_slot(self.model, self._wrappers, slot)
        self._retired.discard(slot)
        self._refs.pop(slot, None)
        self._digests.pop(slot, None)

    def pick(self, ids: Sequence[str]) -> AdapterPick:
        """The slots and namespace tag of ``ids`` now, without a lease (for work
        that ends within the current engine step).

        Raises:
            AdapterError: an id is no longer mounted (unmounted after the request
                was accepted).
        """
        if not ids:
            return NO_ADAPTER
        with self._lock:
            gone = next((i for i in ids if i not in self._mounted), None)
            if gone is not None:
                raise AdapterError(f"adapter '{gone}' is no longer mounted", "adapter")
            slots = tuple(self._mounted[i].slot for i in ids)
        return AdapterPick(slots, "+".join(self._digests[s] for s in slots))

    def acquire(self, owner: Any, ids: Sequence[str]) -> AdapterPick:
        """:meth:`pick`, leased to ``owner`` (a request handle) until :meth:`release`."""
        found = self.pick(ids)
        if found.slots:
            for slot in found.slots:
                self._refs[slot] = self._refs.get(slot, 0) + 1
            self._leases[id(owner)] = (owner, found.slots)
        return found

    def release(self, owner: Any) -> None:
        """End ``owner``'s lease (a no-op without one); a retired slot whose last
        user this was is removed from the layers."""
        lease = self._leases.pop(id(owner), None)
        if lease is None:
            return
        for slot in lease[1]:
            self._refs[slot] -= 1
            if slot in self._retired and not self._refs[slot]:
                self._drop(slot)

    @contextmanager
    def rows(self, picks: Sequence[AdapterPick]) -> Iterator[None]:
        """Select ``picks[i]`` for row ``i`` of the model calls inside the block
        (:meth:`~.mixing.AdapterMix.rows`); free when nothing is mounted."""
        if not self._wrappers:
            yield
            return
        with self.mix.rows([p.slots for p in picks]):
            yield
