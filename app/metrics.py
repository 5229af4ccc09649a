"""Prometheus metrics for GET /metrics: one registry per app, what it counts, and how it is fed.

Requests are observed by a Falcon middleware (`ObserveRequests`), labelled by the
route template they matched (unknown paths are "other"), so the label set stays
small whatever clients send. Generations are observed by the engine itself: it
calls `Metrics.observe_generation` with each finished generation's stats, the one
place every route's token counts and timings are known. The queue and generating
gauges are read from the engine at scrape time.

One gunicorn worker serves the app, so no multiprocess mode is needed.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import falcon
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.engine import Engine, GenerationStats
from app.settings import METRICS_AUTH_CHOICES

OTHER_ROUTE = "other"

# seconds: a request can wait in the queue for minutes; a token takes tens of milliseconds
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2)


def metrics_open(metrics_auth: str) -> bool:
    """Whether /metrics skips the API key (the `metrics_auth` setting: "open" or "key")."""
    if metrics_auth not in METRICS_AUTH_CHOICES:
        raise ValueError(f"metrics_auth must be one of {', '.join(METRICS_AUTH_CHOICES)}, got {metrics_auth!r}")
    return metrics_auth == "open"


class Metrics:
    """The app's own registry (never prometheus_client's global one) and the metrics in it."""

    def __init__(self, engine: Callable[[], Engine | None]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("etserve_requests", "HTTP requests by route template and status code",
                                ["route", "status"], registry=r)
        self.request_seconds = Histogram("etserve_request_duration_seconds",
                                         "Time from request to the last byte of the response, by route template",
                                         ["route"], buckets=REQUEST_BUCKETS, registry=r)
        self.prompt_tokens = Counter("etserve_prompt_tokens", "Prompt tokens of finished generations", registry=r)
        self.cached_tokens = Counter("etserve_prompt_tokens_cached",
                                     "Prompt tokens taken from the KV cache instead of prefilled", registry=r)
        self.cache_hits = Counter("etserve_prefix_cache_hits",
                                  "Generations that reused a prefix already in the KV cache", registry=r)
        self.generated_tokens = Counter("etserve_generated_tokens", "Tokens generated", registry=r)
        self.generations = Counter("etserve_generations", "Generations finished (or cancelled)", registry=r)
        self.first_token_seconds = Histogram(
            "etserve_time_to_first_token_seconds",
            "Time a generation took to its first token: waiting for the engine plus prefill",
            buckets=FIRST_TOKEN_BUCKETS, registry=r)
        self.token_seconds = Histogram(
            "etserve_time_per_output_token_seconds",
            "Mean gap between a generation's tokens after the first (one observation per generation of 2+ tokens)",
            buckets=TOKEN_BUCKETS, registry=r)

        def engine_value(read: Callable[[Engine], float]) -> Callable[[], float]:
            return lambda: float(read(e)) if (e := engine()) is not None else 0.0

        Gauge("etserve_queue_depth", "Requests waiting for a sequence slot right now",
              registry=r).set_function(engine_value(lambda e: e.waiting))
        Gauge("etserve_generating", "1 while the engine generates, else 0",
              registry=r).set_function(engine_value(lambda e: e.generating))
        Gauge("etserve_slots", "Sequence slots", registry=r).set_function(engine_value(lambda e: len(e.slots)))
        Gauge("etserve_slots_busy", "Sequence slots a request uses right now",
              registry=r).set_function(engine_value(lambda e: sum(1 for s in e.slots if s.busy)))
        self.queue_seconds = Histogram(
            "etserve_queue_wait_seconds",
            "Time from a generation's arrival to its first step: waiting for a slot and a turn "
            "(requests that timed out or left while waiting: their whole wait)",
            buckets=FIRST_TOKEN_BUCKETS, registry=r)
        r.register(_SlotCollector(engine))

    def observe_generation(self, stats: GenerationStats) -> None:
        self.queue_seconds.observe(stats.queued_ms / 1000)  # a request that gave up in line too
        if stats.slot is None:  # never ran (timed out or cancelled in line): no generation
            return
        self.generations.inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        if stats.cached_tokens:
            self.cache_hits.inc()
        self.generated_tokens.inc(stats.completion_tokens)
        if stats.completion_tokens:
            self.first_token_seconds.observe((stats.queued_ms + stats.prompt_ms) / 1000)
        if stats.completion_tokens > 1:
            self.token_seconds.observe(stats.decode_ms / 1000 / (stats.completion_tokens - 1))

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _SlotCollector:
    """Per-slot state and the step gate's counters, read from the engine at scrape time."""

    def __init__(self, engine: Callable[[], Engine | None]):
        self._engine = engine

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        e = self._engine()
        busy = GaugeMetricFamily("etserve_slot_busy", "1 while a request uses the slot", labels=["slot", "task"])
        used = GaugeMetricFamily("etserve_slot_context_tokens", "Positions of the slot's context filled",
                                 labels=["slot"])
        steps = CounterMetricFamily("etserve_steps", "Forward steps run (prefill chunks and decode steps)")
        handovers = CounterMetricFamily("etserve_step_handovers",
                                        "Steps handed to another sequence than the one that ran the last")
        shared = CounterMetricFamily("etserve_steps_shared",
                                     "Decode steps that went along in another sequence's forward call (batched decode)")
        drafted = CounterMetricFamily("etserve_draft_tokens", "Tokens guessed by speculative decoding and checked")
        accepted = CounterMetricFamily("etserve_draft_accepted_tokens",
                                       "Guessed tokens the model agreed with (each saves a decode step)")
        kv = GaugeMetricFamily("etserve_slot_kv_bytes", "Bytes of the slot's KV caches in memory", labels=["slot"])
        budget = GaugeMetricFamily("etserve_kv_cache_budget_bytes",
                                   "Bytes the slots' KV caches keep in all once their requests end (--kv-cache-mib)")
        trimmed = CounterMetricFamily("etserve_kv_trimmed_positions",
                                      "Cached positions idle slots gave back to stay within --kv-cache-mib")
        if e is not None:
            for s in e.slots:
                busy.add_metric([str(s.index), s.task or "idle"], 1.0 if s.busy else 0.0)
                used.add_metric([str(s.index)], float(len(s.tokens)))
            for m in e.slot_memory():
                kv.add_metric([str(m["id"])], float(m["resident_bytes"]))
            budget.add_metric([], float(e.kv_budget() or 0))
            trimmed.add_metric([], float(e.kv_trimmed))
            steps.add_metric([], float(e.steps.steps))
            handovers.add_metric([], float(e.steps.handovers))
            shared.add_metric([], float(e.steps.shared))
            drafted.add_metric([], float(e.drafted))
            accepted.add_metric([], float(e.draft_accepted))
        yield from (busy, used, kv, budget, trimmed, steps, handovers, shared, drafted, accepted)


