"""Push, rollback, status and pull on one host: read facts, plan, execute the plan.

Each command is one agent session over one connection (see transport.AgentSession):

    push:      [init, facts] -> resolve + check -> [lock, facts] -> plan -> [apply, unlock]   3 round trips
      + smoke: ... -> [apply] -> smoke (lock held) -> [mark, unlock]                       4
        failed: ... -> smoke -> [facts] -> rollback plan -> [apply, unlock]                5
      + [serve]: ... -> [apply] -> smoke -> [served] restart [served] -> [mark, unlock]     6
        not healthy: ... [served] -> [facts] -> [apply] -> [served] restart [served] -> [unlock]   10
    push --dry-run: [init, facts] -> resolve + check -> plan                               1 round trip
    mark:      [init, lock, mark, unlock]                                    1 round trip
    rollback:  [init, lock, facts]  -> plan           -> [apply, unlock]     2 round trips
      + [serve]: ... -> [apply] -> [served] restart [served] -> [unlock]     5
    status:    [init, facts]                                                 1 round trip
      + a server that started before the last switch: ... -> [switches]      2
    pull:      [init, facts+content]                                         1 round trip

The caller gives a ``desire`` function that turns the host's facts (SGLang version)
into a ``Desired`` (family choice, release snapshot, series check, all on this side):
the rollout passes ``desired.Want.resolve``, settled before the session opens, so the
call goes to this room's ``desired``, never back up into the rollout.
It runs on the first, unlocked read: a release wheel it downloads, or a check it runs,
never holds the host's deploy lock. The locked read must then show the same install
(version, package root), the plan is made from it, and the agent re-checks every hash
under the lock anyway. A push with a smoke returns a ``PushSession`` that still holds
the lock (``begin_push``): the caller smokes, marks, or rolls back (``PushSession.rollback``:
``rollback``'s plan and apply on the same session, so no other run comes between the switch
and its undoing), and leaves it. ``begin_rollback`` with ``keep_lock`` does the same for a
rollback whose server is restarted next.
"""

from __future__ import annotations

import base64
import getpass
import socket
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ddtree_deploy.base import hooks, next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.digests import sha256
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.progress import Progress, quiet
from ddtree_deploy.engine.patch_write import diff_hunks
from ddtree_deploy.remote.transport import AgentFailed, AgentSession, Transport, expect_ok
from ddtree_deploy.session.plan import (
    Desired,
    FileState,
    Plan,
    StateFolder,
    classify,
    plan_push,
    plan_rollback,
)
from ddtree_deploy.settings.inventory import Host

#: Seconds one agent round trip may take unless the inventory's host.op_timeout says:
#: a push's apply backs up, stages and switches (large files on slow disks), a read is quick.
WRITE_OP_TIMEOUT = 120.0
READ_OP_TIMEOUT = 30.0



def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def holder_name() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    return f"{user}@{socket.gethostname()}"


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
        } | ({"diff": self.diff} if self.diff is not None else {}) | (
            {"drifted": self.drifted} if self.drifted is not None else {})


def _init(host: Host) -> dict:
    return {"op": "init", "state_dir": host.state_dir, "hooks": hooks.hooks()}  # base/hooks.py: {} but in a fault test


def _lock(run_id: str, command: str, break_lock: bool) -> dict:
    return {"op": "lock", "run_id": run_id, "holder": holder_name(), "command": command, "break_lock": break_lock}


def _locked_error(host: Host, reply: dict) -> DeployError:
    h = reply.get("holder") or {}
    if h.get("command") == "tune":  # the agent refuses the deploy lock while a tune's servers run
        return DeployError(
            f"{host.name}: a tune is running (run {h.get('run_id', '?')} by {h.get('holder', '?')} since "
            f"{h.get('time', '?')}, pid {h.get('pid', '?')}); its servers use the files this would switch",
            code=Code.LOCKED,
            hint="wait for the tune to finish, or stop it (Ctrl-C on its controller)",
        )
    if not h:  # the lock's guard, held too long by another agent: its own words name the process
        return DeployError(f"{host.name}: {reply.get('message')}", code=Code.LOCKED,
                           hint="rerun once that process has finished or been stopped")
    stale = " (its process is gone)" if reply.get("stale") else ""
    return DeployError(
        f"{host.name}: deploy lock held by {h.get('holder', '?')} since {h.get('time', '?')} "
        f"(run {h.get('run_id', '?')}, {h.get('command', '?')}, pid {h.get('pid', '?')}){stale}",
        code=Code.LOCKED,
        hint="wait for that run to finish; if it is dead, rerun with --break-lock",
    )


def _open_locked(sess: AgentSession, host: Host, run_id: str, command: str, paths: list[str],
                 break_lock: bool, dry_run: bool, init: bool = True, content: bool = False) -> tuple[dict, dict | None]:
    """One round trip: init (unless done), lock (unless a dry run), facts (``content``: with
    the files' bytes, for a diff). Returns (facts, lock reply)."""
    requests = ([_init(host)] if init else []) + ([] if dry_run else [_lock(run_id, command, break_lock)])
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
    return facts, lock


def _hashes(facts: dict) -> dict[str, str | None]:
    return {path: (info or {}).get("sha256") for path, info in facts["files"].items()}


