"""The host programs' protocol: versioned, typed messages, the same table on both sides.

Shipped with the host programs (bundle.py), so stdlib only and Python 3.8
(tests/integration/test_hostprog.py); the controller imports the same module (remote/program.py), so a
request is checked against one declaration where it is built and where it is answered.

Three kinds of message, one JSON line each:

- ``Request``: the controller's ``{"op": ..., <fields>}`` to a request-answering program
  (the deploy agent, the container program). Each op declares its fields (``AGENT_OPS``,
  ``CONTAINER_OPS``): a kind (or kinds) each, required or not. A missing required field, a
  field of the wrong kind or one the op does not declare is refused whole: the program
  answers ``{"ok": false, "code": "protocol", ...}`` naming the field and acts on nothing.
- ``Reply``: a program's answer to one request: ``ok`` (bool), and on a refusal ``code``,
  ``message`` and maybe ``hint``; the op's own fields beside them.
- ``Event``: a line a program emits on its own (``{"event": ...}``): a heartbeat, a smoke
  level, a tune result, a one-shot program's ``done``.

``parse_line`` turns a received line into a Reply or an Event once, where the controller's
session reads it (remote/program.py ``ProgramSession.read``); a line that is neither is a
``ProtocolError``. Both are read-only ``dict`` subclasses: the fields by name, ``json.dumps``
as before, and no code path can change an answer after it arrived.

Versions
--------
``PROTOCOL`` is the version both sides speak. The first exchange carries both: the
controller's ``init`` request has ``"protocol": <its version>`` (required), the program's
``init`` reply has its own. A program refuses every request of a session whose ``init``
names another version (or none: a controller older than version 2) and acts on nothing
(``hello_refusal``); the controller refuses an ``init`` reply that names another version
(or none) and closes the session (``hello_mismatch``). Either way one line names both
versions and what to do, code ``protocol``, exit 1, and the host is unchanged.

==========  ==========================================================================
version     what changed
==========  ==========================================================================
1           JSON lines; ``init`` answered ``"protocol": 1`` and nobody checked it
2           typed requests (each op's fields declared, unknown ones refused) and the
            versioned first exchange
==========  ==========================================================================
"""

PROTOCOL = 2

# A lock's guard held longer is a stopped or hung agent: refuse, never wait for ever (lock.py).
# Shorter than any controller's read deadline (the controller's init may ask for less:
# ``guard_wait_s``), so that the agent's answer, which names the process holding the guard,
# arrives. Here because both sides use it: the controller without importing the agent's jobs.
GUARD_WAIT_S = 10.0

PROTOCOL_CODE = "protocol"  # base.codes.Code.PROTOCOL (the same string; this module imports nothing)


class ProtocolError(ValueError):
    """A message that breaks the protocol (its one line says which field, which message)."""


# ---------------------------------------------------------------- the declarations

NUMBER = (int, float)
NONE = type(None)


def _f(kinds, required=False):
    """A field: the kinds its value may be (a type or a tuple of them), and whether it must be there."""
    return (kinds if isinstance(kinds, tuple) else (kinds,), required)


REQ = True

# Every request may carry ``hooks`` (a test's faults: wire.Hooks; {} in every real run).
COMMON = {"op": _f(str, REQ), "hooks": _f(dict)}

_LOCK = {"run_id": _f(str, REQ), "holder": _f((str, NONE)), "command": _f((str, NONE)), "break_lock": _f(bool)}
_LOCK_RELEASE = {"force": _f(bool), "holder": _f((str, NONE))}

#: The deploy agent's ops (hostprog/agent.py) and their fields.
AGENT_OPS = {
    "init": {"protocol": _f(int, REQ), "state_dir": _f((str, NONE)), "guard_wait_s": _f(NUMBER)},
    "lock": _LOCK,
    "unlock": {},
    "lock_status": {},
    "lock_release": _LOCK_RELEASE,
    "facts": {"paths": _f(list), "content": _f(bool), "driver": _f(bool), "include_state_paths": _f(bool)},
    "driver": {},
    "apply": {"kind": _f(str, REQ), "run_id": _f(str, REQ), "files": _f(list, REQ), "journal": _f(dict, REQ),
              "final_phase": _f(str, REQ), "make_backup": _f(bool), "backup": _f(list), "backup_meta": _f(dict),
              "keep_drifted": _f(list), "keep_backups": _f(int), "from_backup": _f((str, NONE)),
              "backup_id": _f((str, NONE)), "automatic": _f((dict, NONE))},
    "mark": {"run_id": _f((str, NONE), REQ), "phase": _f(str, REQ), "expect": _f((str, NONE), REQ),
             "smoke": _f((dict, NONE))},
    "served": {"serve": _f(dict, REQ), "history": _f((dict, bool, NONE))},
    "speed": {"speed": _f(dict, REQ)},
    "history": {"limit": _f((int, NONE))},
    "switches": {"since": _f(NUMBER, REQ), "paths": _f(list)},
}

