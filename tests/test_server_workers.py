"""``flightsrv serve --workers 2``: worker/front pairs sharing one port (server/workers.py,
server/front.py), driven by real clients (ADBC, pyarrow.flight), each its own connection.

One server for the module (starting 2 workers and 2 fronts takes seconds on 2 cores)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor

import adbc_driver_manager
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

from flightsrv.server import proto
from flightsrv.server.auth import hash_password

from test_serve_cli import TOKEN_HEADER, _self_signed, free_port, query

CONNECTIONS = 12  # all on one worker: 2 * 2**-12 (the kernel hashes each connection)


class Workers:
    """A ``serve --workers 2 --port 0`` parent, its stderr collected; ``port`` is read from
    its "serving" line (front 0 resolves port 0, the other fronts share it)."""

    def __init__(self, warehouse: str, *args: str):
        cmd = [sys.executable, "-m", "flightsrv.cli", "--warehouse", warehouse, "serve",
               "--port", "0", "--workers", "2", "--no-demo", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.events: list[dict] = []
        started = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                if line.startswith("flightsrv: serving"):
                    self.port = int(re.search(r"://[^ ]+:(\d+) ", line).group(1))
                    started.set()
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    pass
            started.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not started.wait(120) or self.proc.poll() is not None:
            self.kill()
            raise AssertionError("server did not start:\n" + "".join(self.lines))

    @property
    def uri(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def worker_pids(self, role: str = "worker") -> dict[int, int]:
        """index -> pid of the newest start of each worker (or front)."""
        return {e["index"]: e["pid"] for e in list(self.events)
                if e.get("event") == f"{role}_started"}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def served_by(server: Workers, since: int, want: set[int], wait: float = 10.0) -> set[int]:
    """The workers whose log (every worker line carries ``"worker": index``) shows a
    statement after event ``since``; waits up to ``wait`` s for ``want`` (lines are written
    when a statement finishes, and read here by the drain thread)."""
    deadline = time.monotonic() + wait
    while True:
        seen = {e.get("worker") for e in list(server.events)[since:]
                if e.get("event") == "statement"}
        if seen >= want or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def _flight_client(server: Workers, user: str = "alice"):
    """A pyarrow.flight connection of ``user``'s (a new TCP connection) and its options."""
    c = flight.connect(server.uri)
    return c, flight.FlightCallOptions(headers=[c.authenticate_basic_token(
        user, f"{user}-pw")])


def _home_and_away(server: Workers, n: int = 4):
    """``n`` connections of alice's, and one at worker 0 (home) and one at worker 1 (away):
    each runs a statement, whose log line names its worker."""
    from _server_harness import desc

    clients = [_flight_client(server) for _ in range(n)]
    since = len(server.events)
    for c, o in clients:
        info = c.get_flight_info(desc(proto.CommandStatementQuery(query="SELECT 1")), o)
        c.do_get(info.endpoints[0].ticket, o).read_all()
    assert served_by(server, since, {0, 1}) == {0, 1}
    at = [e["worker"] for e in list(server.events)[since:]
          if e.get("event") == "statement"][:n]
    return clients, clients[at.index(0)], clients[at.index(1)]


def connect(uri, **db_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(uri, db_kwargs=db_kwargs or None)


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    path = tmp_path_factory.mktemp("users") / "users"
    path.write_text(f"alice:{hash_password('alice-pw', iterations=1000)}:writer\n"
                    f"bob:{hash_password('bob-pw', iterations=1000)}:reader\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, users):
    metrics_port = free_port()
    srv = Workers(str(tmp_path_factory.mktemp("wh") / "wh"), "--users-file", str(users),
                  "--metrics-port", str(metrics_port))
    srv.metrics_port = metrics_port
    try:
        with connect(srv.uri, username="alice", password="alice-pw") as c, c.cursor() as cur:
            cur.execute("CREATE TABLE t AS SELECT range AS id, range * 2 AS v FROM range(1000)")
        yield srv
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=60) == 0  # every child drained and stopped
        srv._drain.join(10)
        # one server's stop and stopped lines, the parent's; each worker's are worker_*
        ends = [e for e in srv.events if e.get("event") in ("stop", "stopped")]
        assert [e["event"] for e in ends] == ["stop", "stopped"]
        assert ends[1]["drained"] is True and "worker" not in ends[1]
        assert sorted(e["worker"] for e in srv.events
                      if e.get("event") == "worker_stopped") == [0, 1]
    finally:
        srv.kill()


def _client_work(uri: str, i: int) -> tuple[int, int, int]:
    """One connection: a query, one prepared statement run 20 times with parameters, an
    ingest (DoPut), a DELETE. Returns (sum of the prepared results, ingested rows, deleted)."""
    with connect(uri, username="alice", password="alice-pw") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM t")
        assert cur.fetchall()[0][0] >= 1000 - CONNECTIONS
        total = 0
        for k in range(20):  # same text: ADBC keeps one prepared handle on this connection
            cur.execute("SELECT v FROM t WHERE id = ?", parameters=(100 + k,))
            total += cur.fetchall()[0][0]
        data = pa.table({"x": pa.array(range(i + 1), pa.int64())})
        ingested = cur.adbc_ingest(f"ing_{i}", data, mode="create")
        cur.execute(f"DELETE FROM t WHERE id = {500 + i}")
        return total, ingested, cur.rowcount


def test_connections_spread_over_workers_and_agree(server):
    pids = server.worker_pids()
    assert sorted(pids) == [0, 1]
    # each worker's line names its socket and the port its clients reach; the server's
    # one start line (the parent's, once all serve) names the port as one process does
    starts = [e for e in list(server.events) if e.get("event") == "worker_start"]
    assert {e["worker"] for e in starts} >= {0, 1}
    assert all(e["port"] == server.port and e["socket"].endswith(".sock") for e in starts)
    (start,) = [e for e in list(server.events) if e.get("event") == "start"]
    assert "worker" not in start and start["port"] == server.port and start["workers"] == 2
    assert start["pid"] == server.proc.pid and start["tls"] is False
    since = len(server.events)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: _client_work(server.uri, i), range(CONNECTIONS)))
    want = sum(2 * (100 + k) for k in range(20))
    assert results == [(want, i + 1, 1) for i in range(CONNECTIONS)]
    # every worker sees every other's commits (the same warehouse)
    for _ in range(4):
        with connect(server.uri, username="alice", password="alice-pw") as c, c.cursor() as cur:
            cur.execute("SELECT count(*), sum(v) FROM t")
            assert cur.fetchall() == [(1000 - CONNECTIONS, sum(2 * r for r in range(1000))
                                       - sum(2 * (500 + i) for i in range(CONNECTIONS)))]
            cur.execute(f"SELECT count(*) FROM ing_{CONNECTIONS - 1}")
            assert cur.fetchall() == [(CONNECTIONS,)]
    # both workers served (the kernel spread the connections over the two fronts)
    assert served_by(server, since, {0, 1}) == {0, 1}


