"""dpfair/pipeline/method_steps.py helpers that do not need the Prefect flow (the flow:
tests/flows)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from dpfair.data import load_dataset
from dpfair.pipeline.method_steps import _trajectory
from dpfair.pipeline.summary import _bounds
from dpfair.training import TrainConfig, train


def test_clip_bound_figure_gets_bounds_only_not_steps_or_released_counts():
    ds = load_dataset("synthetic", {"n": 400})
    config = TrainConfig(method={"name": "dpsgd_f", "C0": 1.0},
                         model={"name": "logistic_regression"}, epochs=1, batch_size=50,
                         lr=0.1, sigma=1.0, progress=False, device="cpu")
    trajectory = _trajectory(train(config, ds))
    # the logged trajectory keeps everything the method released, with its step index ...
    assert {"step", "m_released[0]", "o_released[1]"} <= set(trajectory)
    # ... the figure plots only the clip bounds, one line per group
    bounds = _bounds(trajectory)
    assert sorted(bounds) == [f"C_k[{k}]" for k in range(ds.n_groups)]
    assert all(len(v) == len(trajectory["step"]) for v in bounds.values())


def test_dvc_stage_list_is_read_from_dvc_yaml(repo_root, tmp_path):
    import shutil

    from dpfair.data import available_datasets
    from dpfair.pipeline.data_step import dvc_prepare_stages

    stages = dvc_prepare_stages(repo_root)
    assert "digits" in stages and "adult" in stages
    assert set(stages) <= set(available_datasets())
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  prepare:\n    foreach: [digits]\n    do:\n      cmd: echo ${item}\n"
    )
    assert dvc_prepare_stages(tmp_path) == ("digits",)
    # generated from params.yaml's datasets: an own dataset declared there has its stage
    shutil.copy(repo_root / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(
        "datasets:\n  digits: {seed: 0}\n  loans: {kind: table, path: data/raw/l.csv}\n")
    assert dvc_prepare_stages(tmp_path) == ("digits", "loans")
    assert dvc_prepare_stages(tmp_path / "absent") == ()


def test_final_runs_say_what_their_epsilon_covers(tmp_path):
    """The steps without Prefect: a proven method logs both epsilons, FairLens and the
    reference none (a tag says why), a reproducible run says its noise is replayable, and
    the table and the pipeline run's description say what ε covers."""
    from mlflow import MlflowClient

    from dpfair.accounting.accountant import ACCOUNTANT_NONE
    from dpfair.config.params import parse_params
    from dpfair.pipeline.method_steps import final_config, train_and_log
    from dpfair.pipeline.release_step import plan_release
    from dpfair.pipeline.summary import log_release, summarise
    from dpfair.release.labels import (
        EPSILON_ACCOUNTANT,
        EPSILON_METHOD,
        EPSILON_RUN,
        HEURISTIC,
        NONPRIVATE_REFERENCE,
        TEST_METRICS_NOTE,
    )
    from dpfair.tracking.runs import TrackingConfig, experiment_id, run
    from dpfair.training import REPLAYABLE_NOISE

    params = parse_params({
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                       "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0,
                                 "delta": 1e-5, "progress": False, "reproducible": True},
                       "methods": {"dpsgd": {"C": 1.0}, "fairlens": {"C": 1.0}},
                       "seeds": [0], "baseline": "dpsgd"},
        "budget": {"allow_heuristic": True, "allow_nonprivate_reference": True},
    })
    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                              artifact_root=str(tmp_path / "art"))
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    plan = plan_release(params, dataset, {})
    exp = experiment_id(tracking, "synthetic")
    with run(tracking, exp, "pipeline") as parent:
        log_release(tracking, parent, plan)
        records = [train_and_log(final_config(params, label, 0, None), label, dataset, tracking,
                                 exp, parent, {}, plan.methods[label])
                   for label in plan.methods]
        summary = summarise(params, dataset, records, tmp_path / "out", plan)
    client = MlflowClient(tracking.uri)
    logged = {r.label: client.get_run(r.run_id).data for r in records}
    assert logged["dpsgd"].metrics["epsilon_method_release"] == plan.methods["dpsgd"].epsilon
    assert logged["dpsgd"].tags["dpfair.noise"] == "replayable"
    assert REPLAYABLE_NOISE in logged["dpsgd"].tags["mlflow.note.content"]
    for label, why in (("fairlens", HEURISTIC), ("nonprivate", NONPRIVATE_REFERENCE)):
        assert not [m for m in logged[label].metrics if m.startswith("epsilon")]
        assert logged[label].tags["dpfair.epsilon"] == plan.methods[label].guarantee
        assert f"- dpfair.epsilon: {why}" in logged[label].tags["mlflow.note.content"]
    note = client.get_run(parent).data.tags["mlflow.note.content"]
    assert TEST_METRICS_NOTE in note and REPLAYABLE_NOISE in note
    table = summary.table
    assert table.loc[f"dpsgd ({REPLAYABLE_NOISE})", EPSILON_RUN] == (
        f"{plan.methods['dpsgd'].epsilon_run:.2f}")
    lens = table.loc[f"fairlens ({REPLAYABLE_NOISE})", [EPSILON_RUN, EPSILON_METHOD]]
    assert list(lens) == [HEURISTIC] * 2
    assert table.loc[plan.total_label, EPSILON_METHOD] == f"{plan.epsilon_total:.2f}"
    assert table.loc[plan.total_label, EPSILON_ACCOUNTANT] == plan.accountant_total
    assert plan.methods["dpsgd"].accountant in table.loc[f"dpsgd ({REPLAYABLE_NOISE})",
                                                         EPSILON_ACCOUNTANT]
    assert table.loc[f"fairlens ({REPLAYABLE_NOISE})", EPSILON_ACCOUNTANT] == ACCOUNTANT_NONE
    assert "without guarantee, not covered: non-private reference, fairlens" in plan.total_label
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert markdown.count(TEST_METRICS_NOTE) == 1 and REPLAYABLE_NOISE in markdown
    # the practitioners' measures, and their privacy cost against the reference
    assert "## Fairness measures across groups" in markdown
    assert "## Selection and error rates per group" in markdown
    dp = {r.label: r.headline["demographic_parity_ratio"] for r in records}
    eo = {r.label: r.headline["equalized_odds_difference"] for r in records}
    assert summary.by_method["dpsgd"]["demographic_parity_ratio_privacy_cost"] == \
        pytest.approx(dp["nonprivate"] - dp["dpsgd"])  # a lower ratio: less fair, cost > 0
    assert summary.by_method["dpsgd"]["equalized_odds_difference_privacy_cost"] == \
        pytest.approx(eo["dpsgd"] - eo["nonprivate"])
    assert f"{eo['dpsgd'] - eo['nonprivate']:.3f}" in markdown
    # DVC: the long set in details.json, none in metrics.json (its 120 columns)
    from dpfair.pipeline.dvc_outputs import write_outputs

    paths = write_outputs(tmp_path / "out" / "results.csv", tmp_path / "evaluation")
    details = json.loads(paths["details.json"].read_text())["fairness"]
    assert details["demographic_parity_ratio"]["dpsgd"]["all"] == round(dp["dpsgd"], 4)
    assert details["equalized_odds_difference_privacy_cost"]["dpsgd"]["all"] == round(
        eo["dpsgd"] - eo["nonprivate"], 4)
    assert set(details["selection_rate"]["nonprivate"]) == set(dataset.group_names)
    assert "fairness" not in paths["metrics.json"].read_text()
    csv = (tmp_path / "out" / "results.csv").read_text()
    assert EPSILON_METHOD in csv and HEURISTIC in csv and plan.total_label in csv


