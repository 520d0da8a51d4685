"""What ``budget.*`` allows a release plan (:mod:`dpfair.release.plan`): the one rule the
privacy gate applies to every command before anything trains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.errors import BudgetExceededError
from dpfair.release.labels import HEURISTIC
from dpfair.release.plan import ReleasePlan, _fmt

if TYPE_CHECKING:
    from dpfair.config.sections import BudgetSection

__all__ = ["check_budget"]


def check_budget(plan: ReleasePlan, budget: BudgetSection) -> None:
    """Refuse (``BudgetExceededError``, itemising the spend) a run that releases more than
    ``budget`` allows: a total ε over ``budget.epsilon``, or a release without guarantee
    that the budget does not allow. Called before anything trains."""
    refused = []
    for m in plan.without_guarantee:
        if m.guarantee == "heuristic" and not budget.allow_heuristic:
            refused.append(f"{m.label} has no DP guarantee ({HEURISTIC}); allow it with "
                           "budget.allow_heuristic: true")
        if m.guarantee == "none" and not budget.allow_nonprivate_reference:
            refused.append(f"the non-private reference {m.label!r} releases test metrics of a "
                           "model trained without noise; allow it with "
                           "budget.allow_nonprivate_reference: true or drop it with "
                           "experiment.nonprivate_reference: false")
    for m in plan.methods.values():
        if m.search is not None and m.search.unnoised_scores \
                and not budget.allow_unnoised_validation_scores:
            refused.append(f"{m.label}'s search scores its trials on the validation rows "
                           "without noise (tuning.score_privacy: public_validation): allow "
                           "it with budget.allow_unnoised_validation_scores: true (only for "
                           "public validation data), or use score_privacy: noisy")
    if budget.epsilon is not None and not plan.epsilon_total <= budget.epsilon:
        refused.append(f"the total ε {_fmt(plan.epsilon_total)} exceeds budget.epsilon "
                       f"{budget.epsilon:g} (δ = {plan.delta:g}): lower mu, the seeds or the "
                       "epochs, raise sigma, or tune fewer methods")
    if budget.test_epsilon is not None:
        if plan.epsilon_test_total is None:
            refused.append("budget.test_epsilon is set but the test metrics are exact (no ε "
                           "covers them): set experiment.train.test_metrics.release: noisy, "
                           "or remove budget.test_epsilon")
        elif not plan.epsilon_test_total <= budget.test_epsilon:
            refused.append(f"the test split's ε {_fmt(plan.epsilon_test_total)} exceeds "
                           f"budget.test_epsilon {budget.test_epsilon:g}: lower "
                           "test_metrics.epsilon, the seeds or the methods")
    if refused:
        raise BudgetExceededError(
            "the run would release more than the budget allows; nothing was trained.\n  "
            + "\n  ".join(refused) + "\nplanned spend:\n  " + "\n  ".join(plan.itemised())
        )
