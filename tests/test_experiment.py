"""dpfair/experiment.py helpers that do not need the Prefect flow (the flow: tests/flows)."""

from __future__ import annotations

from dpfair.data import load_dataset
from dpfair.experiment import _bounds, _trajectory
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
