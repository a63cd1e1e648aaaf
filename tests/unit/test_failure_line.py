"""Failures as values, as the CLI shows them (issue 33, section 2): the line under ``error:``
(cli/failure_line.py), the ``--json`` error object of a DeployError (``to_json``) and of the
failures that are none (usage, internal, interrupted, a summary), and the evidence made
JSON-safe and bounded (base/errors.evidence_json). All pure: real DeployErrors, no stand-ins.
The same over a real sshd, a drifted host's refusal: tests/e2e/test_failure_fields.py.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path

import pytest

from ddtree_deploy.base import errors
from ddtree_deploy.base.errors import BadInput, Changed, DeployError, evidence_json
from ddtree_deploy.cli import envelope
from ddtree_deploy.cli.app import interrupted_error
from ddtree_deploy.cli.failure_line import failure_lines

STATUS = "(run `ddtree-deploy status --host ct200`)"


# ---------------------------------------------------------------- the line under error:

@pytest.mark.parametrize("changed, state", [
    ("no", "host unchanged"),
    ("maybe", f"host changed: maybe {STATUS}"),
    ("yes", f"host changed: yes {STATUS}"),
])
def test_each_changed_value_has_its_words(changed, state):
    got = failure_lines("the switch request was refused", host="ct200", step="switch", changed=changed)
    assert got == (f"ct200: failed at switch; {state}",)


def test_a_message_that_starts_with_the_host_is_not_told_the_host_again():
    got = failure_lines("ct200: the switch request was refused", host="ct200", step="switch", changed="maybe")
    assert got == (f"failed at switch; host changed: maybe {STATUS}",)
    # Only a whole leading "<host>: " counts: a longer name that starts the same is another host.
    got = failure_lines("ct2000: refused", host="ct200", step="switch", changed="no")
    assert got == ("ct200: failed at switch; host unchanged",)


def test_a_step_the_message_already_names_is_not_said_twice():
    got = failure_lines("ct200: lock: No space left on device", host="ct200", step="lock", changed="no")
    assert got == ("host unchanged",)
    got = failure_lines("lock: No space left on device", host="ct200", step="lock", changed="maybe")
    assert got == (f"ct200: host changed: maybe {STATUS}",)


def test_no_step_says_the_state_alone():
    assert failure_lines("refused", host="ct200", step=None, changed="no") == ("ct200: host unchanged",)
    assert failure_lines("ct200: refused", host="ct200", step="", changed="yes") == (f"host changed: yes {STATUS}",)


def test_a_step_worded_as_a_phrase_reads_without_at():
    got = failure_lines("ct200: connection lost while starting the host program (reset)", host="ct200",
                        step="while starting the host program", changed="maybe")
    assert got == (f"failed while starting the host program; host changed: maybe {STATUS}",)


def test_no_host_says_no_host_state():
    # A failure on this side (a local file, a release): there is no host whose state to tell.
    assert failure_lines("hosts/gpu1.toml: bad key", host=None, step=None, changed="no") == ()
    assert failure_lines("download failed", host=None, step=None, changed="maybe") == ()
    assert failure_lines("download failed", host=None, step="download", changed="maybe") == ("failed at download",)
    assert failure_lines("download: it failed", host=None, step="download", changed="maybe") == ()


def test_a_hint_that_already_says_status_is_not_repeated():
    hint = "run `ddtree-deploy status --host ct200` to see where the host stands, then rerun"
    got = failure_lines("ct200: connection lost", host="ct200", step="apply", changed="maybe", hint=hint)
    assert got == ("failed at apply; host changed: maybe",)
    # A hint about something else keeps the advice.
    got = failure_lines("ct200: refused", host="ct200", step="apply", changed="yes", hint="check the disk")
    assert got == (f"failed at apply; host changed: yes {STATUS}",)


def test_a_command_that_read_another_inventory_folder_names_it_in_the_advice():
    got = failure_lines("refused", host="ct200", step=None, changed="yes", folder=Path("/srv/my hosts"))
    assert got == ("ct200: host changed: yes (run `ddtree-deploy status --host ct200 -i '/srv/my hosts'`)",)


def test_a_host_name_that_needs_quoting_is_quoted_in_the_advice():
    got = failure_lines("refused", host="/tmp/my hosts/a.toml", step=None, changed="maybe")
    assert got == ("/tmp/my hosts/a.toml: host changed: maybe (run `ddtree-deploy status --host '/tmp/my hosts/a.toml'`)",)


# ---------------------------------------------------------------- the JSON error objects

KEYS = ["code", "message", "hint", "host", "step", "changed", "evidence"]


def test_a_deploy_error_gives_every_field():
    exc = DeployError("ct200: 1 file(s) drifted", hint="push --replace-drifted", code="drift", host="ct200",
                      step="drift check", changed=Changed.NO, evidence={"files": {"a.py": "drifted"}})
    doc = exc.to_json()["error"]
    assert list(doc) == KEYS
    assert doc == {"code": "drift", "message": "ct200: 1 file(s) drifted", "hint": "push --replace-drifted",
                   "host": "ct200", "step": "drift check", "changed": "no", "evidence": {"files": {"a.py": "drifted"}}}


def test_unset_fields_are_null_and_changed_is_what_the_code_proves():
    assert BadInput("hosts/x.toml: bad").to_json()["error"] | {"message": ""} == {
        "code": "bad-input", "message": "", "hint": None, "host": None, "step": None, "changed": "no", "evidence": {}}
    assert DeployError("boom").to_json()["error"]["changed"] == "maybe"
    known = DeployError("ct200: lost", host="ct200").known(changed=Changed.YES, step="switch")
    assert known.to_json()["error"]["changed"] == "yes" and known.to_json()["error"]["step"] == "switch"


def test_the_errors_that_are_no_deploy_error_have_the_same_keys():
    internal = envelope.internal_error(ValueError("boom\nsecond line"))
    assert list(internal) == KEYS
    # A bug may strike after a write was sent: nothing proves the host untouched.
    assert (internal["host"], internal["step"], internal["changed"], internal["evidence"]) == (None, None, "maybe", {})
    interrupted = interrupted_error(KeyboardInterrupt())
    assert list(interrupted) == KEYS and interrupted["changed"] == "maybe" and interrupted["host"] is None


def test_a_summary_error_says_the_most_any_failed_host_says():
    def summary(*hosts):
        return envelope.envelope({"hosts": list(hosts)}, command="push", exit_code=1)["error"]

    def entry(name, changed=None):
        error = {"code": "x", "message": "m", "hint": None} | ({"changed": changed} if changed else {})
        return {"host": name, "ok": False, "error": error}

    ok = {"host": "a", "ok": True}
    assert summary(ok, entry("b", "no"))["changed"] == "no"
    assert summary(entry("b", "no"), entry("c", "maybe"))["changed"] == "maybe"
    assert summary(entry("b", "yes"), entry("c", "maybe"), entry("d", "no"))["changed"] == "yes"
    # A failed host that says nothing (a failed smoke, an internal error's entry) counts as maybe.
    assert summary(entry("b", "no"), {"host": "c", "ok": False, "outcome": "smoke failed"})["changed"] == "maybe"
    both = summary(entry("b", "no"))
    assert list(both) == KEYS and both["host"] is None and both["step"] is None
    # No host at all (a failed check, matrix or port): no host was changed.
    assert envelope.envelope(None, command="check", exit_code=1)["error"]["changed"] == "no"
    assert envelope.envelope(None, command="push", exit_code=130)["error"]["changed"] == "maybe"


# ---------------------------------------------------------------- evidence_json

class Colour(Enum):
    RED = "red"


def test_evidence_becomes_json_safe_values():
    got = evidence_json({"reply": {"ok": False, "n": 3, "f": 1.5, "none": None, "t": (1, 2), "s": {"b", "a"}},
                         "raw": b"caf\xc3\xa9 \xff", "enum": Colour.RED, "path": Path("/srv/x"),
                         "nan": math.nan, "inf": -math.inf, 7: "a key that is no str", "err": ValueError("bad")})
    assert got == {"reply": {"ok": False, "n": 3, "f": 1.5, "none": None, "t": [1, 2], "s": ["a", "b"]},
                   "raw": "café \ufffd", "enum": "red", "path": "/srv/x", "nan": "nan", "inf": "-inf",
                   "7": "a key that is no str", "err": "bad"}
    assert json.loads(json.dumps(got, allow_nan=False)) == got


def test_host_text_stays_inert_text():
    text = '{"ok": true}\n\x1b[31merror: forged\x1b[0m'
    got = evidence_json({"stderr": text})
    assert got == {"stderr": text}  # kept as the host wrote it, never parsed
    line = json.dumps(got)  # as the envelope writes it: control characters escaped
    assert "\n" not in line and "\x1b" not in line and json.loads(line) == got


def test_evidence_is_bounded_and_each_cut_says_what_it_left_out():
    long = "x" * (errors.EVIDENCE_TEXT + 10)
    assert evidence_json({"diff": long})["diff"] == "x" * errors.EVIDENCE_TEXT + "... (10 more characters)"
    many = list(range(errors.EVIDENCE_ITEMS + 3))
    assert evidence_json({"files": many})["files"] == [*range(errors.EVIDENCE_ITEMS), "... (3 more)"]
    keys = {f"k{i}": i for i in range(errors.EVIDENCE_ITEMS + 2)}
    got = evidence_json({"m": keys})["m"]
    assert len(got) == errors.EVIDENCE_ITEMS + 1 and got["..."] == "2 more"
    deep: dict = {}
    node = deep
    for _ in range(errors.EVIDENCE_DEPTH + 3):
        node["in"] = {}
        node = node["in"]
    text = json.dumps(evidence_json(deep))
    assert text.count('"in"') == errors.EVIDENCE_DEPTH and "nested deeper than" in text
    # The whole walk shares one text budget: many long strings stay bounded together.
    huge = evidence_json({f"s{i}": "y" * errors.EVIDENCE_TEXT for i in range(errors.EVIDENCE_ITEMS)})
    assert sum(v.count("y") for v in huge.values()) == errors.EVIDENCE_BUDGET
    assert len(json.dumps(huge)) < errors.EVIDENCE_BUDGET + 200 * errors.EVIDENCE_ITEMS


def test_a_self_containing_mapping_ends_at_the_depth_bound():
    loop: dict = {}
    loop["self"] = loop
    assert "nested deeper than" in json.dumps(evidence_json(loop))


# ---------------------------------------------------------------- on stderr

def _said(monkeypatch, columns: str | None, **fields) -> list[str]:
    import io

    from rich.console import Console

    from ddtree_deploy.cli.app import say_error

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    error = DeployError(fields.pop("message"), **fields).to_json()["error"]
    say_error(console, error["message"], error["hint"], fields=error)
    return buffer.getvalue().splitlines()


def test_say_error_prints_the_error_then_the_line_then_the_hint(monkeypatch):
    got = _said(monkeypatch, None, message="ct200: the [bold]switch[/] failed", hint="check the disk",
                host="ct200", step="switch", changed=Changed.YES)
    assert got == ["error: ct200: the [bold]switch[/] failed",  # host text inert: no markup read
                   f"failed at switch; host changed: yes {STATUS}",
                   "hint: check the disk"]
    # No host, no step: the error and its hint only, as before.
    assert _said(monkeypatch, None, message="hosts/x.toml: bad key", hint="fix it", code="bad-input") == \
        ["error: hosts/x.toml: bad key", "hint: fix it"]


def test_the_line_breaks_between_words_at_a_known_width(monkeypatch):
    fields = dict(message="connection lost", host="ct200", step="while starting the host program",
                  changed=Changed.MAYBE)
    whole = _said(monkeypatch, None, **fields)  # a log: the line whole, for grep
    assert whole[1] == f"ct200: failed while starting the host program; host changed: maybe {STATUS}"
    narrow = _said(monkeypatch, "40", **fields)
    assert all(len(line) <= 40 for line in narrow[1:]) and len(narrow) > 2
    assert " ".join(part.strip() for part in narrow[1:]) == whole[1]
