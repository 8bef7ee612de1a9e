"""The prompt cache's token trie: mlx-lm's ``PromptTrie`` with a search that
costs the prompt's length, not the size of the cache.

mlx-lm's ``PromptTrie.search`` (mlx-lm 0.32.2, ``mlx_lm/models/cache.py``) looks
for the *shortest* stored sequence extending the point where the prompt leaves
the trie by a depth-first walk of the whole subtree below that point, copying
the path list at every node (``extra + [tok]``). Requests that share a chat
template's head and then differ leave the trie right after the head, so each
lookup walks every stored sequence, quadratically in their length: 63 ms with
64 entries of 286 tokens and 299 ms with 256 on the development CPU, and on an
H100 host it was the engine thread's largest GIL holder (23% of the samples while
64 streams joined in waves, ``benchmarks/README.md``, "A wave's prefill").

What the prompt cache needs from a longer entry is only that it exists and
how many tokens it shares with the prompt (it is copied and trimmed back to
them), so :meth:`TokenTrie.search` descends from that point to *a* stored
sequence (the first child each time, which ends at a stored one, since an emptied
branch is pruned by ``pop``): the cost is the two paths' lengths. The other
fields of the result are mlx-lm's.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import PromptTrie, PromptTrieResult

VALUE = "__value__"  # the key under which mlx-lm's trie nodes hold their entry


class TokenTrie(PromptTrie):
    """mlx-lm's ``PromptTrie`` (``add``, ``get``, ``pop``, ``pop_prefixes``
    unchanged) with a linear-time :meth:`search`."""

    def search(self, model: Any, tokens: list[int]) -> PromptTrieResult:
        """The stored sequences that best match ``tokens`` under ``model``.

        Args:
            model: the namespace (anything hashable).
            tokens (list[int]): the prompt's token ids.

        Returns:
            PromptTrieResult: ``exact`` (``tokens`` itself is stored), else
            ``shorter`` (the longest stored prefix of ``tokens``, at least one
            token), ``longer`` (a stored sequence that extends the longest
            common prefix with any stored path; not necessarily the shortest one,
            unlike mlx-lm's) and ``common_prefix`` (that prefix's length). Time:
            O(len(tokens) + len(longer)).
        """
        root = self._trie.get(model)
        if root is None:
            return PromptTrieResult(model, None, None, None, 0)
        if not tokens and VALUE in root:
            return PromptTrieResult(model, [], None, None, 0)
        node, last, index = root, -1, 0
        while index < len(tokens) and tokens[index] in node:
            node = node[tokens[index]]
            if VALUE in node:
                last = index
            index += 1
        if last == len(tokens) - 1 >= 0:
            return PromptTrieResult(model, tokens, None, None, 0)
        shorter = tokens[: last + 1] if last > 0 else None
        longer = None
        if index > 0:
            extra: list[int] | None = []
            while extra is not None and VALUE not in node:
                token = next(iter(node), None)  # ``pop`` prunes: a leaf holds an entry
                if token is None:
                    extra = None  # never seen; kept from a StopIteration all the same
                else:
                    extra.append(token)
                    node = node[token]
            longer = None if extra is None else tokens[:index] + extra
        return PromptTrieResult(model, None, shorter, longer, index)
