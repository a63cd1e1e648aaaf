"""A failure is a value (issue #33, section 2): its fields are given when it is made and never
edited on the way up; ``changed`` says, three-valued, whether the host changed."""

from __future__ import annotations

import pytest

from ddtree_deploy.base.errors import BadInput, Changed, DeployError, changed_by_code
from ddtree_deploy.remote.agent_session import AgentFailed, AgentRefusedInput, expect_ok
from ddtree_deploy.remote.link_errors import link_lost
from ddtree_deploy.session.plan import FileState, StateFolder, drift_error


def test_the_fields_are_given_when_it_is_made():
    exc = DeployError("h: lock: held by x", code="locked", hint="wait", host="h", step="lock",
                      changed=Changed.NO, evidence={"holder": {"pid": 7}})
    assert (exc.message, exc.hint, exc.code, exc.host, exc.step, exc.changed, exc.exit_code) == \
        ("h: lock: held by x", "wait", "locked", "h", "lock", Changed.NO, 1)
    assert dict(exc.evidence) == {"holder": {"pid": 7}} and str(exc) == "h: lock: held by x"
    assert DeployError("x", exit_code=3).exit_code == 3 and DeployError("x").exit_code == 1


@pytest.mark.parametrize("field", ["message", "hint", "code", "exit_code", "host", "step", "changed", "evidence",
                                   "host_unchanged", "diff", "reply"])
def test_no_field_is_set_or_stuck_on_afterwards(field):
    exc = DeployError("x")
    with pytest.raises(AttributeError, match=f"DeployError.{field}: a failure's fields are set when it is made"):
        setattr(exc, field, "y")
    with pytest.raises(TypeError):  # the evidence is read-only too
        exc.evidence["diff"] = "y"  # type: ignore[index]


def test_python_still_chains_and_tracebacks_it():
    try:
        try:
            raise ValueError("cause")
        except ValueError as cause:
            raise DeployError("x") from cause
    except DeployError as exc:
        assert isinstance(exc.__cause__, ValueError) and exc.__traceback__ is not None


@pytest.mark.parametrize(("code", "exit_code", "changed"), [
    ("locked", 1, Changed.NO),  # raised only before any write (codes.BEFORE_CHANGE)
    ("drift", 1, Changed.NO),
    ("connect", 1, Changed.NO),  # never connected
    ("failed-unchanged", 1, Changed.NO),  # the agent switched back what it switched
    ("failed", 2, Changed.NO),  # bad input: nothing anywhere
    ("connection-lost", 1, Changed.MAYBE),  # a write may have been in flight
    ("switch-mixed", 1, Changed.MAYBE),
    ("failed", 1, Changed.MAYBE),
])
def test_changed_defaults_to_what_the_code_proves(code, exit_code, changed):
    assert changed_by_code(code, exit_code) is changed
    assert DeployError("x", code=code, exit_code=exit_code).changed is changed


def test_bad_input_changed_nothing():
    assert BadInput("x").changed is Changed.NO and BadInput("x").exit_code == 2


def test_known_is_a_new_error_with_the_same_sentence():
    reply = {"ok": False, "code": "agent", "message": "boom"}
    with pytest.raises(AgentFailed) as caught:
        expect_ok(reply, "h", "discover")
    exc = caught.value
    told = exc.known(changed=Changed.NO, step="ignored: it names its step")
    assert told is not exc and type(told) is AgentFailed
    assert (told.message, told.code, told.host, told.step, told.changed, told.reply) == \
        ("h: discover: boom", "agent", "h", "discover", Changed.NO, reply)
    assert exc.changed is Changed.MAYBE  # the one caught is as it was
    with pytest.raises(AttributeError):
        told.changed = Changed.YES
    assert DeployError("x").known(changed=Changed.YES, step="mark").step == "mark"


