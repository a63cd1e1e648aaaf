"""The deploy lock, and the lock's run id as a fencing token.

Each package root has its own lock, in its own state folder (roots.py): a push on one
SGLang install of a machine never waits for, nor fences, a push on another. ``lock``
first settles which folder is the root's (``claim_home``, under the top's guard), then
takes ``<its folder>/lock`` by one atomic rename of a complete folder (a stale one,
whose process is provably gone, is broken; so is any with ``break_lock``), refused while a
tune holds the tune lock; then sweeps what dead runs left. ``unlock`` (and the end of the
input) releases it, only while it is still this run's. ``lock_status`` and
``lock_release`` (a stale lock, or any with ``force``) are the ``lock`` command's.
"""

import contextlib
import errno
import json
import os
import shutil
import socket
import sys
import time

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import roots, wire
from ddtree_deploy.hostprog.fileops import (
    TMP_TAG,
    AgentError,
    located,
    makedirs_private,
    remove_quietly,
    write_json_atomic,
    write_private,
)
from ddtree_deploy.hostprog.protocol import GUARD_WAIT_S
from ddtree_deploy.hostprog.state import GUARD, STATE_MARKER


def holder_is_dead(owner):
    """True only when we can *prove* the lock's holder process is gone (same boot, pid gone)."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return False
    mine = wire.boot_id()
    if mine is None or owner.get("boot_id") is None:
        return False
    if owner["boot_id"] != mine:
        return True  # the host rebooted since: nothing from that boot is running
    start = wire.process_start(int(owner.get("pid", 0)))
    return start is None or start != owner.get("pid_start")


class HeldLock(object):
    """The deploy lock as this run holds it: ``locked`` and the ``owner`` record it wrote
    (None before the lock and after its release). A part of its own, below the lock and the
    history, because the history names the holder in every line and the lock records its
    breaks and releases in the history: both read this, neither needs the other for it."""

    def __init__(self):
        self.locked = False
        self.owner = None


class Lock(object):
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
    are, and undoing them would mix the host under that run (Apply.after_lost_lock).

    Collaborators: ``folder`` (state.StateFolder), ``package`` (facts.PackageRoot: the
    package folders a sweep cleans), ``held`` (HeldLock: this run's hold, which the history
    reads too), ``history`` (history.History: lock breaks and releases are recorded, and who
    took a lost lock is read back). ``list_backups``: the backups whose package folders a
    sweep cleans (the container program keeps none).
    """

    def __init__(self, folder, package, held, history, list_backups):
        self.folder = folder
        self.package = package
        self.held = held
        self.history = history
        self.list_backups = list_backups
        self.guard_wait_s = None  # init's, when the controller reads sooner than GUARD_WAIT_S
        self._guard_depth = 0

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
        fd = open_guard(self.folder.path(GUARD), self.guard_wait_s)
        self._guard_depth = 1
        try:
            yield
        finally:
            self._guard_depth = 0
            os.close(fd)  # closing the descriptor drops the flock

    def owns_lock(self):
        if not self.held.locked or not self.held.owner:
            return False
        held = wire.read_json(self.folder.path("lock", "owner.json"))
        return (isinstance(held, dict) and held.get("run_id") == self.held.owner["run_id"]
                and held.get("pid") == self.held.owner.get("pid"))

    @contextlib.contextmanager
    def fenced(self, step):
        """One write step, under the guard, only while this run still holds the lock; else
        AgentError(lost-lock) whose message is the ``step`` that did not happen."""
        with self.guarded():
            if not self.owns_lock():
                raise AgentError(Code.LOST_LOCK, step)
            yield

    def lock_taker(self):
        """Who took this run's lock, from the history (the release or break of our run id),
        and who holds it now; in words."""
        run = (self.held.owner or {}).get("run_id")
        taken = "it was removed"
        for entry in self.history.history_tail():
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

    def sweep_dead_runs(self):
        """Under the lock just taken: every package folder the state names (the journal's files,
        each backup's) is swept of our temporaries, with the state folder's own leftovers."""
        journal = wire.read_json(self.folder.path("journal.json"))
        paths = set()
        if isinstance(journal, dict) and isinstance(journal.get("files"), dict):
            paths.update(journal["files"])
        for manifest in self.list_backups():
            if isinstance(manifest.get("files"), dict):
                paths.update(manifest["files"])
        folders = set()
        for rel in paths:
            try:
                folders.add(os.path.dirname(self.package.target(rel)))
            except AgentError:
                continue  # a path that is not ours to touch (a symlink): never swept
        self.sweep_leftovers(folders)

    def claim_home(self):
        """Settle which folder is this root's and write its root.json when none names it yet,
        under the top's guard, so of two roots that find a folder unclaimed exactly one gets
        its top level. Once settled, the top's guard is never taken again for it (that guard
        is also the top install's own: no other install waits on it)."""
        self.folder.home = None
        if roots.record_of(self.folder.home_dir()) is not None:
            return
        fd = open_guard(self.folder.top(GUARD))
        try:
            self.folder.home = None
            home = self.folder.home_dir()
            if roots.record_of(home) is not None:
                return
            top = home == self.folder.state_dir
            if top:
                marker = wire.read_json(self.folder.top(STATE_MARKER))
                fresh_folder = isinstance(marker, dict) and marker.get("adopted") is False
                how = "legacy" if roots.has_state(home) else "fresh"
                since = 0.0 if fresh_folder else None
            else:
                makedirs_private(home)
                how = "own"
                # Complete from its start only when no earlier layout's state ever sat beside it.
                since = 0.0 if (roots.record_of(self.folder.state_dir) or {}).get("how") == "fresh" else None
            write_json_atomic(os.path.join(home, roots.RECORD),
                              roots.new_record(self.package.package_root(), sys.executable, how, since))
        finally:
            os.close(fd)

    def op_lock(self, request):
        self.package.package_root()
        self.folder.check_state_dir(create=True)
        self.claim_home()
        lock = self.folder.path("lock")
        owner = {
            "run_id": request["run_id"],
            "holder": request.get("holder"),
            "command": request.get("command"),
            "time": wire.now_iso(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": wire.process_start(os.getpid()),
            "boot_id": wire.boot_id(),
            # Whose lock this is: the install (and the interpreter that took it).
            "package_root": roots.resolved(self.package.root),
            "python": sys.executable,
        }
        # Build the lock complete with its owner file, then rename it into place: a
        # directory rename onto an existing non-empty lock fails, so exactly one wins,
        # and nobody ever sees a lock without its owner. All of it under the lock's guard
        # (see Lock): a forced release or another taker never interleaves with it.
        with self.guarded():
            try:
                broke = self._take_lock(lock, owner, request)
            except OSError as exc:  # e.g. ENOSPC writing the owner file: name the lock, not our temporary
                raise located(exc, lock)
            self.held.locked = True
            self.held.owner = owner
            tuning = self._live_tune_lock()
            if tuning:
                # A tune's servers run the files a push or rollback would switch (the tune itself
                # checks the deploy lock before each launch): refuse, and hold nothing.
                self._remove_lock(lock)
                self.held.locked = False
                self.held.owner = None
                raise AgentError(Code.LOCKED, "a tune is running on this host (tune lock held); wait for it or stop it",
                                 holder=tuning, stale=False)
            # What killed runs left (temp files, staging, half-made locks and backups), in the
            # state folder and in every package folder the state names: swept by every run.
            self.sweep_dead_runs()
        warning = None
        if broke is not None:
            warning = self.history.record("lock-break", outcome="broken" if not broke.get("stale") else "stale-taken",
                                          previous=broke)
        reply = {"owner": owner, "broke": broke}
        if warning:
            reply["history_warning"] = warning
        return reply

    def _take_lock(self, lock, owner, request):
        """The atomic take (under the guard): the lock broken first when stale or asked to;
        the broken lock's owner returned (None: it was free)."""
        tmp = self.folder.path("lock%s%s" % (TMP_TAG, owner["run_id"]))
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
            held = wire.read_json(os.path.join(lock, "owner.json")) or {}
            stale = holder_is_dead(held)
            if broke is None and (stale or request.get("break_lock")):
                broke = dict(held, stale=stale)
                self._remove_lock(lock)
                continue
            shutil.rmtree(tmp, ignore_errors=True)
            raise AgentError(Code.LOCKED, "deploy lock held", holder=held, stale=stale)
        shutil.rmtree(tmp, ignore_errors=True)
        raise AgentError(Code.LOCKED, "deploy lock taken concurrently", holder=None, stale=False)

    def _live_tune_lock(self):
        """The tune lock's owner while its process provably runs on this host and its servers
        run this root's files (an owner that does not say which root: taken as ours), else None."""
        held = wire.read_json(self.folder.top("tune", "lock", "owner.json"))
        if wire.same_process(held) is not True:
            return None
        theirs = held.get("package_root")
        return held if theirs is None or roots.resolved(theirs) == roots.resolved(self.package.package_root()) else None

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
        if not self.held.locked:
            return False
        try:
            with self.guarded():
                if self.owns_lock():  # never somebody else's: ours may have been released by force
                    self._remove_lock(self.folder.path("lock"))
        except (OSError, AgentError):
            # No guard (a stopped agent holds it): leave the lock; once this process is gone it
            # is provably stale, and the next run takes it over.
            pass
        finally:
            self.held.locked = False
        return True

    def read_lock(self):
        """The deploy lock's owner (with ``stale``: its process provably gone), or None."""
        if not os.path.isdir(self.folder.path("lock")):
            return None
        owner = wire.read_json(self.folder.path("lock", "owner.json")) or {}
        owner["stale"] = holder_is_dead(owner)
        return owner

    def op_lock_status(self, request):
        """Read-only: who holds this root's deploy lock (and the tune lock) and whether provably stale."""
        self.folder.need_state_dir()
        exists = os.path.isdir(self.folder.state_dir)
        return {"lock": self.read_lock() if exists else None,
                "tune_lock": self._live_tune_lock() if exists else None}

    def op_lock_release(self, request):
        """Remove the deploy lock: only a provably stale one unless ``force``; recorded."""
        self.folder.need_state_dir()
        if not os.path.isdir(self.folder.state_dir):
            return {"released": False, "lock": None}
        # Under the guard: the holder is never between its ownership check and its write when
        # its lock goes (it sees the release at its next write, and stops: see Lock).
        with self.guarded():
            held = self.read_lock()
            if held is None:
                return {"released": False, "lock": None}
            if self.held.locked and held.get("run_id") == (self.held.owner or {}).get("run_id"):
                raise AgentError(Code.PROTOCOL, "lock_release is for somebody else's lock; this session holds it")
            if not held["stale"] and not request.get("force"):
                raise AgentError(Code.LOCKED, "the deploy lock's process may still run (not provably stale); "
                                 "release it with --force only when you know that run is gone",
                                 holder=held, stale=False)
            self._remove_lock(self.folder.path("lock"))
        reply = {"released": True, "lock": held}
        warning = self.history.record("lock-release", holder=request.get("holder"), run_id=held.get("run_id"),
                                      command="lock release",
                                      outcome="forced" if not held["stale"] else "stale-released", previous=held)
        if warning:
            reply["history_warning"] = warning
        return reply

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
        shutil.rmtree(self.folder.path("staging"), ignore_errors=True)
        for name in os.listdir(self.folder.home_dir()):
            if TMP_TAG not in name:
                continue
            if name.startswith(("journal.json", roots.RECORD)):
                remove_quietly(self.folder.path(name))
            elif name.startswith("lock" + TMP_TAG) and not os.path.islink(self.folder.path(name)):
                shutil.rmtree(self.folder.path(name), ignore_errors=True)
        for kept in ("backups", "drifted"):  # half-made backups (and kept edits) of killed runs
            folder = self.folder.path(kept)
            if os.path.isdir(folder):
                for name in os.listdir(folder):
                    if TMP_TAG in name:
                        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def open_guard(path, wait_s=None):
    """``path`` opened and flock'd exclusively, waiting at most ``wait_s`` (GUARD_WAIT_S)."""
    wait_s = GUARD_WAIT_S if wait_s is None else float(wait_s)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX host: no guard (and no concurrent agents there)
        return fd
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise
        if time.monotonic() > deadline:
            who = guard_holder(fd, path)
            os.close(fd)
            raise AgentError(Code.LOCKED, "%s stayed held for %g s by %s: nothing was changed; %s"
                             % (path, wait_s, who[0], who[1]), holder=None, stale=False, guard_pid=who[2])
        time.sleep(0.01)


def guard_holder(fd, path):
    """Who holds the flock on ``path`` (open as ``fd``), from /proc/locks (Linux): (who, what to
    do, pid or None). Another agent stopped (SIGSTOP, a debugger) or hung mid-step holds it."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", "rb") as fh:
            lines = fh.read(1 << 20).decode("ascii", "replace").splitlines()
    except OSError:
        lines = []
    pid = None
    for line in lines:
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" ("->" marks a waiter: skip it)
        if len(f) >= 6 and f[1] == "FLOCK" and f[4].isdigit() and f[5].rsplit(":", 1)[-1] == str(st.st_ino):
            pid = int(f[4])
            break
    if pid is None or pid == os.getpid():
        return ("another agent (stopped or hung mid-step)",
                "find it with `fuser %s` and let it finish or stop it" % path, None)
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            state = fh.read().decode("utf-8", "replace").rsplit(")", 1)[-1].split()[0]
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = " ".join(a.decode("utf-8", "replace") for a in fh.read(4096).split(b"\0") if a)
    except (OSError, IndexError):
        state, argv = "?", "?"
    stopped = {"T": "stopped", "t": "stopped by a debugger", "D": "waiting on the disk"}.get(state, "state " + state)
    agent = "a ddtree-deploy host program" if "ddtree_agent" in argv else argv[:120]
    who = "process %d (%s, %s)" % (pid, agent, stopped)
    todo = ("see it with `ps -o pid,stat,etime,args -p %d`; let it finish%s, or stop it (`kill %d`: the run it "
            "serves stops, and the deploy lock it may hold becomes stale)"
            % (pid, " (`kill -CONT %d`)" % pid if state in ("T", "t") else "", pid))
    return who, todo, pid
