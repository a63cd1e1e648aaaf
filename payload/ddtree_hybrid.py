"""DDTree on hybrid targets (attention + recurrent layers) on SGLang's v2 worker (0.5.20 - 0.5.23).

Installed by the ``sglang-0.5.20`` family as ``sglang/srt/speculative/ddtree_hybrid.py``; called
by ``ddtree_v2_plugin`` (server arguments) and ``ddtree_worker_v2`` (start-up). Read from the
0.5.20 - 0.5.23 wheels (docs/patches-v2.md, "Hybrid targets"):

- A tree verify gives every tree node the recurrent state of its own path: SGLang's hybrid
  linear-attention backend runs its tree-aware kernels (``retrieve_parent_token``, the Triton
  ``causal_conv1d_update`` and recurrent kernels) when ``speculative_eagle_topk > 1``
  (``MambaAttnBackendBase.topk``, read when the backend is built), and keeps each node's state in
  the pool's intermediate caches (``MambaPool.SpeculativeState``, B + 1 states per request).
- After the verify, ``spec_utils.commit_mamba_states_after_verify(..., accept_lens, accept_index,
  ...)`` commits the state of each request's last ACCEPTED tree node (``accept_index[b,
  accept_lens[b] - 1]``, not the chain step ``accept_lens - 1`` DFlash's own
  ``_update_target_mamba_state_after_verify`` uses) and the interval-crossing state for the
  prefix cache (``mamba_track_indices``). EAGLE's ``run_eagle_verify``, which the DDTree worker
  calls, runs it before moving the accepted path to the front, in all four releases.

So DDTree needs no recurrent code of its own: it needs the tree path switched on for the
target, kept off for the DFlash draft (``draft_spec_scope``), and the combinations without a
tree path refused at start-up with one line (``check``). The recurrent kinds, as SGLang's
``attention_registry`` picks their backend:

    gdn         Qwen3-Next, Qwen3.5, InternS2, Jet-Nemotron  GDNAttnBackend: tree verify always on
                                                             the Triton kernel
    mamba2      Nemotron-H, Falcon-H1, Granite hybrid, Mamba2 Mamba2AttnBackend + MambaMixer2:
                                                             --mamba-backend triton (FlashInfer's
                                                             selective_state_update has no tree)
    kda         Kimi Linear, Bailing (KDA), GLM-5 Next       KDAAttnBackend: the Triton verify
                                                             kernel (FlashInfer's is chain-only)
    lightning   Bailing hybrid, MiniCPM hybrid (seg_la)      refused: verifies a tree as a chain
    short_conv  LFM2, LFM2-MoE, LFM2-VL, ZAYA1               refused: no parent plumbing
    inkling     Inkling                                      refused: no parent plumbing
    mamba1      Mamba, Falcon-Mamba                          refused: no target-verify path
    registered  register_linear_attn_model() models          refused: tree path unknown

The memory term (``recurrent_verify_cost``, ``recurrent_request_cap``) is pure: SGLang keeps
B + 1 intermediate recurrent states per running request next to its persistent slots.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional, Sequence

# The function that commits the accepted node's recurrent state (called by run_eagle_verify).
COMMIT_HOOK = "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify"


@dataclass(frozen=True)
class Kind:
    """A recurrent layer kind, as SGLang's attention registry builds its backend."""

    name: str
    label: str
    backend: str
    tree: bool  # SGLang's backend has a tree-aware (retrieve_parent_token) verify path
    why: str = ""  # refused: why there is no tree path


KINDS = {
    k.name: k
    for k in (
        Kind("gdn", "Gated DeltaNet", "GDNAttnBackend", True),
        Kind("mamba2", "Mamba2", "Mamba2AttnBackend", True),
        Kind("kda", "Kimi Delta Attention", "KDAAttnBackend", True),
        Kind("lightning", "Lightning linear attention (seg_la)", "LightningAttentionBackend",
             False, "seg_la verifies a draft tree as a chain and refuses speculative_eagle_topk > 1"),
        Kind("short_conv", "short convolution", "ShortConvAttnBackend", False,
             "its conv states follow the verify window in order, so a tree verifies as a chain"),
        Kind("inkling", "Inkling short convolution", "InklingShortConvAttnBackend", False,
             "its conv states follow the verify window in order, so a tree verifies as a chain"),
        Kind("mamba1", "Mamba-1", "Mamba2AttnBackend (MambaMixer1)", False,
             "MambaMixer1 has no speculative target-verify path"),
        Kind("registered", "registered linear attention", "register_linear_attn_model() backend",
             False, "SGLang's registry does not say whether its backend has a tree path"),
    )
}


