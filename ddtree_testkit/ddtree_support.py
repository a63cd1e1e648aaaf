"""Shared helpers for the DDTree core tests: the module under test, the device, a tiny Llama.

The module is imported from payload/ through ddtree_testkit.payload (it is installed into
SGLang as sglang/srt/speculative/ddtree_utils.py; importing it as a top-level `ddtree_utils`
can never shadow a real `sglang`). Used by tests/test_ddtree_*.py and bench/ddtree_bench.py.
DDTREE_TEST_DEVICE=cuda runs the tests on a GPU.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ddtree_testkit import payload

ddtree_utils = payload("ddtree_utils")

DEVICE = torch.device(os.environ.get("DDTREE_TEST_DEVICE", "cpu"))

LAYOUT_FIELDS = (
    "tokens",
    "depths",
    "parents",
    "tree_mask",
    "retrieve_index",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "valid",
    "scores",
    "ancestors",
)


def layout_mismatch(a, b) -> str | None:
    """None when two layouts are identical field by field, else the first difference."""
    if a.max_depth != b.max_depth:
        return f"max_depth {a.max_depth} != {b.max_depth}"
    for name in LAYOUT_FIELDS:
        x, y = getattr(a, name).cpu(), getattr(b, name).cpu()
        if x.shape != y.shape:
            return f"{name}: shape {tuple(x.shape)} != {tuple(y.shape)}"
        if not torch.equal(x, y):
            rows = (x != y).reshape(x.shape[0], -1).any(dim=1).nonzero().flatten()[:5]
            return f"{name} differs in requests {rows.tolist()}"
    return None


def quantised_logits(bs: int, depth: int, vocab: int, levels: int, generator) -> torch.Tensor:
    """Logits on a coarse integer grid: many exact ties between tokens and between paths."""
    return torch.randint(0, levels, (bs, depth, vocab), generator=generator).float()


# ---------------------------------------------------------------------------------------------
# A tiny randomly initialised Llama (nothing downloaded) and the decoders that use it.
# ---------------------------------------------------------------------------------------------


def tiny_llama(seed: int, vocab: int = 96):
    """LlamaForCausalLM from a config, fixed seed, float32, eager attention.

    initializer_range 0.3 (instead of 0.02) gives peaked next-token distributions, so greedy
    argmaxes are separated by clear logit gaps and float rounding between the tree forward and
    sequential decoding cannot flip them (the tests check the gaps).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    return model


def perturbed_copy(model, scale: float, seed: int):
    """A draft that disagrees with the target now and then: every weight plus N(0, scale)."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return draft


@contextmanager
def one_thread():
    """Tiny models: torch's intra-op threads only add overhead (and oversubscribe a shared
    CI machine); restored afterwards so nothing else in the process is affected."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tiny_model_run(fn):
    """Decorator: no autograd, one intra-op thread (see one_thread)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.no_grad(), one_thread():
            return fn(*args, **kwargs)

    return wrapper


@dataclass
class DecodeResult:
    tokens: list[int]
    target_forwards: int
    accept_lengths: list[int] = field(default_factory=list)
    min_gap: float = float("inf")  # smallest top1 - top2 logit gap the decode relied on


def _gap(logits: torch.Tensor) -> float:
    top = logits.topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


@tiny_model_run
def greedy_decode(model, prompt: list[int], num_tokens: int) -> DecodeResult:
    """Plain greedy decoding with a DynamicCache: one target forward per token."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    forwards, logits = 1, out.logits[0, -1]
    tokens, gap = [], float("inf")
    while True:
        gap = min(gap, _gap(logits))
        tokens.append(int(logits.argmax()))
        if len(tokens) == num_tokens:
            return DecodeResult(tokens, forwards, min_gap=gap)
        out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
        forwards, logits = forwards + 1, out.logits[0, -1]


@torch.no_grad()
def draft_marginals(draft, context: list[int], depth: int) -> torch.Tensor:
    """[depth, V] logits standing in for a DFlash block's per-position outputs.

    Stand-in: DFlash predicts all depths in one non-causal pass; here an autoregressive draft
    model is run along its own greedy chain (position d's distribution conditioned on the
    draft's argmax at depths < d), which gives per-position marginals of the same shape.
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    logits = draft(input_ids=torch.tensor([context]), past_key_values=cache, use_cache=True)
    rows = [logits.logits[0, -1]]
    for _ in range(depth - 1):
        nxt = rows[-1].argmax().view(1, 1)
        rows.append(draft(input_ids=nxt, past_key_values=cache, use_cache=True).logits[0, -1])
    return torch.stack(rows)


@tiny_model_run
def ddtree_decode(
    target, draft, prompt: list[int], num_tokens: int, budget: int, depth: int
) -> DecodeResult:
    """Speculative decoding with DDTree: build -> one tree-verify forward -> greedy accept.

    The verify forward feeds the n = budget + 1 tree tokens at positions seq_len + depth with a
    4D float mask (prefix visible, then the tree mask), over the target's DynamicCache; then
    the cache keeps only the accepted path's KV, reordered into path order.
    """
    from transformers import DynamicCache

    du = ddtree_utils
    cache = DynamicCache()
    out = target(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    forwards = 1
    root = int(out.logits[0, -1].argmax())
    gap = _gap(out.logits[0, -1])
    emitted, accepts = [root], []
    seq_len = len(prompt)  # tokens whose KV is cached; the root is not yet
    while len(emitted) < num_tokens:
        context = prompt + emitted  # ends with the root
        logprobs, cand = du.topk_logprobs(draft_marginals(draft, context, depth)[None], budget)
        layout = du.build_ddtree(logprobs, cand, torch.tensor([root]), budget)
        n = layout.num_nodes
        allowed = torch.cat(
            [torch.ones(1, n, seq_len, dtype=torch.bool), layout.tree_mask], dim=2
        )  # [1, n, seq_len + n]
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        out = target(
            input_ids=layout.tokens,
            position_ids=du.positions(layout, torch.tensor([seq_len])).view(1, n),
            attention_mask=mask[:, None],  # [1, 1, n, seq_len + n]
            past_key_values=cache,
            use_cache=True,
        )
        forwards += 1
        logits = out.logits[0]  # [n, V]
        acc = du.greedy_accept(layout, logits.argmax(dim=-1)[None])
        length = int(acc.accept_length[0])
        path = acc.accept_index[0, : length + 1]  # flat = tree indices (bs 1), root first
        gap = min(gap, _gap(logits[path]))
        # Keep the prefix and the path's KV (the tree wrote node i at seq_len + i).
        keep = torch.cat([torch.arange(seq_len), seq_len + path])
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(2, keep)
            layer.values = layer.values.index_select(2, keep)
        seq_len += length + 1
        emitted += layout.tokens[0, path[1:]].tolist() + [int(acc.bonus[0])]
        root = int(acc.bonus[0])
        accepts.append(length)
    return DecodeResult(emitted[:num_tokens], forwards, accepts, gap)
