"""DDTREE on SGLang's v2 speculative worker (0.5.20 - 0.5.23): registration, server
arguments, and the split between the target's verify width and the draft block.

Installed by the ``sglang-0.5.20`` family as ``sglang/srt/speculative/ddtree_v2_plugin.py``.
The family's one-line hunk at the end of ``spec_info.py`` imports this module, so every
process that can look an algorithm name up (``launch_server``, ``sglang serve``, the
scheduler, data-parallel children, an ``Engine`` in a notebook) has DDTREE registered
before its first ``SpeculativeAlgorithm.from_string``: the lookup itself lives in the
module that registers. An entry point would need package metadata outside ``sglang/``,
which a series cannot install (every path it touches is under ``sglang/``).

Flags (new ``Spec`` fields, the family's hunk on ``arg_groups/fields/spec.py``; the same
names as the v1 families, so one launch command serves every family):

    --speculative-algorithm DDTREE
    --speculative-ddtree-budget B              draft-tree nodes per request, root excluded
                                               (default 64, 1..1023)
    --speculative-ddtree-topk K                candidate tokens kept per draft position
                                               (default min(B, 8))
    --speculative-ddtree-budget-schedule S     instead of the two above: a budget and top-K
                                               per running-batch size, e.g.
                                               1:128/8,8:64/4,32:16/2,64:chain
                                               (ddtree_schedule; _resolve_schedule)

Hybrid targets (Mamba2 / GDN / KDA layers) need no flag: the target's hybrid backend runs its
tree-aware recurrent kernels (topk > 1) and EAGLE's verify commits the accepted node's state;
kinds and settings without a tree path are refused at start-up (ddtree_hybrid.check).

What resolution leaves (the worker reads these only through the helpers below):

    speculative_ddtree_budget     = B
    speculative_num_draft_tokens  = B + 1   the TARGET's verify width: CUDA-graph widths,
                                            attention metadata, KV reservation, recurrent
                                            buffers all size by it
    speculative_dflash_block_size = the DRAFT block (the flag, else the draft's config,
                                    else 16: DFlash's own resolution, reused)
    speculative_eagle_topk        = K       K > 1 also turns SGLang's tree paths on (FA3
                                            tree verify, the hybrid backend's recurrent
                                            tree kernels), as for EAGLE
    speculative_num_steps         = 1       as DFLASH (the worker gives EAGLE's verify the
                                            tree depth itself)
    disable_overlap_schedule      untouched: DDTREE keeps the overlap scheduler

Also resolved: ``max_running_requests`` by the budget x vocab rule of every DDTree family
(``ddtree_utils.size_running_batch``, as v1's ``ddtree_args``), and
``enable_mixed_chunk`` turned off with a log line (as SGLang does for UNO).

Every refusal is one ``ValueError`` line naming the flags involved: among them the
configurations EAGLE's CUDA tree ABI cannot carry (``ddtree_lineage.abi_problem``), and the
EAGLE-family options that would change what DDTREE samples (``_refuse_what_breaks_losslessness``).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

ALGORITHM = "DDTREE"

# The DDTree paper measured budgets up to 1024 (speedup peaks at 256-512 at batch 1);
# SGLang verifies up to 48 requests at budget + 1 tokens each, so the serving default
# is smaller. The v1 families take 1024; EAGLE's CUDA tree builder, which the v2 worker
# goes through, takes a verify width of at most 1024 (budget + 1), so 1023 here.
DEFAULT_BUDGET = 64
MAX_BUDGET = 1023

# Default per-depth cap. K = min(B, V) is exactly optimal (the paper's Lemma 1), but
# SGLang sizes the per-request KV reservation of a topk > 1 tree by topk (with page_size
# > 1: pages * page_size * topk per request per step) and the lineage ABI of EAGLE's
# verify carries (B + 1) * K candidates; 8 keeps both small. --speculative-ddtree-topk B
# gives the paper's optimum back.
DEFAULT_MAX_TOPK = 8

# Target-verify attention backends that apply EAGLE's tree mask (speculative_eagle_topk
# > 1; with K == 1 the tree is a chain, which they verify too). trtllm_mha refuses
# topk > 1 for EAGLE; the MLA kernels and the rest do not take a tree mask.
VERIFY_ATTENTION_BACKENDS = ("flashinfer", "triton", "fa3")


# ---------------------------------------------------------------------------
# The three numbers, read from resolved server args or from the runtime ``Spec`` bag
# (``sglang.srt.runtime_context.get_spec()``): both carry the same field names.


def _int_field(args: Any, name: str) -> Optional[int]:
    if callable(getattr(type(args), "resolve_once", None)):
        # A ServerArgs record keeps the operator's raw input in its fields; what
        # resolution decided is read through its declarations.
        from sglang.srt.arg_groups.overrides import resolving_view

        args = resolving_view(args)
    value = getattr(args, name, None)
    if value is None or isinstance(value, bool):
        return None
    return int(value)


def ddtree_budget(server_args: Any) -> int:
    """B, the draft-tree nodes per request (root excluded). ``server_args``: a resolved
    ServerArgs, or the runtime Spec bag. Raises when the args are not DDTREE-resolved or
    the verify width is not B + 1 (a linear fallback would be)."""
    budget = _int_field(server_args, "speculative_ddtree_budget")
    width = _int_field(server_args, "speculative_num_draft_tokens")
    if budget is None or width is None:
        raise ValueError(
            "DDTREE server args are not resolved (speculative_ddtree_budget="
            f"{budget!r}, speculative_num_draft_tokens={width!r}): read them after "
            "ServerArgs.resolve_once(), or from runtime_context.get_spec()."
        )
    if width != budget + 1:
        raise ValueError(
            f"DDTREE verify width speculative_num_draft_tokens={width} is not "
            f"speculative_ddtree_budget + 1 = {budget + 1}: these args were not resolved "
            "by the DDTREE plugin (a DFlash chain would verify like this)."
        )
    return budget


def ddtree_topk(server_args: Any) -> int:
    """K, the candidate tokens kept per draft position (per tree depth), 1..B."""
    budget = ddtree_budget(server_args)
    topk = _int_field(server_args, "speculative_eagle_topk")
    if topk is None or not 1 <= topk <= budget:
        raise ValueError(
            f"DDTREE per-depth top-K speculative_eagle_topk={topk!r} is not in "
            f"[1, budget={budget}]: these args were not resolved by the DDTREE plugin."
        )
    return topk


def ddtree_draft_block(server_args: Any) -> int:
    """The DFlash draft block (bonus token + block - 1 drafted positions); <= B + 1."""
    budget = ddtree_budget(server_args)
    block = _int_field(server_args, "speculative_dflash_block_size")
    if block is None or not 2 <= block <= budget + 1:
        raise ValueError(
            f"DDTREE draft block speculative_dflash_block_size={block!r} is not in "
            f"[2, budget + 1 = {budget + 1}]: these args were not resolved by the DDTREE "
            "plugin."
        )
    return block


def ddtree_verify_width(server_args: Any) -> int:
    """The target's widest verify per request: B + 1 (with a schedule, its largest budget)."""
    return ddtree_budget(server_args) + 1


