"""next_step: every "what to run next" command the toolkit prints is a real command line.

Each text is parsed by the real typer app (with --help appended, so nothing runs): an option
that does not exist, or a missing argument the parser needs, fails here, not in a user's shell.
"""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from ddtree_deploy import next_step
from ddtree_deploy.cli import app

TEXTS = {
    "push": next_step.push("gpu1"),
    "rollback": next_step.rollback("gpu1"),
    "smoke": next_step.smoke("gpu1"),
    "status": next_step.status("gpu1"),
    "status (all)": next_step.status(),
    "check --release": next_step.check(release="0.5.12.post1", family="sglang-0.5.12"),
    "check --snapshot": next_step.check(snapshot="gpu1"),
    "snapshot pull": next_step.snapshot_pull("gpu1"),
    "snapshot release": next_step.snapshot_release("0.5.12.post1"),
    "series refresh": next_step.series_refresh("sglang-0.5.13", "build/port-sglang-0.5.13"),
    "lock release": next_step.lock_release("gpu1"),
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_each_next_step_is_one_backticked_command_the_cli_parses(name):
    text = TEXTS[name]
    assert text.startswith("`ddtree-deploy ") and text.endswith("`") and text.count("`") == 2, text
    argv = shlex.split(text.strip("`"))[1:]
    result = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, (text, result.output)


def test_smoke_or_rollback_names_both_ways_on():
    assert next_step.smoke_or_rollback("h") == "run `ddtree-deploy smoke --host h` or `ddtree-deploy rollback --host h`"


def test_push_hint_for_a_series_that_does_not_apply_is_a_check_that_runs(monkeypatch, test_family_dir):
    """The push's "does not apply" hint used to be a bare `ddtree-deploy check`, which check
    itself refuses (exit 2: it needs --release or --snapshot); now it names both."""
    from ddtree_deploy import desired
    from ddtree_deploy.errors import DeployError
    from ddtree_deploy.series import load_family

    series = load_family(test_family_dir)
    # Pristine files that are not SGLang's (every patched file empty): the series fails.
    monkeypatch.setattr(desired, "pristine_files",
                        lambda host, version, paths: ("release snapshot sglang-0.5.12", {p: b"" for p in paths}))
    with pytest.raises(DeployError) as e:
        desired.desired_for(series, "gpu1", {"sglang_version": "0.5.12"})
    want = next_step.check(release="0.5.12", family=series.name)
    assert e.value.hint == f"run {want} for the hunk-by-hunk report; nothing was changed"
    argv = shlex.split(want.strip("`"))[1:]
    assert CliRunner().invoke(app, [*argv, "--help"]).exit_code == 0
    assert CliRunner().invoke(app, ["check"]).exit_code == 2  # what the old hint ran
