"""A real failure's fields, end to end (issue 33, section 2, "Failures as values"): the
``--json`` error carries the host, the step, whether the host changed and the evidence, and
stderr says them in one line under the ``error:`` line (cli/failure_line.py).

Real parts: a real sshd on loopback, the small real series (tests/sshd_host.py); the
failure is a real refusal: a pushed host with one file edited by hand refuses the next
push at its drift check, before anything is written (the file's bytes are read back).
The pure parts (every changed value, host or none, step or none): tests/unit/test_failure_line.py.
"""

from __future__ import annotations

from envelope_check import check_envelope  # noqa: E402
from sshd_host import UTILS, cli, ok  # noqa: E402

EDIT = b"# edited by hand on the host\n"


def test_a_drift_refusal_carries_host_step_changed_and_evidence(host):
    ok("push", "--host", host.name)
    edited = host.read(UTILS) + EDIT
    host.file(UTILS).write_bytes(edited)

    result = cli("push", "--host", host.name, "--json")
    assert result.exit_code == 1, result.output
    doc = check_envelope(result.stdout, 1, "push")
    error = doc["error"]
    assert (error["code"], error["host"], error["step"], error["changed"]) == ("drift", host.name, "drift check", "no")
    assert error["evidence"] == {"files": {UTILS: "drifted"}}
    assert error["message"].startswith(f"{host.name}: 1 file(s) match neither")
    assert doc["hosts"][0]["error"] == error  # the host's entry holds the same object
    assert host.read(UTILS) == edited  # refused before any write: "no" is true

    lines = result.stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert lines[at] == f"error: {error['message']}"
    # The message starts with the host: the line under it does not name it again.
    assert lines[at + 1] == "failed at drift check; host unchanged"
    assert lines[at + 2] == f"hint: {error['hint']}"