def ddtree_schedule(server_args: Any):
    """The resolved entries (``ddtree_schedule.Entry``: threshold, budget, top-K), one per
    range of running batch sizes: the schedule's, or one entry (1, B, K) for a single budget.
    Raises when they disagree with the widths resolution declared (B = the largest budget)."""
    from sglang.srt.speculative import ddtree_schedule as sched

    budget, topk = ddtree_budget(server_args), ddtree_topk(server_args)
    text = getattr(server_args, "speculative_ddtree_budget_schedule", None)
    if callable(getattr(type(server_args), "resolve_once", None)):
        from sglang.srt.arg_groups.overrides import resolving_view

        text = getattr(resolving_view(server_args), "speculative_ddtree_budget_schedule", None)
    if text is None:
        return (sched.Entry(1, budget, topk),)
    entries = sched.parse(text)
    if any(e.budget is None or e.topk is None for e in entries) or (
            max(e.budget for e in entries), max(e.topk for e in entries)) != (budget, topk):
        raise ValueError(
            f"DDTREE budget schedule {text!r} is not the one resolution declared (largest "
            f"budget {budget}, top-K {topk}): these args were not resolved by the DDTREE plugin.")
    return entries


def decode_reserve(server_args: Any, batch_size: Optional[int] = None) -> int:
    """KV slots per request that ``DFlashDraftInputV2.prepare_for_decode`` keeps allocated
    past the committed length (hunk 0005): one step's lag (at most a draft block commits)
    plus the step's write window, ``ddtree_lineage.decode_reserve``; DFlash's own
    ``2 x num_draft_tokens`` would be 2 x (B + 1). ``batch_size``: the batch being prepared,
    which the worker then runs, so its schedule entry's budget (None: the largest)."""
    from sglang.srt.speculative import ddtree_schedule as sched
    from sglang.srt.speculative.ddtree_lineage import decode_reserve as reserve

    budget = ddtree_budget(server_args)
    if batch_size is not None:
        entries = ddtree_schedule(server_args)
        budget = entries[sched.pick(entries, int(batch_size))].budget
    return reserve(budget, ddtree_draft_block(server_args))


# ---------------------------------------------------------------------------
# The resolution record (a seam: 0.5.19+ against 0.5.18 and older). From 0.5.19 on a
# ServerArgs record keeps the operator's raw input in its fields and what resolution decides
# as declarations (``overrides.declare_resolution``), read through ``resolving_view``, and the
# model config comes from ``overrides.model_config_of``. Before 0.5.19 resolution writes the
# fields themselves (DFlash's ``_handle_dflash`` assigns them), so a declaration is a field
# write, the record is its own view, and the model config is ``ServerArgs.get_model_config``.
# Chosen by what the running release has, never by its version.


def _declare(record: Any, source: str, **fields: Any) -> None:
    try:
        from sglang.srt.arg_groups.overrides import declare_resolution
    except ImportError:  # 0.5.18 and older: resolution assigns the fields
        for name, value in fields.items():
            setattr(record, name, value)
        return
    declare_resolution(record, source, **fields)