def test_the_agents_refusal_carries_its_reply_as_evidence():
    lost = {"ok": False, "code": "lost-lock", "message": "the lock was broken; switched back", "unchanged": True}
    with pytest.raises(AgentFailed) as caught:
        expect_ok(lost, "h", "apply")
    assert caught.value.changed is Changed.NO and caught.value.reply == lost
    with pytest.raises(AgentFailed) as caught:
        expect_ok(dict(lost, unchanged=False), "h", "apply")
    assert caught.value.changed is Changed.MAYBE
    with pytest.raises(AgentFailed) as caught:
        expect_ok({"ok": False, "code": "no-sglang", "message": "no sglang", "hint": "use /opt/py"}, "h", "agent start")
    assert (caught.value.message, caught.value.hint) == ("h: agent start: no sglang", "use /opt/py")
    with pytest.raises(AgentRefusedInput) as caught:
        expect_ok({"ok": False, "code": "bad-state-dir", "message": "not ours"}, "h", "agent start")
    assert caught.value.exit_code == 2 and caught.value.changed is Changed.NO


def test_a_lost_link_is_said_whole_from_its_facts():
    first = link_lost("h", "Connection reset by peer")
    assert first.message == "h: connection lost (Connection reset by peer)"
    again = link_lost("h", first.evidence["why"], "while uploading the agent",
                      state="the agent never started: nothing on the host changed")
    assert again.message == ("h: connection lost while uploading the agent (Connection reset by peer); "
                             "the agent never started: nothing on the host changed")
    assert again.step == "while uploading the agent" and again.code == "connection-lost"


def test_a_drift_refusal_names_its_files_and_carries_the_diff():
    exc = drift_error("h", [("a.py", FileState.DRIFTED), ("b.py", FileState.MISSING)], "the snapshot (s)",
                      command="push", folder=StateFolder(), diff="--- a/a.py\n")
    assert exc.message == "h: 2 file(s) match neither the snapshot (s) nor the patched version: a.py (drifted), " \
                          "b.py (missing)"
    assert (exc.host, exc.step, exc.changed) == ("h", "drift check", Changed.NO)
    assert dict(exc.evidence) == {"files": {"a.py": "drifted", "b.py": "missing"}, "diff": "--- a/a.py\n"}
    assert "diff" not in drift_error("h", [("a.py", FileState.DRIFTED)], "s", command="push").evidence


def test_a_lost_links_changed_is_what_its_sentence_says():
    """``lost_state`` (the words) and ``lost_changed`` (the field) read the same facts of the
    session: what it uploaded, sent, and had answered."""
    from ddtree_deploy.remote.agent_session import AgentSession
    from ddtree_deploy.remote.local import LocalTransport
    from ddtree_deploy.settings.inventory import Host

    sess = AgentSession(LocalTransport(), Host("h", "python3", None))
    said = lambda: (sess.lost_state().split(";")[0].split(" (")[0], sess.lost_changed())  # noqa: E731
    assert said() == ("the agent never started: nothing on the host changed", Changed.NO)
    sess.uploaded = True
    assert said() == ("no file on the host was changed", Changed.NO)
    sess.unanswered = ["apply", "unlock"]
    assert said() == ("the host agent goes on alone: if it got the whole apply request it completes it",
                      Changed.MAYBE)
    sess.unanswered = []
    sess.switched = ("push", "switched")
    assert said() == ("this run's push switched the files", Changed.YES)
    sess.switched, sess.restarting = None, True
    assert said() == ("no file on the host was changed", Changed.YES)  # a server restart is under way


def test_it_crosses_processes_and_copies_whole():
    """A release worker's error is pickled to the parent (matrix_run's process pool); a copy
    is the same value: same class, sentence and fields, still read-only."""
    import copy
    import pickle

    reply = {"ok": False, "code": "lost-lock", "message": "m", "unchanged": True}
    for exc in (DeployError("h: x", code="network", hint="retry", host="h", step="download", evidence={"url": "u"}),
                BadInput("f.toml: line 1: bad"), AgentFailed("h: apply: m", reply, code="lost-lock")):
        for again in (pickle.loads(pickle.dumps(exc)), copy.copy(exc), copy.deepcopy(exc)):
            assert type(again) is type(exc) and again.args == exc.args
            assert (again.message, again.hint, again.code, again.exit_code, again.host, again.step, again.changed,
                    dict(again.evidence)) == (exc.message, exc.hint, exc.code, exc.exit_code, exc.host, exc.step,
                                              exc.changed, dict(exc.evidence))
            with pytest.raises(AttributeError):
                again.hint = "edited"
