"""Command-line entry point: ``ddtree-deploy``.

Each command group lives in its own module and registers itself on ``app``
when imported here.
"""

from __future__ import annotations

from ddtree_deploy.cli.app import app

# Command modules register on import. Keep this list in README order.
from ddtree_deploy.cli import (  # noqa: E402,F401
    check_cmd,
    snapshot_cmd,
    deploy_cmd,
    smoke_cmd,
    matrix_cmd,
    port_cmd,
    inventory_cmd,
    image_cmd,
    tune_cmd,
    history_cmd,
    lock_cmd,
)


def main() -> None:
    app()


__all__ = ["app", "main"]