def _unsafe(host: Host, facts: dict) -> None:
    """Refuse to plan over a target the agent would not read or replace (a symlink)."""
    bad = [(p, i["unsafe"]) for p, i in sorted(facts["files"].items()) if i and "unsafe" in i]
    if bad:
        raise DeployError(f"{host.name}: {len(bad)} target file(s) cannot be replaced safely: {bad[0][1]}",
                          code=Code.UNSAFE_FILE, hint="replace the symlink by the real file on the host, then rerun")


def _session(transport: Transport, host: Host, write: bool) -> AgentSession:
    return AgentSession(transport, host, host.op_timeout or (WRITE_OP_TIMEOUT if write else READ_OP_TIMEOUT))


def _finish(sess: AgentSession, apply: dict | None) -> dict | None:
    """Second round trip: apply (if any) and unlock, in one write."""
    requests = ([apply] if apply else []) + [{"op": "unlock"}]
    replies = sess.call(*requests)
    return replies[0] if apply else None


@dataclass(frozen=True)
class _Prepared:
    """A plan and what to say and send for it (push and rollback differ only here)."""

    plan: Plan
    noop: str  # summary when nothing changes
    dry: str  # summary of a dry run
    step: str  # progress label of the apply
    request: Callable[[str], dict]  # run id -> the apply request
    done: Callable[[dict], str]  # the agent's apply reply -> summary
    noop_request: dict | None = None  # sent with the unlock when nothing switches (push: a mark)
    pending: dict | None = None  # push, nothing to switch: the journal of the run still `switched`
    # Nothing to switch but the journal says `switching` (the agent was killed after its last
    # rename): sent first, it moves the journal to where that run would have ended.
    complete: dict | None = None
    diff: str | None = None  # push --diff: what the plan changes, as a unified diff
    drifted_diff: str = ""  # --replace-drifted: each drifted file it replaces, against what was expected there


class PushSession:
    """A push (or rollback) that went as far as it goes alone: its ``outcome``, and, when
    its switch ended ``switched`` with a smoke to run (``locked``), its agent session still
    holding the host's deploy lock. The caller runs the smoke, then ``mark``s the result
    (the journal's compare-and-set on the run id and the unlock travel in one round trip)
    or ``unlock``s before a rollback. Use it as a context manager: leaving it releases a
    lock still held and closes the connection. A dropped connection releases the lock
    too (the agent sees EOF), leaving the phase ``switched``."""

    def __init__(self, outcome: Outcome, sess: AgentSession | None, host: Host, stack: ExitStack):
        self.outcome, self.host, self._sess, self._stack = outcome, host, sess, stack
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
            marked, _unlock = self._sess.call(_mark(self.run_id, phase, smoke), {"op": "unlock"})
        else:
            (marked,) = self._sess.call(_mark(self.run_id, phase, smoke))
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
        ``rollback`` command's plan and apply (``_rollback_plan``, ``_switch``: the same
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
        facts = expect_ok(self._sess.one({"op": "facts", "paths": []}), self.host.name, "discover")
        out.sglang_version, out.phase = facts["sglang_version"], (facts["journal"] or {}).get("phase")
        prepared = _rollback_plan(self.host, to, automatic=automatic)(facts, None, progress)
        self.locked = _switch(self._sess, self.host, out, prepared, dry_run=False, keep_lock=not release,
                              progress=progress, sending=[], caller_holds=True)
        out.backup_id = prepared.plan.backup_id
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
        finally:
            self._stack.close()

    def __enter__(self) -> "PushSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _discover(sess: AgentSession, host: Host, paths: list[str], content: bool = False,
              driver: bool = False) -> dict:
    """One round trip without the lock: init, facts (what to resolve the series from;
    ``driver``, a push's: the host's NVIDIA driver too, for its driver check)."""
    request = {"op": "facts", "paths": paths, "content": content}
    if driver:
        request["driver"] = True
    init, facts = sess.call(_init(host), request)
    expect_ok(init, host.name, "agent start")
    return expect_ok(facts, host.name, "discover")


def _same_install(host: Host, before: dict, now: dict) -> None:
    """The series was resolved from the unlocked read: refuse if the install changed since."""
    for key in ("sglang_version", "package_root"):
        if before.get(key) != now.get(key):
            raise DeployError(f"{host.name}: SGLang's {key.replace('_', ' ')} changed from {before.get(key)} to "
                              f"{now.get(key)} while the series was prepared; nothing was changed",
                              code=Code.CHANGED, hint="rerun the command")