def test_a_login_token_verifies_on_every_worker(server):
    """Handshake's bearer token comes back through the front (initial metadata) and is
    accepted by whichever worker a later connection reaches (one shared HMAC key)."""
    header = flight.connect(server.uri).authenticate_basic_token("alice", "alice-pw")
    opts = flight.FlightCallOptions(headers=[header])
    for _ in range(CONNECTIONS):
        client = flight.connect(server.uri)
        info = client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
            proto.CommandStatementQuery(query="SELECT count(*) AS n FROM t"))), opts)
        assert client.do_get(info.endpoints[0].ticket, opts).read_all().num_rows == 1
        client.close()


def test_cancel_and_deadline_pass_through_the_front(server):
    header = flight.connect(server.uri).authenticate_basic_token("alice", "alice-pw")
    opts = flight.FlightCallOptions(headers=[header])
    client = flight.connect(server.uri)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
        proto.CommandStatementQuery(query="SELECT range AS i FROM range(5000000)"))), opts)
    reader = client.do_get(info.endpoints[0].ticket, opts)
    rows = reader.read_chunk().data.num_rows
    req = proto.CancelFlightInfoRequest(info=info.serialize())
    action = flight.Action("CancelFlightInfo", req.SerializeToString())
    (raw,) = list(client.do_action(action, opts))
    assert proto.parse(proto.CancelFlightInfoResult, raw.body.to_pybytes()).status \
        == proto.CancelStatus.CANCELLED
    with pytest.raises(flight.FlightCancelledError, match="cancelled"):
        while True:
            rows += reader.read_chunk().data.num_rows
    assert rows < 5_000_000
    # the caller's deadline reaches the worker: a slow stream ends at it
    info = client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
        proto.CommandStatementQuery(
            query="SELECT count(*) FROM range(100000000000) WHERE range % 7 = 3"))), opts)
    slow = flight.FlightCallOptions(headers=[header], timeout=1.0)
    started = time.monotonic()
    with pytest.raises(flight.FlightTimedOutError):
        reader = client.do_get(info.endpoints[0].ticket, slow)
        while True:
            reader.read_chunk()
    assert time.monotonic() - started < 15
    # the other FlightService methods pass through as well
    kinds = {a.type for a in client.list_actions(opts)}
    assert {"CreatePreparedStatement", "CancelFlightInfo", "CloseSession"} <= kinds
    # an error's status and message come back as the worker said them
    with pytest.raises(pa.ArrowKeyError, match="TableNotFound: no such table"):
        client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
            proto.CommandStatementQuery(query="SELECT * FROM no_such_table"))), opts)
    client.close()


