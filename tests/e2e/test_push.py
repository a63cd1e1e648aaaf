"""push / status / rollback / snapshot pull end to end: a real sshd on loopback, real SGLang files.

Each test gets its own host (venv + site-packages from the 0.5.12.post1 wheel) on one
module-wide sshd; the series is the small real one under tests/data/deploy_series,
and GNU patch is the oracle for what the patched files must be.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ddtree_deploy.session.plan import Desired

from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.remote.ssh import SSHTransport
from ddtree_deploy.session import push
from ddtree_deploy.session.desired import desired_for
from ddtree_deploy.settings.inventory import load_host

from ddtree_deploy.sandbox import SandboxHost as TestHost  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, cli, ok  # noqa: E402
from sshd_host import DEPLOY_FAMILY as FAMILY, DEPLOY_SERIES as DATA  # noqa: E402

# The `sshd` marker: every test that takes the sshd fixture (tests/conftest.py); the plan and
# status-text tests below are pure.

TARGETS = (SPEC, UTILS, ADDED)
_names = itertools.count()


# sshd (module-wide), oracle (GNU patch's result) and host (one per test, no smoke after push):
# tests/sshd_host.py, shared with test_history.py.


# ---------------------------------------------------------------- pure: plans and status text

def _desired(**files) -> "Desired":
    from ddtree_deploy.session.plan import Desired, Target

    return Desired("fam", "f" * 64, "0.5.12.post1", "release snapshot",
                   tuple(Target(p, pr, pa, b"") for p, (pr, pa) in files.items()))


def test_plan_push_states_noop_and_drift():
    from ddtree_deploy.session.plan import FileState, classify, plan_push

    assert classify("a", "a", "b") is FileState.PRISTINE and classify("b", "a", "b") is FileState.PATCHED
    assert classify(None, None, "b") is FileState.PRISTINE  # an added file, not yet there
    assert classify(None, "a", "b") is FileState.MISSING and classify("z", "a", "b") is FileState.DRIFTED
    want = _desired(x=("a", "b"), y=(None, "c"))
    plan = plan_push("h", want, {"x": "a", "y": None})
    assert [(s.path, s.action) for s in plan.steps] == [("x", "replace"), ("y", "create")] and not plan.noop
    assert plan_push("h", want, {"x": "b", "y": "c"}).noop
    with pytest.raises(DeployError) as drift:
        plan_push("h", want, {"x": "z", "y": None})
    assert drift.value.code == "drift" and "x (drifted)" in drift.value.message
    journal = {"series": "old", "series_id": "0" * 64, "files": {"x": {"pristine": "a", "patched": "q"},
                                                               "gone": {"pristine": "g", "patched": "h"}}}
    with pytest.raises(DeployError) as other:
        plan_push("h", want, {"x": "q", "y": None, "gone": "h"}, journal)
    assert other.value.code == "other-series" and "gone, x" in other.value.message


def test_plan_rollback_refuses_foreign_edits():
    from ddtree_deploy.session.plan import plan_rollback

    manifest = {"id": "b1", "files": {"x": {"sha256": "a"}, "y": {"sha256": None}}}
    journal = {"files": {"x": {"patched": "b"}, "y": {"patched": "c"}}}
    plan = plan_rollback("h", manifest, {"x": "b", "y": "c"}, journal)
    assert [(s.path, s.action) for s in plan.steps] == [("x", "replace"), ("y", "remove")]
    assert plan_rollback("h", manifest, {"x": "a", "y": None}, journal).noop
    with pytest.raises(DeployError, match=r"x \(drifted\)"):
        plan_rollback("h", manifest, {"x": "edited", "y": "c"}, journal)


@pytest.mark.parametrize("phase, op, have, expect, mixed", [
    ("deployed", "push", "bd", "deployed fam by run r1 (2 patched)", False),
    # The files contradict the journal: MIXED, never "deployed ... (1 patched, 1 pristine)" (#22).
    ("deployed", "push", "bc", "MIXED: the journal says deployed (push run r1) but 1 of its file(s) is pristine "
                               "(not patched) (1 patched, 1 pristine): an import of SGLang may fail; rerun "
                               "`ddtree-deploy push --host h` to complete the series or `ddtree-deploy rollback "
                               "--host h` to restore the backup", True),
    ("switched", "push", "ac", "MIXED: the journal says switched (push run r1) but 2 of its file(s) are "
                               "pristine", True),
    ("switching", "push", "bc", "push run r1 was interrupted while switching files (1 patched, 1 pristine); each "
                                "file is wholly old or new; rerun `push` to complete it or `rollback` to restore the "
                                "backup", False),
    ("switching", "rollback", "bc", "rerun `rollback` to complete it", False),
    ("staged", "push", "ac", "stopped after staging, before any file changed", False),
    ("staged", "push", "bc", "MIXED: the journal says staged (push run r1) but 1 file(s) are patched and 1 pristine, "
                             "though no file should have changed yet", True),
    ("rolled-back", "rollback", "ac", "rolled back to backup b1 by run r1", False),
    ("rolled-back", "rollback", "bc", "MIXED: the journal says rolled-back (rollback run r1) but 1 of its file(s) "
                                      "is still patched", True),
])
def test_status_explains_every_phase(phase, op, have, expect, mixed):
    from ddtree_deploy.session.status import describe

    facts = {"sglang_version": "0.5.12.post1", "files": {"x": {"sha256": have[0]}, "y": {"sha256": have[1]}},
             "journal": {"op": op, "phase": phase, "run_id": "r1", "series": "fam", "backup_id": "b1",
                         "files": {"x": {"pristine": "a", "patched": "b"}, "y": {"pristine": "c", "patched": "d"}}}}
    doc = describe("h", facts, None)
    assert doc["phase"] == phase and expect in doc["explanation"], doc["explanation"]
    assert doc["mixed"] is mixed
    from ddtree_deploy.fleets.fleet import status_row

    assert status_row(doc)["phase"] == (f"MIXED ({phase})" if mixed else phase)  # the fleet table
    states = {"a": "pristine", "b": "patched", "c": "pristine", "d": "patched"}
    assert [(f["path"], f["state"]) for f in doc["files"]] == [("x", states[have[0]]), ("y", states[have[1]])]
    never = describe("h", {"files": {"x": {"sha256": "a"}}}, _desired(x=("a", "b")))
    assert never["phase"] == "never-deployed" and never["files"][0]["state"] == "pristine" and not never["mixed"]


def files_of(h: TestHost) -> dict[str, bytes | None]:
    return {p: h.read(p) for p in TARGETS}


def test_push_status_rollback(host, oracle):
    pristine, patched = oracle
    assert files_of(host) == pristine
    spec = host.file(SPEC)
    os.chown(spec, 4321, 8765)
    os.chmod(spec, 0o640)
    cache = spec.parent / "__pycache__"
    cache.mkdir()
    (cache / "spec_info.cpython-311.pyc").write_bytes(b"stale")

    dry = ok("push", "--host", host.name, "--dry-run")
    assert "would switch 3 of 3 file(s)" in dry.stdout
    for path in TARGETS:
        assert path in dry.stdout
    assert hashlib.sha256(patched[SPEC]).hexdigest()[:12] in dry.stdout
    assert files_of(host) == pristine and not host.state_dir.exists()  # a dry run touches nothing

    pushed = json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]
    assert pushed["changed"] and pushed["round_trips"] == 3 and pushed["connections"] == 1
    assert files_of(host) == patched  # byte-identical to GNU patch's result
    st = spec.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4321, 8765, 0o640)
    assert not (cache / "spec_info.cpython-311.pyc").exists()
    assert any(p.endswith("spec_info.cpython-311.pyc") for p in pushed["purged_bytecode"])

    again = ok("push", "--host", host.name)
    assert "already deployed" in again.stdout and "nothing changed" in again.stdout
    assert len(list((host.state_dir / "backups").iterdir())) == 1  # a no-op makes no backup

    status = json.loads(ok("status", "--host", host.name, "--json").stdout)["hosts"][0]
    assert status["phase"] == "deployed" and status["sglang_version"] == "0.5.12.post1"
    assert {f["path"]: f["state"] for f in status["files"]} == {p: "patched" for p in TARGETS}
    assert status["series"]["name"] == "sglang-0.5.12" and status["series"]["backup_id"] == pushed["backup_id"]
    assert [b["id"] for b in status["backups"]] == [pushed["backup_id"]] and status["lock"] is None
    human = ok("status", "--host", host.name).stdout
    assert "phase: deployed" in human and "lock: free" in human

    rolled = json.loads(ok("rollback", "--host", host.name, "--json").stdout)["hosts"][0]
    assert rolled["changed"] and rolled["backup_id"] == pushed["backup_id"] and rolled["round_trips"] == 2
    assert files_of(host) == pristine
    st = spec.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4321, 8765, 0o640)
    status = json.loads(ok("status", "--host", host.name, "--json").stdout)["hosts"][0]
    assert status["phase"] == "rolled-back"
    assert {f["path"]: f["state"] for f in status["files"]} == {p: "pristine" for p in TARGETS}
    assert "already at backup" in ok("rollback", "--host", host.name).stdout


def _family(tmp_path: Path, n_added: int) -> Path:
    """A family of ``n_added`` new files (plus the two real patches), for round-trip counts."""
    folder = tmp_path / f"fam{n_added}" / "patches" / "sglang-0.5.12"
    shutil.copytree(FAMILY, folder)
    payload = folder.parent.parent / "payload"
    payload.mkdir()
    lines = (FAMILY / "series").read_text().splitlines()[:-1]
    for i in range(n_added):
        (payload / f"m{i}.py").write_text(f"VALUE = {i}\n")
        lines.append(f"add payload/m{i}.py sglang/srt/speculative/ddtree_deploy_m{i}.py")
    (folder / "series").write_text("\n".join(lines) + "\n")
    return folder


def test_round_trips_and_connections_do_not_grow_with_files(host, tmp_path):
    counts = {}
    for n in (1, 12):
        family = _family(tmp_path, n)
        pushed = json.loads(ok("push", "--host", host.name, "--family", str(family), "--json").stdout)["hosts"][0]
        assert len(pushed["plan"]["files"]) == n + 2
        rolled = json.loads(ok("rollback", "--host", host.name, "--json").stdout)["hosts"][0]
        counts[n] = (pushed["round_trips"], pushed["connections"], rolled["round_trips"], rolled["connections"])
    assert counts[1] == counts[12] == (3, 1, 2, 1)


def test_drift_is_refused_until_snapshot_pull(host, oracle):
    pristine, patched = oracle
    edited = pristine[UTILS] + b"# a hand edit on the host\n"
    host.file(UTILS).write_bytes(edited)
    result = cli("push", "--host", host.name)
    assert result.exit_code == 1
    assert f"{UTILS} (drifted)" in result.stderr and "snapshot pull" in result.stderr
    assert SPEC not in result.stderr.split("match neither")[1].split("hint")[0]
    # Progress is in order and the step that failed says so, before the error line (issue #14).
    steps = result.stderr.split("error:")[0]
    assert f"{host.name}: lock + discover (" in steps and f"{host.name}: drift check + plan failed (" in steps
    assert (steps.index("discover (") < steps.index("resolve + check the series (") < steps.index("lock + discover (")
            < steps.index("plan failed ("))  # the series is resolved and checked before the lock
    assert files_of(host) == {**pristine, UTILS: edited}
    assert not (host.state_dir / "backups").exists() and not (host.state_dir / "lock").exists()

    as_json = cli("push", "--host", host.name, "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["error"]["code"] == "drift"

    pulled = json.loads(ok("snapshot", "pull", "--host", host.name, "--json").stdout)["hosts"][0]
    assert pulled["manifest"]["sglang_version"] == "0.5.12.post1"
    assert pulled["manifest"]["source"]["kind"] == "host"
    ok("push", "--host", host.name)
    assert host.read(UTILS) == patched[UTILS] + b"# a hand edit on the host\n"
    assert host.read(SPEC) == patched[SPEC]
    status = json.loads(ok("status", "--host", host.name, "--json").stdout)["hosts"][0]
    assert {f["state"] for f in status["files"]} == {"patched"}
    # The journal records which snapshot was the pristine side.
    assert json.loads((host.state_dir / "journal.json").read_text())["snapshot"] == f"snapshot/{host.name}"
    # Pulling a patched host would record patched files as pristine: refused.
    refused = cli("snapshot", "pull", "--host", host.name)
    assert refused.exit_code == 1 and "patched by ddtree-deploy" in refused.stderr


def test_a_series_that_does_not_apply_changes_nothing(host, oracle, tmp_path):
    pristine, _patched = oracle
    family = _family(tmp_path, 0)
    bad = family / "0002-dflash-utils-marker.patch"
    bad.write_text(bad.read_text().replace(" def is_dflash_sampling_verify_available", " def not_in_the_file"))
    result = cli("push", "--host", host.name, "--family", str(family))
    assert result.exit_code == 1 and "does not apply cleanly" in result.stderr
    assert files_of(host) == pristine
    assert not (host.state_dir / "backups").exists() and not (host.state_dir / "lock").exists()


def test_two_pushes_at_once_exactly_one_proceeds(host, oracle):
    """The first push holds the lock after its switch (its smoke would run now); a second
    push arrives then and is refused, naming the holder; the first then marks and unlocks."""
    _pristine, patched = oracle
    h = load_host(host.name)
    series = load_family(FAMILY)

    def desire(facts):
        return desired_for(series, h.name, facts)

    with push.begin_push(h, SSHTransport(h), list(TARGETS), desire, smoke=True) as first:
        assert first.locked and first.outcome.changed and (host.state_dir / "lock").is_dir()
        with pytest.raises(DeployError) as second:
            push.push(h, SSHTransport(h), list(TARGETS), desire)
        first.mark("deployed")
    assert second.value.code == "locked" and second.value.changed is Changed.NO
    assert f"(run {first.outcome.run_id}, push" in second.value.message
    assert "since 20" in second.value.message and "@" in second.value.message
    assert files_of(host) == patched and not (host.state_dir / "lock").exists()
    assert len(list((host.state_dir / "backups").iterdir())) == 1
    assert json.loads((host.state_dir / "journal.json").read_text())["phase"] == "deployed"


def test_the_series_is_resolved_before_the_lock_is_taken(host, oracle):
    """``desire`` (family, release snapshot, check, any wheel download) runs on the unlocked
    read: while it works the host holds no lock of this push, and another push may switch
    meanwhile; the first then plans from its locked read (already deployed), not its first."""
    _pristine, patched = oracle
    h = load_host(host.name)
    series = load_family(FAMILY)
    resolving, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def slow_desire(facts):
        seen["lock_while_resolving"] = (host.state_dir / "lock").exists()
        resolving.set()
        assert release.wait(30)
        return desired_for(series, h.name, facts)

    def first():
        try:
            seen["first"] = push.push(h, SSHTransport(h), list(TARGETS), slow_desire)
        except Exception as exc:  # reported below
            seen["first"] = exc

    t = threading.Thread(target=first)
    t.start()
    try:
        assert resolving.wait(30)
        other = push.push(h, SSHTransport(h), list(TARGETS), lambda facts: desired_for(series, h.name, facts))
    finally:
        release.set()
        t.join(60)
    assert seen["lock_while_resolving"] is False and other.changed
    first_outcome = seen["first"]
    assert isinstance(first_outcome, push.Outcome) and not first_outcome.changed, first_outcome
    assert "already deployed" in first_outcome.summary
    assert files_of(host) == patched and len(list((host.state_dir / "backups").iterdir())) == 1


def test_lock_of_a_live_run_needs_break_lock(host, oracle):
    _pristine, patched = oracle
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        from ddtree_deploy.hostprog.wire import boot_id, process_start
        import socket

        lock = host.state_dir / "lock"
        lock.mkdir(parents=True)
        (lock / "owner.json").write_text(json.dumps({
            "run_id": "hung-run", "holder": "alice@laptop", "command": "push", "time": "2026-11-01T10:00:00Z",
            "host": socket.gethostname(), "pid": sleeper.pid, "pid_start": process_start(sleeper.pid),
            "boot_id": boot_id()}))
        refused = cli("push", "--host", host.name)
        assert refused.exit_code == 1
        assert ("deploy lock held by alice@laptop since 2026-11-01T10:00:00Z (run hung-run, push"
                in refused.stderr), refused.stderr
        assert "--break-lock" in refused.stderr and host.read(ADDED) is None
        broke = ok("push", "--host", host.name, "--break-lock")
        assert "broke the lock of run hung-run" in broke.stderr
        assert files_of(host) == patched and not lock.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_keeps_the_newest_backups(host, sshd):
    host.inventory(keep_backups=2, smoke_levels=[])
    made = []
    for _ in range(4):
        made.append(json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]["backup_id"])
        ok("rollback", "--host", host.name)
    kept = sorted(p.name for p in (host.state_dir / "backups").iterdir())
    assert kept == made[-2:]
    assert made == sorted(made)


def _fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True, text=True).stdout
    return out.split()[1]


def test_unknown_and_changed_host_keys_are_refused(host, sshd, oracle):
    pristine, patched = oracle
    saved = sshd.known_hosts.read_text()
    try:
        sshd.known_hosts.write_text("# the user's own comment, kept when a key is trusted\n")
        refused = cli("push", "--host", host.name)
        assert refused.exit_code == 1 and "unknown host key" in refused.stderr
        assert _fingerprint(Path(f"{sshd.host_key}.pub")) in refused.stderr
        assert "--trust-new-host" in refused.stderr and files_of(host) == pristine
        ok("push", "--host", host.name, "--trust-new-host")
        assert files_of(host) == patched
        assert sshd.host_key_line().split()[2] in sshd.known_hosts.read_text()
        assert sshd.known_hosts.read_text().startswith("# the user's own comment")

        other = sshd.dir / "other_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        kind, key = Path(f"{other}.pub").read_text().split()[:2]
        sshd.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
        changed = cli("rollback", "--host", host.name, "--trust-new-host")
        assert changed.exit_code == 1 and "HOST KEY CHANGED" in changed.stderr
        assert "ssh-keygen -f" in changed.stderr and files_of(host) == patched
    finally:
        sshd.known_hosts.write_text(saved)


def test_proxyjump_through_a_jump_host(host, sshd, oracle):
    """ProxyJump from the inventory: the jump is this sshd itself (its own known_hosts entry)."""
    _pristine, patched = oracle
    path = host.inventory(smoke_levels=[])
    text = path.read_text().replace("[host]", f'jump = "{sshd.user}@127.0.0.1:{sshd.port}"\n\n[host]')
    path.write_text(text)
    pushed = json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]
    assert pushed["changed"] and files_of(host) == patched


def test_local_transport(host, oracle, tmp_path):
    pristine, patched = oracle
    (host.server.hosts_dir / f"{host.name}-local.toml").write_text(
        f'transport = "local"\n[host]\npython = "{host.python}"\nstate_dir = "{host.state_dir}"\n'
        "[smoke]\nlevels = []\n")
    pushed = json.loads(ok("push", "--host", f"{host.name}-local", "--json").stdout)["hosts"][0]
    assert pushed["changed"] and pushed["connections"] == 0 and files_of(host) == patched
    status = json.loads(ok("status", "--host", f"{host.name}-local", "--json").stdout)["hosts"][0]
    assert status["phase"] == "deployed"
    ok("rollback", "--host", f"{host.name}-local")
    assert files_of(host) == pristine


def test_several_hosts_report_separately(host, sshd, tmp_path, oracle):
    _pristine, patched = oracle
    broken = sshd.add_host(f"h{next(_names)}", tmp_path / "second", files=[SPEC, UTILS])
    broken.inventory(smoke_levels=[])
    broken.file(SPEC).write_bytes(b"# not SGLang's file\n")
    result = cli("push", "--host", host.name, "--host", broken.name, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [r["ok"] for r in doc["hosts"]] == [True, False]
    assert doc["hosts"][1]["error"]["code"] == "drift"
    assert files_of(host) == patched and broken.read(ADDED) is None


def test_another_series_deployed_needs_a_rollback_first(host, oracle, tmp_path):
    pristine, patched = oracle
    ok("push", "--host", host.name)
    newer = _family(tmp_path, 0)
    first = newer / "0001-spec-info-enum.patch"
    first.write_text(first.read_text().replace("a tree-shaped variant", "a newer tree-shaped variant"))
    refused = cli("push", "--host", host.name, "--family", str(newer))
    assert refused.exit_code == 1
    assert "series sglang-0.5.12" in refused.stderr and f"{SPEC}" in refused.stderr
    assert "rollback --host" in refused.stderr and files_of(host) == patched
    ok("rollback", "--host", host.name)
    ok("push", "--host", host.name, "--family", str(newer))
    assert b"a newer tree-shaped variant" in host.read(SPEC) and host.read(UTILS) == patched[UTILS]
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine


def test_push_runs_the_smoke_and_rolls_back_when_it_fails(host, oracle):
    """The smoke levels are real: compile passes; import fails on this host because its venv
    holds only the series' files, not SGLang's dependencies (a real ImportError)."""
    pristine, patched = oracle
    bad = cli("push", "--host", host.name, "--level", "nope")
    assert bad.exit_code == 2 and "unknown smoke level 'nope'" in bad.stderr and files_of(host) == pristine

    host.inventory(smoke_levels=["compile"])
    doc = json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]
    assert doc["ok"] and [(l["level"], l["status"]) for l in doc["smoke"]["levels"]] == [("compile", "passed")]
    assert files_of(host) == patched
    ok("rollback", "--host", host.name)

    host.inventory(smoke_levels=["import"])
    failed = cli("push", "--host", host.name, "--json")
    assert failed.exit_code == 1, failed.output
    doc = json.loads(failed.stdout)["hosts"][0]
    assert doc["ok"] is False and doc["changed"] and doc["auto_rollback"]["done"] is True
    assert files_of(host) == pristine  # rolled back automatically, sha256-verified
    assert json.loads((host.state_dir / "journal.json").read_text())["phase"] == "rolled-back"
    # The history and status say it was the push's own rollback, after which push, and why.
    push_run = doc["run_id"]
    entry = json.loads(ok("history", "--host", host.name, "--json").stdout)["hosts"][0]["entries"][0]
    assert entry["event"] == "rollback" and entry["run_id"] != push_run
    assert {k: entry["automatic"][k] for k in ("push_run", "cause", "step")} == {
        "push_run": push_run, "cause": "smoke", "step": "import"}
    assert entry["automatic"]["detail"] == doc["smoke"]["levels"][-1]["detail"][:300]
    assert f"rollback (AUTOMATIC, after push run {push_run}: smoke failed at import)" in \
        ok("history", "--host", host.name).stdout
    said = json.loads(cli("status", "--host", host.name, "--json").stdout)["hosts"][0]["explanation"]
    assert said.startswith(f"rolled back automatically after push run {push_run} (smoke failed at import) to "
                           "backup "), said

    kept = cli("push", "--host", host.name, "--no-rollback")
    assert kept.exit_code == 1 and "KEPT" in kept.stdout and files_of(host) == patched
    journal = json.loads((host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "switched" and journal["smoke"]["failed"] == "import"
    read = cli("status", "--host", host.name, "--json")
    status = json.loads(read.stdout)["hosts"][0]
    assert read.exit_code == 1 and [a["kind"] for a in status["attention"]] == ["interrupted"], read.output
    assert status["phase"] == "switched"
    assert (f"files patched by run {journal['run_id']} (3 patched); the smoke has not passed (it failed at import): "
            f"run `ddtree-deploy smoke --host {host.name}` or `ddtree-deploy rollback --host {host.name}`"
            ) == status["explanation"]
    # A re-push never marks these files deployed without running the level that failed:
    # --no-smoke leaves the host `switched` (exit 1), saying why ...
    skipped = cli("push", "--host", host.name, "--no-smoke")
    assert skipped.exit_code == 1 and "nothing to switch" in skipped.stdout, skipped.output
    assert f"was switched by run {journal['run_id']}, whose smoke failed at import" in skipped.stdout
    assert "NOT marked deployed without a smoke" in skipped.stdout
    assert json.loads((host.state_dir / "journal.json").read_text())["phase"] == "switched"
    # ... and a smoke of other levels runs the failed one too (it fails again here: kept).
    rerun = cli("push", "--host", host.name, "--level", "compile", "--no-rollback", "--json")
    doc = json.loads(rerun.stdout)["hosts"][0]
    assert rerun.exit_code == 1 and doc["outcome"] == "failed, NOT rolled back", rerun.output
    assert [(l["level"], l["status"]) for l in doc["smoke"]["levels"]] == [("compile", "passed"), ("import", "failed")]
    assert json.loads((host.state_dir / "journal.json").read_text())["phase"] == "switched"
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine


def _journal(host: TestHost) -> dict:
    return json.loads((host.state_dir / "journal.json").read_text())


def test_switched_until_the_smoke_passes(host, oracle):
    """A push that will smoke journals `switched` at its switch; only a passed smoke makes it
    `deployed`. A controller killed between the two (here: the switch alone, as push.push
    with smoke=True does before the CLI runs the levels) leaves `switched`, which status
    explains, and a rerun push (or `smoke`) finishes it."""
    pristine, patched = oracle
    host.inventory(smoke_levels=["compile"])
    h = load_host(host.name)
    series = load_family(DATA / "patches" / "sglang-0.5.12")
    desire = lambda facts: desired_for(series, h.name, facts)  # noqa: E731

    # --no-smoke: deployed directly, and it says the smoke was skipped.
    skipped = ok("push", "--host", host.name, "--no-smoke")
    assert "smoke: not run (--no-smoke); journal phase deployed" in skipped.stdout
    assert _journal(host)["phase"] == "deployed" and files_of(host) == patched
    ok("rollback", "--host", host.name)

    # The switch of a push that will smoke: `switched`, and status says what to run.
    switched = push.push(h, SSHTransport(h), list(TARGETS), desire, smoke=True)
    assert switched.changed and switched.phase == "switched" and switched.smoke_pending == switched.run_id
    assert _journal(host)["phase"] == "switched" and files_of(host) == patched
    read = cli("status", "--host", host.name, "--json")
    status = json.loads(read.stdout)["hosts"][0]
    assert read.exit_code == 1 and status["outcome"] == "needs attention", read.output  # switched: not deployed
    assert status["phase"] == "switched" and status["series"]["run_id"] == switched.run_id
    assert f"files patched by run {switched.run_id}" in status["explanation"]
    assert f"`ddtree-deploy smoke --host {host.name}`" in status["explanation"]
    human = cli("status", "--host", host.name)
    assert human.exit_code == 1 and "phase: switched: files patched by run" in human.stdout
    assert human.stdout.splitlines()[-1] == (f"{host.name}: needs attention: phase switched: files patched, not "
                                             "deployed (the smoke or the server restart has not passed)")

    # A stale controller cannot mark somebody else's deploy: compare-and-set on the run id.
    with pytest.raises(DeployError, match="not switched of run someone-else") as stale:
        push.mark(h, SSHTransport(h), "someone-else")
    assert stale.value.code == "changed" and _journal(host)["phase"] == "switched"

    # Rerun push: nothing to switch, the smoke runs again, and passes: deployed.
    backups = sorted((host.state_dir / "backups").iterdir())
    doc = json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]
    assert doc["ok"] and not doc["changed"] and doc["smoke_pending"] == switched.run_id
    assert [(l["level"], l["status"]) for l in doc["smoke"]["levels"]] == [("compile", "passed")]
    assert doc["phase"] == "deployed"
    journal = _journal(host)
    assert journal["phase"] == "deployed" and journal["run_id"] == switched.run_id
    assert sorted((host.state_dir / "backups").iterdir()) == backups  # nothing was switched again
    assert doc["backup_id"] == switched.backup_id
    assert "already deployed" in ok("push", "--host", host.name).stdout

    # `smoke` on a switched host runs the levels and marks it deployed, saying so.
    ok("rollback", "--host", host.name)
    again = push.push(h, SSHTransport(h), list(TARGETS), desire, smoke=True)
    smoked = ok("smoke", "--host", host.name)
    assert "smoke passed" in smoked.stdout
    assert f"phase switched -> deployed (run {again.run_id}): the smoke passed" in smoked.stdout
    assert _journal(host)["phase"] == "deployed"

    # rollback from `switched` works as from `deployed`.
    ok("rollback", "--host", host.name)
    push.push(h, SSHTransport(h), list(TARGETS), desire, smoke=True)
    rolled = json.loads(ok("rollback", "--host", host.name, "--json").stdout)["hosts"][0]
    assert rolled["changed"] and files_of(host) == pristine and _journal(host)["phase"] == "rolled-back"


def test_ssh_config_alias_is_honoured(host, sshd, oracle):
    """host = an ~/.ssh/config alias: HostName, Port, User and IdentityFile come from that file."""
    _pristine, patched = oracle
    config = sshd.dir / f"ssh_config_{host.name}"
    config.write_text(f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
                      f"  IdentityFile {sshd.identity}\n")
    (sshd.hosts_dir / f"{host.name}-alias.toml").write_text(
        f'[ssh]\nhost = "gpu-alias"\nknown_hosts = "{sshd.known_hosts}"\nssh_config = "{config}"\n'
        f'[host]\npython = "{host.python}"\nstate_dir = "{host.state_dir}"\n[smoke]\nlevels = []\n')
    ok("push", "--host", f"{host.name}-alias")
    assert files_of(host) == patched


def test_a_wrong_interpreter_is_named(host):
    path = host.inventory(smoke_levels=[], python="/nonexistent/bin/python")
    result = cli("status", "--host", host.name)
    assert result.exit_code == 1, result.output
    assert "cannot run the host's Python '/nonexistent/bin/python' (exit 127" in result.stderr
    assert f"set host.python in {path}" in result.stderr


def test_rollback_without_backups_or_with_an_unknown_id(host, oracle):
    pristine, _patched = oracle
    # Never pushed: nothing to roll back, and that is where a rollback leaves it (no failure).
    none = cli("rollback", "--host", host.name)
    assert none.exit_code == 0 and "nothing to roll back: no push ever switched a file" in none.stdout, none.output
    ok("push", "--host", host.name)
    # Pushed, but its backups gone: nothing to restore the files from (an error, exit 1).
    backups = host.state_dir / "backups"
    kept = backups.rename(host.state_dir.parent / "backups-aside")
    gone = cli("rollback", "--host", host.name)
    assert gone.exit_code == 1 and "no backups on the host to restore from" in gone.stderr, gone.output
    kept.rename(backups)
    unknown = cli("rollback", "--host", host.name, "--to", "20200101T000000.000000Z-nope")
    assert unknown.exit_code == 2 and "no backup '20200101T000000.000000Z-nope'; on the host: 20" in unknown.stderr
    assert not (host.state_dir / "lock").exists()  # released on the refusal, not left for EOF
    dry = ok("rollback", "--host", host.name, "--dry-run")
    assert "dry run: would restore 3 file(s)" in dry.stdout and host.read(ADDED) is not None
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine


def test_status_lists_only_the_hosts_own_files_once_they_are_known():
    """The CLI asks a host for every family's paths (it does not know the release yet);
    files of other families must not show up as 'unknown' once the host's are known."""
    from ddtree_deploy.session.status import describe

    facts = {"files": {"a.py": {"sha256": "x"}, "other_family.py": None, "present_other.py": {"sha256": "y"}},
             "journal": None}

    class _T:
        def __init__(self, path, pristine, patched):
            self.path, self.pristine, self.patched = path, pristine, patched

    class _D:
        targets = [_T("a.py", "x", "z")]

    doc = describe("h", facts, _D())
    assert [(f["path"], f["state"]) for f in doc["files"]] == [("a.py", "pristine")]
    unknown = describe("h", facts, None)  # nothing known: what is present, as unknown
    assert [(f["path"], f["state"]) for f in unknown["files"]] == [("a.py", "unknown"), ("present_other.py", "unknown")]


