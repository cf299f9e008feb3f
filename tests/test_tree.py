"""torchlens_core.ir.tree: the container walks every capture, template and file uses."""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any

import pytest

from torchlens_core.ir import tree

Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Box:
    left: Any
    right: Any


def _reference_leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """The walk written the obvious way, recursively, by type."""
    if isinstance(obj, float):
        return [(path, obj)]
    if isinstance(obj, (tuple, list)):
        return [leaf for i, v in enumerate(obj) for leaf in _reference_leaves(v, (*path, i))]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _reference_leaves(v, (*path, k))]
    if isinstance(obj, Box):
        return _reference_leaves(obj.left, (*path, "left")) + _reference_leaves(obj.right, (*path, "right"))
    return []


def _nested(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["leaf", "leaf", "none", "str", "tuple", "list", "dict", "named", "box"] if depth else ["leaf"])
    if kind == "leaf":
        return rng.random()
    if kind == "none":
        return None
    if kind == "str":
        return "s"
    kids = [_nested(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if kind == "tuple":
        return tuple(kids)
    if kind == "list":
        return kids
    if kind == "dict":
        return {f"k{i}": v for i, v in enumerate(kids)}
    if kind == "named":
        return Point(_nested(rng, depth - 1), _nested(rng, depth - 1))
    return Box(_nested(rng, depth - 1), _nested(rng, depth - 1))


@pytest.mark.parametrize("seed", range(40))
def test_leaves_walk_depth_first_in_container_order(seed: int) -> None:
    value = _nested(random.Random(seed), 5)
    found = list(tree.leaves(value, lambda v: isinstance(v, float)))
    assert found == _reference_leaves(value)
    for path, leaf in found:
        assert tree.get(value, path) is leaf


@pytest.mark.parametrize("seed", range(20))
def test_map_leaves_keeps_every_container_type(seed: int) -> None:
    value = _nested(random.Random(seed), 5)
    mapped = tree.map_leaves(lambda v: -v if isinstance(v, float) else v, value)
    assert [(p, -v) for p, v in _reference_leaves(value)] == _reference_leaves(mapped)
    assert type(mapped) is type(value)


def test_leaves_is_lazy() -> None:
    looked_at = []

    def is_leaf(v: Any) -> bool:
        looked_at.append(v)
        return isinstance(v, float)

    first = next(tree.leaves([[1.5, 2.5], [3.5] * 100], is_leaf))
    assert first == ((0, 0), 1.5)
    assert len(looked_at) == 3  # the outer list, the first inner list, its first element


def test_a_container_holding_itself_is_an_error_not_a_hang() -> None:
    loop: list[Any] = [1.0]
    loop.append(loop)
    with pytest.raises(RecursionError, match="holds itself"):
        list(tree.leaves(loop, lambda v: isinstance(v, float)))


def test_dataclass_fields_follow_the_class() -> None:
    @dataclasses.dataclass
    class Pair:
        a: Any
        b: Any

    assert tree.children(Pair(1, 2)) == [("a", 1), ("b", 2)]

    @dataclasses.dataclass
    class Triple(Pair):
        c: Any

    assert tree.children(Triple(1, 2, 3)) == [("a", 1), ("b", 2), ("c", 3)]
    assert tree.children(Pair) is None  # the class itself is a leaf
