"""The container program's session on a host (the edge): ship hostprog/container.py over the
host's transport, send one request at a time, read heartbeats on the way and the answer
within the step's deadline; a refusal becomes a ``DeployError`` with its code (and exit 3
for an engine that is missing or does not answer, as ``image --build``'s).

One session serves a whole push or rollback, so the deploy lock the program takes stays
held from the first step to the last; a lost link or Ctrl-C leaves the program to finish the
step in hand alone and release the lock (``lost_state`` says so).
"""

from __future__ import annotations

import base64
import time

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.progress import Heartbeat
from ddtree_deploy.hostprog.protocol import GUARD_WAIT_S
from ddtree_deploy.remote import inflight
from ddtree_deploy.remote.program import CONTAINER_PROGRAM, ProgramSession
from ddtree_deploy.settings.container import ContainerSettings

#: Exit code of a container host whose engine is not installed or does not answer (the
#: same as ``image --build`` without a builder that can build).
EXIT_NO_ENGINE = 3
ENGINE_CODES = frozenset({Code.NO_ENGINE, Code.ENGINE_DOWN})
SLICE_S = 0.5  # reads wait this long at most between looks at inflight.cancelled
READ_S = 120.0  # init, inspect, lock, keep: at most
SWITCH_S = 600.0  # stop (its timeout) + rename + create + start, at most

PROGRAM = CONTAINER_PROGRAM

# What each step leaves when the link goes during it (the container program finishes it).
LEAVES = {
    "build": "the image build goes on (the container is not touched)",
    "switch": "the switch goes on: the container is stopped and recreated with the new image (journal `switched`: "
              "not deployed; the old container kept aside)",
    "verify": "the health check goes on and is recorded in the journal (the new container keeps running; the old "
              "one stays aside)",
    "keep": "the old container kept aside is removed (journal `deployed`)",
    "restore": "the old container is put back and started",
}


class ContainerSession(ProgramSession):
    """One container program on one host for the whole command."""

    def __init__(self, transport, host, settings: ContainerSettings):
        super().__init__(transport, host, PROGRAM, label=transport.label)
        self.settings = settings
        self.step: str | None = None
        self.round_trips = 0

    def lost_state(self) -> str:
        if self.uploaded and self.step in LEAVES:
            return f"{LEAVES[self.step]}; the container program then releases the deploy lock"
        return super().lost_state()

    def call(self, request: dict, *, timeout_s: float = READ_S, heartbeat: Heartbeat | None = None) -> dict:
        """Send one request, read its answer (heartbeats reported through ``heartbeat``)."""
        op = str(request.get("op"))
        if op == "init":
            request = dict(request, guard_wait_s=min(GUARD_WAIT_S, timeout_s / 3))
        self.send(request, during=f"while sending {op}")
        self.step = self.waiting_for = op  # sent: a Ctrl-C from now on leaves this step to the program
        self.round_trips += 1
        deadline = time.monotonic() + timeout_s
        while True:
            if inflight.cancelled.is_set():
                raise inflight.Interrupted(f"{self.label}: interrupted during {op}")
            try:
                doc = self.read(min(deadline, time.monotonic() + SLICE_S), what=f"the reply to {op}", during=op)
            except TimeoutError:
                if time.monotonic() < deadline:
                    continue
                self.detach()
                raise DeployError(f"{self.label}: no answer from the container program during {op} after "
                                  f"{timeout_s:g} s", code=Code.TIMEOUT,
                                  hint=f"{LEAVES.get(op, 'it goes on alone')}; {next_step.status(self.host.name)} "
                                  "shows where the host stands") from None
            if doc.get("event") == "wait":
                if heartbeat is not None:
                    heartbeat(f"container {doc.get('level')}", float(doc.get("seconds") or 0))
                continue
            break
        self.step = None
        if not doc.get("ok"):
            raise refusal(self.label, op, doc)
        return doc


def refusal(label: str, op: str, reply: dict) -> DeployError:
    """The program's refusal as the toolkit's error: its code, its one line, the exit code."""
    code = reply.get("code") or Code.CONTAINER_AGENT
    message, hint, exit_code = f"{label}: {op}: {reply.get('message')}", None, None
    if code in ENGINE_CODES:
        exit_code = EXIT_NO_ENGINE
        hint = ("install the engine on the host (or set container.engine)" if code == Code.NO_ENGINE
                else "start its daemon on the host (e.g. `sudo systemctl start docker`) and rerun")
    if code == Code.LOCKED:
        holder = reply.get("holder") or {}
        message += (f" by {holder.get('holder')} since {holder.get('time')} (run {holder.get('run_id')}, "
                    f"{holder.get('command')})")
        hint = "wait for that run, or take the lock with --break-lock once it is gone"
    return DeployError(message, code=code, hint=hint, exit_code=exit_code, host=label, step=op,
                       evidence={"reply": reply})


def context_request(run_id: str, files: dict[str, bytes], *, base: str, kept_tag: str, tag: str,
                    timeout_s: float, series: str, series_id: str) -> dict:
    """``build``: the context's files (base64; its Dockerfile FROM ``kept_tag``), the base image
    (tagged ``kept_tag`` first: kept, and what rollback runs), the tag to build."""
    return {"op": "build", "run_id": run_id, "base": base, "kept_tag": kept_tag, "tag": tag,
            "timeout_s": timeout_s, "series": series, "series_id": series_id,
            "files": {rel: base64.b64encode(data).decode("ascii") for rel, data in files.items()}}


__all__ = ["ContainerSession", "EXIT_NO_ENGINE", "LEAVES", "PROGRAM", "context_request", "refusal"]