def _switch(sess: AgentSession, host: Host, out: Outcome, prepared: _Prepared, *, dry_run: bool, keep_lock: bool,
            progress: Progress, sending: list[str], caller_holds: bool = False) -> bool:
    """After the locked read and the plan: complete an interrupted journal, then the no-op or
    the apply, into ``out``; the part of push and rollback that runs under the lock.
    Returns whether the lock is still held.

    The unlock travels with the last request (``_finish``) unless ``keep_lock``: then an
    apply keeps the lock (the push's smoke and mark; a rollback's server restart), and so
    does a push with nothing to switch whose earlier run awaits its smoke
    (``prepared.pending``). ``caller_holds``: the session took the lock for more than this
    switch (``PushSession.rollback``): an error here never releases it (the caller does),
    and with ``keep_lock`` neither does a no-op.
    """
    out.plan = prepared.plan
    out.diff = prepared.diff
    if prepared.plan.drifted:
        out.drifted = {"files": list(prepared.plan.drifted), "backup_id": None, "folder": None,
                       "diff": prepared.drifted_diff}
    if not dry_run and prepared.complete is not None:
        progress(f"journal: complete the interrupted run ({prepared.complete['phase']})")
        try:
            done = expect_ok(sess.one(prepared.complete), host.name, "complete the journal")
        except DeployError:
            if not caller_holds:
                _finish(sess, None)  # release the lock now, not at EOF
            raise
        out.phase = done["journal"]["phase"]
    if not dry_run and prepared.plan.noop and keep_lock and (prepared.pending or caller_holds):
        out.summary = prepared.noop
        if prepared.pending:
            out.phase, out.smoke_pending = Phase.SWITCHED, prepared.pending.get("run_id")
            out.backup_id = prepared.pending.get("backup_id")
            sending.append("smoke")
        return True
    if dry_run or prepared.plan.noop:
        if not dry_run:
            extra = prepared.noop_request if prepared.plan.noop else None
            reply = _finish(sess, extra)
            if extra is not None:
                out.phase = expect_ok(reply, host.name, extra["op"])["journal"]["phase"]
        out.summary = prepared.noop if prepared.plan.noop else prepared.dry
        return False
    progress(prepared.step)
    request = prepared.request(out.run_id)
    sending.append("apply")
    done = expect_ok(sess.call(request)[0] if keep_lock else _finish(sess, request), host.name, "apply")
    out.changed = True
    out.phase = request["final_phase"]
    out.backup_id = done["backup_id"]
    out.purged, out.pruned = done["purged"], done["pruned"]
    out.history_warning = done.get("history_warning")
    out.summary = prepared.done(done)
    if out.drifted is not None and done.get("drifted_backup"):
        out.drifted.update(backup_id=done["drifted_backup"], folder=done.get("drifted_folder"))
        out.summary += (f"; the edited bytes of {len(prepared.plan.drifted)} drifted file(s) are kept in "
                        f"{done.get('drifted_folder')}")
    if keep_lock and out.phase == Phase.SWITCHED:
        out.smoke_pending = out.run_id
    return keep_lock