# ------------------------------------------------------- what MLflow holds after a pipeline


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The flow's steps without Prefect on a tiny config: a proven method, a heuristic one
    and the non-private reference, one seed; the selected model is registered."""
    from dpfair.config.params import parse_params
    from dpfair.pipeline.data_step import PreparedData, log_pipeline_inputs
    from dpfair.pipeline.method_steps import train_logged
    from dpfair.pipeline.release_step import plan_release
    from dpfair.pipeline.summary import log_release, log_summary, register_model, summarise
    from dpfair.tracking.run_log import pipeline_run_name
    from dpfair.tracking.runs import experiment_id, run

    tmp = tmp_path_factory.mktemp("pipeline")
    raw = {
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                       "train": {"epochs": 2, "batch_size": 50, "lr": 0.5, "sigma": 1.0,
                                 "delta": 1e-5, "progress": False},
                       "methods": {"dpsgd": {"C": 1.0}, "fairlens": {"C": 1.0}},
                       "seeds": [0], "baseline": "dpsgd"},
        "budget": {"allow_heuristic": True, "allow_nonprivate_reference": True},
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}",
                     "artifact_root": str(tmp / "art")},
    }
    params_path = tmp / "params.yaml"
    params_path.write_text(yaml.safe_dump(raw))
    params = parse_params(raw)
    tracking = params.tracking
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    prepared = PreparedData(name="synthetic", path=str(tmp / "prepared"), version="a" * 32)
    data_tags = {"dpfair.dataset": "synthetic", "dpfair.data_version": prepared.version}
    plan = plan_release(params, dataset, {})
    exp = experiment_id(tracking, "synthetic")
    trained = {}
    with run(tracking, exp, pipeline_run_name("synthetic"),
             tags={**data_tags, "dpfair.stage": "pipeline"}) as parent:
        log_release(tracking, parent, plan)
        log_pipeline_inputs(params, params_path, prepared, dataset, tracking, parent)
        for label in plan.methods:
            trained[label] = train_logged(params.experiment.train_config(label, 0), label,
                                          dataset, tracking, exp, parent, data_tags,
                                          plan.methods[label])
        records = [record for _, record in trained.values()]
        summary = summarise(params, dataset, records, tmp / "out", plan)
        log_summary(tracking, parent, summary, tmp / "out", {})
        registered = register_model(params, tracking, dataset, records, plan, data_tags, parent)
    return {"params": params, "tracking": tracking, "client": MlflowClient(tracking.uri),
            "exp": exp,
            "parent": parent, "trained": trained, "plan": plan, "dataset": dataset,
            "registered": registered, "version": prepared.version, "tmp": tmp}


def test_experiment_opens_on_runs_named_by_dataset_method_and_seed(pipeline):
    from dpfair.tracking.runs import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, git_commit

    client = pipeline["client"]
    assert client.get_experiment(pipeline["exp"]).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    parent = client.get_run(pipeline["parent"])
    assert re.fullmatch(r"synthetic · \d{4}-\d\d-\d\d \d\d:\d\d", parent.info.run_name)
    names = {client.get_run(r.run_id).info.run_name for _, r in pipeline["trained"].values()}
    assert names == {f"synthetic · {m} · seed 0" for m in ("dpsgd", "fairlens", "nonprivate")}
    tags = parent.data.tags
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags.get("mlflow.source.git.commit") == git_commit()  # absent outside a checkout


def test_parent_run_carries_the_comparison_config_and_dataset(pipeline):
    from dpfair.release.labels import EPSILON_METHOD, HEURISTIC
    from dpfair.tracking.runs import metric_key

    client, plan = pipeline["client"], pipeline["plan"]
    parent = client.get_run(pipeline["parent"])
    metrics = parent.data.metrics
    for label, (_, record) in pipeline["trained"].items():
        assert metrics[f"worst_group_accuracy/{label}"] == pytest.approx(
            record.headline["worst_group_accuracy"])
        assert metrics[f"largest_group_gap/{label}"] == pytest.approx(
            record.headline["largest_group_gap"])
        for group in pipeline["dataset"].group_names:  # every group by name
            assert metrics[metric_key(f"group_accuracy/{group}/{label}")] == pytest.approx(
                next(r["value"] for r in record.records
                     if r["group"] == group and r["metric"] == "accuracy"))
    assert metrics["epsilon_run/dpsgd"] == pytest.approx(plan.methods["dpsgd"].epsilon_run)
    assert metrics["epsilon_released/dpsgd"] == pytest.approx(plan.methods["dpsgd"].epsilon)
    assert not [k for k in metrics if k.startswith("epsilon") and k.endswith(
        ("/fairlens", "/nonprivate"))]
    # the results table as an MLflow table, params.yaml as given and resolved
    table = json.loads(Path(client.download_artifacts(
        parent.info.run_id, "results/results_table.json", str(pipeline["tmp"]))).read_text())
    assert EPSILON_METHOD in table["columns"]
    rows = {row[0]: row for row in table["data"]}
    assert HEURISTIC in rows["fairlens"]
    config = {a.path for a in client.list_artifacts(parent.info.run_id, "config")}
    assert config == {"config/params.yaml", "config/resolved_params.yaml"}
    given = client.download_artifacts(parent.info.run_id, "config/params.yaml",
                                      str(pipeline["tmp"] / "dl"))
    assert yaml.safe_load(Path(given).read_text())["experiment"]["methods"]["dpsgd"] == {
        "C": 1.0}
    assert parent.data.params["experiment.methods.dpsgd.C"] == "1.0"
    # the dataset is the run's logged input, its digest the data version
    [logged] = parent.inputs.dataset_inputs
    # (the source's version: dataset.meta, what a scheduler compares; not the arrays' hash)
    source_version = pipeline["dataset"].meta["data_version"]
    assert (logged.dataset.name, logged.dataset.digest) == ("synthetic", source_version)
    assert json.loads(logged.dataset.schema)["groups"] == pipeline["dataset"].group_names
    assert "rows" not in logged.dataset.schema and "count" not in logged.dataset.schema


def test_final_runs_have_few_well_named_metrics_and_no_none_params(pipeline):
    from dpfair import accounting
    from dpfair.fairness import rates

    client = pipeline["client"]
    groups = pipeline["dataset"].group_names
    result, record = pipeline["trained"]["dpsgd"]
    logged = client.get_run(record.run_id)
    expected = {*(f"test/{k}" for k in ("accuracy", "worst_group_accuracy",
                                         "largest_group_gap")),
                *(f"final/test/{k}" for k in ("accuracy", "macro_accuracy",
                                               "worst_group_accuracy", "largest_group_gap")),
                *(f"final/test/group_accuracy/{g}" for g in groups),
                *(f"final/test/{d}" for d in rates.DISPARITIES),
                "wall_time_s", "epsilon", "epsilon_method_release"}
    assert set(logged.data.metrics) == expected
    assert [m.step for m in client.get_metric_history(record.run_id, "test/accuracy")] == [1, 2]
    for _, r in pipeline["trained"].values():
        run_ = client.get_run(r.run_id)
        assert "None" not in run_.data.params.values()
        assert not [k for k in run_.data.metrics if "count" in k]
        assert len(run_.data.metrics) <= 20
        [inp] = run_.inputs.dataset_inputs
        assert inp.dataset.digest == pipeline["dataset"].meta["data_version"]
    assert float(logged.data.params["privacy.noise_multiplier"]) == result.sigma
    # dp_event.json: the accountant's event, with a note relating it to the sigma param
    path = client.download_artifacts(record.run_id, "dp_event.json", str(pipeline["tmp"]))
    text = Path(path).read_text()
    assert "sigma = 1" in json.loads(text)["note"]
    assert accounting.epsilon(accounting.event_from_json(text), result.delta) == pytest.approx(
        result.epsilon)


def test_selected_private_model_is_registered_and_predicts_raw_rows(pipeline):
    import mlflow
    import numpy as np
    import pandas as pd

    from dpfair.tracking.model_export import PREDICTION, feature_columns, model_location
    from dpfair.tracking.model_load import load

    client, plan, dataset = pipeline["client"], pipeline["plan"], pipeline["dataset"]
    registered = pipeline["registered"]
    assert registered == {"name": "dpfair-synthetic", "version": "1", "champion": "1"}
    version = client.get_model_version("dpfair-synthetic", "1")
    result, record = pipeline["trained"]["dpsgd"]  # the only proven-private method
    assert version.run_id == record.run_id
    tags = version.tags
    assert tags["method"] == "dpsgd" and tags["privacy_guarantee"] == "proven"
    # machine-readable values: numbers (fractions, ε), the prose in the description
    assert float(tags["epsilon_training_run"]) == pytest.approx(
        plan.methods["dpsgd"].epsilon_run, rel=1e-5)
    assert float(tags["epsilon_released_for_method"]) == pytest.approx(
        plan.methods["dpsgd"].epsilon, rel=1e-5)
    assert json.loads(tags["epsilon_accountants"]) == {
        "training_run": plan.methods["dpsgd"].accountant_run,
        "method": plan.methods["dpsgd"].accountant, "pipeline_total": plan.accountant_total}
    assert float(tags["delta"]) == plan.delta
    assert tags["data_version"] == dataset.meta["data_version"]
    assert json.loads(tags["group_names"]) == list(dataset.group_names)
    assert tags["target"] and tags["protected_attributes"]
    assert float(tags["worst_group_accuracy"]) == pytest.approx(
        record.headline["worst_group_accuracy"], abs=1e-4)
    assert "largest gap" in version.description and "fairness_summary" not in tags
    parent_tags = client.get_run(pipeline["parent"]).data.tags
    assert parent_tags["dpfair.registered_model"] == "dpfair-synthetic/1"
    # the registered model predicts raw rows as the training-time evaluation did
    model = load(pipeline["tracking"], "models:/dpfair-synthetic/1")
    rows = pd.DataFrame(dataset.test.x.numpy().astype(np.float64),
                        columns=feature_columns(dataset.input_shape))
    predicted = model.predict(rows)[PREDICTION].to_numpy()
    expected = np.asarray(dataset.class_names)[result.test_predictions.y_pred]
    np.testing.assert_array_equal(predicted, expected)
    # its input example is no training row (all zeros), its signature names the columns
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=model_location(pipeline["tracking"], "dpfair-synthetic/1"),
        dst_path=str(pipeline["tmp"] / "model"))
    example = mlflow.models.Model.load(local).load_input_example(local)
    assert list(example.columns) == feature_columns(dataset.input_shape)
    assert not example.to_numpy().any()
    assert model.metadata.get_input_schema().input_names() == list(example.columns)
    # `dpfair predict`'s reader: whole numbers are fine, a word in a numeric column is not
    from dpfair.errors import DataError
    from dpfair.tracking.model_load import predict_csv

    csv = pipeline["tmp"] / "rows.csv"
    rows.round().astype("int64").to_csv(csv, index=False)
    assert predict_csv(pipeline["tracking"], "dpfair-synthetic", csv, csv.with_name("p.csv")) == (
        len(rows))
    rows.astype(object).assign(x2="abc").to_csv(csv, index=False)
    with pytest.raises(DataError, match=r"column 'x2' is numeric but holds \['abc'\]"):
        predict_csv(pipeline["tracking"], "dpfair-synthetic/1", csv, csv.with_name("q.csv"))


def test_train_and_tune_commands_log_runs_like_the_pipeline(pipeline, tmp_path, monkeypatch):
    """`dpfair train` / `dpfair tune`: a run each, no parent, named and tagged as the
    pipeline's, holding only what the release covers (no K, no trial score)."""
    from dpfair.config.sections import TuningSection
    from dpfair.pipeline.standalone import train_standalone, tune_standalone
    from dpfair.release.labels import SECRET_NOISE

    monkeypatch.chdir(tmp_path)  # the Optuna storage and its private ledger
    client, dataset = pipeline["client"], pipeline["dataset"]
    tuning = TuningSection.model_validate({"mode": "fixed", "n_runs": 2,
                                           "spaces": {"dpsgd": {"lr": [0.2, 0.5]}}})
    params = pipeline["params"].model_copy(update={"tuning": tuning})
    _, record = train_standalone(params, "dpsgd", 3, dataset)
    trained = client.get_run(record.run_id)
    assert trained.info.run_name == "synthetic · dpsgd · seed 3 · standalone"
    assert "mlflow.parentRunId" not in trained.data.tags
    assert trained.data.tags["dpfair.standalone"] == "true"
    assert trained.data.tags["dpfair.stage"] == "final"
    assert trained.data.tags["dpfair.noise"] == "secret"
    assert float(trained.data.tags["dpfair.epsilon"]) == pytest.approx(
        trained.data.metrics["epsilon"], rel=1e-5)
    assert ("- dpfair.epsilon: epsilon: this training run alone"
            in trained.data.tags["mlflow.note.content"])
    assert SECRET_NOISE in trained.data.tags["mlflow.note.content"]
    assert {"epsilon", "epsilon_method_release"} <= set(trained.data.metrics)
    assert len(trained.outputs.model_outputs) == 1
    assert trained.inputs.dataset_inputs[0].dataset.digest == dataset.meta["data_version"]
    cfg = params.tuning.config("dpsgd", "cli-search")
    result, _, release, ledger = tune_standalone(params, "dpsgd", cfg, dataset)
    [tuned] = client.search_runs([pipeline["exp"]], "tags.`dpfair.stage` = 'tuning'")
    assert tuned.info.run_name == "synthetic · tune dpsgd · standalone"
    assert tuned.data.params["selected.lr"] in ("0.2", "0.5")
    assert tuned.data.metrics["epsilon_search"] == pytest.approx(release.epsilon_search)
    assert not {"K", "runs"} & set(tuned.data.metrics) and ledger.name.endswith(
        ".ledger.PRIVATE.json")
    assert {a.path for a in client.list_artifacts(tuned.info.run_id)} == {
        "dp_event_search.json"}
