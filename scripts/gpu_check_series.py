"""Helpers for scripts/gpu_check_series.sh (the prepared GPU check of the DDTree series).

    python scripts/gpu_check_series.py install --wheel W --site-packages SP
        Install SGLang from the release wheel W into SP (as pip --no-deps would), then
        apply the whole series of patches/sglang-0.5.12/ to it with GNU patch (exact
        hunks only: -F0 and no offset) and add the payload files.
    python scripts/gpu_check_series.py serve --models tests/data/models
        End-to-end on the GPU with SGLang's offline Engine, no tokenizer, float32, for
        each target-verify attention backend (Triton, FlashInfer), greedy AND sampling:
        (a) a RANDOM tiny Llama target (tests/data/models/tiny-llama's config, LM head
            scaled so greedy has no near-ties): DDTREE's greedy tokens must equal plain
            greedy decoding's (the tree mask and the verify are right);
        (b) a CYCLE target built here from the same config: the attention output is
            scaled down and the MLP output zeroed, so the residual stream keeps the token
            embedding, and embeddings / LM head make greedy decoding cycle 10 -> 11 -> 12
            -> 10 (every other token -> 10) with logit margins ~48, so sampling gives the
            same tokens as greedy. The draft is built from the target's own weights:
            its layers output zero, so its proposal at every depth is the target's LM head
            on the target's embedding of the mask token: the three cycle tokens, tied.
            Its first-ranked chain repeats one token, so a chain accepts at most 1 draft
            token per step (accept length <= 2); a budget-128 tree holds every path of
            depth 4 and accepts 4 (accept length ~5) through off-chain nodes. Asserted:
            DDTREE's tokens (greedy and sampling) equal plain greedy decoding's, its accept
            length is > 2 (above the chain's maximum) and above DFLASH's measured on the
            same pair, and /server_info's internal state reports verify width 129, the
            worker class and off-chain accepts > 0.
        Prints GPU-SERVE:{json}; exit 0 only if every assertion held.

Standard library only at module level; SGLang is imported inside ``serve``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"


def _series_entries() -> list[list[str]]:
    entries = []
    for raw in (FAMILY / "series").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append(line.split())
    return entries


def install(wheel: Path, site_packages: Path) -> None:
    site_packages.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site_packages)
    for tokens in _series_entries():
        if tokens[0] == "add":
            dest = site_packages / tokens[2]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / tokens[1], dest)
            continue
        run = subprocess.run(
            ["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(FAMILY / tokens[0])],
            cwd=site_packages, capture_output=True, text=True,
        )
        if run.returncode != 0 or "offset" in run.stdout:
            raise SystemExit(f"{tokens[0]} does not apply exactly:\n{run.stdout}{run.stderr}")
    print(f"installed {wheel.name} + the series into {site_packages}")


GREEDY = {"temperature": 0.0}
SAMPLING = {"temperature": 1.0, "top_k": 4, "top_p": 0.95}
CYCLE = (10, 11, 12)  # the cycle target's greedy orbit
MASK_TOKEN = 511  # tiny-dflash-draft's mask token


def _generate(engine_kwargs: dict, prompts: list[list[int]], params: list[dict],
              max_new_tokens: int) -> tuple[list[dict], dict]:
    """One Engine: generate every prompt with its sampling params; return the outputs and
    the first internal state of /server_info."""
    import sglang as sgl

    engine = sgl.Engine(**engine_kwargs)
    try:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params=[dict(p, max_new_tokens=max_new_tokens, ignore_eos=True)
                             for p in params],
        )
        info = engine.get_server_info()
        states = info.get("internal_states") or [{}]
        return outs, states[0]
    finally:
        engine.shutdown()


def _random_target(models: Path, dest: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(models / "tiny-llama"))
    with torch.no_grad():
        # Sharp logits: plain decoding and the tree verify sum in different orders, so a
        # near-tie could flip an argmax and fake a mismatch.
        model.lm_head.weight.mul_(20.0)
    return _save(model, models, dest)


def _cycle_target(models: Path, dest: Path) -> Path:
    """A real Llama whose greedy continuation is the cycle 10 -> 11 -> 12 -> 10 (any other
    token -> 10), with large margins. Token classes live in four basis directions of the
    residual stream; the MLP output is zero and the attention output small."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig.from_pretrained(models / "tiny-llama")
    model = LlamaForCausalLM(config)
    h, vocab = config.hidden_size, config.vocab_size
    basis = torch.eye(h)[:4]
    with torch.no_grad():
        emb = basis[3].repeat(vocab, 1) + 0.01 * torch.randn(vocab, h)
        for i, tok in enumerate(CYCLE):
            emb[tok] = basis[i] + 0.01 * torch.randn(h)
        emb[MASK_TOKEN] = basis[0] + basis[1] + basis[2]  # the draft's view: all three
        model.model.embed_tokens.weight.copy_(emb)
        head = 0.01 * torch.randn(vocab, h)
        head[CYCLE[1]] = 6.0 * basis[0]  # 10 -> 11
        head[CYCLE[2]] = 6.0 * basis[1]  # 11 -> 12
        head[CYCLE[0]] = 6.0 * (basis[2] + basis[3])  # 12 -> 10, everything else -> 10
        model.lm_head.weight.copy_(head)
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.zero_()
            layer.self_attn.o_proj.weight.mul_(0.01)
    return _save(model, models, dest)


def _save(model, models: Path, dest: Path) -> Path:
    model.save_pretrained(dest, safe_serialization=True)
    shutil.copyfile(models / "tiny-llama" / "generation_config.json",
                    dest / "generation_config.json")
    return dest


