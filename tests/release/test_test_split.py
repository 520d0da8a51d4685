"""The test split's line of a run's release (noisy test metrics): every method and seed
evaluates the same test rows, so its ε is the accountant's composition of all of their
noisy releases (oracle: the smaller of dp_accounting's RDP and PLD accountants), kept apart
from the training ε; the budget refuses an over-spend; a small pipeline carries the label
into the results table and MLflow. Default (exact) outputs keep saying that ε does not cover
the test metrics."""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from dpfair.accounting.accountant import reduced
from dpfair.config.sections import BudgetSection
from dpfair.errors import ConfigError, PrivacyError
from dpfair.release.allowed import check_budget
from dpfair.release.labels import EPSILON_METHOD, EPSILON_RUN, EPSILON_TEST, TEST_METRICS_NOTE
from dpfair.release.plan import method_release, release_plan
from dpfair.training import EXACT_TEST_METRICS, TrainConfig, make_plan

DELTA, TEST_DELTA = 1e-5, 1e-4
N_TRAIN, N_TEST, N_GROUPS = 1000, 200, 2


def _config(method: dict, test: dict | None = None, epochs: int = 3) -> TrainConfig:
    return TrainConfig(method=method, model={"name": "logistic_regression"}, epochs=epochs,
                       batch_size=100, sigma=1.5 if method["name"] != "nonprivate" else None,
                       delta=DELTA, test_metrics=test or {})


def _release(label: str, method: dict, test: dict | None, seeds=(0, 1), epochs: int = 3):
    plans = [make_plan(_config(method, test, epochs), N_TRAIN, N_GROUPS, N_TEST)
             for _ in seeds]
    guarantee = plans[0].privacy_guarantee
    return method_release(label, guarantee, seeds, [p.event for p in plans], None, False,
                          DELTA, [p.test for p in plans])


def _oracle(events: list[dp_event.DpEvent], delta: float) -> float:
    """The smaller of two valid upper bounds, RDP and PLD (a step's Gaussians on one batch
    written as one, ``reduced``), composed by dp_accounting itself; compared to 1e-4, since PLDs
    composed in another order round differently."""
    rdp, pld = RdpAccountant(), PLDAccountant(value_discretization_interval=1e-3)
    for event in events:
        rdp.compose(event)
        pld.compose(reduced(event))
    return min(rdp.get_epsilon(delta), pld.get_epsilon(delta))


NOISY = {"release": "noisy", "epsilon": 0.5, "delta": TEST_DELTA}


def _test_gaussians(release) -> list[dp_event.DpEvent]:
    """What one run's noisy test release is, written out for dp_accounting: a Gaussian of
    noise multiplier z per evaluation, and (``fairness``, the default) the last one's fairness
    counts and probability sums, the same noise per coordinate over the same sensitivity of
    sqrt(3): z again."""
    z = release.noise_multiplier
    return ([dp_event.GaussianDpEvent(z)] * release.releases
            + [dp_event.GaussianDpEvent(z)] * release.fairness)