def _requests_total(metrics_port: int) -> tuple[float, float]:
    """(the server's summed flightsrv_requests_total, workers reporting)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    return (sum(x.value for x in fams["flightsrv_requests"].samples
                if x.name == "flightsrv_requests_total"),
            fams["flightsrv_workers_reporting"].samples[0].value)


def test_a_killed_worker_is_restarted_and_new_connections_work(server):
    # worker 1 has served something: its counters are part of the server's sums
    since = len(server.events)
    deadline = time.monotonic() + 60
    while 1 not in served_by(server, since, {1}, wait=0):
        assert time.monotonic() < deadline, "no connection reached worker 1"
        with connect(server.uri, username="alice", password="alice-pw") as c, \
                c.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchall()
        time.sleep(0.05)  # its statement line reaches the log
    before, reporting = _requests_total(server.metrics_port)
    assert reporting == 2
    old = server.worker_pids()[1]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while server.worker_pids()[1] == old:
        assert time.monotonic() < deadline, "worker 1 was not restarted"
        time.sleep(0.2)
    new = server.worker_pids()[1]
    while not any(e.get("event") == "worker_start" and e.get("pid") == new
                  for e in list(server.events)):
        assert time.monotonic() < deadline, "restarted worker did not serve"
        time.sleep(0.2)
    time.sleep(1.5)  # the front's reconnect back-off is at most 1 s (server/front.py)
    # the summed counters did not go down: the dead worker's totals are carried
    while True:
        after, reporting = _requests_total(server.metrics_port)
        assert after >= before
        if reporting == 2:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # a killed front is started again on the public port (front 0 was started on --port 0)
    old_front = server.worker_pids("front")[0]
    os.kill(old_front, signal.SIGKILL)
    while server.worker_pids("front")[0] == old_front:
        assert time.monotonic() < deadline + 60, "front 0 was not restarted"
        time.sleep(0.2)
    time.sleep(0.5)
    since = len(server.events)
    counts = set()
    for _ in range(CONNECTIONS):
        with connect(server.uri, username="alice", password="alice-pw") as c, c.cursor() as cur:
            cur.execute("SELECT count(*) FROM t")
            counts.add(cur.fetchall()[0][0])
    assert len(counts) == 1
    assert served_by(server, since, {0, 1}) == {0, 1}  # both fronts serve


def test_a_session_belongs_to_its_connection_not_to_its_front(server):
    """Behind a front every call reaches the worker on the front's one channel; the worker
    keys sessions by the client's own connection (x-flightsrv-peer), so one connection's
    SET does not leak into another's of the same principal on the same front."""
    slow = "SELECT count(*) FROM range(3000000000) WHERE range % 7 = 3"
    conns = [connect(server.uri, username="alice", password="alice-pw") for _ in range(5)]
    try:
        curs = [c.cursor() for c in conns]
        for cur in curs:  # every connection open (and so on its front) before the SET
            cur.execute("SELECT 1")
            cur.fetchall()
        curs[0].execute("SET statement_timeout = '1'")
        with pytest.raises(Exception, match="timed out|timeout"):
            curs[0].execute(slow)
            curs[0].fetchall()
        # of 5 connections on 2 fronts, at least one shares connection 0's front
        for cur in curs[1:]:
            cur.execute("SELECT count(*) FROM range(20000000) WHERE range % 7 = 3")
            assert cur.fetchall() == [(2857143,)]
    finally:
        for c in conns:
            c.close()


def test_tls_ends_at_the_fronts_and_roles_hold(tmp_path):
    """--tls-cert with --workers 2: the fronts speak TLS, the workers check tokens/roles."""
    cert, key = _self_signed(tmp_path)
    srv = Workers(str(tmp_path / "wh"), "--auth-token", "w-secret:writer",
                  "--auth-token", "r-secret:reader", "--tls-cert", str(cert),
                  "--tls-key", str(key))
    try:
        uri = f"grpc+tls://localhost:{srv.port}"
        tls = {"adbc.flight.sql.client_option.tls_root_certs": cert.read_text()}
        writer = {TOKEN_HEADER: "Bearer w-secret", **tls}
        reader = {TOKEN_HEADER: "Bearer r-secret", **tls}
        query(uri, "CREATE TABLE t AS SELECT range AS id FROM range(100)", **writer)
        for _ in range(4):
            assert query(uri, "SELECT count(*) FROM t", **reader) == [(100,)]
        with pytest.raises(adbc_driver_manager.Error, match="UNAUTHORIZED"):
            query(uri, "DELETE FROM t", **reader)
        with pytest.raises(adbc_driver_manager.Error, match="UNAUTHENTICATED"):
            query(uri, "SELECT 1", **{TOKEN_HEADER: "Bearer nope"}, **tls)
        with pytest.raises(adbc_driver_manager.Error):  # plaintext to a TLS port
            query(f"grpc://127.0.0.1:{srv.port}", "SELECT 1", **{TOKEN_HEADER: "Bearer w-secret"})
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.kill()


def test_worker_command_lines_split_the_machine():
    from flightsrv.server.workers import worker_argv

    first = worker_argv(["serve", "--metrics-port", "9000"], 2, 0, "/s/w0.sock", 31337, "50%")
    # each worker's DuckDB keeps every core (--threads as given, or the CPU count): one
    # statement alone on the server runs as fast as on one process; memory is split
    assert first[-10:] == ["--workers", "1", "--worker-socket", "/s/w0.sock",
                           "--public-port", "31337", "--worker-index", "0",
                           "--memory-limit", "25%"]
    assert "--threads" not in first
    other = worker_argv(["serve", "--threads", "3"], 2, 1, "/s/w1.sock", 31337, "4GiB")
    assert other.count("--threads") == 1 and "--memory-limit" not in other  # kept as given
    # worker 0 alone seeds the demo and runs the background maintenance; every worker keeps
    # the metrics option (worker 0 serves the port, the others a private socket)
    assert other[-2:] == ["--no-demo", "--no-auto-maintenance"]
    assert "--no-metrics" not in other


