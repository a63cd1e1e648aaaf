"""Which folder of a state folder holds one package root's state (stdlib only, Python 3.8+).

One state folder (``host.state_dir``, by default ``~/.ddtree-deploy`` for every host file)
may be shared by several SGLang installs on one machine: a production venv and a canary
venv, two host files that differ only in ``[host] python``. Each install's state -- its
lock, journal, backups, kept edits and history -- belongs to its package root (the folder
that holds ``sglang/``, resolved through symlinks) and is never read or written for
another root:

    <state_dir>/root.json          the root whose state is the folder's own top level
    <state_dir>/journal.json ...   that root's state, in the layout every earlier version
                                   wrote (so a single-install folder keeps working as is)
    <state_dir>/roots/<key>/       every other root's state, the same layout, with its own
                                   root.json; <key>: the first 16 hex digits of the sha256
                                   of the resolved package root

The top level belongs to the first root that takes a lock there (lock.py's ``claim_home``,
under the top's ``lock.guard``); a folder from before this layout (no ``root.json``) goes to
the first root its journal describes (state.py's ``legacy_is_ours``), so an existing
single-install folder needs no file moved. The listing of ``roots/`` plus the top's record is the index
(``installs``): no shared index file to keep consistent with the folders.
"""

import hashlib
import os

from ddtree_deploy.hostprog import wire

ROOTS = "roots"
RECORD = "root.json"
KEY_LEN = 16
# What a state folder's top level holds when some install has used it (earlier layouts too).
_STATE_NAMES = ("journal.json", "backups", "history.jsonl", "history.1.jsonl", "lock", "drifted")


def resolved(package_root):
    """The package root through every symlink: what a key and a record name."""
    return os.path.realpath(package_root)


def key_of(package_root):
    """The root's folder name under ``roots/``: the same for every interpreter whose sglang
    lives in that folder (a venv's python and python3), another for another folder."""
    return hashlib.sha256(resolved(package_root).encode("utf-8", "surrogateescape")).hexdigest()[:KEY_LEN]


def record_of(folder):
    """The ``root.json`` of a state folder (its top, or one under ``roots/``), or None."""
    doc = wire.read_json(os.path.join(folder, RECORD))
    return doc if isinstance(doc, dict) and isinstance(doc.get("key"), str) else None


def has_state(folder):
    """Whether some install left state in ``folder``'s top level (this layout or an older one)."""
    for name in _STATE_NAMES:
        path = os.path.join(folder, name)
        if name == "backups" and os.path.isdir(path) and not os.path.islink(path):
            if os.listdir(path):
                return True
        elif os.path.lexists(path):
            return True
    return False


def locate(state_dir, package_root, legacy_is_ours=None):
    """The folder of ``package_root``'s state in ``state_dir``, read-only (the first locked
    command writes its root.json there when none names it yet: lock.py, ``claim_home``).

    The top level when its record names this root, or when it names none yet and is empty
    or holds an earlier version's state that ``legacy_is_ours()`` takes for this root's;
    else ``roots/<key>``.
    """
    key = key_of(package_root)
    own = os.path.join(state_dir, ROOTS, key)
    top = record_of(state_dir)
    if top is not None:
        return state_dir if top["key"] == key else own
    if os.path.isdir(own):
        return own
    if not has_state(state_dir) or (legacy_is_ours is not None and legacy_is_ours()):
        return state_dir
    return own


def new_record(package_root, python, how, history_since):
    """A ``root.json``: which root the folder's state belongs to, which interpreter first
    used it, how the folder came to be (``fresh``, ``legacy``: claimed from an earlier
    layout, ``own``: a folder under roots/), and from when its history holds every switch
    of the root's files (0: from the start; None: from its first line)."""
    return {"key": key_of(package_root), "package_root": resolved(package_root), "python": python,
            "created": wire.now_iso(), "how": how, "history_since": history_since}


def installs(state_dir):
    """Every install with state in ``state_dir``: [(folder, record or None)], the top first
    (None: an earlier layout's state that no root has claimed yet), then ``roots/*``."""
    out = []
    if record_of(state_dir) is not None or has_state(state_dir):
        out.append((state_dir, record_of(state_dir)))
    base = os.path.join(state_dir, ROOTS)
    if os.path.isdir(base) and not os.path.islink(base):
        for name in sorted(os.listdir(base)):
            folder = os.path.join(base, name)
            if os.path.isdir(folder) and not os.path.islink(folder) and len(name) == KEY_LEN:
                out.append((folder, record_of(folder)))
    return out


__all__ = ["RECORD", "ROOTS", "has_state", "installs", "key_of", "locate", "new_record", "record_of", "resolved"]
