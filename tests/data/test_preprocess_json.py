"""The table transform computes what scikit-learn's imputers, scaler and one-hot encoder
compute (the independent oracle), and its JSON round-trips exactly (issue 33.3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

from dpfair.data.preprocess import TablePreprocessor, scale_to_range, to_categories, to_numbers

from .own_tables import loans_frame

NUMERIC, CATEGORICAL = ["Alter", "Einkommen"], ["Beruf", "Herkunft", "Geschlecht"]


def _sklearn(impute: bool, ranges: dict, categories: dict) -> ColumnTransformer:
    """The reference: scikit-learn's ColumnTransformer of the same steps."""
    fit_num = [c for c in NUMERIC if c not in ranges]
    fit_cat = [c for c in CATEGORICAL if c not in categories]
    num_declared = [c for c in NUMERIC if c in ranges]
    cat_declared = [c for c in CATEGORICAL if c in categories]
    num = [StandardScaler()]
    cat = [OneHotEncoder(handle_unknown="ignore", sparse_output=False)]
    declared = [FunctionTransformer(scale_to_range, feature_names_out="one-to-one", kw_args={
        "low": [ranges[c][0] for c in num_declared],
        "high": [ranges[c][1] for c in num_declared]})]
    if impute:
        num.insert(0, SimpleImputer(strategy="median"))
        cat.insert(0, SimpleImputer(strategy="most_frequent"))
        declared.append(SimpleImputer(strategy="constant", fill_value=0.0,
                                      keep_empty_features=True))
    parts = [("n", make_pipeline(*num), fit_num), ("nd", make_pipeline(*declared), num_declared),
             ("c", make_pipeline(*cat), fit_cat),
             ("cd", OneHotEncoder(categories=[categories[c] for c in cat_declared],
                                  handle_unknown="ignore", sparse_output=False), cat_declared)]
    return ColumnTransformer([p for p in parts if p[2]], remainder="drop")


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({**{c: to_numbers(frame[c]) for c in NUMERIC},
                         **{c: to_categories(frame[c]) for c in CATEGORICAL}})


@pytest.mark.parametrize("impute", [True, False])
@pytest.mark.parametrize("declared", [{}, {"ranges": {"Alter": [18, 80]},
                                           "categories": {"Herkunft": ["Nord", "Sued", "West"]}}])
def test_the_transform_matches_sklearn_and_its_json_round_trips(impute, declared):
    frame = loans_frame(700, seed=3)
    frame.loc[[1, 2, 3], "Beruf"] = "Lehre"  # ties and rare values, missing ones in the fit
    train, rest = frame.iloc[:500], frame.iloc[500:].copy()
    rest.loc[rest.index[:3], "Beruf"] = "unseen"  # unknown category: all zeros
    ours = TablePreprocessor(NUMERIC, CATEGORICAL, impute=impute, **declared).fit(train)
    oracle = _sklearn(impute, declared.get("ranges", {}), declared.get("categories", {}))
    oracle.fit(_typed(train))
    expected = oracle.transform(_typed(rest)).astype(np.float32)
    got = ours.encode(rest)  # the encoding alone (transform checks the rows first)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    names = [n.split("__", 1)[1] for n in oracle.get_feature_names_out()]
    assert ours.feature_names == names
    again = TablePreprocessor.from_json(ours.to_json())
    np.testing.assert_array_equal(again.encode(rest), got)
    assert again.feature_names == ours.feature_names
    assert again.data_independent == ours.data_independent


def test_a_constant_column_is_scaled_by_one_as_sklearn_does():
    frame = loans_frame(100).assign(Alter=42)
    ours = TablePreprocessor(NUMERIC, [], impute=True).fit(frame)
    assert ours.state.scale["Alter"] == 1.0 and (ours.transform(frame)[:, 0] == 0).all()
