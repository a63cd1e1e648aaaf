"""The one failure model of the toolkit.

Core modules raise these; only the CLI maps them to exit codes and messages
(one table, in ``cli/app.py``). A failure is a value: everything it says is given when
it is made (the sentence, the host, the step, whether the host changed, the evidence
the sentence is made from) and nothing is added or reworded on its way up: a caller
that knows more raises its own error, it never edits one it caught.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping

from ddtree_deploy.base.codes import BEFORE_CHANGE, UNREACHABLE, Code

EXIT_OK = 0
EXIT_FAILED = 1  # a check or a deploy step failed
EXIT_BAD_INPUT = 2  # bad input or usage; nothing was changed anywhere


class Changed(Enum):
    """Whether a failure left its host changed: the fleet's outcome (``failed, host
    unchanged`` or ``failed, state unknown``) and the JSON's ``changed`` say it.

    Not a str-mixin Enum (see codes.py): compared by identity, written by ``.value``."""

    NO = "no"  # provably untouched: refused, or failed, before anything that writes was sent
    MAYBE = "maybe"  # a write may have landed (a link lost while one was in flight): `status` tells
    YES = "yes"  # the host was changed (files switched, a server restarted) before the failure


def changed_by_code(code: str, exit_code: int) -> Changed:
    """What an error's code alone proves: bad input and the codes raised only before any
    write (``BEFORE_CHANGE``, a connection never made) left the host as it was."""
    if exit_code == EXIT_BAD_INPUT or code in BEFORE_CHANGE or code in UNREACHABLE or code == Code.FAILED_UNCHANGED:
        return Changed.NO
    return Changed.MAYBE


class DeployError(Exception):
    """A step failed (exit 1). ``code`` is a stable machine-readable slug.

    Fields, all set here and read-only after (assigning one raises AttributeError):
    ``message`` (one line naming the thing that is wrong), ``hint`` (what to do),
    ``code``, ``exit_code``, ``host`` (the host it happened on, None on this side),
    ``step`` (what was under way: "lock", "apply", "discover"...), ``changed`` (a
    ``Changed``; by default what the code proves, else MAYBE) and ``evidence`` (the facts
    the sentence is made from: the agent's reply, a drifted file's diff...)."""

    exit_code = EXIT_FAILED
    code = Code.FAILED

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None, host: str | None = None,
                 step: str | None = None, changed: Changed | None = None,
                 evidence: Mapping[str, Any] | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code
        if exit_code is not None:
            self.exit_code = exit_code
        self.host = host
        self.step = step
        self.changed = changed if changed is not None else changed_by_code(self.code, self.exit_code)
        self._evidence = dict(evidence or {})
        self._made = True

    @property
    def evidence(self) -> Mapping[str, Any]:
        return MappingProxyType(self._evidence)

    def __setattr__(self, name: str, value: Any) -> None:
        # Python's own bookkeeping (__traceback__, __cause__, __notes__) stays writable.
        if getattr(self, "_made", False) and not name.startswith("__"):
            raise AttributeError(f"{type(self).__name__}.{name}: a failure's fields are set when it is made; "
                                 "raise a new error that says what this caller knows")
        super().__setattr__(name, value)

    def known(self, *, changed: Changed, step: str | None = None) -> DeployError:
        """This failure as a caller that knows more about the host tells it: the same class,
        sentence, hint, code and evidence, with ``changed`` (and the ``step``, where this one
        names none) given. The caller raises it ``from`` this one; nothing is reworded. Where
        the caller knows: a read-only session (nothing it sends writes), the stages of a push
        before its switch request is sent."""
        return _remade(type(self), self.args, dict(self.__dict__, changed=changed, step=self.step or step))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a release worker's error crossing processes) and copied whole, the same
        # class with the same fields: never rebuilt by calling __init__ and setting them after.
        return _remade, (type(self), self.args, dict(self.__dict__))

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` ``error`` object (docs/json.md): every field, ``changed`` as its value
        and the evidence made JSON-safe and bounded (``evidence_json``)."""
        return {"error": {"code": self.code, "message": self.message, "hint": self.hint, "host": self.host,
                          "step": self.step, "changed": self.changed.value,
                          "evidence": evidence_json(self._evidence)}}


