"""Probe run INSIDE a test host (real SGLang 0.5.23 + the v2 payload) by tests/integration/test_v2_worker.py.

``python v2_worker_probe.py CASE...`` prints one line ``V2PROBE:{json}`` mapping each case to
"ok" or the failure text. Module level is stdlib-only (the test imports it for CASES/TAG).

What is real here: SGLang's ``ScheduleBatch`` of ``Req`` objects, ``ReqToTokenPool``,
``TokenToKVPoolAllocator`` over a real ``MHATokenToKVPool`` (CPU, float64), ``RadixCache`` (disabled, as with --disable-radix-cache),
``KVIndexTranslator``, ``ForwardBatch.init_new``, ``LogitsProcessorOutput``, the runtime
context from a real ``ServerArgs``, and, driven through ``DDTreeWorkerV2.forward_batch_
generation`` (greedy) or ``_ddtree_verify_and_commit`` (sampling), SGLang's ``build_eagle_verify_input``, ``run_eagle_verify`` (``eagle_prepare_for_
verify``, ``eagle_sample``, ``move_accept_tokens_to_target_kvcache``,
``_finalize_accept_tree_path``) and DFlash's draft-KV writer entry point.

NAMED STAND-INS:
- ``sgl_kernel``: the CPU ops on that path, pure torch (tests/v2_kernel_standins.py).
- ``tree_speculative_sampling_target_only`` (no CPU op exists) and ``eagle_utils._is_cpu``
  forced False, for the sampling case only, so EAGLE takes its sampling branch.
- The target: ``TinyTarget``, a 2-layer float64 transformer whose attention reads and writes
  SGLang's real KV pool through ``out_cache_loc`` / ``req_to_token`` and honours the verify's
  custom mask and positions (the CPU stand-in for the target model runner's forward).
- The draft: a perturbed ``TinyTarget`` run along its own greedy chain gives per-depth logits
  (the DFlash draft model needs a checkpoint and a GPU model runner). Greedy: the draft model
  runner stand-in returns hidden states that the target's LM head maps to those logits, and
  the worker's own top-K head reads them. Sampling: their top-K goes through
  ``ddtree_lineage.sharded_topk_logprobs`` over two vocabulary shards (simulated TP).
- The tensor-parallel groups: a one-rank group object (no torch.distributed here).
- ``_append_target_hidden_to_draft_kv_by_loc`` (DFlash's draft-KV writer; its kernels need the
  draft model) is replaced by a recorder of what it is handed: (slot, position, hidden row)
  of the committed rows, which the test compares with sequential decoding.
"""

from __future__ import annotations

from pathlib import Path
import sys
import types

TAG = "V2PROBE:"
CASES = ("greedy_lossless", "overlap_lossless", "page16_lossless", "grammar_lossless",
         "schedule_lossless", "schedule_stale_width_control", "verify_states",
         "offchain_counter",
         "sampling_law", "sampling_control", "no_host_sync", "report", "topk_head")


def committed_of(req):
    """Where the release keeps a request's committed KV length: its KV record (0.5.19+) or
    the request itself (0.5.18, whose ReqKvInfo holds only the allocation; 0.5.14 -
    0.5.15.post1, which have no KV record)."""
    kv = getattr(req, "kv", None)
    return kv if hasattr(kv, "kv_committed_len") else req


def allocated_of(req):
    """Where the release keeps a request's allocated KV length: its KV record (0.5.18+) or the
    request itself (0.5.14 - 0.5.15.post1)."""
    kv = getattr(req, "kv", None)
    return kv if hasattr(kv, "kv_allocated_len") else req


def bonus_of(draft_input):
    """The bonus tokens a DFlash draft input carries (0.5.14 names them ``verified_id``): the
    worker's own seam."""
    from sglang.srt.speculative.ddtree_worker_v2 import _bonus_of

    return _bonus_of(draft_input)


def relay_payload(draft_input):
    """What the scheduler stashes in the FutureMap after a step: ``RelayPayload`` of the draft
    input (0.5.15+); 0.5.14 stashes the draft input itself."""
    try:
        from sglang.srt.managers.overlap_utils import RelayPayload
    except ImportError:
        return draft_input
    return RelayPayload.from_draft_input(draft_input)


def make_draft_input(bonus_tokens, new_seq_lens):
    """DFlash's v2 draft input as the scheduler holds it between steps: DFlash's own
    ``make_draft_input_v2`` (0.5.18+), else the input DFlashWorkerV2 of the release makes after
    a decode step (0.5.14 - 0.5.15.post1; 0.5.14 names the bonus ``verified_id``)."""
    try:
        from sglang.srt.speculative.draft_worker_common import make_draft_input_v2
    except ImportError:
        import inspect

        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        make = DFlashWorkerV2._make_next_draft_input_decode  # (reads nothing of its worker)
        bonus = ("bonus_tokens" if "bonus_tokens" in inspect.signature(make).parameters
                 else "verified_id")
        return make(None, **{bonus: bonus_tokens, "new_seq_lens": new_seq_lens})
    return make_draft_input_v2(bonus_tokens=bonus_tokens, new_seq_lens=new_seq_lens)


# ---------------------------------------------------------------------------------------------
# A tiny float64 target that runs on SGLang's KV pool.