def test_test_split_total_is_the_composition_of_every_method_and_seed():
    ref = _release("nonprivate", {"name": "nonprivate"}, NOISY)
    dpsgd = _release("dpsgd", {"name": "dpsgd", "C": 1.0}, NOISY, epochs=5)
    lens = _release("fairlens", {"name": "fairlens", "C": 1.0}, NOISY, seeds=(0, 1, 2))
    plan = release_plan([ref, dpsgd, lens], DELTA)
    gaussians = [dp_event.GaussianDpEvent(t.noise_multiplier)
                 for m in (ref, dpsgd, lens) for t in m.test_releases
                 for _ in range(t.releases)]
    assert len(gaussians) == 2 * 3 + 2 * 5 + 3 * 3  # one per evaluated epoch of every run
    # and each run's fairness counts (test_metrics.fairness, the default), once: the same
    # noise per coordinate over the same sensitivity of sqrt(3): one more Gaussian of z
    counts = [dp_event.GaussianDpEvent(t.noise_multiplier)
              for m in (ref, dpsgd, lens) for t in m.test_releases if t.fairness]
    assert len(counts) == 2 + 2 + 3
    assert plan.epsilon_test_total == pytest.approx(_oracle(gaussians + counts, TEST_DELTA),
                                                    rel=1e-4)
    assert plan.epsilon_test_total > _oracle(gaussians, TEST_DELTA) * 1.05
    assert plan.test_delta == TEST_DELTA
    # per method: its seeds composed, whatever its training guarantee (no training row here)
    z = lens.test_releases[0].noise_multiplier
    assert lens.epsilon_test == pytest.approx(_oracle(
        [dp_event.GaussianDpEvent(z)] * 9
        + [dp_event.GaussianDpEvent(z)] * 3, TEST_DELTA),
        rel=1e-4)
    assert ref.epsilon_test is not None and math.isfinite(ref.epsilon_test)
    # every run alone reaches its target; composed, more; never the sum of epsilons
    assert all(t.epsilon == pytest.approx(0.5, rel=1e-3) for t in dpsgd.test_releases)
    assert 0.5 < plan.epsilon_test_total < 7 * 0.5
    # kept apart from the training ε: the training total ignores the test releases
    assert plan.epsilon_total == release_plan(
        [_release(m.label, m_spec, None, seeds=m.seeds, epochs=e) for m, m_spec, e in
         ((ref, {"name": "nonprivate"}, 3), (dpsgd, {"name": "dpsgd", "C": 1.0}, 5),
          (lens, {"name": "fairlens", "C": 1.0}, 3))], DELTA).epsilon_total
    lines = plan.itemised()
    assert any(line.startswith("test split (noisy test metrics") for line in lines)
    assert TEST_METRICS_NOTE not in plan.notes() and EPSILON_TEST in plan.test_note()


def test_exact_test_metrics_have_no_test_line_and_say_so():
    plan = release_plan([_release("dpsgd", {"name": "dpsgd", "C": 1.0}, None)], DELTA)
    assert not plan.test_noisy and plan.epsilon_test_total is None
    assert TEST_METRICS_NOTE in plan.notes()
    assert not any("test split" in line for line in plan.itemised())


def test_the_test_budget_refuses_an_over_spend_or_exact_metrics_before_training():
    plan = release_plan([_release("dpsgd", {"name": "dpsgd", "C": 1.0}, NOISY)], DELTA)
    check_budget(plan, BudgetSection(test_epsilon=plan.epsilon_test_total * 1.01))
    with pytest.raises(PrivacyError, match="budget.test_epsilon") as refused:
        check_budget(plan, BudgetSection(test_epsilon=plan.epsilon_test_total / 2))
    assert "test split (noisy test metrics" in str(refused.value)  # the itemised spend
    exact = release_plan([_release("dpsgd", {"name": "dpsgd", "C": 1.0}, None)], DELTA)
    with pytest.raises(PrivacyError, match="test metrics are exact"):
        check_budget(exact, BudgetSection(test_epsilon=1.0))


