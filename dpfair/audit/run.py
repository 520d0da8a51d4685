"""``audit``: train one configuration with canaries and bound its ε from below, per group.

One training run (Steinke, Nasr & Jagielski 2023, Algorithm 1): ``m`` canaries per audited
group, each included with probability 1/2 (:mod:`dpfair.audit.canaries`, or
:mod:`dpfair.audit.gradient` for gradient canaries), one ordinary :func:`dpfair.training.train`
with the configuration's own secret randomness, one score per canary, and for each group the
bound of :mod:`dpfair.audit.bound` from that group's canaries alone (the other groups' canaries
are independent coins, so they are part of the fixed rest of the data).

Scores: input-space canaries score the final model's log-likelihood of the canary label
(minus its cross-entropy, black-box: an included canary was fitted); gradient canaries score
the parameter's move against the canary direction (white-box, :mod:`dpfair.audit.gradient`).

Next to each bound stands the method's claim: its ε (DPSGD-F: the group's ε, its own steps
accounted, ``TrainResult.group_epsilons``: a data-dependent reading of this one run, shown
beside the bound fixed before training, ``TrainResult.group_epsilon_bounds``), none for a
heuristic method (no guarantee to compare) and ∞ for the non-private reference.

Which canaries (:func:`plan_canaries`): ``AuditSettings.kind``, where ``auto`` is gradient
canaries (white-box: the strongest, the kind that catches an unclipped method) when the method
is private and its model has a parameter for each canary, else out-of-distribution inputs.
How many: ``AuditSettings.canaries`` when given; otherwise
enough that a run leaking ``leak`` nats more than its planned ε is caught with probability
``power`` by each group's joint statement (at β / K, hence also at β on its own;
:func:`dpfair.audit.bound.canaries_for_power`), capped at :data:`MOST_CANARIES` and, for
every kind, at the smallest audited group's training examples (mislabelled canaries are
made of them; more canaries of another kind would outnumber the group they audit; gradient
canaries also at the model's parameters shared by the groups); :data:`NO_CLAIM_CANARIES`
for a run without a finite claim, and for a claim no count up to :data:`MOST_CANARIES` has
the power to catch (its lower bound is still reported, its verdict cannot decide). Each
group also states the largest ε its canaries could certify (``max_certifiable``).

Verdicts (:func:`verdict`), per group at β and jointly at β / K: ``VIOLATION`` when the
canaries reject the claim (:func:`dpfair.audit.bound.flags`: a run that keeps its claim is
flagged with probability at most β); else "consistent" when the audit had at least ``power``
to catch the leak (:func:`dpfair.audit.bound.detection_power` at the group's claim); else
"cannot decide", with the power it had: such a run is not an audit, and
:meth:`AuditResult.statement` says what it would need. The power is the guess game's: it
assumes the leak reaches the canaries' scores as randomised response would, so weak canaries
make "consistent" weaker than its power says (never a proof of privacy).

Confidence: each group's bound holds with probability 1 - β on its own. ``joint_lower_bound``
is each group's bound at β / (number of audited groups) (Bonferroni): all of them hold together
with probability 1 - β. Audits with other canary kinds are separate statements, each at its
own confidence (combine them the same way, β divided by their number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpfair.audit import bound, gradient
from dpfair.audit.canaries import (
    Canaries,
    InputKind,
    coin_generator,
    make_canaries,
    with_canaries,
)
from dpfair.audit.config import AuditSettings, CanaryKind
from dpfair.data.dataset import GroupedDataset
from dpfair.errors import ConfigError, did_you_mean
from dpfair.methods import PrivacyGuarantee
from dpfair.training import TrainConfig, TrainResult, make_plan, predict, train

MOST_CANARIES = 10_000
NO_CLAIM_CANARIES = 1_000


VIOLATION = "VIOLATION: the run leaks more than its ε claims"


def percent(p: float) -> str:
    """A probability as whole percent, rounded down (79.6 % is not reported as 80 %)."""
    return f"{math.floor(100 * p + 1e-9)}%"


def verdict(violation: bool, power: float | None, settings: AuditSettings) -> str:
    """The verdict in words (module docstring); ``power`` None: no finite claim."""
    if violation:
        return VIOLATION
    if power is None:
        return "no finite ε claimed: nothing to violate"
    if power >= settings.power:
        return f"consistent (power {percent(power)} to catch a leak of {settings.leak:g} nat)"
    return f"cannot decide (power {percent(power)})"


@dataclass(frozen=True)
class CanaryPlan:
    """Canaries per group (module docstring): their ``kind`` (``auto`` resolved),
    ``canaries`` used, ``needed`` for the target power (None: more than
    :data:`MOST_CANARIES`, or no finite claim), ``supply`` the most the default takes (the
    smallest audited group; gradient canaries also the model's parameters over the
    groups)."""

    kind: CanaryKind
    canaries: int
    needed: int | None
    supply: int


@dataclass(frozen=True)
class GroupAudit:
    """One group's audit (``group_id``: its index): its canaries (``included`` of them
    trained on), the guesses behind the bound (``correct`` of ``guesses``), the ε and μ-GDP
    lower bounds at confidence 1 - β for this group alone, the ε bound holding jointly with
    every audited group's (``joint_lower_bound``, module docstring), the largest ε these
    canaries could certify and the claimed ε (``None``: the method claims no guarantee; for
    DPSGD-F a data-dependent reading, ``epsilon_fixed`` the bound fixed before training); the
    power to catch the settings' leak alone and jointly (None: no finite claim), the verdict
    alone and whether the joint statement flags this group."""

    group: str
    group_id: int
    canaries: int
    included: int
    guesses: int
    correct: int
    epsilon_lower_bound: float
    mu_lower_bound: float
    joint_lower_bound: float
    max_certifiable: float
    epsilon_claimed: float | None
    epsilon_fixed: float | None
    power: float | None
    joint_power: float | None
    verdict: str
    joint_violation: bool


@dataclass(frozen=True)
class AuditResult:
    """The per-group bounds, every canary's score, coin and group, and the training run."""

    method: str
    privacy_guarantee: PrivacyGuarantee
    settings: AuditSettings
    delta: float
    groups: list[GroupAudit]
    scores: np.ndarray
    included: np.ndarray
    canary_groups: np.ndarray
    train_result: TrainResult
    plan: CanaryPlan

    @property
    def confidence(self) -> float:
        """Each group's bound on its own."""
        return 1.0 - self.settings.beta

    @property
    def violation(self) -> bool:
        """Whether any verdict, a group's or the joint one, is ``VIOLATION``."""
        return any(g.verdict == VIOLATION or g.joint_violation for g in self.groups)

    @property
    def joint_verdict(self) -> str:
        """The verdict of all groups together at β / K each (module docstring)."""
        powers = [g.joint_power for g in self.groups if g.joint_power is not None]
        return verdict(any(g.joint_violation for g in self.groups),
                       min(powers) if powers else None, self.settings)

    def statement(self) -> list[str]:
        """What the audit says, in sentences for the output: each group's verdict and the
        joint one with their confidence, and what an audit short of power would need."""
        n = len(self.groups)
        lines = [f"{g.group}: {g.verdict} (on its own, confidence {self.confidence:.0%})"
                 for g in self.groups]
        if n > 1:
            joint = ", ".join(f"{g.group} {g.joint_lower_bound:.3f}" for g in self.groups)
            lines.append(f"jointly over the {n} groups (Bonferroni, β/{n} each), confidence "
                         f"{self.confidence:.0%}: {self.joint_verdict}; ε >= {joint}")
        lines += self._shortfall()
        if any(g.epsilon_fixed is not None for g in self.groups):
            fixed = ", ".join(f"{g.group} {g.epsilon_fixed:.3f}" for g in self.groups)
            lines.append(f"{self.method}'s claimed ε per group is a data-dependent reading of "
                         "this one run (its clip bounds come from noisy counts), not a "
                         f"guarantee fixed in advance; the bound fixed before training: {fixed}")
        lines.append(f"a {self.plan.kind} audit is its own statement: bounds of audits with "
                     "other canary kinds hold jointly only at β divided by their number")
        return lines

    def _shortfall(self) -> list[str]:
        """The line saying "not an audit" and what it would need, when nothing was flagged
        and the joint power is below the target."""
        powers = [g.joint_power for g in self.groups if g.joint_power is not None]
        if not powers or self.joint_verdict == VIOLATION or min(powers) >= self.settings.power:
            return []
        plan, target = self.plan, percent(self.settings.power)
        needs = (f"even {MOST_CANARIES:,} canaries per group would not reach {target}"
                 if plan.needed is None else f"{plan.needed} canaries per group would reach "
                 f"{target}")
        if plan.needed is not None and plan.needed > plan.supply:
            fix = (f"the default takes at most {plan.supply} (the smallest audited group; "
                   "gradient canaries also the model's parameters): --canaries with --kind "
                   "ood goes beyond, the canaries then outnumbering the group")
        elif plan.needed is None:
            fix = "only a weaker claim (more noise) can be audited"
        else:
            fix = "raise audit.canaries (--canaries)"
        jointly = " jointly" if len(self.groups) > 1 else ""
        return [f"not an audit: power {percent(min(powers))} to catch a leak of "
                f"{self.settings.leak:g} nat over the claim{jointly} ({self.plan.canaries} "
                f"canaries per group); {needs}: {fix}"]


