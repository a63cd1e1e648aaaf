"""The audit history: one JSON line per push, rollback, mark, restart, lock break and release.

``history.jsonl`` is appended to (never rewritten) with one write per line; past
``HISTORY_MAX_BYTES`` it moves to ``history.1.jsonl`` (the older one dropped). A line that
is not an entry this agent could have written is skipped and counted, never trusted.
``history`` reads the newest entries; ``switches`` what tells whether a server that started
at a given time runs the bytes the files hold now.
"""

import errno
import json
import os
import socket
import sys

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import roots, wire
from ddtree_deploy.hostprog.fileops import AgentError, describe_os_error
from ddtree_deploy.hostprog.state import HISTORY, HISTORY_OLD, STATE_MARKER

# Rotation bound: history.jsonl moves to history.1.jsonl (dropping the older one) once it
# holds this much, so the host keeps the newest 4-8 MiB (~10,000+ entries).
HISTORY_MAX_BYTES = 4 << 20


class History(object):
    """The audit history's lines and the ``speed``, ``history`` and ``switches`` ops.
    Collaborators: ``folder`` (state.StateFolder), ``package`` (facts.PackageRoot: which
    install a line is about, and its files for ``switches``), ``held`` (lock.HeldLock: the
    holder each line names)."""

    def __init__(self, folder, package, held):
        self.folder = folder
        self.package = package
        self.held = held

    def op_speed(self, request):
        """Record the speed gate's figures in the history (one ``speed`` line): a push's
        baseline before its switch, its verdict with the figures before and after, or the
        figures around a restart or a rollback (serve/bake.py writes ``speed``). Under the
        deploy lock, like every record of what a run did; the journal is not touched. One op
        for both programs that keep a history: the agent (a [serve] host) and the container
        program (a [container] host's bake), so their ``speed`` lines are the same."""
        if not self.held.locked:
            raise AgentError(Code.PROTOCOL, "speed needs the deploy lock")
        speed = request.get("speed")
        if not isinstance(speed, dict):
            raise AgentError(Code.PROTOCOL, "speed needs a speed record")
        journal = wire.read_json(self.folder.path("journal.json")) or {}
        warning = self.record("speed", outcome=str(speed.get("outcome") or speed.get("stage") or "?"),
                              phase=journal.get("phase"), series=journal.get("series"),
                              series_id=journal.get("series_id"), speed=speed)
        return {"history_warning": warning} if warning else {}

    def record(self, event, holder=None, run_id=None, command=None, **fields):
        """Append one JSON line to history.jsonl; a warning string when that failed, else None.

        Never raises: the history is evidence, not a step of the deploy, so a full disk or
        an unwritable file leaves the op's result as it is and the reply carries the warning.
        One os.write of the whole line on an O_APPEND descriptor: concurrent appenders
        (a lock release beside a push) never interleave inside a line.
        """
        owner = self.held.owner or {}
        holder = holder if holder is not None else owner.get("holder")
        entry = {
            "time": wire.now_iso(),
            "event": event,
            "holder": holder,
            # The controller's host name: holder_name() is user@host on the controller.
            "from": holder.rsplit("@", 1)[1] if isinstance(holder, str) and "@" in holder else None,
            "run_id": run_id if run_id is not None else owner.get("run_id"),
            "command": command if command is not None else owner.get("command"),
            "host": socket.gethostname(),
            # Which install the line is about (one state folder may hold several: roots.py).
            "package_root": roots.resolved(self.package.root) if self.package.root else None,
            "python": sys.executable,
        }
        entry.update(fields)
        try:
            line = (json.dumps(entry, sort_keys=False) + "\n").encode()
            path = self.folder.path(HISTORY)
            try:
                if os.lstat(path).st_size >= HISTORY_MAX_BYTES:
                    os.rename(path, self.folder.path(HISTORY_OLD))
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: nothing yet, or a concurrent rotation won
                    raise
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                end = os.lseek(fd, 0, os.SEEK_END)
                if end and os.pread(fd, 1, end - 1) != b"\n":
                    line = b"\n" + line  # a torn line (a full disk before): end it, keep ours whole
                view = memoryview(line)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
        except Exception as exc:  # noqa: BLE001 -- never fail the op over its record
            what = describe_os_error(exc, self.folder.path(HISTORY)) if isinstance(exc, OSError) else str(exc)
            return "the audit history was not written: %s" % what
        return None

    def read_history(self):
        """Every history entry, oldest first: [(file name, entry)], and how many lines were
        skipped (torn by a full disk or a crash, or not an entry we wrote)."""
        entries, unreadable = [], 0
        for name in (HISTORY_OLD, HISTORY):
            path = self.folder.path(name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                for raw in f.read().splitlines():
                    if not raw.strip():
                        continue
                    doc = parse_history_line(raw)
                    if doc is None:
                        unreadable += 1
                    else:
                        entries.append((name, doc))
        return entries, unreadable

    def op_history(self, request):
        """Read-only: the newest ``limit`` history entries, newest first."""
        self.folder.need_state_dir()
        limit = int(request.get("limit") or 20)
        entries, unreadable = self.read_history()
        return {"entries": [doc for _name, doc in reversed(entries[-limit:])] if limit > 0 else [],
                "total": len(entries), "unreadable": unreadable,
                "files": [n for n in (HISTORY, HISTORY_OLD) if os.path.isfile(self.folder.path(n))]}

    def op_switches(self, request):
        """Read-only: what tells whether a server that started at ``since`` (seconds, this
        host's clock) runs the bytes the files hold now (serve_plan.loaded_now decides):

        ``current``: each of ``paths`` and of the files those switches name: sha256 and ctime
        now (null: absent); ``switches``: every push or rollback line whose renames may have
        ended at or after ``since``, oldest first (time, run, outcome, per-file from/to, the
        renames' ``began``/``ended``: null on an older agent's line); ``before``: each file's
        sha256 after the newest switch that ended before ``since``; ``complete_since``: from
        when the retained history holds every switch (null: unknown)."""
        self.folder.need_state_dir()
        mine = roots.resolved(self.package.package_root())
        since = float(request["since"])
        entries, unreadable = self.read_history()
        switches, before = [], {}
        for _name, e in entries:
            if e.get("event") not in ("push", "rollback") or not isinstance(e.get("files"), dict):
                continue
            if e.get("package_root") is not None and roots.resolved(e["package_root"]) != mine:
                continue  # another install's switch (a folder shared before this layout): not these files
            began, ended = e.get("switch_began"), e.get("switch_ended")
            if "switch_began" in e and began is None:
                continue  # no rename began: no file changed
            end = ended if "switch_began" in e else (wire.iso_seconds(e.get("time")) or since) + 1
            if end is not None and end < since:
                for path, f in e["files"].items():
                    if not isinstance(f, dict):
                        continue
                    if e.get("outcome") in ("ok", "failed-unchanged"):
                        before[path] = f.get("to") if e.get("outcome") == "ok" else f.get("from")
                    else:
                        before.pop(path, None)  # a switch that failed part-way: unknown since
                continue
            switches.append({"time": e.get("time"), "event": e.get("event"), "run_id": e.get("run_id"),
                             "outcome": e.get("outcome"), "began": began, "ended": ended, "files": e["files"]})
        current = {}
        for rel in sorted(set(request.get("paths") or ()) | set(p for w in switches for p in w["files"])):
            try:
                path = self.package.target(rel)
                st = os.stat(path)
                current[rel] = {"sha256": wire.sha256_file(path), "ctime": st.st_ctime}
            except AgentError:
                continue  # not a file of ours to read (a symlink, a bad path): the record cannot vouch for it
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise
                current[rel] = None
        return {"current": current, "switches": switches, "before": before,
                "complete_since": self.history_complete_since(entries), "unreadable": unreadable}

    def history_complete_since(self, entries):
        """From when (seconds) the retained history holds every switch made from this root's
        state folder: after a rotation, the second after history.1.jsonl's first line (older
        lines were dropped); without one, from the start (0) when the folder's root.json says
        so (the agent made it, and no other install's state was ever mixed in: roots.py) or,
        for an earlier layout's folder, when the agent made the state folder (nothing was
        switched from it before its first line); in a folder adopted from before the marker,
        from its first line. None: nothing tells."""
        rotated = [doc for name, doc in entries if name == HISTORY_OLD]
        if rotated or os.path.isfile(self.folder.path(HISTORY_OLD)):
            first = wire.iso_seconds(rotated[0].get("time")) if rotated else None
            return None if first is None else first + 1
        record = self.folder.root_record()
        if record is not None:
            if record.get("history_since") == 0:
                return 0.0
        else:
            marker = wire.read_json(self.folder.top(STATE_MARKER))
            if isinstance(marker, dict) and marker.get("adopted") is False:
                return 0.0
        first = wire.iso_seconds(entries[0][1].get("time")) if entries else None
        return None if first is None else first + 1

    def history_tail(self, nbytes=1 << 18):
        """The newest history entries (from the last ``nbytes`` of the file), newest first."""
        try:
            with open(self.folder.path(HISTORY), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                lines = f.read().splitlines()
        except OSError:
            return []
        entries = (parse_history_line(raw) for raw in reversed(lines))
        return [e for e in entries if e is not None]


# What each field of a history entry holds (``record`` writes these); an entry whose field
# holds another type was not written by this agent (edited by hand, another tool), and its
# reader would trip over it: skipped and counted. Unknown fields are kept (newer agents).
HISTORY_TYPES = {
    "time": (str,), "event": (str,), "holder": (str,), "from": (str,), "run_id": (str,), "command": (str,),
    "host": (str,), "outcome": (str,), "phase": (str,), "series": (str,), "series_id": (str,),
    "sglang_version": (str,), "backup_id": (str,), "marked_run": (str,), "error": (str,), "files": (dict,),
    "previous": (dict,), "smoke": (dict,), "switch_began": (int, float), "switch_ended": (int, float),
    "package_root": (str,), "python": (str,), "drifted_backup": (str,), "automatic": (dict,),
    "speed": (dict,),
}
# Entries nest a few levels (files -> path -> from/to); deeper is not ours, and a reader that
# recurses (json.dumps with indent, a renderer) must never meet 100,000 levels.
HISTORY_MAX_DEPTH = 16


def parse_history_line(raw):
    """One history line -> its entry (a dict), or None when it is not one: not UTF-8 JSON
    (torn by a crash), nested so deep that json.loads itself gives up (RecursionError on
    100,000 '['), or not an entry this agent could have written (``history_entry_ok``)."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return doc if history_entry_ok(doc) else None


def history_entry_ok(doc):
    """True when ``doc`` could be an entry ``record`` wrote: a dict whose known fields hold
    their types (HISTORY_TYPES) and that nests at most HISTORY_MAX_DEPTH levels."""
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
        return False
    for key, kinds in HISTORY_TYPES.items():
        value = doc.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            return False
    return nesting_within(doc, HISTORY_MAX_DEPTH)


def nesting_within(doc, limit):
    """Whether the parsed JSON value ``doc`` nests at most ``limit`` containers deep (walked
    with a stack, never recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True
