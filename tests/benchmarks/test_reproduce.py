"""The reproduction script's machinery on tiny settings (benchmarks/reproduce.py, issue #7).

One epoch, two seeds, a few hundred rows: the point is the table structure and the published
columns of the report, not the numbers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.conftest import load_benchmark, requires_dataset


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    module = load_benchmark("reproduce")
    if not sys.modules["report_render"].PUBLISHED.exists():
        pytest.skip(f"published numbers not found at {sys.modules['report_render'].PUBLISHED}")
    return module


@pytest.fixture(scope="module")
def rr(reproduce: ModuleType) -> ModuleType:
    """``benchmarks/report_render.py``, the report's rendering (loaded with reproduce)."""
    return sys.modules["report_render"]


def _tiny(config_dir: Path, reproduce: ModuleType) -> Path:
    """Copies of two configs (an Esipova-layout table with three methods, a Zhao table with
    one method) shrunk to seconds."""
    out = config_dir / "configs"
    out.mkdir()
    configs = reproduce.load_configs()
    dutch = configs["02_esipova_dutch"]
    dutch["methods"] = [m for m in dutch["methods"]
                        if m["label"] in ("nonprivate", "dpsgd", "dpsgd_global")]
    dutch["quick"] = {"epochs": 1, "seeds": 2, "subsample": 600}
    zhao = configs["05_zhao_adult"]
    zhao["methods"] = [m for m in zhao["methods"] if m["label"] == "bounded_adaptive"]
    zhao["quick"] = {"epochs": 1, "seeds": [1, 2], "subsample": 600, "epsilons": [0.5],
                     "grid": {"lr": [1.0], "clip": [0.0305, 0.9285]},
                     "tnb": {"epsilons": [0.5], "eta": 0.0, "mu": 1.0, "repetitions": 1}}
    for name, cfg in (("02_esipova_dutch", dutch), ("05_zhao_adult", zhao)):
        cfg.pop("name")
        (out / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return out


def _with_variant(out: Path, reproduce: ModuleType) -> Path:
    """The tiny configs plus a released-code variant of the Dutch table (two methods)."""
    released = reproduce.load_configs()["02b_esipova_dutch_released"]
    released["methods"] = [m for m in released["methods"] if m["label"] in ("nonprivate", "dpsgd")]
    released["quick"] = {"epochs": 1, "seeds": 2, "subsample": 600}
    released.pop("name")
    (out / "02b_esipova_dutch_released.yaml").write_text(yaml.safe_dump(released))
    return out


@requires_dataset("dutch", "adult")
def test_quick_report_has_tables_and_published_columns(
    reproduce: ModuleType, tmp_path: Path
) -> None:
    config_dir = _tiny(tmp_path, reproduce)
    report = tmp_path / "reproduction.md"
    rc = reproduce.main(["--quick", "--config-dir", str(config_dir), "--out", str(report),
                         "--work-dir", str(tmp_path / "work")])
    assert rc == 0
    text = report.read_text()
    # one section per table, with settings, wall time and machine
    assert "## Esipova et al. 2023, Table 5" in text
    assert "## Zhao et al., Table 6" in text
    assert text.count("wall time") == 2 and "thread(s)" in text
    assert "QUICK MODE" in text
    # Esipova layout: every published column, ours next to published
    for column in ("acc_M", "acc_F", "pi_M", "pi_F", "pi_gap", "loss_M", "loss_F", "R_gap"):
        assert f"| {column}" in text or f" {column} " in text
    assert "76.0 ± 0.2" in text  # published dpsgd acc_M on Dutch (Table 5)
    assert "combined SEs" in text
    # Zhao: published female/male accuracies and the private-tuning section
    assert "0.9206 ± 0.0004" in text  # published bounded adaptive, Adult, eps 0.5, female
    assert "REDUCED grid" in text and "Private tuning" in text
    assert "## Checks of the papers' claims" in text
    # raw results stored for re-rendering
    stored = sorted(p.name for p in (tmp_path / "work" / "results").glob("*.json"))
    assert stored == ["02_esipova_dutch.json", "05_zhao_adult.json"]
    assert reproduce.main(["--render-only", "--config-dir", str(config_dir), "--out",
                           str(report), "--work-dir", str(tmp_path / "work")]) == 0
    assert report.read_text() == text


def test_xu_published_rows(reproduce: ModuleType, rr: ModuleType) -> None:
    configs = reproduce.load_configs()
    table = rr.published_table("xu2021.table1")
    pub = rr._xu_published(table, configs["03_xu_adult"])
    assert pub["columns"][:3] == ["acc_total", "acc_M", "acc_F"]
    assert pub["nonprivate"][:3] == [0.8099, 0.7610, 0.9117]
    # DPSGD-F on Adult: Delta_M = -0.0298, Delta_F = -0.0161, gap 0.0137 <= tau 0.05
    assert pub["dpsgd_f"][4:6] == [-0.0298, -0.0161]
    assert pub["dpsgd_f"][6] == pytest.approx(0.0137)
    # MNIST: named columns, our class labels; dpsgd Delta_2 - Delta_8 = -0.0707 + 0.6807
    mnist = rr._xu_published(table, configs["07_xu_mnist"])
    assert mnist["columns"] == ["acc_total", "acc_2", "acc_8", "delta_total", "delta_2",
                                "delta_8", "delta_gap"]
    assert mnist["nonprivate"][:3] == [0.9855, 0.9903, 0.9292]
    assert mnist["dpsgd"][6] == pytest.approx(0.61)


def test_mnist_tables_are_shortened_on_cpu_and_say_so(
    reproduce: ModuleType, rr: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reproduce.torch.cuda, "is_available", lambda: False)
    cfg = reproduce.effective_config(reproduce.load_configs()["06_esipova_mnist"], False, None)
    assert cfg["device"] == "cpu" and cfg["train"]["epochs"] == 3 and cfg["seeds"] == [0, 1, 2]
    assert cfg["shortened"]["from_epochs"] == 60 and cfg["shortened"]["from_seeds"] == 5
    result = {"n_train": 1, "n_test": 1, "settings": {}, "wall_s": 60.0, "machine": "m",
              "finished": "now", "mlflow_run": "r"}
    text = "\n".join(rr.settings_lines(cfg, result))
    assert "SHORTENED ON CPU" in text and "instead of the paper's 60" in text
    monkeypatch.setattr(reproduce.torch.cuda, "is_available", lambda: True)
    full = reproduce.effective_config(reproduce.load_configs()["06_esipova_mnist"], False, None)
    assert full["device"] == "cuda" and full["train"]["epochs"] == 60 and "shortened" not in full


@requires_dataset("dutch")
def test_a_table_cut_short_resumes_without_repeating_runs(
    reproduce: ModuleType, rr: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs = reproduce.load_configs(_tiny(tmp_path, reproduce))
    cfg = reproduce.effective_config(configs["02_esipova_dutch"], True, None)  # 3 methods x 2
    tracking = reproduce.tracking_config(tmp_path / "work")
    results = tmp_path / "work" / "results"
    real = reproduce.train_and_log
    calls: list[str] = []

    def dies_on_fourth(config, label, *args, **kwargs):
        calls.append(label)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(config, label, *args, **kwargs)

    monkeypatch.setattr(reproduce, "train_and_log", dies_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        reproduce.run_one(cfg, tracking, results, log=lambda s: None)
    partial = reproduce.load_results(results, [cfg["name"]])[cfg["name"]]
    assert partial["partial"] and len(partial["done"]) == 3
    assert rr.finished_seeds(cfg, partial) == [0]  # seed 0 has all three methods
    calls.clear()
    monkeypatch.setattr(reproduce, "train_and_log", lambda *a, **k: (calls.append(a[1]),
                                                                      real(*a, **k))[1])
    done = reproduce.run_one(cfg, tracking, results, log=lambda s: None)
    assert calls == ["nonprivate", "dpsgd", "dpsgd_global"]  # only seed 1's runs
    assert not done["partial"] and len(done["done"]) == 6
    assert rr.finished_seeds(cfg, done) == [0, 1]
    assert len(rr.table_stats(cfg, done)) == 3


def test_flag_reasons_name_every_flagged_cell(reproduce: ModuleType, rr: ModuleType) -> None:
    notes = [{"cells": ["*.loss_*"], "reason": "their loss is on sigmoid outputs:  0.500"},
             {"cells": ["dpsgd.acc_F"], "reason": "one split"}]
    lines = rr.flag_reasons(
        ["nonprivate.loss_M", "dpsgd.loss_F", "dpsgd.acc_F", "dpsgd.R_M"], notes)
    assert lines[0] == "Why each ⚠:"
    assert "- nonprivate (loss_M); dpsgd (loss_F): their loss is on sigmoid outputs: 0.500" \
        in lines
    assert "- dpsgd (acc_F): one split" in lines
    assert "- dpsgd (R_M): **no reason recorded yet**" in lines  # never silently dropped
    assert rr.flag_reasons([], notes) == []


def test_markdown_flags_list_each_cell_once(reproduce: ModuleType, rr: ModuleType) -> None:
    """A released-code table under the paper's table flags the same cells again."""
    table = ["| method | acc_M | acc_F |", "|:--|:--|:--|", "| dpsgd | 1 / 2 ⚠ | 3 / 3 |",
             "| fairlens | 1 / 1 | 2 / 5 ⚠ |"]
    assert rr.markdown_flags([*table, "", *table]) == ["dpsgd.acc_M", "fairlens.acc_F"]
    zhao = ["| ε | method | acc_F ours | acc_F published |", "|--:|:--|:--|:--|",
            "| 0.5 | constant | 0.92 | 0.91 ⚠ |"]
    assert rr.markdown_flags(zhao) == ["constant@0.5.acc_F"]
    assert rr.markdown_flags(["\n".join(zhao), ""]) == ["constant@0.5.acc_F"]


def test_previous_sections_are_carried_with_their_claims(
    reproduce: ModuleType, rr: ModuleType, tmp_path: Path
) -> None:
    """A table whose results are not stored keeps its section of the existing report."""
    configs = {"01_a": {"title": "A", "kind": "table", "seeds": 1},
               "02_b": {"title": "B", "kind": "table", "seeds": 1}}
    out = tmp_path / "reproduction.md"
    out.write_text("# Reproduction\n\n## A (`01_a`)\n\nSettings of A\n\n| a |\n\n"
                   "## B (`02_b`)\n\nold B\n\n## Checks of the papers' claims\n\n"
                   "- A: claim of A → **yes**\n- B: claim of B → **NO**\n")
    text = rr.render(configs, {}, out)
    note = rr.carried_epsilon_note(rr.accountant_when(None))  # no finish date: not recorded
    assert "## A (`01_a`)\n\n" + rr.CARRIED + "\n\n" + note + "\n\nSettings of A\n\n| a |" in text
    assert "old B" in text and "- A: claim of A → **yes**" in text
    assert "- B: claim of B → **NO**" in text
    # rendering again keeps one marker, not two
    again = rr.render(configs, {}, out)
    assert again.count(rr.CARRIED) == 2 and again.count(note) == 2 and again == text


@requires_dataset("dutch")
def test_data_seed_run_gives_each_seed_its_own_subsample(reproduce: ModuleType) -> None:
    cfg = {"dataset": {"name": "dutch", "options": {"group_ratios": [1.0, 0.333],
                                                    "validation_fraction": 0.0, "seed": 0}},
           "data_seed": "run"}
    first, second = reproduce.dataset_for(cfg, 0), reproduce.dataset_for(cfg, 1)
    assert first.meta["options"]["seed"] == 0 and second.meta["options"]["seed"] == 1
    assert not (len(first.train) == len(second.train)
                and bool((first.train.x == second.train.x).all()))
    fixed = reproduce.dataset_for({**cfg, "data_seed": None}, 1)
    assert fixed.meta["options"]["seed"] == 0


def test_released_configs_are_variants_of_the_paper_tables(reproduce: ModuleType) -> None:
    configs = reproduce.load_configs()
    for variant, paper in (("01b_esipova_adult_released", "01_esipova_adult"),
                           ("02b_esipova_dutch_released", "02_esipova_dutch")):
        cfg = configs[variant]
        assert cfg["variant_of"] == paper and cfg["data_seed"] == "run"
        assert cfg["published"] == configs[paper]["published"]
        assert cfg["dataset"]["options"]["group_ratios"]


@requires_dataset("dutch")
def test_released_variant_renders_three_columns_and_a_verdict(
    reproduce: ModuleType, tmp_path: Path
) -> None:
    config_dir = _with_variant(_tiny(tmp_path, reproduce), reproduce)
    report = tmp_path / "reproduction.md"
    assert reproduce.main(["--quick", "--only", "02_esipova_dutch", "02b_esipova_dutch_released",
                           "--config-dir", str(config_dir), "--out", str(report),
                           "--work-dir", str(tmp_path / "work")]) == 0
    text = report.read_text()
    assert "ours (released-code settings, `02b_esipova_dutch_released`) / published" in text
    # a cell holds paper / released / published; methods the script lacks say so
    assert re.search(r"\| dpsgd +\| [^|/]+ / [^|/]+ / 76\.0 ± 0\.2 +\|", text)
    assert "not in the released script" in text  # dpsgd_global is not in the tiny variant
    assert "cells within 2 SEs)" in text
    assert "Why each ⚠:" in text and "no reason recorded yet" not in text


def test_epsilon_cells_show_a_number_only_for_a_proven_guarantee(
    reproduce: ModuleType, rr: ModuleType,
) -> None:
    from dpfair.release.labels import HEURISTIC, NONPRIVATE_REFERENCE

    assert rr._epsilon_cell("dpsgd", 3.5212) == "3.52"
    assert rr._epsilon_cell("fairlens", float("inf")) == HEURISTIC
    assert rr._epsilon_cell("nonprivate", float("inf")) == NONPRIVATE_REFERENCE
    assert rr._epsilon_cell("fairlens", None) == HEURISTIC


_SECTION = ["## T (`t`)", "", "Settings:", "",
            "- wall time 2.5 min on m; finished now; MLflow parent run `r`",
            "- **SHORTENED ON CPU** (no GPU in this run): 3 epochs instead of the paper's 60, 3 "
            "seeds instead of 5.", "",
            "Ours (mean ± SE over 3 seeds; accuracies in %; ε measured by our accountant):", "",
            "| method | pi_gap | R_gap | epsilon |", "|:--|:--|:--|--:|",
            "| nonprivate | - | - | none |", "| dpsgd | 29.5 ± 2.1 | 2.38 ± 0.11 | 2.36 |",
            "| dpsgd_global | 51.5 ± 0.5 | 1.39 ± 0.11 | 2.36 |", "",
            "Ours / published (⚠: ...):", "", "| method | pi_gap | R_gap |", "|:--|:--|:--|",
            "| dpsgd | 29.5 ± 2.1 / 48.9 ± 1.3 ⚠ | 2.378 ± 0.106 / 1.630 ± 0.030 ⚠ |",
            "| dpsgd_global | 51.5 ± 0.5 / 14.8 ± 2.7 ⚠ | 1.395 ± 0.108 / 0.710 ± 0.040 ⚠ |", "",
            "2 of 4 comparable cells differ beyond 2 combined SEs.", ""]


def test_prose_figures_are_filled_from_the_tables(reproduce: ModuleType) -> None:
    """A placeholder takes its figure from the table as printed, so a rerun that changes the
    table changes the prose; a placeholder naming nothing is an error, not a typed number."""
    from report_figures import MISSING, FigureError, fill, parse_section

    figs = {"t": parse_section(_SECTION)}
    prose = ("π_gap [[t:dpsgd.pi_gap]] (published [[t:dpsgd.pi_gap|published mean]]; "
             "[[t:dpsgd.pi_gap|vs published]]), R_gap [[t:dpsgd.R_gap|ours]], global − dpsgd "
             "[[t:dpsgd_global.pi_gap vs dpsgd.pi_gap]], [[t:wall]] min, [[t:flagged]], "
             "ε [[t:dpsgd.epsilon]] over [[t:seeds]] seeds")
    assert fill(prose, figs) == (  # no unrounded values kept: distances say so
        "π_gap 29.5 ± 2.1 (published 48.9; -19.4, 7.9 combined SEs of printed cells), R_gap "
        "2.378 ± 0.106, global − dpsgd +22.0, 10.2 combined SEs of printed cells, 2.5 min, "
        "2 of 4, ε 2.36 over 3 seeds")
    rerun = [ln.replace("29.5 ± 2.1", "31.0 ± 1.0") for ln in _SECTION]
    assert "π_gap 31.0 ± 1.0" in fill(prose, {"t": parse_section(rerun)})
    for bad in ("[[t:dpsgd.acc_8]]", "[[t:nonprivate.pi_gap|se]]", "[[t:dpsgd.pi_gap|median]]"):
        with pytest.raises(FigureError):
            fill(bad, figs)
    assert fill("[[u:dpsgd.pi_gap]]", figs) == f"[{MISSING} `u`]"  # a report of some tables


def test_claims_say_how_far_the_runs_go_and_their_se_distance(reproduce: ModuleType) -> None:
    from report_claims import claims
    from report_figures import parse_section

    cfg = {"title": "T", "kind": "table", "layout": "esipova"}
    lines = claims({"t": cfg}, {"t": parse_section(_SECTION)}, lambda c: {})
    assert lines[0] == (
        "- T [SHORTENED on CPU to 3 of 60 epochs, 3 seeds]: dpsgd_global privacy-cost gap π_gap "
        "51.5 ± 0.5 vs dpsgd 29.5 ± 2.1 pp → smaller than dpsgd: **NO** (+22.0, 10.2 combined "
        "SEs of printed cells)")
    assert "R_gap 1.395 ± 0.108 vs dpsgd 2.378 ± 0.106 → smaller than dpsgd: **yes**" in lines[1]


def test_recorded_gpu_runs_are_a_full_length_table(reproduce: ModuleType, rr: ModuleType) -> None:
    """The H100 JSON lines become table 06's results at 60 epochs, with their provenance."""
    import json

    import recorded

    cfg = reproduce.load_configs()["06g_esipova_mnist_h100"]
    assert cfg["train"]["epochs"] == 60 and cfg["methods"][0]["label"] == "nonprivate"
    result = recorded.load(cfg)
    assert result["config"]["seeds"] == [0, 1]
    assert result["recorded"]["device"].startswith("NVIDIA H100")
    assert result["recorded"]["commit"] and result["recorded"]["torch"]
    lines = [json.loads(ln) for ln in
             (recorded.RAW / cfg["recorded"]).read_text().splitlines()]
    acc8 = [r["group_accuracy"][8] for r in lines if r["label"] == "dpsgd"]
    stats = rr.table_stats(result["config"], result)
    assert stats.at["dpsgd", ("acc_8", "mean")] == pytest.approx(sum(acc8) / 2)
    assert result["recorded"]["later"][0]["commit"] == "2578129"  # Global-Adapt rerun
    text = "\n".join(rr.settings_lines(result["config"], result))
    assert "RECORDED ON A GPU, full length" in text and "2 seeds (0, 1)" in text
    # ε by today's accountant, named; the figure recorded with the runs (RDP then) beside it
    from dpfair.accounting.accountant import ACCOUNTANT_PLD, ACCOUNTANT_RDP

    assert result["accountants"]["dpsgd"] == ACCOUNTANT_PLD
    eps = [r["eps"] for r in lines if r["label"] == "dpsgd"]
    assert result["epsilons_recorded"]["dpsgd"] == eps
    assert result["epsilons"]["dpsgd"][0] < eps[0]  # PLD below the recorded RDP figure
    assert f"ε recorded with the runs, by the accountant of their day ({ACCOUNTANT_RDP}): " \
           f"dpsgd {eps[0]:.2f}" in text
    assert rr.accountant_of(result) == ACCOUNTANT_PLD


def test_the_committed_report_is_its_own_rendering(reproduce: ModuleType, rr: ModuleType,
                                                   tmp_path: Path) -> None:
    """Rendered again from its own tables, the recorded runs and the configs, the report does
    not change: every prose figure is a filled placeholder, none is left unfilled."""
    from report_figures import MISSING

    committed = reproduce.REPORT.read_text()
    assert "[[" not in committed and MISSING not in committed
    out = tmp_path / "reproduction.md"
    out.write_text(committed)
    configs = reproduce.load_configs()
    import recorded

    assert rr.render(configs, recorded.recorded_results(configs), out) == committed


def test_se_distances_use_the_unrounded_values_a_table_keeps(reproduce: ModuleType) -> None:
    """A rendered table keeps each cell's unrounded mean and SE (an HTML comment); distances
    in the prose and the claims come from them, not from the rounded cells."""
    import json

    from report_claims import claims
    from report_figures import EXACT, fill, parse_section

    exact = {"ours": {"dpsgd.pi_gap": [29.54, 2.06], "dpsgd_global.pi_gap": [51.46, 0.54]},
             "published": {"dpsgd.pi_gap": [48.9, 1.3], "dpsgd_global.pi_gap": [14.8, 2.7]}}
    section = [*_SECTION, EXACT + json.dumps(exact) + " -->", ""]
    figs = {"t": parse_section(section)}
    distance = abs(51.46 - 29.54) / (2.06 ** 2 + 0.54 ** 2) ** 0.5  # 10.29; rounded cells: 10.2
    assert fill("[[t:dpsgd_global.pi_gap vs dpsgd.pi_gap]]", figs) == (
        f"+21.9, {distance:.1f} combined SEs")
    assert fill("[[t:dpsgd.pi_gap|vs published]]", figs) == "-19.4, 7.9 combined SEs"
    line = claims({"t": {"title": "T", "kind": "table", "layout": "esipova"}}, figs,
                  lambda c: {})[0]
    assert line.endswith(f"**NO** (+21.9, {distance:.1f} combined SEs)")


def test_flagged_cells_are_counted_and_listed_by_kind(reproduce: ModuleType) -> None:
    from report_figures import fill, parse_section

    figs = {"t": parse_section(_SECTION)}
    assert fill("[[t:flagged kinds]]", figs) == (
        "2 of 4 comparable cells flagged: 2 privacy costs (dpsgd pi_gap, dpsgd_global pi_gap); "
        "2 excess risks (dpsgd R_gap, dpsgd_global R_gap)")
    assert fill("[[t:verdict]]", figs) == (
        "does not reproduce cell for cell: 2 of 4 comparable cells flagged")
    clean = [ln.replace(" ⚠", "").replace("2 of 4", "0 of 4") for ln in _SECTION]
    assert fill("[[t:verdict]]", {"t": parse_section(clean)}).startswith(
        "reproduces cell for cell (0 of 4")


def test_the_committed_report_says_what_its_tables_say(reproduce: ModuleType) -> None:
    """The four statements of issue 44, read back from the committed report: every ε names
    its accountant; shortened tables say so in their heading; the flagged cells of the full-
    length MNIST table are listed from the table (an accuracy among them); the Dutch verdict
    counts its flagged cells; one explanation of Xu's ε gap."""
    from report_figures import parse_section
    from report_notes import markdown_flags

    text = reproduce.REPORT.read_text()
    sections = re.split(r"\n(?=## )", text)
    assert "ε measured by our accountant" not in text and "our accountant gives" not in text
    for sec in sections:
        fig = parse_section(sec.splitlines())
        if "Ours (mean ± SE" in sec:
            assert fig.accountant, sec[:80]
        if "SHORTENED ON CPU**" in sec:
            assert "SHORTENED on CPU" in sec.splitlines()[0]
    def section(name: str) -> str:
        return next(s for s in sections if s.splitlines()[0].endswith(f"(`{name}`)"))

    table = section("06g_esipova_mnist_h100")
    flags = markdown_flags(table.splitlines())
    assert "dpsgd_f.acc_8" in flags
    listed = text.split("Flagged in this table:")[1].split(". ")[0]
    assert all(f"{c.split('.')[0]} {c.split('.')[1]}" in listed for c in flags)
    assert listed.startswith(f"\n{parse_section(table.splitlines()).flagged} comparable cells")
    assert "losses and\nexcess risks:" not in text  # the old, wrong summary
    dutch = parse_section(section("02_esipova_dutch").splitlines())
    assert f"does not reproduce cell for cell: {dutch.flagged} comparable cells flagged" in text
    assert "the\ntable reproduces" not in text and "table reproduces:" not in text
    assert "Xu's accountant or step count differs" not in text
    assert text.count("we do not\nknow why") + text.count("we do not know why") == 1
