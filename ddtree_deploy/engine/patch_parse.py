"""Parse unified diffs into file sections and hunks (the patch engine's first half).

Pure functions, no I/O. patch_apply.py places the parsed hunks on text.

CONTRACT (other modules code against these names; keep them stable):

    parse_patch(text, *, name) -> list[FilePatch]        # raises BadInput naming name:line
    strip_path(path, strip=1) -> str                     # "a/sglang/x.py" -> "sglang/x.py"

Paths in FilePatch are the patch's paths with one leading component stripped
(git's a/ and b/), i.e. package-relative like "sglang/srt/speculative/spec_info.py".
Path *safety* (absolute, "..", symlinks) is checked by the series layer, not here,
but parse_patch keeps the raw header line numbers so the series layer can name them.

Every hunk body is read by its counts (so a content line that looks like a header stays
content). Inputs past MAX_PATCH_BYTES, MAX_HUNKS, MAX_HUNK_LINES or MAX_LINE_BYTES are
refused (BadInput) before any work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from typing import Any, Callable

from ddtree_deploy.base.errors import BadInput


_RUN = re.compile(r" +|-+|\++")  # a run of one tag


class _Once:
    """A value computed on first access and kept in the instance (functools.cached_property
    without its lock, which Python 3.11 takes on every first access)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class Hunk:
    """One parsed hunk, in the form the applier needs (the FilePatch.hunks items).

    The body is kept as two parallel sequences, built in C by the parser: ``tags`` (one
    character per line: " ", "-" or "+") and ``texts`` (each line's text, without its
    tag and "\\n"); ``lines`` pairs them up for readers. The sides and runs the applier
    needs are made once, when the hunk is (from its runs of one tag: a few per hunk);
    callers must not mutate them.
    """

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str  # "@@ -a,b +c,d @@" as written, without the section heading
    patch_line: int  # 1-based line of the header in the patch file
    tags: str  # one character per body line: " ", "-" or "+"
    texts: tuple[str, ...]  # each body line's text: no tag, no "\n"
    old_no_eol: bool = False  # the old side's last line has no newline
    new_no_eol: bool = False  # the new side's last line has no newline

    # Made by __post_init__, in C (not fields: equality and hashing are the fields').
    old_lines: list[str] = field(init=False, repr=False, compare=False)  # ' ' and '-' lines
    new_lines: list[str] = field(init=False, repr=False, compare=False)  # ' ' and '+' lines
    removed_lines: list[str] = field(init=False, repr=False, compare=False)
    added_lines: list[str] = field(init=False, repr=False, compare=False)
    prefix_context: int = field(init=False, repr=False, compare=False)
    suffix_context: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tags, texts = self.tags, self.texts
        put = object.__setattr__  # (frozen)
        for name, mask in _SIDE_MASKS:
            # The mask's bytes are 1 for the lines a side keeps: compress reads them in C.
            put(self, name, list(compress(texts, tags.translate(mask).encode("latin-1"))))
        put(self, "prefix_context", len(tags) - len(tags.lstrip(" ")))
        put(self, "suffix_context", len(tags) - len(tags.rstrip(" ")))

    @_Once
    def runs(self) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
        """The body as runs of one tag (a few per hunk): (tag, line count, the run's texts)."""
        return tuple((self.tags[a], b - a, self.texts[a:b]) for a, b in map(re.Match.span, _RUN.finditer(self.tags)))

    @_Once
    def lines(self) -> tuple[tuple[str, str], ...]:
        """(tag, text) per body line."""
        return tuple(zip(self.tags, self.texts))


_SIDE_MASKS = tuple((name, str.maketrans({" ": keep[0], "-": keep[1], "+": keep[2]})) for name, keep in (
    ("old_lines", "\1\1\0"), ("new_lines", "\1\0\1"), ("removed_lines", "\0\1\0"), ("added_lines", "\0\0\1")))


@dataclass(frozen=True)
class FilePatch:
    """One file's section of a patch."""

    patch_name: str  # the patch file's name, for messages
    header_line: int  # 1-based line of the "--- " header in the patch file
    source_path: str | None  # stripped; None for /dev/null (new file)
    target_path: str | None  # stripped; None for /dev/null (deletion)
    hunks: tuple[Any, ...] = field(default_factory=tuple[Any, ...])  # engine-internal parsed hunks
    crlf: bool = False  # every body line of the section ends in CRLF

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



