"""Shared set-ups of the CLI tests (also used by benchmarks/fail_fast.py and soak_train.py):
an own census CSV's params.yaml and a folder holding it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.data.own_tables import census_frame

#: `dpfair run` on an own census CSV whose tracking server does not exist (nothing may reach it)
CENSUS_PARAMS: dict[str, Any] = {
    "datasets": {"census": {"kind": "table", "path": "census.csv", "target": "Income",
                            "protected": "Nationality", "id_columns": ["person"],
                            "categories": {"Activity": [1, 2, 3], "Gender": ["F", "M"]},
                            "numeric_ranges": {"Hours": [0, 100]}}},
    "experiment": {"dataset": "census", "model": {"name": "logistic_regression"},
                   "train": {"epochs": 1, "batch_size": 16, "lr": 0.5, "sigma": 1.0,
                             "delta": 1e-5, "progress": False},
                   "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
                   "nonprivate_reference": False},
    # nothing may reach it: a server that does not exist
    "tracking": {"uri": "http://127.0.0.1:9", "artifact_root": "art"},
}


#: CENSUS_PARAMS with a search space and a local tracking store
CENSUS_TUNE_PARAMS: dict[str, Any] = {
    **CENSUS_PARAMS,
    "tuning": {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}},
    "tracking": {"uri": "sqlite:///mlflow.db", "artifact_root": "art"},
}


#: own models whose outputs or parameters no training can use
OWN_MODELS = """
import torch
import torch.nn as nn


class Rounded(nn.Module):
    def __init__(self, d, k):
        super().__init__()
        self.lin = nn.Linear(d, k)

    def forward(self, x):
        return self.lin(x).round().long()


class Constant(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return torch.zeros(x.shape[0], self.k)


def integer_logits(input_shape, n_classes):
    return Rounded(input_shape[0], n_classes)


def no_parameters(input_shape, n_classes):
    return Constant(n_classes)
"""


def census_folder(tmp_path: Path) -> Path:
    """``tmp_path`` with census.csv (600 rows) and own_models.py (:data:`OWN_MODELS`)."""
    census_frame(600).to_csv(tmp_path / "census.csv", index=False)
    (tmp_path / "own_models.py").write_text(OWN_MODELS)
    return tmp_path