def test_the_metrics_port_answers_for_every_worker(server):
    """Worker 0 serves --metrics-port; /metrics is one server's (every worker's samples
    summed, read from the others' private sockets), ``?by=worker`` each worker's labelled
    ``worker``; /readyz is ready when all are."""
    base = f"http://127.0.0.1:{server.metrics_port}"
    with urllib.request.urlopen(f"{base}/healthz") as r:
        assert r.status == 200
    with urllib.request.urlopen(f"{base}/readyz") as r:
        assert r.status == 200
    since = len(server.events)
    deadline = time.monotonic() + 60
    while served_by(server, since, {0, 1}, wait=0) != {0, 1}:  # new connections spread
        assert time.monotonic() < deadline
        with connect(server.uri, username="alice", password="alice-pw") as c, \
                c.cursor() as cur:
            cur.execute("SELECT count(*) FROM t")
            cur.fetchall()
        time.sleep(0.05)
    from prometheus_client.parser import text_string_to_metric_families

    def scrape(query: str = "") -> tuple[str, dict]:
        with urllib.request.urlopen(f"{base}/metrics{query}") as r:
            text = r.read().decode()
        return text, {f.name: f for f in text_string_to_metric_families(text)}

    def selects(families) -> dict:
        return {s.labels.get("worker"): s.value for s in families["flightsrv_statements"].samples
                if s.name == "flightsrv_statements_total" and s.labels.get("kind") == "select"
                and s.labels.get("status") == "OK"}

    # ?by=worker: each worker's own samples, labelled
    text, families = scrape("?by=worker")
    per_worker = selects(families)
    assert set(per_worker) == {"0", "1"} and all(v >= 1 for v in per_worker.values())
    assert families["flightsrv_workers_reporting"].samples[0].value == 2
    # one HELP/TYPE per metric, however many workers report it
    assert text.count("# TYPE flightsrv_requests_total ") == 1
    # the default: one server's samples, the workers' summed, no worker label
    text, families = scrape()
    (total,) = selects(families).values()
    # nothing ran between the two scrapes; the sum also carries what a worker killed by an
    # earlier test had counted (its restart begins again at zero)
    assert total >= sum(per_worker.values())
    assert 'worker="' not in text
    assert text.count("# TYPE flightsrv_requests_total ") == 1
    assert families["flightsrv_workers_reporting"].samples[0].value == 2


def test_a_front_drops_a_callers_own_peer_header():
    """Only the front names the connection: a client cannot pick another's session."""
    from flightsrv.server.front import PEER_HEADER, forwardable

    sent = [(":authority", "x"), ("authorization", "Bearer t"), (PEER_HEADER, "ipv4:1.2.3.4:5"),
            ("grpc-timeout", "1S"), ("x-custom-bin", b"\x00")]
    assert forwardable(sent) == [("authorization", "Bearer t"), ("x-custom-bin", b"\x00")]


def test_relayed_calls_are_logged_with_the_clients_address_and_no_header_names_it(server):
    """Without TLS the connections are relayed as bytes (server/relay.py): the worker names
    a call's connection by the relayed socket's own name, the client's TCP address; a
    client that sends x-flightsrv-peer itself names nothing (no session to pick)."""
    from flightsrv.server.front import PEER_HEADER

    client = flight.connect(server.uri)
    try:
        token = client.authenticate_basic_token("alice", "alice-pw")
        options = flight.FlightCallOptions(headers=[token, (PEER_HEADER.encode(),
                                                            b"ipv4:9.9.9.9:9")])
        since = len(server.events)
        info = client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
            proto.CommandStatementQuery(query="SELECT 41 + 1 AS x"))), options)
        assert client.do_get(info.endpoints[0].ticket, options).read_all() \
            .column(0).to_pylist() == [42]
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while True:
        peers = {e.get("peer") for e in list(server.events)[since:]
                 if e.get("event") == "rpc" and e.get("method") == "DoGet"}
        if peers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(peers) == 1
    (peer,) = peers
    assert re.fullmatch(r"ipv4:127\.0\.0\.1:\d+", peer), peer