def _execute(command: str, host: Host, transport: Transport, paths: list[str],
             prepare: Callable[[dict, object, Progress], _Prepared], *, dry_run: bool, break_lock: bool,
             progress: Progress, resolve: Callable[[dict, Progress], object] | None = None,
             keep_lock: bool = False, content: bool = False, driver: bool = False) -> PushSession:
    """Discover, resolve, lock + discover, plan in memory, apply + unlock: the one path of
    push and rollback.

    ``resolve`` (push): facts -> what the plan needs from this side (the family, the
    release snapshot, perhaps a wheel download, the check). It runs on an unlocked read,
    so nothing slow happens while the host's lock is held; the locked read then must show
    the same install. ``keep_lock`` (push with a smoke, rollback with a server restart): a
    switch (or, for a push with nothing to switch, an earlier run still ``switched``)
    returns with the lock held, for the smoke and its mark or the restart; otherwise the
    returned session is already unlocked (see ``_switch``).
    """
    t0 = time.monotonic()
    out = Outcome(host.name, command, new_run_id())
    stack = ExitStack()
    # Decided here, where it happens: an error before the apply request (or the smoke of
    # an earlier switch) is sent left the host as it was, whatever its code.
    sending: list[str] = []
    try:
        progress("connect")
        stack.enter_context(transport)
        sess = stack.enter_context(_session(transport, host, write=True))
        resolved = None
        if resolve is not None:
            progress("discover")
            first = _discover(sess, host, paths if dry_run else [], content and dry_run, driver)
            resolved = resolve(first, progress)
        if resolve is not None and dry_run:
            facts, lock = first, None
        else:
            progress("lock + discover")
            facts, lock = _open_locked(sess, host, out.run_id, command, paths, break_lock, dry_run,
                                       init=resolve is None, content=content)
            if resolve is not None:
                try:
                    _same_install(host, first, facts)
                except DeployError:
                    _finish(sess, None)  # release the lock now, not at EOF
                    raise
        out.broke_lock = (lock or {}).get("broke")
        out.sglang_version = facts["sglang_version"]
        out.phase = (facts["journal"] or {}).get("phase")
        try:
            prepared = prepare(facts, resolved, progress)
        except DeployError:
            if not dry_run:
                _finish(sess, None)
            raise
        held = _switch(sess, host, out, prepared, dry_run=dry_run, keep_lock=keep_lock, progress=progress,
                       sending=sending)
        out.round_trips, out.connections = sess.round_trips, transport.connections
    except DeployError as exc:
        stack.close()
        if not sending or (exc.code == Code.LOST_LOCK and (getattr(exc, "reply", None) or {}).get("unchanged")):
            exc.host_unchanged = True  # read by fleet.outcome_of_error
        raise
    except BaseException:
        stack.close()
        raise
    out.seconds = time.monotonic() - t0
    if held:
        return PushSession(out, sess, host, stack)
    stack.close()
    return PushSession(out, None, host, ExitStack())


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
        sess = stack.enter_context(_session(transport, host, write=True))
        facts, lock = _open_locked(sess, host, out.run_id, command, [], break_lock, False)
    except DeployError as exc:
        stack.close()
        exc.host_unchanged = True  # read by fleet.outcome_of_error: nothing was restarted
        raise
    except BaseException:
        stack.close()
        raise
    out.broke_lock = (lock or {}).get("broke")
    out.sglang_version = facts.get("sglang_version")
    out.phase = (facts.get("journal") or {}).get("phase")
    session = PushSession(out, sess, host, stack)
    session.facts = facts
    return session


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
    seen: dict = {}

    def resolve(facts: dict, progress: Progress) -> Desired:
        progress("resolve + check the series")
        return desire(facts)

    def prepare(facts: dict, desired: Desired, progress: Progress) -> _Prepared:
        progress("drift check + plan")
        _unsafe(host, facts)
        try:
            plan = plan_push(host.name, desired, _hashes(facts), facts["journal"], replace_drifted=replace_drifted,
                             folder=_state_folder(facts))
        except DeployError as exc:
            if diff and exc.code == Code.DRIFT:  # --diff: what differs, not only which files (drift.py)
                from ddtree_deploy.session.drift import push_drift_diff

                exc.diff = push_drift_diff(desired, facts)
            raise
        name = f"{desired.series} ({desired.series_id[:12]})"
        journal = dict(facts["journal"] or {})
        noop, noop_request, complete = f"already deployed: {name}; nothing changed", None, None
        if plan.noop and journal.get("phase") == Phase.SWITCHING and journal.get("series_id") == desired.series_id:
            # A run killed after its last rename, before its journal: every file is switched.
            # Finish that run as it would have ended: `switched` (and the smoke runs) or
            # `deployed` without a smoke; never "already deployed" with no smoke at all.
            complete = _mark(journal.get("run_id"), Phase.SWITCHED if smoke else Phase.DEPLOYED, expect=Phase.SWITCHING)
            stopped = f"run {journal.get('run_id')} of {name} stopped after switching every file"
            if dry_run:
                noop = f"dry run: {stopped}; a push would complete its journal; nothing changed"
            elif smoke:
                journal["phase"] = Phase.SWITCHED
                seen.update(journal)
                noop = f"{stopped}: journal completed (switched); its smoke runs now"
            else:
                noop = f"{stopped}: journal completed and marked deployed without a smoke"
        if plan.noop and journal.get("phase") == Phase.SWITCHED and complete is None:
            seen.update(journal)
            noop = f"nothing to switch: {name} was switched by run {journal.get('run_id')}, whose smoke never passed"
            failed = (journal.get("smoke") or {}).get("failed")
            if failed:
                noop = (f"nothing to switch: {name} was switched by run {journal.get('run_id')}, whose smoke "
                        f"failed at {failed}")
            if not smoke and not dry_run:
                if failed:  # a level failed on these files: only a smoke that passes may mark them
                    noop += f"; NOT marked deployed without a smoke: {next_step.smoke_or_rollback(host.name)}"
                else:
                    noop_request = _mark(journal.get("run_id"), Phase.DEPLOYED)
                    noop += "; marked deployed without a smoke"
        return _Prepared(
            plan,
            noop=noop,
            dry=f"dry run: would switch {len(plan.changes)} of {len(plan.steps)} file(s); nothing changed",
            step=f"back up + stage + switch {len(plan.changes)} file(s)",
            request=lambda run_id: _apply_push(host, run_id, desired, plan, Phase.SWITCHED if smoke else Phase.DEPLOYED),
            drifted_diff=_replaced_diff(desired, facts, plan),
            done=lambda d: f"pushed {name}: {len(plan.changes)} file(s) switched, backup {d['backup_id']}",
            noop_request=noop_request,
            pending=dict(journal) if plan.noop and journal.get("phase") == Phase.SWITCHED and smoke else None,
            complete=complete,
            diff=plan_diff(plan, desired, facts) if diff else None,
        )

    session = _execute("push", host, transport, paths, prepare, dry_run=dry_run, break_lock=break_lock,
                       progress=progress, resolve=resolve, keep_lock=keep_lock, content=diff or replace_drifted,
                       driver=True)
    outcome = session.outcome
    if outcome.phase == Phase.SWITCHED and not dry_run and outcome.smoke_pending is None:
        outcome.smoke_pending = outcome.run_id if outcome.changed else seen.get("run_id")
        if not outcome.changed:
            outcome.backup_id = seen.get("backup_id")
    if outcome.smoke_pending is not None and outcome.smoke_pending == seen.get("run_id"):
        outcome.smoke_failed = (seen.get("smoke") or {}).get("failed")
    return session


def _mark(run_id: str | None, phase: str, smoke: dict | None = None, expect: str = Phase.SWITCHED) -> dict:
    return {"op": "mark", "run_id": run_id, "expect": expect, "phase": phase, "smoke": smoke}


def mark(host: Host, transport: Transport, run_id: str, phase: str = Phase.DEPLOYED, *, smoke: dict | None = None,
         progress: Progress = quiet) -> dict:
    """After the smoke: move the journal of ``run_id`` from ``switched`` to ``phase`` (one round trip).

    Compare-and-set under the deploy lock: it fails (code ``changed``) when the journal no
    longer records that run in phase ``switched``, so a stale controller never marks a deploy
    made since by someone else. ``smoke`` (e.g. the failed level) is recorded in the journal.
    Returns the journal as written.
    """
    progress(f"journal: {phase}")
    with transport, _session(transport, host, write=True) as sess:
        init, lock, marked, _unlock = sess.call(_init(host), _lock(new_run_id(), "mark", False),
                                                _mark(run_id, phase, smoke), {"op": "unlock"})
    expect_ok(init, host.name, "agent start")
    if not lock.get("ok"):
        if lock.get("code") == Code.LOCKED:
            raise _locked_error(host, lock)
        expect_ok(lock, host.name, "lock")
    return expect_ok(marked, host.name, "mark")["journal"]


