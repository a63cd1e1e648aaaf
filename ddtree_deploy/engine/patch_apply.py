"""Apply parsed file sections to text, hunk by hunk (the patch engine's second half).

Pure functions, no I/O. Every hunk gets a verdict (exact, offset, fuzz,
already-applied, failed) with the evidence an engineer needs to fix a failure.

CONTRACT (other modules code against these names; keep them stable):

    apply_file_patch(fp, original, *, fuzz=0) -> FileResult   # fp from patch_parse.parse_patch
    split_lines(text, crlf) / join_lines(bodies, eols) / is_crlf_text(text)   # how a text is read

How a hunk is placed (GNU patch 2.7's rules, so that its verdicts and reported
lines can be checked against ``patch`` itself; see tests/integration/test_patch_differential.py):

* Hunks of a file section are placed in order. Hunk k is first tried at the line
  it states plus the offset the earlier hunks landed at, then at offsets +1, -1,
  +2, -2, ... : on equal distance the LATER line wins (GNU patch and git apply
  agree on that). A hunk, its leading context included, never starts at or above
  the last line an earlier hunk changed (GNU patch 2.7.6, the version the
  differential test runs against; 2.8 lets the leading context overlap it).
* A hunk whose leading context is shorter than its trailing context and that
  states line 1 must match at the start of the file; one whose trailing context
  is shorter must match at the end (the diff tool ran out of lines there, so the
  hunk is anchored). Fuzz relaxes the anchors the way GNU patch does.
* Lines match byte for byte, including whether the line has a newline: a hunk
  line followed by "\\ No newline at end of file" matches only a last line that
  lacks one, and a line with a newline never matches such a last line.
* Never a change twice, never one skipped. Every hunk's old side and its new side are
  looked for wherever the search reaches (below the lines earlier hunks froze, the anchors
  above, fuzz levels 0 up to the fuzz in use; each side at its lowest level, nearest first).
  Old side alone: applied there. New side alone: already-applied. Both: their places are
  ranked (_Place): less fuzz is better, and the line the patch states (plus the offset the
  hunks above landed at) is better than any other line, however near; a place outranks
  another when it is no worse on both and better on one. The side whose place outranks
  every place of the other decides; when neither does, the two rank alike and the hunk
  fails as ambiguous with both places (``nearest_line``, ``new_side_line``, ``places``):
  a lookalike of either side would otherwise decide (issue 21: a copy of a hunk's new side
  nearer than its real place made it "already applied" and left the real place
  unpatched), and no check after the fact can tell a lookalike from the real place. A
  match of one side that compares only lines of the other's place (repeated lines) is
  that place read twice, not a second place: the hunks above it decide (a file is patched
  or not), and with none the hunk is ambiguous. A new side matched on no line at all
  (fuzz ignored them all) is no evidence. GNU patch applies the forward match and checks
  "previously applied" on the first hunk only; the differential test checks the rule by
  brute force on every case and names where the tools differ; tests/integration/test_release_corpus.py
  measures it on SGLang's own release diffs (issue 28 item 6). A file with some hunks
  already applied and others applied now is ``FileResult.partly_applied``; the check layer
  refuses it unless asked.
* Fuzz f ignores up to f context lines at each end of the hunk (never changed
  lines), limited by the hunk's context; lines kept from the file are the file's,
  so fuzzed context is never rewritten.
* Where a line is written after a last line that had no newline, that line gets
  its newline first (GNU patch 2.7.6 can join the two into one line).

Cost: a hunk is first compared at its expected line (a C slice compare, no index). A side
with a changed line the input lacks is ruled out at once (a substring search of the text
for the first few questions of a file, then the file's lines counted once); otherwise it
is looked for only where its rarest line occurs. A failed hunk's nearest location is
counted in C at the places of its rarest lines, nearest first, at most NEAREST_CANDIDATES
of them, so its evidence costs O(NEAREST_CANDIDATES * hunk lines) whatever lines repeat.
Inputs past the parser's limits (MAX_PATCH_BYTES, MAX_HUNKS, MAX_HUNK_LINES,
MAX_LINE_BYTES) are refused (BadInput) before any work.

Line endings: a file whose every line ends in CRLF keeps CRLF (new lines get
CRLF) whether the patch is LF or CRLF; a hunk made against the CRLF file byte for byte
(its old lines end in CR) writes its added lines as it gives them, so a patch that turns
CRLF into LF (SGLang 0.5.14's apertus.py) does that. A patch whose body lines all end in CRLF,
applied to a file with none, raises BadInput ("CRLF patch against LF file"):
the patch file was mangled (editor, checkout setting), and converting it is the
fix. Any other mix is matched byte for byte, as GNU patch and git apply do.
"""

from __future__ import annotations

