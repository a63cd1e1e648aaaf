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


__all__ = ["plain", "safe"]
