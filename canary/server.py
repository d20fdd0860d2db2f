"""The reference engine's HTTP server: OpenAI-compatible, with vLLM's metric names.

    python3 -m lookahead_canary.server --host 127.0.0.1 --port 8000 --model smollm2|tiny|PATH \\
        [--served-model-name NAME] [--max-num-seqs 32] \\
        [--speculative-config '{"method":"jacobi","window":7,"ngram":5,"guess_set":7}'] \\
        [--speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}'] \\
        [--lookahead-max-batch-size N] [--backend model|simulate] [--sim-config JSON] \\
        [--runtime auto|torch|numpy] [--report-version VERSION]

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``"stream": true`` gives
server-sent events ending in ``data: [DONE]``; ``stream_options.include_usage`` adds a usage
chunk), ``GET /v1/models``, ``GET /health`` (503 until the model is loaded and while draining),
``GET /metrics`` (Prometheus text; see ``metrics.py``), ``GET /version`` (vLLM's shape:
``{"version": "0.1.0"}``, the lookahead-rollout package's version, or ``--report-version``'s; the
operator reads it from a fleet pod before a rollout).

Decoding is greedy; with ``--speculative-config`` it is lookahead (Jacobi) or n-gram prompt
lookup, which produce exactly the greedy tokens. ``temperature > 0`` is rejected (400, param
``temperature``): lookahead is exact only for greedy decoding, and the control (lookahead off)
rejects it too, so canary and control always serve the same requests. ``ignore_eos`` is
rejected as well: synthetic replays that ignore EOS make acceptance measurements invalid.

SIGTERM (or SIGINT): new requests get 503, ``/health`` turns 503, in-flight requests (running
and queued) finish, then the process exits 0. A second signal aborts what is left and exits 1.

``--runtime numpy`` runs the model as ``nplm.NumpyLlama`` with ``tokenizer.ChatTokenizer`` (no
torch, no transformers): the engine image, which ships SmolLM2's converted weights, runs so;
``auto`` (the default) takes torch where it is installed.

With ``--backend simulate`` no model is loaded: ``SimulatedDecoder`` (scheduler.py) takes its
step times and accepted tokens from the roofline simulator, configured by ``--sim-config``
(``simulator.SimConfig`` JSON; ``"seed"`` is also accepted). The server's own flags decide
whether it speculates: without ``--speculative-config`` the simulator runs greedy, with one the
simulator takes its method and W/N/G or k from it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import specconfig
from .metrics import EngineMetrics
from .models import RUNTIMES  # (models imports torch only when a torch model loads)
from .scheduler import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    Scheduler,
    SimTokenizer,
    SimulatedDecoder,
    TokenEvent,
)

log = logging.getLogger("lookahead_canary.server")

DEFAULT_MAX_TOKENS_COMPLETION = 16   # OpenAI's documented default for /v1/completions
DEFAULT_MAX_TOKENS_CHAT = 256
SIM_MAX_MODEL_LEN = 8192
MAX_STOP_STRINGS = 16

# ---------------------------------------------------------------------------------------------
# command line
def _speculative_config(text: str) -> dict[str, Any]:
    """Parse and validate ``--speculative-config`` (``lookahead_canary.specconfig``), filling defaults."""
    try:
        return specconfig.parse(text)
    except specconfig.SpecConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lookahead-engine",
        description="Reference lookahead engine: OpenAI-compatible server with vLLM metric names.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    p.add_argument("--model", default="smollm2",
                   help="smollm2 | tiny | a model directory | a .gguf file (default smollm2)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send and metrics carry (default: --model)")
    p.add_argument("--max-num-seqs", type=_positive_int, default=32,
                   help="most sequences decoded together; more requests wait (default 32)")
    p.add_argument("--speculative-config", type=_speculative_config, default=None,
                   help='lookahead: \'{"method":"jacobi","window":7,"ngram":5,"guess_set":7}\' or '
                        '\'{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,'
                        '"prompt_lookup_max":5}\'; absent: plain greedy')
    p.add_argument("--lookahead-max-batch-size", type=_positive_int, default=None,
                   help="speculation off while more than N requests run (default: always on)")
    p.add_argument("--backend", choices=("model", "simulate"), default="model",
                   help="model: a real model; simulate: the roofline simulator")
    p.add_argument("--runtime", choices=RUNTIMES, default="auto",
                   help="what runs the model: torch (transformers), numpy (no torch: the engine image) "
                        "or auto, torch where installed (default auto)")
    p.add_argument("--sim-config", type=_json_object, default=None,
                   help="simulator.SimConfig as JSON (with --backend simulate); may add \"seed\"")
    p.add_argument("--report-version", type=_release, default=None,
                   help="the version GET /version answers (default: the lookahead-rollout package's); for "
                        "tests that present another engine release, e.g. an older vLLM than its image tag")
    return p


def _release(text: str) -> str:
    """``--report-version``: a release number (``0.20.1``, ``0.24.0rc1``), as an engine reports it."""
    if not re.match(r"^\d+\.\d+(\.\d+)?([.\-+_]?[0-9A-Za-z.+_-]*)?$", text):
        raise argparse.ArgumentTypeError(f"not a release number: {text!r}")
    return text


def package_version() -> str:
    """The installed lookahead-rollout package's version (``"unknown"`` when it is not installed)."""
    try:
        return importlib.metadata.version("lookahead-rollout")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sim_config is not None and args.backend != "simulate":
        parser.error("--sim-config needs --backend simulate")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    if args.served_model_name is None:
        args.served_model_name = args.model
    return args