def resolving(record: Any) -> Any:
    """What resolution has decided so far, field by field (the record itself before 0.5.19)."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view
    except ImportError:
        return record
    return resolving_view(record)


def model_config(record: Any) -> Any:
    """SGLang's ModelConfig of the target the record names."""
    try:
        from sglang.srt.arg_groups.overrides import model_config_of
    except ImportError:
        return record.get_model_config()
    return model_config_of(record)


# ---------------------------------------------------------------------------
# The running process's settings (a seam: 0.5.17+ against 0.5.14 - 0.5.16). From 0.5.17
# on the runtime context carries them in bags (``get_spec()``, ``get_exec()``) with a scoped
# ``override``; 0.5.14 - 0.5.16 read the global ServerArgs (``get_global_server_args``),
# whose fields carry the same names, and a scoped override is a field write undone on exit.
# 0.5.16's ServerArgs has an ``override`` too, but it is another thing: the one audited,
# lasting mutation point after resolution (``override(source, **fields)``), with a guard on
# bare writes (SGLANG_STRICT_CONFIG_MUTATION). So the scoped write goes through it there.


def runtime_settings(bag: str = "spec") -> Any:
    """The settings bag ``bag`` ("spec", "exec") of this process, or the global ServerArgs."""
    import importlib

    context = importlib.import_module("sglang.srt.runtime_context")
    getter = getattr(context, f"get_{bag}", None)
    if getter is None:
        from sglang.srt.server_args import get_global_server_args

        return get_global_server_args()
    return getter()


def runtime_override(settings: Any, **fields: Any):
    """A context in which ``settings`` answers ``fields``: the bag's own ``override``, else
    the fields written and restored (a ServerArgs)."""
    import contextlib

    override = getattr(settings, "override", None)
    if callable(override) and not _is_server_args(settings):
        return override(**fields)

    @contextlib.contextmanager
    def written():
        saved = {name: getattr(settings, name) for name in fields}
        try:
            _audited_write(settings, fields)
            yield settings
        finally:
            _audited_write(settings, saved)

    return written()


def _is_server_args(settings: Any) -> bool:
    from sglang.srt.server_args import ServerArgs

    return isinstance(settings, ServerArgs)


def _audited_write(settings: Any, fields: dict) -> None:
    """Write ``fields`` on a ServerArgs: through its audited ``override`` where it has one
    (0.5.16: a bare write after resolution is refused under the strict guard, and the audit
    log names who changed what), else plain attribute writes (0.5.14 - 0.5.15.post1)."""
    if callable(getattr(settings, "override", None)):
        settings.override("ddtree-deploy", **fields)
        return
    for name, value in fields.items():
        setattr(settings, name, value)


def _resolved(record: Any) -> Any:
    """What resolution decided, as SGLang's ``resolved_view`` (0.5.15+); 0.5.14 resolves into
    the fields themselves: the record."""
    try:
        from sglang.srt.arg_groups.overrides import resolved_view
    except ImportError:
        return record
    return resolved_view(record)


def _attention_backends(view: Any) -> tuple:
    """(prefill, decode) attention backends as SGLang derives them: ``attention_backends_of``
    (0.5.15+), else ServerArgs' own ``get_attention_backends`` (0.5.14)."""
    try:
        from sglang.srt.arg_groups.overrides import attention_backends_of
    except ImportError:
        return tuple(view.get_attention_backends())
    return attention_backends_of(view)


# ---------------------------------------------------------------------------
# Server-argument resolution (SpeculativeAlgorithm's handle_server_args hook)


def _record_of(args: Any) -> Any:
    """The ServerArgs record behind what ``handle_server_args`` was handed.

    SGLang hands a plugin a write recorder (``overrides._ForeignDefaults``) that keeps
    only plain field writes. DFlash's own resolution, reused here, declares on the
    record (``declare_resolution``), and so does this module, so that every decision
    carries its source; on a release without the recorder the args are the record.
    """
    try:
        from sglang.srt.arg_groups.model_override_base import record_of

        return record_of(object.__getattribute__(args, "_cfg"))
    except (AttributeError, ImportError, TypeError):
        return args


def _positive_int(value: Any, flag: str, *, upper: Optional[int] = None) -> int:
    bad = isinstance(value, bool) or not isinstance(value, int)
    if bad or value < 1 or (upper is not None and value > upper):
        bounds = f"in [1, {upper}]" if upper is not None else ">= 1"
        raise ValueError(f"DDTREE: {flag} must be an integer {bounds}, got {value!r}.")
    return value


