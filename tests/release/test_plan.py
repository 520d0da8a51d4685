"""dpfair.release.plan: a run's ε is the accountant's composition of everything it releases, the
budget refuses an over-spend with the itemised plan, and no release without guarantee gets a
number. The oracle is the smaller of dp_accounting's RDP and PLD accountants, called directly
(a search's RepeatAndSelect is RDP's alone there: dpfair's privacy-profile figure is below it)."""

from __future__ import annotations

import json
import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from dpfair import accounting
from dpfair.config.sections import BudgetSection
from dpfair.errors import PrivacyError
from dpfair.release.allowed import check_budget
from dpfair.release.labels import (
    EPSILON_METHOD,
    HEURISTIC,
    NONPRIVATE_REFERENCE,
    PRIVATE_LEDGER_STATUS,
    TEST_METRICS_NOTE,
)
from dpfair.release.plan import (
    epsilon_cells,
    method_release,
    release_plan,
    search_release,
    write_ledger,
)
from dpfair.training import REPLAYABLE_NOISE, TrainConfig, make_plan
from dpfair.tuning import TuningConfig, TuningResult

DELTA = 1e-5
N_TRAIN, N_GROUPS = 1000, 2


def _run_event(method: dict) -> dp_event.DpEvent:
    config = TrainConfig(method=method, model={"name": "logistic_regression"}, epochs=2,
                         batch_size=100, sigma=1.5, delta=DELTA)
    return make_plan(config, N_TRAIN, N_GROUPS).event


def _oracle(event: dp_event.DpEvent) -> float:
    """The smaller of two valid upper bounds: RDP, and PLD where it supports the event (a
    step's Gaussians on one batch written as one, :func:`accounting.reduced`)."""
    accountant = RdpAccountant()
    accountant.compose(event)
    best = accountant.get_epsilon(DELTA)
    pld = PLDAccountant(value_discretization_interval=1e-3)
    if pld.supports(accounting.reduced(event)):
        pld.compose(accounting.reduced(event))
        best = min(best, pld.get_epsilon(DELTA))
    return best


def _release(label: str, method: dict, seeds=(0, 1), search=None, reproducible=False):
    run = _run_event(method) if search is None else search.run_event
    guarantee = TrainConfig(method=method, model={"name": "mlp"}, epochs=1,
                            sigma=1.0).method.privacy_guarantee
    return method_release(label, guarantee, seeds, [run] * len(seeds), search, reproducible,
                          DELTA)


@pytest.fixture
def tuning() -> TuningConfig:
    return TuningConfig(mode="tnb", eta=1.0, mu=3.0, space={"lr": [0.1, 0.2]}, sigma_score=8.0)


def test_all_trials_release_is_the_composition_of_the_k_runs_and_their_scores(tuning):
    run = _run_event({"name": "dpsgd", "C": 1.0})
    selected = search_release(tuning, run, k=7, release="selected")
    every = search_release(tuning, run, k=7, release="all_trials")
    assert selected.event == dp_event.RepeatAndSelectDpEvent(
        dp_event.ComposedDpEvent([run, dp_event.GaussianDpEvent(8.0)]), 3.0, 1.0)
    k_runs = dp_event.SelfComposedDpEvent(
        dp_event.ComposedDpEvent([run, dp_event.GaussianDpEvent(8.0)]), 7)
    assert every.event == k_runs
    assert "all 7 trials released" in every.label and "score" in every.label
    release = _release("dpsgd", {"name": "dpsgd", "C": 1.0}, search=every)
    assert release.epsilon_search == pytest.approx(_oracle(k_runs), rel=1e-4)
    assert release.accountant_search == accounting.ACCOUNTANT_PLD
    # a grid search has no guarantee whichever is released
    grid = TuningConfig(mode="grid", space={"lr": [0.1]})
    assert search_release(grid, run, 1, "all_trials").event is None


def test_run_total_is_the_accountants_composition_not_a_sum(tuning):
    search = search_release(tuning, _run_event({"name": "dpsgd", "C": 1.0}), 4, "selected")
    tuned = _release("dpsgd", {"name": "dpsgd", "C": 1.0}, search=search)
    fair = _release("dpsgd_f", {"name": "dpsgd_f", "C0": 1.0})
    lens = _release("fairlens", {"name": "fairlens", "C": 1.0})
    reference = _release("nonprivate", {"name": "nonprivate"})
    plan = release_plan([reference, tuned, fair, lens], DELTA)
    everything = dp_event.ComposedDpEvent([
        search.event, search.run_event, search.run_event,
        _run_event({"name": "dpsgd_f", "C0": 1.0}), _run_event({"name": "dpsgd_f", "C0": 1.0}),
    ])
    without_search = dp_event.ComposedDpEvent(everything.events[1:])
    # the search's profile bound is below RDP's, and the search cannot cost less than nothing
    assert _oracle(without_search) < plan.epsilon_total < _oracle(everything)
    assert plan.accountant_total == accounting.ACCOUNTANT_PROFILE
    assert plan.epsilon_total < tuned.epsilon + fair.epsilon
    assert tuned.epsilon < _oracle(dp_event.ComposedDpEvent(
        [search.event, search.run_event, search.run_event]))
    assert tuned.epsilon_run == pytest.approx(_oracle(search.run_event), rel=1e-4)
    assert tuned.accountant_run == accounting.ACCOUNTANT_PLD
    assert fair.epsilon == pytest.approx(_oracle(fair.event), rel=1e-4)
    assert accounting.ACCOUNTANT_PROFILE in plan.accountants()
    # the total names what it leaves out
    assert plan.total_label == ("run total: private releases composed (released without "
                                "guarantee, not covered: non-private reference, fairlens)")
    notes = plan.notes()
    assert TEST_METRICS_NOTE in notes and any(EPSILON_METHOD in n for n in notes)


