"""Grammar-constrained decoding with xgrammar (structured output, forced tool calls).

A :class:`~.types.Constraint` is compiled once against the served tokenizer by
:class:`GrammarCache` (a bounded LRU keyed by ``(kind, spec, any_whitespace)``,
failures included) and enforced by a :class:`GrammarProcessor`, an mlx-lm
logits processor holding one xgrammar ``GrammarMatcher`` per request: each
decode step it accepts the token sampled last, fills the next-token bitmask and
sets every token the grammar forbids to ``-inf``. It runs after the request's
other logits processors (penalties, ``logit_bias``), so the logits of allowed
tokens are untouched, and it works the same in the serial lane
(``generate_step``) and the batched one, where :mod:`~.batch_logits` applies
every row's mask at once from :meth:`GrammarProcessor.allowed`.
:attr:`GrammarProcessor.done` tells the request's :class:`~.rows.Row` when
nothing but a stop token may follow, so generation ends there with
``finish_reason: "stop"`` (reference, "Structured output").

Each new constraint is first compiled in a child process
(:mod:`.grammar_sandbox`): xgrammar's compiler can crash on hostile grammars,
and a crash there only costs the request its grammar. xgrammar is imported
lazily: servers that never see a constraint do not pay for it (or for the
torch import it brings).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from mlxspec.engine.sampling.grammar_sandbox import (
    CompileSandbox,
    choice_ebnf,
    compile_spec,
    error_reason,
    shared_sandbox,
)
from mlxspec.engine.types import Constraint

__all__ = [
    "GRAMMAR_DISABLED",
    "GrammarCache",
    "GrammarError",
    "GrammarProcessor",
    "choice_ebnf",
]

log = logging.getLogger("mlxspec.engine.sampling.grammar")

#: The reason given when grammars are switched off (``MLXSPEC_GRAMMAR=0``).
GRAMMAR_DISABLED = "grammar compilation disabled by MLXSPEC_GRAMMAR=0"


class GrammarError(Exception):
    """A constraint that cannot be enforced.

    Args:
        reason (str): why, safe to show a client (no paths, one line).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GrammarCache:
    """Compiles constraints for one tokenizer and keeps the most recent ones.

    Thread-safe: handlers compile on worker threads (to learn before submitting
    whether a grammar compiles) while the engine thread builds processors.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (or a Hugging Face tokenizer).
        vocab_size (int | None): rows of the model's logits, which may exceed the
            tokenizer's vocabulary (padded ``lm_head``); ``None`` uses the
            tokenizer's. Default: ``None``.
        stop_ids (Iterable[int]): token ids that end generation (EOS); the grammar
            allows them only where its root rule is complete. Default: the
            tokenizer's ``eos_token_ids``.
        capacity (int): compiled grammars (and compile failures) kept. Default: ``64``.
        enabled (bool): ``False`` refuses every constraint with
            :data:`GRAMMAR_DISABLED` (``MLXSPEC_GRAMMAR=0``). Default: ``True``.
        isolate (bool): compile each new constraint in a child process first
            (:mod:`.grammar_sandbox`), so one that crashes xgrammar cannot take
            the server down. Default: ``True``.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        stop_ids: Iterable[int] | None = None,
        *,
        capacity: int = 64,
        enabled: bool = True,
        isolate: bool = True,
    ) -> None:
        self.enabled = enabled
        self.isolate = isolate
        self.capacity = capacity
        self._tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)
        self._vocab_size = vocab_size
        ids = stop_ids if stop_ids is not None else getattr(tokenizer, "eos_token_ids", ())
        self._stop_ids = sorted(set(ids))
        self._compiler: Any = None
        self._sandbox: CompileSandbox | None = None
        self._entries: OrderedDict[tuple[str, str, bool], Any] = OrderedDict()
        self._lock = threading.Lock()
        #: Lookups answered from the cache / compiled afresh (for tests and stats).
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar for ``constraint`` (from the cache when seen before).

        Args:
            constraint (Constraint): what the output must match.

        Returns:
            xgrammar.CompiledGrammar: ready for a matcher.

        Raises:
            GrammarError: grammars are disabled, or the constraint does not compile
                (the failure is cached too, so a bad grammar is not recompiled).
        """
        if not self.enabled:
            raise GrammarError(GRAMMAR_DISABLED)
        key = (constraint.kind, constraint.spec, constraint.any_whitespace)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
        if entry is None:
            entry = self._compile(constraint)
            with self._lock:
                self.misses += 1
                self._entries[key] = entry
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
        if isinstance(entry, GrammarError):
            raise entry
        return entry

    def problem(self, constraint: Constraint) -> str | None:
        """Compile ``constraint``; ``None`` if it can be enforced, else the reason why not."""
        try:
            self.compile(constraint)
        except GrammarError as exc:
            return exc.reason
        return None

    def processor(self, constraint: Constraint) -> GrammarProcessor:
        """A fresh per-request logits processor enforcing ``constraint``.

        Raises:
            GrammarError: as :meth:`compile`.
        """
        return GrammarProcessor(self.compile(constraint), self._stop_ids)

    def for_request(self, constraint: Constraint | None) -> GrammarProcessor | None:
        """The processor for a request's constraint, or ``None`` when it has none.

        Handlers learn before submitting whether a grammar compiles and drop the
        ones that do not (the degrade path), so a failure here is a server-made
        grammar (forced tool call) that xgrammar refuses: the request then runs
        unconstrained, with a warning in the log, rather than fail.
        """
        if constraint is None:
            return None
        try:
            return self.processor(constraint)
        except GrammarError as exc:
            log.warning("%s constraint not enforced: %s", constraint.kind, exc.reason)
            return None

    def _compile(self, constraint: Constraint) -> Any:
        """Compile in the sandbox child, then here; a failure becomes a GrammarError."""
        kind, spec, spaces = constraint.kind, constraint.spec, constraint.any_whitespace
        try:
            compiler, sandbox = self._get_compiler()
            reason = sandbox.check(kind, spec, spaces) if sandbox is not None else None
            if reason is not None:
                return GrammarError(reason)
            return compile_spec(compiler, kind, spec, spaces)
        except GrammarError as exc:
            return exc
        except Exception as exc:  # xgrammar raises RuntimeError, ValueError, its own types
            return GrammarError(error_reason(exc))

    def _get_compiler(self) -> tuple[Any, CompileSandbox | None]:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                try:
                    info = xgr.TokenizerInfo.from_huggingface(
                        self._tokenizer,
                        vocab_size=self._vocab_size,
                        stop_token_ids=self._stop_ids or None,
                    )
                except Exception as exc:  # an exotic tokenizer xgrammar cannot read
                    raise GrammarError(f"tokenizer not supported: {error_reason(exc)}") from exc
                # Our LRU bounds memory; xgrammar's own cache is unbounded by default.
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                if self.isolate:
                    self._sandbox = shared_sandbox(info.serialize_json())
            return self._compiler, self._sandbox


