"""The smoke plan: what the host-side smoke program is asked to do, level by level. Pure.

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

The settings are ``smoke_settings``'s, the host-side work is ``hostprog/smoke.py`` (stdlib
only), starting it on a host is ``smoke_run``'s and reading its answer ``smoke_report``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.hostprog import wire
from ddtree_deploy.settings.smoke import (
    TEMPLATE_PLACEHOLDER,
    FAMILY_SMOKE_DEFAULT,
    LEVELS,
    FamilySmoke,
    LaunchSettings,
    SmokeSettings,
    family_smoke,
    parse_settings,
)

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
# A tiny hybrid target (Qwen3-Next: 3 Gated DeltaNet layers, 1 attention layer) for the tree
# probe of a family that serves hybrid targets (its [smoke] hybrid_report): DDTREE must resolve
# with the recurrent tree path on. The radix cache is off in that probe (SGLang's Mamba extra
# buffer needs a GPU platform, DDTREE or not).
TINY_HYBRID_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "full_attention_interval": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1, "norm_topk_prob": True,
    "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25, "tie_word_embeddings": False, "torch_dtype": "float32",
    "bos_token_id": 1, "eos_token_id": 2,
}
HYBRID_PROBE_ARGS = ("--disable-radix-cache",)
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
    template = tuple(launch.command or default_command(launch, family))
    if launch.budget_schedule is not None:
        template = with_schedule(template, launch, family, source=source)
    for arg in template:
        if arg == "{extra_args}":
            argv.extend(launch.extra_args)
            continue

        def fill(m: re.Match) -> str:
            name = m.group(1)
            if name == "python":
                return "{python}"
            if name == "extra_args":
                raise launch.bad("smoke.launch.command", "{extra_args} must be a whole argument of its own",
                                 'write "{extra_args}" as one element of the list', source=source)
            if values[name] is None:
                raise launch.bad(f"smoke.launch.{name}", f"not set, but the launch command uses {{{name}}}",
                                 f"set {name} in [smoke.launch], or drop {{{name}}} from its command",
                                 source=source)
            return str(values[name])

        argv.append(TEMPLATE_PLACEHOLDER.sub(fill, arg))
    return argv


def with_schedule(template: Sequence[str], launch: LaunchSettings, family: FamilySmoke, *,
                  source: str | None = None) -> tuple[str, ...]:
    """A launch template for ``[smoke.launch] budget_schedule``: the family's budget and top-K
    options (and their values) taken out, since the server refuses a schedule beside them, and
    the family's schedule flag with the schedule added after the template's arguments."""
    if family.schedule_flag is None:
        raise launch.bad("smoke.launch.budget_schedule", "this host's DDTree family takes no budget schedule (its "
                         "family.toml [smoke] names no schedule_flag; the v2 family, SGLang 0.5.20 - 0.5.23, does)",
                         "remove budget_schedule and set budget (and topk) instead", source=source)
    drop = {family.budget_flag, family.topk_flag, family.schedule_flag}
    out: list[str] = []
    skip = False
    for arg in template:
        if skip:
            skip = False
            continue
        if arg.split("=", 1)[0] in drop:
            skip = "=" not in arg  # ``--flag value``: the value goes too
            continue
        out.append(arg)
    return (*out, family.schedule_flag, launch.budget_schedule)


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
    """What the host-side program is asked to do, the levels it will report, and how long
    the controller waits for each (``deadlines``, seconds; ``level_deadlines`` of the
    request when empty)."""

    levels: tuple[str, ...]
    request: dict
    excluded_modules: tuple[str, ...] = ()
    deadlines: Mapping[str, float] = field(default_factory=dict)

    def deadline(self, level: str) -> float:
        return float(self.deadlines.get(level) or level_deadlines(self.request)[level])


# How long the controller waits for the smoke program, seen from this side of the link.
# Every wait ON the host has its own deadline (the request's timeouts); the controller's
# deadline for a level is the sum of those inside it, plus LEVEL_SLACK_S for the
# interpreter's start, a slow link and the result line. A missed one means the program or
# the link is stuck, not that SGLang is slow (that is the host's own timeout, reported as
# the level's failure).
LEVEL_SLACK_S = 60.0
COMPILE_S = 120.0  # the compile level has no deadline on the host: reading + compiling the files
START_S = 60.0  # before the first level starts, and for the final answer after the last
NVIDIA_SMI_S = 30.0  # hostprog.server.check_gpus
SERVER_INFO_S = 60.0  # /server_info, then /get_server_info: 30 s each
HEALTH_POLL_S = 10.0  # the last readiness poll may start just before the deadline
KILL_S = 15.0  # SIGKILL's wait (10 s) and the reap (5 s) after term_grace_s
HEARTBEAT_S = wire.HEARTBEAT_S  # the host programs' beat, unless the request sets heartbeat_s
SILENT_BEATS = 3  # this many heartbeats missed in a row: the link or the program is stuck
MIN_SILENCE_S = 10.0  # never less: a loaded machine may delay a short test heartbeat a little


def level_deadlines(request: Mapping[str, Any]) -> dict[str, float]:
    """Seconds the controller waits for each level of ``request`` (pure)."""
    out: dict[str, float] = {}
    if "compile" in request:
        out["compile"] = COMPILE_S
    for level in ("import", "cli"):  # the cli level's help and validation run side by side
        if level in request:
            out[level] = float(request[level].get("timeout_s", 180)) + LEVEL_SLACK_S
    if "launch" in request:
        spec = request["launch"]
        out["launch"] = (NVIDIA_SMI_S + float(spec.get("ready_timeout_s", 900)) + HEALTH_POLL_S
                         + 2 * float(spec.get("probe_timeout_s", 120)) + SERVER_INFO_S
                         + float(spec.get("term_grace_s", 20)) + KILL_S + LEVEL_SLACK_S)
    return out


def heartbeat_s(request: Mapping[str, Any]) -> float:
    """How often the smoke program says a level still runs."""
    return float(request.get("heartbeat_s", HEARTBEAT_S))


def silence_limit(request: Mapping[str, Any]) -> float:
    """Seconds without a line from the smoke program (it beats every ``heartbeat_s`` during a
    level) after which the link or the program is taken as stuck."""
    return max(SILENT_BEATS * heartbeat_s(request), MIN_SILENCE_S)


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
            raise launch.bad("smoke.launch.model", "missing (the launch level serves it)",
                             'add model = "/path/to/model" to [smoke.launch]', source=where)
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
    return SmokePlan(levels=chosen, request=request, excluded_modules=excluded,
                     deadlines=level_deadlines(request))


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
    validate = {
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
    if family.hybrid_report is not None:
        # A hybrid host model: the family's report of its recurrent tree path.
        validate["hybrid_report"] = list(family.hybrid_report)
    return validate


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
    probe = {
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
    if family.hybrid_report is not None:
        # The same resolution on a tiny hybrid target: the recurrent tree path must be on.
        probe["configs"]["hybrid_model"] = TINY_HYBRID_CONFIG
        probe["hybrid"] = {"argv": [("{hybrid_model}" if a == "{model}" else a) for a in argv]
                                   + list(HYBRID_PROBE_ARGS),
                           "report": list(family.hybrid_report)}
    return probe


def series_inputs(series) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(touched package paths, DDTree flags the patches add) of a loaded Series."""
    from ddtree_deploy.engine.series import PatchEntry

    texts = [e.file.read_text(encoding="utf-8") for e in series.entries if isinstance(e, PatchEntry)]
    return series.touched_paths(), series_flags(texts)


