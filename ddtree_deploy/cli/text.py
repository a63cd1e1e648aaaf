"""The one escaping rule for text that comes from a host or an inventory.

Such text (versions, journal fields, backup ids, lock holders, paths, error messages
quoting them) is printed through rich, whose markup would read ``[/]`` as a closing
tag (a crash) and ``[prod]`` as a style (the text vanishes), and a terminal would obey
its escape sequences and newlines (a forged ``error:`` line). ``safe`` makes it inert:
markup escaped, every non-printable character shown as ``\\x1b`` / ``\\u202e``.
"""

from __future__ import annotations


def _visible(text: str) -> str:
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def safe(value) -> str:
    """``value`` as inert text for a rich console: no markup, no control characters."""
    from rich.markup import escape

    return escape(_visible(str(value)))


def plain(value) -> str:
    """``value`` with control characters made visible, for plain (non-markup) output."""
    return _visible(str(value))


def fit(line: str, width: int | None) -> list[str]:
    """``line`` as lines of at most ``width`` columns, for a terminal that would otherwise cut
    it anywhere (mid-hash, mid-word). Broken at a gap between words, preferably a column gap
    (two spaces or more) when that keeps the line at least half full; the continuation lines
    are indented 4 more than the line itself. A single word longer than a whole line (a long
    path) is cut after its last ``/`` that fits, else at the width. ``None``: no width known
    (a pipe, a log): the line whole."""
    if width is None or len(line) <= width:
        return [line]
    width = max(width, 20)
    indent = len(line) - len(line.lstrip(" "))
    hang = " " * min(indent + 4, width // 2)
    out: list[str] = []
    rest, lead = line, ""
    while len(lead) + len(rest) > width:
        room = width - len(lead)
        cut = _break_at(rest, room)
        out.append((lead + rest[:cut]).rstrip())
        rest, lead = rest[cut:].lstrip(" "), hang
    out.append(lead + rest)
    return out


def _break_at(text: str, room: int) -> int:
    """Where to end a line of ``text`` that has ``room`` columns (see ``fit``)."""
    head = text[:room + 1]  # a gap just after the room is a clean break too
    body = head.lstrip(" ")
    start = len(head) - len(body)
    column_gap = head.rfind("  ", start)
    if column_gap > start and column_gap >= room // 2:
        return column_gap
    gap = head.rfind(" ", start)
    if gap > start:
        return gap
    slash = text.rfind("/", start, room)
    return slash + 1 if slash > start else room


__all__ = ["fit", "plain", "safe"]
