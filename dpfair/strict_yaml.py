"""YAML read strictly: a key given twice in one mapping is an error, never "the last wins".

PyYAML's ``safe_load`` keeps the last of duplicate keys silently (``sigma: 1`` then
``sigma: 0.3`` gives 0.3 and a different ε); :func:`safe_load_unique` raises a
``yaml.constructor.ConstructorError`` naming the key and both lines instead, which callers turn
into their own clear error like any other YAML error.
"""

from __future__ import annotations

from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class names it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"the key {key!r} is given twice (first at line {first.start_mark.line + 1}"
                    "); keep one (YAML would silently use the last)", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing duplicate keys (module doc)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
