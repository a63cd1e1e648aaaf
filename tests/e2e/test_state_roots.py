"""Several SGLang installs on one host, one state folder (issue 28, item 1).

Two real venvs on one sandbox host (SGLang's real files from the release wheels), one real
sshd, and two host files that differ only in ``[host] python``, sharing one ``state_dir``
as every file ``hosts init`` writes does. Each install's state (lock, journal, backups,
history) is its own (ddtree_deploy/hostprog/roots.py): pushes and rollbacks interleaved
never touch the other venv's files nor its state, ``status`` and ``rollback`` of each are
right, a rollback never restores the other venv's backup (the same release in both), a
push holding one install's lock neither blocks nor fences the other's, and a state folder
in the layout every earlier version wrote keeps working.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddtree_deploy.hostprog.roots import key_of
from ddtree_deploy.remote.ssh import SSHTransport
from ddtree_deploy.sandbox import SandboxHost, make_python_env
from ddtree_deploy.session import push
from ddtree_deploy.session.desired import Want
from ddtree_deploy.settings.inventory import load_host

from envelope_check import check_envelope  # noqa: E402
from sshd_host import ADDED, DEPLOY_SERIES, SPEC, UTILS, cli, ok  # noqa: E402

TARGETS = (SPEC, UTILS, ADDED)


@pytest.fixture
def series(tmp_path, monkeypatch) -> Path:
    """The small real series for 0.5.12 (tests/data/deploy_series) and the same two patches as a
    family for 0.5.13 (they apply to 0.5.13's files at an offset): one family per release."""
    root = tmp_path / "series"
    shutil.copytree(DEPLOY_SERIES, root)
    fam = root / "patches" / "sglang-0.5.13"
    shutil.copytree(root / "patches" / "sglang-0.5.12", fam)
    toml = (fam / "family.toml").read_text()
    (fam / "family.toml").write_text(toml.replace('">=0.5.12,<0.5.13"', '">=0.5.13,<0.5.14"'))
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(root / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "hosts"))
    return root


def two_venvs(sshd, tmp_path, prod="0.5.12.post1", canary="0.5.13", state=None):
    """Two venvs on one machine, one state folder: hosts/prod.toml and hosts/canary.toml
    differ only in [host] python."""
    state = state or tmp_path / "shared-state"
    hosts = {}
    for name, version in (("prod", prod), ("canary", canary)):
        python, site = make_python_env(tmp_path / name, [SPEC, UTILS], version=version)
        h = SandboxHost(name=name, server=sshd, python=python, site=site, state_dir=state)
        h.inventory(tmp_path / "hosts", smoke_levels=[])
        hosts[name] = h
    return hosts["prod"], hosts["canary"]


def files(h: SandboxHost) -> dict:
    return {p: h.read(p) for p in TARGETS}


def status(h: SandboxHost, exit_code: int = 0) -> dict:
    """`status --json` of one install (exit 0 unless said: 1 when it needs attention), its
    envelope checked against docs/json-schema.json."""
    result = cli("status", "--host", h.name, "--json")
    assert result.exit_code == exit_code, result.output
    return check_envelope(result.stdout, result.exit_code, "status")["hosts"][0]


def states(doc: dict) -> dict:
    return {f["path"]: f["state"] for f in doc["files"]}


def folder_of(h: SandboxHost) -> Path:
    """Where an install's state lives: the top of the state folder for the first install that
    took a lock there, roots/<key> for the others."""
    top = json.loads((h.state_dir / "root.json").read_text())
    return h.state_dir if top["key"] == key_of(str(h.site)) else h.state_dir / "roots" / key_of(str(h.site))


def history(h: SandboxHost) -> list[dict]:
    return json.loads(ok("history", "--host", h.name, "--json").stdout)["hosts"][0]["entries"]


