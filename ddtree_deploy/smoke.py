"""Smoke levels: the host's ``[smoke]`` settings, the request the host-side smoke
program runs, and the report it answers. Pure: no I/O here except through the
``run`` callable that ``run_smoke`` is given (the transport's edge).

The levels, in the order they run (each proves what the next one needs):

- ``compile``: the host's interpreter byte-compiles every file the series touched;
- ``import``: those modules import there, ``SpeculativeAlgorithm.DDTREE`` exists, and
  the tree probe: ``--speculative-algorithm DDTREE`` resolved through the release's own
  ``prepare_server_args`` (tiny config folders made on the host) gives a verify width of
  budget + 1, and the release's own ``SpeculativeAlgorithm.from_string(...).create_worker``
  gives the family's tree worker, a class carrying ``DDTREE_TREE_VERIFY = True``;
- ``cli``: ``python -m sglang.launch_server --help`` lists every flag the series adds,
  and SGLang's own parser and ``ServerArgs`` validation accept the launch arguments
  (DDTREE, the host's model and draft, budget, extra args) when the host has the
  model files, resolving the verify width to budget + 1;
- ``launch`` (GPU hosts): a real server with DDTree, a readiness wait, a ``/generate``
  probe, DDTREE confirmed by ``/server_info``, then tree verify proven from its
  ``internal_states`` (verify width budget + 1, the family's worker class, at least one
  verify step that accepted a path off the first-ranked chain), the acceptance length
  measured, and the whole process group stopped afterwards.

"Never silently linear": a partial port that routes DDTREE to the chain (DFlash's worker,
a verify width equal to the draft block) fails the import, cli and launch levels.

The host-side work is ``smoke_agent.py`` (stdlib only); this module decides WHAT it
runs from the inventory and the series, and reads its answer into typed results. What
happens around a smoke (after a push's switch: mark deployed or roll back; ``smoke`` on
a deployed host) is ``rollout``'s: this module never calls ``deploy``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ddtree_deploy.codes import Code
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

# The class attribute every worker that really tree-verifies DDTREE carries (CONTRACTS).
TREE_MARKER = "DDTREE_TREE_VERIFY"
# The target's verify width after ServerArgs resolution (budget + 1 for DDTREE).
WIDTH_FIELD = "speculative_num_draft_tokens"
# The import level's tree probe: a budget unlike any default (64) and unlike the draft
# block (16), so a flag that is ignored or a width taken from the block both show.
PROBE_BUDGET = 24
# Tiny config folders written on the host for that probe (ServerArgs reads config.json
# only: no weights, no tokenizer). The draft's block_size (16) differs from the width.
TINY_TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}
TINY_DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32", "block_size": 16,
    "num_target_layers": 4, "dflash_config": {"mask_token_id": 511, "target_layer_ids": [1, 2]},
}
# How the probes reach the release, as ``launch_server`` does it (0.5.12 .. 0.5.23): load the
# plugins (a v2 family may register DDTREE there), parse, resolve (0.5.19+: ``resolve_once``,
# values read through ``resolving_view``; older releases resolve inside ServerArgs itself).
RELEASE_PATHS = {
    "plugins": ["sglang.srt.plugins", "load_plugins"],
    "parse": ["sglang.srt.server_args", "prepare_server_args"],
    "resolve": "resolve_once",
    "view": ["sglang.srt.arg_groups.overrides", "resolving_view"],
    "algorithm": ["sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"],
}
# Prompts of the launch level's tree check: varied, open-ended text, so the draft's
# first-ranked chain is often wrong somewhere and a tree verify accepts a sibling path.
TREE_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List ten common Python built-in functions and say what each one does.",
    "Explain how a hash table works, then compare it with a binary search tree.",
    "Translate into French, then into German: The weather is lovely today and we are going to the sea.",
    "def fibonacci(n):\n    # return the n-th Fibonacci number iteratively\n",
    "Give a step-by-step recipe for pancakes, with quantities.",
    "What are the causes of the French Revolution? Answer in a numbered list.",
    "Continue the sequence and explain the rule: 2, 3, 5, 9, 17,",
)
TREE_MAX_NEW_TOKENS = 256


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


def default_command(launch: LaunchSettings, family: FamilySmoke = FAMILY_SMOKE_DEFAULT) -> tuple[str, ...]:
    """``python -m sglang.launch_server`` with DDTree and the host's launch settings
    (the budget and top-k flags are the family's)."""
    argv = ["{python}", "-m", "sglang.launch_server", "--model-path", "{model}",
            "--speculative-algorithm", ALGORITHM]
    if launch.draft_model is not None:
        argv += ["--speculative-draft-model-path", "{draft_model}"]
    if launch.budget is not None:
        argv += [family.budget_flag, "{budget}"]
    if launch.topk is not None:
        argv += [family.topk_flag, "{topk}"]
    return (*argv, "--host", "{host}", "--port", "{port}", "{extra_args}")


def launch_argv(launch: LaunchSettings, *, source: str | None = None,
                family: FamilySmoke = FAMILY_SMOKE_DEFAULT) -> list[str]:
    """Fill the command template into an argv list (never a shell string).

    ``{extra_args}`` alone splices the extra arguments in; ``{python}`` is left for the
    host-side program, which knows its own interpreter. An unset value used by the
    template is bad input: a server started without its model would test nothing.
    """
    values = {"model": launch.model, "draft_model": launch.draft_model, "budget": launch.budget,
              "topk": launch.topk, "host": launch.host, "port": launch.port}
    argv: list[str] = []
    for arg in launch.command or default_command(launch, family):
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


def check_settings(host) -> SmokeSettings:
    """The host's ``[smoke]`` settings, checked whole (launch template included) BEFORE a
    push changes anything: a typo there must not surface only after the switch."""
    settings = parse_settings(host.smoke, source=host.source)
    if settings.launch is not None and (settings.launch.model is not None or settings.launch.command):
        launch_argv(settings.launch, source=host.source)
    return settings


def choose_levels(settings: SmokeSettings, levels: Sequence[str] | None, *,
                  source: str | None = None) -> tuple[str, ...]:
    """The levels to run, in their fixed order: those asked for, else the host's."""
    chosen = tuple(levels) if levels else settings.levels
    for level in chosen:
        if level not in LEVELS:
            raise BadInput(f"unknown smoke level {level!r}; levels are {', '.join(LEVELS)}")
    if "launch" in chosen and settings.launch is None:
        raise BadInput(f"{source or '<inventory>'}: the launch level needs a [smoke.launch] table "
                       "(model, draft_model, port...)")
    return tuple(sorted(set(chosen), key=LEVELS.index))


def plan_smoke(
    settings: SmokeSettings,
    *,
    touched_paths: Sequence[str],
    flags: Sequence[str],
    log_path: str,
    levels: Sequence[str] | None = None,
    source: str | None = None,
    family: FamilySmoke | None = None,
) -> SmokePlan:
    """Build the request for the host-side program (pure).

    ``touched_paths``: the series' package-relative paths (``sglang/srt/...py``);
    ``flags``: ``series_flags`` of its patches; ``log_path``: where the launch level
    keeps the server's log on the host; ``levels``: a subset chosen on the command line;
    ``family``: the series' ``[smoke]`` table (``family_smoke(series)``), which says how
    its tree shows: budget flag and field, worker class. The import level's tree probe
    runs only when it is given (``push`` and ``smoke`` always give it; ``matrix --import``
    runs a tree level of its own); the cli and launch levels use the defaults without it.
    """
    probe_family = family
    family = family or FAMILY_SMOKE_DEFAULT
    where = source or "<inventory>"
    chosen = choose_levels(settings, levels, source=source)
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
        if probe_family is not None:
            request["import"]["tree"] = tree_probe(probe_family, excluded)
    if "cli" in chosen:
        request["cli"] = {
            "argv": ["{python}", "-m", "sglang.launch_server", "--help"],
            # The series' added flags, and the family's budget/top-k flags (a v2 family adds
            # its flags as Spec fields, which name no "--flag" string in the patches).
            "expect": list(dict.fromkeys([*flags, *((probe_family.budget_flag, probe_family.topk_flag)
                                                    if probe_family else ())])),
            "timeout_s": settings.timeout_s,
            "validate": _validation(settings.launch, family),
        }
    if "launch" in chosen:
        launch = settings.launch
        assert launch is not None
        if launch.model is None and launch.command is None:
            raise BadInput(f"{where}: key smoke.launch.model: missing (the launch level serves it)")
        request["launch"] = {
            "argv": launch_argv(launch, source=where, family=family),
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
            "tree": {
                # The budget the server should run: the inventory's, else the server's own
                # (its /server_info field), since SGLang's default applies then.
                "budget": launch.budget,
                "budget_field": family.budget_field,
                "worker_class": family.worker_class,
                "prompts": list(TREE_PROMPTS),
                "max_new_tokens": TREE_MAX_NEW_TOKENS,
            },
            "term_grace_s": launch.term_grace_s,
            "log_tail_lines": 40,
        }
    return SmokePlan(levels=chosen, request=request, excluded_modules=excluded)


def _validation(launch: LaunchSettings | None, family: FamilySmoke = FAMILY_SMOKE_DEFAULT) -> dict | None:
    """SGLang's own parser over the launch arguments (``prepare_server_args``: argparse,
    then ``ServerArgs`` and its validation), when the inventory names a model and a draft.

    The arguments are those of the default SGLang launch command, even when
    ``command`` replaces it (a stand-in), so the validation is always SGLang's. The
    resolved verify width must be the budget + 1 (the inventory's budget, else the one
    ServerArgs resolved: the family's ``budget_field``).
    """
    if launch is None or launch.model is None or launch.draft_model is None:
        return None
    argv = launch_argv(replace(launch, command=None), family=family)
    report = list(VALIDATION_REPORT)
    if family.budget_field not in report:
        report.append(family.budget_field)
    return {
        "module": "sglang.srt.server_args",
        "function": "prepare_server_args",
        "argv": argv[3:],  # after `{python} -m sglang.launch_server`
        # "Where the host has the model files": a hub id or a missing folder is skipped, said so.
        "needs_paths": [launch.model, launch.draft_model],
        "report": report,
        "plugins": RELEASE_PATHS["plugins"],
        "resolve": RELEASE_PATHS["resolve"],
        "view": RELEASE_PATHS["view"],
        "width": {"field": WIDTH_FIELD, "budget": launch.budget, "budget_field": family.budget_field,
                  "budget_flag": family.budget_flag},
    }


def tree_probe(family: FamilySmoke, excluded: Sequence[str] = ()) -> dict:
    """The import level's tree probe: DDTREE through the release's own ServerArgs and
    worker factory, on tiny config folders the host program writes (pure).

    When the family's worker module is in ``smoke.import_exclude`` (a CPU host that
    cannot import it), the worker class is not resolved, and the report says so.
    """
    argv = ["--model-path", "{model}", "--speculative-algorithm", ALGORITHM,
            "--speculative-draft-model-path", "{draft_model}", family.budget_flag, str(PROBE_BUDGET),
            "--skip-tokenizer-init", *family.probe_args]
    skip = family.worker_module if family.worker_module in excluded else None
    return {
        **RELEASE_PATHS,
        "argv": argv,
        "configs": {"model": TINY_TARGET_CONFIG, "draft_model": TINY_DRAFT_CONFIG},
        "width_field": WIDTH_FIELD,
        "budget": PROBE_BUDGET,
        "budget_flag": family.budget_flag,
        "marker": TREE_MARKER,
        "worker_class": family.worker_class,
        "skip_worker": skip,
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
    note: str | None = None  # what the smoke changed in the host's journal, if anything

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.levels)

    @property
    def failed(self) -> LevelResult | None:
        return next((r for r in self.levels if r.status == "failed"), None)

    def with_log_copy(self, path: str) -> "SmokeReport":
        return replace(self, log_copy=path)

    def to_json(self) -> dict:
        doc = {"host": self.host, "ok": self.ok, "python": self.python,
               "levels": [r.to_json() for r in self.levels], "log_copy": self.log_copy}
        if self.note is not None:
            doc["note"] = self.note
        return doc

    def lines(self) -> list[str]:
        """One line per level, for people (the summary of ``smoke`` and ``push``)."""
        out = [f"{r.level:<8} {r.status:<8} {r.seconds:7.1f} s  {r.detail}" for r in self.levels]
        if self.log_copy:
            out.append(f"server log copied to {self.log_copy}")
        if self.note:
            out.append(self.note)
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


# ------------------------------------------------------------------ on a host (the edge)
# Below: the only part of this module that does I/O, through the transport and a local
# folder for copied-back logs. Everything it decides was decided above.

Progress = Callable[[str], None]


def _quiet(_step: str) -> None:
    pass


def smoke_agent_source() -> bytes:
    from importlib import resources

    return resources.files("ddtree_deploy").joinpath("smoke_agent.py").read_bytes()


def series_inputs(series) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(touched package paths, DDTree flags the patches add) of a loaded Series."""
    from ddtree_deploy.series import PatchEntry

    texts = [e.file.read_text(encoding="utf-8") for e in series.entries if isinstance(e, PatchEntry)]
    return series.touched_paths(), series_flags(texts)


def host_log_path(state_dir: str, run_id: str) -> str:
    """Where the launch level keeps the server's log on the host (``~`` expanded there)."""
    return f"{state_dir.rstrip('/')}/smoke/{run_id}/server.log"


def run_on_host(host, transport, plan: SmokePlan, *, log_dir=None, progress: Progress = _quiet,
                heartbeat: Callable[[str, float], None] | None = None) -> SmokeReport:
    """Ship the smoke program to ``host`` over ``transport``, run ``plan``, read its report.

    The program streams one JSON line per event (level start, heartbeat, level result)
    and the whole answer last; a failed launch's server log comes back with it and is
    written under ``log_dir`` (default: the user's cache, ``smoke-logs/<host>/``).
    ``progress`` hears each level's start; ``heartbeat(level, seconds)``, when given,
    hears the host program's keep-alives during long levels.
    """
    import json

    from ddtree_deploy.transport import BOOTSTRAP

    source = smoke_agent_source()
    answer = None
    # Never sudo: the smoke reads files and starts a server as the SSH user.
    with transport:
        proc = transport.start([host.python, "-c", BOOTSTRAP])
        try:
            proc.write(b"%d\n" % len(source) + source + json.dumps(plan.request).encode() + b"\n")
            while answer is None:
                line = proc.readline()
                if not line.endswith(b"\n"):
                    code, tail = proc.close()
                    proc = None
                    last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
                    raise DeployError(f"{host.name}: the smoke program stopped without a result "
                                      f"(exit {code}; {last})", code=Code.SMOKE_AGENT)
                try:
                    doc = json.loads(line)
                except ValueError:
                    raise DeployError(f"{host.name}: the smoke program answered garbage: {line[:200]!r}",
                                      code=Code.SMOKE_AGENT) from None
                event = doc.get("event")
                # One progress step per level (a caller's step timer times it); the
                # results themselves are in the report.
                if event == "start":
                    progress(f"smoke {doc['level']}")
                elif event == "wait" and heartbeat is not None:
                    heartbeat(doc["level"], float(doc["seconds"]))
                elif event == "done":
                    answer = doc
        finally:
            if proc is not None:
                proc.close()
    report = read_answer(host.name, plan, answer)
    if answer.get("server_log") is not None:
        report = report.with_log_copy(str(_keep_log(host.name, answer["server_log"], log_dir)))
    return report


def _keep_log(host_name: str, text: str, log_dir) -> "Path":
    import time
    from pathlib import Path

    from ddtree_deploy.locations import cache_dir

    folder = Path(log_dir) if log_dir else cache_dir() / "smoke-logs" / host_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-server.log"
    path.write_text(text, encoding="utf-8")
    return path

