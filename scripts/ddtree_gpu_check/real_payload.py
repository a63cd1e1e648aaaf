"""The REAL v2 payload in the GPU check: the worker, the plugin and the hybrid module, imported.

The lent machine has no SGLang (torch, Triton, nvcc only), and ``payload/ddtree_worker_v2.py``
imports SGLang's DFlash worker at its top, the plugin registers itself with SGLang's registry
when imported. So this module installs NAMED STAND-INS for exactly what those imports and the
code paths run here reach, and loads the payload files under their installed names
(``sglang.srt.speculative.<name>``), as the v2 family installs them:

    sglang.srt.speculative.dflash_worker_v2   DFlashWorkerV2 (an empty base class: the worker
                                              is built without __init__, as the CPU probe
                                              builds it)
    sglang.srt.speculative.spec_registry      get_spec answering "registered" (so importing
                                              the plugin does not register with an absent
                                              SGLang)
    sglang.srt.speculative.eagle_info / eagle_utils / eagle_worker_common / managers.utils
                                              what _ddtree_verify_and_commit imports; its
                                              call of build_eagle_verify_input is where the
                                              check takes over (``StopAtVerify``: the worker's
                                              own tree, lineage, topk, num_steps and width go
                                              to SGLang's compiled tree kernel)
    the payload's ddtree_utils, ddtree_lineage, ddtree_schedule, ddtree_hybrid: the files

So every worker line the check runs is the worker's (head, schedule entry, tree, lineage, the
verify call's arguments), every plugin rule it applies is the plugin's (the schedule resolved
with the budget x vocab rule on this GPU's memory, the decode reserve per entry), and the hybrid
module's recurrent memory rule is the hybrid module's.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Optional

import torch

from . import ddtree as dd

PACKAGE = "sglang.srt.speculative"
PAYLOAD_MODULES = ("ddtree_utils", "ddtree_lineage", "ddtree_schedule", "ddtree_hybrid",
                   "ddtree_v2_plugin", "ddtree_worker_v2")
FULL_MASK_MODE = dd.FULL_MASK


class StopAtVerify(Exception):
    """Raised by the stand-in build_eagle_verify_input with what the worker handed it."""

    def __init__(self, args, kwargs):
        super().__init__("build_eagle_verify_input")
        self.args, self.kwargs = args, kwargs


def _module(name: str, **attrs) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__path__ = []  # a package: its children load under it
        # The check's own stand-in (attention.py's loader shares the sglang package with it).
        module.__ddtree_gpu_check__ = True
        sys.modules[name] = module
    for key, value in attrs.items():
        setattr(module, key, value)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(_module(parent), child, module)
    return module


class _DFlashWorkerV2:
    """STAND-IN base class: the DDTree worker's own methods are what the check runs."""

    @property
    def target_worker(self):  # as DFlashWorkerV2's
        return self._target_worker


def _build_eagle_verify_input(*args, **kwargs):
    raise StopAtVerify(args, kwargs)


def _install_standins() -> None:
    _module("sglang")
    _module("sglang.srt")
    _module(PACKAGE)
    _module(f"{PACKAGE}.dflash_worker_v2", DFlashWorkerV2=_DFlashWorkerV2)
    _module(f"{PACKAGE}.spec_registry", get_spec=lambda name: "registered (stand-in)")
    _module(f"{PACKAGE}.eagle_info",
            EagleDraftInput=lambda **kw: types.SimpleNamespace(**kw),
            EagleVerifyInput=None)  # imported by the worker's verify seam, never built here
    _module(f"{PACKAGE}.eagle_utils", default_tree_mask_mode=lambda: FULL_MASK_MODE)
    _module(f"{PACKAGE}.eagle_worker_common", build_eagle_verify_input=_build_eagle_verify_input,
            run_eagle_verify=None)
    _module("sglang.srt.managers")
    _module("sglang.srt.managers.utils", GenerationBatchResult=dict)


