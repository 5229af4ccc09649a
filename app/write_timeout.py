"""A client that stops reading loses its connection: every blocking send (and read) on a
client's socket gives up after --write-timeout seconds.

Without it a client that stops reading a stream (keep-alives off, or a body too big for its
buffers) blocks the server's write forever, and its generation holds the engine for as long.
gunicorn hands the app the client socket (environ["gunicorn.socket"]); a gevent socket with a
timeout raises socket.timeout from a sendall that made no progress for that long. gunicorn then
drops the connection and closes the response body, which cancels the generation
(app/http/sse.py's on_abandon, the cancel token's close).
"""

from __future__ import annotations

import socket

import falcon

# The kernel's send buffer for one client (Linux doubles it): plenty for a LAN (512 KiB in flight
# is 4 Gbit/s at 1 ms), and it keeps what a client that stops reading holds bounded. Without it
# autotuning lets each connection buffer up to tcp_wmem's maximum (4 MiB by default): a whole
# long stream, written into a buffer nobody drains, before a write ever blocks.
SEND_BUFFER = 256 * 1024


class WriteTimeout:
    def __init__(self, seconds: float, send_buffer: int = SEND_BUFFER):
        self.seconds = seconds
        self.send_buffer = send_buffer

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        sock = req.env.get("gunicorn.socket")
        if sock is None:
            return
        try:
            if self.send_buffer:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
            if self.seconds > 0:
                sock.settimeout(self.seconds)
        except OSError:  # already closed (or not a TCP socket): nothing to bound
            pass
