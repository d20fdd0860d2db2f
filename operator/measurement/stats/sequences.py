"""Confidence sequences, vectorised (numpy only): the normal-mixture sequence of a log-ratio of
two independent arms, and the sequential t-test's sequences of paired windows (log-ratios, and
Fieller's ratio of sums), two-sided or one-sided per bound."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: Prior precision c of the standardised effect in the paired tests' scale-invariant mixture
#: (`paired_log_confidence_sequence`): the effect / per-window sd is mixed over N(0, 1/c). Any fixed c
#: keeps the guarantee; c = 0.3 makes the boundary narrowest around 10-18 windows, the length of one
#: step at the CRD's defaults (docs/statistics.md has the table; re-checked for the one-sided win
#: bounds over a step's full share of 10-54 windows: c = 1 or 3 moves the benchmark by < 0.1 point).
PAIRED_EFFECT_PRIOR = 0.3


def mixture_half_width(info: np.ndarray | float, alpha: float, tau: float) -> np.ndarray | float:
    """Half-width of the two-sided normal-mixture confidence sequence for an estimate with
    information `info` (1 / variance). Infinite where info <= 0 or is not finite."""
    info = np.asarray(info, dtype=float)
    t2 = tau * tau
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.sqrt((1.0 + t2 * info) / (t2 * info * info) * (2.0 * math.log(1.0 / alpha) + np.log1p(t2 * info)))
    w = np.where(np.isfinite(w) & (info > 0), w, np.inf)
    return w if w.ndim else float(w)


def log_ratio_confidence_sequence(
    n_c: np.ndarray | float,
    mean_c: np.ndarray | float,
    var_c: np.ndarray | float,
    n_k: np.ndarray | float,
    mean_k: np.ndarray | float,
    var_k: np.ndarray | float,
    alpha: float,
    tau: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised: (estimate D, lower, upper) of log(mean_k / mean_c) from per-arm counts, means and
    unbiased variances. NaN where the inputs cannot support an estimate (n < 2, mean <= 0)."""
    n_c, mean_c, var_c = (np.asarray(x, dtype=float) for x in (n_c, mean_c, var_c))
    n_k, mean_k, var_k = (np.asarray(x, dtype=float) for x in (n_k, mean_k, var_k))
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = (n_c >= 2) & (n_k >= 2) & (mean_c > 0) & (mean_k > 0) & np.isfinite(var_c) & np.isfinite(var_k)
        d = np.where(ok, np.log(mean_k) - np.log(mean_c), np.nan)
        # small-sample inflation of each arm's plug-in variance (1 + 3/n): at 10 samples a sample
        # variance is often far too small; measured in tests/unit/measurement/test_statistics.py, this keeps
        # the time-uniform miss rate under alpha from 10 samples per arm on
        v = var_k * (1.0 + 3.0 / n_k) / (n_k * mean_k**2) + var_c * (1.0 + 3.0 / n_c) / (n_c * mean_c**2)
        # a zero variance (identical samples) would make the interval a point; floor it at a
        # relative resolution of 1e-6 so that constant streams still give a finite, honest width
        v = np.maximum(v, 1e-12 * (1.0 / n_c + 1.0 / n_k))
        info = np.where(ok, 1.0 / v, 0.0)
    w = mixture_half_width(info, alpha, tau)
    lo = np.where(ok, d - w, np.nan)
    hi = np.where(ok, d + w, np.nan)
    return d, lo, hi