import bisect
from collections import Counter
from itertools import repeat
from operator import eq
from dataclasses import dataclass
from enum import Enum
from typing import Iterator

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine.patch_parse import FilePatch, Hunk


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
class SidePlace:
    """Where one side of an ambiguous hunk matches: what `check --explain` shows side by side."""

    side: str  # "old" (what applying expects) or "new" (what applying leaves)
    line: int  # 1-based line where the side's first line lands (in the result's numbering)
    fuzz: int  # context lines it ignored at each end
    offset: int  # line minus the line the patch states
    rows: tuple[tuple[str, str, str | None], ...]  # per side line: (tag ' ', '-' or '+', the hunk's
    # line, the file's line there: None past the end); fuzz may have ignored the outer context rows


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
    reason: str = ""  # failed for a reason other than mismatching lines (ambiguous, file absent...)
    new_side_line: int | None = None  # failed as ambiguous: where the new side matches (nearest_line: the old)
    stated_line: int | None = None  # failed as ambiguous: the line the patch puts the hunk at (after earlier hunks)
    places: tuple[SidePlace, ...] = ()  # failed as ambiguous: both places, old side first (check --explain)

    @property
    def ambiguous(self) -> bool:
        return self.new_side_line is not None

    @property
    def ok(self) -> bool:
        return self.status is not HunkStatus.FAILED


@dataclass(frozen=True)
class FileResult:
    file_patch: FilePatch
    hunks: tuple[HunkResult, ...]
    text: str | None  # the resulting text; None when the file is deleted or a hunk failed

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hunks)

    @property
    def partly_applied(self) -> bool:
        """Some hunks are already in the file and others would be applied now.

        The file is neither pristine nor patched: a half-applied or hand-edited file, or
        an upstream release that took part of the change. Applying the rest may be right
        or may duplicate code in another form, so the check layer refuses it unless asked.
        """
        statuses = {h.status for h in self.hunks}
        return HunkStatus.ALREADY_APPLIED in statuses and bool(statuses & _APPLIED)


_APPLIED = {HunkStatus.EXACT, HunkStatus.OFFSET, HunkStatus.FUZZ}


@dataclass
class _Lines:
    """A text as lines: body (no terminator) and its terminator ("\\n", "\\r\\n" or "")."""

    bodies: list[str]
    eols: list[str]

    @classmethod
    def from_text(cls, text: str, crlf: bool) -> _Lines:
        return cls(*split_lines(text, crlf))

    def text(self) -> str:
        return join_lines(self.bodies, self.eols)

    def __len__(self) -> int:
        return len(self.bodies)


def split_lines(text: str, crlf: bool) -> tuple[list[str], list[str]]:
    """How the engine reads a text: (line bodies, their terminators: "\\n", "\\r\\n" or "").

    Split on "\\n" only; with ``crlf`` (the file's every line ends in CRLF, is_crlf_text) the
    CR is the terminator's, not the body's. patch_verify reads texts the same way.
    """
    parts = text.split("\n")
    bodies, eols = parts[:-1], ["\n"] * (len(parts) - 1)
    if parts[-1]:
        bodies.append(parts[-1])
        eols.append("")
    if crlf:
        for k, b in enumerate(bodies):
            if eols[k] and b.endswith("\r"):
                bodies[k], eols[k] = b[:-1], "\r\n"
    return bodies, eols


def join_lines(bodies: list[str], eols: list[str]) -> str:
    """The text of split_lines' output."""
    if not eols:
        return ""
    # Usually one terminator throughout, the last line maybe without: one join.
    eol = eols[0]
    if eols.count(eol) + (eols[-1] == "" != eol) == len(eols):
        return eol.join(bodies) + eols[-1]
    return "".join(map(str.__add__, bodies, eols))


def is_crlf_text(text: str) -> bool:
    """Every line that ends has CRLF, and at least one does."""
    if "\r" not in text:  # one fast scan settles almost every file
        return False
    n = text.count("\n")
    return n > 0 and text.count("\r\n") == n


@dataclass(frozen=True)
class _Pattern:
    """What a hunk expects to find: one side's line bodies, and whether its last line ends.

    Only a file's last line can lack a newline, and only a side's last line can be marked
    "no newline", so comparing bodies (a list slice, compared in C) and that one flag at
    the end is comparing lines byte for byte.
    """

    bodies: list[str]
    last_nl: bool  # False: the side's last line is marked "\\ No newline at end of file"
    prefix: int  # leading context lines
    suffix: int  # trailing context lines
    changed: list[str]  # the side's own lines ('-' or '+'): fuzz never ignores them

    def has_nl(self, k: int) -> bool:
        return self.last_nl or k != len(self.bodies) - 1


def _pattern(h: Hunk, strip_cr: bool, new_side: bool = False) -> _Pattern:
    """The old side of h (what applying it expects), or its new side (what it leaves)."""
    side = h.new_lines if new_side else h.old_lines
    changed = h.added_lines if new_side else h.removed_lines
    if strip_cr:
        side = [t[:-1] if t.endswith("\r") else t for t in side]
        changed = [t[:-1] if t.endswith("\r") else t for t in changed]
    no_eol = h.new_no_eol if new_side else h.old_no_eol
    return _Pattern(side, not no_eol, h.prefix_context, h.suffix_context, changed)


