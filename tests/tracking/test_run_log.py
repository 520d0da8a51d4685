"""dpfair.tracking.run_log: a training's per-epoch metrics reach MLflow in a few writes."""

from __future__ import annotations

from mlflow import MlflowClient

from dpfair.tracking.run_log import EpochLogger
from dpfair.tracking.runs import TrackingConfig, run


def test_epoch_metrics_are_written_first_at_once_then_together(tmp_path):
    """The first epoch at once (the run shows progress), the next ones of a short training
    together when it ends, each under its epoch as the step."""
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}",
                         artifact_root=str(tmp_path / "art"))
    client = MlflowClient(cfg.uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with run(cfg, exp, "r") as run_id:
        epochs = EpochLogger(cfg, run_id)
        for epoch in (1, 2, 3):
            accuracy = [0.5 + epoch / 10, 0.4]  # per group
            epochs.on_epoch_end(epoch, {"test": {"accuracy": 0.5 + epoch / 10,
                                                 "worst_group_accuracy": 0.4,
                                                 "group_accuracy": accuracy}})
            if epoch == 1:
                written = client.get_metric_history(run_id, "test/accuracy")
                assert [(m.step, m.value) for m in written] == [(1, 0.6)]
        assert len(client.get_metric_history(run_id, "test/accuracy")) == 1  # pending
        epochs.flush()
    history = client.get_metric_history(run_id, "test/accuracy")
    assert sorted((m.step, round(m.value, 9)) for m in history) == [(1, 0.6), (2, 0.7),
                                                                     (3, 0.8)]
    gaps = client.get_metric_history(run_id, "test/largest_group_gap")
    assert sorted(m.step for m in gaps) == [1, 2, 3]
