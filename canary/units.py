"""Human units, parsed in one place: Go-style durations and percentages.

The LookaheadPolicy CRD, the load generator's and ``analyze``'s command lines all take the same
spellings; every one of them parses through these functions (the operator's pydantic models turn
them into typed values once, at validation):

    parse_duration("1h30m") -> 5400.0        format_duration(5400.0) -> "1h30m"
    parse_percent("2.5%") -> 2.5             parse_fraction("2.5%") -> 0.025
"""

from __future__ import annotations

import math
import re
from typing import Union

__all__ = ["DURATION_PATTERN", "parse_duration", "format_duration", "parse_percent", "parse_fraction",
           "format_percent"]

# Go duration syntax (what CEL's duration() parses): 90s, 2m, 1h30m, 500ms, 1.5h.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%?\s*$")


def parse_duration(value: Union[str, int, float]) -> float:
    """Seconds in a Go-style duration: ``"2m"`` -> 120.0, ``"1h30m"`` -> 5400.0, ``"500ms"`` -> 0.5.

    A bare number (or numeric string) is seconds. Units: ms, s, m, h. Raises ``ValueError`` on
    anything else, naming what was given.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '2m', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or math.isnan(value) or math.isinf(value):
            raise ValueError(f"duration must be a finite number of seconds >= 0, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like '2m', got {value!r}")
    text = value.strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return float(text)
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"expected a duration like '90s', '2m' or '1h30m' (units ms, s, m, h), got {value!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_RE.findall(text))


def format_duration(seconds: float) -> str:
    """The Go spelling of a duration, exact to the millisecond: 5400 -> '1h30m', 0.5 -> '500ms'."""
    ms = int(round(seconds * 1000))
    if ms < 0:
        raise ValueError(f"negative duration {seconds!r}")
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "") + (f"{ms}ms" if ms else "")
    return out or "0s"


def parse_percent(value: Union[int, float, str], *, lo: float = 0.0, hi: float = 100.0) -> float:
    """A percentage in percent units: ``"2%"`` -> 2.0, ``"2.5"`` -> 2.5, ``5`` -> 5.0.

    Numbers are percentages too (``2`` means 2 %, not 200 %). Raises ``ValueError`` outside
    ``[lo, hi]`` or when the text is not a percentage.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a percentage like '2%' or a number, got {value!r}")
    if isinstance(value, (int, float)):
        out = float(value)
    elif isinstance(value, str):
        m = _PERCENT_RE.match(value)
        if not m:
            raise ValueError(f"expected a percentage like '2%' or '2.5%', got {value!r}")
        out = float(m.group(1))
    else:
        raise ValueError(f"expected a percentage like '2%' or a number, got {value!r}")
    if math.isnan(out) or not (lo <= out <= hi):
        raise ValueError(f"percentage {value!r} must be between {lo:g}% and {hi:g}%")
    return out


def parse_fraction(value: Union[float, str]) -> float:
    """A command-line share as a fraction: ``'2%'`` -> 0.02, ``'0.02'`` -> 0.02, ``0.02`` -> 0.02.

    (On the command line a bare number is a fraction; in the CRD a bare number is a percent:
    ``parse_percent``.)
    """
    if isinstance(value, str):
        s = value.strip()
        if s.endswith("%"):
            return parse_percent(s) / 100.0
        try:
            out = float(s)
        except ValueError:
            raise ValueError(f"expected a fraction like 0.02 or a percentage like '2%', got {value!r}") from None
    else:
        out = float(value)
    if math.isnan(out) or out < 0:
        raise ValueError(f"expected a fraction >= 0, got {value!r}")
    return out


def format_percent(fraction: float) -> str:
    """0.025 -> '2.5%' (the inverse of ``parse_percent(x) / 100`` to 6 significant digits)."""
    return f"{fraction * 100:.6g}%"
