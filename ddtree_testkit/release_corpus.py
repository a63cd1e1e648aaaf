"""The release-diff corpus (issue 28 item 6): SGLang's own change between consecutive releases,
applied by the patch engine where it must apply and where it is already in, against GNU patch.

Shared by tests/integration/test_release_corpus.py (the claims) and bench/release_corpus_bench.py (the
figures, before and after a change to the engine). Real files only: every ``.py`` file under
``sglang/`` in the PyPI wheels of RELEASES (fetched once into the wheel cache by
ddtree_deploy.release.releases, offline after), diffs written by GNU ``diff -ru``.

    pairs(workdir)            each consecutive pair of RELEASES: its changed files and their diffs
    own_base(change, fuzz)    the diff on the older release: every hunk must apply, exactly
    patched(change, fuzz)     the diff on the newer release: every hunk must be already in
    gnu_verdicts(...)         GNU patch --dry-run --verbose on a pair's tree, per file and hunk
    lookalike(change, side)   the diff's first hunk alone on a file with a copy of one of its
                              sides put on top (issue 21's lookalike, with real code)

A pair's files are written under ``workdir`` (only the files that changed, both sides) and
removed when the next pair is built: about 70 MB at a time.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ddtree_deploy.engine.patch_apply import FileResult, HunkStatus, apply_file_patch
from ddtree_deploy.engine.patch_parse import FilePatch, parse_patch
from ddtree_deploy.release import releases

# Every SGLang release on PyPI from 0.5.12 to 0.5.23, post-releases included, oldest first
# (pinned, so that a new release on PyPI does not change what the tests claim).
RELEASES = ("0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1",
            "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
PACKAGE = "sglang/"
FUZZ = (0, 1, 2)
_APPLIED = (HunkStatus.EXACT, HunkStatus.OFFSET, HunkStatus.FUZZ)


def wheels(versions=RELEASES) -> dict[str, Path]:
    """The verified wheel of each release (downloaded into the cache the first time)."""
    return {v: releases.ensure_wheel(v) for v in versions}


@dataclass(frozen=True)
class Change:
    """One file changed between two consecutive releases."""

    older: str
    newer: str
    path: str  # package-relative, e.g. sglang/srt/server_args.py
    patch: FilePatch  # its `diff -u` section, parsed
    old: str
    new: str


@dataclass(frozen=True)
class Pair:
    older: str
    newer: str
    root: Path  # root/a: the older release's changed files, root/b: the newer's
    diff: str  # `diff -ru a b` over them (a/ and b/ prefixes: patch -p1)
    changes: tuple[Change, ...]


def _members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    return {i.filename: i for i in zf.infolist() if i.filename.startswith(PACKAGE) and i.filename.endswith(".py")}


def pairs(workdir: Path, versions=RELEASES) -> Iterator[Pair]:
    """Each consecutive pair of ``versions`` with the .py files that changed between them."""
    found = wheels(versions)
    for older, newer in zip(versions, versions[1:]):
        root = workdir / f"{older}_{newer}"
        shutil.rmtree(root, ignore_errors=True)
        with zipfile.ZipFile(found[older]) as za, zipfile.ZipFile(found[newer]) as zb:
            ma, mb = _members(za), _members(zb)
            texts = {}
            for path in sorted(ma.keys() & mb.keys()):
                ia, ib = ma[path], mb[path]
                if ia.CRC == ib.CRC and ia.file_size == ib.file_size:
                    continue  # the same bytes (the CRC says so; the contents are compared below)
                old, new = za.read(path), zb.read(path)
                if old != new:
                    texts[path] = (old, new)
        for path, (old, new) in texts.items():
            for side, data in (("a", old), ("b", new)):
                target = root / side / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        run = subprocess.run(["diff", "-ru", "a", "b"], cwd=root, capture_output=True,
                             env={**os.environ, "LC_ALL": "C"})
        if run.returncode not in (0, 1):
            raise RuntimeError(f"diff -ru failed on {root}: {run.stderr.decode(errors='replace')}")
        diff = run.stdout.decode()
        changes = []
        for section in re.split(r"^diff -ru .*\n", diff, flags=re.M)[1:]:
            (fp,) = parse_patch(section, name=f"{older}-{newer}.diff")
            old, new = texts[fp.path]
            changes.append(Change(older, newer, fp.path, fp, old.decode(), new.decode()))
        yield Pair(older, newer, root, diff, tuple(changes))
        shutil.rmtree(root, ignore_errors=True)


def own_base(change: Change, fuzz: int) -> FileResult:
    """The change on the release it was made from: every hunk exact, the result the newer file."""
    return apply_file_patch(change.patch, change.old, fuzz=fuzz)


def patched(change: Change, fuzz: int) -> FileResult:
    """The change on the release that has it: every hunk already applied, nothing written."""
    return apply_file_patch(change.patch, change.new, fuzz=fuzz)


# ---------------------------------------------------------------------------------- GNU patch

_GNU_HUNK = re.compile(r"^Hunk #(\d+) (succeeded|FAILED|ignored) at (-?\d+)"
                       r"(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?\.$")


@dataclass
class GnuFile:
    reversed: bool = False  # -N: "Reversed (or previously applied) patch detected", file skipped
    hunks: dict[int, tuple[str, int, int, int]] = dataclasses.field(default_factory=dict)
    # hunk -> (verdict, line, offset, fuzz)


def gnu_verdicts(pair: Pair, side: str, fuzz: int) -> dict[str, GnuFile]:
    """GNU patch -N --dry-run --verbose on the pair's ``side`` ("a": older, "b": newer), per file."""
    run = subprocess.run(["patch", "--dry-run", "--verbose", "-p1", f"-F{fuzz}", "-N", "-r", "-",
                          "--no-backup-if-mismatch"], input=pair.diff.encode(), cwd=pair.root / side,
                         capture_output=True, env={**os.environ, "LC_ALL": "C"}, timeout=600)
    files: dict[str, GnuFile] = {}
    current = None
    for line in run.stdout.decode(errors="replace").splitlines():
        m = re.match(r"^checking file (.+)$", line)
        if m:
            current = files.setdefault(m[1], GnuFile())
        elif current is not None and line.startswith("Reversed (or previously applied) patch detected"):
            current.reversed = True
        elif current is not None and (h := _GNU_HUNK.match(line)):
            current.hunks[int(h[1])] = (h[2], int(h[3]), int(h[5] or 0), int(h[4] or 0))
    return files