def load(payload: Optional[Path] = None) -> types.SimpleNamespace:
    """The payload's modules (``payload``: the folder, default the checkout's payload/), loaded
    once per folder under their installed names."""
    folder = Path(payload or dd.payload_dir()).resolve()
    loaded = getattr(load, "_loaded", None)
    if loaded is not None and loaded[0] == folder:
        return loaded[1]
    _install_standins()
    mods = {}
    for name in PAYLOAD_MODULES:
        spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        _module(PACKAGE, **{name: module})
        spec.loader.exec_module(module)
        mods[name] = module
    out = types.SimpleNamespace(**mods, folder=folder)
    load._loaded = (folder, out)
    return out


class RealWorker:
    """The payload's DDTreeWorkerV2 on ``device`` for resolved schedule ``entries`` (one entry
    for a single budget), built without __init__ (that loads a draft model) as the CPU probe
    builds it, with the payload's own _DDTreeTopKHead over ``lm_head`` [V, H]."""

    def __init__(self, mods, device, entries, block: int, lm_head, max_bs: int):
        cls = mods.ddtree_worker_v2.DDTreeWorkerV2
        w = cls.__new__(cls)
        w.device = device
        w.block_size = int(block)
        w.ddtree_entries = tuple(entries)
        w.ddtree_budget = max(e.budget for e in entries)
        w.ddtree_topk = max(e.topk for e in entries)
        w.ddtree_verify_width = w.ddtree_budget + 1
        w._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
            attn_backend=None, decode_cuda_graph_runner=None))
        w._init_ddtree_state()
        w._ddtree_head = mods.ddtree_worker_v2._DDTreeTopKHead(
            weight=lm_head, block_size=int(block), k=w.ddtree_topk, num_org=lm_head.shape[0],
            org_vocab_start=0, max_bs=max_bs, tp_group=None)
        self.w, self.mods = w, mods

    def head(self, hidden):
        """hidden [bs * block, H] (the draft's block rows, the bonus position included) ->
        the head's (logprobs, tokens) [bs, block - 1, K]."""
        bs = hidden.shape[0] // self.w.block_size
        self.w._ddtree_head(hidden)
        return self.w._ddtree_head.read(bs)

    def select(self, batch_size: int):
        """The worker's schedule entry (its verify state) for a batch of ``batch_size``."""
        return self.w._ddtree_select(types.SimpleNamespace(seq_lens=torch.zeros(batch_size)))

    def build(self, roots, logprobs, tokens, state=None):
        """The worker's _ddtree_build (layout, parent_list, top_scores_index, draft_tokens)."""
        return self.w._ddtree_build(roots, logprobs, tokens, state)

    def verify_call(self, roots, logprobs, tokens, state) -> dict:
        """The worker's own _ddtree_verify_and_commit up to its build_eagle_verify_input call:
        the tree it built and exactly what it hands SGLang's verify (parent list, selected
        index, draft tokens, topk, num_steps, num_draft_tokens)."""
        built = {}
        build = self.w._ddtree_build

        def recording(*args, **kwargs):
            built["out"] = build(*args, **kwargs)
            return built["out"]

        self.w._ddtree_build = recording
        batch = types.SimpleNamespace(seq_lens=torch.zeros(roots.shape[0]))
        try:
            self.w._ddtree_verify_and_commit(
                batch, types.SimpleNamespace(bonus_tokens=roots), logprobs, tokens, {}, None,
                None, state)
        except StopAtVerify as stop:
            args, kwargs = stop.args, stop.kwargs
        else:
            raise AssertionError("the worker never called build_eagle_verify_input")
        finally:
            del self.w._ddtree_build
        _batch, draft_input, parent_list, sel, draft_tokens, _ = args
        layout = built["out"][0]
        assert torch.equal(draft_input.bonus_tokens, roots)
        return {"layout": layout, "parent_list": parent_list, "top_scores_index": sel,
                "draft_tokens": draft_tokens, "topk": int(kwargs["topk"]),
                "depth": int(kwargs["num_steps"]), "n": int(kwargs["num_draft_tokens"])}

