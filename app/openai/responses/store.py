"""Finished responses kept for GET /v1/responses/{id} and `previous_response_id`: a bounded
in-memory LRU, least recently used first out.

Two bounds: --responses-store-size entries and --responses-store-mib of memory, counted as the
bytes of each entry's JSON (the response as returned, which echoes the request's tools, metadata
and instructions, and the conversation it continues). A chain of previous_response_id holds its
whole history in its newest entry, so the byte bound also bounds chains: an entry alone larger
than a quarter of the budget is not kept (continuing from it is a 404 that says why), and the
conversation's own length is bounded by the model's context (a longer one is a 400 anyway).

Each entry records its owner (the client's credential, app/auth.py); a client sees only the
entries it created.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("etserve")

# An entry may take at most this share of the byte budget, so one huge chain cannot evict all others.
MAX_ENTRY_SHARE = 4


def entry_bytes(response: dict[str, Any], history: list[dict[str, Any]]) -> int:
    """What an entry costs: its JSON's length (an upper bound on shared parts, a fair one on the rest)."""
    return len(json.dumps(response, ensure_ascii=False, default=str)) + \
        len(json.dumps(history, ensure_ascii=False, default=str))


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as it was returned
    history: list[dict[str, Any]]  # the conversation up to and including its output, as chat messages
    session_id: str | None  # the KV session its conversation continues in
    owner: str | None = None  # the client that created it (None: no API keys, one client)
    nbytes: int = field(default=0, compare=False)


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int | None = None):
        self.max_entries = max(0, int(max_entries))
        self.max_bytes = None if max_bytes is None else max(0, int(max_bytes))
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self._items: dict[str, str] = {}  # an output item's id -> the response holding it
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def fits(self, nbytes: int) -> bool:
        return self.max_bytes is None or nbytes * MAX_ENTRY_SHARE <= self.max_bytes

    def put(self, entry: StoredResponse) -> bool:
        """Keep `entry`, evicting the least recently used; False when it is not kept (too large)."""
        if self.max_entries == 0 or self.max_bytes == 0:
            return False
        nbytes = entry.nbytes or entry_bytes(entry.response, entry.history)
        if not self.fits(nbytes):
            log.info("responses: %s (%d bytes) is over a 1/%d share of --responses-store-mib and is not kept",
                     entry.response.get("id"), nbytes, MAX_ENTRY_SHARE)
            return False
        entry = StoredResponse(entry.response, entry.history, entry.session_id, entry.owner, nbytes)
        with self._lock:
            key = entry.response["id"]
            old = self._entries.pop(key, None)
            if old is not None:
                self._forget(old)
            self._entries[key] = entry
            self._bytes += nbytes
            for item in _output_items(entry):
                self._items[item["id"]] = key
            while self._entries and (len(self._entries) > self.max_entries
                                     or (self.max_bytes is not None and self._bytes > self.max_bytes)):
                _, evicted = self._entries.popitem(last=False)
                self._forget(evicted)
        return True

    def _forget(self, entry: StoredResponse) -> None:
        self._bytes -= entry.nbytes
        key = entry.response["id"]
        for item in _output_items(entry):
            if self._items.get(item["id"]) == key:
                del self._items[item["id"]]

    def item(self, item_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """An output item of a stored response (what an item_reference names), if `owner` created it."""
        with self._lock:
            key = self._items.get(item_id)
            entry = self._entries.get(key) if key is not None else None
            if entry is None or entry.owner != owner:
                return None
            return next((i for i in _output_items(entry) if i["id"] == item_id), None)

    def get(self, response_id: str, owner: str | None = None) -> StoredResponse | None:
        """The entry, if `owner` created it (another client's id is as unknown as a wrong one)."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry.owner != owner:
                return None
            self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str, owner: str | None = None) -> bool:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry.owner != owner:
                return False
            del self._entries[response_id]
            self._forget(entry)
            return True


def _output_items(entry: StoredResponse) -> list[dict[str, Any]]:
    return [i for i in entry.response.get("output") or () if isinstance(i, dict) and isinstance(i.get("id"), str)]
