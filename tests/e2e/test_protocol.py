"""The host programs' protocol (hostprog/protocol.py): typed messages, and versions that refuse each other.

The declarations are checked on their own (pure), then the refusal both ways with the real
CLI, the real deploy agent and a real sshd on loopback:

- a new controller and an agent that speaks protocol 1: the agent is the real program
  shipped as usual, only its bundle built with ``PROTOCOL = 1`` (what an agent of an older
  release, or one a wrapper runs from its own copy, says);
- an old controller and a new agent: the real CLI with its ``protocol.PROTOCOL`` set to 1,
  shipping the agent as built from this checkout (protocol 2).

Either way: exit 1, one line naming both versions and what to do, code ``protocol`` in the
JSON, and the host byte-identical, unlocked, its journal untouched.
"""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from sshd_host import SPEC, UTILS, cli

from ddtree_deploy.hostprog import bundle, protocol
from ddtree_deploy.hostprog.protocol import PROTOCOL, Event, ProtocolError, Reply, check_request, parse_line

# ---------------------------------------------------------------- the declarations (pure)


def test_a_request_is_checked_field_by_field():
    ok = check_request("agent", {"op": "lock", "run_id": "r", "holder": "me", "break_lock": False})
    assert ok.op == "lock" and ok["run_id"] == "r"
    cases = {
        "unknown op 'fly'": {"op": "fly"},
        "lock: the field 'run_id' is missing": {"op": "lock"},
        "lock: the field 'run_id' is a string, not int": {"op": "lock", "run_id": 3},
        "lock: the field 'break_lock' is true or false, not str": {"op": "lock", "run_id": "r", "break_lock": "yes"},
        "lock: no field 'runid' in protocol 2": {"op": "lock", "run_id": "r", "runid": "r"},
        # JSON's true is no number, though Python's bool is an int
        "switches: the field 'since' is a number, not bool": {"op": "switches", "since": True},
        "init: the field 'protocol' is missing": {"op": "init", "state_dir": "~/s"},
    }
    for message, doc in cases.items():
        with pytest.raises(ProtocolError) as err:
            check_request("agent", doc)
        assert str(err.value) == message
    assert check_request("container", {"op": "keep", "run_id": "r", "phase": "deployed"})["phase"] == "deployed"
    with pytest.raises(ProtocolError, match="unknown op 'apply'"):
        check_request("container", {"op": "apply"})


def test_every_op_the_programs_answer_is_declared_and_the_reverse():
    from ddtree_deploy.hostprog import agent, container

    assert set(protocol.AGENT_OPS) == set(agent.OPS)
    assert set(protocol.CONTAINER_OPS) == set(container.OPS)


def test_a_received_line_is_a_reply_or_an_event_and_stays_as_it_came():
    reply = parse_line({"ok": False, "code": "locked", "message": "held", "holder": {"pid": 1}})
    assert isinstance(reply, Reply) and not reply.ok and (reply.code, reply.message, reply.hint) == ("locked", "held",
                                                                                                        None)
    assert parse_line({"ok": True}).ok
    event = parse_line({"event": "wait", "seconds": 2.0})
    assert isinstance(event, Event) and event.event == "wait"
    assert isinstance(parse_line({"event": "done", "ok": True}), Event)  # a one-shot program's last line
    for doc in ({"ok": "yes"}, {"answer": 1}, [1]):
        with pytest.raises(ProtocolError):
            parse_line(doc)
    with pytest.raises(TypeError, match="read-only"):
        reply["ok"] = True
    with pytest.raises(TypeError, match="read-only"):
        reply.setdefault("hint", "x")
    # JSON, copies and pickles see the plain object it was
    assert json.loads(json.dumps(reply)) == dict(reply)
    assert copy.deepcopy(reply) == dict(reply) and pickle.loads(pickle.dumps(reply)) == reply


