"""What a statement's text tells before it runs: its parameters' types (for clients that
build typed parameter vectors), its kind's name, and the key its result schema is cached by."""

from __future__ import annotations

import json

import pyarrow as pa
from sqlglot import exp

from flightsrv.sql import binder
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def parameter_schema(stmt: st.Statement, schema_of) -> pa.Schema:
    """The parameters' Arrow types where a statement fixes them, else null: a parameter
    compared with (``=``, ``<``, ``IN``, ``BETWEEN``) a column of a referenced table takes
    that column's type; ``INSERT INTO t [(cols)] VALUES (?, ...)`` takes the target
    columns' types. DuckDB 2.0 reports every parameter of a prepared statement as UNKNOWN,
    and clients that build typed parameter vectors (the Flight SQL JDBC driver) cannot
    bind a value to a null-typed field. The type is only how the client encodes the value;
    DuckDB still binds and casts it. ``schema_of(name)``: the current schema of a table."""
    types: list[pa.DataType] = [pa.null()] * stmt.param_count
    if not stmt.param_count:
        return pa.schema([])
    if isinstance(stmt, st.InsertValues):
        return _values_parameter_schema(stmt, schema_of, types)
    try:
        columns: dict[str, pa.DataType | None] = {}
        tree = stmt.tree.copy()
        skip: tuple = ()
        if not isinstance(stmt, st.Query):
            target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
            skip = (target,) if isinstance(target, exp.Table) else ()
        for ref in list(skip) + binder.bind(tree, stmt.sql, skip=skip).tables:
            try:
                schema = schema_of(ref.name)
            except Exception:  # noqa: BLE001 - unknown table: prepare reports it
                continue
            for f in schema:
                key = f.name.lower()
                columns[key] = f.type if columns.get(key, f.type) == f.type else None
        target = None
        if isinstance(stmt, st.Insert) and isinstance(stmt.tree.expression, exp.Values):
            schema = schema_of(stmt.table)
            names = list(stmt.columns) if stmt.columns is not None else schema.names
            by_lower = {f.name.lower(): f.type for f in schema}
            target = [by_lower.get(n.lower()) for n in names]
        for p in stmt.tree.find_all(exp.Placeholder):
            try:
                k = int(str(p.this)) - 1
            except ValueError:
                continue
            if not 0 <= k < len(types):
                continue
            parent, other = p.parent, None
            if isinstance(parent, _COMPARISONS):
                other = parent.left if parent.right is p else parent.right
            elif isinstance(parent, (exp.In, exp.Between)) and parent.this is not p:
                other = parent.this
            elif target is not None and isinstance(parent, exp.Tuple) \
                    and isinstance(parent.parent, exp.Values):
                pos = parent.expressions.index(p)
                if pos < len(target) and target[pos] is not None:
                    types[k] = target[pos]
                continue
            if isinstance(other, exp.Column):
                t = columns.get(other.name.lower())
                if t is not None:
                    types[k] = t
    except Exception:  # noqa: BLE001 - a hint only: never fail a prepare over it
        pass
    return _announced(types)


def _values_parameter_schema(stmt: st.InsertValues, schema_of, types: list) -> pa.Schema:
    """:func:`parameter_schema` of the INSERT ... VALUES fast path: a parameter standing
    alone in a VALUES position takes its target column's type (the scan recorded where)."""
    try:
        schema = schema_of(stmt.table)
        names = list(stmt.columns) if stmt.columns is not None else schema.names
        by_lower = {f.name.lower(): f.type for f in schema}
        target = [by_lower.get(n.lower()) for n in names]
        for number, pos in stmt.direct:
            if 0 < number <= len(types) and pos < len(target) and target[pos] is not None:
                types[number - 1] = target[pos]
    except Exception:  # noqa: BLE001 - a hint only: never fail a prepare over it
        pass
    return _announced(types)


def _announced(types: list) -> pa.Schema:
    # the JDBC driver (18.x) writes milliseconds into timestamp/time parameter vectors
    # whatever their unit, so announce those in ms (ADBC sends its own types anyway)
    types = [pa.timestamp("ms", t.tz) if pa.types.is_timestamp(t)
             else pa.time32("ms") if pa.types.is_time(t) else t for t in types]
    return pa.schema([pa.field(str(i), t) for i, t in enumerate(types)])


def kind_name(stmt: st.Statement) -> str:
    return {st.Delete: "delete", st.Update: "update", st.Merge: "merge", st.Insert: "insert",
            st.InsertValues: "insert",
            st.CreateTable: "create", st.CreateTableAs: "create", st.DropTable: "drop",
            st.SetSession: "set", st.Maintenance: "maintenance",
            st.AlterTable: "alter"}.get(type(stmt), "select")


def references(stmt: st.Statement) -> tuple | None:
    """The tables a query reads, as ``(name, version, as_of)`` per reference (the binder's
    resolution with SQL scoping, time travel read from ``AT``): a pure function of the
    statement's text. None when the result schema may depend on more than those tables
    (metadata functions, relations bound by name, parameters inside ``AT``) or the binder
    refuses the text (the uncached path then reports why)."""
    try:
        tree = stmt.tree
        if any(True for _ in tree.find_all(exp.HistoricalData)
               for p in _.find_all(exp.Placeholder)):
            return None
        # a query's binding was made while parsing (the same bind: the binder only reads
        # the tree, so no copy); any other statement's skipped its target
        bound = stmt.binding if isinstance(stmt, st.Query) and stmt.binding is not None \
            else binder.bind(tree, stmt.sql)
        if bound.functions or bound.extras:
            return None
        return tuple((ref.name, *sqlplan._time_travel(ref, stmt.sql)) for ref in bound.tables)
    except Exception:  # noqa: BLE001 - see docstring
        return None


def _schema_text(snap) -> str:
    """The pinned version's schema as canonical JSON (kept with the snapshot)."""
    return snap.derived(("schema json",),
                        lambda: json.dumps(snap.manifest.schema, sort_keys=True))


def schema_key(stmt: st.Statement, pinner: sqlplan.Pinner,
               refs: tuple | None = None) -> tuple | None:
    """(text, (table, uuid, schema JSON) per reference) for a query whose result schema and
    parameter types depend on nothing else; pins the references on ``pinner`` (the plan
    reuses the pins). A time-travelling reference also keys the head's schema (parameter
    types are read from it). ``refs``: :func:`references` of ``stmt``, when the caller has
    them cached. None when unsure (see :func:`references`, or a table that cannot be
    pinned: the caller then takes the uncached path, which reports errors properly)."""
    if refs is None:
        refs = references(stmt)
    if refs is None:
        return None
    try:
        parts = []
        for name, version, as_of in refs:
            snap = pinner.pin(name, version, as_of)
            parts.append((name, snap.manifest.table_uuid, _schema_text(snap)))
            if version is not None or as_of is not None:
                head = pinner.pin(name)
                parts.append((name, head.manifest.table_uuid, _schema_text(head)))
        return stmt.sql, tuple(parts)
    except Exception:  # noqa: BLE001 - see docstring
        return None
