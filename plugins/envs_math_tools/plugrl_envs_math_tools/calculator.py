"""The ``calculator`` tool: arithmetic from model output, evaluated by walking its syntax tree, exactly where it can.

The expression is parsed with :func:`ast.parse` and only numbers, ``+ - * / // % **``, unary ``+``/``-``,
parentheses, the functions of :data:`FUNCTIONS` and the constants of :data:`CONSTANTS` are evaluated; every other
construct (names, attributes, subscripts, lambdas, comprehensions, strings, comparisons, keyword arguments, ...)
is refused by the walker. Nothing is ever passed to ``eval``, ``exec`` or ``compile``.

Numbers are exact fractions while the operations allow (``0.1 + 0.2`` is ``0.3``, ``1/3 * 3`` is ``1``,
``sqrt(2.25)`` is ``1.5``); irrational results (``sqrt(2)``, ``log``, ``exp``, ``sin``, a non-integer power that
is no exact root) are floats, shown to 15 significant digits. An exact result is written as an integer or a
terminating decimal; one that does not terminate (``1/3``) is shown to 15 significant digits.

Model-friendly spellings: ``^`` means power (as in most calculators, not Python's xor), ``×``/``·``/``÷``/``−``
are read as ``* * / -``, ``$`` signs and a trailing ``=`` are ignored. ``round`` rounds halves away from zero
(``round(2.5)`` is 3), as taught in school, not to even as Python does.

Limits, each answered with an ``Error: ...`` text: :data:`MAX_CHARS` characters, nesting :data:`MAX_DEPTH` deep
(a long flat sum does not nest), exact numbers of at most :data:`MAX_DIGITS` digits (numerator and denominator;
a power is refused before it is computed when its result would exceed that), finite floats. So no input makes
the tool run long or use much memory.

The module uses the standard library and ``@plugrl.tool`` only: a tool worker imports it fast.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction

from plugrl import tool

MAX_CHARS = 500  # characters of an expression (after the spellings above are normalised)
MAX_DEPTH = 60  # nesting of the syntax tree; the left operand of a chain (1 + 2 + 3 + ...) does not count
MAX_DIGITS = 1000  # digits of any exact number met (numerator and denominator)
MAX_ROUND_DIGITS = 100  # round(x, n): |n| at most this
MAX_ROOT = 64  # x ** (p/q) is tried as an exact root for denominators q up to this
SIGNIFICANT = 15  # digits shown of a float, or of an exact value that is no terminating decimal
MAX_EXACT_DECIMALS = 30  # a terminating decimal with more decimals than this is shown to SIGNIFICANT digits

_MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))

Number = Fraction | float


class CalcError(ValueError):
    """Why an expression cannot be evaluated, as one sentence for the model."""


# ------------------------------------------------------------------------------------------------ the tool


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: + - * / // % ** (or ^), parentheses, decimals,
    sqrt, abs, round, min, max, floor, ceil, log, exp, sin, cos, pi and e.

    Args:
        expression: The expression, e.g. "(48 / 2 + 48) * 3" or "sqrt(2) * 10".
    """
    try:
        return format_number(evaluate(expression))
    except CalcError as e:
        return f"Error: {e}"
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as e:  # a case the walker missed
        return f"Error: cannot evaluate this expression ({type(e).__name__})"


# ------------------------------------------------------------------------------------------------ parsing

_SPELLINGS = {"^": "**", "×": "*", "·": "*", "÷": "/", "−": "-", "$": ""}
_SPELLING_RE = re.compile("|".join(map(re.escape, _SPELLINGS)))


def normalise(expression: str) -> str:
    """The expression with the model-friendly spellings (module doc) replaced and a trailing ``=`` removed."""
    text = _SPELLING_RE.sub(lambda m: _SPELLINGS[m.group()], expression).strip()
    return text[:-1].rstrip() if text.endswith("=") and not text.endswith("==") else text


