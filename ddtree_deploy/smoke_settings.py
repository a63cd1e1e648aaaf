"""The smoke's settings: a family's ``[smoke]`` table (``family.toml``: how its tree shows)
and a host's ``[smoke]`` table (inventory: which levels, their deadlines, the launch
level's server). Pure: parsed and validated here, each wrong key one BadInput line naming
the file and the key. What the host program is asked to do is ``smoke_plan``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ddtree_deploy.errors import BadInput

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


FAMILY_SMOKE_DEFAULT = FamilySmoke()
_FAMILY_SMOKE_KEYS = tuple(FamilySmoke.__dataclass_fields__)


def parse_family_smoke(table: Any, *, where: str) -> FamilySmoke:
    """``[smoke]`` of a family.toml -> FamilySmoke, or one BadInput line naming the key."""
    if table is None:
        return FAMILY_SMOKE_DEFAULT
    if not isinstance(table, dict):
        raise BadInput(f"{where}: key smoke: must be a table ([smoke])")
    unknown = sorted(set(table) - set(_FAMILY_SMOKE_KEYS))
    if unknown:
        raise BadInput(f"{where}: key smoke.{unknown[0]}: unknown key; known keys here: "
                       f"{', '.join(sorted(_FAMILY_SMOKE_KEYS))}")
    values: dict[str, Any] = {}
    for key in ("budget_flag", "topk_flag"):
        if key in table:
            flag = table[key]
            if not isinstance(flag, str) or not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
                raise BadInput(f"{where}: key smoke.{key}: must be a long option such as "
                               f"'--speculative-ddtree-budget', not {flag!r}")
            values[key] = flag
    for key in ("budget_field", "worker_class", "worker_module"):
        if key in table:
            name = table[key]
            pattern = r"[A-Za-z_][A-Za-z0-9_]*" + (r"(\.[A-Za-z_][A-Za-z0-9_]*)*" if key == "worker_module" else "")
            if not isinstance(name, str) or not re.fullmatch(pattern, name):
                raise BadInput(f"{where}: key smoke.{key}: must be a Python "
                               f"{'module path' if key == 'worker_module' else 'identifier'}, not {name!r}")
            values[key] = name
    if "probe_args" in table:
        args = table["probe_args"]
        if not isinstance(args, list) or not all(isinstance(a, str) and a and "\0" not in a for a in args):
            raise BadInput(f"{where}: key smoke.probe_args: must be a list of non-empty strings, not {args!r}")
        values["probe_args"] = tuple(args)
    return FamilySmoke(**values)


def family_smoke(series) -> FamilySmoke:
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
    gpu: bool = True
    min_free_gib: float = 0.0
    ready_timeout_s: float = 900.0
    probe_timeout_s: float = 300.0
    term_grace_s: float = 30.0
    probe_prompt: str = DEFAULT_PROBE
    max_new_tokens: int = 64


@dataclass(frozen=True)
class SmokeSettings:
    """The host's ``[smoke]`` table, validated."""

    levels: tuple[str, ...] = DEFAULT_LEVELS
    timeout_s: float = 300.0  # each of the import and cli levels
    import_exclude: tuple[str, ...] = ()  # modules this host cannot import (say why in the file)
    launch: LaunchSettings | None = None


def parse_settings(table: Mapping[str, Any], *, source: str | None) -> SmokeSettings:
    """``[smoke]`` (as the inventory keeps it, raw) -> SmokeSettings, or one BadInput line."""
    where = source or "<inventory>"
    r = _Keys(where)
    r.unknown("smoke", table, {"levels", "timeout_s", "import_exclude", "launch"})
    levels = r.strings("smoke.levels", table.get("levels"), default=list(DEFAULT_LEVELS))
    for level in levels:
        if level not in LEVELS:
            raise BadInput(f"{where}: key smoke.levels: unknown level {level!r}; levels are {', '.join(LEVELS)}")
    launch = None
    raw = table.get("launch")
    if raw is not None:
        if not isinstance(raw, dict):
            raise BadInput(f"{where}: key smoke.launch: must be a table ([smoke.launch])")
        launch = _parse_launch(raw, r)
    if "launch" in levels and launch is None:
        raise BadInput(f"{where}: key smoke.levels: 'launch' needs a [smoke.launch] table "
                       "(model, draft_model, port...)")
    return SmokeSettings(
        levels=tuple(sorted(set(levels), key=LEVELS.index)),
        timeout_s=r.number("smoke.timeout_s", table.get("timeout_s"), 300.0),
        import_exclude=tuple(r.strings("smoke.import_exclude", table.get("import_exclude"), default=[])),
        launch=launch,
    )