def plan_diff(plan: Plan, desired: Desired, facts: dict) -> str:
    """Pure: the unified diff from each host file the plan changes (its bytes in ``facts``,
    read with ``content``) to the file the push writes; "" when nothing changes. Like
    ``ansible-playbook --check --diff``: what each host would get, per file."""
    by_path = {t.path: t for t in desired.targets}
    out = []
    for step in plan.changes:
        info = (facts.get("files") or {}).get(step.path)
        old = base64.b64decode(info["data"]) if info and info.get("data") is not None else None
        new = by_path[step.path].data
        # Text for people: bytes that are not UTF-8 show as U+FFFD, never fail the push.
        old_text = "" if old is None else old.decode("utf-8", errors="replace")
        hunks = diff_hunks(old_text, new.decode("utf-8", errors="replace"))
        if not hunks:
            continue
        out.append(f"--- {'/dev/null' if old is None else 'a/' + step.path}\n+++ b/{step.path}\n")
        out.extend(text for _line, text in hunks)
    return "".join(out)


def _state_folder(facts: dict) -> StateFolder:
    """Where the host keeps this install's state, and its newest backup (for messages)."""
    backups = facts.get("backups") or []
    return StateFolder(facts.get("state_home"), backups[-1].get("id") if backups else None)


def _replaced_diff(desired: Desired | None, facts: dict, plan: Plan) -> str:
    """--replace-drifted: each drifted file the plan replaces, from what the series expects
    there to the host's bytes (drift.py); "" when none, or the series is unknown here."""
    if not plan.drifted or desired is None:
        return ""
    from ddtree_deploy.session.drift import expected_diff

    return expected_diff(desired, facts, plan.drifted)


def _apply_push(host: Host, run_id: str, desired: Desired, plan: Plan, final_phase: str = Phase.DEPLOYED) -> dict:
    by_path = {t.path: t for t in desired.targets}
    # A drifted or missing file the plan replaces: its original may be nowhere on the host
    # (drift on a host never pushed to), so the snapshot's pristine bytes travel for its backup.
    replaced = {s.path for s in plan.steps if s.state in (FileState.DRIFTED, FileState.MISSING)}
    files = []
    for step in plan.changes:
        t = by_path[step.path]
        files.append({"path": t.path, "expect": step.current, "want": t.patched, "mode": t.mode,
                      "data": base64.b64encode(t.data).decode("ascii")})
    meta = {"series": desired.series, "series_id": desired.series_id, "sglang_version": desired.sglang_version}
    return {
        "op": "apply",
        "kind": "push",
        "run_id": run_id,
        "files": files,
        "make_backup": True,
        # Back up every target, not only the changing ones: a rollback restores the whole set.
        "backup": [{"path": t.path, "pristine": t.pristine, "mode": t.mode}
                   | ({"data": base64.b64encode(t.original).decode("ascii")}
                      if t.path in replaced and t.original is not None else {}) for t in desired.targets],
        "backup_meta": meta,
        "keep_drifted": list(plan.drifted),
        "journal": dict(meta, snapshot=desired.snapshot,
                        files={t.path: {"pristine": t.pristine, "patched": t.patched} for t in desired.targets}),
        "final_phase": final_phase,
        "keep_backups": host.keep_backups,
    }


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
    session = _execute("rollback", host, transport, [], _rollback_plan(host, to, replace_drifted, automatic),
                       dry_run=dry_run, break_lock=break_lock, progress=progress, keep_lock=keep_lock,
                       resolve=resolve, content=replace_drifted)
    session.outcome.backup_id = session.outcome.plan.backup_id if session.outcome.plan else None
    return session


def _rollback_plan(host: Host, to: str | None,
                   replace_drifted: bool = False,
                   automatic: dict | None = None) -> Callable[[dict, Desired | None, Progress], _Prepared]:
    """The rollback's ``prepare`` (facts read under the lock, and with ``--replace-drifted``
    what the series expects, resolved before the lock -> what to switch): one for the
    ``rollback`` command and the automatic rollback under a push's lock alike."""

    def prepare(facts: dict, expected: Desired | None, progress: Progress) -> _Prepared:
        _unsafe(host, facts)
        if not facts["backups"] and not facts["journal"] and to is None:
            # Never pushed (no journal, no backup): it is where a rollback leaves a host, so a
            # fleet rollback over a host a stopped push skipped is no failure there.
            return _Prepared(Plan("rollback", host.name, ()), noop="nothing to roll back: no push ever switched a "
                             "file on this host (no journal, no backup)", dry="dry run: nothing to roll back (never "
                             "pushed)", step="", request=lambda run_id: {}, done=lambda d: "")
        manifest = _choose_backup(host, facts["backups"], to)
        plan = plan_rollback(host.name, manifest, _hashes(facts), facts["journal"], replace_drifted=replace_drifted,
                             folder=_state_folder(facts))
        bid = manifest["id"]
        journal = facts["journal"] or {}
        complete, noop = None, f"already at backup {bid}; nothing changed"
        if plan.noop and journal.get("phase") in (Phase.STAGED, Phase.SWITCHING):
            # Every file is already at the backup (a rollback killed after its last rename, or
            # a push killed before its first): the journal must not stay `switching`.
            complete = _mark(journal.get("run_id"), Phase.ROLLED_BACK, expect=journal.get("phase"))
            noop = (f"completed: every file is at backup {bid} (run {journal.get('run_id')} stopped "
                    f"while {journal.get('phase')}); journal marked rolled-back")
        return _Prepared(
            plan,
            complete=complete,
            noop=noop,
            dry=f"dry run: would restore {len(plan.changes)} file(s) from {bid}; nothing changed",
            step=f"stage + switch {len(plan.changes)} file(s) from backup {bid}",
            request=lambda run_id: _apply_rollback(host, run_id, manifest, plan, facts["journal"], automatic),
            done=lambda d: f"rolled back {len(plan.changes)} file(s) to backup {bid} (sha256 verified)",
            drifted_diff=_replaced_diff(expected, facts, plan),
        )

    return prepare


