"""The smoke's settings: a family's ``[smoke]`` table (``family.toml``: how its tree shows)
and a host's ``[smoke]`` table (inventory: which levels, their deadlines, the launch
level's server). Pure: parsed and validated here through ``toml_input.TomlFile``, so each
wrong key is the one message every TOML input gives,
``<file>: line N: smoke.<key>: <what is wrong>; <what to do>``. What the host program is
asked to do is ``smoke_plan``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.toml_input import Table, TomlFile

LEVELS = ("compile", "import", "cli", "launch")
DEFAULT_LEVELS = ("compile", "import", "cli")  # launch needs a GPU: only when asked for
DEFAULT_PROBE = "Explain in one sentence why the sky is blue."
TEMPLATE_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# The placeholders a [smoke.launch] command template may use (smoke_plan.launch_argv fills them).
_TEMPLATE_NAMES = ("python", "model", "draft_model", "budget", "topk", "host", "port", "extra_args")


@dataclass(frozen=True)
class FamilySmoke:
    """A family's ``[smoke]`` table in ``family.toml``: what its tree looks like to the smoke.

    The flags differ between families (a v2 family may name its budget otherwise), so the
    smoke reads them from the family, never from this module.
    """

    budget_flag: str = "--speculative-ddtree-budget"  # sets the tree budget B
    topk_flag: str = "--speculative-ddtree-topk"  # per-depth cap, when the inventory sets one
    budget_field: str = "speculative_ddtree_budget"  # ServerArgs / /server_info key holding B
    worker_class: str | None = None  # the class DDTREE must resolve to (None: marker only)
    worker_module: str | None = None  # its module (to honour smoke.import_exclude)
    probe_args: tuple[str, ...] = ("--device", "cpu", "--attention-backend", "triton")
    # [module, function] reporting what DDTREE does with a hybrid target's resolved ServerArgs
    # (a family serving hybrid targets names it; the import and cli levels then show the
    # recurrent tree path): None for a family without one.
    hybrid_report: tuple[str, str] | None = None
    # The flag of the family's per-batch-size budget schedule (payload/ddtree_schedule.py's
    # grammar; the v2 family's --speculative-ddtree-budget-schedule): None for a family whose
    # server takes none ([smoke.launch] budget_schedule is refused there).
    schedule_flag: str | None = None


FAMILY_SMOKE_DEFAULT = FamilySmoke()
_FAMILY_SMOKE_KEYS = tuple(FamilySmoke.__dataclass_fields__)


def _doc(given: Any, *, source: str | None) -> TomlFile:
    """The TomlFile to read ``[smoke]`` from: the file's own (its lines name the key's line),
    or, for a table already parsed, one over ``{"smoke": table}`` (no lines to give)."""
    if isinstance(given, TomlFile):
        return given
    if isinstance(given, Table) and given.doc is not None and given.key == "smoke":
        return given.doc  # the host file it was read from: its lines
    return TomlFile.of({} if given is None else {"smoke": given}, source=source or "<inventory>")


_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_family_smoke(table: Any, *, where: str | None = None) -> FamilySmoke:
    """``[smoke]`` of a family.toml -> FamilySmoke, or one BadInput line naming the key.

    ``table``: the family.toml's TomlFile (messages carry the key's line), or the raw
    ``[smoke]`` value (None: no table) with ``where`` naming its file.
    """
    doc = _doc(table, source=where)
    if doc.get("smoke") is None:
        return FAMILY_SMOKE_DEFAULT
    doc.table("smoke")
    doc.unknown("smoke", _FAMILY_SMOKE_KEYS)
    values: dict[str, Any] = {}
    for key in ("budget_flag", "topk_flag", "schedule_flag"):
        flag = doc.get(f"smoke.{key}")
        if flag is not None:
            if not isinstance(flag, str) or not _FLAG.fullmatch(flag):
                raise doc.bad(f"smoke.{key}", f"must be a long option such as "
                              f"'--speculative-ddtree-budget', not {flag!r}",
                              f'write the flag the family\'s server takes, e.g. {key} = "--speculative-ddtree-budget"')
            values[key] = flag
    for key in ("budget_field", "worker_class", "worker_module"):
        name = doc.get(f"smoke.{key}")
        if name is not None:
            module = key == "worker_module"
            if not isinstance(name, str) or not (_MODULE if module else _IDENTIFIER).fullmatch(name):
                raise doc.bad(f"smoke.{key}",
                              f"must be a Python {'module path' if module else 'identifier'}, not {name!r}",
                              f'write it in quotes, e.g. {key} = '
                              f'"{"sglang.srt.speculative.dflash_worker" if module else "DFlashWorker"}"')
            values[key] = name
    if doc.get("smoke.probe_args") is not None:
        values["probe_args"] = tuple(doc.strings("smoke.probe_args", nonempty=True,
                                                 example='["--device", "cpu"]'))
    if doc.get("smoke.hybrid_report") is not None:
        example = '["sglang.srt.speculative.ddtree_hybrid", "describe"]'
        pair = doc.strings("smoke.hybrid_report", nonempty=True, example=example)
        if len(pair) != 2 or not _MODULE.fullmatch(pair[0]) or not _IDENTIFIER.fullmatch(pair[1]):
            raise doc.bad("smoke.hybrid_report", f"must be [module, function], not {list(pair)!r}",
                          f"write hybrid_report = {example}")
        values["hybrid_report"] = (pair[0], pair[1])
    return FamilySmoke(**values)


def family_smoke(series: Any) -> FamilySmoke:
    """The loaded series' ``[smoke]`` settings (validated when its family.toml was read)."""
    found = getattr(series.info, "smoke", None)
    return found if isinstance(found, FamilySmoke) else FAMILY_SMOKE_DEFAULT


