"""The INSERT ... VALUES fast path (issue 35): the VALUES text goes to DuckDB's own INSERT
without a front-end parse tree, and parameter batches (``executemany``) are one statement
and one commit. Checked against plain DuckDB running the same statements (differential),
and against the guard: whatever the fast path's allow-list does not take falls back to the
general path, which refuses forbidden functions inside VALUES as before.
"""

from __future__ import annotations

import decimal
import warnings

import duckdb
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import FlightsrvError, SqlError
from flightsrv.sql import statements as st
from flightsrv.sql.values import scan_insert_values

DDL = ("CREATE TABLE ev (id BIGINT NOT NULL, ts TIMESTAMP, k VARCHAR, v DOUBLE, "
       "d DECIMAL(10,2), l INTEGER[])")
ADD = "ALTER TABLE ev ADD COLUMN w INTEGER DEFAULT 7"
ORDER = "SELECT * FROM ev ORDER BY id, k NULLS FIRST, v NULLS FIRST"


def _setup(path):
    wh = Warehouse.open(str(path))
    ref = duckdb.connect()
    for sql in (DDL, ADD):
        wh.sql(sql)
        ref.execute(sql)
    return wh, ref


def _rows(table: pa.Table) -> list:
    """Rows as tuples, NaN spelled out (NaN != NaN)."""
    return [tuple("nan" if v != v else v for v in r.values()) for r in table.to_pylist()]


def _same(wh, ref) -> None:
    assert _rows(wh.sql(ORDER)) == _rows(ref.sql(ORDER).to_arrow_table())


FAST = [
    "INSERT INTO ev VALUES (1, '2026-01-01 00:00:00', 'a', 1.5, 2.555, [1, 2], 3)",
    "INSERT INTO ev (id, k) VALUES (2, 'x'), (3, NULL), (4, 10)",
    "insert into EV (K, ID) values ('lower', 5);",
    "INSERT INTO ev (id, ts, v) VALUES (6, TIMESTAMP '2026-01-01' + INTERVAL 3 SECOND, "
    "abs(-2.5) * 2), (7, CAST('2026-02-01' AS TIMESTAMP), 1e3)",
    "INSERT INTO ev (id, d, w) VALUES (8, CAST('1.255' AS DECIMAL(10,3)), DEFAULT), "
    "(9, '12.5'::DECIMAL(10,2), 1.5)",
    "INSERT INTO ev (id, v, k) VALUES (10, 'NaN', 1.5), (11, 'inf', upper('q') || 'r')",
    "INSERT INTO ev (id, l) VALUES (12, [1.5, NULL]), (13, [])",
    "INSERT INTO ev (id, k) VALUES (14, CASE WHEN 1 < 2 THEN 'y' ELSE 'n' END)",
]


@pytest.mark.parametrize("sql", FAST, ids=range(len(FAST)))
def test_fast_path_taken(sql):
    stmt = st.parse_statement(sql)
    assert isinstance(stmt, st.InsertValues), sql


def test_fast_path_agrees_with_duckdb(tmp_path):
    wh, ref = _setup(tmp_path / "wh")
    for sql in FAST:
        wh.sql(sql)
        ref.execute(sql)
    _same(wh, ref)


