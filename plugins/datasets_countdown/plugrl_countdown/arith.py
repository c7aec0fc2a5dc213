"""A small, safe evaluator for countdown answers.

Grammar (recursive descent, exact rational arithmetic with :class:`fractions.Fraction`)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/") unary)*
    unary   := "-" unary | primary
    primary := NUMBER | "(" expr ")"
    NUMBER  := DIGITS ("." DIGITS)?          (ASCII digits only)

Nothing is ever handed to ``eval``/``exec``/``compile``; any character outside
digits, ``.``, ``+ - * / ( )`` and whitespace is rejected by the tokenizer. Work is
bounded before it starts: inputs over :data:`MAX_LENGTH` characters are rejected
without being scanned, the tokenizer stops at the first token past
:data:`MAX_TOKENS` or the first parenthesis past :data:`MAX_DEPTH`, and there is
no exponentiation, so every value stays small. Every failure raises
:class:`ArithError` (a :class:`ValueError`) saying what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "MAX_TOKENS", "ArithError", "Evaluation", "analyze", "evaluate", "tokenize"]

MAX_LENGTH = 256
MAX_DEPTH = 32
MAX_TOKENS = 64

_DIGITS = frozenset("0123456789")
_OPERATORS = frozenset("+-*/()")
_SPACE = frozenset(" \t\r\n")


class ArithError(ValueError):
    """The expression is not a valid, bounded arithmetic expression."""


@dataclass(frozen=True)
class Token:
    kind: str  # "num" or one of "+-*/()"
    text: str
    pos: int
    value: Fraction | None = None


@dataclass(frozen=True)
class Evaluation:
    """The exact value of an expression and the number literals it used, in order."""

    value: Fraction
    numbers: tuple[Fraction, ...]


def _number(text: str, start: int) -> tuple[Token, int]:
    """The number literal starting at ``text[start]`` (a digit), and the position just past it."""
    n = len(text)
    i = start
    while i < n and text[i] in _DIGITS:
        i += 1
    if i < n and text[i] == ".":
        i += 1
        if i >= n or text[i] not in _DIGITS:
            raise ArithError(f"malformed number at position {start}: a '.' must be followed by digits")
        while i < n and text[i] in _DIGITS:
            i += 1
    if i < n and text[i] == ".":
        raise ArithError(f"malformed number at position {start}: more than one '.'")
    lit = text[start:i]
    value = Fraction(lit) if "." in lit else Fraction(int(lit))
    return Token("num", lit, start, value), i


def _operator_depth(text: str, i: int, depth: int) -> int:
    """Check the operator at ``text[i]`` (no ``**``, nesting within the limit); the parenthesis depth after it."""
    c = text[i]
    if c == "*" and i + 1 < len(text) and text[i + 1] == "*":
        raise ArithError(f"exponentiation '**' at position {i} is not allowed")
    if c == "(":
        depth += 1
        if depth > MAX_DEPTH:
            raise ArithError(f"nesting deeper than {MAX_DEPTH} parentheses at position {i}")
    elif c == ")":
        depth -= 1
    return depth


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, enforcing the length, token and nesting limits."""
    if not isinstance(text, str):
        raise ArithError(f"expression must be a string, not {type(text).__name__}")
    n = len(text)
    if n > MAX_LENGTH:
        raise ArithError(f"expression too long: {n} characters (limit {MAX_LENGTH})")
    tokens: list[Token] = []
    depth = 0
    i = 0
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            continue
        if c in _DIGITS:
            tok, i = _number(text, i)
        elif c in _OPERATORS:
            depth = _operator_depth(text, i, depth)
            tok = Token(c, c, i)
            i += 1
        elif c == "^":
            raise ArithError(f"exponentiation '^' at position {i} is not allowed")
        elif c == ".":
            raise ArithError(f"malformed number at position {i}: a number must start with a digit")
        else:
            raise ArithError(f"unexpected character {c!r} at position {i}")
        tokens.append(tok)
        if len(tokens) > MAX_TOKENS:
            raise ArithError(f"too many tokens: more than {MAX_TOKENS}")
    return tokens


class _Parser:
    """Evaluates while parsing; ``numbers`` collects the literals in source order."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0
        self.numbers: list[Fraction] = []

    def _peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _enter(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ArithError(f"nesting deeper than {MAX_DEPTH} at position {tok.pos}")

    def parse(self) -> Fraction:
        if not self.tokens:
            raise ArithError("empty expression")
        value = self._expr()
        tok = self._peek()
        if tok is not None:
            raise ArithError(f"unexpected {tok.text!r} at position {tok.pos}")
        return value

    def _expr(self) -> Fraction:
        value = self._term()
        while (tok := self._peek()) is not None and tok.kind in ("+", "-"):
            self.i += 1
            rhs = self._term()
            value = value + rhs if tok.kind == "+" else value - rhs
        return value

    def _term(self) -> Fraction:
        value = self._unary()
        while (tok := self._peek()) is not None and tok.kind in ("*", "/"):
            self.i += 1
            rhs = self._unary()
            if tok.kind == "*":
                value = value * rhs
            elif rhs == 0:
                raise ArithError(f"division by zero at position {tok.pos}")
            else:
                value = value / rhs
        return value

    def _unary(self) -> Fraction:
        tok = self._peek()
        if tok is not None and tok.kind == "-":
            self.i += 1
            self._enter(tok)
            value = -self._unary()
            self.depth -= 1
            return value
        return self._primary()

    def _primary(self) -> Fraction:
        tok = self._peek()
        if tok is None:
            raise ArithError("unexpected end of expression: expected a number or '('")
        if tok.kind == "num":
            self.i += 1
            assert tok.value is not None
            self.numbers.append(tok.value)
            return tok.value
        if tok.kind == "(":
            self.i += 1
            self._enter(tok)
            value = self._expr()
            close = self._peek()
            if close is None:
                raise ArithError(f"unclosed '(' at position {tok.pos}")
            if close.kind != ")":
                raise ArithError(f"unexpected {close.text!r} at position {close.pos}: expected ')'")
            self.i += 1
            self.depth -= 1
            return value
        raise ArithError(f"unexpected {tok.text!r} at position {tok.pos}: expected a number or '('")


def analyze(text: str) -> Evaluation:
    """Evaluate ``text`` exactly and report the number literals it contains."""
    parser = _Parser(tokenize(text))
    value = parser.parse()
    return Evaluation(value=value, numbers=tuple(parser.numbers))


def evaluate(text: str) -> Fraction:
    """The exact value of the arithmetic expression ``text``; raises :class:`ArithError`."""
    return analyze(text).value
