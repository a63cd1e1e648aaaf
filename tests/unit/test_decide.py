"""The push's decide stage, pure (issue #33, section 2): the facts read under the lock ->
a Decision, on facts written by hand, no host. Today's journal-phase logic: a run killed
while ``switching`` is completed, one left ``switched`` is smoked again (or marked deployed
without a smoke unless a level failed), a rollback over a stopped run completes its journal."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.session.decide import Decision, decide_push, decide_rollback, mark_request
from ddtree_deploy.session.plan import Desired, Target
from ddtree_deploy.settings.inventory import Host

HOST = Host("h", "python3", None, state_dir="/tmp/state", keep_backups=3)
SID = "f" * 64
WANT = Desired("fam", SID, "0.5.12", "release snapshot",
               (Target("x.py", "a", "b", b"new x\n", original=b"old x\n"), Target("y.py", None, "c", b"new y\n")))
NAME = f"fam ({SID[:12]})"


def facts(x: str | None, y: str | None, journal: dict | None = None, backups: list | None = None, **data) -> dict:
    files = {"x.py": {"sha256": x} if x else None, "y.py": {"sha256": y} if y else None}
    for path, raw in data.items():
        files[path.replace("_", ".")]["data"] = base64.b64encode(raw).decode()
    return {"sglang_version": "0.5.12", "files": files, "journal": journal, "backups": backups or [],
            "state_home": "/tmp/state"}


def test_a_pristine_host_is_switched_and_the_decision_is_frozen():
    d = decide_push(HOST, WANT, facts("a", None), "run1", smoke=True, dry_run=False)
    assert isinstance(d, Decision) and [s.path for s in d.plan.changes] == ["x.py", "y.py"]
    assert d.step == "back up + stage + switch 2 file(s)"
    assert d.dry == "dry run: would switch 2 of 2 file(s); nothing changed"
    assert d.done == f"pushed {NAME}: 2 file(s) switched, backup {{backup_id}}"
    assert d.apply is not None and (d.apply["op"], d.apply["kind"], d.apply["run_id"], d.apply["final_phase"]) == \
        ("apply", "push", "run1", "switched")
    assert [f["path"] for f in d.apply["files"]] == ["x.py", "y.py"] and d.apply["keep_backups"] == 3
    assert (d.complete, d.pending, d.noop_request, d.earlier, d.diff) == (None, None, None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.noop = "x"  # type: ignore[misc]
    no_smoke = decide_push(HOST, WANT, facts("a", None), "run1", smoke=False, dry_run=False)
    assert no_smoke.apply is not None and no_smoke.apply["final_phase"] == "deployed"


def test_a_deployed_host_has_nothing_to_switch():
    journal = {"phase": "deployed", "series_id": SID, "run_id": "r0", "files": {}}
    d = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=True, dry_run=False)
    assert d.plan.noop and d.apply is None and d.noop == f"already deployed: {NAME}; nothing changed"
    assert (d.complete, d.pending, d.noop_request) == (None, None, None)


def test_a_run_killed_while_switching_is_completed():
    journal = {"phase": "switching", "series_id": SID, "run_id": "r0", "files": {}}
    stopped = f"run r0 of {NAME} stopped after switching every file"
    smoked = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=True, dry_run=False)
    assert smoked.complete == mark_request("r0", "switched", expect="switching")
    assert smoked.noop == f"{stopped}: journal completed (switched); its smoke runs now"
    # The completed run is the one whose smoke runs now: the switch stage keeps the lock for it.
    assert smoked.earlier is not None and smoked.earlier["phase"] == "switched" and smoked.pending == smoked.earlier
    plain = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=False, dry_run=False)
    assert plain.complete == mark_request("r0", "deployed", expect="switching")
    assert plain.noop == f"{stopped}: journal completed and marked deployed without a smoke"
    dry = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=False, dry_run=True)
    assert dry.noop == f"dry run: {stopped}; a push would complete its journal; nothing changed"


def test_a_run_left_switched_is_smoked_again_or_marked():
    journal = {"phase": "switched", "series_id": SID, "run_id": "r0", "backup_id": "b0", "files": {}}
    smoked = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=True, dry_run=False)
    assert smoked.pending == journal and smoked.earlier == journal and smoked.noop_request is None
    assert smoked.noop == f"nothing to switch: {NAME} was switched by run r0, whose smoke never passed"
    plain = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=False, dry_run=False)
    assert plain.pending is None and plain.noop_request == mark_request("r0", "deployed")
    assert plain.noop.endswith("whose smoke never passed; marked deployed without a smoke")


def test_a_run_whose_smoke_failed_is_never_marked_without_one():
    journal = {"phase": "switched", "series_id": SID, "run_id": "r0", "smoke": {"failed": "import"}, "files": {}}
    d = decide_push(HOST, WANT, facts("b", "c", journal), "run1", smoke=False, dry_run=False)
    assert d.noop_request is None
    assert d.noop == (f"nothing to switch: {NAME} was switched by run r0, whose smoke failed at import; NOT marked "
                      "deployed without a smoke: run `ddtree-deploy smoke --host h` or `ddtree-deploy rollback "
                      "--host h`")


def test_a_drift_refusal_is_unchanged_and_carries_its_diff():
    with pytest.raises(DeployError) as caught:
        decide_push(HOST, WANT, facts("z", None, x_py=b"edited x\n"), "run1", smoke=False, dry_run=False, diff=True)
    exc = caught.value
    assert (exc.code, exc.host, exc.step, exc.changed) == ("drift", "h", "drift check", Changed.NO)
    assert exc.evidence["files"] == {"x.py": "drifted"}
    assert "-old x\n+edited x\n" in exc.evidence["diff"]
    with pytest.raises(DeployError) as plain:
        decide_push(HOST, WANT, facts("z", None), "run1", smoke=False, dry_run=False)
    assert plain.value.message == exc.message and "diff" not in plain.value.evidence


def test_a_symlinked_target_is_refused_before_the_plan():
    unsafe = facts("a", None)
    unsafe["files"]["x.py"] = {"unsafe": "x.py is a symlink"}
    with pytest.raises(DeployError) as caught:
        decide_push(HOST, WANT, unsafe, "run1", smoke=False, dry_run=False)
    assert caught.value.message == "h: 1 target file(s) cannot be replaced safely: x.py is a symlink"
    assert (caught.value.code, caught.value.changed) == ("unsafe-file", Changed.NO)


def test_push_diff_shows_what_the_plan_changes():
    d = decide_push(HOST, WANT, facts("a", None, x_py=b"old x\n"), "run1", smoke=False, dry_run=True, diff=True)
    assert d.diff == ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old x\n+new x\n"
                      "--- /dev/null\n+++ b/y.py\n@@ -0,0 +1 @@\n+new y\n")


BACKUP = {"id": "20260101T000000Z-b1", "files": {"x.py": {"sha256": "a", "mode": 0o644}, "y.py": {"sha256": None}}}


def test_a_rollback_restores_the_newest_backup():
    journal = {"phase": "deployed", "series_id": SID, "run_id": "r0",
               "files": {"x.py": {"pristine": "a", "patched": "b"}, "y.py": {"pristine": None, "patched": "c"}}}
    d = decide_rollback(HOST, facts("b", "c", journal, [BACKUP]), "run2", automatic={"cause": "smoke"})
    assert d.apply is not None and (d.apply["kind"], d.apply["from_backup"], d.apply["final_phase"]) == \
        ("rollback", BACKUP["id"], "rolled-back")
    assert d.apply["automatic"] == {"cause": "smoke"} and d.apply["journal"]["automatic"] == {"cause": "smoke"}
    assert "phase" not in d.apply["journal"]
    assert d.done == f"rolled back 2 file(s) to backup {BACKUP['id']} (sha256 verified)"


def test_a_rollback_completes_a_run_stopped_while_switching():
    journal = {"phase": "switching", "run_id": "r0", "files": {"x.py": {"pristine": "a", "patched": "b"}}}
    d = decide_rollback(HOST, facts("a", None, journal, [BACKUP]), "run2")
    assert d.plan.noop and d.complete == mark_request("r0", "rolled-back", expect="switching")
    assert d.noop == (f"completed: every file is at backup {BACKUP['id']} (run r0 stopped while switching); "
                      "journal marked rolled-back")


def test_a_rollback_on_a_host_never_pushed_is_a_noop_and_a_missing_backup_is_refused():
    d = decide_rollback(HOST, facts("a", None), "run2")
    assert d.plan.noop and d.apply is None and d.noop.startswith("nothing to roll back: no push ever switched")
    with pytest.raises(DeployError) as caught:
        decide_rollback(HOST, facts("a", None, backups=[BACKUP]), "run2", to="nope")
    assert caught.value.exit_code == 2
    assert caught.value.message == f"h: no backup 'nope'; on the host: {BACKUP['id']}"
