"""The worker's DDTree step as the GPU check runs it: the payload's own worker.

The check imports ``payload/ddtree_worker_v2.py`` itself (real_payload: the installed module
names, named stand-ins for the SGLang it cannot have) and runs its code: the top-K head
(``_DDTreeTopKHead``), the schedule entry of a batch (``_ddtree_select``), the tree and lineage
(``_ddtree_build``), and ``_ddtree_verify_and_commit`` up to its ``build_eagle_verify_input``
call, whose arguments (parent list, selected index, topk, num_steps, num_draft_tokens) the check
hands SGLang's compiled tree kernel. A worker defect there is a defect the check sees.

One step:
  head     the worker's head over the LM head, top-K log-probs per drafted position
  tree     the worker's build_ddtree over finite_logprobs (always full) + eagle_lineage
  verify   SGLang's tree kernel with the worker's topk, num_steps and width, into preallocated
           buffers (the mask as the Triton backend's uint8 FULL_MASK buffer, filled with 1
           first, as ``eagle_utils.build_tree_kernel_efficient`` does)

The configurations (``configs``) are ones the v2 plugin accepts (tests/integration/test_v2_server_args.py
resolves each through SGLang's own argument pipeline); ``refused_configs`` are ones it refuses
through ``ddtree_lineage.abi_problem``, which the check shows refused and never feeds to the
kernel. ``SCHEDULE`` is the budget schedule the check resolves with the plugin's own rules and
runs width by width.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch

REPO = Path(__file__).resolve().parents[2]

DFLASH_DEFAULT_BLOCK = 16  # SGLang's DFlash draft block when the draft's config names none
PAD_CELLS = 4096  # mask cells past the batch's, filled with SENTINEL: a write there is seen
SENTINEL = 7
FULL_MASK, QLEN_ONLY = 0, 1


def payload_dir() -> Path:
    """The payload folder ddtree_deploy.base.locations names (stdlib only: importable on the GPU
    machine from the carried checkout): the checkout's payload/, or $DDTREE_DEPLOY_PAYLOAD."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from ddtree_deploy.base.locations import repo_dir

    return repo_dir("payload")


def real():
    """The payload's modules, loaded under their installed names (real_payload)."""
    from . import real_payload

    return real_payload.load(payload_dir())


def worker_for(cfg: "Config", lm_head, device, entries=None):
    """The payload's worker for cfg (one budget), or for resolved schedule ``entries``."""
    from . import real_payload

    mods = real()
    entries = entries or (mods.ddtree_schedule.Entry(1, cfg.budget, min(cfg.topk,
                                                                         cfg.budget)),)
    return real_payload.RealWorker(mods, device, entries, cfg.block, lm_head, max_bs=cfg.batch)


@dataclass(frozen=True)
class Config:
    label: str
    budget: int
    topk: int
    block: int
    batch: int

    @property
    def drafted(self) -> int:
        """L: the draft block's positions after the bonus token (the tree's depth limit)."""
        return self.block - 1

    @property
    def n(self) -> int:
        return self.budget + 1

    def __str__(self) -> str:
        return (f"{self.label} (budget {self.budget}, top-K {self.topk}, block {self.block}, "
                f"batch {self.batch})")


