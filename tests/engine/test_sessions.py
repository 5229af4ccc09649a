"""Sessions on one weight load: KV snapshots in the native runtime, the LRU of saved
states, and the engine switching between conversations without changing a single
greedy token.

The tests here load their own NativeModel (not the shared served_model's), so
the engines they build never clobber the cache another test's engine relies on.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.engine import Engine, GenerationRequest, NativeError, NativeModel, SamplingParams, Status
from app.engine.sessions import SessionCache, Snapshot, common_prefix

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(model_dir):
    m = NativeModel(model_dir / "model.pte")
    yield m
    m.close()


def max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


# --- native: ets_kv_info / ets_kv_snapshot / ets_kv_restore -------------------------------------


def test_kv_calls_refuse_before_the_first_forward(model_dir):
    fresh = NativeModel(model_dir / "model.pte")
    try:
        for call in (fresh.kv_info, lambda: fresh.kv_snapshot(1), lambda: fresh.kv_restore(0, b"")):
            with pytest.raises(NativeError, match="first forward call") as e:
                call()
            assert e.value.code == Status.STATE
        fresh.forward([1, 2, 3], 0)
        info = fresh.kv_info()
        assert info.n_caches > 0 and info.bytes_per_position > 0
    finally:
        fresh.close()


def test_kv_info_describes_the_test_models_caches(model, served_model):
    model.forward([1, 2, 3], 0)
    info = model.kv_info()
    # SmolLM2-135M: 30 layers, a key and a value cache each, 3 kv heads of 64 fp32 values
    assert info.n_caches == 60
    assert info.bytes_per_position == 60 * 3 * 64 * 4
    assert len(model.kv_snapshot(7)) == 7 * info.bytes_per_position
    assert len(model.kv_snapshot(0)) == 0


def test_snapshot_then_other_tokens_then_restore_gives_the_uninterrupted_logits(model, served_model):
    ids = served_model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)[:90]
    other = served_model.tokenizer.encode("Completely different text about spaceships and Mars. " * 8)[:120]
    model.forward(ids[:64], 0)
    model.forward(ids[64:], 64)
    n = len(ids)
    snap = model.kv_snapshot(n)
    model.forward([42], n)
    reference = model.logits()

    # another conversation overwrites positions 0..119
    model.forward(other[:64], 0)
    model.forward(other[64:], 64)
    model.forward([42], len(other))
    assert max_diff(model.logits(), reference) > 1e-3  # the cache really changed

    model.kv_restore(n, snap)
    model.forward([42], n)
    assert list(model.logits()) == list(reference)  # bitwise

    # a prefix of a longer snapshot, then the rest prefilled again: the same logits
    model.forward(other[:64], 0)
    model.kv_restore(50, bytes(snap))
    model.forward(ids[50:], 50)
    model.forward([42], n)
    assert max_diff(model.logits(), reference) <= 1e-5


def test_bad_snapshot_arguments_are_refused(model):
    model.forward([1, 2, 3], 0)
    per = model.kv_info().bytes_per_position
    max_seq = model.info.max_seq_len
    with pytest.raises(NativeError, match="more than the KV cache holds") as e:
        model.kv_snapshot(max_seq + 1)
    with pytest.raises(NativeError, match="multiple of"):
        model.kv_restore(1, bytearray(per + 1))
    with pytest.raises(NativeError, match="holds 2 positions"):
        model.kv_restore(3, bytearray(2 * per))
    with pytest.raises(NativeError, match="negative"):
        model.kv_restore(-1, bytearray(per))
    model.forward([1, 2, 3], 0)  # still works
    assert e.value.code != Status.OK


@pytest.fixture(scope="module")
def portable_pte(tmp_path_factory) -> Path:
    """A tiny model whose KV caches are plain buffers (tests/engine/tiny_portable.py)."""
    pytest.importorskip("torch")
    from engine.tiny_portable import export

    return export(tmp_path_factory.mktemp("portable") / "tiny.pte")


def test_a_model_exported_without_custom_ops_refuses_snapshots(portable_pte):
    m = NativeModel(portable_pte)
    try:
        m.forward([1, 2, 3], 0)
        with pytest.raises(NativeError, match="without the LLM custom ops") as e:
            m.kv_info()
        assert e.value.code == Status.UNSUPPORTED
        engine = Engine(m)  # sessions switch themselves off; requests still work on prefix reuse
        ids = list(range(100, 140))
        first = [ev.token_id for ev in engine.generate(GenerationRequest(ids, 4, GREEDY, session_id="a"))]
        gen = engine.generate(GenerationRequest(ids[:30] + [7, 8], 4, GREEDY, session_id="b"))
        list(gen)
        assert gen.stats.cached_tokens == 30  # plain prefix reuse with the live cache
        gen = engine.generate(GenerationRequest(ids, 4, GREEDY, session_id="a"))
        assert [ev.token_id for ev in gen] == first
        assert not engine.sessions.enabled and "custom ops" in engine.sessions.off_reason
        assert len(engine.sessions.cache) == 0
    finally:
        m.close()


# --- SessionCache: LRU and bytes ----------------------------------------------------------------


def snap(n: int, per: int = 10) -> Snapshot:
    return Snapshot(tuple(range(n)), bytearray(n * per))


def test_session_cache_evicts_least_recently_used_to_the_cap():
    cache = SessionCache(100)
    assert cache.put("a", snap(4)) == []  # 40 bytes
    assert cache.put("b", snap(3)) == []  # 70
    assert cache.get("a") is not None  # a is now the most recent
    assert cache.put("c", snap(5)) == ["b"]  # 120 > 100: b goes, a (touched) stays
    assert cache.used_bytes == 90 and [e.id for e in cache.entries()] == ["c", "a"]
    assert cache.put("a", snap(1)) == []  # replacing frees the old bytes first
    assert cache.used_bytes == 60
    assert cache.put("d", snap(11)) == []  # larger than the cap: not kept
    assert "d" not in cache and cache.used_bytes == 60
    assert cache.put("c", snap(11)) == [] and "c" not in cache  # its older state went too
    assert cache.used_bytes == 10
    assert cache.pop("a") is not None and cache.pop("a") is None
    assert cache.used_bytes == 0 and len(cache) == 0


def test_best_prefix_picks_the_longest_shared_prefix():
    cache = SessionCache(10 ** 6)
    cache.put("x", Snapshot((1, 2, 3, 4), b""))
    cache.put("y", Snapshot((1, 2, 9), b""))
    assert cache.best_prefix([1, 2, 3, 4, 5], 10) == ("x", 4)
    assert cache.best_prefix([1, 2, 3, 4, 5], 3) == ("x", 3)
    assert cache.best_prefix([1, 2, 9, 9], 10) == ("y", 3)
    assert cache.best_prefix([7], 10) == (None, 0)


# --- the engine: conversations interleaved give the outputs they give alone ---------------------


def chat_ids(served_model, messages) -> list[int]:
    return served_model.tokenizer.encode(served_model.template.render(messages, add_generation_prompt=True))


def turn(engine: Engine, served_model, messages, session_id, max_tokens=10):
    ids = chat_ids(served_model, messages)
    gen = engine.generate(GenerationRequest(ids, max_tokens, GREEDY, served_model.stop_token_ids,
                                            session_id=session_id))
    out = [e.token_id for e in gen]
    text = served_model.tokenizer.decode([t for t in out if t not in served_model.stop_token_ids])
    return ids, out, text, gen.stats


CONVERSATIONS = {
    "A": ["Tell me about cats.", "And dogs?", "Which one is easier to keep?"],
    "B": ["What is the capital of Spain?", "How many people live there?", "Name a famous museum there."],
    "C": ["Write a haiku about rain.", "Now one about snow.", "Which of the two do you like more?"],
}


def play(engine, served_model, order, session=lambda name: name):
    """Runs the conversations' turns in `order` (a list of names); returns per name its turns."""
    messages = {name: [] for name in CONVERSATIONS}
    done = {name: [] for name in CONVERSATIONS}
    for name in order:
        k = len(done[name])
        messages[name].append({"role": "user", "content": CONVERSATIONS[name][k]})
        ids, out, text, stats = turn(engine, served_model, messages[name], session(name))
        messages[name].append({"role": "assistant", "content": text})
        done[name].append((ids, out, stats))
    return done