def resolve_server_args(args: Any) -> None:
    """DDTREE's resolution: what would change its law refused, DFlash's (device, parallelism,
    draft path, draft block, draft attention backend, running batch), then the tree's own
    numbers and gates: one budget for every batch, or a schedule of budgets per batch size."""
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash
    from sglang.srt.speculative import ddtree_schedule as sched

    record = _record_of(args)
    cfg = resolving(record)
    source = "ddtree_v2_plugin"
    _refuse_what_breaks_losslessness(record, cfg)

    schedule_text = getattr(cfg, "speculative_ddtree_budget_schedule", None)
    parsed, text_fault = None, None
    if schedule_text is not None:
        for flag, value in (("--speculative-ddtree-budget", cfg.speculative_ddtree_budget),
                            ("--speculative-ddtree-topk", cfg.speculative_ddtree_topk),
                            ("--speculative-num-draft-tokens", cfg.speculative_num_draft_tokens),
                            ("--speculative-eagle-topk", cfg.speculative_eagle_topk)):
            if value is not None:
                raise ValueError(
                    f"DDTREE: {flag} {value} and {sched.FLAG} {schedule_text} both set the "
                    f"tree; the schedule gives every batch size its budget and top-K: drop {flag}.")
        try:
            parsed = sched.parse(schedule_text)
        except sched.ScheduleError as fault:
            # Refused below, once the block and the memory are known, with a schedule that works.
            parsed, text_fault = fault.repaired, fault
        budget = topk = None
    else:
        budget = cfg.speculative_ddtree_budget
        # (The upper bound, MAX_BUDGET, is abi_problem's, below, with its reason and a fix.)
        budget = DEFAULT_BUDGET if budget is None else _positive_int(
            budget, "--speculative-ddtree-budget")
        topk = cfg.speculative_ddtree_topk
        if topk is not None:
            _positive_int(topk, "--speculative-ddtree-topk")
        # K > B keeps nothing more: a tree of B nodes has at most B siblings anywhere.
        topk = min(DEFAULT_MAX_TOPK if topk is None else topk, budget)
        if cfg.speculative_num_draft_tokens is not None and int(cfg.speculative_num_draft_tokens) != budget + 1:
            raise ValueError(
                "DDTREE: --speculative-num-draft-tokens is the verify width, "
                f"--speculative-ddtree-budget + 1 = {budget + 1}, got "
                f"{cfg.speculative_num_draft_tokens}; drop it (the draft block is "
                "--speculative-dflash-block-size)."
            )
        if cfg.speculative_eagle_topk is not None and int(cfg.speculative_eagle_topk) != topk:
            raise ValueError(
                f"DDTREE: --speculative-eagle-topk {cfg.speculative_eagle_topk} differs from the "
                f"per-depth top-K {topk}; drop it and use --speculative-ddtree-topk."
            )
    # The operator's own value, before DFlash's resolution declares its default 48.
    wanted_running = cfg.max_running_requests
    # The record's raw field, before DFlash's resolution assigns its 48 where no declarations
    # exist (0.5.18 and older); from 0.5.19 on the raw field never changes.
    operator_running = getattr(record, "max_running_requests", None)
    if (cfg.disaggregation_mode or "null") != "null":
        raise ValueError(
            "DDTREE does not support prefill/decode disaggregation "
            f"(--disaggregation-mode {cfg.disaggregation_mode}); use DFLASH there."
        )

    # DFlash resolves the DRAFT block into speculative_num_draft_tokens (flag, draft
    # config, else 16) and forces topk 1: clear both first, read the block, then give
    # speculative_num_draft_tokens the verify width and topk the per-depth K.
    _declare(record, source, speculative_num_draft_tokens=None, speculative_eagle_topk=None)
    _handle_dflash(record)
    block = int(resolving(record).speculative_num_draft_tokens)
    if block < 2:
        raise ValueError(
            "DDTREE: the draft block must be >= 2 (the bonus token and one drafted "
            f"position), got {block} (--speculative-dflash-block-size or the draft config)."
        )
    vocab = int(model_config(record).vocab_size)
    if parsed is None:
        if block > budget + 1:
            raise ValueError(
                f"DDTREE: the draft block {block} exceeds the verify width {budget + 1} "
                f"(--speculative-ddtree-budget {budget} + 1): the draft writes a whole block "
                f"into each request's verify window; use --speculative-ddtree-budget >= {block - 1}."
            )
        from sglang.srt.speculative.ddtree_lineage import abi_problem

        problem = abi_problem(budget, topk, block, vocab_size=vocab)
        if problem is not None:
            raise ValueError(problem)
        _size_running_batch(record, source, budget, vocab, wanted_running)
        resolved = None
    else:
        resolved, running, log = _resolve_schedule(
            parsed, text_fault, block, vocab, wanted_running,
            _free_bytes(cfg.device, cfg.mem_fraction_static))
        budget = max(entry.budget for entry in resolved)
        topk = max(entry.topk for entry in resolved)
        _declare(record, source, max_running_requests=running,
                 speculative_ddtree_budget_schedule=sched.format_schedule(resolved))
        logger.warning("%s", log)
    _declare(
        record,
        source,
        speculative_ddtree_budget=budget,
        speculative_ddtree_topk=topk,
        speculative_num_draft_tokens=budget + 1,
        speculative_dflash_block_size=block,
        speculative_eagle_topk=topk,
    )

    if resolving(record).enable_mixed_chunk:
        # A mixed prefill + verify step is not proven for a tree verify (supports_mixed_chunk
        # below says so); SGLang's validation would assert on it. Off, said once, as for UNO.
        _declare(record, source, enable_mixed_chunk=False)
        logger.warning("Mixed chunked prefill is disabled for DDTREE speculative decoding.")

    view = _resolved(record)
    prefill, decode = _attention_backends(view)
    verify = decode if view.speculative_attention_mode == "decode" else prefill
    if verify is not None and verify not in VERIFY_ATTENTION_BACKENDS:
        raise ValueError(
            f"DDTREE: the target-verify attention backend {verify!r} "
            f"(speculative_attention_mode={view.speculative_attention_mode}) does not "
            f"apply a tree mask; use --attention-backend one of "
            f"{', '.join(VERIFY_ATTENTION_BACKENDS)}."
        )

    # Hybrid targets (Mamba2 / GDN / KDA layers): served exactly where SGLang's backend has a
    # tree path, refused with the reason otherwise (ddtree_hybrid, docs/patches-v2.md). The
    # pools keep budget + 1 intermediate states per request at the schedule's largest budget.
    from sglang.srt.speculative import ddtree_hybrid

    hybrid = ddtree_hybrid.check(view, model_config(record), budget,
                                 widths=[entry.width for entry in resolved or ()])
    if hybrid is not None:
        _size_for_recurrent_states(record, view, hybrid, budget, source, operator_running)
    if resolved is not None:
        running = int(_resolved(record).max_running_requests)
        unreached = [entry for entry in resolved if entry.threshold > running]
        if unreached:
            kept = [entry for entry in resolved if entry.threshold <= running]
            raise ValueError(sched.refusal(
                unreached[0].text(), f"it starts at batch {unreached[0].threshold}, above "
                f"max_running_requests {running} (the recurrent states' rule), so it would never "
                "run", kept))