def recurrent_kind(model_config: Any) -> Optional[tuple[Kind, Any]]:
    """(kind, the config SGLang builds the recurrent cache from) of a target, or None for a
    pure-attention target. ``model_config``: SGLang's ``ModelConfig``. Follows the order in
    which ``attention_registry`` picks the linear-attention backend, with SGLang's own
    predicates (``configs/hybrid_arch.py``: the same in 0.5.19 - 0.5.23 but for GLM-5 Next)."""
    from sglang.srt import configs

    arch = _hybrid_arch()
    hf = model_config.hf_config
    inkling = tuple(getattr(configs, n) for n in ("InklingModelConfig", "InklingMMConfig")
                    if hasattr(configs, n))
    if inkling and isinstance(hf, inkling):
        # Before SGLang's predicates: Inkling's mamba2_cache_params reads the runtime context,
        # which is not published while the arguments resolve (SGLang's own error otherwise).
        return KINDS["inkling"], hf
    recurrent = arch.mambaish_config(model_config)
    if recurrent is None:
        return None
    if arch.hybrid_gdn_config(model_config) is not None:
        return KINDS["gdn"], recurrent
    mamba2 = arch.mamba2_config(model_config)
    if mamba2 is not None:
        short_conv = tuple(getattr(configs, n) for n in
                           ("Lfm2Config", "Lfm2MoeConfig", "Lfm2VlConfig", "ZayaConfig")
                           if hasattr(configs, n))
        if short_conv and isinstance(mamba2, short_conv):
            return KINDS["short_conv"], recurrent
        mamba1 = tuple(getattr(configs, n) for n in ("MambaConfig", "FalconMambaConfig")
                       if hasattr(configs, n))
        if mamba1 and isinstance(mamba2, mamba1):
            return KINDS["mamba1"], recurrent
        return KINDS["mamba2"], recurrent
    # Seam (API difference): GLM-5 Next's predicate arrives with 0.5.20; 0.5.14 - 0.5.19 have
    # only Kimi Linear on the KDA backend.
    glm5_next = getattr(arch, "glm5_next_config", None)
    if arch.kimi_linear_config(model_config) is not None or (
            glm5_next is not None and glm5_next(model_config) is not None):
        return KINDS["kda"], recurrent
    if arch.hybrid_lightning_config(model_config) is not None:
        return KINDS["lightning"], recurrent
    return KINDS["registered"], recurrent


_PREDICATES = ("mambaish_config", "hybrid_gdn_config", "mamba2_config", "kimi_linear_config",
               "hybrid_lightning_config")


def _hybrid_arch():
    """SGLang's hybrid-architecture predicates, each ``predicate(model_config)``: the module
    ``configs/hybrid_arch`` (0.5.18+), else (0.5.14 - 0.5.15.post1) the ModelRunner properties
    of the same names, which it later moved there, read on a view of the target's ModelConfig
    (a target runner: not the draft worker)."""
    try:
        from sglang.srt.configs import hybrid_arch
    except ImportError:
        pass
    else:
        return hybrid_arch
    from types import SimpleNamespace

    from sglang.srt.model_executor import model_runner as mr

    members = {name: getattr(mr.ModelRunner, name) for name in _PREDICATES}
    members["_get_linear_attn_registry_result"] = mr.ModelRunner._get_linear_attn_registry_result
    view = type("TargetConfigView", (), members)

    def predicate(name):
        def read(model_config):
            target = view()
            target.model_config, target.is_draft_worker = model_config, False
            target._linear_attn_registry_cache = mr._UNSET
            return getattr(target, name)

        return read

    return SimpleNamespace(**{name: predicate(name) for name in _PREDICATES})


@dataclass(frozen=True)
class HybridTarget:
    """A hybrid target DDTREE serves (what ``check`` accepted)."""

    kind: Kind
    config_class: str  # the recurrent config's class, as named in refusals and reports
    config: Any = None  # that config (SGLang sizes the recurrent cache from it)

    def report(self, topk: int) -> dict:
        """What the smoke levels and /server_info show: the tree path is on (topk > 1 makes
        the target's hybrid backend build its tree kernels) and who commits the state."""
        return {"recurrent_kind": self.kind.name, "recurrent_config": self.config_class,
                "recurrent_backend": self.kind.backend, "tree_path": int(topk) > 1,
                "commit_hook": COMMIT_HOOK}


