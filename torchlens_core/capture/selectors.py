"""Selectors: which ops to save, halt at, or intervene on — the same on every backend.

A selector is a small predicate tree over op records::

    tl.func("relu") & tl.in_module("layer2")
    tl.func("conv2d") & tl.followed_by(tl.func("relu"))
    tl.module("features.6") | ~tl.where(lambda op: op.num_passes > 1)

``trace.find(selector)`` returns the matching ops in execution order. Input and
output nodes are never selected: selectors choose operations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.ir.errors import ArgumentTypeError, LabelNotFoundError, PatternError, closest, shown

if TYPE_CHECKING:
    from torchlens_core.capture.builder import TraceBuilder
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace


class Selector:
    """Base of every selector; combine with ``&``, ``|`` and ``~``."""

    def test(self, op: OpRecord, trace: Trace) -> bool:
        """Does ``op`` of a finished trace match?"""
        raise NotImplementedError

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        """While capturing: does ``op`` match — True, False, or None for "not known yet"?"""
        return None

    def __and__(self, other: Selector) -> Selector:
        return AllOf((self, _check(other)))

    def __or__(self, other: Selector) -> Selector:
        return AnyOf((self, _check(other)))

    def __invert__(self) -> Selector:
        return Not(self)

    def find(self, trace: Trace) -> list[OpRecord]:
        return [op for op in trace.ops if op.kind == "op" and self.test(op, trace)]


def _check(other: object) -> Selector:
    if not isinstance(other, Selector):
        raise ArgumentTypeError(
            f"selectors combine with selectors such as tl.func('relu'), not {type(other).__name__} ({shown(other)})"
        )
    return other


def _name(value: object, what: str, example: str) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(
            f"{what} takes a string such as {example!r}, not {type(value).__name__} ({shown(value)})"
        )
    return value


def split_pass(path: str) -> tuple[str, int | None]:
    base, sep, n = path.rpartition(":")
    return (base, int(n)) if sep and n.isdigit() else (path, None)


@attrs.frozen(repr=False)
class Func(Selector):
    """Ops whose function name matches ``pattern`` (a name or a regex; ``relu`` also matches ``relu_``)."""

    pattern: str
    # a plain name is matched as a string: compiling a regex costs time in its length (a pasted blob: seconds)
    _regex: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)

    def __repr__(self) -> str:
        return f"tl.func({self.pattern!r})"

    def __attrs_post_init__(self) -> None:
        _name(self.pattern, "tl.func", "relu")
        regex = None
        if re.escape(self.pattern) != self.pattern:
            try:
                regex = re.compile(f"(?:{self.pattern})_?")
            except re.error as exc:
                raise PatternError(
                    f"tl.func({shown(self.pattern)}): not a valid regular expression ({exc}); "
                    f"escape special characters with re.escape() to match a name "
                    f"literally"
                ) from None
        object.__setattr__(self, "_regex", regex)

    def test(self, op: OpRecord, trace: Trace | TraceBuilder | None) -> bool:  # reads the op alone
        if self._regex is None:
            name = op.func_name
            return name == self.pattern or (name[-1:] == "_" and name[:-1] == self.pattern)
        return self._regex.fullmatch(op.func_name) is not None

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        return self.test(op, builder)


@attrs.frozen(repr=False)
class Module(Selector):
    """The op(s) a module returned: ``"layer3"`` (every pass) or ``"layer3:2"``."""

    path: str
    path_pass: tuple[str, int | None] = attrs.field(init=False, repr=False, eq=False)

    def __repr__(self) -> str:
        return f"tl.module({self.path!r})"

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "path_pass", split_pass(_name(self.path, "tl.module", "layer3")))

    def test(self, op: OpRecord, trace: Trace | TraceBuilder | None) -> bool:  # reads the op alone
        base, n = self.path_pass
        for returned in op.module_outputs:
            path, k = split_pass(returned)
            if path == base and (n is None or k == n):
                return True
        return False

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        base, n = self.path_pass
        inside = [(p, k) for p, k in op.module_passes if p == base and (n is None or k == n)]
        if not inside:  # outside the module: picked only if some pass of it returned this op's value
            return bool(op.module_outputs) and self.test(op, None)
        if all(entry in builder.closed_passes for entry in inside):
            return self.test(op, builder)
        return None  # its module is still running: it may yet be returned


@attrs.frozen(repr=False)
class InModule(Selector):
    """Every op that ran inside a module: ``"layer2"`` (every pass) or ``"layer2:1"``."""

    path: str
    path_pass: tuple[str, int | None] = attrs.field(init=False, repr=False, eq=False)

    def __repr__(self) -> str:
        return f"tl.in_module({self.path!r})"

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "path_pass", split_pass(_name(self.path, "tl.in_module", "layer2")))

    def test(self, op: OpRecord, trace: Trace | TraceBuilder | None) -> bool:  # reads the op alone
        base, n = self.path_pass
        return any(p == base and (n is None or k == n) for p, k in op.module_passes)

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        return self.test(op, builder)


@attrs.frozen(repr=False)
class Label(Selector):
    """Ops with these labels: ``"relu_1_2"``, ``"conv2d_3"``, ``"linear_1:2"`` (a label without a pass
    matches every pass of its layer)."""

    keys: tuple[str, ...]

    def __repr__(self) -> str:
        return f"tl.label({', '.join(map(repr, self.keys))})"

    def test(self, op: OpRecord, trace: Trace | TraceBuilder | None) -> bool:  # reads the op alone
        keys = op_keys(op)
        return any(key in keys for key in self.keys)

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        return self.test(op, builder)


@attrs.frozen(repr=False)
class FollowedBy(Selector):
    """Ops with at least one child matching ``inner``."""

    inner: Selector

    def __repr__(self) -> str:
        return f"tl.followed_by({self.inner!r})"

    def test(self, op: OpRecord, trace: Trace) -> bool:
        return any(self.inner.test(child, trace) for child in map(trace.__getitem__, op.children) if child.kind == "op")


@attrs.frozen(repr=False)
class PrecededBy(Selector):
    """Ops with at least one parent matching ``inner``."""

    inner: Selector

    def __repr__(self) -> str:
        return f"tl.preceded_by({self.inner!r})"

    def test(self, op: OpRecord, trace: Trace) -> bool:
        return any(self.inner.test(trace.ops[i], trace) for i in op.parent_indices if trace.ops[i].kind == "op")

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        verdicts = [
            self.inner.decide(builder.ops[i], builder) for i in op.parent_indices if builder.ops[i].kind == "op"
        ]
        return True if True in verdicts else (None if None in verdicts else False)


@attrs.frozen(repr=False)
class Where(Selector):
    """Ops for which ``predicate(op)`` is true."""

    predicate: Callable[[OpRecord], bool]

    def __repr__(self) -> str:
        return f"tl.where({getattr(self.predicate, '__name__', 'predicate')})"

    def test(self, op: OpRecord, trace: Trace) -> bool:
        return bool(self.predicate(op))


@attrs.frozen(repr=False)
class AllOf(Selector):
    parts: tuple[Selector, ...]

    def __repr__(self) -> str:
        return "(" + " & ".join(map(repr, self.parts)) + ")"

    def test(self, op: OpRecord, trace: Trace) -> bool:
        return all(part.test(op, trace) for part in self.parts)

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        verdicts = [part.decide(op, builder) for part in self.parts]
        return False if False in verdicts else (None if None in verdicts else True)


@attrs.frozen(repr=False)
class AnyOf(Selector):
    parts: tuple[Selector, ...]

    def __repr__(self) -> str:
        return "(" + " | ".join(map(repr, self.parts)) + ")"

    def test(self, op: OpRecord, trace: Trace) -> bool:
        return any(part.test(op, trace) for part in self.parts)

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        verdicts = [part.decide(op, builder) for part in self.parts]
        return True if True in verdicts else (None if None in verdicts else False)


@attrs.frozen(repr=False)
class Not(Selector):
    inner: Selector

    def __repr__(self) -> str:
        return f"~{self.inner!r}"

    def test(self, op: OpRecord, trace: Trace) -> bool:
        return not self.inner.test(op, trace)

    def decide(self, op: OpRecord, builder: TraceBuilder) -> bool | None:
        verdict = self.inner.decide(op, builder)
        return None if verdict is None else not verdict


def op_keys(op: OpRecord) -> set[str]:
    """The labels an op answers to while capturing: full and short, with and without its pass."""
    short = op.layer_label.rsplit("_", 1)[0]
    return {op.layer_label, short, f"{op.layer_label}:{op.pass_num}", f"{short}:{op.pass_num}"}


# -- the public constructors -------------------------------------------------------------
def func(name_or_regex: str) -> Selector:
    return Func(name_or_regex)


def module(path: str) -> Selector:
    return Module(_name(path, "tl.module", "layer3"))


def in_module(path: str) -> Selector:
    return InModule(_name(path, "tl.in_module", "layer3"))


def label(*keys: str) -> Selector:
    return Label(tuple(_name(key, "tl.label", "relu_1_2") for key in keys))


_LABEL_FORM = re.compile(r"[A-Za-z_]\w*_\d+(_\d+)?(:\d+)?")


def key_selector(key: str) -> Selector:
    """The selector of one lookup key: an op label (``"relu_1_2"``, ``"conv2d_3"``, ``"linear_1:2"``)
    picks that op, anything else is a module path (``"layer3"``, ``"layer3:2"``), its output."""
    return label(key) if _LABEL_FORM.fullmatch(key) else module(key)


def followed_by(selector: Selector) -> Selector:
    return FollowedBy(_check(selector))


def preceded_by(selector: Selector) -> Selector:
    return PrecededBy(_check(selector))


def where(predicate: Callable[[OpRecord], bool]) -> Selector:
    if not callable(predicate):
        raise ArgumentTypeError(f"tl.where takes a function of an op record, not {type(predicate).__name__}")
    return Where(predicate)


def find(trace: Trace, selector: Selector) -> list[OpRecord]:
    """The ops ``selector`` matches; an error naming the closest labels and paths if none."""
    found = _check(selector).find(trace)
    if found:
        return found
    hint = near_names(trace, selector)
    raise LabelNotFoundError(f"selector {shown(selector, 120)} matches no op of this trace{hint}")


def near_names(trace: Trace, *selectors: Selector) -> str:
    """``"; closest labels and module paths: ..."`` for the names the selectors mention, or ``""``."""
    pool = [op.label for op in trace.ops if op.kind == "op"] + list(trace.modules)
    near: list[str] = []
    idle: list[str] = []  # modules the model holds that this forward never called
    for word in (w for selector in selectors for w in _words(selector) if w):
        module = trace.modules.get(word)
        if module is not None and not module.passes:
            idle.append(word)
            continue
        near += closest(word, pool, n=4)
    hint = ""
    if idle:
        hint += (
            f"; module {', '.join(map(repr, idle))} belongs to the model but was never called in this forward "
            f"(its parent may compute it another way, a fused op for instance): select its parent, or the ops"
        )
    if near:
        hint += f"; closest labels and module paths: {', '.join(map(repr, dict.fromkeys(near)))}"
    return hint


def _words(selector: Any) -> list[str]:
    """The names a selector mentions, for "did you mean" hints."""
    if isinstance(selector, (Func, Module, InModule)):
        return [selector.pattern if isinstance(selector, Func) else selector.path]
    if isinstance(selector, Label):
        return list(selector.keys)
    if isinstance(selector, (AllOf, AnyOf)):
        return [w for part in selector.parts for w in _words(part)]
    if isinstance(selector, (Not, FollowedBy, PrecededBy)):
        return _words(selector.inner)
    return []