def _apply_rollback(host: Host, run_id: str, manifest: dict, plan: Plan, journal: dict | None,
                    automatic: dict | None = None) -> dict:
    journal = dict(journal or {})
    journal.pop("phase", None)
    journal.pop("automatic", None)  # an earlier automatic rollback's cause says nothing about this one
    if automatic is not None:
        journal["automatic"] = automatic
    return {
        **({"automatic": automatic} if automatic is not None else {}),
        "op": "apply",
        "kind": "rollback",
        "run_id": run_id,
        "files": [{"path": s.path, "expect": s.current, "want": s.want,
                   "mode": manifest["files"][s.path].get("mode") or 0o644} for s in plan.changes],
        "from_backup": manifest["id"],
        "backup_id": manifest["id"],
        "make_backup": False,
        "journal": journal,  # the series stays recorded: status can still tell patched from pristine
        "final_phase": Phase.ROLLED_BACK,
        "keep_drifted": list(plan.drifted),
        "keep_backups": host.keep_backups,
    }


def _choose_backup(host: Host, backups: list[dict], to: str | None) -> dict:
    if not backups:
        raise DeployError(f"{host.name}: no backups on the host to restore from", code=Code.NO_BACKUP,
                          hint=f"see what the files are with {next_step.status(host.name)}")
    if to is None:
        return backups[-1]  # ids start with a UTC timestamp: the last is the newest
    for b in backups:
        if b["id"] == to:
            return b
    raise BadInput(f"{host.name}: no backup {to!r}; on the host: {', '.join(b['id'] for b in backups)}")


# ---------------------------------------------------------------- status and pull


@dataclass
class Reading:
    """A read-only agent session's first answer (``facts``), and the way to ask more on it."""

    facts: dict
    transport: Transport
    _sess: AgentSession
    _host: Host

    def ask(self, request: dict) -> dict:
        """One more read-only request over this session (e.g. the history's switches)."""
        return expect_ok(self._sess.one(request), self._host.name, request["op"])

    @property
    def round_trips(self) -> int:
        return self._sess.round_trips


@contextmanager
def reading(host: Host, transport: Transport, paths: list[str] = (), content: bool = False,
            driver: bool = False) -> Iterator[Reading]:
    """A read-only agent session (takes no lock): [init, facts] in one round trip; the caller
    may ``ask`` more on it (the serving processes' record) before it closes. ``content``
    (``status --diff``): the facts carry the files' bytes too; ``driver`` (status): the
    host's NVIDIA driver as nvidia-smi says it."""
    with transport, _session(transport, host, write=False) as sess:
        request = {"op": "facts", "paths": list(paths), "content": content}
        if driver:
            request["driver"] = True
        init, facts = sess.call(_init(host), request)
        expect_ok(init, host.name, "agent start")
        expect_ok(facts, host.name, "discover")
        yield Reading(facts, transport, sess, host)


def status(host: Host, transport: Transport, paths: list[str] = (), desired: Desired | None = None) -> dict:
    """The host's state as one JSON-able document (read-only: takes no lock); ``desired``:
    what the series wants there (``describe``). A caller that resolves the series from the
    host's facts, or looks at its serving processes, reads with ``reading`` and ``describe``s."""
    with reading(host, transport, paths) as read:
        pass
    return describe(host.name, read.facts, desired, read.round_trips)


