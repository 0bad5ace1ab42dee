"""The record `MetricsLogger.log` queues, and its unpacking on the sender thread.

A record is one dict: the copy of the caller's fields, with the measurement, the
timestamp, the tags and the sampling flags under private keys (`object()`
instances, which no caller can pass as a field name). Why not a tuple of the
measurement, the tags dict and the fields dict: the garbage collector does not
track a dict built from numbers and strings, but tracks every tuple that holds a
dict. Tuple records waiting in a flood (hundreds of thousands when the
caller outpaces the sender) made every full collection walk them all: 0.7-0.9 µs
per point of the client's CPU in `bench_throughput.py`, and stalls of the
caller, which runs the collections its allocations trigger. So the tags are a
number too: `TagSets` gives each measurement's distinct sets of tags one.

The sender unpacks records into `Record` tuples (`unpack_many`) before it
encodes them, the tags still a number; a tuple record (the logger's own
self-metrics) passes as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import count, repeat
from typing import Any

# What the sink encodes: (measurement, tags, fields, timestamp, with_system_metrics, with_gpu_metrics). The tags
# are the caller's (a copy), None, or the `TagSets` number that stands for them: the sink caches a series by it.
Record = tuple[str, dict | int | None, dict, Any, bool, bool]

MEASUREMENT = object()
TIME = object()
TAGS = object()  # a `TagSets` number, or a copy of the caller's tags when they cannot have one
SAMPLED = object()  # present only when system or GPU metrics are asked for: SYSTEM | GPU
SYSTEM = 1
GPU = 2
# A SAMPLED value -> whether it asks for system metrics, and for GPU metrics.
_SYSTEM_OF = (False, True, False, True)
_GPU_OF = (False, False, True, True)
_DICT = {dict}


class TagSets:
    """A number for each distinct measurement and set of tags (its items, in order), shared by caller and sender.

    Per measurement, as the sink's series cache is keyed: tags that compare equal
    but read differently (`True` and `1`) are one set there too. Callers may run on
    several threads: a number is registered before it is published, and
    `setdefault` picks one number per set when two race (the loser's entry stays,
    unused). Numbered sets are kept for the logger's life, up to `LIMIT`.
    """

    LIMIT = 10_000  # sets numbered; beyond it a record holds its copy of the tags

    def __init__(self) -> None:
        self.numbers: dict[tuple, int] = {}  # (measurement, the items of its tags) -> a number
        self.by_number: dict[int, dict] = {}
        self._next = count()

    def ref(self, measurement: str, tags: Mapping[Any, Any]) -> int | dict:
        """The number of `tags` logged to `measurement`, or a copy of them (unhashable values, too many sets).

        `MetricsLogger.log` looks a known set up in `numbers` itself and calls this for the others.
        """
        try:
            key = (measurement, tuple(tags.items()))
            number = self.numbers.get(key)
        except (TypeError, AttributeError):  # unhashable values; pairs rather than a mapping
            return dict(tags)
        if number is not None:
            return number
        if len(self.numbers) >= self.LIMIT:
            return dict(tags)
        number = next(self._next)
        self.by_number[number] = dict(key[1])
        return self.numbers.setdefault(key, number)

    def tags(self, ref: int | dict | None) -> dict | None:
        """The tags a record's TAGS value stands for."""
        return self.by_number[ref] if type(ref) is int else ref


def unpack_many(records: list[Any], sampling_asked: bool = True) -> list[Record]:
    """The records as `Record` tuples, in order; each dict record loses its private keys (the rest is fields).

    A chunk of dict records alone is unpacked a key at a time over all of them
    (`map`, in C), else record by record. `sampling_asked` False says that no
    record holds SAMPLED (no point asked for system or GPU metrics): nothing to pop.
    """
    if set(map(type, records)) != _DICT:
        return [_unpack(record) if type(record) is dict else record for record in records]
    measurements = list(map(dict.pop, records, repeat(MEASUREMENT)))
    stamps = list(map(dict.pop, records, repeat(TIME)))
    tags = list(map(dict.pop, records, repeat(TAGS), repeat(None)))
    sampled = list(map(dict.pop, records, repeat(SAMPLED), repeat(0))) if sampling_asked else ()
    if any(sampled):
        systems: Iterable[bool] = map(_SYSTEM_OF.__getitem__, sampled)
        gpus: Iterable[bool] = map(_GPU_OF.__getitem__, sampled)
    else:
        systems = gpus = repeat(False)
    return list(zip(measurements, tags, records, stamps, systems, gpus, strict=False))  # (repeat is endless)


def _unpack(record: dict) -> Record:
    measurement, ts = record.pop(MEASUREMENT), record.pop(TIME)
    tags = record.pop(TAGS, None)
    sampled = record.pop(SAMPLED, 0)
    return (measurement, tags, record, ts, _SYSTEM_OF[sampled], _GPU_OF[sampled])
