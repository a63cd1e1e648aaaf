"""`tune --apply`: write the sweep's result into the host's inventory file, as one budget or as
the per-batch-size budget schedule.

``decide`` is ``--apply-as``: ``budget`` writes the choice at ``--at`` (``budget``/``topk``),
``schedule`` writes the schedule the sweep implies (``tune.plan``: the payload's own grammar)
as ``budget_schedule``, ``auto`` (the default) writes the schedule when the winners differ
across the concurrencies and the host's family takes one (its ``schedule_flag``), else the
budget. The server refuses a schedule beside ``--speculative-ddtree-budget`` / ``-topk``, so
writing one removes the other (``[smoke.launch]`` never holds both: smoke_settings refuses it).

``tomlkit`` edits the document in place, so every comment, blank line and key order of the
file stays as the person who wrote it left it; only those keys change (or are added at the end
of ``[smoke.launch]``). What is written is read back with the toolkit's own loader
(``smoke_settings.parse_settings``) before the file is replaced: an inventory ``--apply``
would leave unreadable is never written. The change is always shown as a unified diff.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.tuning import tune

APPLY_AS = ("auto", "schedule", "budget")
SCHEDULE_KEY = "budget_schedule"


def check_apply_as(value: str) -> str:
    if value not in APPLY_AS:
        raise BadInput(f"--apply-as {value!r}: not one of {', '.join(APPLY_AS)}",
                       hint="auto (the default): the schedule when the winners differ across concurrencies and the "
                            "host's family takes one, else the budget")
    return value


@dataclass(frozen=True)
class Decision:
    """What ``--apply`` writes: ``schedule``, ``budget`` or ``nothing``, and why (said in the output)."""

    write: str
    why: str


def decide(apply_as: str, plan: tune.SchedulePlan, choice: tune.Choice, *, schedule_flag: str | None,
           family: str) -> Decision:
    """``--apply-as`` against the sweep's plan and choice and the host's family (``schedule_flag``
    None: the family takes no schedule; ``--apply-as schedule`` there is refused before the
    sweep, by ``tune_run``)."""
    if choice.best is not None:
        budget = Decision("budget", f"the choice at concurrency {choice.at}")
    else:
        budget = Decision("nothing", "no DDTree configuration qualified; the inventory is unchanged")
    if apply_as == "budget":
        return Decision(budget.write, f"--apply-as budget: {budget.why}")
    if apply_as == "schedule":
        if schedule_flag is None:
            return Decision("nothing", f"--apply-as schedule: the family {family} takes no budget schedule")
        if plan.text is None:
            return Decision("nothing", f"--apply-as schedule: no schedule to write ({plan.why_none})")
        return Decision("schedule", "--apply-as schedule")
    if not plan.differ:
        return Decision(budget.write, f"auto: the same configuration is fastest at every concurrency swept: "
                                      f"{budget.why}")
    if schedule_flag is None:
        return Decision(budget.write, f"auto: the winners differ across concurrencies, but the family {family} "
                                      "takes no budget schedule (the v2 family, SGLang 0.5.20 - 0.5.23, does): "
                                      f"{budget.why}")
    if plan.text is None:
        return Decision(budget.write, f"auto: no schedule could be written ({plan.why_none}): {budget.why}")
    return Decision("schedule", f"auto: the winners differ across concurrencies and the family {family} takes a "
                                "budget schedule")


def edit_launch(text: str, *, budget: int | None = None, topk: int | None = None, schedule: str | None = None,
                source: str = "<inventory>") -> str:
    """The inventory text with ``[smoke.launch]`` set (pure): ``schedule`` -> ``budget_schedule``
    (``budget``/``topk`` removed), else ``budget``/``topk`` (``budget_schedule`` removed).
    The result is read back with the toolkit's loader; one that would not load is refused."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise BadInput(f"{source}: not valid TOML ({exc}); fix the file before --apply") from None
    smoke = doc.get("smoke")
    launch = smoke.get("launch") if smoke is not None and hasattr(smoke, "get") else None
    if launch is None or not hasattr(launch, "__setitem__"):
        what = "budget schedule" if schedule is not None else "budget and top-K"
        raise BadInput(f"{source}: no [smoke.launch] table to write the {what} into")
    if schedule is not None:
        for key in ("budget", "topk"):
            if key in launch:
                del launch[key]
        launch[SCHEDULE_KEY] = schedule
    else:
        if SCHEDULE_KEY in launch:
            del launch[SCHEDULE_KEY]
        launch["budget"] = budget
        launch["topk"] = topk
    after = tomlkit.dumps(doc)
    _read_back(after, budget=budget, topk=topk, schedule=schedule, source=source)
    return after


def _read_back(text: str, *, budget, topk, schedule, source: str) -> None:
    """The written text, loaded as every command loads it, must say what was written."""
    try:
        import tomllib
    except ImportError:  # Python 3.10 (pyproject's dependency)
        import tomli as tomllib

    from ddtree_deploy.settings.smoke import parse_settings

    try:
        launch = parse_settings(tomllib.loads(text).get("smoke"), source=source).launch
    except (BadInput, ValueError) as exc:
        raise BadInput(f"{source}: --apply would leave [smoke.launch] unreadable ({exc}); nothing written") from None
    got = (launch.budget_schedule,) if schedule is not None else (launch.budget, launch.topk)
    want = (schedule,) if schedule is not None else (budget, topk)
    if got != want:
        raise BadInput(f"{source}: --apply wrote {want} but the file reads back {got}; nothing written")


def apply_launch(path: Path, *, budget: int | None = None, topk: int | None = None,
                 schedule: str | None = None) -> dict:
    """Rewrite ``path`` (atomically: temp file + rename) and return what changed."""
    before = path.read_text(encoding="utf-8")
    after = edit_launch(before, budget=budget, topk=topk, schedule=schedule, source=str(path))
    diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"{path} (before)", tofile=f"{path} (after)"))
    what = {"as": "schedule" if schedule is not None else "budget", "budget": budget, "topk": topk,
            "schedule": schedule}
    if after == before:
        return {"written": False, "file": str(path), "diff": "", **what,
                "why": "the inventory already has these values"}
    tmp = path.with_name(f".{path.name}.tune-tmp")
    tmp.write_text(after, encoding="utf-8")
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return {"written": True, "file": str(path), "diff": diff, **what}


__all__ = ["APPLY_AS", "Decision", "SCHEDULE_KEY", "apply_launch", "check_apply_as", "decide", "edit_launch"]
