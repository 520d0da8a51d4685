"""Privacy loss distributions (PLD) of dpfair's events: dp_accounting's PLD, pessimistic.

:func:`pld` maps a DpEvent to a dp_accounting ``PrivacyLossDistribution`` whose hockey-stick
divergences bound the event's privacy profile from above at every ε (add-or-remove-one
neighbours, both directions): every discretisation is dp_accounting's pessimistic one
(``pessimistic_estimate=True``, connect-the-dots), so an ε read from it is an upper bound.

* Gaussian, ``PoissonSampled(q, Gaussian)``, compositions: dp_accounting's factories. A step
  that releases several Gaussians of the same Poisson-sampled batch is first written as one
  Gaussian of σ_eff (:func:`dpfair.accounting.accountant.reduced`): two Gaussian queries of
  sensitivity 1 on the same batch are, for every pair of neighbours, one two-dimensional
  Gaussian whose privacy loss is that of σ_eff (Zhao et al., Lemma 3.1), before and after
  subsampling.
* ``RepeatAndSelectDpEvent``, :class:`~dpfair.accounting.accountant.BinomialSelectDpEvent` (and
  :class:`~dpfair.accounting.accountant.MaxOfDpEvent`): their
  privacy profile is bounded (:mod:`dpfair.accounting.profiles`; for ``MaxOf``, the largest of the
  profiles, hockey-stick divergence being jointly convex) and turned back into a pessimistic PLD
  by connect-the-dots (Doroshenko et al., PETS 2022, Algorithm 1: the PLD supported on the grid
  whose hockey-stick divergence at every grid ε is the bound, and between them an upper
  bound), which then composes with the rest.
* anything else: :class:`UnsupportedEvent` (the caller falls back to RDP).

PLDs are cached by the event's JSON, and each (subsampled) Gaussian's by its σ and q: one
evaluation is well under a second on a laptop CPU at the default :data:`DISCRETIZATION`, and
DPSGD-F's per-group compositions (:mod:`dpfair.accounting.per_group`), whose groups share
most of their steps' multipliers, build each distinct one once.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpfair.accounting.events import (
    BinomialSelectDpEvent,
    MaxOfDpEvent,
    event_from_json,
    event_to_json,
    reduced,
)
from dpfair.accounting.profiles import Rounds, selection_profile
from dpfair.errors import PrivacyError

__all__ = ["DISCRETIZATION", "UnsupportedEvent", "pld", "pld_epsilon", "profile_pld"]

#: value_discretization_interval of every PLD (ε is then within ~1% of the 1e-4 figure)
DISCRETIZATION = 1e-3
#: grid step of a privacy profile turned back into a PLD (a multiple of DISCRETIZATION)
PROFILE_STEP = 1e-2
#: ε at which a profile's grid stops; the rest of its mass is counted as infinite loss
_PROFILE_TOP = 40.0


class UnsupportedEvent(PrivacyError):
    """The event has no PLD here; account it with RDP."""


def pld(event: dp_event.DpEvent) -> pld_lib.PrivacyLossDistribution | None:
    """Pessimistic PLD of ``event`` (None: not private, ε = ∞), cached by its JSON."""
    return _pld_cached(event_to_json(event))


@functools.lru_cache(maxsize=64)  # a PLD holds up to ~1e5 floats
def _pld_cached(key: str) -> pld_lib.PrivacyLossDistribution | None:

    return _walk(reduced(event_from_json(key)), cached=True)


def _identity() -> pld_lib.PrivacyLossDistribution:
    return pld_lib.identity(value_discretization_interval=DISCRETIZATION)


def _compose(parts: list[pld_lib.PrivacyLossDistribution | None]
             ) -> pld_lib.PrivacyLossDistribution | None:
    out = _identity()
    for p in parts:
        if p is None:
            return None
        out = out.compose(p)
    return out


@functools.lru_cache(maxsize=256)  # DPSGD-F's groups share most of their steps' multipliers
def _gaussian(sigma: float, q: float = 1.0) -> pld_lib.PrivacyLossDistribution | None:
    """PLD of a (Poisson-subsampled) Gaussian, cached (PLDs are immutable: composing makes a
    new one)."""
    if sigma == 0:
        return None
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=q, pessimistic_estimate=True,
        value_discretization_interval=DISCRETIZATION)


def _walk(event: dp_event.DpEvent, cached: bool = False
          ) -> pld_lib.PrivacyLossDistribution | None:
    """PLD of ``event``; a search or a ``MaxOf`` inside a composition goes through the cache
    (the same search is in a method's total, the run's total and the ledger's)."""

    selections = (MaxOfDpEvent, dp_event.RepeatAndSelectDpEvent, BinomialSelectDpEvent)
    if not cached and isinstance(event, selections):
        return _pld_cached(event_to_json(event))

    if isinstance(event, dp_event.NoOpDpEvent):
        return _identity()
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return None
    if isinstance(event, dp_event.GaussianDpEvent):
        return _gaussian(float(event.noise_multiplier))
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        inner = event.event
        if not isinstance(inner, dp_event.GaussianDpEvent):
            raise UnsupportedEvent(f"no PLD for PoissonSampled({inner!r})")
        if event.sampling_probability == 0:
            return _identity()
        return _gaussian(float(inner.noise_multiplier), float(event.sampling_probability))
    if isinstance(event, (dp_event.SelfComposedDpEvent, dp_event.ComposedDpEvent)):
        return _compose_parts(_parts(event))
    if isinstance(event, MaxOfDpEvent):
        parts = [_walk(e) for e in event.events]
        if not parts:
            raise PrivacyError("MaxOfDpEvent needs at least one event")
        if any(p is None for p in parts):
            return None
        if len(parts) == 1:
            return parts[0]
        return profile_pld(lambda eps: np.max([p.get_delta_for_epsilon(eps) for p in parts],
                                              axis=0))
    if isinstance(event, dp_event.RepeatAndSelectDpEvent):
        base = _walk(event.event)
        if base is None:
            return None
        rounds = Rounds.from_shape(float(event.mean), float(event.shape))
        return selection_pld(base, rounds)
    if isinstance(event, BinomialSelectDpEvent):
        base = _walk(event.event)
        if base is None:
            return None
        return selection_pld(base, Rounds("binomial", n=int(event.n), p=float(event.p)))
    raise UnsupportedEvent(f"no PLD for {type(event).__name__}")


def _parts(event: dp_event.DpEvent, times: int = 1,
           into: dict[str, tuple[dp_event.DpEvent, int]] | None = None
           ) -> dict[str, tuple[dp_event.DpEvent, int]]:
    """A composition flattened: every distinct part (not a composition itself) by its JSON,
    with how many times it is composed (a run's steps, the same run on several seeds)."""
    out = {} if into is None else into
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _parts(event.event, times * int(event.count), out) if event.count else out
    if isinstance(event, dp_event.ComposedDpEvent):
        for e in event.events:
            _parts(e, times, out)
        return out
    key = event_to_json(event)
    out[key] = (event, out[key][1] + times if key in out else times)
    return out


def _compose_parts(parts: dict[str, tuple[dp_event.DpEvent, int]]
                   ) -> pld_lib.PrivacyLossDistribution | None:
    """PLD of a flattened composition: each distinct part's PLD built once and self-composed
    (one FFT power instead of many compositions, one tail truncation), Gaussians merged into
    one of σ = (Σ n_j σ_j^-2)^-1/2 (composing Gaussians adds their squared sensitivities over
    noise, exactly)."""
    precision, pieces = 0.0, []
    for event, times in parts.values():
        if isinstance(event, dp_event.GaussianDpEvent):
            if event.noise_multiplier == 0:
                return None
            precision += times / float(event.noise_multiplier) ** 2
            continue
        part = _walk(event)
        if part is None:
            return None
        pieces.append(part if times == 1 else part.self_compose(times))
    if precision:
        pieces.append(_gaussian(precision ** -0.5))
    return _compose(pieces)


def selection_pld(base: pld_lib.PrivacyLossDistribution, rounds: Rounds
                  ) -> pld_lib.PrivacyLossDistribution:
    """PLD bounding the best of K runs of ``base`` (:func:`profiles.selection_profile`)."""
    eps, delta = selection_profile(base.get_delta_for_epsilon, rounds, PROFILE_STEP,
                                   _PROFILE_TOP)
    return _from_profile(eps, delta)


def profile_pld(delta_of: object) -> pld_lib.PrivacyLossDistribution:
    """PLD bounding a mechanism whose privacy profile is at most ``delta_of(ε)``."""
    eps = np.arange(0.0, _PROFILE_TOP + PROFILE_STEP / 2, PROFILE_STEP)
    delta = np.minimum.accumulate(np.clip(np.asarray(delta_of(eps)), 0.0, 1.0))  # type: ignore[operator]
    return _from_profile(eps, delta)


def _from_profile(eps: np.ndarray, delta: np.ndarray) -> pld_lib.PrivacyLossDistribution:
    """Connect-the-dots PLD whose δ at each grid ε is ``delta`` (Doroshenko et al., Alg. 1).

    ``delta`` bounds both neighbouring directions at ε >= 0, so at -ε the hockey-stick
    divergence is at most ``1 - e^-ε + e^-ε δ(ε)`` (the other direction at ε): the grid is
    mirrored to negative losses with those values, which makes the PLD a dominating pair at
    every ε, as composition needs. Points past the first whose δ is 0 carry no mass."""
    if np.any(delta <= 0):
        last = int(np.argmax(delta <= 0))
        eps, delta = eps[: last + 1], delta[: last + 1]
    neg = -eps[:0:-1]
    delta_neg = -np.expm1(neg) + np.exp(neg) * delta[:0:-1]
    grid = np.concatenate([neg, eps])
    values = np.minimum.accumulate(np.clip(np.concatenate([delta_neg, delta]), 0.0, 1.0))
    rounded = np.rint(grid / DISCRETIZATION).astype(int)
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(DISCRETIZATION, rounded, values)
    return pld_lib.PrivacyLossDistribution(pmf)


def pld_epsilon(event: dp_event.DpEvent, delta: float) -> float:
    """ε of ``event`` at ``delta`` from its PLD (``inf`` if not private)."""
    dist = pld(event)
    return math.inf if dist is None else float(dist.get_epsilon_for_delta(delta))
