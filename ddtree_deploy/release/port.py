"""Porting a family to a new SGLang release, and regenerating patches from an edited tree.

Two jobs, both quilt-like:

- ``port_series`` applies a family to a release's files (offset, and fuzz when
  asked), keeps every hunk that lands, regenerates each patch from the texts before
  and after it (so hunks are re-anchored to the new release's line numbers and
  their context is the new release's), and records each hunk that does not land as
  a reject: where it came closest and which lines differ there.
- ``refresh_series`` rebuilds a family's patch files from a working tree that an
  engineer edited (the release's files with the series applied and the rejects
  fixed by hand), one patch per series entry, in order, keeping each patch's
  header text.

The algorithms are pure (texts in, texts out); the functions at the end of the
module are the I/O edge (cached wheels in, family folders and working trees out). The unified diffs are written by ``patch_write`` (the engine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import unidiff
from packaging.version import InvalidVersion, Version

from ddtree_deploy.base import next_step
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.fsutil import atomic_write
from ddtree_deploy.base.locations import inside_install
from ddtree_deploy.engine import patch_apply, patch_parse
from ddtree_deploy.engine.patch_apply import HunkResult, HunkStatus
from ddtree_deploy.engine.patch_parse import FilePatch
from ddtree_deploy.engine.patch_write import CONTEXT, blob_id, diff_hunks, opcodes
from ddtree_deploy.engine.series import (
    FAMILY_FILE,
    SERIES_FILE,
    AddEntry,
    FamilyInfo,
    PatchEntry,
    Series,
    load_family,
    show,
)
from ddtree_deploy.release import releases

def line_map(old: str, new: str):
    """A function from a 1-based line of ``old`` to the matching line of ``new``.

    A line inside a changed block maps to the start of the block's replacement.
    """
    a = old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    blocks = opcodes(a, b)

    def to_new(line: int) -> int:
        index = line - 1
        for tag, i1, i2, j1, _j2 in blocks:
            if i1 <= index < i2 or (i1 == i2 == index):
                return j1 + (index - i1 if tag == "equal" else 0) + 1
        return len(b) + 1

    return to_new


# ---------------------------------------------------------------------------
# Reading the parts of a patch file we keep verbatim


@dataclass(frozen=True)
class _RawSection:
    """One file section of a patch file, as written."""

    path: str
    git_header: bool  # starts with "diff --git"
    has_index: bool
    mode: str | None  # "100644" from an index or new-file-mode line
    hunks: tuple[str, ...]  # each hunk's text, header included


_GIT_EXTENDED = ("diff --git ", "index ", "new file mode ", "deleted file mode ", "old mode ",
                 "new mode ", "similarity index ", "rename from ", "rename to ")


def _preamble_and_sections(text: str, file_patches: Sequence[FilePatch]) -> tuple[str, list[_RawSection]]:
    """The text before the first file section (commit message, notes) and each section's parts."""
    lines = text.splitlines(keepends=True)
    first = min(fp.header_line for fp in file_patches) - 1  # 0-based "--- " line
    while first > 0 and lines[first - 1].startswith(_GIT_EXTENDED):
        first -= 1
    preamble = "".join(lines[:first])
    parsed = unidiff.PatchSet(text)
    if [fp.path for fp in file_patches] != [p.path for p in parsed]:
        # Our engine and unidiff must see the same sections, or hunks would be mislabelled.
        raise BadInput(f"{file_patches[0].patch_name}: its file sections read differently by unidiff "
                       f"({[p.path for p in parsed]}) and by the patch engine",
                       hint="regenerate the patch with git diff")
    sections = []
    for fp, pf in zip(file_patches, parsed):
        start = fp.header_line - 1
        ext = []
        k = start
        while k > 0 and lines[k - 1].startswith(_GIT_EXTENDED):
            k -= 1
            ext.append(lines[k])
        mode = None
        for line in ext:
            if line.startswith("new file mode "):
                mode = line.split()[-1]
            elif line.startswith("index ") and len(line.split()) == 3:
                mode = line.split()[-1]
        sections.append(
            _RawSection(
                path=fp.path,
                git_header=any(x.startswith("diff --git ") for x in ext),
                has_index=any(x.startswith("index ") for x in ext),
                mode=mode,
                hunks=tuple(str(h) if str(h).endswith("\n") else str(h) + "\n" for h in pf),
            )
        )
    return preamble, sections