# ---------------------------------------------------------------- a release wheel download never holds a lock


@pytest.fixture
def uncached_release(tmp_path, monkeypatch, release_wheel, release_version, data_dir):
    """An empty wheel cache, a snapshot folder without the release's files (so the push's
    check must re-extract them from the wheel), and a real HTTP index on loopback serving
    the real wheel (tests/integration/test_releases.py's), so the push really downloads it."""
    from test_releases import _doc, _Index

    root = tmp_path / "www"
    (root / "pypi" / "sglang").mkdir(parents=True)
    (root / "packages").mkdir()
    shutil.copy(release_wheel, root / "packages" / release_wheel.name)
    doc = _doc(data_dir)
    doc["releases"][release_version] = [{
        "filename": release_wheel.name, "url": f"../../packages/{release_wheel.name}",
        "digests": {"sha256": hashlib.sha256(release_wheel.read_bytes()).hexdigest()},
        "size": release_wheel.stat().st_size, "packagetype": "bdist_wheel", "yanked": False}]
    (root / "pypi" / "sglang" / "json").write_text(json.dumps(doc))
    snapshots = tmp_path / "snapshot"
    shutil.copytree(Path(__file__).resolve().parent.parent.parent / "snapshot", snapshots,
                    ignore=shutil.ignore_patterns("files"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(snapshots))
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(tmp_path / "cache"))
    index = _Index(root)
    monkeypatch.setenv("DDTREE_DEPLOY_PYPI", index.url)
    yield index
    index.stop()