def test_the_first_exchange_names_both_versions():
    assert protocol.hello_refusal({"op": "init", "protocol": PROTOCOL}) is None
    old = protocol.hello_refusal({"op": "init", "state_dir": "~/s"})
    assert old.code == "protocol" and old["protocol"] == PROTOCOL and old.message.startswith(
        f"protocol mismatch: the controller speaks protocol 1 (it names no version), this host program speaks "
        f"protocol {PROTOCOL}; nothing was done")
    assert "the first request is 'lock', not init" in protocol.hello_refusal({"op": "lock", "run_id": "r"}).message
    assert protocol.hello_mismatch(Reply({"ok": True, "protocol": PROTOCOL})) is None
    assert protocol.hello_mismatch(Reply({"ok": False, "code": "no-sglang"})) is None  # not about versions
    assert protocol.hello_mismatch(Reply({"ok": True, "protocol": 1})) == (
        f"protocol mismatch: the host program speaks protocol 1, this ddtree-deploy speaks protocol {PROTOCOL}")
    assert "speaks protocol 1 (it names no version)" in protocol.hello_mismatch(Reply({"ok": True}))


# ---------------------------------------------------------------- both directions, over a real sshd


def _unchanged(host, before):
    assert {p: host.read(p) for p in (SPEC, UTILS)} == before
    assert not (host.state_dir / "journal.json").exists()


def _push_refused(host, monkeypatch, skew, agent_version: int, controller_version: int):
    """Push twice (JSON, then text) with ``skew(m)`` applied to the controller, then read the lock
    with both sides of one release again."""
    with monkeypatch.context() as m:
        skew(m)
        _refused_twice(host, agent_version, controller_version)
    held = json.loads(cli("lock", "status", "--host", host.name, "--json").stdout)["hosts"][0]
    assert held["ok"] and held["lock"] is None  # a lock a pipelined request took was released at EOF


def _refused_twice(host, agent_version: int, controller_version: int):
    before = {p: host.read(p) for p in (SPEC, UTILS)}
    result = cli("push", "--host", host.name, "--json")
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["hosts"][0]["error"]
    assert error["code"] == "protocol"
    assert (f"protocol mismatch: the host program speaks protocol {agent_version}, this ddtree-deploy speaks "
            f"protocol {controller_version}; nothing was changed on the host") in error["message"]
    assert "one ddtree-deploy release" in error["hint"]
    _unchanged(host, before)
    plain = cli("push", "--host", host.name)
    assert plain.exit_code == 1
    assert f"speaks protocol {agent_version}, this ddtree-deploy speaks protocol {controller_version}" in \
        " ".join(plain.output.split())
    _unchanged(host, before)


@pytest.mark.parametrize("checks", [True, False], ids=["agent-checks", "agent-checks-nothing"])
def test_a_new_controller_refuses_an_agent_of_protocol_1(host, monkeypatch, checks):
    """``agent-checks-nothing``: as an agent of protocol 1 did, it answers init ok (naming
    protocol 1) and goes on with the lock and facts pipelined behind it: the controller closes
    the session on the init's answer, and the agent releases that lock at EOF."""
    built = bundle.source

    def protocol_1(module):  # the real agent, its bundle saying PROTOCOL = 1
        text = built(module)
        old = text.replace(b"PROTOCOL = %d\\n" % PROTOCOL, b"PROTOCOL = 1\\n")
        if not checks:
            old = old.replace(b"refusal = protocol.hello_refusal(request)", b"refusal = None")
        assert old.count(b"PROTOCOL = 1") == 1 and (checks or b"refusal = None" in old)
        return old

    _push_refused(host, monkeypatch, lambda m: m.setattr(bundle, "source", protocol_1),
                  agent_version=1, controller_version=PROTOCOL)


def test_a_new_agent_refuses_a_controller_of_protocol_1(host, monkeypatch):
    # this process is the old controller; the agent ships as built
    _push_refused(host, monkeypatch, lambda m: m.setattr(protocol, "PROTOCOL", 1),
                  agent_version=PROTOCOL, controller_version=1)