def _passthrough_draft(models: Path, dest: Path) -> Path:
    """tiny-dflash-draft's config with weights written here: attention and MLP outputs zero,
    norms one, so the draft's hidden state at every block position is the TARGET's embedding
    of that position's token (DFlash feeds the target's embeddings and reads the target's LM
    head): its proposals come from the target's own weights."""
    import json as _json

    import torch
    from safetensors.torch import save_file

    cfg = _json.loads((models / "tiny-dflash-draft" / "config.json").read_text())
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    feats = len(cfg["dflash_config"]["target_layer_ids"])
    torch.manual_seed(2)
    w = {"norm.weight": torch.ones(h), "hidden_norm.weight": torch.ones(h),
         "fc.weight": 0.1 * torch.randn(h, feats * h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w.update({
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": 0.1 * torch.randn(heads * hd, h),
            p + "self_attn.k_proj.weight": 0.1 * torch.randn(kv * hd, h),
            p + "self_attn.v_proj.weight": 0.1 * torch.randn(kv * hd, h),
            p + "self_attn.o_proj.weight": torch.zeros(h, heads * hd),
            p + "self_attn.q_norm.weight": torch.ones(hd),
            p + "self_attn.k_norm.weight": torch.ones(hd),
            p + "mlp.gate_proj.weight": 0.1 * torch.randn(inter, h),
            p + "mlp.up_proj.weight": 0.1 * torch.randn(inter, h),
            p + "mlp.down_proj.weight": torch.zeros(h, inter),
        })
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(dest / "model.safetensors"))
    shutil.copyfile(models / "tiny-dflash-draft" / "config.json", dest / "config.json")
    return dest


def _accept_length(outs: list[dict]) -> float:
    tokens = sum(len(o["output_ids"]) for o in outs)
    verifies = sum(int(o["meta_info"].get("spec_verify_ct", 0)) for o in outs)
    return tokens / verifies if verifies else 0.0


def _same(got: list[dict], ref: list[dict]) -> list[bool]:
    return [g["output_ids"] == r["output_ids"] for g, r in zip(got, ref)]


def serve(models: Path, backends: tuple[str, ...] = ("triton", "flashinfer")) -> int:
    import tempfile

    tmp = Path(tempfile.mkdtemp())
    random_target = _random_target(models, tmp / "tiny-llama-random")
    cycle_target = _cycle_target(models, tmp / "tiny-llama-cycle")
    draft = _passthrough_draft(models, tmp / "tiny-dflash-passthrough")
    # Prompts avoid the cycle and mask tokens.
    prompts = [[1, 17, 42, 99, 7], [1, 300, 301, 302, 303, 304, 305], [1, 5]]
    max_new = 48
    budget = 128
    summary, ok = {"backends": {}}, True
    for backend in backends:
        common = dict(skip_tokenizer_init=True, attention_backend=backend,
                      mem_fraction_static=0.3, dtype="float32", log_level="warning",
                      disable_cuda_graph=True)
        spec = dict(speculative_draft_model_path=str(draft))
        both = prompts + prompts
        params = [GREEDY] * len(prompts) + [SAMPLING] * len(prompts)
        row = {}
        # (a) random target: lossless greedy through the tree mask.
        t = dict(common, model_path=str(random_target))
        tree, _ = _generate(dict(t, speculative_algorithm="DDTREE",
                                 speculative_ddtree_budget=budget, **spec),
                            both, params, max_new)
        plain, _ = _generate(t, prompts, [GREEDY] * len(prompts), max_new)
        row["random_greedy_equal"] = _same(tree[: len(prompts)], plain)
        row["random_all_tokens"] = all(len(o["output_ids"]) == max_new for o in tree)
        ok &= all(row["random_greedy_equal"]) and row["random_all_tokens"]
        # (b) cycle target: deep, off-chain accepts; greedy and sampling both lossless.
        t = dict(common, model_path=str(cycle_target))
        tree, state = _generate(dict(t, speculative_algorithm="DDTREE",
                                     speculative_ddtree_budget=budget, **spec),
                                both, params, max_new)
        plain, _ = _generate(t, prompts, [GREEDY] * len(prompts), max_new)
        chain, _ = _generate(dict(t, speculative_algorithm="DFLASH", **spec),
                             prompts, [GREEDY] * len(prompts), max_new)
        row["cycle_greedy_equal"] = _same(tree[: len(prompts)], plain)
        row["cycle_sampling_equal"] = _same(tree[len(prompts):], plain)
        row["cycle_accept_length"] = round(_accept_length(tree), 3)
        row["dflash_accept_length"] = round(_accept_length(chain), 3)
        row["server_info"] = {k: state.get(k) for k in (
            "ddtree_verify_width", "ddtree_worker_class", "ddtree_offchain_accepts")}
        ok &= (all(row["cycle_greedy_equal"]) and all(row["cycle_sampling_equal"])
               and row["cycle_accept_length"] > 2.0
               and row["cycle_accept_length"] > row["dflash_accept_length"]
               and row["server_info"]["ddtree_verify_width"] == budget + 1
               and row["server_info"]["ddtree_worker_class"] == "DFlashWorker"
               and (row["server_info"]["ddtree_offchain_accepts"] or 0) > 0)
        summary["backends"][backend] = row
    summary["ok"] = bool(ok)
    print("GPU-SERVE:" + json.dumps(summary), flush=True)
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install")
    p_install.add_argument("--wheel", type=Path, required=True)
    p_install.add_argument("--site-packages", type=Path, required=True)
    p_serve = sub.add_parser("serve")
    p_serve.add_argument("--models", type=Path, default=REPO / "tests" / "data" / "models")
    args = parser.parse_args(argv)
    if args.command == "install":
        install(args.wheel, args.site_packages)
        return 0
    return serve(args.models)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