CONSTANT_ROWS = [
    # rows of constants only: read by one regular expression per row
    "INSERT INTO ev (id, k, v) VALUES (1, 'a', 1.5), (2, 'it''s, (x)', -2e3)",
    "INSERT INTO ev (id, ts) VALUES (3, TIMESTAMP '2026-01-01 00:00:01'), (4, NULL) ;",
    "insert into ev (id, k) values (5,''),(6,'''')",
    "INSERT INTO ev (id, v, k) VALUES (7, .5, null), (8, +1., 'a''''b')",
    "INSERT INTO ev (id, k) VALUES\n  (9, TRUE),\n\t(10, false)",
    "INSERT INTO ev (id, d) VALUES (11, 1.25e-1)",
    # anything else: the token walk reads it (or refuses it)
    "INSERT INTO ev (id, k) VALUES (12, 'a' 'b')",
    "INSERT INTO ev (id, k) VALUES (13, 'a'), (14)",
    "INSERT INTO ev (id, k) VALUES (15, 'a'), (16, 'b'",
    "INSERT INTO ev (id, k) VALUES (17, 'a'),, (18, 'b')",
    "INSERT INTO ev (id, k) VALUES (19, 'a') (20, 'b')",
    "INSERT INTO ev (id, v) VALUES (21, 1.5.5), (22, 1x)",
    "INSERT INTO ev (id, v) VALUES (23, --1\n 2)",
    "INSERT INTO ev (id, k) VALUES (24, 'unterminated)",
    "INSERT INTO ev (id, k) VALUES (25, 'x') -- a comment",
    "INSERT INTO ev (id, k) VALUES (26, DATE'2026-01-01'), (27, ?)",
    "INSERT INTO ev (id, k) VALUES (28, NULLS), (29, 'x')",
    "INSERT INTO ev (id, k) VALUES (30, 'a'); DROP TABLE ev",
    "INSERT INTO ev (id, k) VALUES (31, 'a'), (32, 'b'), (33, 'c', 'd')",
]


@pytest.mark.parametrize("sql", CONSTANT_ROWS, ids=range(len(CONSTANT_ROWS)))
def test_constant_rows_are_read_as_the_token_walk_reads_them(sql):
    """The regular-expression reading of rows of constants gives what the token walk
    gives (the same rows, widths, text), and never takes what the walk refuses."""
    from flightsrv.sql import values

    assert values._scan(sql, 250, constants=True) == values._scan(sql, 250, constants=False)


def test_constant_rows_agree_with_duckdb(tmp_path):
    wh, ref = _setup(tmp_path / "wh")
    from flightsrv.sql import values

    for sql in CONSTANT_ROWS[:6]:
        assert isinstance(st.parse_statement(sql), st.InsertValues), sql
        body = sql[values._HEAD.match(sql).end():].rstrip().removesuffix(";")
        assert values._scan_constants(body) is not None, sql  # read by the regex
        wh.sql(sql)
        ref.execute(sql)
    _same(wh, ref)


def test_long_constant_list_in_parts_agrees_with_duckdb(tmp_path, monkeypatch):
    """A long list of constant rows runs in parts on several cursors at once: the rows
    arrive in the statement's order and as DuckDB's one INSERT makes them, in one commit;
    a value that fails in a later part fails the statement as DuckDB's would, naming it,
    and commits nothing."""
    import os

    from flightsrv.engine import writes

    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # four parts on any machine
    monkeypatch.setattr(writes, "VALUES_PART_ROWS", 256)
    monkeypatch.setattr(writes, "VALUES_CHUNK_ROWS", 256)
    wh, ref = _setup(tmp_path / "wh")
    rows = ", ".join(f"({i}, '2026-01-01 00:00:{i % 60:02d}', 'k''{i % 7}', "
                     f"{'NULL' if i % 5 == 0 else f'{i % 13}.25'}, {i}.125)"
                     for i in range(1, 1201))
    sql = "INSERT INTO ev (id, ts, k, v, d) VALUES " + rows  # l NULL, w its default
    stmt = st.parse_statement(sql)
    assert isinstance(stmt, st.InsertValues) and len(stmt.splits) >= 3
    calls = []
    real = writes.Writes._in_parts
    monkeypatch.setattr(writes.Writes, "_in_parts",
                        lambda self, runs, into: calls.append(len(runs)) or real(self, runs,
                                                                                 into))
    before = wh.table("ev").head().version
    assert wh.sql(sql) == 1200
    ref.execute(sql)
    assert calls == [4]
    assert wh.table("ev").head().version == before + 1
    assert _rows(wh.sql("SELECT * FROM ev")) == _rows(ref.sql("SELECT * FROM ev")
                                                      .to_arrow_table())  # same order
    bad = sql.replace("(1100, '2026", "(1100, 'x2026")  # a cast that fails in part 4
    with pytest.raises(duckdb.Error) as want:
        ref.execute(bad)
    with pytest.raises(FlightsrvError) as got:
        wh.sql(bad)
    assert "x2026" in str(want.value) and "x2026" in str(got.value)
    assert "INSERT INTO ev" in str(got.value)
    assert wh.table("ev").head().version == before + 1