def _section_header(raw: _RawSection, *, is_new: bool, old: str | None, new: str | None) -> str:
    out = []
    if raw.git_header:
        out.append(f"diff --git a/{raw.path} b/{raw.path}\n")
        if is_new:
            out.append(f"new file mode {raw.mode or '100644'}\n")
        if raw.has_index:
            mode = "" if is_new else f" {raw.mode or '100644'}"
            out.append(f"index {blob_id(old)}..{blob_id(new)}{mode}\n")
    out.append("--- /dev/null\n" if is_new else f"--- a/{raw.path}\n")
    out.append(f"+++ b/{raw.path}\n")
    return "".join(out)


# ---------------------------------------------------------------------------
# Porting


@dataclass(frozen=True)
class Reject:
    """A hunk that did not land on the new release."""

    entry: str
    path: str
    hunk: HunkResult | None  # None when the whole file is missing
    text: str  # the original hunk, header included
    tree_line: int | None  # where to look in the working tree (1-based)
    reason: str

    def describe(self) -> list[str]:
        """Lines for the .rej file's notes and for the CLI."""
        if self.hunk is None:
            return [f"{self.path}: {self.reason}"]
        h = self.hunk
        head = f"{self.path} hunk {h.index} ({h.header.strip()}, patch line {h.patch_line}): {self.reason}"
        out = [head]
        for m in h.mismatches:
            found = "<end of file>" if m.actual is None else repr(m.actual.rstrip("\n"))
            out.append(f"  line {m.line}: expected {m.expected.rstrip(chr(10))!r}, found {found}")
        return out


@dataclass(frozen=True)
class EntryPort:
    entry: str
    kind: str  # "patch" | "add"
    text: str | None  # the regenerated patch (None for an add entry)
    results: tuple[tuple[str, HunkResult], ...]  # every hunk's outcome, (path, result)
    rejects: tuple[Reject, ...]
    widened: tuple[tuple[str, int], ...] = ()  # (path, hunk): regenerated with more context (--context)

    @property
    def ok(self) -> bool:
        return not self.rejects


@dataclass(frozen=True)
class PortResult:
    version: str
    entries: tuple[EntryPort, ...]
    tree: Mapping[str, str]  # the working tree: every touched path's text after the port

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.entries)

    @property
    def rejects(self) -> tuple[Reject, ...]:
        return tuple(r for e in self.entries for r in e.rejects)

    def rej_text(self, entry: EntryPort) -> str:
        """The ``.rej`` file of one entry: notes as ``#`` lines, then the failed hunks as a diff."""
        out = [f"# ddtree-deploy port: hunks of {entry.entry} that did not apply to SGLang {self.version}\n"]
        by_path: dict[str, list[Reject]] = {}
        for r in entry.rejects:
            by_path.setdefault(r.path, []).append(r)
        for path, rejects in by_path.items():
            for r in rejects:
                for line in r.describe():
                    out.append(f"# {line}\n")
                if r.tree_line is not None:
                    out.append(f"#   edit the working tree's {path} near line {r.tree_line}\n")
            out.append(f"--- a/{path}\n+++ b/{path}\n")
            out.extend(r.text for r in rejects)
        return "".join(out)


def _decode(data: bytes | None, path: str) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text in the release", hint="the series can only patch text files") from None


def apply_partial(fp: FilePatch, text: str | None, *, fuzz: int) -> tuple[str | None, list[HunkResult]]:
    """Apply every hunk that lands; return the text and each hunk's result (failed ones included).

    The engine stops a file at its first failed hunk (the result has no text), so the
    failed hunks are taken out and the rest applied again, until what is left lands.
    Results keep the original hunk numbering.
    """
    keep = list(range(len(fp.hunks)))
    failed: dict[int, HunkResult] = {}
    while True:
        if not keep:  # nothing left to apply: the text stays as it was
            return text, [dataclasses.replace(failed[i], index=i + 1) for i in range(len(fp.hunks))]
        sub = dataclasses.replace(fp, hunks=tuple(fp.hunks[i] for i in keep))
        result = patch_apply.apply_file_patch(sub, text, fuzz=fuzz)
        bad = [keep[pos] for pos, h in enumerate(result.hunks) if h.status is HunkStatus.FAILED]
        if not bad:
            landed = {keep[pos]: h for pos, h in enumerate(result.hunks)}
            merged = {**landed, **failed}
            ordered = [dataclasses.replace(merged[i], index=i + 1) for i in range(len(fp.hunks))]
            return result.text, ordered
        for pos, h in enumerate(result.hunks):
            if keep[pos] in bad and keep[pos] not in failed:
                failed[keep[pos]] = h
        keep = [i for i in keep if i not in bad]


