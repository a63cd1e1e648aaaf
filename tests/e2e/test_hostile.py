"""Hostile names reach no shell: interpreter paths, state folders and file names with spaces,
quotes, ``$()``, backticks and ``;`` go through a real sshd (which runs the command with the
user's login shell) and come out as literal names, never as commands.

Each hostile name embeds a command that would create a canary file if any shell ever
evaluated it; the canary's path is spelled with ``\\x2f`` for "/" so it fits in one
path component. The tests assert the operation worked on the literal names and that no
canary exists. Remote files the tool creates are private (0600 files, 0700 folders).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app

from sshd_host import SPEC, UTILS  # noqa: E402
from sshd_host import DEPLOY_FAMILY as FAMILY  # noqa: E402

# The `sshd` marker: every test that takes the sshd fixture (tests/conftest.py); the bad-input
# tests are refused before any connection.


def payload(canary: Path) -> str:
    """A shell snippet that creates ``canary`` when evaluated, with no '/' in it."""
    return "$(touch${IFS}$(printf${IFS}" + str(canary).replace("/", "\\x2f") + "))"


def backticks(canary: Path) -> str:
    return "`touch${IFS}$(printf${IFS}" + str(canary).replace("/", "\\x2f") + ")`"


@pytest.fixture
def canary_dir():
    """A short folder for the canaries: their paths are spelled (escaped) twice into one
    folder name, which must stay under the 255-byte name limit however deep tmp_path is
    (an xdist worker's is longer)."""
    folder = Path(tempfile.mkdtemp(prefix="ddtree-hostile-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_hostile_paths_and_names_reach_no_shell(sshd, tmp_path, canary_dir, monkeypatch):
    canaries = [canary_dir / f"canary{i}" for i in range(2)]
    env_dir = tmp_path / f"v e;n {payload(canaries[0])} {backticks(canaries[1])}"
    # Series paths may hold no backslash: this canary is relative, i.e. in the remote
    # session's working folder (the login user's home).
    home_canaries = [Path.home() / f".ddtree-hostile-canary-{canary_dir.name}-{i}" for i in range(3)]
    # A state_dir may not hold $ or ` (refused as shell syntax nothing expands: see
    # test_deploy_safety); quotes, ';' and spaces are still literal characters of a path.
    state_dir = tmp_path / f"st'a\"te ; touch {home_canaries[2].name} ;"
    dest = (f"sglang/srt/speculative/q'u\"o;$(touch${{IFS}}{home_canaries[0].name})"
            f"`touch${{IFS}}{home_canaries[1].name}`.py")

    family = tmp_path / "fam" / "patches" / "sglang-0.5.12"
    shutil.copytree(FAMILY, family)
    (family.parent.parent / "payload").mkdir()
    (family.parent.parent / "payload" / "hostile.py").write_text("HOSTILE = 'a literal file name'\n")
    lines = (family / "series").read_text().splitlines()[:-1] + [f"add payload/hostile.py {dest}"]
    (family / "series").write_text("\n".join(lines) + "\n")

    host = sshd.add_host("hostile", env_dir, files=[SPEC, UTILS])
    host.state_dir = state_dir
    host.inventory(smoke_levels=[])
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    assert " " in str(host.python) and "$(" in str(host.python)

    runner = CliRunner()
    pushed = runner.invoke(app, ["push", "--host", "hostile", "--family", str(family), "--json"])
    assert pushed.exit_code == 0, pushed.output
    assert json.loads(pushed.stdout)["hosts"][0]["changed"]
    assert host.file(dest).read_text() == "HOSTILE = 'a literal file name'\n"
    assert (state_dir / "journal.json").exists()  # the literal state folder was used

    status = runner.invoke(app, ["status", "--host", "hostile", "--family", str(family), "--json"])
    assert status.exit_code == 0, status.output
    states = {f["path"]: f["state"] for f in json.loads(status.stdout)["hosts"][0]["files"]}
    assert states[dest] == "patched"

    rolled = runner.invoke(app, ["rollback", "--host", "hostile", "--json"])
    assert rolled.exit_code == 0, rolled.output
    assert not host.file(dest).exists()

    evaluated = [c for c in canaries + home_canaries if c.exists()]
    for c in evaluated:
        c.unlink()
    assert not evaluated, "a hostile name was evaluated by a shell"

    # Everything the tool wrote on the host is private, whatever the session's umask.
    for p in [state_dir, *state_dir.rglob("*")]:
        mode = p.stat().st_mode & 0o777
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))


@pytest.mark.parametrize("name", ["a;b", "$(id)", "a b", "x'y", "../hosts/x"])
def test_hostile_host_arguments_are_bad_input(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))
    result = CliRunner().invoke(app, ["status", "--host", name])
    assert result.exit_code == 2 and "host name" in result.stderr and "Traceback" not in result.output
