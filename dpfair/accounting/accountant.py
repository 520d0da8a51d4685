"""The accountant: a DpEvent in, ε out with the accountant's name (:func:`spend`).

A method describes what one step releases as a DpEvent
(:meth:`dpfair.methods.Method.step_event`): ``GaussianDpEvent(σ)`` for the noisy clipped
sum (unit sensitivity after scaling) and, for the adaptive / fair methods, a composed
``GaussianDpEvent(σ_count)`` for the noisy count (unit sensitivity); ``NonPrivateDpEvent`` for
the non-private baseline. :func:`run_event` (:mod:`dpfair.accounting.events`) is the one place
a run's event is composed from it: ``SelfComposed(PoissonSampled(q, step), T)``. Both Gaussians
query the same Poisson-sampled batch, so they reduce to one Gaussian mechanism with
``σ_eff = (σ^-2 + σ_count^-2)^-1/2`` (Zhao et al., Lemma 3.1; for ``dpsgd_f`` and
``naive_reweight`` σ_count is σ1); :func:`reduced` writes the event in that reduced form.

ε is the smaller of two valid upper bounds (:func:`spend`): dp_accounting's pessimistic PLD
(:mod:`dpfair.accounting.pld`; a search through the privacy-profile bound of
:mod:`dpfair.accounting.profiles`) and dp_accounting's RDP accountant (add-or-remove-one
neighbouring relation, its default orders unless given; Papernot & Steinke for a search).
Opacus's RDP accountant computes the same RDP figure for plain DP-SGD at integer orders and is a
test oracle. At fractional orders dp_accounting 0.6 sums the absolute values of the binomial
series of A_α (a valid upper bound) where Opacus keeps the signs, so there dp_accounting's RDP
epsilon is slightly larger (never smaller; < 1% for ε < 10 in the test sweep); both give
Esipova's 2.27 and 2.49. An event whose rows are people (:class:`GroupPrivacyDpEvent`) is
accounted per row and converted by the group bound (:func:`group_delta`).

Non-private is always ``NonPrivateDpEvent`` (never ``None``); its :func:`epsilon` is ``inf``.

Steps: the papers' epsilons are reproduced with ``steps = epochs * ceil(n_train / batch_size)``
(:func:`steps_for_epochs`); ``round`` gives the same numbers for the paper settings.

Three extensions of dp_accounting's event language are handled by :func:`epsilon` (and
serialised like the built-in events):

* :class:`MaxOfDpEvent` — "one of these events, which one unknown": its RDP is the pointwise
  maximum over orders. A tuning run that draws its batch size / σ / epochs from a search space is
  a mixture of such runs, and Rényi divergence is jointly quasi-convex, so the mixture is bounded
  by the maximum.
* ``RepeatAndSelectDpEvent`` with shape in (-1, 0) (Papernot & Steinke allow η > -1;
  dp_accounting 0.6 only η ≥ 0): :mod:`dpfair.accounting.repeat_select`.
* :class:`BinomialSelectDpEvent` — the best of K ~ Binomial(n, p) runs of an event (Koskela,
  Redberg & Wang 2024, Section 5: a binomial number of rounds). Its PLD comes from the
  privacy-profile bound (:mod:`dpfair.accounting.profiles`); its RDP is that of all n runs
  composed (K ≤ n, and releasing the best of K of them is post-processing of the n runs and
  of coins independent of the data).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_accountant
from scipy import optimize

from dpfair.accounting import pld
from dpfair.accounting.events import (
    BinomialSelectDpEvent,
    GroupPrivacyDpEvent,
    MaxOfDpEvent,
    event_from_json,
    event_to_json,
    group_size,
    map_subevents,
    reduced,
    run_event,
    score_release_event,
    steps_for_epochs,
    with_group,
)
from dpfair.accounting.repeat_select import repeat_and_select_curve, tnb_gamma, tnb_mean
from dpfair.errors import PrivacyError

DEFAULT_ORDERS: tuple[float, ...] = tuple(rdp_accountant.DEFAULT_RDP_ORDERS)

ACCOUNTANT_PLD = "PLD (dp_accounting, pessimistic)"
ACCOUNTANT_PROFILE = ("PLD with the privacy profile of the search (Koskela, Redberg & Wang "
                      "2024)")
ACCOUNTANT_RDP = "RDP (dp_accounting)"
ACCOUNTANT_NONE = "none (no DP guarantee)"
#: every accountant name a report can show
ACCOUNTANTS = (ACCOUNTANT_PLD, ACCOUNTANT_PROFILE, ACCOUNTANT_RDP, ACCOUNTANT_NONE)
#: Above this RDP ε the PLD is not built: its grid grows with the privacy loss (σ = 0.02 at
#: q = 0.04 over 1000 steps took 10 GiB and 90 s; σ = 0.15, RDP ε 2660, 0.3 GiB), and an ε
#: that large protects nothing, so RDP's figure, a valid bound too, is reported.
PLD_MAX_RDP_EPSILON = 2000.0

__all__ = [
    "ACCOUNTANTS",
    "ACCOUNTANT_NONE",
    "ACCOUNTANT_PLD",
    "ACCOUNTANT_PROFILE",
    "ACCOUNTANT_RDP",
    "DEFAULT_ORDERS",
    "BinomialSelectDpEvent",
    "GroupPrivacyDpEvent",
    "MaxOfDpEvent",
    "Spend",
    "epsilon",
    "event_from_json",
    "event_to_json",
    "group_size",
    "map_subevents",
    "noise_for_epsilon",
    "rdp_curve",
    "rdp_epsilon",
    "reduced",
    "run_event",
    "score_release_event",
    "spend",
    "steps_for_epochs",
    "tnb_gamma",
    "tnb_mean",
    "with_group",
]


# ----------------------------------------------------------------------------------- epsilon


def _needs_own_walk(event: dp_event.DpEvent) -> bool:
    if isinstance(event, (MaxOfDpEvent, BinomialSelectDpEvent)):
        return True
    if isinstance(event, dp_event.RepeatAndSelectDpEvent):
        return event.shape < 0 or _needs_own_walk(event.event)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _needs_own_walk(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_needs_own_walk(e) for e in event.events)
    return False


def rdp_curve(event: dp_event.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
    """RDP of ``event`` at each order (dp_accounting's RDP accountant, plus the extensions)."""
    orders_arr = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=np.float64)
    if not _needs_own_walk(event):
        return _composed_rdp(event, orders_arr)
    if isinstance(event, MaxOfDpEvent):
        if not event.events:
            raise PrivacyError("MaxOfDpEvent needs at least one event")
        return np.max([rdp_curve(e, orders_arr) for e in event.events], axis=0)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * rdp_curve(event.event, orders_arr)
    if isinstance(event, BinomialSelectDpEvent):  # all n runs composed (module doc)
        return event.n * rdp_curve(event.event, orders_arr)
    if isinstance(event, dp_event.ComposedDpEvent):
        return np.sum([rdp_curve(e, orders_arr) for e in event.events], axis=0)
    if isinstance(event, dp_event.RepeatAndSelectDpEvent):
        inner = rdp_curve(event.event, orders_arr)
        return repeat_and_select_curve(orders_arr, inner, event.mean, event.shape)
    raise AssertionError(f"unhandled event {event!r}")  # pragma: no cover


