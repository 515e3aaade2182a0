"""``connection.run_to_arrow``: the engine's one-pass run of a statement gives what DuckDB's
public ``cur.sql(text).to_arrow_*`` gives (rows, schema, errors), with DuckDB's one-pass seam
and without it (an older DuckDB)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flightsrv.engine.connection import run_to_arrow

STATEMENTS = [
    "SELECT * FROM t ORDER BY a",
    "SELECT a, b FROM t WHERE a % 3 = 1 ORDER BY a",
    "FROM t SELECT count(*), sum(a), max(b)",
    "WITH x AS (SELECT a FROM t WHERE a < 4) SELECT * FROM x ORDER BY a",
    "VALUES (1, 'x'), (2, NULL)",
    "SELECT * FROM t WHERE false",
    "SELECT a::DECIMAL(18, 3) AS d, [a, a] AS l, {'k': b} AS s, "
    "TIMESTAMPTZ '2024-01-01 00:00:00+00' AS ts FROM t ORDER BY a LIMIT 3",
    "DESCRIBE t",
    "SELECT 1;",
]
ERRORS = [
    "SELECT * FROM no_such_table",
    "SELECT CAST(b || 'x' AS INTEGER) FROM t",
    "SELECT ?",
]


class _NoSeam:
    """A cursor of a DuckDB without the one-pass seam: only the public API."""

    def __init__(self, cur):
        self._cur = cur

    def sql(self, text, params=None):
        return self._cur.sql(text, params=params) if params else self._cur.sql(text)


@pytest.fixture()
def cur():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS a, 'v' || range AS b FROM range(10)")
    yield con.cursor()
    con.close()


@pytest.mark.parametrize("seam", [True, False])
@pytest.mark.parametrize("text", STATEMENTS)
def test_one_pass_results_equal_the_public_relation(cur, text, seam):
    runner = cur if seam else _NoSeam(cur)
    want = cur.sql(text).to_arrow_table()
    table = run_to_arrow(runner, text, batch_size=4, stream=False)
    reader = run_to_arrow(runner, text, batch_size=4, stream=True)
    assert isinstance(reader, pa.RecordBatchReader)
    streamed = reader.read_all()
    assert table.schema == want.schema and streamed.schema == want.schema
    assert table.to_pylist() == want.to_pylist() == streamed.to_pylist()


@pytest.mark.parametrize("seam", [True, False])
@pytest.mark.parametrize("text", ERRORS)
def test_one_pass_errors_are_duckdbs(cur, text, seam):
    runner = cur if seam else _NoSeam(cur)
    with pytest.raises(duckdb.Error) as public:
        cur.sql(text).to_arrow_table()
    for stream in (False, True):
        with pytest.raises(duckdb.Error) as ours:
            out = run_to_arrow(runner, text, batch_size=4, stream=stream)
            if stream:
                out.read_all()
        assert type(ours.value) is type(public.value)
        assert str(ours.value).splitlines()[0] == str(public.value).splitlines()[0]


#: statements with parameters ($1..$n, as the engine runs them) and their values
WITH_VALUES = [
    ("SELECT * FROM t WHERE a = $1", [3]),
    ("SELECT a * $1 AS m, b FROM t WHERE b <> $2 ORDER BY a", [2, "v4"]),
    ("SELECT $1::BIGINT * $1::BIGINT AS big", [3_000_000_000]),
]


@pytest.mark.parametrize("seam", [True, False])
@pytest.mark.parametrize("text,values", WITH_VALUES)
def test_one_pass_with_values_equals_the_public_relation(cur, text, values, seam):
    """The engine hands a query's parameter values to the one-pass seam itself (one bind),
    not through ``cur.sql(text, params=...)`` (which binds to describe, then again to run):
    the same rows, names and types."""
    runner = cur if seam else _NoSeam(cur)
    want = cur.sql(text, params=values).to_arrow_table()
    for stream in (False, True):
        out = run_to_arrow(runner, text, batch_size=4, stream=stream, values=values)
        got = out.read_all() if stream else out
        assert got.schema == want.schema
        assert got.to_pylist() == want.to_pylist()


def test_more_than_one_statement_is_refused_not_split(cur):
    if not hasattr(cur, "_submit"):
        pytest.skip("this DuckDB has no one-pass seam; cur.sql runs scripts")
    with pytest.raises(duckdb.Error, match="exactly one"):
        run_to_arrow(cur, "SELECT 1; SELECT 2", batch_size=4, stream=False)