# ---------------------------------------------------------------------------
# Options SGLang's EAGLE path honours and DDTREE must not (each would change what DDTREE
# samples, or is DFlash machinery the tree worker does not carry).

#: Draft architectures whose head is not a per-position marginal (DDTree's tree is built from
#: the draft's top-K log-probs per position): DFlash2's candidate selector (a beam over
#: transitions) and LiLiCorr's reranking head (SGLang's models/dflash.py, models/lilicorr.py).
SELECTOR_DRAFTS = ("DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel")
LILICORR_DRAFTS = ("LiLiCorrDraftModel",)


def _attn_dp_enabled(view: Any) -> bool:
    try:  # 0.5.21+: attention-DP as the runtime computes it
        from sglang.srt.runtime_context import attn_dp_enabled_of
    except ImportError:  # 0.5.20 and older: the flag itself
        return bool(getattr(view, "enable_dp_attention", False))
    return bool(attn_dp_enabled_of(view))


def _is_hip() -> bool:
    try:  # 0.5.19+: the platform record (which tests may override)
        from sglang.srt.runtime_context import get_platform
    except ImportError:  # 0.5.18 and older: SGLang's own probe of the torch build
        from sglang.srt.utils.common import is_hip

        return bool(is_hip())
    return bool(getattr(get_platform(), "is_hip", False))


def _refuse_what_breaks_losslessness(record: Any, cfg: Any) -> None:
    """The options of SGLang's EAGLE family (``_handle_eagle_family`` checks them for EAGLE)
    that DDTREE's resolution would otherwise accept silently: each one refused in one line,
    before DFlash's own checks, so the message is DDTREE's."""
    if getattr(cfg, "speculative_use_rejection_sampling", False):
        raise ValueError(
            "DDTREE: --speculative-use-rejection-sampling is EAGLE's top-K 1 chain sampler (it "
            "needs the draft's proposal distribution over the target vocabulary, which DDTREE's "
            "top-K draft does not have); DDTREE's tree sampling already follows the target's "
            "distribution: drop the flag.")
    for flag in ("--speculative-accept-threshold-single", "--speculative-accept-threshold-acc"):
        value = getattr(cfg, flag[2:].replace("-", "_"), 1.0)
        if value is not None and float(value) != 1.0:
            raise ValueError(
                f"DDTREE: {flag} {value} would accept draft tokens by a threshold, so sampled "
                "output would no longer follow the target's distribution (the lossless verify "
                "is at 1.0); drop the flag.")
    if getattr(cfg, "speculative_draft_window_size", None) is not None:
        raise ValueError(
            f"DDTREE: --speculative-draft-window-size {cfg.speculative_draft_window_size} "
            "(DFlash's compact draft cache) is not supported: the tree worker writes the draft "
            "KV of every committed token; drop the flag.")
    if _attn_dp_enabled(_resolved(record)):
        raise ValueError(
            "DDTREE does not support data-parallel attention (--enable-dp-attention / "
            "--attn-dp-size > 1): the tree verify and the draft's top-K head are not proven "
            "across attention-DP ranks; drop the flag or use DFLASH.")
    device = str(cfg.device or "")
    hip = _is_hip()
    if hip or device in ("xpu", "npu"):
        where = "ROCm" if hip else device
        raise ValueError(
            f"DDTREE is not supported on {where}: SGLang's EAGLE verify there has no tree "
            "sampling kernel and commits the argmax for sampled requests (their output would "
            "not follow the target's distribution); use a CUDA GPU, or DFLASH.")
    head = _draft_head(cfg)
    if head is not None:
        raise ValueError(
            f"DDTREE needs a plain DFlash draft (per-position marginals), but the draft "
            f"{cfg.speculative_draft_model_path} is {head}; use --speculative-algorithm DFLASH "
            "for this draft.")


