"""Probe for patches 0004/0005: drives the PATCHED dflash_info / dflash_worker of an
installed SGLang 0.5.12.x with SGLang's own pieces and checks every result against a
brute-force reference computed here in plain Python.

Run by the host interpreter (the patched SGLang importable), never imported by SGLang:

    python scripts/ddtree_verify_probe.py [--device cuda] [--strict] CASE... | gpu | cpu

It prints one line ``DDTREE-VERIFY-PROBE:{"case": "ok" | traceback}``; with --strict it
exits 1 when a case failed. tests/integration/test_ddtree_verify_input.py runs the CPU cases on
CPU; scripts/gpu_check_series.sh runs the GPU cases with ``--device cuda`` (SGLang's
CUDA tree kernels). Stand-ins (named): the target's logits and hidden states are random
tensors; the LM head given to the worker's top-k helper is a plain object holding a
weight tensor and a real shard-indices record; a hybrid attention backend is a
recording object (worker_tree_mamba_indices). Only the standard library is imported at
module level, so the test module can import CASES without SGLang.
"""

from __future__ import annotations

import json
import sys
import traceback

TAG = "DDTREE-VERIFY-PROBE:"

CASES = [
    "prepare_layout",
    "verify_greedy",
    "verify_finished_request",
    "verify_padding_nodes",
    "verify_sampling_top1_is_greedy",
    "sampling_kernel_call_passes_cuda_host_checks",
    "joint_filter_is_the_samplers",
    "sampling_law_first_token",
    "sampling_law_matches_sampler",
    "verify_counts_offchain_steps",
    "internal_state_reports_tree",
    "idle_batch",
    "page_size_refused",
    "worker_topk_single_shard",
    "worker_topk_two_shards",
    "worker_topk_logit_scale_softcap",
    "worker_topk_method_chunked",
    "worker_topk_method_two_ranks",
    "worker_builds_tree_input",
    "worker_tree_mamba_indices",
    "worker_draft_runner_sized_by_block",
]
# Run by scripts/gpu_check_series.sh with ``--device cuda`` (SGLang's CUDA tree kernels).
GPU_CASES = [
    "prepare_layout",
    "verify_greedy",
    "verify_finished_request",
    "verify_padding_nodes",
    "verify_sampling_top1_is_greedy",
    "sampling_law_first_token",
    "sampling_law_matches_sampler",
    "verify_counts_offchain_steps",
    "greedy_kernel_matches_reference",
    "worker_builds_tree_input",
]


def _models_dir():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


class _ModelsPath:
    def __truediv__(self, name):
        return _models_dir() / name


_MODELS = _ModelsPath()


def _v1_server_args(server_args_class, **kwargs):
    """A ServerArgs of a v1 family's release (0.5.12 / 0.5.13) resolved on CPU: device "cpu"
    first (DFlash's v1 resolution takes it), then "cuda" (construction touches no GPU)."""
    last = None
    for device in ("cpu", "cuda"):
        try:
            return server_args_class(device=device, **kwargs)
        except Exception as exc:  # noqa: BLE001 - try the next device
            last = exc
    raise last


def _ancestors(parents: list[int], i: int) -> list[int]:
    """i and its ancestors, by walking the parent array (the brute-force reference)."""
    out = []
    while i != -1:
        out.append(i)
        i = parents[i]
    return out


def _greedy_walk(tokens, parents, valid, target) -> list[int]:
    """Reference greedy tree walk: from the root, move to the first child (index
    order) whose token equals the target's token at the current node."""
    n = len(tokens)
    path = [0]
    while True:
        cur = path[-1]
        nxt = [
            j for j in range(1, n)
            if valid[j] and parents[j] == cur and tokens[j] == target[cur]
        ]
        if not nxt:
            return path
        path.append(nxt[0])


