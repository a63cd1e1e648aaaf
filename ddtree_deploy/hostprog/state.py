"""The agent's state folder on the host: its layout, and the check that it is ours.

Host-side state (``state_dir``, default ``~/.ddtree-deploy``). It may be shared by several
SGLang installs (package roots) on one machine: each root's state is a folder of its own
(roots.py): the top level for the root named by its ``root.json``, ``roots/<key>/`` for
every other. Per root (``StateFolder.path``)::

    root.json             which package root this state belongs to (roots.py)
    lock/owner.json       who holds the deploy lock (taken by one atomic rename; lock.py)
    lock.guard            flock'd around every lock change and every fenced write (lock.py)
    journal.json          what is deployed and the phase (written by temp + rename):
                          staged, switching, switched (smoke not passed yet), deployed,
                          rolled-back; ``serve``: the newest restart of the host's server
                          (journal.py)
    history.jsonl         the audit history: one JSON line appended per push, rollback,
                          mark, server restart, lock break and lock release (never
                          rewritten; history.py)
    history.1.jsonl       the previous history.jsonl, once that passed HISTORY_MAX_BYTES
    backups/<id>/         original files by index + manifest.json (written last; apply.py)
    staging/<run_id>/     uploaded files, verified, before the switch (apply.py)
    drifted/<id>/         files edited outside ddtree-deploy that ``--replace-drifted``
                          replaced: their bytes, as found, and manifest.json (never pruned)

Shared by the roots, at the top (``StateFolder.top``)::

    .ddtree-deploy-state  marker written when the agent creates the folder: a folder
                          without it is never written to (see check_state_dir)
    roots/<key>/          the other roots' state folders
    smoke/, tune/         the smoke and tune programs' logs and the tune lock (one tune
                          at a time on a machine: its servers hold the GPUs)
    load/<tag>/           the speed gate's load step while it runs (hostprog/load.py: the
                          prompt file and the benchmark's log, removed when it stops)
"""

import errno
import json
import os
import re

from ddtree_deploy.base.codes import JOURNAL_PHASES, Code
from ddtree_deploy.hostprog import roots, wire
from ddtree_deploy.hostprog.facts import find_sglang
from ddtree_deploy.hostprog.fileops import TMP_TAG, AgentError, makedirs_private, write_private

JOURNAL_VERSION = 1
STATE_MARKER = ".ddtree-deploy-state"  # a state folder is ours only when it holds this file
PHASES = JOURNAL_PHASES  # staged, switching, switched, deployed, rolled-back
HISTORY = "history.jsonl"
HISTORY_OLD = "history.1.jsonl"
GUARD = "lock.guard"


class StateFolder(object):
    """The state folder's path (``state_dir``), the check that it is ours, and the folder of
    this package root's state in it (``home``, ``path``; ``top`` for what the roots share).

    Collaborator: ``package`` (facts.PackageRoot), the install whose state this is.
    ``adopt_legacy``: whether state an earlier version left at the top (no root.json) may be
    this root's (``legacy_is_ours``); the container program's never is (it is a venv
    install's)."""

    def __init__(self, package, adopt_legacy=True):
        self.package = package
        self.adopt_legacy = adopt_legacy
        self.state_dir = None
        self.state_raw = None
        self.home = None  # this root's state folder (roots.locate), once resolved

    def set_state_dir(self, state_dir):
        # Kept as given: check_state_dir refuses a relative one rather than resolving it
        # against whatever folder the SSH session starts in.
        self.state_raw = state_dir
        self.state_dir = os.path.normpath(os.path.expanduser(state_dir))
        self.home = None

    def home_dir(self):
        """This root's state folder, read-only (resolved once per session; ``claim_home``
        settles it under the lock)."""
        if self.home is None:
            self.home = roots.locate(self.state_dir, self.package.package_root(), self.legacy_is_ours)
        return self.home

    def legacy_is_ours(self):
        """Whether the state an earlier version left at the top (no root.json) describes
        this root: the journal's SGLang version is ours and our files agree with its phase
        (deployed or switched: some patched, none pristine; rolled back or staged: some
        pristine, none patched; switching: some either way; drifted files do not count);
        without a journal, every backup is of our version. Several roots may agree (the
        same release, untouched): the first to take the lock gets it."""
        if not self.adopt_legacy:
            return False
        version = find_sglang()[1]
        journal = wire.read_json(self.top("journal.json"))
        if not isinstance(journal, dict):
            backups = os.path.join(self.state_dir, "backups")
            names = os.listdir(backups) if os.path.isdir(backups) else []
            docs = [wire.read_json(os.path.join(backups, n, "manifest.json")) for n in names]
            return all(isinstance(d, dict) and d.get("sglang_version") in (None, version) for d in docs)
        if journal.get("sglang_version") not in (None, version):
            return False
        pristine = patched = 0
        for rel, entry in sorted((journal.get("files") or {}).items()):
            if not isinstance(entry, dict):
                continue
            try:
                info = self.package.stat_file(rel)
            except AgentError:
                continue  # a path we do not touch (a symlink): it says nothing either way
            have = info["sha256"] if info else None
            if have is not None and have == entry.get("patched"):
                patched += 1
            elif have == entry.get("pristine"):
                pristine += 1
        phase = journal.get("phase")
        if phase in ("deployed", "switched"):
            return patched > 0 and pristine == 0
        if phase in ("rolled-back", "staged"):
            return pristine > 0 and patched == 0
        return patched + pristine > 0 or not journal.get("files")

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
            # Not package_root(): it would remember the root, and a file operation before
            # facts must still be refused (PackageRoot.target).
            root = self.package.root or find_sglang()[0]
            real = os.path.realpath(self.state_dir)
            real_root = os.path.realpath(root)
            if real == real_root or real.startswith(real_root + os.sep):
                problem = "lies inside the package root %s" % real_root
            elif real_root.startswith(real.rstrip(os.sep) + os.sep):
                problem = "lies above the package root %s" % real_root
        if problem is None and os.path.lexists(self.state_dir):
            marker = self.top(STATE_MARKER)
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
            raise AgentError(Code.BAD_STATE_DIR, "state_dir %r %s; nothing was changed: set host.state_dir to "
                             "an absolute path of a new or empty folder, e.g. ~/.ddtree-deploy" % (raw, problem))

    def write_marker(self, adopted):
        doc = {"tool": "ddtree-deploy", "created": wire.now_iso(), "adopted": adopted}
        try:
            write_private(self.top(STATE_MARKER), (json.dumps(doc) + "\n").encode())
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise

    def path(self, *parts):
        """A path in this root's state folder."""
        return os.path.join(self.home_dir(), *parts)

    def top(self, *parts):
        """A path in the state folder's top level (the marker, the roots, the tune lock)."""
        return os.path.join(self.state_dir, *parts)

    def root_record(self):
        """This root's root.json (None: not written yet, or an earlier layout's folder)."""
        return roots.record_of(self.home_dir())

    def need_state_dir(self):
        if not self.state_dir:
            raise AgentError(Code.PROTOCOL, "init must run first")
        self.check_state_dir(create=False)

    def list_backups(self, kind="backups"):
        """The manifests of this root's backups (``drifted``: of its kept edits), oldest first."""
        out = []
        base = self.path(kind)
        if not os.path.isdir(base):
            return out
        for name in sorted(os.listdir(base)):
            manifest = wire.read_json(os.path.join(base, name, "manifest.json"))
            if isinstance(manifest, dict) and TMP_TAG not in name:
                out.append(manifest)
        return out


