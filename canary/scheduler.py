"""The engine's batching loop: iteration-level (continuous) batching over a ``BatchDecoder``.

One background thread owns the decoder (decoders are not thread-safe and need not be). Each
iteration it

1. admits waiting requests while fewer than ``max_num_seqs`` run (prefill: ``decoder.add``),
2. takes one decode step for every running sequence, with
   ``speculate = running <= lookahead_max_batch_size`` (the regime-aware switch),
3. hands each sequence's new tokens to its request: detokenised incrementally, checked for
   EOS, stop strings and ``max_tokens`` one token at a time, so the output (text and token
   count) is identical whether a step yields one token or several,
4. records vLLM-named metrics (``metrics.EngineMetrics``).

Requests talk to the loop through a thread-safe ``sink`` callable: the HTTP server passes one
that forwards events into an asyncio queue with ``loop.call_soon_threadsafe``.

``SimulatedDecoder`` is the ``--backend simulate`` decoder: the roofline simulator decides how
long each step takes and how many tokens each sequence gets, and the decoder really waits that
long, so everything downstream (streaming, metrics, Prometheus) sees realistic latencies.

A decoder may report one sequence of a step as failed (``SequenceError`` in place of its
output; the simulated decoder does so for the injected ``SimConfig.speculative_error_rate``):
that request alone ends as an engine error (``ErrorEvent``, finished_reason ``abort``, its batch
slot freed) and the loop goes on with the others.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from .metrics import EngineMetrics, FinishedRequest

log = logging.getLogger("lookahead_canary.scheduler")


# ---------------------------------------------------------------------------------------------
# events a request receives
@dataclass
class TokenEvent:
    text: str               # newly released text (may be "" while a stop string is undecided)
    token_ids: list[int]    # the tokens this step gave the request


@dataclass
class FinishEvent:
    finish_reason: str      # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    text: str = ""          # text released at the end (held-back stop-string prefix, if any)


@dataclass
class ErrorEvent:
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass
class SequenceError:
    """What a decoder's ``step`` returns, in place of a sequence's output, for a sequence that
    failed in that step: its request ends as an engine error, the other sequences go on."""

    message: str


class Tokenizer(Protocol):  # the part of a transformers tokenizer we use
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


# ---------------------------------------------------------------------------------------------
class IncrementalDetokenizer:
    """Text for a growing token list, released only once it is stable.

    Byte-level BPE and SentencePiece tokenizers can need the next token to finish a character
    (a multi-byte UTF-8 sequence shows as U+FFFD until then), and SentencePiece strips a
    leading space from a decode that starts at a word. So we decode from a few tokens back
    (``prefix_offset``) and release only the difference, as vLLM and TGI do.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""


