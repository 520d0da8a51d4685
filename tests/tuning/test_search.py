"""Searches in one process: errors before any training, the budget, the ledger of a search,
resuming, every mode, and a search over dpfair.training.train."""

from __future__ import annotations

import json
import math

import numpy as np
import optuna
import pytest
from dp_accounting import dp_event

from dpfair import accounting, tuning
from dpfair.tuning.study import CONFIG_SEED
from tests.tuning.conftest import (
    BASE,
    SPACE,
    cfg,
    fast_event,
    fast_train,
    fast_tune,
    make_dataset,
    never_train,
    prepare_untrained,
    seed_with_k,
)

# --------------------------------------------------------------------- errors before training


@pytest.mark.parametrize(
    "override, match",
    [
        ({"space": {"lr": [0.1], "lrr": [1]}}, "'lrr' is not a hyperparameter.*did you mean"),
        ({"space": {"lr": []}}, "space.lr: the list of values is empty"),
        ({"eta": -1.0}, "eta must be a finite number > -1"),
        ({"eta": -3.0}, "eta must be"),
        ({"mu": 0.5}, r"mu \(the mean number of runs\) must be between 1 and 1000"),
        ({"budget_epsilon": 0.5}, r"would spend epsilon [\d.]+ \((PLD|RDP).*\) at delta "
                                  r".*one training run alone: [\d.]+, (PLD|RDP).* over the "
                                  r"budget 0.5"),
        ({"mode": "binomial", "n_runs": 4}, "mode 'binomial' needs p"),
        ({"mode": "binomial", "n_runs": 4, "pp": 0.5}, "tuning.pp.*did you mean 'p'"),
        ({"mode": "grid", "budget_epsilon": 100.0}, "grid mode has no privacy guarantee"),
        ({"mode": "fixed"}, "mode 'fixed' needs n_runs"),
        ({"workers": 2}, "several workers need storage"),
        ({"typo_key": 1}, "tuning.typo_key"),
    ],
)
def test_errors_before_any_training(tmp_path, override, match):
    with pytest.raises(tuning.TuningError, match=match):
        fast_tune(cfg(tmp_path, **override), train=never_train)
    assert not (tmp_path / "study.db").exists()  # refused before even creating the study


def test_unknown_space_key_says_did_you_mean_and_the_allowed_names(tmp_path):
    c = cfg(tmp_path, space={"lrr": [1]})
    with pytest.raises(tuning.TuningError) as err:
        prepare_untrained(c)
    assert str(err.value) == (
        "space.lrr: 'lrr' is not a hyperparameter of method 'dpsgd' or of training; did you "
        "mean 'lr'? (allowed: clip, epochs, batch_size, lr, sigma)"
    )


@pytest.mark.parametrize(
    "space, match",
    [
        ({"C": [-1]}, r"space\.C: the value -1 is invalid \(.*greater than 0.*\); list only"),
        ({"lr": ["fast"]}, r"space\.lr: the value 'fast' is invalid \(.*valid number"),
    ],
)
def test_space_values_are_validated_by_the_configs_they_make(tmp_path, space, match):
    from dpfair.training import TrainConfig

    base = TrainConfig(method={"name": "dpsgd"}, model={"name": "logistic_regression"},
                       epochs=1, batch_size=50, sigma=1.0)
    with pytest.raises(tuning.TuningError, match=match):
        tuning.prepare(base.method, base, make_dataset(), cfg(tmp_path, space=space),
                       never_train)
    assert not (tmp_path / "study.db").exists()


def test_empty_validation_split_is_refused_naming_validation_fraction(tmp_path):
    ds = make_dataset()
    ds.val = type(ds.val)(x=ds.val.x[:0], y=ds.val.y[:0], g=ds.val.g[:0])
    with pytest.raises(tuning.TuningError) as err:
        fast_tune(cfg(tmp_path), ds, train=never_train)
    assert "empty validation split" in str(err.value)
    assert "set datasets.synthetic.validation_fraction above 0" in str(err.value)
    assert not (tmp_path / "study.db").exists()


def test_budget_is_checked_before_any_run(tmp_path):
    ds = make_dataset()
    ok = cfg(tmp_path, mu=2.0, budget_epsilon=1e6)
    job = prepare_untrained(ok, ds)
    assert job.epsilon_search > job.epsilon_training > 0
    with pytest.raises(tuning.BudgetExceededError):
        prepare_untrained({**ok, "budget_epsilon": job.epsilon_search * 0.99}, ds)


# ---------------------------------------------------------------------- in-process searches