@dataclass(frozen=True)
class _Place:
    """Where one side of a hunk matches: its first line, the fuzz used, and the input lines the
    match compared (``lo`` .. ``hi`` - 1, 1-based; fuzz leaves the outer context out).

    Places are ranked by their evidence: less fuzz is better, and so is the line the patch
    states (after the offset earlier hunks landed at) over any other line, however near. One
    place outranks another when it is no worse on both counts and better on one; two places
    neither of which outranks the other rank alike. How far from the stated line a place is
    does not count: a real place moves with the file's drift, a lookalike lies anywhere, and
    the distance tells the two apart no better than chance (issue 21's minimal case: the
    lookalike 4 lines from the stated line, the real place 5).
    """

    line: int
    fuzz: int
    lo: int
    hi: int

    def outranks(self, other: _Place, first: int) -> bool:
        mine, theirs = (self.fuzz, self.line != first), (other.fuzz, other.line != first)
        return mine != theirs and mine[0] <= theirs[0] and mine[1] <= theirs[1]

    def holds(self, other: _Place) -> bool:
        """The other match compared only lines of this one (one that compared none: at one
        of them): it is this place read again, not a place of its own."""
        if other.lo >= other.hi:
            return self.lo <= other.lo <= self.hi
        return self.lo <= other.lo and other.hi <= self.hi


class _Index:
    """How often, and (on demand) where, each distinct line body of the input occurs.

    The counts are one C pass (Counter). Positions are found per body when first asked
    (list.index, also C); after a few bodies the whole map is built at once, so a file
    with many hunks to search pays one pass, and one with few pays almost nothing.
    """

    _LAZY = 8  # bodies located one by one before the whole map is built

    def __init__(self, bodies: list[str]):
        self.bodies = bodies
        self.counts = Counter(bodies)
        self._where: dict[str, list[int]] = {}
        self._full = False

    def count(self, body: str) -> int:
        return self.counts.get(body, 0)

    def where(self, body: str) -> list[int]:
        """0-based indices of ``body`` in the input, ascending."""
        found = self._where.get(body)
        if found is not None:
            return found
        count = self.counts.get(body, 0)
        if not count or self._full:
            return []
        if len(self._where) >= self._LAZY:
            self._build()
            return self._where.get(body, [])
        found, i, index = [], -1, self.bodies.index
        for _ in range(count):
            i = index(body, i + 1)
            found.append(i)
        self._where[body] = found
        return found

    def _build(self) -> None:
        where: dict[str, list[int]] = {}
        for idx, body in enumerate(self.bodies):
            found = where.get(body)
            if found is None:
                where[body] = [idx]
            else:
                found.append(idx)
        self._where, self._full = where, True


# A failed hunk's nearest-match evidence looks at this many candidate places at most.
NEAREST_CANDIDATES = 64


