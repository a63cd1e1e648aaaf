"""Fault injection: cut the SSH connection at every step of push and rollback, and kill the agent.

A small TCP proxy of our own (tests/link_faults.py) sits between paramiko and the real sshd
and cuts both sockets after N bytes. N walks across the whole conversation of a clean run (key
exchange, auth, agent upload, discover, the apply request, the apply reply, unlock).
The agent is also killed (its test hook ``DDTREE_DEPLOY_TEST_HOOKS``) after staging and
after each rename. After every fault:

* every target file is byte-identical to its pristine or its patched version,
* ``status`` explains the state (phase + per-file states, only pristine/patched),
* running the same command again completes.

The number of faults injected and recovered is printed (run with -s) and asserted.
"""

from __future__ import annotations

import json
import time

import pytest

from ddtree_deploy.base import hooks
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.fleets import rollout
from ddtree_deploy.remote.ssh import SSHTransport
from ddtree_deploy.session import push, status
from ddtree_deploy.session.desired import desired_for
from ddtree_deploy.settings.inventory import load_host

from ddtree_deploy.sandbox import SSHServer  # noqa: E402
from link_faults import CutProxy  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS  # noqa: E402
from sshd_host import DEPLOY_FAMILY as FAMILY  # noqa: E402

pytestmark = pytest.mark.sshd

TARGETS = [SPEC, UTILS, ADDED]
CUTS_PER_COMMAND = 10


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    mp = pytest.MonkeyPatch()
    mp.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp / "snapshot"))
    with SSHServer(tmp / "sshd") as sshd:
        proxy = CutProxy(sshd.port)
        sshd.trust(port=proxy.port)
        h = sshd.add_host("faulty", tmp / "host", files=[SPEC, UTILS])
        direct = load_host(str(h.inventory(sshd.dir / "direct")))
        proxied = load_host(str(h.inventory(sshd.dir / "proxied", port=proxy.port)))
        series = load_family(FAMILY)
        pristine = {p: h.read(p) for p in TARGETS}
        yield {"h": h, "direct": direct, "proxied": proxied, "proxy": proxy, "series": series,
               "pristine": pristine}
        proxy.close()
    mp.undo()


def desire(w):
    return lambda facts: desired_for(w["series"], w["direct"].name, facts)


def run(w, command: str, host=None, **kw):
    host = host or w["direct"]
    if command == "push":
        return push.push(host, SSHTransport(host), TARGETS, desire(w), **kw)
    return push.rollback(host, SSHTransport(host), **kw)


def files(w):
    return {p: w["h"].read(p) for p in TARGETS}


def wait_unlocked(w, deadline_s: float = 15.0) -> None:
    """A cut does not stop the host agent: let the one still running finish (bounded)."""
    lock = w["h"].state_dir / "lock"
    deadline = time.monotonic() + deadline_s
    while lock.exists():
        try:
            owner = json.loads((lock / "owner.json").read_text())
        except FileNotFoundError:  # released between the two reads: look again
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"lock still held after {deadline_s}s: {owner}")
        time.sleep(0.05)


def check_explained(w, patched: dict) -> dict:
    """Every file wholly pristine or wholly patched, and status says so, with a phase."""
    for path, data in files(w).items():
        assert data in (w["pristine"][path], patched[path]), f"{path} is neither pristine nor patched"
    with status.reading(w["direct"], SSHTransport(w["direct"]), TARGETS) as read:
        pass
    doc = status.describe(w["direct"].name, read.facts, desire(w)(read.facts))
    states = {f["path"]: f["state"] for f in doc["files"] if f["path"] in TARGETS}
    assert set(states) == set(TARGETS) and set(states.values()) <= {"pristine", "patched"}, states
    assert doc["explanation"]
    if doc["phase"] in ("deployed", "switched"):
        assert set(states.values()) == {"patched"}
    if doc["phase"] == "switched":  # patched, but the smoke never passed: say what to run
        assert "the smoke has not passed" in doc["explanation"] and "ddtree-deploy smoke --host" in doc["explanation"]
    if doc["phase"] == "staged":  # nothing switched yet: every file still on the side it started
        assert len(set(states.values())) == 1, states
    if "patched" in states.values() and "pristine" in states.values():
        assert doc["phase"] == "switching" and "interrupted while switching" in doc["explanation"]
    return doc