class ObserveRequests:
    """Falcon middleware, first in the chain: counts and times every request.

    A streamed body is timed to its end: the response's stream is wrapped so the
    observation happens when the server closes it (finished or client gone).
    `find_route(path)` names the route template of paths that middleware refused
    before routing (401, 503), so they still count under their route.
    """

    def __init__(self, metrics: Metrics, find_route: Callable[[str], str | None]):
        self.metrics = metrics
        self.find_route = find_route

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.metrics_started = time.perf_counter()

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource, req_succeeded: bool) -> None:
        started = getattr(req.context, "metrics_started", None) or time.perf_counter()
        route = req.uri_template or self.find_route(req.path) or OTHER_ROUTE
        status = resp.status_code

        def observe() -> None:
            self.metrics.observe_request(route, status, time.perf_counter() - started)

        if resp.stream is not None and not hasattr(resp.stream, "read"):
            resp.stream = ObservedStream(resp.stream, observe)
        else:
            observe()


class ObservedStream:
    """A response body that calls `on_close` once, when the server closes it."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]):
        self._body = body
        self._on_close = on_close

    def __iter__(self):
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()


class MetricsResource:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = self.metrics.exposition()


def route_finder(router: falcon.routing.CompiledRouter) -> Callable[[str], str | None]:
    """The route template `router` would match for a path, or None."""

    def find(path: str) -> str | None:
        found = router.find(path)
        return found[3] if found else None

    return find