_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _old_span(hunk_text: str) -> tuple[int, int]:
    """(first old line, one past the last) of a hunk, as the patch parser counts them."""
    m = _HEADER.match(hunk_text)
    start, length = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
    return (start, start + max(length, 1)) if length else (start + 1, start + 1)


def _merge_hunks(regenerated: list[tuple[int, str]], verbatim: list[tuple[int, str, int]]) -> str:
    """Regenerated hunks and kept (failed) hunks, in old-line order and not overlapping.

    ``verbatim`` items are (anchor line, hunk text, line delta to the new text). A kept
    hunk fails wherever it sits, so its anchor only has to help the reader and keep
    the patch well-formed: one that would overlap a neighbour moves just below it.
    """
    placed = [(*_old_span(text), text) for _, text in regenerated]
    for anchor, text, delta in sorted(verbatim):
        start = anchor
        for _ in range(len(placed) + 1):
            length = _old_span(_reanchor(text, start, start + delta))
            clash = next((end for s, end, _ in placed if s < length[1] and length[0] < end), None)
            if clash is None:
                break
            start = clash
        moved = _reanchor(text, start, start + delta)
        placed.append((*_old_span(moved), moved))
    return "".join(text for _, _, text in sorted(placed, key=lambda item: item[0]))


def _reanchor(hunk_text: str, old_start: int, new_start: int) -> str:
    """The same hunk with its header moved to (old_start, new_start)."""
    header, _, body = hunk_text.partition("\n")
    m = re.match(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@(.*)", header)
    if not m:
        return hunk_text
    old_len = m.group(1)
    new_len = m.group(2)
    old = f"{old_start},{old_len}" if old_len is not None else f"{old_start}"
    new = f"{new_start},{new_len}" if new_len is not None else f"{new_start}"
    return f"@@ -{old} +{new} @@{m.group(3)}\n{body}"


def port_series(series: Series, files: Mapping[str, bytes | None], *, version: str, fuzz: int = 0,
                context: int | None = None, source: Mapping[str, bytes | None] | None = None) -> PortResult:
    """Apply ``series`` to a release's ``files`` (path -> bytes, None: absent) and regenerate it.

    Each patch is regenerated from the texts before and after it, so its hunks sit at
    the new release's line numbers with the new release's context. A hunk that does
    not land stays in the patch as it was (so ``check`` keeps failing on it until it
    is fixed) and becomes a ``Reject``.

    ``context`` and ``source`` (the files of a release the family applies to, as ``files``):
    a hunk refused as ambiguous (both its sides match at places that rank alike) is made
    again from ``source`` with ``context`` lines of context (the series applied there up to
    it, diffed around its change alone) and placed in its stead; if that one lands, the file's
    section is regenerated with that much context, so that ``check`` sees one place too.
    """
    state: dict[str, str | None] = {}
    origin: dict[str, str | None] = {}  # the same texts on ``source``, entry by entry

    def current(path: str) -> str | None:
        if path not in state:
            state[path] = _decode(files.get(path), path)
        return state[path]

    def at_source(path: str) -> str | None:
        if path not in origin:
            origin[path] = _decode((source or {}).get(path), path)
        return origin[path]

    ported = []
    for entry in series.entries:
        if isinstance(entry, AddEntry):
            state[entry.dest] = origin[entry.dest] = _decode(entry.content, entry.source)
            ported.append(EntryPort(entry.name, "add", None, (), ()))
            continue
        widen = None
        if context is not None and source is not None:
            widen = _Widen(context, {fp.path: at_source(fp.path) for fp in entry.file_patches})
        ported.append(_port_patch(entry, current, state, version, fuzz, widen))
        if widen is not None:
            origin.update(widen.after())
    tree = {path: text for path, text in state.items() if text is not None}
    return PortResult(version=version, entries=tuple(ported), tree=tree)


class _Widen:
    """One entry's hunks made again with more context, from a release the family applies to."""

    def __init__(self, context: int, before: dict[str, str | None]):
        self.context, self.before = context, before
        self._after: dict[str, str | None] = {}

    def hunk(self, fp: FilePatch, k: int):
        """Hunk k (0-based) of ``fp`` with ``context`` lines of context, or None: the text with
        hunks 0..k-1 applied and with 0..k applied, diffed (one hunk: that change alone)."""
        text = self.before.get(fp.path)
        if text is None and not fp.is_new:
            return None
        texts = []
        for upto in (k, k + 1):
            if not upto:  # no hunk applied yet: the text itself
                texts.append(text or "")
                continue
            res = patch_apply.apply_file_patch(dataclasses.replace(fp, hunks=fp.hunks[:upto]), text)
            if not res.ok or res.text is None:
                return None
            texts.append(res.text)
        hunks = diff_hunks(texts[0], texts[1], context=self.context)
        if len(hunks) != 1:
            return None
        head = f"--- a/{fp.path}\n+++ b/{fp.path}\n"
        try:
            (wide,) = patch_parse.parse_patch(head + hunks[0][1], name=fp.patch_name)
        except BadInput:
            return None
        return wide.hunks[0]

    def after(self) -> dict[str, str | None]:
        """The source's texts after the entry (a file it could not apply to: unknown, None)."""
        return self._after

    def record(self, fp: FilePatch) -> None:
        text = self.before.get(fp.path)
        res = patch_apply.apply_file_patch(fp, text) if text is not None or fp.is_new else None
        self._after[fp.path] = res.text if res is not None and res.ok else None


def _widened(fp: FilePatch, before: str | None, results: list[HunkResult], widen: _Widen | None,
             fuzz: int) -> tuple[FilePatch, str | None, list[HunkResult], list[int]] | None:
    """The section with its ambiguous hunks made again with more context, if any then lands."""
    if widen is None:
        return None
    widen.record(fp)
    wider, done = list(fp.hunks), []
    for k, h in enumerate(results):
        if h.ambiguous:
            wide = widen.hunk(fp, k)
            if wide is not None:
                wider[k] = wide
                done.append(k)
    if not done:
        return None
    fp2 = dataclasses.replace(fp, hunks=tuple(wider))
    after, results2 = apply_partial(fp2, before, fuzz=fuzz)
    landed = [k for k in done if results2[k].ok]
    if not landed:
        return None
    # Keep the original of every widened hunk that still fails (its reject reads as written).
    final = dataclasses.replace(fp, hunks=tuple(wider[k] if k in landed else fp.hunks[k]
                                                for k in range(len(fp.hunks))))
    after, results2 = apply_partial(final, before, fuzz=fuzz)
    return final, after, results2, landed


def _port_patch(entry: PatchEntry, current, state: dict, version: str, fuzz: int,
                widen: _Widen | None = None) -> EntryPort:
    text = entry.file.read_text(encoding="utf-8")
    preamble, raws = _preamble_and_sections(text, entry.file_patches)
    sections, results, rejects, widened = [], [], [], []
    for fp, raw in zip(entry.file_patches, raws):
        before = current(fp.path)
        if before is None and not fp.is_new:
            reason = f"{fp.path} does not exist in SGLang {version}"
            rejects.append(Reject(entry.name, fp.path, None, "".join(raw.hunks), None, reason))
            # Kept verbatim: the ported family must not pretend this file is handled.
            sections.append(_section_header(raw, is_new=False, old=None, new=None) + "".join(raw.hunks))
            if widen is not None:
                widen.record(fp)
            continue
        after, hunk_results = apply_partial(fp, before, fuzz=fuzz)
        context = CONTEXT
        wider = _widened(fp, before, hunk_results, widen, fuzz)
        if wider is not None:
            _, after, hunk_results, landed = wider
            widened.extend((fp.path, k + 1) for k in landed)
            context = widen.context
        results.extend((fp.path, h) for h in hunk_results)
        old = before or ""
        new = after if after is not None else old
        to_new = line_map(old, new)
        verbatim = []
        for h, hunk_text in zip(hunk_results, raw.hunks):
            if h.status is not HunkStatus.FAILED:
                continue
            anchor = h.nearest_line or _stated_line(h.header)
            tree_line = to_new(anchor)
            reason = (h.reason if h.ambiguous else
                      f"no match; nearest at line {h.nearest_line}" if h.nearest_line else "no match")
            rejects.append(Reject(entry.name, fp.path, h, hunk_text, tree_line, reason))
            verbatim.append((anchor, hunk_text, tree_line - anchor))
        state[fp.path] = new
        regenerated = diff_hunks(old, new, context=context)
        if not regenerated and not verbatim:
            continue  # every hunk of this file was already applied upstream
        sections.append(
            _section_header(raw, is_new=fp.is_new, old=before, new=new) + _merge_hunks(regenerated, verbatim)
        )
    body = preamble + "".join(sections)
    return EntryPort(entry.name, "patch", body if sections else None, tuple(results), tuple(rejects),
                     tuple(widened))


def _stated_line(header: str) -> int:
    m = re.match(r"@@ -(\d+)", header)
    return int(m.group(1)) if m else 1


# ---------------------------------------------------------------------------
# Refresh: patches from an edited working tree


def _norm(line: str) -> str:
    return " ".join(line.split())


def _changed_lines(hunk_texts: Sequence[str]) -> set[str]:
    """The normalized ``-`` and ``+`` lines of some hunks (what a change "looks like")."""
    out = set()
    for text in hunk_texts:
        for line in text.splitlines()[1:]:
            if line[:1] in "+-" and _norm(line[1:]):
                out.add(line[0] + _norm(line[1:]))
    return out


def _score(removed: Sequence[str], added: Sequence[str], signature: set[str]) -> float:
    """How much of a changed block the entry's own changes account for (0..1)."""
    lines = [("-" + _norm(x)) for x in removed if _norm(x)] + [("+" + _norm(x)) for x in added if _norm(x)]
    if not lines:
        return 0.0
    return sum(1 for x in lines if x in signature) / len(lines)


@dataclass(frozen=True)
class RefreshedEntry:
    entry: str
    text: str | None  # None: the tree holds none of this entry's changes
    dropped_paths: tuple[str, ...]  # files this entry used to change and no longer does


def refresh_series(
    series: Series, base: Mapping[str, bytes | None], tree: Mapping[str, bytes | None]
) -> tuple[RefreshedEntry, ...]:
    """One regenerated patch per series entry, from the release's files and an edited tree.

    ``base``: the pristine release files; ``tree``: the same paths after editing.
    Each changed block of a file (a difflib opcode between base and tree) goes to
    the entry touching that file whose own ``+``/``-`` lines account for most of it;
    a block that no entry's lines explain goes to the last entry touching the file
    (as quilt refreshes the topmost patch). Then entry k's patch is the diff between
    the file with entries 1..k-1's blocks applied and with 1..k's: applied in order,
    the regenerated series turns ``base`` into ``tree`` exactly.

    ``add`` entries are not patches and keep their payload; a tree file that differs
    from the payload is reported by the caller.
    """
    touching: dict[str, list[tuple[int, FilePatch, str]]] = {}
    raw_by_entry: dict[int, tuple[str, list[_RawSection]]] = {}
    for k, entry in enumerate(series.entries):
        if not isinstance(entry, PatchEntry):
            continue
        text = entry.file.read_text(encoding="utf-8")
        preamble, raws = _preamble_and_sections(text, entry.file_patches)
        raw_by_entry[k] = (preamble, raws)
        for fp, raw in zip(entry.file_patches, raws):
            touching.setdefault(fp.path, []).append((k, fp, "".join(raw.hunks)))

    # For every file: which blocks belong to which entry.
    sections: dict[tuple[int, str], tuple[str | None, str]] = {}  # (entry, path) -> (before, after)
    for path, users in touching.items():
        old = _decode(base.get(path), path) or ""
        if path not in tree:
            raise BadInput(f"{path}: not in the working tree", hint="refresh needs every file the series changes")
        new = _decode(tree[path], path)
        if new is None:
            raise BadInput(f"{path}: missing from the working tree", hint="restore it, or remove the entries that change it")
        a = old.splitlines(keepends=True)
        b = new.splitlines(keepends=True)
        blocks = opcodes(a, b)
        owner: list[int | None] = []
        signatures = [(k, _changed_lines([hunks])) for k, _, hunks in users]
        for tag, i1, i2, j1, j2 in blocks:
            if tag == "equal":
                owner.append(None)
                continue
            scores = [(_score(a[i1:i2], b[j1:j2], sig), pos) for pos, (_, sig) in enumerate(signatures)]
            best, pos = max(scores)  # ties go to the later entry (higher pos)
            owner.append(users[pos][0] if best > 0 else users[-1][0])

        def build(upto: int) -> str:
            """The file with the blocks of entries <= upto applied."""
            out = []
            for (tag, i1, i2, j1, j2), who in zip(blocks, owner):
                take_new = tag != "equal" and who is not None and who <= upto
                out.extend(b[j1:j2] if take_new else a[i1:i2])
            return "".join(out)

        for k, fp, _ in users:
            before = build(k - 1)
            after = build(k)
            is_new = fp.is_new and base.get(path) is None
            sections[(k, path)] = (None if is_new and not before else before, after)

    refreshed = []
    for k, entry in enumerate(series.entries):
        if not isinstance(entry, PatchEntry):
            continue
        preamble, raws = raw_by_entry[k]
        parts, dropped = [], []
        for fp, raw in zip(entry.file_patches, raws):
            before, after = sections[(k, fp.path)]
            hunks = diff_hunks(before or "", after)
            if not hunks:
                dropped.append(fp.path)
                continue
            header = _section_header(raw, is_new=before is None, old=before, new=after)
            parts.append(header + "".join(text for _, text in hunks))
        text = preamble + "".join(parts) if parts else None
        refreshed.append(RefreshedEntry(entry.name, text, tuple(dropped)))
    return tuple(refreshed)


def verify_refresh(
    series: Series, refreshed: Sequence[RefreshedEntry], base: Mapping[str, bytes | None],
    tree: Mapping[str, bytes | None],
) -> None:
    """Apply the regenerated patches to ``base`` with our engine; they must give ``tree`` exactly."""
    state = {path: _decode(data, path) for path, data in base.items()}
    for item in refreshed:
        if item.text is None:
            continue
        for fp in patch_parse.parse_patch(item.text, name=item.entry):
            result = patch_apply.apply_file_patch(fp, state.get(fp.path), fuzz=0)
            if not result.ok or any(h.status is not HunkStatus.EXACT for h in result.hunks):
                raise DeployError(f"{item.entry}: the regenerated patch does not apply exactly to {fp.path}",
                                  hint="this is a bug in ddtree-deploy's refresh; nothing was written")
            state[fp.path] = result.text
    for path in {fp.path for e in series.entries if isinstance(e, PatchEntry) for fp in e.file_patches}:
        if state.get(path) != _decode(tree.get(path), path):
            raise DeployError(f"{path}: the regenerated series does not reproduce the working tree",
                              hint="this is a bug in ddtree-deploy's refresh; nothing was written")


# ---------------------------------------------------------------------------
# I/O: release files in, family folders and working trees out

TREE_MANIFEST = ".ddtree-port.json"


def release_files(version: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """The release's bytes for ``paths`` (None: absent), from the verified wheel cache."""
    found = releases.read_wheel_files(releases.ensure_wheel(version), paths)
    return {path: found.get(path) for path in paths}


def next_micro(version: str) -> str:
    """The first version of the next micro release: 0.5.13.post1 -> 0.5.14."""
    parts = list(Version(version).release) + [0, 0]
    return f"{parts[0]}.{parts[1]}.{parts[2] + 1}"


def _ported_series_text(series: Series, result: PortResult) -> str:
    """The old series file, entries in the same order; entries already upstream are commented out."""
    dropped = {e.entry for e in result.entries if e.kind == "patch" and e.text is None}
    lines = [f"# Ported from {series.name} to SGLang {result.version} by `ddtree-deploy port`.\n"]
    for line in series.series_file.read_text(encoding="utf-8").splitlines(keepends=True):
        name = line.strip()
        if name in dropped:
            line = f"# {name}  (every hunk already in SGLang {result.version}: dropped by port)\n"
        lines.append(line if line.endswith("\n") else line + "\n")
    return "".join(lines)


@dataclass(frozen=True)
class PortOutcome:
    result: PortResult
    family_dir: Path
    tree_dir: Path
    rej_files: tuple[Path, ...]
    context_from: str | None = None  # the release hunks were made again from (--context)


def source_release(series: Series, given: str | None = None) -> str:
    """The release a family's hunks are made again from (port --context): ``given``, else the
    newest release on PyPI the family covers (the cached listing when there is one)."""
    if given is not None:
        try:
            Version(given)
        except InvalidVersion:
            raise BadInput(f"--context-from {given!r} is not a valid PEP 440 version", hint="e.g. 0.5.12.post1") from None
        return given
    listed = releases.list_releases(refresh=False)
    covered = [r.version for r in listed if not r.yanked and series.info.covers(r.version)]
    if not covered:
        raise BadInput(f"family {series.name} ({series.specifier}) covers no SGLang release on PyPI",
                       hint="name the release its patches apply to with --context-from VERSION")
    return str(max(covered))


def port_family(series: Series, version: str, *, into: Path, tree_dir: Path, fuzz: int = 0,
                existing: Sequence[FamilyInfo] = (), context: int | None = None,
                context_from: str | None = None) -> PortOutcome:
    """Port ``series`` to SGLang ``version``: a new family folder, .rej files, a working tree.

    All-or-nothing for the family folder: it is built beside its final place and
    renamed into it. Refused when the folder exists or another family already
    covers ``version`` (family ranges must stay disjoint for the matrix to pick one).
    """
    try:
        Version(version)
    except InvalidVersion:
        raise BadInput(f"--to {version!r} is not a valid PEP 440 version", hint="e.g. 0.5.13") from None
    refuse_install_write(into, "--into")
    refuse_install_write(tree_dir, "--tree")
    if into.exists():
        raise BadInput(f"{show(into)} already exists", hint="choose another name with --into, or remove that folder")
    _check_tree_dir(tree_dir)
    covering = [f.name for f in existing if f.covers(version)]
    if covering:
        raise BadInput(f"SGLang {version} is already covered by family {', '.join(covering)}",
                       hint="port to a release no family covers; use check for a covered one")
    files = release_files(version, series.touched_paths())
    source = None
    if context is not None:
        context_from = source_release(series, context_from)
        source = release_files(context_from, series.touched_paths())
    result = port_series(series, files, version=version, fuzz=fuzz, context=context, source=source)

    into.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=into.parent, prefix=f".{into.name}."))
    staging.chmod(0o755)  # mkdtemp makes it private; a family folder is an ordinary one
    rej_files = []
    try:
        description = f"{series.name} ported to SGLang {version} by ddtree-deploy port"
        if series.info.description:
            description += f" (was: {series.info.description})"
        toml = (f"# Written by `ddtree-deploy port --to {version}` from {series.name}.\n"
                f"sglang = {json.dumps(f'>={version},<{next_micro(version)}')}\n"
                f"description = {json.dumps(description)}\n")
        (staging / FAMILY_FILE).write_text(toml, encoding="utf-8")
        (staging / SERIES_FILE).write_text(_ported_series_text(series, result), encoding="utf-8")
        for entry in result.entries:
            if entry.kind != "patch" or entry.text is None:
                continue
            (staging / entry.entry).write_text(entry.text, encoding="utf-8")
            if entry.rejects:
                rej = staging / f"{entry.entry}.rej"
                rej.write_text(result.rej_text(entry), encoding="utf-8")
                rej_files.append(into / rej.name)
        os.replace(staging, into)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    write_tree(tree_dir, result.tree, {"family": into.name, "sglang": version, "from_family": series.name})
    return PortOutcome(result, into, tree_dir, tuple(rej_files), context_from if context is not None else None)


