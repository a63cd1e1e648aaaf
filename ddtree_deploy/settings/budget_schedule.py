"""DDTREE's budget schedule grammar for the toolkit (``tune --apply`` writes schedules with it).

One grammar, shared with the server: this module loads the payload's own
``ddtree_schedule.py`` (the file the ``sglang-0.5.20`` family installs into SGLang, standard
library only) from the toolkit's payload folder (``base.locations``: the checkout's payload/,
an installed toolkit's copy, or ``DDTREE_DEPLOY_PAYLOAD``), so what the toolkit writes is what
the payload parses, with no second copy to drift. The payload cannot import the toolkit (a GPU
host has no toolkit), so the toolkit imports the payload.

    parse(text) -> entries          ScheduleError (a ValueError): one line naming the entry
    from_table(rows) -> text        a schedule from (running batch, (budget, top-K) | "chain")
    format_schedule(entries), pick(entries, batch_size), ranges(entries, max_batch)
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.locations import repo_dir

#: The payload module that holds the grammar (installed as sglang/srt/speculative/<this>).
PAYLOAD_MODULE = "ddtree_schedule.py"
_NAME = "ddtree_deploy._payload_ddtree_schedule"


def _grammar() -> ModuleType:
    """The payload's grammar module, loaded once per process under a private name."""
    module = sys.modules.get(_NAME)
    if module is None:
        path = repo_dir("payload") / PAYLOAD_MODULE
        if not path.is_file():
            raise DeployError(f"{path}: the payload folder has no budget schedule grammar",
                              hint="point DDTREE_DEPLOY_PAYLOAD at a payload folder that has "
                              f"{PAYLOAD_MODULE} (the toolkit's payload/ has it)")
        spec = importlib.util.spec_from_file_location(_NAME, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path}: cannot load the budget schedule grammar")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module  # dataclasses resolve the module by name while it loads
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_NAME]
            raise
    return module


#: The grammar's names, read from the payload's module on first use (not at import: every
#: push imports this module through tune's code, and a push needs no schedule unless one is
#: configured; a payload folder of the operator's own need not carry the grammar).
_EXPORTS = frozenset({"FLAG", "CHAIN", "MAX_ENTRIES", "Entry", "ScheduleError", "parse", "format_schedule",
                      "from_table", "pick", "ranges", "resolve"})


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(_grammar(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The grammar's names come through __getattr__, so ruff cannot see them defined.
__all__ = ["CHAIN", "FLAG", "MAX_ENTRIES", "Entry", "PAYLOAD_MODULE", "ScheduleError", "format_schedule", "from_table", "parse", "pick", "ranges", "resolve"]  # noqa: F822
