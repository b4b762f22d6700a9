"""The header deadline of the actions route (issue 26): a connection whose request headers do
not arrive within ``http_header_timeout_s`` (10 s by default, docs/configuration.md) gets 408
and is closed, while every other caller is answered meanwhile. Before it, 180 clients sending
their headers a byte at a time held 180 connections for good. Real uvicorn on loopback.

The slow senders send one byte a second on purpose (that is what they are); the test waits on
the sockets themselves (``select``), never on a fixed sleep.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Self

from protomolt_jobs.host.http_route import HTTP_HEADER_TIMEOUT_S, ActionsHttpServer
from tests.support.node import http, start_node_with_file, stub_catalog

#: What a slow sender trickles: a request whose headers never end within the deadline.
TRICKLE = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200


class SlowSenders:
    """``count`` connections, each sent one more header byte per second until the server
    closes it; :attr:`closed_after` holds, per connection, the seconds from its connect to
    the server's close, and :attr:`replies` what the server wrote before closing."""

    def __init__(self, port: int, count: int) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
        self.opened = [time.monotonic() for _ in self.socks]
        for s in self.socks:
            s.setblocking(False)
        self.closed_after: dict[int, float] = {}
        self.replies: dict[int, bytes] = {i: b"" for i in range(count)}

    def run(self, give_up_s: float) -> None:
        start = time.monotonic()
        sent = 0
        while len(self.closed_after) < len(self.socks):
            assert time.monotonic() - start < give_up_s, (
                f"{len(self.socks) - len(self.closed_after)} connections still open"
            )
            tick = time.monotonic() + 1.0
            while (now := time.monotonic()) < tick:
                live = [s for i, s in enumerate(self.socks) if i not in self.closed_after]
                if not live:
                    return
                readable, _, _ = select.select(live, [], [], tick - now)
                for s in readable:
                    self._read(self.socks.index(s))
            for i, s in enumerate(self.socks):
                if i in self.closed_after or sent >= len(TRICKLE):
                    continue
                try:
                    s.send(TRICKLE[sent : sent + 1])
                except OSError:
                    self._closed(i)
            sent += 1

    def _read(self, i: int) -> None:
        try:
            data = self.socks[i].recv(4096)
        except OSError:
            data = b""
        if data:
            self.replies[i] += data
        else:
            self._closed(i)

    def _closed(self, i: int) -> None:
        if i not in self.closed_after:
            self.closed_after[i] = time.monotonic() - self.opened[i]

    def close(self) -> None:
        for s in self.socks:
            s.close()


class Prober:
    """Calls ``/health`` and a verb in a loop on fresh connections; records each latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures: list[object] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, body, _ = http("GET", f"{self.url}/health", timeout=5)
                verb, answer, _ = http(
                    "POST", f"{self.url}/protomolt/actions/get-job", {"jobId": "x"}, timeout=5
                )
                if status != 200 or verb != 200 or not answer.get("ok"):
                    self.failures.append((status, body, verb, answer))
            except Exception as exc:  # noqa: BLE001 - recorded and asserted on
                self.failures.append(exc)
            self.latencies.append(time.monotonic() - started)
            self._stop.wait(0.2)


def read_response(s: socket.socket) -> bytes:
    """One whole response (headers and its ``content-length`` body) from ``s``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = s.recv(4096)
        assert chunk, data
        body += chunk
    return head + b"\r\n\r\n" + body


def test_180_byte_a_second_senders_are_closed_at_the_documented_deadline_while_others_are_answered():
    assert HTTP_HEADER_TIMEOUT_S == 10.0  # the value docs/configuration.md documents
    catalog, _ = stub_catalog()
    server = ActionsHttpServer(catalog, port=0).start()
    senders = SlowSenders(server.port, 180)
    try:
        with Prober(server.url) as prober:
            senders.run(give_up_s=HTTP_HEADER_TIMEOUT_S + 15)
        assert len(senders.closed_after) == 180
        earliest, latest = min(senders.closed_after.values()), max(senders.closed_after.values())
        assert HTTP_HEADER_TIMEOUT_S - 0.1 <= earliest, earliest
        assert latest <= HTTP_HEADER_TIMEOUT_S + 3.0, latest
        assert all(
            r.startswith(b"HTTP/1.1 408 Request Timeout\r\n") for r in senders.replies.values()
        )
        assert all(b"connection: close" in r for r in senders.replies.values())
        # Meanwhile every other caller got its answers, promptly.
        assert prober.failures == []
        assert len(prober.latencies) >= 20
        assert max(prober.latencies) < 2.0, max(prober.latencies)
    finally:
        senders.close()
        server.close()


def test_the_node_takes_its_deadline_from_the_configuration_and_keeps_alive_connections_too(
    tmp_path,
):
    surfaces = start_node_with_file(tmp_path, None, "[node]\nhttp_header_timeout_s = 1.5\n")
    try:
        assert surfaces.http.header_timeout_s == 1.5
        senders = SlowSenders(surfaces.http.port, 3)
        try:
            senders.run(give_up_s=10)
        finally:
            senders.close()
        assert all(1.4 <= t <= 4.0 for t in senders.closed_after.values()), senders.closed_after
        # A kept-alive connection: its first request answered at once, the next one's headers
        # have the deadline from their first byte.
        with socket.create_connection(("127.0.0.1", surfaces.http.port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(s).startswith(b"HTTP/1.1 200 ")
            s.sendall(b"GET /hea")
            started = time.monotonic()
            reply = s.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408 "), reply
            assert s.recv(4096) == b""  # closed
            assert 1.4 <= time.monotonic() - started <= 4.0
    finally:
        surfaces.close()
