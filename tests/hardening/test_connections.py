"""Hostile clients on raw sockets, against a real proxy on loopback: connections that idle, send
their headers a byte at a time, never finish their body, or outnumber the file descriptors.
Each is closed (or refused with a 503) at its bound, and the proxy keeps serving."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy.connections import CONNECTIONS
from tests.conftest import ALICE, live_messages
from tests.fakes.fake_upstream import Reply
from tests.support.harness import ProxyProcess, merge_sections, wait_until, write_config

AUTH = {"Authorization": f"Bearer {ALICE}"}
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
FAST = {"header_timeout_s": 0.5, "keepalive_timeout_s": 0.5, "body_timeout_s": 0.5}


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(0.05)
    return sock


RECEIVED: dict[int, bytes] = {}  # per socket (fileno): what it got so far


def closed_by_server(sock: socket.socket) -> bytes | None:
    """Everything the server sent, once it has closed the connection; None while it is open."""
    key = sock.fileno()
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return RECEIVED.pop(key, b"")
        RECEIVED[key] = RECEIVED.get(key, b"") + chunk


def answered(sock: socket.socket, request: bytes) -> bytes:
    """Send one keep-alive request and read its whole answer (a small JSON body)."""
    sock.sendall(request)
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    sock.settimeout(0.05)
    return head + b"\r\n\r\n" + body


def test_headers_sent_a_byte_at_a_time_are_cut_at_header_timeout_s(make_proxy):
    proxy = make_proxy(server=FAST)
    sock = connect(proxy.port)
    started, sent = time.monotonic(), 0
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    answer = None
    try:
        while answer is None and sent < len(request):
            sock.sendall(request[sent : sent + 1])  # the attack: one byte every 50 ms
            sent += 1
            answer = closed_by_server(sock)
    except (BrokenPipeError, ConnectionResetError):
        answer = b""
    assert answer == b"", answer  # closed unanswered, before the headers were complete
    assert sent < len(request)
    assert time.monotonic() - started < 5
    assert httpx.get(f"{proxy.url}/healthz").status_code == 200


def test_a_connection_that_sends_nothing_is_closed_at_header_timeout_s(make_proxy):
    proxy = make_proxy(server=FAST)
    sock = connect(proxy.port)
    assert wait_until(lambda: closed_by_server(sock) is not None, timeout=5, what="the server to close") is not None


def test_an_idle_keepalive_connection_is_closed_at_keepalive_timeout_s(make_proxy):
    proxy = make_proxy(server={**FAST, "header_timeout_s": 60})
    sock = connect(proxy.port)
    assert answered(sock, HEALTHZ).startswith(b"HTTP/1.1 200")
    assert answered(sock, HEALTHZ).startswith(b"HTTP/1.1 200")  # kept alive between requests
    wait_until(lambda: closed_by_server(sock) is not None, timeout=5, what="the idle connection to close")


def test_a_body_that_never_arrives_is_a_408_at_body_timeout_s(make_proxy, upstream):
    proxy = make_proxy(server=FAST)
    sock = connect(proxy.port)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + ALICE.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"model\": "
    )
    answer = wait_until(lambda: closed_by_server(sock) or None, timeout=5, what="a 408 and the connection closed")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"
    assert upstream.requests == []


def test_a_body_that_comes_in_many_pieces_is_read_whole(make_proxy, upstream):
    """The middleware reads the body itself (joined once, see read_body): every piece of a chunked
    upload is in what the handler parses, stores and forwards."""
    proxy = make_proxy()
    task = "".join(f"line {i}: {'é' * (i % 7)}\n" for i in range(20_000))  # ~300 KB, multi-byte characters across piece edges
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": task}]}).encode()

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), 4_099):
            yield body[i : i + 4_099]

    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        answer = http.post(
            "/v1/chat/completions", content=pieces(),
            headers={**AUTH, "Content-Type": "application/json", "X-Conversation-ID": "pieces"},
        )
        assert answer.status_code == 200, answer.text
        stored = live_messages(http, "pieces", ALICE)
    assert stored[0] == {"role": "user", "content": task}
    assert upstream.chat_requests()[-1]["messages"][0]["content"] == task


def test_past_max_connections_busy_ones_are_kept_and_the_newcomer_gets_a_503(make_proxy, upstream):
    proxy = make_proxy(server={"max_connections": 2})
    held = [Reply.text("slow reply", pause_after_chunks=1) for _ in range(2)]
    upstream.enqueue(*held)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hold"}], "stream": True}
    clients = [httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) for _ in range(2)]
    streams = []
    try:
        for i, (client, reply) in enumerate(zip(clients, held, strict=True)):
            stream = client.stream(
                "POST", "/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": f"busy-{i}"}
            )
            streams.append(stream)
            assert stream.__enter__().status_code == 200
            assert reply.reached.wait(10)
        refused = httpx.get(f"{proxy.url}/healthz")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_busy"
        assert refused.headers["connection"] == "close"
    finally:
        for reply in held:
            reply.release()
        for stream in streams:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
    assert wait_until(lambda: httpx.get(f"{proxy.url}/healthz").status_code == 200, what="a free connection")


def test_past_max_connections_the_longest_idle_one_makes_room(make_proxy):
    proxy = make_proxy(server={"max_connections": 2})
    idle = [connect(proxy.port) for _ in range(2)]
    for sock in idle:
        assert answered(sock, HEALTHZ).startswith(b"HTTP/1.1 200")
    # A new client is served once an idle connection is old enough to be closed for it.
    wait_until(lambda: httpx.get(f"{proxy.url}/healthz").status_code == 200, what="room made for a new client")
    assert [closed_by_server(sock) for sock in idle].count(b"") >= 1


@pytest.fixture
def fd_limited(tmp_path: Path, upstream) -> Iterator[ProxyProcess]:
    """`python -m proxy serve` under a hard limit of 256 open files (its soft limit is raised to
    that at start)."""
    config = merge_sections(
        {"upstream": {"base_url": upstream.base_url}, "storage": {"path": str(tmp_path / "data")}}, {}
    )
    path = write_config(tmp_path / "config.yaml", **config)
    argv = ["prlimit", "--nofile=128:256", sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", "0"]
    proc = ProxyProcess(path, tmp_path / "proxy.log", argv=argv).start()
    yield proc
    proc.stop()


def test_more_idle_connections_than_file_descriptors_take_nothing_offline(fd_limited):
    """Issue 12: 1,100 idle connections against a 1,024 fd limit took the proxy offline (a normal
    request timed out) and flooded the log at ~7,500 lines/s."""
    proc = fd_limited
    started = time.monotonic()
    sockets = []
    for _ in range(400):  # far more than the 256 descriptors the proxy may have
        try:
            sockets.append(socket.create_connection(("127.0.0.1", proc.port), timeout=2))
        except OSError:
            break
    assert len(sockets) > 256
    wait_until(lambda: _healthz(proc.port) == 200, timeout=15, what="a normal request served")
    fds = len(list(Path(f"/proc/{proc.proc.pid}/fd").iterdir()))
    assert fds < 256
    lines = proc.log_path.read_text().splitlines()
    limits = next(json.loads(line) for line in lines if '"connection limits"' in line)
    assert limits["fd_limit"] == 256 and limits["max_connections"] == 256 - 64 - 100 - 32
    accept_errors = [line for line in lines if "accept()" in line]
    assert len(accept_errors) <= time.monotonic() - started + 2
    for sock in sockets:
        sock.close()


def _healthz(port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def switches(pid: int) -> int:
    """Context switches of every thread of `pid` so far: a process that sleeps makes none."""
    total = 0
    for tid in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (tid / "status").read_text()
        except FileNotFoundError:  # a thread that just ended
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if line.endswith(tuple("0123456789"))
                     and line.split(":")[0] in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    return total


def asleep_over(pid: int, window_s: float) -> bool:
    """True if `pid` made no context switch over `window_s` (a measuring window, not a wait)."""
    before = switches(pid)
    time.sleep(window_s)
    return switches(pid) == before


def test_an_idle_proxy_sleeps_and_the_next_client_wakes_its_housekeeping(processes, upstream):
    """With nothing to do, no timer wakes the process: the connection sweep (every 0.5 s here)
    and the malloc trimmer (every 0.05 s here) used to, for good (an idle proxy on this project's
    VM spent ~30 ms of CPU a second on it). A keep-alive connection left open between turns is
    aiohttp's to close; a new connection that sends nothing wakes the sweep, which closes it."""
    (proc,) = processes(server={"header_timeout_s": 2, "keepalive_timeout_s": 60, "malloc_trim_interval_s": 0.2})
    assert proc.proc is not None
    pid = proc.proc.pid
    upstream.responder = lambda body: Reply.text("ok")
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=30) as http:  # its connection stays open
        assert http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": "idle"}).status_code == 200
        wait_until(lambda: asleep_over(pid, 1.2), timeout=20, what="the proxy asleep")
        silent = connect(proc.port)
        wait_until(lambda: closed_by_server(silent) is not None, timeout=10, what="the silent connection closed")
        wait_until(lambda: asleep_over(pid, 1.2), timeout=20, what="the proxy asleep again")
        body["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
        assert http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": "idle"}).status_code == 200


def test_requests_whose_headers_come_whole_do_not_wake_the_sweep_each_second(make_proxy):
    """An agent's turns come seconds apart over one keep-alive connection, each request's headers
    whole at once. The sweep used to look at every connection once a second while any turn had
    started within it; it now wakes at the earliest deadline (here 30 s away), and a request
    whose headers are complete long before then needs nothing from it."""
    proxy = make_proxy(server={"header_timeout_s": 30})
    tracker = proxy.app[CONNECTIONS]
    sock = connect(proxy.port)
    looked = tracker.sweeps
    for _ in range(8):
        assert answered(sock, HEALTHZ).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)  # the client's pace (4 s in all), not a wait for the proxy
    assert tracker.sweeps - looked <= 2, tracker.sweeps - looked  # once a second: 4 or more