def host_log_path(state_dir: str, run_id: str) -> str:
    """Where the launch level keeps the server's log on the host (``~`` expanded there)."""
    return f"{state_dir.rstrip('/')}/smoke/{run_id}/server.log"


def plan_after_switch(host, series, levels: Sequence[str] | None, *, run_id: str, redo: str | None = None,
                      heartbeat: float | None = None) -> SmokePlan:
    """The push's smoke stage, planned here from what the push knows: the host (its
    ``[smoke]`` table, state folder, inventory file), the series it switched, the levels asked
    for (else the host's), ``redo``: a level an earlier run of these files failed at (kept
    by ``--no-rollback``), run again whatever the levels say, so that no smoke that skipped
    it marks the host deployed; ``heartbeat``: the smoke program's keep-alive interval
    (None: its own). Raises BadInput where the levels cannot run here."""
    settings = parse_settings(host.smoke, source=host.source)
    touched, flags = series_inputs(series)
    wanted = choose_levels(settings, levels, source=host.source)
    if redo and redo not in wanted:
        wanted += (redo,)
    plan = plan_smoke(settings, touched_paths=touched, flags=flags, levels=wanted, source=host.source,
                      log_path=host_log_path(host.state_dir, run_id), family=family_smoke(series))
    if heartbeat:
        plan = replace(plan, request={**plan.request, "heartbeat_s": heartbeat})
    return plan
