"""Fleets end to end: several real OpenSSH sshd on loopback (one port and one set of keys
per host), each host its own venv holding SGLang 0.5.12.post1's real files, the small
real series of tests/data/deploy_series, GNU patch as the oracle of the patched bytes.

The hosts that fail do so for real: a closed port (unreachable), a file edited outside
the tool (drift), a live run's lock, and an ``import`` smoke level that fails because
that host's venv holds only the series' files, not SGLang's dependencies (a real
ImportError: the push is rolled back automatically). The others run the ``compile``
level, which is real and fast.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.fleets.fleet import Kind
from ddtree_deploy.fleets.rollout import EventKind

from ddtree_deploy.sandbox import SandboxHost as TestHost, SSHServer, free_port  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, deploy_series_oracle  # noqa: E402
from sshd_host import DEPLOY_FAMILY as FAMILY, DEPLOY_SERIES as DATA  # noqa: E402

pytestmark = pytest.mark.sshd

TARGETS = (SPEC, UTILS, ADDED)
SERVERS = 6


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One sshd per host slot: separate ports, host keys and client keys."""
    started = []
    try:
        for i in range(SERVERS):
            s = SSHServer(tmp_path_factory.mktemp(f"sshd{i}"))
            s.start()
            started.append(s)
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, servers):
    """(pristine, patched) bytes per target: the release files, and GNU patch's result."""
    return deploy_series_oracle(servers[0], tmp_path_factory.mktemp("oracle"))


class Fleet:
    """Builds hosts for one test; each gets its own sshd (by slot) and its own tree."""

    def __init__(self, servers, root: Path):
        self.servers, self.root = servers, root
        self.hosts_dir = root / "hosts"
        self.hosts: dict[str, TestHost] = {}

    def add(self, name: str, slot: int, *, levels=("compile",), port: int | None = None) -> TestHost:
        h = self.servers[slot].add_host(name, self.root / name, files=[SPEC, UTILS])
        h.inventory(self.hosts_dir, port=port, smoke_levels=list(levels))
        self.hosts[name] = h
        return h

    def unreachable(self, name: str, slot: int) -> TestHost:
        """A host whose inventory names a loopback port nothing listens on."""
        return self.add(name, slot, port=_closed_port())

    def group(self, name: str, members: list[str]) -> None:
        with open(self.hosts_dir / "groups.toml", "a") as f:
            f.write(f"[groups]\n{name} = {json.dumps(members)}\n")


def _closed_port() -> int:
    port = free_port()
    with socket.socket() as s:  # nothing listens there: connect() is refused at once
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port


@pytest.fixture
def fleet(servers, tmp_path, monkeypatch) -> Fleet:
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DATA / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "hosts"))
    return Fleet(servers, tmp_path)


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def files_of(h: TestHost) -> dict[str, bytes | None]:
    return {p: h.read(p) for p in TARGETS}


def tree_of(h: TestHost) -> dict[str, bytes]:
    """Every file of the host's package root and state folder, byte for byte."""
    out = {}
    for base in (h.site, h.state_dir):
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                p = Path(dirpath) / f
                out[str(p)] = p.read_bytes()
    return out


def outcomes(doc: dict) -> dict[str, str]:
    return {h["host"]: h["outcome"] for h in doc["hosts"]}


def backups(h: TestHost) -> list[str]:
    folder = h.state_dir / "backups"
    return sorted(os.listdir(folder)) if folder.exists() else []


# ---------------------------------------------------------------- the tests