def plugin_constants(names=("DEFAULT_BUDGET", "DEFAULT_MAX_TOPK", "MAX_BUDGET")) -> Dict[str, int]:
    """The plugin's bounds, read from its source: importing it registers it with SGLang."""
    tree = ast.parse((payload_dir() / "ddtree_v2_plugin.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            found[node.targets[0].id] = int(ast.literal_eval(node.value))
    missing = set(names) - set(found)
    if missing:
        raise ValueError(f"payload/ddtree_v2_plugin.py no longer assigns {sorted(missing)}")
    return found


def configs(small: bool = False) -> List[Config]:
    """The default configuration and edge ones the plugin accepts (its own constants): D =
    ``lineage_depth`` in brackets where it is not the draft depth."""
    c = plugin_constants()
    b0, k0, bmax = c["DEFAULT_BUDGET"], c["DEFAULT_MAX_TOPK"], c["MAX_BUDGET"]
    block = DFLASH_DEFAULT_BLOCK
    return [
        Config("default", b0, k0, block, 4 if small else 16),
        Config("budget 256 (depth 33)", 256, k0, block, 2 if small else 8),
        Config("the plugin's largest budget (depth 129)", bmax, k0, block, 1 if small else 2),
        Config("budget 1 (depth 1)", 1, 1, 2, 8),
        Config("top-K 1: the chain of the draft's depth", block - 1, 1, block, 8),
        Config("block 2: one drafted position, top-K = budget (depth 2)", k0, k0, 2, 8),
        Config("top-K 2, block 3: the draft's 6 prefixes (depth 4)", 6, 2, 3, 8),
        Config("budget 16, top-K 4, block 8", 16, 4, 8, 8),
        Config("top-K = budget, the paper's optimum", b0, b0, block, 2 if small else 4),
    ]


def refused_configs() -> List[Config]:
    """Configurations the plugin refuses through ``ddtree_lineage.abi_problem`` (never fed to
    the kernel): each refusal names a combination that ``configs`` holds."""
    c = plugin_constants()
    k0, block = c["DEFAULT_MAX_TOPK"], DFLASH_DEFAULT_BLOCK
    return [
        Config("verify width 1025", c["MAX_BUDGET"] + 1, k0, block, 1),
        Config("block 2, budget past its 8 prefixes", 16, k0, 2, 1),
        Config("top-K 2, block 3, budget past its 6 prefixes", c["DEFAULT_BUDGET"], 2, 3, 1),
        Config("top-K 1, a chain longer than the draft", block, 1, block, 1),
    ]


def plugin_problem(lineage, cfg: Config) -> Optional[str]:
    """None when the v2 plugin resolves to exactly cfg, else why not: its own range rules
    (``ddtree_v2_plugin``: block >= 2, block <= budget + 1, top-K clamped to the budget)
    and ``abi_problem``, the line it raises."""
    if cfg.block < 2 or cfg.block > cfg.budget + 1 or not 1 <= cfg.topk <= cfg.budget:
        return (f"the plugin's ranges: block {cfg.block} not in [2, budget + 1] or top-K "
                f"{cfg.topk} not in [1, budget]")
    return lineage.abi_problem(cfg.budget, cfg.topk, cfg.block)


@dataclass
class Inputs:
    hidden: "object"  # [bs * block, hidden] float32: the draft block's rows
    lm_head: "object"  # [V, hidden] float32
    roots: "object"  # [bs] int64
    seq_lens: "object"  # [bs] int64
    seq_lens_sum: int


def make_inputs(cfg: Config, device, *, vocab: int, hidden: int, seed: int,
                lm_head=None, max_seq: int = 200) -> Inputs:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if lm_head is None:
        lm_head = (torch.randn(vocab, hidden, generator=gen) / hidden ** 0.5).to(device)
    bs = cfg.batch
    # The draft block's rows (the bonus position too): what the worker's head is handed.
    hs = (torch.randn(bs * cfg.block, hidden, generator=gen) * 3).to(device)
    roots = torch.randint(1, lm_head.shape[0], (bs,), generator=gen).to(device)
    seq_lens = torch.randint(1, max_seq, (bs,), generator=gen)
    return Inputs(hs, lm_head, roots, seq_lens.to(device), int(seq_lens.sum()))


def worker_call(inputs: Inputs, cfg: Config, worker=None, state=None) -> dict:
    """The worker's head, tree and verify call on ``inputs`` (real_payload.RealWorker):
    {"logprobs", "tokens", "layout", "parent_list", "top_scores_index", "draft_tokens",
    "topk", "depth", "n"} as the worker hands them to SGLang's verify."""
    worker = worker or worker_for(cfg, inputs.lm_head, inputs.hidden.device)
    state = state or worker.select(cfg.batch)
    logprobs, tokens = worker.head(inputs.hidden)
    out = worker.verify_call(inputs.roots, logprobs, tokens, state)
    out.update(logprobs=logprobs, tokens=tokens)
    return out


@dataclass
class VerifyBuffers:
    """Preallocated outputs of the tree kernel (fixed addresses: CUDA-graph safe)."""

    tree_mask: "object"
    positions: "object"
    retrieve: "object"  # [3, bs, n]: index, next token, next sibling
    used: int
    mode: int

    @classmethod
    def allocate(cls, cfg: Config, seq_lens_sum: int, device, mode: int = FULL_MASK):
        bs, n = cfg.batch, cfg.n
        used = n * seq_lens_sum + bs * n * n if mode == FULL_MASK else bs * n * n
        return cls(torch.empty(used + PAD_CELLS, dtype=torch.uint8, device=device),
                   torch.empty(bs * n, dtype=torch.long, device=device),
                   torch.empty((3, bs, n), dtype=torch.long, device=device), used, mode)

    def reset(self) -> None:
        self.tree_mask[: self.used].fill_(1)  # the prefix columns: SGLang's fill
        self.tree_mask[self.used:].fill_(SENTINEL)
        self.positions.fill_(-1)
        self.retrieve.fill_(-1)

    def kernel_args(self):
        return (self.tree_mask, self.positions, self.retrieve[0], self.retrieve[1],
                self.retrieve[2])


def verify_tensors(kernels, parent_list, top_scores_index, seq_lens, bufs: VerifyBuffers,
                   topk: int, depth: int, n: int) -> None:
    """``eagle_utils.build_tree_kernel_efficient`` with a preallocated buffer: fill, then
    SGLang's kernel. ``kernels``: tree_abi.TreeKernels (CUDA) or None (nothing to launch)."""
    bufs.reset()
    if kernels is not None:
        kernels.build_tree_kernel_efficient(parent_list, top_scores_index, seq_lens,
                                            *bufs.kernel_args(), topk, depth, n, bufs.mode)


def step(worker, kernels, inputs: Inputs, cfg: Config, bufs: Optional[VerifyBuffers],
         call: dict, marks=None) -> dict:
    """One DDTree step through the worker's head and _ddtree_build, SGLang's tree kernel with
    the worker's verify arguments (``call``: topk, depth, n from ``worker_call``: Python ints,
    the same every step); ``marks(name)`` is called after each phase (timing events)."""
    mark = marks or (lambda name: None)
    state = worker.select(cfg.batch)
    logprobs, tokens = worker.head(inputs.hidden)
    mark("head")
    layout, parent_list, sel, draft = worker.build(inputs.roots, logprobs, tokens, state)
    mark("tree")
    out = {"logprobs": logprobs, "tokens": tokens, "layout_tokens": layout.tokens,
           "parents": layout.parents, "valid": layout.valid, "parent_list": parent_list,
           "top_scores_index": sel, "draft_tokens": torch.cat(
               (inputs.roots.unsqueeze(1), draft), dim=1).flatten()}
    if bufs is not None:
        verify_tensors(kernels, parent_list, sel, inputs.seq_lens, bufs, call["topk"],
                       call["depth"], call["n"])
        out.update(tree_mask=bufs.tree_mask, positions=bufs.positions, retrieve=bufs.retrieve)
    mark("verify")
    return out