def engine_info(args: argparse.Namespace) -> dict[str, str]:
    """Labels of ``lookahead_engine_info``: enough to tell canary and control configs apart."""
    spec = args.speculative_config or {}
    return {
        "backend": args.backend,
        "method": spec.get("method", "greedy"),
        "window": str(spec.get("window", "")),
        "ngram": str(spec.get("ngram", "")),
        "guess_set": str(spec.get("guess_set", "")),
        "num_speculative_tokens": str(spec.get("num_speculative_tokens", "")),
        "prompt_lookup_min": str(spec.get("prompt_lookup_min", "")),
        "prompt_lookup_max": str(spec.get("prompt_lookup_max", "")),
        "max_batch_size": ("" if args.lookahead_max_batch_size is None
                           else str(args.lookahead_max_batch_size)),
        "max_num_seqs": str(args.max_num_seqs),
    }


# ---------------------------------------------------------------------------------------------
# the engine: tokenizer + decoder + scheduler
@dataclass
class Engine:
    tokenizer: Any
    scheduler: Scheduler
    max_model_len: int
    vocab_size: int
    has_chat_template: bool
    load_seconds: float = 0.0


def build_decoder(model: Any, spec: dict[str, Any] | None, eos: set[int],
                  max_num_seqs: int) -> Any:
    from .decoding import make_decoder

    return make_decoder(model, spec, eos_token_ids=sorted(eos), max_batch_size=max_num_seqs)


def simulator_from_args(args: argparse.Namespace):
    from .simulator import RooflineSimulator, SimConfig

    data = dict(args.sim_config or {})
    seed = data.pop("seed", None)
    data.pop("speculative_config", None)
    if args.speculative_config is None:
        data["method"] = "greedy"
    else:
        data["speculative_config"] = {k: v for k, v in args.speculative_config.items()}
    return RooflineSimulator(SimConfig.from_dict(data), seed=seed)


