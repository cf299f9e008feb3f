"""custom_jvp / custom_vjp functions a capture expanded: the ops they cover, and their rules, for gradients.

The walk records a custom-derivative function's inner equations as ops, like
any call. JAX does not differentiate those equations, though: it runs the
function's rule (``jax.nn.relu``'s derivative is 0 at 0 where ``max(x, 0)``'s
is 1/2; a straight-through estimator's is 1 where ``round``'s is 0). So each
expansion is kept here, keyed by the first op it covers, with the equation to
bind again as a whole (:mod:`torchlens_jax.grads` does, for the gradient
through the call). Every op inside also gets ``op.meta["custom_rule"]`` (the
function's name): the rule is Python code that ``tl.save`` cannot keep, and a
trace that has the marks without the rules (a loaded one) is refused a
backward rather than differentiated as JAX would not.
"""

from __future__ import annotations

import weakref
from typing import Any

import attrs

from torchlens_core.ir.records import OpRecord, Ref

MARK = "custom_rule"  # op.meta key: the custom_jvp / custom_vjp function the op ran inside (outermost)

# The first op each expansion covers -> its rules, outermost first (nested calls can start at one op).
_RULES: weakref.WeakKeyDictionary[OpRecord, list[CustomRule]] = weakref.WeakKeyDictionary()


@attrs.frozen
class CustomRule:
    """One call of a custom_jvp / custom_vjp function, as the walk expanded it."""

    name: str  # the function's name, as JAX's debug info gives it
    call: tuple[Any, dict[str, Any]]  # (primitive, params) of the custom_jvp_call / custom_vjp_call equation
    inputs: tuple[Any, ...]  # its operands as op arguments are recorded: Ref, ParamRef or the constant
    outputs: tuple[Ref, ...]  # what it returned: each an output of an op inside it
    start: int  # ops start .. end - 1 ran inside the call
    end: int

    def bind(self, operands: list[Any]) -> list[Any]:
        """Run the call as JAX does, rule included: what ``jax.core.eval_jaxpr`` does for this equation."""
        primitive, params = self.call
        return list(primitive.bind(*operands, **primitive.get_bind_params(params)))


def keep(ops: list[OpRecord], rule: CustomRule) -> None:
    """Mark the ops ``rule`` covers, and keep the rule with its first op (outer calls end last: listed first)."""
    for op in ops[rule.start : rule.end]:
        op.meta[MARK] = rule.name
    _RULES.setdefault(ops[rule.start], []).insert(0, rule)


def rules_of(ops: list[OpRecord]) -> tuple[list[CustomRule], list[OpRecord]]:
    """The rules kept for ``ops``, and the marked ops that no kept rule covers (a loaded trace's)."""
    found: list[CustomRule] = []
    covered_to = -1
    uncovered = []
    for op in ops:
        for rule in _RULES.get(op, ()):
            found.append(rule)
            covered_to = max(covered_to, rule.end)
        if MARK in op.meta and op.index >= covered_to:
            uncovered.append(op)
    return found, uncovered


def kept_rules(ops: list[OpRecord]) -> dict[int, list[CustomRule]]:
    """The rules kept for ``ops``, by the index of the op each starts at (for the capture cache)."""
    return {op.index: list(_RULES[op]) for op in ops if op in _RULES}


def keep_again(ops: list[OpRecord], rules: dict[int, list[CustomRule]]) -> None:
    """Keep ``rules`` (from :func:`kept_rules` of an earlier trace of the same records) for ``ops``."""
    for index, found in rules.items():
        _RULES[ops[index]] = list(found)
