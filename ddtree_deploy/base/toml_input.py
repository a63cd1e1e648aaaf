"""Reading a TOML input file (an inventory file, a family.toml) into typed, validated values.

One reader, one message format for every wrong value, so that a user who fixed one file
knows how to read the next complaint:

    <file>: line N: <key>: <what is wrong>; <what to do>

``line N`` is tomllib's for a syntax error, else the line of the key (or of its table's
header) found in the text; it is left out where the key is not written in the file (a
required key that is missing from an absent table). Parsing is pure; ``read_text`` reads a
file for it, bounded (a regular UTF-8 file under MAX_TOML_BYTES, else one BadInput line).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from typing import Any, Iterable, Literal, overload

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.fsutil import NotARegularFile, check_regular, read_regular

if sys.version_info >= (3, 11):
    import tomllib as tomllib  # re-exported: install.py reads pyproject.toml with it
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The largest TOML input ``read_text`` reads (a host file, groups.toml): far above any real one.
MAX_TOML_BYTES = 1 << 20
#: The longest a number of seconds may be (a day): beyond it a deadline means "never"
#: and, at inf, overflows the clocks it is added to.
MAX_SECONDS = 86400.0
_AT_LINE = re.compile(r"\s*\(at line (\d+), column \d+\)$")
_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\- \"']+?)\s*\]\]?\s*(?:#.*)?$")


def _bare(part: str) -> str:
    return part.strip().strip("\"'")


class TomlFile:
    """A parsed TOML text and the typed getters that name its file, line and key."""

    def __init__(self, text: str, *, source: str):
        self.source = source
        self.lines = text.splitlines()
        try:
            self.data: dict[str, Any] = tomllib.loads(text)
        except RecursionError:  # tomllib recurses per nesting level: 100,000 '[' exhaust the stack
            raise BadInput(f"{source}: a value is nested too deeply to read; fix the file (see https://toml.io)") \
                from None
        except tomllib.TOMLDecodeError as exc:
            message = str(exc)
            m = _AT_LINE.search(message)
            at = f"line {m.group(1)}: " if m else ""
            what = message[:m.start()] if m else message
            raise BadInput(f"{source}: {at}not valid TOML: {what}; fix the syntax (see https://toml.io)") from None

    @classmethod
    def of(cls, data: dict[str, Any], *, source: str, text: str = "") -> "TomlFile":
        """A reader over values already parsed (``text``, when given, is where lines are found)."""
        doc = cls.__new__(cls)
        doc.source, doc.lines, doc.data = source, text.splitlines(), data
        return doc

    # ------------------------------------------------------------ messages

    def line_of(self, key: str) -> int | None:
        """The 1-based line where ``key`` ("ssh.port", "transport", "smoke") is written: its
        ``name =`` line inside its table, else the header of its nearest written table; None
        when neither is in the text."""
        parts = key.split(".")
        for split in range(len(parts) - 1, -1, -1):
            table, rest = ".".join(parts[:split]), parts[split:]
            found = self._find(table, rest)
            if found is not None:
                return found
        # Not written: the header of the nearest table that is (a missing key of [ssh]).
        return self.line_of(key.rsplit(".", 1)[0]) if "." in key else None

    def _find(self, table: str, rest: list[str]) -> int | None:
        """``rest[0] =`` (or a dotted ``rest[0].x =``) inside ``[table]`` ("" = top level), or the
        header ``[table.rest...]`` itself."""
        current = ""
        whole = ".".join([table, *rest]) if table else ".".join(rest)
        for number, line in enumerate(self.lines, 1):
            h = _HEADER.match(line)
            if h:
                current = ".".join(_bare(p) for p in h.group(1).split("."))
                if current == whole:
                    return number
                continue
            if current == table and "=" in line:
                name = line.split("=", 1)[0]
                if ".".join(_bare(p) for p in name.split(".")).split(".")[0] == rest[0]:
                    return number
        return None

    def bad(self, key: str, what: str, todo: str) -> BadInput:
        """The one message: ``<file>: line N: <key>: <what is wrong>; <what to do>``."""
        line = self.line_of(key)
        at = f"line {line}: " if line is not None else ""
        return BadInput(f"{self.source}: {at}{key}: {what}; {todo}")

    # ------------------------------------------------------------ typed getters

    def get(self, key: str) -> Any:
        """The value at dotted ``key``, None when absent (or when a table on the way is not one)."""
        value: Any = self.data
        for part in key.split("."):
            if not isinstance(value, dict):
                return None
            value = value.get(part)
        return value

    def missing(self, key: str, what: str, todo: str) -> BadInput:
        """A required ``key`` that is not there, or, when its table holds a key spelled
        nearly like it (``pyhton`` for ``python``), that misspelt key: said as what is wrong."""
        parent, _, leaf = key.rpartition(".")
        table = self.get(parent) if parent else self.data
        near = difflib.get_close_matches(leaf, [k for k in table if k != leaf], n=1, cutoff=0.75) \
            if isinstance(table, dict) else []
        if near:
            typo = f"{parent}.{near[0]}" if parent else near[0]
            return self.bad(typo, f"unknown key: a misspelling of {leaf} ({key} is required)", f"rename it to {leaf}")
        return self.bad(key, what, todo)

    def table(self, key: str, *, required: bool = False) -> dict[str, Any]:
        value = self.get(key)
        if value is None:
            if required:
                raise self.missing(key, "missing", f"add a [{key}] table")
            return {}
        if not isinstance(value, dict):
            raise self.bad(key, f"must be a table, not {value!r}", f"write it as a [{key}] table")
        return value

    def located(self, key: str) -> "Table":
        """``table(key)`` as a dict that keeps this file, so that a module checking its keys
        later (smoke_settings, for a host's [smoke]) names their lines too."""
        return Table(self.table(key), doc=self, key=key)

    def choice(self, key: str, options: Iterable[str], *, default: str) -> str:
        options = tuple(options)
        value = self.get(key)
        value = default if value is None else value
        if value not in options:
            raise self.bad(key, f"must be one of {', '.join(map(repr, options))}, not {value!r}",
                           "use one of those")
        return value

    # Each getter with a default (or required=True) always gives a value: the overloads say
    # so, and callers get `str` where they passed one, `str | None` where they did not.
    @overload
    def string(self, key: str, *, required: Literal[True], default: None = None, example: str = ...) -> str: ...
    @overload
    def string(self, key: str, *, required: bool = False, default: str, example: str = ...) -> str: ...
    @overload
    def string(self, key: str, *, required: bool = False, default: None = None,
               example: str = ...) -> str | None: ...

    def string(self, key: str, *, required: bool = False, default: str | None = None,
               example: str = "...") -> str | None:
        value = self.get(key)
        leaf = key.rsplit(".", 1)[-1]
        if value is None:
            if required:
                raise self.missing(key, "missing (required)", f'add {leaf} = "{example}"')
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.bad(key, f"must be a non-empty string, not {value!r}",
                           f'write it in quotes: {leaf} = "{example}"')
        if "\0" in value or "\n" in value:
            raise self.bad(key, "must not contain NUL or newline characters", "write it on one line")
        return value

    @overload
    def integer(self, key: str, *, default: int, lo: int, hi: int) -> int: ...
    @overload
    def integer(self, key: str, *, default: None, lo: int, hi: int) -> int | None: ...

    def integer(self, key: str, *, default: int | None, lo: int, hi: int) -> int | None:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.bad(key, f"must be an integer from {lo} to {hi}, not {value!r}",
                           f"write a number without quotes, e.g. {key.rsplit('.', 1)[-1]} = {lo}")
        return int(value)

    @overload
    def seconds(self, key: str, *, default: float, hi: float = ...) -> float: ...
    @overload
    def seconds(self, key: str, *, default: None, hi: float = ...) -> float | None: ...

    def seconds(self, key: str, *, default: float | None, hi: float = MAX_SECONDS) -> float | None:
        """A finite number of seconds, above 0 and at most ``hi`` (TOML's inf and nan are refused:
        a deadline of inf overflows the clock it is added to, one of nan never passes)."""
        value = self.get(key)
        if value is None:
            return default
        if not _finite(value) or not 0 < value <= hi:
            raise self.bad(key, f"must be a number of seconds above 0 and at most {hi:g}, not {value!r}",
                           f"write a number without quotes, e.g. {key.rsplit('.', 1)[-1]} = 30")
        return float(value)

    @overload
    def number(self, key: str, *, default: float, zero: bool = False, hi: float = ...) -> float: ...
    @overload
    def number(self, key: str, *, default: None, zero: bool = False, hi: float = ...) -> float | None: ...

    def number(self, key: str, *, default: float | None, zero: bool = False, hi: float = 1e9) -> float | None:
        """A finite positive number (``zero``: or 0) of at most ``hi``, e.g. GiB of free memory."""
        value = self.get(key)
        if value is None:
            return default
        if not _finite(value) or value < 0 or (value == 0 and not zero) or value > hi:
            raise self.bad(key, f"must be a {'non-negative' if zero else 'positive'} number of at most {hi:g}, "
                           f"not {value!r}",
                           f"write a number without quotes, e.g. {key.rsplit('.', 1)[-1]} = {0 if zero else 1}")
        return float(value)

    @overload
    def file(self, key: str, *, default: str, limit: int, example: str = ...) -> str: ...
    @overload
    def file(self, key: str, *, default: None, limit: int, example: str = ...) -> str | None: ...

    def file(self, key: str, *, default: str | None, limit: int, example: str = "~/.ssh/...") -> str | None:
        """A local file's path (``~`` allowed), as written. When the file is there it must be a
        regular file of at most ``limit`` bytes (``/dev/zero``, a folder: refused now, before any
        connection); an absent one is the caller's to judge when it reads it
        (``fsutil.read_regular``, the same check)."""
        value = self.string(key, default=default, example=example)
        if value is None:
            return None
        try:
            check_regular(os.path.expanduser(value), limit)
        except NotARegularFile as exc:
            raise self.bad(key, str(exc), "name a regular file") from None
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self.bad(key, f"{value}: cannot read ({exc.strerror or exc})", "fix the path or its permissions") \
                from None
        return value

    def strings(self, key: str, *, default: Iterable[str] = (), nonempty: bool = False,
                example: str = '["a", "b"]') -> list[str]:
        """A list of strings (``nonempty``: each non-empty), without NUL characters."""
        value = self.get(key)
        if value is None:
            return list(default)
        if not isinstance(value, list) or not all(
                isinstance(v, str) and "\0" not in v and (v or not nonempty) for v in value):
            kind = "non-empty strings" if nonempty else "strings"
            raise self.bad(key, f"must be a list of {kind}, not {value!r}",
                           f"write a list in brackets, e.g. {key.rsplit('.', 1)[-1]} = {example}")
        return list(value)

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, f"must be true or false, not {value!r}", "write true or false without quotes")
        return value

    def unknown(self, where: str, known: Iterable[str]) -> None:
        """Refuse a key of table ``where`` ("" = top level) that is not in ``known``."""
        known = sorted(known)
        table = self.get(where) if where else self.data
        extra = sorted(set(table) - set(known)) if isinstance(table, dict) else []
        if extra:
            key = f"{where}.{extra[0]}" if where else extra[0]
            near = difflib.get_close_matches(extra[0], known, n=1, cutoff=0.75)
            raise self.bad(key, f"unknown key (known keys here: {', '.join(known)})",
                           (f"did you mean {near[0]}? " if near else "") + "fix its spelling or remove it")


