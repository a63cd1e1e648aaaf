"""Smoke levels: the host's ``[smoke]`` settings, the request the host-side smoke
program runs, and the report it answers. Pure: no I/O here except through the
``run`` callable that ``run_smoke`` is given (the transport's edge).

The levels, in the order they run (each proves what the next one needs):

- ``compile``: the host's interpreter byte-compiles every file the series touched;
- ``import``: those modules import there and ``SpeculativeAlgorithm.DDTREE`` exists;
- ``cli``: ``python -m sglang.launch_server --help`` lists every flag the series adds,
  and ``ServerArgs`` accepts DDTREE for the host's configured model (when the host
  has the model files);
- ``launch`` (GPU hosts): a real server with DDTree, a readiness wait, a ``/generate``
  probe, DDTREE confirmed by ``/server_info``, the acceptance length measured, and the
  whole process group stopped afterwards.

The host-side work is ``smoke_agent.py`` (stdlib only); this module decides WHAT it
runs from the inventory and the series, and reads its answer into typed results.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ddtree_deploy.errors import BadInput, DeployError

LEVELS = ("compile", "import", "cli", "launch")
DEFAULT_LEVELS = ("compile", "import", "cli")  # launch needs a GPU: only when asked for
ALGORITHM = "DDTREE"
# What the import level proves exists once the modules import (patch 0001 adds it).
DDTREE_ATTRIBUTE = ("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm.DDTREE")
PACKAGE = "sglang"
# The flags the series adds are read from its patches (added `"--speculative-ddtree-..."`
# strings), so a renamed flag is checked without touching this file.
_ADDED_FLAG = re.compile(r'^\+.*?"(--speculative-ddtree-[a-z0-9-]+)"', re.M)
# ServerArgs fields the cli level reports after validation: which number each consumer reads.
VALIDATION_REPORT = (
    "speculative_algorithm", "speculative_ddtree_budget", "speculative_ddtree_topk",
    "speculative_num_draft_tokens", "speculative_dflash_block_size", "speculative_eagle_topk",
    "max_running_requests",
)
DEFAULT_PROBE = "Explain in one sentence why the sky is blue."
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


# ------------------------------------------------------------------ settings


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
            for name in _PLACEHOLDER.findall(arg):
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


# ------------------------------------------------------------------ the request

_TEMPLATE_NAMES = ("python", "model", "draft_model", "budget", "topk", "host", "port", "extra_args")


def series_flags(patch_texts: Iterable[str]) -> tuple[str, ...]:
    """The ``--speculative-ddtree-*`` flags the series' patches add, in order."""
    found: dict[str, None] = {}
    for text in patch_texts:
        for flag in _ADDED_FLAG.findall(text):
            found.setdefault(flag, None)
    return tuple(found)


def default_command(launch: LaunchSettings) -> tuple[str, ...]:
    """``python -m sglang.launch_server`` with DDTree and the host's launch settings."""
    argv = ["{python}", "-m", "sglang.launch_server", "--model-path", "{model}",
            "--speculative-algorithm", ALGORITHM]
    if launch.draft_model is not None:
        argv += ["--speculative-draft-model-path", "{draft_model}"]
    if launch.budget is not None:
        argv += ["--speculative-ddtree-budget", "{budget}"]
    if launch.topk is not None:
        argv += ["--speculative-ddtree-topk", "{topk}"]
    return (*argv, "--host", "{host}", "--port", "{port}", "{extra_args}")


def launch_argv(launch: LaunchSettings, *, source: str | None = None) -> list[str]:
    """Fill the command template into an argv list (never a shell string).

    ``{extra_args}`` alone splices the extra arguments in; ``{python}`` is left for the
    host-side program, which knows its own interpreter. An unset value used by the
    template is bad input: a server started without its model would test nothing.
    """
    values = {"model": launch.model, "draft_model": launch.draft_model, "budget": launch.budget,
              "topk": launch.topk, "host": launch.host, "port": launch.port}
    argv: list[str] = []
    for arg in launch.command or default_command(launch):
        if arg == "{extra_args}":
            argv.extend(launch.extra_args)
            continue

        def fill(m: re.Match) -> str:
            name = m.group(1)
            if name == "python":
                return "{python}"
            if name == "extra_args":
                raise BadInput(f"{source or '<inventory>'}: key smoke.launch.command: "
                               "{extra_args} must be a whole argument of its own")
            if values[name] is None:
                raise BadInput(f"{source or '<inventory>'}: key smoke.launch.{name}: not set, "
                               f"but the launch command uses {{{name}}}")
            return str(values[name])

        argv.append(_PLACEHOLDER.sub(fill, arg))
    return argv