def test_a_wheel_download_happens_before_any_lock(host, oracle, uncached_release):
    """Issue #14: the release wheel the check needs is downloaded before the host's deploy
    lock is taken (Events in order: discover, the download, then lock + discover), with its
    bytes reported; a second push finds it cached (no download)."""
    from ddtree_deploy.fleets import rollout
    from ddtree_deploy.fleets.rollout import EventKind

    _pristine, patched = oracle
    h = load_host(host.name)
    seen: list[tuple[str, str, bool]] = []
    received: list[int] = []

    def record(event):
        if event.kind is EventKind.STEP:
            seen.append(("step", event.text, (host.state_dir / "lock").exists()))
        elif event.kind is EventKind.DOWNLOAD:
            received.append(event.received)
            if event.received == 0:
                seen.append(("download", event.text, (host.state_dir / "lock").exists()))

    options = rollout.PushOptions(family=str(FAMILY), smoke=False)
    report = rollout.push([h], lambda x: SSHTransport(x), options, on_event=record)
    assert report.ok, report.results[0].message
    order = [text if kind == "step" else "DOWNLOAD" for kind, text, _ in seen]
    assert order.index("discover") < order.index("DOWNLOAD") < order.index("lock + discover"), order
    assert not any(locked for kind, _, locked in seen if kind == "download")
    assert received[-1] == uncached_release_size(uncached_release) and received == sorted(received)
    assert files_of(host) == patched

    ok("rollback", "--host", host.name)
    seen.clear()
    assert rollout.push([h], lambda x: SSHTransport(x), options, on_event=record).ok
    assert not [s for s in seen if s[0] == "download"]  # cached now