def rdp_epsilon(
    event: dp_event.DpEvent, delta: float, orders: Sequence[float] | None = None
) -> float:
    """Epsilon of ``event`` at ``delta`` from the RDP accountant (plus the extensions)."""
    _check(event, delta)
    orders_arr = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=np.float64)
    if not _needs_own_walk(event):
        if not rdp_accountant.RdpAccountant(list(orders_arr)).supports(event):
            raise PrivacyError(f"the RDP accountant does not support {event!r}")
    rdp = rdp_curve(event, orders_arr)
    return float(rdp_accountant.compute_epsilon(orders_arr, rdp, delta)[0])


def _composed_rdp(event: dp_event.DpEvent, orders: np.ndarray) -> np.ndarray:
    """dp_accounting's RDP of ``event`` to the bit, each distinct mechanism's curve computed
    once per process: ``RdpAccountant.compose`` walks the compositions in order and adds
    ``count * curve`` of every mechanism it meets, recomputing a Poisson-subsampled Gaussian's
    curve (a series per order, ~0.05 s) each time, though a run's, a method's and the release's
    totals hold the same few. This is that walk, with each curve from :func:`_mechanism_rdp`
    (one accountant composing the mechanism once: ``0 + 1 * curve``, the same floats)."""
    rdp = np.zeros_like(orders, dtype=np.float64)
    for leaf, count in _mechanisms(event, 1):
        if isinstance(leaf, dp_event.NonPrivateDpEvent):
            rdp += np.inf  # as dp_accounting: whatever the count
        elif not isinstance(leaf, dp_event.NoOpDpEvent):
            rdp += count * _mechanism_rdp(event_to_json(leaf), tuple(orders.tolist()))
    return rdp


