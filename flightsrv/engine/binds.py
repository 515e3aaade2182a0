"""How bound parameter values reach DuckDB: natively (as Python objects with the type they
were bound with) where that is exact, else as typed literals (the caller decides)."""

from __future__ import annotations

import functools

import duckdb
import pyarrow as pa

from flightsrv.errors import SqlError
from flightsrv.sql import types as sqltypes


def _binds_natively(value: pa.Scalar) -> bool:
    """Whether DuckDB gets ``value`` whole and typed as bound (:func:`_native_params`): an
    untyped NULL, or a valid value of a type :func:`_native_type` names whose ``as_py()``
    holds it (a date or timestamp outside Python's years 1 to 9999 has no Python object).
    Everything else (decimals, nested values, timestamps in s/ms/ns, a NULL of a type)
    binds as a typed literal: DuckDB would type the Python object by its value (``{'a': 5}``
    as ``STRUCT(a INTEGER)`` when bound as BIGINT, ``Decimal('1.50')`` as DECIMAL(3,2))."""
    if not value.is_valid:
        return pa.types.is_null(value.type)
    if _native_type(value.type) is None:
        return False
    try:
        value.as_py()
    except (OverflowError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=64)
def _native_type(t: pa.DataType) -> str | None:
    """The DuckDB type name a bound value of Arrow type ``t`` reaches DuckDB as, for the
    types whose Python objects DuckDB converts exactly (integers of every width, floats,
    text, bytes, booleans, dates, microsecond times and timestamps); None for the rest.
    (Names, not ``DuckDBPyType`` objects: those must not outlive the interpreter's
    shutdown, nanobind reports each one still held as a leak.)"""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or \
            pa.types.is_string(t) or pa.types.is_large_string(t) or \
            pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_date32(t) or \
            (pa.types.is_time64(t) and t.unit == "us") or \
            (pa.types.is_timestamp(t) and t.unit == "us"):
        try:
            return sqltypes.sql_type_name(t)
        except SqlError:
            return None
    return None


@functools.cache
def _sqltypes_names() -> dict[str, str]:
    """Type name -> the name of DuckDB's own constant of that type in ``duckdb.sqltypes``
    (names only: see :func:`_native_type`)."""
    from duckdb import sqltypes

    return {str(getattr(sqltypes, a)): a for a in dir(sqltypes) if a.isupper()}


def _duckdb_type(name: str):
    """DuckDB's type ``name``: its module constant when it has one (``duckdb.sqltype``
    parses the name, ~80 us, more than the rest of a point query's binding)."""
    const = _sqltypes_names().get(name)
    if const is not None:
        from duckdb import sqltypes

        return getattr(sqltypes, const)
    return duckdb.sqltype(name)


def _native_params(values: list[pa.Scalar]) -> list:
    """Bound values as DuckDB takes them natively, each with the type it was bound with:
    DuckDB types a plain Python ``int`` by its value (5 as INTEGER), so two BIGINT
    parameters multiplied overflowed as INT32. An untyped NULL stays ``None``."""
    from duckdb.value.constant import Value

    out = []
    for v in values:
        t = _native_type(v.type) if v.is_valid else None
        out.append(v.as_py() if t is None else Value(v.as_py(), _duckdb_type(t)))
    return out
