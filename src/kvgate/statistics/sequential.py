"""Group-sequential paired accuracy comparisons: stop a comparison early when the answer is already clear. Pure.

The candidate answers the questions in a fixed, seeded order; at fixed looks (numbers of questions n_1 < ... <
n_K, information fractions t_k = n_k / n_K) the comparison with the reference's stored outcomes on the same
questions is tested:

- fail early ("efficacy", against H0 "drop <= margin"): Z_k >= a_k, where Z_k is the margin test's z
  (kvgate.statistics.margins.margin_log_p turned into a z). The a_k spend alpha by Lan-DeMets' O'Brien-Fleming-type
  function alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), computed ignoring the futility bound (non-binding:
  the type-I error holds whether or not the runner obeys a futility stop);
- pass early ("futility", against H1 "drop >= margin + gap"): Z1_k <= f_k, where Z1_k is the z of the reverse
  test at margin + gap (negative when the drop is clearly below it). The f_k spend beta by the power family
  beta(t) = beta t^rho (Kim-DeMets), given the a_k; the drift eta (E[Z_K] at margin + gap) is solved so that the
  two bounds meet at the last look, which therefore always decides: fail when Z_K >= a_K, else pass.

Boundaries come from the canonical joint distribution of (Z_1, ..., Z_K) (Brownian motion in information
time) by recursive numerical integration on a Simpson grid (Jennison & Turnbull 2000, ch. 19): deterministic,
and validated in tests/test_sequential.py against closed forms and a Monte Carlo of the real tests. kvgate's own
code: scipy has no group-sequential designs (its normal tails and root finder are used here).
The maximum number of questions is `inflation` x the fixed design's (N_max / N_fixed = (eta / (z_a + z_b))^2).

`decide` is what a runner calls after each look; `replay` is what the gate does with the outcomes of a stopped
comparison: it replays every look in the question order and decides at the first crossing, with the stagewise
(Armitage-Fairbanks-Jennison ordering) p-value and the repeated-confidence bound of the drop at that look.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize

from kvgate.statistics import distributions, margins

DESIGN_NAME = "kvgate-gs/1"
ACTIONS = ("continue", "fail", "pass")
SEQUENTIAL_METHOD = ("group-sequential paired margin test (O'Brien-Fleming alpha spending, non-binding futility "
                     "at margin + gap)")
_GRID = 601  # Simpson points per look (odd)
_SQRT_2PI = math.sqrt(2 * math.pi)


# ---------------------------------------------------------------------------------------------- boundaries

@dataclass(frozen=True, slots=True)
class Boundaries:
    """The design on the canonical z scale: depends only on the fractions, alpha, beta and rho."""

    fractions: tuple[float, ...]
    alpha: float
    beta: float
    rho: float
    efficacy: tuple[float, ...]  # a_k: fail when Z_k(margin) >= a_k
    futility: tuple[float, ...]  # f_k: pass when Z_k(margin + gap) <= f_k (the last one is a_K - drift)
    drift: float  # eta: the mean of Z_K(margin) at a drop of margin + gap
    inflation: float  # N_max / N_fixed at equal alpha and power
    alpha_spent: tuple[float, ...]  # cumulative alpha(t_k)

    @property
    def looks(self) -> int:
        return len(self.fractions)

    def futility_on_margin_scale(self, k: int) -> float:
        """f_k moved to the Z(margin) scale: l_k = f_k + eta sqrt(t_k) (the canonical lower bound)."""
        return self.futility[k] + self.drift * math.sqrt(self.fractions[k])


def alpha_spending(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming type, one-sided: 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))."""
    if t <= 0:
        return 0.0
    return min(alpha, 2 * distributions.normal_sf(distributions.normal_quantile(1 - alpha / 2) / math.sqrt(t)))


def beta_spending(t: float, beta: float, rho: float) -> float:
    """Kim-DeMets power family: beta t^rho."""
    return beta * min(max(t, 0.0), 1.0) ** rho


@lru_cache(maxsize=64)
def boundaries(fractions: tuple[float, ...], *, alpha: float, beta: float, rho: float) -> Boundaries:
    _check_fractions(fractions)
    if not 0 < alpha < 0.5 or not 0 < beta < 0.5:
        raise ValueError(f"alpha and beta must be in (0, 0.5), got {alpha} and {beta}")
    if not rho > 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    efficacy, spent = _efficacy(fractions, alpha)

    def mismatch(eta: float) -> float:
        return _futility(fractions, efficacy, eta, beta, rho)[1] - beta

    z_sum = distributions.normal_quantile(1 - alpha) + distributions.normal_quantile(1 - beta)
    eta = _root(mismatch, 0.5 * z_sum, 2.0 * z_sum)  # beta-crossing falls as the drift grows
    lower, _ = _futility(fractions, efficacy, eta, beta, rho)
    futility = tuple(lk - eta * math.sqrt(t) for lk, t in zip(lower, fractions, strict=True))
    return Boundaries(fractions=fractions, alpha=alpha, beta=beta, rho=rho, efficacy=tuple(efficacy),
                      futility=futility, drift=eta, inflation=(eta / z_sum) ** 2, alpha_spent=tuple(spent))