def _parse_launch(t: Mapping[str, Any], r: "_Keys") -> LaunchSettings:
    known = set(LaunchSettings.__dataclass_fields__)
    r.unknown("smoke.launch", t, known)
    d = LaunchSettings()
    command = t.get("command")
    if command is not None:
        command = tuple(r.strings("smoke.launch.command", command, default=[]))
        if not command:
            raise BadInput(f"{r.where}: key smoke.launch.command: must not be empty")
        for arg in command:
            for name in TEMPLATE_PLACEHOLDER.findall(arg):
                if name not in _TEMPLATE_NAMES:
                    raise BadInput(f"{r.where}: key smoke.launch.command: unknown placeholder {{{name}}}; "
                                   f"known: {', '.join('{%s}' % n for n in _TEMPLATE_NAMES)}")
    return LaunchSettings(
        model=r.string("smoke.launch.model", t.get("model")),
        draft_model=r.string("smoke.launch.draft_model", t.get("draft_model")),
        budget=r.integer("smoke.launch.budget", t.get("budget"), None, 1, 1024),
        topk=r.integer("smoke.launch.topk", t.get("topk"), None, 1, 1 << 20),
        host=r.string("smoke.launch.host", t.get("host")) or d.host,
        port=r.integer("smoke.launch.port", t.get("port"), d.port, 1, 65535),
        extra_args=tuple(r.strings("smoke.launch.extra_args", t.get("extra_args"), default=[])),
        command=command,
        gpu=r.boolean("smoke.launch.gpu", t.get("gpu"), d.gpu),
        min_free_gib=r.number("smoke.launch.min_free_gib", t.get("min_free_gib"), d.min_free_gib, zero=True),
        ready_timeout_s=r.number("smoke.launch.ready_timeout_s", t.get("ready_timeout_s"), d.ready_timeout_s),
        probe_timeout_s=r.number("smoke.launch.probe_timeout_s", t.get("probe_timeout_s"), d.probe_timeout_s),
        term_grace_s=r.number("smoke.launch.term_grace_s", t.get("term_grace_s"), d.term_grace_s),
        probe_prompt=r.string("smoke.launch.probe_prompt", t.get("probe_prompt")) or d.probe_prompt,
        max_new_tokens=r.integer("smoke.launch.max_new_tokens", t.get("max_new_tokens"), d.max_new_tokens, 1, 4096),
    )


class _Keys:
    """Typed getters whose errors name the inventory file and the key."""

    def __init__(self, where: str):
        self.where = where

    def bad(self, key: str, problem: str) -> BadInput:
        return BadInput(f"{self.where}: key {key}: {problem}")

    def unknown(self, key: str, table: Mapping[str, Any], known: set[str]) -> None:
        extra = sorted(set(table) - known)
        if extra:
            raise self.bad(f"{key}.{extra[0]}", f"unknown key; known keys here: {', '.join(sorted(known))}")

    def string(self, key, value):
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip() or "\0" in value or "\n" in value:
            raise self.bad(key, f"must be a non-empty one-line string, not {value!r}")
        return value

    def strings(self, key, value, *, default):
        if value is None:
            return list(default)
        if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
            raise self.bad(key, f"must be a list of strings, not {value!r}")
        return list(value)

    def integer(self, key, value, default, lo, hi):
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.bad(key, f"must be an integer from {lo} to {hi}, not {value!r}")
        return value

    def number(self, key, value, default, zero=False):
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
            raise self.bad(key, f"must be a {'non-negative' if zero else 'positive'} number, not {value!r}")
        return float(value)

    def boolean(self, key, value, default):
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, f"must be true or false, not {value!r}")
        return value
