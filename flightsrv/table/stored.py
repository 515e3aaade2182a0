"""Column values as data files store them, where Parquet cannot hold the Arrow type as is
(docs/PROTOCOL.md §4.3).

Parquet has no seconds unit. A timestamp in seconds (DuckDB's ``TIMESTAMP_S``, Arrow's
``timestamp[s]``, at any depth of a list, struct or map) is stored as milliseconds: every
finite value times 1000, and ``±infinity`` (±(2^63-1) seconds, as DuckDB and Arrow hold it)
as ±(2^63-1) milliseconds, the ``TIMESTAMP_MS`` infinities DuckDB's Parquet reader reads back
as infinity. pyarrow's own conversion multiplies the infinities too and fails with an
overflow, which is why flightsrv converts before writing and after reading. Every finite
``TIMESTAMP_S`` DuckDB accepts fits in milliseconds; a value that does not (only an Arrow
caller can hand one in) is refused with ``SchemaMismatch`` naming the column.

The table schema (the manifest) keeps the logical type; only the files hold the stored one.
Files written before this rule hold seconds under an Arrow schema that says seconds, and
pyarrow reads them as ``timestamp[s]``: :func:`from_stored` takes either.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc

#: DuckDB's (and Arrow's) ±infinity of a 64-bit timestamp, in any unit
INFINITY = 2**63 - 1
_MS_PER_S = 1000


def _is_seconds(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) and t.unit == "s"


def _children(t: pa.DataType) -> list[pa.Field]:
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [t.value_field]
    if pa.types.is_struct(t):
        return [t.field(i) for i in range(t.num_fields)]
    return []


@functools.lru_cache(maxsize=4096)
def needs_conversion(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` is stored as another type (it holds seconds)."""
    return _is_seconds(t) or any(needs_conversion(f.type) for f in _children(t))


def _with_children(t: pa.DataType, fields: list[pa.Field]) -> pa.DataType:
    if pa.types.is_map(t):
        return pa.map_(fields[0], fields[1], t.keys_sorted)
    if pa.types.is_large_list(t):
        return pa.large_list(fields[0])
    if pa.types.is_fixed_size_list(t):
        return pa.list_(fields[0], t.list_size)
    if pa.types.is_list(t):
        return pa.list_(fields[0])
    return pa.struct(fields)


@functools.lru_cache(maxsize=4096)
def stored_type(t: pa.DataType) -> pa.DataType:
    """The type data files hold for logical type ``t`` (field names, nullability and field
    metadata, such as Parquet field ids, kept)."""
    if not needs_conversion(t):
        return t
    if _is_seconds(t):
        return pa.timestamp("ms", tz=t.tz)
    return _with_children(t, [f.with_type(stored_type(f.type)) for f in _children(t)])


def stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field's type as data files store it."""
    if not any(needs_conversion(f.type) for f in schema):
        return schema
    return pa.schema([f.with_type(stored_type(f.type)) for f in schema], schema.metadata)


def _leaf_to_ms(arr: pa.Array) -> pa.Array:
    ticks = arr.cast(pa.int64())
    inf = pc.equal(pc.abs(ticks), INFINITY)
    finite = pc.if_else(inf, 0, ticks)
    try:
        ms = pc.multiply_checked(finite, _MS_PER_S)
    except pa.ArrowInvalid:
        from flightsrv.errors import SchemaMismatch

        raise SchemaMismatch("a timestamp in seconds is beyond what a data file stores "
                             "(about 292 million years from 1970; DuckDB's TIMESTAMP_S "
                             "range fits)") from None
    return pc.if_else(inf, ticks, ms).cast(pa.timestamp("ms", tz=arr.type.tz))


def _leaf_to_s(arr: pa.Array) -> pa.Array:
    if arr.type.unit == "s":
        return arr
    ticks = arr.cast(pa.int64())
    inf = pc.equal(pc.abs(ticks), INFINITY)
    # stored values are whole seconds; any other is floored (integer division truncates)
    secs = pc.divide(pc.subtract(ticks, pc.if_else(pc.less(ticks, 0), _MS_PER_S - 1, 0)),
                     _MS_PER_S)
    return pc.if_else(inf, ticks, secs).cast(pa.timestamp("s", tz=arr.type.tz))


def _convert(arr: pa.Array, t: pa.DataType, leaf) -> pa.Array:
    """``arr`` (of ``t`` or of ``t``'s other form) with every seconds leaf converted by
    ``leaf`` (:func:`_leaf_to_ms` or :func:`_leaf_to_s`)."""
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([_convert(c, t, leaf) for c in arr.chunks],
                                type=_target(t, leaf))
    if _is_seconds(t):
        return leaf(arr)
    target = _target(t, leaf)
    mask = arr.is_null() if arr.null_count else None
    kids = _children(t)
    if pa.types.is_struct(t):
        fields = [arr.field(i) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(
            [_convert(c, k.type, leaf) if needs_conversion(k.type) else c
             for c, k in zip(fields, kids)], fields=list(target), mask=mask)
    if pa.types.is_map(t):
        offsets, lo, n = _rebased(arr)
        keys, items = arr.keys.slice(lo, n), arr.items.slice(lo, n)
        keys = _convert(keys, kids[0].type, leaf) if needs_conversion(kids[0].type) else keys
        items = _convert(items, kids[1].type, leaf) if needs_conversion(kids[1].type) \
            else items
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=mask)
    if pa.types.is_fixed_size_list(t):
        values = arr.flatten() if not arr.null_count else arr.values.slice(
            arr.offset * t.list_size, len(arr) * t.list_size)
        return pa.FixedSizeListArray.from_arrays(_convert(values, kids[0].type, leaf),
                                                 type=target, mask=mask)
    cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    offsets, lo, n = _rebased(arr)
    return cls.from_arrays(offsets, _convert(arr.values.slice(lo, n), kids[0].type, leaf),
                           type=target, mask=mask)