class _Applier:
    """GNU patch's placement over one input text: in_offset, out_offset, last_frozen_line."""

    _PROBES = 4  # lines looked for in the text itself before the file's lines are counted

    def __init__(self, fp: FilePatch, src: _Lines, strip_cr: bool, eol: str, fuzz: int, text: str = ""):
        self.fp, self.src, self.strip_cr, self.eol, self.fuzz = fp, src, strip_cr, eol, fuzz
        self.text = text  # the input as given (for _has_line)
        self._index: _Index | None = None
        self._probes = 0
        self._haystack: str | None = None
        self.src_open = bool(src.eols) and src.eols[-1] == ""  # the last line lacks a newline
        self.in_offset = 0  # input line minus the line the patch states, after the last placed hunk
        self.out_offset = 0  # lines added minus removed by the hunks applied so far
        # Input lines already written out or deleted: GNU's last_frozen_line. No later
        # hunk may change a line at or before it.
        self.copied = 0
        self.out = _Lines([], [])
        # The verdict of the last hunk placed (EXACT for any applied one): what a hunk whose
        # place reads both ways follows.
        self.last: HunkStatus | None = None

    # -- matching

    def _has_line(self, body: str) -> bool:
        """Whether some input line has this body (True may be a line without its newline).

        A file with few hunks asks a few times: a C substring search of the text is cheaper
        than counting every line; after _PROBES questions the lines are counted once.
        """
        if self._index is not None or self._probes >= self._PROBES:
            return body in self.index.counts
        self._probes += 1
        if self._haystack is None:
            self._haystack = "\n" + self.text + self.eol
        return "\n" + body + self.eol in self._haystack

    @property
    def index(self) -> _Index:
        if self._index is None:
            self._index = _Index(self.src.bodies)
        return self._index

    def _matches(self, pat: _Pattern, start: int, pf: int, sf: int) -> bool:
        """Does the pattern match with its first line at 1-based input line ``start``?

        Lines pf .. len-sf-1 of the pattern are compared (fuzz leaves out the others).
        """
        m, n = len(pat.bodies), len(self.src.bodies)
        lo, hi = start - 1 + pf, start - 1 + m - sf
        if lo < 0 or hi > n:
            return False
        if self.src.bodies[lo:hi] != (pat.bodies[pf:m - sf] if pf or sf else pat.bodies):
            return False
        # Newlines: only the file's last line and the pattern's last line can lack one.
        return (hi == n and self.src_open) == (sf == 0 and not pat.last_nl)

    def _locate(self, pat: _Pattern, first: int, fuzz: int, whole_file: bool = False,
                evidence: bool = False, known: tuple[_Pattern, int] | None = None,
                outside: _Place | None = None, here_only: bool = False) -> int | None:
        """The 1-based line where the pattern lands at this fuzz level, or None (GNU's locate_hunk).

        ``evidence``: the pattern is a hunk's new side, looked for as proof that the change
        is there; a match that compares no line (fuzz ignored them all) proves nothing.
        ``known``: the other side and the line where it matched, whose lines are where it says.
        ``outside``: the other side's place; a match whose compared lines all lie among its
        lines is that place read again, not a place of its own, and is passed over.
        ``here_only``: only the expected line (or the one place an anchor allows) is tried.
        """
        m, n = len(pat.bodies), len(self.src)
        if m == 0:  # nothing to match: a pure insertion lands where it says
            return first if self.copied < first <= n + 1 and self._free(pat, first, fuzz, outside) else None
        context = max(pat.prefix, pat.suffix)
        pf = fuzz + pat.prefix - context
        sf = fuzz + pat.suffix - context
        if whole_file:  # a deletion must remove the whole file, nothing else
            return 1 if m == n and self.copied == 0 and self._matches(pat, 1, 0, 0) else None
        max_where = n - (m - sf) + 1
        # GNU patch 2.7: the whole hunk, leading context included, lies below the last
        # line an earlier hunk changed (2.8 lets the leading context overlap it).
        min_where = self.copied + 1
        if pf < 0 and first - self.in_offset <= 1:
            # Anchored at the start of the file (and, if sf < 0 too, at its end).
            if sf < 0 and (m != n or pat.prefix < self.copied):
                return None
            ok = self.copied <= pat.prefix and 1 <= max_where and self._matches(pat, 1, 0, max(sf, 0))
            return 1 if ok and self._free(pat, 1, fuzz, outside) else None
        pf = max(pf, 0)
        if sf < 0:  # anchored at the end of the file
            start = n - m + 1
            ok = start >= min_where and self._matches(pat, start, pf, 0)
            return start if ok and self._free(pat, start, fuzz, outside) else None
        if m - sf <= pf:  # fuzz left no line to compare: the nearest allowed line
            if evidence or min_where > max_where:
                return None
            where = min(max(first, min_where), max_where)
            return where if self._free(pat, where, fuzz, outside) else None
        # The expected line first: most hunks are there, and it needs no index.
        if (min_where <= first <= max_where and self._matches(pat, first, pf, sf)
                and self._free(pat, first, fuzz, outside)):
            return first
        if here_only:
            return None
        # Candidates: the places where the rarest compared line occurs, visited outward
        # from ``first`` (on equal distance the later line first), as GNU patch visits lines.
        index = self.index
        counts = list(map(index.counts.get, pat.bodies[pf:m - sf], repeat(0)))
        rarest = min(counts)
        k = pf + counts.index(rarest)
        places = None
        if rarest == 1 and known is not None:
            # A line found once in the file and in the other side's match: its place is
            # known without looking (the usual case for a new side's rarest context line).
            other, at = known
            if pat.bodies[k] in other.bodies:
                idx = at - 1 + other.bodies.index(pat.bodies[k])
                if 0 <= idx < len(self.src.bodies) and self.src.bodies[idx] == pat.bodies[k]:
                    places = [idx]
        if places is None:
            places = index.where(pat.bodies[k])
        for start in self._outward(places, k, first, min_where, max_where):
            if self._matches(pat, start, pf, sf) and self._free(pat, start, fuzz, outside):
                return start
        return None

    @staticmethod
    def _place(pat: _Pattern, start: int, fuzz: int) -> _Place:
        """The side matched at ``start`` with ``fuzz``, and the lines that match compared."""
        context = max(pat.prefix, pat.suffix)
        pf = max(fuzz + pat.prefix - context, 0)
        sf = max(fuzz + pat.suffix - context, 0)
        return _Place(start, fuzz, start + pf, start + len(pat.bodies) - sf)

    def _free(self, pat: _Pattern, start: int, fuzz: int, outside: _Place | None) -> bool:
        return outside is None or not outside.holds(self._place(pat, start, fuzz))

    def _find(self, pat: _Pattern, first: int, levels: int, whole_file: bool = False,
              evidence: bool = False, known: tuple[_Pattern, int] | None = None,
              outside: _Place | None = None) -> _Place | None:
        """The pattern's place at the lowest fuzz level 0..levels where it matches (GNU's order).

        A line of the side's own that the input lacks rules out every level at once (fuzz
        ignores context lines only): the usual answer for the side that is not there.
        """
        if self._matches_at_first(pat, first) and self._free(pat, first, 0, outside):
            return self._place(pat, first, 0)
        for body in pat.changed:
            if not self._has_line(body):
                return None
        for fuzz in range(levels + 1):
            where = self._locate(pat, first, fuzz, whole_file, evidence, known, outside)
            if where is not None:
                return self._place(pat, where, fuzz)
        return None

    def _rival(self, a: _Place, pat: _Pattern, b: _Place, first: int, levels: int,
               whole_file: bool = False, evidence: bool = False) -> _Place | None:
        """A place of the other side (``pat``) outside ``a`` that ``a`` does not outrank, or None.

        ``b`` is that side's first place outside ``a`` (lowest fuzz, nearest): every other
        one has as much fuzz or more, so only one at the stated line with more fuzz can
        rank where ``b`` does not; it is looked for there.
        """
        if not a.outranks(b, first):
            return b
        if b.line == first:
            return None
        for fuzz in range(b.fuzz + 1, levels + 1):
            if self._locate(pat, first, fuzz, whole_file, evidence, outside=a, here_only=True) == first:
                here = self._place(pat, first, fuzz)
                return None if a.outranks(here, first) else here
        return None

    def _matches_at_first(self, pat: _Pattern, first: int) -> bool:
        """The hot path: the pattern exactly at its expected line, no anchor in play."""
        m = len(pat.bodies)
        if not m or pat.prefix != pat.suffix or self.fp.is_deletion:
            return False  # anchors, pure insertions and deletions take the careful path
        return self.copied < first and self._matches(pat, first, 0, 0)

    def _line_matches(self, pat: _Pattern, start: int, k: int) -> bool:
        idx = start - 1 + k
        return (0 <= idx < len(self.src.bodies) and self.src.bodies[idx] == pat.bodies[k]
                and (self.src.eols[idx] != "") == pat.has_nl(k))

    def _hits(self, pat: _Pattern, start: int) -> int:
        """Matching lines with the pattern's first line at 1-based ``start`` (counted in C)."""
        bodies, lo = pat.bodies, start - 1
        seg = self.src.bodies[lo:lo + len(bodies)]
        hits: int = sum(map(eq, seg, bodies))
        if pat.last_nl and not self.src_open:
            return hits  # every line on both sides ends: bodies alone decide
        # Newlines: only the input's last line can lack one, and only the pattern's last
        # line can be marked so; a body that matches there may still differ by its newline.
        for k in {len(self.src.bodies) - 1 - lo, len(bodies) - 1}:
            if 0 <= k < len(seg) and seg[k] == bodies[k] and (self.src.eols[lo + k] != "") != pat.has_nl(k):
                hits -= 1
        return hits

    @staticmethod
    def _outward(places: list[int], k: int, first: int, lo: int, hi: int) -> Iterator[int]:
        """Starts (place - k + 1) within lo..hi, nearest ``first`` first (on a tie the later)."""
        shift = k - 1
        # Only places whose start lies in lo..hi: the ones above ``first`` from the first
        # one at or after max(first, lo), the ones below from the last one at or before
        # min(first - 1, hi).
        right = bisect.bisect_left(places, max(first, lo) + shift)
        left = bisect.bisect_right(places, min(first - 1, hi) + shift) - 1
        while True:
            up = places[right] - shift if right < len(places) else None
            down = places[left] - shift if left >= 0 else None
            if up is not None and up > hi:
                up = None
            if down is not None and down < lo:
                down = None
            if up is None and down is None:
                return
            if up is not None and (down is None or up - first <= first - down):
                right += 1
                yield up
            else:  # up is None or farther: down is a place (both None returned above)
                left -= 1
                assert down is not None
                yield down

    def _nearest(self, pat: _Pattern, first: int) -> tuple[int, tuple[Mismatch, ...]]:
        """The location with the most matching lines (ties: nearest, then later) and its differences.

        Bounded: the candidates are the places of the pattern's rarest lines, nearest the
        expected line first, at most NEAREST_CANDIDATES of them, each counted in C. Below
        that many it is exact (a start not among the places of the t rarest pattern lines
        matches at most m - t lines, so the search stops once the best start found matches
        more); past it, it is the best of the nearest candidates. A failed hunk's evidence
        thus costs O(NEAREST_CANDIDATES * hunk lines), whatever lines repeat in the file.
        """
        n, m = len(self.src), len(pat.bodies)
        last = max(n - m + 1, 1)
        start = min(max(first, 1), last)
        best = (-self._hits(pat, start), abs(start - first), -start)
        seen = {start}
        index = self.index
        order = sorted(range(m), key=lambda j: index.count(pat.bodies[j]))
        budget = NEAREST_CANDIDATES
        for t, k in enumerate(order, 1):
            bound = m - (t - 1)  # a start not seen yet matches at most this many lines
            for s in self._outward(index.where(pat.bodies[k]), k, first, 1, last):
                if -best[0] >= bound and abs(s - first) > best[1]:
                    break
                if s in seen:
                    continue
                seen.add(s)
                key = (-self._hits(pat, s), abs(s - first), -s)
                if key < best:
                    best = key
                budget -= 1
                if not budget:
                    break
            if not budget or -best[0] > m - t:
                break
        start = -best[2]
        mismatches = []
        for k, body in enumerate(pat.bodies):
            idx = start - 1 + k
            if not self._line_matches(pat, start, k):
                actual = self._show(idx) if idx < n else None
                expected = body if pat.has_nl(k) else body + "  (no newline at end of file)"
                mismatches.append(Mismatch(start + k + self.out_offset, expected, actual))
        return start + self.out_offset, tuple(mismatches)

    def _show(self, idx: int) -> str:
        body = self.src.bodies[idx]
        return body if self.src.eols[idx] else body + "  (no newline at end of file)"

    # -- output

    def _copy_till(self, line: int) -> None:
        """Copy input lines up to 1-based ``line`` unchanged (in one slice: files are long)."""
        if self.copied >= line:
            return
        if self.out.eols and self.out.eols[-1] == "":
            self.out.eols[-1] = self.eol  # a line now follows the old last line
        self.out.bodies.extend(self.src.bodies[self.copied:line])
        self.out.eols.extend(self.src.eols[self.copied:line])
        self.copied = line

    def _apply(self, h: Hunk, where: int) -> None:
        """Write hunk h at 1-based input line ``where`` (GNU's apply_hunk, for unified hunks)."""
        pos = where - 1  # 0-based input index of the hunk's next old-side line
        runs = h.runs  # runs of one tag: few per hunk
        # The new side's last line: if it is an added one marked "no newline", it gets none.
        last_plus = None
        if h.new_no_eol:
            last_plus = max((r for r, (tag, _, _) in enumerate(runs) if tag != "-"), default=None)
            if last_plus is not None and runs[last_plus][0] != "+":
                last_plus = None
        own = self._own_eols(h)
        for r, (tag, count, added) in enumerate(runs):
            if tag == "+":
                self._write_added(list(added), pos, no_eol=r == last_plus, own_eols=own)
            elif tag == "-":
                self._copy_till(pos)
                self.copied += count
                pos += count
            else:
                pos += count
        self.out_offset += h.new_len - h.old_len

    def _own_eols(self, h: Hunk) -> bool:
        """A CRLF file and a hunk made on it byte for byte (its old lines end in CR, as the file's
        do): the added lines end as the patch writes them, so a change from CRLF to LF is made
        like any other. A hunk without CRs (made on an LF copy) gets the file's CRLF."""
        olds = h.old_lines[:-1] if h.old_no_eol else h.old_lines
        return self.strip_cr and bool(olds) and all(t.endswith("\r") for t in olds)

    def _write_added(self, added: list[str], after: int, *, no_eol: bool = False,
                     own_eols: bool = False) -> None:
        """Copy input lines up to ``after``, then the added lines (no_eol: the last has no newline;
        own_eols: in a CRLF file, each ends in CRLF only if the patch gives it a CR)."""
        self._copy_till(after)
        eols = [self.eol] * len(added)
        if self.strip_cr:
            if own_eols:
                eols = ["\r\n" if t.endswith("\r") else "\n" for t in added]
            added = [t[:-1] if t.endswith("\r") else t for t in added]
        if self.out.eols and self.out.eols[-1] == "":
            self.out.eols[-1] = self.eol  # a line now follows the old last line
        self.out.bodies.extend(added)
        self.out.eols.extend(eols)
        if no_eol:
            self.out.eols[-1] = ""

    def finish(self) -> str:
        self._copy_till(len(self.src))
        return self.out.text()

    # -- one hunk

    def place(self, index: int, h: Hunk) -> HunkResult:
        """The verdict of hunk h: both sides are looked for wherever the search reaches.

        Its old side alone found: applied there. Its new side alone found: already
        applied. Both found at places of their own: the places are ranked
        (``_Place.outranks``: less fuzz, the line the patch states); the side whose place
        outranks every place of the other decides, and when neither does the hunk fails
        with both (a lookalike of either side would otherwise decide, and no check after
        the fact can tell a lookalike from the real place). One side read inside the
        other's place (repeated lines: six of seven equal lines are the old side, all seven
        the new) is one place read two ways: the file's earlier hunks decide which (a file
        is patched or it is not), and with none the hunk fails with both readings.
        """
        fwd = _pattern(h, self.strip_cr)
        first = (h.old_start if h.old_len else h.old_start + 1) + self.in_offset
        whole = self.fp.is_deletion
        levels = min(self.fuzz, max(fwd.prefix, fwd.suffix))
        old = self._find(fwd, first, levels, whole)
        new = rev = None
        # A deletion has nothing to recognise, nor has a hunk whose new side is empty, nor one
        # that writes LF lines into this CRLF file (the file's lines all end in CRLF).
        if h.new_len > 0 and not whole and not (
                self._own_eols(h) and any(not t.endswith("\r") for t in h.added_lines)):
            rev = _pattern(h, self.strip_cr, new_side=True)
            new = self._find(rev, first, levels, evidence=True,
                             known=(fwd, old.line) if old is not None else None, outside=old)
            if old is not None and new is not None and new.holds(old):
                # The old side's first place is a reading inside the new side's: its place of
                # its own, if it has one, is further (the reading is weighed below).
                old = self._find(fwd, first, levels, whole, outside=new)
                if old is not None:
                    new = self._find(rev, first, levels, evidence=True, outside=old)
        if old is not None and new is not None and rev is not None:  # a new place implies its pattern
            rival = self._rival(old, rev, new, first, levels, evidence=True)
            if rival is None:
                new = None
            else:
                rival2 = self._rival(new, fwd, old, first, levels, whole)
                if rival2 is not None:
                    # Places that rank alike: the old side's and a new side's place it does not
                    # outrank, or else the new side's and an old side's place it does not outrank.
                    pair = (old, rival) if not rival.outranks(old, first) else (rival2, new)
                    return self._ambiguous(index, h, first, (fwd, pair[0]), (rev, pair[1]))
                old = None
        # The winning place may hold a reading of the other side that it does not outrank.
        if old is not None and rev is not None:
            twin = self._held(rev, old, first, levels, evidence=True)
            if twin is not None:
                if self.last is None:
                    return self._ambiguous(index, h, first, (fwd, old), (rev, twin), same_place=True)
                new = twin if self.last is HunkStatus.ALREADY_APPLIED else None
        elif new is not None and rev is not None:
            twin = self._held(fwd, new, first, levels, whole)
            if twin is not None:
                if self.last is None:
                    return self._ambiguous(index, h, first, (fwd, twin), (rev, new), same_place=True)
                if self.last is not HunkStatus.ALREADY_APPLIED:
                    old, new = twin, None
        if new is not None and rev is not None:
            self.last = HunkStatus.ALREADY_APPLIED
            return self._already(index, h, rev, first, new.line, new.fuzz)
        if old is not None:
            self.last = HunkStatus.EXACT
            where, fuzz = old.line, old.fuzz
            line = where + self.out_offset
            self.in_offset = where - (first - self.in_offset)
            self._apply(h, where)
            status = (HunkStatus.FUZZ if fuzz else
                      HunkStatus.OFFSET if self.in_offset else HunkStatus.EXACT)
            return HunkResult(index, h.header, h.patch_line, status, line, self.in_offset, fuzz)
        nearest, mismatches = self._nearest(fwd, first)
        reason = ""
        if whole and len(fwd.bodies) != len(self.src):
            reason = (f"the patch deletes {self.fp.path} expecting {len(fwd.bodies)} lines, "
                      f"but it has {len(self.src)}")
        return HunkResult(index, h.header, h.patch_line, HunkStatus.FAILED, None, 0, 0,
                          nearest, mismatches, reason)

    def _held(self, pat: _Pattern, holder: _Place, first: int, levels: int, whole_file: bool = False,
              evidence: bool = False) -> _Place | None:
        """A match of ``pat`` comparing lines of ``holder``'s place only, that ``holder`` does not
        outrank: the place read as the other side. A match that compares no line reads nothing."""
        for body in pat.changed:
            if not self._has_line(body):
                return None
        m, n = len(pat.bodies), len(self.src.bodies)
        context = max(pat.prefix, pat.suffix)
        for fuzz in range(levels + 1):
            pf, sf = fuzz + pat.prefix - context, fuzz + pat.suffix - context
            if (pf < 0 and first - self.in_offset <= 1) or sf < 0:  # anchored: one place
                where = self._locate(pat, first, fuzz, whole_file, evidence)
                starts = [] if where is None else [where]
            else:
                pf, sf = max(pf, 0), max(sf, 0)
                if m - sf <= pf:
                    continue
                # Starts whose compared lines lie in holder.lo .. holder.hi - 1, below the lines
                # earlier hunks froze, found where the first compared line is (list.index: C).
                lo = max(holder.lo - pf, self.copied + 1)
                hi = min(holder.hi - (m - sf), n - (m - sf) + 1)
                starts, body, bodies, at = [], pat.bodies[pf], self.src.bodies, lo - 1 + pf
                while at < hi + pf:
                    try:
                        at = bodies.index(body, at, hi + pf)
                    except ValueError:
                        break
                    if self._matches(pat, at - pf + 1, pf, sf):
                        starts.append(at - pf + 1)
                    at += 1
            for start in starts:
                twin = self._place(pat, start, fuzz)
                if twin.lo < twin.hi and holder.holds(twin) and not holder.outranks(twin, first):
                    return twin
        return None

    def _ambiguous(self, index: int, h: Hunk, first: int, old: tuple[_Pattern, _Place],
                   new: tuple[_Pattern, _Place], same_place: bool = False) -> HunkResult:
        """Hunk h's old side and new side both match at places that rank alike: failed, both as evidence."""
        out = self.out_offset
        (_, o), (_, n) = old, new

        def fuzzed(f: int) -> str:
            return f" (fuzz {f})" if f else ""

        why = ("one inside the other: the same lines read both ways (repeated lines), and no hunk above "
               "it in this file tells whether the file is patched" if same_place else
               "and neither place ranks above the other (less fuzz, or the line the patch puts it at: "
               f"{first + out})")
        reason = (f"ambiguous: its old lines match at line {o.line + out}{fuzzed(o.fuzz)} and its new "
                  f"lines at line {n.line + out}{fuzzed(n.fuzz)}, {why}, so the change may be there "
                  "already or not; read both places (check --explain shows them), then drop the hunk if "
                  "the change is in, or make the patch with more context (git diff -U8, or port --context 8) "
                  "so that it matches one place only")
        places = tuple(self._side_place(side, pat, at, first, h) for side, (pat, at) in (("old", old), ("new", new)))
        return HunkResult(index, h.header, h.patch_line, HunkStatus.FAILED, None, 0, 0,
                          o.line + out, (), reason, new_side_line=n.line + out,
                          stated_line=first + out, places=places)

    def _side_place(self, side: str, pat: _Pattern, at: _Place, first: int, h: Hunk) -> SidePlace:
        """One side's place as rows for --explain: the hunk's line and the file's line there."""
        skip = "+" if side == "old" else "-"
        tags = [tag for tag, _ in h.lines if tag != skip]
        rows = []
        for k, (tag, body) in enumerate(zip(tags, pat.bodies)):
            idx = at.line - 1 + k
            rows.append((tag, body, self._show(idx) if idx < len(self.src.bodies) else None))
        return SidePlace(side, at.line + self.out_offset, at.fuzz, at.line - first, tuple(rows))

    def _already(self, index: int, h: Hunk, pat: _Pattern, first: int, where: int, fuzz: int) -> HunkResult:
        """Record hunk h as already applied with its new side at input line ``where``."""
        offset = where - (first - self.in_offset)
        # Later hunks sit further down by what this one added (it is in the input already).
        self.in_offset = offset + h.new_len - h.old_len
        # Nothing changes, but later hunks must land after it, as after an applied one.
        self._copy_till(where - 1 + len(pat.bodies) - pat.suffix)
        return HunkResult(index, h.header, h.patch_line, HunkStatus.ALREADY_APPLIED,
                          where + self.out_offset, offset, fuzz)


