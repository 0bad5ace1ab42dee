"""The field typing rule: how Python values become InfluxDB fields.

InfluxDB fixes a field's type at its first write in a shard; writing `1` (integer)
and later `0.5` (float) to the same field is a "field type conflict" and the
second write is refused. So every number is written as a float:

- every real number becomes the float `float(value)` gives: int, float, bool
  (as 1.0/0.0), NumPy scalars of every integer, float and bool dtype, 0-d arrays,
  PyTorch 0-d tensors, any `numbers.Real` (Fraction) and other non-complex
  objects with `__float__` (Decimal). Integers above 2**53 lose precision.
  Complex values are not real numbers: `unsupported_type`.
- NaN and ±infinity are dropped from the point (`non_finite`); None is dropped,
  never turned into 0.0 (`none_value`).
- a list, tuple or 1-D array of numbers becomes `<key>_mean`, `<key>_min`,
  `<key>_max`, `<key>_median` over its finite values.
- str stays a string field (up to `max_string_bytes`, else `too_large`).
- anything else is dropped (`unsupported_type`), with one warning per type.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain

import orjson

from telemetry_client._engine.self_log import warn
from telemetry_client._influx.line_protocol import escape_key, format_field, valid_key

DEFAULT_MAX_STRING_BYTES = 64 * 1024
Drop = Callable[[str, int], None]


def _as_number(value: object) -> float | None:
    """`float(value)` for a real number of any kind, None when `value` is not one.

    Always a plain Python float: a float subclass such as NumPy 2's `np.float64`
    must not reach the encoder, whose `repr` would write `np.float64(0.25)`.
    Real numbers are `numbers.Real` (int, bool, Fraction, NumPy integer and float
    scalars), 0-d arrays and tensors of a real or bool dtype (NumPy, PyTorch:
    their `.item()`), NumPy bools (`.item()` is a bool: 1.0/0.0), and other objects
    with `__float__` that are not complex (Decimal).
    """
    if type(value) is float:
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str | bytes | bytearray | numbers.Complex):
        return None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        item = value.item()  # type: ignore[attr-defined]
        return float(item) if isinstance(item, numbers.Real) else None
    if hasattr(value, "__float__"):
        return float(value)  # type: ignore[arg-type]
    return None


def list_stats(values: list[float]) -> dict[str, float]:
    """Mean, min, max and median of finite values (the seed's list treatment)."""
    return {
        "mean": math.fsum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "median": statistics.median(values),
    }


def normalize_fields(
    fields: Mapping[object, object], drop: Drop, max_string_bytes: int = DEFAULT_MAX_STRING_BYTES
) -> dict[str, float | str]:
    """Apply the typing rule; every value left out is counted through `drop`."""
    out: dict[str, float | str] = {}
    for key, value in fields.items():
        if not valid_key(key):
            drop("invalid", 1)
            warn.warning(f"field-key:{key!r}", "dropped field with an invalid key %r", key)
            continue
        if value is None:
            drop("none_value", 1)
            continue
        if isinstance(value, str):
            if len(value.encode("utf-8", "surrogatepass")) > max_string_bytes:
                drop("too_large", 1)
            else:
                out[key] = value  # type: ignore[index]
            continue
        if isinstance(value, list | tuple) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) >= 1):
            items = value.tolist() if hasattr(value, "tolist") else value  # type: ignore[union-attr]
            _add_list(out, key, items, drop)  # type: ignore[arg-type]
            continue
        number = _finite_number(value, drop)
        if number is not None:
            out[key] = number  # type: ignore[index]
    return out


def _finite_number(value: object, drop: Drop) -> float | None:
    """`value` as a finite float, or None after counting why it is not one."""
    try:
        number = _as_number(value)
    except OverflowError:
        drop("too_large", 1)
        return None
    except (TypeError, ValueError):
        number = None
    if number is None:
        drop("unsupported_type", 1)
        name = type(value).__name__
        warn.once(f"type:{name}", "dropped field values of unsupported type %s (see the typing rule)", name)
        return None
    if not math.isfinite(number):
        drop("non_finite", 1)
        return None
    return number


def _add_list(out: dict[str, float | str], key: str, items: list[object], drop: Drop) -> None:
    numbers = [number for number in (_finite_number(item, drop) for item in items) if number is not None]
    if not numbers:
        if not items:
            drop("invalid", 1)  # an empty list has no statistics
        return
    for stat, number in list_stats(numbers).items():
        out[f"{key}_{stat}"] = number


