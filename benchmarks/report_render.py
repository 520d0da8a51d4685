"""Render the reproduction report (``benchmarks/results/reproduction.md``) from results.

Pure rendering for ``benchmarks/reproduce.py`` (no training): each table's settings, ours and
the published numbers side by side with differences beyond two combined SEs flagged
(:data:`N_SE`), the released-code three-way tables, Zhao's grid and private-tuning tables; then
the claims checked on the printed tables (:mod:`report_claims`) and the discussions, whose
figures are placeholders filled from the tables (:mod:`report_figures`). A table without
stored results keeps its section of the existing report (:mod:`report_notes`); a config with
``recorded:`` renders runs kept in ``results/raw/`` (:mod:`recorded`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import recorded
import yaml
from report_claims import claims
from report_figures import EXACT, fill, parse_section
from report_notes import (
    CARRIED,
    CARRIED_EPSILON,
    CLAIMS,
    flag_reasons,
    markdown_flags,
    previous_sections,
)

from dpfair import fairness
from dpfair.accounting.accountant import ACCOUNTANT_RDP
from dpfair.pipeline import report
from dpfair.release.labels import HEURISTIC, NONPRIVATE_REFERENCE

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = Path(os.environ.get("DPFAIR_PUBLISHED",
                                ROOT.parent / "shared" / "reference" / "published.yaml"))
REFERENCE = "nonprivate"
N_SE = 2.0
#: when dpfair's PLD accountant became its default: tables finished before were RDP's
PLD_SINCE = "2026-11-26 13:35 UTC"


def seed_list(seeds: int | Sequence[int]) -> list[int]:
    """``5`` -> ``[0, 1, 2, 3, 4]``; a list stays as it is."""
    return list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]


def published_table(key: str, path: Path = PUBLISHED) -> Any:
    """The entry ``a.b.c`` of ``published.yaml``."""
    node: Any = yaml.safe_load(path.read_text())
    for part in key.split("."):
        node = node[part]
    return node


def _cell(mean: float, se: float, digits: int) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if se is None or (isinstance(se, float) and math.isnan(se)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def _digits(column: str, percent: bool) -> int:
    prefix = column.split("_")[0]
    if prefix in ("acc", "pi", "delta"):
        return 1 if percent else 4
    return 3 if column.startswith(("loss", "R")) else 2


def side_by_side(cmp: pd.DataFrame, percent: bool) -> pd.DataFrame:
    """``comparison_with_published`` rows as a method x column table of ``ours / published``
    cells, ``⚠`` marking a difference beyond two combined SEs."""
    methods = list(dict.fromkeys(cmp["method"]))
    columns = list(dict.fromkeys(cmp["column"]))
    out = pd.DataFrame("", index=pd.Index(methods, name="method"), columns=columns)
    for _, r in cmp.iterrows():
        d = _digits(r["column"], percent)
        pub_se = None if math.isnan(r["published_se"]) else r["published_se"]
        flag = " ⚠" if r["differs"] is True or (r["differs"] is not pd.NA and
                                                  bool(r["differs"])) else ""
        out.at[r["method"], r["column"]] = (
            f"{_cell(r['ours_mean'], r['ours_se'], d)} / {_cell(r['published_mean'], pub_se, d)}"
            f"{flag}")
    return out


def _xu_published(table: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Xu's Table 1 columns of one dataset, renamed to our labels (``total`` and two groups).

    ``published_columns`` names the three published columns (default ``{prefix}_total``,
    ``{prefix}_M``, ``{prefix}_F``)."""
    cols = table["columns"]
    names = cfg.get("published_columns") or [
        f"{cfg['published_prefix']}_{s}" for s in ("total", "M", "F")]
    idx = [cols.index(n) for n in names]
    labels = cfg["labels"]
    rows: dict[str, Any] = {"columns": [f"acc_{lab}" for lab in labels]
                            + [f"delta_{lab}" for lab in labels] + ["delta_gap"]}
    rows["nonprivate"] = [table["sgd"][i] for i in idx] + [None] * 4
    for pub, ours in (("dpsgd", "dpsgd"), ("naive", "naive_reweight"), ("dpsgd_f", "dpsgd_f")):
        d = [table[f"{pub}_minus_sgd"][i] for i in idx]
        acc = [table["sgd"][i] + dd for i, dd in zip(idx, d, strict=True)]
        rows[ours] = acc + d + [abs(d[1] - d[2])]
    return rows


