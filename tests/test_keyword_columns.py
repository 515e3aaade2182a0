"""Columns named like the value keywords (``current_user``, ``session_user``,
``current_catalog``, ``current_date``, ``localtime``, ...). sqlglot reads such a bare word as
a call; DuckDB reads it as the column where a column of that name is in scope, and as the
name itself where a statement names a column (a definition, ALTER, INSERT's list, UPDATE's
SET, RENAME). The same statements on flightsrv and on plain DuckDB give the same tables."""

from __future__ import annotations

import duckdb
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session

STATEMENTS = [
    "CREATE TABLE kw (CURRENT_USER VARCHAR, n INTEGER, current_date VARCHAR, "
    "Session_User VARCHAR, localtime INTEGER)",
    "INSERT INTO kw (current_user, n) VALUES ('a', 1)",
    "INSERT INTO kw (n, current_user, localtime) SELECT 2, 'b', 20",
    "UPDATE kw SET current_date = current_user || '-d', session_user = 's' WHERE n = 2",
    "UPDATE kw SET localtime = localtime + 1 WHERE current_user = 'b'",
    "MERGE INTO kw USING (SELECT 3 AS n) s ON kw.n = s.n "
    "WHEN NOT MATCHED THEN INSERT (n, current_user) VALUES (s.n, 'm')",
    "MERGE INTO kw USING (SELECT 3 AS n) s ON kw.n = s.n "
    "WHEN MATCHED THEN UPDATE SET current_user = 'mm', localtime = 3",
    "DELETE FROM kw WHERE current_user = 'a'",
    "ALTER TABLE kw RENAME COLUMN current_user TO cu",
    "ALTER TABLE kw RENAME COLUMN cu TO Current_User",
    "ALTER TABLE kw ALTER COLUMN localtime TYPE BIGINT",
    "ALTER TABLE kw DROP COLUMN session_user",
    "ALTER TABLE kw ADD COLUMN Current_Catalog VARCHAR",
    "UPDATE kw SET current_catalog = 'c' || n",
    "ALTER TABLE kw ADD COLUMN value INTEGER",
    "MERGE INTO kw USING (SELECT 7 AS n) s ON kw.n = s.n "
    "WHEN NOT MATCHED THEN INSERT (n, value, current_user) VALUES (s.n, 70, 'v')",
    # the keyword column is not the first: a DML's scan must read it (it read the first
    # column only, and DuckDB then bound the function: every row deleted)
    "UPDATE kw SET n = n + 10 WHERE current_user <> 'nobody'",
    "DELETE FROM kw WHERE localtime = 3",
    "DELETE FROM kw WHERE Current_User = 's'",
]
QUERIES = [
    "SELECT current_user FROM kw ORDER BY n",
    "SELECT n, current_user, current_date, localtime FROM kw ORDER BY n",
    "SELECT count(*) FROM kw WHERE current_user = 'mm'",
    "SELECT current_catalog, n FROM kw WHERE current_date IS NULL ORDER BY n",
    "SELECT *, current_user FROM kw ORDER BY n",
]


@pytest.fixture
def engine(warehouse_uri):
    e = DuckEngine(Warehouse.open(warehouse_uri))
    yield e, Session("s")
    e.close()


def test_keyword_named_columns_match_plain_duckdb(engine):
    e, s = engine
    plain = duckdb.connect()
    for sql in STATEMENTS:
        plain.execute(sql)
        e.execute_update(sql, s)
        want = plain.sql("SELECT * FROM kw ORDER BY n").to_arrow_table()
        got = e.execute_query("SELECT * FROM kw ORDER BY n", s).reader.read_all()
        assert got.column_names == want.column_names, sql
        assert got.to_pylist() == want.to_pylist(), sql
    for sql in QUERIES:
        want = plain.sql(sql).to_arrow_table()
        got = e.execute_query(sql, s).reader.read_all()
        assert (got.column_names, got.to_pylist()) == (want.column_names, want.to_pylist()), sql