# --------------------------------------------------------------------------------- lookalikes


def lookalike(change: Change, side: str, fuzz: int) -> tuple[str, FileResult] | None:
    """The change's first hunk alone, on a file that holds a copy of one of its sides on top.

    ``side`` "new": the older file (the hunk must apply) with a copy of the hunk's new side
    above everything, so that the real place moves down by the copy's length; "old": the newer
    file (the hunk is in) with a copy of its old side on top. Neither copy is at the line the
    hunk states, nor is the real place any more: issue 21's lookalike, with real code. Returns
    (what the engine did, its result), what being one of:

    - "refused": failed as ambiguous, both places named (the rule's answer);
    - "right": applied at the real place ("new") or already applied there ("old"): the hunk
      is anchored to the end of the file (its trailing context is shorter: the copy on top
      is out of its reach), or a match at the stated line decided it (SGLang repeats code);
    - "wrong": skipped ("new") or written a second time ("old");
    - "failed": failed for another reason (a side compared with fuzz lost its context).

    None when the hunk states line 1 or has an empty side (a copy would be the real place).
    """
    h = change.patch.hunks[0]
    if h.old_start <= 1 or not h.old_len or not h.new_len:
        return None
    one = dataclasses.replace(change.patch, hunks=(h,))
    keep = "+" if side == "new" else "-"
    copy = [t + "\n" for tag, t in h.lines if tag in (" ", keep)]
    text = "".join(copy) + (change.old if side == "new" else change.new)
    res = apply_file_patch(one, text, fuzz=fuzz)
    (r,) = res.hunks
    if r.ambiguous:
        return "refused", res
    if r.status is HunkStatus.FAILED:
        return "failed", res
    real = (h.old_start if side == "new" else h.new_start) + len(copy)
    if side == "new":
        return ("right" if r.status in _APPLIED and r.line == real else "wrong"), res
    return ("right" if r.status is HunkStatus.ALREADY_APPLIED and r.line == real else "wrong"), res


