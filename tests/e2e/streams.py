"""Raw-socket helpers for tests that need to hang up on the server mid-request."""

from __future__ import annotations

import json
import socket

LONG = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "temperature": 0, "max_tokens": 200}


def open_stream(server, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def read_events(sock: socket.socket, n: int) -> bytes:
    """Read until `n` content events have arrived."""
    data = b""
    while data.count(b'"content"') < n + 1:  # +1: the role chunk carries "content": ""
        chunk = sock.recv(65536)
        assert chunk, "stream ended early"
        data += chunk
    return data