class TinyTarget:
    def __init__(self, torch, vocab=24, hidden=32, heads=2, layers=2, seed=0, max_pos=256,
                 scale=1.0):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        self.torch, self.vocab, self.hidden, self.heads = torch, vocab, hidden, heads
        self.hd = hidden // heads
        self.layers = layers
        self.emb = r(vocab, hidden) * scale
        self.pos = r(max_pos, hidden) * 0.5
        self.w = [
            {
                "q": r(hidden, hidden) / hidden**0.5,
                "k": r(hidden, hidden) / hidden**0.5,
                "v": r(hidden, hidden) / hidden**0.5,
                "o": r(hidden, hidden) / hidden**0.5,
                "up": r(hidden, 2 * hidden) / hidden**0.5,
                "down": r(2 * hidden, hidden) / (2 * hidden) ** 0.5,
            }
            for _ in range(layers)
        ]
        self.head = r(hidden, vocab) * 1.5

    def perturbed(self, scale, seed):
        torch = self.torch
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.__dict__.pop("_prefill_memo", None)
        other.__dict__.pop("_causal_memo", None)
        g = torch.Generator().manual_seed(seed)
        noise = lambda t: t + torch.randn(t.shape, generator=g, dtype=t.dtype) * scale  # noqa
        other.emb, other.head = noise(self.emb), noise(self.head)
        other.w = [{k: noise(v) for k, v in layer.items()} for layer in self.w]
        return other

    # -- plain causal forward (the sequential reference) --------------------------------
    def causal(self, ids):
        """ids list -> (logits [T, V], hidden [T, H]) with full causal attention (memoised:
        the sampling cases ask for the same few sequences thousands of times)."""
        memo = self.__dict__.setdefault("_causal_memo", {})
        key = tuple(int(i) for i in ids)
        if key not in memo:
            memo[key] = self._causal(key)
        return memo[key]

    def _causal(self, ids):
        torch = self.torch
        t = len(ids)
        x = self.emb[torch.tensor(ids)] + self.pos[:t]
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        for layer in self.w:
            x = self._block(layer, x, x, mask)
        return x @ self.head, x

    def _block(self, layer, x_new, x_keys_src, mask, k_pre=None, v_pre=None):
        torch = self.torch
        q = (x_new @ layer["q"]).view(-1, self.heads, self.hd)
        k = (x_keys_src @ layer["k"]).view(-1, self.heads, self.hd)
        v = (x_keys_src @ layer["v"]).view(-1, self.heads, self.hd)
        if k_pre is not None:
            k, v = torch.cat([k_pre, k]), torch.cat([v_pre, v])
        att = torch.einsum("qhd,khd->hqk", q, k) / self.hd**0.5
        att = att.masked_fill(~mask.unsqueeze(0), float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", att, v).reshape(-1, self.hidden)
        x = x_new + out @ layer["o"]
        return x + torch.tanh(x @ layer["up"]) @ layer["down"]

    # -- the same model over SGLang's KV pool ------------------------------------------
    def forward_pool_batch(self, pool, ids, positions, locs, prefixes, mask):
        """``forward_pool`` for a batch of requests in one pass (the verify of a large batch):
        ids / positions / locs [B, m], prefixes: B tensors of prefix slots, mask [B, m, m].
        Returns (logits [B * m, V], hidden [B * m, H])."""
        torch = self.torch
        bs, m = ids.shape
        width = max([len(p) for p in prefixes] + [1])
        prefix = torch.zeros(bs, width, dtype=torch.long)
        seen = torch.zeros(bs, width, dtype=torch.bool)
        for b, slots in enumerate(prefixes):
            prefix[b, :len(slots)] = slots
            seen[b, :len(slots)] = True
        full = torch.cat([seen.unsqueeze(1).expand(bs, m, width), mask], 2)  # [B, m, P + m]
        x = self.emb[ids] + self.pos[positions]  # [B, m, H]
        for li, layer in enumerate(self.w):
            k_new = (x @ layer["k"]).view(bs, m, self.heads, self.hd)
            v_new = (x @ layer["v"]).view(bs, m, self.heads, self.hd)
            pool.k_buffer[li][locs.reshape(-1)] = k_new.reshape(bs * m, self.heads, self.hd)
            pool.v_buffer[li][locs.reshape(-1)] = v_new.reshape(bs * m, self.heads, self.hd)
            q = (x @ layer["q"]).view(bs, m, self.heads, self.hd)
            k = torch.cat([pool.k_buffer[li][prefix], k_new], 1)
            v = torch.cat([pool.v_buffer[li][prefix], v_new], 1)
            att = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.hd**0.5
            att = att.masked_fill(~full.unsqueeze(1), float("-inf")).softmax(-1)
            out = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(bs, m, self.hidden)
            x = x + out @ layer["o"]
            x = x + torch.tanh(x @ layer["up"]) @ layer["down"]
        return (x @ self.head).reshape(bs * m, -1), x.reshape(bs * m, -1)

    def forward_pool(self, pool, ids, positions, locs, prefix_slots, mask):
        """New tokens ids/positions written at KV slots `locs`, attending to the KV at
        `prefix_slots` (all visible) and to each other through mask [m, m] (True = see).
        Returns (logits [m, V], hidden [m, H])."""
        torch = self.torch
        x = self.emb[ids] + self.pos[positions]
        m = len(ids)
        full = torch.cat([torch.ones(m, len(prefix_slots), dtype=torch.bool), mask], 1)
        for li, layer in enumerate(self.w):
            k_new = (x @ layer["k"]).view(-1, self.heads, self.hd)
            v_new = (x @ layer["v"]).view(-1, self.heads, self.hd)
            pool.k_buffer[li][locs] = k_new
            pool.v_buffer[li][locs] = v_new
            q = (x @ layer["q"]).view(-1, self.heads, self.hd)
            k = torch.cat([pool.k_buffer[li][prefix_slots], k_new])
            v = torch.cat([pool.v_buffer[li][prefix_slots], v_new])
            att = torch.einsum("qhd,khd->hqk", q, k) / self.hd**0.5
            att = att.masked_fill(~full.unsqueeze(0), float("-inf")).softmax(-1)
            out = torch.einsum("hqk,khd->qhd", att, v).reshape(-1, self.hidden)
            x = x + out @ layer["o"]
            x = x + torch.tanh(x @ layer["up"]) @ layer["down"]
        return x @ self.head, x


# ---------------------------------------------------------------------------------------------


class Harness:
    # The target's hidden rows handed to the draft vs sequential decoding (float64 end to end;
    # tests/v2_hybrid_probe.py's recurrent kernels compute in float32).
    HIDDEN_ATOL = 1e-9

    def __init__(self):
        import os

        # SGLang's own pure-torch KV move (its Triton copy kernel needs a GPU).
        os.environ["SGLANG_NATIVE_MOVE_KV_CACHE"] = "1"
        import torch

        self.torch = torch
        from sglang.srt.runtime_context import get_context
        from sglang.srt.server_args import ServerArgs

        # (0.5.18 and older resolve at construction, which reads the model's config: the
        # tiny config-only Llama folder; 0.5.19+ read nothing until resolve_once.)
        args = ServerArgs(model_path=str(Path(__file__).resolve().parent / "data" / "models"
                                         / "tiny-llama"), device="cpu")
        if hasattr(get_context(), "set_server_args"):
            get_context().set_server_args(args)
        else:  # 0.5.14 - 0.5.15.post1: processes read the global ServerArgs
            from sglang.srt.server_args import set_global_server_args_for_scheduler

            set_global_server_args_for_scheduler(args)
        from sglang.srt.runtime_context import get_parallel

        # No torch.distributed here: a one-rank group stands in for the TP groups.
        # A CPU answer to a CUDA-only host line: 0.5.19's FutureMap._resolve_spec_extras calls
        # indices.record_stream(...) unguarded (0.5.20+ guard it), which a CPU tensor refuses;
        # a CPU tensor has no stream to record, so recording is a no-op there.
        record = torch.Tensor.record_stream

        def _record_stream(tensor, stream):
            return None if tensor.device.type == "cpu" else record(tensor, stream)

        torch.Tensor.record_stream = _record_stream
        _give_cache_locs_a_cpu_branch()
        _give_eagle_the_cuda_route()
        groups = dict(tp_group=_OneRank(), attn_tp_group=_OneRank())
        if hasattr(type(get_parallel()), "override_permanently"):  # 0.5.20 and later
            get_parallel().override_permanently(**groups)
        elif hasattr(type(get_parallel()), "stamp_derived_widths"):
            # 0.5.19: only the scoped override, held open for the probe's life
            self._parallel_scope = get_parallel().override(**groups)
            self._parallel_scope.__enter__()
            # (0.5.19 reads these widths from a stamp or the live groups: one rank each.)
            get_parallel().stamp_derived_widths(
                moe_ep_size=1, moe_tp_size=1, attn_tp_size=1, attn_dp_size=1, attn_dcp_size=1,
                dcp_enabled=False)
        else:  # 0.5.18 and older: no stamp; the scoped override takes the one-rank widths
            widths = dict(tp_size=1, tp_rank=0, moe_ep_size=1, moe_ep_rank=0, moe_tp_size=1,
                          moe_tp_rank=0, attn_tp_size=1, attn_tp_rank=0, dcp_enabled=False)
            from sglang.srt import runtime_context

            known = getattr(runtime_context, "_PARALLEL_FIELDS", None)
            if known is not None:  # (0.5.14 - 0.5.15.post1 have no DCP field)
                widths = {k: v for k, v in widths.items() if k in known}
            self._parallel_scope = get_parallel().override(**groups, **widths)
            self._parallel_scope.__enter__()

    # -- real SGLang pieces ----------------------------------------------------------------
    def pools(self, target, bs, kv_slots=4096, max_context_len=512, page_size=1):
        torch = self.torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        req_to_token_pool = ReqToTokenPool(
            size=bs + 2, max_context_len=max_context_len, device="cpu", enable_memory_saver=False
        )
        kv = MHATokenToKVPool(
            size=kv_slots, page_size=page_size, dtype=torch.float64, head_num=target.heads,
            head_dim=target.hd, layer_num=target.layers, device="cpu",
            enable_memory_saver=False,
        )
        if page_size == 1:
            allocator = TokenToKVPoolAllocator(
                size=kv_slots, dtype=torch.float64, device="cpu", kvcache=kv, need_sort=False
            )
        else:  # SGLang's paged allocator (its naive CPU path)
            allocator = PagedTokenToKVPoolAllocator(
                size=kv_slots, page_size=page_size, dtype=torch.float64, device="cpu",
                kvcache=kv, need_sort=False,
            )
        return req_to_token_pool, kv, allocator


    def prefill(self, target, kv, alloc, rtp, req, row, prompt, page_size=1):
        """The prompt's KV into the real pool (the target alone, whole pages); returns its
        logits [m, V]. (tests/v2_hybrid_probe.py also writes the recurrent state of the prompt.)"""
        torch = self.torch
        pages = -(-len(prompt) // page_size) * page_size
        slots = alloc.alloc(pages)
        rtp.req_to_token[row, :pages] = slots.to(rtp.req_to_token.dtype)
        if getattr(req, "kv", None) is None and not hasattr(req, "kv_allocated_len"):
            # 0.5.18: allocation creates the KV record (0.5.14 - 0.5.15.post1 have none)
            from sglang.srt.managers.schedule_batch import ReqKvInfo

            req.kv = ReqKvInfo(kv_allocated_len=pages, swa_evicted_seqlen=0)
        committed_of(req).kv_committed_len, allocated_of(req).kv_allocated_len = len(prompt), pages
        used = slots[: len(prompt)].long()
        # A prompt seen before (the sampling cases prefill one prompt many times): its KV
        # copied into the new slots, as computing it again would write.
        memo = target.__dict__.setdefault("_prefill_memo", {})
        if tuple(prompt) in memo:
            lg, rows = memo[tuple(prompt)]
            for li, (k, v) in enumerate(rows):
                kv.k_buffer[li][used], kv.v_buffer[li][used] = k, v
            return lg
        lg, _ = target.forward_pool(
            kv, torch.tensor(prompt), torch.arange(len(prompt)), used,
            torch.zeros(0, dtype=torch.long),
            torch.ones(len(prompt), len(prompt), dtype=torch.bool).tril(),
        )
        memo[tuple(prompt)] = (lg, [(kv.k_buffer[li][used].clone(), kv.v_buffer[li][used].clone())
                                    for li in range(target.layers)])
        return lg

    # -- the worker, built without __init__ (that loads a draft model on a GPU) -------------
    def worker(self, target, budget, topk, block, req_to_token_pool, kv, allocator,
               entries=None):
        from sglang.srt.speculative.ddtree_schedule import Entry
        from sglang.srt.speculative.ddtree_worker_v2 import DDTreeWorkerV2

        try:
            from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        except ImportError:  # 0.5.18: no translator; the draft writes at the cache locations
            translator = None
        else:
            translator = KVIndexTranslator(
                req_to_token=req_to_token_pool.req_to_token,
                token_to_kv_pool_allocator=allocator, token_to_kv_pool=kv,
                page_size=allocator.page_size, device="cpu",
            )
        runner = StandInRunner(target, req_to_token_pool, kv, allocator, translator)
        w = DDTreeWorkerV2.__new__(DDTreeWorkerV2)
        w.device = "cpu"
        w.ddtree_budget = budget
        w.ddtree_topk = topk
        w.ddtree_verify_width = budget + 1
        # The resolved schedule as ddtree_v2_plugin.ddtree_schedule gives it (one entry for a
        # single budget); budget / topk are its largest, as resolution declares them.
        w.ddtree_entries = tuple(entries or (Entry(1, budget, topk),))
        w.model_runner = runner
        w._target_worker = StandInTargetWorker(runner)
        w.draft_model_runner = runner  # _draft_write_ids: the target's ids (shared pool)
        w.draft_kv = {}  # (request row, position) -> (slot, hidden row)
        # Draft side of the decode step (_ddtree_draft): DFlash's block buffers and constants
        # as DFlashWorkerV2.__init__ leaves them, the target's embedding and LM head, and the
        # draft runner stand-in.
        import types

        from sglang.srt.speculative.ddtree_worker_v2 import _draft_block_layout

        runner.model = TargetModelStandIn(target)
        blocks = []
        w.draft_model = types.SimpleNamespace(set_block_size=blocks.append)
        w.draft_parallel_layout = types.SimpleNamespace(tp_group=None)
        w._mask_token_id = 0
        w._noise_embed_scale = 1.0
        w._full_embed_gpu = None
        # As DFlashWorkerV2.__init__ leaves them with speculative_num_draft_tokens = B + 1,
        # then the worker's own fix-up for the draft block.
        w.block_size = budget + 1
        # (DFlash's own helpers where the release has them: the worker's seam.)
        w._block_pos_offsets, w._draft_block_spec_info = _draft_block_layout(budget + 1, "cpu")
        w._ddtree_set_draft_block(block)
        assert blocks == [block] and w.block_size == block
        assert w.speculative_num_draft_tokens == budget + 1
        assert w._block_pos_offsets.tolist() == list(range(block))
        assert w._draft_block_spec_info.draft_token_num == block
        w._init_ddtree_state()
        w.draft_model_runner = DraftRunnerStandIn(translator, target, w)

        def record(*, target_hidden, cache_loc, positions, cache_loc_2d=None, commit_lens=None,
                   extend_lens=None):
            rows = cache_loc_2d.shape[0]
            width = cache_loc_2d.shape[1]
            hid = target_hidden.view(rows, width, -1)
            pos = positions.view(rows, width)
            for b in range(rows):
                for j in range(int(commit_lens[b])):
                    w.draft_kv[(w._rows[b], int(pos[b, j]))] = (
                        int(cache_loc_2d[b, j]), hid[b, j].clone())

        w._append_target_hidden_to_draft_kv_by_loc = record
        return w


class TargetModelStandIn:
    """The target model as the draft step reads it: input embeddings and the LM head."""

    def __init__(self, target):
        import torch

        self.embed = torch.nn.Embedding.from_pretrained(target.emb, freeze=True)
        self.lm_head = torch.nn.Module()
        # float32: the dtypes DFlash treats as a dense (unquantized) head.
        self.lm_head.weight = torch.nn.Parameter(target.head.T.float().contiguous(),
                                                 requires_grad=False)

    def get_input_embeddings(self):
        return self.embed


class DraftRunnerStandIn:
    """Stand-in for the DFlash draft model runner: checks the block forward the worker built
    (a real ForwardBatch: [bonus, MASK...] at prefix + j over the request's window slots) and
    returns hidden states whose product with the target's LM head gives the draft stand-in's
    per-depth logits (draft.causal along its own greedy chain from the request's context),
    so the worker's own top-K head turns them into the tree's candidates."""

    def __init__(self, translator, target, worker):
        import torch

        self.kv_index_translator = translator
        self.worker = worker
        # logits = hidden @ W.T with W = head.T [V, H], H >= V: hidden = logits @ pinv(W.T).
        self.pinv = torch.linalg.pinv(target.head)  # [V, H]
        self.draft = None
        self.contexts = {}  # request row -> its tokens so far (prompt + output)
        self.calls = 0

    def forward(self, fb):
        import types

        import torch

        self.calls += 1
        block = int(self.worker.block_size)
        bs = fb.batch_size
        rtp = self.worker.model_runner.req_to_token_pool
        assert fb.forward_mode.is_target_verify() and fb.input_ids.numel() == bs * block
        hidden = []
        for b in range(bs):
            row, prefix = int(fb.req_pool_indices[b]), int(fb.seq_lens[b])
            ids = fb.input_ids[b * block:(b + 1) * block].tolist()
            ctx = self.contexts[row]
            assert ids == [ctx[-1]] + [self.worker._mask_token_id] * (block - 1), ids
            assert fb.positions[b * block:(b + 1) * block].tolist() == list(
                range(prefix, prefix + block))
            assert torch.equal(fb.out_cache_loc[b * block:(b + 1) * block].long(),
                               rtp.req_to_token[row, prefix:prefix + block].long())
            logits = _draft_marginals(self.draft, ctx, block - 1)  # [L, V]
            hidden.append(torch.cat([torch.zeros(1, self.pinv.shape[1], dtype=logits.dtype),
                                     logits @ self.pinv]))
        # The host planning bound, read as FlashInfer's sync-free planner reads it for this
        # mask-free DFLASH_VERIFY block (fast_prefill_plan: kv_indptr_host = cumsum of
        # seq_lens_cpu) against the device's layout (DFlashVerifyInput.generate_attn_arg_
        # prefill: cumsum of seq_lens + draft_token_num); seq_lens_sum sizes kv_indices.
        assert fb.spec_info.draft_token_num == block, fb.spec_info.draft_token_num
        if _plans_from_lagging_view():
            _check_planning_bound(fb, bs, block)
            out = types.SimpleNamespace(hidden_states=torch.cat(hidden))
            return types.SimpleNamespace(logits_output=out, can_run_graph=False)
        host = torch.cumsum(fb.seq_lens_cpu[:bs].to(torch.int64), 0)
        device = torch.cumsum(fb.seq_lens[:bs].to(torch.int64) + block, 0)
        assert torch.equal(host, device), (
            "the draft's host planning bound disagrees with its KV layout",
            fb.seq_lens_cpu[:bs].tolist(), (fb.seq_lens[:bs] + block).tolist())
        assert fb.seq_lens_sum >= int(device[-1]) - bs * block, fb.seq_lens_sum
        out = types.SimpleNamespace(hidden_states=torch.cat(hidden))
        return types.SimpleNamespace(logits_output=out, can_run_graph=False)


def _plans_from_lagging_view() -> bool:
    """0.5.14: DFlash's draft input carries host planning lengths (``planning_seq_lens_cpu``),
    because its scheduler keeps ``seq_lens_cpu`` as the lagging committed view under overlap;
    0.5.15+ resolve the exact host lengths instead."""
    import dataclasses

    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    return "planning_seq_lens_cpu" in {f.name for f in dataclasses.fields(DFlashDraftInputV2)}


def _check_planning_bound(fb, bs, block):
    """0.5.14's contract for the draft block's host lengths (its DFlash passes the planning
    lengths, committed + speculative_num_draft_tokens, which for DDTREE is the verify width):
    a bound on each device prefix (the host lags by at most one step's commit, at most one
    block), never more than that width over it, and a sum that sizes the KV indices
    (DFlashVerifyInput.generate_attn_arg_prefill: seq_lens_sum + block * bs entries)."""
    from sglang.srt.server_args import get_global_server_args

    width = int(get_global_server_args().speculative_num_draft_tokens)
    host = fb.seq_lens_cpu[:bs].to(fb.seq_lens.dtype).tolist()
    prefix = fb.seq_lens[:bs].tolist()
    assert all(p <= h <= p + width for h, p in zip(host, prefix)), (
        "the draft's host planning bound is not 0.5.14's planning bound", host, prefix, width)
    assert fb.seq_lens_sum == sum(host) and fb.seq_lens_sum >= sum(prefix), (
        fb.seq_lens_sum, host, prefix)


def _draft_marginals(draft, ctx, depth):
    import torch

    memo = draft.__dict__.setdefault("_memo", {})
    key = (tuple(ctx), depth)
    if key not in memo:
        ids, per_depth = list(ctx), []
        for _ in range(depth):
            lg, _ = draft.causal(ids)
            per_depth.append(lg[-1])
            ids.append(int(lg[-1].argmax()))
        memo[key] = torch.stack(per_depth)
    return memo[key]


class StandInRunner:
    """The target ModelRunner's attributes that ForwardBatch.init_new and EAGLE's verify
    read (stand-in: no model loading on CPU); the pools and translator are real."""

    def __init__(self, target, req_to_token_pool, kv, allocator, translator):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.target = target
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = kv
        self.token_to_kv_pool_allocator = allocator
        self.kv_index_translator = translator
        self.device = "cpu"
        self.is_draft_worker = False
        self.spec_algorithm = SpeculativeAlgorithm.EAGLE
        self.model_config = _ModelConfig(target.vocab)
        self.lora_manager = None
        # (0.5.18's ForwardBatch.init_new reads the runner's ServerArgs: the probe's own, as
        # published to the runtime context; 0.5.19+ read the context themselves.)
        from sglang.srt import runtime_context

        self.server_args = (runtime_context.get_server_args()
                            if hasattr(runtime_context, "get_server_args")
                            else _global_server_args())
        self.decode_cuda_graph_runner = None
        self.attn_backend = _AttnBackend()
        self.watermark_state = None
        self.prefill_attention_backend_str = "torch_native"
        self.ngram_embedding_manager = _Disabled()
        # (0.5.14 - 0.5.15.post1's ForwardBatch.init_new reads these from the runner itself.)
        self.use_ngram_embedding = False
        self.model_is_mrope = False
        self.dcp_size, self.dcp_rank = 1, 0
        self.mambaish_config = None  # (and the recurrent commit: a pure-attention target)
        # (0.5.19's ForwardBatch.init_new asks the runner's ParallelState: one rank, no DCP.)
        self.ps = types.SimpleNamespace(attn_dcp_size=1, attn_dcp_rank=0)


def _give_cache_locs_a_cpu_branch():
    """0.5.14 - 0.5.15.post1's ``assign_extend_cache_locs_func`` has no CPU branch (off a GPU it
    returns None); 0.5.16+ have one, over sgl_kernel's ``assign_extend_cache_locs_cpu``. STAND-IN:
    that later branch, over the same kernel stand-in (tests/v2_kernel_standins.py), given to
    the function where the release lacks it (the DFlash worker module's reference, the one the
    DDTree worker calls)."""
    import torch
    from sglang.srt.speculative import dflash_worker_v2 as dfw

    original = dfw.assign_extend_cache_locs_func
    probe = original(req_pool_indices=torch.zeros(1, dtype=torch.int64),
                     req_to_token=torch.arange(4, dtype=torch.int32).view(1, 4),
                     start_offset=torch.zeros(1, dtype=torch.int64),
                     end_offset=torch.ones(1, dtype=torch.int64), batch_size=1,
                     draft_token_num=1, device="cpu")
    if probe is not None:
        return

    def with_cpu_branch(req_pool_indices, req_to_token, start_offset, end_offset, batch_size,
                        draft_token_num, device):
        from sgl_kernel import assign_extend_cache_locs_cpu

        out = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
        assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                     out, req_to_token.shape[1])
        return out

    # Every module holding the original (DFlash's worker imports it at its top, EAGLE's verify
    # preparation at its call), its defining module included.
    import sys

    for module in list(sys.modules.values()):
        if getattr(module, "assign_extend_cache_locs_func", None) is original:
            module.assign_extend_cache_locs_func = with_cpu_branch


def _give_eagle_the_cuda_route():
    """0.5.14 - 0.5.15.post1's EAGLE has no CPU route at all (``eagle_utils`` builds the tree and
    walks it with sgl_kernel's compiled CUDA ops, Triton on XPU; 0.5.16+ add a CPU route over
    sgl_kernel's ``*_cpu`` ops). STAND-IN: the module takes its CUDA route, whose two compiled ops
    are the kernel stand-ins held to the CUDA sources (tests/v2_kernel_standins.py:
    ``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``); nothing else in the
    module changes. Releases with a CPU route are left as they are."""
    from sglang.srt.speculative import eagle_utils

    if hasattr(eagle_utils, "_is_cpu"):
        return
    import sgl_kernel

    eagle_utils._is_cuda = True
    eagle_utils.sgl_build_tree_kernel_efficient = sgl_kernel.build_tree_kernel_efficient_cpu
    sgl_kernel.verify_tree_greedy = sgl_kernel.verify_tree_greedy_cpu


def _global_server_args():
    from sglang.srt.server_args import get_global_server_args

    return get_global_server_args()


class _Disabled:
    enabled = False


class _ModelConfig:
    """Stand-in model config: the few fields set below; any other flag reads as unset
    (None), i.e. a plain text-only decoder."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def __init__(self, vocab):
        from transformers import LlamaConfig

        self.vocab_size = vocab
        self.hf_config = LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64)
        self.model_is_mrope = False
        self.is_multimodal = False
        self.is_encoder_decoder = False


class _AttnBackend:
    verify_mask = None  # EAGLE allocates its own tree mask
    max_context_len = 512  # (the pools' max_context_len: sizes an unallocated full mask)

    def get_verify_buffers_to_fill_after_draft(self):
        # 0.5.14 - 0.5.15.post1's spelling of verify_mask: no preallocated mask or positions.
        return None, None

    def update_verify_buffers_to_fill_after_draft(self, *a, **k):
        pass


class _Out:
    def __init__(self, logits_output):
        self.logits_output = logits_output
        self.can_run_cuda_graph = False
        self.routed_experts_output = None
        self.indexer_topk_output = None


class StandInTargetWorker:
    """The target's verify forward: TinyTarget over the real KV pool, honouring the verify
    input's custom mask (QLEN_ONLY or FULL_MASK layout) and positions."""

    def __init__(self, runner):
        self.model_runner = runner
        self.calls = 0

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kw):
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.speculative import eagle_utils
        from sglang.srt.speculative.eagle_utils import TreeMaskMode

        fb = forward_batch
        assert is_verify and fb.forward_mode.is_target_verify()
        self.calls += 1
        r = self.model_runner
        spec = fb.spec_info
        n = spec.draft_token_num
        bs = fb.batch_size
        seq = fb.seq_lens.tolist()
        mask = spec.custom_mask
        # (0.5.14 - 0.5.15.post1 have no default: EAGLE builds the full mask there.)
        mode = getattr(eagle_utils, "default_tree_mask_mode", lambda: TreeMaskMode.FULL_MASK)()
        qlen_only = mode == TreeMaskMode.QLEN_ONLY
        if _plans_from_lagging_view():
            # 0.5.14: the verify's host lengths bound each device prefix (EAGLE plans the
            # target forward from them; the lagging committed view would under-estimate).
            host = fb.seq_lens_cpu[:bs].tolist()
            assert all(h >= s for h, s in zip(host, seq)), (
                "the verify's host lengths under-estimate the device prefix", host, seq)
        masks, prefixes, off = [], [], 0
        for b in range(bs):
            row = int(fb.req_pool_indices[b])
            s = int(seq[b])
            # The verify writes KV for positions s .. s + n - 1 of the request: every one must
            # lie in the slots the allocator reserved for it (prepare_for_decode), or the step
            # writes into slots that are not the request's (slot 0, another request's).
            reserved = r.reserved(row) if callable(getattr(r, "reserved", None)) else None
            assert reserved is None or s + n <= reserved, (
                f"the verify writes KV past the slots reserved for request row {row}: positions "
                f"{s}..{s + n - 1} at width {n}, {reserved} reserved")
            if qlen_only:
                m = mask[b * n * n:(b + 1) * n * n].view(n, n)
            else:
                full = mask[off:off + n * (s + n)].view(n, s + n)
                assert bool(full[:, :s].all())
                m = full[:, s:]
                off += n * (s + n)
            masks.append(m.bool())
            prefixes.append(r.req_to_token_pool.req_to_token[row, :s].long())
        # One pass over the batch (TinyTarget's per-request forward, batched: the sampling
        # cases verify thousands of requests at once).
        logits, hidden = r.target.forward_pool_batch(
            r.token_to_kv_pool, fb.input_ids[: bs * n].long().view(bs, n),
            fb.positions[: bs * n].long().view(bs, n), fb.out_cache_loc[: bs * n].long().view(bs, n),
            prefixes, torch.stack(masks))
        # float32 logits, as SGLang's LogitsProcessor hands them to the verify (the CUDA
        # sampling kernel's host check takes nothing else); hidden states stay float64.
        out = LogitsProcessorOutput(next_token_logits=logits.float(), hidden_states=hidden)
        return _Out(out)


