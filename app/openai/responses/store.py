"""Finished responses kept for GET /v1/responses/{id} and `previous_response_id`:
a bounded in-memory LRU (--responses-store-size entries), least recently used first out."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as it was returned
    history: list[dict[str, Any]]  # the conversation up to and including its output, as chat messages
    session_id: str | None  # the KV session its conversation continues in


class ResponseStore:
    def __init__(self, max_entries: int):
        self.max_entries = max(0, int(max_entries))
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            key = entry.response["id"]
            self._entries.pop(key, None)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None