# --------------------------------------------------------------------------- paths

DEV_NULL = "/dev/null"


def strip_path(path: str, strip: int = 1, where: str | None = None) -> str:
    """Drop ``strip`` leading components, as ``patch -p`` does ("a/x/y.py" -> "x/y.py").

    An absolute path is returned unchanged: stripping "/etc/x" to "etc/x" would hide
    it from the series layer's safety check, which must see it and refuse it.
    ``where`` ("<patch>:<line>"): where the path was read, the refusal's first words.
    """
    at = f"{where}: " if where else ""
    if path.startswith("/"):
        return path
    if "//" in path:
        raise BadInput(f"{at}path {path!r} has an empty component (a doubled '/'); write it with single "
                       "slashes (a/sglang/...), or make the patch again with plain git diff")
    parts = [p for p in path.split("/") if p]
    if len(parts) <= strip:
        raise BadInput(
            f"{at}path {path!r} has no leading component to strip; "
            "patch paths must look like a/sglang/... and b/sglang/... (git diff)"
        )
    return "/".join(parts[strip:])


# --------------------------------------------------------------------------- parsing

_HUNK_HEADER = re.compile(r"^(@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@)(?: .*)?$")
_GIT_REFUSED = {
    "rename from": "renames", "rename to": "renames",
    "copy from": "copies", "copy to": "copies",
    "old mode": "file mode changes", "new mode": "file mode changes",
}
# Limits against hostile or broken input (BadInput, exit 2, before any work): far above
# any real SGLang diff (largest module 375 KB, longest line ~1,500 characters, a whole-file
# diff between releases a few hundred hunks), low enough that every check stays fast.
MAX_PATCH_BYTES = 4 * 1024 * 1024  # the patch file's size in bytes (UTF-8)
MAX_HUNKS = 10_000  # per patch file
MAX_HUNK_LINES = 100_000  # old plus new lines of one hunk (a whole new 8,000-line module: 8,000)
MAX_LINE_BYTES = 64 * 1024  # a line's content in bytes: what follows its tag, before its line end
# Git file modes other than a regular file's 100644: what each is, and what to do instead.
_MODES = {"120000": "a symlink", "160000": "a submodule (gitlink)", "100755": "an executable file"}
_MODE_FIX = {
    "120000": "ship the linked file's content as a regular file (an 'add' entry) instead of the link",
    "160000": "patch the submodule's own files instead",
    "100755": "make it a regular file (git update-index --chmod=-x) and regenerate the patch; "
              "a host that needs it executable must chmod it itself",
}
_WORD_MARKS = re.compile(r"\[-.*?-\]|\{\+.*?\+\}")  # git diff --word-diff's [-removed-] {+added+}
_COLOUR = "\x1b["  # a terminal colour code (git diff --color)
_NO_EOL_PREFIX = "\\ "  # "\ No newline at end of file" (the text is localised by some tools)
_HINT_REGEN = "regenerate the patch (git diff) rather than editing hunks by hand"


