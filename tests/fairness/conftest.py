"""The hand-computed runs frame shared by the records, tables and significance tests."""

from __future__ import annotations

import pandas as pd
import pytest

from dpfair.fairness import records

# Two methods x two seeds x groups a, b (accuracies as fractions):
#   nonprivate  seed 0: acc a .90 b .80, loss a .2 b .5   seed 1: acc .92 .78, loss .2 .7
#   dpsgd       seed 0: acc a .85 b .60, loss a .3 b .9   seed 1: acc .87 .50, loss .5 1.1
# and for group "all": accuracy .88, .86 / .70, .72 and loss .3, .3 / .6, .6.
TABLE_DATA = {
    ("nonprivate", 0): (0.90, 0.80, 0.2, 0.5, 0.88, 0.3),
    ("nonprivate", 1): (0.92, 0.78, 0.2, 0.7, 0.86, 0.3),
    ("dpsgd", 0): (0.85, 0.60, 0.3, 0.9, 0.70, 0.6),
    ("dpsgd", 1): (0.87, 0.50, 0.5, 1.1, 0.72, 0.6),
}


@pytest.fixture
def runs() -> pd.DataFrame:
    recs = []
    for (method, seed), (acc_a, acc_b, loss_a, loss_b, acc_all, loss_all) in TABLE_DATA.items():
        for group, metric, value in [
            ("a", "accuracy", acc_a), ("b", "accuracy", acc_b), ("a", "loss", loss_a),
            ("b", "loss", loss_b), ("all", "accuracy", acc_all), ("all", "loss", loss_all),
        ]:
            recs.append(
                {"method": method, "seed": seed, "group": group, "metric": metric, "value": value}
            )
    return records.runs_frame(recs)