def _mechanisms(event: dp_event.DpEvent, count: int
                ) -> Iterator[tuple[dp_event.DpEvent, int]]:
    """The mechanisms of a composition in dp_accounting's order, each with its count (the
    product of the counts of the self-compositions around it)."""
    if isinstance(event, dp_event.SelfComposedDpEvent):
        yield from _mechanisms(event.event, event.count * count)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for e in event.events:
            yield from _mechanisms(e, count)
    else:
        yield event, count


@functools.lru_cache(maxsize=1024)  # a curve is one float per order
def _mechanism_rdp(key: str, orders: tuple[float, ...]) -> np.ndarray:
    acc = rdp_accountant.RdpAccountant(list(orders))
    event = event_from_json(key)
    if not acc.supports(event):
        raise PrivacyError(f"the RDP accountant does not support {event!r}")
    acc.compose(event)
    curve = acc.rdp
    curve.flags.writeable = False  # shared by every caller
    return curve


def _check(event: dp_event.DpEvent, delta: float) -> None:
    if not 0 <= delta < 1:
        raise PrivacyError(f"delta must be in [0, 1), got {delta}")
    if not isinstance(event, dp_event.DpEvent):
        raise PrivacyError(f"not a DpEvent: {event!r} (non-private is NonPrivateDpEvent)")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Spend:
    """An ε at a δ and the accountant that gave it (one of :data:`ACCOUNTANTS`)."""

    epsilon: float
    delta: float
    accountant: str


def _has_selection(event: dp_event.DpEvent) -> bool:
    if isinstance(event, (dp_event.RepeatAndSelectDpEvent, BinomialSelectDpEvent)):
        return True
    if isinstance(event, (dp_event.SelfComposedDpEvent, dp_event.PoissonSampledDpEvent)):
        return _has_selection(event.event)
    if isinstance(event, (dp_event.ComposedDpEvent, MaxOfDpEvent)):
        return any(_has_selection(e) for e in event.events)
    return False


def spend(event: dp_event.DpEvent, delta: float) -> Spend:
    """The tightest valid ε of ``event`` at ``delta`` and its accountant's name.

    Both accountants give upper bounds, so the smaller is valid: dp_accounting's PLD
    (pessimistic, :mod:`dpfair.accounting.pld`; with the privacy-profile bound of a search,
    :mod:`dpfair.accounting.profiles`) and RDP (:func:`rdp_epsilon`; Papernot & Steinke for a
    search). An event the PLD cannot represent is RDP's alone. Cached by the event's JSON.
    """
    _check(event, delta)
    return _spend(event_to_json(event), float(delta))