def _remade(cls: type[DeployError], args: tuple[Any, ...], fields: dict[str, Any]) -> DeployError:
    """``cls`` with ``args`` and ``fields`` as they were: made here whole, the one write past
    ``__setattr__``'s guard (``known``, pickling, ``copy``)."""
    new = cls.__new__(cls, *args)
    Exception.__init__(new, *args)
    new.__dict__.update(fields)
    return new


# An error's evidence in JSON: a bounded copy, so that a 40 MB agent reply or a long diff never
# becomes a 40 MB document; each cut says what it left out. Host text stays text: a string is
# never parsed (a reply that looks like JSON stays a string), and the JSON encoder escapes its
# control characters, so nothing a host wrote can end a line or forge a field.
EVIDENCE_TEXT = 2000  # characters of one string
EVIDENCE_ITEMS = 50  # entries of one list or mapping
EVIDENCE_DEPTH = 6  # mappings and lists nested, the evidence itself the first
EVIDENCE_BUDGET = 20000  # characters of text in all


def evidence_json(evidence: Mapping[str, Any]) -> dict[str, Any]:
    """``evidence`` as JSON-safe values (pure): mappings with string keys, lists (tuples,
    sets), str, int, bool, None and finite floats; an Enum as its value, bytes decoded
    (invalid UTF-8 replaced), anything else as its ``str``. Bounded: the EVIDENCE_* limits,
    each cut marked (``... (N more characters)``, a last list item ``... (N more)``, a
    ``"..."`` key)."""
    return _Bounded().mapping(evidence, 1)


class _Bounded:
    """One ``evidence_json`` walk: what is left of the text budget."""

    def __init__(self) -> None:
        self.left = EVIDENCE_BUDGET

    def value(self, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, float):
            return value if value == value and abs(value) != float("inf") else str(value)  # NaN, inf: not JSON
        if isinstance(value, Enum):
            return self.value(value.value, depth)
        if isinstance(value, (bytes, bytearray)):
            return self.text(bytes(value).decode("utf-8", "replace"))
        if isinstance(value, str):
            return self.text(value)
        if depth >= EVIDENCE_DEPTH:
            return f"... (nested deeper than {EVIDENCE_DEPTH} levels)"
        if isinstance(value, Mapping):
            return self.mapping(value, depth + 1)
        if isinstance(value, (list, tuple, set, frozenset)):
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
            shown = [self.value(item, depth + 1) for item in items[:EVIDENCE_ITEMS]]
            return shown + ([f"... ({len(items) - EVIDENCE_ITEMS} more)"] if len(items) > EVIDENCE_ITEMS else [])
        return self.text(str(value))

    def mapping(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        pairs = list(value.items())
        out = {str(key)[:EVIDENCE_TEXT]: self.value(item, depth) for key, item in pairs[:EVIDENCE_ITEMS]}
        if len(pairs) > EVIDENCE_ITEMS:
            out["..."] = f"{len(pairs) - EVIDENCE_ITEMS} more"
        return out

    def text(self, text: str) -> str:
        room = max(0, min(EVIDENCE_TEXT, self.left))
        self.left -= min(len(text), room)
        if len(text) <= room:
            return text
        return f"{text[:room]}... ({len(text) - room} more characters)"


class BadInput(DeployError):
    """Bad input or usage (exit 2): a malformed patch, series, inventory, path..."""

    exit_code = EXIT_BAD_INPUT
    code = Code.BAD_INPUT


# Messages are built from nested prefixes (``<host>: <step>: <the agent's reason>``). Each
# layer says what it knows once: these two keep a segment the inner message already says
# from being said again (``h: lock: lock: No space left on device``).


def prefixed(message: str, *context: str) -> str:
    """``<context>: ...: <message>``, leaving out each context part (a host, a step) that the
    message already starts with: ("h", "lock") and "lock: No space left" -> "h: lock: No
    space left"."""
    for part in reversed(context):
        if message != part and not message.startswith(f"{part}: "):
            message = f"{part}: {message}"
    return message


def clause(exc: DeployError, host: str) -> str:
    """``exc``'s message as a clause of a line that already names ``host`` (without the
    ``<host>: `` it starts with)."""
    return exc.message.removeprefix(f"{host}: ")