def _check_fractions(fractions: Sequence[float]) -> None:
    if not fractions or any(not 0 < f <= 1 for f in fractions) or list(fractions) != sorted(set(fractions)) \
            or abs(fractions[-1] - 1) > 1e-12:
        raise ValueError(f"look fractions must increase strictly within (0, 1] and end at 1, got {list(fractions)}")


def _efficacy(fractions: Sequence[float], alpha: float) -> tuple[list[float], list[float]]:
    bounds: list[float] = []
    spent: list[float] = []
    state = None
    previous_t, previous_spent = 0.0, 0.0
    for t in fractions:
        target = alpha_spending(t, alpha) - previous_spent
        a = _root(lambda x, s=state, t0=previous_t, t1=t, g=target: _upper(s, t0, t1, 0.0, x) - g, -1.0, 40.0)
        bounds.append(a)
        previous_spent += target
        spent.append(previous_spent)
        state = _propagate(state, previous_t, t, 0.0, -10.0, a)
        previous_t = t
    return bounds, spent


def _futility(fractions: Sequence[float], efficacy: Sequence[float], eta: float, beta: float,
              rho: float) -> tuple[list[float], float]:
    """Lower bounds l_k on the Z(margin) scale under drift eta, and the total beta they cross with."""
    lower: list[float] = []
    state = None
    previous_t, crossed = 0.0, 0.0
    last = len(fractions) - 1
    for k, t in enumerate(fractions):
        a = efficacy[k]
        if k == last:
            lower.append(a)
            return lower, crossed + _lower(state, previous_t, t, eta, a)
        target = beta_spending(t, beta, rho) - crossed
        if _lower(state, previous_t, t, eta, a) <= target:
            lk = a  # the whole continuation region is spent: the bounds meet early
        else:
            lk = _root(lambda x, s=state, t0=previous_t, t1=t, g=target: _lower(s, t0, t1, eta, x) - g,
                       eta * math.sqrt(t) - 40.0, a)
        crossed += _lower(state, previous_t, t, eta, lk)
        lower.append(lk)
        state = _propagate(state, previous_t, t, eta, lk, a) if lk < a else _empty()
        previous_t = t
    raise AssertionError("unreachable")


# The sub-density of Z_k on the continuation region: (grid z, Simpson weights w, density g).
_State = tuple[np.ndarray, np.ndarray, np.ndarray] | None


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(1), np.zeros(1), np.zeros(1)


