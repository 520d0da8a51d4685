"""Budget-first planning: one factor on every noise makes the run total meet budget.epsilon
(to 2%, never above), methods in keep_noise keep theirs, the plan shows the split, and the
settings that cannot work are refused with the fix."""

from __future__ import annotations

import pytest
from dp_accounting import dp_event
from pydantic import ValidationError

from dpfair import accounting
from dpfair.accounting.calibration import noise_scale_for_budget, scale_noise
from dpfair.config.sections import BudgetSection
from dpfair.errors import PrivacyError
from dpfair.release.budget import budget_first
from dpfair.release.plan import method_release, release_plan, search_release
from dpfair.training import TrainConfig, make_plan
from dpfair.tuning import TuningConfig

DELTA = 1e-5
N_TRAIN, N_GROUPS = 2000, 2


def _release(label: str, method: dict, tuned: bool = False):
    config = TrainConfig(method=method, model={"name": "logistic_regression"}, epochs=3,
                         batch_size=100, sigma=1.2, delta=DELTA)
    run = make_plan(config, N_TRAIN, N_GROUPS).event
    search = None
    if tuned:
        cfg = TuningConfig(mode="tnb", eta=1.0, mu=5.0, space={"lr": [0.1, 0.2]},
                           sigma_score=8.0)
        search = search_release(cfg, run, 4, "selected")
    return method_release(label, config.method.privacy_guarantee, (0, 1), [run, run], search,
                          False, DELTA)


@pytest.fixture(scope="module")
def plan():
    return release_plan([_release("dpsgd", {"name": "dpsgd", "C": 1.0}, tuned=True),
                         _release("dpsgd_f", {"name": "dpsgd_f", "C0": 1.0})], DELTA)


def test_the_total_meets_the_budget_within_two_percent(plan):
    target = 3.0
    assert plan.epsilon_total > target  # the configured noise is over budget
    calibrated = budget_first(plan, BudgetSection(epsilon=target, calibrate_noise=True))
    assert 0.98 * target <= calibrated.epsilon_total <= target
    s = calibrated.noise_scale
    assert s is not None and s > 1
    for label, m in plan.methods.items():
        new = calibrated.methods[label]
        assert list(new.run_events) == [scale_noise(e, s) for e in m.run_events]
        assert new.epsilon_run < m.epsilon_run
    search = calibrated.methods["dpsgd"].search
    assert search.event == scale_noise(plan.methods["dpsgd"].search.event, s)
    # the split is shown with each part's ε and accountant
    lines = calibrated.itemised()
    assert any(f"× {s:.4g}" in line for line in lines)
    assert any(accounting.ACCOUNTANT_PROFILE in line and "search ε" in line for line in lines)
    # the same split under RDP alone needs more noise
    rdp_total = accounting.rdp_epsilon(scale_noise(plan.event_total, s), DELTA)
    assert rdp_total > target


def test_kept_methods_keep_their_noise(plan):
    calibrated = budget_first(plan, BudgetSection(epsilon=4.0, calibrate_noise=True,
                                                  keep_noise=["dpsgd_f"]))
    assert calibrated.methods["dpsgd_f"].run_events == plan.methods["dpsgd_f"].run_events
    assert calibrated.noise_kept == ("dpsgd_f",)
    assert 0.98 * 4.0 <= calibrated.epsilon_total <= 4.0
    assert any("kept as configured: dpsgd_f" in line for line in calibrated.itemised())


def test_off_by_default_and_refusals(plan):
    assert budget_first(plan, BudgetSection(epsilon=3.0)) is plan
    with pytest.raises(ValidationError, match="calibrate_noise needs budget.epsilon"):
        BudgetSection(calibrate_noise=True)
    with pytest.raises(ValidationError, match="keep_noise applies only"):
        BudgetSection(epsilon=1.0, keep_noise=["dpsgd"])
    with pytest.raises(PrivacyError, match="not methods of this run"):
        budget_first(plan, BudgetSection(epsilon=3.0, calibrate_noise=True, keep_noise=["x"]))
    fixed = plan.methods["dpsgd_f"].event
    with pytest.raises(PrivacyError, match="already spend"):
        noise_scale_for_budget(0.1, [plan.methods["dpsgd"].event], [fixed], DELTA)


def test_scale_noise_reaches_every_gaussian():
    run = accounting.run_event(dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(1.0), dp_event.GaussianDpEvent(10.0)]), 0.01, 50)
    event = dp_event.RepeatAndSelectDpEvent(
        dp_event.ComposedDpEvent([run, dp_event.GaussianDpEvent(5.0)]), 3.0, 1.0)
    scaled = scale_noise(event, 2.0)
    want = accounting.run_event(dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(2.0), dp_event.GaussianDpEvent(20.0)]), 0.01, 50)
    assert scaled == dp_event.RepeatAndSelectDpEvent(
        dp_event.ComposedDpEvent([want, dp_event.GaussianDpEvent(10.0)]), 3.0, 1.0)
    with pytest.raises(PrivacyError, match="factor"):
        scale_noise(event, 0.0)


def test_a_pipeline_run_trains_at_the_calibrated_noise(tmp_path, monkeypatch):
    """`budget.calibrate_noise` in params.yaml: the run's σ, count σ and score σ are scaled
    by one factor, and the plan of what trains meets budget.epsilon to 2%, never above."""
    import yaml

    from dpfair.config.params import load_params
    from dpfair.data import load_dataset
    from dpfair.pipeline.release_step import calibrated_params, plan_release

    monkeypatch.chdir(tmp_path)
    raw = {
        "datasets": {"synthetic": {"n": 600}},
        "experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                       "train": {"epochs": 3, "batch_size": 50, "sigma": 1.0, "delta": 1e-5},
                       "methods": {"dpsgd": {"C": 1.0}, "dpsgd_f": {"C0": 1.0}},
                       "seeds": [0, 1], "nonprivate_reference": False},
        "tuning": {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}},
        "budget": {"epsilon": 4.0, "calibrate_noise": True},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(tmp_path / "params.yaml")
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    studies = {"dpsgd": "s-dpsgd"}
    calibrated = calibrated_params(params, dataset)
    assert not list(tmp_path.glob("*.db"))  # the factor was found without any real study
    assert plan_release(params, dataset, {"dpsgd": "at-1"}).epsilon_total > 4.0  # over at σ 1
    factor = calibrated.experiment.train.sigma
    assert factor > 1.0
    assert calibrated.tuning.settings["sigma_score"] == pytest.approx(10.0 * factor)
    plan = plan_release(calibrated, dataset, studies)
    assert 0.98 * 4.0 <= plan.epsilon_total <= 4.0
    raw["tuning"]["spaces"]["dpsgd"]["sigma"] = [1.0, 2.0]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match="search no sigma"):
        calibrated_params(load_params(tmp_path / "params.yaml"), dataset)
