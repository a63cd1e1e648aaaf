"""Command-line entry point: ``ddtree-deploy``.

Each command group lives in its own module and registers itself on ``app`` when
imported. ``from ddtree_deploy.cli import app`` gives the app with every command
(tests, library use); the console script (``main``) imports only the module(s) of
the command it was asked for, so ``ddtree-deploy lock status`` does not pay for the
checker, the smoke and the tuner (``--help`` with no command, completion and any
word it does not know load everything, so nothing is ever missing).
"""

from __future__ import annotations

import importlib
import sys

# Load the shared app module now, then drop the attribute its import binds on this package
# (the *module* ``ddtree_deploy.cli.app``): ``app`` here must be the Typer app, with every
# command, which __getattr__ below supplies. A module is bound on its package only when
# first loaded, so later imports of ddtree_deploy.cli.app leave ``app`` alone.
importlib.import_module("ddtree_deploy.cli.app")
globals().pop("app", None)

# Command modules register on import. Keep this list in the order of docs/commands.md.
MODULES = (
    "check_cmd",
    "snapshot_cmd",
    "deploy_cmd",
    "serve_cmd",
    "smoke_cmd",
    "matrix_cmd",
    "port_cmd",
    "inventory_cmd",
    "hosts_cmd",
    "image_cmd",
    "tune_cmd",
    "history_cmd",
    "lock_cmd",
)

#: The modules that register each top-level command (tests/integration/test_cli_help.py checks that
#: loading only these gives the command exactly as the full app has it).
COMMAND_MODULES = {
    "check": ("check_cmd",),
    "snapshot": ("snapshot_cmd",),
    "push": ("deploy_cmd",),
    "rollback": ("deploy_cmd",),
    "status": ("deploy_cmd",),
    "restart": ("deploy_cmd", "serve_cmd"),
    "smoke": ("smoke_cmd",),
    "matrix": ("matrix_cmd",),
    "port": ("port_cmd",),
    "series": ("port_cmd",),
    "inventory": ("inventory_cmd",),
    "hosts": ("hosts_cmd",),
    "image": ("image_cmd",),
    "tune": ("tune_cmd",),
    "history": ("history_cmd",),
    "lock": ("lock_cmd",),
}


def load_commands(names=MODULES) -> None:
    for name in names:
        importlib.import_module(f"ddtree_deploy.cli.{name}")


def _modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules ``argv`` needs: the named command's, else all of them."""
    import os

    if any(k.endswith("_COMPLETE") and k.startswith("_DDTREE_DEPLOY") for k in os.environ):
        return MODULES  # shell completion lists every command
    # Top-level options take no value (--version, --help), except --show/--install-completion
    # whose shell name is no command: the first word is the command, if any.
    first = next((a for a in argv if not a.startswith("-")), None)
    return COMMAND_MODULES.get(first, MODULES) if first else MODULES


def main() -> None:
    from ddtree_deploy.cli.app import app as typer_app

    load_commands(_modules_for(sys.argv[1:]))
    try:
        typer_app()
    finally:
        # The command is done; what is left is the interpreter's shutdown, whose garbage
        # collections walk every object the imports made (typer, rich, pydantic, paramiko):
        # about 0.1 s of each run here, 6-12% of a push + rollback (bench.push_bench --rev).
        # Frozen objects are skipped by those passes. The atexit hooks (temporary folders'
        # finalizers, logging's flush) still run; only an object left in a reference cycle
        # goes unfinalized, and the CLI closes what it writes with ``with``.
        import gc

        gc.freeze()


def __getattr__(name: str):
    # ``app`` on demand, with every command: importing ddtree_deploy.cli.app (which each
    # command module does) binds the *module* here, so the name is dropped below and
    # resolved through this hook instead.
    if name == "app":
        load_commands()
        from ddtree_deploy.cli.app import app as typer_app

        globals()["app"] = typer_app
        return typer_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main", "load_commands"]