# ------------------------------------------------------------------ the host's [smoke]


@dataclass(frozen=True)
class LaunchSettings:
    """``[smoke.launch]``: how the launch level starts the host's server."""

    model: str | None = None
    draft_model: str | None = None
    budget: int | None = None
    topk: int | None = None
    host: str = "127.0.0.1"
    port: int = 30188
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None  # argv template; None = sglang.launch_server
    # A per-batch-size budget schedule (``1:128/8,8:64/4,32:chain``: the payload's grammar,
    # settings/budget_schedule.py), sent with the family's ``schedule_flag`` instead of the
    # budget and top-K flags (the server refuses a schedule beside them). Written by
    # ``tune --apply`` (tuning/apply.py); never beside ``budget`` / ``topk``.
    budget_schedule: str | None = None
    gpu: bool = True
    min_free_gib: float = 0.0
    ready_timeout_s: float = 900.0
    probe_timeout_s: float = 300.0
    term_grace_s: float = 30.0
    probe_prompt: str = DEFAULT_PROBE
    max_new_tokens: int = 64
    # The host file it was read from (None: built by hand), for the checks made when the
    # launch level is planned (a template value not set) to name the key's line too.
    doc: TomlFile | None = field(default=None, compare=False, repr=False)

    def bad(self, key: str, what: str, todo: str, *, source: str | None = None) -> BadInput:
        """The one TOML message for a ``smoke.launch`` key found wrong after parsing."""
        doc = self.doc or TomlFile.of({}, source=source or "<inventory>")
        return doc.bad(key, what, todo)


@dataclass(frozen=True)
class SmokeSettings:
    """The host's ``[smoke]`` table, validated."""

    levels: tuple[str, ...] = DEFAULT_LEVELS
    timeout_s: float = 300.0  # each of the import and cli levels
    import_exclude: tuple[str, ...] = ()  # modules this host cannot import (say why in the file)
    launch: LaunchSettings | None = None


def parse_settings(table: Mapping[str, Any] | TomlFile, *, source: str | None) -> SmokeSettings:
    """``[smoke]`` -> SmokeSettings, or one BadInput line naming the file, line and key.

    ``table``: ``host.smoke`` as the inventory keeps it (a ``toml_input.Table`` that remembers
    its file, so a wrong key names its line), the host file's TomlFile, or a plain dict
    (built by hand: the same message, without a line). Checked when a command uses it, not
    when the file is read: ``push --no-smoke`` skips the table.
    """
    doc = _doc(table, source=source)
    doc.table("smoke")
    doc.unknown("smoke", ("levels", "timeout_s", "import_exclude", "launch"))
    levels = doc.strings("smoke.levels", default=DEFAULT_LEVELS, example='["compile", "import", "cli"]')
    for level in levels:
        if level not in LEVELS:
            raise doc.bad("smoke.levels", f"unknown level {level!r}", f"use levels from {', '.join(LEVELS)}")
    launch = None
    if doc.get("smoke.launch") is not None:
        doc.table("smoke.launch")
        launch = _parse_launch(doc)
    if "launch" in levels and launch is None:
        raise doc.bad("smoke.levels", "'launch' needs a [smoke.launch] table",
                      "add [smoke.launch] with model, draft_model, port...")
    return SmokeSettings(
        levels=tuple(sorted(set(levels), key=LEVELS.index)),
        timeout_s=doc.seconds("smoke.timeout_s", default=300.0),
        import_exclude=tuple(doc.strings("smoke.import_exclude", example='["sglang.srt.x"]')),
        launch=launch,
    )


