"""The declared privacy unit and the project account (dpfair/data/privacy_unit.py,
dpfair/ledger/accounts.py), with real commands: an edited copy of a table, `fit` after
`dpfair train`, a search re-run that releases more, unnoised validation scores, the rows a
person may hold, and ledgers written before named accounts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import torch
import yaml
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from typer.testing import CliRunner

from dpfair import accounting
from dpfair.cli.commands import app
from dpfair.errors import BudgetExceededError, PrivacyError
from dpfair.ledger import SourceLedger
from dpfair.ledger.accounts import PROJECT

runner = CliRunner()
LEDGER = ".dpfair/ledger.sqlite"


def _table(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"person": [f"p{i}" for i in range(n)],
                         "age": rng.integers(18, 90, n).astype(float),
                         "income": rng.normal(50, 10, n).round(3),
                         "region": np.where(np.arange(n) % 4 == 0, "north", "south"),
                         "y": rng.integers(0, 2, n)})


def _declare(path: str, **extra: object) -> dict:
    return {"kind": "table", "path": path, "target": "y", "protected": ["region"],
            "features": ["age", "income"],
            "numeric_ranges": {"age": [18, 90], "income": [0, 100]},
            "categories": {}, **extra}


def _params(root: Path, datasets: dict, dataset: str, budget: dict | None = None,
            tuning: dict | None = None) -> None:
    params = {
        "datasets": datasets,
        "experiment": {
            "dataset": dataset, "model": {"name": "logistic_regression"},
            "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      "progress": False},
            "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
        },
        "tuning": {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}},
                   **(tuning or {})},
        "budget": budget or {},
        "tracking": {"uri": f"sqlite:///{root / 'm.db'}", "artifact_root": str(root / "art")},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def _train(expect: int = 0) -> str:
    out = runner.invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == expect, out.output
    return " ".join(out.output.split())


def _one_run_epsilon(root: Path) -> float:
    [release] = SourceLedger(LEDGER, root).releases()
    return release.epsilon


@pytest.mark.parametrize("edit", ["renamed column", "id column dropped", "0.001 added",
                                  "feature added"])
def test_an_edited_copy_draws_on_the_same_project_account(tmp_path, monkeypatch, edit):
    monkeypatch.chdir(tmp_path)
    frame = _table()
    frame.to_csv("loans.csv", index=False)
    original = _declare("loans.csv", id_column="person")
    _params(tmp_path, {"loans": original}, "loans")
    _train()
    one = _one_run_epsilon(tmp_path)
    copy, declared = frame.copy(), _declare("copy.csv")
    if edit == "renamed column":
        copy = copy.rename(columns={"income": "salary"})
        declared["features"] = ["age", "salary"]
        declared["numeric_ranges"] = {"age": [18, 90], "salary": [0, 100]}
    elif edit == "id column dropped":
        copy = copy.drop(columns=["person"])
    elif edit == "0.001 added":
        copy["income"] += 0.001
    else:
        copy["score"] = 1.0
        declared["features"] = ["age", "income", "score"]
        declared["numeric_ranges"] = {**declared["numeric_ranges"], "score": [0, 2]}
    copy.to_csv("copy.csv", index=False)
    # a lifetime that one more run on the same people exceeds
    _params(tmp_path, {"loans": original, "renamed": declared}, "renamed",
            budget={"lifetime_epsilon": one * 1.2})
    text = _train(expect=3)
    assert "would exceed budget.lifetime_epsilon" in text and "nothing was trained" in text
    assert "privacy_unit.account" in text  # how to declare other people, if they are
    [release] = SourceLedger(LEDGER, tmp_path).releases()  # nothing more recorded
    assert release.context["account"] == PROJECT


def test_fit_after_train_is_charged_to_the_same_account(tmp_path, monkeypatch):
    from dpfair.api import fit

    monkeypatch.chdir(tmp_path)
    frame = _table()
    frame.to_csv("loans.csv", index=False)
    _params(tmp_path, {"loans": _declare("loans.csv")}, "loans")
    _train()
    one = _one_run_epsilon(tmp_path)
    net = torch.nn.Linear(2, 2)
    options = {"numeric_ranges": {"age": [18, 90], "income": [0, 100]}, "categories": {}}
    with pytest.raises(BudgetExceededError, match="spent so far on these people"):
        fit(net, frame.drop(columns=["person"]), target="y", protected="region", sigma=1.0,
            epochs=1, batch_size=50, data_options=options,
            budget={"lifetime_epsilon": one * 1.2}, root=tmp_path)
    assert len(SourceLedger(LEDGER, tmp_path).releases()) == 1


def test_fit_refuses_a_fitted_transform_without_the_allowance(tmp_path):
    from dpfair.api import fit

    frame = _table().drop(columns=["person"])
    net = torch.nn.Linear(2, 2)
    where = {"ledger": str(tmp_path / "ledger.sqlite")}
    with pytest.raises(PrivacyError, match="budget.allow_fitted_preprocessing"):
        fit(net, frame, target="y", protected="region", sigma=1.0, epochs=1, batch_size=50,
            budget=where)
    assert SourceLedger(where["ledger"]).releases() == []
    result = fit(net, frame, target="y", protected="region", sigma=1.0, epochs=1,
                 batch_size=50, budget={**where, "allow_fitted_preprocessing": True})
    assert not result.preprocessor.data_independent


def test_a_search_rerun_that_releases_all_trials_is_a_new_charge(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _table().to_csv("loans.csv", index=False)
    _params(tmp_path, {"loans": _declare("loans.csv")}, "loans")
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
    assert out.exit_code == 0, out.output
    [selected] = SourceLedger(LEDGER, tmp_path).releases()
    # the same study, now releasing every trial: over a lifetime that fits one search only
    _params(tmp_path, {"loans": _declare("loans.csv")}, "loans",
            budget={"lifetime_epsilon": selected.epsilon * 1.05},
            tuning={"release": "all_trials"})
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
    assert out.exit_code == 3, out.output
    assert "K = " not in out.output  # nothing of the trials was printed
    # with room in the lifetime budget it is charged, as another release of the search
    _params(tmp_path, {"loans": _declare("loans.csv")}, "loans",
            tuning={"release": "all_trials"})
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
    assert out.exit_code == 0, out.output
    first, second = SourceLedger(LEDGER, tmp_path).releases()
    assert first.context["study"].endswith("release=selected")
    assert second.context["study"].endswith("release=all_trials")
    assert second.status == "released" and second.counts


def test_unnoised_validation_scores_need_their_allowance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _table().to_csv("loans.csv", index=False)
    _params(tmp_path, {"loans": _declare("loans.csv")}, "loans",
            tuning={"score_privacy": "public_validation"})
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "p"])
    assert out.exit_code == 3, out.output
    assert "budget.allow_unnoised_validation_scores" in " ".join(out.output.split())
    assert SourceLedger(LEDGER, tmp_path).releases() == []
    _params(tmp_path, {"loans": _declare("loans.csv")}, "loans",
            budget={"allow_unnoised_validation_scores": True},
            tuning={"score_privacy": "public_validation"})
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "p"])
    assert out.exit_code == 0, out.output
    assert "validation scores released without noise" in " ".join(out.output.split())


def test_a_person_unit_is_enforced_and_charged_for_its_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    frame = _table()
    frame.loc[:99, "person"] = [f"p{i // 2}" for i in range(100)]  # some hold two rows
    frame.to_csv("loans.csv", index=False)
    one_row = {"unit": "person", "max_rows_per_person": 1}
    _params(tmp_path, {"loans": _declare("loans.csv", id_column="person",
                                         privacy_unit=one_row)}, "loans")
    text = _train(expect=2)
    assert "holds more rows than privacy_unit.max_rows_per_person: 1" in text
    assert not Path(LEDGER).exists() or SourceLedger(LEDGER, tmp_path).releases() == []
    two_rows = {"unit": "person", "max_rows_per_person": 2}
    _params(tmp_path, {"loans": _declare("loans.csv", id_column="person",
                                         privacy_unit=two_rows)}, "loans")
    text = _train()
    assert "protecting one person by person (up to 2 rows)" in text
    [release] = SourceLedger(LEDGER, tmp_path).releases()
    row_event, rows = accounting.group_size(release.dp_event())
    assert rows == 2
    assert release.epsilon == pytest.approx(_group_oracle(row_event, 2, 1e-5), rel=1e-3)
    assert release.epsilon > accounting.epsilon(row_event, 1e-5)


def _group_oracle(event: dp_event.DpEvent, k: int, delta: float) -> float:
    """Dwork & Roth's group privacy from dp_accounting's own PLD accountant: the smallest
    k·ε_1 over a grid of δ_1 with δ_1 Σ_{i<k} e^{iε_1} ≤ δ."""
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant(pld_lib.NeighborRel.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    acc.compose(event)
    best = np.inf
    for d1 in np.geomspace(delta / k * 1e-6, delta / k, 400):
        e1 = acc.get_epsilon(d1)
        if d1 * sum(np.exp(i * e1) for i in range(k)) <= delta:
            best = min(best, k * e1)
    return best


def test_group_privacy_is_sound_for_a_gaussian(tmp_path):
    """A Gaussian of sensitivity 1 changed in k rows is a Gaussian of sensitivity k: its exact
    ε is a floor no valid group bound may go under."""
    sigma, k, delta = 4.0, 3, 1e-5
    grouped = accounting.spend(accounting.with_group(dp_event.GaussianDpEvent(sigma), k), delta)
    exact = accounting.epsilon(dp_event.GaussianDpEvent(sigma / k), delta)
    assert grouped.epsilon >= exact
    assert grouped.epsilon == pytest.approx(
        _group_oracle(dp_event.GaussianDpEvent(sigma), k, delta), rel=2e-3)
    assert "group privacy over 3 rows" in grouped.accountant


def test_ids_that_prove_two_versions_disjoint_keep_declared_accounts_apart(tmp_path):
    from dpfair.config.sections import BudgetSection
    from dpfair.data import load_dataset
    from dpfair.data.registry import parse_options
    from dpfair.ledger import PrivacyGate

    _table(300, 0).to_csv(tmp_path / "eu.csv", index=False)
    us = _table(300, 1)
    us["person"] = [f"q{i}" for i in range(300)]
    us.to_csv(tmp_path / "us.csv", index=False)
    gate = PrivacyGate(BudgetSection(ledger=str(tmp_path / "ledger.sqlite")))
    event = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.05, 300)

    def version(name: str, file: str, account: str):
        raw = _declare(str(tmp_path / file), id_column="person",
                       privacy_unit={"account": account})
        return gate.identify(name, load_dataset(name, raw), parse_options(name, raw))

    eu = version("eu", "eu.csv", "eu")
    gate.reserve(eu, event, 1e-5)
    us_version = version("us", "us.csv", "us")
    assert "checked on its person ids" in us_version.account.declaration
    assert gate.spent(us_version, 1e-5) == 0.0
    gate.reserve(us_version, event, 1e-5)
    eu_release, us_release = gate.ledger.releases()
    assert set(eu_release.accounts).isdisjoint(us_release.accounts)


def test_a_ledger_from_before_named_accounts_keeps_every_charge(tmp_path):
    """Two private sources in accounts of their own (the old rule) join the project account:
    a third source's release is checked against both spends composed."""
    where = str(tmp_path / "ledger.sqlite")
    event = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.02, 200)
    old = SourceLedger(where)
    old.reserve("loans", "v1", event, 1e-5)
    old.reserve("cards", "w1", event, 1e-5, account=_version_account("cards"))
    engine = sa.create_engine(f"sqlite:///{where}")
    with engine.begin() as conn:  # as an earlier dpfair wrote it: own accounts, no names
        conn.execute(sa.text("DELETE FROM dpfair_meta WHERE key = 'accounts'"))
        conn.execute(sa.text("UPDATE dpfair_releases SET accounts = '[7]' WHERE source = 'cards'"))
        conn.execute(sa.text("UPDATE dpfair_versions SET accounts = '[7]' WHERE source = 'cards'"))
    ledger = SourceLedger(where)
    two = accounting.epsilon(dp_event.ComposedDpEvent([event, event]), 1e-5)
    assert ledger.spent("other", "x1", 1e-5) == pytest.approx(two, rel=1e-6)
    with pytest.raises(BudgetExceededError):
        ledger.reserve("other", "x1", event, 1e-5, lifetime_epsilon=two * 1.01)
    ledger.reserve("other", "x1", event, 1e-5)
    names = json.loads(engine.connect().execute(
        sa.text("SELECT value FROM dpfair_meta WHERE key = 'accounts'")).scalar())
    assert PROJECT in names


def _version_account(source: str):
    from dpfair.ledger.accounts import account_of

    return account_of(source, None, "w1", disjoint=True)


def test_a_person_unit_splits_whole_people():
    from dpfair.data.options import HoldoutOptions
    from dpfair.data.splits import split_index

    rng = np.random.default_rng(0)
    people = np.repeat([f"p{i}" for i in range(300)], rng.integers(1, 4, 300))
    y, g = rng.integers(0, 2, len(people)), rng.integers(0, 2, len(people))
    splits = split_index(y, g, HoldoutOptions(test_fraction=0.2, validation_fraction=0.1),
                         people)
    owners = [set(people[idx]) for idx in splits]
    assert sum(len(idx) for idx in splits) == len(people)
    assert all(a.isdisjoint(b) for i, a in enumerate(owners) for b in owners[i + 1:])
    assert 0.1 < len(owners[2]) / 300 < 0.3  # a test fraction of the people
