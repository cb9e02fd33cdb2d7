"""A small threaded TCP proxy in front of the PostgreSQL server, for network faults.

Queues under test connect through it (its host:port in their URL); a test asks it to
drop every live connection, to refuse new ones for a while (as a restarting server
does), or to lose the reply to one statement: the client's message that contains a
given byte pattern reaches the server, which runs and commits it, and then both
sockets are closed instead of the server's answer being passed back.

Real sockets and the real server: nothing is simulated but the fault itself.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536
SENT_KEPT = 65536  # bytes of each client's first messages kept, to pick connections by


class _Pair:
    """One client connection and its connection to the server, pumped by two threads."""

    def __init__(self, proxy: Proxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.doomed: bytes | None = None  # the pattern whose reply this pair will lose
        self.sent = bytearray()  # the first bytes the client sent, to pick connections by
        self.closed = threading.Event()
        self._close_lock = threading.Lock()

    def start(self) -> None:
        for target, name in ((self._upstream, "up"), (self._downstream, "down")):
            threading.Thread(target=target, name=f"proxy-{name}", daemon=True).start()

    def close(self) -> None:
        with self._close_lock:
            if self.closed.is_set():
                return
            self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._forget(self)

    def _upstream(self) -> None:
        """Client -> server. Arms the pair before forwarding a message that carries a pattern."""
        tail = b""
        try:
            while not self.closed.is_set():
                data = self.client.recv(CHUNK)
                if not data:
                    break
                if len(self.sent) < SENT_KEPT:
                    self.sent.extend(data[: SENT_KEPT - len(self.sent)])
                window = tail + data  # a pattern may straddle two reads
                if self.doomed is None:
                    pattern = self.proxy._take_pattern(window, fresh=len(data))
                    if pattern is not None:
                        self.doomed = pattern  # set before the server can possibly answer
                tail = window[-256:]
                self.server.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def _downstream(self) -> None:
        """Server -> client; once doomed, hold the answer back and cut at the commit."""
        held = bytearray()  # messages of the doomed statement's answer, not yet passed on
        try:
            while not self.closed.is_set():
                data = self.server.recv(CHUNK)
                if not data:
                    break
                if self.doomed is None:
                    self.client.sendall(data)
                    continue
                held.extend(data)
                if self._cut_at_commit(held):
                    return
        except OSError:
            pass
        finally:
            self.close()

    def _cut_at_commit(self, held: bytearray) -> bool:
        """Walk the server's framed messages (type byte, int32 length) in `held`.

        ReadyForQuery ('Z') with status 'I' means the statement's transaction has
        committed and the server is idle: close both sockets, the answer is lost.
        A ReadyForQuery inside a transaction ('T', 'E') passes everything so far on,
        so a multi-statement transaction goes on until its own commit.
        """
        offset = 0
        while len(held) - offset >= 5:
            kind = held[offset : offset + 1]
            length = int.from_bytes(held[offset + 1 : offset + 5], "big")
            end = offset + 1 + length
            if len(held) < end:
                break
            if kind == b"Z":
                status = held[end - 1 : end]
                if status == b"I":
                    self.proxy._record_loss(self.doomed or b"")
                    self.close()
                    return True
                self.client.sendall(bytes(held[:end]))
                del held[:end]
                offset = 0
                continue
            offset = end
        return False


class Proxy:
    """Listens on 127.0.0.1:<free port> and forwards every connection to `upstream`."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.upstream = upstream
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._patterns: list[bytes] = []  # armed: each loses one reply
        self._refuse_until = 0.0
        self._stopped = threading.Event()
        #: The patterns whose replies were lost, in order.
        self.lost: list[bytes] = []
        #: Connections accepted and forwarded / refused.
        self.accepted = 0
        self.refused = 0
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    # -- what a test uses ------------------------------------------------------

    def url(self, url: str) -> str:
        """The same URL, pointed at this proxy instead of the server."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def _chosen(self, containing: bytes | None) -> list[_Pair]:
        with self._lock:
            pairs = list(self._pairs)
        return [p for p in pairs if containing is None or containing in p.sent]

    def live(self, containing: bytes | None = None) -> int:
        """How many connections are open through the proxy right now (only those whose
        client has sent `containing`, if given)."""
        return len(self._chosen(containing))

    def drop_all(self, containing: bytes | None = None) -> int:
        """Close every live connection (only those whose client has sent `containing`, if
        given), both ways: the network went away. How many."""
        pairs = self._chosen(containing)
        for pair in pairs:
            pair.close()
        return len(pairs)

    def refuse(self, seconds: float) -> None:
        """Refuse new connections for `seconds` from now (reset as soon as accepted)."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds

    @contextlib.contextmanager
    def restart(self, seconds: float) -> Iterator[None]:
        """What a server restart looks like to clients: live connections cut, new ones
        refused for `seconds`. The block runs during the outage."""
        self.refuse(seconds)
        self.drop_all()
        try:
            yield
        finally:
            while time.monotonic() < self._refuse_until:
                time.sleep(0.01)

    def lose_reply(self, pattern: bytes, times: int = 1) -> None:
        """The next `times` client messages containing `pattern` reach the server and
        commit there, and their connection is closed before the answer comes back."""
        with self._lock:
            self._patterns.extend([pattern] * times)

    def disarm(self) -> None:
        with self._lock:
            self._patterns.clear()

    def close(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_all()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = time.monotonic() < self._refuse_until
            if refusing:
                self.refused += 1
                # A reset, not a polite close: the connection is refused outright.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(self, client, server)
            with self._lock:
                self._pairs.add(pair)
                self.accepted += 1
            pair.start()

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)

    def _take_pattern(self, window: bytes, fresh: int) -> bytes | None:
        """An armed pattern that ends in the last `fresh` bytes of `window` (disarmed), or None."""
        with self._lock:
            for i, pattern in enumerate(self._patterns):
                start = max(0, len(window) - fresh - len(pattern) + 1)
                if window.find(pattern, start) >= 0:
                    return self._patterns.pop(i)
        return None

    def _record_loss(self, pattern: bytes) -> None:
        with self._lock:
            self.lost.append(pattern)