def _parse_launch(doc: TomlFile) -> LaunchSettings:
    doc.unknown("smoke.launch", LaunchSettings.__dataclass_fields__)
    d = LaunchSettings()
    command = None
    if doc.get("smoke.launch.command") is not None:
        command = tuple(doc.strings("smoke.launch.command",
                                    example='["{python}", "-m", "sglang.launch_server", "--model-path", "{model}"]'))
        if not command:
            raise doc.bad("smoke.launch.command", "must not be empty",
                          "name the program and its arguments, or remove command (sglang.launch_server)")
        for arg in command:
            for name in TEMPLATE_PLACEHOLDER.findall(arg):
                if name not in _TEMPLATE_NAMES:
                    raise doc.bad("smoke.launch.command", f"unknown placeholder {{{name}}}",
                                  f"use {', '.join('{%s}' % n for n in _TEMPLATE_NAMES)}")
    k = "smoke.launch."
    return LaunchSettings(
        model=doc.string(k + "model", example="/models/Qwen3-8B"),
        draft_model=doc.string(k + "draft_model", example="/models/Qwen3-8B-DFlash-b16"),
        budget=doc.integer(k + "budget", default=None, lo=1, hi=1024),
        topk=doc.integer(k + "topk", default=None, lo=1, hi=1 << 20),
        host=doc.string(k + "host", default=d.host, example=d.host),
        port=doc.integer(k + "port", default=d.port, lo=1, hi=65535),
        extra_args=tuple(doc.strings(k + "extra_args", example='["--tp-size", "1"]')),
        command=command,
        gpu=doc.boolean(k + "gpu", default=d.gpu),
        min_free_gib=doc.number(k + "min_free_gib", default=d.min_free_gib, zero=True),
        ready_timeout_s=doc.seconds(k + "ready_timeout_s", default=d.ready_timeout_s),
        probe_timeout_s=doc.seconds(k + "probe_timeout_s", default=d.probe_timeout_s),
        term_grace_s=doc.seconds(k + "term_grace_s", default=d.term_grace_s),
        probe_prompt=doc.string(k + "probe_prompt", default=d.probe_prompt, example=d.probe_prompt),
        max_new_tokens=doc.integer(k + "max_new_tokens", default=d.max_new_tokens, lo=1, hi=4096),
        budget_schedule=_budget_schedule(doc, k + "budget_schedule"),
        doc=doc if doc.lines else None,
    )


def _budget_schedule(doc: TomlFile, key: str) -> str | None:
    """``[smoke.launch] budget_schedule``, checked with the payload's own grammar (the text the
    server will parse), in the canonical form; never beside ``budget`` / ``topk``."""
    text = doc.string(key, example="1:128/8,8:64/4,32:chain")
    if text is None:
        return None
    from ddtree_deploy.settings import budget_schedule

    try:
        entries = budget_schedule.parse(text)
    except budget_schedule.ScheduleError as exc:
        raise doc.bad(key, f"entry {exc.entry!r}: {exc.why}",
                      f'write e.g. budget_schedule = "{budget_schedule.format_schedule(exc.repaired)}" '
                      "(docs/patches-v2.md: The budget schedule)") from None
    for other in ("budget", "topk"):
        if doc.get(key.rsplit(".", 1)[0] + "." + other) is not None:
            raise doc.bad(key, f"set beside {other}: the server refuses a schedule beside "
                          "--speculative-ddtree-budget / -topk (each entry carries its own)",
                          f"remove {other} from [smoke.launch], or remove budget_schedule")
    return str(budget_schedule.format_schedule(entries))
