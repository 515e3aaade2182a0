"""Schema and statistics mapping from a flightsrv manifest to Delta Lake and Iceberg v3
(docs/INTEROP.md §Schema, §Statistics).

Field ids: every struct field, list element and map key/value gets an id, top-level columns
first (1..n, in schema order), then nested ones depth-first in schema order. The same ids are
the Iceberg field ids and the Delta ``delta.columnMapping.id`` values. Our data files carry no
Parquet field ids, so Iceberg readers resolve columns by the table's name mapping
(``schema.name-mapping.default``) and Delta readers by ``delta.columnMapping.physicalName``
(column mapping mode ``name``; the physical name is the column's own name).

Types are mapped by the tables below (Arrow type name as stored in the manifest → the other
format's type). A type without an entry has no faithful counterpart and is refused with
``UnsupportedForMirror`` naming the column, before anything is written.

Specs: https://github.com/delta-io/delta/blob/master/PROTOCOL.md#schema-serialization-format,
https://iceberg.apache.org/spec/#schemas-and-data-types, and Appendix D of the Iceberg spec
(single-value serialization of bounds).
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from dataclasses import dataclass, field

from flightsrv.errors import ConfigurationError
from flightsrv.table.schema import max_field_id


class UnsupportedForMirror(ConfigurationError):
    """The table has a column type the target format cannot represent faithfully."""


#: Arrow type names (docs/PROTOCOL.md §4.1) → Iceberg primitive types
ICEBERG_PRIMITIVES: dict[str, str] = {
    "bool": "boolean",
    "int8": "int", "int16": "int", "int32": "int", "int64": "long",
    "float32": "float", "float64": "double",
    "string": "string", "large_string": "string", "string_view": "string",
    "binary": "binary", "large_binary": "binary",
    "date32": "date",
}

#: Arrow type names → Delta primitive types
DELTA_PRIMITIVES: dict[str, str] = {
    "bool": "boolean",
    "int8": "byte", "int16": "short", "int32": "integer", "int64": "long",
    "float32": "float", "float64": "double",
    "string": "string", "large_string": "string", "string_view": "string",
    "binary": "binary", "large_binary": "binary",
    "date32": "date",
}

#: timestamp unit → (Iceberg type without zone, with zone). Parquet stores second-unit
#: timestamps as milliseconds; Iceberg's ``timestamp`` is microseconds, so only the
#: microsecond and nanosecond units map exactly.
ICEBERG_TIMESTAMPS = {"us": ("timestamp", "timestamptz"), "ns": ("timestamp_ns", "timestamptz_ns")}
#: Delta timestamps are microseconds (``timestamp`` has a zone, ``timestamp_ntz`` has none)
DELTA_TIMESTAMPS = {"us": ("timestamp_ntz", "timestamp")}


@dataclass
class MappedSchema:
    """One table schema in both target formats, with the field ids they share."""

    iceberg: dict  # Iceberg schema JSON (without schema-id)
    delta: dict  # Delta struct type JSON
    last_column_id: int
    name_mapping: list  # Iceberg name mapping (schema.name-mapping.default)
    #: top-level column name → (field id, Iceberg type, Delta type); stats are top-level
    columns: dict = field(default_factory=dict)
    #: Delta reader/writer features the types need (``timestampNtz``)
    delta_features: set = field(default_factory=set)
    #: the table's own field id (as the manifest's statistics key it) → column name
    by_id: dict = field(default_factory=dict)
    #: top-level column name → the name data files hold it under
    physical: dict = field(default_factory=dict)

    def named(self, stats: dict) -> dict:
        """File statistics keyed by column name (format 2 keys them by field id)."""
        return {self.by_id.get(k, k): v for k, v in stats.items()}


def _unsupported(col: str, t, fmt: str):
    name = t if isinstance(t, str) else t.get("type")
    return UnsupportedForMirror(f"column type has no {fmt} counterpart", column=col,
                                type=name, format=fmt)


class _Mapper:
    def __init__(self, fields: list[dict]):
        # a field without an id (format 1) gets one after every id present, top-level
        # ones (1..n) first, then nested ones depth-first; format 2 gives every field,
        # nested ones included, a stable id of its own
        self.next_id = max([len(fields), max_field_id(fields)])
        self.features: set[str] = set()

    def new_id(self, f: dict | None = None) -> int:
        """The id of nested field ``f``: its own (format 2 gives nested fields stable ids,
        which are also the Parquet field ids in its data files), else the next free one."""
        if f is not None and "id" in f:
            return int(f["id"])
        self.next_id += 1
        return self.next_id

    def iceberg_type(self, col: str, t):
        if isinstance(t, str):
            if t in ICEBERG_PRIMITIVES:
                return ICEBERG_PRIMITIVES[t]
            raise _unsupported(col, t, "iceberg")
        kind = t["type"]
        if kind == "timestamp" and t["unit"] in ICEBERG_TIMESTAMPS:
            plain, zoned = ICEBERG_TIMESTAMPS[t["unit"]]
            return zoned if t.get("tz") else plain
        if kind == "time" and t["unit"] == "us":
            return "time"
        if kind == "decimal" and t["precision"] <= 38:
            return f"decimal({t['precision']}, {t['scale']})"
        if kind == "fixed_size_binary":
            return f"fixed[{t['width']}]"
        raise _unsupported(col, t, "iceberg")

    def delta_type(self, col: str, t):
        if isinstance(t, str):
            if t in DELTA_PRIMITIVES:
                return DELTA_PRIMITIVES[t]
            raise _unsupported(col, t, "delta")
        kind = t["type"]
        if kind == "timestamp" and t["unit"] in DELTA_TIMESTAMPS:
            ntz, zoned = DELTA_TIMESTAMPS[t["unit"]]
            if not t.get("tz"):
                self.features.add("timestampNtz")
            return zoned if t.get("tz") else ntz
        if kind == "decimal" and t["precision"] <= 38:
            return f"decimal({t['precision']},{t['scale']})"
        raise _unsupported(col, t, "delta")


def _nested(mapper: _Mapper, col: str, t, fid: int, formats: set[str]) -> tuple:
    """(iceberg type, delta type, name-mapping children) of a possibly nested type."""
    if isinstance(t, dict) and t["type"] in ("list", "large_list", "fixed_size_list"):
        item = t["item"]
        eid = mapper.new_id(item)
        ice, dlt, nm = _nested(mapper, f"{col}.element", item["type"], eid, formats)
        iceberg = {"type": "list", "element-id": eid, "element": ice,
                   "element-required": not item.get("nullable", True)}
        delta = {"type": "array", "elementType": dlt, "containsNull": item.get("nullable", True)}
        return iceberg, delta, [{"field-id": eid, "names": ["element", item["name"]]
                                 if item["name"] != "element" else ["element"],
                                 **({"fields": nm} if nm else {})}]
    if isinstance(t, dict) and t["type"] == "map":
        key, item = t["key"], t["item"]
        kid, vid = mapper.new_id(key), mapper.new_id(item)
        kice, kdlt, knm = _nested(mapper, f"{col}.key", key["type"], kid, formats)
        vice, vdlt, vnm = _nested(mapper, f"{col}.value", item["type"], vid, formats)
        iceberg = {"type": "map", "key-id": kid, "key": kice, "value-id": vid, "value": vice,
                   "value-required": not item.get("nullable", True)}
        delta = {"type": "map", "keyType": kdlt, "valueType": vdlt,
                 "valueContainsNull": item.get("nullable", True)}
        return iceberg, delta, [{"field-id": kid, "names": ["key"], **({"fields": knm} if knm
                                                                       else {})},
                                {"field-id": vid, "names": ["value"], **({"fields": vnm} if vnm
                                                                         else {})}]
    if isinstance(t, dict) and t["type"] == "struct":
        ids = [mapper.new_id(sub) for sub in t["fields"]]
        ice_fields, dlt_fields, nms = [], [], []
        for sub, sid in zip(t["fields"], ids):
            ice, dlt, nm = _nested(mapper, f"{col}.{sub['name']}", sub["type"], sid, formats)
            ice_fields.append({"id": sid, "name": sub["name"],
                               "required": not sub.get("nullable", True), "type": ice})
            dlt_fields.append(_delta_field(sub, dlt, sid))
            nms.append({"field-id": sid, "names": [sub["name"]], **({"fields": nm} if nm
                                                                    else {})})
        return {"type": "struct", "fields": ice_fields}, {"type": "struct",
                                                          "fields": dlt_fields}, nms
    ice = mapper.iceberg_type(col, t) if "iceberg" in formats else None
    dlt = mapper.delta_type(col, t) if "delta" in formats else None
    return ice, dlt, []


def iceberg_default(value, t, column: str):
    """A column default as stored in our schema (the statistics encoding: dates as days,
    timestamps and times as integers in their unit, decimals and strings as strings, binary
    as hex) in Iceberg's JSON single-value serialization (spec Appendix C: dates, times and
    timestamps as ISO-8601 strings, decimals as strings with ``scale`` digits, binary as
    hex). Raises ``UnsupportedForMirror`` for a value ISO-8601 cannot hold."""
    kind = t["type"] if isinstance(t, dict) else t
    try:
        if kind == "date32":
            return (dt.date(1970, 1, 1) + dt.timedelta(days=int(value))).isoformat()
        if kind == "decimal":
            import decimal

            q = decimal.Decimal(1).scaleb(-int(t["scale"]))
            return format(decimal.Decimal(value).quantize(q), "f")
        if kind == "timestamp":
            per_s = {"us": 10**6, "ns": 10**9}[t["unit"]]
            secs, frac = divmod(int(value), per_s)
            text = (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=secs)).isoformat(
                timespec="seconds") + f".{frac:0{len(str(per_s)) - 1}d}"
            return text + ("+00:00" if t.get("tz") else "")
        if kind == "time":
            secs, us = divmod(int(value), 10**6)
            return (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=secs)).time().isoformat(
                timespec="seconds") + f".{us:06d}"
    except (OverflowError, ValueError, KeyError) as exc:
        raise UnsupportedForMirror("column default has no Iceberg JSON form", column=column,
                                   value=value, format="iceberg", error=str(exc)) from None
    return value  # booleans, numbers, strings, hex binary: the same JSON


def _delta_field(f: dict, dtype, fid: int) -> dict:
    return {"name": f["name"], "type": dtype, "nullable": f.get("nullable", True),
            "metadata": {"delta.columnMapping.id": fid,
                         "delta.columnMapping.physicalName": f.get("physical", f["name"])}}


def map_schema(schema: dict, formats=("delta", "iceberg")) -> MappedSchema:
    """Map a manifest's schema JSON. Raises ``UnsupportedForMirror`` for a column type the
    requested formats cannot hold."""
    formats = set(formats)
    fields = schema["fields"]
    mapper = _Mapper(fields)
    ice_fields, dlt_fields, mapping, columns = [], [], [], {}
    for pos, f in enumerate(fields, start=1):
        # format 2: the column's own field id (stable across renames and drops); format 1:
        # its position
        i = int(f["id"]) if "id" in f else pos
        ice, dlt, nm = _nested(mapper, f["name"], f["type"], i, formats)
        ice_field = {"id": i, "name": f["name"], "required": not f.get("nullable", True),
                     "type": ice}
        if "iceberg" in formats:
            for ours, theirs in (("initial_default", "initial-default"),
                                 ("write_default", "write-default")):
                if f.get(ours) is not None:
                    ice_field[theirs] = iceberg_default(f[ours], f["type"], f["name"])
        ice_fields.append(ice_field)
        dlt_fields.append(_delta_field(f, dlt, i))
        # files hold the column under its physical name (its name when first written)
        mapping.append({"field-id": i, "names": [f.get("physical", f["name"])],
                        **({"fields": nm} if nm else {})})
        columns[f["name"]] = (i, ice, dlt)
    by_id = {str(f["id"]): f["name"] for f in fields if "id" in f}
    return MappedSchema(iceberg={"type": "struct", "fields": ice_fields},
                        delta={"type": "struct", "fields": dlt_fields},
                        last_column_id=mapper.next_id, name_mapping=mapping, columns=columns,
                        delta_features=mapper.features, by_id=by_id,
                        physical={f["name"]: f.get("physical", f["name"]) for f in fields})


# -- statistics --------------------------------------------------------------------------

#: Iceberg types whose bounds we write, with their single-value serialization
_ICEBERG_BOUNDS = {
    "int": lambda v: struct.pack("<i", int(v)),
    "long": lambda v: struct.pack("<q", int(v)),
    "float": lambda v: struct.pack("<f", float(v)),
    "double": lambda v: struct.pack("<d", float(v)),
    "date": lambda v: struct.pack("<i", int(v)),
    "string": lambda v: str(v).encode("utf-8"),
}
_DELTA_BOUNDS = {
    "byte": int, "short": int, "integer": int, "long": int,
    "float": float, "double": float, "string": str,
    "date": lambda v: _delta_date(int(v)),
}
_FLOATS = {"float", "double"}


def _delta_date(days: int) -> str | None:
    """A date bound as Delta writes it (``yyyy-MM-dd``); ``None`` (no bound) for a date
    that format cannot spell: before year 1 or after 9999 (DuckDB's ``infinity`` too)."""
    try:
        return (dt.date(1970, 1, 1) + dt.timedelta(days=days)).isoformat()
    except OverflowError:
        return None


def _bounds_ok(entry: dict, kind: str) -> bool:
    """Bounds of float columns are only written when the file is known to hold no NaN
    (Parquet min/max leave NaN out, and the formats disagree on NaN ordering)."""
    return kind not in _FLOATS or entry.get("nans") == 0


def iceberg_stats(mapped: MappedSchema, stats: dict, rows: int) -> dict:
    """value/null/NaN counts and lower/upper bounds keyed by field id (physical rows)."""
    out = {"value_counts": [], "null_value_counts": [], "nan_value_counts": [],
           "lower_bounds": [], "upper_bounds": []}
    stats = mapped.named(stats)
    for name, entry in sorted(stats.items(), key=lambda kv: mapped.columns.get(kv[0],
                                                                              (0,))[0]):
        col = mapped.columns.get(name)
        if col is None:
            continue
        fid, ice, _ = col
        if not isinstance(ice, str):
            continue
        out["value_counts"].append({"key": fid, "value": rows})
        if entry.get("nulls") is not None:
            out["null_value_counts"].append({"key": fid, "value": int(entry["nulls"])})
        if ice in _FLOATS and entry.get("nans") is not None:
            out["nan_value_counts"].append({"key": fid, "value": int(entry["nans"])})
        enc = _ICEBERG_BOUNDS.get(ice)
        if enc is None or not _bounds_ok(entry, ice):
            continue
        if entry.get("min") is not None:
            out["lower_bounds"].append({"key": fid, "value": enc(entry["min"])})
        if entry.get("max") is not None:
            out["upper_bounds"].append({"key": fid, "value": enc(entry["max"])})
    return out


def delta_stats(mapped: MappedSchema, stats: dict, rows: int, *, tight: bool) -> str:
    """The ``stats`` string of a Delta ``add`` action, keyed by physical column name (as
    the Delta protocol keys statistics under column mapping)."""
    mins, maxs, nulls = {}, {}, {}
    for logical, entry in mapped.named(stats).items():
        col = mapped.columns.get(logical)
        if col is None or not isinstance(col[2], str):
            continue
        kind = col[2]
        name = mapped.physical.get(logical, logical)
        if entry.get("nulls") is not None:
            nulls[name] = int(entry["nulls"])
        enc = _DELTA_BOUNDS.get(kind)
        if enc is None or not _bounds_ok(entry, kind):
            continue
        for bound, out in (("min", mins), ("max", maxs)):
            if entry.get(bound) is not None and (value := enc(entry[bound])) is not None:
                out[name] = value
    out = {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls,
           "tightBounds": tight}
    return json.dumps(out, separators=(",", ":"))
