"""Inventory parsing: the example, every kind of broken file (exit 2, file + key), builders."""

from __future__ import annotations

import re
import shlex

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.locations import REPO_ROOT
from ddtree_deploy.cli import app
from ddtree_deploy.remote.program import BOOTSTRAP, agent_argv
from ddtree_deploy.remote.ssh import remote_command
from ddtree_deploy.settings.inventory import DEFAULT_KEEP_BACKUPS, DEFAULT_STATE_DIR, load_host, parse_host

GOOD = """
[ssh]
host = "gpu-1.example.org"
user = "deploy"
port = 2222
identity_file = "~/.ssh/id_ed25519"
jump = "ops@bastion:22,inner"

[host]
python = "/opt/sglang/.venv/bin/python"
"""


def test_example_inventory_parses():
    host = load_host(str(REPO_ROOT / "hosts" / "ct200.toml"))
    assert host.name == "ct200"
    assert host.ssh.host == "ct200" and host.ssh.user == "ubuntu" and host.ssh.connect_timeout == 10
    assert host.python == "/opt/sglang/.venv/bin/python"
    assert (host.state_dir, host.keep_backups, host.sudo) == ("~/.ddtree-deploy", 5, False)


def test_example_inventory_smoke_launch_uses_a_tree_mask_backend():
    # Patch 0003 refuses DDTREE with FA3 (SGLang's Hopper default): the example must pick one.
    from ddtree_deploy.settings.smoke import parse_settings

    host = load_host(str(REPO_ROOT / "hosts" / "ct200.toml"))
    settings = parse_settings(host.smoke, source="hosts/ct200.toml")
    assert settings.levels == ("compile", "import", "cli", "launch")
    extra = list(settings.launch.extra_args)
    assert extra[extra.index("--attention-backend") + 1] in ("flashinfer", "triton")


def test_defaults_and_all_keys():
    host = parse_host(GOOD, name="gpu1", source="hosts/gpu1.toml")
    assert host.ssh.port == 2222 and host.ssh.jump == "ops@bastion:22,inner"
    assert host.state_dir == DEFAULT_STATE_DIR and host.keep_backups == DEFAULT_KEEP_BACKUPS
    assert host.ssh.known_hosts == "~/.ssh/known_hosts" and not host.is_local


def test_local_transport_takes_no_ssh_table():
    host = parse_host('transport = "local"\n[host]\npython = "/usr/bin/python3"\n', name="box", source="x.toml")
    assert host.is_local and host.ssh is None
    with pytest.raises(BadInput, match=r"x.toml: line 2: ssh: a local host"):
        parse_host('transport = "local"\n[ssh]\nhost = "a"\n[host]\npython = "p"\n', name="box", source="x.toml")


def test_builtin_local_host(tmp_path):
    host = load_host("local", directory=tmp_path)
    assert host.is_local and host.python


@pytest.mark.parametrize(
    "text, message",
    [
        ("[ssh\nhost='a'", r"not valid TOML"),
        ("[host]\npython = '/p'\n", r"ssh: missing"),
        ("[ssh]\nhost = 'a'\n", r"host.python: missing"),
        ("[ssh]\nhost = 'a'\nport = 70000\n[host]\npython = '/p'\n", r"ssh.port: must be an integer from 1 to 65535"),
        ("[ssh]\nhost = 'a'\nport = '22'\n[host]\npython = '/p'\n", r"ssh.port: must be an integer"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nkeep_backups = 0\n", r"host.keep_backups"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nsudo = 'yes'\n", r"host.sudo: must be true or false"),
        ("[ssh]\nhost = 'a'\nprot = 22\n[host]\npython = '/p'\n", r"ssh.prot: unknown key"),
        ("[ssh]\nhost = 'a b'\n[host]\npython = '/p'\n", r"ssh.host: 'a b' is not a host name"),
        ("[ssh]\nhost = 'a;id'\n[host]\npython = '/p'\n", r"ssh.host"),
        ("[ssh]\nhost = '$(id)'\n[host]\npython = '/p'\n", r"ssh.host"),
        ("[ssh]\nhost = 'a'\nuser = \"x'y\"\n[host]\npython = '/p'\n", r"ssh.user"),
        ("[ssh]\nhost = 'a'\njump = 'b;c'\n[host]\npython = '/p'\n", r"ssh.jump"),
        ("[ssh]\nhost = 'a'\nconnect_timeout = -1\n[host]\npython = '/p'\n", r"ssh.connect_timeout"),
        ("[ssh]\nhost = 'a'\n[host]\npython = \"a\\nb\"\n", r"host.python: must not contain"),
        ("transport = 'telnet'\n[host]\npython = '/p'\n", r"transport: must be one of"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nstate_dir = 'st'\n", r"host.state_dir: .* not absolute"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nstate_dir = '/a/../b'\n", r"host.state_dir: .*'\.\.'"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nstate_dir = '~/$(id)'\n", r"host.state_dir: .*shell syntax"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nstate_dir = '~x/s'\n", r"host.state_dir"),
        ("[ssh]\nhost = 'a'\n[host]\npython = '/p'\nop_timeout = 0\n",
         r"host.op_timeout: must be a number of seconds above 0"),
    ],
)
def test_broken_inventory_names_file_and_key(text, message):
    with pytest.raises(BadInput, match=r"^hosts/h\.toml: ") as info:
        parse_host(text, name="h", source="hosts/h.toml")
    assert re.search(message, info.value.message), info.value.message
    # One format (toml_input): <file>: line N: <key>: <what is wrong>; <what to do>
    assert re.fullmatch(r"hosts/h\.toml: (line \d+: )?[a-z_.]+: .+; .+|hosts/h\.toml: line \d+: not valid TOML: .+; .+",
                        info.value.message), info.value.message