def load_engine(args: argparse.Namespace, metrics: EngineMetrics) -> Engine:
    t0 = time.monotonic()
    if args.backend == "simulate":
        tokenizer = SimTokenizer()
        decoder = SimulatedDecoder(simulator_from_args(args), vocab_size=len(tokenizer))
        eos: set[int] = set()
        max_len, vocab, chat = SIM_MAX_MODEL_LEN, len(tokenizer), False
    else:
        from .models import eos_ids, load_model

        model, tokenizer = load_model(args.model, runtime=args.runtime)
        eos = eos_ids(model, tokenizer)
        decoder = build_decoder(model, args.speculative_config, eos, args.max_num_seqs)
        max_len = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
        vocab = int(getattr(model.config, "vocab_size", len(tokenizer)))
        chat = bool(getattr(tokenizer, "chat_template", None))
    scheduler = Scheduler(decoder, tokenizer, metrics, max_num_seqs=args.max_num_seqs,
                          lookahead_max_batch_size=args.lookahead_max_batch_size,
                          eos_token_ids=eos)
    return Engine(tokenizer=tokenizer, scheduler=scheduler, max_model_len=max_len,
                  vocab_size=vocab, has_chat_template=chat, load_seconds=time.monotonic() - t0)


# ---------------------------------------------------------------------------------------------
# request validation (pure; unit-tested)
class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param}
        if self.code is not None:
            err["code"] = self.code
        return {"error": err}


@dataclass
class ParsedRequest:
    prompt_ids: list[int]
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)


@dataclass
class ServingContext:
    """What validation needs to know about the engine."""

    served_model_name: str
    max_model_len: int
    vocab_size: int
    speculative_method: str | None  # None: plain greedy
    tokenizer: Any = None
    has_chat_template: bool = False


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _common(body: dict[str, Any], ctx: ServingContext, default_max_tokens: int,
            max_tokens_keys: tuple[str, ...]) -> dict[str, Any]:
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise RequestError("`model` must be a string", "model")
        if model != ctx.served_model_name:
            raise RequestError(f"The model `{model}` does not exist; this server serves "
                               f"`{ctx.served_model_name}`", "model", status=404,
                               code="model_not_found")
    out: dict[str, Any] = {}
    max_tokens, key = None, max_tokens_keys[0]
    for k in max_tokens_keys:
        if body.get(k) is not None:
            max_tokens, key = body[k], k
            break
    if max_tokens is not None:
        if not _is_int(max_tokens):
            raise RequestError(f"`{key}` must be an integer", key)
        if max_tokens < 1:
            raise RequestError(f"`{key}` must be at least 1, got {max_tokens}", key)
        if max_tokens > ctx.max_model_len:
            raise RequestError(f"`{key}` must be at most {ctx.max_model_len} (the model's "
                               f"context length), got {max_tokens}", key)
    out["max_tokens"], out["max_tokens_key"] = max_tokens, key
    out["default_max_tokens"] = default_max_tokens

    temperature = body.get("temperature")
    if temperature is not None:
        if not _is_number(temperature) or not math.isfinite(temperature):
            raise RequestError("`temperature` must be a number", "temperature")
        if temperature < 0 or temperature > 2:
            raise RequestError(f"`temperature` must be between 0 and 2, got {temperature}",
                               "temperature")
        if temperature > 0:
            if ctx.speculative_method is not None:
                raise RequestError(
                    f"`temperature` must be 0 (or absent) with lookahead decoding "
                    f"(method {ctx.speculative_method}): it reproduces greedy decoding exactly "
                    f"and does not sample; got temperature={temperature}", "temperature")
            raise RequestError(
                f"`temperature` must be 0 (or absent): this engine decodes greedily (so that "
                f"it serves the same requests as its lookahead canary); got "
                f"temperature={temperature}", "temperature")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError("`stream` must be a boolean", "stream")
    out["stream"] = stream
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise RequestError("`stream_options` must be an object", "stream_options")
        include_usage = opts.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise RequestError("`stream_options.include_usage` must be a boolean",
                               "stream_options")
    out["include_usage"] = include_usage

    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise RequestError("`stop` must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"`stop` takes at most {MAX_STOP_STRINGS} strings", "stop")
    out["stop"] = [s for s in stops if s]

    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise RequestError("only `n` = 1 is supported", "n")
    if body.get("ignore_eos") not in (None, False):
        raise RequestError("`ignore_eos` is not supported: replaying traffic that ignores EOS "
                           "makes acceptance measurements invalid", "ignore_eos")
    return out


def _finish_parse(common: dict[str, Any], prompt_ids: list[int], ctx: ServingContext,
                  prompt_param: str) -> ParsedRequest:
    if not prompt_ids:
        raise RequestError(f"`{prompt_param}` is empty after tokenisation", prompt_param)
    room = ctx.max_model_len - len(prompt_ids)
    if room < 1:
        raise RequestError(f"the prompt is {len(prompt_ids)} tokens; the model's context "
                           f"length is {ctx.max_model_len}", prompt_param)
    max_tokens = common["max_tokens"]
    if max_tokens is None:
        max_tokens = min(common["default_max_tokens"], room)
    elif max_tokens > room:
        key = common["max_tokens_key"]
        raise RequestError(f"`{key}` + prompt tokens must be at most {ctx.max_model_len} "
                           f"(the model's context length): {max_tokens} + "
                           f"{len(prompt_ids)}", key)
    return ParsedRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, stream=common["stream"],
                         include_usage=common["include_usage"], stop=common["stop"])


