"""`hosts list`, `hosts init NAME` and `-i/--inventory DIR` (issue 24, item 2).

An operator with an installed toolkit (no checkout) must be able to see which hosts the
toolkit reads and where from, write a first host file, and point any host command at another
inventory folder; hints name those commands, never a checkout's `hosts/ct200.toml`. Through
the CLI (typer's runner and the console script at 80 columns); hosts use the local transport
(the host agent runs here, on a real state folder), so nothing needs sshd.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.settings.host_template import render
from ddtree_deploy.settings.inventory import load_host, parse_host

REPO = Path(__file__).resolve().parent.parent.parent
EXE = Path(sys.executable).parent / "ddtree-deploy"


def cli(*argv: str):
    return CliRunner().invoke(app, list(argv))


def local_host(folder: Path, name: str, state: Path, python: str = sys.executable) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(f'transport = "local"\n[host]\npython = "{python}"\nstate_dir = "{state}"\n')
    return path


# ---------------------------------------------------------------- hosts init: the template


def test_the_template_parses_as_written_and_with_every_example_switched_on():
    text = render("gpu1")
    host = parse_host(text, name="gpu1", source="gpu1.toml")
    assert host.ssh.host == "gpu1" and host.python == "/opt/sglang/.venv/bin/python"
    # Every commented `key = value` line and table header is a valid example of that key.
    on = "\n".join(re.sub(r"^# (?=\[|[a-z_]+ = )", "", line) for line in text.splitlines()
                   if not line.startswith("# transport"))
    everything = parse_host(on, name="gpu1", source="gpu1.toml")
    assert everything.ssh.user == "ubuntu" and everything.ssh.port == 22 and everything.serve["url"]
    from ddtree_deploy.settings.serve import parse_serve
    from ddtree_deploy.settings.smoke import parse_settings

    assert parse_settings(everything.smoke, source="x").launch.budget == 64
    assert parse_serve(everything.serve, source="x").restart[0] == "sudo"
    local = parse_host(render("box", local=True, python="/usr/bin/python3"), name="box", source="box.toml")
    assert local.is_local and local.python == "/usr/bin/python3"


def test_the_template_knows_every_key_of_the_example_inventory():
    """hosts/ct200.toml (the GPU example the wheel ships) and the template never drift apart."""
    keys = set(re.findall(r"^#? ?([a-z_]+) = ", (REPO / "hosts" / "ct200.toml").read_text(), re.M))
    template = set(re.findall(r"^#? ?([a-z_]+) = ", render("x"), re.M))
    assert keys <= template, sorted(keys - template)


def test_hosts_init_writes_refuses_to_overwrite_and_lists(tmp_path):
    folder = tmp_path / "inv"
    r = cli("hosts", "init", "gpu1", "--user", "ops", "--port", "2222", "-i", str(folder))
    assert r.exit_code == 0, r.output
    path = folder / "gpu1.toml"
    assert r.stdout.strip() == str(path) and "ddtree-deploy status --host gpu1 -i" in " ".join(r.stderr.split())
    host = load_host(str(path))
    assert (host.ssh.user, host.ssh.port) == ("ops", 2222)
    before = path.read_bytes()
    again = cli("hosts", "init", "gpu1", "-i", str(folder))
    assert again.exit_code == 2 and "already exists; nothing was written" in again.stderr
    assert path.read_bytes() == before
    assert cli("hosts", "init", "gpu1", "--force", "-i", str(folder)).exit_code == 0
    assert "# user = " in path.read_text()  # replaced: the new values
    for bad, why in ((["bad name"], "a host name uses"), (["groups"], "reserved"),
                     (["x", "--user", "a b"], "ssh.user"), (["x", "--local", "--user", "u"], "--local takes no")):
        r = cli("hosts", "init", *bad, "-i", str(folder))
        assert r.exit_code == 2 and why in r.stderr, (bad, r.output)
    assert sorted(p.name for p in folder.iterdir()) == ["gpu1.toml"]  # nothing written by the refusals


def test_hosts_list_reads_every_file_and_says_where(tmp_path):
    folder = tmp_path / "inv"
    local_host(folder, "box", tmp_path / "state")
    (folder / "groups.toml").write_text('[groups]\ngpu = ["box"]\n')
    r = cli("hosts", "list", "-i", str(folder), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["folder"] == str(folder) and doc["origin"] == "-i" and doc["groups"] == {"gpu": ["box"]}
    assert [(e["name"], e["ok"], e["target"]) for e in doc["inventory"]] == [("box", True, "local")]
    assert Path(doc["example"], "ct200.toml").is_file()
    (folder / "broken.toml").write_text("[host\n")
    r = cli("hosts", "list", "-i", str(folder))
    assert r.exit_code == 2  # listed first, then the broken file is the run's error
    assert re.search(r"^  broken +BROKEN: .*broken\.toml: line 1", r.stdout, re.M) and "  box " in r.stdout
    assert r.stderr.startswith("error: ") and "broken.toml" in r.stderr
    empty = cli("hosts", "list", "-i", str(tmp_path / "none"))
    assert empty.exit_code == 0 and "ddtree-deploy hosts init NAME -i" in " ".join(empty.stderr.split())


@pytest.mark.parametrize("extra, said", [
    ('[smoke]\nlevels = ["compil"]\n', "smoke.levels: unknown level 'compil'"),
    ('[serve]\nrestart = "systemctl restart sglang"\nurl = "http://127.0.0.1:30000"\n',
     "serve.restart: must be a list of arguments, not the string 'systemctl restart sglang'"),
    ('[smoke]\nlevels = ["compile", "launch"]\n', "smoke.levels: 'launch' needs a [smoke.launch] table"),
    ('[analysis]\nwindow_s = 60\ninterval_s = 90\n', "analysis.interval_s: 90 s is longer than window_s 60 s"),
])
def test_hosts_list_shows_broken_what_push_refuses(tmp_path, extra, said):
    """`hosts list` and `push` share one validator: a file push refuses before any connection
    is listed BROKEN with push's own line (exit 2), never as fine (issue 28)."""
    folder = tmp_path / "inv"
    path = local_host(folder, "box", tmp_path / "state")
    path.write_text(path.read_text() + extra)
    pushed = cli("push", "--host", "box", "-i", str(folder))
    assert pushed.exit_code == 2 and said in pushed.stderr, pushed.output
    (refusal,) = [line for line in pushed.stderr.splitlines() if line.startswith("error: ")]
    listed = cli("hosts", "list", "-i", str(folder))
    assert listed.exit_code == 2, listed.output
    assert f"  box  BROKEN: {refusal[len('error: '):]}" in listed.stdout, listed.stdout
    assert listed.stderr.splitlines()[0] == refusal
    doc = json.loads(cli("hosts", "list", "-i", str(folder), "--json").stdout)
    assert [(e["name"], e["ok"]) for e in doc["inventory"]] == [("box", False)]
    assert not (tmp_path / "state").exists()  # nothing connected to, nothing written