def test_two_releases_in_one_state_folder_keep_apart(sshd, tmp_path, series):
    """The issue's host: a 0.5.12 production venv and a 0.5.13 canary venv. Before, after the
    canary's push `status` of prod said `deployed sglang-0.5.13 ... (6 drifted, 1 missing)` and
    its rollback refused `7 file(s) match neither backup`."""
    prod, canary = two_venvs(sshd, tmp_path)
    pristine = {"prod": files(prod), "canary": files(canary)}

    ok("push", "--host", "prod")
    ok("push", "--host", "canary")
    patched = {"prod": files(prod), "canary": files(canary)}
    assert patched["prod"] != pristine["prod"] and patched["canary"] != pristine["canary"]
    for h, family in ((prod, "sglang-0.5.12"), (canary, "sglang-0.5.13")):
        doc = status(h)
        assert doc["phase"] == "deployed" and doc["series"]["name"] == family, doc["explanation"]
        assert states(doc) == dict.fromkeys(TARGETS, "patched") and not doc["mixed"]
        # Each lists the other install, with its own root, interpreter and phase.
        others = [i for i in doc["installs"] if not i["this"]]
        other = canary if h is prod else prod
        assert [(i["package_root"], i["python"], i["phase"]) for i in others] == \
            [(str(other.site.resolve()), str(other.python), "deployed")]
    text = ok("status", "--host", "prod").stdout
    assert "1 other install(s) keep their own state" in text and str(canary.site.resolve()) in text

    # Interleaved: prod rolls back, canary is untouched; prod again; canary rolls back; ...
    assert "rolled back 3 file(s)" in ok("rollback", "--host", "prod").stdout
    assert files(prod) == pristine["prod"] and files(canary) == patched["canary"]
    assert status(canary)["phase"] == "deployed" and status(prod)["phase"] == "rolled-back"
    ok("push", "--host", "prod")
    ok("rollback", "--host", "canary")
    assert files(prod) == patched["prod"] and files(canary) == pristine["canary"]
    assert status(prod)["phase"] == "deployed" and states(status(canary)) == dict.fromkeys(TARGETS, "pristine")
    ok("rollback", "--host", "prod")
    assert files(prod) == pristine["prod"] and files(canary) == pristine["canary"]

    # Every record names its install: journal, backups, history, and each history is its own.
    for h in (prod, canary):
        home = folder_of(h)
        journal = json.loads((home / "journal.json").read_text())
        assert (journal["package_root"], journal["python"]) == (str(h.site.resolve()), str(h.python))
        for manifest in home.glob("backups/*/manifest.json"):
            assert json.loads(manifest.read_text())["package_root"] == str(h.site.resolve())
        entries = history(h)
        assert entries and {e["package_root"] for e in entries} == {str(h.site.resolve())}
        assert {e.get("python") for e in entries} == {str(h.python)}
    assert [e["event"] for e in history(prod)] == ["rollback", "push", "rollback", "push"]
    assert [e["event"] for e in history(canary)] == ["rollback", "push"]
    assert folder_of(prod) != folder_of(canary)


def test_the_same_release_in_both_never_restores_the_other_backup(sshd, tmp_path, series):
    """Both venvs on 0.5.12.post1: identical pristine files, so one install's backup would
    verify on the other; a rollback must still only ever see its own."""
    prod, canary = two_venvs(sshd, tmp_path, canary="0.5.12.post1")
    pristine = files(prod)
    assert files(canary) == pristine
    first = json.loads(ok("push", "--host", "prod", "--json").stdout)["hosts"][0]["backup_id"]
    second = json.loads(ok("push", "--host", "canary", "--json").stdout)["hosts"][0]["backup_id"]
    assert [b["id"] for b in status(prod)["backups"]] == [first]
    assert [b["id"] for b in status(canary)["backups"]] == [second]
    # Another install's backup is not there for this one, not even by id.
    refused = cli("rollback", "--host", "prod", "--to", second)
    assert refused.exit_code == 2 and f"no backup {second!r}" in refused.stderr, refused.output
    rolled = json.loads(ok("rollback", "--host", "canary", "--json").stdout)["hosts"][0]
    assert rolled["backup_id"] == second and files(canary) == pristine
    assert files(prod) != pristine and status(prod)["phase"] == "deployed"
    assert json.loads(ok("rollback", "--host", "prod", "--json").stdout)["hosts"][0]["backup_id"] == first
    assert files(prod) == pristine
    # The canary's state never named the production's backup, and the reverse.
    assert not (folder_of(canary) / "backups" / first).exists()
    assert not (folder_of(prod) / "backups" / second).exists()