def _in_flight(metrics_port: int) -> tuple[float, float, set[str]]:
    """(statements in flight, statements queued, workers reporting) summed over the workers
    from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
        text = r.read().decode()
    running = queued = 0.0
    seen = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "flightsrv_queries_in_flight":
                running += s.value
                seen.add(s.labels.get("worker"))
            elif s.name == "flightsrv_queries_queued":
                queued += s.value
    return running, queued, seen


def test_a_principals_limit_holds_for_the_whole_server_not_per_worker(tmp_path):
    """``--max-concurrent-queries 2`` with two workers: a principal's statements on
    connections spread over both workers run two at a time in all (the parent's slot
    broker), the others wait in its queue and all succeed; one whose deadline passes while
    waiting gets the error naming the limit, on whichever worker it is."""
    metrics_port = free_port()
    srv = Workers(str(tmp_path / "wh"), "--max-concurrent-queries", "2",
                  "--metrics-port", str(metrics_port))
    sql = "SELECT count(*) AS n FROM range(40000000) WHERE range % 7 = 3"
    try:
        since = len(srv.events)
        conns = [connect(srv.uri) for _ in range(CONNECTIONS)]
        samples: list[tuple[float, float]] = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                running, queued, _ = _in_flight(metrics_port)
                samples.append((running, queued))
                time.sleep(0.02)

        def run(conn):
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()[0][0]

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            with ThreadPoolExecutor(CONNECTIONS) as pool:
                counts = list(pool.map(run, conns))
        finally:
            stop.set()
            watcher.join(10)
        assert counts == [40000000 // 7 + (1 if 40000000 % 7 > 3 else 0)] * CONNECTIONS
        assert served_by(srv, since, {0, 1}) == {0, 1}  # both workers ran some
        # a scrape reads the workers one after another, so a slot that moves from one to
        # the other between the two reads is counted twice in that one sample; a third
        # statement really running lasts a statement (~0.1 s): several samples in a row
        over = [a[0] > 2 and b[0] > 2 for a, b in zip(samples, samples[1:])]
        assert samples and not any(over), samples
        assert max(q for _, q in samples) >= 1  # some waited for a slot of the other worker
        # a statement that cannot get a slot within its deadline names the limit, on
        # either worker: two streams held open mid-way hold both slots meanwhile (raw
        # pyarrow.flight clients: ADBC's fetch keeps the interpreter lock while it waits)
        since = len(srv.events)
        late = conns[2:]
        for conn in late:  # before the slots fill up: SET is a statement too
            with conn.cursor() as cur:
                cur.execute("SET statement_timeout = '200ms'")
        holders = []
        for _ in range(2):
            client = flight.connect(srv.uri)
            info = client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
                proto.CommandStatementQuery(query="SELECT range AS i FROM range(10000000)"))))
            reader = client.do_get(info.endpoints[0].ticket)
            reader.read_chunk()
            holders.append((client, reader))
        assert _in_flight(metrics_port)[0] == 2
        for conn in late:
            with conn.cursor() as cur:
                with pytest.raises(adbc_driver_manager.Error,
                                   match="limit=max_concurrent_queries value=2"):
                    cur.execute("SELECT 1")
                    cur.fetchall()
        for client, reader in holders:
            reader.cancel()
            client.close()
        refused_on = {e.get("worker") for e in list(srv.events)[since:]
                      if "max_concurrent_queries" in str(e.get("error", ""))}
        assert refused_on == {0, 1}
        for conn in conns:
            conn.close()
    finally:
        srv.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_children_end_with_a_killed_parent_and_free_the_port(tmp_path):
    """A parent killed outright (SIGKILL: the OOM killer, ``kill -9``) cannot stop its
    children; they notice (PR_SET_PDEATHSIG), drain and exit, and the port is free for the
    next server."""
    import socket

    srv = Workers(str(tmp_path / "wh"), "--drain-timeout", "2")
    try:
        children = [*srv.worker_pids().values(), *srv.worker_pids("front").values()]
        assert len(children) == 4 and all(_alive(p) for p in children)
        with connect(srv.uri) as c, c.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchall() == [(1,)]
        srv.proc.kill()
        srv.proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in children):
            assert time.monotonic() < deadline, [p for p in children if _alive(p)]
            time.sleep(0.1)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", srv.port))
        # its private directory (sockets, ready files) outlived it; the next server's
        # parent removes it (its parent.pid names no live process)
        sockdir = os.path.dirname(next(e["socket"] for e in list(srv.events)
                                       if e.get("event") == "worker_start"))
        assert os.path.isdir(sockdir)
        again = Workers(str(tmp_path / "wh"))
        try:
            assert not os.path.exists(sockdir)
            assert any(e.get("event") == "stale_dir_removed" and e["path"] == sockdir
                       for e in list(again.events))
        finally:
            again.proc.send_signal(signal.SIGTERM)
            again.proc.wait(timeout=60)
            again.kill()
    finally:
        srv.kill()
        for pid in [*srv.worker_pids().values(), *srv.worker_pids("front").values()]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_new_connections_go_to_the_worker_with_the_fewest(tmp_path):
    """The kernel picks a relay by a hash of the connection; the relay picks the worker
    that has the fewest relayed connections, so connections opened one after another
    split evenly, not at random (at random, 5 and 5 of 10 has a chance of 1 in 4)."""
    srv = Workers(str(tmp_path / "wh"))
    clients = []
    try:
        since = len(srv.events)
        for _ in range(10):  # each one connected (a call made) and kept open
            client = flight.connect(srv.uri)
            client.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
                proto.CommandStatementQuery(query="SELECT 1"))))
            clients.append(client)
        deadline = time.monotonic() + 10
        while True:
            peers: dict = {}
            for e in list(srv.events)[since:]:
                if e.get("event") == "rpc" and e.get("method") == "GetFlightInfo":
                    peers.setdefault(e.get("worker"), set()).add(e.get("peer"))
            if sum(map(len, peers.values())) >= 10 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sorted(len(p) for p in peers.values()) == [5, 5], peers
    finally:
        for client in clients:
            client.close()
        srv.kill()


def test_prepared_statements_and_sessions_are_counted_for_the_whole_server(tmp_path):
    """--max-prepared-statements and --max-sessions hold per principal for the whole
    server, as on one process: connections on two workers share them, a closed one frees
    its place on any worker, and a session whose connection closed is released when another
    worker needs its place."""
    from _server_harness import action, desc, fetch, prepare, update

    srv = Workers(str(tmp_path / "wh"), "--max-prepared-statements", "2",
                  "--max-sessions", "2")
    clients = []
    try:
        since = len(srv.events)
        for _ in range(4):  # connections opened one after another alternate over workers
            c = flight.connect(srv.uri)
            clients.append(c)
            fetch(c, desc(proto.CommandStatementQuery(query="SELECT 1")))  # logs its worker
        assert served_by(srv, since, {0, 1}) == {0, 1}
        workers = [e["worker"] for e in list(srv.events)[since:]
                   if e.get("event") == "statement"][:4]
        # two connections, one per worker, hold the two prepared statements allowed
        first = clients[workers.index(0)]
        second = clients[workers.index(1)]
        third = next(c for c in clients if c is not first and c is not second)
        h1 = prepare(first, "SELECT 1")
        prepare(second, "SELECT 2")
        with pytest.raises(flight.FlightError, match="max_prepared_statements") as ei:
            prepare(third, "SELECT 3")
        assert "value=2" in str(ei.value)
        # closing one (on worker 0) frees the place for a connection on either worker
        action(first, "ClosePreparedStatement", proto.pack(
            proto.ActionClosePreparedStatementRequest(prepared_statement_handle=h1)))
        h3 = prepare(third, "SELECT 3")
        # at the limit, a statement used on a connection at the other worker too counts
        # once (its copy there took a second place: refused, session 29)
        away = second if workers[clients.index(third)] == 0 else first
        cmd = desc(proto.CommandPreparedStatementQuery(prepared_statement_handle=h3))
        assert fetch(away, cmd)[1].column(0).to_pylist() == [3]
        with pytest.raises(flight.FlightError, match="max_prepared_statements"):
            prepare(away, "SELECT 4")  # still two open: the limit holds
        # sessions: two connections that SET hold --max-sessions 2 of the whole server
        update(first, "SET delete_mode = 'splice'")
        update(second, "SET delete_mode = 'splice'")
        with pytest.raises(flight.FlightError, match="limit=max_sessions value=2"):
            update(third, "SET delete_mode = 'splice'")
        first.close()  # its session's connection is gone: worker 0 releases it when asked
        clients.remove(first)
        deadline = time.monotonic() + 10
        while True:
            try:
                update(third, "SET delete_mode = 'splice'")
                break
            except flight.FlightError:
                assert time.monotonic() < deadline, "the closed connection's session stayed"
                time.sleep(0.2)
    finally:
        for c in clients:
            c.close()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=60)
        finally:
            srv.kill()


def test_a_ticket_redeems_on_every_worker_and_only_for_its_principal(server):
    """Tickets are signed with one key for the whole server: a query's ticket from one
    connection runs on a connection at the other worker too, as on one server, and
    another principal's redemption is PERMISSION_DENIED (a genuine ticket, not its holder)
    on every worker, never an unknown signature."""
    alices = [_flight_client(server) for _ in range(4)]
    bobs = [_flight_client(server, "bob") for _ in range(4)]
    try:
        c0, o0 = alices[0]
        info = c0.get_flight_info(flight.FlightDescriptor.for_command(proto.pack(
            proto.CommandStatementQuery(query="SELECT count(*) AS n FROM t"))), o0)
        ticket = info.endpoints[0].ticket
        since = len(server.events)
        for c, o in alices:  # connections opened one after another alternate workers
            assert c.do_get(ticket, o).read_all().column("n")[0].as_py() >= 1000 - 20
        assert served_by(server, since, {0, 1}) == {0, 1}
        for c, o in bobs:
            with pytest.raises(flight.FlightUnauthorizedError, match="PermissionDenied|"
                               "another principal|not .*holder"):
                c.do_get(ticket, o).read_all()
    finally:
        for c, _ in alices + bobs:
            c.close()


def test_workers_auto_starts_one_per_usable_core(tmp_path):
    from flightsrv.server.config import usable_cores

    n = usable_cores()
    srv = Workers(str(tmp_path / "wh"), "--workers", "auto")  # the last --workers counts
    try:
        (start,) = [e for e in list(srv.events) if e.get("event") == "start"]
        assert start["workers"] == n
        assert f"{n} workers;" in "".join(srv.lines) or n == 1
        assert query(srv.uri, "SELECT 41 + 1") == [(42,)]
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=60) == 0
    finally:
        srv.kill()


def test_a_prepared_handle_works_on_a_connection_at_the_other_worker(server):
    """A client that reconnects (an idle gRPC channel does) may reach another worker: its
    prepared handles still work there (the handle names its statement, signed for the
    server), bound parameters and all, and stay the principal's own."""
    from _server_harness import desc

    alices, (home, home_opts), (away, away_opts) = _home_and_away(server)
    bob, bob_opts = _flight_client(server, "bob")
    since = len(server.events)
    try:
        (res,) = home.do_action(flight.Action("CreatePreparedStatement", proto.pack(
            proto.ActionCreatePreparedStatementRequest(query="SELECT v FROM t WHERE id = ?"))),
            home_opts)
        raw = res.body.to_pybytes()
        handle = proto.unpack(raw).prepared_statement_handle
        cmd = desc(proto.CommandPreparedStatementQuery(prepared_statement_handle=handle))

        def run(c, o, i):
            writer, reader = c.do_put(cmd, pa.schema([("p", pa.int64())]), o)
            writer.write_batch(pa.record_batch([pa.array([i], pa.int64())], names=["p"]))
            writer.done_writing()
            reader.read()
            writer.close()
            info = c.get_flight_info(cmd, o)
            return c.do_get(info.endpoints[0].ticket, o).read_all().column("v")[0].as_py()

        assert run(home, home_opts, 7) == 14
        assert run(away, away_opts, 8) == 16  # the other worker prepares it again
        deadline = time.monotonic() + 10  # log lines are read by the drain thread
        while not any(e.get("event") == "prepared_revived" and e.get("worker") == 1
                      for e in list(server.events)[since:]):
            assert time.monotonic() < deadline, "worker 1 did not prepare it again"
            time.sleep(0.05)
        assert run(home, home_opts, 9) == 18
        with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
            bob.get_flight_info(cmd, bob_opts)  # another principal's: NOT_FOUND
        close = flight.Action("ClosePreparedStatement", proto.pack(
            proto.ActionClosePreparedStatementRequest(prepared_statement_handle=handle)))
        list(away.do_action(close, away_opts))  # closed on the worker that re-created it
        for c, o in (home, home_opts), (away, away_opts):  # ... is closed on both, as on
            with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
                c.get_flight_info(cmd, o)  # one server: neither runs nor re-creates it
            with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
                list(c.do_action(close, o))  # a second close is NOT_FOUND
        def prepare(sql):
            (res,) = home.do_action(flight.Action("CreatePreparedStatement", proto.pack(
                proto.ActionCreatePreparedStatementRequest(query=sql))), home_opts)
            made = proto.unpack(res.body.to_pybytes()).prepared_statement_handle
            return made, desc(proto.CommandPreparedStatementQuery(prepared_statement_handle=made))

        def close_at(c, o, made):
            list(c.do_action(flight.Action("ClosePreparedStatement", proto.pack(
                proto.ActionClosePreparedStatementRequest(prepared_statement_handle=made))), o))

        # a handle made at home, re-created away and closed at home: gone away as well
        handle, cmd = prepare("SELECT v FROM t WHERE id = ?")
        assert run(away, away_opts, 3) == 6
        close_at(home, home_opts, handle)
        with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
            away.get_flight_info(cmd, away_opts)
        # a handle made at home and closed at home before any other worker used it: the
        # other worker neither runs nor re-creates it (it did: session 29)
        handle, cmd = prepare("SELECT v FROM t WHERE id = ?")
        close_at(home, home_opts, handle)
        with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
            away.get_flight_info(cmd, away_opts)
        with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
            close_at(away, away_opts, handle)
        # a handle naming a long statement (larger than a message to the parent) as well
        handle, cmd = prepare("SELECT v FROM t WHERE id = ? AND '" + "x" * 15_000 + "' <> ''")
        assert len(handle.hex()) > 16 << 10  # as text, more than a broker message holds
        assert run(away, away_opts, 4) == 8
        close_at(away, away_opts, handle)
        with pytest.raises(pa.ArrowKeyError, match="unknown or expired prepared"):
            home.get_flight_info(cmd, home_opts)
        assert not any(e.get("event") in ("slot_broker_lost", "slot_broker_error")
                       for e in list(server.events))
    finally:
        for c, _ in [*alices, (bob, bob_opts)]:
            c.close()