def cut_points(total: int) -> list[int]:
    """Offsets across the whole conversation, plus the tail where the last replies travel."""
    spread = [total * k // (CUTS_PER_COMMAND - 3) for k in range(1, CUTS_PER_COMMAND - 3)]
    return sorted(set(spread + [total - 2000, total - 600, total - 150]))


def test_cut_connection_at_every_step_then_rerun_completes(world, capsys):
    w = world
    proxy = w["proxy"]
    # A clean run through the proxy measures each conversation.
    proxy.arm(None)
    pushed = run(w, "push", w["proxied"])
    push_total = proxy.relayed
    patched = files(w)
    assert pushed.changed and patched != w["pristine"]
    proxy.arm(None)
    run(w, "rollback", w["proxied"])
    rollback_total = proxy.relayed
    assert files(w) == w["pristine"]

    faults = recoveries = claimed_unchanged = 0
    phases_seen: set[str] = set()
    for command, total in (("push", push_total), ("rollback", rollback_total)):
        for cut in cut_points(total):
            if command == "rollback":
                run(w, "push")  # start from a deployed host
            proxy.arm(cut)
            before, lost = files(w), None
            try:
                run(w, command, w["proxied"])
            except DeployError as exc:
                assert exc.code in ("connection-lost", "connect", "auth"), exc.message
                lost = exc
            assert proxy.cut, f"{command}: cut at {cut}/{total} bytes never happened"
            faults += 1
            wait_unlocked(w)
            if lost is not None and lost.changed is Changed.NO:  # the error's claim, checked on the host
                assert files(w) == before, (command, cut, lost.message)
                claimed_unchanged += 1
            doc = check_explained(w, patched)
            phases_seen.add(doc["phase"])
            outcome = run(w, command)  # the rerun, on a good connection
            assert files(w) == (patched if command == "push" else w["pristine"])
            recoveries += 1
            assert outcome.summary
            if command == "push":
                run(w, "rollback")  # back to pristine for the next cut
    with capsys.disabled():
        print(f"\nfault injection (connection cuts): {faults} faults injected, {recoveries} recoveries; "
              f"push {push_total} B, rollback {rollback_total} B; phases seen: {sorted(phases_seen)}; "
              f"{claimed_unchanged} errors said the host unchanged, and it was")
    assert faults == recoveries == len(cut_points(push_total)) + len(cut_points(rollback_total))
    assert claimed_unchanged, "no cut gave an error that says the host is unchanged: the check above never ran"


@pytest.mark.parametrize(
    "command, hook",
    [
        ("push", {"exit_after_staging": True}),
        ("push", {"exit_after_renames": 1}),
        ("push", {"exit_after_renames": 2}),
        ("rollback", {"exit_after_renames": 1}),
        ("rollback", {"exit_after_renames": 2}),
    ],
)
def test_agent_killed_mid_switch_then_rerun_completes(world, monkeypatch, command, hook):
    w = world
    run(w, "push")  # learn the patched bytes, then set up the starting state
    patched = files(w)
    if command == "push":
        run(w, "rollback")
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps(hook))
    with pytest.raises(DeployError, match="agent stopped during apply"):
        run(w, command)
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
    doc = check_explained(w, patched)
    if "exit_after_renames" in hook:
        assert doc["phase"] == "switching" and f"rerun `{command}`" in doc["explanation"]
        n = hook["exit_after_renames"]
        done = patched if command == "push" else w["pristine"]
        assert sum(files(w)[p] == done[p] for p in TARGETS) == n
    else:
        assert doc["phase"] == "staged" and files(w) == w["pristine"]
    assert doc["lock"] and doc["lock"]["stale"] is True  # the killed agent's lock, provably stale
    outcome = run(w, command)  # no --break-lock needed: the holder is provably dead
    assert outcome.broke_lock and outcome.broke_lock["stale"] is True
    assert files(w) == (patched if command == "push" else w["pristine"])
    if command == "push":
        run(w, "rollback")


def test_rollback_after_an_interrupted_push(world, monkeypatch):
    w = world
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"exit_after_renames": 2}))
    with pytest.raises(DeployError):
        run(w, "push")
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
    assert files(w) != w["pristine"]
    outcome = run(w, "rollback")
    assert outcome.changed and files(w) == w["pristine"]


def test_cut_between_switch_and_mark_then_rerun_completes(world, capsys):
    """A push that smokes journals `switched` at its switch and `deployed` only in one more
    call after the smoke passed. Cut that call's connection at every step (and never make
    it at all: the controller killed during the smoke): the host is `switched` (or, when the
    agent got the whole request, `deployed`), status explains it, and a rerun of push runs
    the smoke again and ends `deployed`."""
    w = world
    proxy = w["proxy"]
    direct, proxied = w["direct"], w["proxied"]
    first = run(w, "push", smoke=True)
    patched = files(w)
    proxy.arm(None)
    push.mark(proxied, SSHTransport(proxied), first.run_id)
    total = proxy.relayed
    assert json.loads((w["h"].state_dir / "journal.json").read_text())["phase"] == "deployed"
    run(w, "rollback")

    faults = recoveries = 0
    seen: set[str] = set()
    for cut in [None] + cut_points(total):  # None: the mark is never sent (controller killed)
        switched = run(w, "push", smoke=True)
        assert switched.changed and switched.phase == "switched"
        if cut is not None:
            proxy.arm(cut)
            try:
                push.mark(proxied, SSHTransport(proxied), switched.run_id)
            except DeployError as exc:
                assert exc.code in ("connection-lost", "connect", "auth"), exc.message
            assert proxy.cut, f"mark: cut at {cut}/{total} bytes never happened"
        faults += 1
        wait_unlocked(w)
        doc = check_explained(w, patched)
        assert doc["phase"] in ("switched", "deployed") and doc["series"]["run_id"] == switched.run_id
        seen.add(doc["phase"])
        rerun = run(w, "push", smoke=True)
        assert not rerun.changed
        if doc["phase"] == "switched":
            assert rerun.smoke_pending == switched.run_id and "whose smoke never passed" in rerun.summary
            after = rollout.after_push(direct, lambda: SSHTransport(direct), rerun, w["series"], levels=["compile"])
            assert after.ok and after.marked and after.phase == "deployed", after.lines()
        else:
            assert rerun.smoke_pending is None and "already deployed" in rerun.summary
        assert status.status(direct, SSHTransport(direct))["phase"] == "deployed" and files(w) == patched
        recoveries += 1
        run(w, "rollback")
    with capsys.disabled():
        print(f"\nfault injection (switch -> mark): {faults} faults injected, {recoveries} recoveries; "
              f"mark {total} B; phases seen: {sorted(seen)}")
    assert faults == recoveries == len(cut_points(total)) + 1 and "switched" in seen


