"""TCP relays of our own between paramiko and a real sshd, to fault the link: ``CutProxy``
closes both sides once N bytes went through (a cut), ``StallProxy`` drops every byte the
host sends once the client sent N (a blackhole: nothing closes, nothing arrives).

Shared by tests/integration/test_faults.py and tests/e2e/test_interrupt.py.
"""

from __future__ import annotations

import socket
import threading


class Relay:
    """Relay 127.0.0.1:<port> <-> the target port; ``_pass`` decides, chunk by chunk, what goes
    through and whether the link is cut. A side that closes closes the other."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stop = False
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.listener.close()

    def cut_all(self) -> None:
        """Cut every link relayed so far, at once (a network gone under every connection)."""
        with self._lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _pass(self, data: bytes, upstream: bool) -> tuple[bytes, bool]:
        """(what to forward, cut now?) for ``data`` read from the client (``upstream``) or the host."""
        return data, False

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            pair = (client, server)
            with self._lock:
                self.pairs.append(pair)
            threading.Thread(target=self._pump, args=(client, server, pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair, upstream: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            with self._lock:
                forward, cut_now = self._pass(data, upstream)
            try:
                if forward:
                    dst.sendall(forward)
            except OSError:
                break
            if cut_now:
                break
        for s in pair:  # a cut (or a normal close) ends both sides at once
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class CutProxy(Relay):
    """Cut both sockets once ``cut_after`` bytes (both ways together) went through."""

    def __init__(self, target_port: int):
        self.cut_after: int | None = None
        self.relayed = 0
        self.cut = False
        super().__init__(target_port)

    def arm(self, cut_after: int | None) -> None:
        with self._lock:
            self.cut_after, self.relayed, self.cut = cut_after, 0, False

    def _pass(self, data: bytes, upstream: bool) -> tuple[bytes, bool]:
        allowed = len(data)
        if self.cut_after is not None:
            allowed = max(0, min(allowed, self.cut_after - self.relayed))
        self.relayed += allowed
        cut_now = allowed < len(data)
        if cut_now:
            self.cut = True
        return data[:allowed], cut_now


class StallProxy(Relay):
    """Once ``stall_after`` bytes went client -> host, drop every byte the host sends back (the
    link stays open); the client's close still closes the host's side (the agent sees EOF)."""

    def __init__(self, target_port: int):
        self.stall_after: int | None = None
        self.sent = 0  # client -> host bytes
        self.stalled = threading.Event()
        super().__init__(target_port)

    def arm(self, stall_after: int | None) -> None:
        with self._lock:
            self.stall_after, self.sent = stall_after, 0
            self.stalled.clear()

    def _pass(self, data: bytes, upstream: bool) -> tuple[bytes, bool]:
        if upstream:
            self.sent += len(data)
            if self.stall_after is not None and self.sent >= self.stall_after:
                self.stalled.set()
            return data, False
        return (b"" if self.stalled.is_set() else data), False
