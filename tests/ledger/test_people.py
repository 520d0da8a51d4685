"""Accounts keyed by the people in the data (dpfair/ledger/people.py, book.py): the same rows
under another name or format, a union after a disjoint version, a false disjoint declaration,
person ids, and the published data-version id."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from dp_accounting import dp_event

from dpfair import accounting
from dpfair.config.sections import BudgetSection
from dpfair.data import load_dataset
from dpfair.errors import BudgetExceededError, PrivacyError
from dpfair.ledger import PrivacyGate
from dpfair.ledger.people import frame_fingerprints
from tests.conftest import epsilon_oracle

DELTA = 1e-5
EVENT = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.05, 300)


def _eps(*events: dp_event.DpEvent) -> float:
    return epsilon_oracle(*events, delta=DELTA)


def _frame(start: int, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(start)
    return pd.DataFrame({"person": [f"p{i}" for i in range(start, start + n)],
                         "age": rng.integers(18, 90, n), "income": rng.normal(50, 10, n),
                         "group": np.where(np.arange(n) % 3 == 0, "b", "a"),
                         "y": rng.integers(0, 2, n)})


def _declare(path, **extra) -> dict:
    return {"kind": "table", "path": str(path), "target": "y", "protected": "group",
            "features": ["age", "income"], **extra}


def _gate(tmp_path, **budget) -> PrivacyGate:
    return PrivacyGate(BudgetSection(ledger=str(tmp_path / "ledger.sqlite"), **budget))


def _version(gate: PrivacyGate, name: str, options: dict):
    return gate.identify(name, load_dataset(name, options), options=_options(name, options))


def _options(name: str, options: dict):
    from dpfair.data.registry import parse_options

    return parse_options(name, options)


def test_the_same_rows_under_another_name_and_format_compose(tmp_path):
    frame = _frame(0, 300)
    frame.to_csv(tmp_path / "loans.csv", index=False)
    frame.to_parquet(tmp_path / "copy.parquet", index=False)
    gate = _gate(tmp_path, lifetime_epsilon=_eps(EVENT) * 1.1)
    original = _version(gate, "loans", _declare(tmp_path / "loans.csv"))
    gate.reserve(original, EVENT, DELTA)
    copy = _version(gate, "renamed", _declare(tmp_path / "copy.parquet"))
    assert copy.source_md5 != original.source_md5  # another file, another name
    assert gate.spent(copy, DELTA) == pytest.approx(_eps(EVENT), rel=1e-4)  # the same people
    with pytest.raises(BudgetExceededError) as refused:
        gate.reserve(copy, EVENT, DELTA)
    assert "spent so far on these people" in str(refused.value)
    assert "also in: loans" in str(refused.value)
    # a superset (the rows plus new ones) touches the same people too
    pd.concat([frame, _frame(1000, 50)]).to_csv(tmp_path / "more.csv", index=False)
    superset = _version(gate, "bigger", _declare(tmp_path / "more.csv"))
    assert gate.spent(superset, DELTA) == pytest.approx(_eps(EVENT), rel=1e-4)


def test_a_union_after_a_disjoint_version_is_charged_to_both_accounts(tmp_path):
    _frame(0, 200).to_csv(tmp_path / "v1.csv", index=False)
    _frame(500, 200).to_csv(tmp_path / "v2.csv", index=False)
    pd.concat([_frame(0, 200), _frame(500, 200)]).to_csv(tmp_path / "v3.csv", index=False)
    big = accounting.run_event(dp_event.GaussianDpEvent(0.8), 0.05, 600)
    small = EVENT
    gate = _gate(tmp_path)
    v1 = _version(gate, "loans", _declare(tmp_path / "v1.csv"))
    first = gate.reserve(v1, big, DELTA)
    disjoint = _gate(tmp_path, disjoint_from_previous=True)
    v2 = _version(disjoint, "loans", _declare(tmp_path / "v2.csv"))
    second = disjoint.reserve(v2, small, DELTA)
    assert set(first.accounts).isdisjoint(second.accounts)
    # v3 = v1 ∪ v2: v1's people have spent big, so a limit between big and big + small
    # refuses it although v2's own account (the latest one) would allow it
    limit = (_eps(big) + _eps(big, small)) / 2
    v3 = _version(gate, "loans", _declare(tmp_path / "v3.csv"))
    assert gate.spent(v3, DELTA) == pytest.approx(_eps(big), rel=1e-4)
    with pytest.raises(BudgetExceededError):
        _gate(tmp_path, lifetime_epsilon=limit).reserve(v3, small, DELTA)
    third = gate.reserve(v3, small, DELTA)
    assert set(third.accounts) == {*first.accounts, *second.accounts}
    # v1's people paid twice
    assert gate.spent(v1, DELTA) == pytest.approx(_eps(big, small), rel=1e-4)


def test_a_false_disjoint_declaration_is_refused(tmp_path):
    _frame(0, 200).to_csv(tmp_path / "v1.csv", index=False)
    pd.concat([_frame(0, 200).iloc[150:], _frame(900, 100)]).to_csv(tmp_path / "v2.csv",
                                                                 index=False)
    gate = _gate(tmp_path)
    gate.reserve(_version(gate, "loans", _declare(tmp_path / "v1.csv")), EVENT, DELTA)
    disjoint = _gate(tmp_path, disjoint_from_previous=True)
    v2 = _version(disjoint, "loans", _declare(tmp_path / "v2.csv"))
    with pytest.raises(PrivacyError, match="disjoint_from_previous.*shares rows"):
        disjoint.reserve(v2, EVENT, DELTA)
    assert len(gate.ledger.releases()) == 1


def test_person_ids_recognise_people_whose_rows_changed(tmp_path):
    old, new = _frame(0, 200), _frame(0, 200)
    new["income"] = new["income"] + 1.0  # every row changed, the same people
    old.to_csv(tmp_path / "old.csv", index=False)
    new.to_csv(tmp_path / "new.csv", index=False)
    gate = _gate(tmp_path)
    gate.reserve(_version(gate, "a", _declare(tmp_path / "old.csv", id_column="person")),
                 EVENT, DELTA)
    # rows alone cannot tell, and a declared account of its own without ids is an attestation
    unverified = _declare(tmp_path / "new.csv", privacy_unit={"account": "b"})
    by_rows = _version(gate, "b", unverified)
    assert gate.spent(by_rows, DELTA) == 0.0
    assert "not verifiable" in by_rows.account.declaration
    # with ids, the same declaration is checked, and refused: those people paid already
    by_ids = _version(gate, "c", {**unverified, "id_column": "person"})
    with pytest.raises(PrivacyError, match="person ids of this data are in other accounts"):
        gate.reserve(by_ids, EVENT, DELTA)
    undeclared = _version(gate, "d", _declare(tmp_path / "new.csv", id_column="person"))
    assert gate.spent(undeclared, DELTA) == pytest.approx(_eps(EVENT), rel=1e-4)
    # the id column is never a feature
    data = load_dataset("c", _declare(tmp_path / "new.csv", id_column="person"))
    assert data.input_shape == (2,)


def test_fingerprints_are_canonical_and_keyed():
    frame = pd.DataFrame({"b": [1, 2], "a": ["x", None]})
    same = pd.DataFrame({"a": ["x", None], "b": [1.0, 2.0]})  # column order, int vs float
    assert frame_fingerprints(b"k", frame) == frame_fingerprints(b"k", same)
    assert frame_fingerprints(b"k", frame) != frame_fingerprints(b"other", frame)
    assert all(len(fp) == 32 for fp in frame_fingerprints(b"k", frame)["row"])  # 128 bits


def test_the_published_data_version_is_no_membership_oracle(tmp_path):
    _frame(0, 200).to_csv(tmp_path / "v1.csv", index=False)
    gate = _gate(tmp_path)
    options = _declare(tmp_path / "v1.csv")
    dataset = load_dataset("loans", options)
    md5 = hashlib.md5((tmp_path / "v1.csv").read_bytes()).hexdigest()
    assert dataset.meta["data_version"] == md5  # what DVC records, never published
    version = gate.identify("loans", dataset, _options("loans", options))
    assert dataset.meta["data_version"] == version.public_id != md5
    assert version.public_id == gate.public_id(md5)  # stable for the project
    other = _gate(tmp_path / "elsewhere")  # another project secret: another id
    assert other.public_id(md5) != version.public_id
