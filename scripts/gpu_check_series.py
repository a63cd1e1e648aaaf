"""Helpers for scripts/gpu_check_series.sh (the prepared GPU check of the DDTree series).

    python scripts/gpu_check_series.py install --wheel W --site-packages SP
        Install SGLang from the release wheel W into SP (as pip --no-deps would), then
        apply the whole series of patches/sglang-0.5.12/ to it with GNU patch (exact
        hunks only: -F0 and no offset) and add the payload files.
    python scripts/gpu_check_series.py serve --models tests/data/models
        End-to-end on the GPU: SGLang's offline Engine serves the tiny Llama target
        (tests/data/models/tiny-llama's config, random weights written here with
        transformers, LM head scaled up so greedy has no near-ties) with the tiny DFlash
        draft (random weights: --speculative-draft-load-format dummy), no tokenizer,
        float32, Triton attention: greedy generation with DDTREE, then without
        speculation. Prints a JSON summary; fails unless every DDTREE request generates
        all its tokens through tree verifies and equals the plain greedy output (DDTree
        is lossless). A random draft rarely agrees with the target, so the accept length
        is near 1: this checks correctness, not speed.

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


def _generate(engine_kwargs: dict, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    import sglang as sgl

    engine = sgl.Engine(**engine_kwargs)
    try:
        return engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0,
                             "ignore_eos": True},
        )
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
    model.save_pretrained(dest, safe_serialization=True)
    shutil.copyfile(models / "tiny-llama" / "generation_config.json",
                    dest / "generation_config.json")
    return dest


def serve(models: Path) -> int:
    import tempfile

    target = _random_target(models, Path(tempfile.mkdtemp()) / "tiny-llama-random")
    common = dict(
        model_path=str(target),
        skip_tokenizer_init=True,
        attention_backend="triton",
        mem_fraction_static=0.3,
        dtype="float32",
        log_level="warning",
    )
    prompts = [[1, 17, 42, 99, 7], [1, 300, 301, 302, 303, 304, 305], [1, 5]]
    max_new = 48
    ddtree = _generate(
        dict(common, speculative_algorithm="DDTREE",
             speculative_draft_model_path=str(models / "tiny-dflash-draft"),
             speculative_draft_load_format="dummy",
             speculative_ddtree_budget=128),
        prompts, max_new,
    )
    plain = _generate(common, prompts, max_new)
    summary = {"requests": []}
    ok = True
    for got, ref in zip(ddtree, plain):
        ids, ref_ids = got["output_ids"], ref["output_ids"]
        verify_ct = int(got["meta_info"].get("spec_verify_ct", 0))
        accept_len = len(ids) / verify_ct if verify_ct else 0.0
        same = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), None)
        summary["requests"].append({
            "completion_tokens": len(ids), "spec_verify_ct": verify_ct,
            "accept_length": round(accept_len, 3),
            "matches_plain_greedy": same is None and len(ids) == len(ref_ids),
            "first_difference": same,
        })
        ok &= (len(ids) == max_new and verify_ct > 0 and accept_len >= 1.0
               and summary["requests"][-1]["matches_plain_greedy"])
    summary["ok"] = ok
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
