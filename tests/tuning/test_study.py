"""The Optuna storage format: a study written by the single-module ``dpfair/tuning.py`` (the
fixture ``fixtures/v1_study.db``, see ``fixtures/README.md``) resumes with this package in
reproducible mode, and a new reproducible study is written exactly as that version wrote it;
a default study adds one fingerprint key. Creating a study: one K, whoever opens it."""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest

from dpfair import accounting
from dpfair.errors import TuningError
from dpfair.tuning.trial_records import trial_row
from tests.tuning.conftest import BASE, SPACE, cfg, fast_tune, prepare_untrained

FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "v1_study.json").read_text())


def v1_settings(db: Path) -> dict:
    """The settings the fixture was made with (make_v1_study.py): that code drew K and the
    scores from the seed, as ``reproducible`` does."""
    return {
        "reproducible": True,
        "mode": "tnb",
        "mu": 3.0,
        "study_name": "v1",
        "heartbeat_interval": 1,
        "seed": EXPECTED["seed"],
        "space": SPACE,
        "storage": f"sqlite:///{db}",
    }


def test_v1_study_resumes_with_the_same_k_and_ledger(tmp_path):
    db = tmp_path / "study.db"
    shutil.copy(FIXTURES / "v1_study.db", db)
    written = optuna.load_study(study_name="v1", storage=f"sqlite:///{db}").get_trials()
    assert [trial_row(t, EXPECTED["K"], "tnb") for t in written] == EXPECTED["rows_written"]

    res = fast_tune(v1_settings(db))

    want = EXPECTED["resumed"]
    assert res.K == EXPECTED["K"] == 4 and res.n_runs == 4
    assert res.trials[:2] == EXPECTED["rows_written"]  # the old runs, untouched
    assert len(res.trials) == len(want["trials"])
    # the runs of this session: the configurations, seeds and events the old code drew
    for got, old in zip(res.trials[2:], want["trials"][2:], strict=True):
        assert {**got, "host": None, "score": None} == {**old, "host": None, "score": None}
        assert got["score"] == pytest.approx(old["score"], rel=1e-9)
    assert res.best_trial == want["best_trial"] and res.best_params == want["best_params"]
    assert res.best_score == pytest.approx(want["best_score"], rel=1e-9)
    assert res.event_json == want["event_json"] and res.run_event_json == want["run_event_json"]
    # the fixture's ε are RDP's (the accountant of the code that wrote it): the same events
    # give them again under RDP, and the tightest valid figure now reported is below
    search = accounting.event_from_json(res.event_json)
    run = accounting.event_from_json(res.run_event_json)
    delta = BASE["delta"]  # the search's δ: the base run's (tuning.delta unset)
    assert accounting.rdp_epsilon(search, delta) == pytest.approx(want["epsilon_search"],
                                                                  rel=1e-12)
    assert accounting.rdp_epsilon(run, delta) == pytest.approx(want["epsilon_training"],
                                                               rel=1e-12)
    assert res.epsilon_search == accounting.epsilon(search, delta) < want["epsilon_search"]
    assert res.epsilon_training == accounting.epsilon(run, delta) < want["epsilon_training"]
    study = optuna.load_study(study_name="v1", storage=f"sqlite:///{db}")
    assert study.user_attrs == EXPECTED["study_user_attrs"]


def test_new_study_has_the_v1_attrs(tmp_path):
    job = prepare_untrained(v1_settings(tmp_path / "new.db"))
    assert job.k == EXPECTED["K"]
    study = optuna.load_study(study_name="v1", storage=f"sqlite:///{tmp_path / 'new.db'}")
    attrs, want = dict(study.user_attrs), dict(EXPECTED["study_user_attrs"])
    for key in ("dpfair.epsilon_training", "dpfair.epsilon_search"):  # RDP's in the fixture
        assert attrs.pop(key) < want.pop(key)  # the tightest valid figure is below
    # added since v1: the secret seed of the configuration draws (the seed itself in a
    # reproducible study, as here) and the study's random id (its identity in the ledger)
    assert attrs.pop("dpfair.config_seed") == v1_settings(tmp_path / "new.db")["seed"]
    assert len(attrs.pop("dpfair.study_uid")) == 32
    assert attrs == want  # fingerprint, K, event


def test_fingerprint_marks_only_secret_randomness(tmp_path):
    """A reproducible study keeps the v1 fingerprint; a default one adds one key."""
    secret = prepare_untrained({**v1_settings(tmp_path / "new.db"), "reproducible": False})
    attrs = optuna.load_study(study_name="v1", storage=f"sqlite:///{tmp_path / 'new.db'}")
    stored = json.loads(attrs.user_attrs["dpfair.fingerprint"])
    assert stored == {
        **json.loads(EXPECTED["study_user_attrs"]["dpfair.fingerprint"]),
        "secret_randomness": True,
    }
    assert attrs.user_attrs["dpfair.K"] == secret.k


def test_concurrent_creators_agree_on_one_secret_k(tmp_path):
    """Only the process that created the study draws K; the others wait and read it."""
    c = cfg(tmp_path, mu=10.0, storage=f"journal:{tmp_path / 'journal.log'}")
    start = threading.Barrier(6)

    def open_study(_: int) -> int:
        start.wait()
        return prepare_untrained(c).k

    with ThreadPoolExecutor(6) as pool:
        ks = list(pool.map(open_study, range(6)))
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log"))
    )
    assert ks == [optuna.load_study(study_name="t", storage=storage).user_attrs["dpfair.K"]] * 6


def test_a_study_without_k_is_refused(tmp_path):
    c = cfg(tmp_path, grace_period=1)
    optuna.create_study(study_name="t", storage=c["storage"])  # not by dpfair: no attrs
    with pytest.raises(TuningError, match="exists but holds no K"):
        prepare_untrained(c)
