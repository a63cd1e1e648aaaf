"""Running the serve program on a host (the edge): ship it over the host's transport, stream
its steps and heartbeats, read its answer into a typed ``Restart``; and the restart as a
locked, recorded step (``restart_locked``: the ``restart`` command, under a lock of its own;
``restart_held``: under a lock a push or rollback already holds, so no other run acts on the
host between its switch and the restart).

The journal and the history record every restart through the agent (``op_served``,
under the deploy lock): ``restarting`` before the restart command runs, then its end
(``healthy``, ``unhealthy``, ``interrupted``, ``unknown``), so an interrupted wait leaves
a record ``status`` explains. What is asked is ``serve_plan``'s; what a push does around
it is ``serve_gate``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.progress import Heartbeat, Progress, quiet
from ddtree_deploy.remote import inflight
from ddtree_deploy.remote.program import HostProgram, ProgramSession
from ddtree_deploy.serve import plan as serve_plan
from ddtree_deploy.session import agent_link, push
from ddtree_deploy.settings.serve import ServeSettings
from ddtree_deploy.smoke.plan import START_S


# Never sudo: the serve program reads /proc and runs the inventory's own restart command,
# which names sudo itself when the host needs it (e.g. ["sudo", "-n", "systemctl", ...]).
# One program, two jobs, each with what a lost link (or Ctrl-C) leaves on the host.
SERVE_PROGRAM = HostProgram("ddtree_deploy.hostprog.serve", "the serve program", Code.SERVE_AGENT,
                            lost_state="the serve program only reads: nothing on the host changed")
SERVE_RESTART = HostProgram("ddtree_deploy.hostprog.serve", "the serve program", Code.SERVE_AGENT,
                            lost_state="the serve program goes on alone: it completes the restart it was given "
                            "(the server may be down or restarting meanwhile), waits for its health and records "
                            "its end in the host's journal and history")
CHECK_S = 60.0  # a discovery (and one health GET), at most
SLICE_S = 0.5  # reads wait this long at most between looks at inflight.cancelled

# Restart states, as the journal and the history record them.
RESTARTING = "restarting"
HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
INTERRUPTED = "interrupted"
UNKNOWN = "unknown"  # the serve program could not answer (connection lost, it died): nobody knows


def _now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


@dataclass(frozen=True)
class Restart:
    """One restart of the host's server: how it ended, and the host program's evidence."""

    host: str
    ok: bool
    failed: str | None = None  # drain | restart | health | proof | interrupted | error
    detail: str = ""
    proof: str | None = None  # "tree" / "width": the DDTree proof asked; None: health only
    answer: dict | None = field(default=None, compare=False)
    seconds: float = 0.0
    speed: dict | None = field(default=None, compare=False)  # [analysis]: the figures before/after (bake.around_record)

    @property
    def state(self) -> str:
        if self.ok:
            return HEALTHY
        return {"interrupted": INTERRUPTED, "error": UNKNOWN}.get(self.failed or "", UNHEALTHY)

    @property
    def pids(self) -> list[int]:
        after = (self.answer or {}).get("after") or {}
        return [p["pid"] for p in after.get("processes") or ()]

    def record(self, run_id: str | None, restart_run: str) -> dict:
        """What the journal keeps under ``serve`` (and the history line carries)."""
        return {"state": self.state, "run_id": run_id, "restart_run": restart_run, "time": _now_iso(),
                "failed": self.failed, "detail": self.detail[:500], "proof": self.proof, "pids": self.pids,
                "seconds": round(self.seconds, 2)}

    def line(self) -> str:
        what = "server restarted" + ("" if self.proof else " (health only)")
        if self.ok:
            return f"{what}: {self.detail}"
        if self.failed == "interrupted":
            return f"{what}: interrupted (Ctrl-C) while waiting: {self.detail}"
        if self.failed == "error":
            return f"{what}: its outcome is UNKNOWN: {self.detail}"
        return f"{what}: NOT healthy ({self.failed}): {self.detail}"

    def to_json(self) -> dict:
        a = self.answer or {}
        return {"ok": self.ok, "state": self.state, "failed": self.failed, "detail": self.detail, "proof": self.proof,
                "seconds": round(self.seconds, 2), "restart": a.get("restart"), "drain": a.get("drain"),
                "health": a.get("health"), "tree": (a.get("proof") or {}).get("tree"),
                "before": _pids(a.get("before")), "after": _pids(a.get("after")), "speed": self.speed}


def _pids(discovery: dict | None) -> list[dict] | None:
    if discovery is None:
        return None
    return [{"pid": p["pid"], "started": p["started_iso"], "children": len(p.get("children") or ())}
            for p in discovery.get("processes") or ()]


# ---------------------------------------------------------------- the program on the host


def answer(host, transport, request: dict, *, limit_s: float, what: str, step: str) -> dict:
    """Send one request the serve program answers once (heartbeats read on the way) and return
    its answer, within ``limit_s``; ``what``/``step`` word the messages (the serving check)."""
    with ProgramSession(transport, host, SERVE_PROGRAM) as session:
        session.send(request, during=f"while sending the {step}")
        deadline = time.monotonic() + limit_s
        while True:
            try:
                doc = session.read(deadline, what=what, during=f"the {step}")
            except TimeoutError:
                session.detach()
                raise DeployError(f"{host.name}: the serve program did not answer within {limit_s:g} s",
                                  code=Code.TIMEOUT, hint=f"the host may be overloaded; {next_step.status(host.name)}")
            if doc.get("event") == "done":
                break
    if not doc.get("ok"):
        raise DeployError(f"{host.name}: the {step} failed: {doc.get('error')}", code=Code.SERVE_AGENT)
    return doc


def check(host, transport, request: dict) -> dict:
    """One discovery (``serve_plan.check_request``) on an open ``transport`` (status shares
    the agent's connection): the serve program's answer."""
    return answer(host, transport, request, limit_s=CHECK_S, what="the serving processes", step="serving check")


def run_restart(host, transport, request: dict, *, progress: Progress = quiet,
                heartbeat: Heartbeat | None = None) -> Restart:
    """Ship the serve program, run ``request`` (``serve_plan.restart_request``), read its
    answer. Never raises for the server's sake: a failed step, a lost link, a missed
    deadline or Ctrl-C (``inflight.cancelled``) are a ``Restart`` that says which. On Ctrl-C
    or a missed deadline the program is left to finish its own waits (it changes nothing
    more: the restart command has run or is running)."""
    proof = None
    if request.get("proof"):
        proof = "tree" if request["proof"].get("probe") is not None else "width"
    t0 = time.monotonic()
    limit = serve_plan.restart_deadline(request)
    silence = serve_plan.silence_limit(request)
    step = None

    def ended(ok: bool, failed: str | None, detail: str, answer: dict | None = None) -> Restart:
        return Restart(host.name, ok, failed, detail, proof, answer, time.monotonic() - t0)

    def interrupted() -> Restart:
        return ended(False, "interrupted", f"during {step or 'the start'}, {time.monotonic() - t0:.0f} s after the "
                     f"restart request; {SERVE_RESTART.lost_state}")

    try:
        with transport, ProgramSession(transport, host, SERVE_RESTART) as session:
            session.send(request, during="while sending the restart request")
            last = time.monotonic()
            while True:
                now = time.monotonic()
                if inflight.cancelled.is_set():
                    session.detach()
                    return interrupted()
                if now >= t0 + limit or now >= last + (silence if step else START_S):
                    session.detach()
                    quiet = now >= last + (silence if step else START_S)
                    why = (f"no word from the serve program for {now - last:.0f} s" if quiet
                           else f"no answer within {limit:g} s")
                    return ended(False, "error", f"{why} (step {step or 'start'}); "
                                 f"the host's state: {next_step.status(host.name)}")
                try:
                    doc = session.read(min(now + SLICE_S, t0 + limit), what="the restart's answer",
                                       during=f"the restart ({step or 'start'})")
                except TimeoutError:
                    continue
                last = time.monotonic()
                event = doc.get("event")
                if event == "step":
                    step = doc.get("level")
                    progress(f"server {step}")
                elif event == "wait" and heartbeat is not None:
                    heartbeat(f"server {doc.get('level')}", float(doc.get("seconds") or 0))
                elif event == "done":
                    break
    except DeployError as exc:
        if inflight.cancelled.is_set():  # Ctrl-C dropped the link under the read: not a lost link
            return interrupted()
        return ended(False, "error", exc.message)
    if doc.get("error"):
        return ended(False, "error", f"the serve program failed: {doc['error']}", doc)
    return ended(bool(doc.get("ok")), doc.get("failed"), str(doc.get("detail") or ""), doc)


# ---------------------------------------------------------------- a restart of its own (locked)


def proof_family(journal: dict | None, patches_dir=None):
    """The FamilySmoke of the series the journal names (how its tree shows), else the default."""
    from ddtree_deploy.settings.smoke import FAMILY_SMOKE_DEFAULT, family_smoke

    name = (journal or {}).get("series")
    if not name:
        return FAMILY_SMOKE_DEFAULT
    from pathlib import Path

    from ddtree_deploy.base.locations import repo_dir
    from ddtree_deploy.engine.series import known_family, load_family

    try:
        folder = known_family(str(name), Path(patches_dir or repo_dir("patches")))
        return family_smoke(load_family(folder)) if folder is not None else FAMILY_SMOKE_DEFAULT
    except DeployError:
        return FAMILY_SMOKE_DEFAULT


def restart_locked(host, connect: Callable[[Any], Any], settings: ServeSettings, *, prove: bool = True,
                   break_lock: bool = False, progress: Progress = quiet,
                   heartbeat: Heartbeat | None = None,
                   measure: Callable[[str | None, bool], Any] | None = None) -> tuple[Restart, push.Outcome]:
    """Take the host's deploy lock, restart its server, wait for health (and, with ``prove``
    on a host whose journal says DDTree is in place, the DDTree proof), record it, unlock.

    The lock keeps a push or rollback from switching files under the restart. Returns the
    restart and the lock session's outcome (its run id, a broken lock, a history warning).
    ``measure`` (the host has ``[analysis]``): one short window of the server's figures,
    taken before the restart and after it, recorded in the history (``record_around``).
    """
    with push.hold(host, connect(host), "restart", break_lock=break_lock, progress=progress) as held:
        journal = held.facts.get("journal") or {}
        proof = None
        if prove and journal.get("phase") in (Phase.DEPLOYED, Phase.SWITCHED):
            proof = serve_plan.proof_spec(settings, proof_family(journal))
        release = held.facts.get("sglang_version")
        before = measure_quietly(measure, release, progress, "before the restart", restarted=False)
        result, unrecorded = restart_held(host, connect, settings, held, journal.get("run_id"),
                                          list(journal.get("files") or ()), proof=proof, progress=progress,
                                          heartbeat=heartbeat)
        if unrecorded is not None:
            raise unrecorded
        if measure is not None and result.ok:
            around = record_around(held, before, measure_quietly(measure, release, progress, "after the restart",
                                                                 restarted=True),
                                   progress)
            result = replace(result, speed=around)
    return result, held.outcome


def measure_quietly(measure: Callable[[str | None, bool], Any] | None, release: str | None, progress: Progress,
                    when: str, *, restarted: bool):
    """One window of the server's figures (``measure(release, restarted)``: ``restarted``, a
    server restarted a moment ago, whose first window is warm-up), or None: none asked, or it
    could not be read (said, never fatal: the figures are evidence, not a step of the restart)."""
    if measure is None:
        return None
    progress(f"the server's figures {when}")
    try:
        return measure(release, restarted)
    except DeployError as exc:
        if inflight.cancelled.is_set():
            raise
        progress(f"the server's figures {when} could not be read: {exc.message}")
        return None


def record_around(held: push.PushSession, before, after, progress: Progress) -> dict:
    """The history's ``speed`` line of a restart or a rollback (bake.around_record), under the
    lock ``held`` holds; a failure to write it is said, never fatal. Returns the record."""
    from ddtree_deploy.serve.bake import around_record

    record = around_record(before, after)
    try:
        warning = held.record_speed(record)
        held.outcome.history_warning = held.outcome.history_warning or warning
    except DeployError as exc:
        progress(f"the server's figures were not recorded: {exc.message}")
    return record


def restart_held(host, connect: Callable[[Any], Any], settings: ServeSettings, held: push.PushSession,
                 run_id: str | None, files: list[str], *, proof: dict | None, progress: Progress = quiet,
                 heartbeat: Heartbeat | None = None) -> tuple[Restart, DeployError | None]:
    """Restart the server under the deploy lock ``held`` holds (``restart``'s own, a rollback's,
    or the push whose files it restarts on) and record it there: ``restarting`` first, then
    its end (in the history too). ``run_id``: the switch whose files it serves (the journal's
    run); ``files``: the deployed files; ``proof``: ``serve_plan.proof_spec``'s, or None
    (health only). The lock stays held: the caller leaves the session. Returns the restart
    and, when its end could not be recorded, that error (the restart happened all the same)."""
    record = {"state_dir": host.state_dir, "restart_run": held.outcome.run_id, "run_id": run_id,
              "holder": agent_link.holder_name(), "command": held.outcome.command}
    request = serve_plan.restart_request(host.python, files, settings, proof=proof, record=record)
    progress("journal: serve restarting")
    held.record_serve({"state": RESTARTING, "run_id": run_id, "restart_run": held.outcome.run_id,
                       "time": _now_iso()})
    result = run_restart(host, connect(host), request, progress=progress, heartbeat=heartbeat)
    try:
        warning = held.record_serve(result.record(run_id, held.outcome.run_id), history=True)
    except DeployError as exc:
        return result, exc
    held.outcome.history_warning = held.outcome.history_warning or warning
    return result, None


__all__ = ["HEALTHY", "INTERRUPTED", "RESTARTING", "Restart", "SERVE_PROGRAM", "SERVE_RESTART", "UNHEALTHY",
           "UNKNOWN", "answer", "check", "measure_quietly", "proof_family", "record_around", "restart_held",
           "restart_locked", "run_restart"]
