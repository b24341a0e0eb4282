"""The built-in tools: a calculator, a unit converter, and a lookup and a text search over the run's own data.

TRL shows the model each tool as a JSON schema made from the function's name, type hints and docstring
(transformers' ``get_json_schema``), so each tool is a plain function with a Google-style docstring, worded for a
small model. The model's arguments are untrusted text (and in a public demo so is the data), so every tool answers
in bounded time and size whatever it is sent, and says what went wrong in a sentence the model can read: TRL hands
a tool's exception back to the model as ``{"error": ...}`` and counts the call as failed.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

from ..errors import DragonError


class ToolError(DragonError):
    """A call the tool cannot answer; its sentence is what the model reads back."""


# ---------------------------------------------------------------------------------------------------------------
# Calculator: the arithmetic of Python's grammar, evaluated over exact fractions, with every number's size bounded.

MOST_EXPRESSION_CHARS = 200
MOST_DIGITS = 100  # no number in a calculation may have more: 10**10**10 is refused, not computed
_MOST_BITS = math.ceil(MOST_DIGITS * math.log2(10))
_SPELLINGS = {"×": "*", "÷": "/", "^": "**", "−": "-"}  # what a model writes for the operators Python spells otherwise
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def calculator(expression: str) -> str:
    """Work out an arithmetic expression exactly: + - * / ** and brackets.

    Args:
        expression: The arithmetic to work out, for example "347 * 862".
    """
    if not isinstance(expression, str):
        raise ToolError("expression must be text, for example \"347 * 862\".")
    if len(expression) > MOST_EXPRESSION_CHARS:
        raise ToolError(f"the expression has {len(expression)} characters; the calculator takes at most "
                        f"{MOST_EXPRESSION_CHARS}.")
    text = expression.strip()
    for spelled, python in _SPELLINGS.items():
        text = text.replace(spelled, python)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"{expression!r} is not arithmetic the calculator can read; write it like \"347 * 862\".") \
            from None
    return _shown(_evaluate(tree.body))


def _evaluate(node: ast.AST) -> Fraction | float:
    """Exact fractions while the arithmetic is exact; a float (shown to 12 digits) once a fractional power is taken."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ToolError("the numbers must be finite.")
        return _bounded(Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise ToolError("the expression divides by zero.")
        if isinstance(left, float) or isinstance(right, float):
            return _inexact(lambda: _BINARY[type(node.op)](float(left), float(right)))
        return _bounded(Fraction(_BINARY[type(node.op)](left, right)))
    raise ToolError("the calculator only takes numbers, + - * / // % **, and brackets.")


def _power(base: Fraction | float, exponent: Fraction | float) -> Fraction | float:
    if base == 0 and exponent < 0:
        raise ToolError("the expression divides by zero.")
    if isinstance(base, Fraction) and isinstance(exponent, Fraction) and exponent.denominator == 1:
        # |base| is at least 2 ** (size - 1), so its power has at least (size - 1) * n bits: refused before it is
        # computed; anything under that is cheap to compute and then measured exactly.
        size = max(base.numerator.bit_length(), base.denominator.bit_length())
        if (size - 1) * abs(exponent.numerator) > _MOST_BITS:
            raise ToolError(f"the result would have more than {MOST_DIGITS} digits.")
        return _bounded(base ** exponent.numerator)
    if base < 0 and float(exponent) != int(exponent):
        raise ToolError("a negative number has no real power with a fractional exponent.")
    return _inexact(lambda: float(base) ** float(exponent))


def _inexact(compute) -> float:
    """A float result, refused in a sentence if it overflows or passes MOST_DIGITS digits."""
    try:
        value = compute()
    except (OverflowError, ZeroDivisionError):
        value = math.inf
    if not math.isfinite(value) or abs(value) >= 10.0 ** MOST_DIGITS:
        raise ToolError(f"the result would have more than {MOST_DIGITS} digits.")
    return value


_TOO_LARGE = 10 ** MOST_DIGITS


def _bounded(value: Fraction) -> Fraction:
    if abs(value.numerator) >= _TOO_LARGE or value.denominator >= _TOO_LARGE:
        raise ToolError(f"a number in the calculation would have more than {MOST_DIGITS} digits.")
    return value


def _shown(value: Fraction | float) -> str:
    """An exact whole number in full; anything else as a decimal of 12 significant digits."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.12g}"


# ---------------------------------------------------------------------------------------------------------------
# Unit converter: pint's registry of units, behind a check that keeps its parser to unit names.

# Unit names, each with at most a small exponent, joined by * or /: pint evaluates any number in a unit string
# ("9^9^9" is a number it computes), so none is let through but an exponent of one or two digits.
_UNIT_NAME = r"[A-Za-z°µΩ_]+(?:\^-?\d{1,2})?"
_UNIT_RE = re.compile(rf"{_UNIT_NAME}(?:\s*[*/ ]\s*{_UNIT_NAME})*")
MOST_UNIT_CHARS = 40


@functools.cache
def _units():
    import pint

    return pint.UnitRegistry(autoconvert_offset_to_baseunit=True)


def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert an amount from one unit to another, for example 5 mile to kilometer, or 30 degC to degF.

    Args:
        value: The amount to convert, for example 5.
        from_unit: The unit the amount is in, for example "mile".
        to_unit: The unit to convert it to, for example "kilometer".
    """
    import pint

    amount = _number(value)
    units = _units()
    try:
        parsed = [units.parse_units(_unit_name(unit)) for unit in (from_unit, to_unit)]
        converted = units.Quantity(amount, parsed[0]).to(parsed[1])
    except pint.DimensionalityError:
        raise ToolError(f"{str(from_unit)[:40]} cannot be converted to {str(to_unit)[:40]}: they measure different "
                        "things.") from None
    except Exception:  # pint's parser raises many kinds (KeyError, OverflowError, ...): all mean "not a unit here"
        raise ToolError(f"{str(from_unit)[:40]!r} or {str(to_unit)[:40]!r} is not a unit the converter knows; use "
                        "names like \"meter\", \"mile\", \"kg\", \"degC\", \"km/h\", \"m^2\".") from None
    try:
        magnitude = float(converted.magnitude)
    except (OverflowError, TypeError, ValueError):
        magnitude = math.inf
    if not math.isfinite(magnitude):
        raise ToolError("the converted amount is too large to show.")
    return f"{magnitude:.10g} {to_unit.strip()}"


def _number(value) -> float:
    if isinstance(value, bool):
        raise ToolError("value must be a number, for example 5.")
    try:
        amount = float(value)
    except OverflowError:
        amount = math.inf
    except (TypeError, ValueError):
        raise ToolError(f"value must be a number, for example 5, not {str(value)[:40]!r}.") from None
    if not math.isfinite(amount) or abs(amount) > 1e300:
        raise ToolError("value must be a finite number below 1e300.")
    return amount


def _unit_name(unit) -> str:
    if not isinstance(unit, str) or len(unit) > MOST_UNIT_CHARS or not _UNIT_RE.fullmatch(unit.strip()):
        raise ValueError(unit)
    return unit.strip()


# ---------------------------------------------------------------------------------------------------------------
# Lookup and search over a column of the run's data. Each run builds its own (make_lookup, make_search): the name,
# the description and the argument's wording are the run's, since the model reads them.

MOST_RESULTS = 3
RESULT_CHARS = 300
INDEXED_CHARS = 2_000  # of each document: its words beyond are not searched (an answer shows 300 anyway)
MOST_INDEXED_CHARS = 2_000_000  # of all documents: indexing takes about a second per million characters
_WORD_RE = re.compile(r"\w+")


def _key(text: str) -> str:
    """A key as lookups compare it: case, spacing and trailing punctuation do not matter."""
    return " ".join(str(text).casefold().split()).rstrip(".,;:!?")


def make_lookup(name: str, description: str, argument: str, table: dict[str, str]) -> Callable[[str], str]:
    """A tool ``name(key)`` answering the value ``table`` holds for ``key`` (compared as :func:`_key` says)."""
    entries = {_key(key): value for key, value in table.items() if _key(key)}
    some = ", ".join(repr(key if len(key) <= 40 else key[:39] + "…") for key in list(table)[:3])

    def lookup(key: str) -> str:
        if not isinstance(key, str) or not key.strip():
            raise ToolError(f"{argument} must be some text, for example {some}.")
        found = entries.get(_key(key))
        if found is None:
            raise ToolError(f"there is no entry for {key[:80]!r}; entries look like {some}.")
        return found

    return _named(lookup, name, f"{description}\n\nArgs:\n    key: {argument}")


def make_search(name: str, description: str, documents: list[str]) -> Callable[[str], str]:
    """A tool ``name(query)`` answering the documents that best match the query's words (BM25, as search engines
    rank), each cut to RESULT_CHARS characters, at most MOST_RESULTS of them."""
    texts = [text for text in documents if text.strip()]
    indexed = sum(min(len(text), INDEXED_CHARS) for text in texts)
    if indexed > MOST_INDEXED_CHARS:
        raise ToolError(f"the documents hold {indexed:,} characters to search (counting {INDEXED_CHARS:,} of each), "
                        f"more than the {MOST_INDEXED_CHARS:,} a search tool indexes; search fewer or shorter rows.")
    words = [Counter(_WORD_RE.findall(text[:INDEXED_CHARS].casefold())) for text in texts]
    lengths = [sum(counts.values()) for counts in words]
    mean_length = sum(lengths) / len(lengths) if lengths else 1.0
    holding = Counter(word for counts in words for word in counts)
    idf = {word: math.log(1 + (len(texts) - n + 0.5) / (n + 0.5)) for word, n in holding.items()}

    def search(query: str) -> str:
        if not isinstance(query, str) or not _WORD_RE.search(query):
            raise ToolError("query must hold some words to search for.")
        terms = set(_WORD_RE.findall(query.casefold()[:MOST_EXPRESSION_CHARS]))
        scores = [(_bm25(terms, counts, length, mean_length, idf), index)
                  for index, (counts, length) in enumerate(zip(words, lengths, strict=True))]
        best = sorted((pair for pair in scores if pair[0] > 0), key=lambda pair: (-pair[0], pair[1]))[:MOST_RESULTS]
        if not best:
            raise ToolError(f"no document mentions any of the words in {query[:80]!r}; try other words.")
        return "\n".join(f"{rank}. {_cut(texts[index])}" for rank, (_, index) in enumerate(best, start=1))

    return _named(search, name, f"{description}\n\nArgs:\n    query: The words to search for.")


def _bm25(terms: set[str], counts: Counter, length: int, mean_length: float, idf: dict[str, float],
          k1: float = 1.5, b: float = 0.75) -> float:
    return sum(idf[term] * counts[term] * (k1 + 1) / (counts[term] + k1 * (1 - b + b * length / mean_length))
               for term in terms if term in counts)


def _cut(text: str, most: int = RESULT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 1] + "…"


def _named(function: Callable, name: str, doc: str) -> Callable:
    """The function as the model sees it: its schema is built from ``__name__`` and ``__doc__``."""
    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function
