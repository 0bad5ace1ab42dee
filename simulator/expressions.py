"""Grafana's server-side expressions, as its alerting evaluates them: reduce, math, threshold.

Each rule is evaluated the way Grafana does it (grafana/grafana, the version pinned
in versions.env), so that "this rule fires on this data" means what it means in
Grafana. Every rule below cites where it comes from:

- pkg/expr/mathexp/reduce.go: sum of an empty series is 0, mean is sum/len (NaN when
  empty), min/max/last of an empty series are NaN; in strict mode a null or NaN makes
  sum, mean, min and max NaN, and last is whatever the last point is (null too);
  mode dropNN drops null, NaN and +-Inf before reducing and turns a NaN result into
  null; replaceNN replaces them (and a NaN result) with the given value.
- pkg/expr/mathexp/exp.go: binaryOp short-circuits `||` (left non-zero gives 1) and
  `&&` (left zero gives 0) before looking at NaN, then any NaN operand gives NaN
  (comparisons included); a null operand gives null; unions pair values whose labels
  are equal, or where one side has no labels, or where one side's labels contain the
  other's; unpaired values are dropped, except that one value against one value is
  always paired; NoData on a side of one value gives NoData.
- pkg/expr/threshold.go: gt is `$X > a`, lt `$X < a`, within_range `$X > a && $X < b`,
  outside_range `$X < a || $X > b`, evaluated as math.
- pkg/services/ngalert/eval/eval.go (evaluateExecutionResult): a query that returns
  no data makes the whole rule NoData; per condition value, 0 is Normal, anything
  else (NaN included) Alerting, null NoData; then, if two results of the condition
  have the same labels, the whole rule is one Error, "frame cannot uniquely be
  identified by its labels: has duplicate results with labels {...}" (the labels as
  grafana/grafana-plugin-sdk-go data/labels.go Labels.String writes them: sorted,
  `k=v` joined by ", "). Series without labels, such as an InfluxQL query over
  several measurements without GROUP BY returns (one series per measurement, each
  labelled with its tags only: grafana/grafana-influxdb-datasource
  pkg/influxdb/influxql/buffered/response_parser.go; Grafana adds no distinguishing
  label for InfluxDB, pkg/expr/converter.go checkIfSeriesNeedToBeFixed), are such
  duplicates.
"""

from __future__ import annotations

import math as _math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Labels = dict[str, str]
Float = float | None


@dataclass(frozen=True)
class Series:
    labels: Labels
    points: tuple[tuple[int, Float], ...]  # (time in ms, value or null)


@dataclass(frozen=True)
class Number:
    labels: Labels
    value: Float


@dataclass(frozen=True)
class Scalar:
    """A literal of a math expression: it carries no labels, so it pairs with everything."""

    value: Float
    labels: Labels = field(default_factory=dict)


class NoData:
    """The result of a query (or expression over one) that returned nothing."""

    @property
    def labels(self) -> Labels:
        return {}

    def __repr__(self) -> str:
        return "NoData"


NO_DATA = NoData()
Value = Series | Number | Scalar | NoData
Results = list[Value]


class ExpressionError(ValueError):
    """An expression Grafana would refuse (unknown function, bad syntax, unknown refId)."""


class DuplicateResults(ExpressionError):
    """The condition has two results with the same labels: Grafana makes the whole rule one Error."""


# ---------------------------------------------------------------- reduce


def _finite(value: Float) -> bool:
    return value is not None and not _math.isnan(value) and not _math.isinf(value)


def _strict(values: Sequence[Float], reducer: str) -> Float:
    if reducer == "count":
        return float(len(values))
    if reducer == "last":
        return values[-1] if values else _math.nan
    if any(v is None or _math.isnan(v) for v in values):
        return _math.nan
    numbers = [v for v in values if v is not None]
    if reducer == "sum":
        return float(sum(numbers))
    if reducer == "mean":
        return float(sum(numbers)) / len(numbers) if numbers else _math.nan
    if not numbers:
        return _math.nan
    return float(min(numbers) if reducer == "min" else max(numbers))


def reduce_values(values: Sequence[Float], reducer: str, mode: str = "", replace_with: float = 0.0) -> Float:
    """One series' values to one number, as reduce.go does."""
    if reducer not in ("sum", "mean", "min", "max", "count", "last"):
        raise ExpressionError(f"reduction {reducer} not implemented")
    if mode == "dropNN":
        result = _strict([v for v in values if _finite(v)], reducer)
        return None if result is not None and _math.isnan(result) else result
    if mode == "replaceNN":
        result = _strict([v if _finite(v) else replace_with for v in values], reducer)
        return replace_with if result is not None and _math.isnan(result) else result
    return _strict(values, reducer)