def test_one_install_s_lock_neither_blocks_nor_fences_the_other(sshd, tmp_path, series):
    """A push holding prod's deploy lock (its agent alive, between switch and smoke) does not
    block the canary's push, its lock release, or its rollback; prod's own second push is
    refused; a forced release on the canary leaves prod's run holding its lock."""
    prod, canary = two_venvs(sshd, tmp_path)
    host = load_host("prod")
    want = Want(None)
    held = push.begin_push(host, SSHTransport(host), want.paths, lambda facts: want.resolve("prod", facts),
                             smoke=True)
    try:
        assert held.locked and status(prod)["lock"]["run_id"] == held.outcome.run_id
        assert status(prod)["lock"]["package_root"] == str(prod.site.resolve())
        refused = cli("push", "--host", "prod")
        assert refused.exit_code == 1 and "deploy lock held by" in refused.stderr
        ok("push", "--host", "canary")  # not blocked
        assert status(canary)["lock"] is None and status(canary)["phase"] == "deployed"
        released = json.loads(ok("lock", "release", "--host", "canary", "--force", "--json").stdout)["hosts"][0]
        assert released["released"] is False  # nothing held there: prod's lock is not the canary's
        ok("rollback", "--host", "canary")
        held.mark("deployed")  # prod's run was never fenced: it still owns its lock
    finally:
        held.close()
    assert status(prod)["phase"] == "deployed" and status(canary)["phase"] == "rolled-back"
    marks = [e for e in history(prod) if e["event"] == "mark"]
    assert marks and marks[0]["marked_run"] == held.outcome.run_id


@pytest.mark.parametrize("command", ["push", "rollback"])
def test_an_agent_killed_mid_switch_of_the_second_install_is_completed_by_the_rerun(sshd, tmp_path, series,
                                                                                   monkeypatch, command):
    """The invariants hold in a folder under roots/ as at the top: the canary's agent killed
    after its first rename leaves every file wholly old or new, the journal `switching`,
    `status` explaining it; production untouched; the rerun completes and sweeps what the
    killed run left."""
    from ddtree_deploy.base import hooks

    prod, canary = two_venvs(sshd, tmp_path, canary="0.5.12.post1")
    ok("push", "--host", "prod")
    pristine = files(canary)
    if command == "rollback":
        ok("push", "--host", "canary")
    before_prod, before = files(prod), files(canary)
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"exit_after_renames": 1}))
    assert cli(command, "--host", "canary").exit_code == 1
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
    assert folder_of(canary) == canary.state_dir / "roots" / key_of(str(canary.site))
    doc = status(canary, exit_code=1)  # a run not completed needs attention
    assert doc["phase"] == "switching" and "interrupted while switching" in doc["explanation"]
    assert doc["outcome"] == "needs attention" and "interrupted" in [a["kind"] for a in doc["attention"]]
    assert sorted(states(doc).values()).count("drifted") == 0 and files(canary) != before
    assert files(prod) == before_prod and status(prod)["phase"] == "deployed"
    ok(command, "--host", "canary")
    assert status(canary)["phase"] == ("deployed" if command == "push" else "rolled-back")
    assert files(canary) == (before_prod if command == "push" else pristine)
    assert not [p for p in tmp_path.rglob("*") if ".ddtree-tmp-" in p.name]
    assert files(prod) == before_prod


