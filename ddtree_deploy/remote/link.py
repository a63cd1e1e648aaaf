"""A link to one host: start a program there, write its stdin, read its stdout by lines.

``Transport`` (open once per command, ``start`` a program, ``close``) and ``Process`` (the
started program) are the one narrow interface the sessions use; ``local.py`` and ``ssh.py``
implement it. ``LineReader`` reads a program's lines in linear time, each bounded, within a
deadline, for both.
"""

from __future__ import annotations

import os
import time

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError

DEFAULT_IO_TIMEOUT = 600.0  # seconds one SSH read may wait when the caller gives no deadline (the tune sweep)
#: The largest reply line accepted from a host program: a pull of every target file is a
#: few MB; anything past this is a broken or hostile host, refused with a clear error.
MAX_REPLY_BYTES = 64 << 20


class ReplyError(DeployError):
    """A host program's reply broke a bound (too large, too late)."""


class LineReader:
    """Lines from a byte stream in linear time, each bounded in size, with a deadline.

    ``recv(n, timeout)`` returns up to n bytes (b"" at EOF) or raises ``TimeoutError``.
    The buffer is scanned for a newline only from where the last scan stopped, so a
    32 MB reply costs one pass (paramiko's and io's line readers rescan or re-copy).
    """

    def __init__(self, recv, label: str, limit: int = MAX_REPLY_BYTES):
        self.recv, self.label, self.limit = recv, label, limit
        self.buf = bytearray()
        self.scanned = 0
        self.eof = False

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        while True:
            nl = self.buf.find(b"\n", self.scanned)
            if nl >= 0:
                line = bytes(self.buf[: nl + 1])
                del self.buf[: nl + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buf)
            if self.scanned > self.limit:
                raise ReplyError(f"{self.label}: {what} is over {self.limit >> 20} MiB; refusing to read more "
                                 "(a broken or hostile host program)", code=Code.REPLY_TOO_LARGE)
            if self.eof:
                line, self.buf = bytes(self.buf), bytearray()
                self.scanned = 0
                return line
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            chunk = self.recv(1 << 20, timeout)
            if not chunk:
                self.eof = True
            self.buf += chunk


class Process:
    """A started program: write to its stdin, read lines from its stdout."""

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        """One line (b"" or a line without its newline: the program ended). ``deadline``
        (time.monotonic): TimeoutError past it. Over MAX_REPLY_BYTES: ReplyError."""
        raise NotImplementedError

    def abort(self) -> None:
        """Stop waiting for the program: close the pipes/channel now (the agent sees EOF)."""
        self.close()

    def detach(self) -> None:
        """Stop listening and leave the program to finish by itself (never killed)."""
        self.abort()

    def ended(self, wait_s: float) -> tuple[int, str] | None:
        """(exit code, stderr tail) when the program has ended, waiting up to ``wait_s`` for
        its exit status; None when none came (it runs on, or the link died without one)."""
        return None

    def close(self) -> tuple[int | None, str]:
        """Close stdin, wait (bounded), return (exit code or None, stderr tail)."""
        raise NotImplementedError


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), None where that cannot be read: what a
    command spent before its first connect (the interpreter, the imports, the inventory)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Transport:
    """Start programs on one host. Open once per command; ``close`` always."""

    label = "?"
    connections = 0  # how many network connections this transport opened

    def __init__(self) -> None:
        # (phase, seconds) as they happened: "cli start" and "connect" (the SSH transport's),
        # for push --json.
        self.timings: list[tuple[str, float]] = []

    def open(self) -> None:
        pass

    def start(self, argv: list[str]) -> Process:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["DEFAULT_IO_TIMEOUT", "LineReader", "MAX_REPLY_BYTES", "Process", "ReplyError", "Transport"]
