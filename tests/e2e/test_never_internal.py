"""Property tests (hypothesis): no inventory bytes and no history line reach an internal error.

Issue #22's testers fed the CLI inventories (254 fuzz runs) and history lines; each value that
escaped as `internal error: ...` was a class of defect. Here hypothesis generates:

* inventory files: raw bytes, and TOML built from every key the inventory knows with values of
  every TOML type (inf, nan, huge ints, deep arrays, paths such as /dev/zero, / and a FIFO,
  text that is not UTF-8), plus groups.toml. Each goes through what a command does before
  and at its connect: ``select_hosts`` (groups + host files), the ``[smoke]`` check, and
  the SSH transport's reading of the files the inventory names (``_connection``: ssh config,
  known_hosts, identity files; it opens no connection). Allowed outcomes: a Host, or BadInput
  (exit 2) whose message is one line starting with the file.
* history lines: bytes and JSON of every shape under the entry's keys, deeply nested too. The
  agent's reader (in-process, on a real folder) answers ok whatever they hold, and the CLI's
  ``history`` (text and --json) prints them, exit 0, never an internal error. (The agent runs
  in-process here, handed the request where the transport would carry it: the one stand-in.)

Examples: DDTREE_NEVER_INTERNAL_EXAMPLES (default 150 per property).
"""

from __future__ import annotations

import json
import math
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddtree_deploy.base.errors import BadInput

EXAMPLES = int(os.environ.get("DDTREE_NEVER_INTERNAL_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Local files an inventory may name: ordinary, empty, binary, huge (sparse), a FIFO."""
    d = tmp_path_factory.mktemp("named")
    (d / "config").write_text("Host *\n  User someone\n")
    (d / "known").write_text("# nothing\nbad line\n|1|x|y ssh-ed25519 AAAA\n")
    (d / "empty").write_bytes(b"")
    (d / "binary").write_bytes(bytes(range(256)) * 8)
    with open(d / "huge", "wb") as fh:
        fh.truncate(64 << 20)
    os.mkfifo(d / "fifo")
    (d / "idzero").write_text("Host *\n  IdentityFile /dev/zero\n")
    return [str(d / n) for n in ("config", "known", "empty", "binary", "huge", "fifo", "idzero", "nope")] + \
        ["/dev/zero", "/", "~", "~/.ssh/nope", "", "rel/path", "/proc/self/mem"]


def toml_values(paths):
    scalar = st.one_of(
        st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=30),
        st.sampled_from(paths),
        st.sampled_from(["127.0.0.1", "a b", "x.invalid", "ops@b:22,c", "/usr/bin/python3", "~/.ddtree-deploy",
                         "$(id)", "..", "compile", "launch"]),
    )
    return st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.sampled_from(["a", "model", "port"]),
                                                                          inner, max_size=3)), max_leaves=8)


def toml_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is JSON-compatible here
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"


KEYS = {
    "": ["transport"],
    "ssh": ["host", "user", "port", "identity_file", "jump", "known_hosts", "ssh_config", "connect_timeout", "prot"],
    "host": ["python", "state_dir", "keep_backups", "sudo", "op_timeout"],
    "smoke": ["levels", "timeout_s", "import_exclude"],
    "smoke.launch": ["model", "draft_model", "budget", "topk", "port", "min_free_gib", "ready_timeout_s",
                     "probe_timeout_s", "term_grace_s", "max_new_tokens", "extra_args", "command", "gpu"],
}


@st.composite
def inventory_bytes(draw, paths):
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=400))
    values = toml_values(paths)
    lines = []
    for table, keys in KEYS.items():
        if table and draw(st.integers(0, 5)) == 0:
            continue
        if table:
            lines.append(f"[{table}]")
        for key in keys:
            if draw(st.integers(0, 2)) == 0:
                lines.append(f"{key} = {toml_literal(draw(values))}")
    text = "\n".join(lines) + "\n"
    data = text.encode("utf-8", errors="surrogatepass")
    if draw(st.integers(0, 6)) == 0:  # a byte that is not UTF-8, or a deep array, spliced in
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xe9", b"x = " + b"[" * 5000, b"\x00"])) + data[at:]
    return data


def one_line_bad_input(exc: BadInput, source: str) -> None:
    assert "\n" not in exc.message and exc.message, exc.message
    assert exc.exit_code == 2 and exc.message.startswith(source), exc.message


@pytest.fixture
def hosts_dir(tmp_path, monkeypatch):
    d = tmp_path / "hosts"
    d.mkdir()
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(d))
    return d