def test_missing_inventory_and_bad_name(tmp_path):
    with pytest.raises(BadInput, match=r"no such inventory file"):
        load_host("nosuch", directory=tmp_path)
    with pytest.raises(BadInput, match=r"host name"):
        load_host("../etc/passwd", directory=tmp_path)
    # A .toml path's stem is the host's name (log folders, snapshot names): '...toml' is host '..'.
    for bad in ("...toml", str(tmp_path / "..toml"), str(tmp_path / "a b.toml"), ".hidden.toml"):
        with pytest.raises(BadInput, match=r"is not a host name"):
            load_host(bad, directory=tmp_path)


def test_state_dir_and_op_timeout_are_read():
    host = parse_host("[ssh]\nhost='a'\n[host]\npython='/p'\nstate_dir='~/.x'\nop_timeout=7\n", name="h", source="h")
    assert host.state_dir == "~/.x" and host.op_timeout == 7.0
    assert parse_host("[ssh]\nhost='a'\n[host]\npython='/p'\n", name="h", source="h").op_timeout is None


def test_cli_broken_inventory_is_one_line_exit_2(tmp_path, monkeypatch):
    (tmp_path / "bad.toml").write_text("[ssh]\nhost = 'a'\nport = 0\n[host]\npython = '/p'\n")
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))
    for command in (["push"], ["rollback"], ["status"], ["snapshot", "pull"]):
        result = CliRunner().invoke(app, [*command, "--host", "bad"])
        assert result.exit_code == 2, (command, result.output)
        assert "ssh.port: must be an integer from 1 to 65535" in result.output
        assert "Traceback" not in result.output


def test_agent_command_is_quoted_argv():
    host = parse_host("[ssh]\nhost='a'\n[host]\npython = \"/o p/it's $(x);/python\"\nsudo = true\n",
                      name="h", source="h.toml")
    argv = agent_argv(host)
    assert argv == ["sudo", "-n", "--", "/o p/it's $(x);/python", "-c", BOOTSTRAP]
    command = remote_command(argv)
    assert command == "sudo -n -- '/o p/it'\"'\"'s $(x);/python' -c " + shlex.quote(BOOTSTRAP)
    assert shlex.split(command) == argv


# ---------------------------------------------------------------- values that reached internal errors (#22)

SSH = "[ssh]\nhost = 'a'\n"
HOST = "[host]\npython = '/p'\n"
LINE = re.compile(r"(?P<file>[^:]+): line (?P<line>\d+): (?P<key>[a-z_.]+): (?P<what>.+?); (?P<todo>.+)")