def describe(name: str, facts: dict, desired: Desired | None, round_trips: int = 0) -> dict:
    """Pure: facts (+ optionally what the series wants) -> the status document."""
    journal = facts.get("journal")
    current = _hashes(facts)
    expect: dict[str, tuple[str | None, str | None]] = {}
    if journal:
        expect.update({p: (e.get("pristine"), e.get("patched")) for p, e in journal.get("files", {}).items()})
    if desired is not None:
        for t in desired.targets:
            expect.setdefault(t.path, (t.pristine, t.patched))
    files = []
    unsafe = {p: i["unsafe"] for p, i in (facts.get("files") or {}).items() if i and "unsafe" in i}
    # Paths of other families (the CLI asks for every family's paths before it knows the
    # host's release) say nothing about this host: once its files are known, only they count.
    shown = (set(expect) if expect else {p for p, sha in current.items() if sha}) | set(unsafe)
    for path in sorted(shown):
        pristine, patched = expect.get(path, (None, None))
        state = classify(current.get(path), pristine, patched) if path in expect else None
        entry = {"path": path, "state": state.value if state else "unknown", "sha256": current.get(path)}
        if path in unsafe:  # a symlink: never read through, reported by name
            entry.update(state="unsafe", detail=unsafe[path])
        files.append(entry)
    return {
        "host": name,
        "sglang_version": facts.get("sglang_version"),
        "package_root": facts.get("package_root"),
        "phase": (journal or {}).get("phase", Phase.NEVER_DEPLOYED),
        # The files disagree with the journal's phase (see disagreement): the host is MIXED
        # whatever the journal says, and the explanation starts with that.
        "mixed": disagreement(journal, files) is not None,
        "explanation": explain(journal, files, name),
        "series": ({"name": journal.get("series"), "id": journal.get("series_id"), "run_id": journal.get("run_id"),
                    "updated": journal.get("updated"), "backup_id": journal.get("backup_id")} if journal else None),
        "files": files,
        "backups": [{"id": b["id"], "created": b.get("created"), "series": b.get("series")}
                    for b in facts.get("backups", [])],
        # Files edited outside ddtree-deploy that --replace-drifted replaced: kept, as found.
        "drifted_backups": [_kept(d) for d in facts.get("drifted") or () if isinstance(d, dict)],
        "lock": facts.get("lock"),
        # This install's state folder, and every install keeping state in the same state folder.
        "state_home": facts.get("state_home"),
        "installs": [i for i in facts.get("installs") or () if isinstance(i, dict)],
        "round_trips": round_trips,
    }


def _kept(manifest: dict) -> dict:
    """A kept-edits manifest as status shows it: where each file's bytes are on the host."""
    folder = str(manifest.get("folder") or "")
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    return {"id": manifest.get("id"), "created": manifest.get("created"), "run_id": manifest.get("run_id"),
            "command": manifest.get("command"), "folder": folder or None,
            "files": [{"path": p, "sha256": (e or {}).get("sha256"),
                       "file": f"{folder}/{(e or {}).get('file')}" if folder and (e or {}).get("file") else None}
                      for p, e in sorted(files.items())]}


def explain(journal: dict | None, files: list[dict], host: str = "HOST") -> str:
    """One sentence saying what state the host is in and what to run next."""
    counts: dict[str, int] = {}
    for f in files:
        counts[f["state"]] = counts.get(f["state"], 0) + 1
    tally = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no files known"
    if not journal:
        return f"never deployed by ddtree-deploy ({tally})"
    op, phase, run = journal.get("op"), journal.get("phase"), journal.get("run_id")
    mixed = disagreement(journal, files)
    if mixed is not None:
        return (f"MIXED: the journal says {phase} ({op} run {run}) but {mixed} ({tally}): an import of SGLang may "
                f"fail; rerun {next_step.push(host)} to complete the series or {next_step.rollback(host)} to "
                "restore the backup")
    bad = counts.get(FileState.DRIFTED.value, 0) + counts.get(FileState.MISSING.value, 0) + counts.get("unsafe", 0)
    suffix = f"; {bad} file(s) changed outside ddtree-deploy" if bad else ""
    edited = counts.get(FileState.DRIFTED.value, 0) + counts.get(FileState.MISSING.value, 0)
    if edited:  # the way through: see them, then replace them with the edits kept
        suffix += (f" ({next_step.status_diff(host)} shows them; {next_step.replace_drifted('push', host)} or "
                   f"{next_step.rollback(host, drifted=True)} keeps their bytes in a backup of their own and "
                   "replaces them)")
    serve = journal.get("serve") if isinstance(journal.get("serve"), dict) else {}
    if serve.get("run_id") != run:
        serve = {}  # a restart for files switched since: it says nothing about these
    restarted = _restart_clause(serve)
    if phase == Phase.DEPLOYED:
        return f"deployed {journal.get('series')} by run {run} ({tally}){restarted}{suffix}"
    if phase == Phase.SWITCHED and serve:
        return (f"files patched by run {run} ({tally}); its smoke passed and the server was restarted"
                f"{restarted}, so the host is not marked deployed: {next_step.push_or_rollback(host)}{suffix}")
    if phase == Phase.SWITCHED:
        failed = (journal.get("smoke") or {}).get("failed")
        why = f" (it failed at {failed})" if failed else ""
        return (f"files patched by run {run} ({tally}); the smoke has not passed{why}: "
                f"{next_step.smoke_or_rollback(host)}{suffix}")
    if phase == Phase.ROLLED_BACK:
        auto = journal.get("automatic") if isinstance(journal.get("automatic"), dict) else None
        how = (f" automatically after push run {auto.get('push_run')} ({cause_words(auto)})" if auto else "")
        return f"rolled back{how} to backup {journal.get('backup_id')} by run {run} ({tally}){restarted}{suffix}"
    if phase == Phase.STAGED:
        return (f"{op} run {run} stopped after staging, before any file changed ({tally}); "
                f"rerun `{op}` to complete it{suffix}")
    if phase == Phase.SWITCHING:
        return (f"{op} run {run} was interrupted while switching files ({tally}); each file is wholly old or new; "
                f"rerun `{op}` to complete it" + (" or `rollback` to restore the backup" if op == "push" else "")
                + suffix)
    return f"journal phase {phase!r} ({tally}){suffix}"