def _draft_head(cfg: Any) -> Optional[str]:
    """What kind of non-marginal head the draft carries (its config's architecture, or a
    Domino projector), None for a plain DFlash draft or when the config cannot be read
    (DFlash's own resolution reports an unreadable draft)."""
    if cfg.speculative_draft_model_path is None:
        return None
    import json

    try:
        from sglang.srt.utils.hf_transformers_utils import get_config

        hf = get_config(cfg.speculative_draft_model_path, trust_remote_code=cfg.trust_remote_code,
                        revision=cfg.speculative_draft_model_revision,
                        model_override_args=json.loads(cfg.json_model_override_args or "{}"))
    except Exception:  # noqa: BLE001 - DFlash's resolution names the failure
        return None
    arch = (getattr(hf, "architectures", None) or [None])[0]
    if arch in SELECTOR_DRAFTS:
        return f"a {arch} (a candidate-selector head)"
    if arch in LILICORR_DRAFTS:
        return f"a {arch} (a LiLiCorr reranking head)"
    dflash = getattr(hf, "dflash_config", None) or {}
    projector = dflash.get("projector_type") if isinstance(dflash, dict) else None
    if projector is None:
        projector = getattr(hf, "projector_type", None)
    if projector == "domino":
        return "a Domino draft (projector_type domino)"
    return None


# ---------------------------------------------------------------------------
# The budget schedule (--speculative-ddtree-budget-schedule): per entry the CUDA tree ABI and
# the memory rule; a refusal names the entry and a schedule that passes every check.


def _free_bytes(device: str, mem_fraction_static: Optional[float]) -> Optional[float]:
    """The memory SGLang leaves outside its static pools (None when unknown: no GPU)."""
    device_mib = _device_memory_mib(device)
    if not device_mib or mem_fraction_static is None:
        return None
    return float(device_mib) * (1 << 20) * (1.0 - float(mem_fraction_static))


def _resolve_schedule(parsed, text_fault, block: int, vocab: int, wanted: Optional[int],
                      free_bytes: Optional[float]):
    """(resolved entries, max_running_requests, the log line), or one ValueError line naming
    the first faulty entry and a schedule that works (its faults mended one at a time, each
    mend checked again, so the schedule named passes every check here)."""
    from sglang.srt.speculative import ddtree_schedule as sched

    entries = list(sched.resolve(parsed, block, DEFAULT_MAX_TOPK))
    first = None if text_fault is None else (text_fault.entry, text_fault.why)
    for _ in range(8 * sched.MAX_ENTRIES):
        fault = _schedule_fault(entries, block, vocab, wanted, free_bytes)
        if isinstance(fault, tuple) and len(fault) == 2:  # (max_running_requests, log): passes
            if first is not None:
                raise ValueError(sched.refusal(first[0], first[1], entries))
            return tuple(entries), fault[0], fault[1]
        entry, why, mended = fault
        first = first or (entry, why)
        if mended == entries:
            break
        entries = mended
    raise ValueError(sched.refusal(first[0], first[1], entries).replace(
        "; use ", "; no schedule close to it works here, e.g. not "))


def _schedule_fault(entries, block, vocab, wanted, free_bytes):
    """The first fault of resolved ``entries``: (entry text, why, entries mended); or, when
    there is none, (max_running_requests, the log line)."""
    from sglang.srt.speculative import ddtree_schedule as sched
    from sglang.srt.speculative.ddtree_lineage import MAX_VERIFY_WIDTH, abi_problem, tree_capacity
    from sglang.srt.speculative.ddtree_utils import (
        DEFAULT_MAX_RUNNING_REQUESTS,
        verify_request_cap,
    )

    def replaced(i, budget, topk):
        out = list(entries)
        out[i] = sched.Entry(entries[i].threshold, budget, min(topk, budget))
        return out

    # Per entry, the CUDA tree ABI and the draft block (as --speculative-ddtree-budget's).
    for i, entry in enumerate(entries):
        budget, topk = entry.budget, entry.topk
        if block > budget + 1:
            return (entry.text(), f"the draft block {block} exceeds its verify width {budget + 1}"
                    " (the draft writes a whole block into each request's verify window)",
                    replaced(i, block - 1, topk))
        if abi_problem(budget, topk, block, vocab_size=vocab) is not None:
            fit_k = min(topk, vocab)
            fit_b = min(budget, MAX_VERIFY_WIDTH - 1, tree_capacity(fit_k, block - 1, budget))
            why = ("its verify width is over the 1024 SGLang's CUDA tree builder takes"
                   if budget + 1 > MAX_VERIFY_WIDTH else
                   f"top-K {topk} exceeds the vocabulary ({vocab} tokens)" if topk > vocab else
                   f"budget {budget} exceeds the distinct draft prefixes that top-K {topk} and "
                   f"the draft block {block} allow (EAGLE's CUDA tree verify carries no padding)")
            return entry.text(), why, replaced(i, max(fit_b, block - 1), fit_k)
    last = entries[-1]
    if wanted is not None and int(wanted) < last.threshold:
        unreached = next(entry for entry in entries if entry.threshold > int(wanted))
        return (unreached.text(), f"it starts at batch {unreached.threshold}, above "
                f"--max-running-requests {wanted}, so it would never run",
                [entry for entry in entries if entry.threshold <= int(wanted)])
    running = int(wanted) if wanted is not None else max(DEFAULT_MAX_RUNNING_REQUESTS,
                                                          last.threshold)
    if free_bytes is None:
        return running, (f"DDTREE: budget schedule {sched.format_schedule(entries)}, "
                         f"max_running_requests = {running} (no device memory known: the "
                         "budget x vocab rule not applied)")
    # The memory rule per entry: every batch an entry serves verifies at its budget, so its
    # budget x vocab must fit the largest of them. Unset, max_running_requests stops where the
    # last entry's budget fits.
    caps = [verify_request_cap(entry.budget, vocab, free_bytes) for entry in entries]
    if wanted is None and caps[-1] >= last.threshold:
        running = min(running, caps[-1])
    for i, ((lo, hi), cap) in enumerate(zip(sched.ranges(entries, running), caps)):
        if cap >= hi:
            continue
        need = hi if (wanted is not None or i + 1 < len(entries)) else lo
        fit = entries[i].budget
        while fit > block - 1 and verify_request_cap(fit, vocab, free_bytes) < need:
            fit -= 1
        upto = (f"--max-running-requests {hi}" if i + 1 == len(entries) and wanted is not None
                else f"batch {need}")
        why = (f"budget {entries[i].budget} x vocab {vocab} fits {cap} requests' verify buffers "
               "(half the memory left outside --mem-fraction-static), but the entry serves up to "
               f"{upto}")
        if verify_request_cap(fit, vocab, free_bytes) >= need:
            return entries[i].text(), why, replaced(i, fit, entries[i].topk)
        if i + 1 < len(entries) and cap >= lo:  # end this entry's batches where it fits
            out = entries[:i + 1] + [sched.Entry(cap + 1, entries[i + 1].budget,
                                                 entries[i + 1].topk)]
            out += [entry for entry in entries[i + 2:] if entry.threshold > cap + 1]
            return entries[i].text(), why, out
        return entries[i].text(), why, entries  # nothing close works: refused as it is
    spans = "; ".join(f"{e.text()}: batches {lo}-{hi}, fits {cap}"
                      for e, (lo, hi), cap in zip(entries, sched.ranges(entries, running), caps))
    return running, (f"DDTREE: budget schedule {sched.format_schedule(entries)}, "
                     f"max_running_requests = {running} (budget x vocab {vocab} per entry: {spans})")


