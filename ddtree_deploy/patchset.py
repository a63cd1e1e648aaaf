"""The patch engine: parse unified diffs (with unidiff) and apply them to text, hunk by hunk.

Pure functions, no I/O. Every hunk gets a verdict (exact, offset, fuzz,
already-applied, failed) with the evidence an engineer needs to fix a failure.

CONTRACT (other modules code against these names; keep them stable):

    parse_patch(text, *, name) -> list[FilePatch]        # raises BadInput naming name:line
    apply_file_patch(fp, original, *, fuzz=0) -> FileResult
    strip_path(path, strip=1) -> str                     # "a/sglang/x.py" -> "sglang/x.py"

Paths in FilePatch are the patch's paths with one leading component stripped
(git's a/ and b/), i.e. package-relative like "sglang/srt/speculative/spec_info.py".
Path *safety* (absolute, "..", symlinks) is checked by the series layer, not here,
but parse_patch keeps the raw header line numbers so the series layer can name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class HunkStatus(str, Enum):
    EXACT = "exact"
    OFFSET = "offset"
    FUZZ = "fuzz"
    ALREADY_APPLIED = "already-applied"
    FAILED = "failed"


@dataclass(frozen=True)
class Mismatch:
    """One line where the file differs from what a failed hunk expected."""

    line: int  # 1-based line number in the file
    expected: str
    actual: str | None  # None past the end of the file


@dataclass(frozen=True)
class HunkResult:
    index: int  # 1-based position of the hunk within its file patch
    header: str  # "@@ -a,b +c,d @@"
    patch_line: int  # 1-based line of the hunk header in the patch file
    status: HunkStatus
    line: int | None  # 1-based line in the input text where the hunk landed (None: failed)
    offset: int = 0  # landed line minus the line the hunk states
    fuzz: int = 0  # context lines ignored at each end (0..2)
    nearest_line: int | None = None  # failed: best-matching location
    mismatches: tuple[Mismatch, ...] = ()  # failed: the lines that differ there

    @property
    def ok(self) -> bool:
        return self.status is not HunkStatus.FAILED


@dataclass(frozen=True)
class FilePatch:
    """One file's section of a patch."""

    patch_name: str  # the patch file's name, for messages
    header_line: int  # 1-based line of the "--- " header in the patch file
    source_path: str | None  # stripped; None for /dev/null (new file)
    target_path: str | None  # stripped; None for /dev/null (deletion)
    hunks: tuple = field(default_factory=tuple)  # engine-internal parsed hunks

    @property
    def path(self) -> str:
        """The package-relative path this section changes."""
        return self.target_path or self.source_path  # type: ignore[return-value]

    @property
    def is_new(self) -> bool:
        return self.source_path is None

    @property
    def is_deletion(self) -> bool:
        return self.target_path is None


@dataclass(frozen=True)
class FileResult:
    file_patch: FilePatch
    hunks: tuple[HunkResult, ...]
    text: str | None  # the resulting text; None when the file is deleted or a hunk failed

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hunks)


def strip_path(path: str, strip: int = 1) -> str:
    raise NotImplementedError


def parse_patch(text: str, *, name: str) -> list[FilePatch]:
    raise NotImplementedError


def apply_file_patch(fp: FilePatch, original: str | None, *, fuzz: int = 0) -> FileResult:
    raise NotImplementedError
