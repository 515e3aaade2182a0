"""Early runs: a prepared query starts at its parameters' bind (DoPut), and its DoGet
delivers the result only if it read what a run started by that DoGet would read.

Real parts: the product engine over a local warehouse, the server in this process, and
raw ``pyarrow.flight`` or ADBC clients. A test wrapper around the engine signals when a run
has pinned its tables (its ``execute_query`` returned), so that a commit can be ordered
after it without sleeping.
"""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa
import pytest
from _server_harness import (
    WRITER,
    adbc,
    auth,
    desc,
    fetch,
    make_table,
    opts,
    prepare,
    query,
    update,
)
from pyarrow import flight

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.server import flight as server_flight
from flightsrv.server import proto
from flightsrv.server.app import start_in_thread
from flightsrv.server.config import ServerConfig


class Signalling:
    """The real engine; ``ran`` is set each time an ``execute_query`` has returned (the
    statement pinned its tables and DuckDB started), ``runs`` counts them."""

    def __init__(self, engine):
        self.engine = engine
        self.ran = threading.Event()
        self.runs = 0

    def execute_query(self, *args, **kwargs):
        result = self.engine.execute_query(*args, **kwargs)
        self.runs += 1
        self.ran.set()
        return result

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture
def served(tmp_path):
    servers = []

    def make(**config):
        wh = Warehouse.open(str(tmp_path / f"wh{len(servers)}"))
        make_table(wh, "t", batches=2, rows=500)
        engine = Signalling(DuckEngine(wh))
        server, port = start_in_thread(engine, auth=auth(), config=ServerConfig(**config))
        servers.append((server, engine))
        return server, engine, f"grpc://127.0.0.1:{port}"

    yield make
    for server, engine in servers:
        server.shutdown()
        engine.close()


def _count(server, outcome: str) -> float:
    return server.metrics.registry.get_sample_value(
        "flightsrv_early_runs_total", {"outcome": outcome}) or 0.0


def _bind(client, handle: bytes, value: int) -> None:
    cmd = desc(proto.CommandPreparedStatementQuery(prepared_statement_handle=handle))
    schema = pa.schema([("0", pa.int64())])
    writer, reader = client.do_put(cmd, schema, opts(WRITER))
    writer.write_table(pa.table({"0": pa.array([value], pa.int64())}))
    writer.done_writing()
    try:
        reader.read()
    except StopIteration:
        pass
    writer.close()


def _execute(client, handle: bytes) -> tuple[flight.FlightInfo, pa.Table]:
    return fetch(client, desc(proto.CommandPreparedStatementQuery(
        prepared_statement_handle=handle)), WRITER)


def _prepared(served, sql: str, **config):
    """(server, engine, client, handle): a fresh server and ``sql`` prepared on it."""
    server, engine, uri = served(**config)
    client = flight.connect(uri)
    return server, engine, client, prepare(client, sql, WRITER)


