"""Help text and shell completion, as a user's terminal gets them.

Help: typer keeps a help paragraph's source line breaks, so a paragraph written over
several source lines wrapped at those breaks and again at the terminal's width. Each
paragraph must come out as one line on a console wide enough for it.
Completion: the real console script answers the protocol bash's completion function
speaks (the script `--show-completion bash` prints).
"""

from __future__ import annotations

import json
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
    ("history",): "Read from the history.jsonl of the host file's install in <state_dir> on the host "
                  "(read-only; takes no lock).",
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


def test_check_cmd_partly_matches_the_checker():
    # check_cmd keeps its own copy so `--help` need not import the checker.
    from ddtree_deploy.cli import check_cmd
    from ddtree_deploy.engine import check

    assert check_cmd.PARTLY == check.PARTLY


def test_completion_options_are_offered():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "--install-completion" in result.output and "--show-completion" in result.output


def _complete(words: str, cword: int) -> list[str]:
    env = dict(os.environ, _DDTREE_DEPLOY_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword))
    done = subprocess.run([str(EXE)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_console_script_completes_commands_and_subcommands():
    # The script bash sources. (`--show-completion` detects the calling shell from the process
    # tree, which under make or CI is sh and has no completion: ask for bash's script directly.)
    env = dict(os.environ, _DDTREE_DEPLOY_COMPLETE="source_bash")
    script = subprocess.run([str(EXE)], env=env, capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "_DDTREE_DEPLOY_COMPLETE=complete_bash" in script.stdout
    assert _complete("ddtree-deploy lo", 1) == ["lock"]
    assert _complete("ddtree-deploy lock r", 2) == ["release"]
    assert "--limit" in _complete("ddtree-deploy history --li", 2)


_SHAPE = r"""
import json, sys
import typer.main
from ddtree_deploy import cli
names = sys.argv[1:]
if names:
    cli.load_commands(names)
    from ddtree_deploy.cli.app import app
else:
    from ddtree_deploy.cli import app
group = typer.main.get_command(app)

def shape(cmd):
    subs = getattr(cmd, "commands", None)
    if subs:
        return {n: shape(c) for n, c in sorted(subs.items())}
    return sorted(p.name for p in cmd.params)

print(json.dumps({n: shape(c) for n, c in group.commands.items()}))
"""


def _shape(*modules: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _SHAPE, *modules], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_console_script_loads_each_command_whole_from_its_own_modules():
    """main() imports only COMMAND_MODULES[command]: each must register that command exactly
    as the full app has it (a command moved to another module fails here, by name)."""
    from ddtree_deploy.cli import COMMAND_MODULES

    full = _shape()
    assert set(full) == set(COMMAND_MODULES), "every command needs its entry in COMMAND_MODULES"
    for command, modules in COMMAND_MODULES.items():
        assert _shape(*modules).get(command) == full[command], command


def test_a_lock_command_does_not_import_the_checker_smoke_or_tuner(tmp_path):
    probe = ("import sys; sys.argv = ['ddtree-deploy', 'lock', '--help']\n"
             "from ddtree_deploy import cli\n"
             "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('ddtree_deploy.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, COLUMNS="100"))
    loaded = done.stdout.strip().splitlines()[-1]
    assert "ddtree_deploy.cli.lock_cmd" in loaded
    for heavy in ("ddtree_deploy.engine.check'", "ddtree_deploy.smoke.plan'", "ddtree_deploy.smoke.run'",
                  "ddtree_deploy.tuning.tune'", "ddtree_deploy.engine.patch_parse'", "ddtree_deploy.engine.patch_apply'"):
        assert heavy not in loaded, loaded


# ---------------------------------------------------------------- every help screen (issue 24, item 6)


def _all_commands() -> list[tuple[str, ...]]:
    import typer.main

    def walk(cmd, path):
        yield path
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            yield from walk(sub, (*path, name))

    return list(walk(typer.main.get_command(app), ()))


@pytest.fixture
def columns_80(monkeypatch):
    """An 80-column terminal for typer's help console (its width is read once, at import,
    from TERMINAL_WIDTH; else rich reads COLUMNS)."""
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 80)


def _help(*argv: str) -> str:
    result = CliRunner().invoke(app, list(argv), env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", _all_commands(), ids=lambda c: " ".join(c) or "top")
def test_every_help_screen_fits_80_columns_takes_h_and_shows_no_bool(command, columns_80):
    """`-h` is `--help`; a flag shows no `<bool>` type (it takes no value); every line fits
    an 80-column terminal."""
    text = _help(*command, "--help")
    assert _help(*command, "-h") == text
    assert "<bool>" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "-h" in text and "--help" in text


@pytest.mark.parametrize("command, table", [
    (("push",), "[smoke]"),
    (("tune",), "[smoke.launch]"),
    (("restart",), "[serve]"),
])
def test_inventory_table_names_survive_in_help(command, table, columns_80):
    """Help texts are plain text: rich markup used to read `[smoke]` as a style and drop it."""
    text = " ".join(_help(*command, "--help").split())  # the words, however the panel wrapped them
    assert table in text, text


def test_help_through_the_console_script_at_80_columns():
    """As a terminal gets it: `-h` with `--json` prints help and no JSON; [smoke] is there."""
    env = {k: v for k, v in os.environ.items() if k != "TERMINAL_WIDTH"}
    done = subprocess.run([str(EXE), "push", "-h", "--json"], capture_output=True, text=True,
                          timeout=60, env={**env, "COLUMNS": "80"})
    assert done.returncode == 0 and "Usage:" in done.stdout and "{" not in done.stdout, done.stdout + done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    assert "[smoke]" in " ".join(done.stdout.split()) and "<bool>" not in done.stdout


def test_every_command_says_parallel_and_matrix_still_takes_jobs(columns_80):
    """One spelling for "how many at once": --parallel / -j (issue 24, item 9). matrix's old
    --jobs still works, hidden; the two disagreeing is bad input."""
    import typer.main

    def walk(node):
        for sub in (getattr(node, "commands", None) or {}).values():
            yield from walk(sub) if getattr(sub, "commands", None) else [sub]

    for command in walk(typer.main.get_command(app)):
        names = {o for p in command.params for o in p.opts if not getattr(p, "hidden", False)}
        assert "--jobs" not in names, command.name
        if "-j" in names:
            assert any(p.opts[:2] == ["--parallel", "-j"] for p in command.params), command.name
    text = _help("matrix", "--help")
    assert "--parallel" in text and "--jobs" not in text
    both = CliRunner().invoke(app, ["matrix", "--parallel", "2", "--jobs", "1", "--offline"])
    assert both.exit_code == 2 and "--jobs is the old name of --parallel" in both.stderr