@SETTINGS
@given(data=st.data())
def test_no_inventory_bytes_reach_an_internal_error(data, paths, hosts_dir):
    from ddtree_deploy.fleets import rollout
    from ddtree_deploy.remote.ssh import SSHTransport
    from ddtree_deploy.smoke import plan as smoke_plan

    host_bytes = data.draw(inventory_bytes(paths), label="hosts/h.toml")
    (hosts_dir / "h.toml").write_bytes(host_bytes)
    groups = None
    if data.draw(st.booleans(), label="with groups.toml"):
        groups = data.draw(st.one_of(st.binary(max_size=200),
                                     st.sampled_from([b"[groups]\nall = ['h']\n", b"[groups]\nall = 'h'\n",
                                                      b"[groups]\n\xff = ['h']\n", b"groups = 3\n"])),
                           label="groups.toml")
        (hosts_dir / "groups.toml").write_bytes(groups)
    else:
        (hosts_dir / "groups.toml").unlink(missing_ok=True)
    try:
        [host] = rollout.select_hosts(["h"], ["all"] if groups is not None and b"all" in groups else [])
        smoke_plan.check_settings(host)
        if host.ssh is not None:
            SSHTransport(host)._connection()  # reads every file the inventory names; connects nothing
    except BadInput as exc:  # anything else (TypeError, OSError, UnicodeDecodeError...) fails the test
        one_line_bad_input(exc, str(hosts_dir) if groups is not None else str(hosts_dir / "h.toml"))


# ---------------------------------------------------------------- history lines


ENTRY_KEYS = ["time", "event", "holder", "from", "run_id", "command", "host", "outcome", "phase", "series",
              "series_id", "files", "backup_id", "previous", "error", "smoke", "marked_run", "extra"]


def json_values():
    return st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                                  st.text(alphabet=string.printable + "\x1b[]", max_size=20)),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                        max_leaves=10)


@st.composite
def history_line(draw):
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=200)).replace(b"\n", b" ")
    if kind == 1:
        depth = draw(st.integers(1, 200_000))
        return b"[" * depth + draw(st.sampled_from([b"", b"]" * depth]))
    if kind == 2:
        return json.dumps(draw(json_values())).encode()
    entry = {k: draw(json_values()) for k in draw(st.lists(st.sampled_from(ENTRY_KEYS), max_size=8, unique=True))}
    if draw(st.booleans()):
        entry["event"] = draw(st.sampled_from(["push", "rollback", "mark", "lock-release", "lock-break"]))
    return json.dumps(entry).encode()


@SETTINGS
@given(lines=st.lists(history_line(), max_size=8))
def test_no_history_line_reaches_an_internal_error(lines, tmp_path_factory, monkeypatch):
    from ddtree_deploy.cli import app
    from ddtree_deploy.hostprog.agent import Agent
    from ddtree_deploy.session import hostlog

    tmp = tmp_path_factory.mktemp("history")
    state = tmp / "state"
    state.mkdir()
    (state / ".ddtree-deploy-state").write_text("{}\n")
    agent = Agent(str(state))
    agent.package.root = str(tmp / "site")
    agent.history.record("push", run_id="good", outcome="ok", files={"a.py": {"from": None, "to": "1" * 64}})
    with open(state / "history.jsonl", "ab") as fh:
        fh.write(b"\n".join(lines) + b"\n")

    def call(_host, _transport, request, what):  # the transport seam: the agent in-process
        reply = agent.handle(json.loads(json.dumps(request)))
        assert reply["ok"], reply
        return json.loads(json.dumps(reply))  # what would cross the wire

    monkeypatch.setattr(hostlog, "_call", call)
    for args in (["history", "--host", "local"], ["history", "--host", "local", "--json"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "internal error" not in r.output and "Traceback" not in r.output
    doc = json.loads(CliRunner().invoke(app, ["history", "--host", "local", "--json", "--limit", "100"]).stdout)
    doc = doc["hosts"][0]  # the host's history in its entry
    assert doc["total"] + doc["unreadable"] >= 1 and any(e.get("run_id") == "good" for e in doc["entries"])
