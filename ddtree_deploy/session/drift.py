"""Drift made visible: a drifted host file against what the series expects there. Pure.

A push refuses a file that matches neither its pristine nor its patched version (the drift
check); that one line says *which* files, not *what* differs. With ``--diff`` (``push
--dry-run --diff``, ``status --diff``) the host's bytes are shown against the bytes the
series expects, as a unified diff per file: ``a/`` the expected version (the snapshot's
pristine file before a push, the patched file where the journal says it is deployed),
``b/`` what the host holds (``/dev/null`` for a file that is not there).
"""

from __future__ import annotations

import base64
from typing import Any, Iterable

from ddtree_deploy.session.plan import Desired


def host_bytes(facts: dict[str, Any], path: str) -> bytes | None:
    """A file's bytes as the agent sent them with ``content`` (None: absent or not sent)."""
    info = (facts.get("files") or {}).get(path)
    return base64.b64decode(info["data"]) if info and info.get("data") is not None else None


def file_diff(path: str, old: bytes | None, new: bytes | None, *, note: str = "") -> str:
    """One file's unified diff from ``old`` to ``new`` (None: no such file); "" when equal.
    Bytes that are not UTF-8 show as U+FFFD: text for people. ``note``: a line before the
    diff saying what a/ and b/ are (patch skips text before a diff)."""
    from ddtree_deploy.engine.patch_write import diff_hunks

    hunks = diff_hunks("" if old is None else old.decode("utf-8", errors="replace"),
                       "" if new is None else new.decode("utf-8", errors="replace"))
    if not hunks:
        return ""
    a = "/dev/null" if old is None else f"a/{path}"
    b = "/dev/null" if new is None else f"b/{path}"
    return (f"{note}\n" if note else "") + f"--- {a}\n+++ {b}\n" + "".join(text for _line, text in hunks)


def drift_diff(desired: Desired, facts: dict[str, Any], paths: Iterable[str], *, patched: Iterable[str] = ()) -> str:
    """The diff of each of ``paths`` from the version the series expects to the host's bytes
    in ``facts``: the patched version for the paths in ``patched`` (the journal says they are
    switched), else the pristine one (from ``desired.snapshot``)."""
    by_path = {t.path: t for t in desired.targets}
    switched = set(patched)
    out: list[str] = []
    for path in paths:
        t = by_path.get(path)
        if t is None:
            continue
        expected: bytes | None
        if path in switched:
            expected, what = t.data, f"patched by {desired.series}"
        else:
            expected, what = t.original, f"pristine, {desired.snapshot}"
        out.append(file_diff(path, expected, host_bytes(facts, path),
                             note=f"{path}: a/ what the series expects ({what}), b/ the host's file"))
    return "".join(out)


def expected_diff(desired: Desired, facts: dict[str, Any], paths: Iterable[str]) -> str:
    """Each of ``paths`` (drifted or missing) against what the series expects there: the
    patched version where the journal says this series is switched or deployed, else the
    pristine one. What ``status --diff`` shows, and ``--replace-drifted`` before it replaces."""
    from ddtree_deploy.base.codes import Phase

    journal = facts.get("journal") or {}
    ours = journal.get("series_id") == desired.series_id
    switched = ours and journal.get("phase") in (Phase.SWITCHING, Phase.SWITCHED, Phase.DEPLOYED)
    paths = list(paths)
    return drift_diff(desired, facts, paths, patched=paths if switched else ())


def status_drift_diff(desired: Desired, facts: dict[str, Any], files: list[dict[str, Any]]) -> str:
    """``status --diff``: each drifted or missing file of a status document's ``files``
    against what the series expects there (``expected_diff``)."""
    return expected_diff(desired, facts, [f["path"] for f in files if f.get("state") in ("drifted", "missing")])


def push_drift_diff(desired: Desired, facts: dict[str, Any]) -> str:
    """Before a push: each file the drift check refuses (neither pristine nor patched, or
    missing) against its pristine version."""
    from ddtree_deploy.session.plan import FileState, classify

    bad = [t.path for t in desired.targets
           if classify(((facts.get("files") or {}).get(t.path) or {}).get("sha256"), t.pristine, t.patched)
           in (FileState.DRIFTED, FileState.MISSING)]
    return drift_diff(desired, facts, bad)


__all__ = ["drift_diff", "expected_diff", "file_diff", "host_bytes", "push_drift_diff", "status_drift_diff"]
