"""Reading model output as math without executing it.

verl's graders hand model text to Python's ``eval`` (Prime Math's pi handling and matrix check) and to sympy's
``parse_expr``, which ``eval``s the code its tokenizer writes. plugrl never executes model output outside its sandbox,
so both are replaced here by evaluators that walk Python's syntax tree and accept only what a math answer is made of:

* :func:`arithmetic`: numbers, ``True``/``False``/``None``, lists and tuples of them, and ``+ - * / // % ** ^``,
  with Python's own meaning (what ``eval`` would compute for such a text);
* :func:`sympy_expr`: the text through sympy's own tokenizer and transformations (``stringify_expr``, the first half
  of ``parse_expr``), then the code it writes evaluated with sympy's names only: calls of sympy functions and
  constructors on such values, arithmetic, comparisons, tuples. No attribute, subscript, lambda or other name.

A text that needs anything else is refused (``ValueError``): verl would ``eval`` it, and such a text is no answer to a
math problem. Powers whose result would need more than :data:`MAX_BITS` bits are refused too (computing them cannot
be interrupted).
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from typing import Any

MAX_BITS = 1_000_000  # a power that would need more bits is refused before it is computed
MAX_CHARS = 2_000  # a longer text is refused before it is parsed

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.xor,  # "2^3" is 1 to eval
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _bits(value: Any) -> float:
    """About how many bits ``abs(value)`` takes (0 for what is not a plain or sympy number)."""
    try:
        magnitude = abs(int(value)) if getattr(value, "is_Integer", False) or isinstance(value, int) else None
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return float(magnitude.bit_length()) if magnitude is not None else 0.0


def _power(base: Any, exponent: Any) -> Any:
    try:
        size = abs(float(exponent)) * max(_bits(base), 1.0)
    except (TypeError, ValueError, OverflowError):
        size = 0.0  # a symbolic exponent: sympy keeps the power unevaluated
    if size > MAX_BITS:
        raise ValueError("power too large to compute")
    return operator.pow(base, exponent)


class _Walker:
    """Evaluates a parsed expression; ``names``: the only names it may read or call."""

    def __init__(self, names: dict[str, Any]):
        self.names = names

    def eval(self, node: ast.AST) -> Any:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise ValueError(f"{type(node).__name__} is not allowed in a math answer")
        return method(node)

    def _Expression(self, node: ast.Expression) -> Any:
        return self.eval(node.body)

    def _Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, (int, float, complex, str, bool)) or node.value is None:
            return node.value
        raise ValueError("constant not allowed")

    def _Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.eval(e) for e in node.elts)

    def _List(self, node: ast.List) -> Any:
        return [self.eval(e) for e in node.elts]

    def _BinOp(self, node: ast.BinOp) -> Any:
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ValueError("operator not allowed")
        left, right = self.eval(node.left), self.eval(node.right)
        return _power(left, right) if op is operator.pow else op(left, right)

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        op = _UNARY.get(type(node.op))
        if op is None:
            raise ValueError("operator not allowed")
        return op(self.eval(node.operand))

    def _Compare(self, node: ast.Compare) -> Any:
        if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
            raise ValueError("comparison not allowed")
        return _COMPARE[type(node.ops[0])](self.eval(node.left), self.eval(node.comparators[0]))

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.names:
            raise ValueError(f"name {node.id!r} not allowed")
        return self.names[node.id]

    def _Call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in self.names:
            raise ValueError("only sympy's functions may be called")
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg is not None}
        if len(kwargs) != len(node.keywords):
            raise ValueError("** arguments not allowed")
        return self.names[node.func.id](*args, **kwargs)


def _parse(code: str) -> ast.Expression:
    if len(code) > MAX_CHARS * 8:
        raise ValueError("text too long")
    try:
        return ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"not an expression ({type(e).__name__})") from None


def arithmetic(text: str) -> Any:
    """What ``eval(text)`` gives for a text of numbers, lists, tuples and arithmetic; ValueError otherwise (or the
    arithmetic's own error: ZeroDivisionError, OverflowError, TypeError)."""
    if len(text) > MAX_CHARS:
        raise ValueError("text too long")
    names = {"True": True, "False": False, "None": None}
    return _Walker(names).eval(_parse(text.strip()))


@functools.cache
def _sympy_names() -> dict[str, Any]:
    """The names ``parse_expr`` evaluates in: sympy's (``from sympy import *``) less its modules, the builtins it
    adds that a math answer uses (``abs``, ``pow``, ``round``; ``max``/``min`` as sympy's Max/Min), and what its
    transformations write (Symbol, Integer, Float, Rational, ...)."""
    import sympy

    names = {k: getattr(sympy, k) for k in sympy.__all__ if not isinstance(getattr(sympy, k), type(math))}
    return names | {"abs": abs, "pow": pow, "round": round, "max": sympy.Max, "min": sympy.Min}


def sympy_expr(text: str, *, implicit: bool = False) -> Any:
    """What ``sympy.parsing.sympy_parser.parse_expr(text)`` gives (with ``implicit_multiplication_application``
    among the transformations when ``implicit``), built without ``eval``; ValueError for a text it refuses."""
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        standard_transformations,
        stringify_expr,
    )

    if len(text) > MAX_CHARS:
        raise ValueError("text too long")
    transformations = standard_transformations + ((implicit_multiplication_application,) if implicit else ())
    names = dict(_sympy_names())
    try:
        code = stringify_expr(text, {}, names, transformations)
    except Exception as e:  # sympy's tokenizer and transformations on odd text
        raise ValueError(f"not parsed ({type(e).__name__})") from None
    return _Walker(names).eval(_parse(code))
