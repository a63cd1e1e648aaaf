"""A host file's ``[container]`` table (settings/container.py) and the tables a
container host may and may not have: every bad value is one line naming the file, the line
and the key, exit 2, before any connection (the host's port here is closed: a command that
connected would fail otherwise, exit 1)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.sandbox import free_port
from ddtree_deploy.settings.inventory import parse_host

SERVE = '\n[serve]\nurl = "http://127.0.0.1:30000"\n'


def host_text(container: str, rest: str = SERVE) -> str:
    return (f'[ssh]\nhost = "127.0.0.1"\nport = {free_port()}\n\n[host]\npython = "/usr/bin/python3"\n\n'
            f"[container]\n{container}{rest}")


def test_every_key_and_the_defaults():
    h = parse_host(host_text('engine = "podman"\nname = "sglang"\n'), name="c1", source="c1.toml")
    c = h.container
    assert (c.engine, c.name, c.python, c.compose_file, c.service, c.stop_timeout_s, c.build_timeout_s) == \
        ("podman", "sglang", "python3", None, None, 30.0, 1800.0)
    assert c.identity == "/container:podman/sglang"
    h = parse_host(host_text('engine = "docker"\nname = "sglang-sglang-1"\npython = "/opt/venv/bin/python"\n'
                             'compose_file = "/opt/sglang/compose.yaml"\nservice = "sglang"\nstop_timeout_s = 60\n'
                             'build_timeout_s = 600\n'), name="c1", source="c1.toml")
    assert (h.container.compose_file, h.container.service, h.container.stop_timeout_s) == \
        ("/opt/sglang/compose.yaml", "sglang", 60.0)
    assert parse_host('[ssh]\nhost = "h"\n[host]\npython = "p"\n', name="x", source="x").container is None


@pytest.mark.parametrize("container, rest, says", [
    ("", SERVE, "line 8: container: is empty"),
    ('name = "sglang"\n', SERVE, "line 8: container.engine: missing (required)"),
    ('engine = "containerd"\nname = "s"\n', SERVE, "line 9: container.engine: must be one of 'docker', 'podman'"),
    ('engine = "podman"\n', SERVE, "line 8: container.name: missing (required)"),
    ('engine = "podman"\nname = "sglang; rm -rf /"\n', SERVE, "line 10: container.name: 'sglang; rm -rf /' is not a "
                                                             "container name"),
    ('engine = "podman"\nname = "s"\npython = "python3 -S"\n', SERVE, "line 11: container.python: 'python3 -S' is "
                                                                      "not one word"),
    ('engine = "podman"\nname = "s"\nservice = "x"\n', SERVE, "line 11: container.service: set without compose_file"),
    ('engine = "podman"\nname = "s"\ncompose_file = "compose.yaml"\nservice = "x"\n', SERVE,
     "line 11: container.compose_file: 'compose.yaml' is not an absolute path on the host"),
    ('engine = "podman"\nname = "s"\ncompose_file = "/c.yaml"\n', SERVE, "container.service: missing: a "
                                                                         "compose_file needs the service"),
    ('engine = "podman"\nname = "s"\nstop_timeout_s = -1\n', SERVE, "line 11: container.stop_timeout_s: must be a "
                                                                    "number of seconds above 0"),
    ('engine = "podman"\nname = "s"\nimage = "x"\n', SERVE, "line 11: container.image: unknown key"),
    # The tables around it: [serve] is required and restarts nothing; [smoke] has no place.
    ('engine = "podman"\nname = "s"\n', "", "serve: a [container] host needs a [serve] table with url"),
    ('engine = "podman"\nname = "s"\n', SERVE + 'restart = ["systemctl", "restart", "sglang"]\n',
     "line 14: serve.restart: has no place on a [container] host"),
    ('engine = "podman"\nname = "s"\n', SERVE + 'drain = ["/opt/lb/drain"]\n',
     "line 14: serve.drain: has no place on a [container] host"),
    ('engine = "podman"\nname = "s"\n', SERVE + '\n[smoke]\nlevels = ["compile"]\n',
     "line 15: smoke: a [container] host runs no smoke levels"),
])
@pytest.mark.parametrize("command", ["push", "status", "rollback"])
def test_a_bad_value_is_one_line_exit_2_before_any_connection(tmp_path, monkeypatch, container, rest, says,
                                                               command):
    (tmp_path / "c1.toml").write_text(host_text(container, rest))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))
    r = CliRunner().invoke(app, [command, "--host", "c1", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 2, r.output
    assert doc["error"]["code"] in ("bad-input",) and says in doc["error"]["message"], doc
    assert doc["error"]["message"].startswith(str(tmp_path / "c1.toml"))
    assert "\n" not in doc["error"]["message"]


def test_hosts_list_shows_a_broken_container_host_with_pushs_line(tmp_path, monkeypatch):
    (tmp_path / "c1.toml").write_text(host_text('engine = "podman"\nname = "s"\n', ""))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))
    r = CliRunner().invoke(app, ["hosts", "list"])
    assert "BROKEN" in r.output and "a [container] host needs a [serve] table" in r.output, r.output