def test_tnb_search_ledger_and_resume(tmp_path):
    ds = make_dataset()
    seed = seed_with_k(3, 6, mu=4.0)
    c = cfg(tmp_path, mu=4.0, seed=seed, heartbeat_interval=1, reproducible=True)
    seen = []
    res = fast_tune(c, ds, on_trial=lambda r, _: seen.append(r))
    k = tuning.draw_k(tuning.TuningConfig(mu=4.0, seed=seed, reproducible=True), 1)
    assert [r["number"] for r in seen] == list(range(k)) and seen[0]["score"] is not None
    assert res.K == k and res.n_runs == k
    runs = [r for r in res.trials if r["ledger"] == "run"]
    assert len(runs) == k and all(r["state"] == "COMPLETE" for r in runs)
    assert all(r["tuning_privacy"] == "tnb" for r in res.trials)
    assert res.tuning_privacy == "tnb" and res.score_privacy == "noisy" and res.reproducible
    assert res.best_score == max(r["score"] for r in runs)
    assert res.best_config["lr"] == res.best_params["lr"]
    assert res.best_config["method"]["clip"] == res.best_params["clip"]
    ev = accounting.event_from_json(res.event_json)
    assert isinstance(ev, dp_event.RepeatAndSelectDpEvent) and ev.mean == 4.0 and ev.shape == 0.0
    assert res.epsilon_search == pytest.approx(accounting.epsilon(ev, 1e-5))
    assert res.epsilon_search > res.epsilon_training
    for r in runs:
        assert accounting.event_from_json(r["event"]) == fast_event(BASE, ds)
    assert res.best_result is not None
    # resume: nothing new runs, K is read back
    again = fast_tune(c, ds, train=never_train)
    assert again.K == k and again.n_runs == k and len(again.trials) == len(res.trials)
    # other settings on the same study (secret randomness included): refused
    for other in ({**c, "mu": 5.0}, {**c, "reproducible": False}):
        with pytest.raises(tuning.TuningError, match="other tuning settings"):
            fast_tune(other, ds, train=never_train)


def test_grid_fixed_public_and_crashes(tmp_path):
    ds = make_dataset()
    res = fast_tune(cfg(tmp_path, mode="grid", study_name="g"), ds)
    assert res.K == 6 and res.n_runs == 6 and res.tuning_privacy == "none"
    assert res.epsilon_search == math.inf and res.event_json is None
    assert {(r["params"]["lr"], r["params"]["clip"]) for r in res.trials} == {
        (a, b) for a in SPACE["lr"] for b in SPACE["clip"]
    }
    assert all(r["tuning_privacy"] == "none" for r in res.trials)

    c = cfg(
        tmp_path,
        mode="fixed",
        n_runs=3,
        study_name="f",
        score="loss",
        score_privacy="public_validation",
        space={"lr": [0.1, 0.5], "crash": [True]},
    )
    res = fast_tune(c, ds, allowed=["lr", "clip", "crash"])
    # every run crashed: all 3 counted, none selected
    assert res.n_runs == 3 and res.best_config is None
    assert all(r["state"] == "FAIL" and "planned crash" in r["error"] for r in res.trials)
    assert res.score_privacy == "public_validation" and res.tuning_privacy == "fixed"
    ev = accounting.event_from_json(res.event_json)
    assert ev == dp_event.SelfComposedDpEvent(fast_event(BASE, ds), 3)  # no score event


def test_poisson_k_zero_runs_nothing(tmp_path):
    seed = next(
        s
        for s in range(100)
        if tuning.draw_k(tuning.TuningConfig(mode="poisson", mu=1.0, seed=s, reproducible=True), 1)
        == 0
    )
    c = cfg(tmp_path, mode="poisson", mu=1.0, seed=seed, reproducible=True)
    res = fast_tune(c, train=never_train)
    assert res.K == 0 and res.n_runs == 0 and res.best_config is None and res.trials == []
    ev = accounting.event_from_json(res.event_json)
    assert ev.shape == math.inf and res.tuning_privacy == "poisson"


def test_binomial_search_runs_its_k_and_is_accounted_by_the_profile_bound(tmp_path):
    c = cfg(tmp_path, mode="binomial", n_runs=4, p=0.5, seed=3, reproducible=True)
    k = tuning.draw_k(tuning.TuningConfig.model_validate(c), 1)
    res = fast_tune(c)
    assert res.K == res.n_runs == k and res.tuning_privacy == "binomial"
    ev = accounting.event_from_json(res.event_json)
    assert isinstance(ev, accounting.BinomialSelectDpEvent) and (ev.n, ev.p) == (4, 0.5)
    spend = accounting.spend(ev, res.delta)
    assert spend.accountant == accounting.ACCOUNTANT_PROFILE
    assert res.epsilon_search == spend.epsilon < accounting.rdp_epsilon(ev, res.delta)


