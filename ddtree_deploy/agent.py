"""The host agent: a stdlib-only program that runs ON the host, with the host's interpreter.

It is shipped once per command (the transport runs ``python -c BOOTSTRAP`` and sends
this source, then JSON requests, on stdin) and answers one JSON line per request on
stdout. One process serves the whole command, so a push is two round trips however
many files it touches: (init, lock, facts) pipelined, then (apply, unlock).

Why a program and not shell commands: the host-side steps (lock, back up, stage,
switch, journal) must finish even when the connection drops half-way, and no value
from a patch, an inventory or a path may reach a shell. Here every path travels as
JSON and is used through os.* calls only.

Host-side state (``state_dir``, default ``~/.ddtree-deploy``)::

    .ddtree-deploy-state  marker written when the agent creates the folder: a folder
                          without it is never written to (see check_state_dir)
    lock/owner.json       who holds the deploy lock (taken by one atomic rename)
    journal.json          what is deployed and the phase (written by temp + rename):
                          staged, switching, switched (smoke not passed yet), deployed,
                          rolled-back; ``serve``: the newest restart of the host's server
    history.jsonl         the audit history: one JSON line appended per push, rollback,
                          mark, server restart, lock break and lock release (never
                          rewritten; see record)
    history.1.jsonl       the previous history.jsonl, once that passed HISTORY_MAX_BYTES
    backups/<id>/         original files by index + manifest.json (written last)
    staging/<run_id>/     uploaded files, verified, before the switch

Keep this file compatible with Python 3.8 and free of third-party imports.
"""

import base64
import calendar
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import sys
import time

AGENT_PROTOCOL = 1
JOURNAL_VERSION = 1
TMP_TAG = ".ddtree-tmp-"  # marks our temporary files, so a rerun can sweep leftovers
STATE_MARKER = ".ddtree-deploy-state"  # a state folder is ours only when it holds this file
# Free space the switch leaves on a file system beyond what it writes (statvfs preflight).
SPACE_MARGIN = 1 << 20
PHASES = ("staged", "switching", "switched", "deployed", "rolled-back")
FS_IOC_GETFLAGS = 0x80086601  # linux/fs.h, _IOR('f', 1, long) on 64-bit
FS_IMMUTABLE_FL = 0x00000010
FS_APPEND_FL = 0x00000020
HISTORY = "history.jsonl"
HISTORY_OLD = "history.1.jsonl"
# Rotation bound: history.jsonl moves to history.1.jsonl (dropping the older one) once it
# holds this much, so the host keeps the newest 4-8 MiB (~10,000+ entries).
HISTORY_MAX_BYTES = 4 << 20


class AgentError(Exception):
    """A refused or failed request; ``code`` is a stable slug the client maps
    (``bad-state-dir`` is bad input: exit 2 on the client)."""

    def __init__(self, code, message, **extra):
        Exception.__init__(self, message)
        self.code = code
        self.message = message
        self.extra = extra


# ---------------------------------------------------------------- small file helpers

# Its own sha256 helpers, not ddtree_deploy.digests: this file runs on the host as one
# stdlib-only program (sent over SSH, no package installed there). Same digests (hex sha256).


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def iso_seconds(text):
    """A ``now_iso`` time -> seconds since the epoch (None: not one)."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def write_private(path, data):
    """Create ``path`` (must not exist) as 0600 and write ``data`` durably.

    O_EXCL + mode 0600 means nobody else can read or pre-create it, whatever the umask.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_quietly(path)  # a partial file (ENOSPC, EFBIG) never stays behind
        raise
    os.close(fd)


def remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_json_atomic(path, document):
    """Replace ``path`` with ``document``: a reader sees the old or the new JSON, never half.
    An OSError names ``path`` (not the temporary copy)."""
    tmp = "%s%s%d" % (path, TMP_TAG, os.getpid())
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        write_private(tmp, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode())
        try:
            os.replace(tmp, path)
        except BaseException:
            remove_quietly(tmp)
            raise
        fsync_dir(os.path.dirname(path))
    except OSError as exc:
        raise located(exc, path)


def read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode())
    except (OSError, ValueError):
        return None


def makedirs_private(path):
    os.makedirs(path, mode=0o700, exist_ok=True)


def inode_flags(path):
    """The inode's attribute flags (``lsattr``), or None where the file system has none.

    Opened O_NOFOLLOW|O_NONBLOCK so a symlink or a FIFO never makes this block or look
    elsewhere.
    """
    try:
        import fcntl
        import struct
    except ImportError:  # pragma: no cover - not Linux
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buf = fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("l", 0))
        return struct.unpack("l", buf)[0]
    except (OSError, struct.error):
        return None  # ENOTTY: this file system keeps no such flags (nothing can be immutable)
    finally:
        os.close(fd)


def frozen(path):
    """'immutable' or 'append-only' when chattr made ``path`` unreplaceable, else None."""
    flags = inode_flags(path)
    if flags is None:
        return None
    if flags & FS_IMMUTABLE_FL:
        return "immutable"
    if flags & FS_APPEND_FL:
        return "append-only"
    return None


def errno_name(exc):
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def describe_os_error(exc, where=None):
    """``<file>: <strerror> (errno ENOSPC)``, for a failure the user must act on; ``where`` (a
    path) names the file when the error does not. Never a step's name: the message that
    embeds this one names the step (else it would say it twice: ``lock: lock: ...``)."""
    where = exc.filename or where
    what = "%s (errno %s)" % (exc.strerror or exc, errno_name(exc))
    return "%s: %s" % (where, what) if where else what


def located(exc, path):
    """``exc`` (an OSError) naming ``path``, the file the user knows, when it names no file or
    only our temporary copy of it (TMP_TAG); returned for ``raise``."""
    if exc.filename is None or TMP_TAG in os.path.basename(str(exc.filename)):
        exc.filename = path
    return exc


# ---------------------------------------------------------------- process identity (lock)


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def process_start(pid):
    """The process's start time in clock ticks since boot (Linux), to tell pid reuse apart."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so split after its ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def holder_is_dead(owner):
    """True only when we can *prove* the lock's holder process is gone (same boot, pid gone)."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return False
    mine = boot_id()
    if mine is None or owner.get("boot_id") is None:
        return False
    if owner["boot_id"] != mine:
        return True  # the host rebooted since: nothing from that boot is running
    start = process_start(int(owner.get("pid", 0)))
    return start is None or start != owner.get("pid_start")


# ---------------------------------------------------------------- the lock as a fencing token


GUARD = "lock.guard"  # flock'd around every lock change and every fenced write (see _Fencing)
GUARD_WAIT_S = 30.0  # a guard held longer is a stopped or hung agent: refuse, never wait for ever
LOST_LOCK = "lost-lock"