def _device_memory_mib(device: str) -> Optional[float]:
    """The device's memory in MiB as SGLang measures it for its own memory plan (None when
    unknown, e.g. no GPU)."""
    from sglang.srt.utils.common import get_device_memory_capacity

    return get_device_memory_capacity(device)


def _size_for_recurrent_states(record: Any, view: Any, hybrid: Any, budget: int, source: str,
                               wanted: Optional[int]) -> None:
    """max_running_requests for a hybrid target: every running request keeps B + 1
    intermediate recurrent states during a verify (ddtree_hybrid.recurrent_verify_cost).
    Derived when the operator set none (DFlash's 48, capped), refused with the numbers when
    an explicit value cannot fit; skipped when the device memory is unknown (no GPU)."""
    from sglang.srt.speculative import ddtree_hybrid

    device_mib = _device_memory_mib(view.device)
    if not device_mib or view.mem_fraction_static is None:
        return
    per_slot = ddtree_hybrid.per_slot_state_bytes(hybrid.config, int(view.tp_size or 1))
    cost = ddtree_hybrid.recurrent_verify_cost(per_slot, budget,
                                               radix_cache=not view.disable_radix_cache)
    budget_bytes = ddtree_hybrid.state_budget_bytes(
        float(device_mib) * (1 << 20), float(view.mem_fraction_static),
        getattr(view, "mamba_full_memory_ratio", None))
    # ``wanted``: the operator's own value (the record's raw field before resolution); DFlash
    # decided 48 when it was unset.
    running = ddtree_hybrid.running_requests_for(
        wanted, cost, budget_bytes, default=int(view.max_running_requests or 48),
        what=f"the recurrent share of --mem-fraction-static {view.mem_fraction_static} of "
             f"{ddtree_hybrid.size_text(float(device_mib) * (1 << 20))}")
    if running != view.max_running_requests:
        logger.warning(
            "DDTREE on %s: max_running_requests = %d (budget %d keeps %d recurrent states of "
            "%s per request).", hybrid.config_class, running, budget,
            cost.states_per_request, ddtree_hybrid.size_text(per_slot))
        _declare(record, source, max_running_requests=running)


def _size_running_batch(record: Any, source: str, budget: int, vocab: int,
                        wanted: Optional[int]) -> None:
    """max_running_requests by the rule every DDTree family shares (budget x vocab against the
    memory SGLang leaves outside mem_fraction_static; ddtree_utils.size_running_batch), with
    the device memory SGLang measures for its own memory plan."""
    from sglang.srt.speculative.ddtree_utils import size_running_batch

    cfg = resolving(record)
    plan = size_running_batch(budget, vocab, _device_memory_mib(cfg.device),
                              cfg.mem_fraction_static, wanted)
    if plan is not None:
        _declare(record, source, max_running_requests=plan.max_running_requests)
        logger.warning("%s", plan.log)


# ---------------------------------------------------------------------------
# Registration: DDTREE is DFLASH everywhere but in its resolution, its worker and the
# target's verify width.

