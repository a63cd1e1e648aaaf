"""Writing unified diffs: the hunks turning one text into another, as ``git diff`` writes them.

Pure (texts in, texts out). ``port`` regenerates a family's patches with it and ``push
--diff`` shows each host's change with it. difflib only finds the matching blocks; the
hunks, their headings and the placement of an ambiguous insertion are ours.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from typing import Any, Sequence

CONTEXT = 3  # lines of context around each regenerated hunk, as git and diff -u
NO_EOL = "\\ No newline at end of file\n"


def blob_id(text: str | None) -> str:
    """git's abbreviated blob id of a text (what an ``index`` line names); 0000000 for none."""
    if text is None:
        return "0000000"
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:7]


def _range(start: int, length: int) -> str:
    # diff -u's convention: an empty range names the line before it; a one-line
    # range omits its length.
    if length == 0:
        return f"{start},0"
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1},{length}"


_FUNCNAME = re.compile(r"^[A-Za-z_$]")


def _section_heading(old_lines: Sequence[str], before: int) -> str:
    """git's default hunk heading: the last line above the hunk that starts in column 0."""
    for line in reversed(old_lines[:before]):
        if _FUNCNAME.match(line):
            return " " + line.rstrip("\r\n")[:80]
    return ""


def _body_line(prefix: str, line: str) -> str:
    return prefix + line if line.endswith("\n") else prefix + line + "\n" + NO_EOL


_BLANK = 100  # a blank line "indents" more than any code line: blocks avoid starting at one


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip()) if line.strip() else _BLANK


def opcodes(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's edit blocks between two line lists, ambiguous blocks placed the way people read them.

    ``autojunk`` is off: with it, difflib ignores frequent lines (blank lines,
    closing brackets) in files over 200 lines, which on server_args.py gives
    hunks that are correct but far larger than the change.

    A pure insertion (or deletion) can often slide up or down with the same
    meaning (when the line it starts with repeats right after it). difflib puts it
    as high as it goes; a reader wants a new function to end with its blank lines
    and a new call to start at its own first line. So among the positions it can
    take, we pick the one whose first line and whose following line are the least
    indented (a blank line counts as deeply indented), the lowest on a tie. On the
    DDTree series this gives the very hunks ``git diff`` wrote.
    """
    ops: list[list[Any]] = [["equal", 0, 0, 0, 0]]  # an empty block above the first, so every change has one
    ops += [list(op) for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()]
    for k in range(1, len(ops) - 1):
        op, above, below = ops[k], ops[k - 1], ops[k + 1]
        if op[0] not in ("insert", "delete") or above[0] != "equal" or below[0] != "equal":
            continue
        lines = b if op[0] == "insert" else a
        s, e = (op[3], op[4]) if op[0] == "insert" else (op[1], op[2])
        # Keep a line of each neighbouring equal block (so blocks never merge), except
        # at the ends of the file.
        room_up = (above[2] - above[1]) - (1 if k > 1 else 0)
        room_down = (below[2] - below[1]) - (1 if k + 2 < len(ops) else 0)
        up = 0
        while up < room_up and lines[s - up - 1] == lines[e - up - 1]:
            up += 1
        down = 0
        while down < room_down and lines[s + down] == lines[e + down]:
            down += 1

        def score(shift: int) -> tuple[int, int]:
            after = lines[e + shift] if e + shift < len(lines) else ""
            return (_indent(lines[s + shift]) + (_indent(after) if after else 0), -shift)

        shift = min(range(-up, down + 1), key=score)
        for i in range(1, 5):
            op[i] += shift
        above[2] += shift
        above[4] += shift
        below[1] += shift
        below[3] += shift
    return [tuple(op) for op in ops if op[1] != op[2] or op[3] != op[4]]


def _groups(ops: Sequence[tuple[str, int, int, int, int]], context: int) -> list[list[tuple[str, int, int, int, int]]]:
    """Edit blocks grouped into hunks: changes closer than 2 * context lines share a hunk."""
    changes = [k for k, op in enumerate(ops) if op[0] != "equal"]
    if not changes:
        return []
    groups, current = [], []
    for k, op in enumerate(ops):
        tag, i1, i2, j1, j2 = op
        if tag != "equal":
            current.append(op)
            continue
        first, last = k == 0, k == len(ops) - 1
        size = i2 - i1
        if first:
            current.append((tag, max(i1, i2 - context), i2, max(j1, j2 - context), j2))
        elif last:
            current.append((tag, i1, min(i2, i1 + context), j1, min(j2, j1 + context)))
        elif size > 2 * context:
            current.append((tag, i1, i1 + context, j1, j1 + context))
            groups.append(current)
            current = [(tag, i2 - context, i2, j2 - context, j2)]
        else:
            current.append(op)
    groups.append(current)
    # Drop a leading group made of context only (when the file starts with changes
    # the first group starts with one), and trim pure-context edges.
    out = []
    for g in groups:
        if any(op[0] != "equal" for op in g):
            out.append(g)
    return out


def diff_hunks(old: str, new: str, *, context: int = CONTEXT) -> list[tuple[int, str]]:
    """The unified-diff hunks turning ``old`` into ``new``: ``(old start line, hunk text)``."""
    a = old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    hunks = []
    for group in _groups(opcodes(a, b), context):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        lines = [f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@{_section_heading(a, i1)}\n"]
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                lines.extend(_body_line(" ", line) for line in a[x1:x2])
                continue
            lines.extend(_body_line("-", line) for line in a[x1:x2])
            lines.extend(_body_line("+", line) for line in b[y1:y2])
        hunks.append((i1 + 1, "".join(lines)))
    return hunks


__all__ = ["CONTEXT", "NO_EOL", "blob_id", "diff_hunks", "opcodes"]
