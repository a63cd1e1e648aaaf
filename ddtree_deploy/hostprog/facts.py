"""The agent's read-only job: where SGLang is, what its files hold, what backups the state has.

``facts`` answers the SGLang version and package root (found without importing sglang),
the sha256 (and, asked, the bytes) of each named file and of every file the journal and
the backups name, the journal, the backups, the kept edits and the deploy lock: all of this
root's state folder (roots.py), never another's; as a list for people, which other
installs keep state in the same state folder (``installs``); and, asked (``driver``), the
host's NVIDIA driver as nvidia-smi says it (gpu_driver.py: a push's first read, status). ``target`` is the one way
from a package-relative path to a file: nothing outside the package root, never through
a symlink.
"""

import base64
import errno
import os
import sys

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import gpu_driver, roots, wire
from ddtree_deploy.hostprog.fileops import AgentError


class PackageRoot(object):
    """The SGLang package root this agent works on (``root``: None until ``facts`` or a lock
    found it), and the one way from a package-relative path to a file in it. A part of its
    own, below the state folder and the lock, because both need it (the state folder to
    tell an earlier layout's state, the lock to sweep the package folders) and neither may
    need the other for it."""

    def __init__(self):
        self.root = None

    def package_root(self):
        if self.root is None:
            self.root = find_sglang()[0]
        return self.root

    def target(self, rel):
        """The absolute path of a package-relative file, refusing anything outside the root."""
        if self.root is None:
            raise AgentError(Code.PROTOCOL, "facts must run before any file operation")
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
            raise AgentError(Code.BAD_PATH, "not a package-relative path: %r" % (rel,))
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise AgentError(Code.BAD_PATH, "not a package-relative path: %r" % (rel,))
        path = os.path.join(self.root, *parts)
        # A symlinked directory could carry the write outside the package: refuse it.
        real_parent = os.path.realpath(os.path.dirname(path))
        real_root = os.path.realpath(self.root)
        if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
            raise AgentError(Code.UNSAFE_FILE, "%s leaves the package root through a symlink" % rel)
        if os.path.islink(path):
            raise AgentError(Code.UNSAFE_FILE, "%s is a symlink (to %s); refusing to read or replace it"
                             % (rel, os.readlink(path)))
        return path

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
            "sha256": wire.sha256_bytes(data),
            "size": st.st_size,
            "mode": st.st_mode & 0o7777,
            "uid": st.st_uid,
            "gid": st.st_gid,
        }
        if content:
            info["data"] = base64.b64encode(data).decode("ascii")
        return info


class Facts(object):
    """The ``facts`` and ``driver`` ops. Collaborators: ``folder`` (state.StateFolder),
    ``package`` (PackageRoot), ``lock`` (lock.Lock: who holds the deploy lock)."""

    def __init__(self, folder, package, lock):
        self.folder = folder
        self.package = package
        self.lock = lock

    def op_facts(self, request):
        """Read-only: SGLang version and root, sha256 (and optionally bytes) of files, state."""
        self.package.root, version, how = find_sglang()
        if self.folder.state_dir:
            self.folder.check_state_dir(create=False)
        paths = set(request.get("paths") or ())
        journal = wire.read_json(self.folder.path("journal.json")) if self.folder.state_dir else None
        backups = self.folder.list_backups() if self.folder.state_dir else []
        drifted = self.list_drifted() if self.folder.state_dir else []
        if request.get("include_state_paths", True):
            if journal:
                paths.update(journal.get("files", {}))
            for b in backups:
                paths.update(b.get("files", {}))
        files = {}
        for rel in sorted(paths):
            try:
                files[rel] = self.package.stat_file(rel, bool(request.get("content")))
            except AgentError as exc:
                if exc.code != Code.UNSAFE_FILE:
                    raise
                # One symlinked target must not hide the others: report it, by name.
                files[rel] = {"unsafe": exc.message}
        lock_owner = self.lock.read_lock() if self.folder.state_dir else None
        reply = {
            "sglang_version": version,
            "version_source": how,
            "package_root": self.package.root,
            "files": files,
            "journal": journal,
            "backups": backups,
            "drifted": drifted,
            "lock": lock_owner,
            "state_home": self.folder.home_dir() if self.folder.state_dir else None,
            "installs": self.list_installs() if self.folder.state_dir else [],
        }
        if request.get("driver"):  # only when asked: nvidia-smi can take seconds
            reply["driver"] = gpu_driver.probe()
        return reply

    def op_driver(self, request):
        """Read-only: the host's NVIDIA driver alone (``image --host``: a host whose SGLang, if
        any, runs in a container; no package root or state folder needed)."""
        return {"driver": gpu_driver.probe()}

    def list_drifted(self):
        """The kept edits (``drifted/<id>/``), each manifest with the folder that holds it."""
        return [dict(m, folder=self.folder.path("drifted", str(m.get("id")))) for m in self.folder.list_backups("drifted")]

    def list_installs(self):
        """Every install with state in this state folder, for people (status lists them): its
        package root and interpreter, SGLang version, phase and series, the deploy lock's
        holder; ``this``: ours. Read-only, and only these few fields of each: nothing another
        root's state holds ever decides what this agent does."""
        mine = self.folder.home_dir()
        out = []
        for where, record in roots.installs(self.folder.state_dir):
            journal = wire.read_json(os.path.join(where, "journal.json"))
            journal = journal if isinstance(journal, dict) else {}
            lock = wire.read_json(os.path.join(where, "lock", "owner.json")) \
                if os.path.isdir(os.path.join(where, "lock")) else None
            out.append({
                "this": where == mine,
                "folder": where,
                "package_root": (record or {}).get("package_root") or journal.get("package_root"),
                "python": (record or {}).get("python"),
                "claimed": record is not None,
                "sglang_version": journal.get("sglang_version"),
                "phase": journal.get("phase"),
                "series": journal.get("series"),
                "run_id": journal.get("run_id"),
                "updated": journal.get("updated"),
                "lock": {k: lock.get(k) for k in ("holder", "run_id", "command", "time")}
                if isinstance(lock, dict) else None,
            })
        return out


def find_sglang():
    """The folder holding the sglang package, and its version, without importing sglang.

    Importing sglang would pull torch and CUDA; find_spec only locates it.
    """
    pkg = wire.find_package("sglang")
    if pkg is None:
        raise AgentError(Code.NO_SGLANG, "this interpreter (%s) cannot find the sglang package" % sys.executable)
    root = os.path.dirname(pkg)
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