class StopMatcher:
    """Stop strings over streamed text: never releases text that might begin a stop string."""

    def __init__(self, stops: Iterable[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to release now, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[:min(hits)], True
        hold = 0
        for s in self.stops:  # longest suffix of buf that is a proper prefix of a stop string
            for n in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


# ---------------------------------------------------------------------------------------------
@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sink: Callable[[Event], None]
    stop: list[str] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    # state owned by the scheduler thread
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False
    stopped_on_string: bool = False
    _detok: IncrementalDetokenizer | None = None
    _stop: StopMatcher | None = None


class Scheduler:
    def __init__(self, decoder: Any, tokenizer: Tokenizer, metrics: EngineMetrics, *,
                 max_num_seqs: int = 32, lookahead_max_batch_size: int | None = None,
                 eos_token_ids: Iterable[int] = ()):
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.lookahead_max_batch_size = lookahead_max_batch_size
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._cond = threading.Condition()
        self._waiting: collections.deque[GenerationRequest] = collections.deque()
        self._running: dict[str, GenerationRequest] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0

    # -- public, thread-safe --------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def submit(self, req: GenerationRequest) -> None:
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        req._detok = IncrementalDetokenizer(self.tokenizer)
        req._stop = StopMatcher(req.stop)
        with self._cond:
            if self._stopping:
                raise RuntimeError("scheduler is stopped")
            self._waiting.append(req)
            self._publish_load()
            self._cond.notify_all()

    def cancel(self, req: GenerationRequest) -> None:
        """The client went away: drop the request wherever it is (finished_reason=abort)."""
        with self._cond:
            if req in self._waiting:
                self._waiting.remove(req)
                self._publish_load()
                self._finish_unscheduled(req)
                return
            req.cancelled = True
            self._cond.notify_all()

    @property
    def num_running(self) -> int:
        with self._cond:
            return len(self._running)

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def alive(self) -> bool:
        """The loop thread is running (False before start, after stop, or if it crashed)."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def idle(self) -> bool:
        with self._cond:
            return not self._waiting and not self._running

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop; anything still queued or running is aborted."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the loop -------------------------------------------------------------------------
    def _publish_load(self) -> None:  # caller holds the lock
        self.metrics.set_load(len(self._running), len(self._waiting))

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not self._running:
                        self._cond.wait()
                    if self._stopping:
                        leftovers = list(self._waiting) + list(self._running.values())
                        self._waiting.clear()
                        break
                    cancelled = [r for r in self._running.values() if r.cancelled]
                    admit: list[GenerationRequest] = []
                    while self._waiting and len(self._running) + len(admit) < self.max_num_seqs:
                        admit.append(self._waiting.popleft())
                self._iteration(cancelled, admit)
        except Exception:  # pragma: no cover - a bug in the loop itself; say so loudly
            log.error("engine loop crashed:\n%s", traceback.format_exc())
            with self._cond:
                leftovers = list(self._waiting) + list(self._running.values())
                self._waiting.clear()
                self._stopping = True
        for req in leftovers:
            self._drop(req)
            self._finish(req, "abort", time.monotonic())
        with self._cond:
            self._running.clear()
            self._publish_load()

    def _iteration(self, cancelled: list[GenerationRequest], admit: list[GenerationRequest]) -> None:
        for req in cancelled:
            self._drop(req)
            self._finish(req, "abort", time.monotonic())
        for req in admit:
            req.scheduled = time.monotonic()
            try:
                self.decoder.add(req.request_id, list(req.prompt_ids), req.max_tokens)
            except Exception as exc:
                log.error("prefill failed for %s: %s", req.request_id, exc)
                self._abort(req, f"prefill failed: {exc}", time.monotonic())
                continue
            self.metrics.observe_prompt(len(req.prompt_ids))
            with self._cond:
                self._running[req.request_id] = req
        with self._cond:
            self._publish_load()
            running = len(self._running)
        if not running:
            return

        speculate = (self.lookahead_max_batch_size is None
                     or running <= self.lookahead_max_batch_size)
        t0 = time.monotonic()
        try:
            outputs = self.decoder.step(speculate=speculate)
        except Exception as exc:
            log.error("decode step failed:\n%s", traceback.format_exc())
            with self._cond:
                failed = list(self._running.values())
            for req in failed:
                self._drop(req)
                self._abort(req, f"decode step failed: {exc}", time.monotonic())
            return
        now = time.monotonic()
        step_seconds = now - t0
        self.steps += 1

        with self._cond:
            snapshot = dict(self._running)
        for seq_id, out in outputs.items():
            req = snapshot.get(seq_id)
            if req is None:
                continue
            if isinstance(out, SequenceError):
                self._fail(req, out.message, now)
                continue
            self.metrics.observe_spec(int(getattr(out, "draft_tokens", 0) or 0),
                                      int(getattr(out, "accepted_draft_tokens", 0) or 0))
            reason = self._deliver(req, list(out.new_tokens), now, step_seconds)
            if reason is None and getattr(out, "finished", False):
                # the decoder stopped on its own (its EOS set or its max_new_tokens)
                reason = "length" if len(req.output_ids) >= req.max_tokens else "stop"
            if reason is not None:
                self._drop(req)
                self._finish(req, reason, now)
        # sequences the decoder no longer reports (should not happen) would hang their client
        for seq_id, req in snapshot.items():
            if seq_id not in outputs and req.finish_reason is None and not req.cancelled:
                log.error("decoder returned no output for %s; aborting it", seq_id)
                self._drop(req)
                self._abort(req, "decoder lost the sequence", now)
        with self._cond:
            self._publish_load()

    def _deliver(self, req: GenerationRequest, tokens: list[int], now: float,
                 step_seconds: float) -> str | None:
        """Give a request this step's tokens, one at a time; returns a finish reason or None."""
        kept: list[int] = []
        text: list[str] = []
        reason: str | None = None
        for tok in tokens:
            tok = int(tok)
            req.output_ids.append(tok)
            kept.append(tok)
            if tok in self.eos_token_ids:
                reason = "stop"
                break
            released, hit = req._stop.feed(req._detok.push(tok))
            text.append(released)
            if hit:
                req.stopped_on_string = True
                reason = "stop"
                break
            if len(req.output_ids) >= req.max_tokens:
                reason = "length"
                break
        k = len(kept)
        if k == 0:
            return reason
        self.metrics.observe_generated(k)
        if req.first_token is None:
            req.first_token = now
            self.metrics.observe_first_token(req.arrival, now)
            # Tokens after the first in the very first step: spread the step over them.
            if k > 1:
                self.metrics.observe_tokens(step_seconds * (k - 1) / k, k - 1)
        else:
            self.metrics.observe_tokens(now - req.last_token, k)
        req.last_token = now
        self._emit(req, TokenEvent("".join(text), kept))
        return reason

    def _fail(self, req: GenerationRequest, message: str, now: float) -> None:
        """One request's engine error: free its slot, tell its client, count it as finished_reason
        abort. Its time to first token was observed only if a token reached it before."""
        log.warning("request %s failed in the decoder: %s", req.request_id, message)
        self._drop(req)
        self._abort(req, message, now)

    def _abort(self, req: GenerationRequest, message: str, now: float) -> None:
        """End a request as an engine error: counted (finished_reason abort) before its client
        is told, so that a client which saw the error and then scrapes /metrics finds it."""
        self._finish(req, "abort", now, emit=False)
        self._emit(req, ErrorEvent(message))

    def _drop(self, req: GenerationRequest) -> None:
        with self._cond:
            was_running = self._running.pop(req.request_id, None) is not None
        if was_running:
            try:
                self.decoder.remove(req.request_id)
            except KeyError:
                pass  # the decoder already let a finished sequence go
            except Exception as exc:  # pragma: no cover
                log.error("decoder.remove(%s) failed: %s", req.request_id, exc)

    def _finish(self, req: GenerationRequest, reason: str, now: float, emit: bool = True) -> None:
        if req.finish_reason is not None:
            return
        req.finish_reason = reason
        tail = ""
        if reason != "abort" and req._detok is not None and not req.stopped_on_string:
            # release what was held back: an unfinished character, a stop-string prefix
            released, _ = req._stop.feed(req._detok.flush())
            tail = released + req._stop.flush()
        self.metrics.observe_finished(FinishedRequest(
            arrival=req.arrival,
            scheduled=req.scheduled if req.scheduled is not None else now,
            first_token=req.first_token if req.first_token is not None else now,
            last_token=req.last_token if req.last_token is not None else now,
            finished=now,
            prompt_tokens=len(req.prompt_ids),
            generation_tokens=len(req.output_ids),
            finish_reason=reason,
        ))
        if emit:
            self._emit(req, FinishEvent(reason, len(req.prompt_ids), len(req.output_ids), tail))

    def _finish_unscheduled(self, req: GenerationRequest) -> None:
        req.finish_reason = "abort"
        now = time.monotonic()
        self.metrics.observe_finished(FinishedRequest(
            arrival=req.arrival, scheduled=now, first_token=now, last_token=now, finished=now,
            prompt_tokens=len(req.prompt_ids), generation_tokens=0, finish_reason="abort"))

    @staticmethod
    def _emit(req: GenerationRequest, event: Event) -> None:
        try:
            req.sink(event)
        except Exception as exc:  # the client's event loop is gone; nothing to tell it
            log.debug("dropping event for %s: %s", req.request_id, exc)


# ---------------------------------------------------------------------------------------------
# --backend simulate
SIM_WORDS = (
    "the of and to in is that it for on with as was at by an be this from or have are not "
    "but had his they you which one were all we her she there would their will when who him "
    "been has more if no out do so can what up said about other into than its time only could "
    "new them man some these then two first may any like now my such make over our even most "
    "me state after also made many did must before back see through way where get much go well "
    "your know should down work year because come people just say each those take day good "
    "how long little use here own very great still world old life public both between under "
    "last never place same another while part number might again system found set three left"
).split()


class SimTokenizer:
    """Words as tokens, for the simulated backend (no real tokenizer or model needed).

    ``encode`` maps each whitespace-separated word to a vocabulary id (known words to their
    index, others by a stable hash), so prompt lengths scale like real ones; ``decode`` joins
    the words with spaces.
    """

    def __init__(self, words: tuple[str, ...] | list[str] = tuple(SIM_WORDS)):
        self.words = list(words)
        self._index = {w: i for i, w in enumerate(self.words)}
        self.eos_token_id = None

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        ids = []
        for w in text.split():
            i = self._index.get(w.lower())
            if i is None:
                i = sum(w.encode()) * 2654435761 % len(self.words)
            ids.append(i)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(self.words[int(i) % len(self.words)] for i in ids)


@dataclass
class SimStepOutput:
    """Field for field ``decoding.StepOutput`` (the scheduler reads only these attributes).

    A twin rather than an import so the simulated backend never imports torch: simulated
    engine pods start in a fraction of a second.
    """

    new_tokens: list[int]
    draft_tokens: int
    accepted_draft_tokens: int
    finished: bool


@dataclass
class _SimSeq:
    remaining: int
    next_id: int
    speculated: bool = False  # has taken a speculating step (its speculative_error_rate draw is made)


class SimulatedDecoder:
    """A ``BatchDecoder`` whose timing and acceptance come from the roofline simulator.

    Each ``step`` asks ``simulator.decode_step(batch, speculate)`` for the step's seconds and
    each sequence's accepted tokens, sleeps until that much wall time has passed since the
    step began (the simulator's ``time_scale`` shrinks it for tests), and emits that many
    tokens per sequence, cycling through the simulated vocabulary from a start that depends on
    the prompt. It never emits EOS: sequences end at ``max_tokens`` or on a stop string.

    Injected fault (``SimConfig.speculative_error_rate``): at a sequence's first step that really
    speculates (``simulator.speculates(speculate)``), ``simulator.sample_speculative_error()``
    decides once whether it fails; a failing sequence gets no tokens from that step, leaves the
    batch, and its output is a ``SequenceError``. Steps that do not speculate never fail a sequence.
    """

    def __init__(self, simulator: Any, vocab_size: int = len(SIM_WORDS),
                 sleep: Callable[[float], None] = time.sleep):
        self.simulator = simulator
        self.vocab_size = vocab_size
        self._sleep = sleep
        self._seqs: dict[str, _SimSeq] = {}

    @property
    def active(self) -> int:
        return len(self._seqs)

    def _wait_until(self, deadline: float) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._sleep(left)

    def add(self, seq_id: str, prompt_ids: list[int], max_new_tokens: int) -> float:
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already active")
        t0 = time.monotonic()
        seconds = float(self.simulator.prefill_seconds(len(prompt_ids)))
        self._wait_until(t0 + seconds)
        start = (sum(int(i) for i in prompt_ids) + len(prompt_ids)) % self.vocab_size
        self._seqs[seq_id] = _SimSeq(remaining=int(max_new_tokens), next_id=start)
        return seconds

    def remove(self, seq_id: str) -> None:
        self._seqs.pop(seq_id, None)

    def step(self, speculate: bool = True) -> dict[str, SimStepOutput | SequenceError]:
        if not self._seqs:
            return {}
        t0 = time.monotonic()
        sim = self.simulator.decode_step(len(self._seqs), speculate)
        self._wait_until(t0 + float(sim.seconds))
        speculating = self.simulator.speculates(speculate)
        out: dict[str, SimStepOutput | SequenceError] = {}
        for i, (seq_id, seq) in enumerate(list(self._seqs.items())):
            if speculating and not seq.speculated:
                seq.speculated = True
                if self.simulator.sample_speculative_error():
                    del self._seqs[seq_id]
                    out[seq_id] = SequenceError(
                        "speculative decoding failed for this request (simulated fault: "
                        f"speculative_error_rate={self.simulator.config.speculative_error_rate})")
                    continue
            produced = max(1, int(sim.accepted_tokens[i]))
            k = min(produced, seq.remaining)
            tokens = [(seq.next_id + j) % self.vocab_size for j in range(k)]
            seq.next_id = (seq.next_id + k) % self.vocab_size
            seq.remaining -= k
            out[seq_id] = SimStepOutput(
                new_tokens=tokens,
                draft_tokens=int(sim.draft_tokens[i]),
                accepted_draft_tokens=produced - 1,
                finished=seq.remaining <= 0,
            )
        return out