# KDA verify backends whose tree verify runs the Triton recurrent kernel: triton itself, and
# nv_cutedsl (its CuTe kernel takes chains only; with retrieve_parent_token set the backend
# falls back to the Triton kernel). FlashInfer's recurrent_kda is chain-only (SGLang refuses
# it with topk > 1); Helion's tree verify is not proven here.
KDA_TREE_VERIFY_BACKENDS = ("triton", "nv_cutedsl")


def describe(server_args: Any) -> Optional[dict]:
    """What the smoke levels show for resolved ServerArgs (``[smoke] hybrid_report``): None for a
    pure-attention target, else the kind, its config class and backend, whether the tree path
    is on (the resolved ``speculative_eagle_topk > 1``) and the commit hook, found or not."""
    import importlib

    from sglang.srt.speculative.ddtree_v2_plugin import model_config, resolving

    found = recurrent_kind(model_config(server_args))
    if found is None:
        return None
    kind, recurrent = found
    view = resolving(server_args)
    topk = int(view.speculative_eagle_topk or 0)
    report = HybridTarget(kind=kind, config_class=type(recurrent).__name__).report(topk)
    module, _, name = COMMIT_HOOK.rpartition(".")
    report["commit_hook_found"] = callable(getattr(importlib.import_module(module), name, None))
    report["speculative_eagle_topk"] = topk
    # The tree's own K: 1 makes the tree a chain, which needs no tree path.
    report["ddtree_topk"] = getattr(view, "speculative_ddtree_topk", None)
    return report


def _verify_backend_of_linear_attn(view: Any) -> str:
    # SGLang's rule (linear/utils.resolve_linear_attn_backends): an unset verify backend
    # follows the decode backend for FlashInfer, else Triton.
    verify = getattr(view, "linear_attn_verify_backend", None)
    if verify:
        return str(verify)
    decode = getattr(view, "linear_attn_decode_backend", None) or getattr(
        view, "linear_attn_backend", None) or "triton"
    return "flashinfer" if decode == "flashinfer" else "triton"


