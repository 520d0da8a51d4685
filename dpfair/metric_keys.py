"""Metric keys MLflow accepts, from any group or class name (a leaf: imports nothing of dpfair).

MLflow allows ``[A-Za-z0-9_-. :/]`` in a metric key and refuses a key that is not a normal path
(``a/../b``, ``a//b``). Group and class names come from a user's columns and may hold any
character, ``/`` and ``..`` included; they are cleaned here, made distinct, and the original
names are kept where the run records its dataset (``public_schema``'s groups and classes, and
the ``dpfair.metric_keys`` tag of :func:`dpfair.tracking.run_log.log_data_input`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SIGNS = (("<=", "le "), (">=", "ge "), ("<", "lt "), (">", "gt "), ("×", "x"), ("/", " "))


def clean_key(name: str) -> str:
    """``name`` in the characters MLflow allows in a metric key (``[A-Za-z0-9_-. :/]``):
    ``"<=50K"`` -> ``"le 50K"``, ``"low (5_4_9)"`` -> ``"low 5_4_9"``, ``"w × Ost"`` ->
    ``"w x Ost"``; a ``/`` becomes a space (one name is one segment of a key)."""
    for sign, word in _SIGNS:
        name = name.replace(sign, word)
    return re.sub(r" {2,}", " ", re.sub(r"[^A-Za-z0-9_\-. :]", "", name)).strip()


def metric_segments(names: Sequence[str]) -> list[str]:
    """One distinct key segment per group or class name (:func:`clean_key`); a name that
    cleans to nothing, to dots only (``..`` would be a path), or to an earlier segment gets its
    id appended (``"id 3"``, ``"a b id 3"``): any value of a user's column is a safe key."""
    out: list[str] = []
    for k, name in enumerate(names):
        seg = clean_key(str(name))
        if not seg.strip("."):
            seg = f"id {k}"
        while seg in out:
            seg = f"{seg} id {k}"
        out.append(seg)
    return out


def renamed(names: Sequence[str], limit: int = 4000) -> dict[str, str]:
    """``{key segment: name}`` for the names :func:`metric_segments` changed, as many as fit in
    ``limit`` characters of JSON (a tag's value is bounded; the full list of names is in the
    run's logged dataset, in the same order as the segments)."""
    out: dict[str, str] = {}
    size = 2
    for seg, name in zip(metric_segments(names), names, strict=True):
        if seg != name:
            size += len(seg) + len(str(name)) + 8
            if size > limit:
                break
            out[seg] = str(name)
    return out
