"""The --json envelope (docs/json.md, docs/json-schema.json), for every command that has --json.

The command list is read from the typer app itself: a new command with --json and no case
here fails ``test_every_json_command_has_cases``. Each command gets a success path, bad input
(exit 2), a usage error (exit 2, code "usage") and, where it works on hosts, a host failure
(exit 1: a host whose SSH port is closed, or a fleet with one such host). Every run checks
that stdout is exactly one JSON document, valid against the schema, with the envelope keys
first and ``exit_code`` equal to the process's exit code (tests/envelope_check.py).

Real parts: the host commands run against a real sshd on loopback with the small real
series (tests/sshd_host.py, as tests/e2e/test_push.py); check/matrix/port/image use the matrix
test family on the real cached SGLang wheels (as tests/integration/test_matrix.py). ``tune``'s success
path needs an SGLang host env and bench_serving (10-20 s a launch): it is checked against
the same schema in tests/e2e/test_tune_ssh.py (``check_envelope``), asserted below.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from functools import cached_property
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.cli import app
from ddtree_deploy.release import releases

from envelope_check import ENVELOPE_KEYS, check_envelope  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
MATRIX_FAMILY = REPO / "tests" / "data" / "matrix_family"
CONSOLE = Path(sys.executable).parent / "ddtree-deploy"
WHEELS = ("0.5.12", "0.5.12.post1", "0.5.13")


def json_commands() -> list[str]:
    """Every command path of the app whose command takes --json."""
    found: list[str] = []

    def walk(node, path):
        for name, sub in sorted((getattr(node, "commands", None) or {}).items()):
            if getattr(sub, "commands", None):
                walk(sub, (*path, name))
            elif any("--json" in getattr(p, "opts", ()) for p in sub.params):
                found.append(" ".join((*path, name)))

    walk(typer.main.get_command(app), ())
    return found


@pytest.fixture(scope="module")
def wheels():
    try:
        return {v: releases.ensure_wheel(v) for v in WHEELS}
    except DeployError as exc:  # offline with an empty cache: nothing to check against
        pytest.skip(f"SGLang wheels {', '.join(WHEELS)} not cached and PyPI unreachable: {exc.message}")


class Ctx:
    """What a case needs, made on first use: a host on the real sshd, the matrix family,
    an unreachable host."""

    def __init__(self, request, tmp_path: Path, monkeypatch):
        self.request, self.tmp, self.monkeypatch = request, tmp_path, monkeypatch

    @cached_property
    def host(self) -> str:
        return self.request.getfixturevalue("host").name

    @cached_property
    def served(self) -> str:
        """A host whose stand-in server runs under supervisord, with a [serve] table (tests/serve_host.py)."""
        pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in server")
        from serve_host import Served

        _ = self.host  # the module's sshd, and the environment the host commands read
        s = Served(self.request.getfixturevalue("sshd"), self.tmp, "served")
        s.sup.start()
        self.request.addfinalizer(s.sup.stop)
        s.wait_healthy()
        return s.name

    @cached_property
    def family(self) -> Path:
        """The matrix test family as the patches folder (a copy: port writes beside it)."""
        self.request.getfixturevalue("wheels")
        patches = self.tmp / "patches"
        shutil.copytree(MATRIX_FAMILY / "patches", patches)
        self.monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
        self.monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(MATRIX_FAMILY / "payload"))
        return patches

    @cached_property
    def small_family(self) -> Path:
        """The deploy tests' small series as the patches folder: it ports cleanly to 0.5.13."""
        from sshd_host import DEPLOY_SERIES

        self.request.getfixturevalue("wheels")
        patches = self.tmp / "small-patches"
        shutil.copytree(DEPLOY_SERIES / "patches", patches)
        self.monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
        self.monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(DEPLOY_SERIES / "payload"))
        return patches

    @cached_property
    def down(self) -> str:
        """An inventory whose SSH port nothing listens on: connection refused (exit 1)."""
        with socket.socket() as probe:  # a port nothing listens on once this closes
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        path = self.tmp / "down.toml"
        path.write_text(f'[ssh]\nhost = "127.0.0.1"\nport = {port}\nconnect_timeout = 5\n\n'
                        f'[host]\npython = "/usr/bin/python3"\nstate_dir = "{self.tmp / "down-state"}"\n\n'
                        # tune checks its launch settings before it connects
                        '[smoke.launch]\nmodel = "/models/m"\ndraft_model = "/models/d"\nport = 30000\n\n'
                        # restart checks its [serve] table before it connects
                        '[serve]\nrestart = ["true"]\nurl = "http://127.0.0.1:30000"\n')
        return str(path)

    def ok(self, *args: str) -> None:
        """A set-up step (no --json)."""
        r = CliRunner().invoke(app, list(args))
        assert r.exit_code == 0, r.output


