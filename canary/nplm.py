"""A Llama-family causal LM in numpy, for the reference engine without torch.

``NumpyLlama`` holds the weights as float32 arrays and runs the forward pass the decoders of
``decoding.py`` need (``decoding._NumpyRunner`` drives it): token embedding, per layer RMSNorm,
grouped-query attention with rotary position embeddings under an explicit mask over a KV cache
the decoder owns, a SwiGLU MLP, the final norm and the (tied) LM head. It is the same arithmetic
as transformers' ``LlamaForCausalLM`` in float32 (``tests/unit/canary/test_nplm.py`` checks the
logits against it), with nothing of torch imported, so that an engine image needs only numpy
for it.

Why by hand: the libraries that run such a model on a CPU without torch (llama.cpp's bindings,
ONNX Runtime) cannot run a decoder's own attention mask and KV layout, which Jacobi lookahead
needs (a tree mask over query tokens written into a shared cache); the forward pass is forty
lines of numpy.

Weights come from ``from_state_dict`` (transformers' names: ``model.layers.N.self_attn.q_proj.weight``
...), which ``from_torch`` (a loaded transformers model) and ``from_safetensors`` (a model
directory) feed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Mapping

import numpy as np

__all__ = ["NumpyLlama", "LlamaLayer"]


@dataclass
class LlamaLayer:
    input_norm: np.ndarray  # [H]
    q: np.ndarray  # [H, heads * head_dim] (transposed: x @ q)
    k: np.ndarray  # [H, kv_heads * head_dim]
    v: np.ndarray  # [H, kv_heads * head_dim]
    o: np.ndarray  # [heads * head_dim, H]
    post_norm: np.ndarray  # [H]
    gate: np.ndarray  # [H, I]
    up: np.ndarray  # [H, I]
    down: np.ndarray  # [I, H]


def _rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"rope type {params.get('rope_type')!r} is not supported (default only)")
        return float(params["rope_theta"])
    scaling = getattr(cfg, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {scaling!r} is not supported (default only)")
    return float(getattr(cfg, "rope_theta", 10000.0))


class NumpyLlama:
    """The model: ``config`` (the transformers config's fields the decoders read) and the forward
    pieces ``embed``, ``layer_forward``, ``logits``."""

    def __init__(self, config, embed: np.ndarray, layers: list[LlamaLayer], norm: np.ndarray,
                 lm_head: np.ndarray | None = None):
        self.config = config
        self.hidden = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.embed_tokens = embed  # [V, H]
        self.layers = layers
        self.norm = norm
        self.lm_head_t = np.ascontiguousarray((embed if lm_head is None else lm_head).T)  # [H, V]
        half = np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim
        self.inv_freq = (1.0 / (_rope_theta(config) ** half)).astype(np.float32)  # [head_dim / 2]

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_state_dict(cls, config, tensors: Mapping[str, np.ndarray]) -> "NumpyLlama":
        def w(name: str) -> np.ndarray:
            return np.asarray(tensors[name], dtype=np.float32)

        def t(name: str) -> np.ndarray:  # nn.Linear stores [out, in]; x @ W.T
            return np.ascontiguousarray(w(name).T)

        layers = []
        for i in range(int(config.num_hidden_layers)):
            p = f"model.layers.{i}."
            layers.append(LlamaLayer(
                input_norm=w(p + "input_layernorm.weight"), q=t(p + "self_attn.q_proj.weight"),
                k=t(p + "self_attn.k_proj.weight"), v=t(p + "self_attn.v_proj.weight"),
                o=t(p + "self_attn.o_proj.weight"), post_norm=w(p + "post_attention_layernorm.weight"),
                gate=t(p + "mlp.gate_proj.weight"), up=t(p + "mlp.up_proj.weight"), down=t(p + "mlp.down_proj.weight")))
        head = None
        if not getattr(config, "tie_word_embeddings", False) and "lm_head.weight" in tensors:
            head = w("lm_head.weight")
        return cls(config, w("model.embed_tokens.weight"), layers, w("model.norm.weight"), head)

    @classmethod
    def from_torch(cls, model) -> "NumpyLlama":
        """The weights of a loaded transformers Llama model (float32 copies)."""
        state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        return cls.from_state_dict(model.config, state)

    @classmethod
    def from_safetensors(cls, directory: str | Path) -> "NumpyLlama":
        """A transformers model directory (``config.json`` and ``*.safetensors``)."""
        from safetensors.numpy import load_file

        d = Path(directory)
        config = SimpleNamespace(**json.loads((d / "config.json").read_text()))
        tensors: dict[str, np.ndarray] = {}
        for f in sorted(d.glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        return cls.from_state_dict(config, tensors)

    # ------------------------------------------------------------------ forward
    def _rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        var = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(var + self.eps)) * weight

    def _rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """``x`` [B, q, heads, head_dim]; ``cos``/``sin`` [B, q, 1, head_dim]."""
        half = self.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def rotary(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        freqs = pos[..., None].astype(np.float32) * self.inv_freq  # [B, q, head_dim / 2]
        emb = np.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
        return np.cos(emb), np.sin(emb)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self.embed_tokens[ids]

    def layer_forward(self, i: int, h: np.ndarray, rope: tuple[np.ndarray, np.ndarray], bias: np.ndarray,
                      write_kv) -> np.ndarray:
        """One decoder layer on hidden states ``h`` [B, q, H]. ``bias`` [B, 1, 1, q, T] is 0 where a
        query may attend and -inf-like elsewhere; ``write_kv(i, k, v)`` stores this step's K/V
        ([B, q, kv_heads, head_dim]) in the decoder's cache and returns the cache's K and V over
        the attended length, [B, kv_heads, T, head_dim] each."""
        L = self.layers[i]
        B, q, _ = h.shape
        hd, nh, nkv = self.head_dim, self.heads, self.kv_heads
        x = self._rms(h, L.input_norm)
        cos, sin = rope
        qs = self._rope((x @ L.q).reshape(B, q, nh, hd), cos, sin)
        ks = self._rope((x @ L.k).reshape(B, q, nkv, hd), cos, sin)
        vs = (x @ L.v).reshape(B, q, nkv, hd)
        K, V = write_kv(i, ks, vs)
        g = nh // nkv  # query heads per KV head (transformers' repeat_kv: consecutive heads share one)
        qg = qs.transpose(0, 2, 1, 3).reshape(B, nkv, g, q, hd)
        scores = np.matmul(qg, K[:, :, None].swapaxes(-1, -2)) * np.float32(hd ** -0.5) + bias  # [B, kv, g, q, T]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        att = np.matmul(scores, V[:, :, None])  # [B, kv, g, q, hd]
        att = att.reshape(B, nh, q, hd).transpose(0, 2, 1, 3).reshape(B, q, nh * hd)
        h = h + att @ L.o
        x = self._rms(h, L.post_norm)
        gate = x @ L.gate
        h = h + ((gate / (1.0 + np.exp(-gate))) * (x @ L.up)) @ L.down
        return h

    def logits(self, h: np.ndarray) -> np.ndarray:
        return self._rms(h, self.norm) @ self.lm_head_t