def _encode(ctx: ServingContext, text: str) -> list[int]:
    return [int(t) for t in ctx.tokenizer.encode(text)]


def parse_completion(body: Any, ctx: ServingContext) -> ParsedRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    common = _common(body, ctx, DEFAULT_MAX_TOKENS_COMPLETION, ("max_tokens",))
    if "prompt" not in body or body["prompt"] is None:
        raise RequestError("`prompt` is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("`prompt` must not be empty", "prompt")
        ids = _encode(ctx, prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(t < 0 or t >= ctx.vocab_size for t in prompt):
            raise RequestError(f"`prompt` token ids must be in [0, {ctx.vocab_size})", "prompt")
        ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise RequestError("`prompt` must be one prompt (a string or a list of token ids); "
                           "batches of prompts are not supported", "prompt")
    else:
        raise RequestError("`prompt` must be a non-empty string or list of token ids", "prompt")
    return _finish_parse(common, ids, ctx, "prompt")


CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")


def _message_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise RequestError(f"`messages[{i}].content` parts must be "
                                   "{\"type\": \"text\", \"text\": ...}", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"`messages[{i}].content` must be a string or a list of text parts",
                       "messages")


def render_chat(messages: list[dict[str, str]], ctx: ServingContext) -> list[int]:
    if ctx.has_chat_template:
        from .models import chat_prompt  # the rendering bench-engine uses too (same token ids)

        return chat_prompt(ctx.tokenizer, messages)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return _encode(ctx, text)


def parse_chat(body: Any, ctx: ServingContext) -> ParsedRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    common = _common(body, ctx, DEFAULT_MAX_TOKENS_CHAT, ("max_completion_tokens", "max_tokens"))
    messages = body.get("messages")
    if messages is None:
        raise RequestError("`messages` is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"`messages[{i}]` must be an object", "messages")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise RequestError(f"`messages[{i}].role` must be one of {list(CHAT_ROLES)}",
                               "messages")
        clean.append({"role": role, "content": _message_text(m.get("content"), i)})
    return _finish_parse(common, render_chat(clean, ctx), ctx, "messages")


# ---------------------------------------------------------------------------------------------
# HTTP
def _error(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@web.middleware
async def _json_http_errors(request: web.Request, handler):
    """aiohttp's own 4xx/5xx (unknown path, wrong method, body too large) as OpenAI-style JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "internal_server_error"
        return web.json_response(
            {"error": {"message": f"{exc.reason}: {request.method} {request.path}",
                       "type": kind, "param": None}},
            status=exc.status, headers={k: v for k, v in exc.headers.items()
                                        if k.lower() == "allow"})


class EngineServer:
    """The aiohttp application and the process lifecycle (loading, ready, draining)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.metrics = EngineMetrics(args.served_model_name, engine="0",
                                     max_num_seqs=args.max_num_seqs, info=engine_info(args))
        self.engine: Engine | None = None
        self.ctx: ServingContext | None = None
        self.draining = False
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self.app = web.Application(middlewares=[_json_http_errors])
        self.app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/version", self.version),
        ])

    # -- lifecycle ------------------------------------------------------------------------
    def set_engine(self, engine: Engine) -> None:
        spec = self.args.speculative_config
        self.ctx = ServingContext(
            served_model_name=self.args.served_model_name, max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size, speculative_method=spec["method"] if spec else None,
            tokenizer=engine.tokenizer, has_chat_template=engine.has_chat_template)
        engine.scheduler.start()
        self.engine = engine

    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.draining

    async def drained(self) -> None:
        """Wait until no request handler is running and the scheduler holds nothing."""
        if self._idle is None:
            self._idle = asyncio.Event()
        while True:
            if self._inflight == 0 and (self.engine is None or self.engine.scheduler.idle()):
                return
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    def _unavailable(self) -> web.Response | None:
        if self.draining:
            return _error(RequestError("the server is shutting down", None, status=503,
                                       type="service_unavailable"))
        if self.engine is None:
            return _error(RequestError("the model is still loading", None, status=503,
                                       type="service_unavailable"))
        return None

    # -- endpoints ------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.engine is None:
            return web.json_response({"status": "loading"}, status=503)
        if not self.engine.scheduler.alive:
            return web.json_response({"status": "engine loop stopped"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        data = {"id": self.args.served_model_name, "object": "model",
                "created": int(_START_TIME), "owned_by": "lookahead-rollout",
                "root": self.args.model}
        if self.engine is not None:
            data["max_model_len"] = self.engine.max_model_len
        return web.json_response({"object": "list", "data": [data]})

    async def version(self, request: web.Request) -> web.Response:
        """vLLM's ``GET /version`` shape; answered while loading too (the version does not wait for the model)."""
        return web.json_response({"version": self.args.report_version or package_version()})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        self._inflight += 1
        try:
            try:
                raw = await request.read()
                try:
                    body = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise RequestError(f"the request body is not valid JSON: {exc}") from None
                parsed = (parse_chat if chat else parse_completion)(body, self.ctx)
            except RequestError as exc:
                return _error(exc)
            return await self._generate(request, parsed, chat)
        finally:
            self._inflight -= 1
            if self._idle is not None:
                self._idle.set()

    async def _generate(self, request: web.Request, parsed: ParsedRequest,
                        chat: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def sink(event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        name = self.args.served_model_name
        greq = GenerationRequest(request_id=rid, prompt_ids=parsed.prompt_ids,
                                 max_tokens=parsed.max_tokens, sink=sink, stop=parsed.stop)
        scheduler = self.engine.scheduler
        try:
            scheduler.submit(greq)
        except RuntimeError:
            return _error(RequestError("the engine is stopped", None, status=503,
                                       type="service_unavailable"))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish_reason: str | None, first: bool = False) -> dict:
            if chat:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None,
                          "finish_reason": finish_reason}
            return {"id": rid, "object": obj, "created": created, "model": name,
                    "choices": [choice]}

        def usage(fin: FinishEvent) -> dict:
            return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
                    "total_tokens": fin.prompt_tokens + fin.completion_tokens}

        resp: web.StreamResponse | None = None
        try:
            if not parsed.stream:
                pieces: list[str] = []
                while True:
                    event = await queue.get()
                    if isinstance(event, TokenEvent):
                        pieces.append(event.text)
                        if request.transport is None or request.transport.is_closing():
                            scheduler.cancel(greq)
                    elif isinstance(event, FinishEvent):
                        pieces.append(event.text)
                        text = "".join(pieces)
                        if chat:
                            choice = {"index": 0, "message": {"role": "assistant",
                                                              "content": text},
                                      "logprobs": None, "finish_reason": event.finish_reason}
                        else:
                            choice = {"index": 0, "text": text, "logprobs": None,
                                      "finish_reason": event.finish_reason}
                        return web.json_response({
                            "id": rid, "object": "chat.completion" if chat else "text_completion",
                            "created": created, "model": name, "choices": [choice],
                            "usage": usage(event)})
                    elif isinstance(event, ErrorEvent):
                        return _error(RequestError(event.message, None, status=500,
                                                   type="internal_server_error"))

            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
            await resp.prepare(request)
            if chat:
                await resp.write(_sse(chunk("", None, first=True)))
            while True:
                event = await queue.get()
                if isinstance(event, TokenEvent):
                    if event.text:
                        await resp.write(_sse(chunk(event.text, None)))
                elif isinstance(event, FinishEvent):
                    if event.text:
                        await resp.write(_sse(chunk(event.text, None)))
                    await resp.write(_sse(chunk(None if chat else "", event.finish_reason)))
                    if parsed.include_usage:
                        await resp.write(_sse({"id": rid, "object": obj, "created": created,
                                               "model": name, "choices": [],
                                               "usage": usage(event)}))
                    break
                elif isinstance(event, ErrorEvent):
                    await resp.write(_sse(RequestError(event.message, None, status=500,
                                                       type="internal_server_error").body()))
                    break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except ConnectionError:
            # the client went away mid-stream: free its batch slot (finished_reason=abort)
            scheduler.cancel(greq)
            log.info("client of %s disconnected; request aborted", rid)
            return resp
        except asyncio.CancelledError:
            scheduler.cancel(greq)
            raise


_START_TIME = time.time()


# ---------------------------------------------------------------------------------------------
async def serve(args: argparse.Namespace) -> int:
    server = EngineServer(args)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals_seen = 0

    def on_signal(signame: str) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info("%s: draining (new requests get 503; %d in flight)", signame,
                     server._inflight)
            server.draining = True
            stop.set()
        else:
            log.warning("%s again: aborting in-flight requests", signame)
            os._exit(1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)

    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    bound = ", ".join(f"http://{a[0]}:{a[1]}" for a in runner.addresses
                      if isinstance(a, tuple)) or f"http://{args.host}:{args.port}"
    log.info("engine listening on %s (loading model %s)", bound, args.model)

    loaded: asyncio.Future = loop.create_future()

    def load() -> None:
        try:
            engine = load_engine(args, server.metrics)
        except BaseException as exc:  # noqa: BLE001 - reported, then the process exits 1
            loop.call_soon_threadsafe(loaded.set_exception, exc)
        else:
            loop.call_soon_threadsafe(loaded.set_result, engine)

    threading.Thread(target=load, name="model-loader", daemon=True).start()
    stop_task = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({loaded, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    if loaded in done:
        try:
            engine = loaded.result()
        except Exception as exc:
            log.error("cannot load the engine: %s", exc)
            await runner.cleanup()
            return 1
        server.set_engine(engine)
        log.info("engine ready: loaded in %.1f s, max_model_len %d", engine.load_seconds,
                 engine.max_model_len)
        await stop_task
    else:
        loaded.cancel()
    t0 = time.monotonic()
    await server.drained()
    log.info("drained in %.1f s", time.monotonic() - t0)
    await runner.cleanup()
    if server.engine is not None:
        server.engine.scheduler.stop()
    log.info("stopped; exiting 0")
    return 0


def _startup_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "host": args.host, "port": args.port, "model": args.model,
        "served_model_name": args.served_model_name, "backend": args.backend,
        "max_num_seqs": args.max_num_seqs, "speculative_config": args.speculative_config,
        "lookahead_max_batch_size": args.lookahead_max_batch_size, "sim_config": args.sim_config,
        "pid": os.getpid(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("engine starting: %s", json.dumps(_startup_config(args), sort_keys=True))
    rc = asyncio.run(serve(args))
    # Everything is drained and closed. Skip the interpreter's teardown of torch and
    # transformers (seconds on a small CPU), so a terminating pod goes away at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