def evaluate(expression: str) -> Number:
    """The value of ``expression`` (a :class:`~fractions.Fraction` when exact, else a float); a
    :class:`CalcError` saying what is wrong otherwise."""
    if not isinstance(expression, str):
        raise CalcError(f"the expression must be text, got {type(expression).__name__}")
    if len(expression) > 4 * MAX_CHARS:  # before any work on it
        raise CalcError(f"the expression is too long ({len(expression)} characters; at most {MAX_CHARS})")
    text = normalise(expression)
    if not text:
        raise CalcError("the expression is empty; write one such as 2 * (3 + 4)")
    if len(text) > MAX_CHARS:
        raise CalcError(f"the expression is too long ({len(text)} characters; at most {MAX_CHARS})")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalcError(f"invalid expression: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes; a parser stack overflow
        raise CalcError(f"invalid expression ({type(e).__name__})") from None
    depth = _depth(tree.body)
    if depth > MAX_DEPTH:
        raise CalcError(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)")
    return _Walker(text).eval(tree.body)


def _depth(root: ast.AST) -> int:
    """How deep ``root`` nests, without recursion; a BinOp's left operand stays on its level (chains are flat)."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(node, ast.BinOp):
            stack += [(node.left, d), (node.right, d + 1)]
        else:
            stack += [(child, d + 1) for child in ast.iter_child_nodes(node)]
    return deepest


# ------------------------------------------------------------------------------------------------ evaluation

_REFUSED: dict[type, str] = {
    ast.Attribute: "attribute access (a.b) is not allowed",
    ast.Subscript: "indexing (a[b]) is not allowed",
    ast.Lambda: "lambda is not allowed",
    ast.Compare: "comparisons are not supported; write only the arithmetic",
    ast.BoolOp: "and / or are not supported",
    ast.IfExp: "conditional expressions are not supported",
    ast.Tuple: "a comma separates function arguments only; write numbers without thousands separators (1000, "
    "not 1,000) and one expression per call",
    ast.List: "lists are not supported",
    ast.Dict: "dictionaries are not supported",
    ast.Set: "sets are not supported",
    ast.ListComp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.GeneratorExp: "generator expressions are not allowed",
    ast.JoinedStr: "text is not a number",
    ast.NamedExpr: "assignments (:=) are not allowed",
    ast.Starred: "* unpacking is not allowed",
    ast.Await: "await is not allowed",
    ast.Yield: "yield is not allowed",
    ast.YieldFrom: "yield is not allowed",
    ast.Slice: "slices are not allowed",
}

_OPERATORS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.MatMult: "@",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitAnd: "&",
    ast.BitXor: "^",
}


class _Walker:
    """Evaluates the allowed nodes of one parsed expression (``text``: its source, for exact decimal literals)."""

    def __init__(self, text: str):
        self.text = text

    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Constant):
            return self._constant(node)
        if isinstance(node, ast.BinOp):
            return self._chain(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return -self.eval(node.operand)
            if isinstance(node.op, ast.UAdd):
                return self.eval(node.operand)
            op = {ast.Not: "not", ast.Invert: "~"}.get(type(node.op), type(node.op).__name__)
            raise CalcError(f"the operator {op} is not supported; use + - * / // % **")
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Name):
            return self._name(node.id)
        why = _REFUSED.get(type(node), f"{type(node).__name__} is not allowed in an arithmetic expression")
        raise CalcError(why)

    def _constant(self, node: ast.Constant) -> Fraction:
        value = node.value
        if isinstance(value, bool) or value is None or value is Ellipsis:
            raise CalcError(f"{value!r} is not a number")
        if isinstance(value, int):
            return _exact(Fraction(value))
        if isinstance(value, float):  # read the literal's own digits: 0.1 is exactly 1/10
            source = ast.get_source_segment(self.text, node) or repr(value)
            return _decimal_literal(source)
        if isinstance(value, complex):
            raise CalcError("complex numbers are not supported")
        raise CalcError("text is not a number; pass only the arithmetic, e.g. 3 * 4")

    def _chain(self, node: ast.BinOp) -> Number:
        chain = []
        while isinstance(node, ast.BinOp):  # a left-leaning chain (1 + 2 + 3 ...) is walked in a loop
            chain.append(node)
            node = node.left
        value = self.eval(node)
        for link in reversed(chain):
            value = _binary(link.op, value, self.eval(link.right))
        return value

    def _name(self, name: str) -> Number:
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in FUNCTIONS:
            raise CalcError(f"{name} is a function: call it, e.g. {name}(2)")
        raise CalcError(
            f"unknown name {name!r}: variables are not supported; known functions: {', '.join(FUNCTIONS)}; "
            f"constants: {', '.join(CONSTANTS)}"
        )

    def _call(self, node: ast.Call) -> Number:
        func = node.func
        if not isinstance(func, ast.Name):
            if isinstance(func, ast.Constant) and isinstance(func.value, (int, float)):
                raise CalcError(f"write the multiplication out: {func.value} * (...)")
            raise CalcError(_REFUSED.get(type(func), "only the listed functions can be called"))
        name = func.id
        if name not in FUNCTIONS:
            if name in CONSTANTS:
                raise CalcError(f"{name} is a constant, not a function; write {name} * (...)")
            raise CalcError(f"unknown function {name!r}; known functions: {', '.join(FUNCTIONS)}")
        if node.keywords:
            raise CalcError(f"{name}() takes no keyword arguments; write {name}(x) or round(x, 2)")
        fn, low, high = FUNCTIONS[name]
        args = [self.eval(a) for a in node.args]
        if not low <= len(args) <= high:
            want = {1: "one argument", 2: "one or two arguments"}.get(high, "at least one argument")
            raise CalcError(f"{name}() takes {want}, got {len(args)}")
        return fn(*args)


# ------------------------------------------------------------------------------------------------ numbers


def _exact(x: Fraction) -> Fraction:
    """``x``, unless its numerator or denominator has more than MAX_DIGITS digits."""
    if x.numerator.bit_length() > _MAX_BITS:
        raise CalcError(f"the number is too large (more than {MAX_DIGITS} digits)")
    if x.denominator.bit_length() > _MAX_BITS:
        raise CalcError(f"the number is too precise (more than {MAX_DIGITS} digits after the point)")
    return x


def _finite(x: float) -> float:
    if math.isnan(x):
        raise CalcError("the result is undefined")
    if math.isinf(x):
        raise CalcError("the result is too large")
    return x


def _float(x: Number) -> float:
    if isinstance(x, float):
        return x
    try:
        return float(x)
    except OverflowError:
        raise CalcError("the number is too large for an inexact operation (more than 1e308)") from None


def _decimal_literal(source: str) -> Fraction:
    try:
        d = Decimal(source.replace("_", ""))
    except InvalidOperation:
        raise CalcError(f"{source!r} is not a number") from None
    if not d.is_finite():
        raise CalcError(f"{source!r} is not a finite number")
    if d and abs(d.adjusted()) > MAX_DIGITS:
        raise CalcError(f"{source} is too large or too small (exponent beyond +-{MAX_DIGITS})")
    return _exact(Fraction(d))


def _binary(op: ast.operator, a: Number, b: Number) -> Number:
    if isinstance(op, ast.Pow):
        return _power(a, b)
    symbol = _OPERATORS.get(type(op), type(op).__name__)
    if symbol not in ("+", "-", "*", "/", "//", "%"):
        raise CalcError(f"the operator {symbol} is not supported; use + - * / // % ** (or ^ for a power)")
    if symbol in ("/", "//", "%") and b == 0:
        raise CalcError("division by zero")
    exact = isinstance(a, Fraction) and isinstance(b, Fraction)
    x, y = (a, b) if exact else (_float(a), _float(b))
    if symbol == "+":
        r = x + y
    elif symbol == "-":
        r = x - y
    elif symbol == "*":
        r = x * y
    elif symbol == "/":
        r = x / y
    elif symbol == "//":
        r = x // y
    else:
        r = x % y
    if exact:
        return _exact(Fraction(r))
    return _finite(float(r))


def _digits(x: Fraction) -> float:
    """About how many digits the larger of numerator and denominator has (``log10``: reads integers of any size)."""
    return max(math.log10(abs(x.numerator)) if x.numerator else 0.0, math.log10(x.denominator))


def _power(base: Number, exp: Number) -> Number:
    if isinstance(base, Fraction) and isinstance(exp, Fraction):
        if base == 0:
            if exp < 0:
                raise CalcError("division by zero (0 to a negative power)")
            return Fraction(1) if exp == 0 else Fraction(0)
        if abs(base) == 1 and exp.denominator == 1:
            return Fraction(1) if base == 1 or exp.numerator % 2 == 0 else Fraction(-1)
        if exp.denominator == 1:
            return _integer_power(base, exp.numerator)
        root = _exact_root(base, exp.denominator)
        if root is not None:
            return _integer_power(root, exp.numerator)
    b, e = _float(base), _float(exp)
    if b < 0 and not e.is_integer():
        if isinstance(exp, Fraction) and exp.denominator % 2 == 1:  # an odd root of a negative number is real
            magnitude = _float_power(-b, e)
            return -magnitude if exp.numerator % 2 else magnitude
        raise CalcError("a negative number to a fractional power has no real value")
    if b == 0 and e < 0:
        raise CalcError("division by zero (0 to a negative power)")
    return _float_power(b, e)


def _float_power(b: float, e: float) -> float:
    try:
        return _finite(math.pow(b, e))
    except OverflowError:
        raise CalcError("the result is too large") from None


def _integer_power(base: Fraction, n: int) -> Fraction:
    if abs(n) > 10 * _MAX_BITS or _digits(base) * abs(n) > MAX_DIGITS:  # |base| >= 2 or <= 1/2 here: >= 0.3 digits
        size = _digits(base) * min(abs(n), 10**30)
        raise CalcError(f"the power is too large (its result would have about {size:.3g} digits; at most {MAX_DIGITS})")
    return _exact(base**n)


def _iroot(n: int, q: int) -> int | None:
    """The exact integer ``q``-th root of ``n >= 0``, or None (integer Newton steps: no float overflow)."""
    if n < 2:
        return n
    if q == 2:
        r = math.isqrt(n)
    else:
        r = 1 << -(-n.bit_length() // q)  # at least the root
        while True:
            s = ((q - 1) * r + n // r ** (q - 1)) // q
            if s >= r:
                break
            r = s
    return r if r**q == n else None


def _exact_root(x: Fraction, q: int) -> Fraction | None:
    """The exact real ``q``-th root of ``x`` (``q > 1``), or None when it is irrational or ``q`` is large."""
    if q > MAX_ROOT:
        return None
    if x < 0:
        if q % 2 == 0:
            return None
        root = _exact_root(-x, q)
        return None if root is None else -root
    num, den = _iroot(x.numerator, q), _iroot(x.denominator, q)
    return None if num is None or den is None else Fraction(num, den)


# ------------------------------------------------------------------------------------------------ functions


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise CalcError("the square root of a negative number has no real value")
    if isinstance(x, Fraction):
        root = _exact_root(x, 2)
        if root is not None:
            return root
    return _finite(math.sqrt(_float(x)))


def _abs(x: Number) -> Number:
    return abs(x)


def _as_fraction(x: Number) -> Fraction:
    """A float as the exact value of its shortest decimal (2.675 -> 2675/1000), a Fraction as is."""
    return x if isinstance(x, Fraction) else Fraction(repr(x))


def _round(x: Number, ndigits: Number = Fraction(0)) -> Fraction:
    """``x`` rounded to ``ndigits`` decimals, halves away from zero."""
    if not (isinstance(ndigits, Fraction) and ndigits.denominator == 1):
        raise CalcError("round(x, n): n must be a whole number")
    n = ndigits.numerator
    if abs(n) > MAX_ROUND_DIGITS:
        raise CalcError(f"round(x, n): n must be between -{MAX_ROUND_DIGITS} and {MAX_ROUND_DIGITS}")
    v = _as_fraction(x) * Fraction(10) ** n
    whole = math.floor(abs(v) + Fraction(1, 2))
    return _exact(Fraction(whole if v >= 0 else -whole) / Fraction(10) ** n)


def _floor(x: Number) -> Fraction:
    return Fraction(math.floor(x))


def _ceil(x: Number) -> Fraction:
    return Fraction(math.ceil(x))


def _ln(x: Number) -> float:
    if x <= 0:
        raise CalcError("the logarithm of zero or a negative number is undefined")
    if isinstance(x, Fraction):  # math.log reads integers of any size
        return math.log(x.numerator) - math.log(x.denominator)
    return math.log(x)


def _log(x: Number, base: Number | None = None) -> Number:
    if base is None:
        return _ln(x)
    if base <= 0 or base == 1:
        raise CalcError("the base of a logarithm must be positive and not 1")
    value = _ln(x) / _ln(base)
    if isinstance(x, Fraction) and isinstance(base, Fraction):  # log(8, 2) is exactly 3
        k = round(value)
        if abs(k) * _digits(base) <= MAX_DIGITS and base**k == x:
            return Fraction(k)
    return _finite(value)


def _exp(x: Number) -> float:
    try:
        return _finite(math.exp(_float(x)))
    except OverflowError:
        raise CalcError("the result is too large") from None


def _trig(fn: Callable[[float], float]) -> Callable[[Number], float]:
    def apply(x: Number) -> float:
        return _finite(fn(_float(x)))

    return apply


def _min(*xs: Number) -> Number:
    return min(xs)


def _max(*xs: Number) -> Number:
    return max(xs)


# name -> (function, fewest arguments, most arguments)
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "sqrt": (_sqrt, 1, 1),
    "abs": (_abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (_min, 1, 100),
    "max": (_max, 1, 100),
    "floor": (_floor, 1, 1),
    "ceil": (_ceil, 1, 1),
    "log": (_log, 1, 2),
    "exp": (_exp, 1, 1),
    "sin": (_trig(math.sin), 1, 1),
    "cos": (_trig(math.cos), 1, 1),
    "tan": (_trig(math.tan), 1, 1),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


# ------------------------------------------------------------------------------------------------ output


def format_number(x: Number) -> str:
    """``x`` as the model reads it: an integer, a terminating decimal (exact), or 15 significant digits."""
    if isinstance(x, float):
        _finite(x)
        return "0" if x == 0 else format(x, f".{SIGNIFICANT}g")
    if x.denominator == 1:
        return str(x.numerator)
    places = _decimal_places(x.denominator)
    if places is not None and places <= MAX_EXACT_DECIMALS:
        scaled = abs(x.numerator) * 10**places // x.denominator
        digits = str(scaled).rjust(places + 1, "0")
        text = f"{digits[:-places]}.{digits[-places:]}".rstrip("0")
        return ("-" if x < 0 else "") + text
    with localcontext() as ctx:
        ctx.prec = SIGNIFICANT
        d = Decimal(x.numerator) / Decimal(x.denominator)
    text = format(d, "f") if -7 <= d.adjusted() < SIGNIFICANT else format(d, "e")
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _decimal_places(den: int) -> int | None:
    """The decimals of a fraction with denominator ``den`` when it terminates (den = 2^a 5^b), else None."""
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    return max(twos, fives) if den == 1 else None
