"""Command-line entry point: ``ddtree-deploy``.

Each command group lives in its own module and registers itself on ``app``
when imported here.
"""

from __future__ import annotations

from ddtree_deploy.cli.app import app

# Command modules register on import. Keep this list in README order.
from ddtree_deploy.cli import check_cmd  # noqa: E402,F401


def main() -> None:
    app()


__all__ = ["app", "main"]
