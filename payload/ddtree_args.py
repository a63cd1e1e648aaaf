"""DDTREE server-argument validation, shared by every v1 family (0.5.12.x, 0.5.13.x).

Installed into SGLang as ``sglang/srt/speculative/ddtree_args.py``. The releases keep the
DFlash validation in different places (``ServerArgs._handle_speculative_decoding`` in
0.5.12, ``arg_groups/speculative_hook._handle_dflash`` in 0.5.13); their patches only call
the two steps here, in the DFlash flow:

- ``check(args)`` before the DFlash logic resolves the draft block;
- ``finalize(args)`` after it, with the block in ``speculative_num_draft_tokens``.

``args`` is SGLang's ``ServerArgs``: only its fields and its ``get_model_config`` /
``get_attention_backends`` / ``enable_mamba_extra_buffer`` methods are used. Every refusal
is a ``ValueError`` with one message naming the flags involved.
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang.srt.speculative import ddtree_utils

logger = logging.getLogger(__name__)

# DDTREE budget bounds: the DDTree paper measured budgets up to 1024 and its speedup
# peaks at 256-512; the verify mask grows as budget x (prefix + budget) per request.
DDTREE_MAX_BUDGET = 1024

# Target-verify attention backends that apply spec_info.custom_mask with
# speculative_eagle_topk == 1. The others (FA3, TRT-LLM, MLA kernels, torch native)
# verify with a causal mask there: right for a chain, wrong for a tree.
DDTREE_VERIFY_ATTENTION_BACKENDS = ("flashinfer", "triton")

# Config classes (by name in sglang.srt.configs) whose models have recurrent (Mamba / GDN
# / linear-attention) layers, as ModelRunner.mambaish_config tests them. By name, so a
# release that lacks one still imports this module.
_RECURRENT_CONFIGS = (
    "BailingHybridConfig",
    "FalconH1Config",
    "InternS2PreviewConfig",
    "JetNemotronConfig",
    "JetVLMConfig",
    "KimiLinearConfig",
    "Lfm2Config",
    "Lfm2MoeConfig",
    "Lfm2VlConfig",
    "NemotronH_Nano_VL_V2_Config",
    "NemotronHConfig",
    "Qwen3_5Config",
    "Qwen3_5MoeConfig",
    "Qwen3NextConfig",
)


def recurrent_target(hf_config) -> Optional[str]:
    """Name the config that gives the target recurrent (Mamba / GDN / linear-attention)
    layers, by the tests ModelRunner.mambaish_config applies (before any runner
    exists); None for a pure-attention target."""
    from sglang.srt import configs
    from sglang.srt.configs.linear_attn_model_registry import get_linear_attn_config

    recurrent = tuple(
        getattr(configs, name) for name in _RECURRENT_CONFIGS if hasattr(configs, name)
    )
    # The runner tests some classes on the config, others on its text config: test both.
    for config in (hf_config, hf_config.get_text_config()):
        if isinstance(config, recurrent):
            return type(config).__name__
    granite = getattr(configs, "GraniteMoeHybridConfig", None)
    if granite is not None and isinstance(hf_config, granite) and "mamba" in (
        getattr(hf_config, "layer_types", None) or ()
    ):
        return type(hf_config).__name__
    registered = get_linear_attn_config(hf_config)
    if registered is not None:
        return type(registered[1]).__name__
    return None


def check(args) -> None:
    """DDTREE's own checks, before the DFlash logic resolves the draft block."""
    budget = args.speculative_ddtree_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= DDTREE_MAX_BUDGET:
        raise ValueError(
            f"--speculative-ddtree-budget must be an integer in [1, {DDTREE_MAX_BUDGET}], "
            f"got {budget!r}."
        )
    topk = args.speculative_ddtree_topk
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
        raise ValueError(
            "--speculative-ddtree-topk must be an integer >= 1 (omit it for no cap), "
            f"got {topk!r}."
        )
    if args.speculative_num_draft_tokens is not None:
        if int(args.speculative_num_draft_tokens) != budget + 1:
            raise ValueError(
                "DDTREE derives speculative_num_draft_tokens (the verify width) as "
                f"--speculative-ddtree-budget + 1 = {budget + 1}, but "
                f"--speculative-num-draft-tokens is {args.speculative_num_draft_tokens}. "
                "Drop --speculative-num-draft-tokens; size the tree with "
                "--speculative-ddtree-budget and the draft block with "
                "--speculative-dflash-block-size."
            )
        # Already derived (these args are being validated again): the DFlash logic
        # must resolve the draft block, not read the verify width.
        args.speculative_num_draft_tokens = None
    if args.page_size != 1:
        raise ValueError(
            f"DDTREE requires --page-size 1, got {args.page_size}: the accepted "
            "tree path's KV slots are kept in path order, one slot at a time."
        )
    prefill_backend, decode_backend = args.get_attention_backends()
    verify_backend = (
        decode_backend if args.speculative_attention_mode == "decode" else prefill_backend
    )
    if verify_backend not in DDTREE_VERIFY_ATTENTION_BACKENDS:
        raise ValueError(
            f"DDTREE needs a target-verify attention backend that applies the tree "
            f"mask ({', '.join(DDTREE_VERIFY_ATTENTION_BACKENDS)}), got "
            f"{verify_backend!r} (speculative_attention_mode="
            f"{args.speculative_attention_mode}). Pass --attention-backend flashinfer."
        )
    recurrent = recurrent_target(args.get_model_config().hf_config)
    if recurrent is not None:
        if not args.speculative_ddtree_allow_hybrid_unsafe:
            raise ValueError(
                f"DDTREE refuses hybrid target {args.model_path} ({recurrent}: "
                "Mamba/GDN/linear-attention layers): their recurrent state advances "
                "in sequence order, so sibling tree branches corrupt it. Use "
                "--speculative-algorithm DFLASH, or pass "
                "--speculative-ddtree-allow-hybrid-unsafe to run it anyway."
            )
        logger.warning(
            "DDTREE on hybrid target %s (%s) because of "
            "--speculative-ddtree-allow-hybrid-unsafe: outputs may differ from the "
            "target model's.",
            args.model_path,
            recurrent,
        )
        if args.enable_mamba_extra_buffer() and args.mamba_track_interval < budget + 1:
            raise ValueError(
                f"mamba_track_interval {args.mamba_track_interval} must be >= the "
                f"DDTREE verify width {budget + 1} (--speculative-ddtree-budget + 1)."
            )