@pytest.fixture(scope="module")
def cold_outputs(model, served_model):
    """Each conversation alone, every turn prefilled from nothing."""
    engine = Engine(model, prefix_reuse=False, session_cache_mib=0)
    out = {}
    for name in CONVERSATIONS:
        out[name] = play(engine, served_model, [name] * 3, session=lambda _: None)[name]
        assert all(stats.cached_tokens == 0 for _, _, stats in out[name])
    return out


def expected_hit(prev_ids, prev_out, ids) -> int:
    """What a turn can reuse of its conversation's previous turn: the previous prompt and all
    generated tokens but the last (sampled, never run through the model)."""
    return common_prefix(ids, prev_ids + prev_out[:-1], len(ids) - 1)


def test_interleaved_sessions_match_each_conversation_run_alone(model, served_model, cold_outputs):
    engine = Engine(model, session_cache_mib=512)
    order = ["A", "B", "C"] * 3
    warm = play(engine, served_model, order)
    for name in CONVERSATIONS:
        for k in range(3):
            ids, out, stats = warm[name][k]
            cold_ids, cold_out, _ = cold_outputs[name][k]
            assert ids == cold_ids and out == cold_out, (name, k)
            if k:
                prev_ids, prev_out, _ = warm[name][k - 1]
                # B and C ran in between, yet the turn reuses all of its previous turn
                assert stats.cached_tokens >= len(prev_ids), (name, k)
                assert stats.cached_tokens == expected_hit(prev_ids, prev_out, ids), (name, k)
                assert stats.cached_tokens >= len(prev_ids) + len(prev_out) - 4, (name, k)
    assert engine.sessions.restores >= 6 and engine.sessions.saves >= 6
    assert {e["id"] for e in engine.session_entries()} == {"A", "B", "C"}


