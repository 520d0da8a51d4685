"""Privacy accounting: dp_accounting DpEvent builders, epsilon, JSON ledger.

A method describes what one step releases as a DpEvent
(:meth:`dpfair.privacy.methods.Method.step_event`): ``GaussianDpEvent(σ)`` for the noisy clipped
sum (unit sensitivity after scaling) and, for the adaptive / fair methods, a composed
``GaussianDpEvent(σ_count)`` for the noisy count (unit sensitivity); ``NonPrivateDpEvent`` for
the non-private baseline. :func:`run_event` is the one place a run's event is composed from it:
``SelfComposed(PoissonSampled(q, step), T)``. Both Gaussians query the same Poisson-sampled
batch, so the RDP accountant reduces them to one Gaussian mechanism with
``σ_eff = (σ^-2 + σ_count^-2)^-1/2`` (Zhao et al., Lemma 3.1; for ``dpsgd_f`` and
``naive_reweight`` σ_count is σ1); :func:`reduced` writes the event in that reduced form.

Epsilon comes from dp_accounting's RDP accountant (add-or-remove-one neighbouring relation,
dp_accounting's default orders unless given). Opacus's RDP accountant computes the same number
for plain DP-SGD at integer orders and is a test oracle. At fractional orders dp_accounting 0.6
sums the absolute values of the binomial series of A_α (a valid upper bound) where Opacus keeps
the signs, so with fractional orders dp_accounting's epsilon is slightly larger (never smaller;
< 1% for ε < 10 in the test sweep); both give Esipova's 2.27 and 2.49.

Non-private is always ``NonPrivateDpEvent`` (never ``None``); its :func:`epsilon` is ``inf``.

Steps: the papers' epsilons are reproduced with ``steps = epochs * ceil(n_train / batch_size)``
(:func:`steps_for_epochs`); ``round`` gives the same numbers for the paper settings.

Two extensions of dp_accounting's event language are handled by :func:`epsilon` (and
serialised like the built-in events):

* :class:`MaxOfDpEvent` — "one of these events, which one unknown": its RDP is the pointwise
  maximum over orders. A tuning run that draws its batch size / σ / epochs from a search space is
  a mixture of such runs, and Rényi divergence is jointly quasi-convex, so the mixture is bounded
  by the maximum.
* ``RepeatAndSelectDpEvent`` with shape in (-1, 0) (Papernot & Steinke allow η > -1;
  dp_accounting 0.6 only η ≥ 0): :mod:`dpfair.privacy.repeat_select`.
* :class:`BinomialSelectDpEvent` — the best of K ~ Binomial(n, p) runs of an event (Koskela,
  Redberg & Wang 2024, Section 5: a binomial number of rounds). Its PLD comes from the
  privacy-profile bound (:mod:`dpfair.privacy.profiles`); its RDP is that of all n runs
  composed (K ≤ n, and releasing the best of K of them is post-processing of the n runs and
  of coins independent of the data).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_accountant
from scipy import optimize

from dpfair.errors import PrivacyError
from dpfair.privacy import pld
from dpfair.privacy.repeat_select import repeat_and_select_curve, tnb_gamma, tnb_mean

DEFAULT_ORDERS: tuple[float, ...] = tuple(rdp_accountant.DEFAULT_RDP_ORDERS)

ACCOUNTANT_PLD = "PLD (dp_accounting, pessimistic)"
ACCOUNTANT_PROFILE = ("PLD with the privacy profile of the search (Koskela, Redberg & Wang "
                      "2024)")
ACCOUNTANT_RDP = "RDP (dp_accounting)"
ACCOUNTANT_NONE = "none (no DP guarantee)"
#: every accountant name a report can show
ACCOUNTANTS = (ACCOUNTANT_PLD, ACCOUNTANT_PROFILE, ACCOUNTANT_RDP, ACCOUNTANT_NONE)

__all__ = [
    "ACCOUNTANTS",
    "ACCOUNTANT_NONE",
    "ACCOUNTANT_PLD",
    "ACCOUNTANT_PROFILE",
    "ACCOUNTANT_RDP",
    "DEFAULT_ORDERS",
    "BinomialSelectDpEvent",
    "MaxOfDpEvent",
    "Spend",
    "epsilon",
    "event_from_json",
    "event_to_json",
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
]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class MaxOfDpEvent(dp_event.DpEvent):
    """One of ``events`` happened (which one may depend on randomness independent of the data).

    RDP at every order is the maximum over the events' RDP at that order.
    """

    events: Sequence[dp_event.DpEvent]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class BinomialSelectDpEvent(dp_event.DpEvent):
    """The best of K runs of ``event``, K ~ Binomial(``n``, ``p``) drawn independently of the
    data (K = 0 releases nothing); see the module doc."""

    event: dp_event.DpEvent
    n: int
    p: float


# ----------------------------------------------------------------------------------- builders


def steps_for_epochs(epochs: int, n_train: int, batch_size: int) -> int:
    """Number of Poisson-sampled steps for ``epochs`` epochs: ``epochs * ceil(n / B)``."""
    if epochs < 0 or n_train <= 0 or batch_size <= 0:
        raise PrivacyError(f"bad epochs/n_train/batch_size: {epochs}, {n_train}, {batch_size}")
    return int(epochs) * math.ceil(n_train / batch_size)


def run_event(step_event: dp_event.DpEvent, sample_rate: float, steps: int) -> dp_event.DpEvent:
    """One training run: ``SelfComposed(PoissonSampled(q, step_event), T)``.

    ``step_event`` is what one step releases on its Poisson-sampled batch
    (:meth:`dpfair.privacy.methods.Method.step_event`); a non-private step gives
    ``NonPrivateDpEvent``.
    """
    if not 0 < sample_rate <= 1:
        raise PrivacyError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if int(steps) != steps or steps < 0:
        raise PrivacyError(f"steps must be a non-negative integer, got {steps}")
    if isinstance(step_event, dp_event.NonPrivateDpEvent):
        return dp_event.NonPrivateDpEvent()
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(float(sample_rate), step_event), int(steps)
    )


def score_release_event(sigma_score: float) -> dp_event.DpEvent:
    """Gaussian release of a count query of L2 sensitivity 1 with noise std ``sigma_score``."""
    if not sigma_score > 0:
        raise PrivacyError(f"sigma_score must be > 0, got {sigma_score}")
    return dp_event.GaussianDpEvent(float(sigma_score))


def _effective_sigma(event: dp_event.DpEvent) -> float | None:
    """σ of the one Gaussian that ``event``, Gaussians composed on the same data, amounts to:
    ``(Σ_j σ_j^-2)^-1/2`` (Zhao Lemma 3.1); None if ``event`` is anything else."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return float(event.noise_multiplier)
    if not isinstance(event, dp_event.ComposedDpEvent) or not event.events:
        return None
    sigmas = [_effective_sigma(e) for e in event.events]
    if any(s is None for s in sigmas):
        return None
    if min(sigmas) == 0:
        return 0.0
    return sum(s**-2 for s in sigmas) ** -0.5