class _Fencing(object):
    """The deploy lock's run id as a fencing token.

    ``lock release --force`` (or ``--break-lock``) can take the lock from a run that is still
    alive (stopped, slow, on a hung link). Such a run must never write again: before its apply
    and before every rename, journal write, backup prune and sweep it checks that ``lock/``
    still names its run id (``owns_lock``), and it checks and writes under ``lock.guard``, an
    flock that every lock change (take, release, break) also holds. So a release never falls
    between a holder's check and its write, and a new holder's read of the files comes after
    the old holder's last write. A run that lost the lock stops; it switches back what it
    switched only when nobody has written since (the lock still free, the journal and the
    switched files still its own): otherwise the new holder planned from the files as they
    are, and undoing them would mix the host under that run.
    """

    locked = False
    lock_owner = None
    last_journal = None  # the journal this run last wrote (None: none yet in this apply)
    switch_total = 0  # how many files this apply switches (for messages)
    # When this apply's renames began (time.time(); None: none began), for its history line:
    # which bytes a server that started since loaded is told by it (op_switches).
    switch_began = None
    _guard_depth = 0

    @contextlib.contextmanager
    def guarded(self):
        """Hold ``<state_dir>/lock.guard`` (re-entrant within this agent)."""
        if self._guard_depth:
            self._guard_depth += 1
            try:
                yield
            finally:
                self._guard_depth -= 1
            return
        fd = open_guard(self._p(GUARD))
        self._guard_depth = 1
        try:
            yield
        finally:
            self._guard_depth = 0
            os.close(fd)  # closing the descriptor drops the flock

    def owns_lock(self):
        if not self.locked or not self.lock_owner:
            return False
        held = read_json(self._p("lock", "owner.json"))
        return (isinstance(held, dict) and held.get("run_id") == self.lock_owner["run_id"]
                and held.get("pid") == self.lock_owner.get("pid"))

    @contextlib.contextmanager
    def fenced(self, step):
        """One write step, under the guard, only while this run still holds the lock; else
        AgentError(lost-lock) whose message is the ``step`` that did not happen."""
        with self.guarded():
            if not self.owns_lock():
                raise AgentError("lost-lock", step)
            yield

    def after_lost_lock(self, exc, previous, done):
        """The lost-lock error of an apply that stopped before ``exc.message`` (its step),
        after switching what ``done`` says: switched back when nobody wrote since."""
        switched = [e for e in done if e[3]]
        unchanged = True
        with self.guarded():
            holder = self.read_lock()
            now = read_json(self._p("journal.json"))
            ours = self.last_journal if self.last_journal is not None else previous
            untouched = holder is None and now == ours and all(switched_is_ours(e) for e in switched)
            if not switched and self.last_journal is None:
                state = "nothing on the host was changed by it"
            elif untouched:
                failed = switch_back(done)
                if failed:
                    unchanged = False
                    state = ("it had switched %d file(s); switching them back failed (%s): the host is MIXED and "
                             "the journal says `switching`: rerun push or rollback to complete"
                             % (len(switched), "; ".join(failed)))
                else:
                    try:
                        if previous is None:
                            remove_quietly(self._p("journal.json"))
                        else:
                            write_json_atomic(self._p("journal.json"), previous)
                        journal_note = "the journal restored"
                    except OSError as err:
                        journal_note = "the journal not restored (%s; status explains it)" % describe_os_error(
                            err)
                    state = ("the %d file(s) it had switched were switched back, %s: the host is as before "
                             "this run" % (len(switched), journal_note))
            else:
                unchanged = not switched
                for e in done:  # our own temporaries only (named by our pid); the files stay as they are
                    if e[2] and not e[3]:
                        remove_quietly(e[2])
                who = ("run %s (%s) holds it now and works from the files as they are"
                       % (holder.get("run_id"), holder.get("holder")) if holder else
                       "the host changed since (its journal: run %s, phase %s)"
                       % ((now or {}).get("run_id"), (now or {}).get("phase")))
                if switched:
                    see = "`status` once that run ends" if holder else "`status`"
                    state = ("it had switched %d of %d file(s) and wrote nothing after that; %s: see %s"
                             % (len(switched), self.switch_total or len(done), who, see))
                else:
                    state = "no file was switched by it; %s" % who
        message = "run %s lost the deploy lock before %s (%s); it stopped: %s" % (
            (self.lock_owner or {}).get("run_id"), exc.message, self.lock_taker(), state)
        return AgentError("lost-lock", message, unchanged=unchanged, switched=len(switched))

    def lock_taker(self):
        """Who took this run's lock, from the history (the release or break of our run id),
        and who holds it now; in words."""
        run = (self.lock_owner or {}).get("run_id")
        taken = "it was removed"
        for entry in self.history_tail():
            prev = entry.get("previous")
            if entry.get("event") in ("lock-release", "lock-break") and isinstance(prev, dict) \
                    and prev.get("run_id") == run:
                how = {"forced": "released by force", "broken": "broken"}.get(entry.get("outcome"), "released")
                taken = "%s by %s at %s" % (how, entry.get("holder"), entry.get("time"))
                break
        holder = self.read_lock()
        if holder:
            return "%s; run %s (%s, %s) holds it since %s" % (taken, holder.get("run_id"), holder.get("holder"),
                                                              holder.get("command"), holder.get("time"))
        return "%s; it is free now" % taken

    def history_tail(self, nbytes=1 << 18):
        """The newest history entries (from the last ``nbytes`` of the file), newest first."""
        try:
            with open(self._p(HISTORY), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                lines = f.read().splitlines()
        except OSError:
            return []
        entries = (parse_history_line(raw) for raw in reversed(lines))
        return [e for e in entries if e is not None]

    def sweep_dead_runs(self):
        """Under the lock just taken: every package folder the state names (the journal's files,
        each backup's) is swept of our temporaries, with the state folder's own leftovers."""
        journal = read_json(self._p("journal.json"))
        paths = set()
        if isinstance(journal, dict) and isinstance(journal.get("files"), dict):
            paths.update(journal["files"])
        for manifest in self.list_backups():
            if isinstance(manifest.get("files"), dict):
                paths.update(manifest["files"])
        folders = set()
        for rel in paths:
            try:
                folders.add(os.path.dirname(self.target(rel)))
            except AgentError:
                continue  # a path that is not ours to touch (a symlink): never swept
        self.sweep_leftovers(folders)


def open_guard(path):
    """``path`` opened and flock'd exclusively, waiting at most GUARD_WAIT_S."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX host: no guard (and no concurrent agents there)
        return fd
    deadline = time.monotonic() + GUARD_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise
        if time.monotonic() > deadline:
            os.close(fd)
            raise AgentError("locked", "%s stayed held for %g s by another agent (stopped or hung mid-step): "
                             "nothing was changed; find that process (`fuser %s`) and let it finish or stop it"
                             % (path, GUARD_WAIT_S, path), holder=None, stale=False)
        time.sleep(0.01)


def switched_is_ours(entry):
    """Whether the file of a switched ``done`` entry is still the version this run put there
    (its inode; a removed file still absent)."""
    path, ino = entry[1], entry[4] if len(entry) > 4 else None
    try:
        return ino is not None and os.lstat(path).st_ino == ino
    except OSError:
        return ino is None


# ---------------------------------------------------------------- the agent


class Agent(_Fencing):
    def __init__(self, state_dir=None, hooks=None):
        self.state_dir = None
        self.root = None
        self.locked = False
        self.lock_owner = None
        self.hooks = hooks or {}
        if state_dir:
            self._set_state_dir(state_dir)

    # -- paths

    def _set_state_dir(self, state_dir):
        # Kept as given: check_state_dir refuses a relative one rather than resolving it
        # against whatever folder the SSH session starts in.
        self.state_raw = state_dir
        self.state_dir = os.path.normpath(os.path.expanduser(state_dir))

    def check_state_dir(self, create):
        """Refuse a state folder that is not ours, before anything is read from or written to it.

        Ours: absolute after ``~`` expansion, no ``..`` and no shell syntax (nothing expands
        it), neither inside nor above the package root, and either absent (``create``
        makes it, with the marker), holding the marker, empty, or holding exactly the
        layout this agent writes (a folder from before the marker existed: adopted, the
        marker added when ``create``). Anything else might be somebody's data.
        """
        raw = self.state_raw
        expanded = os.path.expanduser(raw)
        problem = None
        if "$" in raw or "`" in raw:
            problem = "holds shell syntax ($ or `), which nothing expands: it would be created literally"
        elif not os.path.isabs(expanded):
            problem = "is not an absolute path after ~ expansion"
        elif ".." in expanded.split("/"):
            problem = "climbs with '..'"
        if problem is None:
            root = self.root or find_sglang()[0]
            real = os.path.realpath(self.state_dir)
            real_root = os.path.realpath(root)
            if real == real_root or real.startswith(real_root + os.sep):
                problem = "lies inside the package root %s" % real_root
            elif real_root.startswith(real.rstrip(os.sep) + os.sep):
                problem = "lies above the package root %s" % real_root
        if problem is None and os.path.lexists(self.state_dir):
            marker = self._p(STATE_MARKER)
            if not os.path.isdir(self.state_dir):
                problem = "exists and is not a folder"
            elif os.path.lexists(marker):
                if os.path.islink(marker) or not os.path.isfile(marker):
                    problem = "has a %s that is not a plain file" % STATE_MARKER
            else:
                why = foreign_content(self.state_dir)
                if why is not None:
                    problem = ("exists without the %s marker and is not a ddtree-deploy state folder (%s)"
                               % (STATE_MARKER, why))
                elif create:
                    self.write_marker(adopted=True)
        elif problem is None and create:
            makedirs_private(self.state_dir)
            self.write_marker(adopted=False)
        if problem is not None:
            raise AgentError("bad-state-dir", "state_dir %r %s; nothing was changed: set host.state_dir to "
                             "an absolute path of a new or empty folder, e.g. ~/.ddtree-deploy" % (raw, problem))

    def write_marker(self, adopted):
        doc = {"tool": "ddtree-deploy", "created": now_iso(), "adopted": adopted}
        try:
            write_private(self._p(STATE_MARKER), (json.dumps(doc) + "\n").encode())
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise

    def _p(self, *parts):
        return os.path.join(self.state_dir, *parts)

    def target(self, rel):
        """The absolute path of a package-relative file, refusing anything outside the root."""
        if self.root is None:
            raise AgentError("protocol", "facts must run before any file operation")
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
            raise AgentError("bad-path", "not a package-relative path: %r" % (rel,))
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise AgentError("bad-path", "not a package-relative path: %r" % (rel,))
        path = os.path.join(self.root, *parts)
        # A symlinked directory could carry the write outside the package: refuse it.
        real_parent = os.path.realpath(os.path.dirname(path))
        real_root = os.path.realpath(self.root)
        if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
            raise AgentError("unsafe-file", "%s leaves the package root through a symlink" % rel)
        if os.path.islink(path):
            raise AgentError("unsafe-file", "%s is a symlink (to %s); refusing to read or replace it"
                             % (rel, os.readlink(path)))
        return path

    # -- dispatch

    def handle(self, request):
        op = request.get("op")
        fn = getattr(self, "op_" + str(op), None)
        if fn is None:
            return {"ok": False, "code": "protocol", "message": "unknown op %r" % (op,)}
        try:
            result = fn(request)
        except AgentError as exc:
            out = {"ok": False, "code": exc.code, "message": exc.message}
            out.update(exc.extra)
            return out
        except OSError as exc:
            # The controller names the step (``<host>: <step>: <this>``): the file and the
            # reason only.
            out = {"ok": False, "code": "os-error", "message": describe_os_error(exc)}
            if getattr(exc, "history_warning", None):
                out["history_warning"] = exc.history_warning
            return out
        result["ok"] = True
        return result

    # -- ops

    def op_init(self, request):
        self._set_state_dir(request.get("state_dir") or "~/.ddtree-deploy")
        return {
            "protocol": AGENT_PROTOCOL,
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": sys.executable,
            "state_dir": self.state_dir,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def op_lock(self, request):
        if self.root is None:
            self.root = find_sglang()[0]
        self.check_state_dir(create=True)
        lock = self._p("lock")
        owner = {
            "run_id": request["run_id"],
            "holder": request.get("holder"),
            "command": request.get("command"),
            "time": now_iso(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
            "boot_id": boot_id(),
        }
        # Build the lock complete with its owner file, then rename it into place: a
        # directory rename onto an existing non-empty lock fails, so exactly one wins,
        # and nobody ever sees a lock without its owner. All of it under the lock's guard
        # (see _Fencing): a forced release or another taker never interleaves with it.
        with self.guarded():
            try:
                broke = self._take_lock(lock, owner, request)
            except OSError as exc:  # e.g. ENOSPC writing the owner file: name the lock, not our temporary
                raise located(exc, lock)
            self.locked = True
            self.lock_owner = owner
            tuning = self._live_tune_lock()
            if tuning:
                # A tune's servers run the files a push or rollback would switch (the tune itself
                # checks the deploy lock before each launch): refuse, and hold nothing.
                self._remove_lock(lock)
                self.locked = False
                self.lock_owner = None
                raise AgentError("locked", "a tune is running on this host (tune lock held); wait for it or stop it",
                                 holder=tuning, stale=False)
            # What killed runs left (temp files, staging, half-made locks and backups), in the
            # state folder and in every package folder the state names: swept by every run.
            self.sweep_dead_runs()
        warning = None
        if broke is not None:
            warning = self.record("lock-break", outcome="broken" if not broke.get("stale") else "stale-taken",
                                  previous=broke)
        reply = {"owner": owner, "broke": broke}
        if warning:
            reply["history_warning"] = warning
        return reply

    def _take_lock(self, lock, owner, request):
        """The atomic take (under the guard): the lock broken first when stale or asked to;
        the broken lock's owner returned (None: it was free)."""
        tmp = self._p("lock%s%s" % (TMP_TAG, owner["run_id"]))
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.mkdir(tmp, 0o700)
            write_private(os.path.join(tmp, "owner.json"), json.dumps(owner).encode())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves no empty lock.<tmp>/ behind
            raise
        broke = None
        for _attempt in range(2):
            try:
                os.rename(tmp, lock)
                return broke
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
            held = read_json(os.path.join(lock, "owner.json")) or {}
            stale = holder_is_dead(held)
            if broke is None and (stale or request.get("break_lock")):
                broke = dict(held, stale=stale)
                self._remove_lock(lock)
                continue
            shutil.rmtree(tmp, ignore_errors=True)
            raise AgentError("locked", "deploy lock held", holder=held, stale=stale)
        shutil.rmtree(tmp, ignore_errors=True)
        raise AgentError("locked", "deploy lock taken concurrently", holder=None, stale=False)

    def _live_tune_lock(self):
        """The tune lock's owner while its process provably runs on this host, else None."""
        held = read_json(self._p("tune", "lock", "owner.json"))
        if not isinstance(held, dict) or held.get("host") != socket.gethostname():
            return None
        pid = held.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            return None
        start = process_start(pid)
        return held if start is not None and start == held.get("pid_start") else None

    def _remove_lock(self, lock):
        # Rename first so a concurrent taker never sees a half-deleted lock.
        gone = "%s%sbroken-%d" % (lock, TMP_TAG, os.getpid())
        try:
            os.rename(lock, gone)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return
            raise
        shutil.rmtree(gone, ignore_errors=True)

    def op_unlock(self, request):
        released = self.release()
        return {"released": released}

    def release(self):
        if not self.locked:
            return False
        try:
            with self.guarded():
                if self.owns_lock():  # never somebody else's: ours may have been released by force
                    self._remove_lock(self._p("lock"))
        except (OSError, AgentError):
            # No guard (a stopped agent holds it): leave the lock; once this process is gone it
            # is provably stale, and the next run takes it over.
            pass
        finally:
            self.locked = False
        return True

    def op_facts(self, request):
        """Read-only: SGLang version and root, sha256 (and optionally bytes) of files, state."""
        self.root, version, how = find_sglang()
        if self.state_dir:
            self.check_state_dir(create=False)
        paths = set(request.get("paths") or ())
        journal = read_json(self._p("journal.json")) if self.state_dir else None
        backups = self.list_backups() if self.state_dir else []
        if request.get("include_state_paths", True):
            if journal:
                paths.update(journal.get("files", {}))
            for b in backups:
                paths.update(b.get("files", {}))
        files = {}
        for rel in sorted(paths):
            try:
                files[rel] = self.stat_file(rel, bool(request.get("content")))
            except AgentError as exc:
                if exc.code != "unsafe-file":
                    raise
                # One symlinked target must not hide the others: report it, by name.
                files[rel] = {"unsafe": exc.message}
        lock_owner = None
        if self.state_dir and os.path.isdir(self._p("lock")):
            lock_owner = read_json(self._p("lock", "owner.json")) or {}
            lock_owner["stale"] = holder_is_dead(lock_owner)
        return {
            "sglang_version": version,
            "version_source": how,
            "package_root": self.root,
            "files": files,
            "journal": journal,
            "backups": backups,
            "lock": lock_owner,
        }

    def stat_file(self, rel, content=False):
        path = self.target(rel)
        try:
            st = os.stat(path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise
        with open(path, "rb") as f:
            data = f.read()
        info = {
            "sha256": sha256_bytes(data),
            "size": st.st_size,
            "mode": st.st_mode & 0o7777,
            "uid": st.st_uid,
            "gid": st.st_gid,
        }
        if content:
            info["data"] = base64.b64encode(data).decode("ascii")
        return info

    def list_backups(self):
        out = []
        base = self._p("backups")
        if not os.path.isdir(base):
            return out
        for name in sorted(os.listdir(base)):
            manifest = read_json(os.path.join(base, name, "manifest.json"))
            if manifest is not None and TMP_TAG not in name:
                out.append(manifest)
        return out

    # -- the one mutating op: push and rollback both go through here

    def op_apply(self, request):
        """``apply`` (below), recorded in the history whatever its outcome."""
        self.switch_began = None
        try:
            reply = self.apply(request)
        except AgentError as exc:
            if exc.code != "protocol":
                warning = self.record_apply(request, exc.code, None, error=exc.message)
                if warning:
                    exc.extra["history_warning"] = warning
            raise
        except OSError as exc:
            warning = self.record_apply(request, "os-error", None, error=describe_os_error(exc))
            if warning:
                exc.history_warning = warning
            raise
        warning = self.record_apply(request, "ok", request.get("final_phase"), backup_id=reply.get("backup_id"))
        if warning:
            reply["history_warning"] = warning
        return reply

    def record_apply(self, request, outcome, phase, **extra):
        journal = request.get("journal") or {}
        files = {}
        for f in request.get("files") or ():
            if isinstance(f, dict) and "path" in f:
                files[f["path"]] = {"from": f.get("expect"), "to": f.get("want")}
        # When its renames began and when they (and any switch back, and the journal) were
        # over: now, as this line is written after them (null: no rename began).
        began = self.switch_began
        ended = None if began is None else time.time()
        # The apply's own run id: a push's automatic rollback runs under the push's lock (and
        # run id) but journals a run of its own, which its history line names.
        return self.record(request.get("kind") or "apply", run_id=request.get("run_id"), outcome=outcome,
                           phase=phase, series=journal.get("series"), series_id=journal.get("series_id"),
                           sglang_version=journal.get("sglang_version"), files=files, switch_began=began,
                           switch_ended=ended, **extra)

    def apply(self, request):
        """Back up (push), stage and verify, switch by rename, purge bytecode, journal.

        ``files``: [{path, expect, want, data | backup}] where expect/want are sha256 or
        None (absent). Every file's current hash must still equal ``expect`` (checked
        under the lock), so what changes is exactly the plan the client printed.

        All or nothing: a preflight refuses what would fail half-way (unwritable or
        immutable folders and files, a foreign ``__pycache__``, too little space); a
        failure that still happens during the switch switches the files already switched
        back in this same op (their previous versions are kept as hard links until the
        end, so the way back needs no free space) and restores the previous journal. Only
        a killed agent leaves a mixed host, with the journal at ``switching``.
        """
        if not self.locked:
            raise AgentError("protocol", "apply needs the deploy lock")
        if self.root is None:
            raise AgentError("protocol", "facts must run before apply")
        run_id = request["run_id"]
        files = request["files"]
        targets = [(f, self.target(f["path"])) for f in files]
        self.last_journal, self.switch_total = None, len(targets)
        previous = read_json(self._p("journal.json"))
        self.hook("stop_before_apply")
        try:
            # Leftovers of dead runs first (we hold the lock): they may hold the space we need.
            self.sweep_leftovers(set(os.path.dirname(p) for _f, p in targets))  # fenced: checks the lock
        except AgentError as exc:
            if exc.code == LOST_LOCK:
                raise self.after_lost_lock(AgentError("lost-lock", "its apply"), previous, [])
            raise
        for f, path in targets:
            current = self.stat_file(f["path"])
            have = current["sha256"] if current else None
            if have != f["expect"]:
                raise AgentError(
                    "changed",
                    "%s changed since it was read (now %s, planned from %s)"
                    % (f["path"], short(have), short(f["expect"])),
                    path=f["path"],
                )
        self.preflight(targets, request)
        journal = dict(request["journal"])
        journal.update(version=JOURNAL_VERSION, run_id=run_id, op=request["kind"])
        staging = self._p("staging", run_id)
        step = "back up"
        done = []
        try:
            backup_id = request.get("backup_id")
            if request.get("make_backup"):
                backup_id = self.make_backup(run_id, request["backup"], request.get("backup_meta") or {})
            journal["backup_id"] = backup_id
            step = "stage"
            staged = self.stage(staging, files, request.get("from_backup"))
            step = "journal"
            self.journal(journal, "staged")
            self.hook("exit_after_staging")
            self.journal(journal, "switching")
            self.hook("fill_after_staging")
            step = "switch"
            self.switch_began = time.time()
            switched, purged, done = self.switch_all(targets, staged)
            step = "journal"
            try:
                self.journal(journal, request["final_phase"])
            except OSError as exc:
                # The files are switched but the journal cannot say so: switch them back.
                with self.fenced("switching back after the journal write failed"):
                    failed = switch_back(done)
                if failed:
                    raise AgentError("switch-mixed", "writing the journal failed (%s) and switching back also "
                                     "failed (%s): the host is MIXED and the journal says `switching`: rerun "
                                     "push or rollback to complete" % (describe_os_error(exc), "; ".join(failed)))
                raise
            for entry in done:
                if entry[2]:
                    remove_quietly(entry[2])
        except (OSError, AgentError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, AgentError) and exc.code == LOST_LOCK:
                raise self.after_lost_lock(exc, previous, getattr(exc, "done", None) or done)
            if isinstance(exc, AgentError) and exc.code == "switch-mixed":
                raise  # the journal stays `switching`: the rerun completes the switch
            try:
                self.restore_journal(previous)
            except AgentError as lost:
                if lost.code != LOST_LOCK:
                    raise
                raise self.after_lost_lock(lost, previous, [])
            if isinstance(exc, AgentError):
                what, path = exc.message, exc.extra.get("path")
            else:
                what, path = describe_os_error(exc), exc.filename
            raise AgentError("failed-unchanged", "%s failed, host unchanged: %s" % (step, what), path=path)
        shutil.rmtree(staging, ignore_errors=True)
        try:
            pruned = self.prune_backups(int(request.get("keep_backups", 5)), keep=(backup_id,))
        except AgentError as exc:
            if exc.code != LOST_LOCK:
                raise
            pruned = []  # the switch is done and journaled; only the pruning is left to the next run
        return {"backup_id": backup_id, "switched": switched, "purged": purged,
                "pruned": pruned, "verified": len(targets)}

    def restore_journal(self, previous):
        """Put the journal back as it was before this op (the host is as it was): only if this
        op wrote it, and only while this run holds the lock (else AgentError lost-lock)."""
        if self.last_journal is None:
            return
        with self.fenced("restoring the journal"):
            try:
                if previous is None:
                    remove_quietly(self._p("journal.json"))
                else:
                    write_json_atomic(self._p("journal.json"), previous)
            except OSError:
                pass  # it said `staged` at most, which status explains as "before any file changed"

    def switch_all(self, targets, staged):
        """Switch every file; on any failure switch the switched ones back (same op).

        Returns (paths, purged bytecode, entries): the entries keep each file's previous
        version (a hard link) for a switch back until the caller has written the journal.
        """
        done = []  # [file, path, previous-version link or None, switched?, inode switched in]
        purged = []
        try:
            for (f, path), src in zip(targets, staged):
                entry = [f, path, None, False, None]
                done.append(entry)
                with self.fenced("switching %s" % f["path"]):
                    pass  # checked first too: a run that lost the lock reads and copies nothing more
                entry[2] = keep_previous(path, links=not self.hooks.get("no_hard_links"))
                tmp = self.prepare_switch(f, path, src)
                try:
                    with self.fenced("switching %s" % f["path"]):  # the rename, only while we hold the lock
                        if tmp is None:
                            if os.path.lexists(path):
                                os.unlink(path)
                        else:
                            os.replace(tmp, path)
                            entry[4] = os.lstat(path).st_ino
                        entry[3] = True
                        purged.extend(purge_bytecode(path))
                except BaseException:
                    if tmp is not None:
                        remove_quietly(tmp)
                    raise
                if self.hooks.get("exit_after_renames") == len(done):
                    os._exit(75)  # TEST HOOK: simulate the agent killed mid-switch
                if self.hooks.get("stop_after_renames") == len(done):
                    # TEST HOOK: the agent stopped (SIGSTOP) mid-switch, outside the guard, until
                    # the test continues it (SIGCONT), e.g. after a forced lock release.
                    os.kill(os.getpid(), signal.SIGSTOP)
                if self.hooks.get("immutable_after_renames") == len(done):
                    # TEST HOOK (injected fault): the folder turns immutable (chattr +i) after
                    # this rename, so the next switch and the switch back both really fail.
                    import subprocess
                    subprocess.run(["chattr", "+i", os.path.dirname(path)], check=True)
            for d in sorted(set(os.path.dirname(p) for _f, p in targets)):
                fsync_dir(d)
            mismatched = []
            for f, _path in targets:
                info = self.stat_file(f["path"])
                have = info["sha256"] if info else None
                if have != f["want"]:
                    mismatched.append(f["path"])
            if mismatched:
                raise AgentError("verify", "after the switch these files differ from the plan: %s"
                                 % ", ".join(mismatched))
        except (OSError, AgentError) as exc:
            if isinstance(exc, AgentError) and exc.code == LOST_LOCK:
                exc.done = done  # never switched back here: the caller decides (after_lost_lock)
                raise
            # os.write's ENOSPC names no file: name the one being switched.
            current = done[-1][0]["path"] if done else None
            # Our own temp files (the kept previous version, a staged copy) mean nothing to the
            # user: name the package file being switched instead.
            if isinstance(exc, OSError):
                located(exc, current)
            what = exc.message if isinstance(exc, AgentError) else describe_os_error(exc, current)
            try:
                with self.fenced("switching back after: %s" % what):
                    failed = switch_back(done)
            except AgentError as lost:
                if lost.code == LOST_LOCK:
                    lost.done = done
                raise
            if failed:
                raise AgentError("switch-mixed", "switch failed: %s; switching back also failed (%s): the host "
                                 "is MIXED and the journal says `switching`: rerun push or rollback to complete"
                                 % (what, "; ".join(failed)))
            n = sum(1 for e in done if e[3])
            raise AgentError("switch", "%s (%d file(s) already switched were switched back)" % (what, n))
        # The previous versions stay until the journal says the switch is done (the caller).
        return [e[0]["path"] for e in done], purged, done

    def op_mark(self, request):
        """Move the journal from one phase to the next, compare-and-set on run id and phase.

        ``switched`` -> ``deployed`` once the smoke passed (or ``switched`` -> ``switched``
        to record a failed smoke level): only for the run the caller saw, so a stale
        controller can never mark a deploy made by someone else since.
        """
        if not self.locked:
            raise AgentError("protocol", "mark needs the deploy lock")
        journal = read_json(self._p("journal.json"))
        if journal and journal.get("run_id") == request["run_id"] and journal.get("phase") == request["phase"] \
                and request.get("smoke") is None:
            return {"journal": journal, "already": True}  # a rerun after a lost reply
        if not journal or journal.get("run_id") != request["run_id"] or journal.get("phase") != request["expect"]:
            j = journal or {}
            raise AgentError("changed", "the journal is at phase %s of run %s, not %s of run %s"
                             % (j.get("phase"), j.get("run_id"), request["expect"], request["run_id"]),
                             journal=journal)
        if request.get("smoke") is not None:
            journal["smoke"] = request["smoke"]
        try:
            self.journal(journal, request["phase"])
        except AgentError as exc:
            if exc.code != LOST_LOCK:
                raise
            raise AgentError("lost-lock", "run %s lost the deploy lock before marking the journal %s (%s); nothing "
                             "was written" % ((self.lock_owner or {}).get("run_id"), request["phase"],
                                              self.lock_taker()), unchanged=True)
        reply = {"journal": journal}
        warning = self.record("mark", outcome="ok", phase=request["phase"], marked_run=journal.get("run_id"),
                              series=journal.get("series"), series_id=journal.get("series_id"),
                              smoke=request.get("smoke"))
        if warning:
            reply["history_warning"] = warning
        return reply

    # -- a restart of the host's server (issue 25: serve_run.py runs it; this records it)

    def op_served(self, request):
        """Record a restart of the host's serving server: the journal keeps the newest record
        under ``serve`` (its phase unchanged: a restart switches no file), and a finished
        restart (``history``) appends a ``restart`` line to the history.

        Under the deploy lock, like every journal write. ``serve``: {state (restarting,
        healthy, unhealthy, interrupted), run_id (the switch whose files it serves), ...}.
        """
        if not self.locked:
            raise AgentError("protocol", "served needs the deploy lock")
        serve = request.get("serve")
        if not isinstance(serve, dict):
            raise AgentError("protocol", "served needs a serve record")
        with self.fenced("recording the server restart (%s)" % serve.get("state")):
            journal = read_json(self._p("journal.json"))
            if journal:
                journal["serve"] = serve
                write_json_atomic(self._p("journal.json"), journal)
        reply = {"journal": journal}
        if request.get("history"):
            warning = self.record("restart", outcome=serve.get("state"), phase=(journal or {}).get("phase"),
                                  series=(journal or {}).get("series"), series_id=(journal or {}).get("series_id"),
                                  serve=serve)
            if warning:
                reply["history_warning"] = warning
        return reply

    # -- the audit history (append-only; see HISTORY_MAX_BYTES for the bound)

    def record(self, event, holder=None, run_id=None, command=None, **fields):
        """Append one JSON line to history.jsonl; a warning string when that failed, else None.

        Never raises: the history is evidence, not a step of the deploy, so a full disk or
        an unwritable file leaves the op's result as it is and the reply carries the warning.
        One os.write of the whole line on an O_APPEND descriptor: concurrent appenders
        (a lock release beside a push) never interleave inside a line.
        """
        owner = self.lock_owner or {}
        holder = holder if holder is not None else owner.get("holder")
        entry = {
            "time": now_iso(),
            "event": event,
            "holder": holder,
            # The controller's host name: holder_name() is user@host on the controller.
            "from": holder.rsplit("@", 1)[1] if isinstance(holder, str) and "@" in holder else None,
            "run_id": run_id if run_id is not None else owner.get("run_id"),
            "command": command if command is not None else owner.get("command"),
            "host": socket.gethostname(),
        }
        entry.update(fields)
        try:
            line = (json.dumps(entry, sort_keys=False) + "\n").encode()
            path = self._p(HISTORY)
            try:
                if os.lstat(path).st_size >= HISTORY_MAX_BYTES:
                    os.rename(path, self._p(HISTORY_OLD))
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
            what = describe_os_error(exc, self._p(HISTORY)) if isinstance(exc, OSError) else str(exc)
            return "the audit history was not written: %s" % what
        return None

    def need_state_dir(self):
        if not self.state_dir:
            raise AgentError("protocol", "init must run first")
        self.check_state_dir(create=False)

    def read_history(self):
        """Every history entry, oldest first: [(file name, entry)], and how many lines were
        skipped (torn by a full disk or a crash, or not an entry we wrote)."""
        entries, unreadable = [], 0
        for name in (HISTORY_OLD, HISTORY):
            path = self._p(name)
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
        self.need_state_dir()
        limit = int(request.get("limit") or 20)
        entries, unreadable = self.read_history()
        return {"entries": [doc for _name, doc in reversed(entries[-limit:])] if limit > 0 else [],
                "total": len(entries), "unreadable": unreadable,
                "files": [n for n in (HISTORY, HISTORY_OLD) if os.path.isfile(self._p(n))]}

    def op_switches(self, request):
        """Read-only: what tells whether a server that started at ``since`` (seconds, this
        host's clock) runs the bytes the files hold now (serve_plan.loaded_now decides):

        ``current``: each of ``paths`` and of the files those switches name: sha256 and ctime
        now (null: absent); ``switches``: every push or rollback line whose renames may have
        ended at or after ``since``, oldest first (time, run, outcome, per-file from/to, the
        renames' ``began``/``ended``: null on an older agent's line); ``before``: each file's
        sha256 after the newest switch that ended before ``since``; ``complete_since``: from
        when the retained history holds every switch (null: unknown)."""
        self.need_state_dir()
        if self.root is None:
            self.root = find_sglang()[0]
        since = float(request["since"])
        entries, unreadable = self.read_history()
        switches, before = [], {}
        for _name, e in entries:
            if e.get("event") not in ("push", "rollback") or not isinstance(e.get("files"), dict):
                continue
            began, ended = e.get("switch_began"), e.get("switch_ended")
            if "switch_began" in e and began is None:
                continue  # no rename began: no file changed
            end = ended if "switch_began" in e else (iso_seconds(e.get("time")) or since) + 1
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
                path = self.target(rel)
                st = os.stat(path)
                current[rel] = {"sha256": sha256_file(path), "ctime": st.st_ctime}
            except AgentError:
                continue  # not a file of ours to read (a symlink, a bad path): the record cannot vouch for it
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    raise
                current[rel] = None
        return {"current": current, "switches": switches, "before": before,
                "complete_since": self.history_complete_since(entries), "unreadable": unreadable}

    def history_complete_since(self, entries):
        """From when (seconds) the retained history holds every switch made from this state
        folder: after a rotation, the second after history.1.jsonl's first line (older lines
        were dropped); without one, from the start (0) when this agent made the folder
        (nothing was switched from it before its first line); in a folder adopted from before
        the marker, from its first line. None: nothing tells."""
        rotated = [doc for name, doc in entries if name == HISTORY_OLD]
        if rotated or os.path.isfile(self._p(HISTORY_OLD)):
            first = iso_seconds(rotated[0].get("time")) if rotated else None
            return None if first is None else first + 1
        marker = read_json(self._p(STATE_MARKER))
        if isinstance(marker, dict) and marker.get("adopted") is False:
            return 0.0
        first = iso_seconds(entries[0][1].get("time")) if entries else None
        return None if first is None else first + 1

    def read_lock(self):
        """The deploy lock's owner (with ``stale``: its process provably gone), or None."""
        if not os.path.isdir(self._p("lock")):
            return None
        owner = read_json(self._p("lock", "owner.json")) or {}
        owner["stale"] = holder_is_dead(owner)
        return owner

    def op_lock_status(self, request):
        """Read-only: who holds the deploy lock (and the tune lock) and whether provably stale."""
        self.need_state_dir()
        exists = os.path.isdir(self.state_dir)
        return {"lock": self.read_lock() if exists else None,
                "tune_lock": self._live_tune_lock() if exists else None}

    def op_lock_release(self, request):
        """Remove the deploy lock: only a provably stale one unless ``force``; recorded."""
        self.need_state_dir()
        if not os.path.isdir(self.state_dir):
            return {"released": False, "lock": None}
        # Under the guard: the holder is never between its ownership check and its write when
        # its lock goes (it sees the release at its next write, and stops: see _Fencing).
        with self.guarded():
            held = self.read_lock()
            if held is None:
                return {"released": False, "lock": None}
            if self.locked and held.get("run_id") == (self.lock_owner or {}).get("run_id"):
                raise AgentError("protocol", "lock_release is for somebody else's lock; this session holds it")
            if not held["stale"] and not request.get("force"):
                raise AgentError("locked", "the deploy lock's process may still run (not provably stale); "
                                 "release it with --force only when you know that run is gone",
                                 holder=held, stale=False)
            self._remove_lock(self._p("lock"))
        reply = {"released": True, "lock": held}
        warning = self.record("lock-release", holder=request.get("holder"), run_id=held.get("run_id"),
                              command="lock release", outcome="forced" if not held["stale"] else "stale-released",
                              previous=held)
        if warning:
            reply["history_warning"] = warning
        return reply

    def preflight(self, targets, request):
        """Refuse, before any write, what would fail half-way: folders or a ``__pycache__`` we
        cannot write, immutable files, owners we cannot keep, too little space."""
        euid = os.geteuid()
        for d in sorted(set(os.path.dirname(p) for _f, p in targets)):
            rel = os.path.relpath(d, self.root)
            if not os.path.isdir(d):
                raise AgentError("preflight", "folder %s does not exist" % rel)
            if frozen(d):
                raise AgentError("preflight", "folder %s is %s (chattr); clear it with chattr -i/-a first"
                                 % (rel, frozen(d)))
            if not os.access(d, os.W_OK | os.X_OK):
                raise AgentError("permission", "%s: cannot write in this folder as uid %d (owner uid %d); "
                                 "set sudo = true in the inventory" % (rel, euid, os.stat(d).st_uid))
            cache = os.path.join(d, "__pycache__")
            if os.path.islink(cache):
                raise AgentError("unsafe-file", "%s/__pycache__ is a symlink (to %s); refusing to purge "
                                 "bytecode through it" % (rel, os.readlink(cache)))
            if os.path.isdir(cache):
                if frozen(cache):
                    raise AgentError("preflight", "%s/__pycache__ is %s (chattr); clear it with chattr -i/-a "
                                     "first" % (rel, frozen(cache)))
                if not os.access(cache, os.W_OK | os.X_OK):
                    raise AgentError("permission", "%s/__pycache__: cannot delete the replaced files' bytecode "
                                     "as uid %d (owner uid %d): set sudo = true in the inventory, or remove "
                                     "that folder" % (rel, euid, os.stat(cache).st_uid))
        for f, path in targets:
            if not os.path.exists(path):
                continue
            if frozen(path):
                raise AgentError("preflight", "%s is %s (chattr); clear it with chattr -i/-a first"
                                 % (f["path"], frozen(path)))
            if euid != 0 and os.stat(path).st_uid != euid:
                raise AgentError("permission", "%s: owned by uid %d, cannot keep its owner as uid %d; "
                                 "set sudo = true in the inventory" % (f["path"], os.stat(path).st_uid, euid))
        self.preflight_space(targets, request)

    def preflight_space(self, targets, request):
        """statvfs: room for everything this op writes, per file system, plus a margin."""
        need = {}  # st_dev -> [bytes, inodes, a folder on it]

        def add(folder, nbytes, inodes=1):
            dev = os.stat(folder).st_dev
            entry = need.setdefault(dev, [0, 0, folder])
            entry[0] += nbytes
            entry[1] += inodes

        sizes = []
        blobs = None
        if request.get("from_backup"):
            blobs = (read_json(self._p("backups", request["from_backup"], "manifest.json")) or {}).get("files", {})
        for f, _path in targets:
            if f["want"] is None:
                sizes.append(0)
            elif "data" in f:
                sizes.append(len(f["data"]) * 3 // 4)
            else:
                entry = (blobs or {}).get(f["path"]) or {}
                blob = self._p("backups", request["from_backup"], entry.get("blob") or "")
                sizes.append(os.path.getsize(blob) if os.path.isfile(blob) else 0)
        for (f, path), size in zip(targets, sizes):
            add(os.path.dirname(path), size)  # the temporary copy beside the target
            add(self.state_dir, size)  # the staged copy
        if request.get("make_backup"):
            for entry in request.get("backup") or ():
                if entry.get("pristine") is not None:
                    try:
                        add(self.state_dir, os.path.getsize(self.target(entry["path"])))
                    except OSError:
                        add(self.state_dir, 0)
        for dev, (nbytes, inodes, folder) in sorted(need.items()):
            st = os.statvfs(folder)
            free = st.f_frsize * (st.f_bfree if os.geteuid() == 0 else st.f_bavail)
            wanted = nbytes + SPACE_MARGIN
            if free < wanted:
                raise AgentError("no-space", "not enough free space on the file system of %s: %d bytes free, "
                                 "this switch needs %d (its copies + 1 MiB margin); free some space, then rerun"
                                 % (folder, free, wanted))
            if st.f_files and st.f_favail < inodes + 16:
                raise AgentError("no-space", "no free inodes on the file system of %s (%d free, %d needed)"
                                 % (folder, st.f_favail, inodes + 16))

    def stop_before_request(self, request):
        """TEST HOOK (``stop_before_each_request``: a file name): before handling each request,
        append "<pid> <op>" to that file and stop (SIGSTOP) until the test continues this agent,
        so every point between two requests of a run can be held open (e.g. to show that
        another controller is refused the lock at each of them)."""
        log = self.hooks.get("stop_before_each_request")
        if not log:
            return
        with open(log, "a") as f:
            f.write("%d %s\n" % (os.getpid(), request.get("op")))
        os.kill(os.getpid(), signal.SIGSTOP)

    def hook(self, name):
        if not self.hooks.get(name):
            return
        if name.startswith("stop_"):
            os.kill(os.getpid(), signal.SIGSTOP)  # TEST HOOK: stopped until the test continues it
            return
        if name == "fill_after_staging":
            # TEST HOOK: another process fills the package's file system after the
            # preflight passed (a real ENOSPC the preflight could not foresee).
            fill_file_system(self.hooks[name])
            return
        os._exit(75)  # TEST HOOK: simulate the agent killed at this step

    def journal(self, journal, phase):
        journal["phase"] = phase
        journal["updated"] = now_iso()
        with self.fenced("the journal write (phase %s)" % phase):
            write_json_atomic(self._p("journal.json"), journal)
            self.last_journal = json.loads(json.dumps(journal))

    def sweep_leftovers(self, folders):
        """Remove what killed runs left (ours only: the names carry TMP_TAG): hidden temp copies
        and previous-version links in the package ``folders``; in the state folder staging/,
        journal temp files, half-made backups and half-made or half-removed locks (every lock
        change holds the guard, and so does this: any such folder seen now is a dead run's).
        Fenced: only the run holding the lock sweeps."""
        with self.fenced("sweeping what dead runs left"):
            self._sweep(folders)

    def _sweep(self, folders):
        for d in folders:
            if not os.path.isdir(d) or os.path.islink(d):
                continue
            for name in os.listdir(d):
                if name.startswith(".") and TMP_TAG in name:
                    remove_quietly(os.path.join(d, name))
        shutil.rmtree(self._p("staging"), ignore_errors=True)
        for name in os.listdir(self.state_dir):
            if TMP_TAG not in name:
                continue
            if name.startswith("journal.json"):
                remove_quietly(self._p(name))
            elif name.startswith("lock" + TMP_TAG) and not os.path.islink(self._p(name)):
                shutil.rmtree(self._p(name), ignore_errors=True)
        backups = self._p("backups")
        if os.path.isdir(backups):
            for name in os.listdir(backups):
                if TMP_TAG in name:
                    shutil.rmtree(os.path.join(backups, name), ignore_errors=True)

    def make_backup(self, run_id, entries, meta):
        """Copy each file's pristine version into backups/<id>/, verify, then write the manifest.

        A file already switched by an interrupted run is backed up from an older backup
        holding its pristine hash, so a rerun never records a patched file as 'original'.
        """
        # Sortable by creation time down to the microsecond: "newest N" must be exact.
        now = time.time()
        backup_id = "%s.%06dZ-%s" % (time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)),
                                      int(now % 1 * 1e6), run_id[:8])
        base = self._p("backups")
        makedirs_private(base)
        tmp = os.path.join(base, backup_id + TMP_TAG)
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        try:
            return self._fill_backup(tmp, base, backup_id, run_id, entries, meta, now)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # no half backup stays behind
            raise

    def _fill_backup(self, tmp, base, backup_id, run_id, entries, meta, now):
        older = self.list_backups()
        manifest_files = {}
        for i, entry in enumerate(entries):
            rel, pristine = entry["path"], entry["pristine"]
            if pristine is None:
                manifest_files[rel] = {"sha256": None, "blob": None}
                continue
            path = self.target(rel)
            info = self.stat_file(rel)
            if info is not None and info["sha256"] == pristine:
                src = path
            else:
                src = self.find_in_backups(older, rel, pristine)
                if src is None:
                    raise AgentError("backup", "%s: no copy of its original (%s) on the host to back up"
                                     % (rel, short(pristine)))
            blob = "%04d" % i
            with open(src, "rb") as f:
                data = f.read()
            write_private(os.path.join(tmp, blob), data)
            if sha256_file(os.path.join(tmp, blob)) != pristine:
                raise AgentError("backup", "%s: backup copy does not verify" % rel)
            st = os.stat(src) if src == path else None
            manifest_files[rel] = {
                "sha256": pristine, "blob": blob,
                "mode": (st.st_mode & 0o7777) if st else entry.get("mode"),
                "uid": st.st_uid if st else None, "gid": st.st_gid if st else None,
            }
        manifest = dict(meta, id=backup_id, created=now_iso(), run_id=run_id, files=manifest_files)
        write_private(os.path.join(tmp, "manifest.json"),
                      (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        fsync_dir(tmp)
        with self.fenced("adding backup %s" % backup_id):
            os.rename(tmp, os.path.join(base, backup_id))
        fsync_dir(base)
        return backup_id

    def find_in_backups(self, backups, rel, sha):
        for manifest in reversed(backups):
            entry = manifest.get("files", {}).get(rel)
            if entry and entry.get("sha256") == sha and entry.get("blob"):
                path = self._p("backups", manifest["id"], entry["blob"])
                if os.path.isfile(path) and sha256_file(path) == sha:
                    return path
        return None

    def stage(self, staging, files, from_backup):
        """Write every wanted file under staging/<run>/ (0600) and verify its sha256."""
        makedirs_private(self._p("staging"))
        os.mkdir(staging, 0o700)
        manifest = None
        if from_backup:
            manifest = read_json(self._p("backups", from_backup, "manifest.json"))
            if manifest is None:
                raise AgentError("backup", "backup %s has no readable manifest" % from_backup)
        staged = []
        for i, f in enumerate(files):
            if f["want"] is None:
                staged.append(None)
                continue
            if "data" in f:
                data = base64.b64decode(f["data"])
            else:
                entry = manifest["files"].get(f["path"]) if manifest else None
                if not entry or not entry.get("blob"):
                    raise AgentError("backup", "backup %s holds no copy of %s" % (from_backup, f["path"]))
                with open(self._p("backups", from_backup, entry["blob"]), "rb") as fh:
                    data = fh.read()
            dest = os.path.join(staging, "%04d" % i)
            write_private(dest, data)
            if sha256_file(dest) != f["want"]:
                raise AgentError("verify", "%s: staged copy has the wrong sha256 (transfer damaged?)"
                                 % f["path"])
            staged.append(dest)
        return staged

    def prepare_switch(self, f, path, src):
        """The temp file that replaces ``path`` by one rename (the caller's, fenced): beside it,
        owner/group/mode copied. None: the file is to be removed."""
        if src is None:
            return None
        d, name = os.path.split(path)
        tmp = os.path.join(d, ".%s%s%d" % (name, TMP_TAG, os.getpid()))
        if os.path.lexists(tmp):
            os.unlink(tmp)
        with open(src, "rb") as fh:
            write_private(tmp, fh.read())
        try:
            try:
                st = os.stat(path)
                mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
            except OSError:
                # A new file: take the mode the request asks for, owner from its directory.
                dst = os.stat(d)
                mode, uid, gid = int(f.get("mode") or 0o644), dst.st_uid, dst.st_gid
            if (uid, gid) != (os.geteuid(), os.getegid()):
                try:
                    os.chown(tmp, uid, gid)
                except OSError as exc:
                    raise AgentError("permission", "%s: cannot keep owner %d:%d (%s); use sudo in the inventory"
                                     % (f["path"], uid, gid, exc.strerror), path=f["path"])
            os.chmod(tmp, mode)
        except BaseException:
            remove_quietly(tmp)
            raise
        return tmp

    def prune_backups(self, keep_n, keep=()):
        with self.fenced("pruning old backups"):
            return self._prune_backups(keep_n, keep)

    def _prune_backups(self, keep_n, keep):
        journal = read_json(self._p("journal.json")) or {}
        protected = set(k for k in keep if k) | set([journal.get("backup_id")])
        backups = [b["id"] for b in self.list_backups()]
        pruned = []
        for bid in backups[: max(0, len(backups) - keep_n)]:
            if bid in protected:
                continue
            shutil.rmtree(self._p("backups", bid), ignore_errors=True)
            pruned.append(bid)
        return pruned


# What each field of a history entry holds (``record`` writes these); an entry whose field
# holds another type was not written by this agent (edited by hand, another tool), and its
# reader would trip over it: skipped and counted. Unknown fields are kept (newer agents).
HISTORY_TYPES = {
    "time": (str,), "event": (str,), "holder": (str,), "from": (str,), "run_id": (str,), "command": (str,),
    "host": (str,), "outcome": (str,), "phase": (str,), "series": (str,), "series_id": (str,),
    "sglang_version": (str,), "backup_id": (str,), "marked_run": (str,), "error": (str,), "files": (dict,),
    "previous": (dict,), "smoke": (dict,), "switch_began": (int, float), "switch_ended": (int, float),
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


def short(sha):
    return "absent" if sha is None else sha[:12]


def purge_bytecode(path):
    """Delete the cached bytecode of a replaced source file (every tag and opt level).

    Never through a symlink: a symlinked ``__pycache__`` is refused by the preflight and
    skipped here (lstat), and unlinking an entry removes that entry, never what it points to.
    """
    d, name = os.path.split(path)
    stem = name[:-3] if name.endswith(".py") else name
    cache = os.path.join(d, "__pycache__")
    purged = []
    try:
        if not stat.S_ISDIR(os.lstat(cache).st_mode):
            return purged
    except OSError:
        return purged
    for entry in os.listdir(cache):
        if entry.startswith(stem + ".") and entry.endswith(".pyc"):
            os.unlink(os.path.join(cache, entry))
            purged.append(os.path.join(cache, entry))
    return purged


def keep_previous(path, links=True):
    """A hard link to ``path``'s current version beside it (None: absent), for the way back.

    A link costs no data blocks, so switching back works on a full disk. Where the file
    system has no hard links, a copy (same owner and mode) is the fallback.
    ``links=False`` is a TEST HOOK (``no_hard_links``): os.link fails as on such a file system.
    """
    if not os.path.lexists(path):
        return None
    d, name = os.path.split(path)
    prev = os.path.join(d, ".%s%sprev-%d" % (name, TMP_TAG, os.getpid()))
    remove_quietly(prev)
    try:
        if not links:
            raise OSError(errno.EPERM, "hard links refused (injected test fault)", path)
        os.link(path, prev)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.EOPNOTSUPP):
            raise
        with open(path, "rb") as fh:
            write_private(prev, fh.read())
        st = os.stat(path)
        try:
            os.chown(prev, st.st_uid, st.st_gid)
        except OSError:
            pass
        os.chmod(prev, st.st_mode & 0o7777)
    return prev


def switch_back(done):
    """Undo a partial switch: each switched file back to its previous version (or removed,
    when it was created). Returns what could not be undone (empty: the host is as before)."""
    failed = []
    for f, path, prev, switched in (e[:4] for e in reversed(done)):
        try:
            if switched:
                if prev is not None:
                    os.rename(prev, path)
                elif os.path.lexists(path):
                    os.unlink(path)
        except OSError as exc:
            kept = "; its previous version is kept at %s" % prev if prev and os.path.lexists(prev) else ""
            failed.append("%s: %s (errno %s)%s" % (f["path"], exc.strerror or exc, errno_name(exc), kept))
            continue
        if prev is not None:
            remove_quietly(prev)
    for d in sorted(set(os.path.dirname(e[1]) for e in done)):
        fsync_dir(d)
    return failed


def fill_file_system(folder_and_slack):
    """TEST HOOK body: fill the file system of ``folder`` up to ``slack`` free bytes."""
    folder, slack = folder_and_slack
    st = os.statvfs(folder)
    size = max(0, st.f_frsize * st.f_bavail - int(slack))
    fd = os.open(os.path.join(folder, "ddtree-test-filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * (1 << 16)
        while size > 0:
            size -= os.write(fd, block[: min(len(block), size)])
    except OSError:
        pass
    finally:
        os.close(fd)


_BACKUP_ID = re.compile(r"^[0-9]{8}T[0-9]{6}(\.[0-9]{6})?Z-[0-9A-Za-z_-]+(" + re.escape(TMP_TAG) + r")?$")
_BLOB = re.compile(r"^[0-9]{4}$")


def foreign_content(folder):
    """None when ``folder`` holds nothing but what this agent writes in a state folder
    (or nothing at all); else what in it is not ours. Symlinks are never ours."""
    def only(path, files_ok, dirs_ok=None):
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if os.path.islink(full):
                return "%s is a symlink" % os.path.relpath(full, folder)
            if os.path.isdir(full):
                why = dirs_ok(full, name) if dirs_ok else "unexpected folder"
            elif os.path.isfile(full):
                why = None if files_ok(name) else "unexpected file"
            else:
                why = "not a file or folder"
            if why:
                return "%s: %s" % (os.path.relpath(full, folder), why)
        return None

    def backups(full, name):
        if not _BACKUP_ID.match(name):
            return "not a backup id"
        return only(full, lambda n: n == "manifest.json" or _BLOB.match(n))

    def staging(full, _name):
        return only(full, lambda n: bool(_BLOB.match(n)))

    def smoke(full, _name):
        return only(full, lambda n: True)

    def top(full, name):
        if name == "lock" or name.startswith("lock" + TMP_TAG):
            return only(full, lambda n: n == "owner.json")
        sub = {"backups": backups, "staging": staging, "smoke": smoke}.get(name)
        if sub is None:
            return "unexpected folder"
        return only(full, lambda n: False, sub)

    def top_file(name):
        return name in ("journal.json", HISTORY, HISTORY_OLD, GUARD) or name.startswith("journal.json" + TMP_TAG)

    why = only(folder, top_file, top)
    if why is not None:
        return why
    journal_path = os.path.join(folder, "journal.json")
    if os.path.lexists(journal_path):
        if os.path.islink(journal_path) or not os.path.isfile(journal_path):
            return "journal.json is not a plain file"
        doc = read_json(journal_path)
        if not isinstance(doc, dict) or doc.get("version") != JOURNAL_VERSION or doc.get("phase") not in PHASES:
            return "journal.json is not a ddtree-deploy journal"
    return None


def find_sglang():
    """The folder holding the sglang package, and its version, without importing sglang.

    Importing sglang would pull torch and CUDA; find_spec only locates it.
    """
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise AgentError("no-sglang", "this interpreter (%s) cannot find the sglang package" % sys.executable)
    pkg = list(spec.submodule_search_locations)[0]
    root = os.path.dirname(os.path.abspath(pkg))
    # Fast path: the one dist-info beside the package (importlib.metadata costs ~50 ms to import).
    infos = [n for n in os.listdir(root) if n.lower().startswith("sglang-") and n.endswith(".dist-info")]
    if len(infos) == 1:
        try:
            with open(os.path.join(root, infos[0], "METADATA"), encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return root, line.split(":", 1)[1].strip(), "metadata"
                    if not line.strip():
                        break  # end of the headers
        except OSError:
            pass
    try:
        from importlib import metadata

        return root, metadata.version("sglang"), "metadata"
    except Exception:
        pass
    version_file = os.path.join(pkg, "version.py")
    try:
        with open(version_file) as f:
            for line in f:
                if line.startswith("__version__"):
                    return root, line.split("=", 1)[1].strip().strip("\"'"), "version.py"
    except OSError:
        pass
    return root, None, None


# ---------------------------------------------------------------- the program


def serve(stdin, stdout, hooks=None):
    """Answer one JSON line per request line until EOF; always release the lock at the end."""
    agent = Agent(hooks=hooks)
    writable = [True]

    def answer(doc):
        if not writable[0]:
            return
        try:
            stdout.write((json.dumps(doc) + "\n").encode())
            stdout.flush()
        except (OSError, ValueError):
            # The client went away: finish the job we are in, stop talking.
            writable[0] = False

    try:
        for line in stdin:
            if not line.endswith(b"\n"):
                break  # a truncated request (connection cut mid-send): do nothing with it
            try:
                request = json.loads(line.decode())
            except ValueError:
                answer({"ok": False, "code": "protocol", "message": "request is not JSON"})
                break
            if request.get("hooks"):
                agent.hooks.update(request["hooks"])
            agent.stop_before_request(request)
            answer(agent.handle(request))
    finally:
        agent.release()


def main():
    # A dropped SSH connection must not stop a switch half-way: ignore hangups, and
    # treat a closed stdout as "stop talking" (see serve.answer), never as "stop working".
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Ctrl-C at a terminal reaches a local agent too (same process group): the controller
    # decides, and lets go of the link; the agent finishes the request it has, then sees EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