def _failed_all(fp: FilePatch, reason: str, nearest: int | None = None,
                mismatches: tuple[Mismatch, ...] = ()) -> FileResult:
    hunks = tuple(HunkResult(k, h.header, h.patch_line, HunkStatus.FAILED, None,
                             nearest_line=nearest, mismatches=mismatches, reason=reason)
                  for k, h in enumerate(fp.hunks, 1))
    if not hunks:  # a section without hunks (empty new/deleted file) still needs a verdict
        hunks = (HunkResult(1, "(no hunks)", fp.header_line, HunkStatus.FAILED, None,
                            nearest_line=nearest, mismatches=mismatches, reason=reason),)
    return FileResult(fp, hunks, None)


def _all_already(fp: FilePatch, text: str | None) -> FileResult:
    hunks = tuple(HunkResult(k, h.header, h.patch_line, HunkStatus.ALREADY_APPLIED,
                             h.new_start or 1) for k, h in enumerate(fp.hunks, 1))
    return FileResult(fp, hunks, text)


def apply_file_patch(fp: FilePatch, original: str | None, *, fuzz: int = 0) -> FileResult:
    """Apply one file section to ``original`` (None: the file does not exist).

    The text is None when a hunk failed or the section deletes the file. Raises
    BadInput for a fuzz outside 0..2 and for a CRLF patch against an LF file.
    """
    if not 0 <= fuzz <= 2:
        raise BadInput(f"fuzz {fuzz} is out of range; use 0, 1 or 2")
    where = f"{fp.patch_name}:{fp.header_line}"
    if original is None:
        if fp.is_deletion:
            return _all_already(fp, None)
        if not fp.is_new:
            return _failed_all(fp, f"{fp.path} does not exist; the patch changes an existing file")
        original = ""
    elif not fp.hunks and original:
        what = "creates it empty" if fp.is_new else "deletes it as an empty file"
        return _failed_all(fp, f"{fp.path} is not empty; the patch {what}")

    file_crlf = is_crlf_text(original)
    if fp.crlf and "\n" in original and "\r\n" not in original:
        raise BadInput(f"{where}: CRLF patch against LF file {fp.path}: the patch's lines end in CRLF "
                       "but the file's end in LF; convert the patch to LF (dos2unix) or regenerate it")
    strip_cr = file_crlf  # compare and write in the file's CRLF style; otherwise byte for byte
    src = _Lines.from_text(original, crlf=file_crlf)

    if fp.is_new and len(src):
        return _new_file_exists(fp, src, strip_cr, original)

    ap = _Applier(fp, src, strip_cr, "\r\n" if file_crlf else "\n", fuzz, original)
    results = tuple(ap.place(k, h) for k, h in enumerate(fp.hunks, 1))
    if not all(r.ok for r in results):
        return FileResult(fp, results, None)
    text = ap.finish()
    if fp.is_deletion:
        return FileResult(fp, results, None)
    return FileResult(fp, results, text)


def _new_file_exists(fp: FilePatch, src: _Lines, strip_cr: bool, original: str) -> FileResult:
    """A section creating a file that exists: already applied if the file is exactly its content."""
    created = _Applier(fp, _Lines([], []), strip_cr, "\r\n" if strip_cr else "\n", 0)
    for k, h in enumerate(fp.hunks, 1):
        created.place(k, h)
    expected = _Lines.from_text(created.finish(), crlf=strip_cr)
    if expected.bodies == src.bodies and expected.eols == src.eols:
        return _all_already(fp, original)
    mismatches = []
    for k in range(max(len(expected), len(src))):
        exp = expected.bodies[k] if k < len(expected) else "(end of file)"
        act = src.bodies[k] if k < len(src) else None
        if k >= len(expected) or k >= len(src) or exp != act or expected.eols[k] != src.eols[k]:
            mismatches.append(Mismatch(k + 1, exp, act))
        if len(mismatches) >= 20:
            break
    return _failed_all(fp, f"{fp.path} already exists with other content; the patch creates it",
                       1, tuple(mismatches))