def read_text(path: str | os.PathLike[str], *, source: str | None = None, what: str = "TOML file") -> str:
    """A TOML input's text: a regular UTF-8 file of at most MAX_TOML_BYTES, or one BadInput
    line (``/dev/zero``, a folder, a Latin-1 file: never a traceback, never read for ever)."""
    source = source or str(path)
    try:
        data = read_regular(path, MAX_TOML_BYTES)
    except NotARegularFile as exc:
        raise BadInput(f"{source}: cannot read the {what}: {exc}; give a TOML file") from None
    except OSError as exc:
        raise BadInput(f"{source}: cannot read the {what} ({exc.strerror or exc})") from None
    return decode_utf8(data, source)


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as text, or one BadInput line naming the line and column of the first byte
    that is not UTF-8 (a file saved as Latin-1 or UTF-16)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise BadInput(f"{source}: line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); "
                       "save the file as UTF-8") from None


def _finite(value: Any) -> bool:
    """An int or a finite float (TOML has inf and nan; a bool is not a number here)."""
    return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)


class Table(dict[str, Any]):
    """A table read from a TomlFile, that remembers the file and its own key (``located``)."""

    def __init__(self, values: Any = (), *, doc: TomlFile | None = None, key: str = ""):
        super().__init__(values)  # (dataclasses.asdict rebuilds it from pairs: no file then)
        self.doc, self.key = doc, key

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:  # pickled or deep-copied: a plain dict (the file stays behind)
        return (dict, (dict(self),))


__all__ = ["MAX_SECONDS", "MAX_TOML_BYTES", "Table", "TomlFile", "decode_utf8", "read_text"]
