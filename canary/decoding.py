"""Batched decoders for the reference engine: greedy, Jacobi lookahead (Fu et al., ICML 2024)
and n-gram prompt lookup (vLLM's ``ngram`` method).

Contract (docs/architecture.md)::

    add(seq_id, prompt_ids, max_new_tokens) -> prefill seconds
    remove(seq_id)
    step(speculate=True) -> {seq_id: StepOutput}     # one decode iteration for every active sequence
    active                                          # number of sequences being decoded

Every decoder produces exactly the tokens of greedy decoding.

How it works
------------
* **KV cache holding only accepted tokens.** One preallocated tensor
  ``[layers, 2, slots, kv_heads, capacity, head_dim]``. Active sequences occupy slots
  ``0..B-1`` (a removed sequence's slot is refilled by the last one, so the batch is always a
  contiguous slice). A sequence's cache holds the K/V of every accepted token except the last
  one (the *pending* token), which is the first query token of the next step.
* **One forward pass per step for the whole batch.** Each sequence contributes a query (pending
  token + speculative tokens); queries are padded to the longest, written into the cache after
  each sequence's own accepted length, and attention runs under an explicit 4-D boolean->float
  mask ``[B, 1, q, T]`` with explicit ``position_ids``: each query token sees its sequence's
  accepted prefix plus the query tokens its branch allows (a tree/2-D mask). Nothing of the
  transformers masking utilities or cache classes is involved: the decoder layers of the model are
  called directly with our own cache object, so the mask we build is exactly the mask used.
* **Acceptance.** After the pass, each sequence keeps the longest verified prefix; the K/V rows
  of the accepted query tokens are moved to contiguous positions after its accepted prefix, and
  its length grows by that many. Rejected rows are simply left beyond the length and overwritten.
* Finished sequences (``max_new_tokens`` reached, or an EOS id) leave the batch by themselves;
  ``remove`` cancels a running sequence and ignores unknown ids.

Not thread-safe: call ``add``/``remove``/``step`` from one thread (the server's batching loop).
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = [
    "StepOutput",
    "BatchDecoder",
    "GreedyDecoder",
    "JacobiLookaheadDecoder",
    "PromptLookupDecoder",
    "make_decoder",
]


@dataclass
class StepOutput:
    new_tokens: list[int]  # tokens accepted for this sequence in this step (>= 1 unless finished earlier)
    draft_tokens: int  # speculative tokens proposed and verified this step (0 for greedy)
    accepted_draft_tokens: int  # of those, accepted (new_tokens = accepted_draft_tokens + 1 bonus, capped at max)
    finished: bool  # hit max_new_tokens or an EOS id


@runtime_checkable
class BatchDecoder(Protocol):
    def add(self, seq_id: str, prompt_ids: list[int], max_new_tokens: int) -> float: ...

    def remove(self, seq_id: str) -> None: ...

    def step(self, speculate: bool = True) -> dict[str, StepOutput]: ...

    @property
    def active(self) -> int: ...


# --------------------------------------------------------------------------------------------
# KV store and the model runners (torch: a transformers model; numpy: nplm.NumpyLlama)
# --------------------------------------------------------------------------------------------


class _KVStore:
    """``data[layer, k|v, slot, kv_head, position, head_dim]``, a torch tensor or a numpy array
    (``xp``: the ``zeros``/``index`` pair of either)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, zeros, index, slots: int = 4, capacity: int = 256):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self._zeros, self._index = zeros, index
        self.data = zeros((layers, 2, slots, kv_heads, capacity, head_dim))

    @property
    def slots(self) -> int:
        return self.data.shape[2]

    @property
    def capacity(self) -> int:
        return self.data.shape[4]

    def ensure(self, slots: int, capacity: int) -> None:
        s, c = self.slots, self.capacity
        if slots <= s and capacity <= c:
            return
        ns = max(s, 1 << max(0, math.ceil(math.log2(max(slots, 1)))))
        nc = c
        while nc < capacity:
            nc *= 2
        new = self._zeros((self.layers, 2, ns, self.kv_heads, nc, self.head_dim))
        new[:, :, :s, :, :c] = self.data
        self.data = new

    def move_slot(self, src: int, dst: int, length: int) -> None:
        if length > 0:
            self.data[:, :, dst, :, :length] = self.data[:, :, src, :, :length]

    def compact(self, slot: int, base: int, src_idx: list[int]) -> None:
        """Move query rows ``base + src_idx`` to ``base + 0..len-1`` (all layers, K and V)."""
        dst = list(range(len(src_idx)))
        if src_idx == dst:
            return
        src = self._index([i + base for i in src_idx])
        d = self.data[:, :, slot]  # [layers, 2, kv_heads, capacity, head_dim], a view
        d[:, :, :, base : base + len(src_idx)] = d[:, :, :, src]


