"""The slots' KV memory on a real server (app/engine/kv_budget.py, --kv-cache-mib): finished
requests' caches stay cached within the budget, the least recently used idle slot is cut from
its end past it, and a slot gives back what lies past what it holds."""

from __future__ import annotations

import re
import time

import requests

from .servers import Server

WORDS = ("river stone cloud lantern orchard violet harbor meadow copper whistle ember thistle "
         "granite saddle pepper marble feather canyon hollow juniper").split()


def text(seed: int, n: int) -> str:
    """n words that share no start with another seed's."""
    return f"Story {seed}: " + " ".join(WORDS[(seed * 7 + i * i) % len(WORDS)] for i in range(n))


def complete(base_url: str, prompt: str) -> dict:
    r = requests.post(base_url + "/v1/completions", timeout=120,
                      json={"prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def metrics(base_url: str) -> dict[str, float]:
    out = {}
    for line in requests.get(base_url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r'(etserve_(?:slot_kv_bytes|kv_cache_budget_bytes|kv_trimmed_positions_total))'
                     r'(?:\{slot="(\d+)"\})? (\S+)$', line)
        if m:
            out[m.group(1) + (f"[{m.group(2)}]" if m.group(2) else "")] = float(m.group(3))
    return out


def kv_bytes(m: dict[str, float]) -> float:
    return sum(v for k, v in m.items() if k.startswith("etserve_slot_kv_bytes["))


def bytes_per_position(server: Server) -> float:
    """The test model's cache bytes a position: the default budget is one context's worth."""
    budget = metrics(server.base_url)["etserve_kv_cache_budget_bytes"]
    assert budget > 0
    [model] = requests.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return budget / model["context_length"]


def test_default_budget_keeps_two_prompts_cached(server):
    a, b = text(1, 150), text(2, 150)  # ~190 tokens each: both fit one context
    first = complete(server.base_url, a)
    complete(server.base_url, b)
    again = complete(server.base_url, a)
    assert again["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] - 1, again


def test_past_the_budget_the_least_recently_used_idle_slot_is_cut_from_its_end(model_dir, server):
    bpp = bytes_per_position(server)
    mib = int(300 * bpp / 2**20)  # room for about 300 positions: one prompt of ~200 tokens, not two
    srv = Server(model_dir, {"ETSERVE_PARALLEL": "2", "ETSERVE_KV_CACHE_MIB": str(mib)})
    try:
        srv.wait_ready()
        budget = mib * 2**20
        assert metrics(srv.base_url)["etserve_kv_cache_budget_bytes"] == budget
        a, b = text(3, 200), text(4, 200)
        first = complete(srv.base_url, a)
        n = first["prompt_tokens"]
        assert 180 < n and 2 * n * bpp > budget > n * bpp
        assert complete(srv.base_url, b)["prompt_tokens_details"]["cached_tokens"] == 0  # the other slot
        deadline = time.monotonic() + 10
        while (m := metrics(srv.base_url)).get("etserve_kv_trimmed_positions_total", 0) == 0:
            assert time.monotonic() < deadline, m
            time.sleep(0.05)
        assert kv_bytes(m) <= budget, m
        assert kv_bytes(m) >= n * bpp, m  # b's cache stays whole
        # a's slot kept the start of a, in whole blocks of 64 positions
        cached = complete(srv.base_url, a)["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached < n - 1 and cached % 64 == 0, cached
    finally:
        srv.stop()


def test_a_slot_gives_back_what_lies_past_what_it_holds(model_dir):
    srv = Server(model_dir, {"ETSERVE_PARALLEL": "1"})
    try:
        srv.wait_ready()
        complete(srv.base_url, text(5, 300))
        long = kv_bytes(metrics(srv.base_url))
        complete(srv.base_url, text(6, 40))  # over the same slot, from position ~3
        deadline = time.monotonic() + 10
        while (short := kv_bytes(metrics(srv.base_url))) > long / 4:
            assert time.monotonic() < deadline, (long, short)
            time.sleep(0.05)
    finally:
        srv.stop()
