"""Grafana's expression semantics as the simulator models them, case by case.

Each expectation is what grafana/grafana's own code does (cited in
simulator/expressions.py): pkg/expr/mathexp/reduce.go and its reduce_test.go,
pkg/expr/mathexp/exp.go (binaryOp, union), pkg/expr/threshold.go and
pkg/services/ngalert/eval/eval.go (evaluateExecutionResult).
"""

from __future__ import annotations

import math

import pytest

from simulator import expressions as ex

NAN, INF = math.nan, math.inf


def series(values: list[float | None], **labels: str) -> ex.Series:
    return ex.Series(dict(labels), tuple((1000 * i, v) for i, v in enumerate(values)))


def number(value: float | None, **labels: str) -> ex.Number:
    return ex.Number(dict(labels), value)


def value(results: ex.Results, index: int = 0) -> float | None:
    item = results[index]
    assert isinstance(item, ex.Number | ex.Scalar), item
    return item.value


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize(
    ("values", "reducer", "mode", "expected"),
    [
        ([1.0, 2.0, 6.0], "mean", "", 3.0),
        ([1.0, 2.0, 6.0], "last", "", 6.0),
        ([1.0, NAN, 6.0], "sum", "", NAN),  # strict: a NaN poisons sum, mean, min, max
        ([1.0, None, 6.0], "max", "", NAN),  # ... and so does a null
        ([1.0, 2.0, None], "last", "", None),  # last is the last point, null included
        ([], "sum", "", 0.0),  # the sum of nothing is 0
        ([], "mean", "", NAN),  # 0/0
        ([], "last", "", NAN),
        ([], "count", "", 0.0),
        ([1.0, NAN, INF, None, 6.0], "count", "", 5.0),
        ([1.0, NAN, INF, None, 6.0], "sum", "dropNN", 7.0),  # NaN, Inf and null dropped first
        ([1.0, NAN, INF, None, 6.0], "count", "dropNN", 2.0),
        ([NAN, None], "mean", "dropNN", None),  # nothing left: NaN turned into null -> NoData
        ([NAN, None], "last", "replaceNN", 1.0),  # replaced by the value
        ([2.0, NAN], "sum", "replaceNN", 3.0),
        ([INF, 1.0], "max", "", INF),  # strict mode keeps infinities
    ],
)
def test_reduce(values: list[float | None], reducer: str, mode: str, expected: float | None) -> None:
    result = ex.reduce_values(values, reducer, mode, replace_with=1.0)
    assert same(result, expected), (values, reducer, mode, result)


def test_reduce_keeps_labels_and_passes_no_data_on() -> None:
    out = ex.reduce([series([1.0, 3.0], uid="1"), series([5.0], uid="2")], "max")
    assert [(n.labels, n.value) for n in out] == [({"uid": "1"}, 3.0), ({"uid": "2"}, 5.0)]
    assert ex.reduce([ex.NO_DATA], "last") == [ex.NO_DATA]


def test_unknown_reducer_is_refused() -> None:
    with pytest.raises(ex.ExpressionError):
        ex.reduce_values([1.0], "median")


@pytest.mark.parametrize(
    ("op", "a", "b", "expected"),
    [
        (">", 2.0, 1.0, 1.0),
        (">", NAN, 1.0, NAN),  # a NaN comparison is NaN, not 0: the condition then alerts
        ("||", 1.0, NAN, 1.0),  # short-circuit before the NaN check
        ("&&", 0.0, NAN, 0.0),
        ("&&", 1.0, NAN, NAN),
        ("==", 0.0, 0.0, 1.0),
        (">=", 1.0, 1.0, 1.0),
        ("/", 1.0, 0.0, INF),
        ("/", 0.0, 0.0, NAN),
        ("%", 5.0, 3.0, 2.0),
        ("**", 2.0, 3.0, 8.0),
    ],
)
def test_binary_op(op: str, a: float, b: float, expected: float) -> None:
    assert same(ex.binary_op(op, a, b), expected)


def test_math_pairs_values_by_labels_and_drops_the_unmatched() -> None:
    a = [number(5.0, uid="1"), number(1.0, uid="2"), number(9.0, uid="3")]
    b = [number(2.0, uid="1"), number(2.0, uid="2")]
    out = ex.evaluate_math("$A > $B", {"A": a, "B": b})
    assert [(n.labels, n.value) for n in out] == [({"uid": "1"}, 1.0), ({"uid": "2"}, 0.0)]  # uid 3 dropped


def test_math_a_value_without_labels_meets_every_value() -> None:
    a = [number(5.0, uid="1", role="miner"), number(1.0, uid="2", role="miner")]
    out = ex.evaluate_math("$A > ${B} * 2", {"A": a, "B": [number(2.0)]})
    assert [n.value for n in out] == [1.0, 0.0]
    assert out[0].labels == {"uid": "1", "role": "miner"}


