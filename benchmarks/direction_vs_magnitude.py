"""Esipova et al. (2023) Table 1, shortened for CPU: direction vs magnitude error of clipping.

Noise-free training on skewed MNIST (class 8 kept at 9%, about 1% of the training set) where
every step is either (‖ḡ_B‖/‖g_B‖) g_B (magnitude error only) or (‖g_B‖/‖ḡ_B‖) ḡ_B (direction
error only), g_B the unclipped and ḡ_B the clipped (per-sample, at C0) batch mean gradient;
class 2 vs class 8 test accuracy and loss at the end, beside the published numbers. Two
references isolate the direction error at equal step norms: ḡ_B (clipped, the norm of the
magnitude run) and g_B (SGD, the norm of the direction run).

The paper's argument is that a magnitude error "could be completely compensated for by
adapting the learning rate" (Sec. 4), so with several ``--lr`` values every update gets its
own learning rate: each variant trains at every lr on the first seed, the lr with the best
*overall* validation accuracy (class-blind, so class 8 cannot steer it) is kept, and the other
seeds run at that lr only.

    .venv/bin/python benchmarks/direction_vs_magnitude.py            # the recorded run
    .venv/bin/python benchmarks/direction_vs_magnitude.py --help

Writes benchmarks/results/direction_vs_magnitude.md and figures/direction_vs_magnitude.png.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import matplotlib
import numpy as np
import torch
import yaml
from torch import nn

from dpfair.data import load_dataset
from dpfair.data.dataset import Split
from dpfair.diagnostics.toys import per_group_metrics, train_direction_vs_magnitude
from dpfair.models import build_model, n_params, parse_model_config

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent
PUBLISHED = ROOT.parents[1] / "shared" / "reference" / "published.yaml"
MODELS = {
    "esipova_cnn": {"name": "esipova_cnn"},
    "mlp": {"name": "mlp", "hidden": [256, 256], "activation": "tanh"},
}
LABELS = {
    "magnitude": "magnitude error only: (‖ḡ_B‖/‖g_B‖) g_B",
    "direction": "direction error only: (‖g_B‖/‖ḡ_B‖) ḡ_B",
    "clipped": "both (DP-SGD without noise): ḡ_B",
    "sgd": "neither (SGD): g_B",
}


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


def stratified_subset(split: Split, size: int, seed: int) -> Split:
    """A random subset of ``size`` rows keeping every class's share (so class 8 stays ~1%)."""
    if size >= len(split):
        return split
    gen = torch.Generator().manual_seed(seed)
    keep = []
    for c in torch.unique(split.y):
        rows = torch.nonzero(split.y == c).squeeze(1)
        k = max(1, round(size * len(rows) / len(split)))
        keep.append(rows[torch.randperm(len(rows), generator=gen)[:k]])
    return split.subset(torch.sort(torch.cat(keep)).values)


def _train(args: argparse.Namespace, variant: str, lr: float, seed: int, train: Split,
           val: Split, test: Split, input_shape: tuple, n_classes: int) -> dict:
    """One run; test metrics per class, and the overall validation accuracy."""
    torch.manual_seed(seed)
    model = build_model(parse_model_config(MODELS[args.model]), input_shape, n_classes)
    t0 = time.perf_counter()
    res = train_direction_vs_magnitude(
        model, cross_entropy, train, test, variant, C0=args.c0, lr=lr,
        epochs=args.epochs, batch_size=args.batch_size, seed=seed,
    )
    res["seconds"] = time.perf_counter() - t0
    res["val_accuracy"] = overall_accuracy(per_group_metrics(model, cross_entropy, val))
    return res


def overall_accuracy(per_group: dict[int, dict]) -> float:
    """Accuracy (%) over all classes, from per-class results."""
    n = sum(v["n"] for v in per_group.values())
    return sum(v["acc"] * v["n"] for v in per_group.values()) / n