def reduce(results: Results, reducer: str, mode: str = "", replace_with: float = 0.0) -> Results:
    out: Results = []
    for item in results:
        if isinstance(item, NoData):
            out.append(NO_DATA)
        elif isinstance(item, Series):
            out.append(Number(item.labels, reduce_values([v for _, v in item.points], reducer, mode, replace_with)))
        else:  # a number reduces to itself
            out.append(Number(item.labels, item.value))
    return out


# ---------------------------------------------------------------- math


def binary_op(op: str, a: float, b: float) -> float:
    """exp.go binaryOp on two non-null floats."""
    if op == "||" and a != 0:
        return 1.0
    if op == "&&" and a == 0:
        return 0.0
    if _math.isnan(a) or _math.isnan(b):
        return _math.nan
    try:
        return {
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            # Go's float division: x/0 is +-Inf, 0/0 NaN.
            "/": lambda: a / b if b else (_math.nan if a == 0 else _math.copysign(_math.inf, a)),
            "%": lambda: _math.fmod(a, b) if b else _math.nan,
            "**": lambda: a**b,
            "==": lambda: float(a == b),
            "!=": lambda: float(a != b),
            ">": lambda: float(a > b),
            "<": lambda: float(a < b),
            ">=": lambda: float(a >= b),
            "<=": lambda: float(a <= b),
            "||": lambda: float(a != 0 or b != 0),
            "&&": lambda: float(a != 0 and b != 0),
        }[op]()
    except KeyError:
        raise ExpressionError(f"expr: unknown operator {op}") from None


def _contains(big: Labels, small: Labels) -> bool:
    return all(big.get(k) == v for k, v in small.items())


def _union(a: Results, b: Results) -> list[tuple[Labels, Value, Value]]:
    """exp.go union: which values of each side meet, and the labels of the result."""
    if not a or not b:
        return []
    if (len(a) == 1 or len(b) == 1) and (isinstance(a[0], NoData) or isinstance(b[0], NoData)):
        return [({}, a[0], b[0])]
    pairs = []
    for x in a:
        for y in b:
            la, lb = x.labels, y.labels
            if la == lb or not la or not lb:
                labels = la or lb
            elif len(la) == len(lb):
                continue
            elif _contains(la, lb):
                labels = la
            elif _contains(lb, la):
                labels = lb
            else:
                continue
            pairs.append((labels, x, y))
    if not pairs and len(a) == 1 and len(b) == 1:
        pairs.append(({}, a[0], b[0]))
    return pairs


def _apply(op: str, x: Float, y: Float) -> Float:
    return None if x is None or y is None else binary_op(op, x, y)


def _binary(op: str, a: Results, b: Results) -> Results:
    out: Results = []
    for labels, x, y in _union(a, b):
        if isinstance(x, NoData) or isinstance(y, NoData):
            out.append(NO_DATA)
        elif isinstance(x, Series) and isinstance(y, Series):
            times = dict(y.points)
            points = tuple((t, _apply(op, v, times[t])) for t, v in x.points if t in times)
            out.append(Series(labels, points))
        elif isinstance(x, Series):
            out.append(Series(labels, tuple((t, _apply(op, v, y.value)) for t, v in x.points)))
        elif isinstance(y, Series):
            out.append(Series(labels, tuple((t, _apply(op, x.value, v)) for t, v in y.points)))
        elif isinstance(x, Scalar) and isinstance(y, Scalar):
            out.append(Scalar(_apply(op, x.value, y.value)))
        else:
            out.append(Number(labels, _apply(op, x.value, y.value)))
    return out


def _unary(op: str, a: Results) -> Results:
    def one(v: Float) -> Float:
        if v is None:
            return None
        if _math.isnan(v):
            return _math.nan
        return float(v == 0) if op == "!" else -v

    out: Results = []
    for item in a:
        if isinstance(item, NoData):
            out.append(NO_DATA)
        elif isinstance(item, Series):
            out.append(Series(item.labels, tuple((t, one(v)) for t, v in item.points)))
        elif isinstance(item, Scalar):
            out.append(Scalar(one(item.value)))
        else:
            out.append(Number(item.labels, one(item.value)))
    return out


