"""The models the prepared GPU served check (scripts/gpu_check_series.py serve) builds, checked
on CPU so the check's premises cannot silently fail to hold.

The cycle target is a real transformers Llama (float32 forward on CPU); the draft's proposal is
computed the way DFlash forms it in SGLang when the draft layers output zero: the target's LM
head on the RMS-normalised target embedding of the mask token (the draft's own safetensors,
written by the script, are checked for exactly that: zero attention and MLP outputs, unit
norms). The tree and chain are built and verified with ddtree_utils, the same code the
patched SGLang runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ddtree_testkit.ddtree_support import ddtree_utils as du

REPO = Path(__file__).resolve().parent.parent.parent
MODELS = REPO / "tests" / "data" / "models"


def _script():
    spec = importlib.util.spec_from_file_location(
        "gpu_check_series", REPO / "scripts" / "gpu_check_series.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from transformers import LlamaForCausalLM

    script = _script()
    tmp = tmp_path_factory.mktemp("gpu-check-models")
    target = LlamaForCausalLM.from_pretrained(script._cycle_target(MODELS, tmp / "cycle"))
    draft = script._passthrough_draft(MODELS, tmp / "draft")
    return script, target.eval(), draft


def test_cycle_target_greedy_is_the_cycle_with_wide_margins(built):
    script, target, _ = built
    prompt = torch.tensor([[1, 17, 42, 99, 7]])
    with torch.no_grad():
        out = target.generate(prompt, max_new_tokens=12, do_sample=False,
                              output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, prompt.shape[1]:].tolist()
    c = script.CYCLE
    assert tokens == [c[i % 3] for i in range(12)]
    for scores in out.scores:
        top2 = scores[0].topk(2).values
        assert float(top2[0] - top2[1]) > 20  # sampling at temperature 1 = greedy


def test_draft_weights_pass_the_target_embedding_through(built):
    from safetensors.torch import load_file

    _, _, draft = built
    weights = load_file(str(draft / "model.safetensors"))
    assert not weights["layers.0.self_attn.o_proj.weight"].any()
    assert not weights["layers.0.mlp.down_proj.weight"].any()
    assert bool((weights["norm.weight"] == 1).all())


def test_tree_goes_deep_and_off_chain_where_the_chain_cannot(built):
    script, target, _ = built
    c = script.CYCLE
    emb = target.model.embed_tokens.weight[script.MASK_TOKEN]
    normed = emb * torch.rsqrt(emb.pow(2).mean() + 1e-6)
    logits = target.lm_head(normed).detach()
    assert set(logits.topk(3).indices.tolist()) == set(c)
    depth = 15  # block 16
    draft_logits = logits.expand(1, depth, -1)
    root = torch.tensor([c[0]])

    def next_token(tok: torch.Tensor) -> torch.Tensor:  # the target's greedy map
        with torch.no_grad():
            return target(tok.reshape(-1, 1)).logits[:, -1].argmax(-1).reshape(tok.shape)

    tree = du.build_ddtree_from_logits(draft_logits, root, 128)
    acc = du.greedy_accept(tree, next_token(tree.tokens))
    assert int(acc.accept_length[0]) == 4 and bool(du.offchain_accepted(tree, acc.accept_index)[0])
    chain = du.build_ddtree_from_logits(draft_logits, root, depth, topk=1)
    acc = du.greedy_accept(chain, next_token(chain.tokens))
    assert int(acc.accept_length[0]) <= 1  # the chain repeats one token: at most 1 accepted
