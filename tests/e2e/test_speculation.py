"""Speculative decoding served for real (issue 35): the default model, on by default, gives the
same greedy output as a server with it off (--draft-max 0), over chat, tool calls, json_schema
output, the Responses and Messages APIs and streaming; drafted and accepted tokens show in
`timings` and /metrics; several requests at once share forward calls (batched decode).
"""

from __future__ import annotations

import json
import threading

import pytest
import requests

from .tool_prompts import AGENT_TOOLS

CODE = '''import json
from pathlib import Path


def load_config(path):
    """Read a JSON config file and return it as a dict."""
    text = Path(path).read_text()
    config = json.loads(text)
    if "name" not in config:
        raise ValueError("config has no name")
    return config


def save_config(path, config):
    """Write a config dict as JSON."""
    Path(path).write_text(json.dumps(config, indent=2))
'''

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                           "landmarks": {"type": "array", "items": {"type": "string"}}},
          "required": ["city", "population", "landmarks"]}


def chat_bodies() -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": "Rename load_config to read_config in this file and show the "
                                                  "whole file:\n\n" + CODE}], "max_tokens": 200},
        {"messages": [{"role": "user", "content": "Write a limerick about a cat."}], "max_tokens": 60},
        {"messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
         "tools": AGENT_TOOLS, "max_tokens": 80},
        {"messages": [{"role": "user", "content": "Describe Paris as JSON."}], "max_tokens": 120,
         "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}},
        {"messages": [{"role": "user", "content": "Add a docstring to every function:\n\n" + CODE}],
         "max_tokens": 150, "stream": True},
    ]


def post_chat(srv, body: dict) -> tuple[str, list, dict]:
    body = {"temperature": 0, **body}
    if body.get("stream"):
        r = requests.post(srv.base_url + "/v1/chat/completions", json=body, stream=True, timeout=600)
        assert r.status_code == 200, r.text
        text, timings = "", {}
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunk = json.loads(line[6:])
                for c in chunk.get("choices", []):
                    text += c["delta"].get("content") or ""
                timings = chunk.get("timings") or timings
        return text, [], timings
    r = requests.post(srv.base_url + "/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    return msg.get("content") or "", calls, r.json().get("timings", {})


def responses_text(srv) -> str:
    r = requests.post(srv.base_url + "/v1/responses", timeout=600, json={
        "model": "m", "input": "Repeat this code exactly:\n\n" + CODE, "max_output_tokens": 160, "temperature": 0})
    assert r.status_code == 200, r.text
    return "".join(c["text"] for item in r.json()["output"] if item["type"] == "message" for c in item["content"])


def messages_text(srv) -> str:
    r = requests.post(srv.base_url + "/v1/messages", timeout=600, headers={"anthropic-version": "2023-06-01"},
                      json={"model": "m", "max_tokens": 120, "temperature": 0, "messages": [
                          {"role": "user", "content": "Rewrite save_config to also create the parent "
                                                      "directory:\n\n" + CODE}]})
    assert r.status_code == 200, r.text
    return "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")


def metric(srv, name: str) -> float:
    text = requests.get(srv.base_url + "/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


@pytest.fixture(scope="module")
def plain(make_server, qwen_dir):
    return make_server({"ETSERVE_MODEL_PATH": str(qwen_dir), "ETSERVE_DRAFT_MAX": "0"})


def test_greedy_output_is_the_same_with_speculation_on_and_off(qwen_server, plain):
    drafted0 = metric(qwen_server, "etserve_draft_tokens_total")
    accepted = 0
    for body in chat_bodies():
        on = post_chat(qwen_server, body)
        off = post_chat(plain, body)
        assert on[:2] == off[:2], body["messages"][0]["content"][:60]
        assert off[2].get("draft_n", 0) == 0
        accepted += on[2].get("draft_n_accepted", 0)
    assert accepted >= 50, "the rename copies most of a file: drafts should be accepted"
    assert responses_text(qwen_server) == responses_text(plain)
    assert messages_text(qwen_server) == messages_text(plain)
    assert metric(qwen_server, "etserve_draft_tokens_total") > drafted0
    assert metric(qwen_server, "etserve_draft_accepted_tokens_total") > 0
    assert metric(plain, "etserve_draft_tokens_total") == 0


def test_requests_at_once_share_forward_calls_and_keep_their_output(make_server, qwen_dir):
    """As tests/e2e/test_slots.py's identity test: slots to spare, the prompts read once first, so
    that alone and together alike find each prompt in a slot (a prompt read cold in one chunk and
    its last token read alone round differently: what is compared is the sharing)."""
    srv = make_server({"ETSERVE_MODEL_PATH": str(qwen_dir), "ETSERVE_PARALLEL": "8"})
    bodies = chat_bodies()[:4]

    def together() -> list:
        out: list = [None] * len(bodies)

        def one(i):
            out[i] = post_chat(srv, bodies[i])[:2]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    together()
    alone = [post_chat(srv, b)[:2] for b in bodies]
    shared0 = metric(srv, "etserve_steps_shared_total")
    assert together() == alone
    assert metric(srv, "etserve_steps_shared_total") > shared0
    srv.stop()