def test_long_constant_list_runs_as_shorter_inserts(tmp_path, monkeypatch):
    """A long list of constant rows reaches DuckDB as INSERTs of about VALUES_CHUNK_ROWS
    rows each, in order, on one cursor when there is one part (DuckDB's CPU for one list
    grows faster than its rows): the same rows as DuckDB's one INSERT, one commit; a value
    that fails in a later INSERT fails the statement as DuckDB's would and commits
    nothing."""
    import os

    from flightsrv.engine import writes

    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one part
    monkeypatch.setattr(writes, "VALUES_CHUNK_ROWS", 256)
    texts: list = []
    real = writes.split_rows
    monkeypatch.setattr(writes, "split_rows", lambda *a: texts.extend(real(*a)) or real(*a))
    wh, ref = _setup(tmp_path / "wh")
    rows = ", ".join(f"({i}, TIMESTAMP '2026-01-01 00:00:{i % 60:02d}', 'k{i % 7}', "
                     f"{'NULL' if i % 5 == 0 else f'{i % 13}.25'}, {i}.125)"
                     for i in range(1, 1201))
    sql = "INSERT INTO ev (id, ts, k, v, d) VALUES " + rows
    before = wh.table("ev").head().version
    assert wh.sql(sql) == 1200
    ref.execute(sql)
    assert len(texts) == 5 and all(t.count("TIMESTAMP") <= 256 for t in texts)
    assert "".join(texts).count("TIMESTAMP") == 1200
    assert wh.table("ev").head().version == before + 1
    assert _rows(wh.sql("SELECT * FROM ev")) == _rows(ref.sql("SELECT * FROM ev")
                                                      .to_arrow_table())  # same order
    bad = sql.replace("(1000, TIMESTAMP '2026", "(1000, TIMESTAMP 'x2026")
    with pytest.raises(duckdb.Error) as want:
        ref.execute(bad)
    with pytest.raises(FlightsrvError) as got:
        wh.sql(bad)
    assert "x2026" in str(want.value) and "x2026" in str(got.value)
    assert wh.table("ev").head().version == before + 1


ERRORS = [
    "INSERT INTO ev (id, k) VALUES (NULL, 'x')",  # NOT NULL
    "INSERT INTO ev (k) VALUES ('x')",  # NOT NULL, omitted
    "INSERT INTO ev (id, v) VALUES (20, 'abc')",  # a cast that fails
    "INSERT INTO ev (id) VALUES (21, 1)",  # more values than columns
    "INSERT INTO ev (id, k) VALUES (22, 'a'), (23)",  # rows of different lengths
    "INSERT INTO ev (id, d) VALUES (24, 123456789012.5)",  # out of the decimal's range
]


@pytest.mark.parametrize("sql", ERRORS, ids=range(len(ERRORS)))
def test_fast_path_errors_agree_and_name_the_table(tmp_path, sql):
    wh, ref = _setup(tmp_path / "wh")
    assert isinstance(st.parse_statement(sql), st.InsertValues)
    with pytest.raises(duckdb.Error):
        ref.execute(sql)
    before = wh.table("ev").head().version
    with pytest.raises(FlightsrvError) as info:
        wh.sql(sql)
    text = str(info.value)
    assert "__fsrv" not in text and "Traceback" not in text, text
    assert "INSERT INTO ev" in text  # the statement is named
    if "NOT NULL" in text:
        assert "ev.id" in text
    assert wh.table("ev").head().version == before