def test_the_source_ledger_records_the_noisy_test_releases_too(tmp_path):
    """The cumulative ledger composes a run's training and noisy test releases sequentially
    (a later version may train on today's test rows); exact metrics add nothing."""
    from dpfair.ledger import PrivacyGate
    from dpfair.ledger.gate import DataVersion
    from dpfair.pipeline.resume import retry_event

    dpsgd = _release("dpsgd", {"name": "dpsgd", "C": 1.0}, NOISY)
    lens = _release("fairlens", {"name": "fairlens", "C": 1.0}, NOISY)
    plan = release_plan([dpsgd, lens], DELTA)
    gate = PrivacyGate(BudgetSection(allow_heuristic=True, ledger=str(tmp_path / "l.sqlite")))
    data = DataVersion("loans", "v1", "public-v1", {"row": ["a", "b"]})
    release = gate.admit(plan, data).release
    ledger = gate.ledger
    tests = [e for m in (dpsgd, lens) for t in m.test_releases for e in _test_gaussians(t)]
    expected = _oracle([plan.event_total, *tests], DELTA)
    assert release.epsilon == pytest.approx(expected, rel=1e-4)
    assert release.epsilon > plan.epsilon_total  # more than the training alone
    assert ledger.spent("loans", "v2", DELTA) == pytest.approx(expected, rel=1e-4)
    # a heuristic method's training is a label; its noisy test release still counts
    assert release.without_guarantee == ("fairlens: heuristic — no DP guarantee",)
    assert accounting_epsilon(lens.ledger_event) == pytest.approx(
        _oracle(tests[len(tests) // 2:], DELTA), rel=1e-4)
    # exact test metrics: the ledger records the training releases alone
    exact = release_plan([_release("dpsgd", {"name": "dpsgd", "C": 1.0}, None)], DELTA)
    alone = PrivacyGate(BudgetSection(ledger=str(tmp_path / "exact.sqlite"))).admit(
        exact, data).release
    assert alone.epsilon == pytest.approx(_oracle([exact.event_total], DELTA), rel=1e-4)
    # a resumed run's retrain of dpsgd seed 1 adds that run and its test evaluations
    retry = retry_event(plan, {("dpsgd", 1): 1, ("fairlens", 0): 1})
    per_run = dpsgd.test_releases[1]
    assert accounting_epsilon(retry) == pytest.approx(_oracle(
        [dpsgd.run_events[1], *_test_gaussians(per_run),
         *_test_gaussians(lens.test_releases[0])], DELTA), rel=1e-4)


def accounting_epsilon(event: dp_event.DpEvent) -> float:
    from dpfair import accounting

    return accounting.epsilon(event, DELTA)


# ------------------------------------------------------------------ a small pipeline


def _params(tmp_path, test_metrics: dict, **budget):
    from dpfair.config.params import parse_params

    return parse_params({
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                       "train": {"epochs": 2, "batch_size": 50, "lr": 0.01, "sigma": 1.0,
                                 "delta": 1e-5, "progress": False,
                                 "test_metrics": test_metrics},
                       "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0, 1],
                       "baseline": "dpsgd"},
        "budget": {"allow_nonprivate_reference": True, **budget},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                     "artifact_root": str(tmp_path / "art")},
    })


def test_pipeline_labels_noisy_test_metrics_in_the_table_and_mlflow(tmp_path):
    """The flow's steps without Prefect: the results table has the test split's column and
    total, the runs and the pipeline run carry the label and ε, the records have no count or
    per-class value, and what MLflow holds is the noisy release, not the exact metrics."""
    from mlflow import MlflowClient

    from dpfair.data import load_dataset
    from dpfair.pipeline.method_steps import final_config, train_logged
    from dpfair.pipeline.release_step import plan_release
    from dpfair.pipeline.summary import log_release, summarise
    from dpfair.tracking.runs import experiment_id, run
    from dpfair.training import evaluate

    params = _params(tmp_path, {"release": "noisy", "epsilon": 1.0})
    tracking = params.tracking
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    plan = plan_release(params, dataset, {})
    assert plan.test_noisy and set(plan.methods) == {"nonprivate", "dpsgd"}
    exp = experiment_id(tracking, "synthetic")
    with run(tracking, exp, "pipeline") as parent:
        log_release(tracking, parent, plan)
        trained = [train_logged(final_config(params, label, seed, None), label, dataset,
                                tracking, exp, parent, {}, plan.methods[label])
                   for label in plan.methods for seed in (0, 1)]
        records = [record for _, record in trained]
        summary = summarise(params, dataset, records, tmp_path / "out", plan)
    client = MlflowClient(tracking.uri)
    parent_data = client.get_run(parent).data
    assert parent_data.metrics["epsilon_test_total"] == pytest.approx(plan.epsilon_test_total)
    assert parent_data.tags["dpfair.test_metrics"] == "noisy"
    assert "- dpfair.test_metrics: noisy (ε" in parent_data.tags["mlflow.note.content"]
    assert plan.test_note() in parent_data.tags["mlflow.note.content"]
    assert TEST_METRICS_NOTE not in parent_data.tags["mlflow.note.content"]
    for result, record in trained:
        data = client.get_run(record.run_id).data
        assert data.tags["dpfair.test_metrics"] == "noisy"
        assert (f"- dpfair.test_metrics: {result.test_release.label}"
                in data.tags["mlflow.note.content"])
        assert data.metrics["epsilon_test_split"] == pytest.approx(1.0, rel=1e-3)
        logged = data.metrics["final/test/accuracy"]
        assert logged == result.test_metrics["accuracy"]
        exact = evaluate(result.load_model(), dataset.test, dataset.n_classes,
                         dataset.n_groups)
        assert 0 < exact["accuracy"] < 1 and logged != exact["accuracy"]
        loss = {r["group"]: r["value"] for r in record.records if r["metric"] == "loss"}
        assert not set(loss.values()) & {*exact["group_loss"], exact["loss"]}
        assert "final/test/macro_accuracy" not in data.metrics
        assert not {r["metric"] for r in record.records} & {"count", "macro_accuracy"}
        assert not [r for r in record.records if str(r["group"]).startswith("class:")]
    table = summary.table
    assert table.loc[plan.total_label, EPSILON_TEST] == f"{plan.epsilon_test_total:.2f}"
    assert table.loc["dpsgd", EPSILON_TEST] == f"{plan.methods['dpsgd'].epsilon_test:.2f}"
    # never mixed: the training columns hold the training ε
    assert table.loc["dpsgd", EPSILON_RUN] == f"{plan.methods['dpsgd'].epsilon_run:.2f}"
    assert table.loc[plan.total_label, EPSILON_METHOD] == f"{plan.epsilon_total:.2f}"
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert EPSILON_TEST in markdown and markdown.count(plan.test_note()) == 1


def test_pipeline_refuses_a_test_delta_not_below_one_over_n_test(tmp_path):
    from dpfair.data import load_dataset
    from dpfair.pipeline.release_step import plan_release

    params = _params(tmp_path, {"release": "noisy", "epsilon": 1.0, "delta": 0.05})
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    with pytest.raises(ConfigError, match=r"experiment\.train\.test_metrics\.delta"):
        plan_release(params, dataset, {})


def test_default_pipeline_plan_says_exact_and_has_no_test_column(tmp_path):
    from dpfair.data import load_dataset
    from dpfair.pipeline.release_step import plan_release

    params = _params(tmp_path, {})
    plan = plan_release(params, load_dataset("synthetic", params.dataset("synthetic")), {})
    assert not plan.test_noisy and TEST_METRICS_NOTE in plan.notes()
    assert all(t.label == EXACT_TEST_METRICS for m in plan.methods.values()
               for t in m.test_releases)


def test_train_command_prints_the_noisy_label_and_no_count(tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from dpfair.cli.commands import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                       "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0,
                                 "delta": 1e-5, "progress": False,
                                 "test_metrics": {"release": "noisy", "epsilon": 1.0}},
                       "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0]},
    }))
    out = CliRunner().invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert ("test metrics: noisy (ε 1 at δ 1e-05 for the test split over 1 evaluation and the "
            "fairness counts;") in text
    assert TEST_METRICS_NOTE not in text and "macro" not in text
    assert "│ minority │" in out.output and "— │" in out.output  # no count released
    from dpfair.ledger import SourceLedger

    (recorded,) = SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases("synthetic")
    config = TrainConfig(method={"name": "dpsgd", "C": 1.0}, model={"name": "logistic_regression"},
                         epochs=1, batch_size=50, sigma=1.0, delta=1e-5,
                         test_metrics={"release": "noisy", "epsilon": 1.0})
    from dpfair.data import load_dataset

    data = load_dataset("synthetic", {"n": 400})
    plan = make_plan(config, len(data.train), data.n_groups, len(data.test))
    assert recorded.epsilon == pytest.approx(_oracle([plan.event, plan.test.event], 1e-5),
                                             rel=1e-4)