def module_name(rel_path: str) -> str | None:
    """``sglang/srt/x/y.py`` -> ``sglang.srt.x.y``; None for a non-Python file."""
    if not rel_path.endswith(".py"):
        return None
    parts = rel_path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@dataclass(frozen=True)
class SmokePlan:
    """What the host-side program is asked to do, and the levels it will report."""

    levels: tuple[str, ...]
    request: dict
    excluded_modules: tuple[str, ...] = ()


def plan_smoke(
    settings: SmokeSettings,
    *,
    touched_paths: Sequence[str],
    flags: Sequence[str],
    log_path: str,
    levels: Sequence[str] | None = None,
    source: str | None = None,
) -> SmokePlan:
    """Build the request for the host-side program (pure).

    ``touched_paths``: the series' package-relative paths (``sglang/srt/...py``);
    ``flags``: ``series_flags`` of its patches; ``log_path``: where the launch level
    keeps the server's log on the host; ``levels``: a subset chosen on the command line.
    """
    where = source or "<inventory>"
    chosen = tuple(levels) if levels else settings.levels
    for level in chosen:
        if level not in LEVELS:
            raise BadInput(f"unknown smoke level {level!r}; levels are {', '.join(LEVELS)}")
    chosen = tuple(sorted(set(chosen), key=LEVELS.index))
    if "launch" in chosen and settings.launch is None:
        raise BadInput(f"{where}: the launch level needs a [smoke.launch] table (model, draft_model, port...)")
    py_files = [p for p in touched_paths if p.endswith(".py")]
    modules = [m for m in map(module_name, py_files) if m]
    excluded = tuple(m for m in modules if m in settings.import_exclude)
    request: dict[str, Any] = {"levels": list(chosen)}
    if "compile" in chosen:
        request["compile"] = {"package": PACKAGE, "files": py_files}
    if "import" in chosen:
        request["import"] = {
            "modules": [m for m in modules if m not in excluded],
            "attributes": [list(DDTREE_ATTRIBUTE)],
            "timeout_s": settings.timeout_s,
        }
    if "cli" in chosen:
        request["cli"] = {
            "argv": ["{python}", "-m", "sglang.launch_server", "--help"],
            "expect": list(flags),
            "timeout_s": settings.timeout_s,
            "validate": _validation(settings.launch),
        }
    if "launch" in chosen:
        launch = settings.launch
        assert launch is not None
        if launch.model is None and launch.command is None:
            raise BadInput(f"{where}: key smoke.launch.model: missing (the launch level serves it)")
        request["launch"] = {
            "argv": launch_argv(launch, source=where),
            "host": launch.host,
            "port": launch.port,
            "log_path": log_path,
            "gpu_check": launch.gpu,
            "min_free_mib": int(launch.min_free_gib * 1024),
            "ready_timeout_s": launch.ready_timeout_s,
            "poll_s": 1.0,
            "probe": {"text": launch.probe_prompt, "max_new_tokens": launch.max_new_tokens},
            "probe_timeout_s": launch.probe_timeout_s,
            "expect_algorithm": ALGORITHM,
            "term_grace_s": launch.term_grace_s,
            "log_tail_lines": 40,
        }
    return SmokePlan(levels=chosen, request=request, excluded_modules=excluded)