def refuse_install_write(path: Path, option: str) -> None:
    """The installed toolkit (site-packages) is never written: not a family, not a tree."""
    if inside_install(path):
        raise BadInput(f"{show(path)} is inside the installed toolkit, which ddtree-deploy never writes",
                       hint=f"name a folder of your own with {option} (by default a new family goes to "
                            "$XDG_DATA_HOME/ddtree-deploy/patches/)")


def _check_tree_dir(tree_dir: Path) -> None:
    if tree_dir.exists() and not (tree_dir / TREE_MANIFEST).is_file():
        raise BadInput(f"{show(tree_dir)} exists and is not a working tree written by port",
                       hint="choose another --tree folder")


def write_tree(tree_dir: Path, files: Mapping[str, str], manifest: dict) -> None:
    """The working tree: package-relative files plus a manifest naming family and release.

    An existing folder is replaced only when it is a tree this command wrote before.
    """
    _check_tree_dir(tree_dir)
    tree_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=tree_dir.parent, prefix=f".{tree_dir.name}."))
    staging.chmod(0o755)
    try:
        for path, text in files.items():
            target = staging.joinpath(*path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8", newline="")
        (staging / TREE_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if tree_dir.exists():
            shutil.rmtree(tree_dir)
        os.replace(staging, tree_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def read_tree(tree_dir: Path, paths: Sequence[str]) -> dict[str, bytes | None]:
    if not tree_dir.is_dir():
        raise BadInput(f"{show(tree_dir)}: no such folder", hint="pass the working tree that port wrote (--tree)")
    out: dict[str, bytes | None] = {}
    for path in paths:
        target = tree_dir.joinpath(*path.split("/"))
        if target.is_symlink():
            raise BadInput(f"{show(target)}: is a symlink", hint="the working tree must hold plain files")
        out[path] = target.read_bytes() if target.is_file() else None
    return out


def tree_version(tree_dir: Path) -> str | None:
    try:
        return json.loads((tree_dir / TREE_MANIFEST).read_text(encoding="utf-8")).get("sglang")
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RefreshOutcome:
    version: str
    changed: tuple[str, ...]  # patch files whose text changed
    unchanged: tuple[str, ...]
    removed_rejects: tuple[Path, ...]
    payload_drift: tuple[str, ...]  # add entries whose tree copy differs from the payload
    dropped: tuple[tuple[str, str], ...]  # (entry, path) sections that no longer change anything


def refresh_family(family: Path | str, tree_dir: Path, *, version: str | None = None,
                   resolved: bool = False) -> RefreshOutcome:
    """Rewrite a family's patch files from an edited working tree (see ``refresh_series``)."""
    series = load_family(family)
    if inside_install(series.info.folder):
        raise BadInput(f"family {series.name} is part of the installed toolkit ({show(series.info.folder)}), "
                       "which ddtree-deploy never writes",
                       hint=f"port it to make your own copy: {next_step.port(series.name)}, or copy its "
                            "folder elsewhere and name the copy with --family")
    version = version or tree_version(tree_dir)
    if version is None:
        raise BadInput(f"{show(tree_dir)}: no {TREE_MANIFEST} naming the SGLang release",
                       hint="pass --release VERSION: the release the tree was made from")
    rejects = sorted(series.info.folder.glob("*.rej"))
    if rejects and not resolved:
        names = ", ".join(r.name for r in rejects)
        raise BadInput(f"{show(series.info.folder)} still has reject files: {names}",
                       hint="apply each rejected hunk in the working tree by hand, then run again with --resolved")
    paths = series.touched_paths()
    base = release_files(version, paths)
    tree = read_tree(tree_dir, paths)
    refreshed = refresh_series(series, base, tree)
    empty = [r.entry for r in refreshed if r.text is None]
    if empty:
        raise BadInput(f"the working tree holds none of the changes of {', '.join(empty)}",
                       hint="restore their changes in the tree, or remove those entries from the series")
    verify_refresh(series, refreshed, base, tree)

    changed, unchanged = [], []
    for item in refreshed:
        target = series.info.folder / item.entry
        data = item.text.encode("utf-8")
        if target.read_bytes() == data:
            unchanged.append(item.entry)
            continue
        atomic_write(target, data)
        changed.append(item.entry)
    for rej in rejects:
        rej.unlink()
    drift = tuple(e.name for e in series.entries
                  if isinstance(e, AddEntry) and tree.get(e.dest) not in (None, e.content))
    dropped = tuple((r.entry, p) for r in refreshed for p in r.dropped_paths)
    return RefreshOutcome(version, tuple(changed), tuple(unchanged), tuple(rejects), drift, dropped)


__all__ = [
    "EntryPort",
    "PortResult",
    "Reject",
    "RefreshedEntry",
    "apply_partial",
    "line_map",
    "port_series",
    "refresh_series",
    "PortOutcome",
    "RefreshOutcome",
    "next_micro",
    "port_family",
    "read_tree",
    "refresh_family",
    "release_files",
    "source_release",
    "tree_version",
    "verify_refresh",
    "write_tree",
]
