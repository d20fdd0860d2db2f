"""Live traffic: canary against control while both serve a share of the fleet's real traffic,
compared per offered-load stratum (pure; numpy only).

Why strata, and why not by running batch size
---------------------------------------------
In live mode nobody sets the batch size: users send requests, the router spreads them, and each
pod runs whatever is in flight. By Little's law a pod's running batch is its arrival rate times the
time a request stays (B = lambda x D), and D is what the treatment changes: a faster arm finishes
sooner and runs *fewer* requests at once. The running batch is therefore an **outcome**; comparing
arms "at the same running batch" compares a faster arm's busy windows with a slower arm's quiet
ones (and an arm's high-batch windows are its slow ones: a slowdown raises B). We stratify on what
the router sets and the treatment does not: the **offered load per pod** in the window (requests
routed per pod per window). The caller passes, per window, the offered load of the *fleet* (all
requests the fleet's Service or route received, per pod): a canary serving a small share does not
move it, and unlike the requests routed to one arm it cannot depend on that arm's own queue (a
load-aware picker sends fewer requests to a busier pod).

What one window is
------------------
A ``LiveWindow``: the same wall-clock window for both arms (so drift, prompt mix and everything else
the two arms share cancels in the pair), the window's ``offered_load`` (the stratum key) and per arm
an ``ArmWindow``:

* ``per_token_latency`` -- seconds per output token over the window (histogram ``_sum``/``_count``
  increase); None when the arm finished no token.
* ``token_rate`` -- output tokens per second per running request: tokens generated in the window
  over the request-seconds in flight (the window's mean ``num_requests_running`` x its length).
  Under open-loop traffic a pod's tokens per second follow what its users ask for, whatever it
  runs, so "tokens/s" compares demand, not the config; tokens per second per request being served
  is the throughput each user gets (the guard's production-mode argument, docs/statistics.md
  section 6). 0 when requests were in flight and no token came out (a stall, counted against the
  arm); None when nothing was in flight.
* ``ttft`` -- mean time to first token of the requests started in the window (None if none).
* ``requests``, ``errors`` -- requests routed to the arm (per pod) and how many failed: counted per
  stratum for status and for the safety checks (``compare_error_rate``); not a test here.
* ``running`` -- the arm's mean running batch. Reported (the control's is what the crossover's batch
  size is read from), never a stratum key.

Strata (``Strata``): explicit, increasing interior edges e_1 < ... < e_k on the offered load give
k + 1 strata [0, e_1), [e_1, e_2), ..., [e_k, inf); a window belongs to stratum
``searchsorted(edges, offered_load, side="right")`` (an edge belongs to the stratum above it).
``Strata.geometric(low, high, ratio=2)`` builds edges low*ratio, low*ratio^2, ... below ``high``:
a stratum per doubling of the offered load over the planned range, the open ends catching the
rest. The edges are fixed before any data (the family split counts them).

The comparison per stratum
--------------------------
Per stratum, the paired comparisons that a synthetic load step runs (``PairedComparison``): per-token
latency (mean per-window log-ratio), the per-request token rate (ratio of sums, stalls counted) and
TTFT (mean log-ratio, a veto like the tail in a step: ``max_ttft_regression``, default 50% as the
guard's ``maxTtftRegression``). The error budget is split over strata x 3 metrics exactly as a sweep
splits it over batch sizes x 3 metrics (``Thresholds.for_family``: loss bounds one-sided at half a
Bonferroni share each, the canary-better bounds at one share for all strata). That one win share is
valid because the decision reads Wins only along the run from the lowest stratum (below): the
fixed-sequence argument of docs/statistics.md section 4, with the strata in their load order.

Per stratum, as ``BatchComparison.outcome`` does for a step:
**Regresses** -- the token rate is confidently worse than ``max_throughput_regression`` or TTFT
than ``max_ttft_regression``; **Wins** -- latency confidently better than
``min_latency_improvement`` and the token rate confidently not worse than its tolerance;
**NoGain** -- latency confidently not better by the minimum improvement; otherwise **Pending**.
A stratum with fewer than ``min_samples`` paired windows is Pending, whatever its interval says, and
Pending is never a win. By default every look re-reads all of a stratum's windows (``freeze=False``):
live load moves through a stratum (a ramp enters it at one edge), so its first windows are not a
sample of the whole stratum, and a step's "stop at the first settled look" would decide on one end
of it (the benchmark measured wrong promotions of 3-13% that way). ``freeze=True`` keeps a
stratum's first settled outcome and counts later windows in ``ignored``.

The decision's reading (``LiveResults``)
----------------------------------------
The *visited* strata are those that received at least ``min_samples`` windows (a count that only the
offered load decides, not the treatment). Lookahead pays in the run of Wins from the lowest visited
stratum: ``enabled`` (their indices) and ``enabled_below`` (the upper edge of the run: lookahead on
while the offered load per pod is below it). The **crossover** (``Crossover``) is the stratum that
ends the run with a loss (Regresses or NoGain): the lowest offered load where lookahead stops paying,
with the control's mean running batch there (the batch size it corresponds to on the fleet as it
runs today). A run that ends at a Pending stratum has no crossover (it lies above the run, not
measured), as ``decide()`` says for an unmeasured batch size.

Usage::

    strata = Strata.geometric(low=1.0, high=32.0)            # requests per pod per window
    live = LiveComparison(Thresholds(), strata)               # the policy's thresholds; split here
    live.add(LiveWindow(offered_load=6.1,
                        control=ArmWindow(per_token_latency=0.021, token_rate=47.0, ttft=0.30, requests=6),
                        canary=ArmWindow(per_token_latency=0.016, token_rate=61.0, ttft=0.33, requests=6)))
    res = live.results()          # res.strata[i].outcome, res.enabled_below, res.crossover

Future work, not done: CUPED-style adjustment on a pre-period of the same pods (Deng et al. 2013;
the regression-adjusted sequences of Lindon et al., arXiv:2210.08589) would narrow the per-window
log-ratios' spread; the guard's ``measure.offered_load_adjusted`` does a regression adjustment on
the router's per-arm imbalance, which is not used here (strata key on the fleet's load instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Sequence

import numpy as np

from lookahead_operator.measurement.stats.comparisons import PairedComparison
from lookahead_operator.measurement.stats.thresholds import Thresholds
from lookahead_operator.measurement.stats.verdicts import ComparisonResult, Direction

#: Tests per stratum in the family-wise split: per-token latency, per-request token rate, TTFT.
LIVE_METRICS_PER_STRATUM = 3
#: Default TTFT veto: the canary's mean time to first token may rise at most 50% (the guard's default).
DEFAULT_MAX_TTFT_REGRESSION = 0.5


class StratumOutcome(str, Enum):
    """A stratum's outcome; the same words as a batch size's (``verdict.BatchOutcome``)."""

    WINS = "Wins"
    REGRESSES = "Regresses"
    NO_GAIN = "NoGain"
    PENDING = "Pending"

    @property
    def settled(self) -> bool:
        return self is not StratumOutcome.PENDING

    @property
    def loss(self) -> bool:
        return self in (StratumOutcome.REGRESSES, StratumOutcome.NO_GAIN)


@dataclass(frozen=True)
class Strata:
    """Offered-load strata from explicit interior edges: stratum i is [edges[i-1], edges[i]) with
    edges[-1] = 0 and edges[k] = inf, so ``len(edges) + 1`` strata."""

    edges: tuple[float, ...]

    def __post_init__(self) -> None:
        e = tuple(float(x) for x in self.edges)
        if any(not math.isfinite(x) or x <= 0 for x in e):
            raise ValueError("strata edges must be finite and > 0")
        if any(b <= a for a, b in zip(e, e[1:])):
            raise ValueError("strata edges must be strictly increasing")
        object.__setattr__(self, "edges", e)

    @classmethod
    def geometric(cls, low: float, high: float, ratio: float = 2.0) -> "Strata":
        """Edges ``low * ratio**j`` for j = 1, 2, ... while below ``high``: one stratum per factor
        ``ratio`` of offered load from ``low`` to ``high``, plus the open ends ([0, low*ratio) holds
        everything up to the first edge, the last stratum everything from the last edge up). E.g.
        low 1, high 32, ratio 2 -> edges (2, 4, 8, 16): strata [0,2) [2,4) [4,8) [8,16) [16,inf)."""
        if not (low > 0 and high > low and ratio > 1):
            raise ValueError("need 0 < low < high and ratio > 1")
        edges: list[float] = []
        x = low * ratio
        while x < high * (1 - 1e-12):
            edges.append(x)
            x *= ratio
        return cls(tuple(edges))

    def __len__(self) -> int:
        return len(self.edges) + 1

    def index(self, offered_load: float | np.ndarray) -> Any:
        """The stratum of an offered load (vectorised); a value on an edge belongs to the stratum above."""
        idx = np.searchsorted(np.asarray(self.edges, dtype=float), np.asarray(offered_load, dtype=float),
                              side="right")
        return int(idx) if np.ndim(idx) == 0 else idx

    def bounds(self, i: int) -> tuple[float, float]:
        """(lower, upper) offered load of stratum i; upper is inf for the last."""
        if not 0 <= i < len(self):
            raise IndexError(f"stratum {i} of {len(self)}")
        lo = 0.0 if i == 0 else self.edges[i - 1]
        hi = math.inf if i == len(self.edges) else self.edges[i]
        return lo, hi


@dataclass(frozen=True)
class ArmWindow:
    """One arm over one window (see the module docstring for each field's meaning and units)."""

    per_token_latency: float | None
    token_rate: float | None
    ttft: float | None = None
    requests: int = 0
    errors: int = 0
    running: float | None = None  # an outcome: reported, never a stratum key

    @property
    def served(self) -> int:
        """Requests counted: never fewer than the failed ones (counters read apart can disagree)."""
        return max(int(self.requests), int(self.errors), 0)

    @property
    def error_rate(self) -> float:
        """The share of failed requests; 0 when none were served."""
        return min(1.0, max(0, int(self.errors)) / self.served) if self.served else 0.0


@dataclass(frozen=True)
class LiveWindow:
    """Both arms over the same wall-clock window, and the fleet's offered load per pod in it."""

    offered_load: float
    control: ArmWindow
    canary: ArmWindow


@dataclass(frozen=True)
class StratumResult:
    """One stratum as of now."""

    index: int
    low: float  # offered load per pod per window, inclusive
    high: float  # exclusive; inf for the last stratum
    windows: int  # windows that fell in this stratum (all of them, settled or not)
    pairs: int  # paired latency windows the outcome was read from
    outcome: StratumOutcome
    latency: ComparisonResult
    token_rate: ComparisonResult
    ttft: ComparisonResult
    ignored: int = 0  # windows after the outcome was settled (freeze), not added
    control_running: float | None = None  # mean running batch of the control in this stratum's windows
    canary_running: float | None = None
    requests: tuple[int, int] = (0, 0)  # (control, canary) routed requests
    errors: tuple[int, int] = (0, 0)
    vetoes: tuple[str, ...] = ()  # metrics whose loss made it Regresses: "token_rate", "ttft"
    min_samples: int = 10  # the thresholds' min_samples: below it the stratum is Pending

    @property
    def visited(self) -> bool:
        """``is_visited``: decided by the offered load and the arms' routing, never by outcomes."""
        return is_visited(self.windows, self.pairs, self.min_samples)

    @property
    def leaning(self) -> bool:
        """Pending, with the canary's per-token latency estimate below the control's (``read_run``
        passes over such a stratum below the run)."""
        return leans_to_canary(self.outcome, self.latency.estimate)

    def to_dict(self) -> dict:
        return {
            "stratum": self.index, "offeredLoadLow": self.low,
            "offeredLoadHigh": None if math.isinf(self.high) else self.high,
            "windows": self.windows, "pairs": self.pairs, "ignored": self.ignored, "outcome": self.outcome.value,
            "latency": self.latency.to_dict(), "tokenRate": self.token_rate.to_dict(), "ttft": self.ttft.to_dict(),
            "controlRunning": self.control_running, "canaryRunning": self.canary_running,
            "requests": {"control": self.requests[0], "canary": self.requests[1]},
            "errors": {"control": self.errors[0], "canary": self.errors[1]}, "vetoes": list(self.vetoes),
        }


@dataclass(frozen=True)
class Crossover:
    """Where lookahead stops paying: the lowest-load loss after the run of wins."""

    stratum: int
    offered_load: float  # the stratum's lower edge (requests per pod per window)
    outcome: StratumOutcome
    control_running: float | None  # the control's mean running batch there: the batch size it corresponds to


@dataclass(frozen=True)
class LiveResults:
    strata: tuple[StratumResult, ...]
    thresholds: Thresholds  # the per-test thresholds every comparison ran at (the family split)
    enabled: tuple[int, ...]  # the run of Wins from the lowest visited stratum
    enabled_below: float | None  # lookahead pays below this offered load (None: nowhere; inf: everywhere measured)
    crossover: Crossover | None

    def to_dict(self) -> dict:
        c = self.crossover
        return {
            "strata": [s.to_dict() for s in self.strata],
            "confidence": self.thresholds.confidence, "winConfidence": self.thresholds.win_confidence,
            "enabled": list(self.enabled),
            "enabledBelow": None if self.enabled_below is None or math.isinf(self.enabled_below) else self.enabled_below,
            "crossover": None if c is None else {"stratum": c.stratum, "offeredLoad": c.offered_load,
                                                 "outcome": c.outcome.value, "controlRunning": c.control_running},
        }


def stratum_outcome(latency: ComparisonResult, token_rate: ComparisonResult, ttft: ComparisonResult,
                    thresholds: Thresholds, max_ttft_regression: float = DEFAULT_MAX_TTFT_REGRESSION,
                    ) -> tuple[StratumOutcome, tuple[str, ...]]:
    """A stratum's outcome from its three comparisons (the rule of ``BatchComparison.outcome``, TTFT
    in the tail's place), and the vetoes that fired. Pending below ``min_samples`` latency pairs."""
    if latency.n_control < thresholds.min_samples:
        return StratumOutcome.PENDING, ()
    vetoes = []
    if token_rate.worse_by_more_than(thresholds.max_throughput_regression):
        vetoes.append("token_rate")
    if ttft.worse_by_more_than(max_ttft_regression):
        vetoes.append("ttft")
    if vetoes:
        return StratumOutcome.REGRESSES, tuple(vetoes)
    if latency.better_by_at_least(thresholds.min_latency_improvement) and token_rate.not_worse_by_more_than(
            thresholds.max_throughput_regression):
        return StratumOutcome.WINS, ()
    if latency.not_better_by(thresholds.min_latency_improvement):
        return StratumOutcome.NO_GAIN, ()
    return StratumOutcome.PENDING, ()


def live_thresholds(thresholds: Thresholds, n_strata: int) -> Thresholds:
    """The per-test thresholds of a live comparison over ``n_strata`` strata: the family split over
    strata x ``LIVE_METRICS_PER_STRATUM`` (as ``family_split`` does over batch sizes)."""
    return thresholds.for_family(max(1, int(n_strata)), LIVE_METRICS_PER_STRATUM)


def is_visited(windows: int, pairs: int, min_samples: int) -> bool:
    """A stratum the traffic visited: at least ``min_samples`` windows fell in it and as many were
    paired (both arms served tokens in them: at a low load an arm of one pod idles in many)."""
    return windows >= min_samples and pairs >= min_samples


def leans_to_canary(outcome: StratumOutcome, latency_change: float | None) -> bool:
    """A Pending stratum whose per-token latency estimate (canary vs control, relative) is below 0."""
    return (outcome is StratumOutcome.PENDING and latency_change is not None and math.isfinite(latency_change)
            and latency_change < 0)


def read_run(outcomes: Sequence[StratumOutcome], visited: Sequence[bool],
             leaning: Sequence[bool] | None = None) -> tuple[tuple[int, ...], int | None]:
    """(the run of Wins from the lowest visited stratum, the stratum that ends it with a loss or None).

    Unvisited strata below the first visited one are skipped; after it, the run ends at the first
    stratum that is not a Win (an unvisited stratum there is Pending: it ends the run, with no
    crossover). No visited stratum: nothing enabled, no crossover.

    ``leaning`` (per stratum, ``leans_to_canary``): a visited stratum still Pending whose latency
    estimate favours the canary is passed over, below the first settled one, as an unvisited one
    is. Lookahead's gain only shrinks as load rises, and it is enabled from batch 1 up, so a load
    below a measured Win is covered by that Win whether the traffic never went there or went there
    too briefly to answer; a Pending stratum leaning the other way still ends the run before it
    starts (Inconclusive). Such a stratum stays Pending: never counted as a Win."""
    lean = list(leaning) if leaning is not None else [False] * len(outcomes)
    start = next((i for i, v in enumerate(visited) if v and not lean[i]), None)
    if start is None:
        return (), None
    run = []
    for i in range(start, len(outcomes)):
        if outcomes[i] is StratumOutcome.WINS:
            run.append(i)
            continue
        return tuple(run), (i if outcomes[i].loss else None)
    return tuple(run), None


class _Stratum:
    """Accumulates one stratum's windows."""

    def __init__(self, th: Thresholds, max_ttft_regression: float) -> None:
        self.latency = PairedComparison.for_latency(th)
        self.token_rate = PairedComparison.for_throughput(th, metric="output_tokens_per_second_per_request")
        self.ttft = PairedComparison("time_to_first_token_seconds", Direction.LOWER_IS_BETTER, max_ttft_regression,
                                     th.confidence, th.min_samples, win_confidence=th.win_confidence)
        self.windows = 0
        self.ignored = 0
        self.frozen: tuple[StratumOutcome, tuple[str, ...]] | None = None
        self.running: dict[str, list[float]] = {"control": [], "canary": []}
        self.requests = [0, 0]
        self.errors = [0, 0]


class LiveComparison:
    """Canary vs control on live traffic, per offered-load stratum (see the module docstring).

    ``thresholds`` are the policy's (not yet split): the family split over ``len(strata)`` x 3 tests
    is applied here (``split=False`` takes them as given, e.g. already split by the caller).
    ``freeze``: keep a stratum's first settled outcome and ignore its later windows (as a step stops
    at its first settled look); False (the default) re-reads every window at every look."""

    def __init__(self, thresholds: Thresholds, strata: Strata | Iterable[float], *,
                 max_ttft_regression: float = DEFAULT_MAX_TTFT_REGRESSION, split: bool = True,
                 freeze: bool = False) -> None:
        self.strata = strata if isinstance(strata, Strata) else Strata(tuple(strata))
        if max_ttft_regression < 0:
            raise ValueError("max_ttft_regression must be >= 0")
        self.policy_thresholds = thresholds
        self.thresholds = live_thresholds(thresholds, len(self.strata)) if split else thresholds
        self.max_ttft_regression = float(max_ttft_regression)
        self.freeze = freeze
        self._s = [_Stratum(self.thresholds, self.max_ttft_regression) for _ in range(len(self.strata))]

    def add(self, window: LiveWindow) -> int:
        """Add one window; returns its stratum. A window whose offered load is missing (None/NaN) or
        negative has no stratum and is refused with ValueError (the key must be known)."""
        x = window.offered_load
        if x is None or not math.isfinite(float(x)) or float(x) < 0:
            raise ValueError(f"offered_load must be a finite number >= 0, got {x!r}")
        i = self.strata.index(float(x))
        s = self._s[i]
        s.windows += 1
        for j, (role, arm) in enumerate((("control", window.control), ("canary", window.canary))):
            s.requests[j] += int(arm.requests)
            s.errors[j] += int(arm.errors)
            if arm.running is not None and math.isfinite(arm.running):
                s.running[role].append(float(arm.running))
        if s.frozen is not None:
            s.ignored += 1
            return i
        c, k = window.control, window.canary
        s.latency.add_pairs([c.per_token_latency], [k.per_token_latency])
        s.token_rate.add_pairs([c.token_rate], [k.token_rate])
        s.ttft.add_pairs([c.ttft], [k.ttft])
        if self.freeze:
            out = self._outcome(s)
            if out[0].settled:
                s.frozen = out
        return i

    def extend(self, windows: Iterable[LiveWindow]) -> None:
        for w in windows:
            self.add(w)

    def _outcome(self, s: _Stratum) -> tuple[StratumOutcome, tuple[str, ...]]:
        if s.frozen is not None:
            return s.frozen
        return stratum_outcome(s.latency.result(), s.token_rate.result(), s.ttft.result(), self.thresholds,
                               self.max_ttft_regression)

    def results(self) -> LiveResults:
        """Every stratum's outcome, the enabled run and the crossover, as of now."""
        rows = []
        for i, s in enumerate(self._s):
            lo, hi = self.strata.bounds(i)
            outcome, vetoes = self._outcome(s)
            mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
            lat = s.latency.result()
            rows.append(StratumResult(
                index=i, low=lo, high=hi, windows=s.windows, pairs=lat.n_control, outcome=outcome, latency=lat,
                token_rate=s.token_rate.result(), ttft=s.ttft.result(), ignored=s.ignored,
                control_running=mean(s.running["control"]), canary_running=mean(s.running["canary"]),
                requests=(s.requests[0], s.requests[1]), errors=(s.errors[0], s.errors[1]), vetoes=vetoes,
                min_samples=self.thresholds.min_samples))
        run, cross = read_run([r.outcome for r in rows], [r.visited for r in rows], [r.leaning for r in rows])
        enabled_below = rows[run[-1]].high if run else None
        crossover = None
        if cross is not None:
            r = rows[cross]
            crossover = Crossover(stratum=cross, offered_load=r.low, outcome=r.outcome,
                                  control_running=r.control_running)
        return LiveResults(strata=tuple(rows), thresholds=self.thresholds, enabled=run,
                           enabled_below=enabled_below, crossover=crossover)
