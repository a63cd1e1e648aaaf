"""Apply a series to a set of file contents in memory, then byte-compile the results.

``check_series`` is pure: bytes in, a ``CheckReport`` out. It is the gate the
design puts before any host is touched: the push step consumes
``CheckReport.patched`` (original and patched bytes for every touched path)
only when ``CheckReport.ok``.

Texts are decoded as UTF-8 without newline translation, so bytes round-trip
exactly (CRLF files stay CRLF; the engine sees what is on disk).

Every file a patch entry writes is proven after the fact (``patch_verify``): reversing
the hunks reported applied, at the lines and fuzz reported, must give back the file's
bytes; a file that does not is FAILED naming the hunk, whatever the engine said.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from ddtree_deploy.base.digests import sha256_or_none
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine import patch_apply, patch_verify
from ddtree_deploy.engine.patch_apply import HunkResult, HunkStatus
from ddtree_deploy.engine.series import AddEntry, PatchEntry, Series

MAX_FUZZ = 2

# File-level outcomes of one entry on one file.
APPLIED = "applied"
ALREADY = "already-applied"
FAILED = "failed"
SKIPPED = "skipped"  # an earlier entry already failed on this file
# Some hunks already in the file, others applied now: neither pristine nor patched. Refused
# (not ok) unless the caller allows it (check --allow-partly-applied): finishing a
# half-applied change may be right, or may duplicate code upstream wrote in another form.
PARTLY = "partly applied"
_OK = (APPLIED, ALREADY)


@dataclass(frozen=True)
class FileCheck:
    """One entry's effect on one file."""

    path: str
    status: str
    hunks: tuple[HunkResult, ...] = ()
    message: str | None = None  # why it failed or was skipped
    header_line: int | None = None  # the section's "--- " line in the patch file
    allowed: bool = False  # PARTLY only: the caller asked to accept it

    @property
    def ok(self) -> bool:
        return self.status in _OK or (self.status == PARTLY and self.allowed)


@dataclass(frozen=True)
class EntryCheck:
    name: str
    line: int  # line in the series file
    kind: str  # "patch" | "add"
    files: tuple[FileCheck, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)


@dataclass(frozen=True)
class CompileError:
    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line or '?'}: {self.message}"


@dataclass(frozen=True)
class PatchedFile:
    path: str
    original: bytes | None  # None: the series creates the file
    patched: bytes

    @property
    def changed(self) -> bool:
        return self.original != self.patched


@dataclass(frozen=True)
class CheckReport:
    family: str
    fuzz: int
    entries: tuple[EntryCheck, ...]
    compile_errors: tuple[CompileError, ...]
    #: Every touched path whose entries all succeeded; every touched path when ``ok``.
    patched: Mapping[str, PatchedFile] = field(default_factory=dict)
    allow_partly_applied: bool = False

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.entries) and not self.compile_errors

    def hunk_counts(self) -> dict[str, int]:
        counts = Counter(h.status.value for e in self.entries for f in e.files for h in f.hunks)
        return {s.value: counts.get(s.value, 0) for s in HunkStatus}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "family": self.family,
            "fuzz": self.fuzz,
            "allow_partly_applied": self.allow_partly_applied,
            "hunks": self.hunk_counts(),
            "entries": [_entry_json(e) for e in self.entries],
            "compile_errors": [
                {"path": c.path, "line": c.line, "message": c.message} for c in self.compile_errors
            ],
            "files": [_patched_json(p) for p in sorted(self.patched.values(), key=lambda p: p.path)],
        }


def _hunk_json(h: HunkResult) -> dict[str, Any]:
    return {
        "index": h.index,
        "header": h.header,
        "patch_line": h.patch_line,
        "status": h.status.value,
        "line": h.line,
        "offset": h.offset,
        "fuzz": h.fuzz,
        "nearest_line": h.nearest_line,
        "new_side_line": h.new_side_line,
        "stated_line": h.stated_line,
        "places": [{"side": p.side, "line": p.line, "fuzz": p.fuzz, "offset": p.offset,
                    "rows": [{"tag": tag, "hunk": want, "file": have} for tag, want, have in p.rows]}
                   for p in h.places],
        "reason": h.reason,
        "mismatches": [{"line": m.line, "expected": m.expected, "actual": m.actual} for m in h.mismatches],
    }