def _ansible_ini(c: Ctx, with_python: bool) -> str:
    path = c.tmp / ("inv.ini" if with_python else "bad.ini")
    var = " ddtree_python=/usr/bin/python3" if with_python else ""
    path.write_text(f"[gpu]\nnode1 ansible_host=10.0.0.1{var}\n")
    return str(path)


def _no_builder(c: Ctx) -> None:
    empty = c.tmp / "empty-path"
    empty.mkdir()
    c.monkeypatch.setenv("PATH", str(empty))  # no docker, podman or buildah: exit 3 after writing


# Per command: kind -> (set-up + argv maker, expected exit code, expected error code or None).
# argv makers take the Ctx and may run set-up steps first (a push before a rollback).
def _push_then(*argv):
    def make(c: Ctx):
        c.ok("push", "--host", c.host)
        return [a.format(host=c.host) for a in argv]
    return make


def _port_ok(c: Ctx):
    _ = c.small_family  # built on first use: the family port reads
    return ["port", "--to", "0.5.13", "--family", "sglang-0.5.12", "--into", "ported", "--tree", str(c.tmp / "tree")]


def _refresh_ok(c: Ctx):
    c.ok(*_port_ok(c))
    return ["series", "refresh", "--family", "ported", "--from", str(c.tmp / "tree")]


