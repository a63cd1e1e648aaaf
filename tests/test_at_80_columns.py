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

from sshd_host import DEPLOY_SERIES, SPEC, UTILS, sshd  # noqa: F401  (shared fixtures)

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
