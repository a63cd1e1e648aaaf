"""`ddtree-deploy --version`: the installed distribution's version, exit 0."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from ddtree_deploy.cli import app


def test_version_prints_the_package_version_and_exits_0():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0, r.output
    assert r.stdout == f"ddtree-deploy {version('ddtree-deploy')}\n"


def test_version_does_not_hide_the_commands():
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    assert "--version" in r.stdout and "check" in r.stdout
