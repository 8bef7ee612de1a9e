"""Prompt cache: reuse the KV cache of an earlier request's token prefix.

After a request ends, its KV cache (prompt plus generated tokens) is kept
under its token sequence; a later request whose prompt shares a prefix with a
kept sequence starts from a copy of that cache and prefills only the rest.
Entries live in a token trie (mlx-lm's ``PromptTrie``, the structure
``mlx_lm.server``'s ``LRUPromptCache`` searches, with a search linear in the
prompt's length: :mod:`.token_trie`) inside a *namespace* of
everything that changes the numbers in a KV cache, and are evicted least
recently used first under a byte budget.

mlx-lm's ``LRUPromptCache`` itself is not used because a hit does not refresh
its LRU position, an exact hit leaves nothing to prefill (a forward pass needs
at least one token), and it has no notion of sessions. Its trie, copy-then-trim
lookup and "a longer entry makes its prefixes redundant" rule are kept.

Sessions (reference, "Cache session affinity"): a request labelled with a
session prefers that session's latest checkpoint when it is a prefix of the
new prompt; eviction spares session checkpoints while other entries remain.
An optional :class:`~.ssd_cache.SsdCache` keeps durable copies on disk and
restores them after a restart.

Thread use: :meth:`PromptCache.fetch` and :meth:`PromptCache.store` run on the
engine thread (they touch MLX arrays); :meth:`stats`, :meth:`close_session` and
:meth:`flush` may be called from any thread.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from mlxspec.engine.caches.kv import bucket_tail, cache_length, common_prefix, compact
from mlxspec.engine.caches.ssd_cache import SsdCache

log = logging.getLogger("mlxspec.engine")

#: Default RAM budget for kept KV caches, bytes (``--prompt-cache-bytes``).
DEFAULT_PROMPT_CACHE_BYTES = 1 << 30

#: A hit is used only when it covers at least this fraction of the prompt...
MIN_HIT_FRACTION = 0.1
#: ...or at least this many tokens (see :meth:`PromptCache.worth_using`).
MIN_HIT_TOKENS = 1024


class CacheNamespace(NamedTuple):
    """What must match for a kept KV cache to be valid for a request.

    Args:
        model (str): the served model id.
        adapter (str | None): the LoRA adapter in use, if any.
        kv_quant (str): the KV cache precision (``"bf16"`` for none).
        weights (str | None): the weight files' fingerprint
            (:func:`~.loader.weights_fingerprint`), so that entries kept on disk
            for other weights at the same path are never restored. Default: ``None``.
        media (str | None): the content digest of the media a prompt's media
            tokens stood for (:func:`~mlxspec.engine.media.encoder_cache.media_digest`),
            so KV computed with one image is never reused for another whose token
            ids are the same; ``None`` for text. Default: ``None``.
    """

    model: str
    adapter: str | None = None
    kv_quant: str = "bf16"
    weights: str | None = None
    media: str | None = None


Key = tuple[CacheNamespace, tuple[int, ...]]


@dataclass
class _Entry:
    cache: list[Any]
    nbytes: int


class PromptCache:
    """Kept KV caches by namespace and token prefix, LRU under a byte budget.

    Args:
        max_bytes (int): RAM budget in bytes; ``0`` disables the cache (no
            lookups, nothing kept). Default: :data:`DEFAULT_PROMPT_CACHE_BYTES`.
        ssd (SsdCache | None): durable tier for snapshots. Default: ``None``.
        min_hit_fraction (float): smallest share of the prompt a hit must
            cover to be used. Default: :data:`MIN_HIT_FRACTION`.
        min_hit_tokens (int): a hit covering this many tokens is used whatever
            its share. Default: :data:`MIN_HIT_TOKENS`.
        bucket_tails (bool | None): trim hits with :func:`~.kv.bucket_tail`.
            Default: ``None`` (on when MLX computes on a GPU, where kernels
            are planned per shape; on the CPU it would only add prefill).
        max_entries (int | None): most KV caches kept at once, least recently
            used out first (mlx_lm.server's ``--prompt-cache-size``); ``None``
            bounds only the bytes. Default: ``None``.
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        ssd: SsdCache | None = None,
        min_hit_fraction: float = MIN_HIT_FRACTION,
        min_hit_tokens: int = MIN_HIT_TOKENS,
        bucket_tails: bool | None = None,
        max_entries: int | None = None,
    ):
        from mlxspec.engine.caches.token_trie import TokenTrie

        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.ssd = ssd
        self.min_hit_fraction = min_hit_fraction
        self.min_hit_tokens = min_hit_tokens
        if bucket_tails is None:
            import mlx.core as mx

            bucket_tails = mx.default_device().type == mx.gpu
        self.bucket_tails = bucket_tails
        #: An entry's bytes as counted against the budget: what this process
        #: holds times ``num / den``. A rank of a sharded server holds a fixed
        #: share of every KV cache; counting the whole model's bytes makes every
        #: rank keep and evict the same entries (:mod:`..distributed`).
        self.byte_scale: tuple[int, int] = (1, 1)
        self._trie = TokenTrie()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._sessions: dict[str, Key] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self._counts = dict.fromkeys(
            (
                "hits",
                "misses",
                "hit_tokens",
                "evictions",
                "session_hits",
                "session_misses",
                "prefix_scans",
            ),
            0,
        )

    @classmethod
    def tiered(
        cls, max_bytes: int, ssd_dir: Path | None, ssd_bytes: int, max_entries: int | None = None
    ) -> PromptCache:
        """A RAM cache with an SSD tier in ``ssd_dir`` when given (``--ssd-cache``);
        with a RAM budget of 0 the SSD tier is not used either (a warning is logged).

        Args:
            max_bytes (int): RAM budget in bytes.
            ssd_dir (Path | None): directory of the SSD tier.
            ssd_bytes (int): disk budget of the SSD tier in bytes.
            max_entries (int | None): most entries kept in RAM. Default: ``None``.

        Returns:
            PromptCache: the cache.
        """
        if ssd_dir is not None and max_bytes <= 0:
            log.warning("the prompt cache is off (budget 0): --ssd-cache is not used")
        ssd = SsdCache(ssd_dir, ssd_bytes) if ssd_dir is not None and max_bytes > 0 else None
        return cls(max_bytes, ssd, max_entries=max_entries)

    @property
    def enabled(self) -> bool:
        """True when the budget allows keeping anything."""
        return self.max_bytes > 0

    def fetch(
        self, namespace: CacheNamespace, prompt: Sequence[int], session: str | None = None
    ) -> tuple[list[Any] | None, int]:
        """A private copy of the best kept cache for ``prompt`` (engine thread).

        The copy is trimmed to a prefix of ``prompt`` that leaves at least one
        token to prefill (the forward pass that yields the first logits).

        Args:
            namespace (CacheNamespace): the request's namespace.
            prompt (Sequence[int]): the prompt token ids.
            session (str | None): the request's session label. Default: ``None``.

        Returns:
            tuple: ``(cache, cached)``: the per-layer cache holding the first
            ``cached`` prompt tokens, or ``(None, 0)`` on a miss.
        """
        if not self.enabled or len(prompt) < 2:
            return None, 0
        with self._lock:
            key, covered = self._best_in_ram(namespace, prompt, session)
            entry = self._entries[key] if key is not None else None
            if key is not None:
                self._entries.move_to_end(key)
        if self.ssd is not None and covered < len(prompt) - 1:
            restored = self.ssd.restore(namespace, prompt, better_than=covered)
            if restored is not None:
                tokens, cache = restored
                covered = common_prefix(tokens, prompt)
                key, entry = (namespace, tokens), self._keep(namespace, tokens, cache)
        usable = min(covered, len(prompt) - 1)
        if self.bucket_tails:
            usable = bucket_tail(usable, len(prompt))
        if not self.worth_using(usable, len(prompt)):
            usable = 0  # a miss: prefilling from scratch is cheaper
        found = self._private_copy(key, entry, usable)
        with self._lock:
            if found[0] is None:
                self._counts["misses"] += 1
            else:
                self._counts["hits"] += 1
                self._counts["hit_tokens"] += found[1]
        return found

    def worth_using(self, cached: int, prompt_tokens: int) -> bool:
        """Whether a hit of ``cached`` tokens pays for itself on a prompt of
        ``prompt_tokens``: it covers at least ``min_hit_fraction`` of the
        prompt or at least ``min_hit_tokens`` tokens.

        A hit is not free: with it, the prefill of the rest runs on new
        attention shapes (query length, key length and the kept buffer's
        strides), and mlx-cuda builds a cuDNN attention graph per new shape
        (``SDPACacheKey`` in mlx's ``backend/cuda/scaled_dot_product_attention``).
        On the H200 (7.4B, ``benchmarks/README.md``) a 25-token hit on a
        1029-token prompt (the chat template's head, 2.4%) took TTFT from
        0.12 s to 1.35 s in the batched lane and from 0.094 s to 0.249 s in the
        serial lane, while a hit on 1029 of 1140 tokens cost ~0.15 s in all.
        Saving 10% of a prompt, or 1024 tokens (~0.1 s of 7.4B prefill on
        the H200), is where a hit starts to pay for that. On this CPU the
        copy and trim cost 1-3 ms (``benchmarks/hit_path.py``), so the rule is
        set by the GPU.

        Args:
            cached (int): prompt tokens the hit would serve.
            prompt_tokens (int): the prompt's length.

        Returns:
            bool: True if the hit should be used.
        """
        if cached <= 0:
            return False
        return cached >= self.min_hit_tokens or cached >= self.min_hit_fraction * prompt_tokens

    def covered(self, namespace: CacheNamespace, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` the best kept RAM entry holds: a
        lookup only (no copy; no hit or miss counted, one prefix scan). ``0``
        when disabled."""
        if not self.enabled:
            return 0
        with self._lock:
            return self._best_in_ram(namespace, prompt, None)[1]

    def _best_in_ram(
        self, namespace: CacheNamespace, prompt: Sequence[int], session: str | None
    ) -> tuple[Key | None, int]:
        """The entry covering the most of ``prompt`` and how many tokens it covers."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        if session is not None:
            key = self._sessions.get(session)
            if key is not None and key in self._entries and key[0] == namespace:
                if common_prefix(key[1], prompt) == len(key[1]):
                    self._counts["session_hits"] += 1
                    return key, len(key[1])
            self._counts["session_misses"] += 1
        self._counts["prefix_scans"] += 1
        found = self._trie.search(namespace, list(prompt))
        best: tuple[Key | None, int] = (None, 0)
        if found.exact is not None:
            return (namespace, tuple(found.exact)), len(found.exact)
        if found.shorter is not None:
            best = ((namespace, tuple(found.shorter)), len(found.shorter))
        if found.longer is not None and found.common_prefix > best[1]:
            longer = (namespace, tuple(found.longer))
            # a longer entry serves only trimmed back, which some caches cannot be
            if can_trim_prompt_cache(self._entries[longer].cache):
                best = (longer, found.common_prefix)
        return best

    def _private_copy(
        self, key: Key | None, entry: _Entry | None, usable: int
    ) -> tuple[list[Any] | None, int]:
        """Deep-copy ``entry`` and trim it to ``usable`` tokens (kept caches are
        updated in place by generation, so they are never handed out)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if key is None or entry is None or usable <= 0:
            return None, 0
        surplus = len(key[1]) - usable
        if surplus > 0 and not can_trim_prompt_cache(entry.cache):
            return None, 0
        cache = copy.deepcopy(entry.cache)
        if surplus > 0:
            trim_prompt_cache(cache, surplus)
        return cache, usable

    def store(
        self,
        namespace: CacheNamespace,
        tokens: Sequence[int],
        cache: list[Any],
        session: str | None = None,
    ) -> None:
        """Keep ``cache``, which holds exactly ``tokens``, and snapshot it to SSD.

        The caller gives up ``cache``. A kept entry that is a prefix of
        ``tokens`` is dropped when caches can be trimmed (the new entry serves
        it). ``session``'s checkpoint becomes this entry.

        Args:
            namespace (CacheNamespace): the request's namespace.
            tokens (Sequence[int]): token ids whose KV ``cache`` holds.
            cache (list): per-layer mlx-lm caches.
            session (str | None): the request's session label. Default: ``None``.
        """

        if not self.enabled or len(tokens) < 2 or cache_length(cache) != len(tokens):
            return
        compact(cache, wait=self.ssd is not None)
        key_tokens = tuple(tokens)
        self._keep(namespace, key_tokens, cache, session)
        if self.ssd is not None:
            self.ssd.enqueue(namespace, key_tokens, cache)

    def _keep(
        self,
        namespace: CacheNamespace,
        tokens: tuple[int, ...],
        cache: list[Any],
        session: str | None = None,
    ) -> _Entry:
        from mlx_lm.models.cache import can_trim_prompt_cache

        num, den = self.byte_scale
        entry = _Entry(cache, sum(c.nbytes for c in cache) * num // den)
        key = (namespace, tokens)
        with self._lock:
            if session is not None:
                self._sessions[session] = key
            if entry.nbytes > self.max_bytes:
                return entry  # usable once, never kept
            previous = self._trie.add(namespace, list(tokens), entry)
            if previous is not None:
                self._bytes -= previous.nbytes
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._bytes += entry.nbytes
            if can_trim_prompt_cache(cache):
                for length, dropped in self._trie.pop_prefixes(namespace, list(tokens)):
                    self._entries.pop((namespace, tokens[:length]), None)
                    self._bytes -= dropped.nbytes
            self._evict()
        return entry

    def _evict(self) -> None:
        """Drop least recently used entries until within budget, sparing
        session checkpoints while any other entry remains (lock held)."""
        pinned = set(self._sessions.values())
        while self._entries and (
            self._bytes > self.max_bytes
            or (self.max_entries is not None and len(self._entries) > self.max_entries)
        ):
            victim = next((k for k in self._entries if k not in pinned), None)
            if victim is None:
                victim = next(iter(self._entries))
            self._trie.pop(victim[0], list(victim[1]))
            self._bytes -= self._entries.pop(victim).nbytes
            self._counts["evictions"] += 1

    def close_session(self, session_id: str) -> None:
        """Forget ``session_id``'s checkpoint association (entries stay kept)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def flush(self, timeout: float) -> dict[str, Any]:
        """Write every pending SSD snapshot; see :meth:`SsdCache.flush`. Without
        an SSD tier nothing is pending: durable, zero entries."""
        if self.ssd is None:
            return SsdCache.empty_flush_report()
        return self.ssd.flush(timeout, in_ram=self._kept)

    def demote(self, timeout: float) -> int:
        """Move the RAM tier to the SSD tier: write every pending snapshot
        (:meth:`flush`), then drop each RAM entry whose snapshot is on disk
        (reference, "POST /admin/drain"). Without an SSD tier nothing moves.

        Args:
            timeout (float): seconds to wait for the snapshot writer.

        Returns:
            int: entries dropped from RAM (their KV now lives only on disk).
        """
        if self.ssd is None:
            return 0
        self.flush(timeout)
        with self._lock:
            demoted = [key for key in self._entries if self.ssd.holds(key)]
            for key in demoted:
                self._trie.pop(key[0], list(key[1]))
                self._bytes -= self._entries.pop(key).nbytes
        return len(demoted)

    def _kept(self, key: tuple) -> list[Any] | None:
        """The kept RAM cache for ``(namespace, tokens)``, or ``None``."""
        with self._lock:
            entry = self._entries.get(key)
        return entry.cache if entry is not None else None

    def stats(self) -> dict[str, Any]:
        """Counters for ``GET /stats``' ``prompt_cache`` section.

        Returns:
            dict: ``entries``, ``bytes``, ``max_bytes``, ``hits``, ``misses``,
            ``hit_tokens`` (prompt tokens served from the cache), ``evictions``,
            ``sessions``, ``session_hits``, ``session_misses``, ``prefix_scans``.
        """
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "sessions": len(self._sessions),
                **self._counts,
            }
