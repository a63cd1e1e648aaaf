"""Drift has a way out (issue 28, item 3): a deployed host with one hand-edited file.

Before, it was a circle: `push` said `snapshot pull`, `snapshot pull` said roll back first,
`rollback` said restore by hand, and nothing said where the backup was. Now every refusal
names the backup's folder on the host and one command, and that command succeeds:
`push --replace-drifted` / `rollback --replace-drifted` show the edited file's diff, keep
its bytes as found in a backup of their own on the host (`drifted/<id>/`, never pruned,
listed by `status`), then go on. Real sshd, the small real series, GNU patch as the oracle
(tests/sshd_host.py); the hand edit's bytes are read back from the host byte for byte.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path


from envelope_check import check_envelope  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, cli, ok  # noqa: E402

TARGETS = (SPEC, UTILS, ADDED)
EDIT = b"# a hot fix, made by hand on the GPU host\n"


def files(h) -> dict:
    return {p: h.read(p) for p in TARGETS}


def one_line(text: str) -> str:
    return " ".join(text.split())  # messages wrap between words at the terminal's width


def way_out(result) -> list[str]:
    """The refusal's one command (the hint's first backticked command), as argv."""
    hint = one_line(result.stderr).split("hint:", 1)[1]
    command = re.search(r"`ddtree-deploy ([^`]*)`", hint).group(1)
    return shlex.split(command)


def refused(*args: str, code: str):
    result = cli(*args, "--json")
    doc = check_envelope(result.stdout, result.exit_code, doc_command(args))
    assert result.exit_code == 1 and doc["error"]["code"] == code, result.output
    return result, doc["error"]


def doc_command(args) -> str:
    return "snapshot pull" if args[0] == "snapshot" else args[0]


def host_doc(*args: str, exit_code: int = 0) -> dict:
    """A --json run's one host document (exit 0 unless said), the envelope checked against the
    schema."""
    result = cli(*args, "--json")
    assert result.exit_code == exit_code, result.output
    return check_envelope(result.stdout, result.exit_code, doc_command(args))["hosts"][0]


def backup_folder(h, error: dict) -> Path:
    """The backup folder the refusal names (it must exist on the host, with its manifest)."""
    text = one_line(error["message"])
    folder = Path(re.search(r"the originals are in backup \S+ \((/[^)]*)\)", text).group(1))
    assert folder.parent == h.state_dir / "backups" and (folder / "manifest.json").is_file(), text
    return folder


def kept(h, doc: dict) -> Path:
    """The kept-edits folder a push's or rollback's JSON names; its manifest says what it holds."""
    folder = Path(doc["drifted"]["folder"])
    assert folder.parent == h.state_dir / "drifted" and doc["drifted"]["files"] == [UTILS]
    return folder


def deployed_and_edited(h) -> tuple[bytes, Path]:
    pushed = host_doc("push", "--host", h.name)
    edited = h.read(UTILS) + EDIT
    h.file(UTILS).write_bytes(edited)
    return edited, h.state_dir / "backups" / pushed["backup_id"]


def test_push_refuses_naming_the_backup_and_push_replace_drifted_gets_through(host, oracle):
    pristine, patched = oracle
    edited, backup = deployed_and_edited(host)
    result, error = refused("push", "--host", host.name, code="drift")
    assert backup_folder(host, error) == backup
    assert way_out(result) == ["push", "--host", host.name, "--replace-drifted"]
    assert "snapshot pull" not in error["hint"]  # it would refuse the patched files: not a way out here
    # status says the same: what to look at, and the two ways through.
    drifted = host_doc("status", "--host", host.name, exit_code=1)  # a drifted host needs attention
    assert drifted["outcome"] == "needs attention" and [a["kind"] for a in drifted["attention"]] == ["drifted"]
    said = one_line(drifted["explanation"])
    assert f"`ddtree-deploy status --host {host.name} --diff` shows them" in said
    assert f"`ddtree-deploy push --host {host.name} --replace-drifted`" in said

    dry = host_doc(*way_out(result), "--dry-run")
    assert dry["drifted"]["folder"] is None and dry["drifted"]["files"] == [UTILS]
    assert EDIT.decode().strip() in dry["drifted"]["diff"]  # the edit, against the patched file
    assert files(host) == {**patched, UTILS: edited} and not (host.state_dir / "drifted").exists()

    through = ok(*way_out(result))
    assert UTILS in through.stdout and "+" + EDIT.decode().strip() in through.stdout  # the diff, shown
    assert files(host) == patched
    pushed = host_doc("status", "--host", host.name)
    assert pushed["phase"] == "deployed" and not pushed["mixed"]
    (keep,) = pushed["drifted_backups"]
    assert (Path(keep["files"][0]["file"])).read_bytes() == edited  # the hand edit, byte for byte
    assert keep["command"] == "push" and Path(keep["folder"]).parent == host.state_dir / "drifted"
    assert "kept edits" in ok("status", "--host", host.name).stdout
    # Its original is still the backup the first push made: the rollback restores release bytes.
    ok("rollback", "--host", host.name)
    assert files(host) == pristine
    assert Path(keep["files"][0]["file"]).read_bytes() == edited  # never pruned, never touched


def test_rollback_refuses_naming_the_backup_and_rollback_replace_drifted_gets_through(host, oracle):
    pristine, _patched = oracle
    edited, backup = deployed_and_edited(host)
    result, error = refused("rollback", "--host", host.name, code="drift")
    assert backup_folder(host, error) == backup and "by hand" not in error["hint"]
    assert way_out(result) == ["rollback", "--host", host.name, "--replace-drifted"]
    done = host_doc(*way_out(result))
    assert done["changed"] and files(host) == pristine
    folder = kept(host, done)
    manifest = json.loads((folder / "manifest.json").read_text())
    planned = {f["path"]: f for f in done["plan"]["files"]}
    assert manifest["command"] == "rollback" and manifest["files"][UTILS]["sha256"] == planned[UTILS]["current"]
    assert (folder / manifest["files"][UTILS]["file"]).read_bytes() == edited
    assert EDIT.decode().strip() in done["drifted"]["diff"]
    assert host_doc("status", "--host", host.name)["phase"] == "rolled-back"


def test_snapshot_pull_refuses_with_the_rollback_that_works(host, oracle, tmp_path):
    pristine, _patched = oracle
    edited, backup = deployed_and_edited(host)
    result, error = refused("snapshot", "pull", "--host", host.name, code="not-pristine")
    assert backup_folder(host, error) == backup
    # A plain rollback would refuse the edited file: the hint is the one that gets through.
    assert way_out(result) == ["rollback", "--host", host.name, "--replace-drifted"]
    ok(*way_out(result))
    assert files(host) == pristine
    pulled = host_doc("snapshot", "pull", "--host", host.name)
    assert pulled["ok"]
    (keep,) = host_doc("status", "--host", host.name)["drifted_backups"]
    assert Path(keep["files"][0]["file"]).read_bytes() == edited


def test_a_host_never_pushed_to_gets_its_release_bytes_as_the_backup(host, oracle):
    """Drift before any push: the host has no copy of the original anywhere. The push keeps
    the edit and backs up the snapshot's pristine bytes, so the rollback gives the release."""
    pristine, patched = oracle
    edited = pristine[SPEC] + EDIT
    host.file(SPEC).write_bytes(edited)
    result, error = refused("push", "--host", host.name, code="drift")
    assert way_out(result) == ["push", "--host", host.name, "--replace-drifted"]
    assert "snapshot pull" in error["hint"]  # here it works too: nothing is patched
    done = host_doc(*way_out(result))
    assert files(host) == patched and done["drifted"]["files"] == [SPEC]
    assert (Path(done["drifted"]["folder"]) / "files" / SPEC).read_bytes() == edited
    ok("rollback", "--host", host.name)
    assert files(host) == pristine
