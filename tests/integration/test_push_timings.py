"""push --json's phase timings (issue 33 s5): recorded by the transport and the agent session,
carried by the push's outcome, over a real sshd on loopback."""

from __future__ import annotations

import json

from sshd_host import ok


def test_push_json_reports_each_phase(host):
    pushed = json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]
    phases = [t["phase"] for t in pushed["timings"]]
    assert phases[:3] == ["cli start", "connect", "agent start"], phases
    # every round trip by its ops, the switch (apply+unlock) last; one per round trip counted
    assert len(phases) - 3 == pushed["round_trips"] and phases[-1] == "apply+unlock", phases
    assert all(t["seconds"] >= 0 for t in pushed["timings"])
    # "cli start" is this (test) process's age: everything after it happened within the push
    assert sum(t["seconds"] for t in pushed["timings"][1:]) <= pushed["seconds"] + 0.5