def test_a_cancel_reaching_the_other_worker_cancels_the_stream(server):
    """CancelFlightInfo sent on a connection at another worker than the one streaming (or
    about to stream) the ticket cancels it there, as on one server: a running stream ends
    CANCELLED, and a ticket cancelled before its DoGet fails CANCELLED on either worker."""
    from _server_harness import desc

    alices, (home, home_opts), (away, away_opts) = _home_and_away(server)
    try:

        def cancel(info):
            req = proto.CancelFlightInfoRequest(info=info.serialize())
            (raw,) = list(away.do_action(flight.Action(
                "CancelFlightInfo", req.SerializeToString()), away_opts))
            return proto.parse(proto.CancelFlightInfoResult, raw.body.to_pybytes()).status

        long = desc(proto.CommandStatementQuery(query="SELECT range AS i FROM range(50000000)"))
        info = home.get_flight_info(long, home_opts)
        reader = home.do_get(info.endpoints[0].ticket, home_opts)
        rows = reader.read_chunk().data.num_rows
        assert cancel(info) == proto.CancelStatus.CANCELLED
        with pytest.raises(flight.FlightCancelledError, match="cancelled"):
            while True:
                rows += reader.read_chunk().data.num_rows
        assert rows < 50_000_000
        info = home.get_flight_info(long, home_opts)  # cancelled before its DoGet
        assert cancel(info) == proto.CancelStatus.CANCELLED
        for c, o in (home, home_opts), (away, away_opts):
            with pytest.raises(flight.FlightCancelledError, match="cancelled"):
                c.do_get(info.endpoints[0].ticket, o).read_all()
    finally:
        for c, _ in alices:
            c.close()


