"""`ddtree-deploy smoke` through typer's CliRunner, on a local-transport host whose Python
has the real SGLang 0.5.12.post1 files (no sshd needed: the transport is the seam, and
the SSH path is covered by test_smoke_ssh.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.session import push
from ddtree_deploy.session.desired import desired_for
from ddtree_deploy.settings.inventory import load_host

from ddtree_deploy.sandbox import make_python_env

REPO = Path(__file__).resolve().parent.parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"


@pytest.fixture
def local_host(tmp_path):
    # Only the files the series touches (and their packages): enough for push and compile.
    python, site = make_python_env(tmp_path / "env", list(load_family(FAMILY).touched_paths()))
    inv = tmp_path / "h1.toml"
    inv.write_text(f'transport = "local"\n[host]\npython = "{python}"\nstate_dir = "{tmp_path / "state"}"\n')
    return inv, site


def invoke(*args):
    result = CliRunner().invoke(app, ["smoke", *args])
    return result.exit_code, result.stdout, result.stderr


def test_unknown_level_is_bad_input_before_any_connection(tmp_path):
    inv = tmp_path / "h1.toml"
    # A python that does not exist: reaching the host would fail differently.
    inv.write_text('transport = "local"\n[host]\npython = "/nonexistent/python"\n')
    code, stdout, stderr = invoke("--host", str(inv), "--level", "fly")
    assert code == 2
    assert "unknown smoke level 'fly'; levels are compile, import, cli, launch" in stderr
    assert stdout == ""


def test_broken_smoke_table_names_file_and_key(tmp_path):
    inv = tmp_path / "h1.toml"
    inv.write_text('transport = "local"\n[host]\npython = "/x/python"\n[smoke.launch]\nport = "80"\n')
    code, stdout, stderr = invoke("--host", str(inv), "--json")
    assert code == 2
    assert json.loads(stdout)["error"]["message"] == (
        f"{inv}: line 5: smoke.launch.port: must be an integer from 1 to 65535, not '80'; "
        "write a number without quotes, e.g. port = 1")


def test_never_deployed_host_is_refused(local_host):
    inv, _ = local_host
    code, stdout, stderr = invoke("--host", str(inv))
    assert code == 1
    assert "h1: no series is deployed (phase never-deployed)" in stderr
    assert "hint: push first: `ddtree-deploy push --host h1`" in stderr


def test_smoke_after_a_real_push_json_and_text(local_host):
    inv, site = local_host
    host = load_host(str(inv))
    series = load_family(FAMILY)
    outcome = push.push(host, transport_for(host), list(series.touched_paths()),
                          lambda facts: desired_for(series, host.name, facts))
    assert outcome.changed
    code, stdout, _ = invoke("--host", str(inv), "--level", "compile", "--json")
    assert code == 0
    doc = json.loads(stdout)["hosts"][0]  # one host or several: its report in its hosts entry
    assert doc["ok"] is True and doc["host"] == "h1" and doc["outcome"] == "smoke passed"
    assert [(l["level"], l["status"]) for l in doc["levels"]] == [("compile", "passed")]
    assert doc["levels"][0]["evidence"]["root"] == str(site)

    # Break one deployed file behind the tool's back: the compile level names it, exit 1.
    spec_info = site / "sglang/srt/speculative/spec_info.py"
    spec_info.write_text(spec_info.read_text() + "\ndef broken(:\n")
    code, stdout, stderr = invoke("--host", str(inv), "--level", "compile")
    assert code == 1
    assert stdout.splitlines()[0] == "h1: smoke FAILED"
    assert "compile  failed" in stdout and f"{spec_info}:" in stdout