def finished_seeds(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[int]:
    """Seeds on which every method finished (all of them, unless the run was cut short)."""
    if not result.get("partial"):
        return list(cfg["seeds"])
    done = {tuple(d) for d in result.get("done", [])}
    return [s for s in cfg["seeds"] if all((m["label"], s) in done for m in cfg["methods"])]


def _epsilon_cell(label: str, eps: float | None) -> str:
    """A method's ε cell: a number only for a proven guarantee; the non-private reference and
    heuristic methods (FairLens) carry their label (:mod:`dpfair.release.plan`)."""
    if eps is not None and math.isfinite(eps) and eps > 0:
        return f"{eps:.2f}"
    return NONPRIVATE_REFERENCE if label == REFERENCE else HEURISTIC


def table_stats(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> pd.DataFrame:
    seeds = set(finished_seeds(cfg, result))
    frame = fairness.runs_frame([r for r in result["records"] if r["seed"] in seeds])
    return fairness.comparison_stats(
        frame, cfg["groups"], reference=REFERENCE, labels=cfg["labels"], layout=cfg["layout"],
        paired_reference=True, tau=cfg.get("tau", fairness.XU_TAU))


def _seeds(n: int) -> str:
    return "1 seed" if n == 1 else f"{n} seeds"


def render_table(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """Markdown of one ``table`` result."""
    percent = cfg["layout"] == "esipova"
    stats = table_stats(cfg, result)
    pub = published_table(cfg["published"])
    if cfg["layout"] == "xu":
        pub = _xu_published(pub, cfg)
    cmp = report.comparison_with_published(stats, pub, percent=percent, n_se=N_SE)
    ours = fairness.format_table(stats, percent=percent)
    eps = {m: float(np.mean(v)) for m, v in result["epsilons"].items()}
    ours["epsilon"] = [_epsilon_cell(m, eps.get(m)) for m in ours.index]
    lines = [
        f"Ours (mean ± SE over {_seeds(len(finished_seeds(cfg, result)))}; accuracies "
        f"{'in %' if percent else 'as fractions'}; ε by {accountant_of(result)}, "
        f"published ε = {cfg['published_epsilon']}):", "", ours.to_markdown(), "",
        f"Ours / published (⚠: |difference| > {N_SE:g} combined SEs; a published value "
        "without SE counts its SE as 0):", "", side_by_side(cmp, percent).to_markdown(), "",
    ]
    n_flag = int(cmp["differs"].fillna(False).sum())
    n_cmp = int(cmp["differs"].notna().sum())
    lines += [f"{n_flag} of {n_cmp} comparable cells differ beyond {N_SE:g} combined SEs."
              + (" No cell is comparable: one run on our side and no SE on the paper's."
                 if n_cmp == 0 else ""), ""]
    lines += flag_reasons(flagged_cells(cmp), cfg.get("flag_notes", []))
    return [*lines, exact_values(cmp), ""]


def accountant_of(result: Mapping[str, Any]) -> str:
    """The accountant of a result's ε: the names stored with its runs (``accountants``), else
    the one dpfair had when it finished (:data:`PLD_SINCE`)."""
    names = sorted({a for a in result.get("accountants", {}).values() if a})
    if names:
        return ", ".join(names)
    return accountant_when(result.get("finished"))


def accountant_when(finished: str | None) -> str:
    """dpfair's accountant at ``finished`` ("YYYY-MM-DD HH:MM UTC"), for runs that did not
    store it."""
    if finished is not None and finished < PLD_SINCE:
        return ACCOUNTANT_RDP
    return "dpfair's accountant, not recorded with these runs"


def carried_epsilon_note(accountant: str) -> str:
    """The line under a carried section's marker naming the accountant of all its ε."""
    why = (f", dpfair's accountant when this table ran (before its PLD accountant, default "
           f"since {PLD_SINCE[:10]}, which gives a lower ε for the same run)"
           if accountant == ACCOUNTANT_RDP else "")
    return f"{CARRIED_EPSILON}{accountant}{why}.*"


def exact_values(cmp: pd.DataFrame) -> str:
    """The unrounded (mean, SE) of every compared cell, ours and published, as one HTML comment
    (hidden in the rendered markdown) that SE distances in the prose are computed from."""
    def pair(mean: Any, se: Any) -> list[float | None]:
        return [None if pd.isna(v) else float(v) for v in (mean, se)]

    ours, pub = {}, {}
    for _, r in cmp.iterrows():
        key = f"{r['method']}.{r['column']}"
        ours[key] = pair(r["ours_mean"], r["ours_se"])
        pub[key] = pair(r["published_mean"], r["published_se"])
    return EXACT + json.dumps({"ours": ours, "published": pub}, allow_nan=False) + " -->"


def flagged_cells(cmp: pd.DataFrame) -> list[str]:
    """``method.column`` of every cell flagged ⚠ in a ``comparison_with_published`` frame."""
    hit = cmp[cmp["differs"].fillna(False).astype(bool)]
    return [f"{m}.{c}" for m, c in zip(hit["method"], hit["column"], strict=True)]


def three_way(cfg: Mapping[str, Any], result: Mapping[str, Any], vcfg: Mapping[str, Any],
              vresult: Mapping[str, Any]) -> list[str]:
    """Paper settings / released-code settings / published, cell by cell, and per method which
    of our two settings matches the published row more often (cells within 2 combined SEs)."""
    percent = cfg["layout"] == "esipova"
    pub = published_table(cfg["published"])
    both = [report.comparison_with_published(table_stats(c, r), pub, percent=percent, n_se=N_SE)
            .set_index(["method", "column"]) for c, r in ((cfg, result), (vcfg, vresult))]
    a = both[0]
    methods = list(dict.fromkeys(a.index.get_level_values(0)))
    columns = list(dict.fromkeys(a.index.get_level_values(1)))
    table = pd.DataFrame("", index=pd.Index(methods, name="method"), columns=columns + ["matches"])
    for m in methods:
        score = [0, 0, 0]
        for c in columns:
            if (m, c) not in a.index:
                continue
            d = _digits(c, percent)
            ra = a.loc[(m, c)]
            parts = []
            for k, frame in enumerate(both):
                if (m, c) not in frame.index or pd.isna(frame.loc[(m, c)]["ours_mean"]):
                    parts.append("-")
                    continue
                r = frame.loc[(m, c)]
                flag = bool(r["differs"]) if not pd.isna(r["differs"]) else None
                score[k] += flag is False
                score[2] += k == 0 and flag is not None
                parts.append(_cell(r["ours_mean"], r["ours_se"], d) + (" ⚠" if flag else ""))
            pub_se = None if math.isnan(ra["published_se"]) else ra["published_se"]
            table.at[m, c] = " / ".join([*parts, _cell(ra["published_mean"], pub_se, d)])
        if m not in vresult["settings"]:
            verdict = f"paper settings {score[0]}/{score[2]}; not in the released script"
        else:
            best = ("paper settings" if score[0] > score[1] else "released code"
                    if score[1] > score[0] else "both equally")
            verdict = (f"{best} (paper {score[0]}/{score[2]}, released {score[1]}/{score[2]} "
                       "cells within 2 SEs)")
        table.at[m, "matches"] = verdict
    return [f"Ours (paper settings, `{cfg['name']}`) / ours (released-code settings, "
            f"`{vcfg['name']}`) / published (⚠ on our cell: beyond {N_SE:g} combined SEs of "
            "the published one; ε: paper settings "
            f"{_eps_range(result)}, released code {_eps_range(vresult)}, published "
            f"{cfg['published_epsilon']}; the reasons of each setting's ⚠ are under its own "
            "table):", "", table.to_markdown(), ""]


def _eps_range(result: Mapping[str, Any]) -> str:
    eps = [float(np.mean(v)) for v in result["epsilons"].values() if np.isfinite(np.mean(v))]
    lo, hi = min(eps), max(eps)
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}"


def zhao_frame(result: Mapping[str, Any]) -> pd.DataFrame:
    frame = fairness.runs_frame(result["records"])
    return frame[frame["metric"] == fairness.ACCURACY]


def render_zhao(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    pub = published_table(cfg["published"])
    frame = zhao_frame(result)
    groups, labels = cfg["groups"], cfg["labels"]
    lines: list[str] = []
    rows = []
    for eps in result.get("partial_epsilons", cfg["epsilons"]):
        pub_eps = pub.get(str(eps), {})
        for m in cfg["methods"]:
            key = f"{m['label']}@{eps}"
            sel = frame[frame["method"] == key]
            if sel.empty:
                continue
            row: dict[str, Any] = {"ε": eps, "method": m["label"]}
            per_seed = sel.pivot_table(index="seed", columns="group", values="value")
            flags = []
            for g, lab, k in zip(groups, labels, range(len(groups)), strict=True):
                mean, se = fairness.mean_se(per_seed[g].to_numpy())
                entry = pub_eps.get(m["label"])
                pm, ps = (entry[k] if entry else (math.nan, math.nan))
                comb = math.sqrt(se**2 + ps**2) if not math.isnan(se) else ps
                differs = abs(mean - pm) > N_SE * comb if not math.isnan(pm) else False
                flags.append(differs)
                row[f"acc_{lab} ours"] = _cell(mean, se, 4)
                row[f"acc_{lab} published"] = _cell(pm, ps, 4) + (" ⚠" if differs else "")
            worst = per_seed[groups].min(axis=1)
            wm, ws = fairness.mean_se(worst.to_numpy())
            row["worst-group ours"] = _cell(wm, ws, 4)
            b = result["best"][key]
            row["best grid point (lr, clip)"] = f"{b['lr']:g}, {b['clip'] if b['clip'] else '-'}"
            row["ε measured"] = f"{result['epsilons'][key]:.3f}"
            rows.append(row)
    lines += [f"Best point of the {_grid_name(cfg)} ({len(cfg['grid']['lr'])} learning rates × "
              f"{len(cfg['grid']['clip'])} clip values), selected on validation macro accuracy "
              f"with seed {cfg['grid_seed']}, retrained on {len(cfg['seeds'])} seeds "
              "(mean ± SE; fractions; ⚠: |difference| > 2 combined SEs; ε measured by "
              f"{accountant_of(result)}). "
              "`tuning_privacy: none` — the grid search itself is not accounted:", "",
              pd.DataFrame(rows).to_markdown(index=False), ""]
    if result.get("tnb"):
        tnb = pd.DataFrame(result["tnb"])
        agg = []
        for (eps, meth), part in tnb.groupby(["epsilon", "method"], sort=False):
            r = {"ε per run": eps, "method": meth, "repetitions": len(part),
                 "mean K": f"{part['K'].mean():.1f}",
                 "ε of the whole search (mean)": f"{part['epsilon_search'].mean():.3f}"}
            for g, lab in zip(groups, labels, strict=True):
                mean, se = fairness.mean_se(part[g].to_numpy())
                r[f"acc_{lab}"] = _cell(mean, se, 4)
            r["worst-group"] = _cell(*fairness.mean_se(part[groups].min(axis=1).to_numpy()), 4)
            agg.append(r)
        lines += ["Private tuning (`tnb`: K ~ truncated negative binomial, η = "
                  f"{cfg['tnb']['eta']}, μ = {cfg['tnb']['mu']}; points drawn uniformly from the "
                  f"{_grid_name(cfg).lower()}; best by noisy validation macro accuracy; test "
                  "accuracy of the "
                  "selected run, mean ± SE over repetitions of the whole search):", "",
                  pd.DataFrame(agg).to_markdown(index=False), ""]
    return lines


def grid_reduced(cfg: Mapping[str, Any]) -> bool:
    """Whether the config's grid is smaller than the paper's (``paper_grid``: its sizes)."""
    paper = cfg.get("paper_grid", {})
    return any(len(cfg["grid"][k]) < n for k, n in paper.items())


def _grid_name(cfg: Mapping[str, Any]) -> str:
    return "REDUCED grid" if grid_reduced(cfg) else "full grid of the paper"


def settings_lines(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    ds = cfg["dataset"]
    lines = [f"- data: `{ds['name']}` options `{json.dumps(ds.get('options', {}))}`; "
             f"n_train = {result['n_train']}, n_test = {result['n_test']}"
             + (f", n_val = {result['n_val']}" if "n_val" in result else "")
             + (f"; **subsampled to {cfg['subsample']} rows per split**"
                if cfg.get("subsample") else ""),
             f"- model: `{json.dumps(cfg['model'])}`; training: "
             f"`{json.dumps(cfg['train'])}`; seeds {cfg['seeds']}"]
    if cfg["kind"] == "table":
        for label, s in result["settings"].items():
            lines.append(f"- {label}: `{json.dumps(s['method'])}`, lr {s['lr']:.4g}")
    else:
        for m in cfg["methods"]:
            lines.append(f"- {m['label']}: `{json.dumps(m['method'])}`, grid over lr"
                         + (f" and `{m['clip_field']}`" if m.get("clip_field") else ""))
        lines.append(f"- target ε {cfg['epsilons']} at δ = {cfg['train']['delta']} (σ calibrated "
                     "per run with dpfair's accountant)")
    if result.get("recorded"):
        lines += recorded.settings_lines(result, cfg["groups"], cfg["labels"])
    else:
        lines.append(f"- wall time {result['wall_s'] / 60:.1f} min on {result['machine']}; "
                     f"finished {result['finished']}; MLflow parent run "
                     f"`{result['mlflow_run']}`")
    if cfg["kind"] == "table" and result.get("partial"):
        lines.append(f"- **PARTIAL: the run was cut short; the tables use the seeds on which "
                     f"every method finished: {finished_seeds(cfg, result)}**")
    if "partial_epsilons" in result:
        lines.append(f"- **PARTIAL: the run was cut short; only ε {result['partial_epsilons']} "
                     "finished (grid and seeds), private tuning did not run**")
    if cfg.get("shortened"):
        sh = cfg["shortened"]
        lines.append(f"- **SHORTENED ON CPU** (no GPU in this run): {cfg['train']['epochs']} "
                     f"epochs instead of the paper's {sh['from_epochs']}, {len(cfg['seeds'])} "
                     f"seeds instead of {sh['from_seeds']}. {sh.get('why', '').strip()} The same "
                     "config runs the paper's length where CUDA is available.")
    if cfg.get("quick"):
        lines.append("- **QUICK MODE: not a reproduction, a smoke test of the machinery**")
    return lines


def heading(title: str, name: str, body: Sequence[str]) -> str:
    """A table's heading; a table shortened on the CPU says so in it."""
    qualifier = parse_section(body).qualifier
    short = f", {qualifier.split(',')[0]}" if qualifier.startswith("SHORTENED") else ""
    return f"## {title}{short} (`{name}`)"


def render(configs: Mapping[str, Mapping], results: Mapping[str, dict], out: Path,
           preamble: Iterable[str] = ()) -> str:
    """Write the report for every configured table; tables without results say so.

    Configs of ``kind: discussion`` (``title``, ``text``: prose written after reading the
    numbers, e.g. why we differ) are appended after the tables and the automatic checks."""
    discussions = {n: c for n, c in configs.items() if c.get("kind") == "discussion"}
    configs = {n: c for n, c in configs.items() if n not in discussions}
    lines = ["# Reproduction of the published results", "",
             "Generated by `benchmarks/reproduce.py` from `benchmarks/configs/*.yaml` "
             "(rerun: `make reproduce`, or `.venv/bin/python benchmarks/reproduce.py --only NAME`)."
             " Published numbers come from `reference/published.yaml`. Every final training is "
             "an MLflow run (default store `outputs/reproduction/mlflow.db`, or the "
             "`--work-dir`'s; one experiment per dataset, a parent run per table). Accuracy "
             "columns: `acc_*` per group, `pi_*` privacy cost (non-private minus private "
             "accuracy), `R_*` excess loss, `*_gap` their absolute difference between groups, "
             "`delta_*` private minus non-private accuracy (Xu's sign).", "", *preamble]
    figures = {}
    previous = previous_sections(out)
    carried_claims: list[str] = []
    for name, cfg_file in configs.items():
        start = len(lines)
        if name not in results and name in previous:
            finished = re.search(r"finished (\d{4}-\d\d-\d\d \d\d:\d\d UTC)",
                                 "\n".join(previous[name]))
            accountant = accountant_when(finished.group(1) if finished else None)
            body = [ln.replace("ε measured by our accountant", f"ε by {accountant}")
                    for ln in previous[name][2:]]
            reasons = flag_reasons(markdown_flags(body), cfg_file.get("flag_notes", []))
            at = next((i for i, ln in enumerate(body)
                       if ln.startswith("Known differences of setting")), len(body))
            lines += [heading(cfg_file["title"], name, body), "", CARRIED, "",
                      carried_epsilon_note(accountant), "", *body[:at], *reasons, *body[at:],
                      ""]
            figures[name] = parse_section(lines[start:])
            if "main" not in figures[name].tables:  # no table to check: keep its old lines
                carried_claims += [ln for ln in previous.get(CLAIMS, [])
                                   if ln.startswith((f"- {cfg_file['title']}:",
                                                     f"- {cfg_file['title']}, ε ="))]
            continue
        lines += [f"## {cfg_file['title']} (`{name}`)", ""]
        if name not in results:
            lines += ["Not run (no results recorded for this table).", ""]
            continue
        result = results[name]
        # the ⚠ reasons come from the YAML as it is now, like the notes
        cfg = {**result["config"], "flag_notes": cfg_file.get("flag_notes", [])}
        lines += ["Settings:", "", *settings_lines(cfg, result), ""]
        wanted = len(seed_list(cfg_file["seeds"]))
        if (len(cfg["seeds"]) < wanted and not cfg.get("quick") and not cfg.get("shortened")
                and not cfg.get("recorded")):
            lines.insert(-1, f"- **seeds reduced to {len(cfg['seeds'])} (the config asks for "
                             f"{wanted}) to fit the time of the run that made this "
                             "report**")
        if cfg["kind"] == "table":
            lines += render_table(cfg, result)
        else:
            body = render_zhao(cfg, result)
            lines += body + flag_reasons(markdown_flags(body), cfg["flag_notes"])
        variant = next((v for v, c in configs.items()
                        if c.get("variant_of") == name and v in results), None)
        if variant is not None:
            lines += three_way(cfg, result, results[variant]["config"], results[variant])
        if cfg_file.get("notes"):  # from the YAML as it is now, not as stored with the run
            lines += [f"Known differences of setting: {cfg_file['notes']}", ""]
        lines[start] = heading(cfg_file["title"], name, lines[start + 2:])
        figures[name] = parse_section(lines[start:])
    checked = ["### Qualitative claims checked", "",
               *claims(configs, figures, lambda c: _xu_published(published_table(c["published"]),
                                                                 c))]
    if carried_claims:
        checked += ["", "Carried over from the previous report (tables without a table to "
                    "check):", "", *carried_claims]
    lines += [f"## {CLAIMS}", "", *checked, ""]
    for disc in discussions.values():
        lines += [f"## {disc['title']}", "", disc["text"].rstrip(), ""]
    text = fill("\n".join(lines).rstrip() + "\n", figures)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