#: The container program's ops (hostprog/container.py) and their fields.
CONTAINER_OPS = {
    "init": {"protocol": _f(int, REQ), "container": _f(dict, REQ), "state_dir": _f((str, NONE)),
             "guard_wait_s": _f(NUMBER)},
    "inspect": {"paths": _f(list), "health_url": _f((str, NONE)), "driver": _f(bool)},
    "lock": _LOCK,
    "unlock": {},
    "build": {"run_id": _f(str, REQ), "base": _f(str, REQ), "kept_tag": _f(str, REQ), "tag": _f(str, REQ),
              "files": _f(dict, REQ), "timeout_s": _f(NUMBER), "series": _f((str, NONE)),
              "series_id": _f((str, NONE))},
    "switch": {"run_id": _f(str, REQ), "image": _f(dict, REQ), "expect": _f((str, NONE), REQ),
               "command": _f((str, NONE)), "kind": _f((str, NONE)), "from_tag": _f((str, NONE)),
               "series": _f((str, NONE)), "series_id": _f((str, NONE)), "sglang_version": _f((str, NONE))},
    "verify": {"health_url": _f(str, REQ), "url": _f((str, NONE)), "proof": _f((dict, NONE)),
               "ready_timeout_s": _f(NUMBER), "poll_s": _f(NUMBER), "switched": _f(bool)},
    "keep": {"run_id": _f(str, REQ), "phase": _f(str, REQ)},
    "restore": {"run_id": _f(str, REQ), "command": _f((str, NONE)), "automatic": _f((dict, NONE))},
    "history": {"limit": _f((int, NONE))},
    "speed": {"speed": _f(dict, REQ)},
    "lock_status": {},
    "lock_release": _LOCK_RELEASE,
}

#: Each request-answering program's ops, by the name its session gives (remote/program.py).
PROGRAMS = {"agent": AGENT_OPS, "container": CONTAINER_OPS}


def _kind_names(kinds):
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
             dict: "an object", NONE: "null"}
    if int in kinds and float in kinds:  # NUMBER: said once
        kinds = tuple(k for k in kinds if k is not int)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _is(value, kinds):
    # JSON's true is not a number here: bool is a subclass of int in Python.
    if isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


# ---------------------------------------------------------------- the messages


class _Frozen(dict):
    """A JSON object that arrived: read-only (a received message is a value)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("%s is read-only: build a new message (dict(message, ...))" % type(self).__name__)

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __copy__(self):
        return dict(self)

    def __deepcopy__(self, memo):
        import copy

        return copy.deepcopy(dict(self), memo)

    def __reduce__(self):
        return (type(self), (dict(self),))


class Request(_Frozen):
    """One request, checked against its program's declaration (``check_request``)."""

    @property
    def op(self):
        return self["op"]


class Reply(_Frozen):
    """A program's answer to one request: ``ok``; on a refusal ``code``, ``message``, ``hint``."""

    @property
    def ok(self):
        return self.get("ok") is True

    @property
    def code(self):
        return self.get("code")

    @property
    def message(self):
        return self.get("message")

    @property
    def hint(self):
        return self.get("hint")


class Event(_Frozen):
    """A line a program emits on its own: ``event`` names what it is."""

    @property
    def event(self):
        return self["event"]


def check_request(program, doc):
    """``doc`` as a Request of ``program`` ("agent", "container"), or a ProtocolError naming the
    op and field that is wrong."""
    if not isinstance(doc, dict):
        raise ProtocolError("a request is a JSON object, not %s" % type(doc).__name__)
    ops = PROGRAMS[program]
    op = doc.get("op")
    if not isinstance(op, str) or op not in ops:
        raise ProtocolError("unknown op %r" % (op,))
    fields = dict(COMMON, **ops[op])
    for name, (kinds, required) in sorted(fields.items()):
        if name not in doc:
            if required:
                raise ProtocolError("%s: the field %r is missing" % (op, name))
        elif not _is(doc[name], kinds):
            raise ProtocolError("%s: the field %r is %s, not %s" % (op, name, _kind_names(kinds),
                                                                    type(doc[name]).__name__))
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise ProtocolError("%s: no field %r in protocol %d" % (op, unknown[0], PROTOCOL))
    return Request(doc)


def parse_line(doc):
    """A received JSON object as the message it is: an Event (it has ``event``), else a Reply
    (it has a boolean ``ok``); anything else is a ProtocolError."""
    if not isinstance(doc, dict):
        raise ProtocolError("a message is a JSON object, not %s" % type(doc).__name__)
    if isinstance(doc.get("event"), str):
        return Event(doc)
    if isinstance(doc.get("ok"), bool):
        return Reply(doc)
    raise ProtocolError("neither a reply (a boolean ok) nor an event (an event name)")


# ---------------------------------------------------------------- the first exchange


def _said(version):
    return "protocol %d" % version if isinstance(version, int) and not isinstance(version, bool) \
        else "protocol 1 (it names no version)"


def hello_refusal(request):
    """The program's side: None when ``request`` (a session's first) is an ``init`` naming
    this PROTOCOL, else the Reply that refuses it (and every request after it)."""
    version = request.get("protocol") if isinstance(request, dict) else None
    if isinstance(request, dict) and request.get("op") == "init" and version == PROTOCOL:
        return None
    if isinstance(request, dict) and request.get("op") != "init":
        why = "the first request is %r, not init: the controller speaks %s" % (request.get("op"), _said(version))
    else:
        why = "the controller speaks %s" % _said(version)
    return Reply({"ok": False, "code": PROTOCOL_CODE, "protocol": PROTOCOL,
                  # The message says what to do itself: an older controller shows no hint of ours.
                  "message": "protocol mismatch: %s, this host program speaks protocol %d; nothing was done: "
                             "run both from one ddtree-deploy release" % (why, PROTOCOL)})


def hello_mismatch(reply):
    """The controller's side: None when an ``init`` reply is ok and names this PROTOCOL (or is a
    refusal that is not about the protocol: the caller words it), else the one line that says
    both versions."""
    version = reply.get("protocol")
    if reply.get("ok") is True and version == PROTOCOL:
        return None
    if reply.get("ok") is not True and reply.get("code") != PROTOCOL_CODE:
        return None
    return "protocol mismatch: the host program speaks %s, this ddtree-deploy speaks protocol %d" % (
        _said(version), PROTOCOL)