def check(view: Any, model_config: Any, budget: int,
          widths: Sequence[int] = ()) -> Optional[HybridTarget]:
    """DDTREE's start-up gate for hybrid targets. ``view``: the resolved server arguments
    (a ResolvedView or anything with the same fields); ``model_config``: SGLang's
    ModelConfig; ``budget``: the largest budget; ``widths``: the verify widths of a budget
    schedule (none for one budget). Returns None for a pure-attention target, the HybridTarget
    when DDTREE can serve it exactly, and raises ValueError (one line: the model, its recurrent
    config class, the reason, what to use instead) otherwise."""
    found = recurrent_kind(model_config)
    if found is None:
        return None
    kind, recurrent = found
    name = type(recurrent).__name__
    who = f"DDTREE on hybrid target {view.model_path} ({name}, {kind.label})"
    if not kind.tree:
        raise ValueError(
            f"{who}: SGLang's {kind.backend} has no tree path ({kind.why}); use "
            "--speculative-algorithm DFLASH for this model."
        )
    refusals = []
    if kind.name == "mamba2" and getattr(view, "mamba_backend", "triton") != "triton":
        refusals.append(
            f"--mamba-backend {view.mamba_backend} has no tree path (its selective_state_update "
            "refuses retrieve_parent_token); use --mamba-backend triton")
    if kind.name == "mamba2" and len(set(widths)) > 1:
        # MambaMixer2 hands selective_state_update cache_steps = the step's verify width, and
        # the kernel strides the pool's intermediate SSM states by it, while the pool holds
        # the largest width per request: a narrower step writes request b's states at b x its
        # width and the commit reads them at b x the largest (tests/integration/test_v2_hybrid.py shows the
        # wrong state). GDN and KDA index the pool by its own stride: every width is exact.
        refusals.append(
            f"a budget schedule of several verify widths ({', '.join(map(str, sorted(set(widths))))})"
            ": SGLang's MambaMixer2 strides the intermediate SSM states by the step's width, the "
            "pool by the largest, so a narrower step would commit the wrong state; use one "
            "--speculative-ddtree-budget (or schedule entries of one budget) for this model")
    if kind.name == "kda" and not _kda_has_verify_path():
        # 0.5.14 - 0.5.15.post1: KDAAttnBackend has no verify path: a verify runs the
        # prefill's chunk kernel over the tree's tokens in order (a tree verified as a chain).
        raise ValueError(
            f"{who}: this SGLang's {kind.backend} has no tree verify path (a verify runs its "
            "prefill kernel over the tree as a chain; SGLang 0.5.17+ has one); use "
            "--speculative-algorithm DFLASH for this model, or SGLang 0.5.17 or later."
        )
    if kind.name == "gdn" and not _gdn_routes_trees_to_triton():
        flags = _gdn_flashinfer_flags(view)
        if flags:
            refusals.append(
                f"{' and '.join(flags)} {'route' if len(flags) > 1 else 'routes'} this "
                "SGLang's GDN verify to FlashInfer, whose "
                "kernel refuses retrieve_parent_token (a tree); use "
                "--linear-attn-decode-backend triton --linear-attn-prefill-backend triton")
    if kind.name == "kda":
        verify = _verify_backend_of_linear_attn(view)
        if verify not in KDA_TREE_VERIFY_BACKENDS:
            # Before 0.5.17 there is no verify flag: the decode backend's kernel verifies.
            flag = ("--linear-attn-verify-backend" if hasattr(view, "linear_attn_verify_backend")
                    else "--linear-attn-decode-backend")
            refusals.append(
                f"the KDA verify backend {verify} has no tree path proven here (FlashInfer's "
                f"recurrent_kda is chain-only); use {flag} triton")
    if getattr(view, "enable_linear_replayssm_spec", False):
        refusals.append(
            "--enable-linear-replayssm-spec verifies a linear chain only (its ring is committed "
            "by accepted count, not by tree node); drop the flag")
    page = int(getattr(view, "page_size", None) or 1)
    if page != 1:
        refusals.append(
            f"--page-size {page}: the recurrent tree commit is proven at page size 1 only "
            "(docs/patches-v2.md, Hybrid targets); use --page-size 1")
    if _extra_buffer(view):
        interval = int(view.mamba_track_interval)
        if interval < budget + 1:
            # One verify may commit any node of a width-(B + 1) window, and the prefix
            # cache snapshots at most one interval crossing per step (SGLang asserts
            # mamba_track_interval >= speculative_num_draft_tokens for that reason).
            refusals.append(
                f"--mamba-track-interval {interval} is below the verify width {budget + 1} "
                f"(--speculative-ddtree-budget {budget} + 1); use --mamba-track-interval "
                f">= {_round_up(budget + 1, page)} or --mamba-radix-cache-strategy no_buffer")
    if refusals:
        raise ValueError(f"{who}: " + "; ".join(refusals) + ".")
    return HybridTarget(kind=kind, config_class=name, config=recurrent)


def _module_text(name: str) -> str:
    """The source text of SGLang's module ``name`` ("" when it has none), found without
    importing it: what a seam reads to learn which code path the running release has (never
    its version number)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return ""
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    try:
        with open(spec.origin, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


_GDN_BACKEND = "sglang.srt.layers.attention.linear.gdn_backend"
_KDA_BACKEND = "sglang.srt.layers.attention.linear.kda_backend"


def _gdn_routes_trees_to_triton(backend_text: Optional[str] = None) -> bool:
    """Seam (API difference): 0.5.17+'s GDN backend sends every tree verify (parents set) to
    its Triton kernel whatever the FlashInfer flags say (``tree_verify_kernel``); 0.5.14 -
    0.5.15.post1 verify on FlashInfer whenever a FlashInfer decode or prefill backend is
    chosen, and that kernel raises on ``retrieve_parent_token``."""
    text = _module_text(_GDN_BACKEND) if backend_text is None else backend_text
    return "self.tree_verify_kernel = triton_kernel" in text


def _kda_has_verify_path(backend_text: Optional[str] = None) -> bool:
    """Seam (API difference): 0.5.17+'s KDA backend hands its verify kernels the tree's
    parents (``retrieve_parent_token``); 0.5.14 - 0.5.15.post1's has no verify path at all."""
    text = _module_text(_KDA_BACKEND) if backend_text is None else backend_text
    return "retrieve_parent_token" in text


