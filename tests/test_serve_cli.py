"""`flightsrv serve` as a real process: seeded demo table, clients, SIGTERM, persistence across
restarts (local and S3 via moto), auth tokens and users file, TLS."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import adbc_driver_manager
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight
from test_server_app import _self_signed

from flightsrv.demo import DEMO_TABLE
from flightsrv.server import proto
from flightsrv.server.auth import hash_password

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
TOKEN_HEADER = "adbc.flight.sql.authorization_header"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: ``FLIGHTSRV_TEST_SERVE_WORKERS=N`` runs every ``Served`` server as ``serve --workers N``
#: (the suites that start servers, on the multi-process design); unset: one process
SERVE_WORKERS = int(os.environ.get("FLIGHTSRV_TEST_SERVE_WORKERS") or 1)


class Served:
    """A `python -m flightsrv.cli ... serve` child process, its stderr collected."""

    def __init__(self, warehouse: str, *args: str, env=None, port: int | None = None):
        self.port = port if port is not None else free_port()
        if SERVE_WORKERS > 1 and "--workers" not in args:
            args = (*args, "--workers", str(SERVE_WORKERS))
        cmd = [sys.executable, "-m", "flightsrv.cli", "--warehouse", warehouse, "serve",
               "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.events: list[dict] = []
        started = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                self.events.append(event)
                # one start line per server (with --workers N, the parent's once all serve)
                if event.get("event") == "start":
                    started.set()
            started.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not started.wait(60) or self.proc.poll() is not None:
            self.kill()
            raise AssertionError("server did not start:\n" + "".join(self.lines))
        start = next(e for e in self.events if e.get("event") == "start")
        assert start["port"] == self.port

    def uri(self, scheme="grpc", host="127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}"

    def stop(self, sig=signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        finally:
            self.kill()
        self._drain.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def connect(uri, **db_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(uri, db_kwargs=db_kwargs or None)


def query(uri, sql, **db_kwargs):
    with connect(uri, **db_kwargs) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall() if cur.description else cur.rowcount


def test_serve_local_demo_sql_writes_survive_restart(tmp_path):
    wh = str(tmp_path / "warehouse")
    srv = Served(wh)
    try:
        uri = srv.uri()
        # the one human line names the seeded table (with --workers, worker 0 seeds it
        # before the parent prints the line)
        deadline = time.monotonic() + 10  # it follows the JSON start line
        while not any(ln.startswith("flightsrv: serving") for ln in list(srv.lines)):
            assert time.monotonic() < deadline, "".join(srv.lines)
            time.sleep(0.05)
        (serving,) = [ln for ln in list(srv.lines) if ln.startswith("flightsrv: serving")]
        assert f"(tables: {DEMO_TABLE};" in serving or f"(tables: {DEMO_TABLE})" in serving
        total, user42 = query(uri, f"SELECT count(*), count(*) FILTER (WHERE user_id = 42) "
                                   f"FROM {DEMO_TABLE}")[0]
        assert 99_000 < total < 100_000 and user42 == 0  # seeded, user 42 erased
        with connect(uri) as conn, conn.cursor() as cur:
            cur.execute(f"DELETE FROM {DEMO_TABLE} WHERE event_type = 'refund'")
            refunds = cur.rowcount
            assert refunds > 0
            cur.execute(f"INSERT INTO main.{DEMO_TABLE} (event_id, user_id, event_type, amount) "
                        "VALUES (-1, 42, 'signup', 0.5)")
            assert cur.rowcount == 1
            cur.execute(f"SELECT count(*), sum(event_id) FROM {DEMO_TABLE}")
            before = cur.fetchall()
        assert srv.stop() == 0
    finally:
        srv.kill()
    assert any(e.get("event") == "stopped" for e in srv.events)
    seeded = [e for e in srv.events if e.get("msg") == "seeded demo table"]
    assert seeded and seeded[0]["table"] == DEMO_TABLE

    again = Served(wh)
    try:
        assert query(again.uri(), f"SELECT count(*), sum(event_id) FROM {DEMO_TABLE}") == before
        assert before[0][0] == total - refunds + 1
        assert query(again.uri(), f"SELECT user_id FROM {DEMO_TABLE} WHERE event_id = -1") == [
            (42,)]
        assert again.stop(signal.SIGINT) == 0
    finally:
        again.kill()
    assert not [e for e in again.events if e.get("msg") == "seeded demo table"]
    skipped = [e for e in again.events if e.get("event") == "demo_not_seeded"]
    assert skipped and f"already holds tables ({DEMO_TABLE})" in skipped[0]["msg"], skipped


def test_serve_s3_writes_survive_restart(s3_uri, subprocess_env):
    srv = Served(s3_uri, env=subprocess_env)
    try:
        uri = srv.uri()
        assert query(uri, "SELECT 1") == [(1,)]
        query(uri, "CREATE TABLE t AS SELECT range AS id, range % 5 AS k FROM range(1000)")
        assert query(uri, "DELETE FROM t WHERE k = 0") == 200
        assert query(uri, "INSERT INTO flightsrv.main.t VALUES (5000, 7)") == 1
        before = query(uri, "SELECT count(*), sum(id) FROM t")
        assert srv.stop() == 0
    finally:
        srv.kill()
    again = Served(s3_uri, env=subprocess_env)
    try:
        assert query(again.uri(), "SELECT count(*), sum(id) FROM t") == before == [
            (801, sum(i for i in range(1000) if i % 5) + 5000)]
        assert again.stop() == 0
    finally:
        again.kill()


def test_serve_auth_tokens_users_file_and_tls(tmp_path):
    cert, key = _self_signed(tmp_path)
    users = tmp_path / "users"
    users.write_text(f"ann:{hash_password('ann-pw', iterations=1000)}:writer\n")
    srv = Served(str(tmp_path / "wh"), "--auth-token", "w-secret:writer",
                 "--auth-token", "r-secret:reader", "--users-file", str(users),
                 "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        uri = srv.uri("grpc+tls", "localhost")
        tls = {"adbc.flight.sql.client_option.tls_root_certs": cert.read_text()}
        writer = {TOKEN_HEADER: "Bearer w-secret", **tls}
        reader = {TOKEN_HEADER: "Bearer r-secret", **tls}
        n = query(uri, f"SELECT count(*) FROM {DEMO_TABLE}", **reader)[0][0]
        for creds in ({}, {TOKEN_HEADER: "Bearer nope"}):
            with pytest.raises(adbc_driver_manager.Error) as ei:
                query(uri, "SELECT 1", **creds, **tls)
            assert "UNAUTHENTICATED" in str(ei.value)
        with pytest.raises(adbc_driver_manager.Error) as ei:
            query(uri, f"DELETE FROM {DEMO_TABLE}", **reader)
        assert "UNAUTHORIZED" in str(ei.value)
        assert query(uri, f"DELETE FROM {DEMO_TABLE} WHERE event_id < 10", **writer) == 10
        assert query(uri, f"SELECT count(*) FROM {DEMO_TABLE}",
                     username="ann", password="ann-pw", **tls) == [(n - 10,)]
        with pytest.raises(adbc_driver_manager.Error):  # plaintext to a TLS port
            query(srv.uri(), "SELECT 1", **{TOKEN_HEADER: "Bearer w-secret"})
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_serve_refuses_half_tls_config(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flightsrv.cli", "--warehouse",
                           str(tmp_path / "wh"), "serve", "--no-demo", "--port", "0",
                           "--tls-cert", str(tmp_path / "cert.pem")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "--tls-key" in proc.stderr


def test_serve_refuses_a_temp_dir_inside_the_warehouse_before_reading_it(tmp_path):
    """A bad --temp-dir is a bad option (exit 2, as CLI.md says: nothing read or written),
    refused before the warehouse is opened (it was exit 1 after the demo check had read it:
    found in session 28)."""
    wh = tmp_path / "wh"
    proc = subprocess.run([sys.executable, "-m", "flightsrv.cli", "--warehouse", str(wh),
                           "serve", "--port", "0", "--temp-dir", str(wh / "spill")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--temp-dir must be outside the warehouse" in proc.stderr
    assert "demo" not in proc.stderr and "Traceback" not in proc.stderr
    assert not wh.exists()


def test_serve_time_zone_pins_what_timestamptz_statements_answer(tmp_path):
    """``serve --time-zone``: every statement (on every worker) runs in that zone whatever
    the host's ``TZ``; an unknown zone is refused before anything is created."""
    sql = ("SELECT CAST(TIMESTAMPTZ '2024-01-01 20:00:00+00' AS DATE)::VARCHAR AS d, "
           "TIMESTAMPTZ '2024-01-01 20:00:00+00'::VARCHAR AS shown")
    env = dict(os.environ, TZ="America/New_York")
    srv = Served(str(tmp_path / "wh"), "--no-demo", "--time-zone", "Asia/Tokyo", env=env)
    try:
        for _ in range(4):  # connections spread over the workers when there are several
            assert query(srv.uri(), sql) == [("2024-01-02", "2024-01-02 05:00:00+09")]
    finally:
        assert srv.stop() == 0
    proc = subprocess.run([sys.executable, "-m", "flightsrv.cli", "--warehouse",
                           str(tmp_path / "wh2"), "serve", "--port", "0",
                           "--time-zone", "Mars/Olympus"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr  # a bad option, as --tls-cert without a key
    assert "--time-zone: unknown time zone 'Mars/Olympus'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "wh2").exists()


def _env(**values: str) -> dict[str, str]:
    """This process's environment without any FLIGHTSRV_* variable, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTSRV_")}
    return {**env, **values}


def _users_line(name: str, password: str, role: str) -> str:
    return f"{name}:{hash_password(password, iterations=1000)}:{role}\n"


# (files to write, serve arguments, environment, what the one error line names); {d} is the
# test's directory. Every case gives a credential source that yields no (usable) credential
NO_CREDENTIALS = {
    "token file of comments": ({"tokens": "# provisioned later\n\n   \n"},
                               ["--auth-token-file", "{d}/tokens"], {},
                               ["--auth-token-file {d}/tokens", "holds no token"]),
    "token file of comments beside a token": (
        {"tokens": "# provisioned later\n"},
        ["--auth-token", "w-secret", "--auth-token-file", "{d}/tokens"], {},
        ["{d}/tokens", "holds no token"]),
    "token file from the environment, empty": (
        {"tokens": ""}, [], {"FLIGHTSRV_AUTH_TOKEN_FILE": "{d}/tokens"},
        ["{d}/tokens", "holds no token"]),
    "token file name empty": ({}, [], {"FLIGHTSRV_AUTH_TOKEN_FILE": ""},
                              ["--auth-token-file", "empty"]),
    "users file of comments": ({"users": "# user:hash:role\n\n"},
                               ["--users-file", "{d}/users"], {},
                               ["--users-file", "{d}/users", "no user"]),
    "users file name empty": ({}, ["--users-file", ""], {}, ["--users-file", "empty"]),
    "users file from the environment, name empty": ({}, [], {"FLIGHTSRV_USERS_FILE": ""},
                                                    ["--users-file", "empty"]),
    "token variable empty": ({}, [], {"FLIGHTSRV_AUTH_TOKEN": ""},
                             ["$FLIGHTSRV_AUTH_TOKEN", "empty"]),
    "token variable blank beside a token": ({}, ["--auth-token", "w-secret"],
                                            {"FLIGHTSRV_AUTH_TOKEN": "  "},
                                            ["$FLIGHTSRV_AUTH_TOKEN", "empty"]),
    "token option empty": ({}, ["--auth-token", ""], {}, ["TOKEN[:reader|writer]"]),
    "token option of a role only": ({}, ["--auth-token", ":reader"], {},
                                    ["TOKEN[:reader|writer]"]),
}


def _serve_with(tmp_path, files: dict, args: list, env: dict):
    """``flightsrv serve`` with ``files`` written to ``tmp_path`` and ``{d}`` in the
    arguments and environment replaced by it (the completed process: it is expected to
    refuse to start)."""
    d = str(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return subprocess.run([sys.executable, "-m", "flightsrv.cli", "--warehouse", f"{d}/wh",
                           "serve", "--no-demo", "--port", "0",
                           *[a.format(d=d) for a in args]],
                          capture_output=True, text=True, timeout=60, check=False,
                          env=_env(**{k: v.format(d=d) for k, v in env.items()}))


@pytest.mark.parametrize("case", NO_CREDENTIALS)
def test_serve_refuses_a_credential_source_that_yields_no_credential(tmp_path, case):
    files, args, env, needles = NO_CREDENTIALS[case]
    d = str(tmp_path)
    proc = _serve_with(tmp_path, files, args, env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("flightsrv: error: ") and proc.stderr.count("\n") == 1
    for needle in needles:
        assert needle.format(d=d) in proc.stderr, (needle, proc.stderr)
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("files,args,env,needles", [
    ({"tokens": "s3cret-a:reader\n"}, ["--auth-token", "s3cret-a:writer",
                                       "--auth-token-file", "{d}/tokens"], {},
     ["--auth-token-file {d}/tokens", "reader", "writer", "first=--auth-token"]),
    ({}, ["--auth-token", "s3cret-a"], {"FLIGHTSRV_AUTH_TOKEN": "s3cret-a:reader"},
     ["$FLIGHTSRV_AUTH_TOKEN", "reader", "writer"]),
    ({"users": _users_line("ann", "pw1", "reader") + _users_line("ann", "pw2", "writer")},
     ["--users-file", "{d}/users"], {}, ["--users-file", "user=ann", "twice"]),
])
def test_serve_refuses_one_credential_given_two_ways(tmp_path, files, args, env, needles):
    d = str(tmp_path)
    proc = _serve_with(tmp_path, files, args, env)
    assert proc.returncode == 2, proc.stderr
    for needle in needles:
        assert needle.format(d=d) in proc.stderr, (needle, proc.stderr)
    assert "s3cret" not in proc.stderr  # a token is never shown
    assert not (tmp_path / "wh").exists()


def test_serve_gives_every_credential_its_own_principal(tmp_path):
    """The same token from $FLIGHTSRV_AUTH_TOKEN and the token file is one credential; a
    second token and a users-file user named like the old token names ("token-1") are
    other principals, so none of them can use another's tickets or prepared statements."""
    (tmp_path / "tokens").write_text("alice-secret:writer\nbob-secret:reader\n")
    (tmp_path / "users").write_text(_users_line("token-1", "pw", "reader")
                                    + _users_line("token-2", "pw", "reader"))
    srv = Served(str(tmp_path / "wh"), "--no-demo", "--auth-token-file",
                 str(tmp_path / "tokens"), "--users-file", str(tmp_path / "users"),
                 env=_env(FLIGHTSRV_AUTH_TOKEN="alice-secret:writer"))
    try:
        client = flight.FlightClient(srv.uri())
        _, user_header = client.authenticate_basic_token("token-1", "pw")

        def opts(token=None, header=None):
            header = header or f"Bearer {token}".encode()
            return flight.FlightCallOptions(headers=[(b"authorization", header)])

        alice, bob, user = opts("alice-secret"), opts("bob-secret"), opts(header=user_header)
        query = proto.pack(proto.CommandStatementQuery(query="SELECT 42 AS n"))
        ticket = client.get_flight_info(flight.FlightDescriptor.for_command(query),
                                        alice).endpoints[0].ticket
        for other in (bob, user):
            with pytest.raises(flight.FlightUnauthorizedError, match="another principal"):
                client.do_get(ticket, other).read_all()
        assert client.do_get(ticket, alice).read_all().to_pylist() == [{"n": 42}]

        def action(kind, msg, who):
            return [r.body.to_pybytes()
                    for r in client.do_action(flight.Action(kind, proto.pack(msg)), who)]

        handle = proto.unpack(action("CreatePreparedStatement",
                                     proto.ActionCreatePreparedStatementRequest(
                                         query="SELECT 1 AS one"), alice)[0]
                              ).prepared_statement_handle
        close = proto.ActionClosePreparedStatementRequest(prepared_statement_handle=handle)
        for other in (bob, user):
            with pytest.raises(KeyError, match="unknown or expired prepared statement"):
                action("ClosePreparedStatement", close, other)
        action("ClosePreparedStatement", close, alice)  # still alice's to close
        client.close()
        assert srv.stop() == 0
    finally:
        srv.kill()
    users = {e["user"] for e in srv.events if e.get("event") == "rpc"}
    assert {"token:1", "token:2", "token-1"} <= users
    failed = {e["user"] for e in srv.events if e.get("event") == "rpc"
              and e["status"] != "OK"}
    assert "token:1" not in failed
    text = "".join(srv.lines)
    assert "alice-secret" not in text and "bob-secret" not in text


def test_serve_runs_duckdb_with_an_allocator_that_gives_memory_back(tmp_path):
    """``serve`` caps its address space (RLIMIT_DATA); DuckDB's allocator kept the address
    space of freed memory, so one query near the cap left the process unable to allocate
    anything (every RPC failed with MemoryError, /healthz went silent: session 29). The
    server runs DuckDB with ``retain:false`` (its memory_cap log line says so); a value the
    environment sets is kept."""
    def conf(server) -> str | None:
        # one line per process that serves (each worker of --workers N caps its own)
        confs = {e.get("allocator_conf") for e in server.events
                 if e.get("event") == "memory_cap"}
        assert len(confs) == 1, confs
        return confs.pop()

    env = {k: v for k, v in os.environ.items() if k != "DUCKDB_JE_MALLOC_CONF"}
    server = Served(str(tmp_path / "wh"), "--no-demo", env=env)
    try:
        assert conf(server) == "retain:false"
        assert query(server.uri(), "SELECT 42") == [(42,)]
    finally:
        assert server.stop() == 0
    env["DUCKDB_JE_MALLOC_CONF"] = "narenas:2,retain:true"
    server = Served(str(tmp_path / "wh"), "--no-demo", env=env)
    try:
        assert conf(server) == "narenas:2,retain:true"
    finally:
        assert server.stop() == 0


def test_memory_cap_is_on_top_of_what_the_server_holds(tmp_path):
    """The cap is the data memory the server holds when it starts serving (reserved thread
    stacks, the runtime) plus --memory-limit plus --memory-headroom: a fixed cap of the two
    alone fell below a server's baseline and it never started (MemoryError, reported as a
    port problem)."""
    if os.environ.get("FLIGHTSRV_TEST_SERVE_WORKERS"):
        # a worker caps itself before its threads start, and their reserved stacks (40-60
        # threads of 8 MiB) come out of the headroom: 1 GiB is too little under a 256 MiB
        # limit (SERVER.md, --memory-headroom); the arithmetic is checked in one process
        pytest.skip("a worker's threads start after its cap")
    mib = 1 << 20
    server = Served(str(tmp_path / "wh"), "--memory-limit", "256MiB")  # seeds the demo
    try:
        (cap,) = [e for e in server.events if e.get("event") == "memory_cap"][:1]
        assert cap["held_bytes"] > 0
        assert cap["rlimit_data_bytes"] == cap["held_bytes"] + 256 * mib + 1024 * mib
        assert query(server.uri(), "SELECT count(*) > 0 FROM demo_events") == [(True,)]
    finally:
        assert server.stop() == 0
    # a headroom too small for the server's own threads: said so, not blamed on the port
    try:
        out = subprocess.run([sys.executable, "-m", "flightsrv", "--warehouse",
                              str(tmp_path / "wh"), "serve", "--port", "0", "--no-demo",
                              "--memory-limit", "16MiB", "--memory-headroom", "1MiB"],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:  # (its threads fit in 17 MiB here: it served)
        return
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "out of memory under its cap" in last and "port" not in last, out.stderr


def test_every_serve_flag_in_the_servers_flag_table_exists():
    """SERVER.md's flag tables are the contract: each flag named in a row's first cell is
    one `serve --help` lists (SERVER.md named --max-results, which did not exist)."""
    import re

    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "SERVER.md")).read()
    documented = set(re.findall(r"^\| `(--[a-z0-9-]+)", doc, re.M))
    out = subprocess.run([sys.executable, "-m", "flightsrv", "serve", "--help"],
                         capture_output=True, text=True, timeout=60).stdout
    listed = set(re.findall(r"(--[a-z0-9-]+)", out))
    assert len(documented) > 20
    assert documented <= listed, sorted(documented - listed)
