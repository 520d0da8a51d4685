"""The events dpfair describes its releases with: dp_accounting's DpEvent language, two
extensions, the builders of a run's event and their strict JSON form.

Data that *describes* a mechanism, read by the accountants (:mod:`dpfair.accounting.accountant`
for ε, :mod:`dpfair.accounting.pld` for privacy loss distributions); this module computes no ε.

* :class:`MaxOfDpEvent`: one of these events, which one unknown (a search space's runs).
* :class:`BinomialSelectDpEvent`: the best of K ~ Binomial(n, p) runs of an event (Koskela,
  Redberg & Wang 2024, Section 5).
* :class:`GroupPrivacyDpEvent`: an event whose neighbouring datasets differ in up to ``rows``
  rows, not one (a person who may hold several rows: group privacy).
* :func:`run_event`: one training run, ``SelfComposed(PoissonSampled(q, step), T)``;
  :func:`reduced`: a step's Gaussians on one batch written as one Gaussian of
  ``σ_eff = (Σ_j σ_j^-2)^-1/2`` (Zhao et al., Lemma 3.1).
* :func:`event_to_json` / :func:`event_from_json`: the ledger's and MLflow's form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import attr
import numpy as np
from dp_accounting import dp_event

from dpfair.errors import PrivacyError


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


@attr.s(frozen=True, slots=True, auto_attribs=True)
class GroupPrivacyDpEvent(dp_event.DpEvent):
    """``event`` on data where the protected unit (a person) may hold up to ``rows`` rows: the
    neighbouring datasets differ in ``rows`` rows, not one. Inside a composition every such
    event is read with the largest ``rows`` of the composition (:func:`group_size`)."""

    event: dp_event.DpEvent
    rows: int


def with_group(event: dp_event.DpEvent, rows: int) -> dp_event.DpEvent:
    """``event`` for a unit of ``rows`` rows: itself for one row (or no guarantee), else
    :class:`GroupPrivacyDpEvent`."""
    if int(rows) != rows or rows < 1:
        raise PrivacyError(f"rows per privacy unit must be a positive integer, got {rows}")
    if rows == 1 or isinstance(event, dp_event.NonPrivateDpEvent):
        return event
    return GroupPrivacyDpEvent(event, int(rows))


def group_size(event: dp_event.DpEvent) -> tuple[dp_event.DpEvent, int]:
    """``event`` with every :class:`GroupPrivacyDpEvent` unwrapped, and the largest ``rows``
    among them (1: none).

    Reading the whole composition with the largest k is sound: change a person's rows one at
    a time, the i-th row of every dataset at step i; each step is a one-row change of every
    mechanism, so the composition's row-level guarantee holds per step, and k steps give the
    group bound (:func:`dpfair.accounting.accountant.spend`)."""
    found: list[int] = []

    def strip(e: dp_event.DpEvent) -> dp_event.DpEvent:
        if isinstance(e, GroupPrivacyDpEvent):
            found.append(e.rows)
            return strip(e.event)
        return map_subevents(e, strip)

    inner = strip(event)
    return inner, max(found, default=1)


# ----------------------------------------------------------------------------------- builders


def steps_for_epochs(epochs: int, n_train: int, batch_size: int) -> int:
    """Number of Poisson-sampled steps for ``epochs`` epochs: ``epochs * ceil(n / B)``."""
    if epochs < 0 or n_train <= 0 or batch_size <= 0:
        raise PrivacyError(f"bad epochs/n_train/batch_size: {epochs}, {n_train}, {batch_size}")
    return int(epochs) * math.ceil(n_train / batch_size)


def run_event(step_event: dp_event.DpEvent, sample_rate: float, steps: int) -> dp_event.DpEvent:
    """One training run: ``SelfComposed(PoissonSampled(q, step_event), T)``.

    ``step_event`` is what one step releases on its Poisson-sampled batch
    (:meth:`dpfair.methods.Method.step_event`); a non-private step gives
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


# -------------------------------------------------------------------------------- JSON ledger

_EXTRA_TYPES = {"MaxOfDpEvent": MaxOfDpEvent, "BinomialSelectDpEvent": BinomialSelectDpEvent,
                "GroupPrivacyDpEvent": GroupPrivacyDpEvent}


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