# ---------------------------------------------------------------------------------------------
# The decode loop: real batch/allocator/cache objects, the worker's verify + accept + commit.


def _greedy_argmax(logits):
    return int(logits.argmax())


def draft_topk(h, draft, contexts, depth, k, shards=2):
    """Per-depth top-K log-probs [bs, L, K] and tokens from the draft stand-in, through
    ddtree_lineage.sharded_topk_logprobs over `shards` vocabulary shards (simulated TP)."""
    torch = h.torch
    from sglang.srt.speculative.ddtree_lineage import sharded_topk_logprobs

    rows = [_draft_marginals(draft, ctx, depth) for ctx in contexts]
    logits = torch.stack(rows)  # [bs, L, V]
    bs, L, V = logits.shape
    flat = logits.reshape(bs * L, V)
    bounds = [V * i // shards for i in range(shards + 1)]
    locals_ = [flat[:, bounds[i]:bounds[i + 1]] for i in range(shards)]
    per_rank = [sharded_topk_logprobs(x, k, vocab_start=bounds[i]) for i, x in enumerate(locals_)]
    # all_gather stand-in: rank r's local result is the r-th shard's (same computation).
    state = {"i": 0}

    def gather(x):
        # Called three times (values, ids, lse) on rank 0; rebuild each from every shard.
        which = state["i"] % 3
        state["i"] += 1
        outs = []
        for i, loc in enumerate(locals_):
            kk = min(k, loc.shape[1])
            v, ids_ = torch.topk(loc.float(), kk, dim=-1)
            outs.append((v, ids_.long() + bounds[i], torch.logsumexp(loc.float(), -1, keepdim=True))[which])
        return torch.stack(outs)

    lp, tok = sharded_topk_logprobs(locals_[0], k, vocab_start=0, all_gather=gather)
    # Exact against the unsharded top-K of the full vocabulary.
    ref_v, ref_i = torch.topk(torch.log_softmax(flat.float(), -1), min(k, V), dim=-1)
    assert torch.allclose(lp, ref_v, atol=1e-5) and torch.equal(tok, ref_i), (
        "sharded top-K", (lp - ref_v).abs().max(), tok[tok != ref_i], ref_i[tok != ref_i])
    del per_rank
    return lp.view(bs, L, -1), tok.view(bs, L, -1)


class Run:
    """One decode run's state: the real pools, cache, worker and requests, plus what the
    harness knows for checking (each request's committed tokens on the device side, the
    per-step records)."""


def run_decode(h, target, draft, prompts, max_new, budget, topk, block, sampling=None,
               seed=0, check=True, first_token=None, kv_slots=4096, via_forward=False,
               overlap=False, page_size=1, grammar=False, schedule=None, joins=None,
               worker_hook=None):
    """Decode ``prompts`` to ``max_new`` tokens each with the DDTree worker over SGLang's real
    batch/pool/allocator/cache objects, the way the scheduler drives a spec-v2 worker:

    - ``overlap=False``: the synchronous schedule (the scheduler's non-overlap branch): each
      step's result is processed before the next step is prepared;
    - ``overlap=True``: the overlap schedule (Scheduler.run_batch with enable_overlap): step
      k is prepared (prepare_for_decode's KV over-allocation) from the HOST's committed
      lengths, which lag one step because step k-1's result is processed only after step k
      launched; at launch the real FutureMap resolves the true lengths (published by step
      k-1 through ``on_publish``) and the bonus tokens (stashed from step k-1's
      next_draft_input) into the batch; a request that finished at step k-1 still runs in
      step k, as on a server. The draft input's own bonus tokens and lengths are POISONED
      (-1) before the resolve, so only what the relay carried can be used.

    ``schedule`` (``--speculative-ddtree-budget-schedule`` text): the worker runs the
    schedule's entries (``budget`` / ``topk`` are then its largest, as resolution declares),
    the spec bag carries it as resolution leaves it, so prepare_for_decode reserves each
    batch's entry; every step checks that the worker verified the entry of the batch it ran
    (``ddtree_schedule.pick``, the oracle). ``joins`` ({request index: step}): a request joins
    the running batch at that step (the others from the start), so the batch grows as well as
    shrinks. ``worker_hook(w)`` may change the worker (the negative control).

    Every step checks the accepted depth of every request against a reference walk of the
    step's tree with plain sequential greedy decoding (``check``), and the window the step
    writes against the KV the allocator reserved; the run checks the off-chain counter
    against the steps whose accepted paths left the first-ranked chain, and that every KV
    slot and request row is free at the end."""
    torch = h.torch
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_override, runtime_settings

    from sglang.srt.speculative import ddtree_schedule as sched

    r = Run()
    r.h, r.target, r.draft, r.prompts, r.max_new = h, target, draft, prompts, max_new
    r.entries = (sched.resolve(sched.parse(schedule), block) if schedule is not None
                 else (sched.Entry(1, budget, topk),))
    if schedule is not None:
        budget = max(e.budget for e in r.entries)
        topk = max(e.topk for e in r.entries)
    r.budget, r.topk, r.block, r.sampling, r.check = budget, topk, block, sampling, check
    r.overlap, r.grammar = overlap, grammar
    r.joins = dict(joins or {})
    r.widths = []  # (batch size, the verify width the worker ran) per step
    bs = len(prompts)
    r.rtp, r.kv, r.alloc = h.pools(target, bs, kv_slots=kv_slots, page_size=page_size)
    free_slots0, free_rows0 = r.alloc.available_size(), r.rtp.available_size()
    r.cache = RadixCache(CacheInitParams(
        disable=True, req_to_token_pool=r.rtp, token_to_kv_pool_allocator=r.alloc,
        page_size=page_size))
    w = r.w = h.worker(target, budget, topk, block, r.rtp, r.kv, r.alloc, entries=r.entries)
    if worker_hook is not None:
        worker_hook(w)
    w.draft_model_runner.draft = draft
    w.via_forward = via_forward
    _record_steps(r)
    r.reqs = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=max_new[i], **(sampling or {"temperature": 0.0}))
        params.normalize(None)
        params.verify(target.vocab)
        req = Req(f"r{i}", "", list(prompt), params, vocab_size=target.vocab)
        if grammar:
            req.grammar = ParityGrammar(prompt[-1], target.vocab)
        r.reqs.append(req)
    r.rows = r.rtp.alloc(r.reqs)
    by_row = dict(zip(r.rows, r.reqs))
    # What the allocator reserved for each request row (the target stand-in's window check).
    w._target_worker.model_runner.reserved = lambda row: allocated_of(by_row[row]).kv_allocated_len
    r.gen = torch.Generator().manual_seed(seed)
    # Prefill (DFlashWorkerV2's own path on a server; here the target alone): prompt KV into
    # the real pool (whole pages), the first token, the prompt's hidden rows for the draft.
    r.truth = {}  # request index -> tokens committed on the device side (prompt + output)
    for i, (req, row, prompt) in enumerate(zip(r.reqs, r.rows, prompts)):
        lg = h.prefill(target, r.kv, r.alloc, r.rtp, req, row, prompt, page_size)
        last = req.grammar.masked(lg[-1:])[0] if grammar else lg[-1]
        first = _pick(last, sampling, r.gen) if first_token is None else first_token
        if grammar:
            req.grammar.accept_token(first)
        req.output_ids.append(first)
        r.truth[i] = list(prompt) + [first]
    r.steps, r.accepts = 0, []
    # What the scheduler's spec bag holds once the plugin resolved DDTREE (budget B, verify
    # width B + 1, the draft block, per-depth K): prepare_for_decode (the family's 0005 hunk)
    # and release_kv_cache read it.
    settings = runtime_settings("spec")
    # Where that is the process's ServerArgs (0.5.16 and older), release_kv_cache reads the
    # page size from it too (0.5.17+ ask the allocator): a server's equals its pool's.
    paged = {"page_size": page_size} if hasattr(settings, "page_size") else {}
    with runtime_override(
        settings, speculative_algorithm="DDTREE", speculative_ddtree_budget=budget,
        speculative_num_draft_tokens=budget + 1, speculative_dflash_block_size=block,
        speculative_eagle_topk=topk, speculative_ddtree_topk=topk,
        speculative_ddtree_budget_schedule=(None if schedule is None
                                            else sched.format_schedule(r.entries)),
        **paged,
    ):
        (_overlap_loop if overlap else _sync_loop)(r)
    assert r.alloc.available_size() == free_slots0, (r.alloc.available_size(), free_slots0)
    assert r.rtp.available_size() == free_rows0
    # The off-chain counter, exactly: the steps in which some request's accepted path holds
    # a node that is not its parent's first child (recomputed from the accepted paths).
    assert int(w._ddtree_offchain) == r.offchain_steps, (int(w._ddtree_offchain), r.offchain_steps)
    assert int(w._ddtree_steps) == r.steps
    w.probe_widths = r.widths  # (the requests of each step, the width it verified)
    return r.reqs, r.steps, r.accepts, w