def cause_words(automatic: dict) -> str:
    """An automatic rollback's cause in a few words: "smoke failed at import", "server health"."""
    cause, step = automatic.get("cause"), automatic.get("step")
    if cause == "smoke":
        return f"smoke failed at {step}"
    if cause == "analysis":  # the speed gate: slower than the baseline, not proven, or the server died
        return "speed analysis failed" if step in (None, "analysis") else f"speed analysis: {step}"
    return f"server {step or cause} failed after the restart"


def _restart_clause(serve: dict) -> str:
    """The journal's newest server restart, as a clause of ``explain`` ("" when none)."""
    state, when = serve.get("state"), serve.get("time")
    if not state:
        return ""
    if state == "healthy":
        return f"; server restarted {when}, healthy then"  # (now: the serving line's health, status' attention)
    if state == "restarting":
        return (f"; a server restart began {when} and its end was never recorded (interrupted, or the "
                "connection lost): whether the server is healthy is unknown")
    if state == "interrupted":
        return f"; the server restart of {when} was interrupted (Ctrl-C) before its health was confirmed"
    return f"; the server restart of {when} left it NOT healthy ({serve.get('failed')}: {serve.get('detail')})"


def disagreement(journal: dict | None, files: list[dict]) -> str | None:
    """Pure: how the files contradict the journal's phase, in words, or None when they agree.

    ``deployed`` and ``switched`` mean every file is patched, ``rolled-back`` every file
    pristine, ``staged`` nothing switched yet (all on one side). Only ``switching`` may be
    mixed: a switch under way or interrupted, which its explanation says. Drifted, missing
    and unsafe files are told apart by the explanation (changed outside ddtree-deploy)."""
    phase = (journal or {}).get("phase")
    pristine = sum(1 for f in files if f["state"] == FileState.PRISTINE.value)
    patched = sum(1 for f in files if f["state"] == FileState.PATCHED.value)
    if phase in (Phase.DEPLOYED, Phase.SWITCHED) and pristine:
        return f"{pristine} of its file(s) {'is' if pristine == 1 else 'are'} pristine (not patched)"
    if phase == Phase.ROLLED_BACK and patched:
        return f"{patched} of its file(s) {'is' if patched == 1 else 'are'} still patched"
    if phase == Phase.STAGED and pristine and patched:
        return f"{patched} file(s) are patched and {pristine} pristine, though no file should have changed yet"
    return None


def ask(host: Host, transport: Transport, request: dict) -> dict:
    """One read-only agent request over an open ``transport``: [init, request], one round trip."""
    with _session(transport, host, write=False) as sess:
        init, reply = sess.call(_init(host), request)
    expect_ok(init, host.name, "agent start")
    return expect_ok(reply, host.name, request["op"])


def pull(host: Host, transport: Transport, paths: list[str]) -> tuple[dict, dict[str, bytes | None]]:
    """The host's SGLang version/root facts and the bytes of ``paths`` (None: absent)."""
    with transport, _session(transport, host, write=False) as sess:
        init, facts = sess.call(_init(host), {"op": "facts", "paths": list(paths), "content": True,
                                              "include_state_paths": False})
        expect_ok(init, host.name, "agent start")
        expect_ok(facts, host.name, "discover")
    got = facts.get("files") or {}
    # Only what was asked for: a file the host adds to its answer is never stored.
    extra = sorted(set(got) - set(paths))
    missing = sorted(set(paths) - set(got))
    if extra or missing:
        raise DeployError(f"{host.name}: the host answered for other files than asked "
                          f"({'extra: ' + extra[0] if extra else 'missing: ' + missing[0]}); nothing was stored",
                          code=Code.AGENT)
    _unsafe(host, facts)
    files = {p: (base64.b64decode(got[p]["data"]) if got[p] else None) for p in paths}
    return facts, files


def patched_paths(facts: dict, files: dict[str, bytes | None]) -> list[str]:
    """Paths whose bytes are the patched version the host's journal records (not pristine)."""
    recorded = (facts.get("journal") or {}).get("files", {})
    out = []
    for path, data in files.items():
        entry = recorded.get(path) or {}
        have = None if data is None else sha256(data)
        if have is not None and have == entry.get("patched") and have != entry.get("pristine"):
            out.append(path)
    return out


def not_pristine(host: str, facts: dict, files: dict[str, bytes | None]) -> DeployError | None:
    """``snapshot pull``'s refusal when some of ``files`` are the patched version the journal
    records (None: every file may be taken as pristine): where the originals are, and the
    rollback that gets there (``--replace-drifted`` where other files were edited by hand,
    which a plain rollback refuses)."""
    patched = patched_paths(facts, files)
    if not patched:
        return None
    recorded = (facts.get("journal") or {}).get("files", {})
    edited = any(path in files and (None if files[path] is None else sha256(files[path]))
                 not in (entry.get("pristine"), entry.get("patched"))
                 for path, entry in recorded.items() if isinstance(entry, dict))
    return DeployError(f"{host}: {', '.join(patched)} are patched by ddtree-deploy, not pristine"
                       f"{_state_folder(facts).originals}",
                       code=Code.NOT_PRISTINE, hint=f"roll back first: {next_step.rollback(host, drifted=edited)}")


__all__ = ["AgentFailed", "Outcome", "PushSession", "ask", "automatic_cause", "cause_words", "begin_push",
           "begin_rollback", "describe", "hold", "not_pristine", "patched_paths", "explain", "mark", "pull", "push",
           "rollback", "status", "Reading", "reading"]
