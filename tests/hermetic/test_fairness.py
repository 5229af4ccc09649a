"""The wait queue for a slot: requests are served in arrival order; a departed waiter never runs.

One slot here (ETSERVE_PARALLEL=1), so every request but the running one waits for it."""

from __future__ import annotations

import socket

from fakes.scripted import FakeModel

from .background import Background, call_with_socket, wait_for

ONE_SLOT = {"ETSERVE_PARALLEL": "1"}


def test_waiting_requests_run_in_arrival_order():
    fake = FakeModel(settings={"ETSERVE_MAX_QUEUE": "32", **ONE_SLOT})
    client = fake.client()
    fake.runtime.hold()
    order = [f"request {i}" for i in range(12)]
    try:
        first = Background(lambda: client.simulate_post("/v1/chat/completions",
                                                        json={"messages": [{"role": "user", "content": "first"}]}))
        wait_for(lambda: fake.engine.generating)
        waiters = []
        for i, text in enumerate(order):
            waiters.append(Background(lambda text=text: client.simulate_post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}], "max_tokens": 2})))
            wait_for(lambda: fake.engine.waiting == i + 1)  # in line before the next one arrives
    finally:
        fake.runtime.release()
    assert first.result().status_code == 200
    assert all(w.result().status_code == 200 for w in waiters)
    ran = [p.split("user\n")[1].split("<|im_end|>")[0] for p in fake.runtime.prompts]
    assert ran == ["first", *order]


def test_a_waiter_whose_client_left_never_runs_and_leaves_the_line():
    fake = FakeModel(settings=ONE_SLOT)
    client = fake.client()
    fake.runtime.hold()
    server_end, client_end = socket.socketpair()
    try:
        first = Background(lambda: client.simulate_post("/v1/chat/completions",
                                                        json={"messages": [{"role": "user", "content": "first"}]}))
        wait_for(lambda: fake.engine.generating)
        gone = Background(lambda: call_with_socket(client.app, "/v1/chat/completions",
                                                   {"messages": [{"role": "user", "content": "gone"}]}, server_end))
        wait_for(lambda: fake.engine.waiting == 1)
        later = Background(lambda: client.simulate_post("/v1/chat/completions",
                                                        json={"messages": [{"role": "user", "content": "later"}]}))
        wait_for(lambda: fake.engine.waiting == 2)
        client_end.close()  # the waiting client goes away
        wait_for(lambda: fake.engine.waiting == 1)  # it left the line while the engine was still busy
        gone.result()
    finally:
        fake.runtime.release()
        server_end.close()
    assert first.result().status_code == 200 and later.result().status_code == 200
    ran = [p.split("user\n")[1].split("<|im_end|>")[0] for p in fake.runtime.prompts]
    assert ran == ["first", "later"]
    assert fake.engine.waiting == 0


def test_a_newcomer_does_not_overtake_a_waiter_when_the_engine_frees_up():
    """The client that just finished asks again at once (an agent loop): the request that waited goes
    first. (A plain lock lets the newcomer barge in whenever it gets there before the waiter wakes.)"""
    from app.engine import GenerationRequest, SamplingParams

    fake = FakeModel(settings=ONE_SLOT)
    engine = fake.engine

    def generation(text: str):
        prompt = fake.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        return engine.generate(GenerationRequest(prompt, 2, SamplingParams(temperature=0), frozenset({fake.eos_id})))

    for round in range(5):
        first, again = generation(f"first {round}"), generation(f"again {round}")
        fake.runtime.prompts.clear()
        fake.runtime.hold()
        try:
            loop = Background(lambda: (list(first), list(again)))  # "again" starts the moment "first" ends
            wait_for(lambda: engine.generating)
            waiter = Background(lambda: list(generation(f"waiter {round}")))
            wait_for(lambda: engine.waiting == 1)
        finally:
            fake.runtime.release()
        loop.result(), waiter.result()
        ran = [p.split("user\n")[1].split("<|im_end|>")[0] for p in fake.runtime.prompts]
        assert ran == [f"first {round}", f"waiter {round}", f"again {round}"]
