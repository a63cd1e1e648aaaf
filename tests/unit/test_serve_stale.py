"""Whether a serving process runs the bytes the files hold now, by content (serve_plan.loaded_now
over the agent's `switches` record): the cases the sandbox run (tests/e2e/test_serve_ssh.py) does
not reach, and the agent's record itself from a real history file.

A server that started before the last change of the files loaded, for each file, the `from` of
the first switch of that file after its start (a file no switch touched is as it was); it is
current when those are the bytes now. Where the record cannot vouch for that, the answer is
None with the reason, and `status` falls back to the times.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ddtree_deploy.hostprog.agent import Agent
from ddtree_deploy.hostprog.history import HISTORY, HISTORY_OLD
from ddtree_deploy.hostprog.wire import iso_seconds
from ddtree_deploy.serve import plan as serve_plan
from ddtree_deploy.serve.plan import loaded_now

A, B, C = "a" * 64, "b" * 64, "c" * 64
P, Q = "sglang/x.py", "sglang/y.py"


def switch(began, files, outcome="ok", ended=None):
    return {"time": "T", "event": "push", "run_id": "r", "outcome": outcome, "began": began,
            "ended": began + 0.5 if ended is None else ended, "files": files}


def record(current, switches=(), before=None, complete=0.0):
    return {"current": current, "switches": list(switches), "before": before or {}, "complete_since": complete}


def now(sha, ctime):
    return {"sha256": sha, "ctime": ctime}


def test_undone_switches_are_current_and_a_remaining_change_is_stale():
    undone = record({P: now(A, 30.5), Q: now(C, 5)}, [switch(10, {P: {"from": A, "to": B}}),
                                                     switch(20, {P: {"from": B, "to": C}}),
                                                     switch(30, {P: {"from": C, "to": A}})])
    assert loaded_now(5.0, undone) == (True, "")
    assert loaded_now(25.0, undone) == (False, "")  # it loaded C (the from of the switch at 30)
    assert loaded_now(31.0, undone) == (True, "")  # started after every change
    added = record({P: None}, [switch(10, {P: {"from": None, "to": B}}), switch(20, {P: {"from": B, "to": None}})])
    assert loaded_now(5.0, added) == (True, "")  # a module added then removed again


def test_a_switch_switched_back_in_its_op_changes_nothing():
    back = record({P: now(A, 10.2)}, [switch(10, {P: {"from": A, "to": B}}, outcome="failed-unchanged")])
    assert loaded_now(5.0, back) == (True, "")


@pytest.mark.parametrize("case, why", [
    (record({P: now(A, 30)}, complete=10.0), "no longer reaches back to its start"),
    (record({P: now(A, 30)}, complete=None), "no longer reaches back to its start"),
    (record({P: now(B, 10.2)}, [switch(4.9, {P: {"from": A, "to": B}}, ended=5.2)]), "it started during the switch"),
    (record({P: now(B, 10.2)}, [switch(10, {P: {"from": A, "to": B}}, outcome="switch-mixed")]), "failed part-way"),
    # changed after the start (its ctime) and no recorded switch did it: a killed agent, an edit
    (record({P: now(B, 10.2)}), "no switch in the history did that"),
    # the bytes now are not where the recorded switches left them
    (record({P: now(C, 10.2)}, [switch(10, {P: {"from": A, "to": B}})]), "outside the switches"),
    # the switches do not chain (B -> ... then from C)
    (record({P: now(A, 20.2)}, [switch(10, {P: {"from": A, "to": B}}), switch(20, {P: {"from": C, "to": A}})]),
     "outside the switches"),
    # the version before the start is not the first switch's from
    (record({P: now(B, 10.2)}, [switch(10, {P: {"from": A, "to": B}})], before={P: C}), "outside the switches"),
    (record({P: now(B, 10.2)}, [dict(switch(10, {P: {"from": A, "to": B}}), began=None, ended=None)]),
     "without the times of its renames"),
    ({"error": "h: switches: no"}, "could not be read"),
])
def test_the_record_that_cannot_tell_says_why(case, why):
    verdict, reason = loaded_now(5.0, case)
    assert verdict is None and why in reason, reason


def test_serving_says_which_rule_decided():
    answer = {"processes": [{"pid": 7, "started": 5.0, "started_iso": "S", "before_files": True, "cmdline": ["p"]}],
              "files_changed_iso": "F"}
    assert serve_plan.record_since(answer) == 5.0
    by_content = serve_plan.serving(answer, "h", record=record({P: now(A, 30.5)}, [
        switch(10, {P: {"from": A, "to": B}}), switch(30, {P: {"from": B, "to": A}})]))
    assert by_content["state"] == "current" and by_content["processes"][0]["decided_by"] == "content"
    assert "the files hold again the bytes it started with" in by_content["explanation"]
    assert "since undone" in serve_plan.process_line(by_content["processes"][0])
    by_time = serve_plan.serving(answer, "h", record=record({P: now(A, 30)}, complete=None))
    assert by_time["state"] == "stale" and by_time["processes"][0]["decided_by"] == "time"
    assert "taken as older by the times alone: the host's history no longer reaches back" in by_time["explanation"]
    assert "BEFORE the last switch" in serve_plan.process_line(by_time["processes"][0])


def test_the_agent_reads_its_record_from_the_history(tmp_path):
    """op_switches over real history lines (written by the agent's own record): the lines of
    switches that ended before ``since`` become ``before``, later ones are listed, an older
    agent's line (no rename times) is listed by its time, and the history is complete from
    the start in a folder the agent made, from history.1.jsonl's first line after a rotation."""
    site, state = tmp_path / "site", tmp_path / "state"
    (site / "sglang").mkdir(parents=True)
    (site / P).write_bytes(b"now")
    agent = Agent(str(state))
    agent.package.root = str(site)
    agent.folder.check_state_dir(create=True)  # the marker: made by this agent
    agent.history.record("push", outcome="ok", files={P: {"from": A, "to": B}}, switch_began=100.0, switch_ended=100.5)
    agent.history.record("push", outcome="failed-unchanged", files={Q: {"from": A, "to": B}}, switch_began=None,
                 switch_ended=None)  # no rename began: nothing changed
    agent.history.record("rollback", outcome="ok", files={P: {"from": B, "to": C}}, switch_began=200.0, switch_ended=200.5)
    with open(state / HISTORY, "a") as fh:  # an older agent's line: its time only
        fh.write(json.dumps({"time": "2026-01-01T00:00:00Z", "event": "push", "outcome": "ok",
                             "files": {P: {"from": C, "to": A}}}) + "\n")
    got = agent.history.op_switches({"since": 150.0, "paths": [P]})
    assert got["before"] == {P: B} and got["complete_since"] == 0.0
    assert [(w["event"], w["began"]) for w in got["switches"]] == [("rollback", 200.0), ("push", None)]
    assert got["current"][P]["sha256"] == hashlib.sha256(b"now").hexdigest()
    assert got["current"][P]["ctime"] == os.stat(site / P).st_ctime

    os.rename(state / HISTORY, state / HISTORY_OLD)  # as the rotation does
    first = json.loads((state / HISTORY_OLD).read_text().splitlines()[0])["time"]
    got = agent.history.op_switches({"since": 150.0, "paths": [P]})
    assert got["complete_since"] == iso_seconds(first) + 1
