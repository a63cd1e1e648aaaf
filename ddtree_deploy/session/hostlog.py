"""The host's audit history and deploy lock, read (and the lock released) from the controller.

One agent session each, one round trip: ``history`` and ``lock_status`` are read-only
and take no lock; ``lock_release`` removes the deploy lock only when its process is
provably gone, or with ``force`` (Kamal's ``lock release``), and the agent writes the
release to the host's history. The pure ``*_lines`` helpers turn the documents into the
text the CLI prints (escaped there: every field comes from the host).
"""

from __future__ import annotations

import time
from typing import Callable

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.hostprog.history import history_entry_ok
from ddtree_deploy.remote.agent_session import AgentSession, expect_ok
from ddtree_deploy.remote.link import Transport
from ddtree_deploy.remote.program import CONTAINER_PROGRAM, ProgramSession
from ddtree_deploy.settings.inventory import Host

#: Seconds one of these (read-only, tiny) round trips may take.
OP_TIMEOUT = 30.0


def _call(host: Host, transport: Transport, request: dict, what: str,
          refused: Callable[[dict], DeployError | None] = lambda reply: None) -> dict:
    """One round trip; a refusal is ``refused``'s error for it where it words one, else the
    agent's own line."""
    if host.container is not None:  # [container]: the container program keeps that host's lock and history
        return _container_call(host, transport, request, what)
    with transport, AgentSession(transport, host, host.op_timeout or OP_TIMEOUT) as sess:
        init, reply = sess.call({"op": "init", "state_dir": host.state_dir}, request)
        expect_ok(init, host.name, "agent start")
        if not reply.get("ok"):
            own = refused(reply)
            if own is not None:
                raise own
        return expect_ok(reply, host.name, what)


def _container_call(host: Host, transport: Transport, request: dict, what: str) -> dict:
    init = {"op": "init", "state_dir": host.state_dir, "container": host.container.to_request()}
    limit = host.op_timeout or OP_TIMEOUT
    with transport, ProgramSession(transport, host, CONTAINER_PROGRAM, label=transport.label) as sess:
        sess.send(init, request, during=f"while sending {request['op']}")
        deadline = time.monotonic() + limit
        try:
            replies = [sess.read(deadline, f"the reply to {op}", during=op) for op in ("init", request["op"])]
        except TimeoutError:
            sess.abort()
            raise DeployError(f"{host.name}: no answer from the container program after {limit:g} s",
                              code=Code.TIMEOUT) from None
    expect_ok(replies[0], host.name, "container program start")
    return expect_ok(replies[1], host.name, what)


def history(host: Host, transport: Transport, limit: int) -> dict:
    """The newest ``limit`` entries of the host's history, newest first."""
    reply = _call(host, transport, {"op": "history", "limit": limit}, "read the history")
    # Checked here too (the host may run an older agent, or answer anything): an entry of
    # unexpected types is skipped and counted, the same rule as the agent's reader.
    raw = reply.get("entries") if isinstance(reply.get("entries"), list) else []
    entries = [e for e in raw if history_entry_ok(e)]
    skipped = len(raw) - len(entries)
    return {"host": host.name, "entries": entries, "total": _count(reply.get("total")) - skipped,
            "unreadable": _count(reply.get("unreadable")) + skipped}


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def lock_status(host: Host, transport: Transport) -> dict:
    reply = _call(host, transport, {"op": "lock_status"}, "read the lock")
    return {"host": host.name, "lock": reply["lock"], "tune_lock": reply.get("tune_lock")}


def lock_release(host: Host, transport: Transport, force: bool) -> dict:
    from ddtree_deploy.session.agent_link import holder_name

    def held(reply: dict) -> DeployError | None:
        """A live lock, not released without --force: the lock line and how to go on."""
        holder = reply.get("holder")
        if reply.get("code") != Code.LOCKED or not holder:  # (no holder: the lock's guard was held too long)
            return None
        return DeployError(lock_line(host.name, holder) + "; not released", code=Code.LOCKED, host=host.name,
                           step="release the lock", changed=Changed.NO, evidence={"reply": reply},
                           hint=f"wait for that run, or {next_step.lock_release(host.name, force=True)} once you "
                           "know it is gone")

    reply = _call(host, transport, {"op": "lock_release", "force": force, "holder": holder_name()},
                  "release the lock", held)
    return {"host": host.name, "released": reply["released"], "lock": reply["lock"],
            "history_warning": reply.get("history_warning")}


def entry_line(e: dict) -> str:
    """One history entry as one line (unescaped)."""
    what = e.get("event", "?")
    auto = e.get("automatic")
    if isinstance(auto, dict):  # a push's own rollback: after which push, and why
        from ddtree_deploy.session.status import cause_words

        what += f" (AUTOMATIC, after push run {auto.get('push_run') or '?'}: {cause_words(auto)})"
    if e.get("series"):
        sid = (e.get("series_id") or "")[:12]
        what += f" {e['series']}" + (f" ({sid})" if sid else "")
    outcome = e.get("outcome")
    phase = e.get("phase")
    result = (outcome or "?") + (f" -> {phase}" if phase else "")
    parts = [e.get("time", "?"), what, result, f"by {e.get('holder') or '?'}", f"run {e.get('run_id') or '?'}"]
    if e.get("files"):
        parts.append(f"{len(e['files'])} file(s)")
    if e.get("backup_id"):
        parts.append(f"backup {e['backup_id']}")
    prev = e.get("previous")
    if isinstance(prev, dict):
        parts.append(f"lock of run {prev.get('run_id', '?')} by {prev.get('holder', '?')}")
    if e.get("error"):
        parts.append(str(e["error"]))
    return "  ".join(str(p) for p in parts)


def lock_line(name: str, lock: dict | None) -> str:
    """The lock status as one line (unescaped)."""
    if not lock:
        return f"{name}: lock free"
    stale = "stale (its process is gone)" if lock.get("stale") else "live (its process may still run)"
    return (f"{name}: lock held by {lock.get('holder', '?')} since {lock.get('time', '?')} "
            f"(run {lock.get('run_id', '?')}, {lock.get('command', '?')}, pid {lock.get('pid', '?')} "
            f"on {lock.get('host', '?')}): {stale}")


__all__ = ["history", "lock_status", "lock_release", "entry_line", "lock_line"]
