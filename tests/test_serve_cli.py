"""`flightsrv serve` as a real process: seeded demo table, clients, SIGTERM, persistence across
restarts (local and S3 via moto), auth tokens and users file, TLS."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import warnings

import adbc_driver_manager
import pytest
from adbc_driver_flightsql import dbapi
from test_server_app import _self_signed

from flightsrv.demo import DEMO_TABLE
from flightsrv.server.auth import hash_password

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
TOKEN_HEADER = "adbc.flight.sql.authorization_header"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A `python -m flightsrv.cli ... serve` child process, its stderr collected."""

    def __init__(self, warehouse: str, *args: str, env=None, port: int | None = None):
        self.port = port if port is not None else free_port()
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