def _split_lines(text: str) -> list[str]:
    """The patch's lines without their "\\n" (one C split; a CRLF line keeps its "\\r").

    Split on "\\n" only: str.splitlines also splits on \\r, \\f, \\x1c..., which are content.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the text ends with a newline: no line after it
    return lines


def _meta(raw: str) -> str:
    """A header line without its "\\r" (a CRLF patch has CRLF headers too)."""
    return raw.removesuffix("\r")


_FIRST = itemgetter(0)  # a line's tag (IndexError on an empty line: the careful path reads it)
_REST = itemgetter(slice(1, None))  # a line's text after its tag


def _body_length(tags: str, old_len: int, new_len: int) -> int | None:
    """The number of body lines whose tags meet the header's counts exactly, or None.

    ``tags`` holds the first character of each line after the header. A body of L lines with
    c context lines has L = old_len + new_len - c; starting from the fewest lines possible,
    L = old_len + new_len - (context lines among the first L) settles in a few steps (each
    a C count). The counts are then checked exactly, every tag being one of the three.
    """
    total = old_len + new_len
    length = max(old_len, new_len)
    for _ in range(8):
        nxt = total - tags.count(" ", 0, length)
        if nxt == length:
            break
        length = nxt
    else:
        return None
    if length > len(tags):
        return None
    context, minus, plus = tags.count(" ", 0, length), tags.count("-", 0, length), tags.count("+", 0, length)
    if context + minus != old_len or context + plus != new_len or context + minus + plus != length:
        return None
    return length


@dataclass
class _ScannedHunk:
    header_index: int  # 0-based line index of "@@"
    header: str
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    body_end: int = 0  # index after the last body line (markers included)
    hunk: Hunk | None = None  # the parsed hunk, read by its counts


@dataclass
class _Section:
    start: int  # 0-based index of "diff --git" or "--- "
    minus_index: int | None = None  # 0-based index of "--- "
    git_paths: tuple[str, str] | None = None
    new_file: bool = False
    deleted_file: bool = False
    hunks: list[_ScannedHunk] = field(default_factory=list)


class _Scanner:
    """The parser: counts, truncation, binary, renames, ordering, and the hunks themselves.

    It walks the patch once, names the 1-based line of every problem, and reads every
    hunk body by its counts (so a content line that looks like a header stays content).
    """

    def __init__(self, lines: list[str], name: str):
        self.lines = lines
        self.name = name
        self.sections: list[_Section] = []
        self.hunk_lines: list[int] = []  # every hunk header seen, for the MAX_HUNKS limit

    def bad(self, index: int, what: str) -> BadInput:
        return BadInput(f"{self.name}:{index + 1}: {what}")

    def _is_file_header(self, i: int) -> bool:
        return (self.lines[i].startswith("--- ") and i + 1 < len(self.lines)
                and self.lines[i + 1].startswith("+++ "))

    def _looks_like_header(self, i: int) -> bool:
        line = self.lines[i]
        return line.startswith(("@@ ", "diff --git ")) or self._is_file_header(i)

    def scan(self) -> list[_Section]:
        lines, i = self.lines, 0
        cur: _Section | None = None
        after_hunk = False  # the previous line closed a hunk
        while i < len(lines):
            raw, meta = lines[i], _meta(lines[i])
            if raw.startswith("diff --git "):
                cur = self._open(_Section(start=i))
                cur.git_paths = self._git_paths(i, meta)
            elif meta == "GIT binary patch" or (meta.startswith("Binary files ") and meta.endswith(" differ")):
                raise self.bad(i, "binary patch; the engine applies text patches only, "
                                  "so ship the file whole with an 'add' entry in the series")
            elif cur is not None and not cur.hunks and cur.minus_index is None and any(
                    meta.startswith(k) for k in _GIT_REFUSED):
                what = next(v for k, v in _GIT_REFUSED.items() if meta.startswith(k))
                raise self.bad(i, f"{what} are not supported ({meta!r}); "
                                  "express the change as hunks on the file (or a new file and a deletion)")
            elif cur is not None and not cur.hunks and meta.startswith("new file mode "):
                self._check_mode(i, meta, meta.split()[-1], "the new file")
                cur.new_file = True
            elif cur is not None and not cur.hunks and meta.startswith("deleted file mode "):
                self._check_mode(i, meta, meta.split()[-1], "the deleted file")
                cur.deleted_file = True
            elif cur is not None and not cur.hunks and meta.startswith("index ") and len(meta.split()) == 3:
                self._check_mode(i, meta, meta.split()[-1], "the file", executable_ok=True)
            elif raw.startswith("--- "):
                if not self._is_file_header(i):
                    raise self.bad(i, "'--- ' file header is not followed by a '+++ ' header; "
                                      + _HINT_REGEN)
                if cur is None or cur.minus_index is not None or cur.git_paths is None:
                    cur = self._open(_Section(start=i))
                cur.minus_index = i
                i += 2
                after_hunk = False
                continue
            elif raw.startswith("+++ "):
                raise self.bad(i, "'+++ ' file header without a '--- ' header before it; " + _HINT_REGEN)
            elif raw.startswith("@@"):
                if cur is None or cur.minus_index is None:
                    raise self.bad(i, "hunk header outside a file section (no '--- '/'+++ ' "
                                      "header above it); " + _HINT_REGEN)
                i = self._hunk(cur, i)
                after_hunk = True
                continue
            elif raw.startswith(_NO_EOL_PREFIX):
                raise self.bad(i, "'\\ No newline at end of file' marker not directly after a hunk line; "
                               + _HINT_REGEN)
            elif after_hunk and cur is not None and raw[:1] in (" ", "+", "-") and meta not in ("--", "-- "):
                self._wrong_counts(cur.hunks[-1])  # the hunk goes on past its counts
            elif raw in ("", "\r"):
                pass  # blank lines between or after hunks are harmless (GNU patch and unidiff skip them too)
            elif cur is not None and cur.hunks:
                cur = None  # free text after a section's hunks ends the section (as for GNU patch)
            after_hunk = False
            i += 1
        if not self.sections:
            raise BadInput(f"{self.name}:1: empty patch: no file section ('--- a/...' and "
                           "'+++ b/...' headers) found; make the patch with git diff or git format-patch")
        return self.sections

    def _check_mode(self, i: int, meta: str, mode: str, what: str, executable_ok: bool = False) -> None:
        """Only regular files: a symlink, a submodule or an executable mode the engine would
        silently turn into a plain 0644 file is refused (an existing executable file whose
        content changes, ``index ... 100755``, keeps its mode on the host: a deploy keeps modes)."""
        if mode == "100644" or (executable_ok and mode == "100755"):
            return
        kind = _MODES.get(mode, f"file mode {mode}")
        raise self.bad(i, f"{what} is {kind} ({meta!r}), which the engine cannot deploy: it writes "
                          f"regular files (mode 100644) only; {_MODE_FIX.get(mode, _MODE_FIX['100755'])}")

    def _word_diff(self, h: _ScannedHunk) -> None:
        """A hunk body made of words, not lines: git diff --word-diff output, said as such."""
        body = self.lines[h.header_index + 1:h.header_index + 1 + h.old_len + h.new_len]
        for raw in body:
            if raw.startswith(("@@ ", "diff --git ")):
                break
            if raw == "~" or (raw[:1] not in (" ", "-", "+") and _WORD_MARKS.search(raw)):
                raise BadInput(f"{self.name}:{h.header_index + 1}: hunk {h.header} is word-diff output "
                               "(git diff --word-diff): its body marks words ([-removed-], {+added+}, or "
                               "'~' line breaks), not whole ' ', '-' and '+' lines; make the patch with "
                               "plain git diff (without --word-diff)")

    def _open(self, section: _Section) -> _Section:
        self.sections.append(section)
        return section

    def _git_paths(self, i: int, meta: str) -> tuple[str, str]:
        rest = meta[len("diff --git "):]
        if rest.startswith('"'):
            raise self.bad(i, "quoted (escaped) path in the diff header; "
                              "paths with special characters are not supported")
        # "a/x b/x", or with other one-component prefixes ("orig/x new/x", git diff
        # --src-prefix/--dst-prefix): the space where both halves name the same path once
        # their first component is stripped splits the line unambiguously.
        for k, char in enumerate(rest):
            if char == " ":
                left, right = rest[:k], rest[k + 1:]
                if "/" in left and left.split("/", 1)[1] == right.partition("/")[2]:
                    return left, right
        parts = rest.split(" b/", 1)
        if len(parts) != 2:
            raise self.bad(i, f"cannot read the two paths of {meta!r}: they differ once their first "
                              "component (a/, b/) is stripped; renames are not supported, and paths "
                              "with spaces need git's default a/ and b/ prefixes; " + _HINT_REGEN)
        return parts[0], "b/" + parts[1]

    def _hunk(self, cur: _Section, i: int) -> int:
        lines = self.lines
        meta = _meta(lines[i])
        m = _HUNK_HEADER.match(meta)
        if not m:
            raise self.bad(i, f"malformed hunk header {meta!r} (expected '@@ -a,b +c,d @@'); " + _HINT_REGEN)
        header = m.group(1)
        old_start, new_start = int(m.group(2)), int(m.group(4))
        old_len = int(m.group(3)) if m.group(3) is not None else 1
        new_len = int(m.group(5)) if m.group(5) is not None else 1
        if (old_start == 0 and old_len) or (new_start == 0 and new_len):
            raise self.bad(i, f"hunk {header} starts at line 0 but has lines; " + _HINT_REGEN)
        h = _ScannedHunk(i, header, old_start, old_len, new_start, new_len)
        if len(self.hunk_lines) >= MAX_HUNKS:
            raise self.bad(i, f"more than {MAX_HUNKS} hunks in one patch; split the patch "
                              "(a limit against hostile input: real SGLang diffs have far fewer)")
        self.hunk_lines.append(i)
        if old_len + new_len > MAX_HUNK_LINES:
            raise self.bad(i, f"hunk {header} has {old_len + new_len:,} lines, over the limit of "
                              f"{MAX_HUNK_LINES:,}; ship such a file whole with an 'add' entry")
        # Fast path (the parser's hot loop, all in C): plain ' ', '-', '+' lines that meet
        # the counts. Anything else (blank lines, "no newline" markers, wrong counts) is read
        # again by the careful loop, which names the problem.
        n = len(lines)
        seg = lines[i + 1:min(i + 1 + old_len + new_len, n)]
        try:
            tags = "".join(map(_FIRST, seg))
        except IndexError:  # an empty line: a blank context line whose space was stripped
            length = None
        else:
            length = _body_length(tags, old_len, new_len)
        j = i + 1 + (length or 0)
        if length is not None and not (j < n and lines[j].startswith(_NO_EOL_PREFIX)):
            tags, texts = tags[:length], tuple(map(_REST, seg[:length]))
            closed: set[str] = set()
        else:
            body, j, closed = self._body(h, i)
            tags, texts = "".join(tag for tag, _ in body), tuple(text for _, text in body)
        h.body_end = j
        h.hunk = Hunk(old_start, old_len, new_start, new_len, header, i + 1, tags, texts,
                      "old" in closed, "new" in closed)
        if cur.hunks:
            prev = cur.hunks[-1]
            prev_end = prev.old_start + max(prev.old_len, 1)
            first = old_start if old_len else old_start + 1
            if first < prev_end:
                raise self.bad(i, f"hunk {header} starts at old line {first}, before the hunk above "
                                  f"({prev.header}) ends; hunks must be in file order, not overlapping; "
                                  + _HINT_REGEN)
        cur.hunks.append(h)
        return j

    def _body(self, h: _ScannedHunk, i: int) -> tuple[list[tuple[str, str]], int, set[str]]:
        """The careful read of a hunk body: blank lines, markers, and every defect named.

        Returns the body, the index after it and the sides marked "no newline".
        """
        lines, header = self.lines, h.header
        old_len, new_len = h.old_len, h.new_len
        old_left, new_left = old_len, new_len
        j, n = i + 1, len(lines)
        last_tag = None
        closed: set[str] = set()  # sides whose last line was marked "no newline"
        body: list[tuple[str, str]] = []
        # Inside its counts a line is content, whatever it looks like: a removed "-- x"
        # followed by an added "++ y" reads as "--- x" / "+++ y", not as a file header
        # (GNU patch reads by the counts too).
        while old_left > 0 or new_left > 0 or (j < n and last_tag and lines[j].startswith(_NO_EOL_PREFIX)):
            if j >= n:
                raise self.bad(i, f"truncated hunk {header}: the patch ends (line {n}) after "
                                  f"{old_len - old_left} of {old_len} old and {new_len - new_left} of "
                                  f"{new_len} new lines; the patch file was cut short, fetch or make it again")
            raw = lines[j]
            tag = raw[:1]
            if raw == "" or raw == "\r":  # a blank context line whose space an editor stripped
                tag = " "
                raw = " " + raw
            elif raw.startswith(_NO_EOL_PREFIX):
                if last_tag is None:
                    raise self.bad(j, "'\\ No newline at end of file' marker before any hunk line; " + _HINT_REGEN)
                closed |= {"old", "new"} if last_tag == " " else {"old" if last_tag == "-" else "new"}
                last_tag = None
                j += 1
                continue
            elif tag not in (" ", "-", "+"):
                self._wrong_counts(h)
            if closed and (tag != "+" and "old" in closed or tag != "-" and "new" in closed):
                raise self.bad(j, "line after a '\\ No newline at end of file' marker on the same side; "
                                  "only the last line of a file can lack a newline; " + _HINT_REGEN)
            if tag != "+":
                old_left -= 1
            if tag != "-":
                new_left -= 1
            if old_left < 0 or new_left < 0:
                self._wrong_counts(h)
            body.append((tag, raw[1:]))
            last_tag = tag
            j += 1
        return body, j, closed

    def _wrong_counts(self, h: _ScannedHunk) -> None:
        """Count the hunk's real body (up to the first line that is not one) and say which count is off."""
        self._word_diff(h)
        old = new = 0
        j = h.header_index + 1
        while j < len(self.lines):
            raw = self.lines[j]
            if raw.startswith(_NO_EOL_PREFIX):
                j += 1
                continue
            tag = " " if raw in ("", "\r") else raw[:1]
            if tag not in (" ", "-", "+") or self._looks_like_header(j):
                break
            old += tag in (" ", "-")
            new += tag in (" ", "+")
            j += 1
        parts = []
        if old != h.old_len:
            parts.append(f"{h.old_len} old lines but has {old}")
        if new != h.new_len:
            parts.append(f"{h.new_len} new lines but has {new}")
        says = " and ".join(parts) or f"{h.old_len} old and {h.new_len} new lines but its body is malformed"
        raise BadInput(f"{self.name}:{h.header_index + 1}: hunk {h.header} says {says} "
                       f"(body ends at line {j}); " + _HINT_REGEN)