def test_push_status_rollback_of_a_group_with_every_kind_of_failure(fleet, oracle):
    pristine, patched = oracle
    names = ["canary", "good1", "drift", "smoke", "down", "good2"]
    fleet.add("canary", 0)
    fleet.add("good1", 1)
    fleet.add("drift", 2).file(SPEC).write_bytes(b"# edited by hand on the host\n")
    fleet.add("smoke", 3, levels=["import"])
    fleet.unreachable("down", 4)
    fleet.add("good2", 5)
    fleet.group("gpu", names)
    before = {n: tree_of(h) for n, h in fleet.hosts.items()}

    dry = cli("push", "--group", "gpu", "--dry-run", "--json")  # every host planned, none waits, nothing changes
    assert dry.exit_code == 1
    assert outcomes(json.loads(dry.stdout)) == {
        "canary": "dry run: would change", "good1": "dry run: would change", "drift": "failed, host unchanged",
        "smoke": "dry run: would change", "down": "unreachable", "good2": "dry run: would change"}
    assert {n: tree_of(h) for n, h in fleet.hosts.items()} == before

    result = cli("push", "--group", "gpu", "--max-failures", "3", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and [h["host"] for h in doc["hosts"]] == names
    assert outcomes(doc) == {"canary": "pushed", "good1": "pushed", "drift": "failed, host unchanged",
                             "smoke": "failed, rolled back", "down": "unreachable", "good2": "pushed"}
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["drift"]["error"]["code"] == "drift" and by["down"]["error"]["code"] == "connect"
    assert by["smoke"]["auto_rollback"]["done"] is True
    assert [(lv["level"], lv["status"]) for lv in by["smoke"]["smoke"]["levels"]] == [("import", "failed")]
    assert doc["counts"] == {"pushed": 3, "failed, host unchanged": 1, "failed, rolled back": 1, "unreachable": 1}
    for name in ("canary", "good1", "good2"):
        assert files_of(fleet.hosts[name]) == patched, name
    assert files_of(fleet.hosts["smoke"]) == pristine  # rolled back automatically, sha256-verified
    assert fleet.hosts["drift"].read(SPEC) == b"# edited by hand on the host\n"
    assert fleet.hosts["drift"].read(ADDED) is None and backups(fleet.hosts["drift"]) == []
    # The outcome table is on stderr; only the JSON document is on stdout.
    for row in ("canary", "pushed", "failed, rolled back", "unreachable", "failed, host unchanged"):
        assert row in result.stderr
    assert "smoke failed at import" in result.stderr

    status = cli("status", "--group", "gpu")
    assert status.exit_code == 1  # "down" could not be read
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.split()}
    assert "deployed" in lines["good1"] and "sglang-0.5.12" in lines["good1"] and "free" in lines["good1"]
    assert "rolled-back" in lines["smoke"]
    assert "never-deployed" in lines["drift"] and "1 file(s)" in lines["drift"]
    assert "unreachable" in lines["down"]
    footer = " ".join(status.stderr.split())
    assert ("not all fine: 4 of 6 host(s) fine; drifted files: 1 (drift); unreachable: 1 (down)") in footer, footer
    as_json = json.loads(cli("status", "--group", "gpu", "--json").stdout)
    assert outcomes(as_json)["down"] == "unreachable" and outcomes(as_json)["good2"] == "fine"
    assert {f["path"]: f["state"] for f in next(h for h in as_json["hosts"] if h["host"] == "drift")["files"]}[SPEC] \
        == "drifted"

    rolled = cli("rollback", "--group", "gpu", "--parallel", "2", "--json")
    assert rolled.exit_code == 1
    # (drift: its push was refused, so nothing of ddtree-deploy's is there to roll back; its hand
    # edit is its own, which status keeps calling drifted)
    assert outcomes(json.loads(rolled.stdout)) == {
        "canary": "rolled back", "good1": "rolled back", "drift": "already rolled back",
        "smoke": "already rolled back", "down": "unreachable", "good2": "rolled back"}
    for name in ("canary", "good1", "good2", "smoke"):
        assert files_of(fleet.hosts[name]) == pristine, name


def test_fleet_status_counts_what_is_not_fine_and_exits_by_it(fleet, oracle):
    """`status --group` printed `all ok`, exit 0, over a MIXED host and a drifted one (issue 28):
    a host that answered is not a host that is fine. The footer counts each kind of trouble
    and names its hosts; the exit code is 1 while any host needs attention, 0 once all are fine."""
    pristine, patched = oracle
    for i, name in enumerate(["fine", "mixed", "drifted"]):
        fleet.add(name, i)
    fleet.group("gpu", ["fine", "mixed", "drifted"])
    assert cli("push", "--group", "gpu").exit_code == 0
    fleet.hosts["mixed"].file(SPEC).write_bytes(pristine[SPEC])  # a file back to pristine under `deployed`
    fleet.hosts["drifted"].file(UTILS).write_bytes(b"# a hot fix on the host\n")

    status = cli("status", "--group", "gpu")
    assert status.exit_code == 1, status.output
    footer = " ".join(status.stderr.split())
    assert "not all fine: 1 of 3 host(s) fine; MIXED: 1 (mixed); drifted files: 1 (drifted)" in footer, footer
    doc = json.loads(cli("status", "--group", "gpu", "--json").stdout)
    assert doc["exit_code"] == 1 and doc["ok"] is False
    assert outcomes(doc) == {"fine": "fine", "mixed": "needs attention", "drifted": "needs attention"}
    by = {h["host"]: h for h in doc["hosts"]}
    assert [a["kind"] for a in by["mixed"]["attention"]] == ["mixed"] and by["fine"]["attention"] == []
    assert [a["kind"] for a in by["drifted"]["attention"]] == ["drifted"]
    one = cli("status", "--host", "drifted")
    assert one.exit_code == 1 and one.stdout.splitlines()[-1].startswith(
        f"drifted: needs attention: 1 file(s) changed outside ddtree-deploy ({UTILS} drifted)"), one.stdout

    assert cli("push", "--host", "mixed").exit_code == 0  # completes the series
    assert cli("rollback", "--host", "drifted").exit_code == 1  # refuses to overwrite the hand edit
    fleet.hosts["drifted"].file(UTILS).write_bytes(patched[UTILS])
    ok = cli("status", "--group", "gpu")
    assert ok.exit_code == 0 and "all fine: 3 of 3 host(s) fine" in " ".join(ok.stderr.split()), ok.output