CASES: dict[str, dict] = {
    "check": {
        "ok": (lambda c: (c.family, ["check", "--release", "0.5.12.post1", "--family", "sglang-0.5.12"])[1], 0, None),
        "fail": (lambda c: (c.family, ["check", "--release", "0.5.13", "--family", "sglang-0.5.12"])[1], 1, "failed"),
        "bad": (lambda c: ["check", "--snapshot", "nope"], 2, "bad-input"),
    },
    "snapshot release": {
        "ok": (lambda c: (c.family, ["snapshot", "release", "0.5.12.post1", "--name", "env-check"])[1], 0, None),
        "bad": (lambda c: ["snapshot", "release", "not-a-version"], 2, "bad-input"),
    },
    "snapshot pull": {
        "ok": (lambda c: ["snapshot", "pull", "--host", c.host], 0, None),
        "fail": (lambda c: ["snapshot", "pull", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["snapshot", "pull", "--host", "nosuch"], 2, "bad-input"),
    },
    "push": {
        "ok": (lambda c: ["push", "--host", c.host], 0, None),
        "fail": (lambda c: ["push", "--host", c.down], 1, "connect"),
        "fleet-fail": (lambda c: ["push", "--host", c.host, "--host", c.down], 1, "failed"),
        "bad": (lambda c: ["push", "--host", c.host, "--parallel", "0"], 2, "bad-input"),
    },
    "rollback": {
        "ok": (_push_then("rollback", "--host", "{host}"), 0, None),
        "fail": (lambda c: ["rollback", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["rollback", "--host", c.host, "--host", c.down, "--to", "x"], 2, "bad-input"),
    },
    "status": {
        "ok": (lambda c: ["status", "--host", c.host], 0, None),
        "fail": (lambda c: ["status", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["status", "--host", c.host, "--parallel", "0"], 2, "bad-input"),
    },
    "restart": {
        "ok": (lambda c: ["restart", "--host", c.served], 0, None),
        "fail": (lambda c: ["restart", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["restart", "--host", c.host], 2, "bad-input"),  # no [serve] table
    },
    "smoke": {
        "ok": (_push_then("smoke", "--host", "{host}", "--level", "compile"), 0, None),
        "fail": (lambda c: ["smoke", "--host", c.down, "--level", "compile"], 1, "connect"),
        "bad": (lambda c: ["smoke", "--host", c.host, "--level", "fly"], 2, "bad-input"),
    },
    "history": {
        "ok": (lambda c: ["history", "--host", c.host], 0, None),
        "fail": (lambda c: ["history", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["history", "--host", c.host, "--limit", "0"], 2, "bad-input"),
    },
    "lock status": {
        "ok": (lambda c: ["lock", "status", "--host", c.host], 0, None),
        "fail": (lambda c: ["lock", "status", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["lock", "status", "--host", "nosuch"], 2, "bad-input"),
    },
    "lock release": {
        "ok": (lambda c: ["lock", "release", "--host", c.host], 0, None),
        "fail": (lambda c: ["lock", "release", "--host", c.down], 1, "connect"),
        "bad": (lambda c: ["lock", "release", "--host", "nosuch"], 2, "bad-input"),
    },
    "tune": {
        "ok": "tests/e2e/test_tune_ssh.py",  # a real sweep: see the module docstring
        "fail": (lambda c: ["tune", "--host", c.down, "--budgets", "2", "--topk", "2", "--concurrency", "1"],
                 1, "connect"),
        "bad": (lambda c: ["tune", "--host", c.down, "--budgets", "x"], 2, "bad-input"),
    },
    "matrix": {
        "ok": (lambda c: (c.family, ["matrix", "--from", "0.5.12", "--to", "0.5.12.post1", "--offline",
                                     "--jobs", "1"])[1], 0, None),
        # --strict: a release newer than every family's range fails the run.
        "fail": (lambda c: (c.family, ["matrix", "--from", "0.5.13", "--to", "0.5.13", "--offline", "--jobs", "1",
                                       "--strict"])[1], 1, "failed"),
        "bad": (lambda c: ["matrix", "--from", "banana", "--offline"], 2, "bad-input"),
    },
    "port": {
        "ok": (_port_ok, 0, None),
        "fail": (lambda c: (c.family, ["port", "--to", "0.5.13", "--family", "sglang-0.5.12",
                                       "--tree", str(c.tmp / "t13")])[1], 1, "failed"),
        "bad": (lambda c: (c.family, ["port", "--to", "not-a-version", "--tree", str(c.tmp / "t")])[1],
                2, "bad-input"),
    },
    "series refresh": {
        "ok": (_refresh_ok, 0, None),
        "bad": (lambda c: (c.family, ["series", "refresh", "--family", "sglang-0.5.12", "--from",
                                      str(c.tmp / "missing")])[1], 2, "bad-input"),
    },
    "inventory from-ansible": {
        "ok": (lambda c: ["inventory", "from-ansible", _ansible_ini(c, True), "--out", str(c.tmp / "hosts")], 0, None),
        "bad": (lambda c: ["inventory", "from-ansible", _ansible_ini(c, False), "--out", str(c.tmp / "h")],
                2, "bad-input"),
    },
    "hosts list": {
        "ok": (lambda c: ["hosts", "list", "-i", _inventory(c, broken=False)], 0, None),
        "bad": (lambda c: ["hosts", "list", "-i", _inventory(c, broken=True)], 2, "bad-input"),
    },
    "hosts init": {
        "ok": (lambda c: ["hosts", "init", "gpu9", "--python", "/usr/bin/python3", "-i", str(c.tmp / "new")], 0, None),
        "bad": (lambda c: ["hosts", "init", "not a name", "-i", str(c.tmp / "new")], 2, "bad-input"),
    },
    "image": {
        "ok": (lambda c: (c.family, ["image", "--base", "img", "--release", "0.5.12.post1", "--family",
                                     "sglang-0.5.12", "--out", str(c.tmp / "ctx")])[1], 0, None),
        "fail": (lambda c: (c.family, _no_builder(c), ["image", "--base", "img", "--release", "0.5.12.post1",
                                                       "--family", "sglang-0.5.12", "--out", str(c.tmp / "ctx"),
                                                       "--build"])[2], 3, "no-builder"),
        "bad": (lambda c: (c.family, (c.tmp / "file").write_text("x"),
                           ["image", "--base", "img", "--release", "0.5.12.post1", "--out", str(c.tmp / "file")])[2],
                2, "bad-input"),
    },
}
#: Commands that work on hosts: each needs a host-failure case (exit 1).
HOST_COMMANDS = {"snapshot pull", "push", "rollback", "status", "restart", "smoke", "history", "lock status",
                 "lock release", "tune"}


def _inventory(c, *, broken: bool) -> str:
    folder = c.tmp / "inv"
    folder.mkdir(exist_ok=True)
    (folder / "gpu1.toml").write_text('[ssh]\nhost = "127.0.0.1"\n[host]\npython = "/usr/bin/python3"\n')
    if broken:
        (folder / "gpu2.toml").write_text("[host\n")
    return str(folder)


def _params():
    for command, kinds in CASES.items():
        for kind, case in kinds.items():
            if isinstance(case, tuple):
                marks = [pytest.mark.sshd] if command in HOST_COMMANDS else []
                yield pytest.param(command, kind, id=f"{command}-{kind}".replace(" ", "_"), marks=marks)


def test_every_json_command_has_cases():
    commands = json_commands()
    assert len(commands) >= 16 and "snapshot pull" in commands and "series refresh" in commands
    assert sorted(CASES) == sorted(commands), "a command with --json needs its cases here"
    for command, kinds in CASES.items():
        assert {"ok", "bad"} <= set(kinds), command
        if command in HOST_COMMANDS:
            assert "fail" in kinds, command
    # tune's success path is checked where its sweep runs.
    assert "check_envelope(" in (REPO / CASES["tune"]["ok"]).read_text()


#: Run through the console script, never in this process: ansible-core's import patches
#: sys.intern, socket.getaddrinfo and dataclasses for the whole process (tests/conftest.py).
OWN_PROCESS = {"inventory from-ansible"}


def _console(*argv: str):
    """The console script as a user runs it, with CliRunner's result fields used here."""
    import types

    proc = subprocess.run([str(CONSOLE), *argv], capture_output=True, text=True, timeout=120)
    return types.SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                                 output=proc.stdout + proc.stderr)


@pytest.mark.parametrize("command, kind", list(_params()))
def test_envelope(command, kind, request, tmp_path, monkeypatch):
    make, exit_code, error_code = CASES[command][kind]
    c = Ctx(request, tmp_path, monkeypatch)
    argv = make(c)
    if command in OWN_PROCESS:
        r = _console(*argv, "--json")
    else:
        r = CliRunner().invoke(app, [*argv, "--json"])
    assert r.exit_code == exit_code, r.output
    doc = check_envelope(r.stdout, r.exit_code, command)
    if error_code is None:
        assert doc["error"] is None
    else:
        assert doc["error"]["code"] == error_code, doc["error"]
        assert doc["error"]["message"] and "\n" not in doc["error"]["message"]
        # Every host case fails before anything is written (bad input, a refused connection),
        # and bad input never changes anything: the error says so as a value.
        if command in HOST_COMMANDS or kind == "bad":
            assert doc["error"]["changed"] == "no", doc["error"]
    if command in HOST_COMMANDS:
        names = [h["host"] for h in doc["hosts"]]
        if kind == "ok":
            assert names == [c.served if command == "restart" else c.host] and doc["hosts"][0]["ok"] is True
            # One shape for every host command: the host's fields in its entry, none at the top.
            assert set(doc) - set(ENVELOPE_KEYS) <= {"policy", "stopped", "counts", "seconds"}, sorted(doc)
            assert set(doc["hosts"][0]) - {"host", "ok"}, doc["hosts"][0]
        elif kind == "fail":
            assert names == [c.down] or names == ["down"], names
            assert doc["hosts"][0]["ok"] is False and doc["hosts"][0]["error"]["code"] == error_code
        elif kind == "fleet-fail":
            assert [(h["host"], h["ok"]) for h in doc["hosts"]] == [(c.host, True), ("down", False)]
            assert doc["hosts"][1]["error"]["code"] == "connect" and doc["counts"] == {"pushed": 1, "unreachable": 1}
    else:
        assert doc["hosts"] == []
    if command == "inventory from-ansible" and kind == "ok":  # renamed: "hosts" is the envelope's
        assert doc["imported_hosts"] == ["node1"]


@pytest.mark.sshd
def test_status_carries_the_driver_object(host):
    """status's ``driver`` ($defs/driver): here a sandbox host without nvidia-smi, so ``none``;
    a read driver, an unreadable one and the refused push: tests/e2e/test_driver_ssh.py (a stand-in
    nvidia-smi on the sessions' PATH), each checked with the same check_envelope."""
    r = CliRunner().invoke(app, ["status", "--host", host.name, "--json"])
    doc = check_envelope(r.stdout, r.exit_code, "status")
    driver = doc["hosts"][0]["driver"]
    assert driver["state"] == "none" and driver["version"] is None and driver["lane"] is None
    assert driver["line"].startswith("driver: none found (no nvidia-smi on the host")


#: The per-host fields of the one-host commands whose shape issue 24 (item 7) unified: each in
#: the host's ``hosts`` entry, none at the top level.
HOST_FIELDS = {"smoke": {"levels", "python", "outcome", "elapsed_s"},
               "history": {"entries", "total", "unreadable"},
               "lock status": {"lock", "tune_lock"}}


@pytest.mark.sshd
@pytest.mark.parametrize("command", sorted(HOST_FIELDS))
def test_host_commands_through_the_console_script(command, request, tmp_path, monkeypatch):
    """smoke, history and lock status as a user runs them (the installed entry point, after a
    real push): one envelope valid against the schema, the host's fields in ``hosts[0]``, the
    top level only the envelope (and, for smoke, the fleet's summary like push's)."""
    c = Ctx(request, tmp_path, monkeypatch)
    c.ok("push", "--host", c.host)
    argv = {"smoke": ["smoke", "--host", c.host, "--level", "compile"], "history": ["history", "--host", c.host],
            "lock status": ["lock", "status", "--host", c.host]}[command]
    proc = subprocess.run([str(CONSOLE), *argv, "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    doc = check_envelope(proc.stdout, 0, command)
    assert [(h["host"], h["ok"]) for h in doc["hosts"]] == [(c.host, True)]
    entry = doc["hosts"][0]
    assert HOST_FIELDS[command] <= set(entry), sorted(entry)
    top = set(doc) - set(ENVELOPE_KEYS)
    assert top == ({"policy", "stopped", "counts", "seconds"} if command == "smoke" else set()), sorted(top)
    if command == "smoke":
        assert [(lv["level"], lv["ok"]) for lv in entry["levels"]] == [("compile", True)]
    elif command == "history":
        assert entry["total"] == 1 and entry["entries"][0]["event"] == "push", entry["entries"]
    else:
        assert entry["lock"] is None and entry["tune_lock"] is None


@pytest.mark.parametrize("command", json_commands())
def test_usage_error_is_one_envelope(command):
    """An unknown option fails in click's parser, before any command body: still one envelope,
    exit 2, code usage, and click's usage text on stderr."""
    r = CliRunner().invoke(app, [*command.split(), "--no-such-option", "--json"])
    assert r.exit_code == 2
    doc = check_envelope(r.stdout, 2, command)
    assert doc["error"]["code"] == "usage" and "--no-such-option" in doc["error"]["message"]
    assert doc["error"]["hint"] == f"see ddtree-deploy {command} --help"
    assert (doc["error"]["host"], doc["error"]["step"], doc["error"]["changed"]) == (None, None, "no")
    assert "Usage:" in r.stderr and "--no-such-option" in r.stderr


def test_usage_errors_through_the_console_script(tmp_path):
    """The installed entry point (ddtree_deploy.cli:main), as a user runs it."""
    env = dict(os.environ, COLUMNS="100")
    for argv, command, message in (
        (["push", "--hots", "x", "--json"], "push", "No such option: --hots"),
        (["pusj", "--json"], "pusj", "No such command 'pusj'"),
        (["snapshot", "pul", "--json"], "snapshot pul", "No such command 'pul'"),
        (["lock", "--json"], "lock", "No such option: --json"),
        (["check", "--fuzz", "7", "--json"], "check", "--fuzz"),
        (["--version", "--json"], "", "No such option: --json"),  # the top level has no --json
    ):
        proc = subprocess.run([str(CONSOLE), *argv], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        doc = check_envelope(proc.stdout, 2, command)
        assert doc["error"]["code"] == "usage" and message in doc["error"]["message"], doc["error"]
        assert "Usage:" in proc.stderr
    # Without --json: click's usual output only, nothing on stdout.
    proc = subprocess.run([str(CONSOLE), "push", "--hots", "x"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "No such option" in proc.stderr


def test_an_unexpected_exception_is_one_line_and_one_envelope(monkeypatch):
    """A bug inside a command (injected: hostlog.history raises, a STAND-IN for any defect) is
    exit 1 with code "internal" and one line on stderr; DDTREE_DEPLOY_DEBUG re-raises it (the
    traceback) after the envelope."""
    from ddtree_deploy.session import hostlog

    def broken(*_a, **_k):
        raise ValueError("boom: an injected defect\nsecond line")

    monkeypatch.setattr(hostlog, "history", broken)
    r = CliRunner().invoke(app, ["history", "--host", "local", "--json"])
    assert r.exit_code == 1
    doc = check_envelope(r.stdout, 1, "history")
    assert doc["error"] == {"code": "internal", "message": "ValueError: boom: an injected defect",
                            "hint": "a bug in ddtree-deploy: rerun with DDTREE_DEPLOY_DEBUG=1 for the traceback, "
                                    "and report it",
                            # A bug knows nothing of the host: it may have struck after a write.
                            "host": None, "step": None, "changed": "maybe", "evidence": {}}
    assert doc["hosts"] == [{"host": "local", "ok": False, "error": doc["error"]}]
    assert "internal error: ValueError: boom" in r.stderr and "Traceback" not in r.stderr
    # Without --json: the same one line, no traceback.
    plain = CliRunner().invoke(app, ["history", "--host", "local"])
    assert plain.exit_code == 1 and plain.stdout == "" and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 2  # the error and its hint
    monkeypatch.setenv("DDTREE_DEPLOY_DEBUG", "1")
    debug = CliRunner().invoke(app, ["history", "--host", "local", "--json"])
    assert isinstance(debug.exception, ValueError) and debug.exit_code == 1
    assert check_envelope(debug.stdout, 1, "history")["error"]["code"] == "internal"


def test_help_wins_over_json():
    """--help prints help (stdout, exit 0) and no JSON: documented in docs/json.md."""
    r = CliRunner().invoke(app, ["lock", "status", "--help", "--json"])
    assert r.exit_code == 0 and "Usage:" in r.stdout and "{" not in r.stdout


def test_without_json_nothing_changes():
    r = CliRunner().invoke(app, ["check", "--snapshot", "nope"])
    assert r.exit_code == 2 and r.stdout == "" and "no such snapshot" in r.stderr


def test_ctrl_c_is_exit_130_and_one_envelope(tmp_path):
    """A real SIGINT to the console script while it waits on a host (a TCP listener that
    accepts and never speaks SSH, so the run blocks reading the banner): exit 130, one
    envelope with code "interrupted", one line on stderr, no traceback."""
    import signal
    import time

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        inv = tmp_path / "mute.toml"
        inv.write_text(f'[ssh]\nhost = "127.0.0.1"\nport = {port}\nconnect_timeout = 60\n\n'
                       f'[host]\npython = "/usr/bin/python3"\nstate_dir = "{tmp_path / "state"}"\n')
        proc = subprocess.Popen([str(CONSOLE), "history", "--host", str(inv), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        silent.settimeout(30)
        conn, _ = silent.accept()  # the run is now blocked on our silence
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        conn.close()
    assert proc.returncode == 130, stderr
    doc = check_envelope(stdout, 130, "history")
    assert doc["error"]["code"] == "interrupted" and doc["error"]["changed"] == "maybe"
    assert "interrupted" in stderr and "Traceback" not in stderr
