"""Why Esipova et al.'s Dutch losses (Table 5) are higher than ours: the model's output.

fair-dp's logistic regression puts a sigmoid on its two outputs and then applies the
cross-entropy to them as if they were logits (``fairdp_models.sigmoid_logistic``); dpfair's
``logistic_regression`` is a softmax regression. This trains both non-privately on the paper's
Dutch split (all rows, split seed 0, 20 epochs, batch 256) and prints the per-group loss on
the training split (what fair-dp reports: its ``final_loss_per_group`` is the training loss)
and on the test split. Usage: ``.venv/bin/python benchmarks/released_loss.py [--seeds N]``.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from dpfair.data import load_dataset
from dpfair.models import build_model, parse_model_config
from dpfair.training import TrainConfig, train
from dpfair.training.evaluation import metrics_from_predictions, predict

MODELS = {
    "softmax regression (dpfair logistic_regression)": {"name": "logistic_regression"},
    "sigmoid outputs + cross-entropy (fair-dp)": {
        "name": "import", "target": "fairdp_models:sigmoid_logistic"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--lr", type=float, nargs="*", default=[0.8, 0.5])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ds = load_dataset("dutch", {"validation_fraction": 0.0, "seed": 0})
    rows = []
    for label, model in MODELS.items():
        for lr in args.lr:
            for seed in range(args.seeds):
                config = TrainConfig(method={"name": "nonprivate"}, model=model, lr=lr,
                                     epochs=20, batch_size=256, sigma=0.0, seed=seed,
                                     progress=False, eval_every=20)
                res = train(config, ds)
                net = build_model(parse_model_config(model), res.input_shape, res.n_classes)
                net.load_state_dict(res.model_state)
                row = {"model": label, "lr": lr, "seed": seed}
                for split in ("train", "test"):
                    m = metrics_from_predictions(predict(net, getattr(ds, split)),
                                                 res.n_classes, res.n_groups)
                    for k, g in enumerate(ds.group_names):
                        row[f"{split} loss {g}"] = float(m["group_loss"][k])
                        row[f"{split} acc {g}"] = 100 * float(m["group_accuracy"][k])
                rows.append(row)
                print(row, flush=True)
    table = pd.DataFrame(rows).groupby(["model", "lr"], sort=False).mean().drop(columns="seed")
    print(table.round(3).to_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
