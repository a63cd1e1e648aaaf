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

from ddtree_deploy.base.locations import repo_dir

#: The payload module that holds the grammar (installed as sglang/srt/speculative/<this>).
PAYLOAD_MODULE = "ddtree_schedule.py"
_NAME = "ddtree_deploy._payload_ddtree_schedule"


def _grammar() -> ModuleType:
    """The payload's grammar module, loaded once per process under a private name."""
    module = sys.modules.get(_NAME)
    if module is None:
        path = repo_dir("payload") / PAYLOAD_MODULE
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


_g = _grammar()
FLAG = _g.FLAG
CHAIN = _g.CHAIN
MAX_ENTRIES = _g.MAX_ENTRIES
Entry = _g.Entry
ScheduleError = _g.ScheduleError
parse = _g.parse
format_schedule = _g.format_schedule
from_table = _g.from_table
pick = _g.pick
ranges = _g.ranges
resolve = _g.resolve

__all__ = ["CHAIN", "FLAG", "MAX_ENTRIES", "Entry", "PAYLOAD_MODULE", "ScheduleError",
           "format_schedule", "from_table", "parse", "pick", "ranges", "resolve"]
