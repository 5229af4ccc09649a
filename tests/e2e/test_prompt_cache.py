"""The prompt cache on disk (--session-dir) over HTTP on real servers: states survive a
restart and warm a new conversation of the same agent; damaged files are logged and ignored."""

from __future__ import annotations

import time

import requests

from .servers import Server

SYSTEM = ("You are a careful coding assistant working in a terminal. You answer with short, correct "
          "code and explain each step in one sentence. You never invent functions or modules. "
          "Available tools: read_file(path) returns a file's text; write_file(path, text) replaces a "
          "file; run(command) runs a shell command and returns its output. Use a tool whenever a task "
          "needs the file system, and say which tool you use and why before you use it.")


def chat(base_url, user: str, max_tokens: int = 8) -> dict:
    r = requests.post(base_url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def wait_for_files(srv: Server, n: int = 1, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = srv.health()["engine"]["session_dir"]
        if state["files"] >= n:
            return state
        time.sleep(0.05)
    raise AssertionError(f"no session file written: {srv.health()}")


def serve(model_dir, directory) -> Server:
    srv = Server(model_dir, {"ETSERVE_SESSION_DIR": str(directory)})
    srv.wait_ready()
    return srv


def test_a_new_conversation_after_a_restart_reports_the_saved_prompt_as_cached(model_dir, server, tmp_path):
    srv = serve(model_dir, tmp_path)
    try:
        first = chat(srv.base_url, "How do I reverse a list in Python?")
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        wait_for_files(srv)
    finally:
        srv.stop()
    assert list(tmp_path.glob("*.kv"))

    srv = serve(model_dir, tmp_path)
    try:
        assert srv.health()["engine"]["session_dir"]["files"] >= 1
        second = chat(srv.base_url, "How do I sort a dict by value?")  # another conversation, same agent
        usage = second["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.7 * usage["prompt_tokens"], usage
        # restored keys and values give the text a server without them gives
        plain = chat(server.base_url, "How do I sort a dict by value?")
        assert second["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    finally:
        srv.stop()


def test_a_state_still_being_written_when_the_server_stops_reaches_the_disk(model_dir, tmp_path):
    """A slow disk (each file held back 3 s, a test-only fault): the server is stopped while the
    state of the conversation it just answered is still being written; the worker waits for it
    (gunicorn's worker_exit hook) and the next server finds it."""
    srv = Server(model_dir, {"ETSERVE_SESSION_DIR": str(tmp_path), "ETSERVE_FAULT_INJECT": "slow_session_writes:3"})
    srv.wait_ready()
    try:
        chat(srv.base_url, "How do I reverse a list in Python?")
        assert srv.health()["engine"]["session_dir"]["files"] == 0  # not written yet
    finally:
        srv.stop()
    log = srv.log_path.read_text()
    assert len(list(tmp_path.glob("*.kv"))) == 1, log[-3000:]
    assert "before exiting" in log, log[-3000:]
    srv = serve(model_dir, tmp_path)
    try:
        assert srv.health()["engine"]["session_dir"]["files"] == 1
    finally:
        srv.stop()


def test_damaged_and_foreign_files_are_logged_and_ignored(model_dir, server, tmp_path):
    srv = serve(model_dir, tmp_path)
    try:
        chat(srv.base_url, "How do I reverse a list in Python?")
        wait_for_files(srv)
    finally:
        srv.stop()
    (saved,) = tmp_path.glob("*.kv")
    raw = bytearray(saved.read_bytes())
    raw[len(raw) // 2 + 7] ^= 0x10  # one bit of the saved keys and values
    saved.write_bytes(raw)
    (tmp_path / "garbage.kv").write_bytes(b"GARBAGE" * 500)
    foreign = bytearray(raw)  # the same file, as another build of the model would have written it
    at = foreign.index(b'"identity": "') + len(b'"identity": "')
    foreign[at] = ord("0") if foreign[at] != ord("0") else ord("1")
    (tmp_path / "other-build.kv").write_bytes(foreign)

    srv = serve(model_dir, tmp_path)
    try:
        health = srv.health()
        assert health["status"] == "ok" and health["engine"]["session_dir"]["ignored"] == 2
        second = chat(srv.base_url, "How do I sort a dict by value?")
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the damaged state is not used
        plain = chat(server.base_url, "How do I sort a dict by value?")
        assert second["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        assert srv.health()["status"] == "ok"
        log = srv.log_path.read_text()
        assert "garbage.kv ignored" in log and "another model build" in log and "damaged data" in log
        assert "Traceback" not in log
    finally:
        srv.stop()
