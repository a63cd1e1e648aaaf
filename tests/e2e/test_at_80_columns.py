"""What an operator reads, through the real console script on an 80-column terminal (issue 24).

Hosts are sandbox hosts behind a real OpenSSH sshd on loopback (tests/sshd_host.py) with the
small real deploy series; a host whose ``[smoke]`` runs the import level fails it for real
(its Python has only the two SGLang files the series touches, so ``import spec_info`` fails)
and its push is rolled back by itself. Each run is the installed ``ddtree-deploy`` with
``COLUMNS=80``, as a terminal of that width gives it; every line of stdout and stderr must fit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sshd_host import DEPLOY_SERIES, SPEC, UTILS

pytestmark = pytest.mark.sshd

EXE = Path(sys.executable).parent / "ddtree-deploy"
HASH = re.compile(r"\b[0-9a-f]{12}\b")


def run80(env: dict, *argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(EXE), *argv], capture_output=True, text=True, timeout=300,
                          env={**env, "COLUMNS": "80"})
    for stream in (done.stdout, done.stderr):
        # An error and its hint stay one line each (the one-line contract; the terminal wraps them).
        long = [line for line in stream.splitlines() if len(line) > 80 and not line.startswith(("error:", "hint:"))]
        assert not long, f"wider than 80 columns: {long}"
    return done


@pytest.fixture
def fleet(sshd, tmp_path):  # noqa: F811
    """Two fresh hosts: ``good`` (no smoke after push) and ``bad`` (its import level fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_DEPLOY_")}
    hosts_dir = tmp_path / "hosts"
    env.update(DDTREE_DEPLOY_PATCHES=str(DEPLOY_SERIES / "patches"), DDTREE_DEPLOY_PAYLOAD=str(DEPLOY_SERIES / "payload"),
               DDTREE_DEPLOY_SNAPSHOT=str(tmp_path / "snapshot"), DDTREE_DEPLOY_HOSTS=str(hosts_dir))
    made = {}
    for name, levels in (("good", []), ("bad", ["compile", "import"])):
        h = sshd.add_host(name, tmp_path / name, files=[SPEC, UTILS])
        h.inventory(hosts_dir, smoke_levels=levels)
        made[name] = h
    return env, made


def test_a_push_whose_smoke_failed_starts_with_its_outcome(fleet):
    """Item 1: the first line is `HOST: failed, rolled back: ...`, not `pushed ... switched`;
    item 5: the plan lines break between columns, every hash whole."""
    env, hosts = fleet
    bad = hosts["bad"].name
    done = run80(env, "push", "--host", bad)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{bad}: failed, rolled back: smoke failed at import"), done.stdout
    assert any(line.startswith(f"{bad}: pushed ") for line in lines[1:])  # the switch, after the outcome
    plan = [line for line in lines if line.startswith(("  replace ", "  create "))]
    assert len(plan) == 3, done.stdout
    # Each plan step names its file, then (same line or the next, indented) both hashes, whole.
    text = "\n".join(lines)
    for step in re.finditer(r"^  (replace|create) +(\S+)  pristine\n?\s+(absent|[0-9a-f]{12}) -> ([0-9a-f]{12})$",
                            text, re.M):
        assert step.group(2).startswith("sglang/"), step.group(0)
    assert len(re.findall(r"^  (?:replace|create) ", text, re.M)) == 3


def test_a_fleet_gives_each_host_its_outcome_first(fleet):
    """Item 1 on a fleet: every host's block on stdout starts with its outcome line (the
    skipped host too), in selection order."""
    env, hosts = fleet
    bad, good = hosts["bad"].name, hosts["good"].name
    done = run80(env, "push", "--host", bad, "--host", good)
    assert done.returncode == 1, done.stdout + done.stderr
    heads = [line for line in done.stdout.splitlines() if re.match(r"^\S+: ", line)]
    assert heads[0].startswith(f"{bad}: failed, rolled back: "), done.stdout
    assert heads[-1] == f"{good}: skipped: not started: the canary {bad} ended failed, rolled back", done.stdout
    assert f"not started: {good}" in " ".join(done.stderr.split())  # the footer names it


# ---------------------------------------------------------------- tables and bars (item 5)


def _plain_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_DEPLOY_")}
    env["DDTREE_DEPLOY_SNAPSHOT"] = str(tmp_path / "snapshot")
    return env


@pytest.mark.parametrize("release, family", [("0.5.12.post1", "sglang-0.5.12"), ("0.5.23", "sglang-0.5.20")])
def test_the_check_table_never_folds_a_name_at_80_columns(release, family, tmp_path):
    """The table does not fit 80 columns: its narrow form gives each entry and file whole."""
    from ddtree_deploy.engine.series import load_family
    from ddtree_deploy.sandbox import release_wheel

    release_wheel(release)
    done = run80(_plain_env(tmp_path), "check", "--release", release)
    assert done.returncode == 0, done.stderr
    words = set(done.stderr.split())
    series = load_family(Path(__file__).resolve().parent.parent.parent / "patches" / family)
    for entry in series.entries:
        assert entry.name.split()[-1] in words, (entry.name, done.stderr)  # the patch's name, whole
    for path in series.touched_paths():
        assert path in words, (path, done.stderr)


def test_matrix_is_readable_at_80_columns(tmp_path):
    """The v2 family's matrix: releases as rows, entries numbered (their names listed whole
    under the table), each cell a few characters, the legend; nothing wider than 80."""
    from ddtree_deploy.sandbox import release_wheel

    for version in ("0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        release_wheel(version)
    done = run80(_plain_env(tmp_path), "matrix", "--from", "0.5.20", "--to", "0.5.23", "--offline", "--parallel", "1")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stderr.splitlines()
            if re.match(r"^0\.5\.2[0-3] ", line)}
    assert set(rows) == {"0.5.20", "0.5.21", "0.5.22", "0.5.23"}, done.stderr
    from ddtree_deploy.engine.series import family_folder, load_family

    entries = len(load_family(family_folder("sglang-0.5.20")).entries)
    # The CUDA lane beside the release (cu130: 0.5.20 on), then every entry exact, compiles, ok.
    assert all(cells[0] == "cu130" for cells in rows.values()), rows
    assert rows["0.5.23"] == ["cu130"] + ["="] * entries + ["ok", "ok"], rows
    assert rows["0.5.20"][1] == "+2", rows  # an offset, in its own few characters
    assert "  1 0001-spec-fields-ddtree-flags.patch" in done.stderr.splitlines()
    assert "= exact" in done.stderr and "matrix: 4 release(s): 4 ok; exit 0" in done.stdout


def test_the_download_bar_keeps_its_numbers_at_80_columns(monkeypatch):
    """A wheel download on an 80-column terminal: the name on its own line, the bar's row
    with whole numbers (it used to shrink to `39… 23… 0:0…`)."""
    import io

    from rich.console import Console

    from ddtree_deploy.cli import download_view

    console = Console(width=80, force_terminal=True, record=True, file=io.StringIO())
    monkeypatch.setattr(download_view, "err", console)
    shown = download_view.Downloads(bar=True)
    shown.update("sglang-0.5.23-py3-none-any.whl", 12_345_678, 0)
    shown.update("sglang-0.5.23-py3-none-any.whl", 12_345_678, 5_000_000)
    row = shown._progress.get_renderable()
    shown.close()
    console.print(row)
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert lines[0] == "downloading sglang-0.5.23-py3-none-any.whl (11.8 MiB)", lines
    assert len(lines[-1]) <= 80 and "…" not in lines[-1], lines
    assert re.search(r"━+.* 5\.0/12\.3 MB +\S+ +\S+$", lines[-1]), lines


# ---------------------------------------------------------------- drift can be inspected (item 4)


def _patch_applies(diff: str, expected: bytes, host: bytes, tmp: Path, path: str) -> None:
    """GNU patch (the oracle) turns the expected file into the host's with the diff shown."""
    target = tmp / "oracle" / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(expected)
    done = subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch"], input=diff, text=True,
                          cwd=tmp / "oracle", capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.read_bytes() == host


def test_a_drifted_host_shows_its_bytes_against_what_the_series_expects(fleet, tmp_path):
    """`push --dry-run --diff` on a drifted host no longer stops at the drift check with one
    line: the diff from the expected (pristine) file to the host's follows, here and in
    --json; `status --diff` shows the same. GNU patch applies each diff to the expected file
    and gets the host's bytes."""
    import json

    env, hosts = fleet
    h = hosts["good"]
    pristine = h.read(SPEC)
    edited = pristine.replace(b"\n", b"  # a local edit\n", 1)
    h.file(SPEC).write_bytes(edited)
    dry = run80(env, "push", "--host", h.name, "--dry-run", "--diff")
    assert dry.returncode == 1 and "match neither" in dry.stderr and "(drifted)" in dry.stderr
    assert f"{SPEC}: a/ what the series expects (pristine, " in " ".join(dry.stdout.split())
    assert "+" in dry.stdout and "# a local edit" in dry.stdout
    doc = json.loads(subprocess.run([str(EXE), "push", "--host", h.name, "--dry-run", "--diff", "--json"],
                                    capture_output=True, text=True, env=env, timeout=120).stdout)
    entry = doc["hosts"][0]
    assert entry["error"]["code"] == "drift" and entry["outcome"] == "failed, host unchanged"
    _patch_applies(entry["diff"], pristine, edited, tmp_path / "push", SPEC)
    assert h.read(SPEC) == edited  # a dry run: nothing changed

    status = run80(env, "status", "--host", h.name, "--diff")
    assert status.returncode == 1, status.stderr  # answered, but drifted: needs attention
    assert f"{h.name}: 1 drifted file(s) against what sglang-0.5.12 expects:" in status.stdout
    assert "# a local edit" in status.stdout
    doc = json.loads(subprocess.run([str(EXE), "status", "--host", h.name, "--diff", "--json"],
                                    capture_output=True, text=True, env=env, timeout=120).stdout)
    _patch_applies(doc["hosts"][0]["diff"], pristine, edited, tmp_path / "status", SPEC)
    plain = json.loads(subprocess.run([str(EXE), "status", "--host", h.name, "--json"],
                                      capture_output=True, text=True, env=env, timeout=120).stdout)
    assert "diff" not in plain["hosts"][0]  # only when asked for


def test_status_diff_of_a_deployed_host_is_against_the_patched_file(fleet, tmp_path):
    import json

    env, hosts = fleet
    h = hosts["good"]
    assert subprocess.run([str(EXE), "push", "--host", h.name], env=env, capture_output=True,
                          timeout=120).returncode == 0
    patched = h.read(UTILS)
    h.file(UTILS).write_bytes(patched + b"# edited after the push\n")
    doc = json.loads(subprocess.run([str(EXE), "status", "--host", h.name, "--diff", "--json"],
                                    capture_output=True, text=True, env=env, timeout=120).stdout)
    diff = doc["hosts"][0]["diff"]
    assert f"{UTILS}: a/ what the series expects (patched by sglang-0.5.12), b/ the host's file" in diff
    _patch_applies(diff, patched, patched + b"# edited after the push\n", tmp_path, UTILS)