def test_hosts_list_shows_a_group_member_without_a_file_as_push_refuses_it(tmp_path):
    folder = tmp_path / "inv"
    local_host(folder, "box", tmp_path / "state")
    (folder / "groups.toml").write_text('[groups]\ngpu = ["box", "ghost"]\n')
    pushed = cli("push", "--group", "gpu", "-i", str(folder))
    assert pushed.exit_code == 2 and f"{folder / 'ghost.toml'}: no such inventory file" in pushed.stderr
    listed = cli("hosts", "list", "-i", str(folder))
    assert listed.exit_code == 2, listed.output
    assert f"  group gpu: box, ghost  BROKEN: group gpu: member ghost: {folder / 'ghost.toml'}: no such inventory " \
           "file" in listed.stdout, listed.stdout
    doc = json.loads(cli("hosts", "list", "-i", str(folder), "--json").stdout)
    assert doc["broken_groups"] == {"gpu": f"group gpu: member ghost: {folder / 'ghost.toml'}: no such inventory file"}
    (folder / "groups.toml").write_text('[groups]\ngpu = ["box", "local"]\n')  # the built-in host needs no file
    assert cli("hosts", "list", "-i", str(folder)).exit_code == 0


# ---------------------------------------------------------------- -i on every command that reads hosts


