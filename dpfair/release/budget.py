"""Budget-first planning of a release: ``budget.calibrate_noise``.

Given the release's shape (each method's search, final runs on every seed; the noisy test
metrics have their own budget and are not part of it), :func:`budget_first` finds the one
factor by which every noise multiplier of the calibrated methods is multiplied so that the run
total meets ``budget.epsilon`` (:func:`dpfair.accounting.calibration.noise_scale_for_budget`: the
proportional split, by the tightest valid accountant), and returns the plan at that noise,
whose itemised spend shows the factor, each part's ε and the methods that kept their noise
(``budget.keep_noise``). Whoever trains the plan multiplies the same noises by
``plan.noise_scale``: ``experiment.train.sigma``, every explicitly set count σ (a count σ left
to its default is already a multiple of σ) and ``tuning.sigma_score``.
"""

from __future__ import annotations

from dataclasses import replace

from dpfair.accounting.calibration import noise_scale_for_budget, scale_noise
from dpfair.config.sections import BudgetSection
from dpfair.errors import PrivacyError
from dpfair.release.plan import MethodRelease, ReleasePlan, method_release, release_plan

__all__ = ["budget_first", "scaled_release"]


def scaled_release(m: MethodRelease, factor: float) -> MethodRelease:
    """Method ``m``'s release with every noise multiplier times ``factor``."""
    search = m.search
    if search is not None:
        search = replace(search, run_event=scale_noise(search.run_event, factor),
                         event=None if search.event is None else scale_noise(search.event,
                                                                             factor))
    return method_release(m.label, m.guarantee, m.seeds,
                          [scale_noise(e, factor) for e in m.run_events], search,
                          m.reproducible, m.delta, m.test_releases)


def budget_first(plan: ReleasePlan, budget: BudgetSection) -> ReleasePlan:
    """``plan`` with its noise calibrated so that its total meets ``budget.epsilon`` (module
    doc); ``plan`` itself when ``budget.calibrate_noise`` is off."""
    if not budget.calibrate_noise:
        return plan
    if budget.epsilon is None:
        raise PrivacyError("budget.calibrate_noise needs budget.epsilon, the total to meet")
    unknown = sorted(set(budget.keep_noise) - set(plan.methods))
    if unknown:
        raise PrivacyError(f"budget.keep_noise names {unknown}, not methods of this run "
                           f"({', '.join(plan.methods)}): name methods of experiment.methods")
    private = [m for m in plan.methods.values() if m.has_epsilon]
    scaled = [m for m in private if m.label not in budget.keep_noise]
    kept = [m for m in private if m.label in budget.keep_noise]
    factor = noise_scale_for_budget(budget.epsilon, [m.event for m in scaled],
                                    [m.event for m in kept], plan.delta)
    methods = [scaled_release(m, factor) if m in scaled else m for m in plan.methods.values()]
    return replace(release_plan(methods, plan.delta), noise_scale=factor,
                   noise_kept=tuple(m.label for m in kept))