def _record_steps(r):
    """Keep each step's tree and EAGLE's accept_index (wrappers that only record)."""
    try:
        from sglang.srt.speculative import eagle_worker_common as ewc
    except ImportError:  # 0.5.14 - 0.5.15.post1: EAGLEWorkerV2.verify through the worker's seam
        from sglang.srt.speculative import ddtree_worker_v2 as verify_home
        from sglang.srt.speculative import eagle_worker_v2 as sample_home

        verify_name = "_eagle_verify"
    else:
        verify_home = sample_home = ewc
        verify_name = "run_eagle_verify"
    w, r.trees, r.verifies, r.offchain_steps = r.w, [], [], 0
    build, verify = w._ddtree_build, getattr(verify_home, verify_name)

    def recording_build(*a, **k):
        out = build(*a, **k)
        r.trees.append(out)
        return out

    sample, sampled = sample_home.eagle_sample, []

    def recording_sample(*a, **k):  # 0.5.19's run_eagle_verify returns no accept_index
        out = sample(*a, **k)
        sampled.append(out[2])
        return out

    # (wraps: the worker asks the release's own run_eagle_verify which arguments it takes.)
    @__import__("functools").wraps(verify)
    def recording_verify(*a, **k):
        sampled.clear()
        out = verify(*a, **k)
        if getattr(out, "accept_index", None) is None:
            out.accept_index = sampled[-1]
        r.verifies.append(out)
        return out

    w._ddtree_build = recording_build
    setattr(verify_home, verify_name, recording_verify)
    sample_home.eagle_sample = recording_sample

    def restore():
        setattr(verify_home, verify_name, verify)
        sample_home.eagle_sample = sample

    r.restore = restore


def _new_batch(r, active, seq_lens):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    torch = r.h.torch
    areqs = [r.reqs[i] for i in active]
    batch = ScheduleBatch(
        reqs=areqs, req_to_token_pool=r.rtp, token_to_kv_pool_allocator=r.alloc,
        tree_cache=r.cache, forward_mode=ForwardMode.DECODE, device="cpu",
        spec_algorithm=SpeculativeAlgorithm.from_string("DDTREE"),
    )
    batch.model_config = r.w.model_runner.model_config
    batch.req_pool_indices = torch.tensor([r.rows[i] for i in active], dtype=torch.int64)
    batch.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
    batch.seq_lens_cpu = batch.seq_lens.clone()
    batch.seq_lens_sum = int(batch.seq_lens.sum())
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, r.target.vocab)
    batch.has_grammar = r.grammar
    batch.can_run_decode_cuda_graph = False
    return batch


def _prepare(r, batch, draft_input, active, lag):
    """prepare_for_decode (the family's 0005: block + max(B + 1, block) past the committed
    length the host sees), and the step's window within what it reserved: ``lag`` = each
    request's tokens committed on the device but not yet on the host."""
    from sglang.srt.speculative import ddtree_schedule as sched

    draft_input.prepare_for_decode(batch)
    # The entry of this batch (the oracle: the schedule applied to the batch that will run).
    width = r.entries[sched.pick(r.entries, len(active))].width
    reserve = r.block + max(width, r.block)
    areqs = [r.reqs[i] for i in active]
    ahead = [allocated_of(q).kv_allocated_len - committed_of(q).kv_committed_len for q in areqs]
    # The reserve past the host's committed length, rounded up to whole pages: never short of
    # the step's need, never more than the widest entry's (one budget: exactly the reserve),
    # never DFlash's 2 x (B + 1). (An allocation never shrinks: a request that ran a wider
    # entry before keeps what it had.)
    page = r.alloc.page_size
    widest = r.block + max(r.budget + 1, r.block)
    assert all(reserve <= a < widest + page for a in ahead), (ahead, reserve, widest, page)
    for q, i in zip(areqs, active):
        true_len = committed_of(q).kv_committed_len + lag.get(i, 0)
        assert true_len + max(width, r.block) <= allocated_of(q).kv_allocated_len, (
            "the step writes past the reserved KV", true_len, allocated_of(q).kv_allocated_len)
    batch.spec_info = draft_input


