"""deploy/nginx.conf and deploy/nginx-replicas.conf, run by a real nginx in front of real servers.

nginx runs in the foreground as a child of the test, with every path it writes under the
test's temporary directory; the deploy files are included as they are, with only their
addresses, port and log path replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from .streams import LONG

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

pytestmark = pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx is not installed (make system-packages)")


def render(template: Path, replacements: dict[str, str]) -> str:
    """The deploy file with each placeholder replaced; a placeholder the file lacks is an error."""
    text = template.read_text()
    for old, new in replacements.items():
        assert old in text, f"{template.name} no longer contains {old!r}: update the test's replacements"
        text = text.replace(old, new)
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx in the foreground on a free loopback port, serving one deploy file."""

    def __init__(self, workdir: Path, site: str):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.access_log = workdir / "access.log"
        self.error_log = workdir / "error.log"
        (workdir / "etserve.conf").write_text(site.replace("__LISTEN__", f"127.0.0.1:{self.port}")
                                              .replace("__ACCESS_LOG__", str(self.access_log)))
        temp = "\n".join(f"    {kind}_temp_path {workdir / kind};"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # as root, nginx's workers would switch to `nobody`, who cannot enter pytest's directories
        user = "user root;\n" if os.geteuid() == 0 else ""
        # a main config as an admin might have it: gzip on, and for more than HTML
        (workdir / "nginx.conf").write_text(
            f"{user}worker_processes 1;\nevents {{ worker_connections 256; }}\n"
            f"http {{\n{temp}\n    gzip on;\n    gzip_types text/event-stream application/json;\n"
            f"    gzip_min_length 0;\n    include {workdir / 'etserve.conf'};\n}}\n")
        self.cmd = [NGINX, "-p", str(workdir), "-c", str(workdir / "nginx.conf"),
                    "-g", f"daemon off; pid {workdir / 'nginx.pid'}; error_log {self.error_log} info;"]
        check = subprocess.run([*self.cmd, "-t"], capture_output=True, text=True)
        assert check.returncode == 0, f"nginx -t refused the config:\n{check.stderr}"
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            assert self.proc.poll() is None, f"nginx exited: {self.proc.stderr.read().decode()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start listening"
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def site_replacements(upstreams: list[str]) -> dict[str, str]:
    return {"listen 8080;": "listen __LISTEN__;",
            "/var/log/nginx/etserve.access.log": "__ACCESS_LOG__",
            **{f"server 127.0.0.1:{8000 + i if len(upstreams) == 1 else 8001 + i};": f"server {u};"
               for i, u in enumerate(upstreams)}}


@pytest.fixture(scope="module")
def proxy(server, tmp_path_factory):
    site = render(DEPLOY / "nginx.conf", site_replacements([f"127.0.0.1:{server.port}"]))
    nginx = Nginx(tmp_path_factory.mktemp("nginx"), site)
    yield nginx
    nginx.stop()


def post_raw(port: int, body: dict, headers: dict[str, str] | None = None,
             path: str = "/v1/chat/completions") -> socket.socket:
    payload = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\n" + extra + b"Content-Length: " + str(len(payload)).encode()
                 + b"\r\n\r\n" + payload)
    return sock