@functools.lru_cache(maxsize=4096)
def _spend(key: str, delta: float) -> Spend:
    event, rows = group_size(event_from_json(key))
    if rows > 1:
        return _group_spend(event_to_json(event), delta, rows)
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return Spend(math.inf, delta, ACCOUNTANT_NONE)
    try:
        rdp = rdp_epsilon(event, delta)
    except PrivacyError:
        rdp = math.inf
    try:
        bounded = math.isinf(rdp) or rdp <= PLD_MAX_RDP_EPSILON
        via_pld = pld.pld_epsilon(event, delta) if bounded else math.inf
    except pld.UnsupportedEvent:
        via_pld = math.inf
    if via_pld < rdp:
        name = ACCOUNTANT_PROFILE if _has_selection(event) else ACCOUNTANT_PLD
        return Spend(via_pld, delta, name)
    if math.isinf(rdp):
        return Spend(math.inf, delta, ACCOUNTANT_NONE)
    return Spend(rdp, delta, ACCOUNTANT_RDP)


def group_delta(epsilon_row: float, delta_row: float, rows: int) -> float:
    """δ of the group guarantee for ``rows`` rows of an (ε, δ)-DP mechanism:
    ``δ Σ_{i<k} e^{iε}`` with ε_k = k ε (Dwork & Roth 2014, Thm. 2.2, by induction over the
    rows: P[M(D_0) ∈ S] ≤ e^ε P[M(D_1) ∈ S] + δ, ...)."""
    if not math.isfinite(epsilon_row):
        return math.inf
    top = (rows - 1) * epsilon_row  # Σ e^{iε} = e^{(k-1)ε} Σ e^{-jε}: no overflow below it
    log_sum = top + math.log(math.fsum(math.exp(-j * epsilon_row) for j in range(rows)))
    log_delta = math.log(delta_row) + log_sum if delta_row > 0 else -math.inf
    return math.exp(log_delta) if log_delta < 700 else math.inf


def _group_spend(row_key: str, delta: float, rows: int) -> Spend:
    """The ε at ``delta`` of a change of ``rows`` rows of the row-level event ``row_key``: the
    row-level ε at the largest δ_1 whose group δ (:func:`group_delta`) is at most ``delta``,
    times ``rows``. δ_1 is found by bisection in log δ_1 (every candidate's ε is the row
    accountant's, so the returned pair is valid whatever the bisection's precision)."""
    def row(d: float) -> Spend:
        return _spend(row_key, d)

    def fits(log_d: float) -> bool:
        d = math.exp(log_d)
        return group_delta(row(d).epsilon, d, rows) <= delta

    hi, lo = math.log(delta / rows), math.log(delta / rows) - 80.0
    if not fits(lo):
        first = row(math.exp(lo))
        return Spend(math.inf, delta, _group_name(first.accountant, rows))
    if fits(hi):
        lo = hi
    for _ in range(40):
        if hi - lo < 1e-3:  # δ_1 to 0.1%: ε_1 moves far less
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    best = row(math.exp(lo))
    return Spend(rows * best.epsilon, delta, _group_name(best.accountant, rows))


def _group_name(accountant: str, rows: int) -> str:
    return f"{accountant}, group privacy over {rows} rows (Dwork & Roth Thm. 2.2)"


def epsilon(
    event: dp_event.DpEvent, delta: float, orders: Sequence[float] | None = None
) -> float:
    """Epsilon of ``event`` at ``delta``: the tightest valid figure (:func:`spend`); with
    ``orders``, the RDP accountant's at those orders (:func:`rdp_epsilon`).
    ``NonPrivateDpEvent`` gives ``inf``."""
    if orders is not None:
        return rdp_epsilon(event, delta, orders)
    return spend(event, delta).epsilon


# ------------------------------------------------------------------------------ calibration