def uncached_release_size(index) -> int:
    return next(p for p in (Path(index.server.RequestHandlerClass.keywords["directory"]) / "packages").iterdir()).stat().st_size


def test_a_failed_download_leaves_the_host_untouched(host, oracle, uncached_release, monkeypatch):
    """The index is unreachable: the push fails before any lock, journal or backup exists on
    the host, reported `failed, host unchanged`, and nothing claims a cached wheel."""
    pristine, _patched = oracle
    uncached_release.stop()
    r = cli("push", "--host", host.name, "--family", str(FAMILY), "--no-smoke", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["hosts"][0]["outcome"] == "failed, host unchanged" and "package index" in doc["error"]["message"]
    assert files_of(host) == pristine and not host.state_dir.exists()  # no lock, journal or backup
    assert "cached" not in r.stderr


def test_a_piped_push_names_its_download_in_one_line(host, uncached_release):
    """Not a terminal (CliRunner, CI logs): no bar, one line `downloading <wheel> (N MiB)`."""
    r = cli("push", "--host", host.name, "--family", str(FAMILY), "--no-smoke")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("downloading ")]
    size = uncached_release_size(uncached_release)
    assert lines == [f"downloading sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl ({size / (1 << 20):.1f} MiB)"]


def test_a_dry_run_checks_the_smoke_table_as_a_push_does(host, oracle):
    """Issue #14: `push --dry-run` validated nothing of `[smoke]`; now it gives the real push's
    one-line error (exit 2) and touches nothing; --no-smoke skips the table in both."""
    pristine, _patched = oracle
    host.inventory(smoke_levels=["compile", "launch"])  # launch without a [smoke.launch] table
    real, dry = cli("push", "--host", host.name), cli("push", "--host", host.name, "--dry-run")
    assert real.exit_code == dry.exit_code == 2, (real.output, dry.output)
    line = [ln for ln in real.stderr.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "smoke.levels" in line[0] and "[smoke.launch]" in line[0]
    assert [ln for ln in dry.stderr.splitlines() if ln.startswith("error:")] == line
    assert files_of(host) == pristine and not host.state_dir.exists()
    assert "would switch 3 of 3" in ok("push", "--host", host.name, "--dry-run", "--no-smoke").stdout


# ---------------------------------------------------------------- push --diff


def _apply_with_gnu_patch(tmp_path: Path, files: dict[str, bytes | None], diff: str) -> dict[str, bytes | None]:
    """GNU patch, the oracle: apply ``diff`` to a copy of ``files``; return the result."""
    root = tmp_path / "gnu"
    for path, data in files.items():
        if data is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
    root.mkdir(exist_ok=True)
    (tmp_path / "d.diff").write_text(diff)
    subprocess.run(["patch", "-p1", "--forward", "--batch", "-s", "-d", str(root), "-i", str(tmp_path / "d.diff")],
                   check=True)
    return {p: (root / p).read_bytes() if (root / p).exists() else None for p in files}


def test_push_diff_shows_what_each_file_gets(host, oracle, tmp_path):
    """`push --dry-run --diff` (as `ansible-playbook --check --diff`): per file, the unified diff
    from the host's current file to the patched one; GNU patch applying it to the host's
    files gives the exact bytes a push writes. `push --diff` shows the same and switches;
    once deployed there is nothing to show."""
    pristine, patched = oracle
    host.file(UTILS).write_bytes(pristine[UTILS])  # the host's own bytes are the diff's "from" side
    dry = json.loads(ok("push", "--host", host.name, "--dry-run", "--diff", "--json").stdout)["hosts"][0]
    text = dry["diff"]
    assert f"--- a/{SPEC}\n+++ b/{SPEC}\n" in text and f"--- /dev/null\n+++ b/{ADDED}\n" in text
    assert _apply_with_gnu_patch(tmp_path, files_of(host), text) == patched
    assert files_of(host) == pristine and not host.state_dir.exists()

    human = ok("push", "--host", host.name, "--dry-run", "--diff").stdout
    assert f"--- a/{SPEC}" in human and f"+++ b/{ADDED}" in human and "@@ -" in human
    assert "diff" not in json.loads(ok("push", "--host", host.name, "--dry-run", "--json").stdout)["hosts"][0]

    real = json.loads(ok("push", "--host", host.name, "--diff", "--json").stdout)["hosts"][0]
    assert real["changed"] and real["diff"] == text and files_of(host) == patched
    assert json.loads(ok("push", "--host", host.name, "--diff", "--json").stdout)["hosts"][0]["diff"] == ""


def test_snapshot_release_says_cached_only_when_it_was(uncached_release, tmp_path):
    """`snapshot release` downloads the wheel (one line, piped) and says so; the second run
    finds it in the cache and says that instead."""
    first = cli("snapshot", "release", "0.5.12.post1", "--name", "fresh")
    assert first.exit_code == 0, first.output
    assert "downloading sglang-0.5.12.post1-" in first.stderr and "just downloaded and verified" in first.stderr
    assert "in the cache" not in first.stderr
    again = cli("snapshot", "release", "0.5.12.post1", "--name", "fresh")
    assert again.exit_code == 0 and "in the cache, verified" in again.stderr and "downloading" not in again.stderr
