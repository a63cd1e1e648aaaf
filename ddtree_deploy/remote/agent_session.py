"""The deploy agent's session: one agent process on one host for the whole command.

``AgentSession.call`` pipelines requests (one write) and reads one reply each, within the
round trip's deadline; it keeps what the answered requests did, for the line a lost link or
Ctrl-C leaves. ``expect_ok`` turns a refusal into an ``AgentFailed`` carrying the reply.
"""

from __future__ import annotations

import time

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import BadInput, Changed, DeployError, prefixed
from ddtree_deploy.hostprog import protocol
from ddtree_deploy.remote.link import ReplyError, Transport
from ddtree_deploy.remote.program import AGENT, ProgramSession
from ddtree_deploy.settings.inventory import Host

#: Seconds one round trip with the agent may take when the inventory sets no op_timeout:
#: generous for a push's backup + switch of large files, short enough that a silent host
#: is reported in minutes, not left hanging.
DEFAULT_OP_TIMEOUT = 120.0


class AgentFailed(DeployError):
    """The agent refused or failed a request; ``reply`` (its evidence) holds its JSON answer.
    A reply that says ``unchanged`` (the agent switched back all it had switched) is
    ``Changed.NO`` whatever its code."""

    def __init__(self, message: str, reply: dict, **kw):
        if reply.get("unchanged") is True:
            kw.setdefault("changed", Changed.NO)
        super().__init__(message, evidence={"reply": reply}, **kw)

    @property
    def reply(self) -> dict:
        return dict(self.evidence["reply"])


