"""dpfair/experiment.py helpers that do not need the Prefect flow (the flow: tests/flows)."""

from __future__ import annotations

from dpfair.data import load_dataset
from dpfair.experiment import _trajectory
from dpfair.summary import _bounds
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
    from dpfair.data import available_datasets
    from dpfair.experiment import dvc_prepare_stages

    stages = dvc_prepare_stages(repo_root)
    assert "digits" in stages and "adult" in stages
    assert set(stages) <= set(available_datasets())
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  prepare:\n    foreach: [digits]\n    do:\n      cmd: echo ${item}\n"
    )
    assert dvc_prepare_stages(tmp_path) == ("digits",)
    assert dvc_prepare_stages(tmp_path / "absent") == ()


def test_final_runs_say_what_their_epsilon_covers(tmp_path):
    """The steps without Prefect: a proven method logs both epsilons, FairLens and the
    reference none (a tag says why), a reproducible run says its noise is replayable, and
    the table and the pipeline run's description say what ε covers."""
    from mlflow import MlflowClient

    from dpfair.config import parse_params
    from dpfair.experiment import final_config, plan_release, train_and_log
    from dpfair.release import (
        EPSILON_METHOD,
        EPSILON_RUN,
        HEURISTIC,
        NONPRIVATE_REFERENCE,
        TEST_METRICS_NOTE,
    )
    from dpfair.summary import log_release, summarise
    from dpfair.tracking import TrackingConfig, experiment_id, run
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
    assert logged["dpsgd"].tags["dpfair.noise"] == REPLAYABLE_NOISE
    for label, why in (("fairlens", HEURISTIC), ("nonprivate", NONPRIVATE_REFERENCE)):
        assert not [m for m in logged[label].metrics if m.startswith("epsilon")]
        assert logged[label].tags["dpfair.epsilon"].startswith(why)
    note = client.get_run(parent).data.tags["mlflow.note.content"]
    assert TEST_METRICS_NOTE in note and REPLAYABLE_NOISE in note
    table = summary.table
    assert table.loc[f"dpsgd ({REPLAYABLE_NOISE})", EPSILON_RUN] == (
        f"{plan.methods['dpsgd'].epsilon_run:.2f}")
    lens = table.loc[f"fairlens ({REPLAYABLE_NOISE})", [EPSILON_RUN, EPSILON_METHOD]]
    assert list(lens) == [HEURISTIC] * 2
    assert table.loc[plan.total_label, EPSILON_METHOD] == f"{plan.epsilon_total:.2f}"
    assert "without guarantee, not covered: non-private reference, fairlens" in plan.total_label
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert markdown.count(TEST_METRICS_NOTE) == 1 and REPLAYABLE_NOISE in markdown
    csv = (tmp_path / "out" / "results.csv").read_text()
    assert EPSILON_METHOD in csv and HEURISTIC in csv and plan.total_label in csv