def _gdn_flashinfer_flags(view: Any) -> list[str]:
    """The linear-attention flags that pick FlashInfer for the GDN decode or prefill (each
    falls back to --linear-attn-backend, as SGLang's initialize_linear_attn_config does)."""
    base = getattr(view, "linear_attn_backend", None)
    flags = []
    for side in ("decode", "prefill"):
        own = getattr(view, f"linear_attn_{side}_backend", None)
        if (own or base) == "flashinfer":
            flags.append(f"--linear-attn-{side}-backend flashinfer" if own
                         else "--linear-attn-backend flashinfer")
    return list(dict.fromkeys(flags))


def _extra_buffer(view: Any) -> bool:
    return getattr(view, "disable_radix_cache", True) is False and getattr(
        view, "mamba_radix_cache_strategy", None) in ("extra_buffer", "extra_buffer_lazy")


def _round_up(value: int, multiple: int) -> int:
    return -(-int(value) // int(multiple)) * int(multiple)


# ---------------------------------------------------------------------------
# The draft side: DFlash's draft keeps the backend it supports


@contextmanager
def draft_spec_scope():
    """Build the DFlash draft's attention backends and CUDA graphs under
    ``speculative_eagle_topk = 1``: the DDTREE resolution sets it to K for the TARGET (the
    hybrid backend's tree kernels, FA3's tree verify), while the draft verifies DFlash's
    mask-free block, which no tree path of a backend expects. UNO builds its private draft
    backend under the same override. The target's backends are built before the draft's
    (scheduler: tp_worker first), so the override reaches the draft only. (0.5.14 -
    0.5.15.post1 have no Spec bag: ``ddtree_worker_v2._draft_settings_scope`` scopes the draft
    runner's own ServerArgs there.)"""
    from sglang.srt.runtime_context import get_spec

    with get_spec().override(speculative_eagle_topk=1):
        yield


def target_tree_path_on(attn_backend: Any) -> Optional[bool]:
    """For a hybrid target's attention backend: whether its recurrent backend was built with
    the tree path on (``topk > 1``). None when the backend is not a hybrid linear one."""
    linear = getattr(attn_backend, "linear_attn_backend", None)
    if linear is None or not hasattr(linear, "topk"):
        return None
    return int(linear.topk or 0) > 1


# ---------------------------------------------------------------------------
# Memory: the B + 1 recurrent states a tree verify keeps per running request (pure)

# SGLang's persistent state slots per running request (kv_cache_configurator's base ratio:
# 3 with the radix cache, 1 without); the extra buffer's tracking slots come on top.
PERSISTENT_SLOTS_RADIX = 3
PERSISTENT_SLOTS_NO_RADIX = 1
# SGLang's --mamba-full-memory-ratio fallback (the mamba share of the static pool is r / (1 + r)).
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass(frozen=True)
class RecurrentVerifyCost:
    """Recurrent-state bytes one running request holds during a DDTree verify."""

    per_slot_bytes: int  # one state slot: conv + SSM state of every recurrent layer
    budget: int
    persistent_slots: int

    @property
    def verify_states(self) -> int:
        """The intermediate states a verify keeps per request: one per tree node, B + 1."""
        return self.budget + 1

    @property
    def states_per_request(self) -> int:
        return self.verify_states + self.persistent_slots

    @property
    def bytes_per_request(self) -> int:
        return self.states_per_request * self.per_slot_bytes


def recurrent_verify_cost(per_slot_bytes: int, budget: int, *, radix_cache: bool) -> RecurrentVerifyCost:
    if per_slot_bytes < 0 or budget < 1:
        raise ValueError(f"per_slot_bytes {per_slot_bytes} / budget {budget} out of range")
    slots = PERSISTENT_SLOTS_RADIX if radix_cache else PERSISTENT_SLOTS_NO_RADIX
    return RecurrentVerifyCost(int(per_slot_bytes), int(budget), slots)


def state_budget_bytes(device_bytes: float, mem_fraction_static: float,
                       mamba_full_memory_ratio: Optional[float] = None) -> float:
    """The most SGLang can give recurrent states: the mamba share r / (1 + r) of the static
    pool (device x mem_fraction_static). An upper bound: the weights come out of the static
    pool first, and they are unknown before the model loads."""
    r = DEFAULT_MAMBA_FULL_MEMORY_RATIO if mamba_full_memory_ratio is None else float(
        mamba_full_memory_ratio)
    return max(0.0, float(device_bytes) * float(mem_fraction_static)) * r / (1.0 + r)


def recurrent_request_cap(cost: RecurrentVerifyCost, budget_bytes: float) -> int:
    """The most requests whose recurrent verify states fit ``budget_bytes`` (0: not one)."""
    if cost.bytes_per_request <= 0:
        return 1 << 30
    return int(max(0.0, float(budget_bytes)) // cost.bytes_per_request)


def running_requests_for(wanted: Optional[int], cost: RecurrentVerifyCost, budget_bytes: float,
                         *, default: int, what: str) -> int:
    """``max_running_requests`` for a hybrid target: ``min(default, cap)`` when unset, the
    operator's value when it fits, else ValueError with the numbers. ``what``: the memory the
    budget is taken from, for the message."""
    cap = recurrent_request_cap(cost, budget_bytes)
    numbers = (
        f"budget {cost.budget} keeps {cost.verify_states} intermediate + {cost.persistent_slots} "
        f"persistent recurrent states per request, {cost.states_per_request} x "
        f"{size_text(cost.per_slot_bytes)} = {size_text(cost.bytes_per_request)}; {what} "
        f"({size_text(budget_bytes)}) fits {cap}")
    if cap < 1:
        raise ValueError(
            f"DDTREE cannot serve one request on this hybrid target: {numbers}; lower "
            "--speculative-ddtree-budget or raise --tp-size / --mem-fraction-static.")
    if wanted is None:
        return min(int(default), cap)
    if int(wanted) > cap:
        raise ValueError(
            f"--max-running-requests {wanted} cannot fit DDTREE's recurrent verify states: "
            f"{numbers}; use --max-running-requests <= {cap} or a smaller "
            "--speculative-ddtree-budget.")
    return int(wanted)


def size_text(nbytes: float) -> str:
    """Bytes as the messages show them (decimal units, 3 significant digits)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def per_slot_state_bytes(recurrent_config: Any, attn_tp_size: int) -> int:
    """One state slot's bytes (conv + SSM state, every recurrent layer, this rank's share), as
    SGLang sizes it (``mamba2_cache_params.mamba_cache_per_req``). Usable before the runtime
    context is published: the parallel width is supplied for the duration of the read."""
    with _config_attn_tp_width(recurrent_config, int(attn_tp_size)):
        params = recurrent_config.mamba2_cache_params
    return int(params.mamba_cache_per_req)


@contextmanager
def _config_attn_tp_width(recurrent_config: Any, attn_tp_size: int):
    """Seam (API difference): where the recurrent config reads the attention TP width while it
    sizes a state slot. 0.5.17+ read the runtime context's ``get_parallel().attn_tp_size``
    (overridden here); 0.5.14 - 0.5.16's configs call ``dp_attention.get_attention_tp_size()``,
    which asks the process groups, not initialized at argument resolution (a start-up crash):
    answered with the width for the duration of the read."""
    from sglang.srt import runtime_context
    from sglang.srt.runtime_context import get_parallel

    widths: dict[str, Any] = {"attn_tp_size": attn_tp_size}
    # Seam (API difference): the CP/TP group-sharing switch, which picks the group the state
    # is split over, is a parallel field from 0.5.20; 0.5.19 splits over attention TP only.
    known = getattr(runtime_context, "_parallel_fields", None)
    known = known() if callable(known) else getattr(runtime_context, "_PARALLEL_FIELDS", ())
    if "enable_cp_tp_group_sharing" in known:
        widths["enable_cp_tp_group_sharing"] = False
    config_module = type(recurrent_config).__module__
    dp_attention: Any = None
    if "dp_attention import get_attention_tp_size" in _module_text(config_module):
        from sglang.srt.layers import dp_attention
    asked = dp_attention.get_attention_tp_size if dp_attention is not None else None
    with get_parallel().override(**widths):
        if dp_attention is not None:
            dp_attention.get_attention_tp_size = lambda: attn_tp_size
        try:
            yield
        finally:
            if dp_attention is not None:
                dp_attention.get_attention_tp_size = asked


__all__ = [
    "COMMIT_HOOK",
    "HybridTarget",
    "KINDS",
    "Kind",
    "RecurrentVerifyCost",
    "check",
    "describe",
    "draft_spec_scope",
    "per_slot_state_bytes",
    "recurrent_kind",
    "recurrent_request_cap",
    "recurrent_verify_cost",
    "running_requests_for",
    "size_text",
    "state_budget_bytes",
    "target_tree_path_on",
]