def _grid(low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    z = np.linspace(low, high, _GRID)
    h = (high - low) / (_GRID - 1)
    w = np.full(_GRID, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return z, w * h / 3


def _pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / _SQRT_2PI


def _propagate(state: _State, t0: float, t1: float, theta: float, low: float, high: float) -> _State:
    """The sub-density of Z at t1 on [low, high] (paths still running), from the state at t0."""
    low = max(low, theta * math.sqrt(t1) - 12.0)  # nothing lives 12 SD below the mean
    if high <= low:
        return _empty()
    z, w = _grid(low, high)
    if state is None:
        g = _pdf(z - theta * math.sqrt(t1))
    else:
        zp, wp, gp = state
        dt = t1 - t0
        arg = (z[:, None] * math.sqrt(t1) - zp[None, :] * math.sqrt(t0) - theta * dt) / math.sqrt(dt)
        g = (_pdf(arg) * math.sqrt(t1 / dt)) @ (wp * gp)
    return z, w, g


def _upper(state: _State, t0: float, t1: float, theta: float, a: float) -> float:
    """P(still running at t0, Z(t1) >= a)."""
    if state is None:
        return distributions.normal_sf(a - theta * math.sqrt(t1))
    zp, wp, gp = state
    dt = t1 - t0
    arg = (a * math.sqrt(t1) - zp * math.sqrt(t0) - theta * dt) / math.sqrt(dt)
    return float(np.sum(wp * gp * np.exp(distributions.log_normal_sf(arg))))


def _lower(state: _State, t0: float, t1: float, theta: float, lk: float) -> float:
    """P(still running at t0, Z(t1) <= lk)."""
    if state is None:
        return distributions.normal_sf(theta * math.sqrt(t1) - lk)
    zp, wp, gp = state
    dt = t1 - t0
    arg = (lk * math.sqrt(t1) - zp * math.sqrt(t0) - theta * dt) / math.sqrt(dt)
    return float(np.sum(wp * gp * np.exp(distributions.log_normal_sf(-arg))))


def _root(f: Callable[[float], float], low: float, high: float) -> float:
    """A root of a monotone f on [low, high], to 1e-10 (scipy.optimize.brentq)."""
    f_low, f_high = f(low), f(high)
    if (f_low > 0) == (f_high > 0) and f_low != 0 and f_high != 0:
        raise ValueError(f"no root in [{low}, {high}]: f = {f_low} and {f_high}")
    return optimize.brentq(f, low, high, xtol=1e-10)


# ---------------------------------------------------------------------------------------------- operating figures

@dataclass(frozen=True, slots=True)
class Operating:
    """Stopping probabilities of a design at one true drift (canonical: drift_rel = (drop - margin) / gap)."""

    fail_at: tuple[float, ...]
    pass_at: tuple[float, ...]

    @property
    def fail(self) -> float:
        return sum(self.fail_at)

    def expected_fraction(self, fractions: Sequence[float]) -> float:
        """E[questions] / questions at the last look."""
        return sum(t * (f + p) for t, f, p in zip(fractions, self.fail_at, self.pass_at, strict=True))


def operating(bounds: Boundaries, drift_rel: float) -> Operating:
    """Where the design stops when the true drop is margin + drift_rel x gap (canonical approximation)."""
    theta = drift_rel * bounds.drift
    state = None
    previous_t = 0.0
    fails, passes = [], []
    for k, t in enumerate(bounds.fractions):
        a, lk = bounds.efficacy[k], bounds.futility_on_margin_scale(k)
        fails.append(_upper(state, previous_t, t, theta, a))
        passes.append(_lower(state, previous_t, t, theta, min(lk, a)))
        if k < bounds.looks - 1:
            state = _propagate(state, previous_t, t, theta, lk, a) if lk < a else _empty()
            previous_t = t
    return Operating(fail_at=tuple(fails), pass_at=tuple(passes))


def stagewise_log_p(bounds: Boundaries, look: int, z: float) -> float:
    """log of the stagewise-ordering p-value of stopping at `look` (1-based) with Z = z under H0 (the
    efficacy bounds alone, as the non-binding design's type-I error is computed)."""
    if not 1 <= look <= bounds.looks:
        raise ValueError(f"look must be 1..{bounds.looks}, got {look}")
    state = None
    previous_t = 0.0
    for k in range(look - 1):
        t = bounds.fractions[k]
        state = _propagate(state, previous_t, t, 0.0, -10.0, bounds.efficacy[k])
        previous_t = t
    t = bounds.fractions[look - 1]
    if state is None:
        return float(distributions.log_normal_sf(z))
    earlier = bounds.alpha_spent[look - 2]
    here = _upper(state, previous_t, t, 0.0, z)
    if here > 0:
        return math.log(earlier + here)
    return math.log(earlier) if earlier > 0 else float(distributions.log_normal_sf(z))


# ---------------------------------------------------------------------------------------------- a design in questions

@dataclass(frozen=True, slots=True)
class Design:
    """A sequential comparison in questions: the looks, the canonical bounds, the margin and the gap (points)."""

    looks: tuple[int, ...]
    bounds: Boundaries
    margin_points: float
    gap_points: float

    @property
    def fractions(self) -> tuple[float, ...]:
        return self.bounds.fractions


def design(looks: Sequence[int], *, alpha: float, beta: float, rho: float, margin_points: float,
           gap_points: float) -> Design:
    """The design for these look sizes (questions answered at each look)."""
    looks = tuple(int(n) for n in looks)
    if not looks or any(n < 1 for n in looks) or list(looks) != sorted(set(looks)):
        raise ValueError(f"looks must be increasing numbers of questions, got {list(looks)}")
    if not (margin_points >= 0 and gap_points > 0):
        raise ValueError(f"need margin >= 0 and gap > 0 points, got {margin_points} and {gap_points}")
    fractions = tuple(round(n / looks[-1], 12) for n in looks)
    return Design(looks=looks, bounds=boundaries(fractions, alpha=alpha, beta=beta, rho=rho),
                  margin_points=margin_points, gap_points=gap_points)


def looks_for(max_questions: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Look sizes for a budget: ceil(fraction x max_questions) (the runner's chunks end at these)."""
    return tuple(math.ceil(f * max_questions - 1e-9) for f in fractions)


@dataclass(frozen=True, slots=True)
class Look:
    look: int  # 1-based
    n: int
    only_reference: int
    only_candidate: int
    z: float  # margin test z (fail when >= efficacy)
    z_futility: float  # reverse test z at margin + gap (pass when <= futility)
    action: str  # continue | fail | pass


def decide(design_: Design, only_reference: int, only_candidate: int, n: int) -> Look:
    """The runner's call after a look: the counts over the first n questions of the order (n one of the looks)
    -> continue | fail | pass. The last look never answers continue."""
    if n not in design_.looks:
        raise ValueError(f"{n} questions is not a look of this design (looks at {', '.join(map(str, design_.looks))})")
    if min(only_reference, only_candidate) < 0 or only_reference + only_candidate > n:
        raise ValueError(f"impossible counts: {only_reference} + {only_candidate} discordant of {n}")
    k = design_.looks.index(n)
    bounds = design_.bounds
    log_p = float(margins.margin_log_p(only_reference, only_candidate, n, design_.margin_points / 100))
    log_q = float(margins.reverse_margin_log_p(only_reference, only_candidate, n,
                                             min((design_.margin_points + design_.gap_points) / 100, 0.999)))
    z = float(distributions.z_from_log_p(log_p))
    z_futility = -float(distributions.z_from_log_p(log_q))
    if log_p <= float(distributions.log_normal_sf(bounds.efficacy[k])):
        action = "fail"
    elif k == bounds.looks - 1 or z_futility <= bounds.futility[k]:
        action = "pass"
    else:
        action = "continue"
    return Look(look=k + 1, n=n, only_reference=only_reference, only_candidate=only_candidate, z=z,
                z_futility=z_futility, action=action)


class IncompleteSequence(ValueError):
    """The outcomes end before any boundary was crossed and before the last look."""


@dataclass(frozen=True, slots=True)
class SequentialResult:
    decision: str  # fail | pass
    look: Look  # where it stopped
    history: tuple[Look, ...]
    counts: margins.PairedCounts  # over the first look.n questions
    p_value: float  # stagewise p-value of H0 "drop <= margin" at the stop (never below TINY_P)
    log_p_value: float
    lower_points: float  # bound of the drop at the look's efficacy level: fail <=> lower > margin
    upper_points: float  # bound at the look's futility level: an early pass <=> upper < margin + gap
    level: float  # one-sided level of the lower bound, P(Z >= a_k)
    futility_level: float  # one-sided level of the upper bound, P(Z <= f_k)
    unused: int  # questions answered beyond the deciding look (ignored, as the design says)


def replay(design_: Design, reference: Sequence[bool], candidate: Sequence[bool]) -> SequentialResult:
    """The gate's view: outcomes in the question order (same length), every look replayed, the first crossing
    decides. Raises IncompleteSequence when the outcomes stop before a crossing and before the last look."""
    ref = np.asarray(reference, dtype=bool)
    cand = np.asarray(candidate, dtype=bool)
    if ref.shape != cand.shape or ref.ndim != 1:
        raise ValueError("the two outcome sequences must be flat and of one length")
    only_ref = np.concatenate([[0], np.cumsum(ref & ~cand)])
    only_cand = np.concatenate([[0], np.cumsum(~ref & cand)])
    history = []
    for n in design_.looks:
        if n > ref.size:
            break
        look = decide(design_, int(only_ref[n]), int(only_cand[n]), n)
        history.append(look)
        if look.action != "continue":
            k = look.look - 1
            counts = margins.PairedCounts.from_outcomes(ref[:n], cand[:n])
            log_p = stagewise_log_p(design_.bounds, look.look, look.z)
            level = math.exp(float(distributions.log_normal_sf(design_.bounds.efficacy[k])))
            futility_level = math.exp(float(distributions.log_normal_sf(-design_.bounds.futility[k])))
            lower = margins.drop_bounds(counts, level)[0]
            upper = margins.drop_bounds(counts, min(futility_level, 0.5))[1]
            return SequentialResult(decision=look.action, look=look, history=tuple(history), counts=counts,
                                    p_value=margins.reported_p(log_p), log_p_value=log_p, lower_points=lower,
                                    upper_points=upper, level=level, futility_level=futility_level,
                                    unused=ref.size - n)
    reached = history[-1].n if history else 0
    raise IncompleteSequence(
        f"the comparison stopped at {ref.size} questions without crossing a boundary (looks at "
        f"{', '.join(map(str, design_.looks))}; {'no look reached' if not history else f'last look {reached}: continue'})")