def finalize(args, device_memory_mib: Optional[float]) -> None:
    """After the DFlash logic resolved the DRAFT block into speculative_num_draft_tokens:
    keep the block in speculative_dflash_block_size (the draft runner's width), give
    speculative_num_draft_tokens the target's verify width (which every target-side
    consumer sizes by: attention metadata, CUDA graphs, recurrent-state buffers, the
    decode memory check, req_to_token rows), and size the running batch.

    device_memory_mib: the device's memory as SGLang measured it for its own memory
    plan (get_device_memory_capacity), None when unknown.
    """
    block = int(args.speculative_num_draft_tokens)
    budget = int(args.speculative_ddtree_budget)
    if block < 2:
        raise ValueError(
            f"DDTREE needs a draft block of at least 2 (the bonus token and one drafted "
            f"position), got --speculative-dflash-block-size {block}."
        )
    if budget + 1 < block:
        # Every per-request reservation (decode memory check, req_to_token row width,
        # over-allocation) is sized by the verify width, but the draft step writes a whole
        # block per request: a verify width below the block would let the draft write
        # past its row into the next request's.
        raise ValueError(
            f"--speculative-ddtree-budget {budget} gives a verify width of {budget + 1}, "
            f"below the draft block {block} (--speculative-dflash-block-size or the draft "
            f"config): use --speculative-ddtree-budget >= {block - 1}."
        )
    args.speculative_dflash_block_size = block
    args.speculative_num_draft_tokens = budget + 1
    if not args.disable_cuda_graph:
        args.disable_cuda_graph = True
        logger.warning(
            "CUDA graphs are disabled for DDTREE: the DFlash target-verify graphs "
            "are captured without a custom mask, and a tree verify needs its mask."
        )
    _size_running_batch(args, budget, device_memory_mib)


def _size_running_batch(args, budget: int, device_memory_mib: Optional[float]) -> None:
    """max_running_requests from budget x vocab (ddtree_utils.size_running_batch, the rule the
    v2 family shares): derived when unset, refused when set too high."""
    if device_memory_mib is None or args.mem_fraction_static is None:
        return  # no memory plan to size against (and no model config to read)
    plan = ddtree_utils.size_running_batch(
        budget, int(args.get_model_config().vocab_size), device_memory_mib,
        args.mem_fraction_static, args.max_running_requests,
    )
    if plan is not None:
        args.max_running_requests = plan.max_running_requests
        logger.warning("%s", plan.log)