def _forward(r, batch, draft_input, active, **kw):
    w = r.w
    contexts = [list(r.truth[i]) for i in active]
    w._rows = [r.rows[i] for i in active]
    if w.via_forward:
        # The worker's whole decode step: DFlash block -> top-K head -> tree -> verify.
        for i, ctx in zip(active, contexts):
            w.draft_model_runner.contexts[r.rows[i]] = ctx
        res = w.forward_batch_generation(batch, **kw)
    else:
        logprobs, tokens = draft_topk(r.h, r.draft, contexts, r.block - 1, r.topk)
        window = w_window(r.h, w, batch, r.block)
        res = w._ddtree_verify_and_commit(batch, draft_input, logprobs, tokens, window,
                                          kw.get("on_publish"))
    r.steps += 1
    # EAGLE's verify rebinds the batch it is handed: the scheduler's own batch stays as it was.
    assert batch.forward_mode.is_decode() and batch.spec_info is draft_input
    _check_step(r, res, active, contexts, batch)
    return res


def _check_step(r, res, active, contexts, batch):
    """The step's accepted depth against a reference walk of its own tree with plain greedy
    decoding; the off-chain steps from the accepted paths; the harness's device-side truth."""
    from sglang.srt.speculative import ddtree_utils as du

    from sglang.srt.speculative import ddtree_schedule as sched

    torch = r.h.torch
    entry = r.entries[sched.pick(r.entries, len(active))]
    n = res.speculative_num_draft_tokens  # the scheduler reads next_token_ids by it
    r.widths.append((tuple(active), n))
    layout = r.trees[-1][0]
    verify = r.verifies[-1]
    acc = res.accept_lens.tolist()
    assert acc == (verify.accept_lens).tolist()
    assert n == entry.width and layout.tokens.shape[1] == n, (
        f"step {r.steps}: batch of {len(active)} verified at width {n}, its schedule entry "
        f"{entry.text()} is width {entry.width}")
    assert torch.equal(res.new_seq_lens, batch.seq_lens + res.accept_lens.to(batch.seq_lens.dtype))
    if bool(du.offchain_accepted(layout, verify.accept_index.long()).any()):
        r.offchain_steps += 1
    out = res.next_token_ids.view(len(active), n)
    for j, i in enumerate(active):
        if r.check and r.sampling is None:
            want = _reference_walk(r, layout, j, contexts[j], r.reqs[i])
            assert acc[j] == want, (f"step {r.steps}, request {i}: accepted {acc[j]} "
                                    f"!= the reference walk's {want}")
        r.truth[i].extend(out[j, : acc[j]].tolist())


def _reference_walk(r, layout, j, ctx, req):
    """Committed tokens (root + accepted) of request j's tree under greedy decoding, by walking
    the tree with the target's sequential argmax (grammar-masked for a constrained request)."""
    parents, tokens = layout.parents[j].tolist(), layout.tokens[j].tolist()
    node, path = 0, []
    grammar = req.grammar.fork() if r.grammar else None
    while True:
        logits, _ = r.target.causal(ctx + path)
        last = logits[-1:]
        if grammar is not None:
            last = grammar.masked(last)
        want = int(last[0].argmax())
        kids = [c for c in range(len(tokens)) if parents[c] == node and tokens[c] == want]
        if not kids:
            return len(path) + 1
        node = kids[0]
        path.append(want)
        if grammar is not None:
            grammar.accept_token(want)


def _commit(r, i, new):
    """The scheduler's side of one request's result: commit, emit, finish mid-path when
    max_new is reached; True when it finished."""
    from sglang.srt.mem_cache.common import release_kv_cache

    req, prompt = r.reqs[i], r.prompts[i]
    r.accepts.append(len(new) - 1)
    committed_of(req).kv_committed_len += len(new)
    req.output_ids.extend(new)
    if r.grammar and not r.overlap:
        for t in new:  # the synchronous scheduler advances the FSM after the step
            req.grammar.accept_token(t)
    if len(req.output_ids) < r.max_new[i]:
        return False
    # Finished mid-path when the step accepted more than were still wanted.
    r.w.__dict__.setdefault("cut", []).append(len(req.output_ids) - r.max_new[i])
    del req.output_ids[r.max_new[i]:]
    if r.check:
        _check_request(r.h, r.target, r.w, r.kv, r.rtp, r.rows[i], prompt, req, r.sampling,
                       grammar=r.grammar)
    owner = committed_of(req)
    owner.kv_committed_len = min(owner.kv_committed_len, len(prompt) + len(req.output_ids))
    import inspect

    if "checkpoint" in inspect.signature(release_kv_cache).parameters:  # 0.5.20+
        release_kv_cache(req, r.cache, checkpoint=False)
    else:  # 0.5.19: the same release, spelled is_insert
        release_kv_cache(req, r.cache, is_insert=False)
    return True


def _sync_loop(r):
    """The synchronous schedule: prepare, forward, process, in order."""
    torch = r.h.torch

    active = list(range(len(r.reqs)))
    try:
        while active:
            committed = [committed_of(r.reqs[i]).kv_committed_len for i in active]
            batch = _new_batch(r, active, committed)
            draft_input = make_draft_input(
                bonus_tokens=torch.tensor([r.reqs[i].output_ids[-1] for i in active]),
                new_seq_lens=torch.tensor(committed))
            _prepare(r, batch, draft_input, active, lag={})
            res = _forward(r, batch, draft_input, active)
            out = res.next_token_ids.view(len(active), res.speculative_num_draft_tokens)
            acc = res.accept_lens.tolist()
            still = []
            for j, i in enumerate(active):
                new = out[j, : acc[j]].tolist()
                assert int(bonus_of(res.next_draft_input)[j]) == new[-1]
                if not _commit(r, i, new):
                    still.append(i)
            active = still
    finally:
        r.restore()


def _overlap_loop(r):
    """The overlap schedule (see run_decode): the real FutureMap, publish / stash / resolve,
    host lengths one step behind, results processed one step late."""
    from functools import partial

    torch = r.h.torch
    from sglang.srt.managers.overlap_utils import FutureMap, resolve_forward_inputs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    fm = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.from_string("DDTREE"), r.rtp,
                   needs_cpu_seq_lens=True)
    everyone = torch.tensor(r.rows, dtype=torch.int64)
    # The prefill step's relay: its committed lengths and first tokens.
    fm.publish(everyone, torch.tensor([committed_of(q).kv_committed_len for q in r.reqs]))
    fm.stash(everyone, relay_payload(make_draft_input(
        torch.tensor([q.output_ids[-1] for q in r.reqs]),
        torch.tensor([committed_of(q).kv_committed_len for q in r.reqs]))))
    # As the host knows it (results processed so far); joiners enter at their step.
    active = [i for i in range(len(r.reqs)) if i not in r.joins]
    finished = set()
    pending = None  # (requests, result) of the step launched but not yet processed
    lag = {}
    stale = extra = 0  # steps launched on stale host lengths; steps run for finished requests
    launches = 0
    try:
        while active or pending is not None or any(at >= launches for at in r.joins.values()):
            active += [i for i, at in sorted(r.joins.items()) if at == launches]
            launches += 1
            launched = None
            if active:
                host = [committed_of(r.reqs[i]).kv_committed_len for i in active]
                batch = _new_batch(r, active, host)  # the host's (stale) lengths
                draft_input = make_draft_input(
                    bonus_tokens=torch.full((len(active),), -1),  # POISON: the relay fills it
                    new_seq_lens=torch.full((len(active),), -1))
                draft_input.future_indices = batch.req_pool_indices.clone()
                if hasattr(draft_input, "direct_carry_valid"):
                    # 0.5.14: the scheduler also carries DFlash's last draft input straight
                    # over while the batch is unchanged; this run relays through the FutureMap,
                    # the path 0.5.14 takes once a batch was filtered or merged.
                    draft_input.direct_carry_valid = False
                _prepare(r, batch, draft_input, active, lag)
                batch.enable_overlap = True
                # Scheduler.run_batch: resolve what step k-1 published and stashed.
                fm.resolve_seq_lens_cpu(batch)
                resolve_forward_inputs(batch, fm)
                truth_lens = [len(r.truth[i]) - 1 for i in active]  # minus the bonus token
                assert batch.seq_lens.tolist() == truth_lens, (batch.seq_lens.tolist(), truth_lens)
                stale += host != truth_lens
                assert bonus_of(batch.spec_info).tolist() == [r.truth[i][-1] for i in active]
                future_indices = batch.req_pool_indices
                kw = {"on_publish": partial(fm.publish, future_indices)}
                if r.grammar and _scheduler_hands_grammar_barrier():
                    kw["grammar_barrier"] = partial(_advance_grammar, r, pending)
                elif r.grammar:
                    # 0.5.16 and older hand no barrier: their scheduler turns overlap off
                    # for a constrained spec decode batch (need_grammar_sync) and processes
                    # the previous result first, so its tokens reach the FSM before this
                    # verify builds its mask. (The lengths here still lag: the relay path.)
                    _advance_grammar(r, pending)
                res = _forward(r, batch, draft_input, active, **kw)
                fm.stash(future_indices, relay_payload(res.next_draft_input))
                launched = (list(active), res)
            if pending is not None:  # step k-1's result, processed after step k launched
                done, res_prev = pending
                if r.grammar:
                    _advance_grammar(r, pending)  # (a no-op when the barrier already ran)
                out = res_prev.next_token_ids.view(len(done), res_prev.speculative_num_draft_tokens)
                acc = res_prev.accept_lens.tolist()
                for j, i in enumerate(done):
                    lag[i] = lag.get(i, 0) - acc[j]
                    if i in finished:
                        extra += 1
                        continue  # the extra overlap step of a request already done
                    if _commit(r, i, out[j, : acc[j]].tolist()):
                        finished.add(i)
            if launched is not None:
                for j, i in enumerate(launched[0]):
                    lag[i] = lag.get(i, 0) + int(launched[1].accept_lens[j])
            pending = launched
            active = [i for i in active if i not in finished]
    finally:
        r.restore()
    # Not vacuous: the host really lagged, and finished requests really ran one step more.
    assert stale > 0 and extra > 0, (stale, extra)


def _scheduler_hands_grammar_barrier() -> bool:
    """Whether this release's scheduler hands a spec worker the grammar barrier: 0.5.17+ ask
    the algorithm (``supports_grammar_overlap``)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return hasattr(SpeculativeAlgorithm, "supports_grammar_overlap")


def _advance_grammar(r, pending):
    """The scheduler's grammar barrier under overlap: feed the previous step's committed
    tokens to each constrained request's FSM, once."""
    if pending is None or getattr(pending[1], "_grammar_done", False):
        return
    done, res = pending
    out = res.next_token_ids.view(len(done), res.speculative_num_draft_tokens)
    for j, i in enumerate(done):
        for t in out[j, : int(res.accept_lens[j])].tolist():
            r.reqs[i].grammar.accept_token(t)
    res._grammar_done = True


