"""Speculative decoding's acceptance as users read it: the one rule for the mean acceptance length
(tokens per verification step) and the key of one draft position's counter in a ``/metrics`` read.
The operator's Prometheus reads and ``kubectl lookahead analyze``'s direct reads both use these."""

from __future__ import annotations


def acceptance_length(drafts: float | None, accepted: float | None, generated: float | None) -> float | None:
    """Tokens per verification step, bonus token included: ``1 + accepted / drafts`` (vLLM's
    definition); for an engine without an accepted-token counter (``accepted`` None: SGLang, whose
    verify calls and generated tokens both move when a request finishes) ``generated / drafts``.
    None without drafts, or without either count (never 0)."""
    if not drafts or drafts <= 0:
        return None
    if accepted is not None:
        return 1.0 + accepted / drafts
    return generated / drafts if generated else None


def position_key(metric: str, position: int) -> str:
    """The key of one position of the per-position counter in a ``/metrics`` delta dict."""
    return f'{metric}{{position="{position}"}}'