def _lai_kappa(n: np.ndarray, alpha: float, prior: float) -> np.ndarray:
    """kappa_n = 1 - (alpha^2 c / (n + c))^(1/n): the scale-invariant mixture (below) stays under
    1/alpha exactly when S_n^2 < kappa_n (n + c) V_n."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.expm1(np.log(alpha * alpha * prior / (n + prior)) / n)


def _student_t_cdf(x: np.ndarray, nu: int) -> np.ndarray:
    """P(T <= x) for Student's t with an integer number of degrees of freedom ``nu`` >= 1, exactly
    (the finite series of Abramowitz & Stegun 26.7.3 / 26.7.4; numpy only, no SciPy at runtime)."""
    x = np.asarray(x, dtype=float)
    theta = np.arctan(x / math.sqrt(nu))
    c2 = np.cos(theta) ** 2
    coef = _t_series(int(nu))
    s = (c2[..., None] ** np.arange(coef.size)) @ coef
    if nu % 2 == 0:
        a = np.sin(theta) * s
    else:
        a = (2.0 / math.pi) * (theta + np.sin(theta) * np.cos(theta) * s)
    return np.clip(0.5 * (1.0 + a), 0.0, 1.0)


@lru_cache(maxsize=1024)
def _t_series(nu: int) -> np.ndarray:
    """Coefficients (in cos^2 theta) of the A&S series: even nu 1, 1/2, 1*3/(2*4), ...; odd nu
    1, 2/3, 2*4/(3*5), ... (none for nu = 1)."""
    if nu % 2 == 0:
        k = np.arange(1, nu // 2)
        return np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])
    if nu == 1:
        return np.zeros(1)
    k = np.arange(1, (nu - 1) // 2)
    return np.concatenate([[1.0], np.cumprod((2 * k) / (2 * k + 1))])


def _log_one_sided_mixture(rho: float, n: int, prior: float) -> float:
    """log of the one-sided scale-invariant mixture B+_n at rho = S / sqrt((n + c) V) > 0 (see
    `_one_sided_kappa`)."""
    a = rho / math.sqrt(1.0 - rho * rho)
    t = float(_student_t_cdf(np.array([math.sqrt(n) * a]), n)[0])
    return 0.5 * math.log(prior / (n + prior)) - 0.5 * n * math.log1p(-rho * rho) + math.log(2.0 * t)


@lru_cache(maxsize=4096)
def _one_sided_kappa_scalar(n: int, alpha: float, prior: float) -> float:
    if n < 2:
        return math.inf
    target = math.log(1.0 / alpha)
    top = math.sqrt(n / (n + prior))
    hi = top * (1.0 - 1e-15)
    if _log_one_sided_mixture(hi, n, prior) < target:
        return math.inf  # no mean is excluded yet: the bound is infinite
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _log_one_sided_mixture(mid, n, prior) >= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi * hi  # the rejection threshold itself (never below it: conservative by rounding)


def _one_sided_kappa(n: np.ndarray, alpha: float, prior: float) -> np.ndarray:
    """kappa such that the ONE-sided scale-invariant mixture stays under 1/alpha exactly when
    S_n < sqrt(kappa (n + c) V_n) (S, V the sums of d_i - m and (d_i - m)^2, as below).

    Mixing the standardised effect over a half-normal prior (effect > 0 only, precision c) instead
    of the two-sided N(0, 1/c) gives, with rho = S / sqrt((n + c) V) and T_n Student's t CDF,
        B+_n = sqrt(c / (n + c)) (1 - rho^2)^(-n/2) * 2 T_n( sqrt(n) rho / sqrt(1 - rho^2) ),
    the two-sided mixture times 2 P(Z <= a chi_n): a nonnegative martingale under the true mean for
    the same reason (a mixture of the scale-invariant likelihood ratios), increasing in rho > 0 and
    below 1 for every rho <= 0, so {B+_n >= 1/alpha} = {rho >= sqrt(kappa_n)}: the lower bound of a
    one-sided confidence sequence at level alpha. Solved numerically once per (n, alpha, c)."""
    n = np.asarray(n, dtype=float)
    out = np.full(n.shape, np.inf)
    ok = np.isfinite(n) & (n >= 2)
    if ok.any():
        uniq, inv = np.unique(n[ok].astype(np.int64), return_inverse=True)
        vals = np.array([_one_sided_kappa_scalar(int(u), float(alpha), float(prior)) for u in uniq])
        out[ok] = vals[inv]
    return out


def _side_kappas(n: np.ndarray, alpha: float | None, prior: float, alpha_lower: float | None,
                 alpha_upper: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(kappa for the lower bound, kappa for the upper bound): both the two-sided kappa at alpha,
    or one-sided kappas at alpha_lower and alpha_upper."""
    if alpha_lower is None and alpha_upper is None:
        if alpha is None or not 0 < alpha < 1:
            raise ValueError("alpha must be in (0, 1)")
        k = _lai_kappa(n, alpha, prior)
        return k, k
    if alpha_lower is None or alpha_upper is None or not (0 < alpha_lower < 1 and 0 < alpha_upper < 1):
        raise ValueError("alpha_lower and alpha_upper must both be in (0, 1)")
    return _one_sided_kappa(n, alpha_lower, prior), _one_sided_kappa(n, alpha_upper, prior)