class ParityGrammar:
    """STAND-IN grammar object (BaseGrammarObject's interface, xgrammar's packed int32
    bitmask): after token t the next token must have the other parity (t + next odd).
    Its FSM is the last accepted token; rollback pops."""

    def __init__(self, last, vocab):
        self.stack, self.vocab = [int(last)], vocab
        self.finished, self.grammar_stats, self.current_token = False, None, None

    def fork(self):
        other = ParityGrammar(0, self.vocab)
        other.stack = list(self.stack)
        return other

    def allowed(self, token):
        return (token + self.stack[-1]) % 2 == 1

    def accept_token(self, token):
        assert self.allowed(int(token)), ("the grammar refuses", token, self.stack[-1])
        self.stack.append(int(token))

    def rollback(self, k):
        del self.stack[len(self.stack) - k:]

    def is_terminated(self):
        return False

    def allocate_vocab_mask(self, vocab_size, batch_size, device):
        import torch

        return torch.full((batch_size, (vocab_size + 31) // 32), -1, dtype=torch.int32)

    def fill_vocab_mask(self, vocab_mask, idx):
        bits = 0
        for t in range(self.vocab):
            if self.allowed(t):
                bits |= 1 << t
        vocab_mask[idx, 0] = bits - (1 << 32) if bits >= 1 << 31 else bits

    @staticmethod
    def move_vocab_mask(vocab_mask, device):
        return vocab_mask.to(device)

    @staticmethod
    def apply_vocab_mask(logits, vocab_mask):
        import torch

        v = logits.shape[-1]
        bits = (vocab_mask[:, :1].long() & 0xFFFFFFFF) >> torch.arange(v)
        logits.masked_fill_((bits & 1) == 0, float("-inf"))

    def masked(self, logits):
        """logits [1, V] with the tokens the grammar refuses now at -inf (the reference)."""
        import torch

        keep = torch.tensor([self.allowed(t) for t in range(logits.shape[-1])])
        return logits.masked_fill(~keep, float("-inf"))


def _pick(logits, sampling, gen):
    if sampling is None:
        return int(logits.argmax())
    import torch

    p = torch.softmax(logits / sampling["temperature"], -1)
    return int(torch.multinomial(p, 1, generator=gen))


def w_window(h, w, batch, block):
    """The DFlash block window of the step (what _ddtree_draft returns besides the top-K)."""
    torch = h.torch
    rtp = w.model_runner.req_to_token_pool
    seq = batch.seq_lens
    pos = seq.unsqueeze(1) + torch.arange(block)
    locs = rtp.req_to_token[batch.req_pool_indices.unsqueeze(1), pos].long()
    translator = w.model_runner.kv_index_translator
    plan = translator.plan(  # 0.5.20+; 0.5.19 writes at the cache locations (no plan)
        req_pool_indices=batch.req_pool_indices, seq_lens=seq, seq_lens_cpu=batch.seq_lens_cpu,
        write_virtual=locs.reshape(-1), read_extent=block,
    ) if hasattr(translator, "plan") else None
    return {"cache_loc_2d": locs, "positions_2d": pos, "kv_loc_plan": plan}


def _check_request(h, target, w, kv, rtp, row, prompt, req, sampling, grammar=False):
    """Sequential decoding agrees: tokens (greedy; grammar-masked greedy for a constrained
    request), the KV in the request's slots, and the hidden rows handed to the draft for
    every committed position."""
    torch = h.torch
    seq = list(prompt) + list(req.output_ids)
    logits, hidden = target.causal(seq)
    if sampling is None:
        rows = logits[len(prompt) - 1 : len(seq) - 1]
        if grammar:
            fsm = ParityGrammar(prompt[-1], target.vocab)
            want = []
            for row_logits in rows:
                want.append(int(fsm.masked(row_logits.unsqueeze(0))[0].argmax()))
                fsm.accept_token(want[-1])
        else:
            want = [int(x) for x in rows.argmax(-1)]
        assert list(req.output_ids) == want, f"tokens {list(req.output_ids)} != greedy {want}"
    committed = min(committed_of(req).kv_committed_len, len(seq))
    slots = rtp.req_to_token[row, :committed].long()
    # Layer-0 keys depend on (token, position) only: the slot of position p holds token p's.
    k0 = ((target.emb[torch.tensor(seq[:committed])] + target.pos[:committed]) @ target.w[0]["k"])
    assert torch.allclose(kv.k_buffer[0][slots].reshape(committed, -1), k0, atol=1e-9), "KV slots"
    for p in range(len(prompt), committed):
        slot, hid = w.draft_kv[(row, p)]
        assert slot == int(slots[p]), f"draft slot of position {p}"
        assert torch.allclose(hid, hidden[p], atol=h.HIDDEN_ATOL), f"draft hidden at position {p}"


def _greedy_case(h, budget=10, topk=3, **kw):
    """Three requests of different prompt lengths through the worker's whole decode step
    (run_decode checks tokens, KV, draft hidden rows, accepted depth per step, the off-chain
    count, the reserve and the freed slots)."""
    torch = h.torch
    target = TinyTarget(torch, seed=1)
    draft = target.perturbed(0.08, seed=2)
    gen = torch.Generator().manual_seed(3)
    plens, max_new = [4, 9, 15], [6, 23, 14]
    prompts = [torch.randint(0, target.vocab, (m,), generator=gen).tolist() for m in plens]
    reqs, steps, accepts, w = run_decode(h, target, draft, prompts, max_new, budget=budget,
                                         topk=topk, block=5, via_forward=True, **kw)
    assert w._target_worker.calls == steps == w.draft_model_runner.calls
    # Not vacuous: deep paths and off-chain (rank > 0) accepts happened.
    assert max(accepts) >= 2, accepts
    assert int(w._ddtree_offchain) >= 1, "no off-chain accept: the tree never mattered"
    assert steps < max(max_new), (steps, accepts)
    assert any(c > 0 for c in w.cut), w.cut  # some request finished mid-path
    return reqs, target, prompts


def case_greedy_lossless(h):
    _greedy_case(h)


def case_overlap_lossless(h):
    """The overlap schedule: lagged host lengths, publish, the FutureMap relay (poisoned draft
    inputs), results processed a step late, an extra step for finished requests. Budget 12 and
    top-2 over a draft depth of 4: the lineage depth (7) exceeds the draft depth, so the parent
    list is wider than a depth-L one (the CUDA host check sees the difference)."""
    from sglang.srt.speculative.ddtree_lineage import lineage_depth

    assert lineage_depth(12, 2, 4) == 7
    _greedy_case(h, budget=12, topk=2, overlap=True)


def case_page16_lossless(h):
    """Page size 16 (SGLang's paged allocator; EAGLE moves the accepted path's KV)."""
    _greedy_case(h, overlap=True, page_size=16, kv_slots=4096)


def case_grammar_lossless(h):
    """Grammar-constrained requests (a STAND-IN grammar object) under overlap: EAGLE masks the
    target over the DDTree with the FSM the grammar barrier advanced; the tokens are the
    grammar-masked greedy decode, which differs from the unconstrained one."""
    reqs, target, prompts = _greedy_case(h, overlap=True, grammar=True)
    free = []
    for req, prompt in zip(reqs, prompts):
        seq = list(prompt) + list(req.output_ids)
        free.append([int(x) for x in target.causal(seq)[0][len(prompt) - 1: len(seq) - 1].argmax(-1)])
    assert any(f != list(q.output_ids) for f, q in zip(free, reqs)), "the grammar changed nothing"


# The schedule run: three widths (13, 6 and the chain's 5 at block 5), crossed as requests join
# (1 -> 3 -> 5 running) and finish (5 -> ... -> 1), under the overlap schedule.
SCHEDULE = "1:12/3,3:5/2,5:chain"
SCHEDULE_JOINS = {1: 2, 2: 2, 3: 4, 4: 4}


def _schedule_run(h, worker_hook=None, check=True):
    torch = h.torch
    target = TinyTarget(torch, seed=1)
    draft = target.perturbed(0.08, seed=2)
    gen = torch.Generator().manual_seed(7)
    plens, max_new = [5, 9, 4, 12, 7], [34, 14, 20, 8, 12]
    prompts = [torch.randint(0, target.vocab, (m,), generator=gen).tolist() for m in plens]
    return run_decode(h, target, draft, prompts, max_new, budget=None, topk=None, block=5,
                      via_forward=True, overlap=True, schedule=SCHEDULE, joins=SCHEDULE_JOINS,
                      worker_hook=worker_hook, check=check)


def case_schedule_lossless(h):
    """A budget schedule under the overlap schedule: requests join and finish so the running
    batch crosses every threshold both ways, the width changing mid-request (request 0 runs
    at all three); every step verified the entry of the batch it ran, inside the KV reserved
    for that entry, and the tokens, KV, draft hidden rows, accepted depths, off-chain count
    and freed slots are checked as in every run. The /server_info report gives each entry's
    steps and mean accept length, equal to what the run saw."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.speculative import ddtree_schedule as sched
    from sglang.srt.speculative.ddtree_worker_v2 import add_ddtree_report

    seen = {}

    def count(w):
        verify = w._ddtree_verify_and_commit

        def counted(batch, *a, **k):
            res = verify(batch, *a, **k)
            i = sched.pick(w.ddtree_entries, len(batch.seq_lens))
            steps, rows, committed = seen.get(i, (0, 0, 0))
            seen[i] = (steps + 1, rows + len(batch.seq_lens), committed + int(res.accept_lens.sum()))
            return res

        w._ddtree_verify_and_commit = counted

    reqs, steps, accepts, w = _schedule_run(h, worker_hook=count)
    entries = sched.resolve(sched.parse(SCHEDULE), 5)
    assert sorted(seen) == list(range(len(entries))), ("not every entry ran", seen)
    report = add_ddtree_report(GetInternalStateReqOutput(internal_state={}),
                               type("Scheduler", (), {"draft_worker": w})()).internal_state
    assert report["ddtree_verify_width"] == 13, report
    got = report["ddtree_schedule"]
    assert [(e["threshold"], e["budget"], e["topk"], e["verify_width"]) for e in got] == [
        (e.threshold, e.budget, e.topk, e.width) for e in entries], got
    for i, entry in enumerate(got):
        s_, rows, committed = seen[i]
        assert entry["steps"] == s_ and entry["mean_accept_length"] == round(committed / rows, 4), (
            entry, seen[i])
    assert sum(e["steps"] for e in got) == steps
    # Not vacuous: the width fell (requests joined) and rose (requests finished), and request 0
    # ran at every width, changing width mid-request.
    ns = [n for _, n in w.probe_widths]
    assert any(b < a for a, b in zip(ns, ns[1:])) and any(b > a for a, b in zip(ns, ns[1:])), ns
    assert {n for active, n in w.probe_widths if 0 in active} == {e.width for e in entries}, (
        w.probe_widths)
    print("V2SHOW:" + __import__("json").dumps({"server_info_internal_state": report}),
          file=sys.stderr)


def case_schedule_stale_width_control(h):
    """The negative control: the worker reuses the previous step's width state (the entry of
    the batch before, as a relay one step late would). Where the batch grew into a smaller
    width, the verify writes past the KV reserved for the batch it runs: the run must fail."""
    def stale(w):
        select, last = w._ddtree_select, []

        def previous(batch):
            now = select(batch)
            used = last[-1] if last else now
            last.append(now)
            return used

        w._ddtree_select = previous

    try:
        _schedule_run(h, worker_hook=stale)
    except AssertionError as exc:
        # The real invariant broke (KV written outside the request's reservation), not the
        # probe's own bookkeeping of which entry should have run.
        assert "past the slots reserved" in str(exc), exc
        return
    raise AssertionError("reusing the previous step's width state passed every check")


def case_verify_states(h):
    """One verify state per width (GPU start-up, ``_ddtree_build_verify_states``): each entry
    but the largest (the target's own, captured for every graph batch size) gets a fresh target
    attention backend and a graph runner built while the spec bag says its width, for exactly
    the graph batch sizes its running batches pad to; the spec bag and graph sizes are given
    back; each step then swaps in the state of its batch's entry. STAND-INS (no GPU): the graph
    runner class and the model runner's backend factory, which record what they were built
    under; CUDA graphs reported on."""
    torch = h.torch
    from sglang.srt.model_executor import cuda_graph_config
    from sglang.srt.model_executor import runner as runners
    from sglang.srt.speculative import ddtree_schedule as sched
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_override
    # The settings as the worker reads them (0.5.14 - 0.5.15.post1: the global ServerArgs, its
    # cuda_graph_config's decode sizes), through the worker's own seams.
    from sglang.srt.speculative.ddtree_worker_v2 import (
        _decode_graph_sizes,
        _decode_graph_sizes_scope,
    )
    from sglang.srt.speculative.ddtree_worker_v2 import _spec as get_spec

    target = TinyTarget(torch, seed=1)
    rtp, kv, alloc = h.pools(target, 4)
    entries = sched.resolve(sched.parse(SCHEDULE), 5)
    w = h.worker(target, 12, 3, 5, rtp, kv, alloc, entries=entries)
    runner = w.target_worker.model_runner
    built = []

    class GraphRunner:  # STAND-IN for DecodeCudaGraphRunner
        def __init__(self, model_runner, attn_backend, speculative_num_steps,
                     speculative_num_draft_tokens):
            assert model_runner is runner and speculative_num_steps == 1
            self.backend, self.width = attn_backend, speculative_num_draft_tokens
            built.append((speculative_num_draft_tokens, get_spec().speculative_num_draft_tokens,
                          get_spec().speculative_ddtree_budget,
                          _decode_graph_sizes()))

    original = (runner.attn_backend, "the target's own graph runner")
    runner.decode_cuda_graph_runner = original[1]
    runner.init_new_workspace = "kept"
    runner._get_attention_backend = lambda init_new_workspace: (
        "backend", get_spec().speculative_num_draft_tokens, init_new_workspace)
    saved = (runners.DecodeCudaGraphRunner, cuda_graph_config.check_cuda_graph_backend)
    runners.DecodeCudaGraphRunner = GraphRunner
    cuda_graph_config.check_cuda_graph_backend = lambda phase, backend: False  # graphs on
    spec_before = (get_spec().speculative_num_draft_tokens, get_spec().speculative_ddtree_budget)
    try:
        with runtime_override(get_spec(), speculative_algorithm="DDTREE",
                              speculative_ddtree_budget=12, speculative_num_draft_tokens=13), \
                _decode_graph_sizes_scope([1, 2, 4, 8, 16]):
            w._ddtree_build_verify_states()
            assert _decode_graph_sizes() == [1, 2, 4, 8, 16]
            assert get_spec().speculative_num_draft_tokens == 13
    finally:
        runners.DecodeCudaGraphRunner, cuda_graph_config.check_cuda_graph_backend = saved
    assert (get_spec().speculative_num_draft_tokens,
            get_spec().speculative_ddtree_budget) == spec_before
    # 3:5/2 serves batches 3-4 (graph 4), the chain 5-16 (graphs 8, 16); 1:12/3 is the target's.
    assert built == [(6, 6, 5, [4]), (5, 5, 4, [8, 16])], built
    assert (runner.attn_backend, runner.decode_cuda_graph_runner) == original
    assert runner.init_new_workspace == "kept"
    largest, middle, chain = w._ddtree_widths
    assert (largest.attn_backend, largest.graph_runner) == original
    assert middle.attn_backend == ("backend", 6, True) and middle.graph_runner.width == 6
    assert chain.attn_backend == ("backend", 5, True) and chain.graph_runner.width == 5
    for bs, state in ((1, largest), (4, middle), (3, middle), (9, chain), (2, largest)):
        batch = type("Batch", (), {"seq_lens": torch.zeros(bs)})()
        assert w._ddtree_select(batch) is state
        assert runner.attn_backend is state.attn_backend
        assert runner.decode_cuda_graph_runner is state.graph_runner


class _OneRank:
    """Stand-in tensor-parallel group of one rank (no torch.distributed on this machine)."""

    world_size = 1

    def broadcast(self, *a, **k):
        pass


# The sampling law test (issue 30, 4): several target models (seeds), two widths, a 12-token
# vocabulary, LAW_TRIALS requests per (width, seed). Each run tests the t2 marginal and the
# (t2, t3) joint by Pearson's chi-square at LAW_ALPHA per test (Bonferroni: the family of
# 2 x widths x seeds tests stays below 1.2e-3). Block 4: a tree of budget 8 / top-3 (width 9)
# and the chain (budget 3 / top-1, width 4).
LAW_VOCAB = 12
LAW_WIDTHS = ((8, 3), (3, 1))
LAW_SEEDS = (4, 5)
LAW_TRIALS = 2500
LAW_ALPHA = 1e-4
LAW_POWER = 0.9


def _normal_quantile(p):
    """The standard normal's quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    import math

    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
         3.754408661907416e+00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def _chi2_quantile(df, alpha=LAW_ALPHA):
    """Wilson-Hilferty: the chi-square quantile with upper tail ``alpha``."""
    z = _normal_quantile(1 - alpha)
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _power(df, noncentrality, alpha=LAW_ALPHA):
    """P(noncentral chi-square(df, lambda) > the alpha quantile): Patnaik's scaled chi-square
    and Wilson-Hilferty's normal for it."""
    import math

    c = _chi2_quantile(df, alpha)
    k, lam = float(df), float(noncentrality)
    scale, nu = (k + 2 * lam) / (k + lam), (k + lam) ** 2 / (k + 2 * lam)
    z = ((c / scale / nu) ** (1 / 3) - (1 - 2 / (9 * nu))) / math.sqrt(2 / (9 * nu))
    return 0.5 * math.erfc(z / math.sqrt(2))


def detectable_bias(df, trials, power=LAW_POWER, alpha=LAW_ALPHA, spread=4.0):
    """The smallest total-variation bias delta that the chi-square test over ``df`` + 1 cells
    rejects with probability >= ``power``, in EVERY direction: for any law q at total variation
    delta from p, sum (q - p)^2 / p >= delta^2 (1 / P+ + 1 / P-) >= 4 delta^2 (P+, P-: the
    masses of the cells q raises and lowers), so the noncentrality is >= 4 N delta^2.
    ``spread`` = 1 / P+ + 1 / P- of a given direction (e.g. mass moved between two tokens)
    gives that direction's figure instead."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        enough = _power(df, spread * trials * mid * mid, alpha) >= power
        lo, hi = (lo, mid) if enough else (mid, hi)
    return hi


def _chi2(observed, expected):
    """Pearson's statistic with the cells expected below 5 pooled; (statistic, df)."""
    big = expected >= 5
    obs = observed[big].tolist() + [float(observed[~big].sum())]
    exp = expected[big].tolist() + [float(expected[~big].sum())]
    pairs = [(o, e) for o, e in zip(obs, exp) if e > 0]
    return sum((o - e) ** 2 / e for o, e in pairs), len(pairs) - 1


def _sampling_run(h, walk, trials=LAW_TRIALS, budget=8, topk=3, seed=4):
    """``trials`` requests of 3 tokens after a fixed first token, sampled at temperature 1
    through EAGLE's sampling branch with ``walk`` as its tree-sampling kernel, at one width
    (``budget``, ``topk``, block 4) on the target of ``seed``. Returns the (t2, t3) counts
    [V, V], the target's law of them x trials, the accepts and the worker."""
    torch = h.torch
    from sglang.srt.speculative import eagle_utils

    # NAMED STAND-INS for these cases: the sampling walk (no CPU op in SGLang) and the CPU
    # engine's "always greedy" switch, so eagle_sample takes its sampling branch.
    eagle_utils.tree_speculative_sampling_target_only = walk
    eagle_utils._is_cpu = False
    import inspect

    restore = []

    if "from sgl_kernel import" in inspect.getsource(eagle_utils.eagle_sample):
        # 0.5.19 imports the sampling walk from sgl_kernel inside eagle_sample (0.5.20+ at
        # the module's top): the same walk, where that import finds it.
        import sgl_kernel

        bound = sgl_kernel.tree_speculative_sampling_target_only
        sgl_kernel.tree_speculative_sampling_target_only = walk
        # (``bound`` by value: the renorm stand-ins below rebind the name in this scope.)
        restore.append(lambda bound=bound: setattr(
            sgl_kernel, "tree_speculative_sampling_target_only", bound))
    if (hasattr(eagle_utils, "sgl_build_tree_kernel_efficient_cpu")
            and not hasattr(eagle_utils, "sgl_build_tree_kernel_efficient")):
        # 0.5.19 routes its tree builder by the same switch (0.5.20+ build in spec_tree.py):
        # with it off, the CUDA name, bound to the same stand-in of the CUDA builder.
        eagle_utils.sgl_build_tree_kernel_efficient = (
            eagle_utils.sgl_build_tree_kernel_efficient_cpu)
    if "get_tp_group()" in inspect.getsource(eagle_utils.eagle_sample):
        # 0.5.19's sampling branch imports parallel_state's TP group getter itself (0.5.20+
        # ask the runtime context, which holds the one-rank group): the same one-rank stand-in.
        import sglang.srt.distributed as distributed

        distributed.get_tp_group = _OneRank
    source = inspect.getsource(eagle_utils.eagle_sample)
    if "top_k_renorm_prob(" in source and "need_top_k_sampling" not in source:
        # 0.5.14 - 0.5.15.post1 renormalize by top-k and top-p on every sampled verify (0.5.16+
        # only when a request asks); these requests keep the whole vocabulary (top_k -1,
        # top_p 1), for which the CUDA kernels return their input. STAND-INs for exactly that
        # case, refusing any other.
        import sgl_kernel

        def whole_vocabulary_only(what, keeps_all):
            def renorm(probs, limit):
                assert keeps_all(limit, probs.shape[-1]), (what, "stand-in: whole vocabulary only")
                return probs

            return renorm

        for name, keeps_all in (
                ("top_k_renorm_prob", lambda k, v: bool(((k <= 0) | (k >= v)).all())),
                ("top_p_renorm_prob", lambda p, v: bool((p >= 1.0).all()))):
            bound = getattr(sgl_kernel, name)
            setattr(sgl_kernel, name, whole_vocabulary_only(name, keeps_all))
            restore.append(lambda name=name, bound=bound: setattr(sgl_kernel, name, bound))
    vocab = LAW_VOCAB
    target = TinyTarget(torch, vocab=vocab, hidden=16, seed=seed, scale=0.6)
    target.head = target.head * 0.15  # spread-out next-token laws, a few likely tokens
    draft = target.perturbed(0.05, seed=seed + 100)  # agrees often, not always
    prompt, first = [1, 4, 2, 5, 0], 3
    torch.manual_seed(11 + seed)  # EAGLE's verify coins come from torch.rand
    reqs, steps, accepts, w = run_decode(
        h, target, draft, [prompt] * trials, [3] * trials, budget=budget, topk=topk, block=4,
        sampling={"temperature": 1.0, "top_k": -1, "top_p": 1.0}, first_token=first,
        kv_slots=trials * 28,  # (SGLang's allocator concatenates its free list on every free)
    )
    for undo in restore:
        undo()
    counts = torch.zeros(vocab, vocab)
    for req in reqs:
        out = list(req.output_ids)
        assert out[0] == first and len(out) == 3
        counts[out[1], out[2]] += 1
    p2 = torch.softmax(target.causal(prompt + [first])[0][-1], -1)
    expected = torch.stack([
        p2[a] * torch.softmax(target.causal(prompt + [first, a])[0][-1], -1)
        for a in range(vocab)
    ]) * trials
    return counts, expected, accepts, w


def _law_statistics(counts, expected):
    """[(name, statistic, its LAW_ALPHA quantile, df)] for the t2 marginal and the (t2, t3)
    joint."""
    out = []
    for name, obs_t, exp_t in (("t2", counts.sum(1), expected.sum(1)),
                               ("(t2, t3)", counts.flatten(), expected.flatten())):
        stat, df = _chi2(obs_t, exp_t)
        out.append((name, stat, _chi2_quantile(df), df))
    return out


def _least_detectable_shift(expected, delta):
    """The law ``expected`` moved by total variation ``delta`` in the direction the chi-square
    test sees least: the cells split into two halves of (about) equal mass, one scaled up by
    1 + delta / P+, the other down by 1 - delta / P- (noncentrality ~ 4 N delta^2)."""
    import torch

    flat = expected.flatten().double()
    order = flat.argsort(descending=True)
    up = torch.zeros(flat.shape, dtype=torch.bool)
    mass, total = 0.0, float(flat.sum())
    for i in order.tolist():  # greedy halves: the next cell to the lighter side
        if mass < total / 2:
            up[i] = True
            mass += float(flat[i])
    p_up, p_down = mass / total, 1 - mass / total
    shifted = flat.clone()
    shifted[up] *= 1 + delta / p_up
    shifted[~up] *= 1 - delta / p_down
    return shifted.view(expected.shape).to(expected.dtype)


def case_sampling_law(h):
    """Target-only tree sampling through EAGLE's sampling branch: the law of the two tokens
    the worker emits after a fixed first token equals the target's p(t2) p(t3 | t2), at two
    widths (a tree and the chain), on several targets. The test's resolution is printed
    (V2SHOW): the smallest total-variation bias it rejects with probability 0.9 in every
    direction; and the same counts against the target's law moved by that bias (in the
    direction it sees least) are rejected."""
    import json

    import sgl_kernel

    shown, combined, runs = [], {}, []
    for budget, topk in LAW_WIDTHS:
        for seed in LAW_SEEDS:
            counts, expected, accepts, w = _sampling_run(
                h, sgl_kernel.tree_speculative_sampling_target_only, budget=budget, topk=topk,
                seed=seed)
            trials = int(counts.sum())
            runs.append((counts, expected))
            for name, stat, bound, df in _law_statistics(counts, expected):
                assert stat < bound, (budget, topk, seed, name, stat, bound)
                total = combined.setdefault(name, [0.0, 0, 0])
                total[0] += stat
                total[1] += df
                total[2] += trials
                shown.append({"width": budget + 1, "topk": topk, "seed": seed, "law": name,
                              "trials": trials, "df": df, "chi2": round(stat, 1),
                              "bound": round(bound, 1),
                              "detects_tv_any_direction": round(detectable_bias(df, trials), 4)})
            # Mass moved between the two likeliest second tokens: that direction's resolution.
            p1, p2 = (expected.sum(1) / trials).sort(descending=True).values[:2].tolist()
            shown[-2]["detects_tv_between_top_two"] = round(
                detectable_bias(shown[-2]["df"], trials, spread=1 / p1 + 1 / p2), 4)
            # Not vacuous: drafts were accepted in many trials (and off the chain in a tree).
            assert sum(1 for a in accepts if a >= 1) > trials // 4, accepts[:50]
            assert int(w._ddtree_offchain) >= 1 or topk == 1
            # The resolution claimed is real: against the law moved by the detectable bias,
            # the same counts are rejected (joint law: its delta; marginal: its own).
            for (name, _, bound, df), (obs_t, exp_t) in zip(
                    _law_statistics(counts, expected),
                    ((counts.sum(1), expected.sum(1)), (counts.flatten(), expected.flatten()))):
                moved = _least_detectable_shift(exp_t, 1.25 * detectable_bias(df, trials))
                assert _chi2(obs_t, moved)[0] >= bound, (name, "a law off by the detectable "
                                                         "bias was not rejected")
    # Every run together (a bug in the walk biases every run): the sum of the statistics
    # against the chi-square of the summed degrees of freedom; and its resolution, shown real
    # the same way (each run's law moved by the combined test's detectable bias).
    for name, (stat, df, trials) in combined.items():
        bound = _chi2_quantile(df)
        assert stat < bound, (name, "all runs", stat, bound)
        delta = detectable_bias(df, trials)
        moved = 0.0
        for counts, expected in runs:
            obs_t, exp_t = ((counts.sum(1), expected.sum(1)) if name == "t2"
                            else (counts.flatten(), expected.flatten()))
            moved += _chi2(obs_t, _least_detectable_shift(exp_t, 1.25 * delta))[0]
        assert moved >= bound, (name, "all runs: a law off by the detectable bias passed")
        shown.append({"law": name, "runs": len(runs), "trials": trials, "df": df,
                      "chi2": round(stat, 1), "bound": round(bound, 1),
                      "detects_tv_any_direction": round(delta, 4)})
    print("V2SHOW:" + json.dumps({"sampling_law": shown}), file=sys.stderr)


def case_sampling_control(h):
    """The sampling test can fail: the same run with a tree-sampling walk WITHOUT the residual
    (after the walk stops, the bonus is drawn from the target's distribution itself, rejected
    tokens included) gives counts the same statistics reject."""
    import sgl_kernel
    import torch

    walk = sgl_kernel.tree_speculative_sampling_target_only  # the stand-in, before the run binds

    def no_residual(predicts, accept_index, accept_token_num, candidates, retrive_index,
                    retrive_next_token, retrive_next_sibling, uniform_samples,
                    uniform_samples_for_final_sampling, target_probs, draft_probs, **kw):
        walk(
            predicts, accept_index, accept_token_num, candidates, retrive_index,
            retrive_next_token, retrive_next_sibling, uniform_samples,
            uniform_samples_for_final_sampling, target_probs, draft_probs, **kw)
        bs, n = candidates.shape
        for b in range(bs):
            last = int(accept_index[b, int(accept_token_num[b])])
            q = target_probs[b, last - b * n].double()
            cdf = q.cumsum(0)
            u = float(uniform_samples_for_final_sampling[b]) * float(cdf[-1])
            pick = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True))
            predicts[last] = min(pick, q.numel() - 1)

    counts, expected, _, _ = _sampling_run(h, no_residual)
    stats = _law_statistics(counts, expected)
    assert any(stat >= bound for _, stat, bound, _ in stats), stats