def _validation(launch: LaunchSettings | None) -> dict | None:
    """ServerArgs(DDTREE, the host's model) when the inventory names a model and a draft."""
    if launch is None or launch.model is None or launch.draft_model is None:
        return None
    kwargs: dict[str, Any] = {
        "model_path": launch.model,
        "speculative_algorithm": ALGORITHM,
        "speculative_draft_model_path": launch.draft_model,
        # No tokenizer: validation needs the config files only, not a full download.
        "skip_tokenizer_init": True,
        "device": "cuda" if launch.gpu else "cpu",
    }
    if launch.budget is not None:
        kwargs["speculative_ddtree_budget"] = launch.budget
    if launch.topk is not None:
        kwargs["speculative_ddtree_topk"] = launch.topk
    return {
        "module": "sglang.srt.server_args",
        "class": "ServerArgs",
        "kwargs": kwargs,
        # "Where the host has the model files": a hub id or a missing folder is skipped, said so.
        "needs_paths": [launch.model, launch.draft_model],
        "report": list(VALIDATION_REPORT),
    }


# ------------------------------------------------------------------ the report


@dataclass(frozen=True)
class LevelResult:
    level: str
    status: str  # passed | failed | skipped | not-run
    seconds: float
    detail: str
    evidence: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict:
        return {"level": self.level, "status": self.status, "ok": self.ok,
                "seconds": self.seconds, "detail": self.detail, "evidence": self.evidence}


@dataclass(frozen=True)
class SmokeReport:
    host: str
    levels: tuple[LevelResult, ...]
    python: str | None = None
    log_copy: str | None = None  # where the server log was copied back to, on failure

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.levels)

    @property
    def failed(self) -> LevelResult | None:
        return next((r for r in self.levels if r.status == "failed"), None)

    def with_log_copy(self, path: str) -> "SmokeReport":
        return SmokeReport(self.host, self.levels, self.python, path)

    def to_json(self) -> dict:
        return {"host": self.host, "ok": self.ok, "python": self.python,
                "levels": [r.to_json() for r in self.levels], "log_copy": self.log_copy}

    def lines(self) -> list[str]:
        """One line per level, for people (the summary of ``smoke`` and ``push``)."""
        out = [f"{r.level:<8} {r.status:<8} {r.seconds:7.1f} s  {r.detail}" for r in self.levels]
        if self.log_copy:
            out.append(f"server log copied to {self.log_copy}")
        return out


def read_answer(host: str, plan: SmokePlan, answer: Mapping[str, Any]) -> SmokeReport:
    """The host-side program's JSON answer -> SmokeReport (a malformed one is a DeployError)."""
    if not isinstance(answer, Mapping) or "levels" not in answer:
        message = answer.get("error") if isinstance(answer, Mapping) else None
        raise DeployError(f"{host}: the smoke program gave no result ({message or 'malformed answer'})")
    results = []
    for item in answer["levels"]:
        try:
            results.append(LevelResult(level=str(item["level"]), status=str(item["status"]),
                                       seconds=float(item["seconds"]), detail=str(item["detail"]),
                                       evidence=dict(item.get("evidence") or {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise DeployError(f"{host}: the smoke program's answer is malformed ({exc!r})") from None
    if [r.level for r in results] != list(plan.levels):
        raise DeployError(f"{host}: the smoke program answered levels {[r.level for r in results]}, "
                          f"asked for {list(plan.levels)}")
    if plan.excluded_modules:
        results = [_note_excluded(r, plan.excluded_modules) for r in results]
    return SmokeReport(host=host, levels=tuple(results), python=answer.get("python"))


def _note_excluded(result: LevelResult, excluded: tuple[str, ...]) -> LevelResult:
    if result.level != "import" or result.status != "passed":
        return result
    note = f"; not imported here (smoke.import_exclude): {', '.join(excluded)}"
    evidence = dict(result.evidence, excluded=list(excluded))
    return LevelResult(result.level, result.status, result.seconds, result.detail + note, evidence)


def run_smoke(host: str, plan: SmokePlan, run: Callable[[dict], Mapping[str, Any]]) -> SmokeReport:
    """Run the plan through ``run`` (request -> the host program's JSON answer)."""
    return read_answer(host, plan, run(plan.request))
