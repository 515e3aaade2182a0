"""What a statement's text tells before it runs: its parameters' types (for clients that
build typed parameter vectors), its kind's name, and the key its result schema is cached by.

A query's parameter types are DuckDB's (:func:`duckdb_parameter_types`): the types its
binder gives each ``$n`` from its context (``s LIKE ?`` VARCHAR, ``LIMIT ?`` BIGINT,
``CAST(? AS DATE)`` DATE, ``s = ?`` the column's type). A parameter DuckDB leaves untyped
(``SELECT ?``, ``? + 1``: DuckDB types it by the value bound) is announced as
:data:`UNTYPED`. Other statements keep :func:`parameter_schema`'s reading of the text."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
from sqlglot import exp
from sqlglot.tokens import TokenType

from flightsrv.engine.stream import plain_schema
from flightsrv.sql import binder
from flightsrv.sql import lexer
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def parameter_schema(stmt: st.Statement, schema_of) -> pa.Schema:
    """:func:`text_parameter_types` as announced (an untyped parameter as
    :data:`UNTYPED`)."""
    if not stmt.param_count:
        return pa.schema([])
    return _announced(text_parameter_types(stmt, schema_of))


def text_parameter_types(stmt: st.Statement, schema_of) -> list[pa.DataType | None]:
    """The parameters' Arrow types where a statement's text fixes them, None elsewhere
    (the engine asks DuckDB first and uses these where DuckDB leaves one untyped): a
    parameter compared with (``=``, ``<``, ``IN``, ``BETWEEN``) or added to (``v + ?``, a
    number) a column of a referenced table takes that column's type, as does one named
    after a column (``SELECT ? AS id``, a MERGE's source); ``INSERT INTO t [(cols)]
    VALUES (?, ...)`` and ``INSERT ... SELECT ?, ...`` take the target columns' types.
    Clients that build typed parameter vectors (the Flight SQL JDBC driver) cannot bind a
    value to a null-typed field. The type is only how the client encodes the value; DuckDB
    still binds and casts it. ``schema_of(name)``: the current schema of a table."""
    types: list[pa.DataType | None] = [None] * stmt.param_count
    if not stmt.param_count:
        return types
    if isinstance(stmt, st.InsertValues):
        return _values_parameter_types(stmt, schema_of, types)
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
        target = selected = None
        hint = _Hints(types)
        if isinstance(stmt, st.Insert) and isinstance(stmt.tree.expression,
                                                      (exp.Values, exp.Select)):
            schema = schema_of(stmt.table)
            names = list(stmt.columns) if stmt.columns is not None else schema.names
            by_lower = {f.name.lower(): f.type for f in schema}
            target = [by_lower.get(n.lower()) for n in names]
            if isinstance(stmt.tree.expression, exp.Select):
                # INSERT ... SELECT ?, ?: each select item fills the target column at its
                # position
                selected = stmt.tree.expression.expressions
        for p in stmt.tree.find_all(exp.Placeholder):
            try:
                k = int(str(p.this)) - 1
            except ValueError:
                continue
            if not 0 <= k < len(types):
                continue
            parent, other = p.parent, _compared_with(p)
            if other is None and target is not None and isinstance(parent, exp.Tuple) \
                    and isinstance(parent.parent, exp.Values):
                pos = parent.expressions.index(p)
                if pos < len(target) and target[pos] is not None:
                    hint(k, target[pos])
                continue
            if other is None and isinstance(parent, (exp.Add, exp.Sub)):
                # v + ?: the other operand's type when it is a number (a timestamp's other
                # operand is an interval); DuckDB leaves the parameter untyped
                other = parent.left if parent.right is p else parent.right
                if isinstance(other, exp.Interval):
                    # ? - INTERVAL 1 DAY: a point in time; the column it is compared with
                    # says which kind, else TIMESTAMP
                    hint(k, _temporal_partner(parent, columns) or pa.timestamp("us"))
                    continue
                if isinstance(other, exp.Column) and not _numeric(columns.get(
                        other.name.lower())):
                    other = None
            elif other is None and isinstance(parent, exp.Alias):
                # SELECT ? AS id (a MERGE's USING source, INSERT ... SELECT): the column of
                # that name
                if selected is None or not any(parent is x for x in selected):
                    t = columns.get(parent.alias.lower())
                    if t is not None:
                        hint(k, t)
            if selected is not None and target is not None:
                item = parent if isinstance(parent, exp.Alias) else p
                if any(item is x for x in selected):
                    pos = next(i for i, x in enumerate(selected) if x is item)
                    if pos < len(target) and target[pos] is not None:
                        hint(k, target[pos])
                    continue
            if isinstance(other, exp.Column):
                t = columns.get(other.name.lower())
                if t is not None:
                    hint(k, t)
    except Exception:  # noqa: BLE001 - a hint only: never fail a prepare over it
        pass
    return types


class _Hints:
    """Sets a parameter's type from one occurrence's hint; a parameter whose occurrences
    hint at different types gets none (DuckDB's plan then types it: each occurrence's type,
    widened to the one every occurrence's value fits, see :func:`parameter_types_on`), so
    that a client never narrows its value to one occurrence's type."""

    def __init__(self, types: list):
        self.types = types
        self.conflicts: set[int] = set()

    def __call__(self, k: int, t: pa.DataType) -> None:
        if k in self.conflicts:
            return
        if self.types[k] is not None and self.types[k] != t:
            self.conflicts.add(k)
            self.types[k] = None
            return
        self.types[k] = t


def _compared_with(node: exp.Expression) -> exp.Expression | None:
    """What ``node`` is compared with: the other side of ``=``, ``<``, ...; the tested
    expression of ``x IN (..., node)`` and ``x BETWEEN node AND ...``; None otherwise."""
    parent = node.parent
    if isinstance(parent, _COMPARISONS):
        return parent.left if parent.right is node else parent.right
    if isinstance(parent, (exp.In, exp.Between)) and parent.this is not node:
        return parent.this
    return None


def _temporal_partner(node: exp.Expression, columns: dict) -> pa.DataType | None:
    """The date or timestamp type of the column ``node`` is compared with (``ts > node``,
    ``ts BETWEEN node AND ...``), if any."""
    other = _compared_with(node)
    t = columns.get(other.name.lower()) if isinstance(other, exp.Column) else None
    return t if t is not None and (pa.types.is_timestamp(t) or pa.types.is_date(t)) else None


def _numeric(t: pa.DataType | None) -> bool:
    return t is not None and (pa.types.is_integer(t) or pa.types.is_floating(t)
                              or pa.types.is_decimal(t))


def _values_parameter_types(stmt: st.InsertValues, schema_of, types: list) -> list:
    """:func:`text_parameter_types` of the INSERT ... VALUES fast path: a parameter standing
    alone in a VALUES position takes its target column's type (the scan recorded where)."""
    try:
        schema = schema_of(stmt.table)
        names = list(stmt.columns) if stmt.columns is not None else schema.names
        by_lower = {f.name.lower(): f.type for f in schema}
        target = [by_lower.get(n.lower()) for n in names]
        hint = _Hints(types)
        for number, pos in stmt.direct:
            if 0 < number <= len(types) and pos < len(target) and target[pos] is not None:
                hint(number - 1, target[pos])
    except Exception:  # noqa: BLE001 - a hint only: never fail a prepare over it
        pass
    return types


#: What a parameter DuckDB leaves untyped is announced as. DuckDB binds such a parameter by
#: the type of the value sent, so any type is only how a client encodes its value; VARCHAR
#: because the Flight SQL JDBC driver (arrow-java 18.x ``AvaticaParameterBinder``) binds a
#: Java value only to a vector of its own kind and a null-typed field takes only NULL:
#: ``setString`` (the commonest bind, and DuckDB casts a string to most types) and
#: ``setNull`` then work. A union would not help: the driver binds nothing to one.
UNTYPED = pa.string()

#: a statement whose parameters DuckDB types only from their occurrences one by one (see
#: :func:`duckdb_parameter_types`) is probed at most this many times
_MAX_PROBES = 64


def duckdb_parameter_types(cur, sql: str, count: int,
                           relations: tuple[str, ...] = ()) -> list[pa.DataType | None]:
    """The Arrow type DuckDB's binder gives each of the parameters ``$1..$count`` of the
    query ``sql``, None where DuckDB leaves one untyped or cannot say. ``relations``: the
    names ``sql`` reads that ``cur`` holds.

    DuckDB 2.0 reports a prepared statement's parameters as UNKNOWN
    (``duckdb_prepared_statements()``) but its bound plan holds their types:
    ``json_serialize_plan`` serializes it, and refuses a plan with an untyped parameter.
    Then each occurrence is planned alone (the other parameters as NULL). A parameter of
    several occurrences takes the type DuckDB widens theirs to (as ``coalesce`` does), none
    when they do not mix. The plans are made on a cursor of
    their own where each relation is an empty view with the same column types (DuckDB
    serializes no plan that scans a registered Arrow object)."""
    probe = _stand_ins(cur, relations)
    if probe is None:
        return [None] * count
    try:
        return parameter_types_on(probe, sql, count)
    finally:
        probe.close()


def parameter_types_on(cur, sql: str, count: int) -> list[pa.DataType | None]:
    """:func:`duckdb_parameter_types` of ``sql`` (a query, or a DELETE, UPDATE, MERGE or
    INSERT when its tables are real tables of ``cur``'s catalog: DuckDB plans no DML over a
    view) over the relations ``cur`` already holds."""
    types: list[pa.DataType | None] = [None] * count
    found = _plan_parameter_types(cur, sql)
    if found is None:
        found = _one_by_one(cur, sql)
    names = {int(k) - 1: v for k, v in found.items() if k.isdigit() and 0 < int(k) <= count}
    # a parameter of several occurrence types takes the one DuckDB widens them to (INTEGER
    # and BIGINT: BIGINT; DATE and TIMESTAMP: TIMESTAMP), so that a client encodes a value
    # every occurrence takes; none where they do not mix (VARCHAR and INTEGER)
    exprs = {k: "CAST(NULL AS " + t[0] + ")" if len(t) == 1 else
             "coalesce(" + ", ".join(f"CAST(NULL AS {x})" for x in t) + ")"
             for k, t in names.items()}
    def shape(group: dict[int, str]) -> None:
        rel = cur.sql("SELECT " + ", ".join(f"{e} AS p{k}" for k, e in group.items()))
        for f, k in zip(plain_schema(rel.limit(0).to_arrow_table().schema), group,
                        strict=True):
            types[k] = f.type

    if exprs:
        try:
            shape(exprs)
        except duckdb.Error:  # one that does not mix: the others one by one
            for k, e in exprs.items():
                try:
                    shape({k: e})
                except duckdb.Error:
                    pass
    return types


def announced(types: list) -> pa.Schema:
    """The parameter schema a prepare announces for ``types`` (None: untyped)."""
    return _announced(types)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _stand_ins(cur, relations: tuple[str, ...]):
    """A new cursor of ``cur``'s database where each of ``relations`` is an empty view
    with the columns (names and DuckDB types) it has on ``cur``; None when one cannot be
    made."""
    views = []
    try:
        for name in relations:
            rel = cur.sql(f"SELECT * FROM {_quoted(name)}")
            columns = ", ".join(f"CAST(NULL AS {t}) AS {_quoted(c)}"
                                for c, t in zip(rel.columns, rel.types, strict=True))
            if not columns:
                return None
            views.append(f"CREATE TEMP VIEW {_quoted(name)} AS SELECT {columns} LIMIT 0")
        probe = cur.cursor()
    except duckdb.Error:
        return None
    try:
        for view in views:
            probe.execute(view)
    except duckdb.Error:
        probe.close()
        return None
    return probe


def _one_by_one(probe, sql: str) -> dict[str, str]:
    """:func:`_plan_parameter_types` of each parameter occurrence of ``sql`` planned with
    the other occurrences as NULL (each occurrence DuckDB types counts)."""
    try:
        tokens = lexer.tokenize(sql)
    except Exception:  # noqa: BLE001 - DuckDB reports the text when it runs
        return {}
    spans = [(t.start, n.end + 1, n.text) for t, n in zip(tokens, tokens[1:])
             if t.token_type == TokenType.PARAMETER and n.token_type == TokenType.NUMBER
             and n.start == t.end + 1]
    found: dict[str, list[str]] = {}
    for start, _, number in spans[:_MAX_PROBES]:
        text, last = [], 0
        for s, e, _ in spans:
            if s != start:
                text += [sql[last:s], "NULL"]
                last = e
        one = _plan_parameter_types(probe, "".join(text) + sql[last:])
        if one and number in one:
            seen = found.setdefault(number, [])
            seen += [t for t in one[number] if t not in seen]
    return found


def _plan_parameter_types(cur, sql: str) -> dict[str, list[str]] | None:
    """Parameter identifier -> the DuckDB type names its occurrences have in the bound
    plan of ``sql`` (each once; DuckDB types each occurrence by its context and casts the
    one value to each); None when DuckDB does not plan it (an untyped parameter, or any
    other refusal)."""
    try:
        ((raw,),) = cur.execute("SELECT json_serialize_plan(?)", [sql]).fetchall()
    except duckdb.Error:
        return None
    plan = json.loads(raw)
    if plan.get("error"):
        return None
    out: dict[str, list[str]] = {}
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("expression_class") == "BOUND_PARAMETER":
                name = _type_name(node.get("return_type") or {})
                if name is not None:
                    seen = out.setdefault(str(node.get("identifier")), [])
                    if name not in seen:
                        seen.append(name)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _type_name(t: dict) -> str | None:
    """The DuckDB type name of a type as ``json_serialize_plan`` writes it; None for an
    unknown type and for those a client cannot send (ENUM, UNION, user types)."""
    tid, info = t.get("id"), t.get("type_info") or {}
    if info.get("alias") or info.get("extension_info"):
        return None
    if tid in ("DECIMAL",):
        return f"DECIMAL({int(info['width'])},{int(info['scale'])})"
    if tid == "MAP":
        entry = (info.get("child_type") or {}).get("type_info") or {}
        kv = [_type_name(c.get("second") or {}) for c in entry.get("child_types") or []]
        return f"MAP({kv[0]}, {kv[1]})" if len(kv) == 2 and None not in kv else None
    if tid in ("LIST", "ARRAY"):
        child = _type_name(info.get("child_type") or {})
        if child is None:
            return None
        return f"{child}[]" if tid == "LIST" else f"{child}[{int(info['size'])}]"
    if tid == "STRUCT":
        parts = []
        for c in info.get("child_types") or []:
            child = _type_name(c.get("second") or {})
            if child is None:
                return None
            parts.append('"' + str(c.get("first")).replace('"', '""') + '" ' + child)
        return f"STRUCT({', '.join(parts)})" if parts else None
    if t.get("type_info") is not None or not isinstance(tid, str) or tid in (
            "UNKNOWN", "INVALID", "ANY", "SQLNULL", "NULL", "ENUM", "UNION", "POINTER"):
        return None
    return tid


def _announced(types: list) -> pa.Schema:
    # the JDBC driver (18.x) writes milliseconds into timestamp/time parameter vectors
    # whatever their unit, so announce those in ms (ADBC sends its own types anyway)
    types = [UNTYPED if t is None or pa.types.is_null(t)
             else pa.timestamp("ms", t.tz) if pa.types.is_timestamp(t)
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
