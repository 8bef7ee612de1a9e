"""Continuous batching on mlx-lm's ``BatchGenerator`` (engine thread only).

Requests join the running batch between decode steps and leave it when they
finish or are cancelled; each keeps its own sampler, logits processors and
token budget (``BatchGenerator.insert``'s per-sequence options). Output
bookkeeping is the same :class:`~.rows.Row` the serial lane uses.

With a :class:`~.prompt_cache.PromptCache`, a request joins with a copy of the
best kept KV cache and only its uncached prompt tail (``insert``'s ``caches``
and ``all_tokens``, as ``mlx_lm.server`` does); when it leaves, its KV cache
(prompt plus generated tokens) is kept for later requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .grammar import GrammarCache
from .prompt_cache import CacheNamespace, PromptCache
from .rows import Row
from .sampling import build_logits_processors, build_sampler
from .types import Failed

if TYPE_CHECKING:
    from .generator import RequestHandle

log = logging.getLogger("mlxspec.engine")


class BatchLane:
    """A running batch of requests.

    Args:
        model: the mlx-lm model.
        tokenizer: its ``TokenizerWrapper``.
        eos (set[int]): end-of-sequence ids (also the batch's stop tokens).
        xtc_special (list[int]): tokens XTC never removes.
        max_batch (int): most sequences decoding at once.
        on_done (Callable[[str], None]): called with ``"completed"`` or
            ``"cancelled"`` when a request leaves the batch.
        prefill_step (int): prompt tokens per prefill chunk; each ``step``
            processes at most one chunk, so cancellation is seen between chunks.
            Default: ``2048`` (mlx-lm's).
        prompt_cache (PromptCache | None): where prefixes are looked up and
            finished KV caches kept. Default: ``None`` (no reuse).
        namespace (CacheNamespace | None): the engine's cache namespace
            (required with ``prompt_cache``). Default: ``None``.
        grammars (GrammarCache | None): compiles requests' constraints into
            per-row processors; ``None`` ignores constraints. Default: ``None``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        eos: set[int],
        xtc_special: list[int],
        max_batch: int,
        on_done: Callable[[str], None],
        prefill_step: int = 2048,
        prompt_cache: PromptCache | None = None,
        namespace: CacheNamespace | None = None,
        grammars: GrammarCache | None = None,
    ) -> None:
        from mlx_lm.generate import BatchGenerator

        self._model = model
        self._prefill_step = prefill_step
        self._tokenizer = tokenizer
        self._eos = eos
        self._xtc_special = xtc_special
        self._on_done = on_done
        self._grammars = grammars
        self._gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(eos)],
            completion_batch_size=max_batch,
            prefill_batch_size=min(max_batch, 8),
            prefill_step_size=prefill_step,
        )
        self._rows: dict[int, Row] = {}
        self._cache = prompt_cache if namespace is not None else None
        self._namespace = namespace

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, handle: RequestHandle, max_tokens: int) -> None:
        """Queue ``handle``'s request into the batch with a budget of ``max_tokens`` (>= 1)."""
        req = handle.request
        cache, cached = None, 0
        if self._cache is not None and self._namespace is not None:
            if req.shared_prefill:
                self._prefill_once(req.prompt, req.session)
            cache, cached = self._cache.fetch(self._namespace, req.prompt, req.session)
        grammar = None if self._grammars is None else self._grammars.for_request(req.constraint)
        # The grammar mask goes last: after penalties and logit_bias.
        processors = build_logits_processors(req.logits) + ([grammar] if grammar else [])
        (uid,) = self._gen.insert(
            [list(req.prompt[cached:])],
            max_tokens=[max_tokens],
            caches=[cache],
            all_tokens=[list(req.prompt[:cached])],
            samplers=[build_sampler(req.sampling, self._xtc_special)],
            logits_processors=[processors],
        )
        self._rows[uid] = Row(
            handle, self._tokenizer, self._eos, lane="batched", cached=cached, grammar=grammar
        )

    def _prefill_once(self, prompt: tuple[int, ...], session: str | None) -> None:
        """Keep the KV cache of ``prompt[:-1]`` in the prompt cache unless it is
        there already, so the ``n`` sibling requests of one body prefill the
        prompt once and each starts from a copy (their ``fetch`` hits it).

        Runs the prefill here, in ``prefill_step`` chunks (mlx-lm's model call
        with a ``make_prompt_cache`` cache); a cache too large for the budget is
        not kept, and each sibling then prefills as usual.
        """
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        assert self._cache is not None and self._namespace is not None
        head = prompt[:-1]
        if len(head) < 2 or self._cache.covered(self._namespace, prompt) >= len(head):
            return
        cache = make_prompt_cache(self._model)
        tokens = mx.array(head, dtype=mx.uint32)[None]
        for start in range(0, len(head), self._prefill_step):
            self._model(tokens[:, start : start + self._prefill_step], cache=cache)
            mx.eval([c.state for c in cache])
        self._cache.store(self._namespace, head, cache, session)

    def step(self) -> None:
        """Drop cancelled requests, then run one prefill/decode step and route its tokens."""
        gone = [uid for uid, row in self._rows.items() if row.handle.cancelled]
        if gone:
            self._keep(self._gen.remove(gone, return_prompt_caches=self._cache is not None))
            for uid in gone:
                del self._rows[uid]
                self._on_done("cancelled")
        if not self._rows:
            return
        _, responses = self._gen.next()
        finished = []
        for r in responses:
            row = self._rows.get(r.uid)
            if row is None:
                continue
            if self._cache is not None:
                row.before_finish = lambda r=r: self._keep_finished(r)
            ended = row.push(r.token, r.logprobs)
            if not ended and r.finish_reason is not None:
                row.finish_length()
                ended = True
            if ended:
                finished.append(r.uid)
        if finished:  # rows ended by a stop string are still in the generator
            self._gen.remove(finished)
        for uid in finished:
            del self._rows[uid]
            self._on_done("completed")

    def _keep_finished(self, r: Any) -> None:
        """Keep the KV cache of the row ending at response ``r``: the generator
        hands it over when it ended the row itself, else the row is removed
        now (a stop string or EOS matched on our side)."""
        if r.finish_reason is not None:
            self._keep({r.uid: (r.prompt_cache, r.all_tokens)})
        else:
            self._keep(self._gen.remove([r.uid], return_prompt_caches=True))

    def _keep(self, caches: dict[int, tuple[list[Any], list[int]]]) -> None:
        """Hand leaving rows' KV caches (``uid -> (cache, tokens it holds)``)
        to the prompt cache, under each request's session."""
        if self._cache is None or self._namespace is None:
            return
        for uid, (cache, tokens) in caches.items():
            row = self._rows.get(uid)
            session = row.request.session if row is not None else None
            try:
                self._cache.store(self._namespace, tuple(tokens), cache, session)
            except Exception:  # the cache is an optimisation: never fail the rows
                log.exception("prompt cache store failed")

    def fail_all(self, message: str) -> int:
        """Fail every request in the batch with ``message``; returns how many."""
        for row in self._rows.values():
            row.handle.emit(Failed(message))
        failed = len(self._rows)
        self._rows.clear()
        return failed

    def close(self) -> None:
        """Release the generator (wired-memory limit) and cancel what is left."""
        for row in self._rows.values():
            row.handle.cancel()
        self._rows.clear()
        self._gen.close()