def test_unknown_column_is_named(tmp_path):
    wh, _ = _setup(tmp_path / "wh")
    with pytest.raises(SqlError, match="nope"):
        wh.sql("INSERT INTO ev (id, nope) VALUES (1, 2)")


FORBIDDEN = [
    "INSERT INTO ev (id, k) VALUES (1, read_text('/etc/hostname'))",
    "INSERT INTO ev (id, k) VALUES (1, getenv('HOME'))",
    "INSERT INTO ev (id, k) VALUES (1, current_setting('threads'))",
    "INSERT INTO ev (id, k) VALUES (1, (SELECT content FROM read_text('/etc/hostname')))",
    "INSERT INTO ev (id, k) VALUES (1, main.upper('x'))",
    "INSERT INTO ev (id, k) VALUES (1, 'a' -- ')\n, read_text('/etc/hostname') --\n)",
    "INSERT INTO ev (id, k) VALUES (1, 'a' /* ' */ || read_text('/x') /* ' */)",
    "INSERT INTO ev (id, k) VALUES (1, \"read_text\"('/etc/hostname'))",
    "INSERT INTO ev (id, k) VALUES (1, E'\\x41'), (2, read_text('/x'))",
]


@pytest.mark.parametrize("sql", FORBIDDEN, ids=range(len(FORBIDDEN)))
def test_forbidden_inside_values_is_refused(tmp_path, sql):
    """The fast path declines (a word off its allow-list, a comment, a quoted name), and the
    general path's guard refuses, as for a SELECT; nothing is committed."""
    assert scan_insert_values(sql) is None
    wh, _ = _setup(tmp_path / "wh")
    before = wh.table("ev").head().version
    with pytest.raises(FlightsrvError):
        wh.sql(sql)
    assert wh.table("ev").head().version == before


def _batch(rows: list[tuple], types: list[pa.DataType]) -> pa.RecordBatch:
    cols = list(zip(*rows)) if rows else [[] for _ in types]
    return pa.record_batch([pa.array(list(c), t) for c, t in zip(cols, types)],
                           names=[str(i) for i in range(len(types))])


BATCHES = [
    ("INSERT INTO ev (id, k, v) VALUES (?, ?, ?)",
     [(1, "a", 1.5), (2, None, None), (3, "10", -0.0)],
     [pa.int64(), pa.string(), pa.float64()]),
    # parameters in another order, casts by DuckDB (text -> timestamp, int -> varchar)
    ("INSERT INTO ev (k, id, ts) VALUES ($2, $1, $3)",
     [(4, 7, "2026-01-01 00:00:01"), (5, 8, None)], [pa.int32(), pa.int64(), pa.string()]),
    # expressions around parameters
    ("INSERT INTO ev (id, v, k) VALUES (? + 100, ? * 2, upper(?))",
     [(1, 1.25, "x"), (2, None, "y")], [pa.int64(), pa.float64(), pa.string()]),
    # a decimal parameter (not bound natively: read as a column of its exact type)
    ("INSERT INTO ev (id, d) VALUES (?, ?)",
     [(9, decimal.Decimal("1.255")), (10, None)], [pa.int64(), pa.decimal128(6, 3)]),
    # a DEFAULT beside parameters (one execution per parameter row, one commit)
    ("INSERT INTO ev (id, v, w) VALUES (?, ?, DEFAULT)",
     [(15, 0.5), (16, None)], [pa.int64(), pa.float64()]),
    # several VALUES rows per parameter row
    ("INSERT INTO ev (id, k) VALUES (?, 'first'), (? + 1000, 'second')",
     [(11, 11), (12, 12)], [pa.int64(), pa.int64()]),
]