def stream_timing(base_url: str, max_tokens: int = 64) -> tuple[list[float], bytes]:
    """Arrival time (since the request) of each SSE data event of a streamed completion, read
    as the bytes come in (decompressed, should the proxy compress them), and the body."""
    times, data = [], b""
    t0 = time.perf_counter()
    with requests.post(base_url + "/v1/chat/completions", json={**LONG, "stream": True, "max_tokens": max_tokens},
                       stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for chunk in r.iter_content(chunk_size=None):
            now = time.perf_counter() - t0
            data += chunk
            times += [now] * (data.count(b"data: ") - len(times))
    return times, data


# --- one server behind deploy/nginx.conf ---------------------------------------------------------


def test_stream_arrives_token_by_token_through_nginx(proxy, server):
    server.wait_idle()
    times, data = stream_timing(proxy.base_url)
    assert data.endswith(b"data: [DONE]\n\n")
    content = data.count(b'"content"')
    assert content >= 33, f"only {content} content chunks: the test needs a long generation"
    first_content, last = times[1], times[-1]  # times[0] is the role chunk
    print(f"through nginx: first content chunk at {first_content:.3f} s, [DONE] at {last:.3f} s, "
          f"{len(set(times))} distinct arrivals for {len(times)} events")
    assert first_content < 0.5 * last, f"first chunk at {first_content:.2f} s, last at {last:.2f} s: buffered"
    # the events came in many separate reads spread over the generation, not in a few bursts: one
    # read a decode step at least (a step emits its accepted drafts with its token, together)
    accepted = sum(int(n) for n in re.findall(rb'"draft_n_accepted":\s*(\d+)', data))
    assert len(set(times)) >= (content - accepted) // 2


def test_a_buffering_proxy_would_fail_that_test(server, tmp_path):
    """The control: the same measurement through nginx buffering (and ignoring etserve's
    X-Accel-Buffering header) with the main config's gzip on sees the stream held back."""
    site = render(DEPLOY / "nginx.conf", {**site_replacements([f"127.0.0.1:{server.port}"]), "gzip off;": "",
                                           "proxy_buffering off;": "proxy_buffering on; "
                                           "proxy_ignore_headers X-Accel-Buffering;"})
    nginx = Nginx(tmp_path, site)
    try:
        server.wait_idle()
        times, data = stream_timing(nginx.base_url)
    finally:
        nginx.stop()
    print(f"buffering nginx: first content chunk at {times[1]:.3f} s, [DONE] at {times[-1]:.3f} s")
    assert data.endswith(b"data: [DONE]\n\n")
    assert times[1] >= 0.5 * times[-1]


def _abandon_through_nginx(proxy, server, body: dict, wait_for) -> tuple[int, int, int]:
    """Send `body` through nginx, let `wait_for(sock, start)` see it generate, hang up;
    returns (forward calls at the start, at the hang-up, once the server is idle)."""
    server.wait_idle()
    start = server.health()["engine"]["forward_calls"]
    sock = post_raw(proxy.port, body)
    wait_for(sock, start)
    sock.close()
    at_close = server.health()["engine"]["forward_calls"]
    after = server.wait_idle()["engine"]["forward_calls"]
    return start, at_close, after


def test_client_leaving_a_stream_through_nginx_stops_generation(proxy, server):
    def read_three(sock, start):
        data = b""
        while data.count(b'"content"') < 4:
            chunk = sock.recv(65536)
            assert chunk, "stream ended early"
            data += chunk

    start, at_close, after = _abandon_through_nginx(proxy, server, {**LONG, "stream": True}, read_three)
    print(f"stream: {at_close - start} forward calls before the hang-up, {after - at_close} after")
    assert after - at_close <= 2, f"decoded {after - at_close} steps after the client left"
    assert after - start < LONG["max_tokens"] // 2


def test_client_leaving_a_plain_request_through_nginx_stops_generation(proxy, server):
    def generating(sock, start):
        deadline = time.monotonic() + 60
        while server.health()["engine"]["forward_calls"] - start < 5:
            assert time.monotonic() < deadline, "generation did not start"
            time.sleep(0.02)

    start, at_close, after = _abandon_through_nginx(proxy, server, LONG, generating)
    print(f"non-streaming: {at_close - start} forward calls before the hang-up, {after - at_close} after")
    assert after - at_close <= 3, f"decoded {after - at_close} steps after the client left"
    assert after - start < LONG["max_tokens"] // 2
    # nginx logged the abandoned request as 499 (client closed), and the server still answers
    deadline = time.monotonic() + 5
    while " 499 " not in proxy.access_log.read_text():
        assert time.monotonic() < deadline, proxy.access_log.read_text()[-2000:]
        time.sleep(0.05)
    r = requests.post(proxy.base_url + "/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200


def _wait_for_line(path: Path, needle: str, timeout: float = 5) -> str:
    deadline = time.monotonic() + timeout
    while True:
        for line in path.read_text(errors="replace").splitlines():
            if needle in line:
                return line
        assert time.monotonic() < deadline, f"no line with {needle!r} in {path}"
        time.sleep(0.05)


def test_request_id_and_client_address_reach_the_server(proxy, server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    # none given: nginx makes one, and nginx, etserve and the response agree on it
    r = requests.post(proxy.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200
    rid = r.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid), rid
    nginx_line = _wait_for_line(proxy.access_log, f"rid={rid}")
    assert f"up=127.0.0.1:{server.port}" in nginx_line
    server_line = _wait_for_line(server.log_path, f"rid={rid}")
    assert "fwd=127.0.0.1" in server_line
    usage = r.json()["usage"]
    assert f"prompt={usage['prompt_tokens']} " in server_line
    assert f"completion={usage['completion_tokens']} " in server_line
    # the client's own id goes through
    r = requests.post(proxy.base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Request-Id": "client-chosen-7"})
    assert r.headers["X-Request-Id"] == "client-chosen-7"
    _wait_for_line(server.log_path, "rid=client-chosen-7")
    # one etserve would not take (it would log an id of its own) becomes nginx's: both logs agree
    r = requests.post(proxy.base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Request-Id": "my id fwd=9.9.9.9"})
    rid = r.headers["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid), rid
    _wait_for_line(proxy.access_log, f"rid={rid}")
    _wait_for_line(server.log_path, f"rid={rid}")


def length(response: bytes) -> int:
    return int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", response).group(1))


def test_oversized_body_is_refused_by_nginx_as_an_openai_error(proxy):
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000000\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < length(data):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert re.search(rb"(?i)\r\nx-request-id: *[0-9a-f]{32}", head)


def test_nginx_answers_the_messages_api_in_anthropics_error_shape(proxy):
    """nginx's own 413 on /v1/messages: Anthropic's envelope, which the anthropic SDK parses."""
    import anthropic

    client = anthropic.Anthropic(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(anthropic.APIStatusError) as e:
        client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x" * 5_000_000}])
    assert e.value.status_code == 413 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error" and "4 MiB" in e.value.body["error"]["message"]


# --- two replicas behind deploy/nginx-replicas.conf ----------------------------------------------


@pytest.fixture(scope="module")
def replicas(server, model_dir, tmp_path_factory):
    """The shared server and a second one, each loading its own model, behind nginx."""
    second = type(server)(model_dir)  # conftest's Server
    try:
        second.wait_ready()
        servers = [server, second]
        site = render(DEPLOY / "nginx-replicas.conf",
                      site_replacements([f"127.0.0.1:{s.port}" for s in servers]))
        nginx = Nginx(tmp_path_factory.mktemp("nginx-replicas"), site)
        try:
            yield nginx, servers
        finally:
            nginx.stop()
    finally:
        second.stop()


def _counts(servers) -> list[int]:
    return [s.health()["engine"]["requests"] for s in servers]


def _ask(nginx, servers, headers: dict[str, str]) -> int:
    """One short completion through nginx; the index of the replica that generated it."""
    before = _counts(servers)
    r = requests.post(nginx.base_url + "/v1/chat/completions", headers=headers, timeout=60,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert r.status_code == 200, r.text
    delta = [a - b for a, b in zip(_counts(servers), before)]
    assert sorted(delta) == [0, 1], f"request counters moved by {delta}"
    return delta.index(1)


def test_a_session_keeps_its_replica(replicas):
    nginx, servers = replicas
    for session in ("conversation-A", "conversation-B"):
        homes = {_ask(nginx, servers, {"X-Session-ID": session}) for _ in range(4)}
        assert len(homes) == 1, f"{session} went to replicas {homes}"
        home = homes.pop()
        # the other session headers name the same session, in their order of precedence
        assert _ask(nginx, servers, {"X-ExecuTorch-Session-ID": session}) == home
        assert _ask(nginx, servers, {"x-session-affinity": session}) == home
        assert _ask(nginx, servers, {"X-ExecuTorch-Session-ID": session,
                                     "x-session-affinity": "something-else"}) == home


def test_sessions_spread_over_replicas(replicas):
    nginx, servers = replicas
    homes = [_ask(nginx, servers, {"X-Session-ID": f"session-{i}"}) for i in range(16)]
    print(f"16 sessions: {homes.count(0)} on replica 0, {homes.count(1)} on replica 1")
    assert set(homes) == {0, 1}


def test_requests_without_session_go_to_the_idle_replica(replicas):
    nginx, servers = replicas
    # one at a time, they take turns
    homes = [_ask(nginx, servers, {}) for _ in range(4)]
    assert set(homes) == {0, 1}, homes
    # while one replica generates a long answer, the next request goes to the other
    for s in servers:
        s.wait_idle()
    sock = post_raw(nginx.port, {**LONG, "stream": True, "max_tokens": 60})
    try:
        data = b""
        while data.count(b'"content"') < 3:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        busy = [s.health()["engine"]["generating"] for s in servers]
        assert busy.count(True) == 1
        for _ in range(2):
            assert _ask(nginx, servers, {}) == busy.index(False)
    finally:
        sock.close()
    for s in servers:
        s.wait_idle()
