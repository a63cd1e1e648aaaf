"""Prove a placement after the fact: reversing the hunks reported applied gives the original back.

Pure, no I/O. ``verify_round_trip(fp, original, result)`` takes a file section, the text it
was applied to and the engine's ``FileResult``. It walks the result text and, at every hunk
reported applied (exact, offset, fuzz), at the line and fuzz reported, checks that the hunk's
new lines are there (less the context lines that fuzz ignored) and puts its old lines back
(a fuzzed context line stays the file's, as the engine keeps it). The text rebuilt so must be
the original byte for byte; anything else is a ``RoundTripError`` naming the hunk.

It shares nothing with patch_apply's placement or writer but the parsed hunks and the way a
text is read into lines (split_lines, join_lines, is_crlf_text), so a writer that puts a
line in the wrong place, drops or doubles one, or rewrites a line outside the hunks is
caught here, not reproduced. It cannot tell a lookalike from the real place (the
lookalike reverses just as well): that is decided at placement (patch_apply, the ambiguity
rule). Already-applied hunks changed nothing and are not reversed.

The one difference allowed is the engine's documented newline rule: where lines were written
after a last line that had no newline, that line got one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ddtree_deploy.engine.patch_apply import FileResult, HunkStatus, is_crlf_text, join_lines, split_lines
from ddtree_deploy.engine.patch_parse import FilePatch, Hunk

_APPLIED = (HunkStatus.EXACT, HunkStatus.OFFSET, HunkStatus.FUZZ)


@dataclass(frozen=True)
class RoundTripError:
    """A hunk whose reported placement does not reverse to the original."""

    index: int  # 1-based hunk within the file section
    header: str
    patch_line: int
    line: int  # the line the engine reported (in the result text)
    problem: str

    def __str__(self) -> str:
        return (f"reversing hunk {self.index} {self.header} (patch line {self.patch_line}) at line "
                f"{self.line} does not give the original back: {self.problem}")


def _stripped(texts: Iterable[str]) -> list[str]:
    """Hunk texts as a CRLF file's line bodies (the engine compares them without their CR)."""
    return [t[:-1] if t.endswith("\r") else t for t in texts]


def _compared(h: Hunk, fuzz: int) -> tuple[int, int]:
    """How many lines fuzz ignored at the start and at the end of the hunk's sides."""
    context = max(h.prefix_context, h.suffix_context)
    return max(fuzz + h.prefix_context - context, 0), max(fuzz + h.suffix_context - context, 0)


def verify_round_trip(fp: FilePatch, original: str | None, result: FileResult) -> RoundTripError | None:
    """None when reversing ``result``'s applied hunks gives ``original`` back; else the first culprit."""
    if not result.ok or result.text is None:
        return None  # nothing was written
    base = original or ""
    crlf = is_crlf_text(base)
    eol = "\r\n" if crlf else "\n"
    out_b, out_e = split_lines(result.text, crlf)
    back_b: list[str] = []
    back_e: list[str] = []
    pos = 0  # the next line of the result not yet copied back
    regions: list[tuple[int, int, Hunk, int, int]] = []  # (start, end in rebuilt, hunk, index, line)
    for k, (h, r) in enumerate(zip(fp.hunks, result.hunks), 1):
        if r.status not in _APPLIED:
            continue
        assert r.line is not None  # an applied hunk has its line
        start = r.line - 1
        if start < pos:
            return RoundTripError(k, h.header, h.patch_line, r.line, "it starts inside the hunk above")
        new = _stripped(h.new_lines) if crlf else h.new_lines
        pf, sf = _compared(h, r.fuzz)
        if out_b[start + pf:start + len(new) - sf] != new[pf:len(new) - sf]:
            return RoundTripError(k, h.header, h.patch_line, r.line, f"its new lines are not at line {r.line}")
        back_b.extend(out_b[pos:start])
        back_e.extend(out_e[pos:start])
        first = len(back_b)
        at = start
        for tag, count, texts in h.runs:
            if tag == " ":  # the file's own lines (fuzz may have kept some that differ)
                back_b.extend(out_b[at:at + count])  # (a fuzzed trailing one may lie past the end)
                back_e.extend(out_e[at:at + count])
            elif tag == "-":
                back_b.extend(_stripped(texts) if crlf else texts)
                back_e.extend([eol] * count)
            if tag != "-":
                at += count
        if h.old_no_eol and next(tag for tag, _, _ in reversed(h.runs) if tag != "+") == "-":
            back_e[-1] = ""  # the old side's last line, removed, had no newline
        pos = min(at, len(out_b))
        regions.append((first, len(back_b), h, k, r.line))
    back_b.extend(out_b[pos:])
    back_e.extend(out_e[pos:])
    if join_lines(back_b, back_e) == base:  # the usual answer: one join and one compare, in C
        return None
    orig_b, orig_e = split_lines(base, crlf)
    n = len(orig_b)
    if (back_b == orig_b and orig_e and back_e[:-1] == orig_e[:-1] and orig_e[-1] == ""
            and any(end == n for _, end, _, _, _ in regions)):
        return None  # the newline rule: a hunk at the end wrote lines after a last line without one
    differ = next((i for i, (b1, b2, e1, e2) in enumerate(zip(back_b, orig_b, back_e, orig_e))
                   if b1 != b2 or e1 != e2), min(len(back_b), n))
    # The culprit: the hunk whose rebuilt lines hold the first difference, else the last one above it.
    above = [reg for reg in regions if reg[0] <= differ]
    culprit = above[-1] if above else (regions[0] if regions else None)
    if culprit is None:  # no hunk was applied, yet the text changed
        return RoundTripError(0, "(no hunk applied)", fp.header_line, 0,
                              f"line {differ + 1} of the original changed")
    _, _, h, k, line = culprit
    return RoundTripError(k, h.header, h.patch_line, line,
                          f"line {differ + 1} of the rebuilt text differs from the original")


__all__ = ["RoundTripError", "verify_round_trip"]