#: A number, or one per element of a vectorised call.
ArrayLike = np.ndarray | float
#: (estimate, lower bound, upper bound), vectorised.
Bounds = tuple[np.ndarray, np.ndarray, np.ndarray]


def paired_log_confidence_sequence(n: ArrayLike, sum_d: ArrayLike, sum_dd: ArrayLike, alpha: float | None = None,
                                   prior: float | None = None, *, alpha_lower: float | None = None,
                                   alpha_upper: float | None = None) -> Bounds:
    """Vectorised: (estimate, lower, upper) of the mean of i.i.d. paired differences d_i (here
    per-window log-ratios log(canary_i / control_i)) from the running sums of d and d^2.

    The confidence sequence of the sequential t-test (Lai 1976; Wang & Ramdas 2023, "Anytime-valid
    t-tests and confidence sequences for Gaussian means with unknown variance"): for a candidate
    mean m, with S = sum(d_i - m) and V = sum((d_i - m)^2), mixing the standardised effect
    (mean - m) / sigma over N(0, 1/c) and the scale over the right-Haar prior d(sigma)/sigma gives
        B_n(m) = sqrt(c / (n + c)) * (V / (V - S^2 / (n + c)))^(n / 2),
    a nonnegative martingale under the true mean (in the filtration of the scale-invariant
    statistics), so by Ville's inequality it stays below 1/alpha at every n with probability
    >= 1 - alpha. No plug-in variance, no asymptotics: exact for Gaussian d_i, at any n >= 2, so
    it holds at the small per-test alphas a family-wise split asks for. Solving B_n(m) < 1/alpha:
        |mean(d) - m| < s * sqrt(kappa (n + c) (n - 1) / (n (n - kappa (n + c)))),
    s the sample standard deviation (infinite while n <= kappa (n + c)). NaN where n < 2.

    ``alpha_lower`` / ``alpha_upper`` (both, instead of ``alpha``): two ONE-sided sequences, the
    lower bound at level alpha_lower and the upper at alpha_upper (half-normal mixtures,
    `_one_sided_kappa`), each valid at every n on its own; the interval then covers with
    probability >= 1 - alpha_lower - alpha_upper."""
    c = PAIRED_EFFECT_PRIOR if prior is None else float(prior)
    n, sum_d, sum_dd = (np.asarray(x, dtype=float) for x in (n, sum_d, sum_dd))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ok = n >= 2
        d = sum_d / n
        s2 = np.maximum(np.maximum(sum_dd - n * d * d, 0.0) / np.maximum(n - 1.0, 1.0), 1e-12)
        k_lo, k_hi = _side_kappas(n, alpha, c, alpha_lower, alpha_upper)

        def width(k: np.ndarray) -> np.ndarray:
            den = n - k * (n + c)
            return np.where(np.isfinite(k) & (den > 0), np.sqrt(k * (n + c) * (n - 1.0) * s2 / (n * den)), np.inf)

        d = np.where(ok, d, np.nan)
        return d, np.where(ok, d - width(k_lo), np.nan), np.where(ok, d + width(k_hi), np.nan)


