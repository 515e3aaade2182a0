"""A table's columns change between GetFlightInfo and DoGet (ALTER TABLE, CREATE OR
REPLACE): DoGet streams the schema GetFlightInfo announced, reading the tables as they were
when it was planned, or is UNAVAILABLE (SchemaChanged) when those versions are gone. Other
commits in between are seen as usual. Real clients check the stream against the
announcement: ADBC fails an "inconsistent schema"."""

from __future__ import annotations

import threading

import adbc_driver_flightsql.dbapi as adbc_dbapi
import pyarrow as pa
import pytest
from _server_harness import desc, fetch, prepare, query, start, update
from pyarrow import flight

from flightsrv.server import proto


@pytest.fixture
def served(tmp_path):
    server, engine, wh, uri = start(tmp_path, with_auth=False)
    client = flight.connect(uri)
    update(client, "CREATE TABLE g (a INTEGER, b VARCHAR)")
    update(client, "INSERT INTO g VALUES (1, 'x'), (2, 'y')")
    yield client, uri
    client.close()
    server.shutdown()


def _redeem(client, info) -> pa.Table:
    return pa.concat_tables(client.do_get(ep.ticket).read_all() for ep in info.endpoints)


def test_doget_streams_the_announced_columns_as_planned(served):
    client, _ = served
    info = client.get_flight_info(query("SELECT * FROM g ORDER BY a"))
    update(client, "ALTER TABLE g RENAME COLUMN a TO renamed")
    update(client, "ALTER TABLE g ALTER COLUMN renamed TYPE BIGINT")
    update(client, "INSERT INTO g VALUES (3, 'z')")
    got = _redeem(client, info)
    assert got.schema.equals(info.schema, check_metadata=True)
    # the snapshot GetFlightInfo planned over: the row inserted after it is not there
    assert got.to_pylist() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    # planned again, the query answers with the new columns and rows
    _, now = fetch(client, query("SELECT * FROM g ORDER BY renamed"))
    assert now.column_names == ["renamed", "b"] and now.num_rows == 3


def test_a_prepared_query_with_parameters_keeps_its_announced_columns(served):
    client, _ = served
    handle = prepare(client, "SELECT * FROM g WHERE a >= ? ORDER BY a")
    cmd = desc(proto.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    params = pa.record_batch({"0": pa.array([2], pa.int64())})
    writer, reader = client.do_put(cmd, params.schema)
    writer.write_batch(params)
    writer.done_writing()
    reader.read()
    writer.close()
    info = client.get_flight_info(cmd)
    update(client, "ALTER TABLE g ADD COLUMN c DOUBLE DEFAULT 0.5")
    got = _redeem(client, info)
    assert got.schema.equals(info.schema, check_metadata=True)
    assert got.to_pylist() == [{"a": 2, "b": "y"}]


def test_other_commits_in_between_are_seen(served):
    client, _ = served
    info = client.get_flight_info(query("SELECT * FROM g ORDER BY a"))
    update(client, "DELETE FROM g WHERE a = 1")
    update(client, "INSERT INTO g VALUES (5, 'v')")
    got = _redeem(client, info)
    assert got.schema.equals(info.schema, check_metadata=True)
    assert got.to_pylist() == [{"a": 2, "b": "y"}, {"a": 5, "b": "v"}]


def test_columns_changed_and_planned_versions_gone_is_unavailable(served):
    client, _ = served
    info = client.get_flight_info(query("SELECT * FROM g"))
    update(client, "CREATE OR REPLACE TABLE g (k VARCHAR)")  # a new table: no way back
    with pytest.raises(flight.FlightUnavailableError,
                       match="changed its columns since GetFlightInfo.*GetFlightInfo again"):
        _redeem(client, info)
    info = client.get_flight_info(query("SELECT * FROM g"))
    assert _redeem(client, info).column_names == ["k"]


def test_adbc_reads_while_another_client_alters(served):
    """ADBC's SELECT (GetFlightInfo then DoGet) never fails on an ALTER TABLE that lands
    between the two; each answer is one consistent snapshot's."""
    client, uri = served
    stop = threading.Event()
    failures: list[BaseException] = []

    def alter():
        n = 0
        try:
            while not stop.is_set():
                update(client, f"ALTER TABLE g ADD COLUMN x{n} INTEGER DEFAULT {n}")
                update(client, f"ALTER TABLE g DROP COLUMN x{n}")
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    thread = threading.Thread(target=alter)
    thread.start()
    try:
        with adbc_dbapi.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            for _ in range(60):
                cur.execute("SELECT * FROM g ORDER BY a")
                table = cur.fetch_arrow_table()
                assert table.column("a").to_pylist() == [1, 2]
                assert table.column_names[:2] == ["a", "b"] and table.num_columns <= 3
    finally:
        stop.set()
        thread.join()
    assert not failures


def test_a_failure_over_new_rows_is_not_answered_from_the_described_versions(served):
    """Only a change of columns sends DoGet to the described versions: a run that fails
    over rows committed in between fails (a deleted row is not served again from before
    its DELETE, and the new row is not hidden)."""
    client, _ = served
    update(client, "CREATE TABLE fb (a INTEGER, b VARCHAR)")
    update(client, "INSERT INTO fb VALUES (1, '1'), (2, '2')")
    info = client.get_flight_info(query("SELECT a, CAST(b AS INTEGER) AS n FROM fb ORDER BY a"))
    update(client, "DELETE FROM fb WHERE a = 2")
    update(client, "INSERT INTO fb VALUES (3, 'oops')")
    with pytest.raises(pa.ArrowInvalid, match="oops"):
        _redeem(client, info)
    update(client, "DELETE FROM fb WHERE a = 3")
    assert _redeem(client, info).to_pylist() == [{"a": 1, "n": 1}]  # the head, as usual


def test_rows_deleted_along_with_a_change_of_columns_are_never_served(served):
    """Reading the described versions would show a row deleted since: DoGet refuses
    (SchemaChanged, UNAVAILABLE) instead, and GetFlightInfo again answers without it."""
    client, _ = served
    info = client.get_flight_info(query("SELECT * FROM g ORDER BY a"))
    update(client, "DELETE FROM g WHERE a = 2")
    update(client, "ALTER TABLE g ADD COLUMN extra INTEGER")
    with pytest.raises(flight.FlightUnavailableError, match="rows were deleted or updated"):
        _redeem(client, info)
    info = client.get_flight_info(query("SELECT * FROM g ORDER BY a"))
    assert _redeem(client, info).to_pylist() == [{"a": 1, "b": "x", "extra": None}]