class FieldEncoder:
    """Encodes a field dict straight to line protocol, with the typing rule above.

    The validated, escaped and sorted key order is cached per key set. When every
    value is a finite float (or an int up to 2**53, whose text is the same), the
    whole field set is written by orjson in one call, in C (its JSON object, with
    the braces and quotes taken out and `:` made `=`); a chunk of such sets is one
    call (`plain_many`), about a microsecond per ten-field set on the sender
    thread. orjson writes a float's shortest round-trip form as `repr` does,
    except from 1e-9 up to 1e-4 (`0.00001`, `1e-6` where `repr` writes `1e-05`,
    `1e-06`), which `_line_protocol_fields` rewrites. Keys that orjson would not
    write as line protocol needs take one `%` operation over `repr`; other values
    the general path, field by field. Output is identical either way.
    """

    MAX_PLANS = 4096

    def __init__(self, max_string_bytes: int = DEFAULT_MAX_STRING_BYTES) -> None:
        self.max_string_bytes = max_string_bytes
        self._plans: dict[tuple, _Plan] = {}
        self._as_is_keys: set[str] = set()  # keys `plain_many` writes as they are

    def _plan(self, keys: tuple) -> _Plan:
        plan = _Plan(keys)
        if len(self._plans) < self.MAX_PLANS:
            self._plans[keys] = plan
        return plan

    def plain(self, fields: Mapping[object, object]) -> bytes | None:
        """The fast path: the text of a field set whose values are all finite floats (or small ints), else None.

        Nothing is dropped or counted here: None sends the fields to `encode`.
        """
        keys = tuple(fields)
        plan = self._plans.get(keys) or self._plan(keys)
        if plan.template is None:
            return None
        values = fields.values()
        types = set(map(type, values))
        if types == _FLOAT or (types <= _NUMBER and _small_ints(values)):
            total = sum(values)
            if total - total == 0.0:  # every value finite
                if plan.dumps_option is not None:
                    try:
                        return _line_protocol_fields(orjson.dumps(fields, option=plan.dumps_option))[1:-1]
                    except TypeError:  # a key equal to the plan's but of a str subclass, which orjson refuses
                        pass
                text = (plan.template % plan.values_of(fields)).replace(".0,", ",")[:-1]
                return text.encode()
        return None

    def plain_many(self, field_sets: Sequence[dict]) -> list[bytes] | None:
        """`plain` for many field dicts in a few calls, or None unless every one is plain and non-empty.

        One orjson call writes them all, and one type check, one finiteness check and
        one set of replacements cover them: for the common chunk of training steps this
        costs a fraction of `plain` per dict. Keys must all be ones orjson writes as they
        are (checked once per key).
        """
        values = list(chain.from_iterable(map(dict.values, field_sets)))
        types = set(map(type, values))
        if types != _FLOAT and not (
            types <= _NUMBER and values and min(values) >= -_EXACT_INT and max(values) <= _EXACT_INT
        ):
            return None  # not numbers alone (a bool is not an int here), or ints beside a value too large to tell
        total = sum(values)
        if total - total != 0.0 or not all(field_sets):  # a value not finite, or a dict with no fields
            return None
        keys = set().union(*field_sets)
        if not keys <= self._as_is_keys and not self._approve(keys):
            return None
        # `[{"a":1.0,"b":2.5},{...}]` -> `[,a=1,b=2.5,,,...,]` -> [`a=1,b=2.5`, ...]
        try:
            json = orjson.dumps(field_sets, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a key of a str subclass, equal to an approved key: orjson refuses it
            return None
        texts = _line_protocol_fields(json)[2:-2].split(b",,,")
        return texts if len(texts) == len(field_sets) else None

    def _approve(self, keys: set) -> bool:
        """Remember the keys `plain_many` may write as they are; False when one of `keys` is not such a key."""
        if not all(type(key) is str and _Plan((key,)).dumps_option is not None for key in keys):
            return False
        if len(self._as_is_keys) < self.MAX_PLANS:
            self._as_is_keys.update(keys)
        return True

    def encode(self, fields: Mapping[object, object], drop: Drop) -> bytes:
        """`key=value,...` sorted by key; empty when no field survives (the caller counts that).

        Raises UnicodeEncodeError for text that is not valid Unicode (a lone surrogate).
        """
        text = self.plain(fields)
        if text is not None:
            return text
        keys = tuple(fields)
        plan = self._plans.get(keys) or self._plan(keys)
        drop = getattr(drop, "part", drop)  # a field value is a part of its point (see the engine's counters)
        parts = []
        for key, prefix in plan.entries:
            if prefix is None:
                normalize_fields({key: fields[key]}, drop)  # counts and warns about the invalid key
                continue
            for name, clean in sorted(normalize_fields({key: fields[key]}, drop, self.max_string_bytes).items()):
                parts.append(f"{escape_key(name)}={format_field(clean)}")
        return ",".join(parts).encode()


_FLOAT = {float}
_NUMBER = {float, int}
# orjson's JSON of field dicts made line protocol (`_line_protocol_fields`): `:` is `=`, braces become commas.
_JSON_TO_FIELDS = bytes.maketrans(b":{}", b"=,,")
# The floats orjson writes unlike `repr` (its exponents from -5 to -9), as found in its JSON: after a key's `:`,
# before the `,` or `}` that ends the value, so never inside a key's quotes.
_EXPONENT_5 = re.compile(rb":(-?)0\.0000([1-9])([0-9]*)")  # 0.000015 for 1.5e-05
_EXPONENT_6_TO_9 = re.compile(rb"e-([6-9])(?=[,}])")  # 1.5e-6 for 1.5e-06


def _line_protocol_fields(json: bytes) -> bytes:
    """orjson's JSON of a field dict (or a list of them) with its floats in `repr`'s form, as line protocol.

    `{"a":1.0,"b":2.5e-6}` -> `,a=1,b=2.5e-06,`: quotes out, `:` made `=`, braces made
    commas, integral floats without `.0` (as `repr` without it: Point's form).
    """
    if b"0.0000" in json:
        json = _EXPONENT_5.sub(_repr_exponent_5, json)
    if b"-" in json and b"e-" in json:  # memchr first: most chunks hold no minus sign at all
        json = _EXPONENT_6_TO_9.sub(rb"e-0\1", json)
    return b",".join(json.translate(_JSON_TO_FIELDS, b'"').split(b".0,"))  # split and join: faster than replace


def _repr_exponent_5(match: re.Match[bytes]) -> bytes:
    sign, first, rest = match.groups()
    return b":%s%s%s%se-05" % (sign, first, b"." if rest else b"", rest)


# Up to this magnitude an int is a float exactly, and its text is that float's `repr` without ".0".
_EXACT_INT = 2**53
# What a key orjson writes into line protocol as it is may not hold: what line protocol escapes
# (`escape_key`), what JSON escapes (quotes, backslashes, control characters) and what `plain`
# takes out or replaces (braces, colons).
_NOT_AS_IS = frozenset(',= "\\{}:') | frozenset(map(chr, range(32)))


def _encodable(text: str) -> bool:
    """False for text holding a lone surrogate, which orjson refuses (the general path counts it)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _small_ints(values: Iterable[object]) -> bool:
    return all(-_EXACT_INT <= value <= _EXACT_INT for value in values if type(value) is int)  # type: ignore[operator]


class _Plan:
    """The sorted, escaped field keys of one key set, a `%` template when all keys are valid, and orjson's option.

    `dumps_option` is None when some key is not written by orjson as line protocol
    needs it; else the option that sorts the keys, or 0 when they come sorted.
    """

    __slots__ = ("dumps_option", "entries", "keys", "template", "values_of")

    def __init__(self, keys: tuple) -> None:
        self.entries = sorted(
            ((key, f"{escape_key(key)}=" if valid_key(key) else None) for key in keys),
            key=lambda entry: str(entry[0]),
        )
        self.keys = tuple(key for key, _ in self.entries)
        getter = operator.itemgetter(*self.keys) if self.keys else (lambda fields: ())
        self.values_of = getter if len(self.keys) != 1 else (lambda fields: (getter(fields),))
        valid = all(prefix is not None for _, prefix in self.entries)
        self.template = "".join(f"{prefix.replace('%', '%%')}%r," for _, prefix in self.entries) if valid else None
        as_is = valid and keys and all(type(key) is str for key in keys)
        as_is = as_is and not any(_NOT_AS_IS.intersection(key) or not _encodable(key) for key in keys)
        self.dumps_option = (0 if self.keys == keys else orjson.OPT_SORT_KEYS) if as_is else None
