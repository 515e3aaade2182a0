"""Hidden partitioning: partition specs, transforms, and what a partition value proves
(docs/PROTOCOL.md §15).

A *partition spec* is ``{"spec_id": n, "fields": [{"field_id", "source_id", "transform",
"name"}]}``; ``source_id`` is the field id of a top-level column. Transforms (the names and
semantics are Apache Iceberg's, https://iceberg.apache.org/spec/#partition-transforms):

==================  ==============================================  =======================
transform           value                                           source types
==================  ==============================================  =======================
``identity``        the value itself                                ints, bool, string,
                                                                    binary, date, timestamp,
                                                                    decimal
``year``            years since 1970                                date, timestamp
``month``           months since 1970-01                            date, timestamp
``day``             days since 1970-01-01                           date, timestamp
``hour``            hours since 1970-01-01 00:00                    timestamp
``bucket[N]``       ``(murmur3_x86_32(bytes(v)) & 0x7fffffff) % N``  ints, decimal, date,
                                                                    timestamp, string,
                                                                    binary
``truncate[W]``     ints ``v - (v mod W)`` (floor), decimals on     ints, decimal, string,
                    the unscaled value, strings the first W code    binary
                    points, binary the first W bytes
==================  ==============================================  =======================

Timestamps with a time zone are transformed in UTC, timestamps without one on their own
wall clock. ``bucket`` hashes (Iceberg Appendix B, seed 0): integers of every width and
dates (days) as 8-byte little-endian longs, timestamps as microseconds since the epoch
(floor) as such a long, strings as UTF-8 bytes, binary as is, decimals as the minimal
big-endian two's-complement bytes of the unscaled value. So ``bucket[100](34) == 79`` and
``bucket[100](decimal '14.20') == 59`` for every writer. A NULL source value has a NULL
partition value. Floats cannot be partition sources (NaN and -0.0 have no single value).

Pruning (:func:`bounds`): a file's partition value bounds its source values exactly like
statistics do (``day = d`` means every non-NULL value lies in day ``d``; NULL means every
value is NULL), so the engine's pruner treats them as one more set of bounds; ``bucket``
values prune ``=`` / ``IN`` through the hashes of the constants (:func:`bucket_of`). A
partition value never decides that a row matches.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightsrv.errors import ConfigurationError
from flightsrv.table.schema import type_from_json, value_from_json, value_to_json
from flightsrv.table.stored import widen

UNPARTITIONED = {"spec_id": 0, "fields": []}
#: partition field ids start above this (as in Iceberg), so they never meet column ids
FIRST_PARTITION_FIELD_ID = 1000

_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void)$|^(bucket|truncate)\[(\d+)\]$")
_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_EPOCH = dt.date(1970, 1, 1)


def parse_transform(text: str) -> tuple[str, int | None]:
    m = _TRANSFORM.match(text or "")
    if not m:
        raise ConfigurationError("unknown partition transform (identity, year, month, day, "
                                 "hour, bucket[N], truncate[W])", transform=text)
    if m.group(1):
        return m.group(1), None
    n = int(m.group(3))
    if n < 1:
        raise ConfigurationError("bucket/truncate needs a positive width", transform=text)
    return m.group(2), n


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_str(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_bin(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or \
        pa.types.is_fixed_size_binary(t)


def check_source(transform: str, t: pa.DataType, column: str) -> None:
    """ConfigurationError if ``transform`` cannot take a column of type ``t``."""
    kind, _ = parse_transform(transform)
    ok = {
        "identity": _is_int(t) or pa.types.is_boolean(t) or _is_str(t) or _is_bin(t)
        or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_decimal(t),
        "year": pa.types.is_date(t) or pa.types.is_timestamp(t),
        "month": pa.types.is_date(t) or pa.types.is_timestamp(t),
        "day": pa.types.is_date(t) or pa.types.is_timestamp(t),
        "hour": pa.types.is_timestamp(t),
        "bucket": _is_int(t) or pa.types.is_decimal(t) or pa.types.is_date(t)
        or pa.types.is_timestamp(t) or _is_str(t) or _is_bin(t),
        "truncate": _is_int(t) or pa.types.is_decimal(t) or _is_str(t) or _is_bin(t),
        "void": True,
    }[kind]
    if not ok:
        raise ConfigurationError("partition transform does not apply to this column type",
                                 column=column, transform=transform, type=str(t))


_ALIASES = {"years": "year", "months": "month", "days": "day", "hours": "hour"}
_CALL = re.compile(r'^\s*([A-Za-z_]+)\s*\((.*)\)\s*$', re.S)


def _ident(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].replace('""', '"')
    if not text or not re.fullmatch(r"[^\s(),]+", text):
        raise ConfigurationError("a partition field names one column", field=text)
    return text


def parse_field(text: str) -> tuple[str, str]:
    """``col``, ``identity(col)``, ``year|month|day|hour(col)`` (also ``years``, ...),
    ``bucket(N, col)`` / ``bucket(col, N)``, ``truncate(W, col)`` / ``truncate(col, W)``
    -> (transform, column)."""
    m = _CALL.match(text)
    if not m:
        return "identity", _ident(text)
    fn = m.group(1).lower()
    fn = _ALIASES.get(fn, fn)
    args = [a.strip() for a in m.group(2).split(",")]
    if fn in ("identity", "year", "month", "day", "hour") and len(args) == 1:
        return fn, _ident(args[0])
    if fn in ("bucket", "truncate") and len(args) == 2:
        nums = [a for a in args if a.isdigit()]
        cols = [a for a in args if not a.isdigit()]
        if len(nums) == 1 and len(cols) == 1:
            return f"{fn}[{int(nums[0])}]", _ident(cols[0])
    raise ConfigurationError("a partition field is col, identity(col), year(col), "
                             "month(col), day(col), hour(col), bucket(N, col) or "
                             "truncate(W, col)", field=text.strip())


def result_type(transform: str, source: pa.DataType) -> pa.DataType:
    kind, _ = parse_transform(transform)
    if kind in ("identity", "truncate"):
        return source
    return pa.int32()


def default_name(transform: str, column: str) -> str:
    kind, _ = parse_transform(transform)
    return column if kind == "identity" else f"{column}_{'trunc' if kind == 'truncate' else kind}"


def make_spec(spec_id: int, items: list[tuple[str, str]], schema_json: dict,
              last_partition_id: int, *, table: str | None = None) -> tuple[dict, int]:
    """A spec from ``[(transform, column name), ...]`` against a schema with field ids.
    Returns (spec, the largest partition field id)."""
    from flightsrv.table.schema import field_by_name

    fields, names = [], set()
    for transform, column in items:
        f = field_by_name(schema_json, column)
        if f is None:
            raise ConfigurationError("partition source column does not exist", table=table,
                                     column=column)
        check_source(transform, type_from_json(f["type"]), f["name"])
        name = default_name(transform, f["name"])
        if name.lower() in names:
            raise ConfigurationError("the same partition field twice", table=table,
                                     field=name)
        names.add(name.lower())
        last_partition_id += 1
        fields.append({"field_id": last_partition_id, "source_id": int(f["id"]),
                       "transform": transform, "name": name})
    return {"spec_id": spec_id, "fields": fields}, last_partition_id


def describe(spec: dict, schema_json: dict) -> str:
    """``day(event_time), bucket(64, user_id)`` (SQL spelling, current column names)."""
    names = {int(f["id"]): f["name"] for f in schema_json["fields"] if "id" in f}
    out = []
    for pf in spec["fields"]:
        kind, n = parse_transform(pf["transform"])
        col = names.get(pf["source_id"], f"<dropped column {pf['source_id']}>")
        out.append(col if kind == "identity" else f"{kind}({n}, {col})" if n is not None
                   else f"{kind}({col})")
    return ", ".join(out)


# -- murmur3 (Iceberg Appendix B) -----------------------------------------------------------


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_longs(values: np.ndarray) -> np.ndarray:
    """murmur3_x86_32 (seed 0) of each value's 8-byte little-endian encoding, as int32;
    vectorized (equal to ``mmh3.hash(struct.pack('<q', v))``)."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
    h = np.zeros(len(v), dtype=np.uint32)
    with np.errstate(over="ignore"):
        for k in ((v & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                  (v >> np.uint64(32)).astype(np.uint32)):
            k = k * c1
            k = _rotl(k, 15)
            k = k * c2
            h ^= k
            h = _rotl(h, 13)
            h = h * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(8)
        h ^= h >> np.uint32(16)
        h = h * np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h = h * np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def _decimal_bytes(unscaled: int) -> bytes:
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


_INFINITY = 2**63 - 1  # a 64-bit timestamp's +infinity in every unit (DuckDB, Arrow)


def _micros(arr: pa.Array) -> np.ndarray:
    """int64 microseconds since the epoch (floor) of a timestamp array (nulls as 0). A
    seconds or milliseconds value past microseconds' range (±infinity: ±(2^63-1) in every
    unit) becomes microseconds' ±infinity, so it transforms as a TIMESTAMP's infinity does
    (multiplying would wrap around)."""
    unit = arr.type.unit
    ints = arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    per = _UNIT_PER_SECOND[unit]
    if per >= 1_000_000:
        return np.floor_divide(ints, per // 1_000_000)
    factor = 1_000_000 // per
    limit = _INFINITY // factor
    return np.where(ints > limit, _INFINITY,
                    np.where(ints < -limit, -_INFINITY, ints * factor))


def _as_micros(arr: pa.Array) -> pa.Array:
    """A naive timestamp array in microseconds (:func:`_micros`) when its unit is coarser
    (Arrow's calendar functions would overflow on a seconds infinity)."""
    if _UNIT_PER_SECOND[arr.type.unit] >= 1_000_000:
        return arr
    return pa.array(_micros(arr), pa.int64(), mask=_mask(arr)).cast(pa.timestamp("us"))


def _longs(arr: pa.Array) -> np.ndarray:
    """int64 of an integer array (nulls as 0); a UBIGINT of 2^63 or more by its 64 bits (two's
    complement), as a long has no room for it (values below 2^63 are unchanged)."""
    values = arr.fill_null(0).to_numpy(zero_copy_only=False)
    return values.astype(np.int64)  # numpy wraps uint64 to the same bits


def _hashes(arr: pa.Array) -> np.ndarray:
    """The murmur3 hash of every value (nulls hash to 0, masked by the caller)."""
    t = arr.type
    if _is_int(t):
        return murmur3_longs(_longs(arr))
    if pa.types.is_date(t):
        days = arr.cast(pa.date32()).cast(pa.int32()).cast(pa.int64()).fill_null(0)
        return murmur3_longs(days.to_numpy(zero_copy_only=False))
    if pa.types.is_timestamp(t):
        return murmur3_longs(_micros(arr))
    out = np.zeros(len(arr), dtype=np.int32)
    if _is_str(t):
        for i, v in enumerate(arr.to_pylist()):
            if v is not None:
                out[i] = mmh3.hash(v.encode("utf-8"), 0, signed=True)
    elif _is_bin(t):
        for i, v in enumerate(arr.to_pylist()):
            if v is not None:
                out[i] = mmh3.hash(bytes(v), 0, signed=True)
    elif pa.types.is_decimal(t):
        for i, v in enumerate(arr.to_pylist()):
            if v is not None:
                out[i] = mmh3.hash(_decimal_bytes(int(v.scaleb(t.scale))), 0, signed=True)
    else:
        raise ConfigurationError("bucket does not apply to this type", type=str(t))
    return out


# -- transforms ------------------------------------------------------------------------------


def _mask(arr: pa.Array) -> np.ndarray | None:
    return None if arr.null_count == 0 else np.asarray(arr.is_null().to_numpy(
        zero_copy_only=False))


def _int32(values: np.ndarray, nulls: np.ndarray | None) -> pa.Array:
    return pa.array(values.astype(np.int32), pa.int32(), mask=nulls)


def _utc_naive(arr: pa.Array) -> pa.Array:
    """Timestamps on their UTC (zoned) or wall-clock (naive) reading, as naive values."""
    return arr.cast(pa.timestamp(arr.type.unit)) if arr.type.tz is not None else arr


def apply(transform: str, arr: pa.Array) -> pa.Array:
    """The transform of every value of ``arr`` (a NULL stays NULL)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    kind, n = parse_transform(transform)
    t = arr.type
    nulls = _mask(arr)
    if kind == "identity":
        return arr
    if kind == "void":
        return pa.nulls(len(arr), pa.int32())
    if kind in ("year", "month"):
        src = _as_micros(_utc_naive(arr)) if pa.types.is_timestamp(t) else arr
        years = pc.year(src).fill_null(1970).to_numpy(zero_copy_only=False).astype(np.int64)
        if kind == "year":
            return _int32(years - 1970, nulls)
        months = pc.month(src).fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64)
        return _int32((years - 1970) * 12 + months - 1, nulls)
    if kind == "day":
        if pa.types.is_date(t):
            return arr.cast(pa.date32()).cast(pa.int32())
        return _int32(np.floor_divide(_micros(arr), 86_400_000_000), nulls)
    if kind == "hour":
        return _int32(np.floor_divide(_micros(arr), 3_600_000_000), nulls)
    if kind == "bucket":
        h = _hashes(arr).astype(np.int64)
        return _int32((h & 0x7FFFFFFF) % n, nulls)
    # truncate
    if _is_int(t):
        # the floor to a multiple of n; one below the type's least value becomes that value
        # (a partition [p, p + n) then still holds all its rows: pruning stays sound)
        ints = arr.fill_null(0).to_numpy(zero_copy_only=False)
        out = ints - np.mod(ints, ints.dtype.type(n))
        if np.issubdtype(ints.dtype, np.signedinteger):
            least = np.iinfo(ints.dtype).min
            out = np.where(out > ints, least, out)  # wrapped below the least value
        return pa.array(out, mask=nulls).cast(t)
    if _is_str(t):
        return pc.utf8_slice_codeunits(arr, 0, n)
    if _is_bin(t):
        return pc.binary_slice(arr.cast(pa.binary()), 0, n).cast(t)
    if pa.types.is_decimal(t):
        out = []
        for v in arr.to_pylist():
            if v is None:
                out.append(None)
                continue
            unscaled = int(v.scaleb(t.scale))
            # clamped to the least value of the type, as integers are
            floor = max(unscaled - (unscaled % n), -(10 ** t.precision - 1))
            out.append(decimal.Decimal(floor).scaleb(-t.scale))
        return pa.array(out, t)
    raise ConfigurationError("truncate does not apply to this type", type=str(t))


def bucket_of(n: int, arr: pa.Array) -> list[int | None]:
    """``bucket[n]`` of each value (the pruner hashes constants with the writers' code)."""
    return apply(f"bucket[{n}]", arr).to_pylist()


def partition_keys(spec: dict, schema_json: dict, batch) -> list[tuple[tuple, pa.Array]]:
    """Split rows by partition: ``[(partition value tuple as JSON, row indices)]``, in order
    of first appearance. ``batch`` has the schema's logical column names."""
    if not spec["fields"]:
        return [((), None)]
    by_id = {int(f["id"]): f for f in schema_json["fields"]}
    cols, types = [], []
    for pf in spec["fields"]:
        src = by_id[pf["source_id"]]
        col = batch.column(batch.schema.get_field_index(src["name"]))
        vals = apply(pf["transform"], col)
        cols.append(vals)
        types.append(vals.type)
    n = batch.num_rows
    keys = pa.table({f"k{i}": c for i, c in enumerate(cols)} | {"__i": pa.array(
        np.arange(n, dtype=np.int64))})
    grouped = keys.group_by([f"k{i}" for i in range(len(cols))], use_threads=False) \
        .aggregate([("__i", "list"), ("__i", "min")]).sort_by("__i_min")
    out = []
    lists = grouped.column("__i_list")
    for r in range(grouped.num_rows):
        values = tuple(value_to_json(grouped.column(f"k{i}")[r], types[i])
                       for i in range(len(cols)))
        out.append((values, lists[r].values))
    return out


def transformed_value(pf: dict, value, schema_json: dict):
    """The partition value (JSON) of one source value (Python) under field ``pf``."""
    by_id = {int(f["id"]): f for f in schema_json["fields"]}
    t = type_from_json(by_id[pf["source_id"]]["type"])
    arr = apply(pf["transform"], pa.array([value], t))
    return value_to_json(arr[0], arr.type)


# -- what a partition value proves (pruning) ----------------------------------------------


def _ts_bounds(lo_us: int, hi_us: int, t: pa.DataType):
    """[lo, hi] microsecond bounds (hi exclusive + 1 unit) as Python values of type ``t``."""
    per = _UNIT_PER_SECOND[t.unit]
    if per >= 1_000_000:
        lo, hi = lo_us * (per // 1_000_000), hi_us * (per // 1_000_000) - 1
    else:
        lo, hi = -((-lo_us) // (1_000_000 // per)), (hi_us - 1) // (1_000_000 // per)
    return (pa.scalar(lo, pa.int64()).cast(t).as_py(), pa.scalar(hi, pa.int64()).cast(t).as_py())


def _month_start_days(m: int) -> int:
    y, mo = 1970 + m // 12, m % 12 + 1
    return (dt.date(y, mo, 1) - _EPOCH).days


def bounds(transform: str, value, source: pa.DataType, file_source: pa.DataType | None = None):
    """(lo, hi) Python values of type ``source`` bounding every non-NULL source value of a
    file whose partition value is ``value`` (JSON, written when the source had type
    ``file_source``); None for a bound this transform does not give. ``value`` None: the
    caller knows every source value is NULL."""
    kind, n = parse_transform(transform)
    file_source = file_source or source
    if value is None or kind in ("bucket", "void"):
        return None, None
    try:
        if kind == "identity":
            v = value_from_json(value, file_source)
            if file_source != source:  # widened since (a DATE's infinity stays infinite)
                v = widen(pa.array([v], file_source), source)[0]
            v = v.as_py()
            return v, v
        if kind in ("year", "month", "day", "hour"):
            if kind == "year":
                lo_d = (dt.date(1970 + int(value), 1, 1) - _EPOCH).days
                hi_d = (dt.date(1971 + int(value), 1, 1) - _EPOCH).days
            elif kind == "month":
                lo_d, hi_d = _month_start_days(int(value)), _month_start_days(int(value) + 1)
            elif kind == "day":
                lo_d, hi_d = int(value), int(value) + 1
            else:
                lo_d = hi_d = None
            if pa.types.is_date(source):
                if lo_d is None:
                    return None, None
                return _EPOCH + dt.timedelta(days=lo_d), _EPOCH + dt.timedelta(days=hi_d - 1)
            if kind == "hour":
                lo_us, hi_us = int(value) * 3_600_000_000, (int(value) + 1) * 3_600_000_000
            else:
                lo_us, hi_us = lo_d * 86_400_000_000, hi_d * 86_400_000_000
            return _ts_bounds(lo_us, hi_us, source)
        # truncate
        if _is_int(file_source):
            lo = int(value)
            return lo, lo + n - 1
        if pa.types.is_decimal(file_source):
            lo = decimal.Decimal(value)
            scale = file_source.scale
            hi = lo + decimal.Decimal(n - 1).scaleb(-scale)
            return lo, hi
        if _is_str(file_source):
            return str(value), None
        return None, None
    except (ValueError, OverflowError, pa.ArrowInvalid, decimal.InvalidOperation):
        return None, None


__all__ = ["FIRST_PARTITION_FIELD_ID", "UNPARTITIONED", "apply", "bounds", "bucket_of",
           "check_source", "default_name", "describe", "make_spec", "murmur3_longs",
           "parse_field", "parse_transform", "partition_keys", "result_type", "transformed_value"]