def test_secret_randomness_by_default(tmp_path):
    """Fresh studies with one seed draw their own K; the same runs (configurations and
    training seeds are public, seeded draws) get other score noise. Reproducible: the seeded
    streams, K of SeedSequence([seed, 75]) and scores of SeedSequence([seed, 78, n])."""
    ds = make_dataset()

    def prepare(name, **kw):
        c = cfg(tmp_path, study_name=name, mu=10.0, **kw)
        return prepare_untrained(c, ds)

    def search(name, **kw):
        c = cfg(tmp_path, study_name=name, mode="fixed", n_runs=3, seed=5, **kw)
        return fast_tune(c, ds)

    jobs = [prepare(f"s{i}") for i in range(20)]
    assert len({job.k for job in jobs}) > 1  # P(20 equal) < 1e-10, see test_k_draw
    # K is kept in the study (the private working state) and read back
    assert all(prepare(job.study_name).k == job.k for job in jobs)
    a, b = search("a"), search("b")
    assert not a.reproducible
    # the configuration draws are seeded by a secret of the study, not by the logged seed
    seeds = {optuna.load_study(study_name=n, storage=f"sqlite:///{tmp_path / 'study.db'}")
             .user_attrs[CONFIG_SEED] for n in ("a", "b")}
    assert len(seeds) == 2 and 5 not in seeds
    assert all(x["score"] != y["score"] for x, y in zip(a.trials, b.trials, strict=True))
    c, d = search("c", reproducible=True), search("d", reproducible=True)
    assert c.reproducible and [r["config"] for r in c.trials] == [r["config"] for r in d.trials]
    for row, other in zip(c.trials, d.trials, strict=True):
        rng = np.random.default_rng(np.random.SeedSequence([5, 78, row["number"]]))
        pred = fast_train(json.loads(row["config"]), ds).val_predictions
        want = tuning.release_score(pred, "macro_accuracy", 2, 2, 10.0, 10.0, rng)
        assert row["score"] == other["score"] == want


# ----------------------------------------------------------- dpfair.training.train


def test_with_dpfair_training(tmp_path):
    try:
        import torch

        from dpfair.data.dataset import GroupedDataset, Split
        from dpfair.methods import MethodConfig  # noqa: F401
        from dpfair.training import TrainConfig
    except ImportError as exc:
        pytest.skip(f"dpfair.training not available yet: {exc}")
    rng = np.random.default_rng(0)

    def split(m):
        x = torch.tensor(rng.normal(size=(m, 4)), dtype=torch.float32)
        y = (x[:, 0] > 0).long()
        g = torch.tensor(rng.random(m) < 0.3).long()
        return Split(x, y, g)

    ds = GroupedDataset("toy", split(300), split(100), split(100), ["a", "b"], ["g0", "g1"])
    base = TrainConfig.model_validate(
        {
            "method": {"name": "dpsgd"},
            "model": {"name": "logistic_regression"},
            "epochs": 1,
            "batch_size": 50,
            "lr": 0.5,
            "sigma": 1.0,
            "delta": 1e-5,
            "progress": False,
            "device": "cpu",
        }
    )
    c = cfg(tmp_path, mode="fixed", n_runs=2, space={"lr": [0.1, 1.0]}, study_name="real")
    res = tuning.tune(base.method, base, ds, c)
    assert res.n_runs == 2 and res.best_config is not None
    # a default search trains with secret noise, a reproducible one reproducibly
    assert not res.reproducible and not res.best_config.reproducible
    assert res.best_result is not None and not res.best_result.reproducible
    seeded = tuning.tune(base.method, base, ds, {**c, "study_name": "seeded", "reproducible": True})
    assert seeded.best_config.reproducible and seeded.best_result.reproducible
    assert res.privacy_guarantee == "proven"
    assert all(r["privacy_guarantee"] == "proven" for r in res.trials)
    assert res.best_result is not None and res.best_result.epsilon == pytest.approx(
        res.epsilon_training
    )


def test_a_search_subject_to_a_fairness_constraint_runs_and_is_accounted(tmp_path):
    """Accuracy subject to demographic-parity ratio >= 0.8, end to end: the search is
    accounted like any other (the score's table has sensitivity 1, the same event), and the
    selected run's released score is an accuracy, or an accuracy - 1 if none met the bound."""
    plain = fast_tune(cfg(tmp_path, mode="fixed", n_runs=3, seed=1, reproducible=True,
                          study_name="plain"))
    c = cfg(tmp_path, mode="fixed", n_runs=3, seed=1, reproducible=True, score="accuracy",
            constraint={"measure": "demographic_parity_ratio", "at_least": 0.8},
            study_name="fair")
    res = fast_tune(c)
    assert res.K == 3
    assert res.epsilon_search == pytest.approx(plain.epsilon_search)
    assert -1.0 <= res.best_score <= 1.0
