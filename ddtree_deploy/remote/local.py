"""The local transport (``--host local``): the same host programs, run on this machine by subprocess."""

from __future__ import annotations

import os
import select
import subprocess
import tempfile

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.remote.link import LineReader, Process, Transport


class _LocalProcess(Process):
    def __init__(self, argv: list[str]):
        self._err = tempfile.TemporaryFile()
        try:
            self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        except OSError as exc:
            raise DeployError(f"cannot start {argv[0]}: {exc.strerror}", code=Code.AGENT,
                              hint="set host.python in the inventory to an interpreter on this machine "
                              "that has sglang installed (`command -v python3` shows one)") from None

    def write(self, data: bytes) -> None:
        try:
            self.p.stdin.write(data)
            self.p.stdin.flush()
        except OSError:
            pass  # the agent exited; readline reports it with its stderr

    def _recv(self, n: int, timeout: float | None) -> bytes:
        fd = self.p.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        return os.read(fd, n)

    def readline(self, deadline: float | None = None, what: str = "a reply") -> bytes:
        if not hasattr(self, "_reader"):
            self._reader = LineReader(self._recv, "local")
        return self._reader.readline(deadline, what)

    def abort(self) -> None:
        self.p.kill()
        self.close()

    def ended(self, wait_s: float) -> tuple[int, str] | None:
        try:
            code = self.p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        self._err.seek(0)
        return code, self._err.read()[-2000:].decode(errors="replace")

    def detach(self) -> None:
        # Our ends closed, nothing waited for or killed: the program sees EOF / EPIPE.
        for stream in (self.p.stdin, self.p.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._err.close()

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            code = self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            code = self.p.wait()
        self.p.stdout.close()
        self._err.seek(0)
        tail = self._err.read()[-2000:].decode(errors="replace")
        self._err.close()
        return code, tail


class LocalTransport(Transport):
    """Run on this machine (``--host local``): same agent, no network."""

    label = "local"

    def start(self, argv: list[str]) -> Process:
        return _LocalProcess(argv)


__all__ = ["LocalTransport"]