# ---------------------------------------------------------------------------------- figures


def measure(workdir: Path, *, fuzz_levels=FUZZ, gnu_levels=FUZZ, lookalike_every: int = 1,
            versions=RELEASES) -> Counter:
    """Every figure the bench prints and the test claims, over the whole corpus.

    Keys: "pairs", "files", "hunks"; per fuzz f: "own f: refused" (hunks failed on their own
    base), "own f: not exact", "own f: wrong text" (a result that is not the newer file),
    "patched f: files failing" (some hunk not already applied), "patched f: hunks not already",
    "patched f: hunks written" (applied again); for f in ``gnu_levels``: "gnu own f: hunks refused",
    "gnu own f: disagree" (another verdict or line than the engine's), "gnu patched f: files
    reversed", "gnu patched f: files written twice" (GNU -N would apply a hunk again);
    lookalikes (the first hunk of every ``lookalike_every``-th changed file, both copies):
    "lookalike new f: refused|right|wrong|failed", "lookalike old f: ...".
    """
    stats: Counter = Counter()
    seen = 0
    for pair in pairs(workdir, versions):
        stats["pairs"] += 1
        for f in fuzz_levels:
            gnu = f in gnu_levels
            own_gnu = gnu_verdicts(pair, "a", f) if gnu else {}
            re_gnu = gnu_verdicts(pair, "b", f) if gnu else {}
            for change in pair.changes:
                res = own_base(change, f)
                stats[f"own {f}: refused"] += sum(not h.ok for h in res.hunks)
                stats[f"own {f}: not exact"] += sum(h.status is not HunkStatus.EXACT for h in res.hunks)
                stats[f"own {f}: wrong text"] += res.ok and res.text != change.new
                if gnu:
                    g = own_gnu.get(change.path, GnuFile())
                    for h in res.hunks:
                        verdict = g.hunks.get(h.index, ("missing", 0, 0, 0))
                        stats[f"gnu own {f}: hunks refused"] += verdict[0] != "succeeded"
                        stats[f"gnu own {f}: disagree"] += (verdict[0] == "succeeded") != h.ok or (
                            h.ok and verdict[1:] != (h.line, h.offset, h.fuzz))
                res = patched(change, f)
                behind = [h for h in res.hunks if h.status is not HunkStatus.ALREADY_APPLIED]
                stats[f"patched {f}: files failing"] += bool(behind)
                stats[f"patched {f}: hunks not already"] += len(behind)
                stats[f"patched {f}: hunks written"] += sum(h.status in _APPLIED for h in behind)
                if gnu:
                    g = re_gnu.get(change.path, GnuFile())
                    stats[f"gnu patched {f}: files reversed"] += g.reversed
                    stats[f"gnu patched {f}: files written twice"] += not g.reversed and any(
                        v[0] == "succeeded" for v in g.hunks.values())
        for change in pair.changes:
            stats["files"] += 1
            stats["hunks"] += len(change.patch.hunks)
            seen += 1
            if (seen - 1) % lookalike_every:
                continue
            for side in ("new", "old"):
                for f in fuzz_levels:
                    found = lookalike(change, side, f)
                    if found is not None:
                        stats[f"lookalike {side} {f}: {found[0]}"] += 1
    return stats


__all__ = ["RELEASES", "Change", "GnuFile", "Pair", "gnu_verdicts", "lookalike", "measure", "own_base",
           "pairs", "patched", "wheels"]