class AgentSession(ProgramSession):
    """The deploy agent's session: one agent process on one host for the whole command.

    ``call(*requests)`` pipelines the requests (one write) and reads one answer per
    request: one round trip however many requests or files.
    """

    def __init__(self, transport: Transport, host: Host, op_timeout: float | None = None):
        super().__init__(transport, host, AGENT, sudo=host.sudo, label=transport.label)
        self.round_trips = 0
        self.unanswered: list[str] = []  # the ops sent whose replies have not been read yet
        self.holds_lock = False  # a lock reply said ok, no unlock reply since
        # What this session's answered requests did on the host, for the line a lost link or
        # Ctrl-C leaves (lost_state): the apply that switched files (its kind and the journal
        # phase it left), and a server restart recorded as begun and not yet ended.
        self.switched: tuple[str, str] | None = None
        self.restarting = False
        # Seconds each round trip may take (None: the host's inventory op_timeout, else
        # DEFAULT_OP_TIMEOUT). A silent host fails the call, naming host and step.
        self.op_timeout = op_timeout

    def call(self, *requests: dict, timeout: float | None = None) -> list[dict]:
        """Send ``requests`` in one write, read one reply each, all within ``timeout`` seconds."""
        if self.proc is None:
            raise DeployError(f"{self.transport.label}: the agent session is closed", code=Code.CONNECTION_LOST)
        limit = timeout or self.op_timeout or self.host.op_timeout or DEFAULT_OP_TIMEOUT
        deadline = time.monotonic() + limit
        # The agent gives up on a guard another agent holds (and says which process) well
        # within this deadline, so that its answer arrives (protocol.GUARD_WAIT_S at most).
        requests = tuple(dict(r, guard_wait_s=min(protocol.GUARD_WAIT_S, limit / 3)) if r.get("op") == "init" else r
                         for r in requests)
        ops = "+".join(str(r.get("op")) for r in requests)
        self.unanswered = [str(r.get("op")) for r in requests]
        self.send(*requests, during=f"while sending {ops}")
        self.round_trips += 1
        t0 = time.monotonic()
        replies = []
        for request in requests:
            op = request.get("op")
            try:
                reply = self.read(deadline, f"the reply to {op}", during=op)
                self.unanswered.pop(0)
                replies.append(self._note(request, reply))
            except TimeoutError:
                self.abort()
                raise DeployError(
                    f"{self.transport.label}: no answer from the host agent during {op} after {limit:g} s",
                    code=Code.TIMEOUT, step=str(op), changed=self.lost_changed(),
                    hint=f"the host may be hung or overloaded; raise host.op_timeout in "
                    f"{self.host.source or 'the inventory'} if {op} is just slow there, then run "
                    f"{next_step.status(self.host.name)}") from None
            except ReplyError:
                self.abort()
                raise
        self.timings.append((ops, time.monotonic() - t0))
        return replies

    def phase_seconds(self) -> list[dict]:
        """Each phase's seconds so far, in order: the transport's (connect), then this session's
        (the agent's start, every round trip by its ops), for push --json."""
        return [{"phase": phase, "seconds": round(seconds, 4)}
                for phase, seconds in [*self.transport.timings, *self.timings]]

    def one(self, request: dict) -> dict:
        return self.call(request)[0]

    def _note(self, request: dict, reply: dict) -> dict:
        """Keep what an answered request did (lost_state says it if the link goes next); give a
        refusal the hint only this session can word (it knows the host): the reply as kept."""
        if reply.get("code") == Code.NO_SGLANG and not reply.get("hint"):
            reply = protocol.Reply(dict(reply, hint=next_step.python_that_imports_sglang(
                self.host.source, local=self.host.is_local)))
        op, ok = request.get("op"), bool(reply.get("ok"))
        if op in ("lock", "unlock"):
            self.holds_lock = op == "lock" and ok
        elif op == "apply" and ok:
            self.switched = (str(request.get("kind") or "apply"), str(request.get("final_phase")))
        elif op == "mark" and ok and self.switched is not None:
            self.switched = (self.switched[0], str(request.get("phase")))
        elif op == "served" and ok:
            self.restarting = (request.get("serve") or {}).get("state") == "restarting"
        return reply

    def interrupted_state(self) -> str:
        self.waiting_for = "+".join(self.unanswered) or None
        return super().interrupted_state()

    def lost_state(self) -> str:
        """A lost link during the ops in flight: what the agent (which ignores the hangup,
        finishes the request it has and releases its lock at EOF) leaves on the host."""
        if not self.uploaded:
            return super().lost_state()
        writing = [op for op in self.unanswered if op in WRITE_OPS]
        if writing:
            return (f"the host agent goes on alone: if it got the whole {writing[0]} request it completes it "
                    f"(the journal says how far), else nothing changed; {next_step.status(self.host.name)} "
                    "shows which")
        held = " (a deploy lock it took is released when the agent sees the link close)" \
            if self.holds_lock or "lock" in self.unanswered else ""
        restart = ("; a server restart is under way (the server may be down or restarting): the host's serve "
                   "program completes it and records its end" if self.restarting else "")
        if self.switched is None:
            return f"no file on the host was changed{restart}{held}"
        kind, phase = self.switched
        did = ("this run rolled the files back" if kind == "rollback" else f"this run's {kind} switched the files")
        did += f" (journal phase `{phase}`" + (": not deployed)" if phase == Phase.SWITCHED else ")")
        return f"{did}{restart}; nothing more was changed{held}"

    def lost_changed(self) -> Changed:
        """``lost_state`` as the error's ``changed``: a write in flight may have landed; a
        switch this session made, or a restart under way, changed the host; else nothing."""
        if not self.uploaded:
            return super().lost_changed()
        if any(op in WRITE_OPS for op in self.unanswered):
            return Changed.MAYBE
        if self.switched is not None or self.restarting:
            return Changed.YES
        return Changed.NO


class AgentRefusedInput(AgentFailed):
    """The agent refused the inventory's input (e.g. a state_dir that is not ours): exit 2."""

    exit_code = BadInput.exit_code


#: Agent ops that change the host (a link lost while one is in flight leaves it unknown).
WRITE_OPS = frozenset({"apply", "mark", "lock_release"})

#: Agent codes that mean "the inventory is wrong", not "the host failed".
BAD_INPUT_CODES = frozenset({Code.BAD_STATE_DIR})


def expect_ok(reply: dict, label: str, what: str) -> dict:
    """A reply's payload, or an AgentFailed carrying the agent's code and message."""
    if reply.get("ok"):
        return reply
    cls = AgentRefusedInput if reply.get("code") in BAD_INPUT_CODES else AgentFailed
    code = reply.get("code") or Code.AGENT
    # The inventory's python is not the one that imports sglang: say which one does.
    hint = (reply.get("hint") or next_step.python_that_imports_sglang()) if code == Code.NO_SGLANG else None
    raise cls(prefixed(str(reply.get("message")), label, what), reply, code=code, hint=hint, host=label, step=what)


__all__ = ["AgentFailed", "AgentRefusedInput", "AgentSession", "DEFAULT_OP_TIMEOUT", "WRITE_OPS", "expect_ok"]
