"""dpfair.lazy: a module stood for by lazy_module is imported when an attribute is first read."""

from __future__ import annotations

import sys

from dpfair.lazy import lazy_module


def test_a_lazy_module_is_imported_on_first_use(tmp_path, monkeypatch) -> None:
    (tmp_path / "slow_to_import.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_to_import", raising=False)
    module = lazy_module("slow_to_import")
    assert "slow_to_import" not in sys.modules and "imported on first use" in repr(module)
    assert module.VALUE == 42
    assert sys.modules["slow_to_import"].VALUE == 42
    monkeypatch.delitem(sys.modules, "slow_to_import")


def test_the_method_rules_load_torch_only_when_they_run() -> None:
    """A method module's ``torch`` is the real module once used (the rules' arithmetic)."""
    import torch

    from dpfair.methods import dpsgd

    assert dpsgd.torch.minimum is torch.minimum