_TOKEN = re.compile(
    r"\s*(?:(?P<var>\$\{[^}]+\}|\$[A-Za-z_][A-Za-z0-9_]*)|(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"
    r"|(?P<op>\*\*|&&|\|\||==|!=|>=|<=|[-+*/%><!()]))"
)
# Precedence, loosest first (pkg/expr/mathexp/parse/parse.go: O ||, A &&, C comparisons, P + -, M * / %,
# then E ** and F, the operand with its sign).
_LEVELS: tuple[tuple[str, ...], ...] = (
    ("||",),
    ("&&",),
    ("==", "!=", ">", "<", ">=", "<="),
    ("+", "-"),
    ("*", "/", "%"),
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match:
            raise ExpressionError(f"invalid math expression {text!r} at position {position}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        position = match.end()
    return out


def evaluate_math(expression: str, variables: Mapping[str, Results]) -> Results:
    """A math expression over other refIds' results ($A or ${A})."""
    items = _tokens(expression)
    position = 0

    def peek() -> tuple[str, str]:
        return items[position] if position < len(items) else ("end", "")

    def take() -> tuple[str, str]:
        nonlocal position
        item = peek()
        position += 1
        return item

    def level(depth: int) -> Results:
        if depth == len(_LEVELS):
            return power()
        left = level(depth + 1)
        while peek()[0] == "op" and peek()[1] in _LEVELS[depth]:
            op = take()[1]
            left = _binary(op, left, level(depth + 1))
        return left

    def power() -> Results:  # E = F {"**" F}: left to right
        left = unary()
        while peek() == ("op", "**"):
            take()
            left = _binary("**", left, unary())
        return left

    def unary() -> Results:  # F = v | "(" O ")" | "!" F | "-" F: a sign binds tighter than **
        if peek()[0] == "op" and peek()[1] in ("-", "!"):
            op = take()[1]
            return _unary(op, unary())
        return atom()

    def atom() -> Results:
        kind, text = take()
        if kind == "num":
            return [Scalar(float(text))]
        if kind == "var":
            name = text[2:-1] if text.startswith("${") else text[1:]
            if name not in variables:
                raise ExpressionError(f"unknown refId {name} in {expression!r}")
            return list(variables[name])
        if (kind, text) == ("op", "("):
            inner = level(0)
            if take() != ("op", ")"):
                raise ExpressionError(f"missing ) in {expression!r}")
            return inner
        raise ExpressionError(f"unexpected {text or 'end'} in {expression!r}")

    result = level(0)
    if peek()[0] != "end":
        raise ExpressionError(f"unexpected {peek()[1]} in {expression!r}")
    return result


# ---------------------------------------------------------------- threshold


THRESHOLD_EXPRESSIONS: dict[str, Callable[[Sequence[float]], str]] = {
    "gt": lambda p: f"$X > {p[0]!r}",
    "lt": lambda p: f"$X < {p[0]!r}",
    "within_range": lambda p: f"$X > {p[0]!r} && $X < {p[1]!r}",
    "outside_range": lambda p: f"$X < {p[0]!r} || $X > {p[1]!r}",
}


def threshold(results: Results, kind: str, params: Sequence[float]) -> Results:
    try:
        expression = THRESHOLD_EXPRESSIONS[kind]([float(p) for p in params])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ExpressionError(f"threshold {kind} with params {list(params)} is not valid") from None
    return evaluate_math(expression, {"X": results})


# ---------------------------------------------------------------- condition


NORMAL, ALERTING, NODATA = "Normal", "Alerting", "NoData"


def labels_text(labels: Labels) -> str:
    """Labels as Grafana prints them in its messages (data.Labels.String): sorted `k=v`, joined by ", "."""
    return ", ".join(f"{key}={labels[key]}" for key in sorted(labels))


def condition_states(results: Results) -> list[tuple[Labels, str, Float]]:
    """Per alert instance: (labels, state, value), as eval.go turns the condition into states.

    DuplicateResults when two instances have the same labels: eval.go then replaces
    every state by one Error, so the rule's execErrState decides.
    """
    out = []
    for item in results:
        if isinstance(item, NoData):
            out.append(({}, NODATA, None))
        elif isinstance(item, Series):
            raise ExpressionError("the condition is a time series: reduce it first")
        elif item.value is None:
            out.append((item.labels, NODATA, None))
        else:
            out.append((item.labels, NORMAL if item.value == 0 else ALERTING, item.value))
    seen: set[str] = set()
    for labels, _, _ in out:
        text = labels_text(labels)
        if text in seen:
            # invalidEvalResultFormatError with no refID: "...for the alert definition : <reason>".
            raise DuplicateResults(
                "invalid format of evaluation results for the alert definition : frame cannot uniquely be "
                f"identified by its labels: has duplicate results with labels {{{text}}}"
            )
        seen.add(text)
    return out
