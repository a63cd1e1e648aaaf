"""The journal: what is deployed on the host and how far its switch got.

``journal.json`` (state.py's layout) is written by temp + rename, only under the deploy
lock (``fenced``): ``staged``, ``switching``, then the apply's final phase (``switched``
until the smoke passed, ``deployed``, ``rolled-back``). ``mark`` moves it on for the run the
caller saw (compare-and-set); ``served`` records the newest restart of the host's server.
"""

import json

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import wire
from ddtree_deploy.hostprog.fileops import AgentError, remove_quietly, write_json_atomic


class Journal(object):
    """The journal's writes and the ``mark`` and ``served`` ops. Collaborators: ``folder``
    (state.StateFolder), ``held`` (lock.HeldLock: whether this run holds the lock),
    ``lock`` (lock.Lock: every write fenced), ``history`` (history.History)."""

    def __init__(self, folder, held, lock, history):
        self.folder = folder
        self.held = held
        self.lock = lock
        self.history = history
        self.last_journal = None  # the journal this run last wrote (None: none yet in this apply)

    def write(self, journal, phase):
        journal["phase"] = phase
        journal["updated"] = wire.now_iso()
        with self.lock.fenced("the journal write (phase %s)" % phase):
            write_json_atomic(self.folder.path("journal.json"), journal)
            self.last_journal = json.loads(json.dumps(journal))

    def restore(self, previous):
        """Put the journal back as it was before this op (the host is as it was): only if this
        op wrote it, and only while this run holds the lock (else AgentError lost-lock)."""
        if self.last_journal is None:
            return
        with self.lock.fenced("restoring the journal"):
            try:
                if previous is None:
                    remove_quietly(self.folder.path("journal.json"))
                else:
                    write_json_atomic(self.folder.path("journal.json"), previous)
            except OSError:
                pass  # it said `staged` at most, which status explains as "before any file changed"

    def op_mark(self, request):
        """Move the journal from one phase to the next, compare-and-set on run id and phase.

        ``switched`` -> ``deployed`` once the smoke passed (or ``switched`` -> ``switched``
        to record a failed smoke level): only for the run the caller saw, so a stale
        controller can never mark a deploy made by someone else since.
        """
        if not self.held.locked:
            raise AgentError(Code.PROTOCOL, "mark needs the deploy lock")
        journal = wire.read_json(self.folder.path("journal.json"))
        if journal and journal.get("run_id") == request["run_id"] and journal.get("phase") == request["phase"] \
                and request.get("smoke") is None:
            return {"journal": journal, "already": True}  # a rerun after a lost reply
        if not journal or journal.get("run_id") != request["run_id"] or journal.get("phase") != request["expect"]:
            j = journal or {}
            raise AgentError(Code.CHANGED, "the journal is at phase %s of run %s, not %s of run %s"
                             % (j.get("phase"), j.get("run_id"), request["expect"], request["run_id"]),
                             journal=journal)
        if request.get("smoke") is not None:
            journal["smoke"] = request["smoke"]
        try:
            self.write(journal, request["phase"])
        except AgentError as exc:
            if exc.code != Code.LOST_LOCK:
                raise
            raise AgentError(Code.LOST_LOCK, "run %s lost the deploy lock before marking the journal %s (%s); nothing "
                             "was written" % ((self.held.owner or {}).get("run_id"), request["phase"],
                                              self.lock.lock_taker()), unchanged=True)
        reply = {"journal": journal}
        warning = self.history.record("mark", outcome="ok", phase=request["phase"], marked_run=journal.get("run_id"),
                                      series=journal.get("series"), series_id=journal.get("series_id"),
                                      smoke=request.get("smoke"))
        if warning:
            reply["history_warning"] = warning
        return reply

    # -- a restart of the host's server (issue 25: serve/run.py runs it; this records it)

    def op_served(self, request):
        """Record a restart of the host's serving server: the journal keeps the newest record
        under ``serve`` (its phase unchanged: a restart switches no file), and a finished
        restart (``history``) appends a ``restart`` line to the history.

        Under the deploy lock, like every journal write. ``serve``: {state (restarting,
        healthy, unhealthy, interrupted), run_id (the switch whose files it serves), ...}.
        """
        if not self.held.locked:
            raise AgentError(Code.PROTOCOL, "served needs the deploy lock")
        serve = request.get("serve")
        if not isinstance(serve, dict):
            raise AgentError(Code.PROTOCOL, "served needs a serve record")
        with self.lock.fenced("recording the server restart (%s)" % serve.get("state")):
            journal = wire.read_json(self.folder.path("journal.json"))
            if journal and serve.get("state") != RESTARTING and _ended_here(journal, serve.get("restart_run")):
                return {"journal": journal, "already": True}  # the serve program recorded it: said once
            if journal:
                journal["serve"] = serve
                write_json_atomic(self.folder.path("journal.json"), journal)
        reply = {"journal": journal}
        if request.get("history"):
            warning = self.history.record("restart", outcome=serve.get("state"), phase=(journal or {}).get("phase"),
                                          series=(journal or {}).get("series"),
                                          series_id=(journal or {}).get("series_id"), serve=serve)
            if warning:
                reply["history_warning"] = warning
        return reply

    def record_restart_end(self, serve, holder=None, command=None):
        """The serve program's own record of a restart's end (``serve``: its journal record),
        so that a restart whose controller is gone (Ctrl-C, a cut link) does not stay
        ``restarting`` for ever. Compare-and-set, under the guard: written only while the
        journal still records this restart (``restart_run``) as ``restarting`` and no other
        live run holds the deploy lock; then one ``restart`` line in the history. The
        controller's own ``served`` for it afterwards finds it recorded (``already``).
        -> True when written here, False when there was nothing to write."""
        run = serve.get("restart_run")
        with self.lock.guarded():
            held = self.lock.read_lock()
            if held is not None and held.get("run_id") != run and not held.get("stale"):
                return False  # another run acts on the host now: its journal is not ours to write
            journal = wire.read_json(self.folder.path("journal.json"))
            current = journal.get("serve") if isinstance(journal, dict) else None
            if not isinstance(current, dict) or current.get("state") != RESTARTING or current.get("restart_run") != run:
                return False
            journal["serve"] = dict(serve, recorded_by=RECORDED_BY_HOST)
            write_json_atomic(self.folder.path("journal.json"), journal)
        self.history.record("restart", holder=holder, run_id=run, command=command, outcome=serve.get("state"),
                            phase=journal.get("phase"), series=journal.get("series"),
                            series_id=journal.get("series_id"), serve=journal["serve"])
        return True


RESTARTING = "restarting"  # serve_run.RESTARTING: a restart whose end is not recorded yet
RECORDED_BY_HOST = "serve program"  # the journal's serve record, written by the host's serve program


def _ended_here(journal, run):
    """The journal already holds the end of restart ``run``, recorded by the serve program."""
    current = journal.get("serve") if isinstance(journal, dict) else None
    return (isinstance(current, dict) and current.get("restart_run") == run and current.get("state") != RESTARTING
            and current.get("recorded_by") == RECORDED_BY_HOST)