def _utf8_size(text: str, limit: int) -> int:
    """The UTF-8 size of ``text`` in bytes; only its length (a lower bound) when even 4 bytes
    a character would stay within ``limit``, so a usual patch is never encoded to count."""
    if 4 * len(text) <= limit:
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _header_path(raw: str, prefix: str) -> str:
    """The path of a '--- '/'+++ ' line, without a tab-separated timestamp."""
    return _meta(raw)[len(prefix):].split("\t", 1)[0]


def parse_patch(text: str, *, name: str) -> list[FilePatch]:
    """Parse a unified diff into file sections; any defect raises BadInput naming ``name:line``."""
    if not text.strip():
        raise BadInput(f"{name}:1: empty patch (no text); make it with git diff or git format-patch")
    size = _utf8_size(text, MAX_PATCH_BYTES)
    if size > MAX_PATCH_BYTES:
        raise BadInput(f"{name}:1: the patch is {size:,} bytes, over the limit of {MAX_PATCH_BYTES:,} "
                       "bytes (4 MiB); split it into several patches (a limit against hostile input: a "
                       "whole-file diff of SGLang's largest module is under 1 MiB)")
    if text.startswith(_COLOUR) or "\n" + _COLOUR in text:
        at = next(k for k, line in enumerate(_split_lines(text)) if line.startswith(_COLOUR))
        raise BadInput(f"{name}:{at + 1}: the patch holds terminal colour codes (ESC[...m), as git diff "
                       "--color writes them for a terminal; make it with git diff --no-color (or git "
                       "format-patch), or strip the codes")
    lines = _split_lines(text)
    # A line's content is what follows its one-character tag, without its line end: a
    # 65,536-byte source line is within the limit, whatever tag and newline surround it.
    # Characters first (one C pass): only a line of more than a quarter of the limit in
    # characters can be over it in bytes.
    if max(map(len, lines)) > MAX_LINE_BYTES // 4:
        for at, line in enumerate(lines):
            content = line[1:].removesuffix("\r")
            if len(content) > MAX_LINE_BYTES // 4 and (size := _utf8_size(content, MAX_LINE_BYTES)) > MAX_LINE_BYTES:
                raise BadInput(f"{name}:{at + 1}: a line of {size:,} bytes, over the limit of "
                               f"{MAX_LINE_BYTES:,} bytes (64 KiB) per line; ship such a file whole with "
                               "an 'add' entry (SGLang's longest source line is under 2,000 characters)")
    sections = _Scanner(lines, name).scan()
    return [_section_to_file_patch(s, lines, name) for s in sections]


