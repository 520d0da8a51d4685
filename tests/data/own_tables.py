"""Synthetic tables the project has never seen, for the own-data tests (no fixture magic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

TARGET = "Ausfall"
PROTECTED = ["Geschlecht", "Herkunft"]  # two- and three-valued: six intersectional groups


def loans_frame(n: int = 900, seed: int = 0) -> pd.DataFrame:
    """Renamed columns, a three-valued protected attribute, missing values in two features."""
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n)
    income = rng.normal(3000, 800, n).round(2)
    job = rng.choice(["Buero", "Handwerk", "Pflege", "Lehre"], n)
    sex = rng.choice(["w", "m"], n)
    origin = rng.choice(["Nord", "Sued", "Ost"], n, p=[0.5, 0.3, 0.2])
    risk = (income < 2800) + (age < 30) + (job == "Lehre") + rng.normal(0, 0.5, n)
    frame = pd.DataFrame({"Alter": age, "Einkommen": income, "Beruf": job,
                          "Geschlecht": sex, "Herkunft": origin,
                          TARGET: np.where(risk > 1.0, "ja", "nein")})
    frame.loc[rng.choice(n, 25, replace=False), "Einkommen"] = np.nan
    frame.loc[rng.choice(n, 15, replace=False), "Beruf"] = np.nan
    return frame


def table_options(path: Path, **overrides: object) -> dict:
    return {"kind": "table", "path": str(path), "target": TARGET, "positive_label": "ja",
            "protected": list(PROTECTED), "missing": "impute", **overrides}


def write_params(path: Path, datasets: dict, dataset: str) -> Path:
    path.write_text(yaml.safe_dump({"datasets": datasets, "experiment": {"dataset": dataset}}))
    return path


def census_frame(n: int = 500, seed: int = 0) -> pd.DataFrame:
    """Integer codes for a category and the target, a three-valued protected column, ids."""
    rng = np.random.default_rng(seed)
    activity = rng.choice([1, 2, 3], n)
    hours = rng.integers(10, 60, n)
    nation = rng.choice(["A", "B", "C"], n, p=[0.5, 0.3, 0.2])
    gender = rng.choice(["F", "M"], n)
    income = ((activity == 2) + (hours > 35) + rng.normal(0, 0.5, n) > 1.0).astype(int)
    return pd.DataFrame({"person": np.arange(1000, 1000 + n), "Activity": activity,
                         "Hours": hours, "Gender": gender, "Nationality": nation,
                         "Income": income})


#: how a dataset declares :func:`census_frame`'s columns (integer-coded categories)
CENSUS_OPTIONS = {"target": "Income", "protected": "Nationality", "id_columns": ["person"],
                  "categories": {"Activity": [1, 2, 3]}, "test_fraction": 0.3}