def _rebased(arr) -> tuple[pa.Array, int, int]:
    """A list or map array's offsets starting at 0 (a new array: Arrow refuses a sliced
    offsets array beside a null mask), and the (start, length) of its values."""
    offsets = arr.offsets
    lo, hi = offsets[0].as_py(), offsets[len(offsets) - 1].as_py()
    return pc.subtract(offsets, pa.scalar(lo, offsets.type)), lo, hi - lo


def _target(t: pa.DataType, leaf) -> pa.DataType:
    return stored_type(t) if leaf is _leaf_to_ms else t


def to_stored(arr, t: pa.DataType):
    """Column ``arr`` of logical type ``t`` as data files store it (unchanged for most
    types). Raises ``SchemaMismatch`` for a finite timestamp in seconds past
    milliseconds' range."""
    if not needs_conversion(t):
        return arr
    return _convert(arr, t, _leaf_to_ms)


def from_stored(arr, t: pa.DataType):
    """Column ``arr``, read from a data file, as logical type ``t``: milliseconds that stand
    for seconds become seconds again (infinities kept); an array already of ``t`` (a file
    written before the rule) is returned as is."""
    if not needs_conversion(t) or arr.type == t:
        return arr
    return _convert(arr, t, _leaf_to_s)


#: the largest finite millisecond timestamp DuckDB reads (it reads milliseconds as
#: microseconds: a value times 1000 must stay a 64-bit integer)
MAX_FINITE_MS = INFINITY // 1000


@functools.lru_cache(maxsize=4096)
def holds_milliseconds(t: pa.DataType) -> bool:
    """Whether a stored type ``t`` holds a millisecond timestamp at any depth."""
    if pa.types.is_timestamp(t):
        return t.unit == "ms"
    return any(holds_milliseconds(f.type) for f in _children(t))


def check_readable(arr, t: pa.DataType) -> None:
    """Raise ``SchemaMismatch`` when column ``arr`` of stored type ``t`` holds a finite
    millisecond timestamp DuckDB cannot read (past about 292,000 years from 1970: DuckDB
    reads it as microseconds, and every read of the column would fail, a DELETE of the
    row would not help)."""
    if isinstance(arr, pa.ChunkedArray):
        for c in arr.chunks:
            check_readable(c, t)
        return
    if pa.types.is_timestamp(t):
        if t.unit != "ms" or not len(arr) or arr.null_count == len(arr):
            return
        ticks = pc.abs(arr.cast(pa.int64()))
        bad = pc.and_(pc.greater(ticks, MAX_FINITE_MS), pc.not_equal(ticks, INFINITY))
        if pc.any(bad).as_py():
            from flightsrv.errors import SchemaMismatch

            raise SchemaMismatch("a timestamp is beyond DuckDB's range (about 292,000 years "
                                 "from 1970, the years 290309 BC to 294247; infinity is "
                                 "kept)")
        return
    if not holds_milliseconds(t):
        return
    if pa.types.is_struct(t):
        for i, child in enumerate(arr.flatten()):
            check_readable(child, t.field(i).type)
    elif pa.types.is_map(t):
        check_readable(arr.keys, t.key_type)
        check_readable(arr.items, t.item_type)
    else:
        check_readable(arr.flatten(), t.value_type)


#: DuckDB's (and Arrow's) ±infinity of a DATE, in days
DATE_INFINITY = 2**31 - 1
_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}


def widen(arr, t: pa.DataType):
    """Column ``arr`` cast to the type ``t`` it was widened to (docs/PROTOCOL.md §15.4), as
    DuckDB casts: a DATE's ±infinity becomes the timestamp's ±infinity (Arrow's cast would
    multiply it into a finite instant, or overflow)."""
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([widen(c, t) for c in arr.chunks], type=t)
    if not (pa.types.is_date(arr.type) and pa.types.is_timestamp(t)):
        return arr.cast(t)
    days = arr.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    inf = pc.equal(pc.abs(days), DATE_INFINITY)
    try:
        ticks = pc.multiply_checked(pc.if_else(inf, 0, days), _PER_DAY[t.unit])
    except pa.ArrowInvalid:
        raise pa.ArrowInvalid(f"a date is out of the range of {t}") from None
    signed = pc.if_else(pc.greater(days, 0), INFINITY, -INFINITY)
    return pc.if_else(inf, signed, ticks).cast(t)


__all__ = ["DATE_INFINITY", "INFINITY", "MAX_FINITE_MS", "check_readable", "from_stored",
           "holds_milliseconds", "needs_conversion", "stored_schema", "stored_type",
           "to_stored", "widen"]
