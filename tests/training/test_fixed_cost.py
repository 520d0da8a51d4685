"""A training run on digits loads none of the libraries that cost a command seconds at start:
torch._dynamo (torch.optim's optimizers), scikit-learn (its digits loader) and Fairlearn (the
fairness rates of the last evaluation)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from dpfair.data import load_dataset
from dpfair.data.digits import DigitsOptions
from dpfair.training import TrainConfig, train
dataset = load_dataset("digits", DigitsOptions())
for optimizer in ("sgd", "adam"):
    config = TrainConfig.model_validate({
        "method": {"name": "dpsgd", "C": 1.0}, "model": {"name": "mlp", "hidden": [16]},
        "epochs": 1, "batch_size": 64, "lr": 0.1, "sigma": 1.0, "progress": False,
        "device": "cpu", "optimizer": optimizer})
    result = train(config, dataset)
    assert "demographic_parity_ratio" in result.test_metrics  # the rates were formed
print(sorted(m for m in ("torch._dynamo", "sklearn", "fairlearn") if m in sys.modules))
"""


def test_a_digits_training_loads_no_dynamo_sklearn_or_fairlearn():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