def test_connection_cut_while_the_push_holds_the_lock_during_its_smoke(world):
    """The CLI's path: the smoke runs while the push's session holds the lock, and the mark
    travels on that session. Cut that connection during the smoke: the mark never arrives,
    the agent sees EOF and releases the lock, the host stays `switched` (status explains),
    and a rerun of push runs the smoke again and ends `deployed`."""
    w = world
    proxy = w["proxy"]
    direct, proxied = w["direct"], w["proxied"]
    results: list = []
    proxy.arm(None)
    with push.begin_push(proxied, SSHTransport(proxied), TARGETS, desire(w), smoke=True) as held:
        pushed = held.outcome
        proxy.arm(1)  # the next byte on the push's connection (the mark request) cuts it
        results.append(rollout.after_push(direct, lambda: SSHTransport(direct), pushed, w["series"],
                                          levels=["compile"], held=held))
    after = results[0]
    assert pushed.changed and proxy.cut and after.report.ok and not after.ok and after.mark_error, after.lines()
    assert "the host stays `switched`" in after.lines()[-1]
    wait_unlocked(w)
    doc = check_explained(w, files(w))
    assert doc["phase"] == "switched" and doc["series"]["run_id"] == pushed.run_id and doc["lock"] is None

    with push.begin_push(direct, SSHTransport(direct), TARGETS, desire(w), smoke=True) as held:
        rerun = held.outcome
        results.append(rollout.after_push(direct, lambda: SSHTransport(direct), rerun, w["series"],
                                          levels=["compile"], held=held))
    assert not rerun.changed and rerun.smoke_pending == pushed.run_id and rerun.phase == "deployed"
    assert results[1].ok and results[1].marked
    assert status.status(direct, SSHTransport(direct))["phase"] == "deployed"
    run(w, "rollback")


def test_a_cut_before_the_apply_says_what_happened_and_that_the_host_is_unchanged(world, capsys):
    """#22: a cut during the upload said `the agent stopped during apply (exit -1; no output)`, a
    cut while the host program started `cannot start the agent:` with an empty reason, a cut
    during the handshake `authentication failed`. Walk cuts over the start of a push (key
    exchange, authentication, program start, agent upload, the first round trip): each error
    names what was under way and says the host is unchanged, and it is."""
    w = world
    proxy = w["proxy"]
    before = files(w)
    journal = w["h"].state_dir / "journal.json"
    journal_before = journal.read_bytes() if journal.exists() else None
    phases: dict[str, int] = {}
    wrong = ("authentication failed", "cannot start the agent:", "exit -1", "stopped during")
    # Where the cut landed -> the one clause that says the host is unchanged there (the
    # transport words it; the error's ``changed`` says it as a value).
    unchanged = {
        "during the SSH handshake": "(by the network or the host); nothing was sent to the host",
        "does not answer as an SSH server": "; nothing was sent to the host",
        "during the authentication": "(by the network or the host); nothing was sent to the host",
        "while starting the host program": "; nothing was sent to the host: it is unchanged",
        "while uploading the agent": "; the agent never started: nothing on the host changed",
        "waiting for init": "; no file on the host was changed",
        "while sending": "; no file on the host was changed",
    }
    for cut in range(250, 10250, 250):
        proxy.arm(cut)
        with pytest.raises(DeployError) as caught:
            run(w, "push", w["proxied"])
        message = caught.value.message
        assert proxy.cut and not any(bad in message for bad in wrong), (cut, message)
        assert caught.value.changed is Changed.NO, (cut, message)
        phase = next((p for p in unchanged if p in message), None)
        assert phase is not None and unchanged[phase] in message, (cut, message)
        phases[phase] = phases.get(phase, 0) + 1
        wait_unlocked(w)
        assert files(w) == before and (journal.read_bytes() if journal.exists() else None) == journal_before
    proxy.arm(None)
    with capsys.disabled():
        print(f"\ncuts before the apply: {sorted(phases.items())}")
    assert {"during the SSH handshake", "during the authentication", "while uploading the agent"} <= set(phases)