def noise_for_epsilon(
    target_epsilon: float, make_event: Callable[[float], dp_event.DpEvent], delta: float,
    rtol: float = 2e-5,
) -> float:
    """Smallest σ (to ``rtol`` relative) whose run event ``make_event(σ)`` reaches
    ``target_epsilon`` at ``delta`` by the tightest valid accountant (:func:`epsilon`).

    ``make_event`` maps the gradient noise multiplier to the run's event (e.g. the method built
    at σ, its :meth:`~dpfair.methods.Method.step_event`, wrapped by :func:`run_event`);
    its ε must fall as σ grows. A release whose noise does not grow with σ (a fixed count
    noise) bounds ε from below: a target under that floor is a :class:`PrivacyError`. The σ
    that meets the target under RDP alone (cheap) brackets the search from above, since the
    returned figure is never above RDP's; bisection in log σ keeps ε(σ) <= target at the
    returned σ.
    """
    if not target_epsilon > 0:
        raise PrivacyError(f"target_epsilon must be > 0, got {target_epsilon}")
    hi = math.log(_rdp_noise(target_epsilon, make_event, delta))
    if math.exp(hi) <= 1e-6:
        return math.exp(hi)

    def gap(log_sigma: float) -> float:
        return epsilon(make_event(math.exp(log_sigma)), delta) - target_epsilon

    g_hi, lo = gap(hi), hi - 0.3
    g_lo = gap(lo)
    while g_lo <= 0:
        hi, g_hi, lo = lo, g_lo, lo - 0.3
        if lo < math.log(1e-6):
            return math.exp(hi)
        g_lo = gap(lo)
    # bracket [lo, hi] with gap(lo) > 0 >= gap(hi): Illinois false position, which keeps it
    side, slack = 0, -g_hi  # slack: target − ε at hi (g_hi is halved by Illinois steps)
    while hi - lo > rtol and slack > 1e-6 * target_epsilon:
        mid = lo + (hi - lo) * g_lo / (g_lo - g_hi)
        mid = min(max(mid, lo + rtol / 4), hi - rtol / 4)
        g_mid = gap(mid)
        if g_mid <= 0:
            hi, g_hi, slack = mid, g_mid, -g_mid
            g_lo = g_lo / 2 if side == -1 else g_lo
            side = -1
        else:
            lo, g_lo = mid, g_mid
            g_hi = g_hi / 2 if side == 1 else g_hi
            side = 1
    return math.exp(hi)  # eps(σ) <= target at the returned σ


def _rdp_noise(
    target_epsilon: float, make_event: Callable[[float], dp_event.DpEvent], delta: float
) -> float:
    """Smallest σ (to 1e-6 relative) meeting ``target_epsilon`` under RDP alone."""

    grouped = group_size(make_event(1.0))[1] > 1  # RDP has no group form: the full figure

    def eps_of(log_sigma: float) -> float:
        event = make_event(math.exp(log_sigma))
        return epsilon(event, delta) if grouped else rdp_epsilon(event, delta)

    lo, hi = math.log(0.1), math.log(10.0)
    while eps_of(lo) <= target_epsilon:
        lo -= 1.0
        if lo < math.log(1e-6):
            return math.exp(lo)
    while eps_of(hi) > target_epsilon:
        hi += 1.0
        if hi > math.log(1e7):
            raise PrivacyError(
                f"no sigma <= 1e7 reaches epsilon {target_epsilon} at delta {delta}: at sigma "
                f"{math.exp(hi):.3g} the run still has epsilon {eps_of(hi):.4g} (a release whose "
                "noise does not grow with sigma, e.g. a fixed count noise, sets that floor)"
            )
    root = optimize.brentq(lambda ls: eps_of(ls) - target_epsilon, lo, hi, xtol=1e-7)
    # brentq may land on either side of the root: step up until the target is met
    log_sigma = min(root + 1e-7, hi)
    while eps_of(log_sigma) > target_epsilon and log_sigma < hi:
        log_sigma = min(log_sigma + 1e-6, hi)
    return math.exp(log_sigma)