class HostSyncCounter:
    """Counts calls that read a tensor's value on the host (.item, .tolist, .cpu, .numpy,
    int()/float()/bool() of a tensor): on a GPU each one stalls the stream and breaks the
    overlap scheduler. Wraps torch.Tensor's methods while active."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self, torch):
        self.torch, self.count, self.where = torch, 0, []

    def __enter__(self):
        import traceback as tb

        self.saved = {n: getattr(self.torch.Tensor, n) for n in self.NAMES}
        for name, fn in self.saved.items():
            def wrapped(t, *a, _fn=fn, _name=name, **k):
                self.count += 1
                self.where.append((_name, tb.extract_stack(limit=3)[0].name))
                return _fn(t, *a, **k)
            setattr(self.torch.Tensor, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.torch.Tensor, name, fn)


def case_no_host_sync(h):
    """The worker's own decode-step code (tree build + lineage, the off-chain counter) reads
    nothing back to the host, at batch 32 and budget 64."""
    torch = h.torch
    target = TinyTarget(torch, seed=1)
    rtp, kv, alloc = h.pools(target, 32)
    w = h.worker(target, 64, 8, 16, rtp, kv, alloc)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 15, 24, generator=gen) * 3
    from sglang.srt.speculative.ddtree_lineage import sharded_topk_logprobs

    w._ddtree_build(torch.zeros(32, dtype=torch.long),
                    *[x.view(32, 15, -1) for x in sharded_topk_logprobs(logits.view(-1, 24), 8)])
    with HostSyncCounter(torch) as c:
        lp, tok = sharded_topk_logprobs(logits.view(-1, 24), 8)
        layout, parent_list, sel, dt = w._ddtree_build(
            torch.zeros(32, dtype=torch.long), lp.view(32, 15, -1), tok.view(32, 15, -1))
        accept_index = torch.full((32, 16), -1, dtype=torch.long)
        w._ddtree_count_offchain(accept_index, parent_list, sel, 8)
    assert c.count == 0, c.where
    # Not vacuous: the counter sees a sync when there is one.
    with HostSyncCounter(torch) as c:
        int(layout.tokens[0, 0])
    assert c.count == 1
    # A broken draft (NaN and -inf log-probs) still gives full trees: every node linked, no
    # padding for the CUDA tree builder's parent-not-found path.
    lp = lp.view(32, 15, -1).clone()
    lp[0] = float("nan")
    lp[1:, :, 2:] = float("-inf")
    layout, *_ = w._ddtree_build(torch.zeros(32, dtype=torch.long), lp, tok.view(32, 15, -1))
    assert bool(layout.valid.all())


def case_offchain_counter(h):
    """The off-chain counter counts steps whose accepted path holds a node of rank > 0 (not its
    parent's first child), not steps that accepted deep paths: a step accepting only first-
    ranked nodes to depth 3 counts nothing, one accepting a second-ranked child of the root
    counts one (the greedy runs cannot tell ranks from parent indices: there, the two counts
    agree step for step)."""
    torch = h.torch
    from sglang.srt.speculative import ddtree_utils as du

    target = TinyTarget(torch, seed=1)
    rtp, kv, alloc = h.pools(target, 2)
    w = h.worker(target, 10, 3, 5, rtp, kv, alloc)
    # A peaked draft (rank 0 far ahead at every depth): the tree holds the first-ranked chain
    # to depth 4 and second-ranked children beside it.
    logits = (-3.0 * torch.arange(24, dtype=torch.float32)).expand(2, 4, 24).contiguous()
    from sglang.srt.speculative.ddtree_lineage import sharded_topk_logprobs

    lp, tok = (x.view(2, 4, -1) for x in sharded_topk_logprobs(logits.view(-1, 24), 3))
    layout, parent_list, sel, _ = w._ddtree_build(torch.zeros(2, dtype=torch.long), lp, tok)
    n = layout.tokens.shape[1]
    nxt, sib = layout.retrieve_next_token, layout.retrieve_next_sibling

    def path(b, ranks):  # accept_index row: the root, then the ranks[i]-th child each level
        node, row = 0, [b * n]
        for rank in ranks:
            node = int(nxt[b, node])
            for _ in range(rank):
                node = int(sib[b, node])
            assert node > 0, (b, ranks)
            row.append(b * n + node)
        return row + [-1] * (5 - len(row))

    steps = [([0, 0, 0], []),  # first-ranked chain to depth 3, the other request rejected all
             ([1], []),        # a second-ranked child of the root
             ([0, 1], [0])]    # a second-ranked grandchild under the first-ranked child
    want = 0
    for first, second in steps:
        accept_index = torch.tensor([path(0, first), path(1, second)], dtype=torch.int32)
        want += int(bool(du.offchain_accepted(layout, accept_index.long()).any()))
        w._ddtree_count_offchain(accept_index, parent_list, sel, 3)
        assert int(w._ddtree_offchain) == want, (first, second, int(w._ddtree_offchain), want)
    assert want == 2 and int(w._ddtree_steps) == 3


def case_report(h):
    """The /server_info report: SGLang's own GetInternalStateReqOutput gets the contract's
    three keys from the worker through add_ddtree_report, the off-chain count read from the
    device counter only there."""
    torch = h.torch
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.speculative.ddtree_worker_v2 import add_ddtree_report

    target = TinyTarget(torch, seed=1)
    rtp, kv, alloc = h.pools(target, 2)
    w = h.worker(target, 10, 3, 5, rtp, kv, alloc)
    w._ddtree_offchain += 4

    class Scheduler:  # stand-in: only the attribute the hook reads
        draft_worker = w

    out = add_ddtree_report(GetInternalStateReqOutput(internal_state={"x": 1}), Scheduler())
    assert out.internal_state == {"x": 1, "ddtree_verify_width": 11,
                                  "ddtree_worker_class": "DDTreeWorkerV2",
                                  "ddtree_offchain_accepts": 4}, out.internal_state

    class Plain:
        draft_worker = object()

    out = add_ddtree_report(GetInternalStateReqOutput(internal_state={"x": 1}), Plain())
    assert out.internal_state == {"x": 1}


def case_topk_head(h):
    """The draft's top-K head as the draft graph calls it (hidden states of whole blocks,
    static buffers): positions 1..block-1 of each block, exact top-K log-probs over the
    vocabulary slice [0, num_org) of the LM head; a second, smaller batch reuses the buffers."""
    torch = h.torch
    from sglang.srt.speculative.ddtree_worker_v2 import _DDTreeTopKHead

    gen = torch.Generator().manual_seed(0)
    vocab, hidden, block, k = 40, 16, 5, 6
    weight = torch.randn(vocab + 8, hidden, generator=gen)  # 8 padding rows past num_org
    head = _DDTreeTopKHead(weight=weight, block_size=block, k=k, num_org=vocab,
                           org_vocab_start=0, max_bs=4, tp_group=None)
    for bs in (4, 2):
        hs = torch.randn(bs * block, hidden, generator=gen)
        head(hs, None)
        lp, tok = head.read(bs)
        logits = hs.view(bs, block, hidden)[:, 1:] @ weight[:vocab].T
        ref_v, ref_i = torch.topk(torch.log_softmax(logits.float(), -1), k, dim=-1)
        assert lp.shape == (bs, block - 1, k) and torch.equal(tok, ref_i), bs
        assert torch.allclose(lp, ref_v, atol=1e-5), bs


def main(argv):
    from probe_cases import run_cases

    return run_cases(TAG, argv, Harness, globals(), what="harness")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