def _section_to_file_patch(s: _Section, lines: list[str], name: str) -> FilePatch:
    where = f"{name}:{(s.minus_index if s.minus_index is not None else s.start) + 1}"
    if s.minus_index is None:
        # A git section without ---/+++: only an empty new or deleted file has none.
        if s.new_file or s.deleted_file:
            a, b = s.git_paths  # type: ignore[misc]
            src = None if s.new_file else _strip(a, where)
            dst = None if s.deleted_file else _strip(b, where)
            return FilePatch(name, s.start + 1, src, dst, ())
        raise BadInput(f"{where}: file section {_meta(lines[s.start])!r} has no hunks "
                       "(a mode-only or empty change); remove it from the patch")
    if not s.hunks:
        raise BadInput(f"{where}: file section has headers but no hunk ('@@ ... @@'); "
                       "the patch is truncated or hand-edited; " + _HINT_REGEN)
    minus, plus = lines[s.minus_index], lines[s.minus_index + 1]
    raw_src, raw_dst = _header_path(minus, "--- "), _header_path(plus, "+++ ")
    for raw_path, idx in ((raw_src, s.minus_index), (raw_dst, s.minus_index + 1)):
        if raw_path.startswith('"'):
            raise BadInput(f"{name}:{idx + 1}: quoted (escaped) path {raw_path}; "
                           "paths with special characters are not supported")
    if raw_src == DEV_NULL and raw_dst == DEV_NULL:
        raise BadInput(f"{where}: both sides of the file section are /dev/null; " + _HINT_REGEN)
    src = None if raw_src == DEV_NULL else _strip(raw_src, where)
    dst = None if raw_dst == DEV_NULL else _strip(raw_dst, where)
    if src is not None and dst is not None and src != dst:
        raise BadInput(f"{where}: the section renames {src} to {dst}; renames are not supported, "
                       "express it as a new file and a deletion")
    if s.git_paths is not None:
        for git_path, path in zip(s.git_paths, (src, dst)):
            if path is not None and _strip(git_path, where) != path:
                raise BadInput(f"{where}: 'diff --git' names {git_path} but the ---/+++ headers name "
                               f"{path}; " + _HINT_REGEN)
    hunks = _section_hunks(s, name)
    for h in hunks:
        if src is None and (h.old_len or len(hunks) > 1):
            raise BadInput(f"{name}:{h.patch_line}: hunk {h.header} of a new file has old lines; "
                           + _HINT_REGEN)
        if dst is None and h.new_len:
            raise BadInput(f"{name}:{h.patch_line}: hunk {h.header} of a deleted file has new lines; "
                           + _HINT_REGEN)
    return FilePatch(name, s.minus_index + 1, src, dst, tuple(hunks), crlf=_is_crlf(hunks))


