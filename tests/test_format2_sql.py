"""The SQL surface of format 2 (issue 15) over Flight SQL: ALTER TABLE (add with DEFAULT,
rename, drop, widen, SET PARTITIONED BY, UPGRADE) and CREATE TABLE ... PARTITIONED BY, by a
writer; a reader is refused; bad input is INVALID_ARGUMENT naming statement, table and
column."""

from __future__ import annotations

import pyarrow as pa
import pytest
from _server_harness import READER, WRITER, fetch, query, start, update
from pyarrow import flight


def test_alter_table_over_flight(tmp_path):
    server, engine, wh, uri = start(tmp_path)
    try:
        client = flight.connect(uri)
        old = wh.create_table("old", pa.schema([("a", pa.int64())]), format_version=1)
        old.append(pa.table({"a": [1, 2]}))
        for sql in (
                "CREATE TABLE ev (ts TIMESTAMP, user_id BIGINT, n INTEGER) "
                "PARTITIONED BY (day(ts), bucket(64, user_id))",
                "INSERT INTO ev VALUES (TIMESTAMP '2024-01-01 10:00', 7, 1)",
                "ALTER TABLE ev ADD COLUMN note VARCHAR DEFAULT 'none'",
                "ALTER TABLE ev RENAME COLUMN n TO amount",
                "ALTER TABLE ev ALTER COLUMN amount TYPE BIGINT",
                "ALTER TABLE ev SET PARTITIONED BY (month(ts), truncate(10, user_id))",
                "INSERT INTO ev VALUES (TIMESTAMP '2024-02-01 10:00', 8, 2, 'x')",
                "ALTER TABLE ev DROP COLUMN note",
                "ALTER TABLE old UPGRADE"):
            assert update(client, sql, WRITER) == 0 or sql.startswith("INSERT")
        _, got = fetch(client, query("SELECT * FROM ev ORDER BY user_id"), WRITER)
        assert got.column_names == ["ts", "user_id", "amount"]
        assert got.schema.field("amount").type == pa.int64()
        assert got.column("amount").to_pylist() == [1, 2]
        _, back = fetch(client, query("SELECT note FROM ev AT (VERSION => 2)"), WRITER)
        assert back.column("note").to_pylist() == ["none"]
        assert wh.table("ev").partitioning == "month(ts), truncate(10, user_id)"
        assert wh.table("old").head().format_version == 2
        assert wh.table("old").to_table().column("a").to_pylist() == [1, 2]

        version = wh.table("ev").head().version
        for sql in ("ALTER TABLE ev ADD COLUMN x INTEGER", "ALTER TABLE ev DROP COLUMN amount",
                    "ALTER TABLE ev UPGRADE", "CREATE TABLE p (a INT) PARTITIONED BY (a)"):
            with pytest.raises(flight.FlightUnauthorizedError, match="read-only"):
                update(client, sql, READER)
        assert wh.table("ev").head().version == version

        for sql, words in (
                ("ALTER TABLE ev DROP COLUMN nope", ["no such column", "column=nope",
                                                     "table=ev", "statement="]),
                ("ALTER TABLE ev ALTER COLUMN amount TYPE INTEGER", ["widening",
                                                                    "column=amount"]),
                ("ALTER TABLE ev ADD COLUMN user_id INT", ["already exists",
                                                         "column=user_id"]),
                ("ALTER TABLE ev ADD COLUMN z INT DEFAULT 'abc'", ["DEFAULT", "column=z"]),
                ("ALTER TABLE ev SET PARTITIONED BY (bucket(0, user_id))", ["positive"]),
                ("CREATE TABLE q (a INT) PARTITIONED BY (day(a))", ["transform", "a"]),
                ("ALTER TABLE ev ALTER COLUMN amount SET DEFAULT 1", ["TYPE"])):
            with pytest.raises(pa.ArrowInvalid) as e:  # gRPC INVALID_ARGUMENT
                update(client, sql, WRITER)
            msg = str(e.value)
            assert "INVALID_ARGUMENT" in msg
            for w in words:
                assert w in msg, (sql, msg)
        assert wh.table("ev").head().version == version
    finally:
        server.shutdown()
        engine.close()


def test_a_nested_default_is_refused_for_its_type_not_as_a_non_constant(tmp_path):
    """``DEFAULT [1, 2]`` / ``{'a': 1}`` / ``MAP {...}`` are constants (DuckDB takes them);
    the table format stores no nested default, which the error now says, naming the column."""
    from flightsrv import Warehouse
    from flightsrv.errors import ConfigurationError

    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.sql("CREATE TABLE t (id INTEGER)")
    for ddl, column in [("l INTEGER[] DEFAULT [1, 2]", "l"),
                        ("s STRUCT(a INTEGER) DEFAULT {'a': 1}", "s"),
                        ("m MAP(VARCHAR, INTEGER) DEFAULT MAP {'k': 1}", "m")]:
        with pytest.raises(ConfigurationError) as ei:
            wh.sql(f"ALTER TABLE t ADD COLUMN {ddl}")
        assert "simple type" in ei.value.message and ei.value.context["column"] == column
    with pytest.raises(ConfigurationError, match="needs a constant"):
        wh.sql("ALTER TABLE t ADD COLUMN x INTEGER DEFAULT id")
    wh.sql("ALTER TABLE t ADD COLUMN d DOUBLE DEFAULT -1.5")
    assert wh.table("t").schema.names == ["id", "d"]


def test_defaults_at_the_edges_of_their_types(tmp_path):
    """ALTER TABLE ADD COLUMN ... DEFAULT with a UBIGINT past int64 is stored from its own
    type (it was an INTERNAL OverflowError); an infinite or BC date or timestamp default is
    refused naming the column, and nothing is committed (session 29)."""
    from flightsrv import Warehouse
    from flightsrv.errors import SqlError

    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.sql("CREATE TABLE t (id INTEGER)")
    wh.sql("INSERT INTO t VALUES (1)")
    wh.sql("ALTER TABLE t ADD COLUMN u UBIGINT DEFAULT 18446744073709551615")
    wh.sql("ALTER TABLE t ADD COLUMN h UBIGINT DEFAULT 9223372036854775808")
    wh.sql("INSERT INTO t (id) VALUES (2)")
    assert wh.sql("SELECT id, u, h FROM t ORDER BY id").to_pylist() == [
        {"id": k, "u": 2 ** 64 - 1, "h": 2 ** 63} for k in (1, 2)]
    version = wh.table("t").head().version
    for ddl in ("d DATE DEFAULT 'infinity'", "ts TIMESTAMP DEFAULT '-infinity'",
                "b DATE DEFAULT DATE '0044-03-15 (BC)'"):
        with pytest.raises(SqlError, match="is not supported for column") as ei:
            wh.sql(f"ALTER TABLE t ADD COLUMN {ddl}")
        assert ei.value.context["column"] == ddl.split()[0]
    assert wh.table("t").head().version == version
    assert wh.table("t").schema.names == ["id", "u", "h"]
