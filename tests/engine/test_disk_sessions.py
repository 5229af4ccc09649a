"""Sessions on disk (issue 13, item 5) driven through the engine on the real model: a new
engine on the same directory stands for a restarted server."""

from __future__ import annotations

import logging

import pytest

from app.engine import Engine, GenerationRequest, NativeModel, SamplingParams
from app.engine.sessions import common_prefix

GREEDY = SamplingParams(temperature=0.0)
SYSTEM = ("You are a careful coding assistant. You answer with short, correct code and explain "
          "each step. You never invent APIs. Tools: read_file(path), write_file(path, text), "
          "run(command). Use them when a task needs the file system.")


@pytest.fixture(scope="module")
def model(model_dir):
    """A runtime of its own: these engines must not clobber the cache served_model's engine relies on."""
    m = NativeModel(model_dir / "model.pte")
    yield m
    m.close()


def chat(served_model, user: str, session_id=None, system: str = SYSTEM):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    ids = served_model.tokenizer.encode(served_model.template.render(messages, add_generation_prompt=True))
    return GenerationRequest(ids, 8, GREEDY, served_model.stop_token_ids, session_id=session_id)


def system_tokens(served_model) -> int:
    """What two conversations of this agent share: the system prompt's turn (and the next
    turn's opening tag)."""
    return common_prefix(chat(served_model, "Hello.").prompt, chat(served_model, "Goodbye.").prompt)


def run(engine, request):
    gen = engine.generate(request)
    return [e.token_id for e in gen], gen.stats


def restarted(model, directory, **kw) -> Engine:
    """A new engine on the same directory, its runtime's cache overwritten first (a restarted
    server's holds nothing)."""
    model.forward(list(range(300, 420)), 0)
    return Engine(model, session_dir=directory, model_identity="test-build", **kw)


@pytest.fixture(scope="module")
def cold(model, served_model):
    engine = Engine(model, prefix_reuse=False, session_cache_mib=0)
    return {u: run(engine, chat(served_model, u))[0] for u in ("Reverse a list in Python.", "Sort a dict by value.")}


def test_a_new_conversation_after_a_restart_starts_from_the_saved_system_prompt(model, served_model, cold, tmp_path):
    first = Engine(model, session_dir=tmp_path, model_identity="test-build")
    out, stats = run(first, chat(served_model, "Reverse a list in Python."))
    assert out == cold["Reverse a list in Python."]
    assert first.sessions.disk.flush(30)
    assert len(list(tmp_path.glob("*.kv"))) == 1

    second = restarted(model, tmp_path)
    assert len(second.sessions.disk) == 1
    out, stats = run(second, chat(served_model, "Sort a dict by value."))  # another conversation
    assert stats.cached_tokens >= system_tokens(served_model)
    assert second.sessions.disk_restores == 1
    assert out == cold["Sort a dict by value."]  # restored state, same tokens as a cold run


def test_a_session_continues_from_its_file_after_a_restart(model, served_model, tmp_path):
    first = Engine(model, session_dir=tmp_path, model_identity="test-build")
    request = chat(served_model, "Reverse a list in Python.", session_id="conv-7")
    out, _ = run(first, request)
    assert first.sessions.disk.flush(30)
    turn_two = GenerationRequest(request.prompt + out + [17, 42, 99], 4, GREEDY, session_id="conv-7")
    second = restarted(model, tmp_path)
    warm, stats = run(second, turn_two)
    assert stats.cached_tokens == len(request.prompt) + len(out) - 1  # all but the last token, never run
    cold, _ = run(Engine(model, prefix_reuse=False, session_cache_mib=0), turn_two)
    assert warm == cold
    assert second.sessions.disk.flush(30)
    assert second.drop_session("conv-7") and not list(tmp_path.glob("*.kv"))


def test_a_damaged_file_is_logged_and_ignored(model, served_model, cold, tmp_path, caplog):
    first = Engine(model, session_dir=tmp_path, model_identity="test-build")
    run(first, chat(served_model, "Reverse a list in Python."))
    assert first.sessions.disk.flush(30)
    (path,) = tmp_path.glob("*.kv")
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x55  # a flipped bit in the saved keys and values
    path.write_bytes(raw)
    (tmp_path / "garbage.kv").write_bytes(b"\x00" * 1000)
    with caplog.at_level(logging.WARNING, logger="etserve"):
        second = restarted(model, tmp_path)
        out, stats = run(second, chat(served_model, "Sort a dict by value."))
    assert "garbage.kv ignored" in caplog.text and "damaged data" in caplog.text
    assert out == cold["Sort a dict by value."] and second.sessions.disk_restores == 0
    assert stats.cached_tokens == 0  # nothing usable: read from the start


def test_a_truncated_file_of_this_build_is_deleted_at_start_up(model, served_model, tmp_path, caplog):
    """docs/api.md: a damaged file of this build is deleted; one whose header cannot say whose it
    is stays (ignored), as another build's does."""
    first = Engine(model, session_dir=tmp_path, model_identity="test-build")
    run(first, chat(served_model, "Reverse a list in Python."))
    assert first.sessions.disk.flush(30)
    (path,) = tmp_path.glob("*.kv")
    path.write_bytes(path.read_bytes()[:-64])
    (tmp_path / "short.kv").write_bytes(b"\x00" * 30)
    with caplog.at_level(logging.WARNING, logger="etserve"):
        second = restarted(model, tmp_path)
    assert "truncated or extended" in caplog.text and "deleted" in caplog.text
    assert not path.exists() and (tmp_path / "short.kv").exists()
    assert len(second.sessions.disk) == 0


def test_another_builds_files_are_not_restored(model, served_model, tmp_path, caplog):
    first = Engine(model, session_dir=tmp_path, model_identity="test-build")
    run(first, chat(served_model, "Reverse a list in Python."))
    assert first.sessions.disk.flush(30)
    model.forward(list(range(300, 420)), 0)
    with caplog.at_level(logging.WARNING, logger="etserve"):
        other = Engine(model, session_dir=tmp_path, model_identity="another-build")
    assert "another model build" in caplog.text and len(other.sessions.disk) == 0
    _, stats = run(other, chat(served_model, "Sort a dict by value."))
    assert stats.cached_tokens == 0


def test_the_longest_prefix_wins_across_conversations(model, served_model, tmp_path):
    engine = Engine(model, session_dir=tmp_path, model_identity="test-build", session_cache_mib=0)
    other_system = "You are a poet. You answer every question with a rhyming couplet about the moon."
    run(engine, chat(served_model, "Reverse a list in Python."))
    run(engine, chat(served_model, "What is a list?", system=other_system))
    assert engine.sessions.disk.flush(30)
    assert len(engine.sessions.disk) == 2
    # live: the poet; the coding agent's new conversation restores the coding agent's state
    _, stats = run(engine, chat(served_model, "Sort a dict by value."))
    assert stats.cached_tokens >= system_tokens(served_model) and engine.sessions.disk_restores == 1