def paired_ratio_confidence_sequence(n: ArrayLike, sum_c: ArrayLike, sum_k: ArrayLike, sum_cc: ArrayLike,
                                     sum_kk: ArrayLike, sum_ck: ArrayLike, alpha: float | None = None,
                                     prior: float | None = None, *, alpha_lower: float | None = None,
                                     alpha_upper: float | None = None) -> Bounds:
    """Vectorised: (log R_hat, log lower, log upper) for R = E[canary] / E[control] from the running
    sums of ``n`` paired windows (control c_i, canary k_i, the same wall-clock windows).

    Fieller's construction made anytime-valid: R = r exactly when y_i(r) = k_i - r c_i has mean 0,
    so the set of r that the sequential t-test of `paired_log_confidence_sequence` does not reject
    for y(r) is a confidence sequence for R. With S(r) = sum(k) - r sum(c) and
    V(r) = sum(k^2) - 2 r sum(ck) + r^2 sum(c^2) the condition S(r)^2 < kappa (n + c) V(r) is a
    quadratic inequality in r: a bounded interval when sum(c)^2 > kappa (n + c) sum(c^2), unbounded
    (no information yet) otherwise. A factor common to both arms in a window (drift, a shared
    slowdown) scales c_i and k_i together and leaves y_i(R) small: that is what pairing buys. A
    stall (k_i = 0) enters as y_i = -r c_i, a large residual against the canary.

    NaN where the sums cannot support an estimate (n < 2, no control output); where the canary
    produced nothing at all the estimate and both bounds are -inf (-100%, with certainty); an upper
    bound of +inf when the interval is unbounded.

    ``alpha_lower`` / ``alpha_upper`` (both, instead of ``alpha``): one-sided sequences as in
    `paired_log_confidence_sequence`. The lower bound of R is the lower root of the quadratic with
    the lower side's kappa: below it S(r) > 0 is large enough for the one-sided mixture against
    "R > r" to exceed 1/alpha_lower; the upper bound the upper root with the upper side's kappa."""
    c0 = PAIRED_EFFECT_PRIOR if prior is None else float(prior)
    n, sc, sk, scc, skk, sck = (np.asarray(x, dtype=float) for x in (n, sum_c, sum_k, sum_cc, sum_kk, sum_ck))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ok = (n >= 2) & (sc > 0) & (sk > 0)
        nothing = (n >= 2) & (sc > 0) & (sk == 0)
        k_lo, k_hi = _side_kappas(n, alpha, c0, alpha_lower, alpha_upper)

        def roots(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            finite = np.isfinite(k)
            q = np.where(finite, k, 0.0) * (n + c0)
            eps = 1.0 + 1e-12  # a relative variance floor: constant streams still get a finite width
            a = sc * sc - q * scc * eps
            b = -2.0 * sk * sc + 2.0 * q * sck
            cc = sk * sk - q * skk * eps
            disc = b * b - 4.0 * a * cc
            root = np.sqrt(np.maximum(disc, 0.0))
            bounded = finite & (a > 0) & (disc >= 0)
            return np.where(bounded, (-b - root) / (2.0 * a), 0.0), np.where(bounded, (-b + root) / (2.0 * a), np.inf)

        r_lo, r_hi = roots(k_lo)
        if k_hi is not k_lo:
            _, r_hi = roots(k_hi)
        r_hat = sk / sc
        # the estimate always lies inside; a lower root below 0 means "down to -100%"
        lo = np.log(np.clip(np.minimum(r_lo, r_hat), 0.0, None))
        hi = np.log(np.maximum(r_hi, r_hat))
        d = np.where(ok, np.log(r_hat), np.where(nothing, -np.inf, np.nan))
        lo = np.where(ok, lo, np.where(nothing, -np.inf, np.nan))
        hi = np.where(ok, hi, np.where(nothing, -np.inf, np.nan))
    return d, lo, hi

