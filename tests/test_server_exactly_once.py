"""Side effects happen exactly once, at the request that carries them (issue 12 item 1).

The product engine over a real local warehouse, counted (``_server_harness.Counting``) so a
second execution is visible even when its effect would be idempotent."""

import pyarrow as pa
import pytest
from _server_harness import (
    WRITER,
    adbc,
    desc,
    fetch,
    make_table,
    opts,
    prepare,
    query,
    start,
    update,
)
from pyarrow import flight

from flightsrv.server import proto

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")


@pytest.fixture
def served(tmp_path):
    server, engine, wh, uri = start(tmp_path)
    client = flight.connect(uri)
    yield server, engine, wh, client, uri
    client.close()
    server.shutdown()
    engine.close()


def _ops(wh, name):
    return [h["operation"] for h in wh.table(name).history()]


@pytest.mark.parametrize("sql, operation", [
    ("OPTIMIZE t", "compact"),
    ("DELETE FROM t WHERE id < 10", "delete"),
    ("PURGE t", "purge"),
    ("VACUUM t RETAIN 1 VERSIONS", None),
])
def test_get_flight_info_runs_it_once_without_any_fetch(served, sql, operation):
    """flightsql-dbapi's flow: GetFlightInfo(CommandStatementQuery). No DoGet at all."""
    _, engine, wh, client, _ = served
    make_table(wh, "t")
    wh.table("t").delete("id >= 3990")  # something for PURGE to erase
    before = len(_ops(wh, "t"))
    info = client.get_flight_info(query(sql), opts(WRITER))
    assert engine.executed[sql] == 1
    if operation is not None:
        assert _ops(wh, "t")[0] == operation
        assert len(_ops(wh, "t")) == before + 1
    if sql.startswith("DELETE"):
        assert info.total_records == 10
    # fetching later, twice, never runs it again
    ticket = info.endpoints[0].ticket
    first = client.do_get(ticket, opts(WRITER)).read_all()
    if sql.startswith(("OPTIMIZE", "PURGE", "VACUUM")):
        assert first.num_rows == info.total_records > 0
        assert set(first.column("table").to_pylist()) == {"t"}
        with pytest.raises(pa.ArrowKeyError, match="already fetched or expired"):
            client.do_get(ticket, opts(WRITER)).read_all()
    else:
        assert first.num_rows == 0
        assert client.do_get(ticket, opts(WRITER)).read_all().num_rows == 0
    assert engine.executed[sql] == 1
    if operation is not None:
        assert len(_ops(wh, "t")) == before + 1
    else:  # VACUUM ... RETAIN 1 VERSIONS: one version left
        assert len(_ops(wh, "t")) == 1


def test_adbc_execute_and_close_without_fetch_takes_effect_once(served):
    _, engine, wh, _, uri = served
    make_table(wh, "t")
    with adbc(uri, WRITER) as conn:
        cur = conn.cursor()
        cur.execute("OPTIMIZE t")
        cur.close()  # never fetched
        cur = conn.cursor()
        cur.execute("DELETE FROM t WHERE id = 5")
        assert cur.rowcount == 1
        cur.close()
    assert _ops(wh, "t")[:2] == ["delete", "compact"]
    assert engine.executed["OPTIMIZE t"] == 1
    assert engine.executed["DELETE FROM t WHERE id = 5"] == 1
    assert wh.table("t").count_rows() == 3999


def test_prepared_statement_runs_once_per_get_flight_info(served):
    """ADBC's flow: CreatePreparedStatement -> GetFlightInfo(prepared) -> DoGet -> Close.
    Each GetFlightInfo is one request carrying the statement: one execution each; the
    tickets never execute."""
    _, engine, wh, client, _ = served
    make_table(wh, "t")
    handle = prepare(client, "DELETE FROM t WHERE id < ?", WRITER)
    cmd = proto.CommandPreparedStatementQuery(prepared_statement_handle=handle)
    params = pa.record_batch({"0": pa.array([100], pa.int64())})
    writer, _ = client.do_put(desc(cmd), params.schema, opts(WRITER))
    writer.write_batch(params)
    writer.close()
    assert engine.executed["DELETE FROM t WHERE id < ?"] == 0  # binding runs nothing
    info = client.get_flight_info(desc(cmd), opts(WRITER))
    assert info.total_records == 100
    for _ in range(3):
        client.do_get(info.endpoints[0].ticket, opts(WRITER)).read_all()
    assert engine.executed["DELETE FROM t WHERE id < ?"] == 1
    assert _ops(wh, "t").count("delete") == 1


def test_get_schema_never_executes(served):
    _, engine, wh, client, _ = served
    make_table(wh, "t")
    for sql in ("DELETE FROM t", "OPTIMIZE t", "PURGE t", "DROP TABLE t",
                "INSERT INTO t VALUES (1, 'x')"):
        client.get_schema(query(sql), opts(WRITER))
        handle = prepare(client, sql, WRITER)
        client.get_schema(desc(proto.CommandPreparedStatementQuery(
            prepared_statement_handle=handle)), opts(WRITER))
    assert sum(engine.executed.values()) == 0
    assert wh.table("t").count_rows() == 4000
    assert _ops(wh, "t")[0] == "append"


def test_update_through_doput_and_select_streams_lazily(served):
    _, engine, wh, client, _ = served
    make_table(wh, "t")
    assert update(client, "DELETE FROM t WHERE id < 3", WRITER) == 3
    assert engine.executed["DELETE FROM t WHERE id < 3"] == 1
    info = client.get_flight_info(query("SELECT count(*) AS n FROM t"), opts(WRITER))
    # a pure SELECT runs once per result a DoGet delivers: GetFlightInfo may have started
    # it (an early run, docs/SERVER.md), which the first DoGet then delivers
    assert engine.executed["SELECT count(*) AS n FROM t"] <= 1
    for _ in range(2):  # a query ticket may be redeemed again: it is read-only
        table = client.do_get(info.endpoints[0].ticket, opts(WRITER)).read_all()
        assert table.to_pylist() == [{"n": 3997}]
    assert engine.executed["SELECT count(*) AS n FROM t"] == 2
    _, table = fetch(client, query("SELECT count(*) AS n FROM t"), WRITER)
    assert table.to_pylist() == [{"n": 3997}]


@pytest.mark.parametrize("sql, operation", [("OPTIMIZE t", "compact"), ("PURGE t", "purge")])
def test_maintenance_that_commits_past_the_deadline_reports_its_result(served, sql,
                                                                       operation):
    """A maintenance statement that committed after the session's deadline passed returns
    its report: the client was told "statement timed out" although the compaction or the
    purge had happened (and could not be taken back)."""
    import time

    _, engine, wh, client, _ = served
    make_table(wh, "t")
    wh.table("t").delete("id >= 3990")
    before = len(_ops(wh, "t"))
    inner = engine.engine.execute_query

    def slow(*args, **kwargs):  # the work commits, then takes longer than the deadline
        result = inner(*args, **kwargs)
        time.sleep(0.5)
        return result

    engine.engine.execute_query = slow
    try:
        update(client, "SET statement_timeout = '50ms'", WRITER)
        info, table = fetch(client, query(sql), WRITER)
    finally:
        engine.engine.execute_query = inner
    assert _ops(wh, "t")[0] == operation and len(_ops(wh, "t")) == before + 1
    assert table.num_rows == info.total_records > 0
    assert set(table.column("table").to_pylist()) == {"t"}