def test_math_subset_labels_match_and_take_the_larger_set() -> None:
    a = [number(5.0, uid="1", gpu_index="0")]
    out = ex.evaluate_math("$A + $B", {"A": a, "B": [number(1.0, uid="1"), number(7.0, uid="2")]})
    assert [(n.labels, n.value) for n in out] == [({"uid": "1", "gpu_index": "0"}, 6.0)]


def test_math_one_against_one_always_pairs_and_strips_labels() -> None:
    out = ex.evaluate_math("$A - $B", {"A": [number(5.0, uid="1")], "B": [number(2.0, uid="2")]})
    assert [(n.labels, n.value) for n in out] == [({}, 3.0)]


def test_math_with_no_data_gives_no_data_and_null_propagates() -> None:
    assert ex.evaluate_math("$A > $B", {"A": [number(1.0, uid="1")], "B": [ex.NO_DATA]}) == [ex.NO_DATA]
    assert value(ex.evaluate_math("$A + 1", {"A": [number(None, uid="1")]})) is None


def test_math_precedence_parentheses_and_unary() -> None:
    assert value(ex.evaluate_math("1 + 2 * 3 > 6 && !(2 < 1)", {})) == 1.0
    assert value(ex.evaluate_math("-2 ** 2", {})) == 4.0  # the sign belongs to the operand (parse.go F)
    assert value(ex.evaluate_math("2 ** 3 ** 2", {})) == 64.0  # ** from left to right (parse.go E)
    assert value(ex.evaluate_math("(1 + 2) * 3", {})) == 9.0
    assert value(ex.evaluate_math("1 || 0 && 0", {})) == 1.0  # && binds tighter than ||


@pytest.mark.parametrize("text", ["$A >", "$A ? 1", "$Z > 1", "(1 + 2"])
def test_math_refuses_what_grafana_refuses(text: str) -> None:
    with pytest.raises(ex.ExpressionError):
        ex.evaluate_math(text, {"A": [number(1.0)]})


def test_math_over_series_works_point_by_point() -> None:
    out = ex.evaluate_math("$A * 2", {"A": [series([1.0, None, 3.0], uid="1")]})
    assert isinstance(out[0], ex.Series) and [v for _, v in out[0].points] == [2.0, None, 6.0]


@pytest.mark.parametrize(
    ("kind", "params", "inputs", "expected"),
    [
        ("gt", [95], [96.0, 95.0, NAN], [1.0, 0.0, NAN]),
        ("lt", [1], [0.0, 1.0], [1.0, 0.0]),
        ("within_range", [1, 5], [1.0, 3.0, 5.0], [0.0, 1.0, 0.0]),  # exclusive bounds
        ("outside_range", [1, 5], [0.0, 1.0, 6.0], [1.0, 0.0, 1.0]),
    ],
)
def test_threshold(kind: str, params: list[float], inputs: list[float], expected: list[float]) -> None:
    out = ex.threshold([number(v, i=str(i)) for i, v in enumerate(inputs)], kind, params)
    assert all(same(value(out, i), e) for i, e in enumerate(expected)), out


def test_threshold_refuses_a_missing_bound() -> None:
    with pytest.raises(ex.ExpressionError):
        ex.threshold([number(1.0)], "within_range", [1])


def test_condition_states_are_evaluated_as_grafana_does() -> None:
    values = [number(0.0, uid="1"), number(1.0, uid="2"), number(NAN, uid="3"), number(None, uid="4")]
    states = ex.condition_states(values)
    assert [s for _, s, _ in states] == [ex.NORMAL, ex.ALERTING, ex.ALERTING, ex.NODATA]
    assert ex.condition_states([ex.NO_DATA])[0][1] == ex.NODATA
    with pytest.raises(ex.ExpressionError):
        ex.condition_states([series([1.0])])


def test_results_with_the_same_labels_make_the_rule_one_error() -> None:
    # Two series without tags (two measurements of one InfluxQL query) reduced and compared.
    reduced = ex.reduce([series([1.0]), series([2.0])], "sum")
    with pytest.raises(ex.DuplicateResults, match=r"has duplicate results with labels \{\}$"):
        ex.condition_states(ex.evaluate_math("$B < 0", {"B": reduced}))
    with pytest.raises(ex.DuplicateResults, match=r"labels \{role=miner, uid=1\}$"):
        ex.condition_states([number(0.0, uid="1", role="miner"), number(1.0, role="miner", uid="1")])
    # Different labels, or labels that only share a subset, are distinct instances.
    assert len(ex.condition_states([number(0.0, uid="1"), number(0.0, uid="1", role="miner")])) == 2
