"""Push and rollback on one host, as explicit stages over one agent session.

    push:  discover -> lock and read -> decide -> switch    (smoke, serve, analysis: the rollout's)
           [init, facts]  [lock, facts]   (pure)    [apply, unlock]

Each stage returns a frozen outcome (``Discovered``, ``LockedRead``, ``decide.Decision``,
``Switched``) and the next one starts from it; a dry run stops after decide. Round trips:

    push:      [init, facts] -> resolve + check -> [lock, facts] -> decide -> [apply, unlock]   3 round trips
      + smoke: ... -> [apply] -> smoke (lock held) -> [mark, unlock]                       4
        failed: ... -> smoke -> [facts] -> rollback decision -> [apply, unlock]            5
      + [serve]: ... -> [apply] -> smoke -> [served] restart [served] -> [mark, unlock]     6
        not healthy: ... [served] -> [facts] -> [apply] -> [served] restart [served] -> [unlock]   10
    push --dry-run: [init, facts] -> resolve + check -> decide                             1 round trip
    mark:      [init, lock, mark, unlock]                                    1 round trip
    rollback:  [init, lock, facts]  -> decide         -> [apply, unlock]     2 round trips
      + [serve]: ... -> [apply] -> [served] restart [served] -> [unlock]     5

The caller gives a ``desire`` function that turns the host's facts (SGLang version)
into a ``Desired`` (family choice, release snapshot, series check, all on this side):
the rollout passes ``desired.Want.resolve``, settled before the session opens, so the
call goes to this room's ``desired``, never back up into the rollout.
It runs in the discover stage, on the unlocked read: a release wheel it downloads, or a
check it runs, never holds the host's deploy lock. The locked read must then show the
same install (version, package root), the decision is made from it, and the agent
re-checks every hash under the lock anyway. A push with a smoke returns a ``PushSession``
that still holds the lock (``begin_push``): the caller smokes, marks, or rolls back
(``PushSession.rollback``: the rollback's decision and switch on the same session, so no
other run comes between the switch and its undoing), and leaves it. ``begin_rollback``
with ``keep_lock`` does the same for a rollback whose server is restarted next.

A failure in a stage before the switch's apply request is sent left the host as it was:
it is raised as ``Changed.NO`` (``DeployError.known``), whatever its code.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.base.progress import Progress, quiet
from ddtree_deploy.remote.agent_session import AgentSession, expect_ok
from ddtree_deploy.remote.link import Transport
from ddtree_deploy.session.agent_link import agent_session, holder_name, init_request, new_run_id
from ddtree_deploy.session.decide import Decision, decide_push, decide_rollback, mark_request
from ddtree_deploy.session.plan import Desired, Plan
from ddtree_deploy.settings.inventory import Host


@dataclass
class Outcome:
    """What one command did on one host: a value the CLI renders (one summary line, or JSON)."""

    host: str
    command: str
    run_id: str
    ok: bool = True
    changed: bool = False
    summary: str = ""
    plan: Plan | None = None
    sglang_version: str | None = None
    backup_id: str | None = None
    purged: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    broke_lock: dict | None = None
    history_warning: str | None = None  # the host could not append to its audit history
    phase: str | None = None  # the host's journal phase when the command ended
    # push: the run whose switch awaits its smoke (journal phase ``switched``): this push's
    # own, or an earlier one that switched the same files and never passed its smoke.
    smoke_pending: str | None = None
    # The level the journal records as failed for that earlier run (kept by --no-rollback):
    # the smoke of this push must run it again before the host may be marked deployed.
    smoke_failed: str | None = None
    diff: str | None = None  # push --diff: the unified diff of every file the plan changes
    # --replace-drifted: the files edited outside ddtree-deploy it replaced (or, dry, would):
    # {"files", "backup_id", "folder" (where their bytes are kept on the host), "diff"}
    drifted: dict | None = None
    round_trips: int = 0
    connections: int = 0
    seconds: float = 0.0
    # push --json: each phase's seconds as the transport and the agent session recorded them
    # (connect, agent start, every round trip by its ops: apply+unlock is the switch).
    timings: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "command": self.command,
            "run_id": self.run_id,
            "ok": self.ok,
            "changed": self.changed,
            "summary": self.summary,
            "sglang_version": self.sglang_version,
            "backup_id": self.backup_id,
            "plan": self.plan.to_json() if self.plan else None,
            "purged_bytecode": self.purged,
            "pruned_backups": self.pruned,
            "broke_lock": self.broke_lock,
            "history_warning": self.history_warning,
            "phase": self.phase,
            "smoke_pending": self.smoke_pending,
            "round_trips": self.round_trips,
            "connections": self.connections,
            "seconds": round(self.seconds, 3),
            "timings": self.timings,
        } | ({"diff": self.diff} if self.diff is not None else {}) | (
            {"drifted": self.drifted} if self.drifted is not None else {})

# ---------------------------------------------------------------- the stages' outcomes


@dataclass(frozen=True)
class Discovered:
    """The discover stage: the host's facts read without the lock, and what was resolved from
    them on this side (a push: the series' ``Desired``; a rollback: what drifted files are
    shown against), before any lock is taken."""

    facts: dict[str, Any]
    resolved: Any = None


@dataclass(frozen=True)
class LockedRead:
    """The lock-and-read stage: the facts read under the host's deploy lock (a dry run reads
    without it: ``locked`` is False) and the lock it broke (``--break-lock``), if any."""

    facts: dict[str, Any]
    locked: bool
    broke_lock: dict[str, Any] | None = None


@dataclass(frozen=True)
class Switched:
    """The switch stage: what it did (a completed journal, the apply, a mark, or nothing; a
    dry run: nothing sent) and what the host's journal says now. ``held``: the lock is still
    held (a smoke, a mark, a restart follows on the same session)."""

    summary: str
    held: bool
    changed: bool = False
    phase: str | None = None
    backup_id: str | None = None
    purged: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    history_warning: str | None = None
    smoke_pending: str | None = None  # the run whose switch awaits its smoke (this one's, or an earlier one's)
    drifted_backup: str | None = None  # --replace-drifted: where the drifted files' bytes were kept
    drifted_folder: str | None = None


def _lock(run_id: str, command: str, break_lock: bool) -> dict:
    return {"op": "lock", "run_id": run_id, "holder": holder_name(), "command": command, "break_lock": break_lock}


def _locked_error(host: Host, reply: dict) -> DeployError:
    """The lock refused: who holds it, since when, and the way on (the holder is the evidence)."""
    h = reply.get("holder") or {}
    facts = {"host": host.name, "step": "lock", "evidence": {"reply": reply}}
    if h.get("command") == "tune":  # the agent refuses the deploy lock while a tune's servers run
        return DeployError(
            f"{host.name}: a tune is running (run {h.get('run_id', '?')} by {h.get('holder', '?')} since "
            f"{h.get('time', '?')}, pid {h.get('pid', '?')}); its servers use the files this would switch",
            code=Code.LOCKED,
            hint="wait for the tune to finish, or stop it (Ctrl-C on its controller)", **facts,
        )
    if not h:  # the lock's guard, held too long by another agent: its own words name the process
        return DeployError(f"{host.name}: {reply.get('message')}", code=Code.LOCKED,
                           hint="rerun once that process has finished or been stopped", **facts)
    stale = " (its process is gone)" if reply.get("stale") else ""
    return DeployError(
        f"{host.name}: deploy lock held by {h.get('holder', '?')} since {h.get('time', '?')} "
        f"(run {h.get('run_id', '?')}, {h.get('command', '?')}, pid {h.get('pid', '?')}){stale}",
        code=Code.LOCKED,
        hint="wait for that run to finish; if it is dead, rerun with --break-lock", **facts,
    )


def _same_install(host: Host, before: dict, now: dict) -> None:
    """The series was resolved from the unlocked read: refuse if the install changed since."""
    for key in ("sglang_version", "package_root"):
        if before.get(key) != now.get(key):
            raise DeployError(f"{host.name}: SGLang's {key.replace('_', ' ')} changed from {before.get(key)} to "
                              f"{now.get(key)} while the series was prepared; nothing was changed",
                              code=Code.CHANGED, hint="rerun the command", host=host.name, step="lock + discover",
                              changed=Changed.NO, evidence={"before": before.get(key), "now": now.get(key)})


def _finish(sess: AgentSession, apply: dict | None) -> dict | None:
    """The last round trip: apply (if any) and unlock, in one write."""
    requests = ([apply] if apply else []) + [{"op": "unlock"}]
    replies = sess.call(*requests)
    return replies[0] if apply else None


class PushSession:
    """A push (or rollback) that went as far as it goes alone: its ``outcome``, and, when
    its switch ended ``switched`` with a smoke to run (``locked``), its agent session still
    holding the host's deploy lock. The caller runs the smoke, then ``mark``s the result
    (the journal's compare-and-set on the run id and the unlock travel in one round trip)
    or ``unlock``s before a rollback. Use it as a context manager: leaving it releases a
    lock still held and closes the connection. A dropped connection releases the lock
    too (the agent sees EOF), leaving the phase ``switched``."""

    def __init__(self, outcome: Outcome, sess: AgentSession | None, host: Host, stack: ExitStack,
                 facts: dict | None = None):
        self.outcome, self.host, self._sess, self._stack = outcome, host, sess, stack
        self.facts = facts  # ``hold``: the host's facts, read under the lock it holds
        self.locked = sess is not None
        self.marked: str | None = None  # the phase a successful mark wrote

    @property
    def run_id(self) -> str | None:
        """The run whose switch awaits its smoke (this push's, or an earlier one's)."""
        return self.outcome.smoke_pending

    def mark(self, phase: str, smoke: dict | None = None, *, speed: dict | None = None) -> dict:
        """Mark the journal ``phase`` and release the lock. ``speed`` (the speed gate's verdict,
        serve/bake.py): its history line is written once the mark is, still under the lock, so
        it shows the phase the mark made (a second round trip); a line that cannot be written is
        the outcome's history warning, not a failed mark."""
        if not self.locked or self._sess is None:
            raise DeployError(f"{self.host.name}: mark: the deploy lock was already released", code=Code.PROTOCOL)
        if speed is None:
            self.locked = False
            marked, _unlock = self._sess.call(mark_request(self.run_id, phase, smoke), {"op": "unlock"})
        else:
            (marked,) = self._sess.call(mark_request(self.run_id, phase, smoke))
        journal = expect_ok(marked, self.host.name, "mark")["journal"]
        self.marked = self.outcome.phase = phase
        if speed is not None:
            self.locked = False
            said, _unlock = self._sess.call({"op": "speed", "speed": speed}, {"op": "unlock"})
            warning = said.get("history_warning") if said.get("ok") else (
                f"the speed verdict was not recorded in the history: {said.get('message')}")
            self.outcome.history_warning = self.outcome.history_warning or warning
        return journal

    def record_serve(self, serve: dict, *, history: bool = False) -> str | None:
        """Record a restart of the host's server in its journal (``serve``; the phase stays)
        and, with ``history``, in its history, under the lock this session holds (one round
        trip). Returns the agent's history warning, if any."""
        if not self.locked or self._sess is None:
            raise DeployError(f"{self.host.name}: record the restart: the deploy lock was already released",
                              code=Code.PROTOCOL)
        reply = expect_ok(self._sess.one({"op": "served", "serve": serve, "history": history}), self.host.name,
                          "record the restart")
        return reply.get("history_warning")

    def record_speed(self, speed: dict) -> str | None:
        """Append one ``speed`` line to the host's history (the speed gate's figures,
        serve/bake.py), under the lock this session holds. Returns the history warning, if any."""
        if not self.locked or self._sess is None:
            raise DeployError(f"{self.host.name}: record the speed figures: the deploy lock was already released",
                              code=Code.PROTOCOL)
        reply = expect_ok(self._sess.one({"op": "speed", "speed": speed}), self.host.name, "record the speed figures")
        return reply.get("history_warning")

    def history(self, limit: int = 200) -> list[dict]:
        """The host's newest ``limit`` history entries, newest first, read on this session."""
        if self._sess is None:
            return []
        reply = expect_ok(self._sess.one({"op": "history", "limit": limit}), self.host.name, "read the history")
        return [e for e in reply.get("entries") or () if isinstance(e, dict)]

    def rollback(self, to: str | None, *, release: bool = False, progress: Progress = quiet,
                 automatic: dict | None = None) -> Outcome:
        """Roll the host back to backup ``to`` under the lock this session holds, so that no
        other run acts on the host between this run's switch and its undoing: the
        ``rollback`` command's decision and switch (``decide_rollback``, ``switch``: the same
        verified switch), over this session. One round trip reads the host (under the lock),
        one applies; with ``release`` the unlock travels with the apply, else the lock stays
        held (the caller restarts the server on the restored files, then leaves). Returns the
        rollback's own outcome (its run id is the one the journal records). ``automatic``
        (``automatic_cause``): why the push rolled itself back, recorded with the rollback in
        the journal and the history."""
        if not self.locked or self._sess is None:
            raise DeployError(f"{self.host.name}: rollback: the deploy lock was already released", code=Code.PROTOCOL)
        t0, before = time.monotonic(), self._sess.round_trips
        out = Outcome(self.host.name, "rollback", new_run_id())
        progress("discover (lock held)")
        read = LockedRead(expect_ok(self._sess.one({"op": "facts", "paths": []}), self.host.name, "discover"),
                          locked=True)
        decision = decide_rollback(self.host, read.facts, out.run_id, to=to, automatic=automatic)
        switched = switch(self._sess, self.host, decision, dry_run=False, keep_lock=not release, progress=progress,
                          caller_holds=True)
        self.locked = switched.held
        _record(out, read, decision, switched)
        out.backup_id = decision.plan.backup_id
        out.round_trips, out.seconds = self._sess.round_trips - before, time.monotonic() - t0
        self.outcome.phase = out.phase
        return out

    def unlock(self) -> None:
        if self.locked and self._sess is not None:
            self.locked = False
            self._sess.call({"op": "unlock"})

    def close(self) -> None:
        try:
            if self.locked:
                try:
                    self.unlock()
                except DeployError:
                    pass  # the connection is gone: the agent released the lock at EOF
            if self._sess is not None:
                self.outcome.round_trips = self._sess.round_trips
                self.outcome.timings = self._sess.phase_seconds()
        finally:
            self._stack.close()

    def __enter__(self) -> "PushSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

# ---------------------------------------------------------------- the stages


def discover(sess: AgentSession, host: Host, paths: list[str], resolve: Callable[[dict, Progress], Any], *,
             content: bool = False, driver: bool = False, progress: Progress = quiet) -> Discovered:
    """One round trip without the lock: init, facts (``driver``, a push's: the host's NVIDIA
    driver too, for its driver check); then ``resolve`` on this side (the series: a release
    wheel it downloads, or a check it runs, never holds the host's lock)."""
    progress("discover")
    request = {"op": "facts", "paths": paths, "content": content}
    if driver:
        request["driver"] = True
    init, facts = sess.call(init_request(host), request)
    expect_ok(init, host.name, "agent start")
    facts = expect_ok(facts, host.name, "discover")
    return Discovered(facts, resolve(facts, progress))


def lock_and_read(sess: AgentSession, host: Host, run_id: str, command: str, paths: list[str], *,
                  break_lock: bool, dry_run: bool, found: Discovered | None = None, content: bool = False,
                  progress: Progress = quiet) -> LockedRead:
    """One round trip: init (unless ``found`` did), lock (unless a dry run), facts
    (``content``: with the files' bytes, for a diff). After a discover, the install must be
    the one the series was resolved for (else the lock is released and nothing changed)."""
    progress("lock + discover")
    init = found is None
    requests = ([init_request(host)] if init else []) + ([] if dry_run else [_lock(run_id, command, break_lock)])
    requests.append({"op": "facts", "paths": paths, "content": content})
    replies = sess.call(*requests)
    if init:
        expect_ok(replies[0], host.name, "agent start")
    lock = None
    if not dry_run:
        lock = replies[1 if init else 0]
        if not lock.get("ok"):
            if lock.get("code") == Code.LOCKED:
                raise _locked_error(host, lock)
            expect_ok(lock, host.name, "lock")
    facts = expect_ok(replies[-1], host.name, "discover")
    if found is not None:
        try:
            _same_install(host, found.facts, facts)
        except DeployError:
            _finish(sess, None)  # release the lock now, not at EOF
            raise
    return LockedRead(facts, locked=not dry_run, broke_lock=(lock or {}).get("broke"))


def switch(sess: AgentSession, host: Host, decision: Decision, *, dry_run: bool, keep_lock: bool,
           progress: Progress = quiet, on_apply: Callable[[], None] = lambda: None,
           caller_holds: bool = False) -> Switched:
    """The part of push and rollback that runs under the lock, after the decision: complete
    an interrupted journal, then the no-op or the apply. A dry run sends nothing.

    The unlock travels with the last request (``_finish``) unless ``keep_lock``: then an
    apply keeps the lock (the push's smoke and mark; a rollback's server restart), and so
    does a push with nothing to switch whose earlier run awaits its smoke
    (``decision.pending``). ``caller_holds``: the session took the lock for more than this
    switch (``PushSession.rollback``): an error here never releases it (the caller does),
    and with ``keep_lock`` neither does a no-op. ``on_apply`` is called just before the
    apply request is sent: from there on the host may change.
    """
    if dry_run:
        return Switched(decision.noop if decision.plan.noop else decision.dry, held=False)
    phase = None
    if decision.complete is not None:
        progress(f"journal: complete the interrupted run ({decision.complete['phase']})")
        try:
            done = expect_ok(sess.one(decision.complete), host.name, "complete the journal")
        except DeployError:
            if not caller_holds:
                _finish(sess, None)  # release the lock now, not at EOF
            raise
        phase = done["journal"]["phase"]
    if decision.plan.noop and keep_lock and (decision.pending or caller_holds):
        if decision.pending:
            return Switched(decision.noop, held=True, phase=Phase.SWITCHED,
                            smoke_pending=decision.pending.get("run_id"), backup_id=decision.pending.get("backup_id"))
        return Switched(decision.noop, held=True, phase=phase)
    if decision.plan.noop or decision.apply is None:
        reply = _finish(sess, decision.noop_request)
        if decision.noop_request is not None:
            phase = expect_ok(reply, host.name, decision.noop_request["op"])["journal"]["phase"]
        return Switched(decision.noop, held=False, phase=phase)
    progress(decision.step)
    request = decision.apply
    on_apply()
    done = expect_ok(sess.call(request)[0] if keep_lock else _finish(sess, request), host.name, "apply")
    summary = decision.done.replace("{backup_id}", str(done["backup_id"]))
    kept = done.get("drifted_backup") if decision.plan.drifted else None
    if kept:
        summary += (f"; the edited bytes of {len(decision.plan.drifted)} drifted file(s) are kept in "
                    f"{done.get('drifted_folder')}")
    final = request["final_phase"]
    return Switched(summary, held=keep_lock, changed=True, phase=final, backup_id=done["backup_id"],
                    purged=tuple(done["purged"]), pruned=tuple(done["pruned"]),
                    history_warning=done.get("history_warning"),
                    smoke_pending=request["run_id"] if keep_lock and final == Phase.SWITCHED else None,
                    drifted_backup=kept or None, drifted_folder=done.get("drifted_folder") if kept else None)


def _record(out: Outcome, read: LockedRead, decision: Decision, switched: Switched) -> None:
    """The stages' outcomes into the command's ``Outcome`` (what the CLI renders)."""
    out.broke_lock = read.broke_lock
    out.sglang_version = read.facts["sglang_version"]
    out.plan, out.diff = decision.plan, decision.diff
    if decision.plan.drifted:
        out.drifted = {"files": list(decision.plan.drifted), "backup_id": switched.drifted_backup,
                       "folder": switched.drifted_folder, "diff": decision.drifted_diff}
    out.summary, out.changed = switched.summary, switched.changed
    out.phase = switched.phase if switched.phase is not None else (read.facts["journal"] or {}).get("phase")
    out.backup_id = switched.backup_id
    out.purged, out.pruned = list(switched.purged), list(switched.pruned)
    out.history_warning = switched.history_warning
    out.smoke_pending = switched.smoke_pending


def _execute(command: str, host: Host, transport: Transport, paths: list[str],
             decide: Callable[[dict, Any, str, Progress], Decision], *, dry_run: bool, break_lock: bool,
             progress: Progress, resolve: Callable[[dict, Progress], Any] | None = None,
             keep_lock: bool = False, content: bool = False, driver: bool = False) -> PushSession:
    """The one path of push and rollback, stage by stage: discover (with ``resolve``: the
    push's series, on an unlocked read), lock and read, decide (pure), switch. A dry run
    stops after decide.

    ``keep_lock`` (push with a smoke, rollback with a server restart): a switch (or, for a
    push with nothing to switch, an earlier run still ``switched``) returns with the lock
    held, for the smoke and its mark or the restart; otherwise the returned session is
    already unlocked (see ``switch``). A failure before the apply request is sent left the
    host as it was, and is raised so (``Changed.NO``), whatever its code.
    """
    t0 = time.monotonic()
    out = Outcome(host.name, command, new_run_id())
    stack = ExitStack()
    applying = False

    def sending_apply() -> None:
        nonlocal applying
        applying = True

    try:
        progress("connect")
        stack.enter_context(transport)
        sess = stack.enter_context(agent_session(transport, host, write=True))
        found = None
        if resolve is not None:
            found = discover(sess, host, paths if dry_run else [], resolve, content=content and dry_run,
                             driver=driver, progress=progress)
        if found is not None and dry_run:
            read = LockedRead(found.facts, locked=False)
        else:
            read = lock_and_read(sess, host, out.run_id, command, paths, break_lock=break_lock, dry_run=dry_run,
                                 found=found, content=content, progress=progress)
        try:
            decision = decide(read.facts, found.resolved if found else None, out.run_id, progress)
        except DeployError:
            if read.locked:
                _finish(sess, None)  # release the lock now, not at EOF
            raise
        switched = switch(sess, host, decision, dry_run=dry_run, keep_lock=keep_lock, progress=progress,
                          on_apply=sending_apply)
    except DeployError as exc:
        stack.close()
        if not applying and exc.changed is not Changed.NO:
            raise exc.known(changed=Changed.NO) from exc
        raise
    except BaseException:
        stack.close()
        raise
    _record(out, read, decision, switched)
    if command == "push" and not dry_run:
        _smoke_owed(out, decision.earlier or {})
    out.round_trips, out.connections = sess.round_trips, transport.connections
    out.timings = sess.phase_seconds()
    out.seconds = time.monotonic() - t0
    if switched.held:
        return PushSession(out, sess, host, stack)
    stack.close()
    return PushSession(out, None, host, ExitStack())


def _smoke_owed(out: Outcome, earlier: dict) -> None:
    """A push that left the host ``switched``: the run whose smoke is owed (this one's switch,
    or the earlier run's that switched the same files) and the level that earlier run failed
    at, which the smoke must run again before the host may be marked deployed."""
    if out.phase == Phase.SWITCHED and out.smoke_pending is None:
        out.smoke_pending = out.run_id if out.changed else earlier.get("run_id")
        if not out.changed:
            out.backup_id = earlier.get("backup_id")
    if out.smoke_pending is not None and out.smoke_pending == earlier.get("run_id"):
        out.smoke_failed = (earlier.get("smoke") or {}).get("failed")


# ---------------------------------------------------------------- the commands


def hold(host: Host, transport: Transport, command: str, *, break_lock: bool = False,
         progress: Progress = quiet) -> PushSession:
    """Take the host's deploy lock for a step that switches no file (a server restart):
    one round trip (init, lock, facts). The returned session holds the lock (its ``facts``
    were read under it; ``record_serve``, ``unlock``); leaving it releases the lock."""
    out = Outcome(host.name, command, new_run_id())
    stack = ExitStack()
    try:
        progress("lock")
        stack.enter_context(transport)
        sess = stack.enter_context(agent_session(transport, host, write=True))
        read = lock_and_read(sess, host, out.run_id, command, [], break_lock=break_lock, dry_run=False)
    except DeployError as exc:
        stack.close()
        raise exc.known(changed=Changed.NO, step="lock") from exc  # nothing was restarted
    except BaseException:
        stack.close()
        raise
    out.broke_lock = read.broke_lock
    out.sglang_version = read.facts.get("sglang_version")
    out.phase = (read.facts.get("journal") or {}).get("phase")
    return PushSession(out, sess, host, stack, facts=read.facts)


def begin_push(host: Host, transport: Transport, paths: list[str], desire: Callable[[dict], Desired], *,
               dry_run: bool = False, break_lock: bool = False, smoke: bool = False, diff: bool = False,
               replace_drifted: bool = False, progress: Progress = quiet) -> PushSession:
    """Deploy the series on ``host``: discover, resolve and check the series (no lock
    yet), then lock, re-read, drift check, back up, stage, switch.

    ``desire`` (facts -> Desired) is called on the unlocked read: a release wheel it
    downloads, or a check it runs, never holds the host's lock.
    ``smoke``: the caller runs smoke levels next, so the switch ends in phase ``switched``
    (files patched, smoke not passed) and the returned session still holds the lock
    (``locked``): the caller smokes, then ``mark``s ``deployed`` (or unlocks and rolls
    back), so no other push or mark interleaves. Without, the switch ends ``deployed``
    and the session comes back unlocked. A host left ``switched`` by an earlier run of the
    same series has nothing to switch: with ``smoke`` the session's ``run_id`` names that
    run (the caller smokes it again), without it is marked ``deployed`` here, unless its
    journal records a failed smoke level (then it stays ``switched``: only a smoke that
    passes may mark it).
    ``diff``: the locked read (a dry run's only read) brings the target files' bytes, and
    the outcome's ``diff`` is the unified diff from each host file the plan changes to
    its patched version (``a/<path>`` -> ``b/<path>``, ``/dev/null`` for an absent file).
    ``replace_drifted``: a file edited outside ddtree-deploy (the drift check) is replaced
    too; its bytes are kept first in a backup of their own on the host (``drifted/<id>/``,
    never pruned), and the outcome's ``drifted`` names them, where they are, and their diff.
    """
    return _push(host, transport, paths, desire, dry_run=dry_run, break_lock=break_lock, smoke=smoke,
                 progress=progress, keep_lock=smoke, diff=diff, replace_drifted=replace_drifted)


def push(host: Host, transport: Transport, paths: list[str], desire: Callable[[dict], Desired], *,
         dry_run: bool = False, break_lock: bool = False, smoke: bool = False, diff: bool = False,
         replace_drifted: bool = False, progress: Progress = quiet) -> Outcome:
    """``begin_push`` without holding the lock afterwards: the outcome only (with ``smoke``,
    the journal stays ``switched`` and ``smoke_pending`` names the run to smoke and mark)."""
    with _push(host, transport, paths, desire, dry_run=dry_run, break_lock=break_lock, smoke=smoke,
               progress=progress, keep_lock=False, diff=diff, replace_drifted=replace_drifted) as session:
        return session.outcome


def _push(host: Host, transport: Transport, paths: list[str], desire: Callable[[dict], Desired], *,
          dry_run: bool, break_lock: bool, smoke: bool, progress: Progress, keep_lock: bool,
          diff: bool = False, replace_drifted: bool = False) -> PushSession:
    def resolve(facts: dict, progress: Progress) -> Desired:
        progress("resolve + check the series")
        return desire(facts)

    def decide(facts: dict, desired: Desired, run_id: str, progress: Progress) -> Decision:
        progress("drift check + plan")
        return decide_push(host, desired, facts, run_id, smoke=smoke, dry_run=dry_run, diff=diff,
                           replace_drifted=replace_drifted)

    return _execute("push", host, transport, paths, decide, dry_run=dry_run, break_lock=break_lock,
                    progress=progress, resolve=resolve, keep_lock=keep_lock, content=diff or replace_drifted,
                    driver=True)


def mark(host: Host, transport: Transport, run_id: str, phase: str = Phase.DEPLOYED, *, smoke: dict | None = None,
         progress: Progress = quiet) -> dict:
    """After the smoke: move the journal of ``run_id`` from ``switched`` to ``phase`` (one round trip).

    Compare-and-set under the deploy lock: it fails (code ``changed``) when the journal no
    longer records that run in phase ``switched``, so a stale controller never marks a deploy
    made since by someone else. ``smoke`` (e.g. the failed level) is recorded in the journal.
    Returns the journal as written.
    """
    progress(f"journal: {phase}")
    with transport, agent_session(transport, host, write=True) as sess:
        init, lock, marked, _unlock = sess.call(init_request(host), _lock(new_run_id(), "mark", False),
                                                mark_request(run_id, phase, smoke), {"op": "unlock"})
    expect_ok(init, host.name, "agent start")
    if not lock.get("ok"):
        if lock.get("code") == Code.LOCKED:
            raise _locked_error(host, lock)
        expect_ok(lock, host.name, "lock")
    return expect_ok(marked, host.name, "mark")["journal"]


def rollback(host: Host, transport: Transport, *, to: str | None = None, dry_run: bool = False,
             break_lock: bool = False, replace_drifted: bool = False,
             expect: Callable[[dict], Desired | None] | None = None, progress: Progress = quiet,
             automatic: dict | None = None) -> Outcome:
    """Restore a backup (the newest, or ``to``) through the same staged, verified switch as push."""
    with begin_rollback(host, transport, to=to, dry_run=dry_run, break_lock=break_lock, progress=progress,
                        replace_drifted=replace_drifted, expect=expect, automatic=automatic) as done:
        return done.outcome


def automatic_cause(push_run: str | None, cause: str, step: str | None, detail: str) -> dict:
    """Why a push rolls itself back (its smoke failed at a level; its server was not healthy, or
    failed the proof, after the restart): the ``automatic`` record of its rollback, which the
    journal and the history keep with it."""
    return {"push_run": push_run, "cause": cause, "step": step, "detail": detail[:300]}


def begin_rollback(host: Host, transport: Transport, *, to: str | None = None, dry_run: bool = False,
                   break_lock: bool = False, keep_lock: bool = False, replace_drifted: bool = False,
                   expect: Callable[[dict], Desired | None] | None = None,
                   progress: Progress = quiet, automatic: dict | None = None) -> PushSession:
    """``rollback``, and with ``keep_lock`` a rollback that switched files returns its session
    still holding the lock (``locked``): the caller restarts the server on the restored
    files under it (``serve_run.restart_held``), then leaves the session (the unlock).
    ``replace_drifted``: files edited outside ddtree-deploy are restored too, their edited
    bytes kept first in a backup of their own on the host; ``expect`` (facts -> the series'
    ``Desired``, or None) gives what their diff is shown against (as ``status --diff``). It
    runs on a first, unlocked read, as a push resolves its series: a release wheel it may
    download never holds the host's lock. ``automatic``: the cause of a push's own rollback
    (``automatic_cause``), kept with it in the journal and the history."""
    resolve = None
    if replace_drifted and expect is not None:
        def resolve(facts: dict, progress: Progress) -> Desired | None:
            progress("resolve the series (for the drifted files' diff)")
            return expect(facts)

    def decide(facts: dict, expected: Desired | None, run_id: str, progress: Progress) -> Decision:
        return decide_rollback(host, facts, run_id, to=to, replace_drifted=replace_drifted, expected=expected,
                               automatic=automatic)

    session = _execute("rollback", host, transport, [], decide,
                       dry_run=dry_run, break_lock=break_lock, progress=progress, keep_lock=keep_lock,
                       resolve=resolve, content=replace_drifted)
    session.outcome.backup_id = session.outcome.plan.backup_id if session.outcome.plan else None
    return session


__all__ = ["Discovered", "LockedRead", "Outcome", "PushSession", "Switched", "automatic_cause", "begin_push",
           "begin_rollback", "discover", "hold", "lock_and_read", "mark", "push", "rollback", "switch"]