class _Probe:
    def __init__(self, device: str = "cpu"):
        import torch

        from sglang.srt.speculative import ddtree_utils
        from sglang.srt.speculative.dflash_info import DDTreeVerifyInput

        self.torch = torch
        self.device = device
        self.ddtree_utils = ddtree_utils
        self._tp_group_ready = False
        self.DDTreeVerifyInput = DDTreeVerifyInput

    # -- real SGLang pieces ------------------------------------------------------------

    def batch(self, prefix_lens, *, max_new_tokens=1000, sampling=None, vocab=64,
              max_context_len=256, kv_slots=4096):
        """A decode ScheduleBatch whose requests hold `prefix_lens` committed tokens."""
        torch = self.torch
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
        from sglang.srt.sampling.sampling_params import SamplingParams

        bs = len(prefix_lens)
        dev = self.device
        req_to_token_pool = ReqToTokenPool(
            size=bs + 2, max_context_len=max_context_len, device=dev,
            enable_memory_saver=False,
        )
        allocator = TokenToKVPoolAllocator(
            size=max(kv_slots, 64 * bs), dtype=torch.float16, device=dev, kvcache=None,
            need_sort=False,
        )
        cache = ChunkCache(CacheInitParams(
            disable=True, req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator, page_size=1,
        ))
        reqs = []
        for i, plen in enumerate(prefix_lens):
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
            params.normalize(None)
            params.verify(vocab)
            req = Req(f"r{i}", "", list(range(1, plen + 1)), params, vocab_size=vocab)
            req.kv_committed_len = plen
            req.kv_allocated_len = plen
            reqs.append(req)
        pool_rows = req_to_token_pool.alloc(reqs)
        # The prefill's KV: each request's prefix owns its own slots.
        for row, plen in zip(pool_rows, prefix_lens):
            req_to_token_pool.req_to_token[row, :plen] = allocator.alloc(plen).to(torch.int32)
        seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)
        batch = ScheduleBatch(
            reqs=reqs, req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator, tree_cache=cache,
            forward_mode=ForwardMode.DECODE, device=dev,
        )
        batch.req_pool_indices = torch.tensor(pool_rows, dtype=torch.int64, device=dev)
        batch.seq_lens = seq_lens.to(dev)
        batch.seq_lens_cpu = seq_lens.clone()
        batch.seq_lens_sum = int(sum(prefix_lens))
        if sampling is not None:
            top_k, top_p, temperature, min_p = (*sampling, 0.0)[:4]
            info = SamplingBatchInfo(
                temperatures=torch.full((bs, 1), temperature, device=dev),
                top_ps=torch.full((bs,), top_p, device=dev),
                top_ks=torch.full((bs,), top_k, dtype=torch.int32, device=dev),
                min_ps=torch.full((bs,), min_p, device=dev), is_all_greedy=False,
                need_top_p_sampling=top_p < 1.0, need_top_k_sampling=True,
                need_min_p_sampling=min_p > 0, vocab_size=vocab, device=dev,
            )
            info.penalizer_orchestrator = BatchedPenalizerOrchestrator(vocab, batch, set())
            batch.sampling_info = info
        return batch

    def layout(self, gen, bs, depth, budget, vocab, k, max_per_depth=None, mass=1.0):
        torch = self.torch
        logits = torch.randn(bs, depth, vocab, generator=gen) * 3
        logprobs, tokens = self.ddtree_utils.topk_logprobs(logits, k)
        if mass < 1.0:
            # Only the first `k` tokens per position are drawable: small trees get padding.
            logprobs[:, :, 2:] = float("-inf")
        roots = torch.randint(0, vocab, (bs,), generator=gen)
        return self.ddtree_utils.build_ddtree(
            logprobs.to(self.device), tokens.to(self.device), roots.to(self.device),
            budget, max_per_depth=max_per_depth,
        )

    def target_logits(self, gen, layout, vocab, follow=0.75):
        """Target logits whose argmax follows a child's token with prob `follow`."""
        torch = self.torch
        bs, n = layout.tokens.shape
        tokens, parents, valid = (layout.tokens.tolist(), layout.parents.tolist(),
                                  layout.valid.tolist())
        target = []
        for b in range(bs):
            row = []
            for i in range(n):
                kids = [j for j in range(1, n) if valid[b][j] and parents[b][j] == i]
                if kids and torch.rand(1, generator=gen).item() < follow:
                    pick = kids[int(torch.randint(len(kids), (1,), generator=gen))]
                    row.append(tokens[b][pick])
                else:
                    row.append(int(torch.randint(vocab, (1,), generator=gen)))
            target.append(row)
        logits = torch.randn(bs * n, vocab, generator=gen)
        flat = torch.tensor(target).reshape(-1)
        logits[torch.arange(bs * n), flat] += 50.0
        return logits.to(self.device), target

    def logits_output(self, logits, hidden_dim=3):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        rows = logits.shape[0]
        # Row r's hidden state is r: the next draft context is checkable by value.
        hidden = self.torch.arange(rows, dtype=self.torch.float32)[:, None].repeat(1, hidden_dim)
        return LogitsProcessorOutput(
            next_token_logits=logits.to(self.device), hidden_states=hidden.to(self.device)
        )

    # -- shared verify check -------------------------------------------------------------

    def run_and_check_verify(self, batch, layout, logits, target, commit_limit=None):
        """Prepare + verify on a real batch, then compare everything with brute force."""
        bs, n = layout.tokens.shape
        free_before = set(batch.token_to_kv_pool_allocator.free_pages.tolist())
        seq0 = batch.seq_lens.tolist()
        rows = batch.req_pool_indices.tolist()
        prefix_table = [batch.req_to_token_pool.req_to_token[r, :s].tolist()
                        for r, s in zip(rows, seq0)]
        vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
        vi.prepare_for_verify(batch, 1)
        loc = batch.out_cache_loc.tolist()
        out = self.logits_output(logits)
        new_bonus, commit_lens, next_hidden, ncorrect = vi.verify(
            batch=batch, logits_output=out, page_size=1
        )
        tokens, parents, valid = (layout.tokens.tolist(), layout.parents.tolist(),
                                  layout.valid.tolist())
        expect_hidden, kept = [], set()
        for b in range(bs):
            path = _greedy_walk(tokens[b], parents[b], valid[b], target[b])
            emitted = [tokens[b][p] for p in path[1:]] + [target[b][path[-1]]]
            c = len(emitted) if commit_limit is None else min(commit_limit[b], len(emitted))
            req = batch.reqs[b]
            assert list(req.output_ids) == emitted[:c], (b, req.output_ids, emitted, c)
            assert int(commit_lens[b]) == c and ncorrect[b] == c - 1
            assert int(new_bonus[b]) == emitted[c - 1]
            assert req.kv_committed_len == seq0[b] + c and req.spec_verify_ct == 1
            # What the request owns after the commit is exactly its committed tokens' slots:
            # one slot more and release_kv_cache would later free a slot the verify already
            # gave back (or another request's).
            assert req.kv_allocated_len == req.kv_committed_len, (
                b, req.kv_allocated_len, req.kv_committed_len)
            assert int(batch.seq_lens[b]) == seq0[b] + c == int(batch.seq_lens_cpu[b])
            table = batch.req_to_token_pool.req_to_token[rows[b]].tolist()
            assert table[: seq0[b]] == prefix_table[b], "the prefix must not move"
            path_slots = [loc[b * n + p] for p in path[:c]]
            assert table[seq0[b] : seq0[b] + c] == path_slots, (b, path, table[seq0[b]:])
            kept |= set(path_slots)
            expect_hidden += [b * n + p for p in path[:c]]
            assert int(vi.last_committed_node[b]) == path[c - 1]
            assert vi.committed_path_nodes[b].tolist()[:c] == path[:c]
            assert all(x == -1 for x in vi.committed_path_nodes[b].tolist()[c:])
        assert batch.seq_lens_sum == sum(seq0) + int(commit_lens.sum())
        assert next_hidden[:, 0].tolist() == [float(x) for x in expect_hidden]
        assert out.hidden_states is None
        assert batch.out_cache_loc.tolist() == [
            int(batch.req_to_token_pool.req_to_token[rows[b], seq0[b] + j])
            for b in range(bs) for j in range(int(commit_lens[b]))
        ]
        # Every tree slot is either kept (on a committed path) or back in the allocator.
        free_after = set(batch.token_to_kv_pool_allocator.free_pages.tolist())
        for b, req in enumerate(batch.reqs):
            owned = batch.req_to_token_pool.req_to_token[rows[b], : req.kv_allocated_len].tolist()
            assert len(set(owned)) == len(owned) and not set(owned) & free_after, (
                "a request owns a freed or repeated KV slot", b, owned)
        tree_slots = set(loc)
        assert len(tree_slots) == bs * n
        assert free_after == (free_before - kept), "freed set differs"
        assert len(batch.token_to_kv_pool_allocator.free_pages) == len(free_after)
        assert not (tree_slots - kept) & (set(range(4097)) - free_after)
        return vi

    # -- cases ---------------------------------------------------------------------------

    def prepare_layout(self):
        torch = self.torch
        gen = torch.Generator().manual_seed(1)
        for trial in range(6):
            prefix = [int(x) for x in torch.randint(1, 20, (1 + trial % 3,), generator=gen)]
            budget = [3, 8, 15][trial % 3]
            batch = self.batch(prefix)
            layout = self.layout(gen, len(prefix), depth=4, budget=budget, vocab=10, k=budget)
            bs, n = layout.tokens.shape
            vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
            free0 = len(batch.token_to_kv_pool_allocator.free_pages)
            vi.prepare_for_verify(batch, 1)
            assert vi.draft_token_num == n == budget + 1
            assert torch.equal(batch.input_ids, layout.tokens.reshape(-1))
            loc = batch.out_cache_loc.tolist()
            assert len(loc) == bs * n == len(set(loc))
            assert free0 - len(batch.token_to_kv_pool_allocator.free_pages) == bs * n
            parents = layout.parents.tolist()
            mask = vi.custom_mask.tolist()
            # What generate_attn_arg_prefill sizes: sum(prefix) * n + n * n * bs.
            assert len(mask) == sum(prefix) * n + n * n * bs
            expect, positions = [], []
            for b in range(bs):
                row = int(batch.req_pool_indices[b])
                table = batch.req_to_token_pool.req_to_token[row].tolist()
                assert table[prefix[b] : prefix[b] + n] == loc[b * n : (b + 1) * n]
                for i in range(n):
                    anc = set(_ancestors(parents[b], i))
                    positions.append(prefix[b] + len(anc) - 1)
                    expect += [True] * prefix[b] + [j in anc for j in range(n)]
            assert mask == expect, f"trial {trial}: FULL mask differs from the ancestor walk"
            assert vi.positions.tolist() == positions
            # The mask must also be what the core's own tree layout says.
            assert torch.equal(
                vi.custom_mask,
                self.ddtree_utils.flat_mask_for_sglang(
                    layout, torch.tensor(prefix, device=self.device)
                ),
            )

    def verify_greedy(self):
        torch = self.torch
        gen = torch.Generator().manual_seed(2)
        lengths = []
        for trial in range(12):
            bs = 1 + trial % 4
            budget = [1, 4, 9, 20][trial % 4]
            vocab = 16
            prefix = [int(x) for x in torch.randint(1, 30, (bs,), generator=gen)]
            batch = self.batch(prefix, vocab=vocab)
            layout = self.layout(gen, bs, depth=5, budget=budget, vocab=vocab, k=budget,
                                 max_per_depth=[None, 2][trial % 2])
            logits, target = self.target_logits(gen, layout, vocab)
            self.run_and_check_verify(batch, layout, logits, target)
            lengths += [len(r.output_ids) for r in batch.reqs]
        # The trees must have exercised both rejection at the root and deep acceptance.
        assert min(lengths) == 1 and max(lengths) >= 4, lengths

    def verify_finished_request(self):
        torch = self.torch
        gen = torch.Generator().manual_seed(3)
        vocab = 16
        for _trial in range(4):
            bs = 2
            batch = self.batch([7, 11], max_new_tokens=2, vocab=vocab)
            layout = self.layout(gen, bs, depth=5, budget=12, vocab=vocab, k=12)
            logits, target = self.target_logits(gen, layout, vocab, follow=1.0)
            # max_new_tokens=2: a request commits at most 2 tokens, whatever its path.
            self.run_and_check_verify(batch, layout, logits, target, commit_limit=[2, 2])
            assert all(r.finished() for r in batch.reqs if len(r.output_ids) == 2)

    def verify_padding_nodes(self):
        torch = self.torch
        gen = torch.Generator().manual_seed(4)
        vocab = 16
        # Two drawable tokens per position over depth 2: at most 2 + 4 = 6 real nodes,
        # so a budget of 10 leaves padding nodes (never accepted, always freed).
        batch = self.batch([5, 9, 3], vocab=vocab)
        layout = self.layout(gen, 3, depth=2, budget=10, vocab=vocab, k=10, mass=0.5)
        assert not bool(layout.valid.all()), "the case needs padding nodes"
        logits, target = self.target_logits(gen, layout, vocab, follow=1.0)
        # Request 0's target predicts the padding token (0) everywhere: padding nodes
        # hang under the root with token 0, so a walk that entered padding would show.
        n = layout.num_nodes
        target[0] = [0] * n
        logits[:n, 0] += 1000.0
        vi = self.run_and_check_verify(batch, layout, logits, target)
        pad = ~layout.valid
        for b in range(3):
            nodes = [x for x in vi.committed_path_nodes[b].tolist() if x >= 0]
            assert not any(bool(pad[b, x]) for x in nodes)

    def verify_sampling_top1_is_greedy(self):
        torch = self.torch
        self._single_rank_tp_group()  # the CUDA sampling path broadcasts over TP
        gen = torch.Generator().manual_seed(5)
        vocab = 16
        for _trial in range(6):
            bs = 3
            # top_k = 1: the target distribution is one-hot at its argmax, so the lossless
            # sampling walk (ddtree_utils.sample_accept on CPU) must equal the greedy walk.
            batch = self.batch([4, 8, 12], sampling=(1, 1.0, 0.7), vocab=vocab)
            layout = self.layout(gen, bs, depth=4, budget=9, vocab=vocab, k=9)
            logits, target = self.target_logits(gen, layout, vocab)
            self.run_and_check_verify(batch, layout, logits, target)

    def sampling_kernel_call_passes_cuda_host_checks(self):
        """The v1 verify's call into sgl-kernel's tree_speculative_sampling_target_only (the
        tensors _sample_accept builds on a GPU) passes the CUDA host checks and walks the
        tree: the CUDA branch is forced on CPU (logits that claim is_cuda, the availability
        check answering yes) and the kernel is the NAMED STAND-IN of
        tests/v2_kernel_standins.py, held to the kernel's sources. Accepted paths follow the
        tree's links, and the call happened once per verify."""
        import importlib.util
        from pathlib import Path

        torch = self.torch
        self._single_rank_tp_group()  # the CUDA sampling path broadcasts over TP
        spec = importlib.util.spec_from_file_location(
            "v2_kernel_standins", Path(__file__).resolve().parent.parent / "tests" /
            "v2_kernel_standins.py")
        ks = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ks)
        info = sys.modules[self.DDTreeVerifyInput.__module__]
        calls = []

        def walk(**kw):
            calls.append(kw)
            ks.tree_speculative_sampling_target_only(**kw)

        class OnCuda(torch.Tensor):  # a CPU tensor that takes the CUDA branch
            @property
            def is_cuda(self):
                return True

        saved = (info.is_dflash_sampling_verify_available,
                 info.dflash_utils.__dict__.get("tree_speculative_sampling_target_only"))
        info.is_dflash_sampling_verify_available = lambda: True
        info.dflash_utils.tree_speculative_sampling_target_only = walk
        try:
            gen = torch.Generator().manual_seed(9)
            vocab, bs = 16, 3
            for trial in range(4):
                batch = self.batch([4, 8, 12], sampling=(vocab, 1.0, 1.0), vocab=vocab)
                layout = self.layout(gen, bs, depth=4, budget=9, vocab=vocab, k=9,
                                     mass=0.5 if trial % 2 else 1.0)
                logits, _ = self.target_logits(gen, layout, vocab)
                vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
                acc = vi._sample_accept(batch.sampling_info, logits.as_subclass(OnCuda), bs)
                assert len(calls) == trial + 1
                n = layout.num_nodes
                parents = layout.parents.tolist()
                for b in range(bs):
                    path = [int(i) - b * n for i in acc.accept_index[b].tolist() if int(i) >= 0]
                    assert path[0] == 0 and len(path) == int(acc.accept_length[b]) + 1, path
                    assert all(parents[b][c] == p for p, c in zip(path, path[1:])), path
        finally:
            info.is_dflash_sampling_verify_available = saved[0]
            if saved[1] is None:
                info.dflash_utils.__dict__.pop("tree_speculative_sampling_target_only", None)
            else:
                info.dflash_utils.tree_speculative_sampling_target_only = saved[1]

    def joint_filter_is_the_samplers(self):
        """ddtree_utils.joint_filter_probs keeps exactly the tokens SGLang's own
        non-speculative torch sampler (sglang.srt.layers.sampler) can draw, with the same
        relative weights, on random rows and (top_k, top_p, min_p)."""
        torch = self.torch
        from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

        gen = torch.Generator().manual_seed(6)
        rows, vocab = 60, 9
        probs = torch.softmax(torch.randn(rows, vocab, generator=gen) * 2, dim=-1)
        top_ks = torch.randint(1, 12, (rows,), generator=gen)
        top_ps = torch.rand(rows, generator=gen) * 0.9 + 0.1
        min_ps = torch.where(torch.rand(rows, generator=gen) < 0.5, 0.0,
                             torch.rand(rows, generator=gen) * 0.5)
        got = self.ddtree_utils.joint_filter_probs(probs, top_ks, top_ps, min_ps)
        # The sampler's support, found by drawing from it (a token it can draw never
        # has probability 0 here, and vice versa), then brute-force weights.
        seen = torch.zeros(rows, vocab, dtype=torch.bool)
        for _ in range(200):
            drawn = top_k_top_p_min_p_sampling_from_probs_torch(
                probs.clone(), top_ks, top_ps, min_ps, True, None, None
            )
            seen[torch.arange(rows), drawn.reshape(-1).long()] = True
        for r in range(rows):
            p = probs[r].tolist()
            order = sorted(range(vocab), key=lambda t: -p[t])
            keep = [t for i, t in enumerate(order)
                    if i < int(top_ks[r]) and sum(p[u] for u in order[:i]) <= float(top_ps[r])
                    and p[t] >= p[order[0]] * float(min_ps[r])]
            total = sum(p[t] for t in keep)
            want = torch.tensor([p[t] / total if t in keep else 0.0 for t in range(vocab)])
            assert torch.allclose(got[r], want, atol=1e-6), (r, got[r], want)
            assert set(torch.nonzero(seen[r]).flatten().tolist()) <= set(keep), (r, keep)
        # The example: the joint filter keeps two tokens where renormalising
        # after top-k then applying top-p keeps one.
        ex = self.ddtree_utils.joint_filter_probs(
            torch.tensor([[0.4, 0.3, 0.2, 0.1]]), torch.tensor([2]), torch.tensor([0.5])
        )
        assert torch.allclose(ex, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]])), ex

    def sampling_law_first_token(self):
        """Lossless sampling: the first emitted token follows the target's distribution
        at the root, whatever the tree proposes (many copies of one tree, one verify)."""
        torch = self.torch
        self._single_rank_tp_group()  # the CUDA sampling path broadcasts over TP
        copies, vocab = 20000, 8
        batch = self.batch([2] * copies, sampling=(vocab, 1.0, 1.0), vocab=vocab)
        # One tree copied: root children 3, 5, 1 (best first), one grandchild under 3.
        gen = torch.Generator().manual_seed(11)
        lp = torch.full((1, 2, vocab), float("-inf"))
        lp[0, 0, [3, 5, 1]] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
        lp[0, 1, 6] = 0.0
        logprobs, tokens = lp.sort(dim=-1, descending=True)
        layout = self.ddtree_utils.build_ddtree(
            logprobs.expand(copies, -1, -1).to(self.device),
            tokens.expand(copies, -1, -1).to(self.device),
            torch.zeros(copies, dtype=torch.int64, device=self.device), 4,
        )
        n = layout.num_nodes
        target = torch.softmax(torch.randn(vocab, generator=gen), dim=-1)
        logits = target.log().repeat(copies * n, 1).to(self.device)
        vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
        acc = vi._sample_accept(batch.sampling_info, logits, copies)
        path1 = acc.accept_index[:, 1] - torch.arange(copies, device=self.device) * n
        first = torch.where(
            acc.accept_length > 0, layout.tokens.gather(1, path1.clamp(min=0)[:, None])[:, 0],
            acc.bonus,
        )
        freq = torch.bincount(first.cpu(), minlength=vocab).double() / copies
        tol = 5 * (target.double() * (1 - target.double()) / copies).sqrt() + 1e-3
        assert bool(((freq - target.double()).abs() <= tol).all()), (freq, target)

    def sampling_law_matches_sampler(self):
        """Lossless w.r.t. decoding WITHOUT speculation: DDTREE's first emitted token
        (one verify over many copies of a tree whose root children include filtered-out
        tokens) has the law of SGLang's own non-speculative torch sampler
        (sglang.srt.layers.sampler) under the same top-k / top-p / min-p. Two-sample
        chi-square test of homogeneity, rejected below p = 1e-4."""
        torch = self.torch
        from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

        self._single_rank_tp_group()  # the CUDA sampling path broadcasts over TP
        copies = 20000
        cases = [
            # (target probs, top_k, top_p, min_p): the first is the example.
            ([0.4, 0.3, 0.2, 0.1], 2, 0.5, 0.0),
            ([0.35, 0.25, 0.2, 0.12, 0.08], 4, 0.7, 0.0),
            ([0.35, 0.25, 0.2, 0.12, 0.08], 5, 1.0, 0.5),
            ([0.3, 0.3, 0.2, 0.1, 0.1], 3, 0.9, 0.4),
        ]
        for target, top_k, top_p, min_p in cases:
            vocab = len(target)
            batch = self.batch([2] * copies, sampling=(top_k, top_p, 1.0, min_p), vocab=vocab)
            # Root children: the two least likely tokens first (filtered out by the
            # sampler), then the most likely; one grandchild.
            lp = torch.full((1, 2, vocab), float("-inf"))
            lp[0, 0, [vocab - 1, vocab - 2, 0]] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
            lp[0, 1, 1] = 0.0
            logprobs, tokens = lp.sort(dim=-1, descending=True)
            layout = self.ddtree_utils.build_ddtree(
                logprobs.expand(copies, -1, -1).to(self.device),
                tokens.expand(copies, -1, -1).to(self.device),
                torch.zeros(copies, dtype=torch.int64, device=self.device), 4,
            )
            n = layout.num_nodes
            probs = torch.tensor(target)
            logits = probs.log().repeat(copies * n, 1).to(self.device)
            vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
            acc = vi._sample_accept(batch.sampling_info, logits, copies)
            path1 = acc.accept_index[:, 1] - torch.arange(copies, device=self.device) * n
            first = torch.where(
                acc.accept_length > 0,
                layout.tokens.gather(1, path1.clamp(min=0)[:, None])[:, 0], acc.bonus,
            )
            ours = torch.bincount(first.cpu(), minlength=vocab).double()
            drawn = top_k_top_p_min_p_sampling_from_probs_torch(
                probs.repeat(copies, 1), torch.full((copies,), top_k),
                torch.full((copies,), top_p), torch.full((copies,), min_p),
                min_p > 0, None, None,
            )
            theirs = torch.bincount(drawn.reshape(-1).cpu().long(), minlength=vocab).double()
            both = ours + theirs
            used = both > 0
            expected = both[used] / 2
            stat = (((ours[used] - expected) ** 2 + (theirs[used] - expected) ** 2)
                    / expected).sum()
            df = max(int(used.sum()) - 1, 1)
            p_value = float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2))
            assert p_value > 1e-4, (target, top_k, top_p, min_p, ours, theirs, p_value)
            # Tokens the sampler can never draw are never emitted.
            assert bool((ours[theirs == 0] == 0).all()), (ours, theirs)

    def verify_counts_offchain_steps(self):
        """verify sets offchain_step = 1 exactly when some request committed a node that
        is not its parent's first child (brute force from the parent array)."""
        torch = self.torch
        gen = torch.Generator().manual_seed(22)
        seen = set()
        for trial in range(24):
            bs = 1 + trial % 3
            batch = self.batch([5, 7, 9][:bs], vocab=32)
            layout = self.layout(gen, bs, depth=4, budget=10, vocab=32, k=10)
            logits, target = self.target_logits(gen, layout, 32, follow=0.9)
            if trial % 4 == 0:
                # The target agrees with every node's FIRST child: the first-ranked chain.
                nxt = layout.retrieve_next_token
                target = torch.where(nxt >= 0, layout.tokens.gather(1, nxt.clamp(min=0)),
                                     7).tolist()
                logits = torch.full((bs * layout.num_nodes, 32), -5.0)
                logits[torch.arange(bs * layout.num_nodes), torch.tensor(target).reshape(-1)] = 5.0
                logits = logits.to(self.device)
            vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
            vi.prepare_for_verify(batch, 1)
            vi.verify(batch=batch, logits_output=self.logits_output(logits), page_size=1)
            tokens, parents, valid = (layout.tokens.tolist(), layout.parents.tolist(),
                                      layout.valid.tolist())
            want = 0
            for b in range(bs):
                path = _greedy_walk(tokens[b], parents[b], valid[b], target[b])
                for node in path[1:]:
                    first = min(j for j in range(1, len(tokens[b]))
                                if valid[b][j] and parents[b][j] == parents[b][node])
                    if node != first:
                        want = 1
            assert vi.offchain_step.dtype == torch.int64 and vi.offchain_step.dim() == 0
            assert int(vi.offchain_step) == want, (trial, want)
            seen.add(want)
        assert seen == {0, 1}, "the trials must cover both outcomes"

    def internal_state_reports_tree(self):
        """The worker's report and the PATCHED Scheduler.get_internal_state that puts it
        in /server_info's internal_states (stand-in: a namespace holding the attributes
        get_internal_state reads, no model runners)."""
        import dataclasses
        import types

        torch = self.torch
        from sglang.srt import server_args as sa
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.speculative.dflash_worker import DFlashWorker

        # The class the smoke's tree level reads: DDTREE's worker tree-verifies.
        assert DFlashWorker.DDTREE_TREE_VERIFY is True
        worker = object.__new__(DFlashWorker)  # the real class; no model runners
        worker.is_ddtree, worker.ddtree_budget = True, 64
        worker._ddtree_offchain_steps = torch.tensor(3, dtype=torch.int64, device=self.device)
        report = worker.ddtree_internal_state()
        assert report == {"ddtree_verify_width": 65, "ddtree_worker_class": "DFlashWorker",
                          "ddtree_offchain_accepts": 3}, report
        assert DFlashWorker.ddtree_internal_state(
            types.SimpleNamespace(is_ddtree=False)) == {}

        args = object.__new__(sa.ServerArgs)  # real defaults, no validation
        for f in dataclasses.fields(sa.ServerArgs):
            if f.default is not dataclasses.MISSING:
                setattr(args, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(args, f.name, f.default_factory())
        saved = sa._global_server_args
        sa.set_global_server_args_for_scheduler(args)
        try:
            runner = types.SimpleNamespace(weight_load_mem_usage=1.0, graph_mem_usage=0.0)
            sched = types.SimpleNamespace(
                last_gen_throughput=0.0, max_total_num_tokens=10, max_running_requests=4,
                tp_worker=types.SimpleNamespace(model_runner=runner),
                token_to_kv_pool_allocator=types.SimpleNamespace(
                    get_kvcache=lambda: types.SimpleNamespace(mem_usage=0.5)),
                spec_algorithm=types.SimpleNamespace(is_none=lambda: False),
                spec_total_num_forward_ct=0, spec_total_num_accept_tokens=0,
                metrics_reporter=types.SimpleNamespace(
                    last_gen_throughput=0.0, spec_total_num_forward_ct=0,
                    spec_total_num_accept_tokens=0, step_time_dict={}),
                draft_worker=worker,
            )
            state = Scheduler.get_internal_state(sched, None).internal_state
            assert {k: state[k] for k in report} == report, state
            sched.draft_worker = None  # no speculative worker: no DDTREE keys
            state = Scheduler.get_internal_state(sched, None).internal_state
            assert not set(report) & set(state), state
        finally:
            sa._global_server_args = saved

    def greedy_kernel_matches_reference(self):
        """sgl_kernel's verify_tree_greedy (what verify uses on CUDA) against the
        pure-torch walk, on larger random trees (GPU only)."""
        torch = self.torch
        gen = torch.Generator().manual_seed(12)
        for bs, budget, depth in ((1, 16, 15), (8, 64, 15), (32, 256, 15), (4, 1024, 15)):
            layout = self.layout(gen, bs, depth=depth, budget=budget, vocab=64, k=budget)
            logits, _ = self.target_logits(gen, layout, 64)
            target = logits.argmax(dim=-1).view(bs, -1)
            ref = self.ddtree_utils.greedy_accept(layout, target, backend="torch")
            ker = self.ddtree_utils.greedy_accept(layout, target, backend="sgl_kernel")
            for name in ("accept_index", "accept_length", "bonus", "last_node"):
                assert torch.equal(getattr(ref, name), getattr(ker, name)), (bs, budget, name)

    def idle_batch(self):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        torch = self.torch
        gen = torch.Generator().manual_seed(7)
        batch = self.batch([3])
        layout = self.layout(gen, 1, depth=3, budget=4, vocab=8, k=4)
        vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
        batch.forward_mode = ForwardMode.IDLE
        free0 = len(batch.token_to_kv_pool_allocator.free_pages)
        vi.prepare_for_verify(batch, 1)
        assert batch.out_cache_loc is None
        bonus, commit, hidden, ncorrect = vi.verify(
            batch=batch, logits_output=self.logits_output(torch.zeros(0, 8)), page_size=1
        )
        assert bonus.numel() == commit.numel() == 0 and ncorrect == []
        assert len(batch.token_to_kv_pool_allocator.free_pages) == free0

    def page_size_refused(self):
        torch = self.torch
        gen = torch.Generator().manual_seed(8)
        batch = self.batch([3])
        layout = self.layout(gen, 1, depth=3, budget=4, vocab=8, k=4)
        vi = self.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
        free0 = len(batch.token_to_kv_pool_allocator.free_pages)
        try:
            vi.prepare_for_verify(batch, 16)
        except ValueError as exc:
            assert "--page-size 1" in str(exc) and "16" in str(exc), str(exc)
        else:
            raise AssertionError("page_size 16 was accepted")
        assert len(batch.token_to_kv_pool_allocator.free_pages) == free0

    def _lm_head(self, weight, shard):
        class LMHead:  # stand-in: the worker reads only .weight and .shard_indices
            pass

        head = LMHead()
        head.weight, head.shard_indices = weight, shard
        return head

    def _shard(self, org_start, org_end, padded_len, added=(0, 0)):
        from sglang.srt.layers.vocab_parallel_embedding import (
            VocabParallelEmbeddingShardIndices,
        )

        return VocabParallelEmbeddingShardIndices(
            padded_org_vocab_start_index=org_start,
            padded_org_vocab_end_index=org_start + padded_len,
            padded_added_vocab_start_index=added[0],
            padded_added_vocab_end_index=added[0] + (added[1] - added[0]),
            org_vocab_start_index=org_start,
            org_vocab_end_index=org_end,
            added_vocab_start_index=added[0],
            added_vocab_end_index=added[1],
        )

    def worker_topk_single_shard(self):
        torch = self.torch
        from sglang.srt.speculative.dflash_worker import (
            _merge_shard_topk_logprobs,
            _shard_topk_logprobs,
        )

        gen = torch.Generator().manual_seed(9)
        vocab, hidden = 50, 8
        # 64 padded rows, 50 real: padding rows get huge logits and must never be picked.
        weight = torch.randn(64, hidden, generator=gen)
        weight[vocab:] = 100.0
        head = self._lm_head(weight, self._shard(0, vocab, 64))
        hs = torch.randn(7, hidden, generator=gen)
        for k in (1, 5, 50, 70):
            values, ids, lse = _shard_topk_logprobs(hs, head, k)
            lp, tok = _merge_shard_topk_logprobs(values[None], ids[None], lse[None], k)
            ref = torch.log_softmax(hs @ weight[:vocab].T, dim=-1)
            kk = min(k, vocab)
            ref_lp, ref_tok = ref.topk(kk, dim=-1)
            assert torch.allclose(lp[:, :kk], ref_lp, atol=1e-5)
            assert torch.equal(tok[:, :kk], ref_tok)
            assert bool(torch.isinf(lp[:, kk:]).all()), "k beyond the vocab must be -inf"

    def worker_topk_logit_scale_softcap(self):
        """Draft log-probs for the tree see the target's logit scale and final
        soft-capping, read from a REAL LogitsProcessor built on a tiny config with
        final_logit_softcapping (Gemma-2 style) and a logit_scale (Cohere style)."""
        import dataclasses
        import types

        torch = self.torch
        from transformers import PretrainedConfig

        from sglang.srt import server_args as sa
        from sglang.srt.layers.logits_processor import LogitsProcessor
        from sglang.srt.speculative.dflash_worker import DFlashWorker

        self._single_rank_tp_group()
        args = object.__new__(sa.ServerArgs)  # real defaults, no validation
        for f in dataclasses.fields(sa.ServerArgs):
            if f.default is not dataclasses.MISSING:
                setattr(args, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(args, f.name, f.default_factory())
        saved = sa._global_server_args
        sa.set_global_server_args_for_scheduler(args)
        try:
            config = PretrainedConfig(vocab_size=30, final_logit_softcapping=2.0)
            processor = LogitsProcessor(config, logit_scale=0.5)
        finally:
            sa._global_server_args = saved
        gen = torch.Generator().manual_seed(16)
        vocab, hidden, block, budget = 30, 8, 4, 6
        weight = torch.randn(32, hidden, generator=gen) * 3
        head = self._lm_head(weight.to(self.device), self._shard(0, vocab, 32))
        batch = self.batch([6], vocab=vocab)
        draft_hidden = torch.randn(1, block, hidden, generator=gen)
        worker = self._worker_self(ddtree_k=budget, ddtree_budget=budget,
                                   ddtree_max_per_depth=None)
        worker.target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
            model=types.SimpleNamespace(logits_processor=processor)))
        vi = DFlashWorker._build_ddtree_verify_input(
            worker, batch, torch.tensor([3]).to(self.device),
            draft_hidden.to(self.device), head,
        )
        raw = draft_hidden[:, 1:] @ weight[:vocab].T
        capped = torch.tanh(raw * 0.5 / 2.0) * 2.0
        lp, tok = torch.log_softmax(capped, dim=-1).topk(budget, dim=-1)
        ref = self.ddtree_utils.build_ddtree(lp, tok, torch.tensor([3]), budget)
        assert torch.allclose(vi.layout.scores.cpu(), ref.scores, atol=1e-5), (
            vi.layout.scores, ref.scores)
        assert torch.equal(vi.layout.parents.cpu(), ref.parents)
        # Without them the path scores differ (the test can fail).
        plain_lp, _ = torch.log_softmax(raw, dim=-1).topk(budget, dim=-1)
        plain = self.ddtree_utils.build_ddtree(plain_lp, tok, torch.tensor([3]), budget)
        assert not torch.allclose(plain.scores, ref.scores, atol=1e-3)

    def worker_topk_two_shards(self):
        torch = self.torch
        from sglang.srt.speculative.dflash_worker import (
            _merge_shard_topk_logprobs,
            _shard_topk_logprobs,
        )

        # Tensor parallelism by hand: vocab 45 split 24 + 21 (second shard padded to 24),
        # plus 3 added tokens on the second rank; the merge must equal the full softmax.
        gen = torch.Generator().manual_seed(10)
        hidden = 6
        full = torch.randn(48, hidden, generator=gen)  # ids 0..44 base, 45..47 added
        w0 = full[:24].clone()
        w1 = torch.cat([full[24:45], torch.full((3, hidden), 99.0), full[45:48]])
        s0 = self._shard(0, 24, 24)
        s1 = self._shard(24, 45, 24, added=(45, 48))
        hs = torch.randn(9, hidden, generator=gen)
        for k in (1, 4, 30):
            parts = [_shard_topk_logprobs(hs, self._lm_head(w, s), k) for w, s in ((w0, s0), (w1, s1))]
            values, ids, lse = (torch.stack([p[i] for p in parts]) for i in range(3))
            lp, tok = _merge_shard_topk_logprobs(values, ids, lse, k)
            ref_lp, ref_tok = torch.log_softmax(hs @ full.T, dim=-1).topk(k, dim=-1)
            assert torch.allclose(lp, ref_lp, atol=1e-5), (k, lp, ref_lp)
            assert torch.equal(tok, ref_tok)

    def _single_rank_tp_group(self):
        """SGLang's own TP group with one rank (what a tp_size=1 server has)."""
        if self._tp_group_ready:
            return
        import socket

        from sglang.srt.distributed import (
            init_distributed_environment,
            initialize_model_parallel,
        )

        backend = "nccl" if self.device == "cuda" else "gloo"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend=backend,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
        )
        initialize_model_parallel(1, backend=backend)
        self._tp_group_ready = True

    def _worker_self(self, **attrs):
        """The attributes DFlashWorker's DDTree methods read (no model runners)."""
        import functools
        import types

        from sglang.srt.speculative.dflash_worker import DFlashWorker

        ns = types.SimpleNamespace(**attrs)
        ns._topk_logprobs_from_vocab_parallel_head = functools.partial(
            DFlashWorker._topk_logprobs_from_vocab_parallel_head, ns
        )
        return ns

    def worker_topk_method_chunked(self):
        torch = self.torch
        from sglang.srt.speculative.dflash_worker import DFlashWorker

        self._single_rank_tp_group()
        gen = torch.Generator().manual_seed(13)
        vocab, hidden = 40, 8
        weight = torch.randn(48, hidden, generator=gen)
        head = self._lm_head(weight, self._shard(0, vocab, 48))
        hs = torch.randn(11, hidden, generator=gen)
        lp, tok = DFlashWorker._topk_logprobs_from_vocab_parallel_head(
            self._worker_self(), hidden_states=hs, lm_head=head, k=6, chunk_size=4
        )
        ref_lp, ref_tok = torch.log_softmax(hs @ weight[:vocab].T, dim=-1).topk(6, dim=-1)
        assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.equal(tok, ref_tok)

    def worker_topk_method_two_ranks(self):
        """The worker's TP gather path, as rank 0 of 2. SGLang's TP group cannot have two
        ranks on CPU (it opens PyNccl), so the group is a STAND-IN whose all-gather
        appends the other rank's shard results, computed here from its weight shard."""
        torch = self.torch
        from sglang.srt.speculative import dflash_worker
        from sglang.srt.speculative.dflash_worker import _shard_topk_logprobs

        gen = torch.Generator().manual_seed(15)
        hidden, k, chunk = 6, 5, 4
        full = torch.randn(40, hidden, generator=gen)
        shards = [(full[:20], self._shard(0, 20, 20)), (full[20:], self._shard(20, 40, 20))]
        heads = [self._lm_head(w, s) for w, s in shards]
        hs = torch.randn(10, hidden, generator=gen)
        other = []  # rank 1's gathered inputs, in the order rank 0 gathers them
        for start in range(0, hs.shape[0], chunk):
            other += list(_shard_topk_logprobs(hs[start : start + chunk], heads[1], k))

        class TwoRankGroup:
            world_size = 2

            def __init__(self, parts):
                self.parts = iter(parts)

            def all_gather_into_tensor(self, output, inp):
                output.copy_(torch.cat([inp.reshape(-1), next(self.parts).reshape(-1)]))

        saved = dflash_worker.get_tp_group
        dflash_worker.get_tp_group = lambda: TwoRankGroup(other)
        try:
            lp, tok = dflash_worker.DFlashWorker._topk_logprobs_from_vocab_parallel_head(
                self._worker_self(), hidden_states=hs, lm_head=heads[0], k=k,
                chunk_size=chunk,
            )
        finally:
            dflash_worker.get_tp_group = saved
        ref_lp, ref_tok = torch.log_softmax(hs @ full.T, dim=-1).topk(k, dim=-1)
        assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.equal(tok, ref_tok)

    def worker_builds_tree_input(self):
        """Draft step after the draft forward: per-position top-K, batched tree build,
        verify input (tokens, positions) and prepare, as _prepare_for_speculative_decoding
        runs them for DDTREE."""
        torch = self.torch
        from sglang.srt.speculative.dflash_worker import DFlashWorker

        self._single_rank_tp_group()
        gen = torch.Generator().manual_seed(14)
        vocab, hidden, block, budget, cap = 30, 8, 5, 12, 3
        weight = torch.randn(32, hidden, generator=gen)
        head = self._lm_head(weight.to(self.device), self._shard(0, vocab, 32))
        batch = self.batch([6, 9], vocab=vocab)
        draft_hidden = torch.randn(2, block, hidden, generator=gen)
        roots = torch.tensor([3, 17])
        worker = self._worker_self(ddtree_k=min(budget, cap), ddtree_budget=budget,
                                   ddtree_max_per_depth=cap)
        import types

        # A target model without a logits processor: plain log-softmax of the LM head.
        worker.target_worker = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(model=types.SimpleNamespace()))
        vi = DFlashWorker._build_ddtree_verify_input(
            worker, batch, roots.to(self.device), draft_hidden.to(self.device), head
        )
        ref_lp = torch.log_softmax(draft_hidden[:, 1:] @ weight[:vocab].T, dim=-1)
        lp, tok = ref_lp.topk(min(budget, cap), dim=-1)
        ref = self.ddtree_utils.build_ddtree(lp, tok, roots, budget, max_per_depth=cap)
        assert vi.draft_token_num == budget + 1
        assert torch.equal(vi.draft_token.cpu(), ref.tokens.reshape(-1))
        assert torch.equal(vi.layout.parents.cpu(), ref.parents)
        assert vi.draft_token.view(2, -1)[:, 0].tolist() == [3, 17]
        depth = ref.depths.tolist()
        assert vi.positions.tolist() == [p + d for p, row in zip([6, 9], depth) for d in row]
        vi.prepare_for_verify(batch, 1)
        assert batch.out_cache_loc.numel() == 2 * (budget + 1)

    def worker_draft_runner_sized_by_block(self):
        """The patched DFlashWorker.__init__ (tree mode), run to where the draft is loaded:
        the draft runner (TpModelWorker) is built for the DRAFT block, not the target's verify
        width, and the worker's block is the draft block. STAND-INS: the target worker (the
        attributes __init__ reads), the draft TpModelWorker (records its server args and
        returns a draft runner of the real draft config), and _resolve_mask_token_id, where
        the probe stops (a tokenizer follows)."""
        import types

        from sglang.srt.speculative import dflash_worker
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.utils.hf_transformers_utils import get_config

        models = _MODELS
        args = _v1_server_args(ServerArgs, model_path=str(models / "tiny-llama"),
                               speculative_algorithm="DDTREE",
                               speculative_draft_model_path=str(models / "tiny-dflash-draft"),
                               speculative_ddtree_budget=24, speculative_dflash_block_size=8,
                               skip_tokenizer_init=True)
        assert (args.speculative_num_draft_tokens, args.speculative_dflash_block_size) == (25, 8)
        seen = {}

        class DraftWorker:  # STAND-IN for TpModelWorker
            def __init__(self, *, server_args, **kwargs):
                seen["draft_args"] = server_args
                seen["is_draft_worker"] = kwargs.get("is_draft_worker")
                hf = get_config(str(models / "tiny-dflash-draft"), trust_remote_code=False)
                self.model_runner = types.SimpleNamespace(
                    model_config=types.SimpleNamespace(hf_config=hf),
                    model=types.SimpleNamespace(block_size=None))

        class Stop(Exception):
            pass

        def stop(worker, **kwargs):
            seen["block_size"] = worker.block_size
            raise Stop

        target = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(
                spec_algorithm=SpeculativeAlgorithm.from_string("DDTREE"),
                model_config=types.SimpleNamespace(context_len=2048), memory_pool_config=None),
            get_memory_pool=lambda: (None, None), device="cpu")
        dflash_worker.set_global_server_args_for_scheduler(args)  # as the scheduler has it
        saved = (dflash_worker.TpModelWorker, dflash_worker.DFlashWorker._resolve_mask_token_id)
        dflash_worker.TpModelWorker = DraftWorker
        dflash_worker.DFlashWorker._resolve_mask_token_id = stop
        try:
            dflash_worker.DFlashWorker(args, gpu_id=0, tp_rank=0, dp_rank=None, moe_ep_rank=0,
                                       attn_cp_rank=0, moe_dp_rank=0, nccl_port=0,
                                       target_worker=target)
        except Stop:
            pass
        finally:
            dflash_worker.TpModelWorker, dflash_worker.DFlashWorker._resolve_mask_token_id = saved
        assert seen["is_draft_worker"] is True
        assert seen["draft_args"].speculative_num_draft_tokens == 8, (
            "the draft runner is sized by", seen["draft_args"].speculative_num_draft_tokens)
        assert args.speculative_num_draft_tokens == 25  # the target's own args untouched
        assert seen["block_size"] == 8, seen["block_size"]

    def worker_tree_mamba_indices(self):
        """The worker's recurrent-state commit reads tree indices, not commit_len - 1."""
        torch = self.torch
        from sglang.srt.speculative.dflash_worker import DFlashWorker

        seen = {}

        class Backend:  # stand-in for a hybrid attention backend (GPU-only in SGLang)
            def update_mamba_state_after_mtp_verify(self, **kwargs):
                seen.update(kwargs)

        class Worker:  # the method reads only these attributes
            pass

        worker = Worker()
        worker.target_worker = Worker()
        worker.target_worker.model_runner = Worker()
        worker.target_worker.model_runner.attn_backend = Backend()
        worker.target_worker.model_runner.model = None
        batch = Worker()
        batch.mamba_track_indices = None
        path = torch.tensor([[0, 3, 7, -1], [0, -1, -1, -1], [0, 2, 5, 9]])
        commit = torch.tensor([3, 1, 4], dtype=torch.int32)
        DFlashWorker._update_target_mamba_state_after_verify(
            worker, batch=batch, seq_lens_pre_verify=torch.tensor([5, 5, 5]),
            commit_lens=commit, committed_path_nodes=path,
        )
        assert seen["last_correct_step_indices"].tolist() == [7, 0, 9]
        DFlashWorker._update_target_mamba_state_after_verify(
            worker, batch=batch, seq_lens_pre_verify=torch.tensor([5, 5, 5]),
            commit_lens=commit,
        )
        assert seen["last_correct_step_indices"].tolist() == [2, 0, 3], "DFLASH unchanged"
        # Mamba tracking (extra buffer): the committed step that crosses a tracking point
        # is a path position; the state to track is at that path node's tree index.
        worker.server_args = Worker()
        worker.server_args.mamba_track_interval = 4
        batch.mamba_track_indices = torch.tensor([0, 1, 2])
        batch.seq_lens = torch.tensor([8, 6, 9])  # after the commit of 3, 1, 4 tokens
        for nodes, expect in ((path, [7, -1, 5]), (None, [2, -1, 2])):
            DFlashWorker._update_target_mamba_state_after_verify(
                worker, batch=batch, seq_lens_pre_verify=torch.tensor([5, 5, 5]),
                commit_lens=commit, committed_path_nodes=nodes,
            )
            assert seen["mamba_steps_to_track"].tolist() == expect, seen


def _main(args: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    device, strict, cases = "cpu", False, []
    while args:
        arg, args = args[0], args[1:]
        if arg == "--device":
            device, args = args[0], args[1:]
        elif arg == "--strict":
            strict = True
        else:
            cases += {"cpu": CASES, "gpu": GPU_CASES}.get(arg, [arg])
    probe = _Probe(device)
    results = {}
    for case in cases:
        try:
            getattr(probe, case)()
            results[case] = "ok"
        except Exception:
            results[case] = traceback.format_exc()[-3000:]
        print(f"{case}: {'ok' if results[case] == 'ok' else 'FAILED'}", file=sys.stderr)
    print(TAG + json.dumps(results), flush=True)
    return 1 if strict and any(v != "ok" for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