class _StepCache:
    """What the torch decoder layers see as ``cache``: ``update`` writes this step's K/V at each
    sequence's write positions and returns the cache slice the attention runs over."""

    def __init__(self, store: _KVStore, row0: int, rows: int, write_pos, kv_len: int):
        import torch

        self.store, self.row0, self.rows, self.kv_len = store, row0, rows, kv_len
        self.row_idx = torch.arange(row0, row0 + rows).unsqueeze(1)  # [B, 1]
        self.write_pos = write_pos  # [B, q]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        buf = self.store.data[layer_idx]  # [2, S, H, C, D]
        buf[0][self.row_idx, :, self.write_pos] = key_states.transpose(1, 2)
        buf[1][self.row_idx, :, self.write_pos] = value_states.transpose(1, 2)
        sl = slice(self.row0, self.row0 + self.rows)
        return buf[0, sl, :, : self.kv_len], buf[1, sl, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # for code paths that ask
        return self.kv_len


def _eos_of(cfg) -> list[int]:
    e = getattr(cfg, "eos_token_id", None)
    return [] if e is None else ([e] if isinstance(e, int) else list(e))


class _TorchRunner:
    """A transformers Llama-family model: its decoder layers called directly with our cache and
    mask (see the module doc)."""

    def __init__(self, model, num_threads: int | None):
        import torch

        self.torch = torch
        if num_threads:
            torch.set_num_threads(num_threads)
        cfg = model.config
        self.config = cfg
        inner = model.model
        self._embed = inner.embed_tokens
        self._rotary = inner.rotary_emb
        self._layers = list(inner.layers[: cfg.num_hidden_layers])
        self._norm = inner.norm
        self._lm_head = model.lm_head
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._dtype = next(model.parameters()).dtype
        self._neg = torch.finfo(self._dtype).min
        self.store = _KVStore(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim,
                              lambda shape: torch.zeros(*shape, dtype=self._dtype), torch.tensor)

    def _run(self, ids, pos, mask, cache, logits: bool):
        h = self._embed(ids)
        pe = self._rotary(h, position_ids=pos)
        for layer in self._layers:
            h = layer(h, attention_mask=mask, position_ids=pos, cache=cache, position_embeddings=pe)
        if not logits:
            return h
        return self._lm_head(self._norm(h))

    def prefill(self, slot: int, ids: list[int]) -> None:
        torch, n = self.torch, len(ids)
        with torch.inference_mode():
            pos = torch.arange(n).unsqueeze(0)
            mask = torch.full((n, n), self._neg, dtype=self._dtype).triu_(1).view(1, 1, n, n)
            self._run(torch.tensor([ids]), pos, mask, _StepCache(self.store, slot, 1, pos, n), logits=False)

    def forward(self, ids: np.ndarray, pos: np.ndarray, allow: np.ndarray, wpos: np.ndarray,
                gather: np.ndarray | None) -> list[list[int]]:
        """Greedy next tokens [B][q or len(gather[b])] for one step's queries (see ``step``)."""
        torch = self.torch
        B, q, T = allow.shape
        with torch.inference_mode():
            mask = torch.zeros((B, 1, q, T), dtype=self._dtype)
            mask.masked_fill_(~torch.from_numpy(allow).unsqueeze(1), self._neg)
            cache = _StepCache(self.store, 0, B, torch.from_numpy(wpos), T)
            h = self._run(torch.from_numpy(ids), torch.from_numpy(pos), mask, cache, logits=False)
            if gather is not None:
                g = torch.from_numpy(gather)
                h = torch.gather(h, 1, g.unsqueeze(-1).expand(B, g.shape[1], h.shape[-1]))
            return self._lm_head(self._norm(h)).argmax(-1).tolist()


class _NumpyRunner:
    """``nplm.NumpyLlama``: the same steps in numpy (no torch in the process)."""

    def __init__(self, model, num_threads: int | None):
        self.model = model
        self.config = model.config
        self.store = _KVStore(int(model.config.num_hidden_layers), model.kv_heads, model.head_dim,
                              lambda shape: np.zeros(shape, dtype=np.float32), np.asarray)

    def _hidden(self, ids: np.ndarray, pos: np.ndarray, allow: np.ndarray, rows: np.ndarray,
                wpos: np.ndarray) -> np.ndarray:
        m, data, T = self.model, self.store.data, allow.shape[-1]
        bias = np.where(allow, np.float32(0), np.float32(-np.inf))[:, None, None]  # [B, 1, 1, q, T]
        r0, r1 = int(rows[0, 0]), int(rows[-1, 0]) + 1

        def write_kv(i: int, k: np.ndarray, v: np.ndarray):
            buf = data[i]  # [2, S, kv_heads, C, head_dim]
            buf[0][rows, :, wpos] = k
            buf[1][rows, :, wpos] = v
            return buf[0, r0:r1, :, :T], buf[1, r0:r1, :, :T]

        h = m.embed(ids)
        rope = m.rotary(pos)
        for i in range(len(m.layers)):
            h = m.layer_forward(i, h, rope, bias, write_kv)
        return h

    def prefill(self, slot: int, ids: list[int]) -> None:
        n = len(ids)
        allow = np.tril(np.ones((n, n), dtype=bool))[None]
        pos = np.arange(n)[None]
        self._hidden(np.asarray([ids]), pos, allow, np.array([[slot]]), pos)

    def forward(self, ids: np.ndarray, pos: np.ndarray, allow: np.ndarray, wpos: np.ndarray,
                gather: np.ndarray | None) -> list[list[int]]:
        B = ids.shape[0]
        h = self._hidden(ids, pos, allow, np.arange(B)[:, None], wpos)
        if gather is not None:
            h = np.take_along_axis(h, gather[:, :, None], axis=1)
        return self.model.logits(h).argmax(-1).tolist()


def _runner(model, num_threads: int | None):
    from lookahead_canary.nplm import NumpyLlama

    return _NumpyRunner(model, num_threads) if isinstance(model, NumpyLlama) else _TorchRunner(model, num_threads)


# --------------------------------------------------------------------------------------------
# Sequences and proposals
# --------------------------------------------------------------------------------------------


class _Seq:
    __slots__ = (
        "id", "tokens", "arr", "n_prompt", "max_new", "n_gen", "cache_len", "state",
    )

    def __init__(self, seq_id: str, prompt_ids: list[int], max_new: int):
        self.id = seq_id
        self.tokens: list[int] = list(prompt_ids)  # prompt + accepted; tokens[-1] is pending
        self.arr = np.zeros(max(64, 2 * (len(prompt_ids) + max_new + 8)), dtype=np.int64)
        self.arr[: len(prompt_ids)] = prompt_ids
        self.n_prompt = len(prompt_ids)
        self.max_new = max_new
        self.n_gen = 0
        self.cache_len = len(prompt_ids) - 1
        self.state = None  # decoder-specific

    def extend(self, new: list[int]) -> None:
        n = len(self.tokens)
        if n + len(new) > len(self.arr):
            a = np.zeros(2 * (n + len(new)), dtype=np.int64)
            a[:n] = self.arr[:n]
            self.arr = a
        self.arr[n : n + len(new)] = new
        self.tokens.extend(new)


class _Proposal:
    """The query one sequence contributes to a step.

    ``tokens[0]`` is the pending token; ``rel_pos[i]`` is the position offset from it;
    ``mask[i, j]`` says whether query token i attends to query token j (the accepted prefix is
    always visible). ``cands`` are the verification candidates as lists of query indices (each
    a chain: the first index's token is the proposed next token after the pending one)."""

    __slots__ = ("tokens", "rel_pos", "mask", "cands", "extra", "need")

    def __init__(self, tokens, rel_pos, mask, cands, extra=None, need=None):
        self.tokens, self.rel_pos, self.mask, self.cands, self.extra = tokens, rel_pos, mask, cands, extra
        self.need = need  # query indices whose next-token prediction is used (None: all)


_GREEDY_MASK = np.ones((1, 1), dtype=bool)


def _greedy_proposal(seq: _Seq) -> _Proposal:
    return _Proposal([seq.tokens[-1]], [0], _GREEDY_MASK, [])


def _chain_proposal(seq: _Seq, chains: list[list[int]]) -> _Proposal:
    """Pending token + independent candidate chains, each attending to the pending token and its
    own earlier tokens (a token tree without shared prefixes)."""
    toks = [seq.tokens[-1]]
    rel = [0]
    cand_idx = _append_chains(toks, rel, chains)
    mask = np.zeros((len(toks), len(toks)), dtype=bool)
    mask[:, 0] = True
    _mask_chains(mask, cand_idx)
    return _Proposal(toks, rel, mask, cand_idx)


def _append_chains(toks: list[int], rel: list[int], chains: list[list[int]]) -> list[list[int]]:
    """Append candidate chains to a query (tokens and relative positions, in place); return each
    chain's query indices."""
    cand_idx = []
    for ch in chains:
        idx = list(range(len(toks), len(toks) + len(ch)))
        toks.extend(ch)
        rel.extend(range(1, len(ch) + 1))
        cand_idx.append(idx)
    return cand_idx


def _mask_chains(mask: np.ndarray, cand_idx: list[list[int]]) -> None:
    """Each chain attends causally to itself (and, set by the caller, to the pending token)."""
    for idx in cand_idx:
        a, b = idx[0], idx[-1] + 1
        mask[a:b, a:b] = np.tril(np.ones((b - a, b - a), dtype=bool))


def _prompt_lookup(seq: _Seq, k: int, nmin: int, nmax: int) -> list[int]:
    """vLLM ``ngram``: the latest earlier occurrence of the longest suffix n-gram (n in
    [nmin, nmax]) of prompt + generated tokens; propose the (up to) k tokens that followed it."""
    n_tok = len(seq.tokens)
    a = seq.arr[:n_tok]
    for n in range(min(nmax, n_tok - 1), nmin - 1, -1):
        # starts i with a[i:i+n] == a[-n:] and i + n <= n_tok - 1 (a token follows the match)
        span = n_tok - n
        hit = a[0:span] == a[span]
        for j in range(1, n):
            hit &= a[j : span + j] == a[span + j]
        idx = np.flatnonzero(hit)
        if idx.size:
            i = int(idx[-1]) + n
            return a[i : min(i + k, n_tok)].tolist()
    return []


# --------------------------------------------------------------------------------------------
# The batch decoder
# --------------------------------------------------------------------------------------------


class _BaseDecoder:
    speculative = False

    def __init__(self, model, eos_token_ids=None, max_batch_size: int = 32, num_threads: int | None = None):
        self.model = model
        self.runner = _runner(model, num_threads)
        self.config = self.runner.config
        self.store = self.runner.store
        if eos_token_ids is None:
            eos_token_ids = _eos_of(self.config)
        self.eos = frozenset(int(x) for x in eos_token_ids)
        self.max_batch_size = max_batch_size
        self._seqs: list[_Seq] = []  # index == slot
        self._by_id: dict[str, _Seq] = {}
        # counters (whole lifetime), handy for benchmarks
        self.steps = 0
        self.spec_steps = 0
        self.seq_steps = 0
        self.query_tokens = 0  # sum over steps and sequences of query length (compute spent)

    # ---------------------------------------------------------------- public interface
    @property
    def active(self) -> int:
        return len(self._seqs)

    def add(self, seq_id: str, prompt_ids: list[int], max_new_tokens: int) -> float:
        if seq_id in self._by_id:
            raise ValueError(f"sequence {seq_id!r} is already active")
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if len(self._seqs) >= self.max_batch_size:
            raise RuntimeError(f"batch is full ({self.max_batch_size} sequences)")
        t0 = time.perf_counter()
        seq = _Seq(seq_id, prompt_ids, max_new_tokens)
        slot = len(self._seqs)
        self.store.ensure(slot + 1, len(prompt_ids) + 64)
        if seq.cache_len > 0:
            self.runner.prefill(slot, prompt_ids[:-1])
        self._init_state(seq)
        self._seqs.append(seq)
        self._by_id[seq_id] = seq
        return time.perf_counter() - t0

    def remove(self, seq_id: str) -> None:
        seq = self._by_id.pop(seq_id, None)
        if seq is None:
            return
        slot = self._seqs.index(seq)
        last = len(self._seqs) - 1
        if slot != last:
            moved = self._seqs[last]
            self.store.move_slot(last, slot, moved.cache_len)
            self._seqs[slot] = moved
        self._seqs.pop()

    def step(self, speculate: bool = True) -> dict[str, StepOutput]:
        if not self._seqs:
            return {}
        seqs = list(self._seqs)
        spec = speculate and self.speculative
        props = [self._propose(s) if spec else _greedy_proposal(s) for s in seqs]
        B = len(seqs)
        q = max(len(p.tokens) for p in props)
        lens = [s.cache_len for s in seqs]
        T = max(lens) + q
        self.store.ensure(B, T)
        ids = np.zeros((B, q), dtype=np.int64)
        pos = np.zeros((B, q), dtype=np.int64)
        wpos = np.empty((B, q), dtype=np.int64)
        allow = np.zeros((B, q, T), dtype=bool)
        ar = np.arange(q)
        for b, (p, L) in enumerate(zip(props, lens)):
            n = len(p.tokens)
            ids[b, :n] = p.tokens
            pos[b, :n] = np.asarray(p.rel_pos) + L
            pos[b, n:] = L
            wpos[b] = L + ar
            allow[b, :, :L] = True
            allow[b, :n, L : L + n] = p.mask
            if n < q:  # padding rows see only themselves
                allow[b, ar[n:], L + ar[n:]] = True
        # logits only where a prediction is used (the lm_head is a fifth of the model)
        needs = [p.need if p.need is not None else range(len(p.tokens)) for p in props]
        qn = max(len(nd) for nd in needs)
        gather = np.zeros((B, qn), dtype=np.int64)
        for b, nd in enumerate(needs):
            gather[b, : len(nd)] = nd
        got = self.runner.forward(ids, pos, allow, wpos, gather if qn < q else None)  # [B][qn]
        best = []
        for b, nd in enumerate(needs):
            if qn < q:
                row = [-1] * q
                for i, qi in enumerate(nd):
                    row[qi] = got[b][i]
                best.append(row)
            else:
                best.append(got[b])
        self.steps += 1
        self.query_tokens += sum(len(p.tokens) for p in props)
        self.seq_steps += B
        if spec:
            self.spec_steps += 1
        out: dict[str, StepOutput] = {}
        finished: list[str] = []
        for b, (s, p) in enumerate(zip(seqs, props)):
            row = best[b]
            new, acc_idx, n_draft, n_acc = self._accept(s, p, row)
            # cap at max_new_tokens and at the first EOS
            room = s.max_new - s.n_gen
            done = False
            if len(new) >= room:
                new = new[:room]
                done = True
            for i, t in enumerate(new):
                if t in self.eos:
                    new = new[: i + 1]
                    done = True
                    break
            n_acc = min(n_acc, len(new))
            s.n_gen += len(new)
            out[s.id] = StepOutput(new, n_draft, n_acc, done)
            if done:
                finished.append(s.id)
                continue
            # the K/V of the pending token and the accepted drafts become part of the cache
            self.store.compact(b, lens[b], acc_idx[: len(new)])
            s.cache_len += len(new)
            s.extend(new)
            self._after_accept(s, p, row, new)
        for sid in finished:
            self.remove(sid)
        return out

    # ---------------------------------------------------------------- per-method hooks
    def _init_state(self, seq: _Seq) -> None:
        pass

    def _propose(self, seq: _Seq) -> _Proposal:
        return _greedy_proposal(seq)

    def _accept(self, seq: _Seq, p: _Proposal, row: list[int]):
        """Returns (new tokens, query indices whose K/V to keep, draft tokens, accepted drafts).
        Greedy verification of every candidate chain; the longest accepted one wins."""
        first = row[0]
        best_c, best_m = None, 0
        for c in p.cands:
            m = 0
            expect = first
            for qi in c:
                if p.tokens[qi] != expect:
                    break
                m += 1
                expect = row[qi]
            if m > best_m:
                best_c, best_m = c, m
        n_draft = sum(len(c) for c in p.cands)
        if best_c is None:
            return [first], [0], n_draft, 0
        kept = best_c[:best_m]
        new = [first] + [row[qi] for qi in kept]
        return new, [0] + kept, n_draft, best_m

    def _after_accept(self, seq: _Seq, p: _Proposal, row: list[int], new: list[int]) -> None:
        pass


class GreedyDecoder(_BaseDecoder):
    """Plain greedy decoding: one token per sequence per step."""

    def __init__(self, model, eos_token_ids=None, max_batch_size: int = 32, num_threads: int | None = None,
                 temperature: float = 0.0):
        if temperature and temperature > 0:
            raise ValueError("GreedyDecoder decodes greedily; temperature > 0 (sampling) is not supported")
        super().__init__(model, eos_token_ids, max_batch_size, num_threads)


class PromptLookupDecoder(_BaseDecoder):
    """vLLM's ``ngram`` speculative method: draft ``num_speculative_tokens`` tokens that followed
    the latest earlier occurrence of the longest matching suffix n-gram (``prompt_lookup_min`` ..
    ``prompt_lookup_max`` tokens) of prompt + generated text; verify them in the same forward pass
    as the pending token; keep the longest greedy-verified prefix plus one bonus token."""

    speculative = True

    def __init__(self, model, num_speculative_tokens: int = 4, prompt_lookup_min: int = 2,
                 prompt_lookup_max: int = 5, eos_token_ids=None, max_batch_size: int = 32,
                 num_threads: int | None = None, temperature: float = 0.0):
        if temperature and temperature > 0:
            raise ValueError("prompt lookup decoding is exact greedy only; temperature > 0 (sampling) is not supported")
        if num_speculative_tokens < 1 or prompt_lookup_min < 1 or prompt_lookup_max < prompt_lookup_min:
            raise ValueError("need num_speculative_tokens >= 1 and 1 <= prompt_lookup_min <= prompt_lookup_max")
        super().__init__(model, eos_token_ids, max_batch_size, num_threads)
        self.k, self.nmin, self.nmax = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max

    def _propose(self, seq: _Seq) -> _Proposal:
        room = seq.max_new - seq.n_gen - 1
        if room <= 0:
            return _greedy_proposal(seq)
        draft = _prompt_lookup(seq, min(self.k, room), self.nmin, self.nmax)
        if not draft:
            return _greedy_proposal(seq)
        return _chain_proposal(seq, [draft])


class _LookaheadState:
    __slots__ = ("levels", "fill", "pool", "rng", "pl_len", "pl_chain")

    def __init__(self):
        self.pl_len = 0  # current prompt-lookup draft length (adaptive)
        self.pl_chain: list[int] | None = None
        self.levels: list[list[int]] = []
        self.fill = 0
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.rng: random.Random | None = None


class JacobiLookaheadDecoder(_BaseDecoder):
    """Lookahead decoding (Fu et al., ICML 2024).

    *Lookahead branch*: a 2-D window of ``W`` positions by ``N - 1`` Jacobi levels. Level ``l``,
    column ``j`` sits ``1 + l + j`` positions after the pending token and attends to the accepted
    prefix, the pending token, level 0 columns ``0..j`` and levels ``1..l`` of column ``j``.
    The outputs of the last level are one Jacobi iteration further: column ``j`` yields the
    n-gram ``(level_0[j], ..., level_{N-2}[j], out[j])`` for the pool (keyed by its first token),
    and the window shifts up one level. Level 0 starts from random prompt tokens; the window fills
    one level per step (warm-up) before it yields n-grams.

    *Verification branch*: up to ``G`` pool n-grams that start with the pending token (most recent
    first; each contributes its ``N - 1`` continuation tokens as a chain), plus optionally one
    prompt-lookup draft (``prompt_lookup_tokens`` > 0). Both branches are in one forward pass;
    neither sees the other. The longest greedy-verified chain is accepted, plus the bonus token.

    The pool is seeded with the prompt's n-grams (as the original implementation does) and gets
    the n-grams of the accepted output as well. Tokens per step <= 1 + (W + G)(N - 1) (+ the
    prompt-lookup draft).
    """

    speculative = True

    def __init__(self, model, window: int = 5, ngram: int = 4, guess_set: int = 5,
                 prompt_lookup_tokens: int = 0, prompt_lookup_min: int = 2, prompt_lookup_max: int = 4,
                 pool_from_prompt: bool = True, window_with_draft: bool = True, adaptive_draft: bool = False,
                 eos_token_ids=None, max_batch_size: int = 32,
                 num_threads: int | None = None, temperature: float = 0.0, seed: int = 0):
        if temperature and temperature > 0:
            raise ValueError(
                "lookahead decoding here is exact greedy only; temperature > 0 (sampling) is not supported"
            )
        if window < 1 or ngram < 2 or guess_set < 0:
            raise ValueError("need window >= 1, ngram >= 2, guess_set >= 0")
        super().__init__(model, eos_token_ids, max_batch_size, num_threads)
        self.W, self.N, self.G = window, ngram, guess_set
        self.pl_k, self.pl_min, self.pl_max = prompt_lookup_tokens, prompt_lookup_min, prompt_lookup_max
        self.pool_from_prompt = pool_from_prompt
        self.window_with_draft = window_with_draft
        self.adaptive_draft = adaptive_draft and prompt_lookup_tokens > 0
        self.seed = seed
        self._mask_cache: dict[tuple, np.ndarray] = {}

    # ---------------------------------------------------------------- pool
    def _pool_add(self, st: _LookaheadState, key: int, gram: tuple[int, ...]) -> None:
        lst = st.pool.get(key)
        if lst is None:
            st.pool[key] = [gram]
            return
        try:
            lst.remove(gram)
        except ValueError:
            pass
        lst.append(gram)
        cap = max(self.G, 1) * 2
        if len(lst) > cap:
            del lst[0]

    def _pool_add_text(self, st: _LookaheadState, toks: list[int], start: int) -> None:
        """Add every n-gram of ``toks`` that starts at index >= start and is complete."""
        n = self.N
        for i in range(max(0, start), len(toks) - n + 1):
            self._pool_add(st, toks[i], tuple(toks[i + 1 : i + n]))

    def _init_state(self, seq: _Seq) -> None:
        st = _LookaheadState()
        st.rng = random.Random(self.seed * 1_000_003 + len(seq.tokens))
        prompt = seq.tokens
        st.levels = [[st.rng.choice(prompt) for _ in range(self.W)]]
        st.fill = 1
        st.pl_len = min(self.pl_k, 8) if self.adaptive_draft else self.pl_k
        if self.pool_from_prompt:
            self._pool_add_text(st, prompt, 0)
        seq.state = st

    # ---------------------------------------------------------------- proposal
    def _lookahead_mask(self, fill: int) -> np.ndarray:
        """Mask of the lookahead branch among itself: levels 0..fill-1, W columns, level-major."""
        key = ("la", fill)
        m = self._mask_cache.get(key)
        if m is None:
            W = self.W
            n = fill * W
            m = np.zeros((n, n), dtype=bool)
            for l in range(fill):
                for j in range(W):
                    r = l * W + j
                    m[r, 0 : j + 1] = True  # level 0 columns 0..j
                    for k in range(1, l + 1):
                        m[r, k * W + j] = True  # column j of levels 1..l
            self._mask_cache[key] = m
        return m

    def _propose(self, seq: _Seq) -> _Proposal:
        st: _LookaheadState = seq.state
        W = self.W
        pending = seq.tokens[-1]
        room = seq.max_new - seq.n_gen - 1  # drafts beyond this can never be used
        chains: list[list[int]] = []
        if room > 0:
            if self.pl_k > 0:
                d = _prompt_lookup(seq, min(st.pl_len, room), self.pl_min, self.pl_max)
                if d:
                    chains.append(d)
        st.pl_chain = chains[0] if chains else None
        have_draft = bool(chains)
        if room > 0 and self.G > 0:
            grams = st.pool.get(pending)
            if grams:
                taken = 0
                for g in reversed(grams):  # most recent first
                    g = list(g[:room])
                    if any(c[: len(g)] == g for c in chains):
                        continue
                    chains.append(g)
                    taken += 1
                    if taken >= self.G:
                        break
        fill = st.fill
        if self.window_with_draft or not have_draft:
            la = [t for lvl in st.levels[:fill] for t in lvl]
        else:
            # a prompt-lookup draft is verified this step: on a CPU, where query tokens are not free,
            # leave the Jacobi window where it is rather than pay for it this step
            la = []
            fill = 0
        n_la = len(la)
        toks = [pending] + la
        rel = [0] + [1 + l + j for l in range(fill) for j in range(W)]
        cand_idx = _append_chains(toks, rel, chains)
        q = len(toks)
        mask = np.zeros((q, q), dtype=bool)
        mask[:, 0] = True
        if n_la:
            mask[1 : 1 + n_la, 1 : 1 + n_la] = self._lookahead_mask(fill)
        _mask_chains(mask, cand_idx)
        if n_la == 0:
            return _Proposal(toks, rel, mask, cand_idx, extra=None)
        # predictions used: the pending token, the last filled level, the candidates
        last = 1 + (fill - 1) * W
        need = [0] + list(range(last, last + W)) + list(range(1 + n_la, q))
        return _Proposal(toks, rel, mask, cand_idx, extra=n_la, need=need)

    def _after_accept(self, seq: _Seq, p: _Proposal, row: list[int], new: list[int]) -> None:
        st: _LookaheadState = seq.state
        if st.pl_chain is not None and self.adaptive_draft:
            # draft length control: double after a fully accepted draft, else shrink to what was
            # accepted plus two (every rejected draft token is compute spent for nothing)
            ch, m = st.pl_chain, 0
            while m < len(ch) and m < len(new) and ch[m] == new[m]:
                m += 1
            st.pl_len = min(self.pl_k, 2 * st.pl_len) if m == len(ch) else max(2, min(self.pl_k, m + 2))
            st.pl_chain = None
        if p.extra is None:  # a plain greedy step (speculate=False): window untouched
            self._pool_add_text(st, seq.tokens, len(seq.tokens) - len(new) - self.N)
            return
        W, N = self.W, self.N
        fill = st.fill
        last = 1 + (fill - 1) * W
        outs = row[last : last + W]
        if fill < N - 1:
            st.levels.append(outs)
            st.fill += 1
        else:
            lv = st.levels
            for j in range(W):
                self._pool_add(st, lv[0][j], tuple(lv[l][j] for l in range(1, N - 1)) + (outs[j],))
            st.levels = lv[1:] + [outs]
        # n-grams of the accepted text that are now complete
        self._pool_add_text(st, seq.tokens, len(seq.tokens) - len(new) - N)


def make_decoder(model, speculative_config: dict | None = None, **kw) -> _BaseDecoder:
    """Decoder from a vLLM-style ``--speculative-config`` dict (None -> greedy):
    ``{"method": "jacobi", "window": 7, "ngram": 5, "guess_set": 7}`` (optionally also
    ``"prompt_lookup_tokens"``, ``"prompt_lookup_min"``, ``"prompt_lookup_max"``,
    ``"window_with_draft"``, ``"pool_from_prompt"``) or
    ``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}``."""
    try:
        return _make_decoder(model, speculative_config, **kw)
    except TypeError as e:  # an unknown key in the config
        raise ValueError(f"bad speculative config {speculative_config!r}: {e}") from None


def _make_decoder(model, speculative_config, **kw) -> _BaseDecoder:
    if not speculative_config:
        return GreedyDecoder(model, **kw)
    cfg = dict(speculative_config)
    method = cfg.pop("method", None)
    if method in ("jacobi", "lookahead"):
        return JacobiLookaheadDecoder(
            model,
            window=cfg.pop("window", 5),
            ngram=cfg.pop("ngram", 4),
            guess_set=cfg.pop("guess_set", 5),
            **cfg,  # prompt_lookup_tokens, prompt_lookup_min/max, window_with_draft, pool_from_prompt
            **kw,
        )
    if method == "ngram":
        return PromptLookupDecoder(
            model,
            num_speculative_tokens=cfg.pop("num_speculative_tokens", 4),
            prompt_lookup_min=cfg.pop("prompt_lookup_min", 2),
            prompt_lookup_max=cfg.pop("prompt_lookup_max", 5),
            **cfg,
            **kw,
        )
    raise ValueError(f"unknown speculative method {method!r}; expected 'jacobi' or 'ngram'")
