"""--context-shift keeps the system turn by default: chat tells the engine how many of the prompt's
tokens are the system turn, and a shift never drops them."""

from __future__ import annotations

from fakes.scripted import FakeModel


def test_a_shift_keeps_the_system_turn():
    fake = FakeModel(settings={"ETSERVE_CONTEXT_SHIFT": "1"}, max_seq_len=96)
    try:
        fake.script.default(["word"], then="repeat")  # whatever the (shifted) prompt, more words
        system = "You are a very careful assistant"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello " + "there " * 10}]
        r = fake.client().simulate_post("/v1/chat/completions", json={"messages": messages, "max_tokens": 150})
        assert r.status_code == 200, r.text
        assert r.json["usage"]["completion_tokens"] == 150  # past the 96-token context: it shifted
        system_turn = fake.encode(fake.served.template.render([messages[0]], add_generation_prompt=False))
        kept = fake.engine.slots[0].tokens[:len(system_turn)]
        assert len(system_turn) > 5 and kept == system_turn
    finally:
        fake.runtime.release()
        fake.close()
