"""The agent's one mutating job: back up, stage, verify, switch by rename, journal.

Push and rollback both go through ``apply``; a push's backups are made here and pruned
after the switch. Files edited outside ddtree-deploy that the request replaces
(``keep_drifted``: ``--replace-drifted``) are first kept, as found, in a backup of their own
(``drifted/<id>/``), which nothing prunes. All or nothing: a preflight refuses what would
fail half-way; a failure during the switch switches back (each file's previous version kept
as a hard link until the journal says the switch is done); a run that lost the deploy lock
stops and switches back only when nobody wrote since (``after_lost_lock``).
"""

import base64
import errno
import json
import os
import shutil
import stat
import sys
import time

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import roots, wire
from ddtree_deploy.hostprog.fileops import (
    TMP_TAG,
    AgentError,
    describe_os_error,
    errno_name,
    frozen,
    fsync_dir,
    located,
    makedirs_private,
    remove_quietly,
    write_json_atomic,
    write_private,
)
from ddtree_deploy.hostprog.state import JOURNAL_VERSION

# Free space the switch leaves on a file system beyond what it writes (statvfs preflight).
SPACE_MARGIN = 1 << 20


class Apply(object):
    """The ``apply`` op. Collaborators: ``folder`` (state.StateFolder: staging, backups),
    ``package`` (facts.PackageRoot: the files it switches), ``held`` (lock.HeldLock),
    ``lock`` (lock.Lock: every write fenced, the sweep, who took a lost lock), ``journal``
    (journal.Journal), ``history`` (history.History), ``hooks`` (wire.Hooks: a test's faults)."""

    def __init__(self, folder, package, held, lock, journal, history, hooks):
        self.folder = folder
        self.package = package
        self.held = held
        self.lock = lock
        self.journal = journal
        self.history = history
        self.hooks = hooks
        self.switch_total = 0  # how many files this apply switches (for messages)
        # When this apply's renames began (time.time(); None: none began), for its history line:
        # which bytes a server that started since loaded is told by it (op_switches).
        self.switch_began = None

    def op_apply(self, request):
        """``apply`` (below), recorded in the history whatever its outcome."""
        self.switch_began = None
        try:
            reply = self.apply(request)
        except AgentError as exc:
            if exc.code != Code.PROTOCOL:
                warning = self.record_apply(request, exc.code, None, error=exc.message)
                if warning:
                    exc.extra["history_warning"] = warning
            raise
        except OSError as exc:
            warning = self.record_apply(request, Code.OS_ERROR, None, error=describe_os_error(exc))
            if warning:
                exc.history_warning = warning
            raise
        extra = {"drifted_backup": reply["drifted_backup"]} if reply.get("drifted_backup") else {}
        warning = self.record_apply(request, "ok", request.get("final_phase"), backup_id=reply.get("backup_id"),
                                    **extra)
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
        if isinstance(request.get("automatic"), dict):  # a push's own rollback: why, and after which push
            extra["automatic"] = request["automatic"]
        return self.history.record(request.get("kind") or "apply", run_id=request.get("run_id"), outcome=outcome,
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
        if not self.held.locked:
            raise AgentError(Code.PROTOCOL, "apply needs the deploy lock")
        if self.package.root is None:
            raise AgentError(Code.PROTOCOL, "facts must run before apply")
        run_id = request["run_id"]
        files = request["files"]
        targets = [(f, self.package.target(f["path"])) for f in files]
        self.journal.last_journal, self.switch_total = None, len(targets)
        previous = wire.read_json(self.folder.path("journal.json"))
        self.hooks.at("stop_before_apply")
        try:
            # Leftovers of dead runs first (we hold the lock): they may hold the space we need.
            self.lock.sweep_leftovers(set(os.path.dirname(p) for _f, p in targets))  # fenced: checks the lock
        except AgentError as exc:
            if exc.code == Code.LOST_LOCK:
                raise self.after_lost_lock(AgentError(Code.LOST_LOCK, "its apply"), previous, [])
            raise
        for f, _path in targets:
            current = self.package.stat_file(f["path"])
            have = current["sha256"] if current else None
            if have != f["expect"]:
                raise AgentError(
                    Code.CHANGED,
                    "%s changed since it was read (now %s, planned from %s)"
                    % (f["path"], short(have), short(f["expect"])),
                    path=f["path"],
                )
        self.preflight(targets, request)
        journal = dict(request["journal"])
        journal.update(version=JOURNAL_VERSION, run_id=run_id, op=request["kind"],
                       package_root=roots.resolved(self.package.root), python=sys.executable)
        staging = self.folder.path("staging", run_id)
        step = "keep the drifted files"
        done = []
        drifted_backup = None
        try:
            keep = [(f, path) for f, path in targets if f["path"] in set(request.get("keep_drifted") or ())]
            if keep:
                drifted_backup = self.keep_drifted(run_id, request["kind"], keep)
            step = "back up"
            backup_id = request.get("backup_id")
            if request.get("make_backup"):
                backup_id = self.make_backup(run_id, request["backup"], request.get("backup_meta") or {})
            journal["backup_id"] = backup_id
            step = "stage"
            staged = self.stage(staging, files, request.get("from_backup"))
            step = "journal"
            self.journal.write(journal, "staged")
            self.hooks.at("exit_after_staging")
            self.journal.write(journal, "switching")
            self.hooks.at("fill_after_staging")
            step = "switch"
            self.switch_began = time.time()
            switched, purged, done = self.switch_all(targets, staged)
            step = "journal"
            try:
                self.journal.write(journal, request["final_phase"])
            except OSError as exc:
                # The files are switched but the journal cannot say so: switch them back.
                with self.lock.fenced("switching back after the journal write failed"):
                    failed = switch_back(done)
                if failed:
                    raise AgentError(Code.SWITCH_MIXED, "writing the journal failed (%s) and switching back also "
                                     "failed (%s): the host is MIXED and the journal says `switching`: rerun "
                                     "push or rollback to complete" % (describe_os_error(exc), "; ".join(failed)))
                raise
            for entry in done:
                if entry[2]:
                    remove_quietly(entry[2])
        except (OSError, AgentError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, AgentError) and exc.code == Code.LOST_LOCK:
                raise self.after_lost_lock(exc, previous, getattr(exc, "done", None) or done)
            if isinstance(exc, AgentError) and exc.code == Code.SWITCH_MIXED:
                raise  # the journal stays `switching`: the rerun completes the switch
            try:
                self.journal.restore(previous)
            except AgentError as lost:
                if lost.code != Code.LOST_LOCK:
                    raise
                raise self.after_lost_lock(lost, previous, [])
            if isinstance(exc, AgentError):
                what, path = exc.message, exc.extra.get("path")
            else:
                what, path = describe_os_error(exc), exc.filename
            raise AgentError(Code.FAILED_UNCHANGED, "%s failed, host unchanged: %s" % (step, what), path=path)
        shutil.rmtree(staging, ignore_errors=True)
        try:
            pruned = self.prune_backups(int(request.get("keep_backups", 5)), keep=(backup_id,))
        except AgentError as exc:
            if exc.code != Code.LOST_LOCK:
                raise
            pruned = []  # the switch is done and journaled; only the pruning is left to the next run
        return {"backup_id": backup_id, "switched": switched, "purged": purged,
                "pruned": pruned, "verified": len(targets), "drifted_backup": drifted_backup,
                "drifted_folder": self.folder.path("drifted", drifted_backup) if drifted_backup else None}

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
                with self.lock.fenced("switching %s" % f["path"]):
                    pass  # checked first too: a run that lost the lock reads and copies nothing more
                entry[2] = keep_previous(path, link=self.hooks.link)
                tmp = self.prepare_switch(f, path, src)
                try:
                    with self.lock.fenced("switching %s" % f["path"]):  # the rename, only while we hold the lock
                        if tmp is None:
                            if os.path.lexists(path):
                                os.unlink(path)
                        else:
                            os.replace(tmp, path)
                            entry[4] = os.lstat(path).st_ino
                        entry[3] = True
                        purged.extend(purge_bytecode(path))
                        self.hooks.at("stop_in_guard_after_renames", len(done))  # (a test: stuck in the guard)
                except BaseException:
                    if tmp is not None:
                        remove_quietly(tmp)
                    raise
                # Test hooks (wire.Hooks): killed, stopped outside the guard, or the folder made
                # immutable right after this rename.
                self.hooks.at("exit_after_renames", len(done))
                self.hooks.at("stop_after_renames", len(done))
                self.hooks.at("immutable_after_renames", len(done), folder=os.path.dirname(path))
            for d in sorted(set(os.path.dirname(p) for _f, p in targets)):
                fsync_dir(d)
            mismatched = []
            for f, _path in targets:
                info = self.package.stat_file(f["path"])
                have = info["sha256"] if info else None
                if have != f["want"]:
                    mismatched.append(f["path"])
            if mismatched:
                raise AgentError(Code.VERIFY, "after the switch these files differ from the plan: %s"
                                 % ", ".join(mismatched))
        except (OSError, AgentError) as exc:
            if isinstance(exc, AgentError) and exc.code == Code.LOST_LOCK:
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
                with self.lock.fenced("switching back after: %s" % what):
                    failed = switch_back(done)
            except AgentError as lost:
                if lost.code == Code.LOST_LOCK:
                    lost.done = done
                raise
            if failed:
                raise AgentError(Code.SWITCH_MIXED, "switch failed: %s; switching back also failed (%s): the host "
                                 "is MIXED and the journal says `switching`: rerun push or rollback to complete"
                                 % (what, "; ".join(failed)))
            n = sum(1 for e in done if e[3])
            raise AgentError(Code.SWITCH, "%s (%d file(s) already switched were switched back)" % (what, n))
        # The previous versions stay until the journal says the switch is done (the caller).
        return [e[0]["path"] for e in done], purged, done

    def after_lost_lock(self, exc, previous, done):
        """The lost-lock error of an apply that stopped before ``exc.message`` (its step),
        after switching what ``done`` says: switched back when nobody wrote since."""
        switched = [e for e in done if e[3]]
        unchanged = True
        with self.lock.guarded():
            holder = self.lock.read_lock()
            now = wire.read_json(self.folder.path("journal.json"))
            ours = self.journal.last_journal if self.journal.last_journal is not None else previous
            untouched = holder is None and now == ours and all(switched_is_ours(e) for e in switched)
            if not switched and self.journal.last_journal is None:
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
                            remove_quietly(self.folder.path("journal.json"))
                        else:
                            write_json_atomic(self.folder.path("journal.json"), previous)
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
            (self.held.owner or {}).get("run_id"), exc.message, self.lock.lock_taker(), state)
        return AgentError(Code.LOST_LOCK, message, unchanged=unchanged, switched=len(switched))

    def preflight(self, targets, request):
        """Refuse, before any write, what would fail half-way: folders or a ``__pycache__`` we
        cannot write, immutable files, owners we cannot keep, too little space."""
        euid = os.geteuid()
        for d in sorted(set(os.path.dirname(p) for _f, p in targets)):
            rel = os.path.relpath(d, self.package.root)
            if not os.path.isdir(d):
                raise AgentError(Code.PREFLIGHT, "folder %s does not exist" % rel)
            if frozen(d):
                raise AgentError(Code.PREFLIGHT, "folder %s is %s (chattr); clear it with chattr -i/-a first"
                                 % (rel, frozen(d)))
            if not os.access(d, os.W_OK | os.X_OK):
                raise AgentError(Code.PERMISSION, "%s: cannot write in this folder as uid %d (owner uid %d); "
                                 "set sudo = true in the inventory" % (rel, euid, os.stat(d).st_uid))
            cache = os.path.join(d, "__pycache__")
            if os.path.islink(cache):
                raise AgentError(Code.UNSAFE_FILE, "%s/__pycache__ is a symlink (to %s); refusing to purge "
                                 "bytecode through it" % (rel, os.readlink(cache)))
            if os.path.isdir(cache):
                if frozen(cache):
                    raise AgentError(Code.PREFLIGHT, "%s/__pycache__ is %s (chattr); clear it with chattr -i/-a "
                                     "first" % (rel, frozen(cache)))
                if not os.access(cache, os.W_OK | os.X_OK):
                    raise AgentError(Code.PERMISSION, "%s/__pycache__: cannot delete the replaced files' bytecode "
                                     "as uid %d (owner uid %d): set sudo = true in the inventory, or remove "
                                     "that folder" % (rel, euid, os.stat(cache).st_uid))
        for f, path in targets:
            if not os.path.exists(path):
                continue
            if frozen(path):
                raise AgentError(Code.PREFLIGHT, "%s is %s (chattr); clear it with chattr -i/-a first"
                                 % (f["path"], frozen(path)))
            if euid != 0 and os.stat(path).st_uid != euid:
                raise AgentError(Code.PERMISSION, "%s: owned by uid %d, cannot keep its owner as uid %d; "
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
            blobs = (wire.read_json(self.folder.path("backups", request["from_backup"], "manifest.json")) or {}).get("files", {})
        for f, _path in targets:
            if f["want"] is None:
                sizes.append(0)
            elif "data" in f:
                sizes.append(len(f["data"]) * 3 // 4)
            else:
                entry = (blobs or {}).get(f["path"]) or {}
                blob = self.folder.path("backups", request["from_backup"], entry.get("blob") or "")
                sizes.append(os.path.getsize(blob) if os.path.isfile(blob) else 0)
        for (_f, path), size in zip(targets, sizes):
            add(os.path.dirname(path), size)  # the temporary copy beside the target
            add(self.folder.path(), size)  # the staged copy
        for f, path in targets:  # the kept copy of each drifted file it replaces
            if f["path"] in set(request.get("keep_drifted") or ()) and os.path.isfile(path):
                add(self.folder.path(), os.path.getsize(path))
        if request.get("make_backup"):
            for entry in request.get("backup") or ():
                if entry.get("pristine") is not None:
                    try:
                        add(self.folder.path(), os.path.getsize(self.package.target(entry["path"])))
                    except OSError:
                        add(self.folder.path(), len(entry.get("data") or "") * 3 // 4)
        for _dev, (nbytes, inodes, folder) in sorted(need.items()):
            st = os.statvfs(folder)
            free = st.f_frsize * (st.f_bfree if os.geteuid() == 0 else st.f_bavail)
            wanted = nbytes + SPACE_MARGIN
            if free < wanted:
                raise AgentError(Code.NO_SPACE, "not enough free space on the file system of %s: %d bytes free, "
                                 "this switch needs %d (its copies + 1 MiB margin); free some space, then rerun"
                                 % (folder, free, wanted))
            if st.f_files and st.f_favail < inodes + 16:
                raise AgentError(Code.NO_SPACE, "no free inodes on the file system of %s (%d free, %d needed)"
                                 % (folder, st.f_favail, inodes + 16))

    def make_backup(self, run_id, entries, meta):
        """Copy each file's pristine version into backups/<id>/, verify, then write the manifest.

        A file already switched by an interrupted run is backed up from an older backup
        holding its pristine hash, so a rerun never records a patched file as 'original'.
        """
        return self.new_folder("backups", run_id, lambda tmp: self._fill_backup(tmp, entries, meta), "adding backup")

    def keep_drifted(self, run_id, kind, keep):
        """Copy each drifted file ``keep`` names ([(file, path)]: edited outside ddtree-deploy,
        about to be replaced) as it is now into ``drifted/<id>/files/<its package path>``,
        verified against the sha256 the plan saw (``expect``: the bytes the diff showed), with
        ``manifest.json`` last; renamed into place whole, under the lock. Never pruned: the
        edit may be somebody's only copy. Returns the id."""
        return self.new_folder("drifted", run_id, lambda tmp: self._fill_drifted(tmp, kind, keep),
                               "keeping the drifted files in")

    def new_folder(self, kind, run_id, fill, step):
        """A new ``<kind>/<id>/`` made whole: ``fill(tmp)`` writes its files into a temporary
        folder and returns the manifest (written last, with the id, the time, the run and the
        install); renamed into place only while this run holds the lock (``step``: what did
        not happen otherwise). Nothing half-made stays behind. Returns the id."""
        folder_id = new_backup_id(run_id)
        base = self.folder.path(kind)
        makedirs_private(base)
        tmp = os.path.join(base, folder_id + TMP_TAG)
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        try:
            manifest = dict(fill(tmp), id=folder_id, created=wire.now_iso(), run_id=run_id,
                            package_root=roots.resolved(self.package.root), python=sys.executable)
            write_private(os.path.join(tmp, "manifest.json"),
                          (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
            fsync_dir(tmp)
            with self.lock.fenced("%s %s" % (step, folder_id)):
                os.rename(tmp, os.path.join(base, folder_id))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # no half backup stays behind
            raise
        fsync_dir(base)
        return folder_id

    def _fill_backup(self, tmp, entries, meta):
        older = self.folder.list_backups()
        manifest_files = {}
        for i, entry in enumerate(entries):
            rel, pristine = entry["path"], entry["pristine"]
            if pristine is None:
                manifest_files[rel] = {"sha256": None, "blob": None}
                continue
            path = self.package.target(rel)
            info = self.package.stat_file(rel)
            if info is not None and info["sha256"] == pristine:
                src = path
            else:
                src = self.find_in_backups(older, rel, pristine)
                if src is None and entry.get("data") is None:
                    raise AgentError(Code.BACKUP, "%s: no copy of its original (%s) on the host to back up"
                                     % (rel, short(pristine)))
            blob = "%04d" % i
            if src is not None:
                with open(src, "rb") as f:
                    data = f.read()
            else:
                # A drifted file replaced (--replace-drifted) whose original is nowhere on the
                # host: the controller sent the snapshot's pristine bytes (verified below).
                data = base64.b64decode(entry["data"])
            write_private(os.path.join(tmp, blob), data)
            if wire.sha256_file(os.path.join(tmp, blob)) != pristine:
                raise AgentError(Code.BACKUP, "%s: backup copy does not verify" % rel)
            st = os.stat(src) if src == path else None
            manifest_files[rel] = {
                "sha256": pristine, "blob": blob,
                "mode": (st.st_mode & 0o7777) if st else entry.get("mode"),
                "uid": st.st_uid if st else None, "gid": st.st_gid if st else None,
            }
        return dict(meta, files=manifest_files)

    def _fill_drifted(self, tmp, kind, keep):
        files = {}
        for f, path in keep:
            with open(path, "rb") as fh:
                data = fh.read()
            if wire.sha256_bytes(data) != f["expect"]:
                raise AgentError(Code.CHANGED, "%s changed since it was read (now %s, planned from %s)"
                                 % (f["path"], short(wire.sha256_bytes(data)), short(f["expect"])), path=f["path"])
            dest = os.path.join(tmp, "files", *f["path"].split("/"))
            makedirs_private(os.path.dirname(dest))
            write_private(dest, data)
            if wire.sha256_file(dest) != f["expect"]:
                raise AgentError(Code.BACKUP, "%s: the kept copy of its edited bytes does not verify" % f["path"])
            st = os.stat(path)
            files[f["path"]] = {"sha256": f["expect"], "size": len(data), "file": "files/" + f["path"],
                                "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid,
                                "replaced_by": f.get("want")}
        return {"kind": "drifted", "command": kind, "files": files}

    def find_in_backups(self, backups, rel, sha):
        for manifest in reversed(backups):
            entry = manifest.get("files", {}).get(rel)
            if entry and entry.get("sha256") == sha and entry.get("blob"):
                path = self.folder.path("backups", manifest["id"], entry["blob"])
                if os.path.isfile(path) and wire.sha256_file(path) == sha:
                    return path
        return None

    def stage(self, staging, files, from_backup):
        """Write every wanted file under staging/<run>/ (0600) and verify its sha256."""
        makedirs_private(self.folder.path("staging"))
        os.mkdir(staging, 0o700)
        manifest = None
        if from_backup:
            manifest = wire.read_json(self.folder.path("backups", from_backup, "manifest.json"))
            if manifest is None:
                raise AgentError(Code.BACKUP, "backup %s has no readable manifest" % from_backup)
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
                    raise AgentError(Code.BACKUP, "backup %s holds no copy of %s" % (from_backup, f["path"]))
                with open(self.folder.path("backups", from_backup, entry["blob"]), "rb") as fh:
                    data = fh.read()
            dest = os.path.join(staging, "%04d" % i)
            write_private(dest, data)
            if wire.sha256_file(dest) != f["want"]:
                raise AgentError(Code.VERIFY, "%s: staged copy has the wrong sha256 (transfer damaged?)"
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
                    raise AgentError(Code.PERMISSION, "%s: cannot keep owner %d:%d (%s); use sudo in the inventory"
                                     % (f["path"], uid, gid, exc.strerror), path=f["path"])
            os.chmod(tmp, mode)
        except BaseException:
            remove_quietly(tmp)
            raise
        return tmp

    def prune_backups(self, keep_n, keep=()):
        with self.lock.fenced("pruning old backups"):
            return self._prune_backups(keep_n, keep)

    def _prune_backups(self, keep_n, keep):
        journal = wire.read_json(self.folder.path("journal.json")) or {}
        protected = set(k for k in keep if k) | set([journal.get("backup_id")])
        backups = [b["id"] for b in self.folder.list_backups()]
        pruned = []
        for bid in backups[: max(0, len(backups) - keep_n)]:
            if bid in protected:
                continue
            shutil.rmtree(self.folder.path("backups", bid), ignore_errors=True)
            pruned.append(bid)
        return pruned


def new_backup_id(run_id):
    """An id sortable by creation time down to the microsecond: "newest N" must be exact."""
    now = time.time()
    return "%s.%06dZ-%s" % (time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)), int(now % 1 * 1e6), run_id[:8])


def switched_is_ours(entry):
    """Whether the file of a switched ``done`` entry is still the version this run put there
    (its inode; a removed file still absent)."""
    path, ino = entry[1], entry[4] if len(entry) > 4 else None
    try:
        return ino is not None and os.lstat(path).st_ino == ino
    except OSError:
        return ino is None


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


def keep_previous(path, link=os.link):
    """A hard link to ``path``'s current version beside it (None: absent), for the way back.

    A link costs no data blocks, so switching back works on a full disk. Where the file
    system has no hard links, a copy (same owner and mode) is the fallback. ``link``: the
    agent's is ``wire.Hooks.link`` (os.link, unless the test hook ``no_hard_links``).
    """
    if not os.path.lexists(path):
        return None
    d, name = os.path.split(path)
    prev = os.path.join(d, ".%s%sprev-%d" % (name, TMP_TAG, os.getpid()))
    remove_quietly(prev)
    try:
        link(path, prev)
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
