"""Greedy vs lookahead (and prompt lookup) on the same prompts, side by side, at a sweep of batch
sizes, on the reference engine's decoders.

    python3 -m lookahead_dev.bench_engine [--model smollm2] [--prompts code]
        [--batch-sizes 1,2,8] [--max-tokens 64] [--num-prompts N] [--served-batch-sizes auto|off|1,8]
        [--lookahead '{"window":3,"ngram":4,"guess_set":2,"prompt_lookup_tokens":12}']
        [--ngram '{"num_speculative_tokens":8,"prompt_lookup_min":1,"prompt_lookup_max":4}']

At batch size b, b sequences decode together (iteration-level batching: when one finishes the
next prompt joins), every method on the same prompts. Timing covers decode steps only (prefill
is the same work for every method and is reported apart). Definitions:

* tokens/s: generated tokens / decode wall seconds.
* per-token latency: per sequence, decode seconds from its first to its last step / its tokens;
  mean over sequences.
* acceptance rate: accepted draft tokens / draft tokens verified (vLLM's
  spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens). For Jacobi lookahead every
  token of every verification candidate counts as a draft token, so this is far below
  the fraction of steps that gain something; mean tokens per step says more.
* tokens/step: generated tokens / sequence-steps (1.0 for greedy).
* exact: every sequence's tokens identical to greedy's.
* served rows (``--served-batch-sizes``, default the smallest and the largest batch size): the
  same configuration, prompts and output lengths through the HTTP server
  (``python3 -m lookahead_canary.server``) and the load generator, right after the in-process rows
  of that batch size; ``served_speedup`` = greedy / lookahead per-token latency as the client
  sees it (vLLM's TPOT), beside the in-process ratio of the same quantity.

Prints a table, and as its last line one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from importlib import resources

import torch

PROMPT_SETS = ("chat", "code", "summarize")
DEFAULT_LOOKAHEAD = {"window": 3, "ngram": 4, "guess_set": 2, "prompt_lookup_tokens": 24, "window_with_draft": False}
DEFAULT_NGRAM = {"num_speculative_tokens": 16, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


def load_prompts(name: str) -> list[dict]:
    if os.path.exists(name):
        text = open(name, encoding="utf-8").read()
    else:
        text = resources.files("lookahead_canary").joinpath("prompts", f"{name}.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def machine_description() -> dict:
    from lookahead_operator.cli.analyze import machine

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        **machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg": [round(x, 2) for x in load],
    }


def run_method(dec, prompts: list[tuple[list[int], int]], batch_size: int, on_step=None) -> dict:
    """Decode every prompt with at most batch_size sequences in flight. Returns outputs and stats."""
    outs: dict[str, list[int]] = {}
    first_step: dict[str, float] = {}
    last_step: dict[str, float] = {}
    queue = list(enumerate(prompts))
    prefill_s = 0.0
    decode_s = 0.0
    seq_steps = 0
    draft = accepted = 0
    steps = 0
    while queue or dec.active:
        while queue and dec.active < batch_size:
            i, (ids, n) = queue.pop(0)
            sid = str(i)
            outs[sid] = []
            prefill_s += dec.add(sid, ids, n)
        t0 = time.perf_counter()
        res = dec.step()
        t1 = time.perf_counter()
        decode_s += t1 - t0
        steps += 1
        for sid, o in res.items():
            first_step.setdefault(sid, t0)
            last_step[sid] = t1
            outs[sid] += o.new_tokens
            seq_steps += 1
            draft += o.draft_tokens
            accepted += o.accepted_draft_tokens
            if on_step:
                on_step(len(o.new_tokens))
    tokens = sum(len(v) for v in outs.values())
    lat = [(last_step[s] - first_step[s]) / max(1, len(outs[s])) for s in outs]
    return {
        "outs": outs,
        "tokens": tokens,
        "decode_s": decode_s,
        "prefill_s": prefill_s,
        "tok_s": tokens / decode_s if decode_s > 0 else 0.0,
        "tpot_ms": 1000.0 * sum(lat) / len(lat),
        "acceptance_rate": (accepted / draft) if draft else 0.0,
        "draft_tokens": draft,
        "accepted_tokens": accepted,
        "tokens_per_step": tokens / seq_steps if seq_steps else 0.0,
        "steps": steps,
    }


def served_tpot(requests) -> tuple[float, int]:
    """Per-token latency as a client of the server sees it, in ms (`analyze.pooled_per_token_s`:
    vLLM's TPOT pooled over the requests), and the completion tokens."""
    from lookahead_operator.cli.analyze import pooled_per_token_s

    s = pooled_per_token_s(requests)
    return (1000.0 * s if s else float("nan")), sum(r.completion_tokens or 0 for r in requests if r.ok)


class ServedPair:
    """The same configuration, prompts and output lengths through the HTTP server and the load
    generator: a greedy and a lookahead engine (``python3 -m lookahead_canary.server``, as many
    torch threads as in-process), started once. ``measure(b)`` drives them at concurrency b in
    closed-loop rounds in ABBA order (greedy, lookahead, lookahead, greedy) on the prompts the
    in-process rows decoded, so drift lands on both, and returns the served per-token latency of each and ``served_speedup`` = greedy TPOT /
    lookahead TPOT (at batch 1 the same quantity as the in-process decode tokens/s ratio).
    Used as a context manager: the engines stop with it, also on an exception or Ctrl-C."""

    def __init__(self, model: str, la_kw: dict, rows: list[dict], max_tokens: int | None, num_prompts: int,
                 threads: int, log) -> None:
        from lookahead_canary import loadgen
        from lookahead_operator.cli.analyze import EngineProcess

        self.prompts = [loadgen.Prompt(messages=tuple(r["messages"]) if "messages" in r else None,
                                       prompt=None if "messages" in r else r["prompt"],
                                       max_tokens=min(int(r.get("max_tokens", 128)), max_tokens or 10**9))
                        for r in rows]
        env = {"OMP_NUM_THREADS": str(threads)}
        self.engines = {
            "greedy": EngineProcess("greedy", model=model, env=env),
            "lookahead": EngineProcess("lookahead", model=model, env=env,
                                       speculative_config=json.dumps({"method": "jacobi", **la_kw})),
        }
        self.num_prompts, self.log = num_prompts, log
        self.models: dict[str, str] = {}

    def __enter__(self) -> "ServedPair":
        try:
            for e in self.engines.values():
                e.start()
            for e in self.engines.values():
                e.wait_ready(timeout=600.0)
            asyncio.run(self._warm_up())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for e in self.engines.values():
            e.stop()

    def _client(self):
        import httpx

        return httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                                 limits=httpx.Limits(max_connections=64))

    async def _warm_up(self) -> None:
        from lookahead_canary import loadgen

        async with self._client() as client:
            for k, e in self.engines.items():  # first-call allocations are not the workload
                self.models[k] = await loadgen.discover_model(client, e.url)
                await loadgen.run_step(client, e.url, self.models[k], self.prompts[:1], 1, requests_per_step=1)

    def measure(self, b: int) -> dict:
        return asyncio.run(self._measure(b))

    async def _measure(self, b: int) -> dict:
        from lookahead_canary import loadgen

        # the prompts the in-process rows of this batch size decoded (the first max(N, b), cycled),
        # all of them in every round: 2 rounds per method, each prompt twice
        work = [self.prompts[i % len(self.prompts)] for i in range(max(self.num_prompts, b))]
        reqs: dict[str, list] = {"greedy": [], "lookahead": []}
        async with self._client() as client:
            for k in ("greedy", "lookahead", "lookahead", "greedy"):
                self.log(f"served batch {b:>2} {k}")
                step = await loadgen.run_step(client, self.engines[k].url, self.models[k], work, b,
                                              requests_per_step=len(work))
                reqs[k] += step.requests
        g_ms, g_tok = served_tpot(reqs["greedy"])
        l_ms, l_tok = served_tpot(reqs["lookahead"])
        self.log(f"served batch {b:>2}: greedy {g_ms:.1f} ms/token, lookahead {l_ms:.1f} ms/token, "
                 f"x{g_ms / l_ms:.2f}")
        return {"served_greedy_tpot_ms": round(g_ms, 2), "served_lookahead_tpot_ms": round(l_ms, 2),
                "served_speedup": round(g_ms / l_ms, 3), "served_tokens": [g_tok, l_tok],
                "served_errors": sum(1 for rs in reqs.values() for r in rs if not r.ok)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lookahead_dev.bench_engine", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", default="code", help="chat | code | summarize | path to a JSONL file")
    ap.add_argument("--batch-sizes", default="1,2,8")
    ap.add_argument("--max-tokens", type=int, default=64, help="cap on each prompt's max_tokens (0: none)")
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts per batch size (cycled to fill a batch)")
    ap.add_argument("--lookahead", default=json.dumps(DEFAULT_LOOKAHEAD), help="JacobiLookaheadDecoder kwargs (JSON)")
    ap.add_argument("--ngram", default=json.dumps(DEFAULT_NGRAM), help="PromptLookupDecoder kwargs (JSON); 'off' to skip")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--served-batch-sizes", default="auto",
                    help="batch sizes for the served rows (HTTP server + load generator), 'auto' = the "
                         "smallest and the largest of --batch-sizes, 'off' = none")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from lookahead_canary.decoding import GreedyDecoder, JacobiLookaheadDecoder, PromptLookupDecoder
    from lookahead_canary.models import chat_prompt, eos_ids, load_model

    err = Console(stderr=True)
    out = Console()
    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    load_s = time.perf_counter() - t0
    # the weights' type, as the served engines (and `make demo`) load them too: exactness below is
    # token for token against greedy in this type
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    eos = sorted(eos_ids(model, tok))
    rows = load_prompts(args.prompts)
    la_kw = json.loads(args.lookahead)
    ng_kw = None if args.ngram == "off" else json.loads(args.ngram)
    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    encoded = [
        (chat_prompt(tok, r["messages"] if "messages" in r else r["prompt"]), min(int(r.get("max_tokens", 128)), args.max_tokens or 10**9))
        for r in rows
    ]

    methods = [("greedy", lambda: GreedyDecoder(model, eos_token_ids=eos)),
               ("lookahead", lambda: JacobiLookaheadDecoder(model, eos_token_ids=eos, **la_kw))]
    if ng_kw is not None:
        methods.append(("ngram", lambda: PromptLookupDecoder(model, eos_token_ids=eos, **ng_kw)))

    work = {b: [encoded[i % len(encoded)] for i in range(max(args.num_prompts, b))] for b in batch_sizes}
    # the greedy pass bounds the token count of every method (outputs are identical)
    results: dict[int, dict[str, dict]] = {}
    served_bs: list[int] = []
    if args.served_batch_sizes != "off":
        served_bs = (sorted({min(batch_sizes), max(batch_sizes)}) if args.served_batch_sizes == "auto"
                     else [int(x) for x in args.served_batch_sizes.split(",") if x.strip()])
    served: dict[int, dict] = {}
    with contextlib.ExitStack() as stack:
        pair = (stack.enter_context(ServedPair(args.model, la_kw, rows, args.max_tokens, args.num_prompts,
                                               args.threads, log=(lambda m: None) if args.no_progress else err.print))
                if served_bs else None)
        with torch.inference_mode(), Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
            TimeElapsedColumn(), console=err, disable=args.no_progress,
        ) as progress:
            # warm-up (first-call allocations, thread pools)
            w = GreedyDecoder(model, eos_token_ids=eos)
            w.add("w", encoded[0][0], 4)
            while w.active:
                w.step()
            for b in batch_sizes:
                results[b] = {}
                total = sum(n for _, n in work[b])
                for name, make in methods:
                    task = progress.add_task(f"batch {b:>2} {name:<9}", total=total)
                    dec = make()
                    r = run_method(dec, work[b], b, on_step=lambda k, t=task: progress.advance(t, k))
                    progress.update(task, completed=total)
                    results[b][name] = r
                    g = results[b]["greedy"]
                    progress.console.print(
                        f"batch {b:>2} {name:<9} {r['tok_s']:7.2f} tok/s  {r['tokens_per_step']:.2f} tok/step  "
                        f"x{r['tok_s'] / g['tok_s']:.2f} vs greedy  "
                        f"exact={all(r['outs'][s] == g['outs'][s] for s in g['outs'])}"
                    )
                if pair is not None and b in served_bs:
                    # right after the in-process rows of the same batch size: the same machine load
                    served[b] = pair.measure(b)

    table = Table(title=f"{args.model} / {args.prompts} prompts: greedy vs speculative, same engine")
    for c in ("batch", "method", "tok/s", "ms/tok", "tok/step", "accept", "speedup", "exact"):
        table.add_column(c, justify="right")
    summary = []
    for b in batch_sizes:
        g = results[b]["greedy"]
        for name, _ in methods:
            r = results[b][name]
            exact = all(r["outs"][s] == g["outs"][s] for s in g["outs"])
            r["exact"] = exact
            table.add_row(
                str(b), name, f"{r['tok_s']:.2f}", f"{r['tpot_ms']:.1f}", f"{r['tokens_per_step']:.2f}",
                "-" if name == "greedy" else f"{r['acceptance_rate']:.3f}",
                f"{r['tok_s'] / g['tok_s']:.2f}x", "yes" if exact else "NO",
            )
        la = results[b]["lookahead"]
        row = {
            "batch_size": b,
            "greedy_tok_s": round(g["tok_s"], 3),
            "lookahead_tok_s": round(la["tok_s"], 3),
            "speedup": round(la["tok_s"] / g["tok_s"], 3),
            "acceptance_rate": round(la["acceptance_rate"], 4),
            "tokens_per_step": round(la["tokens_per_step"], 3),
            "greedy_tpot_ms": round(g["tpot_ms"], 2),
            "lookahead_tpot_ms": round(la["tpot_ms"], 2),
            "exact": la["exact"],
        }
        if ng_kw is not None:
            ng = results[b]["ngram"]
            row.update({
                "ngram_tok_s": round(ng["tok_s"], 3),
                "ngram_speedup": round(ng["tok_s"] / g["tok_s"], 3),
                "ngram_acceptance_rate": round(ng["acceptance_rate"], 4),
                "ngram_exact": ng["exact"],
            })
        summary.append(row)
    out.print(table)
    if served:
        st = Table(title="per-token latency speedup, served (HTTP + load generator) vs in-process")
        for c in ("batch", "greedy ms/tok", "lookahd ms/tok", "served", "in-process", "ratio"):
            st.add_column(c, justify="right")
        for row in summary:
            sv = served.get(row["batch_size"])
            if sv is None:
                continue
            row.update(sv)
            # the same quantity in-process: greedy / lookahead per-token latency (at batch 1 the
            # tokens/s ratio `speedup` too; above it the two differ as sequences finish apart)
            row["tpot_speedup"] = round(row["greedy_tpot_ms"] / row["lookahead_tpot_ms"], 3)
            row["served_over_in_process"] = round(sv["served_speedup"] / row["tpot_speedup"], 3)
            st.add_row(str(row["batch_size"]), f"{sv['served_greedy_tpot_ms']:.1f}",
                       f"{sv['served_lookahead_tpot_ms']:.1f}", f"{sv['served_speedup']:.2f}x",
                       f"{row['tpot_speedup']:.2f}x", f"{row['served_over_in_process']:.2f}")
        out.print(st)
    mach = machine_description()
    out.print(f"machine: {mach['cpu']} ({' '.join(mach['cpu_flags'])}), {mach['cores']} cores, torch {mach['torch']}, "
              f"{mach['threads']} threads, {dtype}, loadavg {mach['loadavg']}; model load {load_s:.1f}s; "
              f"lookahead {la_kw}; ngram {ng_kw}")
    sys.stdout.write(json.dumps({
        "model": args.model, "dtype": dtype, "prompts": args.prompts, "machine": mach,
        "lookahead": la_kw, "ngram": ng_kw, "batches": summary,
    }) + "\n")
    sys.stdout.flush()
    return 0 if all(r["exact"] and r.get("ngram_exact", True) for r in summary) else 1


if __name__ == "__main__":
    raise SystemExit(main())