def _wait_until(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_adbc_prepared_queries_run_from_their_bind_and_answer_as_duckdb(served):
    server, engine, uri = served()
    records: list[logging.LogRecord] = []
    capture = logging.Handler()
    capture.emit = records.append
    server_log = logging.getLogger("flightsrv.server")
    level = server_log.level
    server_log.addHandler(capture)
    server_log.setLevel(logging.INFO)
    try:
        with adbc(uri, WRITER) as conn, conn.cursor() as cur:
            for i in [3, 999, 0, 512, 1000, -1, 77, 3]:
                cur.execute("SELECT id, v FROM t WHERE id = ? ORDER BY id", (i,))
                rows = cur.fetchall()
                assert rows == ([(i, f"v{i}")] if 0 <= i < 1000 else [])
    finally:
        server_log.removeHandler(capture)
        server_log.setLevel(level)
    assert _count(server, "claimed") == _count(server, "started") == 8
    assert _count(server, "stale") == _count(server, "dropped") == 0
    # one log line per statement, written when its DoGet delivered it
    lines = [r.fields for r in records if getattr(r, "fields", {}).get("event") == "statement"]
    assert [(f["rpc"], f["status"], f["rows"]) for f in lines] == \
        [("DoGet", "OK", 1)] * 4 + [("DoGet", "OK", 0)] * 2 + [("DoGet", "OK", 1)] * 2


def test_a_commit_after_the_bind_is_seen_by_the_fetch(served):
    """The run started at the bind read the version before the DELETE: the DoGet finds
    the table moved on, discards that run and runs the statement itself."""
    server, engine, client, handle = _prepared(served, "SELECT id, v FROM t WHERE id = ?")
    for commit_after in ("bind", "ticket"):
        victim = 10 if commit_after == "bind" else 11
        engine.ran.clear()
        _bind(client, handle, victim)
        engine.ran.wait(20)  # the early run has pinned the version holding the row
        if commit_after == "bind":
            update(client, f"DELETE FROM t WHERE id = {victim}", WRITER)
            info, table = _execute(client, handle)
        else:
            info = client.get_flight_info(desc(proto.CommandPreparedStatementQuery(
                prepared_statement_handle=handle)), opts(WRITER))
            update(client, f"DELETE FROM t WHERE id = {victim}", WRITER)
            table = client.do_get(info.endpoints[0].ticket, opts(WRITER)).read_all()
        assert table.num_rows == 0, commit_after
    assert _count(server, "stale") == 2
    assert _count(server, "claimed") == 0
    # a discarded run is no statement of the client's: each statement counted once, OK
    statements = server.metrics.registry.get_sample_value
    assert statements("flightsrv_statements_total", {"kind": "select", "status": "OK"}) == 2
    assert not statements("flightsrv_statements_total",
                          {"kind": "select", "status": "CANCELLED"})
    _bind(client, handle, 12)  # unchanged tables: the early run answers
    _, table = _execute(client, handle)
    assert table.to_pylist() == [{"id": 12, "v": "v12"}]
    assert _count(server, "claimed") == 1


def test_a_new_bind_replaces_the_run_of_the_last(served):
    server, _, client, handle = _prepared(served, "SELECT id FROM t WHERE id = ?")
    _bind(client, handle, 1)
    _bind(client, handle, 2)
    _, table = _execute(client, handle)
    assert table.column("id").to_pylist() == [2]
    assert _count(server, "dropped") == 1
    assert _count(server, "claimed") == 1


def test_cancel_flight_info_cancels_the_early_run(served):
    server, _, client, handle = _prepared(served, "SELECT id FROM t WHERE id = ?")
    _bind(client, handle, 5)
    info = client.get_flight_info(desc(proto.CommandPreparedStatementQuery(
        prepared_statement_handle=handle)), opts(WRITER))
    req = proto.CancelFlightInfoRequest(info=info.serialize())
    list(client.do_action(flight.Action("CancelFlightInfo", req.SerializeToString()),
                          opts(WRITER)))
    with pytest.raises(flight.FlightCancelledError):
        client.do_get(info.endpoints[0].ticket, opts(WRITER)).read_all()
    assert _count(server, "dropped") == 1
    _, table = fetch(client, query("SELECT count(*) AS n FROM t"), WRITER)
    assert table.column("n").to_pylist() == [1000]  # the slot came back


def test_a_bind_never_fetched_gives_its_slot_back(served, monkeypatch):
    """With one slot per principal: a small result read whole holds no slot while it waits
    for its DoGet; a large one holds it until the claim deadline drops it, then a waiting
    statement of the same principal runs."""
    monkeypatch.setattr(server_flight, "EARLY_CLAIM_S", 0.5)
    server, engine, uri = served(max_concurrent_queries=1)
    client = flight.connect(uri)
    small = prepare(client, "SELECT id FROM t WHERE id = ?", WRITER)
    _bind(client, small, 5)
    _wait_until(lambda: _count(server, "started") == 1 and server.statements_running() == 0)
    _, table = fetch(client, query("SELECT count(*) AS n FROM t"), WRITER)
    assert table.column("n").to_pylist() == [1000]
    # unclaimed, it still counts against the principal's early runs (its batches are
    # held) until its claim deadline drops it
    _wait_until(lambda: _count(server, "dropped") == 1)

    large = prepare(client, "SELECT range AS i FROM range(?)", WRITER)
    started = _count(server, "started")
    _bind(client, large, 3_000_000)  # more than EAGER_RESULT_BYTES: it keeps streaming
    _wait_until(lambda: _count(server, "started") == started + 1 and
                server.statements_running() == 1)
    _, table = fetch(client, query("SELECT max(id) AS m FROM t"), WRITER)  # waits its turn
    assert table.column("m").to_pylist() == [999]
    assert _count(server, "dropped") == 2
    claimed = _count(server, "claimed")
    _bind(client, large, 2_000_000)  # and a large one claimed in time streams whole
    _, table = _execute(client, large)
    assert table.num_rows == 2_000_000
    assert _count(server, "claimed") == claimed + 1


def test_a_query_without_parameters_starts_at_get_flight_info(served):
    """A plain statement query (JDBC's Statement, ADBC without parameters) starts when
    GetFlightInfo answers; a DELETE acknowledged before its DoGet is still seen."""
    server, engine, uri = served()
    client = flight.connect(uri)
    _, table = fetch(client, query("SELECT v FROM t WHERE id = 20"), WRITER)
    assert table.to_pylist() == [{"v": "v20"}]
    assert _count(server, "claimed") == _count(server, "started") == 1
    engine.ran.clear()
    info = client.get_flight_info(query("SELECT v FROM t WHERE id = 21"), opts(WRITER))
    engine.ran.wait(20)
    update(client, "DELETE FROM t WHERE id = 21", WRITER)
    table = client.do_get(info.endpoints[0].ticket, opts(WRITER)).read_all()
    assert table.num_rows == 0
    assert _count(server, "stale") == 1


def test_no_early_runs_when_turned_off(served):
    server, engine, uri = served(early_runs=False)
    with adbc(uri, WRITER) as conn, conn.cursor() as cur:
        for i in range(3):
            cur.execute("SELECT v FROM t WHERE id = ?", (i,))
            assert cur.fetchall() == [(f"v{i}",)]
    assert _count(server, "started") == 0


def test_reads_racing_deletes_see_every_delete_acknowledged_before_them(served):
    """ADBC range reads (run early) while another connection deletes ranges: each answer
    equals the table after a prefix of the deletes that holds every delete acknowledged
    before the read's execute began and none begun after it returned (one snapshot, never
    a deleted row back, whether the run was delivered or discarded as stale)."""
    import random

    server, engine, uri = served()  # t: ids 0..999, v = "v<id>"
    deletes: list[list] = []  # [lo, hi, started, acknowledged]
    stop = threading.Event()
    failures: list[BaseException] = []

    def deleter():
        rng = random.Random(11)
        try:
            with adbc(uri, WRITER) as conn, conn.cursor() as cur:
                while not stop.is_set():
                    lo = rng.randrange(1000)
                    rec = [lo, lo + rng.randrange(1, 6), time.monotonic(), None]
                    deletes.append(rec)
                    cur.execute(f"DELETE FROM t WHERE id BETWEEN {rec[0]} AND {rec[1]}")
                    rec[3] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    thread = threading.Thread(target=deleter)
    thread.start()
    rng = random.Random(12)
    try:
        with adbc(uri, WRITER) as conn, conn.cursor() as cur:
            for _ in range(150):
                lo = rng.randrange(1000)
                hi = lo + rng.randrange(0, 60)
                began = time.monotonic()
                cur.execute("SELECT count(*) FROM t WHERE id BETWEEN ? AND ?", (lo, hi))
                (got,) = cur.fetchall()[0]
                ended = time.monotonic()
                done = list(deletes)
                must = sum(1 for d in done if d[3] is not None and d[3] < began)
                may = [d for d in done if d[2] < ended]
                answers = set()
                for k in range(must, len(may) + 1):
                    dead = {i for d in may[:k] for i in range(d[0], d[1] + 1)}
                    answers.add(sum(1 for i in range(lo, min(hi, 999) + 1) if i not in dead))
                assert got in answers, (lo, hi, got, must, len(may))
    finally:
        stop.set()
        thread.join()
    assert not failures
    assert len(deletes) > 5
    assert _count(server, "started") >= 100  # the reads did run early (one client)
