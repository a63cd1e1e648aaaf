"""Help text and shell completion, as a user's terminal gets them.

Help: typer keeps a help paragraph's source line breaks, so a paragraph written over
several source lines wrapped at those breaks and again at the terminal's width. Each
paragraph must come out as one line on a console wide enough for it.
Completion: the real console script answers the protocol bash's completion function
speaks (the script `--show-completion bash` prints).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app

EXE = Path(sys.executable).parent / "ddtree-deploy"

PARAGRAPHS = {
    ("matrix",): "Exit 1 when a release inside its family's range fails (and, with --strict, when a "
                 "release is newer than every family's range).",
    ("port",): "Hunks that do not land are kept as they were and written to <patch>.rej with the nearest "
               "location and the differing lines; the working tree holds the release's files with every "
               "landed hunk applied.",
    ("series", "refresh"): "One patch per series entry, same order, same header text. A change is given to "
                           "the entry whose own lines it resembles most (else to the last entry touching that "
                           "file); the regenerated series is checked to rebuild the tree exactly before "
                           "anything is written.",
    ("lock", "release"): "Exit 1 when the lock's process may still run and --force is not given.",
    ("history",): "Read from <state_dir>/history.jsonl on the host (read-only; takes no lock).",
}


@pytest.mark.parametrize("command", list(PARAGRAPHS), ids=" ".join)
def test_help_paragraphs_wrap_only_at_the_terminal(command):
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert PARAGRAPHS[command] in lines, result.output


def test_port_and_series_refresh_live_in_their_own_module():
    from ddtree_deploy.cli import matrix_cmd, port_cmd

    assert port_cmd.port_command.__module__ == "ddtree_deploy.cli.port_cmd"
    assert not hasattr(matrix_cmd, "port_command") and not hasattr(matrix_cmd, "series_app")


def test_completion_options_are_offered():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "--install-completion" in result.output and "--show-completion" in result.output


def _complete(words: str, cword: int) -> list[str]:
    env = dict(os.environ, _DDTREE_DEPLOY_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword))
    done = subprocess.run([str(EXE)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_console_script_completes_commands_and_subcommands():
    script = subprocess.run([str(EXE), "--show-completion", "bash"], capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "_DDTREE_DEPLOY_COMPLETE=complete_bash" in script.stdout
    assert _complete("ddtree-deploy lo", 1) == ["lock"]
    assert _complete("ddtree-deploy lock r", 2) == ["release"]
    assert "--limit" in _complete("ddtree-deploy history --li", 2)
