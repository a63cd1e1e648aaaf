"""Output folders and files the user names (issue 24, item 8): a place that cannot be written is
bad input -- exit 2, one line naming the option, the path and why, a hint, nothing left behind
-- never `internal error ... a bug, report it` after the work was done.

The faults are real file system refusals that hold for root too: a regular file where a folder
must be (ENOTDIR), and /proc, where no file or folder can be made. Through the real CLI, also
with --json (the envelope's error code is bad-input).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base.fsutil import require_writable_file, require_writable_folder
from ddtree_deploy.cli import app

RELEASE = "0.5.12.post1"


def _cli(*argv: str):
    return CliRunner().invoke(app, list(argv))


def _console(*argv: str) -> SimpleNamespace:
    """The console script in a process of its own, read like a CliRunner result: for commands
    whose imports change the interpreter for good (ansible-core's), kept out of pytest's."""
    proc = subprocess.run([str(Path(sys.executable).parent / "ddtree-deploy"), *argv], capture_output=True,
                          text=True, timeout=120)
    return SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           output=proc.stdout + proc.stderr)


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "a-file"
    f.write_text("x")
    return f


def _one_bad_line(r, option: str) -> None:
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {option} ") and "internal" not in r.stderr, r.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: "), r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("where", ["under-a-file", "proc", "is-a-file"])
def test_check_write_to_an_unusable_folder_is_bad_input(where, a_file, tmp_path, release_wheel):
    target = {"under-a-file": a_file / "sub", "proc": Path("/proc/ddtree-no-such"), "is-a-file": a_file}[where]
    r = _cli("check", "--release", RELEASE, "--write", str(target))
    _one_bad_line(r, "--write")
    assert str(target) in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing made"
    j = _cli("check", "--release", RELEASE, "--write", str(target), "--json")
    assert j.exit_code == 2
    from envelope_check import check_envelope

    doc = check_envelope(j.stdout, 2, "check")
    assert doc["error"]["code"] == "bad-input" and "--write" in doc["error"]["message"]


def test_check_write_to_a_new_folder_still_writes(tmp_path, release_wheel):
    target = tmp_path / "new" / "deeper"
    r = _cli("check", "--release", RELEASE, "--write", str(target))
    assert r.exit_code == 0, r.output
    assert (target / "sglang" / "srt" / "speculative" / "ddtree_utils.py").is_file()


@pytest.mark.parametrize("argv, option", [
    (lambda f: ["matrix", "--from", "0.5.12", "--to", "0.5.12", "--offline", "--markdown", str(f / "m.md")],
     "--markdown"),
    (lambda f: ["image", "--base", "img", "--release", RELEASE, "--family", "sglang-0.5.12", "--out", str(f / "c")],
     "--out"),
    (lambda f: ["port", "--to", "0.5.14", "--family", "sglang-0.5.13", "--into", "sglang-0.5.14",
                "--tree", str(f / "t")], "--tree"),
    (lambda f: ["inventory", "from-ansible", str(f), "--out", str(f / "h")], "--out"),
])
def test_every_output_option_refuses_an_unusable_place_as_bad_input(argv, option, a_file, tmp_path):
    """The same class of defect in every command that writes where the user says."""
    if argv(a_file)[0] == "inventory":
        pytest.importorskip("ansible")
        inv = tmp_path / "inv.ini"
        inv.write_text("[gpu]\nnode1 ansible_host=10.0.0.1 ddtree_python=/usr/bin/python3\n")
        r = _console("inventory", "from-ansible", str(inv), "--out", str(a_file / "h"))  # ansible: own process
    else:
        r = _cli(*argv(a_file))
    _one_bad_line(r, option)


def test_the_probe_leaves_nothing(tmp_path):
    # Made to try, removed again: the command makes its folders when it writes.
    assert require_writable_folder(tmp_path / "a" / "b", "--x") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    assert require_writable_file(tmp_path / "c" / "f.md", "--y") == tmp_path / "c" / "f.md"
    assert list(tmp_path.iterdir()) == []


def test_a_folder_where_a_file_goes(tmp_path):
    from ddtree_deploy.base.errors import BadInput

    with pytest.raises(BadInput, match=r"^--markdown .*: is a folder; give a file name$"):
        require_writable_file(tmp_path, "--markdown")


def test_a_folder_without_write_permission(tmp_path):
    from ddtree_deploy.base.errors import BadInput

    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(BadInput, match="cannot write in"):
            require_writable_folder(ro, "--write")
        return
    # Root writes in a folder of mode 0555 (and CI runs as root: this used to skip there): the
    # check runs as `nobody` (setpriv, util-linux), with the system's python3 and this checkout's
    # package (base/fsutil imports the standard library only), on a folder nobody can reach.
    import shutil
    import tempfile

    if not (shutil.which("setpriv") and Path("/usr/bin/python3").exists()):
        pytest.skip("as root this needs setpriv and /usr/bin/python3 to run the check as another user")
    base = Path(tempfile.mkdtemp(prefix="ddtree-ro-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "ro").mkdir(mode=0o555)
        code = ("import pathlib, sys\n"
                "from ddtree_deploy.base.errors import BadInput\n"
                "from ddtree_deploy.base.fsutil import require_writable_folder\n"
                "try:\n    require_writable_folder(pathlib.Path(sys.argv[1]), '--write')\n"
                "except BadInput as exc:\n    print(exc.message)\n")
        repo = Path(__file__).resolve().parent.parent.parent
        run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
                              f"PYTHONPATH={repo}", "/usr/bin/python3", "-c", code, str(base / "ro")],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == f"--write {base / 'ro'}: cannot write in {base / 'ro'} (Permission denied)"
    finally:
        shutil.rmtree(base, ignore_errors=True)