def test_summed_counters_stay_monotonic_over_a_worker_restart():
    """The merge of workers' /metrics (worker 0's): a worker that restarted counts from
    zero again, one restarting is missing from a scrape; the server's sums never drop."""
    from prometheus_client.parser import text_string_to_metric_families

    from flightsrv.server.metrics import CounterCarry, merge_workers

    def text(started: float, requests: float, sessions: float) -> bytes:
        return (f"# TYPE flightsrv_requests_total counter\n"
                f'flightsrv_requests_total{{rpc="DoGet"}} {requests}\n'
                f"# TYPE flightsrv_sessions gauge\nflightsrv_sessions {sessions}\n"
                f"# TYPE flightsrv_start_time_seconds gauge\n"
                f"flightsrv_start_time_seconds {started}\n").encode()

    def sums(texts):
        out = merge_workers(texts, carry=carry).decode()
        fams = {f.name: f for f in text_string_to_metric_families(out)}
        return (fams["flightsrv_requests"].samples[0].value,
                fams["flightsrv_sessions"].samples[0].value)

    carry = CounterCarry()
    assert sums([("0", text(100, 5, 1)), ("1", text(100, 3, 2))]) == (8, 3)
    assert sums([("0", text(100, 6, 1))]) == (9, 1)  # 1 restarting: its last total stays
    # restarted (a new start time) and already past its old total: still carried
    assert sums([("0", text(100, 6, 1)), ("1", text(200, 4, 0))]) == (13, 1)
    assert sums([("0", text(100, 7, 1)), ("1", text(200, 5, 0))]) == (15, 1)
    # without a carry (one scrape, or ?by=worker): the plain sums
    assert merge_workers([("0", text(100, 1, 0)), ("1", text(100, 2, 0))]).decode().count(
        "flightsrv_requests_total{") == 1