def _strip(path: str, where: str) -> str:
    return strip_path(path, 1, where)


def _section_hunks(s: _Section, name: str) -> list[Hunk]:
    """The section's hunks as the strict pass read them (by their counts)."""
    out = [h.hunk for h in s.hunks]
    assert all(h is not None for h in out)
    _check_no_eol_is_last(out, name)  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def _check_no_eol_is_last(hunks: list[Hunk], name: str) -> None:
    for h in hunks[:-1]:
        if h.old_no_eol or h.new_no_eol:
            raise BadInput(f"{name}:{h.patch_line}: hunk {h.header} marks a line '\\ No newline at end of "
                           "file' but is not the section's last hunk; " + _HINT_REGEN)


def _is_crlf(hunks: list[Hunk]) -> bool:
    """True when every body line that has a line terminator ends in CR (a CRLF patch)."""
    seen = False
    for h in hunks:
        open_lines = _lines_without_newline(h)
        for k, (_, text) in enumerate(h.lines):
            if k in open_lines:
                continue
            if not text.endswith("\r"):
                return False
            seen = True
    return seen


def _lines_without_newline(h: Hunk) -> set[int]:
    """The body lines of h that are a side's last line marked '\\ No newline' (one pass)."""
    out = set()
    for no_eol, other in ((h.old_no_eol, "+"), (h.new_no_eol, "-")):
        if no_eol:
            last = max((k for k, (tag, _) in enumerate(h.lines) if tag != other), default=None)
            if last is not None:
                out.add(last)
    return out