def run(args: argparse.Namespace) -> dict:
    ds = load_dataset("mnist", {"validation_fraction": args.validation_fraction, "seed": 0})
    train = stratified_subset(ds.train, args.subset, seed=0) if args.subset else ds.train
    splits = (train, ds.val, ds.test, ds.input_shape, ds.n_classes)
    start = time.perf_counter()
    done: dict[tuple[str, float, int], dict] = {}
    grid: dict[str, dict[float, float]] = {v: {} for v in args.variants}
    chosen = dict.fromkeys(args.variants, args.lr[0])
    if len(args.lr) > 1:
        first = args.seeds[0]
        for variant in args.variants:
            for lr in args.lr:
                res = done[variant, lr, first] = _train(args, variant, lr, first, *splits)
                grid[variant][lr] = res["val_accuracy"]
                print(f"select {variant:9s} lr {lr:g}: validation accuracy "
                      f"{grid[variant][lr]:.2f} ({res['seconds']:.0f}s)", flush=True)
            chosen[variant] = max(args.lr, key=lambda lr, v=variant: grid[v][lr])
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    for seed in args.seeds:
        for variant in args.variants:
            lr = chosen[variant]
            res = done.get((variant, lr, seed)) or _train(args, variant, lr, seed, *splits)
            results[variant].append(res)
            pg = res["per_group"]
            print(f"seed {seed} {variant:9s} lr {lr:g} acc2 {pg[2]['acc']:.1f} "
                  f"acc8 {pg[8]['acc']:.1f} loss2 {pg[2]['loss']:.3f} "
                  f"loss8 {pg[8]['loss']:.3f} ({res['seconds']:.0f}s)", flush=True)
    return {
        "results": results,
        "train": train,
        "n_val": len(ds.val),
        "grid": grid,
        "chosen": chosen,
        "n_params": n_params(build_model(parse_model_config(MODELS[args.model]),
                                         ds.input_shape, ds.n_classes)),
        "seconds": time.perf_counter() - start,
    }


def summary(runs: list[dict], cls: int, key: str) -> tuple[float, float]:
    vals = np.array([r["per_group"][cls][key] for r in runs])
    se = vals.std(ddof=1) / np.sqrt(len(vals)) if len(vals) > 1 else float("nan")
    return float(vals.mean()), float(se)