@pytest.mark.parametrize("key, table, value", [
    ("ssh.connect_timeout", "ssh", "inf"), ("ssh.connect_timeout", "ssh", "nan"),
    ("ssh.connect_timeout", "ssh", "-inf"), ("ssh.connect_timeout", "ssh", "1e300"),
    ("ssh.connect_timeout", "ssh", "99999"),
    ("host.op_timeout", "host", "inf"), ("host.op_timeout", "host", "nan"), ("host.op_timeout", "host", "1e300"),
    ("host.keep_backups", "host", "inf"), ("ssh.port", "ssh", "nan"), ("ssh.port", "ssh", "1e3"),
    ("host.keep_backups", "host", "99999999999999999999999999"),
])
def test_non_finite_and_out_of_range_numbers_are_one_line(key, table, value):
    """TOML's inf and nan (and values past a sane bound) were an OverflowError, a `timestamp
    out of range`, or (nan) no deadline at all: now the one line, naming the key's line."""
    leaf = key.split(".")[1]
    text = (SSH + (f"{leaf} = {value}\n" if table == "ssh" else "") + HOST
            + (f"{leaf} = {value}\n" if table == "host" else ""))
    with pytest.raises(BadInput) as info:
        parse_host(text, name="h", source="hosts/h.toml")
    m = LINE.fullmatch(info.value.message)
    assert m and m["key"] == key, info.value.message
    assert text.splitlines()[int(m["line"]) - 1].startswith(leaf)


@pytest.mark.parametrize("level", ["smoke.timeout_s", "smoke.launch.ready_timeout_s", "smoke.launch.min_free_gib"])
def test_smoke_numbers_refuse_inf_and_nan(level):
    from ddtree_deploy.settings.smoke import parse_settings

    table, leaf = level.rsplit(".", 1)
    for value in ("inf", "nan"):
        text = SSH + HOST + f"[{table}]\n" + ("model = 'm'\ndraft_model = 'd'\n" if "launch" in table else "") + \
            f"{leaf} = {value}\n"
        host = parse_host(text, name="h", source="hosts/h.toml")
        with pytest.raises(BadInput) as info:
            parse_settings(host.smoke, source=host.source)
        m = LINE.fullmatch(info.value.message)
        assert m and m["key"] == level, info.value.message


@pytest.mark.parametrize("key", ["known_hosts", "ssh_config", "identity_file"])
@pytest.mark.parametrize("path, what", [("/dev/zero", "is not a regular file (a character device)"),
                                        ("/", "is a folder, not a file")])
def test_files_the_inventory_names_are_bounded_regular_files(key, path, what):
    """`known_hosts = "/dev/zero"` was read until the kernel killed the CLI; "/" was an
    internal IsADirectoryError. Every file key goes through one checked reader."""
    text = SSH + f"{key} = '{path}'\n" + HOST
    with pytest.raises(BadInput) as info:
        parse_host(text, name="h", source="hosts/h.toml")
    m = LINE.fullmatch(info.value.message)
    assert m and m["key"] == f"ssh.{key}" and m["line"] == "3" and what in m["what"], info.value.message


def test_a_file_over_its_cap_is_refused(tmp_path):
    from ddtree_deploy.settings.inventory import MAX_SSH_CONFIG_BYTES

    big = tmp_path / "config"
    with open(big, "wb") as fh:
        fh.truncate(MAX_SSH_CONFIG_BYTES + 1)  # sparse: no disk used
    with pytest.raises(BadInput, match=r"ssh\.ssh_config: .* over the 1 MiB limit; name a regular file"):
        parse_host(SSH + f"ssh_config = '{big}'\n" + HOST, name="h", source="hosts/h.toml")


def test_non_utf8_host_file_and_groups_file_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "latin.toml").write_bytes(SSH.encode() + b"# caf\xe9\n" + HOST.encode())
    (tmp_path / "groups.toml").write_bytes(b"[groups]\n# \xff\xfe\nall = ['latin']\n")
    with pytest.raises(BadInput) as info:
        load_host("latin", directory=tmp_path)
    assert info.value.message == (f"{tmp_path / 'latin.toml'}: line 3: not valid UTF-8 (byte 0xe9 at column 6); "
                                  "save the file as UTF-8")
    from ddtree_deploy.settings.inventory import load_groups

    with pytest.raises(BadInput, match=r"groups\.toml: line 2: not valid UTF-8 \(byte 0xff at column 3\)"):
        load_groups(tmp_path)
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))
    for args in (["status", "--host", "latin"], ["status", "--group", "all"], ["history", "--host", "latin"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "not valid UTF-8" in r.stderr and "internal" not in r.stderr, r.output
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_host_file_that_is_a_device_or_deeply_nested(tmp_path):
    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(BadInput, match=r"zero\.toml: cannot read the inventory: .* character device"):
        load_host(str(link))
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000)
    with pytest.raises(BadInput, match=r"deep\.toml: a value is nested too deeply"):
        load_host(str(deep))