@pytest.mark.parametrize("sql,rows,types", BATCHES, ids=range(len(BATCHES)))
def test_parameter_batches_agree_with_duckdb(tmp_path, sql, rows, types):
    wh, ref = _setup(tmp_path / "wh")
    before = wh.table("ev").head().version
    n = wh.engine.execute_update(sql, wh._session(), _batch(rows, types))
    ref.executemany(sql, [list(r) for r in rows])
    assert n == ref.sql("SELECT count(*) FROM ev").fetchall()[0][0]
    _same(wh, ref)
    # one statement, one commit, whatever the number of parameter rows
    assert wh.table("ev").head().version == before + 1


def test_parameter_batch_error_commits_nothing(tmp_path):
    wh, _ = _setup(tmp_path / "wh")
    before = wh.table("ev").head().version
    with pytest.raises(FlightsrvError, match="ev.id"):
        wh.engine.execute_update("INSERT INTO ev (id, k) VALUES (?, ?)", wh._session(),
                                 _batch([(1, "a"), (None, "b")], [pa.int64(), pa.string()]))
    assert wh.table("ev").head().version == before
    assert wh.sql("SELECT count(*) AS n FROM ev").column("n").to_pylist() == [0]


def test_adbc_executemany_and_large_values(tmp_path):
    """Through a real server and the ADBC driver: ``executemany`` sends one DoPut with all
    parameter rows (one commit); a 10,000-row VALUES list runs and is not kept by the
    statement caches."""
    from adbc_driver_flightsql import dbapi

    from flightsrv.engine import DuckEngine
    from flightsrv.engine.duck import _parse
    from flightsrv.server.app import start_in_thread
    from flightsrv.server.config import ServerConfig

    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.sql("CREATE TABLE ev (id BIGINT, k VARCHAR, v DOUBLE)")
    server, port = start_in_thread(DuckEngine(wh), auth=None, config=ServerConfig())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
        cur = conn.cursor()
        before = wh.table("ev").head().version
        cur.executemany("INSERT INTO ev VALUES (?, ?, ?)",
                        [(i, f"k{i % 3}", i / 2) for i in range(200)])
        assert wh.table("ev").head().version == before + 1
        big = "INSERT INTO ev VALUES " + ", ".join(
            f"({1000 + i}, 'k{i % 3}', {i}.5)" for i in range(10_000))
        cur.execute(big)
        cur.fetchall()
        cur.execute("SELECT count(*), sum(id), count(DISTINCT k) FROM ev")
        assert cur.fetchall() == [(10_200, sum(range(200)) + sum(range(1000, 11_000)), 3)]
        assert not any(big in key for key in _cached_texts(_parse))
        cur.close()
        conn.close()
    finally:
        server.shutdown()


def _cached_texts(cached) -> list[str]:
    """The texts a text_cache keeps (its closure's OrderedDict keys)."""
    for cell in cached.__closure__ or ():
        v = cell.cell_contents
        if isinstance(v, dict):
            return [a for key in v for a in key if isinstance(a, str)]
    return []


def test_statement_log_caches_do_not_keep_large_statements():
    """The redacted statement log tokenizes each statement; its caches are bounded by text
    (a 10,000-row VALUES list is ~500 kB, and its token tuple many MB)."""
    from flightsrv.server import logs

    for fn in (logs.redact_sql, logs._tokens_of, logs.identifier_names,
               logs.literal_values):
        fn.cache_clear()
    for k in range(3):
        big = "INSERT INTO ev VALUES " + ", ".join(f"({k}, 'x{i}')" for i in range(8_000))
        assert logs.redact_sql(big).startswith("INSERT INTO ev VALUES (?")
        logs.identifier_names(big)
        logs.literal_values(big)
    for fn in (logs.redact_sql, logs._tokens_of, logs.identifier_names,
               logs.literal_values):
        # too large to keep (only the latest, alone); the redaction tokenizes only the
        # head of a list of constant rows, a short text the cache may keep
        assert fn.cache_chars() <= len("INSERT INTO ev VALUES ")
    small = "INSERT INTO ev VALUES (1, 'x')"
    logs.redact_sql(small)
    assert logs.redact_sql.cache_chars() == len(small)


