"""`push` shows the launch level's heartbeat, as `smoke` does: the host's smoke program
sends a keep-alive while a slow server starts, and the push's progress prints it
(`H: smoke launch: still running (N s)`) instead of going silent for minutes.

Over a real sshd on loopback, a real push of the real series onto the real SGLang
0.5.12.post1 files; the launch level runs against ddtree_testkit/standin_server.py, a
STAND-IN for a GPU SGLang server (no GPU here), told to become ready only after 3 s. The
keep-alive interval is 20 s on real hosts; the test hook ``smoke_heartbeat_s`` makes it
0.5 s so that a 3 s start shows several.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base import hooks
from ddtree_deploy.cli import app

from test_smoke_ssh import FAMILY, STANDIN, make_host  # noqa: E402
from ddtree_deploy.sandbox import free_port  # noqa: E402

pytestmark = [pytest.mark.sshd, pytest.mark.sglang_env]


def test_push_prints_the_launch_levels_heartbeat(sshd, tmp_path, monkeypatch):  # noqa: F811
    port = free_port()
    make_host(sshd, tmp_path, "h-beat", ["launch"], launch_extra=textwrap.dedent(f"""
        port = {port}
        command = ["{{python}}", "{STANDIN}", "--ready-after", "3", "--model-path", "{{model}}",
                   "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{{draft_model}}",
                   "--speculative-ddtree-budget", "{{budget}}", "--port", "{{port}}", "{{extra_args}}"]
    """))
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"smoke_heartbeat_s": 0.5}))
    r = CliRunner().invoke(app, ["push", "--host", str(tmp_path / "hosts" / "h-beat.toml"), "--family", str(FAMILY)])
    assert r.exit_code == 0, r.output
    assert "smoke passed: journal marked deployed" in r.stdout
    beats = [line for line in r.stderr.splitlines() if line.startswith("h-beat: smoke launch: still running (")]
    assert len(beats) >= 3, r.stderr
    # In order: the heartbeats come while the level runs, before its timed line.
    lines = r.stderr.splitlines()
    done = next(i for i, line in enumerate(lines) if line.startswith("h-beat: smoke launch ("))
    assert all(lines.index(b) < done for b in beats)