def old_layout(h: SandboxHost) -> None:
    """What every version before this layout left in a state folder: the same files at its
    top, without root.json and without the install's root and interpreter in the journal,
    the backups' manifests, the lock and the history (their readers never needed them)."""
    (h.state_dir / "root.json").unlink()
    strip = ("package_root", "python")
    for path in [h.state_dir / "journal.json", *h.state_dir.glob("backups/*/manifest.json")]:
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in doc.items() if k not in strip}, indent=1, sort_keys=True))
    lines = (h.state_dir / "history.jsonl").read_text().splitlines()
    (h.state_dir / "history.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in json.loads(line).items() if k not in strip}) + "\n" for line in lines))
    assert sorted(p.name for p in h.state_dir.iterdir()) == [
        ".ddtree-deploy-state", "backups", "history.jsonl", "journal.json", "lock.guard", "staging"]


@pytest.mark.parametrize("canary_release", ["0.5.13", "0.5.12.post1"])
def test_a_state_folder_of_the_earlier_layout_keeps_working(sshd, tmp_path, series, canary_release):
    """Production was deployed before this layout existed (its state at the folder's top);
    a canary venv is added since, with the same state folder. The canary never takes the old
    state (another release; or the same release, whose files do not agree with the journal's
    `deployed`), even when it acts first; production reads its old state, rolls back from its
    old backup and claims the folder's top on its first locked command."""
    prod, canary = two_venvs(sshd, tmp_path, canary=canary_release)
    pristine = {"prod": files(prod), "canary": files(canary)}
    old = json.loads(ok("push", "--host", "prod", "--json").stdout)["hosts"][0]["backup_id"]
    patched = files(prod)
    old_layout(prod)

    assert status(canary)["phase"] == "never-deployed" and status(canary)["backups"] == []
    ok("push", "--host", "canary")  # the canary acts first: it gets a folder of its own
    assert (prod.state_dir / "roots" / key_of(str(canary.site)) / "root.json").exists()
    assert not (prod.state_dir / "root.json").exists()  # the old state is still nobody's claim
    doc = status(prod)
    assert doc["phase"] == "deployed" and [b["id"] for b in doc["backups"]] == [old]
    assert states(doc) == dict.fromkeys(TARGETS, "patched")
    assert [e["event"] for e in history(prod)] == ["push"]  # its old history, as it was
    rolled = json.loads(ok("rollback", "--host", "prod", "--json").stdout)["hosts"][0]
    assert rolled["backup_id"] == old and files(prod) == pristine["prod"]
    record = json.loads((prod.state_dir / "root.json").read_text())
    assert (record["key"], record["how"]) == (key_of(str(prod.site)), "legacy")
    assert [e["event"] for e in history(prod)] == ["rollback", "push"]
    ok("push", "--host", "prod")
    assert files(prod) == patched and files(canary) != pristine["canary"]
    ok("rollback", "--host", "canary")
    assert files(canary) == pristine["canary"] and files(prod) == patched
    assert status(prod)["phase"] == "deployed" and status(canary)["phase"] == "rolled-back"


def test_hosts_init_writes_two_installs_of_one_machine_but_not_one_install_twice(tmp_path):
    """Production and canary on one machine: two files, the same (default) state folder, each
    install's state its own. The same machine and interpreter under a second name is refused
    (one install, two names: a fleet would push it twice), exit 2, nothing written."""
    inv = str(tmp_path / "inv")
    ok("hosts", "init", "gpu1-prod", "--ssh-host", "gpu1", "--python", "/opt/prod/bin/python", "-i", inv)
    second = ok("hosts", "init", "gpu1-canary", "--ssh-host", "gpu1", "--python", "/opt/canary/bin/python", "-i", inv)
    assert "the same machine as gpu1-prod, another interpreter" in " ".join(second.stderr.split())
    prod, canary = (load_host(f"{inv}/gpu1-{n}.toml") for n in ("prod", "canary"))
    assert prod.state_dir == canary.state_dir == "~/.ddtree-deploy" and prod.python != canary.python
    twin = cli("hosts", "init", "gpu1-again", "--ssh-host", "gpu1", "--python", "/opt/prod/bin/python", "-i", inv)
    assert twin.exit_code == 2 and "gpu1-prod.toml already names this machine and this interpreter" in \
        " ".join(twin.stderr.split()), twin.output
    assert not (tmp_path / "inv" / "gpu1-again.toml").exists()
    ok("hosts", "init", "gpu2", "--python", "/opt/prod/bin/python", "-i", inv)  # another machine: fine