def _entry_json(e: EntryCheck) -> dict[str, Any]:
    return {
        "name": e.name,
        "line": e.line,
        "kind": e.kind,
        "ok": e.ok,
        "files": [
            {
                "path": f.path,
                "status": f.status,
                "ok": f.ok,
                "message": f.message,
                "header_line": f.header_line,
                "hunks": [_hunk_json(h) for h in f.hunks],
            }
            for f in e.files
        ],
    }


def _patched_json(p: PatchedFile) -> dict[str, Any]:
    return {
        "path": p.path,
        "created": p.original is None,
        "changed": p.changed,
        "original_sha256": sha256_or_none(p.original),
        "patched_sha256": sha256_or_none(p.patched),
    }


# ---------------------------------------------------------------------------


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def compile_check(path: str, data: bytes) -> CompileError | None:
    """Byte-compile in memory (as the host's import would), without writing .pyc files."""
    try:
        compile(data, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return CompileError(path, exc.lineno, exc.msg)
    except ValueError as exc:  # e.g. NUL bytes in the source
        return CompileError(path, None, str(exc))
    return None


class _Work:
    """The evolving texts while the series is applied in order."""

    def __init__(self, files: Mapping[str, bytes | None]):
        self.files = files
        self.text: dict[str, str | None] = {}
        self.broken: dict[str, str] = {}  # path -> why later entries skip it

    def current(self, path: str) -> tuple[str | None, str | None]:
        """(text or None if absent, error)."""
        if path not in self.text:
            data = self.files[path]
            if data is None:
                self.text[path] = None
            else:
                decoded = _decode(data)
                if decoded is None:
                    return None, f"{path} is not UTF-8 text"
                self.text[path] = decoded
        return self.text[path], None


def _partly_message(hunks: tuple[HunkResult, ...], allowed: bool) -> str:
    done = [str(h.index) for h in hunks if h.status is HunkStatus.ALREADY_APPLIED]
    now = [str(h.index) for h in hunks if h.status is not HunkStatus.ALREADY_APPLIED]
    text = (f"partly applied: hunk{'s' if len(done) > 1 else ''} {', '.join(done)} already in the file, "
            f"hunk{'s' if len(now) > 1 else ''} {', '.join(now)} not")
    if allowed:
        return text + "; the rest applied (--allow-partly-applied)"
    return (text + "; the file is half patched or upstream took part of the change: read the diff, "
            "then port the family, or pass --allow-partly-applied to apply the rest")


def _apply_patch_entry(entry: PatchEntry, work: _Work, fuzz: int, allow_partly: bool) -> EntryCheck:
    results = []
    for fp in entry.file_patches:
        path = fp.path
        if path in work.broken:
            results.append(FileCheck(path, SKIPPED, message=work.broken[path],
                                     header_line=fp.header_line))
            continue
        text, error = work.current(path)
        if error is None and text is None and not fp.is_new:
            error = f"{path} does not exist in this SGLang"
        if error is not None:
            work.broken[path] = f"{entry.name} failed on this file"
            results.append(FileCheck(path, FAILED, message=error, header_line=fp.header_line))
            continue
        res = patch_apply.apply_file_patch(fp, text, fuzz=fuzz)
        unproven = patch_verify.verify_round_trip(fp, text, res)
        if unproven is not None:
            # The engine's own result does not reverse to the file: never let it through.
            work.broken[path] = f"{entry.name} failed on this file"
            results.append(FileCheck(path, FAILED, hunks=res.hunks, header_line=fp.header_line,
                                     message=f"placement not proven: {unproven}; this is a bug in "
                                             "ddtree-deploy's patch engine: report it with the patch and the file"))
            continue
        if res.ok and res.partly_applied:
            results.append(FileCheck(path, PARTLY, hunks=res.hunks, header_line=fp.header_line,
                                     message=_partly_message(res.hunks, allow_partly),
                                     allowed=allow_partly))
            if allow_partly and res.text is not None:
                work.text[path] = res.text
            else:
                work.broken[path] = f"{entry.name} is partly applied on this file"
            continue
        if res.ok and res.text is not None:
            work.text[path] = res.text
            status = ALREADY if res.hunks and all(h.status is HunkStatus.ALREADY_APPLIED for h in res.hunks) else APPLIED
            results.append(FileCheck(path, status, hunks=res.hunks, header_line=fp.header_line))
        else:
            work.broken[path] = f"{entry.name} failed on this file"
            failed = sum(1 for h in res.hunks if not h.ok)
            results.append(FileCheck(path, FAILED, hunks=res.hunks, header_line=fp.header_line,
                                     message=f"{failed} of {len(res.hunks)} hunks failed"))
    return EntryCheck(entry.name, entry.line, entry.kind, tuple(results))


def _apply_add_entry(entry: AddEntry, work: _Work) -> EntryCheck:
    path = entry.dest
    if path in work.broken:
        fc = FileCheck(path, SKIPPED, message=work.broken[path])
        return EntryCheck(entry.name, entry.line, entry.kind, (fc,))
    text, error = work.current(path)
    content = _decode(entry.content)
    if error is None and content is None:
        error = f"{entry.source} is not UTF-8 text"
    if error is None and text is not None and text != content:
        error = f"{path} already exists with different content"
    if error is not None:
        work.broken[path] = f"{entry.name} failed on this file"
        fc = FileCheck(path, FAILED, message=error)
    else:
        # Same bytes already there: a host that was deployed before.
        fc = FileCheck(path, ALREADY if text is not None else APPLIED)
        work.text[path] = content
    return EntryCheck(entry.name, entry.line, entry.kind, (fc,))


def check_series(series: Series, files: Mapping[str, bytes | None], *, fuzz: int = 0,
                 allow_partly_applied: bool = False) -> CheckReport:
    """Apply ``series`` to ``files`` (path -> bytes, None for absent) and compile the results.

    A file some of whose hunks are already there while others apply now is PARTLY applied:
    not ok (the check fails) unless ``allow_partly_applied``, then the rest is applied.

    Raises BadInput when ``fuzz`` is out of range or a touched path is not in
    ``files`` at all (the snapshot was taken for another series).
    """
    if not 0 <= fuzz <= MAX_FUZZ:
        raise BadInput(f"fuzz {fuzz} is out of range", hint=f"use 0..{MAX_FUZZ}")
    for path, origin in series.origins().items():
        if path not in files:
            raise BadInput(
                f"{origin}: {path} is not in the snapshot",
                hint="take the snapshot again so that it covers this series",
            )
    work = _Work(files)
    entries = []
    for entry in series.entries:
        if isinstance(entry, PatchEntry):
            entries.append(_apply_patch_entry(entry, work, fuzz, allow_partly_applied))
        else:
            entries.append(_apply_add_entry(entry, work))
    patched = {}
    compile_errors = []
    for path in series.touched_paths():
        text = work.text.get(path)
        if path in work.broken or text is None:
            continue
        data = text.encode("utf-8")
        patched[path] = PatchedFile(path, files[path], data)
        if path.endswith(".py"):
            problem = compile_check(path, data)
            if problem is not None:
                compile_errors.append(problem)
    return CheckReport(
        family=series.name,
        fuzz=fuzz,
        entries=tuple(entries),
        compile_errors=tuple(compile_errors),
        patched=patched,
        allow_partly_applied=allow_partly_applied,
    )


__all__ = [
    "ALREADY",
    "APPLIED",
    "FAILED",
    "PARTLY",
    "SKIPPED",
    "CheckReport",
    "CompileError",
    "EntryCheck",
    "FileCheck",
    "PatchedFile",
    "check_series",
    "compile_check",
]