def test_a_failed_canary_leaves_every_other_host_byte_identical(fleet, oracle):
    pristine, _patched = oracle
    for i, name in enumerate(["a", "b", "c"]):
        fleet.add(name, i)
    fleet.add("canary", 3, levels=["import"])
    before = {n: tree_of(fleet.hosts[n]) for n in "abc"}

    bad = cli("push", "--host", "a", "--host", "b", "--canary", "nope")
    assert bad.exit_code == 2 and "--canary nope: not one of the selected hosts (a, b)" in bad.stderr
    assert cli("push", "--group", "gpu").exit_code == 2  # no groups.toml: no such group
    to = cli("rollback", "--host", "a", "--host", "b", "--to", "20261129T000000Z-x")
    assert to.exit_code == 2 and "a backup id belongs to one host" in to.stderr

    result = cli("push", "--host", "a", "--host", "b", "--host", "c", "--host", "canary", "--canary", "canary",
                 "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert outcomes(doc) == {"a": "skipped", "b": "skipped", "c": "skipped", "canary": "failed, rolled back"}
    assert doc["stopped"] == "the canary canary ended failed, rolled back"
    assert doc["hosts"][0]["reason"] == "not started: the canary canary ended failed, rolled back"
    assert files_of(fleet.hosts["canary"]) == pristine
    for n in "abc":
        assert tree_of(fleet.hosts[n]) == before[n], n  # every file byte-identical
        assert not fleet.hosts[n].state_dir.exists()  # not even connected to

    # The way out of a bad push is a fleet rollback: the hosts it skipped were never pushed,
    # so they are already where a rollback leaves them: no failure there ("no backups").
    back = cli("rollback", "--host", "a", "--host", "b", "--host", "c", "--host", "canary", "--json")
    assert back.exit_code == 0, back.output
    doc = json.loads(back.stdout)
    assert outcomes(doc) == {"a": "already rolled back", "b": "already rolled back", "c": "already rolled back",
                             "canary": "already rolled back"}
    assert doc["hosts"][0]["summary"] == ("nothing to roll back: no push ever switched a file on this host (no "
                                          "journal, no backup)")
    for n in "abc":
        site = str(fleet.hosts[n].site)
        assert {p: v for p, v in tree_of(fleet.hosts[n]).items() if p.startswith(site)} == before[n], n


def test_max_failures_and_a_held_lock(fleet, oracle):
    """--parallel 1: after the first failure (a live run's lock), no new host starts; with
    --max-failures 1 the locked host is reported and the others are pushed."""
    from ddtree_deploy.hostprog.wire import boot_id, process_start

    pristine, patched = oracle
    for i, name in enumerate(["g1", "locked", "g2", "g3"]):
        fleet.add(name, i)
    before = {n: tree_of(fleet.hosts[n]) for n in ("g2", "g3")}
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        lock = fleet.hosts["locked"].state_dir / "lock"
        lock.mkdir(parents=True)
        (lock / "owner.json").write_text(json.dumps({
            "run_id": "hung-run", "holder": "alice@laptop", "command": "push", "time": "2026-11-01T10:00:00Z",
            "host": socket.gethostname(), "pid": sleeper.pid, "pid_start": process_start(sleeper.pid),
            "boot_id": boot_id()}))
        hosts = [a for n in ("g1", "locked", "g2", "g3") for a in ("--host", n)]

        first = cli("push", *hosts, "--parallel", "1", "--json")
        assert first.exit_code == 1
        doc = json.loads(first.stdout)
        assert outcomes(doc) == {"g1": "pushed", "locked": "failed, host unchanged", "g2": "skipped",
                                 "g3": "skipped"}
        assert doc["hosts"][1]["error"]["code"] == "locked" and "alice@laptop" in doc["hosts"][1]["error"]["message"]
        assert doc["stopped"] == "1 host(s) failed (--max-failures 0)"
        assert files_of(fleet.hosts["g1"]) == patched and files_of(fleet.hosts["locked"]) == pristine
        assert {n: tree_of(fleet.hosts[n]) for n in ("g2", "g3")} == before

        second = cli("push", *hosts, "--parallel", "1", "--max-failures", "1", "--json")
        assert second.exit_code == 1
        assert outcomes(json.loads(second.stdout)) == {"g1": "already deployed", "locked": "failed, host unchanged",
                                                       "g2": "pushed", "g3": "pushed"}
        assert all(files_of(fleet.hosts[n]) == patched for n in ("g1", "g2", "g3"))
        assert files_of(fleet.hosts["locked"]) == pristine
    finally:
        sleeper.kill()
        sleeper.wait()
    ok = cli("push", *hosts, "--break-lock", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["ok"] is True


def test_two_fleet_pushes_over_overlapping_hosts_push_each_host_once(fleet, oracle, release_wheel):
    """Two CLI processes at once: A on h0..h3, B on h2..h5 (canaries h0 and h5). Each host is
    pushed by exactly one of them; the other finds it locked or already deployed."""
    from ddtree_deploy.engine.series import load_family
    from ddtree_deploy.release.snapshot import fresh_release_snapshot

    _pristine, patched = oracle
    names = [f"h{i}" for i in range(6)]
    for i, name in enumerate(names):
        fleet.add(name, i)
    # The release snapshot cache is filled once here: two processes filling it at the
    # same moment is not what this test is about.
    fresh_release_snapshot("0.5.12.post1", load_family(FAMILY).touched_paths())
    cmd = [sys.executable, "-m", "ddtree_deploy", "push", "--json"]
    a = subprocess.Popen(cmd + [x for n in names[:4] for x in ("--host", n)] + ["--max-failures", "9"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    b = subprocess.Popen(cmd + [x for n in reversed(names[2:]) for x in ("--host", n)] + ["--max-failures", "9"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    docs = []
    for p in (a, b):
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode in (0, 1), stderr.decode()[-2000:]
        docs.append(json.loads(stdout))
    pushed_by: dict[str, list[int]] = {n: [] for n in names}
    for i, doc in enumerate(docs):
        for h in doc["hosts"]:
            if h["outcome"] == "pushed":
                pushed_by[h["host"]].append(i)
            else:  # the other run got there first: refused by the lock, or found it done
                assert h["outcome"] == "already deployed" or h["error"]["code"] == "locked", h
    assert {n: len(v) for n, v in pushed_by.items()} == {n: 1 for n in names}
    assert pushed_by["h0"] == [0] and pushed_by["h5"] == [1]
    for name in names:
        h = fleet.hosts[name]
        assert files_of(h) == patched and len(backups(h)) == 1, name
        journal = json.loads((h.state_dir / "journal.json").read_text())
        pusher = docs[pushed_by[name][0]]
        assert journal["run_id"] == next(x for x in pusher["hosts"] if x["host"] == name)["run_id"]
    locked = sum(1 for d in docs for h in d["hosts"] if (h.get("error") or {}).get("code") == "locked")
    print(f"overlapping hosts refused by the lock: {locked} of 2")


def test_a_host_without_sglang_is_failed_host_unchanged(fleet, oracle):
    """Issue #14: the error (no-sglang, from the agent's discovery) is not in any list of
    'before change' codes; deploy marks it where it happens (before the apply request), so
    the host reads 'failed, host unchanged', not 'failed, state unknown'."""
    pristine, patched = oracle
    fleet.add("canary", 0)
    bare = fleet.add("bare", 1)
    bare.inventory(fleet.hosts_dir, smoke_levels=["compile"], python="/usr/bin/python3")  # no sglang there
    before = tree_of(bare)
    result = cli("push", "--host", "canary", "--host", "bare", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert outcomes(doc) == {"canary": "pushed", "bare": "failed, host unchanged"}
    assert {h["host"]: h for h in doc["hosts"]}["bare"]["error"]["code"] == "no-sglang"
    assert files_of(fleet.hosts["canary"]) == patched and tree_of(bare) == before


def test_rollout_push_without_the_cli_typed_outcomes_and_events(fleet, oracle):
    """The core the CLI calls: rollout.push on two hosts, no CliRunner. Each host's kind is
    decided by rollout from typed values (the drift error keeps its exception and hint);
    events come per host STARTED, STEPs, FINISHED, and the canary finishes before the
    other host starts."""
    from ddtree_deploy.base.codes import Code
    from ddtree_deploy.fleets import rollout
    from ddtree_deploy.remote.transport import transport_for

    pristine, patched = oracle
    fleet.add("canary", 0)
    fleet.add("drift", 1).file(SPEC).write_bytes(b"# edited by hand on the host\n")
    events: list = []
    hosts = rollout.select_hosts(["canary", "drift"], [])
    report = rollout.push(hosts, transport_for, rollout.PushOptions(max_failures=1), on_event=events.append)
    by = {r.host: r for r in report.results}
    assert by["canary"].kind is Kind.PUSHED and by["canary"].error is None
    assert by["drift"].kind is Kind.FAILED_UNCHANGED and by["drift"].error.code == Code.DRIFT
    assert by["drift"].hint and "snapshot pull" in by["drift"].hint
    # A sandbox host has no nvidia-smi: the push says so first and goes on (docs/deploy.md, the driver).
    assert by["canary"].lines[0].startswith("canary: no NVIDIA driver found (no nvidia-smi on the host)")
    assert by["canary"].lines[1].startswith("canary: pushed ") and not report.ok and report.exit_code == 1
    for name in ("canary", "drift"):
        mine = [e for e in events if e.host == name]
        assert mine[0].kind is EventKind.STARTED and mine[-1].kind is EventKind.FINISHED
        assert mine[-1].result is by[name]
        assert {e.kind for e in mine[1:-1]} == {EventKind.STEP}
    order = [(e.kind, e.host) for e in events if e.kind in (EventKind.STARTED, EventKind.FINISHED)]
    assert order.index((EventKind.FINISHED, "canary")) < order.index((EventKind.STARTED, "drift"))
    assert files_of(fleet.hosts["canary"]) == patched
    assert fleet.hosts["drift"].read(SPEC) == b"# edited by hand on the host\n"


def test_smoke_on_a_group_reports_each_host(fleet, oracle):
    """`smoke --group`: every host smoke-tested through rollout (no canary, no stop), each
    with its own [smoke] levels and its own outcome: passed, failed at a level (a venv
    without SGLang's dependencies fails `import` for real), or not deployed (nothing
    changed there); the outcome table on stderr, one fleet document with --json, exit 1.
    One host keeps the one-host document (its levels at the top)."""
    for name, slot, levels in (("a", 0, ["compile"]), ("b", 1, ["compile"]), ("fails", 2, ["import"]),
                               ("bare", 3, ["compile"])):
        fleet.add(name, slot, levels=levels)
    fleet.group("gpu", ["a", "b", "fails", "bare"])
    for name in ("a", "b", "fails"):
        assert cli("push", "--host", name, "--no-smoke").exit_code == 0
    before = tree_of(fleet.hosts["bare"])

    from envelope_check import check_envelope

    r = cli("smoke", "--group", "gpu", "--json")
    assert r.exit_code == 1, r.output
    doc = check_envelope(r.stdout, 1, "smoke")  # one document, valid against docs/json-schema.json
    assert outcomes(doc) == {"a": "smoke passed", "b": "smoke passed", "fails": "smoke failed",
                             "bare": "failed, host unchanged"}
    by = {h["host"]: h for h in doc["hosts"]}
    assert [(lv["level"], lv["status"]) for lv in by["a"]["levels"]] == [("compile", "passed")]
    assert [(lv["level"], lv["status"]) for lv in by["fails"]["levels"]] == [("import", "failed")]
    assert by["bare"]["error"]["code"] == "not-deployed" and doc["counts"] == {"smoke passed": 2, "smoke failed": 1,
                                                                               "failed, host unchanged": 1}
    assert tree_of(fleet.hosts["bare"]) == before
    human = cli("smoke", "--group", "gpu", "--parallel", "2")
    assert human.exit_code == 1 and "a: smoke passed" in human.stdout and "fails: smoke FAILED" in human.stdout
    for row in ("smoke passed", "smoke failed", "failed, host unchanged"):
        assert row in human.stderr

    one = cli("smoke", "--host", "a", "--json")  # one host: the same fleet document (docs/json.md)
    single = check_envelope(one.stdout, 0, "smoke")
    assert one.exit_code == 0 and single["hosts"][0]["levels"][0]["level"] == "compile"
    assert set(single) - {"schema", "command", "ok", "exit_code", "error", "hosts"} == \
        {"policy", "stopped", "counts", "seconds"}
    bad = cli("smoke", "--group", "gpu", "--level", "fly")
    assert bad.exit_code == 2 and "unknown smoke level 'fly'" in bad.stderr
