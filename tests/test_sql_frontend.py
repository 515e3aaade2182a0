"""The SQL front end: classification, refusals, time travel, pinning, scan hints."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest
from sqlglot import exp

from flightsrv.errors import SqlError, TableNotFound
from flightsrv.sql import statements as st
from flightsrv.sql.plan import Pinner, PruneTerm, bind_params, params_from_batch, plan_query
from flightsrv.sql.statements import parse_statement

SCHEMAS = {
    "t": pa.schema([("id", pa.int64()), ("a", pa.string()), ("b", pa.float64()),
                    ("d", pa.date32())]),
    "u": pa.schema([("id", pa.int64()), ("x", pa.int32())]),
}


class Resolver:
    """Fake table layer: each unpinned resolve returns a newer version, as under commits."""

    def __init__(self):
        self.calls = []
        self.head = 10

    def __call__(self, name, version, as_of):
        if name not in SCHEMAS:
            raise TableNotFound("no such table", table=name)
        self.calls.append((name, version, as_of))
        if version is None and as_of is None:
            self.head += 1
            version = self.head
        return SimpleNamespace(schema=SCHEMAS[name], version=version, as_of=as_of, name=name)


def plan(sql, params=()):
    stmt = parse_statement(sql)
    tree = bind_params(stmt.tree, [pa.scalar(p) for p in params], sql, stmt.param_count)
    r = Resolver()
    return plan_query(tree, Pinner(r), sql), r


# -- classification ---------------------------------------------------------------------


@pytest.mark.parametrize("sql, kind", [
    ("SELECT 1", st.Query),
    ("FROM t", st.Query),
    ("WITH c AS (SELECT id FROM t) SELECT * FROM c JOIN u USING (id)", st.Query),
    ("SELECT a, sum(b) OVER (PARTITION BY a ORDER BY id) FROM t", st.Query),
    ("SELECT id FROM t UNION ALL SELECT id FROM u EXCEPT SELECT 3", st.Query),
    ("VALUES (1, 'a'), (2, 'b')", st.Query),
    ("SELECT * FROM range(10) r(i), generate_series(1, 3), unnest([1, 2])", st.Query),
    ("DELETE FROM t", st.Delete),
    ("DELETE FROM t WHERE id > 3", st.Delete),
    ("INSERT INTO t VALUES (1, 'a', 1.0, DATE '2024-01-01')", st.Insert),
    ("INSERT INTO t (id, a) SELECT id, 'x' FROM u", st.Insert),
    ("CREATE TABLE n (a INT, b VARCHAR)", st.CreateTable),
    ("CREATE TABLE n AS SELECT * FROM t", st.CreateTableAs),
    ("DROP TABLE t", st.DropTable),
    ("DROP TABLE IF EXISTS t", st.DropTable),
    ("VACUUM t", st.Maintenance),
    ("OPTIMIZE t", st.Maintenance),
    ("SET delete_mode = 'splice'", st.SetSession),
    ("SET delete_mode = 'dv'", st.SetSession),
    ("UPDATE t SET a = 'x' WHERE id IN (SELECT id FROM u)", st.Update),
    ("UPDATE t AS z SET a = u.a FROM u WHERE z.id = u.id", st.Update),
    ("MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN DELETE", st.Merge),
    ("DELETE FROM t USING u WHERE t.id = u.id", st.Delete),
    ("DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.id)", st.Delete),
])
def test_classified(sql, kind):
    stmt = parse_statement(sql)
    # a plain INSERT ... VALUES is the fast path's Insert (sql/values.py)
    assert type(stmt) is kind or (kind is st.Insert and type(stmt) is st.InsertValues)
    assert stmt.writes == (kind not in (st.Query, st.SetSession))


@pytest.mark.parametrize("sql, reason", [
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("SELECT * FROM read_csv_auto('/etc/passwd')", "read_csv_auto"),
    ("SELECT * FROM read_parquet('x.parquet')", "read_parquet"),
    ("SELECT * FROM read_json('x.json')", "read_json"),
    ("SELECT * FROM read_text('/etc/passwd')", "read_text"),
    ("SELECT content FROM t, read_blob('/etc/passwd')", "read_blob"),
    ("SELECT * FROM glob('/etc/*')", "glob"),
    ("SELECT * FROM duckdb_settings()", "duckdb_settings"),
    ("SELECT * FROM query('SELECT 1')", "query"),
    ("SELECT (SELECT count(*) FROM read_csv('/etc/passwd'))", "read_csv"),
    ("COPY t TO '/tmp/out.csv'", "COPY"),
    ("COPY (SELECT 1) TO '/tmp/out.parquet' (FORMAT parquet)", "COPY"),
    ("ATTACH '/tmp/x.db' AS x", "ATTACH"),
    ("DETACH x", "DETACH"),
    ("INSTALL httpfs", "INSTALL"),
    ("LOAD httpfs", "LOAD"),
    ("PRAGMA database_list", "PRAGMA"),
    ("SET enable_external_access = true", "engine settings"),
    ("SET memory_limit = '1GB'", "engine settings"),
    ("SET delete_mode = 'bogus'", "bad value"),
    ("EXPORT DATABASE '/tmp/x'", "DATABASE is not allowed"),
    ("SELECT 1; SELECT 2", "one statement"),
    ("DELETE FROM t; DROP TABLE t", "one statement"),
    ("CREATE VIEW v AS SELECT 1", "CREATE VIEW"),
    ("CREATE MACRO m(a) AS a", "CREATE MACRO"),
    ("CREATE SECRET (TYPE s3)", "CREATE SECRET statements are not allowed"),
    ("CREATE OR REPLACE PERSISTENT SECRET s (TYPE s3)", "CREATE SECRET statements"),
    ("DROP SECRET IF EXISTS s1", "DROP SECRET statements are not allowed"),
    ("SELECT * FROM (SHOW TABLES)", "SHOW inside a statement is not supported"),
    ("SELECT * FROM (SHOW ALL TABLES)", "SHOW inside a statement is not supported"),
    ("SELECT count(*) FROM (SHOW t) AS x", "SHOW inside a statement is not supported"),
    ("OPTIMIZE t WHERE v = 'It''s'", "unexpected \"WHERE v = 'It''s'\" after OPTIMIZE t"),
    ("CALL pragma_version()", "CALL"),
    ("WITH x AS (SELECT 1 AS a) INSERT INTO t SELECT a FROM x", "INSERT INTO t WITH x AS"),
    ("MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN ERROR 'dup'",
     "THEN ERROR is not supported"),
    ("SELECT * FROM information_schema.nope", "has no view"),
    ("SELECT * FROM system.information_schema.tables", "unknown schema or catalog"),
    ("SELECT * FROM other.t", "unknown schema or catalog"),
    ("SELECT * FROM system.main.t", "unknown schema or catalog"),
    ("DELETE FROM other.t", "unknown schema or catalog"),
    ("VACUUM other.t", "unknown schema or catalog"),
    ("VACUUM t FULL", "the form is"),
    ("VACUUM t RETAIN 0 VERSIONS", "n >= 1"),
    ("OPTIMIZE t; DROP TABLE t", "one statement"),
    ("SELECT * FROM flightsrv_history(1)", "table name"),
    ("SELECT * FROM flightsrv_history('t', 'u')", "table name"),
    ("DELETE FROM t WHERE id IN (SELECT * FROM read_csv('/etc/passwd'))", "read_csv"),
    ('WITH "/w/t/data/x.parquet" AS (SELECT * FROM "/w/t/data/x.parquet") SELECT 1',
     "plain identifier"),
    ("SELECT __fsrv_pos FROM t", "reserved"),
    ("WITH x AS (SELECT 1) DELETE FROM t", "WITH"),
    ("UPDATE t SET a = 'x' RETURNING *", "RETURNING"),
    ("CREATE TABLE n (a INT PRIMARY KEY)", "constraint"),
    ("SELECT $name", "named parameters"),
    ("SELECT ?, $1", "mix"),
    ("", "empty"),
    ("PIVOT t ON b IN (1, 2) USING count(*) GROUP BY i", "SELECT * FROM (PIVOT"),
    ("UNPIVOT t ON i, j INTO NAME k VALUE v", "SELECT * FROM (UNPIVOT"),
])
def test_refused(sql, reason):
    with pytest.raises(SqlError) as ei:
        parse_statement(sql)
    assert reason.lower() in str(ei.value).lower()
    if sql:
        assert "statement=" in str(ei.value)


def test_error_names_position():
    with pytest.raises(SqlError) as ei:
        parse_statement("SELECT *\nFROM read_csv('/etc/passwd')")
    assert ei.value.context["line"] == 2
    assert ei.value.context["col"] == 6
    with pytest.raises(SqlError) as ei:
        parse_statement("SELECT 1 FROM FROM")
    assert ei.value.context["line"] == 1


@pytest.mark.parametrize("sql,line,col", [
    ("EXPLAIN SELECT * FROM s WHERE score > 1000000", 1, 1),
    ("EXPLAIN ANALYZE SELECT id FROM s", 1, 1),
    ("CALL pragma_version()", 1, 1),
    ("ANALYZE s", 1, 1),
    ("PIVOT s ON id USING sum(score)", 1, 1),
    ("  ATTACH 'x.db' AS x", 1, 3),
    ("-- a comment\nCOPY s TO 'x.csv'", 2, 1),
])
def test_a_statement_refused_by_its_kind_points_at_its_keyword(sql, line, col):
    """The caret of a statement refused for its kind is under the keyword that makes it that
    kind, not its last token (session 29: EXPLAIN's caret sat under 1000000)."""
    with pytest.raises(SqlError) as ei:
        parse_statement(sql)
    assert (ei.value.context["line"], ei.value.context["col"]) == (line, col), str(ei.value)


def test_create_table_types():
    stmt = parse_statement(
        "CREATE TABLE n (a INT NOT NULL, b VARCHAR(10), c DECIMAL(10, 2), d TIMESTAMP, "
        "e INT[], f STRUCT(x INT, y VARCHAR), g MAP(VARCHAR, BIGINT), h DATE, i BOOLEAN, "
        "j DOUBLE, k BLOB, l TIMESTAMPTZ, m UBIGINT)")
    s = stmt.schema
    assert s.field("a").type == pa.int32() and not s.field("a").nullable
    assert s.field("b").type == pa.string() and s.field("b").nullable
    assert s.field("c").type == pa.decimal128(10, 2)
    assert s.field("d").type == pa.timestamp("us")
    assert s.field("e").type == pa.list_(pa.int32())
    assert s.field("f").type == pa.struct([("x", pa.int32()), ("y", pa.string())])
    assert s.field("g").type == pa.map_(pa.string(), pa.int64())
    assert s.field("h").type == pa.date32()
    assert s.field("i").type == pa.bool_()
    assert s.field("j").type == pa.float64()
    assert s.field("k").type == pa.binary()
    assert s.field("l").type == pa.timestamp("us", tz="UTC")
    assert s.field("m").type == pa.uint64()


def test_maintenance_and_set_parse():
    m = parse_statement('OPTIMIZE "My T"')
    assert (m.verb, m.table, m.options) == ("optimize", "My T", "")
    m = parse_statement('vacuum "flightsrv"."main".t retain 3 versions retain 0 hours dry run;')
    assert (m.verb, m.table, m.retain_versions, m.retain_hours, m.dry_run) == (
        "vacuum", "t", 3, 0, True)
    m = parse_statement("PURGE main.t EXPIRE")
    assert (m.verb, m.table, m.expire, m.writes) == ("purge", "t", True, True)
    assert parse_statement("PURGE t").expire is False
    q = parse_statement("SHOW STATS main.t")
    assert isinstance(q, st.Query) and "flightsrv_table_stats('t')" in q.text
    s = parse_statement("SET delete_mode TO splice")
    assert (s.name, s.value) == ("delete_mode", "splice")


@pytest.mark.parametrize("sql", [
    "SELECT * FROM main.t", "SELECT * FROM flightsrv.main.t", 'SELECT * FROM "main"."t"',
    'SELECT * FROM "flightsrv"."main"."t"', "SELECT * FROM FLIGHTSRV.MAIN.t",
    "DELETE FROM main.t WHERE a = 1", "INSERT INTO flightsrv.main.t VALUES (1)",
    "DROP TABLE main.t", "CREATE TABLE main.t (a INT)", "SELECT main.t.a FROM main.t",
])
def test_qualified_names_of_the_one_schema(sql):
    stmt = parse_statement(sql)
    tables = [t for t in stmt.tree.find_all(exp.Table)]
    assert tables and all(t.name == "t" and not t.args.get("db") and not t.args.get("catalog")
                          for t in tables)
    assert stmt.spliceable == ("main.t.a" not in sql)
    if hasattr(stmt, "table"):
        assert stmt.table == "t"


def test_placeholders_numbered_in_text_order():
    stmt = parse_statement("SELECT ? AS p FROM t WHERE id = ? LIMIT ?")
    assert stmt.param_count == 3
    tree = bind_params(stmt.tree, [pa.scalar("s"), pa.scalar(5), pa.scalar(2)],
                       stmt.sql, stmt.param_count)
    sql = tree.sql("duckdb")
    assert "'s' AS p" in sql and "id = CAST(5 AS BIGINT)" in sql
    assert "LIMIT CAST(2 AS BIGINT)" in sql
    assert parse_statement("SELECT $2, $1").param_count == 2
    assert parse_statement("SELECT '?'").param_count == 0


@pytest.mark.parametrize(("sql", "count", "text"), [
    ("SELECT ?,?", 2, "SELECT $1,$2"),
    ("SELECT $1,$2", 2, "SELECT $1,$2"),
    ("SELECT $2,$1", 2, "SELECT $2,$1"),
    ("SELECT ?+?,?||?", 4, "SELECT $1+$2,$3||$4"),
    ("SELECT ?::INT,?", 2, "SELECT $1::INT,$2"),
    ("SELECT 1 FROM t WHERE id IN (?,?,?)", 3, "SELECT 1 FROM t WHERE id IN ($1,$2,$3)"),
    # (a comment keeps it off the VALUES fast path, which hands `?` to DuckDB as it is)
    ("INSERT INTO t /* x */ VALUES (?,?),(?,?)", 4,
     "INSERT INTO t /* x */ VALUES ($1,$2),($3,$4)"),
    ("SELECT '$1,$2', $1", 1, "SELECT '$1,$2', $1"),
    ("SELECT $t$ $1,$2 $t$, $1", 1, "SELECT $t$ $1,$2 $t$, $1"),
    ("SELECT /* ?,? */ ?", 1, "SELECT /* ?,? */ $1"),
    ('SELECT 1 AS "?,?", ?', 1, 'SELECT 1 AS "?,?", $1'),
])
def test_adjacent_placeholders_parse(sql, count, text):
    """A bare comma (or operator) between two placeholders: sqlglot alone reads ``$1,$``
    as the start of a dollar-quoted string; DuckDB reads two parameters."""
    stmt = parse_statement(sql)
    assert (stmt.param_count, stmt.text) == (count, text)
    numbers = {str(p.this) for p in stmt.tree.find_all(exp.Placeholder)}
    assert numbers == {str(n) for n in range(1, count + 1)}


def test_params_from_batch_positional():
    b = pa.record_batch({"1": ["b"], "0": [1]})
    assert [v.as_py() for v in params_from_batch(b)] == [1, "b"]
    b = pa.record_batch({"x": [1], "y": ["b"]})
    assert [v.as_py() for v in params_from_batch(b)] == [1, "b"]


# -- time travel and pinning -----------------------------------------------------------------


def test_time_travel_resolution():
    qp, r = plan("SELECT * FROM t AT (VERSION => 3) JOIN u AT (TIMESTAMP => '2024-01-01') "
                 "ON t.id = u.id")
    assert ("t", 3, None) in r.calls and ("u", None, "2024-01-01") in r.calls
    assert "AT (" not in qp.sql
    assert {s.snapshot.version for s in qp.scans if s.table == "t"} == {3}


def test_time_travel_version_from_parameter():
    _, r = plan("SELECT * FROM t AT (VERSION => ?)", [4])
    assert r.calls == [("t", 4, None)]


def test_time_travel_bad_version():
    with pytest.raises(SqlError, match="VERSION"):
        plan("SELECT * FROM t AT (VERSION => 'x')")


def test_repeated_references_pin_one_version():
    qp, r = plan("SELECT * FROM t a JOIN t b ON a.id = b.id "
                 "WHERE a.id IN (SELECT id FROM t) UNION ALL SELECT * FROM t, t AS c")
    t_scans = [s for s in qp.scans if s.table == "t"]
    assert len(t_scans) == 5
    assert len({s.snapshot.version for s in t_scans}) == 1
    assert r.calls == [("t", None, None)]  # resolved once
    assert len({s.relation for s in qp.scans}) == len(qp.scans)  # unique relation names


def test_pinned_plus_time_travel_differ():
    qp, _ = plan("SELECT * FROM t JOIN t AT (VERSION => 2) old USING (id)")
    versions = sorted(s.snapshot.version for s in qp.scans)
    assert versions[0] == 2 and versions[1] > 2


def test_rewrite_keeps_alias_and_qualifiers():
    qp, _ = plan("SELECT t.id, x.x FROM t JOIN u AS x ON t.id = x.id")
    assert "AS t " in qp.sql and "AS x " in qp.sql and "t.id" in qp.sql


def test_cte_names_are_not_tables():
    qp, _ = plan("WITH t2 AS (SELECT id FROM t) SELECT * FROM t2")
    assert [s.table for s in qp.scans] == ["t"]


def test_unknown_table():
    with pytest.raises(TableNotFound, match="nope"):
        plan("SELECT * FROM nope")
    with pytest.raises(TableNotFound):
        plan("SELECT * FROM '/etc/passwd'")


# -- scan hints ---------------------------------------------------------------------------------


def scans(sql, params=()):
    qp, _ = plan(sql, params)
    return {s.table if s.table not in [x.table for x in qp.scans if x is not s] else s.relation: s
            for s in qp.scans}


def test_projection():
    s = scans("SELECT a FROM t WHERE b > 1")
    assert s["t"].columns == ["a", "b"]
    assert scans("SELECT count(*) FROM t")["t"].columns == []
    assert scans("SELECT * FROM t")["t"].columns is None
    assert scans("SELECT t.* FROM t JOIN u USING (id)")["t"].columns is None
    s = scans("SELECT t.a FROM t JOIN u USING (id)")
    assert s["t"].columns == ["id", "a"] and s["u"].columns == ["id"]
    assert scans("SELECT t FROM t")["t"].columns is None  # whole-row reference
    assert scans("SELECT * FROM t NATURAL JOIN u")["u"].columns is None


def test_prune_terms():
    s = scans("SELECT a FROM t WHERE id > 5 AND b < 2.5 AND a = 'x' AND d > '2024-01-01' "
              "AND lower(a) = 'x' AND 3 <= id AND id BETWEEN 1 AND 9 AND a IS NOT NULL")
    assert s["t"].prune == (PruneTerm("id", ">", ("5",)), PruneTerm("b", "<", ("2.5",)),
                            PruneTerm("a", "=", ("'x'",)), PruneTerm("d", ">", ("'2024-01-01'",)),
                            PruneTerm("id", ">=", ("3",)), PruneTerm("id", "between", ("1", "9")),
                            PruneTerm("a", "not_null"))
    s = scans("SELECT * FROM t JOIN u ON t.id = u.id WHERE u.x IN (1, 2) AND t.a IS NULL")
    assert s["u"].prune == (PruneTerm("x", "in", ("1", "2")),)
    assert s["t"].prune == (PruneTerm("a", "is_null"),)
    assert scans("SELECT * FROM t WHERE id = ?", [7])["t"].prune == (
        PruneTerm("id", "=", ("CAST(7 AS BIGINT)",)),)
    # a string column compared with a number: DuckDB would cast the column, not pruned
    assert scans("SELECT * FROM t WHERE a = 5")["t"].prune == ()


def test_an_or_of_one_column_spelled_with_and_without_its_table_is_one_term():
    """``t.id = 1 OR id = 2`` lists one column when ``id`` can only be ``t``'s; columns of
    two references, or a name another source may hold, stay apart."""
    want = (PruneTerm("id", "in", ("1", "2")),)
    assert scans("SELECT * FROM t WHERE t.id = 1 OR id = 2")["t"].prune == want
    assert scans("SELECT * FROM t AS x WHERE id = 1 OR X.ID = 2")["t"].prune == want
    assert scans("SELECT * FROM t JOIN u ON t.id = u.id WHERE t.id = 1 OR u.id = 2"
                 )["t"].prune == ()
    assert scans("SELECT * FROM t, (SELECT 1 AS z) s WHERE t.id = 1 OR id = 2"
                 )["t"].prune == ()  # a derived table: unqualified names are not provably t's


def test_no_prune_terms_through_outer_join_or_ambiguity():
    s = scans("SELECT * FROM t LEFT JOIN u ON t.id = u.id WHERE u.x IS NULL AND t.id = 1")
    assert s["t"].prune == () and s["u"].prune == ()
    s = scans("SELECT * FROM t JOIN u USING (id) WHERE id = 3")  # unqualified, in both
    assert s["t"].prune == () and s["u"].prune == ()
    s = scans("SELECT * FROM t, (SELECT 1 AS x) s WHERE x = 1")  # x not provably t's
    assert s["t"].prune == ()
    s = scans("SELECT * FROM t ASOF JOIN u ON t.id >= u.id WHERE t.id = 1")
    assert s["t"].prune == ()


@pytest.mark.parametrize("sql, clause", [
    ("INSERT OR REPLACE INTO t VALUES (1)", "OR REPLACE"),
    ("INSERT OR IGNORE INTO t VALUES (1)", "OR IGNORE"),
    ("INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING", "CONFLICT"),
    ("INSERT INTO t VALUES (1) RETURNING *", "RETURNING"),
])
def test_insert_clauses_beyond_a_plain_insert_are_refused_not_ignored(sql, clause):
    """DuckDB gives these meaning (upsert, skip duplicates); run as a plain INSERT they would
    silently add duplicates, so each is refused by name."""
    from flightsrv.sql.statements import parse_statement

    with pytest.raises(SqlError, match=f"INSERT with {clause} is not supported"):
        parse_statement(sql)


def test_insert_by_name_is_parsed_as_by_name_not_as_a_plain_insert():
    """BY NAME matches the query's columns by name (tests/test_insert_by_name.py runs it);
    read as a plain INSERT it would match them by position."""
    from flightsrv.sql.statements import Insert, parse_statement

    stmt = parse_statement("INSERT INTO t BY NAME SELECT 1 AS a")
    assert isinstance(stmt, Insert) and stmt.by_name and stmt.columns is None
    assert not parse_statement("INSERT INTO t SELECT 1 AS a").by_name


@pytest.mark.parametrize("sql", ["SELECT * FROM", "SELECT 1 WHERE", "SELECT * FROM t WHERE a =",
                                 "SELECT a FROM t ORDER BY", "DELETE FROM", "SELEC 1",
                                 "SELECT (1", "INSERT INTO t VALUES ("])
def test_syntax_errors_speak_sql_not_the_parsers_objects(sql):
    with pytest.raises(SqlError) as exc:
        parse_statement(sql)
    msg = str(exc.value)
    assert msg.startswith("syntax error") or "tokenize" in msg
    for internal in ("<Token", "TokenType", "<class", "sqlglot", "Required keyword"):
        assert internal not in msg, msg


@pytest.mark.parametrize("sql", ["EXPORT DATABASE 'out'", "import database 'in'"])
def test_export_and_import_database_are_refused_by_name(sql):
    with pytest.raises(SqlError, match="DATABASE is not allowed"):
        parse_statement(sql)


@pytest.mark.parametrize("sql,needle", [
    ("CREATE OR REPLACE TABLE IF NOT EXISTS t (a INT)", "OR REPLACE and IF NOT EXISTS"),
    ("CREATE OR REPLACE TABLE IF NOT EXISTS t AS SELECT 1 AS a", "OR REPLACE and IF NOT EXISTS"),
    ("DELETE t", "DELETE needs FROM"),
    ("DELETE t WHERE id = 1", "DELETE needs FROM"),
])
def test_contradictory_or_incomplete_statements_are_refused_clearly(sql, needle):
    """CREATE OR REPLACE ... IF NOT EXISTS wiped the table (DuckDB refuses it); DELETE
    without FROM failed inside the error builder (an unexpected AttributeError)."""
    with pytest.raises(SqlError, match=needle):
        parse_statement(sql)


def test_a_type_named_column_compared_with_less_than_gets_a_hint():
    # sqlglot reads "range <" as the start of a type's parameter list; quoting works
    with pytest.raises(SqlError, match=r'quoted \("range"\)'):
        parse_statement("SELECT range < 5 FROM range(3)")
    parse_statement('SELECT "range" < 5 FROM range(3)')


def test_binding_thousands_of_parameters_is_the_same_tree_and_checks_its_deadline():
    """``bind_params`` of an IN list of 3,000 parameters (sqlglot's transform took n^2: a
    20,000-parameter statement held the GIL for minutes past its deadline, session 29): the
    same text as literals spelled one by one, strings and negative numbers included; the
    deadline ``check`` runs while it binds, and its QueryCancelled ends the bind."""
    import datetime as dt

    from flightsrv.errors import QueryCancelled
    from flightsrv.sql.types import parameter_literal

    n = 3000
    sql = ("SELECT * FROM t WHERE a IN (" + ", ".join("?" for _ in range(n)) +
           ") AND b = ? AND c = ?")
    stmt = parse_statement(sql)
    values = [pa.scalar(i - 1500, pa.int64()) if i % 3 else pa.scalar(f"it's {i}")
              for i in range(n)] + [pa.scalar(dt.date(2020, 1, 2)), pa.scalar(-0.5)]
    got = bind_params(stmt.tree, values, sql, stmt.param_count).sql(dialect="duckdb")
    want = ("SELECT * FROM t WHERE a IN (" +
            ", ".join(parameter_literal(v, i + 1) for i, v in enumerate(values[:n])) +
            f") AND b = {parameter_literal(values[n], n + 1)} AND c = "
            f"{parameter_literal(values[n + 1], n + 2)}")
    from sqlglot import parse_one
    assert got == parse_one(want, read="duckdb").sql(dialect="duckdb")
    calls = []

    def check():
        calls.append(1)
        if len(calls) > 3:
            raise QueryCancelled("statement timed out", reason="timeout")

    with pytest.raises(QueryCancelled):
        bind_params(stmt.tree, values, sql, stmt.param_count, check=check)
    assert len(calls) == 4


def test_large_statements_are_parsed_one_at_a_time(monkeypatch):
    """A statement over LARGE_STATEMENT_CHARS is parsed while no other such statement is
    (each costs ~300 bytes of memory per character: four at once took a server past its
    cap); shorter ones are not held back, and one parse may nest another (SUMMARIZE)."""
    import threading

    from flightsrv.sql import statements

    inside: dict[int, int] = {}  # thread -> large parses it is in (SUMMARIZE nests one)
    most, lock = [0], threading.Lock()
    real = statements._parse_general

    def counted(sql):
        me, big = threading.get_ident(), len(sql) > statements.LARGE_STATEMENT_CHARS
        with lock:
            inside[me] = inside.get(me, 0) + big
            most[0] = max(most[0], sum(1 for n in inside.values() if n))
        try:
            return real(sql)
        finally:
            with lock:
                inside[me] -= big

    monkeypatch.setattr(statements, "_parse_general", counted)
    items = ",".join(str(i) for i in range(15_000))
    texts = [f"SELECT {k} AS k FROM t WHERE id IN ({items})" for k in range(4)]
    texts.append(f"SUMMARIZE SELECT * FROM t WHERE id IN ({items})")
    assert all(len(t) > statements.LARGE_STATEMENT_CHARS for t in texts)
    errors: list = []

    def parse(text):
        try:
            parse_statement(text)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=parse, args=(t,)) for t in texts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert most[0] == 1
    parse_statement("SELECT 1")  # a short one takes no turn