# Methods of SpeculativeAlgorithm that answer from the algorithm's identity alone; for
# DDTREE they answer as DFLASH does (target-layer capture, graph runners, pool sizing).
_PREDICATE_PREFIXES = ("is_", "supports_", "has_", "carries_", "need_")


def _as_dflash(name: str):
    def predicate(self, *args, **kwargs):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return getattr(SpeculativeAlgorithm.DFLASH, name)(*args, **kwargs)

    predicate.__name__ = name
    return predicate


def _run_enum(name: str, function):
    # The enum's own code, run for DDTREE: it dispatches on the predicates above.
    def method(self, *args, **kwargs):
        return function(self, *args, **kwargs)

    method.__name__ = name
    return method


def _spec_class():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DDTreeSpecAlgo(CustomSpecAlgo):
        """DDTREE: DFlash drafting, verified as a tree through EAGLE's verify."""

        def handle_server_args(self, server_args):
            resolve_server_args(server_args)

        def create_worker(self, server_args):
            ddtree_verify_width(server_args)  # refuses args not resolved as DDTREE's
            worker = self.factory(server_args)
            if getattr(worker, "DDTREE_TREE_VERIFY", False) is not True:
                raise RuntimeError(
                    f"DDTREE resolved to {worker.__module__}.{worker.__qualname__}, which "
                    "does not tree-verify (no DDTREE_TREE_VERIFY = True): refusing to "
                    "serve DDTREE as a linear chain."
                )
            return worker

        def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens, is_draft_worker):
            # One number, two meanings, decoupled: the target verifies budget + 1 tokens
            # per request, the DFlash draft runs on its block.
            if is_draft_worker:
                return ddtree_draft_block(runtime_settings("spec"))
            return num_draft_tokens

        # The same question under its name before 0.5.16 (0.5.14 - 0.5.15.post1 ask it as
        # ``..._per_bs_...``; 0.5.16+ keep that name as a deprecated alias of the above).
        get_num_tokens_per_bs_for_target_verify = get_num_tokens_per_req_for_target_verify

        def supports_mixed_chunk(self):
            # Conservative: a tree verify inside a mixed prefill + verify forward is
            # not proven here; SGLang then turns mixed chunk off for DDTREE.
            return False

    for name, member in vars(SpeculativeAlgorithm).items():
        if name.startswith("_") or name in DDTreeSpecAlgo.__dict__:
            continue
        if not callable(member) or isinstance(member, (classmethod, staticmethod, type)):
            continue
        if isinstance(member, SpeculativeAlgorithm):
            continue
        if name.startswith(_PREDICATE_PREFIXES):
            setattr(DDTreeSpecAlgo, name, _as_dflash(name))
        elif not hasattr(CustomSpecAlgo, name) or name in ("build_disagg_draft_input",
                                                         "resolve_max_speculative_num_draft_tokens"):
            setattr(DDTreeSpecAlgo, name, _run_enum(name, member))
    return DDTreeSpecAlgo


def _worker_factory(server_args):
    from sglang.srt.speculative.ddtree_worker_v2 import DDTreeWorkerV2

    return DDTreeWorkerV2


# /server_info's DDTree report (CONTRACTS.md: ddtree_verify_width, ddtree_worker_class,
# ddtree_offchain_accepts under internal_states[i]): an AFTER hook on the scheduler's
# get_internal_state, applied by SGLang's load_plugins() (HookRegistry). The method exists
# from 0.5.20 to 0.5.23 while its body moved (0.5.22), so a hook, not a hunk.
REPORT_HOOK_TARGET = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"


def _internal_state_report(result, *args, **kwargs):
    # Imported when the hook runs (a /server_info request), never at registration.
    from sglang.srt.speculative.ddtree_worker_v2 import add_ddtree_report

    return add_ddtree_report(result, *args, **kwargs)


def _register_hooks() -> None:
    """Register the report hook. The scheduler process imports spec_info (so this module)
    at its top and calls load_plugins() later, which applies every registered hook."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(REPORT_HOOK_TARGET, _internal_state_report, HookType.AFTER)


def register() -> None:
    """Register DDTREE once per process (idempotent)."""
    from sglang.srt.speculative.spec_registry import get_spec as registered

    if registered(ALGORITHM) is not None:
        return
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    SpeculativeAlgorithm.register(ALGORITHM, supports_overlap=True, spec_class=_spec_class())(
        _worker_factory)
    # SpeculativeAlgorithm.DDTREE names the registered algorithm, as the enum member does
    # in the v1 families, so code and the import smoke level find DDTREE the same way on
    # every family. A class attribute, not a member: the enum's members are fixed, and
    # iteration, SpeculativeAlgorithm["..."] and the reserved names are unchanged.
    setattr(SpeculativeAlgorithm, ALGORITHM, registered(ALGORITHM))
    _register_hooks()


register()


__all__ = [
    "ALGORITHM",
    "DEFAULT_BUDGET",
    "DEFAULT_MAX_TOPK",
    "MAX_BUDGET",
    "VERIFY_ATTENTION_BACKENDS",
    "ddtree_budget",
    "ddtree_draft_block",
    "ddtree_schedule",
    "ddtree_topk",
    "ddtree_verify_width",
    "decode_reserve",
    "register",
    "resolve_server_args",
]
