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
accounted, ``TrainResult.group_epsilons``), none for a heuristic method (no guarantee to
compare) and ∞ for the non-private reference.

How many canaries: ``AuditSettings.canaries`` when given; otherwise the fewest whose audit can
certify the run's planned ε at all (:func:`dpfair.audit.bound.canaries_needed`), capped at
:data:`MOST_CANARIES` and, for mislabelled canaries, at the smallest audited group;
:data:`NO_CLAIM_CANARIES` for a run without a finite claim. Each group also states the largest
ε its canaries could certify (``max_certifiable``): a claim above it cannot be caught.

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
from dpfair.audit.config import AuditSettings
from dpfair.data.dataset import GroupedDataset
from dpfair.errors import ConfigError, did_you_mean
from dpfair.privacy.methods import PrivacyGuarantee
from dpfair.training import TrainConfig, TrainResult, make_plan, predict, train

MOST_CANARIES = 10_000
NO_CLAIM_CANARIES = 1_000


@dataclass(frozen=True)
class GroupAudit:
    """One group's audit (``group_id``: its index): its canaries (``included`` of them
    trained on), the guesses behind the bound (``correct`` of ``guesses``), the ε and μ-GDP
    lower bounds at confidence 1 - β for this group alone, the ε bound holding jointly with
    every audited group's (``joint_lower_bound``, module docstring), the largest ε these
    canaries could certify and the claimed ε (``None``: the method claims no guarantee)."""

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

    @property
    def confidence(self) -> float:
        """Each group's bound on its own."""
        return 1.0 - self.settings.beta

    def statement(self) -> list[str]:
        """What the bounds say, in sentences for the output: the confidence per group and
        jointly, and each claim above what the canaries could certify."""
        n = len(self.groups)
        lines = [f"each group's ε >= holds with probability {self.confidence:.0%} on its own"]
        if n > 1:
            joint = ", ".join(f"{g.group} {g.joint_lower_bound:.3f}" for g in self.groups)
            lines.append(f"jointly over the {n} groups (Bonferroni, β/{n} each), with "
                         f"probability {self.confidence:.0%}: ε >= {joint}")
        lines += [f"{g.group}: {g.canaries} canaries can certify at most ε "
                  f"{g.max_certifiable:.2f}, below the claimed {g.epsilon_claimed:.2f}: this "
                  "audit cannot catch a violation of that claim (raise audit.canaries)"
                  for g in self.groups
                  if g.epsilon_claimed is not None and g.max_certifiable < g.epsilon_claimed]
        lines.append(f"a {self.settings.kind} audit is its own statement: bounds of audits with "
                     "other canary kinds hold jointly only at β divided by their number")
        return lines


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


def canary_count(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings,
                 groups: list[int]) -> int:
    """Canaries per group (module docstring): the setting, or enough to catch the claim."""
    if settings.canaries is not None:
        return settings.canaries
    plan = make_plan(config, len(dataset.train), dataset.n_groups)
    most = MOST_CANARIES
    if settings.kind == "mislabel":
        sizes = np.bincount(dataset.train.g.numpy(), minlength=dataset.n_groups)
        most = max(1, min(most, *(int(sizes[k]) for k in groups)))
    if plan.privacy_guarantee == "heuristic" or not math.isfinite(plan.epsilon):
        return min(most, NO_CLAIM_CANARIES)
    return bound.canaries_needed(plan.epsilon, settings.guesses, settings.beta, plan.delta, most)


def _input_space(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings,
                 groups: list[int], m: int, rng: np.random.Generator
                 ) -> tuple[Canaries, np.ndarray, TrainResult]:
    kind: InputKind = "ood" if settings.kind == "ood" else "mislabel"
    canaries = make_canaries(dataset, kind, groups, m, rng, ood_scale=settings.ood_scale)
    result = train(config, with_canaries(dataset, canaries))
    scores = -predict(result.load_model(), canaries.split, config.eval_batch_size).loss
    return canaries, scores, result


def audit(config: TrainConfig, dataset: GroupedDataset, settings: AuditSettings) -> AuditResult:
    """Train ``config`` on ``dataset`` with canaries and bound ε from below per group (module
    docstring). Raises ``ConfigError`` for an unknown group, ``DataError`` for a group with
    fewer training examples than mislabelled canaries asked for."""
    groups = group_ids(dataset, settings.groups)
    m = canary_count(config, dataset, settings, groups)
    rng = coin_generator(config.seed if config.reproducible else None)
    if settings.kind == "gradient":
        canaries, scores, result = gradient.run(config, dataset, groups, m, rng)
    else:
        canaries, scores, result = _input_space(config, dataset, settings, groups, m, rng)
    canary_groups = canaries.split.g.numpy()
    rows = []
    for k in groups:
        mine = canary_groups == k
        found = [bound.best_guesses(scores[mine], canaries.included[mine], settings.guesses,
                                    beta, result.delta)
                 for beta in (settings.beta, settings.beta / len(groups))]
        rows.append(GroupAudit(
            group=dataset.group_names[k], group_id=k, canaries=int(mine.sum()),
            included=int(canaries.included[mine].sum()), guesses=found[0].r,
            correct=found[0].v, epsilon_lower_bound=found[0].epsilon,
            mu_lower_bound=bound.mu_lower_bound(found[0].epsilon, result.delta),
            joint_lower_bound=found[1].epsilon,
            max_certifiable=bound.max_certifiable(int(mine.sum()), settings.guesses,
                                                  settings.beta, result.delta),
            epsilon_claimed=claimed_epsilon(result, k),
        ))
    return AuditResult(
        method=result.method, privacy_guarantee=result.privacy_guarantee, settings=settings,
        delta=result.delta, groups=rows, scores=scores, included=canaries.included,
        canary_groups=canary_groups, train_result=result,
    )