def _commands_with(option: str) -> set[str]:
    found = set()

    def walk(node, path):
        for name, sub in (getattr(node, "commands", None) or {}).items():
            if getattr(sub, "commands", None):
                walk(sub, (*path, name))
            elif any(option in p.opts for p in sub.params):
                found.add(" ".join((*path, name)))

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_that_reads_hosts_takes_inventory():
    readers = _commands_with("--host") | _commands_with("--group") | {"hosts list", "hosts init",
                                                                      "inventory from-ansible"}
    assert readers - _commands_with("--inventory") == set()
    assert {"push", "rollback", "status", "restart", "smoke", "history", "lock status", "lock release",
            "snapshot pull", "tune"} <= readers


def test_inventory_folder_is_read_and_hints_name_it(tmp_path, monkeypatch, release_wheel):
    """A host command reads -i DIR: a local host whose Python has SGLang's real files (the
    agent checks it finds the package) answers `history` from there."""
    from ddtree_deploy.sandbox import make_python_env

    monkeypatch.delenv("DDTREE_DEPLOY_HOSTS", raising=False)
    folder = tmp_path / "inv"
    python, _site = make_python_env(tmp_path / "env", files=[])
    local_host(folder, "box", tmp_path / "state", python=str(python))
    r = cli("history", "--host", "box", "-i", str(folder), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["hosts"][0]["total"] == 0
    missing = cli("history", "--host", "nosuch", "-i", str(folder))
    assert missing.exit_code == 2
    assert f"{folder / 'nosuch.toml'}: no such inventory file" in missing.stderr
    hint = " ".join(missing.stderr.split())
    assert f"`ddtree-deploy hosts init nosuch -i {folder}`" in hint and f"`ddtree-deploy hosts list -i {folder}`" in hint
    assert "ct200" not in missing.stderr and "hosts/" not in hint.replace(str(folder), "")
    group = cli("status", "--group", "gpu", "-i", str(folder))
    assert group.exit_code == 2 and "`ddtree-deploy hosts list`" in " ".join(group.stderr.split())


def test_hosts_list_at_80_columns_through_the_console_script(tmp_path):
    folder = tmp_path / "inv"
    for n in range(3):
        local_host(folder, f"gpu-node-{n}", tmp_path / "a-rather-long-state-folder-name" / str(n))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_DEPLOY_")}
    done = subprocess.run([str(EXE), "hosts", "list", "-i", str(folder)], capture_output=True, text=True,
                          timeout=60, env={**env, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    assert [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  gpu")] == \
        ["gpu-node-0", "gpu-node-1", "gpu-node-2"]


def test_host_local_is_the_toolkits_own_python_and_says_the_way_out(tmp_path, monkeypatch):
    """docs/inventory.md: `--host local` runs ddtree-deploy's own Python as the host's; where that Python
    has no sglang (the project venv here: SGLang lives in the hosts' envs), one line says so
    and the hint names a local host file with its own python."""
    monkeypatch.setenv("HOME", str(tmp_path))  # its state folder, ~/.ddtree-deploy, stays here
    r = cli("status", "--host", "local")
    # (It used to stop earlier, wrongly: the built-in host's empty serve table read as an empty [serve].)
    assert r.exit_code == 1 and "serve" not in r.stderr, r.stderr
    assert f"this interpreter ({sys.executable}) cannot find the sglang package" in r.stderr
    hint = " ".join(r.stderr.split())
    assert "the built-in host 'local' runs ddtree-deploy's own Python" in hint
    assert "`ddtree-deploy hosts init NAME --local --python PATH`" in hint


@pytest.mark.parametrize("given, marked", [
    ([], True),  # python and the SSH host are examples: marked EDIT
    (["--python", "/opt/v/bin/python"], True),  # the SSH host is still the example (the name)
    (["--python", "/opt/v/bin/python", "--ssh-host", "gpu1.example.org"], False),
    (["--local", "--python", "/opt/v/bin/python"], False),
])
def test_hosts_init_asks_to_edit_only_what_it_marked(tmp_path, given, marked):
    r = cli("hosts", "init", "gpu1", *given, "-i", str(tmp_path / "inv"))
    assert r.exit_code == 0, r.output
    text = (tmp_path / "inv" / "gpu1.toml").read_text()
    said = " ".join(r.stderr.split())
    assert ("# EDIT: " in text) is marked
    assert ("edit the values marked EDIT" in said) is marked and "check it: `ddtree-deploy status --host gpu1" in said