class GrammarProcessor:
    """An mlx-lm logits processor that enforces one compiled grammar for one request.

    Both mlx-lm lanes call processors once per decode step, with the request's
    tokens so far: on the first call the prompt, then the prompt plus every
    token sampled since, the newest last. So call ``k > 0`` first accepts
    generated token ``k - 1``; :meth:`advance` makes that idempotent, so the
    request's Row may also report tokens without accepting one twice.

    Args:
        compiled: an ``xgrammar.CompiledGrammar``.
        stop_ids (Iterable[int]): the stop (EOS) token ids, for :attr:`done`.
    """

    def __init__(self, compiled: Any, stop_ids: Iterable[int]) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self._vocab = compiled.tokenizer_info.vocab_size
        self._stop = np.array(sorted(stop_ids), dtype=np.int64)
        self._stop = self._stop[self._stop < self._vocab]
        self._bitmask = np.full(xgr.get_bitmask_shape(1, self._vocab), -1, dtype=np.int32)
        self._calls = 0
        self._accepted = 0
        self._allowed: np.ndarray | None = None
        #: True once a token the grammar rejects was sampled (the processor then
        #: stops masking rather than fail the request).
        self.broken = False

    @property
    def accepted(self) -> int:
        """How many generated tokens the grammar has accepted."""
        return self._accepted

    def allowed(self) -> np.ndarray:
        """Which token ids may come next.

        Returns:
            np.ndarray: shape ``(vocab,)``, bool, over the tokenizer info's
            vocabulary (the model's ``vocab_size`` when given).
        """
        if self._allowed is None:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
            self._allowed = bits[: self._vocab].astype(bool)
        return self._allowed

    @property
    def masking(self) -> bool:
        """Whether the next token is masked: the grammar neither broke nor
        terminated (the batched lane's mask, :mod:`~.batch_logits`)."""
        return not self.broken and not self._matcher.is_terminated()

    @property
    def done(self) -> bool:
        """True when the grammar is complete and only a stop token may follow."""
        if self.broken or self._matcher.is_terminated():
            return False
        allowed = self.allowed()
        count = int(allowed.sum())
        return count > 0 and count == int(allowed[self._stop].sum())

    def jump_forward(self) -> str:
        """The text the grammar forces next (xgrammar's jump-forward string:
        the longest string every continuation starts with; complete UTF-8
        characters only); ``""`` when none, or when the grammar broke or ended."""
        if not self.masking:
            return ""
        return str(self._matcher.find_jump_forward_string())

    def jump_forward_tokens(self) -> list[int]:
        """xgrammar's own tokenization of :meth:`jump_forward` (greedy longest
        vocabulary match, the last token left off where a longer token could
        extend it); ``[]`` when none."""
        if not self.masking:
            return []
        return [int(t) for t in self._matcher.find_jump_forward_tokens()]

    def lookahead(self, tokens: list[int]) -> tuple[list[int], np.ndarray]:
        """The grammar's masks after each of ``tokens``, the matcher left as it was.

        Accepts ``tokens`` one by one, filling the allowed set after each, and
        rolls back (xgrammar's rollback is unbounded since 0.1.x's Earley parser).

        Args:
            tokens (list[int]): candidate next tokens, in order.

        Returns:
            tuple: ``(kept, masks)``: the longest prefix of ``tokens`` the
            grammar accepts, and ``masks`` shape ``(len(kept), vocab)``, bool:
            row ``j`` is what may follow ``kept[: j + 1]``.
        """
        import xgrammar as xgr

        kept: list[int] = []
        masks = []
        if not self.masking:
            return kept, np.zeros((0, self._vocab), dtype=bool)
        bitmask = np.full(xgr.get_bitmask_shape(1, self._vocab), -1, dtype=np.int32)
        for token in tokens:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token):
                break
            kept.append(token)
            if self._matcher.is_terminated():
                masks.append(np.zeros(self._vocab, dtype=bool))
                continue
            self._matcher.fill_next_token_bitmask(bitmask)
            bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
            masks.append(bits[: self._vocab].astype(bool))
        if kept:
            self._matcher.rollback(len(kept))
        shape = (len(kept), self._vocab)
        return kept, np.stack(masks) if masks else np.zeros(shape, dtype=bool)

    def advance(self, position: int, token: int) -> None:
        """Accept generated token number ``position`` (0-based) unless already accepted.

        Args:
            position (int): index of ``token`` among the generated tokens.
            token (int): the sampled token id.
        """
        if self.broken or position < self._accepted:
            return
        if position > self._accepted or not self._matcher.accept_token(token):
            log.warning("grammar rejected token %d at position %d; unconstrained", token, position)
            self.broken = True
            return
        self._accepted += 1
        self._allowed = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        """Mask ``logits`` to the tokens the grammar allows next.

        Args:
            tokens (mx.array): shape ``(n,)``, the request's tokens so far.
            logits (mx.array): shape ``(1, vocab)``, after the other processors.

        Returns:
            mx.array: ``logits`` with forbidden tokens set to ``-inf``.
        """
        import mlx.core as mx

        if self._calls:
            self.advance(self._calls - 1, int(tokens[-1].item()))
        self._calls += 1
        if self.broken or self._matcher.is_terminated():
            return logits
        allowed = self.allowed()
        width = logits.shape[-1]
        if allowed.size != width:  # logits rows beyond the tokenizer are never allowed
            allowed = np.pad(allowed, (0, max(0, width - allowed.size)))[:width]
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))
