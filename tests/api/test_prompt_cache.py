"""Prompt cache: prefix reuse in both lanes, identical greedy output, LRU byte
eviction, namespaces, sessions and the SSD tier across a restart."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from mlxspec.engine import Engine, Finished, GenerationRequest, LogitsParams
from mlxspec.engine.caches.kv import bucket_tail
from mlxspec.engine.caches.prompt_cache import CacheNamespace, PromptCache
from mlxspec.engine.caches.ssd_cache import SsdCache, read_snapshot_header
from mlxspec.engine.sampling.sampler import with_history
from tests.helpers import text_and_finish

#: Forbid EOS (token 2, ``<|im_end|>``) so every run generates its full budget.
NO_EOS = LogitsParams(logit_bias=((2, -1e9),))
SHARED = "the quick brown fox jumps over the lazy dog " * 3


def make_engine(model_dir: Path, max_batch: int, cache: PromptCache | None) -> Engine:
    engine = Engine.load(model_dir, "tiny-llama", max_batch=max_batch)
    if cache is not None:
        engine.prompt_cache = cache
    engine.start()
    return engine


def run(engine: Engine, req: GenerationRequest) -> tuple[str, Finished]:
    return asyncio.run(text_and_finish(engine, req))


def run_concurrently(engine: Engine, reqs: list[GenerationRequest]) -> list[tuple[str, Finished]]:
    async def go():
        return await asyncio.gather(*(text_and_finish(engine, r) for r in reqs))

    return asyncio.run(go())


def request(engine: Engine, text: str, max_tokens: int = 8, **kw) -> GenerationRequest:
    return GenerationRequest(tuple(engine.text_prompt(text)), max_tokens=max_tokens, **kw)


@pytest.fixture(scope="module", params=[1, 4], ids=["serial", "batched"])
def lanes(request, tiny_model_dir):
    """A cached and an uncached engine on the same lane."""
    cached = make_engine(tiny_model_dir, request.param, PromptCache(64 << 20))
    plain = make_engine(tiny_model_dir, request.param, PromptCache(0))
    yield cached, plain
    cached.close()
    plain.close()


def test_repeated_prefix_is_cached_and_output_is_identical(lanes) -> None:
    cached, plain = lanes
    first = request(cached, SHARED + "first", logits=NO_EOS)
    second = request(cached, SHARED + "second", logits=NO_EOS)
    shared = len(cached.text_prompt(SHARED))
    text1, fin1 = run(cached, first)
    text2, fin2 = run(cached, second)
    again, fin3 = run(cached, first)
    assert fin1.cached_tokens == 0
    assert shared - 2 <= fin2.cached_tokens < len(second.prompt)
    # the whole prompt is kept; one token is always prefilled for the logits
    assert fin3.cached_tokens == len(first.prompt) - 1
    assert (text1, text2) == (run(plain, first)[0], run(plain, second)[0])
    assert again == text1
    assert run(plain, first)[1].cached_tokens == 0
    stats = cached.prompt_cache.stats()
    assert stats["hits"] >= 2 and stats["hit_tokens"] >= fin2.cached_tokens + fin3.cached_tokens


def test_multi_turn_continuation_reuses_prompt_and_answer(lanes) -> None:
    """Turn 2's prompt extends turn 1's prompt plus its answer: all of it is cached."""
    cached, plain = lanes
    turn1 = request(cached, "Once upon a time ", max_tokens=6, logits=NO_EOS)
    _, fin1 = run(cached, turn1)
    held = cached.prompt_cache.stats()
    answer = run(plain, turn1)[0]
    turn2 = request(cached, "Once upon a time " + answer + " and then", logits=NO_EOS)
    text2, fin2 = run(cached, turn2)
    assert held["entries"] >= 1
    assert fin2.cached_tokens >= len(turn1.prompt)
    assert text2 == run(plain, turn2)[0]


def test_penalties_see_the_cached_prefix(lanes) -> None:
    cached, plain = lanes
    penalised = LogitsParams(
        logit_bias=((2, -1e9),), repetition_penalty=1.5, repetition_context_size=64
    )
    req = request(cached, SHARED + "penalised", max_tokens=10, logits=penalised)
    run(cached, req)
    text, fin = run(cached, req)
    assert fin.cached_tokens > 0
    assert text == run(plain, req)[0]


def test_concurrent_shared_prefix_equals_one_at_a_time(tiny_model_dir) -> None:
    engine = make_engine(tiny_model_dir, 4, PromptCache(64 << 20))
    plain = make_engine(tiny_model_dir, 1, PromptCache(0))
    try:
        run(engine, request(engine, SHARED))  # seed the cache with the shared prefix
        tails = ("a", "bb", "c", "dd")
        reqs = [request(engine, SHARED + tail, logits=NO_EOS) for tail in tails]
        reqs.append(request(engine, "zzz unrelated", logits=NO_EOS))  # a miss joins the batch
        together = run_concurrently(engine, reqs)
        alone = [run(plain, r)[0] for r in reqs]
        assert [t for t, _ in together] == alone
        assert all(f.cached_tokens > 0 for _, f in together[:4])
        assert together[4][1].cached_tokens == 0
        assert {f.lane for _, f in together} == {"batched"}
    finally:
        engine.close()
        plain.close()


def test_lru_evicts_oldest_under_byte_budget(tiny_engine) -> None:
    ns = CacheNamespace("tiny-llama")
    probe = PromptCache(1 << 30)
    run_into(tiny_engine, probe, "aaaa bbbb")
    size = probe.stats()["bytes"]
    cache = PromptCache(2 * size + size // 2)  # room for two entries, not three
    for text in ("aaaa bbbb", "cccc dddd", "eeee ffff"):
        run_into(tiny_engine, cache, text)
    stats = cache.stats()
    assert (stats["entries"], stats["evictions"]) == (2, 1)
    assert stats["bytes"] <= cache.max_bytes
    assert cache.fetch(ns, tiny_engine.text_prompt("aaaa bbbb"))[0] is None
    assert cache.fetch(ns, tiny_engine.text_prompt("eeee ffff"))[1] > 0


def test_an_entry_cap_evicts_the_oldest(tiny_engine) -> None:
    """``--prompt-cache-size N`` (mlx_lm.server's): at most N entries, whatever the bytes."""
    ns = CacheNamespace("tiny-llama")
    cache = PromptCache(1 << 30, max_entries=2)
    for text in ("aaaa bbbb", "cccc dddd", "eeee ffff"):
        run_into(tiny_engine, cache, text)
    assert (cache.stats()["entries"], cache.stats()["evictions"]) == (2, 1)
    assert cache.fetch(ns, tiny_engine.text_prompt("aaaa bbbb"))[0] is None
    assert cache.fetch(ns, tiny_engine.text_prompt("cccc dddd"))[1] > 0


def run_into(engine: Engine, cache: PromptCache, text: str, session: str | None = None) -> None:
    """Prefill ``text`` on the model and keep its cache in ``cache``."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    tokens = engine.text_prompt(text)
    kv = make_prompt_cache(engine.model)
    engine.model(mx.array([tokens]), cache=kv)
    cache.store(CacheNamespace("tiny-llama"), tokens, kv, session)


def test_namespaces_are_separate(tiny_engine) -> None:
    cache = PromptCache(1 << 30)
    run_into(tiny_engine, cache, SHARED)
    prompt = tiny_engine.text_prompt(SHARED + "more")
    assert cache.fetch(CacheNamespace("tiny-llama"), prompt)[1] > 0
    assert cache.fetch(CacheNamespace("other-model"), prompt) == (None, 0)
    assert cache.fetch(CacheNamespace("tiny-llama", adapter="lora-a"), prompt) == (None, 0)
    assert cache.fetch(CacheNamespace("tiny-llama", kv_quant="kv8"), prompt) == (None, 0)


def test_session_prefers_its_checkpoint_and_close_forgets_it(tiny_engine) -> None:
    ns = CacheNamespace("tiny-llama")
    cache = PromptCache(1 << 30)
    run_into(tiny_engine, cache, SHARED)
    prompt = tiny_engine.text_prompt(SHARED + "next")
    cache.fetch(ns, prompt, session="agent-42")  # no checkpoint yet: ordinary search
    kv_tokens = tiny_engine.text_prompt(SHARED + "nex")
    run_into(tiny_engine, cache, SHARED + "nex", session="agent-42")
    _, got = cache.fetch(ns, prompt, session="agent-42")
    stats = cache.stats()
    assert (stats["session_hits"], stats["session_misses"], stats["sessions"]) == (1, 1, 1)
    assert got == len(kv_tokens)
    cache.close_session("agent-42")
    cache.fetch(ns, prompt, session="agent-42")
    stats = cache.stats()
    assert (stats["session_hits"], stats["session_misses"], stats["sessions"]) == (1, 2, 0)
    assert stats["entries"] == 1  # closing keeps the checkpoint


def test_session_checkpoint_survives_eviction_pressure(tiny_engine) -> None:
    ns = CacheNamespace("tiny-llama")
    probe = PromptCache(1 << 30)
    run_into(tiny_engine, probe, "aaaa bbbb")
    size = probe.stats()["bytes"]
    cache = PromptCache(2 * size + size // 2)
    tokens = tiny_engine.text_prompt("aaaa bbbb")
    run_into(tiny_engine, cache, "aaaa bbbb", session="s")
    for text in ("cccc dddd", "eeee ffff"):
        run_into(tiny_engine, cache, text)
    assert cache.fetch(ns, tokens + [5], session="s")[1] == len(tokens)


def test_with_history_prepends_cached_tokens() -> None:
    import mlx.core as mx

    seen = []
    wrapped = with_history([lambda t, lg: seen.append(t.tolist()) or lg], [1, 2, 3, 4], 3)
    wrapped[0](mx.array([9], dtype=mx.uint32), mx.zeros((1, 4)))
    assert seen == [[2, 3, 4, 9]]
    assert with_history([], [1], 3) == []


def test_ssd_cache_survives_restart(tiny_model_dir, tmp_path) -> None:
    ssd_dir = tmp_path / "ssd"
    first = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, ssd_cache=ssd_dir)
    first.start()
    req = request(first, SHARED + "durable", logits=NO_EOS)
    try:
        text, fin = run(first, req)
        report = first.prompt_cache.flush(30)
    finally:
        first.close()
    assert fin.cached_tokens == 0
    assert report["durable"] is True and report["entries"] == 1
    assert report["longest_durable_prefix_tokens"] == len(req.prompt) + 8  # prompt + answer
    files = [p for p in ssd_dir.iterdir() if p.suffix == ".safetensors"]
    assert len(files) == 1 and not files[0].name.startswith(".")
    ns, tokens = read_snapshot_header(files[0])
    assert (ns, tokens[: len(req.prompt)]) == (tuple(first.cache_namespace), req.prompt)

    second = Engine.load(tiny_model_dir, "tiny-llama", max_batch=4, ssd_cache=ssd_dir)
    second.start()
    try:
        assert second.prompt_cache.ssd.stats()["entries"] == 1
        again, fin2 = run(second, req)
    finally:
        second.close()
    assert again == text
    assert fin2.cached_tokens == len(req.prompt) - 1
    assert second.prompt_cache.ssd.stats()["restores"] == 1


def test_flush_reports_failed_write_then_retries(tiny_engine, tmp_path) -> None:
    import shutil

    ssd = SsdCache(tmp_path / "ssd")
    cache = PromptCache(1 << 30, ssd)
    shutil.rmtree(ssd.directory)
    ssd.directory.write_text("not a directory")  # every write now fails
    run_into(tiny_engine, cache, SHARED)
    report = cache.flush(30)
    assert (report["durable"], report["failedSpills"], report["flushedSnapshots"]) == (False, 1, 0)
    assert (report["pendingSnapshots"], report["entries"]) == (1, 0)
    assert report["pendingSpillBytes"] == cache.stats()["bytes"]
    ssd.directory.unlink()
    ssd.directory.mkdir()
    report = cache.flush(30)
    assert (report["durable"], report["failedSpills"], report["flushedSnapshots"]) == (True, 0, 1)
    assert (report["pendingSnapshots"], report["entries"]) == (0, 1)
    assert report["longest_durable_prefix_tokens"] == len(tiny_engine.text_prompt(SHARED))


def test_a_damaged_snapshot_is_deleted_and_written_again(tiny_engine, tmp_path) -> None:
    ns = CacheNamespace("tiny-llama")
    ssd = SsdCache(tmp_path / "ssd")
    run_into(tiny_engine, PromptCache(1 << 30, ssd), SHARED)
    cache = PromptCache(1 << 30, ssd)
    run_into(tiny_engine, cache, "the quick brown fox")  # a shorter match for SHARED + "more"
    assert cache.flush(30)["entries"] == 2
    prompt = tiny_engine.text_prompt(SHARED + "more")
    start = tiny_engine.text_prompt("the quick brown fox")
    assert prompt[: len(start)] == start
    damaged = max(ssd.directory.iterdir(), key=lambda p: len(read_snapshot_header(p)[1]))

    restarted = SsdCache(ssd.directory)  # a restart...
    assert restarted.stats()["entries"] == 2
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])  # ...then damage
    found = restarted.restore(ns, prompt, better_than=0)  # the damaged one is skipped...
    assert found is not None and found[0] == tuple(start)  # ...for the next best
    assert not damaged.exists() and restarted.stats()["entries"] == 1
    assert restarted.stats()["corrupt"] == 1
    assert restarted.restore(ns, prompt, better_than=len(start)) is None

    again = PromptCache(1 << 30, restarted)
    run_into(tiny_engine, again, SHARED)  # kept again: written afresh, not skipped
    report = again.flush(30)
    assert (report["durable"], report["flushedSnapshots"], report["entries"]) == (True, 1, 2)
    restored = SsdCache(ssd.directory).restore(ns, prompt, better_than=0)
    assert restored is not None and restored[0] == tuple(tiny_engine.text_prompt(SHARED))


def test_flush_writes_again_what_vanished_from_disk_while_ram_holds_it(
    tiny_engine, tmp_path
) -> None:
    import shutil

    ssd = SsdCache(tmp_path / "ssd")
    cache = PromptCache(1 << 30, ssd)
    run_into(tiny_engine, cache, SHARED)
    assert cache.flush(30)["entries"] == 1
    (snapshot,) = list(ssd.directory.iterdir())
    snapshot.unlink()  # one file deleted by hand: RAM still holds its tokens
    report = cache.flush(30)
    assert (report["durable"], report["flushedSnapshots"], report["missingSnapshots"]) == (
        True,
        1,
        0,
    )
    assert snapshot.exists() and report["entries"] == 1
    shutil.rmtree(ssd.directory)  # the whole directory: made again and written
    report = cache.flush(30)
    assert (report["durable"], report["flushedSnapshots"], report["entries"]) == (True, 1, 1)
    assert report["longest_durable_prefix_tokens"] == len(tiny_engine.text_prompt(SHARED))
    assert snapshot.exists()


def test_flush_reports_a_vanished_snapshot_missing_until_written_again(
    tiny_engine, tmp_path
) -> None:
    ssd = SsdCache(tmp_path / "ssd")
    run_into(tiny_engine, PromptCache(1 << 30, ssd), SHARED)
    cache = PromptCache(1 << 30, ssd)  # a RAM tier that never held those tokens
    assert cache.flush(30)["entries"] == 1
    (snapshot,) = list(ssd.directory.iterdir())
    snapshot.unlink()
    for _ in range(2):  # retrying does not make it durable
        report = cache.flush(30)
        assert (report["durable"], report["missingSnapshots"], report["entries"]) == (False, 1, 0)
        assert report["longest_durable_prefix_tokens"] == 0
    run_into(tiny_engine, cache, SHARED + "and more")  # a longer snapshot covers it again
    report = cache.flush(30)
    assert (report["durable"], report["missingSnapshots"], report["flushedSnapshots"]) == (
        True,
        0,
        1,
    )


def test_flush_without_ssd_tier_is_durable_and_empty() -> None:
    report = PromptCache(1).flush(1)
    assert report == SsdCache.empty_flush_report()
    assert (report["durable"], report["entries"]) == (True, 0)


def test_ssd_disk_budget_keeps_the_newest_snapshot(tiny_engine, tmp_path) -> None:
    ssd = SsdCache(tmp_path / "ssd", max_bytes=1)  # room for less than one snapshot
    cache = PromptCache(1 << 30, ssd)
    run_into(tiny_engine, cache, "aaaa bbbb")
    assert cache.flush(30)["entries"] == 1
    run_into(tiny_engine, cache, "cccc dddd")
    assert cache.flush(30)["entries"] == 1  # the newest always stays
    (path,) = list(ssd.directory.iterdir())
    assert read_snapshot_header(path)[1] == tuple(tiny_engine.text_prompt("cccc dddd"))
    assert SsdCache(ssd.directory).stats()["entries"] == 1  # the index rebuilt from disk


def test_n_siblings_share_one_prefill(tiny_model_dir) -> None:
    """``shared_prefill`` (the n choices of one body): the prompt is prefilled
    once into the cache and every sibling starts from it, same text as alone."""
    cache = PromptCache(64 << 20)
    engine = make_engine(tiny_model_dir, 4, cache)
    plain = make_engine(tiny_model_dir, 1, PromptCache(0))
    try:
        base = request(engine, "shared prefill for three choices, once", logits=NO_EOS)
        siblings = [replace(base, shared_prefill=True) for _ in range(3)]
        together = run_concurrently(engine, siblings)
        prompt = len(base.prompt)
        # every sibling, the first included, starts from the one kept prefill
        assert [f.cached_tokens for _, f in together] == [prompt - 1] * 3
        assert cache.stats()["misses"] == 0 and cache.stats()["hits"] == 3
        assert [t for t, _ in together] == [run(plain, base)[0]] * 3
        assert {f.lane for _, f in together} == {"batched"}
    finally:
        engine.close()
        plain.close()


def test_shared_prefill_flag_follows_n() -> None:
    from mlxspec.engine import GenerationDefaults
    from mlxspec.handlers.requests import to_generation_request

    def flag(body: dict) -> bool:
        return to_generation_request(body, [1, 2, 3], GenerationDefaults()).shared_prefill

    assert (flag({}), flag({"n": 1}), flag({"n": None}), flag({"n": 2})) == (
        False,
        False,
        False,
        True,
    )


def test_worth_using_needs_a_tenth_of_the_prompt_or_1024_tokens() -> None:
    cache = PromptCache(1 << 20)
    assert (cache.min_hit_fraction, cache.min_hit_tokens) == (0.1, 1024)
    assert [cache.worth_using(c, 1029) for c in (0, 25, 102, 103, 1028)] == [
        False,
        False,
        False,
        True,
        True,
    ]
    assert cache.worth_using(1024, 20_000) and not cache.worth_using(1023, 20_000)
    assert PromptCache(1 << 20, min_hit_fraction=0.5).worth_using(10, 30) is False


def test_a_hit_too_small_to_pay_is_a_miss(tiny_engine) -> None:
    """Only a short head in common (under 10% of the prompt): no copy is handed
    out, the request prefills from scratch and counts as a miss."""
    ns = CacheNamespace("tiny-llama")
    cache = PromptCache(1 << 30)
    run_into(tiny_engine, cache, SHARED + "first")
    tokens = tiny_engine.text_prompt(SHARED + "first")
    filler = [tokens[-1]] * 100
    assert cache.fetch(ns, tokens[:5] + filler) == (None, 0)
    kv, got = cache.fetch(ns, tokens[:20] + filler)  # 20 of 120 tokens
    assert got == 20 and kv is not None and kv[0].offset == 20
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["hit_tokens"]) == (1, 1, 20)
    lenient = PromptCache(1 << 30, min_hit_tokens=5)
    run_into(tiny_engine, lenient, SHARED + "first")
    assert lenient.fetch(ns, tokens[:5] + filler)[1] == 5


def test_kept_entries_are_evaluated_without_blocking_the_store(tiny_engine) -> None:
    """``store`` queues the compaction (``async_eval``); what it keeps holds
    exactly the stored tokens and serves a later exact hit."""
    import mlx.core as mx

    ns = CacheNamespace("tiny-llama")
    cache = PromptCache(1 << 30)
    run_into(tiny_engine, cache, SHARED)
    tokens = tiny_engine.text_prompt(SHARED)
    kv, got = cache.fetch(ns, tokens)
    assert got == len(tokens) - 1
    mx.eval([c.state for c in kv])
    assert [c.keys.shape[2] for c in kv] == [len(tokens)] * len(kv)
    assert cache.stats()["bytes"] == sum(c.nbytes for c in kv)


def test_bucket_tail_rounds_the_prefill_up_to_a_few_lengths() -> None:
    # H200 turn 2: 1029 of 1140 tokens cached, 110 to prefill -> 128
    assert bucket_tail(1029, 1140) == 1011
    # over 64 tokens, multiples of 64: 149 -> 192 (a power of two, 256, left 21)
    assert bucket_tail(128, 278) == 85
    assert (bucket_tail(900, 1000), bucket_tail(934, 1000)) == (871, 871)  # 99, 65 -> 128
    assert [bucket_tail(u, 100) for u in (99, 98, 97, 96, 95)] == [99, 98, 97, 95, 95]
    assert (bucket_tail(488, 1000), bucket_tail(487, 1000)) == (487, 487)  # 511, 512 -> 512
    assert bucket_tail(400, 1000) == 400  # 599 to prefill: over the largest bucket
    assert (bucket_tail(30, 40), bucket_tail(5, 40)) == (23, 0)  # 9 -> 16; 34 -> 64 > 39


def test_tails_are_bucketed_only_when_asked(tiny_engine) -> None:
    ns = CacheNamespace("tiny-llama")
    tokens = tiny_engine.text_prompt(SHARED + "first")
    prompt = tokens + [tokens[-1]] * 10  # 11 tokens after the kept ones
    plain = PromptCache(1 << 30)
    assert plain.bucket_tails is False  # MLX computes on the CPU here
    run_into(tiny_engine, plain, SHARED + "first")
    assert plain.fetch(ns, prompt)[1] == len(tokens)
    bucketed = PromptCache(1 << 30, bucket_tails=True)
    run_into(tiny_engine, bucketed, SHARED + "first")
    kv, got = bucketed.fetch(ns, prompt)
    assert got == len(prompt) - 1 - 16 and kv[0].offset == got