def test_no_number_without_a_guarantee():
    lens = _release("fairlens", {"name": "fairlens", "C": 1.0})
    reference = _release("nonprivate", {"name": "nonprivate"})
    assert epsilon_cells(lens) == (HEURISTIC, HEURISTIC)
    assert epsilon_cells(reference) == (NONPRIVATE_REFERENCE, NONPRIVATE_REFERENCE)
    assert math.isinf(lens.epsilon) and not lens.has_epsilon
    assert HEURISTIC in lens.epsilon_note and "heuristic" in lens.epsilon_note
    dpsgd = _release("dpsgd", {"name": "dpsgd", "C": 1.0})
    run, everything = epsilon_cells(dpsgd)
    assert float(run) == pytest.approx(dpsgd.epsilon_run, abs=0.005)
    assert float(everything) == pytest.approx(dpsgd.epsilon, abs=0.005)


def test_over_budget_is_refused_with_the_itemised_spend(tuning):
    search = search_release(tuning, _run_event({"name": "dpsgd", "C": 1.0}), 4, "selected")
    tuned = _release("dpsgd", {"name": "dpsgd", "C": 1.0}, search=search)
    fair = _release("dpsgd_f", {"name": "dpsgd_f", "C0": 1.0}, seeds=(3, 4, 5))
    plan = release_plan([tuned, fair], DELTA)
    check_budget(plan, BudgetSection(epsilon=plan.epsilon_total * 1.001))
    with pytest.raises(PrivacyError) as err:
        check_budget(plan, BudgetSection(epsilon=tuned.epsilon))
    msg = str(err.value)
    assert "nothing was trained" in msg and "exceeds budget.epsilon" in msg
    assert f"search ε {tuned.epsilon_search:.3g}" in msg
    assert f"seeds 0, 1: ε {tuned.epsilon_run:.3g} each" in msg
    assert f"composed: ε {tuned.epsilon:.3g}" in msg
    assert f"dpsgd_f: not tuned; seeds 3, 4, 5: ε {fair.epsilon_run:.3g} each" in msg
    assert f"total, composition of every private release: ε {plan.epsilon_total:.3g}" in msg


def test_releases_without_guarantee_are_refused_unless_allowed():
    plan = release_plan([_release("nonprivate", {"name": "nonprivate"}),
                         _release("fairlens", {"name": "fairlens", "C": 1.0}),
                         _release("dpsgd", {"name": "dpsgd", "C": 1.0})], DELTA)
    with pytest.raises(PrivacyError) as err:
        check_budget(plan, BudgetSection(epsilon=100.0))
    assert "budget.allow_heuristic: true" in str(err.value)
    assert "budget.allow_nonprivate_reference: true" in str(err.value)
    with pytest.raises(PrivacyError, match="allow_heuristic") as err:
        check_budget(plan, BudgetSection(epsilon=100.0, allow_nonprivate_reference=True))
    assert "allow_nonprivate_reference" not in str(err.value).split("planned spend")[0]
    check_budget(plan, BudgetSection(epsilon=100.0, allow_heuristic=True,
                                     allow_nonprivate_reference=True))


def test_a_reproducible_release_says_its_noise_is_replayable(tuning):
    replayable = _release("dpsgd", {"name": "dpsgd", "C": 1.0}, reproducible=True)
    plan = release_plan([replayable], DELTA)
    assert plan.reproducible
    assert any(REPLAYABLE_NOISE in note for note in plan.notes())
    assert any(REPLAYABLE_NOISE in line for line in plan.itemised())
    search = search_release(tuning.model_copy(update={"reproducible": True}),
                            _run_event({"name": "dpsgd", "C": 1.0}), 2, "selected")
    assert _release("dpsgd", {"name": "dpsgd", "C": 1.0}, search=search).reproducible


def _result(storage: str, study: str) -> TuningResult:
    return TuningResult(
        best_config=None, best_params={"lr": 0.1}, best_score=0.9, best_trial=1, K=3, n_runs=3,
        trials=[{"number": n, "score": s} for n, s in enumerate([0.8, 0.85, 0.9])],  # type: ignore[misc]
        epsilon_training=1.0, epsilon_search=2.0, delta=DELTA, event_json=None,
        run_event_json=None, tuning_privacy="tnb", score_privacy="noisy",
        score="macro_accuracy", study_name=study, storage=storage)


def test_the_private_ledger_lies_beside_the_storage_and_says_it_is_private(tmp_path):
    (tmp_path / "db").mkdir()
    path = write_ledger(_result(f"sqlite:///{tmp_path / 'db' / 'optuna.db'}", "d/ds-1"),
                        "selected")
    assert path == tmp_path / "db" / "d_ds-1.ledger.PRIVATE.json"
    ledger = json.loads(path.read_text())
    assert ledger["status"] == PRIVATE_LEDGER_STATUS
    assert "not for release" in ledger["status"] and "voids the ε" in ledger["status"]
    assert ledger["K"] == 3 and [t["score"] for t in ledger["trials"]] == [0.8, 0.85, 0.9]
    released = write_ledger(_result(f"journal:{tmp_path / 'j.log'}", "s"), "all_trials")
    assert released == tmp_path / "s.ledger.json"
    assert "released" in json.loads(released.read_text())["status"]
