"""GET /metrics on a real server: Prometheus text that moves exactly with the requests and tokens served."""

from __future__ import annotations

import json
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .streams import LONG, open_stream, read_events

KEY = "metrics-test-key"
CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Name three colors."}]


def scrape(server, headers: dict | None = None) -> dict[tuple[str, tuple], float]:
    """Every sample as {(sample name, sorted labels): value}."""
    r = requests.get(server.base_url + "/metrics", headers=headers or {}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def requests_for(samples, route: str, status: int) -> float:
    return value(samples, "etserve_requests_total", route=route, status=str(status))


def scrape_until(server, check, timeout: float = 5.0):
    """Scrape until `check(samples)` holds: a streamed request is counted when the server closes its body."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(server)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_a_chat_request_moves_every_counter_by_exactly_its_usage(server):
    before = scrape(server)
    r = requests.post(server.base_url + CHAT, timeout=120,
                      json={"messages": HI, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200
    usage = r.json()["usage"]
    after = scrape(server)

    assert requests_for(after, CHAT, 200) - requests_for(before, CHAT, 200) == 1
    assert value(after, "etserve_request_duration_seconds_count", route=CHAT) \
        - value(before, "etserve_request_duration_seconds_count", route=CHAT) == 1
    delta = {name: value(after, name) - value(before, name) for name in (
        "etserve_generated_tokens_total", "etserve_prompt_tokens_total", "etserve_prompt_tokens_cached_total",
        "etserve_generations_total", "etserve_time_to_first_token_seconds_count",
        "etserve_time_per_output_token_seconds_count", "etserve_time_per_output_token_seconds_sum")}
    assert delta["etserve_generated_tokens_total"] == usage["completion_tokens"] > 0
    assert delta["etserve_prompt_tokens_total"] == usage["prompt_tokens"] > 0
    assert delta["etserve_prompt_tokens_cached_total"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert delta["etserve_generations_total"] == 1
    assert delta["etserve_time_to_first_token_seconds_count"] == 1
    if usage["completion_tokens"] > 1:
        assert delta["etserve_time_per_output_token_seconds_count"] == 1
        assert 0 < delta["etserve_time_per_output_token_seconds_sum"] < 5
    assert ("etserve_queue_depth", ()) in after and ("etserve_generating", ()) in after
    assert value(after, "etserve_generating") == 0


def test_the_same_prompt_again_counts_a_cache_hit(server):
    body = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 4, "temperature": 0}
    requests.post(server.base_url + CHAT, json=body, timeout=120).raise_for_status()
    before = scrape(server)
    usage = requests.post(server.base_url + CHAT, json=body, timeout=120).json()["usage"]
    after = scrape(server)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert value(after, "etserve_prefix_cache_hits_total") - value(before, "etserve_prefix_cache_hits_total") == 1
    assert value(after, "etserve_prompt_tokens_cached_total") \
        - value(before, "etserve_prompt_tokens_cached_total") == cached


def test_a_streamed_request_is_counted_with_its_usage(server):
    before = scrape(server)
    with requests.post(server.base_url + CHAT, stream=True, timeout=120,
                       json={"messages": HI, "max_tokens": 10, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    usage = json.loads(events[-2])["usage"]
    after = scrape_until(server, lambda s: requests_for(s, CHAT, 200) > requests_for(before, CHAT, 200))
    assert requests_for(after, CHAT, 200) - requests_for(before, CHAT, 200) == 1
    assert value(after, "etserve_generated_tokens_total") \
        - value(before, "etserve_generated_tokens_total") == usage["completion_tokens"]
    assert value(after, "etserve_prompt_tokens_total") \
        - value(before, "etserve_prompt_tokens_total") == usage["prompt_tokens"]
    assert value(after, "etserve_time_to_first_token_seconds_count") \
        - value(before, "etserve_time_to_first_token_seconds_count") == 1


def test_the_gauges_are_read_live_during_a_generation(server):
    server.wait_idle()
    sock = open_stream(server, dict(LONG, stream=True))
    try:
        read_events(sock, 2)
        during = scrape(server)
        assert value(during, "etserve_generating") == 1
        assert value(during, "etserve_queue_depth") == 0
    finally:
        sock.close()
    server.wait_idle()
    assert value(scrape(server), "etserve_generating") == 0


def test_route_labels_are_templates_and_junk_paths_are_other(server):
    before = scrape(server)
    assert requests.get(server.base_url + "/v1/models/no-such-model-xyz", timeout=10).status_code == 404
    assert requests.get(server.base_url + "/no/such/path/abc", timeout=10).status_code == 404
    assert requests.get(server.base_url + "/models", timeout=10).status_code == 200
    after = scrape(server)
    assert requests_for(after, "/v1/models/{model_id}", 404) - requests_for(before, "/v1/models/{model_id}", 404) == 1
    assert requests_for(after, "other", 404) - requests_for(before, "other", 404) == 1
    assert requests_for(after, "/models", 200) - requests_for(before, "/models", 200) == 1
    routes = {dict(labels).get("route") for name, labels in after if name == "etserve_requests_total"}
    assert not any("xyz" in r or "abc" in r for r in routes), routes


@pytest.fixture(scope="module")
def keyed_open(make_server):
    return make_server({"ETSERVE_API_KEY": KEY})


@pytest.fixture(scope="module")
def keyed_closed(make_server):
    return make_server({"ETSERVE_API_KEY": KEY, "ETSERVE_METRICS_AUTH": "key"})


def test_with_an_api_key_metrics_are_open_by_default_and_count_refusals(keyed_open):
    before = scrape(keyed_open)
    assert requests.get(keyed_open.base_url + "/v1/models", timeout=10).status_code == 401
    after = scrape(keyed_open)
    assert requests_for(after, "/v1/models", 401) - requests_for(before, "/v1/models", 401) == 1


def test_metrics_auth_key_puts_metrics_behind_the_key(keyed_closed):
    r = requests.get(keyed_closed.base_url + "/metrics", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert requests.get(keyed_closed.base_url + "/metrics", headers={"Authorization": "Bearer wrong"},
                        timeout=10).status_code == 401
    samples = scrape(keyed_closed, headers={"Authorization": f"Bearer {KEY}"})
    assert requests_for(samples, "/metrics", 401) == 2
    assert requests.get(keyed_closed.base_url + "/health", timeout=10).status_code == 200


def test_an_unknown_metrics_auth_value_is_refused_at_start():
    from app.metrics import metrics_open

    assert metrics_open("open") is True and metrics_open("key") is False
    with pytest.raises(ValueError, match="metrics_auth"):
        metrics_open("yes")