def test_a_kept_result_is_fetched_once_from_whichever_worker(server):
    """A statement with effects runs at GetFlightInfo and its report is kept for one fetch
    where it ran; a DoGet of its ticket on a connection at the other worker fetches it from
    there, as on one server, and a second fetch anywhere is NOT_FOUND (it never runs
    again)."""
    from _server_harness import desc

    alices, (home, home_opts), (away, away_opts) = _home_and_away(server)
    try:
        for first in (away, away_opts), (home, home_opts):
            since = len(server.events)
            info = home.get_flight_info(desc(proto.CommandStatementQuery(
                query="OPTIMIZE t")), home_opts)
            report = first[0].do_get(info.endpoints[0].ticket, first[1]).read_all()
            assert report.num_rows >= 1 and "table" in report.column_names
            for c, o in (home, home_opts), (away, away_opts):
                with pytest.raises(pa.ArrowKeyError, match="already fetched or expired"):
                    c.do_get(info.endpoints[0].ticket, o).read_all()
            runs = [e for e in list(server.events)[since:]
                    if e.get("event") == "statement" and e.get("kind") == "maintenance"]
            assert len(runs) == 1  # ran once, at GetFlightInfo
    finally:
        for c, _ in alices:
            c.close()


def test_failed_logins_back_off_for_the_whole_server(server):
    """A password guesser that opens a new connection per guess reaches both workers; the
    back-off still counts every failure of the name (5 free), as one server does; and a
    credential that verified on one worker is not backed off on the other."""
    def login(user, password):
        c = flight.connect(server.uri)
        try:
            c.authenticate_basic_token(user, password)
            return "ok"
        except flight.FlightUnauthenticatedError as exc:
            return "backoff" if "too many failed logins" in str(exc) else "denied"
        finally:
            c.close()

    from prometheus_client.parser import text_string_to_metric_families

    def failures() -> dict:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics?by=worker"
        with urllib.request.urlopen(url) as r:
            fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        return {s.labels["worker"]: s.value for s in fams["flightsrv_auth_failures"].samples
                if s.name == "flightsrv_auth_failures_total"}

    before = failures()
    guesses = [login("mallory", f"guess{i}") for i in range(10)]
    after = failures()
    assert all(after.get(w, 0) > before.get(w, 0) for w in ("0", "1"))  # on both workers
    # 5 free failures; the 6th is checked and backs the name off for 1 s, a 7th checked
    # (one that came later than that) for 2 s, ... (without the whole server's count each
    # worker would have seen 5 of the 10 guesses: none backed off)
    assert guesses[:6] == ["denied"] * 6 and "backoff" in guesses[6:]
    assert login("alice", "alice-pw") == "ok"  # verified on one worker
    time.sleep(0.5)  # its notice is told without waiting
    assert "backoff" in [login("alice", f"wrong{i}") for i in range(10)]
    # ... is known as verified on both: her own logins are never backed off
    assert [login("alice", "alice-pw") for _ in range(4)] == ["ok"] * 4


def test_maintenance_yields_to_statements_on_every_worker(tmp_path, users):
    """Worker 0 runs the background maintenance; it waits (up to ``--maintenance-yield``)
    while a statement runs on any worker, not only on its own, as one server's maintenance
    waits for its statements: 20 small files made due while a long statement runs on
    worker 1 are compacted only once that statement ends."""
    from _server_harness import desc

    srv = Workers(str(tmp_path / "wh"), "--users-file", str(users),
                  "--maintenance-interval", "0.3", "--maintenance-yield", "60")
    alices = []
    try:
        c0, o0 = _flight_client(srv)
        alices.append((c0, o0))

        def update(c, o, sql):
            writer, reader = c.do_put(desc(proto.CommandStatementUpdate(query=sql)),
                                      pa.schema([]), o)
            writer.done_writing()
            reader.read()
            writer.close()

        update(c0, o0, "CREATE TABLE small (id BIGINT)")
        alices, _, (away, away_opts) = _home_and_away(srv, n=6)
        alices.append((c0, o0))
        long = desc(proto.CommandStatementQuery(
            query="SELECT count(*) AS n FROM range(4000000000) WHERE range % 7 = 3"))
        info = away.get_flight_info(long, away_opts)
        ended = []

        def stream():
            try:
                away.do_get(info.endpoints[0].ticket, away_opts).read_all()
            except flight.FlightCancelledError:
                ended.append(time.monotonic())

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        time.sleep(1.0)  # the statement runs on worker 1
        # the same connection (so the same worker) makes the small files meanwhile
        for i in range(20):
            update(away, away_opts, f"INSERT INTO small VALUES ({i})")
        time.sleep(3.0)  # ten maintenance ticks
        runs = [e for e in list(srv.events) if e.get("event") == "maintenance_run"]
        assert runs == [], runs  # yielding to worker 1's statement
        req = proto.CancelFlightInfoRequest(info=info.serialize())
        list(away.do_action(flight.Action("CancelFlightInfo", req.SerializeToString()),
                            away_opts))
        t.join(30)
        assert ended, "the long statement was not cancelled"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            runs = [e for e in list(srv.events) if e.get("event") == "maintenance_run"
                    and e.get("table") == "small" and e.get("status") == "ok"]
            if runs:
                break
            time.sleep(0.1)
        assert runs and runs[0]["worker"] == 0, srv.lines[-20:]
    finally:
        for c, _ in alices:
            c.close()
        srv.kill()