def figure(results: dict[str, list[dict]], path: Path) -> None:
    variants = list(results)
    classes = sorted(results[variants[0]][0]["per_group"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        for ax, key in zip(axes, ("acc", "loss"), strict=True):
            means = [summary(results[variant], c, key)[0] for c in classes]
            offset = (i - (len(variants) - 1) / 2) * width
            ax.bar(np.arange(len(classes)) + offset, means, width, label=variant)
    for ax, label in zip(axes, ("test accuracy (%)", "test loss"), strict=True):
        ax.set_xticks(range(len(classes)), [str(c) for c in classes])
        ax.set_xlabel("class (8 undersampled)")
        ax.set_ylabel(label)
    axes[0].set_ylim(0, 100)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(variants), title="update")
    fig.suptitle("Direction vs magnitude error of clipping, noise-free (Esipova et al. Table 1)")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cell(runs: list[dict], cls: int, key: str, fmt: str) -> str:
    m, se = summary(runs, cls, key)
    return fmt.format(m) + ("" if np.isnan(se) else " ± " + fmt.format(se))


def verdict(res: dict[str, list[dict]], key: str) -> str:
    """Does the direction error hurt class 8 more than the magnitude error (on ``key``)?"""
    if "magnitude" not in res or "direction" not in res:
        return "not run (needs both the magnitude and the direction variant)"
    worse = (lambda a, b: a > b) if key == "loss" else (lambda a, b: a < b)
    (m8, s8), (d8, t8) = summary(res["magnitude"], 8, key), summary(res["direction"], 8, key)
    (m2, _), (d2, _) = summary(res["magnitude"], 2, key), summary(res["direction"], 2, key)
    gap8, gap2 = d8 - m8, d2 - m2
    se = float(np.hypot(s8, t8)) if not (np.isnan(s8) or np.isnan(t8)) else float("nan")
    yes = worse(d8, m8) and abs(gap8) > abs(gap2)
    f = ".1f" if key == "acc" else ".3f"
    return (f"class 8 {key}: direction {d8:{f}} vs magnitude {m8:{f}} (difference "
            f"{gap8:+{f}}, 2 SE = {2 * se:{f}}; class 2 difference {gap2:+{f}}) → direction "
            f"hurts class 8 more: **{'yes' if yes else 'no'}**"
            + (" (beyond 2 SE)" if yes and abs(gap8) > 2 * se else ""))


def write_markdown(args: argparse.Namespace, out: dict, path: Path, fig: Path) -> None:
    published = yaml.safe_load(PUBLISHED.read_text())["esipova2023"][
        "table1_direction_vs_magnitude"
    ]
    train: Split = out["train"]
    n8 = int((train.y == 8).sum())
    res = out["results"]
    model = ("Esipova's CNN (`esipova_cnn`: 3x3 conv 32, 16, tanh, linear head" if
             args.model == "esipova_cnn" else
             "an MLP (2 x 256, tanh: Esipova's Adult architecture")
    lrs = " ".join(f"{lr:g}" for lr in args.lr)
    lines = [
        "# Direction vs magnitude error (Esipova et al. 2023, Table 1), shortened for CPU",
        "",
        "Produced by `benchmarks/direction_vs_magnitude.py` "
        f"(`--model {args.model} --epochs {args.epochs} --lr {lrs} "
        + (f"--subset {args.subset} " if args.subset else "")
        + f"--batch-size {args.batch_size} --c0 {args.c0} "
        f"--seeds {' '.join(map(str, args.seeds))}`) on {platform.machine()} CPU, "
        f"{torch.get_num_threads()} torch thread(s), in {out['seconds'] / 60:.1f} min.",
        "**Non-private diagnostic**: no noise, un-noised training statistics.",
        "",
        "## Setting",
        "",
        "* Data: skewed MNIST (`load_dataset(\"mnist\")`: 9% of class 8 kept); "
        f"{len(train):,} training images ({n8} of class 8, {100 * n8 / len(train):.2f}%)"
        + (" (a stratified random subset)" if args.subset else "")
        + f", {out['n_val']:,} held out for choosing the learning rate; the full, balanced "
        "10,000-image test set.",
        f"* Model: {model}; {out['n_params']:,} parameters on MNIST).",
        "* Steps: Poisson batches (rate batch_size/n), per-sample clipping at C0 = "
        f"{args.c0}; update (‖ḡ_B‖/‖g_B‖) g_B (*magnitude*: magnitude error only) or "
        "(‖g_B‖/‖ḡ_B‖) ḡ_B (*direction*: direction error only), as in the paper; as "
        "references ḡ_B (*clipped*: both errors, the same step norm as *magnitude*) and g_B "
        "(*sgd*: neither, the same step norm as *direction*); plain SGD, "
        f"{args.epochs} epochs, no noise.",
        "* Learning rate: "
        + (f"each update's own, chosen from {{{lrs}}} by overall validation accuracy on seed "
           f"{args.seeds[0]} (the paper: a magnitude error can be compensated by the learning "
           "rate)." if len(args.lr) > 1 else f"{lrs} for every update."),
        "* Shortened from the paper (Esipova's CNN, full skewed MNIST, 60 epochs, batch 256, "
        "5 seeds; the paper does not state Table 1's learning rate): "
        f"{args.model}, {args.epochs} epochs, {len(args.seeds)} seed(s).",
        "",
    ]
    if out["grid"] and any(out["grid"].values()):
        lines += ["## Learning rate chosen per update (validation accuracy %, seed "
                  f"{args.seeds[0]})", "",
                  "| update | " + " | ".join(f"lr {lr:g}" for lr in args.lr) + " | chosen |",
                  "|---|" + "---|" * (len(args.lr) + 1)]
        for variant, accs in out["grid"].items():
            lines.append(f"| {variant} | " + " | ".join(f"{accs[lr]:.2f}" for lr in args.lr)
                         + f" | {out['chosen'][variant]:g} |")
        lines.append("")
    lines += [
        "## Result (test set; mean ± standard error over seeds)",
        "",
        "| update | lr | acc 2 | acc 8 | loss 2 | loss 8 "
        "| published acc 2 | acc 8 | loss 2 | loss 8 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in args.variants:
        cells = [_cell(res[variant], cls, key, fmt)
                 for key, fmt in (("acc", "{:.1f}"), ("loss", "{:.3f}")) for cls in (2, 8)]
        pub = published.get(f"{variant}_error")
        cited = (f"{pub['acc_2']} | {pub['acc_8']} | {pub['loss_2']} | {pub['loss_8']}"
                 if pub else "– | – | – | –")
        lines.append(f"| {LABELS[variant]} | {out['chosen'][variant]:g} | "
                     + " | ".join(cells) + f" | {cited} |")
    lines += ["", "Verdicts (the paper's claim: the direction error disproportionately hurts "
              "class 8):", "", f"* {verdict(res, 'loss')}", f"* {verdict(res, 'acc')}", ""]
    lines += ["Per seed:", "", "| seed | update | acc 2 | acc 8 | loss 2 | loss 8 | s |",
              "|---|---|---|---|---|---|---|"]
    for variant in args.variants:
        for seed, r in zip(args.seeds, res[variant], strict=True):
            pg = r["per_group"]
            lines.append(f"| {seed} | {variant} | {pg[2]['acc']:.1f} | {pg[8]['acc']:.1f} | "
                         f"{pg[2]['loss']:.3f} | {pg[8]['loss']:.3f} | {r['seconds']:.0f} |")
    lines += ["", f"![per-class accuracy and loss](figures/{fig.name})", ""]
    path.write_text("\n".join(lines))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="esipova_cnn")
    parser.add_argument("--subset", type=int, default=None,
                        help="train on a stratified subset of this many images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, nargs="+", default=[0.1],
                        help="one lr for all, or a grid to choose each update's lr from")
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--c0", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", choices=list(LABELS), default=list(LABELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "direction_vs_magnitude.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = run(args)
    fig = args.out.parent / "figures" / "direction_vs_magnitude.png"
    figure(out["results"], fig)
    write_markdown(args, out, args.out, fig)
    print(f"wrote {args.out} and {fig}")


if __name__ == "__main__":
    main()
