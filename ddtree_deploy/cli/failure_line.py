"""The sentence under an ``error:`` line: where the failure happened and what it left.

A ``DeployError`` carries its host, its step and whether the host changed (base/errors.py);
this renders them, for a person on stderr, as one line after the error's own:

    error: ct200: connection lost while starting the host program (...)
    failed while starting the host program; host changed: maybe (run `ddtree-deploy status --host ct200`)
    hint: ...

Pure (fields in, lines out; tests/unit/test_failure_line.py). The message is never reworded:
the sentence only adds what the message does not already start with.
"""

from __future__ import annotations

import shlex

from ddtree_deploy.base import next_step

#: A step named as a phrase of its own ("while starting the host program") reads after
#: "failed" without "at".
_PHRASE_STARTS = ("while ", "during ", "before ", "after ", "at ", "in ", "on ")


def failure_lines(message: str, *, host: str | None, step: str | None, changed: str,
                  hint: str | None = None, folder: object = None) -> tuple[str, ...]:
    """The line to print after ``error: <message>`` (none or one), from the error's fields.

    - ``<host>: `` leads it unless the message already starts with it (the line above
      names the host then); ``failed at <step>; `` follows unless the message (after the
      host) already starts with ``<step>: ``.
    - Then the host's state: ``host unchanged`` (``changed`` "no"), ``host changed: maybe``
      or ``host changed: yes``, the last two with ``(run `ddtree-deploy status --host H`)``
      unless the hint already names ``ddtree-deploy status`` (with ``-i FOLDER`` when the
      command read its hosts from ``folder``).
    - No host (a failure on this side: a local file, a release): nothing about a host's
      state; only ``failed at <step>`` when a step is known, else no line.
    """
    rest = message
    lead = ""
    if host:
        if rest.startswith(f"{host}: "):
            rest = rest[len(host) + 2:]
        else:
            lead = f"{host}: "
    where = ""
    if step and not rest.startswith(f"{step}: "):
        where = f"failed {step}" if step.startswith(_PHRASE_STARTS) else f"failed at {step}"
    if not host:
        return (where,) if where else ()
    state = "host unchanged" if changed == "no" else f"host changed: {changed}"
    if changed != "no" and f"{next_step.PROG} status" not in (hint or ""):
        where_from = shlex.quote(str(folder)) if folder is not None else None
        state += f" (run {next_step.status(shlex.quote(host), where_from)})"
    return (lead + "; ".join(part for part in (where, state) if part),)


__all__ = ["failure_lines"]