def _constant_rows_statement(rnd, rows: int) -> str:
    """An INSERT ... VALUES of ``rows`` rows of constants, spelled in the many ways a
    client may (whitespace, case, signs, exponents, typed and escaped strings)."""
    def space():
        return rnd.choice(["", "", " ", "  ", "\n", "\t", " \r\n "])

    def constant():
        return rnd.choice([
            str(rnd.randint(-10**6, 10**6)), f"{rnd.choice(['-', '+', ''])}{rnd.random()}",
            "1.", ".5", "1e5", "1.5E-3", "-2.5e+10", "NULL", "null", "TRUE", "false",
            "'x'", "''", "'it''s'", "'a -- b /* c */'", "'two\nlines'", "'  spaced  '",
            "'café 日本'", "'ü'",
            f"TIMESTAMP{rnd.choice([' ', '  ', chr(10)])}'2026-01-01 00:00:01'",
            "date '2026-01-02'", "TIMESTAMPTZ '2026-01-01 00:00:00+00'", "Time '12:00'"])

    width = rnd.randint(1, 5)
    body = ",".join(space() + "(" + ",".join(space() + constant() + space()
                                           for _ in range(width)) + ")" + space()
                    for _ in range(rows))
    head = rnd.choice(["INSERT INTO ev VALUES", "insert into \"E v\" (a, \"b c\") values",
                       "INSERT  INTO ev\n(id)\tVALUES"])
    return head + space() + body.strip() + rnd.choice(["", ";", " ;", ";  ", "\n"])


def test_redacted_constant_rows_match_the_tokenizer():
    """The statement log's redaction of a list of constant rows reads them by the fast
    path's regular expression, not DuckDB's tokenizer: the same line, on generated lists."""
    import random

    from flightsrv.server import logs

    rnd = random.Random(35)
    for _ in range(300):
        sql = _constant_rows_statement(rnd, rnd.randint(1, 6))
        fast = logs._redact_constant_rows(sql)
        assert fast is not None, sql
        assert fast == logs._redact_tokens(sql), sql
    for sql in ("INSERT INTO ev VALUES (1, x)", "INSERT INTO ev VALUES (1), (2, 3)",
                "INSERT INTO ev VALUES (1 /* c */)", "INSERT INTO ev VALUES (0x1F)",
                "INSERT INTO ev VALUES (- 1)", "SELECT 1", "INSERT INTO ev VALUES (1)\v"):
        assert logs._redact_constant_rows(sql) is None  # the tokenizer reads these
        assert logs.redact_sql(sql) == logs._redact_tokens(sql)


def test_redacting_a_long_constant_list_tokenizes_only_its_head(monkeypatch):
    """A 10,000-row list of constants is redacted without DuckDB tokenizing its rows
    (200,000 tokens: 0.1-0.2 s of server CPU per statement under the default log)."""
    import duckdb as duck

    from flightsrv.server import logs

    seen: list[int] = []
    real = duck.tokenize
    monkeypatch.setattr(duck, "tokenize", lambda sql: (seen.append(len(sql)), real(sql))[1])
    logs.redact_sql.cache_clear()
    logs._tokens_of.cache_clear()
    sql = "INSERT INTO ev VALUES " + ", ".join(
        f"({i}, TIMESTAMP '2026-01-01 00:00:{i % 60:02d}', 'k{i % 5}', {i / 10})"
        for i in range(10_000))
    assert logs.redact_sql(sql) == "INSERT INTO ev VALUES " + ", ".join(
        ["(?, TIMESTAMP ?, ?, ?)"] * 10_000)
    assert seen and max(seen) < 100
