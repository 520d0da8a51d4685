"""A registered own-architecture model loads anywhere (issue 27): it carries its code (the
user's module and dpfair, MLflow ``code_paths``) and pins installable packages; a fresh process
in another directory, with neither on its path, loads it and predicts."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires

import pytest

from dpfair.tracking.model_export import LOAD_REQUIREMENTS, model_location
from dpfair.tracking.model_registry import register
from tests.tracking.conftest import predict_elsewhere, train_and_log

MODULE = '''
import torch.nn as nn


def make_net(input_shape, n_classes, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], width), nn.Tanh(),
                         nn.Linear(width, n_classes))
'''



@pytest.mark.slow
def test_registered_import_model_predicts_from_a_fresh_process_elsewhere(tmp_path, monkeypatch):
    from dpfair.data.tabular_frame import dataset_from_frame
    from tests.data.own_tables import PROTECTED, TARGET, loans_frame

    project = tmp_path / "project"
    project.mkdir()
    (project / "travelling_models.py").write_text(MODULE)
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    frame = loans_frame(400)
    dataset = dataset_from_frame(frame, target=TARGET, protected=PROTECTED, name="loans",
                                 positive_label="ja", missing="impute")
    tracking, run_id, uri = train_and_log(
        tmp_path, dataset, {"name": "import", "target": "travelling_models:make_net"}, "loans")
    registered = register(tracking, "travelling", uri, run_id, {})
    location = model_location(tracking, f"{registered['name']}/{registered['version']}")
    requirements = [line.split("==")[0] for line in
                    (tmp_path / "art").rglob("requirements.txt").__next__().read_text().split()]
    assert "dpfair" not in requirements and "torch" in requirements
    frame.head(30).to_csv(tmp_path / "rows.csv", index=False)

    found = predict_elsewhere(location, tmp_path / "rows.csv", tmp_path / "elsewhere",
                              "travelling_models")
    assert len(found["predictions"]) == 30
    assert set(found["predictions"]) <= set(dataset.class_names)
    # both imported from the model's own code folder, not from the project or the checkout
    assert "/code/" in found["module"] and "/code/" in found["dpfair"]
    assert str(project) not in found["module"]


def test_load_requirements_cover_what_loading_a_model_imports():
    """Every declared dependency of dpfair that importing the model's module loads is pinned,
    or installed by a pinned one."""
    script = ("import sys, dpfair.tracking.model_export; "
              "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    loaded = set(done.stdout.split())
    dists = packages_distributions()
    used = {_norm(d) for top in loaded for d in dists.get(top, [])} & _needs("dpfair", depth=1)
    pinned = set().union(*(_needs(r) for r in LOAD_REQUIREMENTS))  # with what they install
    assert used - {"dpfair"} <= pinned, used - pinned  # dpfair: its code travels


def _norm(name: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", name.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _needs(dist: str, depth: int = 99) -> set[str]:
    """``dist`` and what installing it installs (its non-extra requirements, recursively)."""
    seen, todo = set(), [(_norm(dist), 0)]
    while todo:
        name, level = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if level == depth:
            continue
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [(_norm(r), level + 1) for r in reqs if "extra ==" not in r]
    return seen