_BACKUP_ID = re.compile(r"^[0-9]{8}T[0-9]{6}(\.[0-9]{6})?Z-[0-9A-Za-z_-]+(" + re.escape(TMP_TAG) + r")?$")
_BLOB = re.compile(r"^[0-9]{4}$")


def foreign_content(folder):
    """None when ``folder`` holds nothing but what this agent writes in a state folder
    (or nothing at all); else what in it is not ours. Symlinks are never ours. An install's
    state folder under ``roots/`` must hold that same layout (roots.py)."""
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

    def anything(full, _name):  # files of ours in any folder below (no symlinks)
        return only(full, lambda n: True, anything)

    def drifted(full, name):
        if not _BACKUP_ID.match(name):
            return "not a backup id"
        return only(full, lambda n: n == "manifest.json", lambda f, n: anything(f, n) if n == "files" else
                    "unexpected folder")

    def staging(full, _name):
        return only(full, lambda n: bool(_BLOB.match(n)))

    def smoke(full, _name):
        return only(full, lambda n: True)

    def install(full, name, nested):
        if name == "lock" or name.startswith("lock" + TMP_TAG):
            return only(full, lambda n: n == "owner.json")
        subs = {"backups": backups, "staging": staging, "drifted": drifted}
        if not nested:
            # load/<tag>/: the speed gate's load step (hostprog/load.py: its files, removed when it ends)
            subs.update(smoke=smoke, load=lambda f, n: only(f, lambda n: False, smoke),
                        roots=lambda f, n: only(f, lambda n: False, root_folder))
        sub = subs.get(name)
        if sub is None:
            return "unexpected folder"
        return only(full, lambda n: False, sub)

    def root_folder(full, name):
        if not re.match(r"^[0-9a-f]{%d}$" % roots.KEY_LEN, name):
            return "not an install's key"
        return only(full, state_file, lambda f, n: install(f, n, True)) or journal_problem(full)

    def state_file(name):
        return name in ("journal.json", HISTORY, HISTORY_OLD, GUARD, roots.RECORD) or \
            name.startswith(("journal.json" + TMP_TAG, roots.RECORD + TMP_TAG))

    def journal_problem(where):
        journal_path = os.path.join(where, "journal.json")
        if os.path.lexists(journal_path):
            rel = os.path.relpath(journal_path, folder)
            if os.path.islink(journal_path) or not os.path.isfile(journal_path):
                return "%s is not a plain file" % rel
            doc = wire.read_json(journal_path)
            if not isinstance(doc, dict) or doc.get("version") != JOURNAL_VERSION or doc.get("phase") not in PHASES:
                return "%s is not a ddtree-deploy journal" % rel
        return None

    return only(folder, state_file, lambda f, n: install(f, n, False)) or journal_problem(folder)
