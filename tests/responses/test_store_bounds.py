"""The Responses store: bounded in bytes as well as entries, one client's entries its own."""

from __future__ import annotations

from app.openai.responses.store import ResponseStore, StoredResponse, entry_bytes


def _entry(i: int, size: int = 100, owner: str | None = None) -> StoredResponse:
    return StoredResponse({"id": f"resp_{i}", "output": "x" * size}, [{"role": "user", "content": "y" * size}],
                          None, owner)


def test_store_is_bounded_by_bytes():
    one = entry_bytes(_entry(0).response, _entry(0).history)
    store = ResponseStore(max_entries=1000, max_bytes=one * 10)
    for i in range(100):
        assert store.put(_entry(i))
    assert 9 <= len(store) <= 10 and store.used_bytes <= one * 10  # ids of two digits are a byte longer
    assert store.get("resp_99") is not None and store.get("resp_89") is None  # least recently used went


def test_an_entry_over_a_quarter_of_the_budget_is_not_kept():
    store = ResponseStore(max_entries=10, max_bytes=4000)
    assert store.put(_entry(1, size=100))
    assert not store.put(_entry(2, size=600))  # a long chain's history: refused, the others stay
    assert store.get("resp_2") is None and store.get("resp_1") is not None


def test_bytes_are_given_back_on_delete_and_replace():
    store = ResponseStore(max_entries=10, max_bytes=10**6)
    store.put(_entry(1))
    store.put(_entry(1))
    assert len(store) == 1 and store.used_bytes == entry_bytes(_entry(1).response, _entry(1).history)
    assert store.delete("resp_1") and store.used_bytes == 0


def test_a_client_sees_only_its_own_entries():
    store = ResponseStore(max_entries=10, max_bytes=10**6)
    store.put(_entry(1, owner="alice"))
    assert store.get("resp_1", "alice") is not None
    assert store.get("resp_1", "bob") is None and store.get("resp_1") is None
    assert not store.delete("resp_1", "bob") and store.get("resp_1", "alice") is not None


def test_output_items_are_found_by_id_while_their_response_is_kept():
    def entry(i: int, owner: str | None = None) -> StoredResponse:
        output = [{"id": f"msg_{i}", "type": "message", "role": "assistant", "content": []},
                  {"id": f"fc_{i}", "type": "function_call", "call_id": f"call_{i}", "name": "f", "arguments": "{}"}]
        return StoredResponse({"id": f"resp_{i}", "output": output}, [], None, owner)

    store = ResponseStore(max_entries=2)
    store.put(entry(1))
    store.put(entry(2, owner="alice"))
    assert store.item("fc_1")["call_id"] == "call_1" and store.item("msg_1")["type"] == "message"
    assert store.item("msg_2") is None and store.item("msg_2", "alice")["id"] == "msg_2"  # another's is unknown
    store.put(entry(3))  # resp_1 is evicted, and its items with it
    assert store.item("fc_1") is None and store.item("fc_3") is not None
    store.delete("resp_3")
    assert store.item("fc_3") is None and store.item("nope") is None
    store.put(entry(2, owner="alice"))  # replaced: still found once
    assert store.item("fc_2", "alice")["id"] == "fc_2"