def reduced(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """``event`` with every ``PoissonSampled(q, Composed of Gaussians)`` replaced by
    ``PoissonSampled(q, Gaussian(σ_eff))``, the form the RDP accountant computes (same ε).

    It names a run's effective noise multiplier, and is the event dpfair wrote before a step's
    releases were named one by one (tuning fingerprints of older studies hold this form).
    """
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        sigma = _effective_sigma(event.event)
        if sigma is not None:
            return dp_event.PoissonSampledDpEvent(
                event.sampling_probability, dp_event.GaussianDpEvent(sigma)
            )
    return map_subevents(event, reduced)


def map_subevents(event: dp_event.DpEvent,
                  fn: Callable[[dp_event.DpEvent], dp_event.DpEvent]) -> dp_event.DpEvent:
    """``event`` rebuilt with ``fn`` applied to every DpEvent it holds directly (an attrs
    field, or a list of events): one level, ``fn`` recurses if it wants to."""
    if not attr.has(type(event)):
        return event
    changes: dict[str, Any] = {}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_event.DpEvent):
            changes[field.name] = fn(value)
        elif isinstance(value, (list, tuple)) and any(
            isinstance(v, dp_event.DpEvent) for v in value
        ):
            changes[field.name] = type(value)(fn(v) for v in value)
    return attr.evolve(event, **changes) if changes else event


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
        acc = rdp_accountant.RdpAccountant(list(orders_arr))
        acc.compose(event)
        return np.asarray(acc.rdp, dtype=np.float64)
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
        acc = rdp_accountant.RdpAccountant(list(orders_arr))
        if not acc.supports(event):
            raise PrivacyError(f"the RDP accountant does not support {event!r}")
        acc.compose(event)
        return float(acc.get_epsilon(delta))
    rdp = rdp_curve(event, orders_arr)
    return float(rdp_accountant.compute_epsilon(orders_arr, rdp, delta)[0])


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
    (pessimistic, :mod:`dpfair.privacy.pld`; with the privacy-profile bound of a search,
    :mod:`dpfair.privacy.profiles`) and RDP (:func:`rdp_epsilon`; Papernot & Steinke for a
    search). An event the PLD cannot represent is RDP's alone. Cached by the event's JSON.
    """
    _check(event, delta)
    return _spend(event_to_json(event), float(delta))


@functools.lru_cache(maxsize=4096)
def _spend(key: str, delta: float) -> Spend:
    event = event_from_json(key)
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return Spend(math.inf, delta, ACCOUNTANT_NONE)
    try:
        rdp = rdp_epsilon(event, delta)
    except PrivacyError:
        rdp = math.inf
    try:
        via_pld = pld.pld_epsilon(event, delta)
    except pld.UnsupportedEvent:
        via_pld = math.inf
    if via_pld < rdp:
        name = ACCOUNTANT_PROFILE if _has_selection(event) else ACCOUNTANT_PLD
        return Spend(via_pld, delta, name)
    if math.isinf(rdp):
        return Spend(math.inf, delta, ACCOUNTANT_NONE)
    return Spend(rdp, delta, ACCOUNTANT_RDP)


def epsilon(
    event: dp_event.DpEvent, delta: float, orders: Sequence[float] | None = None
) -> float:
    """Epsilon of ``event`` at ``delta``: the tightest valid figure (:func:`spend`); with
    ``orders``, the RDP accountant's at those orders (:func:`rdp_epsilon`).
    ``NonPrivateDpEvent`` gives ``inf``."""
    if orders is not None:
        return rdp_epsilon(event, delta, orders)
    return spend(event, delta).epsilon


# -------------------------------------------------------------------------------- JSON ledger

_EXTRA_TYPES = {"MaxOfDpEvent": MaxOfDpEvent, "BinomialSelectDpEvent": BinomialSelectDpEvent}


def _encode(value: Any) -> Any:
    if isinstance(value, dp_event.DpEvent):
        out = {"type": type(value).__name__}
        if attr.has(type(value)):
            for f in attr.fields(type(value)):
                out[f.name] = _encode(getattr(value, f.name))
        return out
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isfinite(v):
            return v
        return {"float": repr(v)}  # "inf", "-inf", "nan": strict JSON has none
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "name") and hasattr(value, "value"):  # enums
        return {"enum": type(value).__name__, "name": value.name}
    raise TypeError(f"cannot serialise {value!r} in a DpEvent")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return float(value["float"])
        if "type" in value:
            name = value["type"]
            cls = _EXTRA_TYPES.get(name) or getattr(dp_event, name, None)
            if cls is None or not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
                raise PrivacyError(f"unknown DpEvent type {name!r}")
            # "note": a human explanation beside the event (MLflow's dp_event.json), not a field
            kwargs = {k: _decode(v) for k, v in value.items() if k not in ("type", "note")}
            return cls(**kwargs)
        raise PrivacyError(f"cannot decode {value!r}")
    return value


def event_to_json(event: dp_event.DpEvent) -> str:
    """Strict JSON of an event: ``{"type": <dp_event class name>, <field>: ...}``, nested.

    Non-finite floats are ``{"float": "inf"}``.
    """
    if not isinstance(event, dp_event.DpEvent):
        raise PrivacyError(f"not a DpEvent: {event!r} (non-private is NonPrivateDpEvent)")
    return json.dumps(_encode(event), sort_keys=True, allow_nan=False)


def event_from_json(s: str) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_json` (a ``"note"`` key beside a ``"type"`` is ignored)."""
    event = _decode(json.loads(s))
    if not isinstance(event, dp_event.DpEvent):
        raise PrivacyError(f"not the JSON of a DpEvent: {s!r}")
    return event


# ------------------------------------------------------------------------------ calibration


def noise_for_epsilon(
    target_epsilon: float, make_event: Callable[[float], dp_event.DpEvent], delta: float,
    rtol: float = 2e-5,
) -> float:
    """Smallest σ (to ``rtol`` relative) whose run event ``make_event(σ)`` reaches
    ``target_epsilon`` at ``delta`` by the tightest valid accountant (:func:`epsilon`).

    ``make_event`` maps the gradient noise multiplier to the run's event (e.g. the method built
    at σ, its :meth:`~dpfair.privacy.methods.Method.step_event`, wrapped by :func:`run_event`);
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

    def eps_of(log_sigma: float) -> float:
        return rdp_epsilon(make_event(math.exp(log_sigma)), delta)

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