def test_an_anonymous_request_restores_the_session_sharing_the_longest_prefix(model, served_model, cold_outputs):
    engine = Engine(model, session_cache_mib=512)
    play(engine, served_model, ["A", "B", "C"])  # A and B saved, C live
    # A's second turn without a session id: the engine finds A's saved state by its tokens
    a2 = play(engine, served_model, ["A", "A"], session=lambda name: None)["A"][1]
    ids, out, stats = a2
    prev_ids, prev_out, _ = cold_outputs["A"][0]
    assert out == cold_outputs["A"][1][1]
    assert stats.cached_tokens == expected_hit(prev_ids, prev_out, ids) > len(prev_ids)
    # C (live before the anonymous requests) was saved first, and continues warm
    c2 = play(engine, served_model, ["C", "C"])["C"][1]
    assert c2[1] == cold_outputs["C"][1][1]
    assert c2[2].cached_tokens >= len(cold_outputs["C"][0][0])


def test_prefix_reuse_off_and_on_give_the_same_greedy_tokens(model, served_model, cold_outputs):
    engine = Engine(model, session_cache_mib=512)
    warm = play(engine, served_model, ["A", "A", "A"])["A"]
    assert [o for _, o, _ in warm] == [o for _, o, _ in cold_outputs["A"]]
    assert warm[2][2].cached_tokens > len(warm[1][0])


def test_lru_eviction_under_a_small_cap(model, served_model, cold_outputs):
    model.forward([1], 0)
    per = model.kv_info().bytes_per_position
    first_turns = {name: cold_outputs[name][0] for name in CONVERSATIONS}
    sizes = {name: (len(ids) + len(out) - 1) * per for name, (ids, out, _) in first_turns.items()}
    # room for two saved first turns, not three
    cap = max(sizes.values()) * 2 + per
    assert cap < sum(sorted(sizes.values())[:3])
    engine = Engine(model, session_cache_mib=cap / 2**20)
    first = play(engine, served_model, ["A", "B", "C"])  # A and B saved; C live
    cache = engine.sessions.cache
    assert set(e.id for e in cache.entries()) == {"A", "B"}
    turn(engine, served_model, [{"role": "user", "content": "Something else entirely."}], "D")
    # D took the cache: C saved, and A, the least recently used, evicted to make room
    assert [e.id for e in cache.entries()] == ["C", "B"] and cache.evictions == 1
    assert cache.used_bytes == sizes["B"] + sizes["C"] <= cap
    assert cache.used_bytes == sum(e.bytes for e in cache.entries())
    # A's second turn: its state is gone, so it starts cold (but right)
    a1_ids, a1_out, _ = first["A"][0]
    text = served_model.tokenizer.decode([t for t in a1_out if t not in served_model.stop_token_ids])
    messages = [{"role": "user", "content": CONVERSATIONS["A"][0]}, {"role": "assistant", "content": text},
                {"role": "user", "content": CONVERSATIONS["A"][1]}]
    ids, out, _, stats = turn(engine, served_model, messages, "A")
    assert out == cold_outputs["A"][1][1]
    assert stats.cached_tokens < len(a1_ids)
    assert "B" not in cache and cache.used_bytes <= cap  # D saved, B evicted


def test_forgetting_a_session(model, served_model):
    engine = Engine(model, session_cache_mib=512)
    play(engine, served_model, ["A", "B"])  # A saved, B live
    assert engine.drop_session("A") and not engine.drop_session("A")
    assert engine.drop_session("B")  # the live owner: no longer saved under B later
    assert not engine.drop_session("B") and not engine.drop_session("nobody")
    play(engine, served_model, ["C"])
    assert [e["id"] for e in engine.session_entries()] == ["C"]
    assert engine.sessions.cache.used_bytes == 0


def test_session_cache_zero_turns_sessions_off(model, served_model, cold_outputs):
    engine = Engine(model, session_cache_mib=0)
    done = play(engine, served_model, ["A", "B", "A"])
    assert not engine.sessions.enabled and engine.sessions.saves == 0
    assert done["A"][1][1] == cold_outputs["A"][1][1]
    assert math.isfinite(done["A"][1][2].prompt_ms)