def group_ids(dataset: GroupedDataset, names: list[str] | None) -> list[int]:
    if names is None:
        return list(range(dataset.n_groups))
    unknown = [n for n in names if n not in dataset.group_names]
    if unknown:
        raise ConfigError(
            f"audit.groups: no group {unknown[0]!r} in {dataset.name!r}"
            f"{did_you_mean(unknown[0], dataset.group_names)} (groups: "
            f"{', '.join(dataset.group_names)})"
        )
    return [dataset.group_names.index(n) for n in names]


def claimed_epsilon(result: TrainResult, group: int) -> float | None:
    """What the run claims for ``group``: see the module docstring."""
    if result.privacy_guarantee == "heuristic":
        return None
    if result.privacy_guarantee == "none":
        return math.inf
    if result.group_epsilons is not None:
        return result.group_epsilons[group]
    return result.epsilon


def plan_canaries(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings,
                  groups: list[int]) -> CanaryPlan:
    """Which canaries and how many per group (module docstring)."""
    plan = make_plan(config, len(dataset.train), dataset.n_groups)
    needed = None
    claim = plan.privacy_guarantee != "heuristic" and math.isfinite(plan.epsilon)
    if claim:
        needed = bound.canaries_for_power(plan.epsilon, settings.leak, settings.power,
                                          settings.guesses, settings.beta / len(groups),
                                          plan.delta, MOST_CANARIES)
    sizes = np.bincount(dataset.train.g.numpy(), minlength=dataset.n_groups)
    supply = max(1, min(MOST_CANARIES, *(int(sizes[k]) for k in groups)))
    wanted = settings.canaries or min(supply, needed or NO_CLAIM_CANARIES)
    kind = _kind(config, dataset, settings, len(groups), wanted)
    if kind == "gradient":
        supply = max(1, min(supply, gradient.coordinates(config, dataset) // len(groups)))
    default = min(supply, NO_CLAIM_CANARIES if needed is None else needed)
    return CanaryPlan(kind, settings.canaries or default, needed, supply)


def _kind(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings,
          n_groups: int, wanted: int) -> CanaryKind:
    """``settings.kind``, with ``auto`` resolved (module docstring)."""
    if settings.kind != "auto":
        return settings.kind
    if (config.method.is_private and math.prod(dataset.input_shape) >= 2
            and gradient.coordinates(config, dataset) >= wanted * n_groups):
        return "gradient"
    return "ood"


def fixed_epsilon(result: TrainResult, group: int) -> float | None:
    """The per-group bound fixed before training where the claim is a reading (DPSGD-F)."""
    bounds = result.group_epsilon_bounds
    return None if bounds is None else bounds[group]


def _power(m: int, claim: float | None, settings: AuditSettings, beta: float,
           delta: float) -> float | None:
    if claim is None or not math.isfinite(claim):
        return None
    return bound.detection_power(m, claim, settings.leak, settings.guesses, beta, delta)


def _input_space(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings,
                 kind: InputKind, groups: list[int], m: int, rng: np.random.Generator
                 ) -> tuple[Canaries, np.ndarray, TrainResult]:
    canaries = make_canaries(dataset, kind, groups, m, rng, ood_scale=settings.ood_scale)
    result = train(config, with_canaries(dataset, canaries))
    scores = -predict(result.load_model(), canaries.split, config.eval_batch_size).loss
    return canaries, scores, result


def audit(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings) -> AuditResult:
    """Train ``config`` on ``dataset`` with canaries and bound ε from below per group (module
    docstring). Raises ``ConfigError`` for an unknown group, ``DataError`` for a group with
    fewer training examples than mislabelled canaries asked for."""
    groups = group_ids(dataset, settings.groups)
    plan = plan_canaries(config, dataset, settings, groups)
    rng = coin_generator(config.seed if config.reproducible else None)
    if plan.kind == "gradient":
        canaries, scores, result = gradient.run(config, dataset, groups, plan.canaries, rng)
    else:
        canaries, scores, result = _input_space(config, dataset, settings, plan.kind, groups,
                                                plan.canaries, rng)
    canary_groups = canaries.split.g.numpy()
    levels = (settings.beta, settings.beta / len(groups))
    rows = []
    for k in groups:
        mine, claim = canary_groups == k, claimed_epsilon(result, k)
        m, inside = int(mine.sum()), canaries.included[mine]
        found = [bound.best_guesses(scores[mine], inside, settings.guesses, beta, result.delta)
                 for beta in levels]
        flagged = [claim is not None and math.isfinite(claim) and bound.flags(
            scores[mine], inside, settings.guesses, beta, result.delta, claim)
            for beta in levels]
        power = [_power(m, claim, settings, beta, result.delta) for beta in levels]
        rows.append(GroupAudit(
            group=dataset.group_names[k], group_id=k, canaries=m, included=int(inside.sum()),
            guesses=found[0].r, correct=found[0].v, epsilon_lower_bound=found[0].epsilon,
            mu_lower_bound=bound.mu_lower_bound(found[0].epsilon, result.delta),
            joint_lower_bound=found[1].epsilon,
            max_certifiable=bound.max_certifiable(m, settings.guesses, settings.beta,
                                                  result.delta),
            epsilon_claimed=claim, epsilon_fixed=fixed_epsilon(result, k),
            power=power[0], joint_power=power[1],
            verdict=verdict(flagged[0], power[0], settings), joint_violation=flagged[1],
        ))
    return AuditResult(
        method=result.method, privacy_guarantee=result.privacy_guarantee, settings=settings,
        delta=result.delta, groups=rows, scores=scores, included=canaries.included,
        canary_groups=canary_groups, train_result=result, plan=plan,
    )
