"""Per-row LoRA mixing: one linear layer serving several adapters in one batch.

An :class:`AdapterLinear` replaces a base linear layer on which adapters are
mounted. It holds every mounted adapter's ``lora_a``/``lora_b`` for that layer
stacked (index 0 is an all-zero slot: no adapter) and computes, per row ``i``
of the batch, ``base(x) + sum_k scale_k * (x_i @ A_k) @ B_k`` over the adapters
row ``i`` selected, summed in the order the request named them. Which adapters
each row selects is not an argument of the layer: it is read from the
:class:`AdapterMix` the whole model shares, which whoever runs the model (the
lone decode loop, the batch, a prefill) sets right before each model call with
one :data:`Pick` per row (:meth:`AdapterMix.rows`). So the layers do not care
who batches the rows.

A call whose rows all select the same adapters takes mlx-lm's ``LoRALinear``
arithmetic exactly (``y + (scale * ((x @ a) @ b)).astype(x.dtype)``, mlx-lm
``tuner/lora.py``); a mixed call gathers each row's matrices with
``mx.gather_mm`` (one gathered product per stacked depth, whatever the number
of adapters), the batched-LoRA scheme of S-LoRA and vLLM's Punica kernels. A
mixed prefill (more than one token a row) takes each row's matrices instead and
multiplies in one batched product: the copy is paid once over the row's tokens,
and mlx-cuda 0.32.4's ``gather_mm`` failed at those shapes
(``cuGraphAddKernelNode ... invalid argument``; ``benchmarks/gather_probe.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

#: One row's selection: global adapter slots in the order their residuals are
#: summed; ``()`` is the base model.
Pick = tuple[int, ...]


@dataclass(frozen=True)
class _Plan:
    """How one layer serves one call: ``same`` when every row selects the same
    local slots (``None`` otherwise), else ``indices`` (shape ``(B, K)``, int32,
    0 where a row has fewer than ``K`` adapters on this layer)."""

    same: tuple[int, ...] | None
    indices: Any = None


class _Selection:
    """The picks of one model call and, per layer membership, its :class:`_Plan`
    (layers with the same adapters share one, computed once per call)."""

    def __init__(self, picks: Sequence[Pick]) -> None:
        self.picks = tuple(picks)
        self._plans: dict[tuple[int, ...], _Plan | None] = {}

    def plan(self, members: tuple[int, ...]) -> _Plan | None:
        """The plan for a layer whose stack holds global slots ``members`` at
        local indices ``1..len(members)``; ``None`` when no row uses any of them."""
        if members not in self._plans:
            where = {slot: i + 1 for i, slot in enumerate(members)}
            rows = [tuple(where[s] for s in pick if s in where) for pick in self.picks]
            if not any(rows):
                self._plans[members] = None
            elif all(r == rows[0] for r in rows):
                self._plans[members] = _Plan(rows[0])
            else:
                depth = max(len(r) for r in rows)
                padded = [list(r) + [0] * (depth - len(r)) for r in rows]
                self._plans[members] = _Plan(None, mx.array(padded, dtype=mx.int32))
        return self._plans[members]


class AdapterMix:
    """The adapter selection of the model call being made, shared by every
    :class:`AdapterLinear` of one model (engine thread only)."""

    def __init__(self) -> None:
        self.current: _Selection | None = None

    @contextlib.contextmanager
    def rows(self, picks: Sequence[Pick]) -> Iterator[None]:
        """Select ``picks[i]`` for row ``i`` of the model calls made inside the block.

        Args:
            picks (Sequence[Pick]): one per row of the batch, in the order of the
                model input's first axis.

        Yields:
            None. Outside the block the layers add no adapter (base model).
        """
        previous = self.current
        self.current = _Selection(picks) if any(picks) else None
        try:
            yield
        finally:
            self.current = previous


class AdapterLinear(nn.Module):
    """A base linear layer (``nn.Linear`` or ``nn.QuantizedLinear``) plus the LoRA
    adapters mounted on it, mixed per row (see the module docstring).

    The stacks are plain attributes, not module parameters, so ``parameters()``
    still lists only the base weights (under ``base.``).

    Args:
        base (nn.Module): the layer the adapters modify.
        mix (AdapterMix): the model's shared selection.
    """

    def __init__(self, base: nn.Module, mix: AdapterMix) -> None:
        super().__init__()
        self.base = base
        object.__setattr__(self, "_mix", mix)
        object.__setattr__(self, "_stack", _Stack())

    @property
    def members(self) -> tuple[int, ...]:
        """The global slots mounted here, in stack order."""
        return self._stack.members

    def add(self, slot: int, lora_a: mx.array, lora_b: mx.array, scale: float) -> None:
        """Mount ``slot``'s adapter: ``lora_a`` shape ``(in, r)``, ``lora_b`` shape
        ``(r, out)`` (mlx-lm ``LoRALinear``'s), ``scale`` its LoRA scale."""
        object.__setattr__(self, "_stack", self._stack.plus(slot, lora_a, lora_b, scale))

    def remove(self, slot: int) -> None:
        """Unmount ``slot``'s adapter (nothing if it is not here)."""
        object.__setattr__(self, "_stack", self._stack.minus(slot))

    def nbytes(self, slot: int) -> int:
        """Resident bytes of ``slot``'s rows of the stacks (rank padded to the
        largest mounted here); 0 if it is not here."""
        return self._stack.nbytes(slot)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        selection = self._mix.current
        if selection is None:
            return y
        plan = selection.plan(self._stack.members)
        if plan is None:
            return y
        stack = self._stack
        if plan.same is not None:  # every row alike: mlx-lm's LoRALinear arithmetic
            parts = [
                stack.scales[i]
                * ((x @ stack.a[i, :, : stack.ranks[i]]) @ stack.b[i, : stack.ranks[i]])
                for i in plan.same
            ]
        else:
            if x.ndim != 3 or x.shape[0] != plan.indices.shape[0]:
                rows = plan.indices.shape[0]
                raise ValueError(f"adapter selection has {rows} rows, input {x.shape}")
            parts = []
            for k in range(plan.indices.shape[1]):  # one gathered product per stacked depth
                column = plan.indices[:, k]
                if x.shape[1] == 1:  # decode: the gathered products
                    h = mx.gather_mm(
                        mx.gather_mm(x, stack.a, rhs_indices=column), stack.b, rhs_indices=column
                    )
                else:  # prefill: each row's matrices taken, one batched product over L tokens
                    h = (x @ stack.a[column]) @ stack.b[column]
                parts.append(stack.scale_array[column][:, None, None] * h)
        z = parts[0]
        for part in parts[1:]:  # summed in the order the request named them
            z = z + part
        return y + z.astype(x.dtype)


class _Stack:
    """Immutable stacks of one layer's adapters: ``a`` shape ``(E + 1, in, R)``,
    ``b`` shape ``(E + 1, R, out)``, index 0 all zeros, ``R`` the largest rank
    (smaller ones zero-padded), and per index its global slot, rank and scale."""

    def __init__(
        self,
        members: tuple[int, ...] = (),
        a: Any = None,
        b: Any = None,
        ranks: tuple[int, ...] = (0,),
        scales: tuple[float, ...] = (0.0,),
    ) -> None:
        self.members, self.a, self.b, self.ranks, self.scales = members, a, b, ranks, scales
        self.scale_array = mx.array(scales, dtype=mx.float32)

    def plus(self, slot: int, lora_a: mx.array, lora_b: mx.array, scale: float) -> _Stack:
        rank = lora_a.shape[1]
        if self.a is None:
            a = mx.zeros((1, lora_a.shape[0], rank), dtype=lora_a.dtype)
            b = mx.zeros((1, rank, lora_b.shape[1]), dtype=lora_b.dtype)
        else:
            a, b = self.a, self.b
        wide = max(a.shape[2], rank)
        a = mx.concatenate([_pad(a, 2, wide), _pad(lora_a[None], 2, wide).astype(a.dtype)])
        b = mx.concatenate([_pad(b, 1, wide), _pad(lora_b[None], 1, wide).astype(b.dtype)])
        mx.eval(a, b)
        return _Stack(
            (*self.members, slot), a, b, (*self.ranks, rank), (*self.scales, float(scale))
        )

    def minus(self, slot: int) -> _Stack:
        if slot not in self.members:
            return self
        gone = self.members.index(slot) + 1
        keep = [i for i in range(len(self.ranks)) if i != gone]
        if len(keep) == 1:
            return _Stack()
        wide = max(self.ranks[i] for i in keep)
        index = mx.array(keep)
        a, b = self.a[index][:, :, :wide], self.b[index][:, :wide, :]
        mx.eval(a, b)
        members = tuple(s for s in self.members if s != slot)
        return _Stack(
            members, a, b, tuple(self.ranks[i] for i in keep), tuple(self.scales[i] for i in keep)
        )

    def nbytes(self, slot: int) -> int:
        if slot not in self.members:
            return 0
        return (self.a.nbytes + self.b.nbytes) // len(self.ranks)


def _pad(array: mx.array, axis: int, size: int) -> mx.array:
    """``array`` zero-padded along ``axis`` to ``size``."""
    missing = size - array.shape[axis]
    if missing <= 0:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, missing)
    return mx.pad(array, widths)
