"""The papers' qualitative claims, checked on the figures of the report's tables.

Pure text helper of ``benchmarks/reproduce.py``: every verdict is read from a table as printed
(:mod:`report_figures`), rendered now or carried over, so a carried table gets the same checks
as a fresh one. Each line says how far its runs go (shortened, GPU, seeds: :attr:`Figures.
qualifier`) and states every "yes" / "NO" with its distance in combined SEs; a difference
within 2 combined SEs says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from report_figures import Figures, se_distance

N_SE = 2.0
REFERENCE = "nonprivate"


def _ours(fig: Figures, key: str) -> str | None:
    """Our cell of ``key``: from the "ours / published" table where it has one (losses and
    excess risks carry a third decimal there), else from the main table."""
    cell = fig.tables.get("published", {}).get(key)
    if cell and " / " in cell:
        return cell.split(" / ")[0].replace("⚠", "").strip()
    return fig.tables.get("main", {}).get(key)


def _within(a: tuple[float, float], b: tuple[float, float]) -> bool:
    comb = math.hypot(a[1], b[1])
    return not math.isnan(comb) and abs(a[0] - b[0]) <= N_SE * comb


def _esipova(fig: Figures, head: str) -> list[str]:
    out = []
    for col, what, unit in (("pi_gap", "privacy-cost gap π_gap", " pp"),
                            ("R_gap", "excess-risk gap R_gap", "")):
        base_cell = _ours(fig, f"dpsgd.{col}")
        if base_cell is None:
            continue
        base, base_exact = fig.value("ours", f"dpsgd.{col}", base_cell)
        for m in ("dpsgd_global", "dpsgd_global_adapt", "dpsgd_f"):
            cell = _ours(fig, f"{m}.{col}")
            if cell is None:
                continue
            gap, exact = fig.value("ours", f"{m}.{col}", cell)
            verdict = "yes" if gap[0] < base[0] else "NO"
            weak = "; within 2 combined SEs" if _within(gap, base) else ""
            out.append(f"- {head}: {m} {what} {cell} vs dpsgd {base_cell}{unit} → smaller "
                       f"than dpsgd: **{verdict}** "
                       f"({se_distance(gap, base, exact and base_exact)}{weak})")
    return out


def _xu(cfg: Mapping[str, Any], fig: Figures, head: str, pub: Mapping[str, Any]) -> list[str]:
    main = fig.tables.get("main", {})
    labels = cfg["labels"]
    pair = "Δ_{} − Δ_{}".format(*labels[1:3])
    methods = [k.split(".")[0] for k in main if k.endswith(".delta_gap")]
    out = []
    for m in methods:
        if m == REFERENCE:
            continue
        gap = fig.value("ours", f"{m}.delta_gap", main[f"{m}.delta_gap"])[0][0]
        ses = [fig.value("ours", f"{m}.delta_{lab}", main[f"{m}.delta_{lab}"])[0][1]
               for lab in labels[1:3]]
        se_text = ("no SE (one run)" if any(math.isnan(s) for s in ses) else
                   f"SEs of the two Δ {ses[0]:.4f}, {ses[1]:.4f}")
        eq = "equal" if gap <= cfg["tau"] else "unequal"
        pg = pub.get(m, [None] * 7)[6]
        peq = "equal" if pg is not None and pg <= cfg["tau"] else "unequal"
        out.append(f"- {head}: {m} |{pair}| = {gap:.4f} ({se_text}) → **{eq}** cost of "
                   f"privacy at τ = {cfg['tau']} (published {pg:.4f} → {peq})")
    if "dpsgd" in methods and "dpsgd_f" in methods:
        gf, gd = (fig.value("ours", f"{m}.delta_gap", main[f"{m}.delta_gap"])[0][0]
                  for m in ("dpsgd_f", "dpsgd"))
        out.append(f"- {head}: dpsgd_f gap {gf:.4f} vs dpsgd {gd:.4f} → DPSGD-F narrows the "
                   f"gap: **{'yes' if gf < gd else 'NO'}** (published "
                   f"{pub['dpsgd_f'][6]:.4f} vs {pub['dpsgd'][6]:.4f}; gaps of seed means, "
                   "no SE)")
    return out


def _zhao(cfg: Mapping[str, Any], fig: Figures, head: str) -> list[str]:
    main = fig.tables.get("main", {})
    col = "worst-group ours"
    out = []
    for eps in cfg["epsilons"]:
        cells = {m: main.get(f"{m}@{eps}.{col}") for m in
                 ("bounded_adaptive", "unbounded_adaptive", "constant")}
        if not (cells["bounded_adaptive"] and cells["unbounded_adaptive"]):
            continue
        (b, eb), (u, eu) = (fig.value("ours", f"{m}@{eps}.{col}", cells[m])
                            for m in ("bounded_adaptive", "unbounded_adaptive"))
        within = _within(b, u)
        verdict = "yes" if b[0] >= u[0] else (
            "no, lower but within 2 combined SEs" if within else "NO")
        weak = "; within 2 combined SEs: not a significant difference" if (
            within and b[0] >= u[0]) else ""
        cstr = f"; constant {cells['constant']}" if cells["constant"] else ""
        out.append(f"- {cfg['title']}, ε = {eps} [{fig.qualifier}]: worst-group accuracy "
                   f"bounded {cells['bounded_adaptive']} vs unbounded "
                   f"{cells['unbounded_adaptive']}{cstr} → bounded ≥ unbounded: **{verdict}** "
                   f"({se_distance(b, u, eb and eu)}{weak})")
    return out


def claims(configs: Mapping[str, Mapping[str, Any]], figures: Mapping[str, Figures],
           xu_published: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> list[str]:
    """One line per checked claim of every table with figures (configs in report order);
    ``xu_published(cfg)`` gives Xu's published rows of a Xu-layout table."""
    out = []
    for name, cfg in configs.items():
        fig = figures.get(name)
        if fig is None or "main" not in fig.tables:
            continue
        head = f"{cfg['title']} [{fig.qualifier}]"
        if cfg["kind"] == "zhao":
            out += _zhao(cfg, fig, head)
        elif cfg.get("layout") == "esipova":
            out += _esipova(fig, head)
        elif cfg.get("layout") == "xu":
            out += _xu(cfg, fig, head, xu_published(cfg))
    return out
