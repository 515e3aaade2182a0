"""serve(): JSON log lines, clean shutdown on SIGTERM/SIGINT; TLS."""

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from _server_engine import start_test_server
from adbc_driver_flightsql import dbapi

from flightsrv.server.flight import TlsConfig

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")

TESTS_DIR = os.path.dirname(__file__)
SERVE = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {TESTS_DIR!r})
    from _server_engine import DuckDBTestEngine
    from flightsrv.server.app import serve
    serve(DuckDBTestEngine(), "127.0.0.1", 0)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_logs_json_and_shuts_down_on_signal(sig):
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stderr=subprocess.PIPE, text=True)
    try:
        start = json.loads(proc.stderr.readline())
        assert start["event"] == "start" and start["level"] == "info"
        with dbapi.connect(f"grpc://127.0.0.1:{start['port']}") as conn, conn.cursor() as cur:
            cur.execute("SELECT 40 + 2 AS answer")
            assert cur.fetchone() == (42,)
            with pytest.raises(dbapi.Error):
                cur.execute("SELECT * FROM missing_t")
        proc.send_signal(sig)
        _, rest = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    events = [json.loads(line) for line in rest.splitlines() if line.strip()]
    rpcs = [e for e in events if e.get("event") == "rpc"]
    assert any(e["method"] == "DoAction" and e["msg"] == "rpc ok" for e in rpcs)
    failed = [e for e in rpcs if e["msg"] == "rpc failed"]
    assert failed and "missing_t" in failed[0]["error"] and failed[0]["statement"]
    assert [e["event"] for e in events][-2:] == ["stop", "stopped"]
    assert events[-2]["signal"] == signal.Signals(sig).name


def _self_signed(tmp_path):
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_path, key_path


def test_tls(tmp_path):
    cert, key = _self_signed(tmp_path)
    server, _, uri = start_test_server(tls=TlsConfig(str(cert), str(key)))
    try:
        assert uri.startswith("grpc+tls://")
        kwargs = {"adbc.flight.sql.client_option.tls_root_certs": cert.read_text()}
        with dbapi.connect(uri, db_kwargs=kwargs) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 AS one")
            assert cur.fetchone() == (1,)
    finally:
        server.shutdown()


def test_a_stop_signal_never_deadlocks_the_serving_loop():
    """The serving loops wait on ``StopOnSignals.stop`` while SIGTERMs arrive; a Python
    signal handler runs in the main thread between any two lines, so it must work wherever
    the main thread is inside ``stop.wait``. A handler that took ``threading.Event``'s lock
    hung when it ran while the waiting thread held that lock (seen: a worker stuck for 48
    min). Here the handler runs at every line executed inside ``wait`` (a trace function,
    in a child process with a deadline); the old Event-based flag deadlocks on it."""
    child = textwrap.dedent("""
        import signal, sys
        from flightsrv.server.signals import StopOnSignals
        signals = StopOnSignals()
        def tracer(frame, event, arg):
            if event == "line" and len(signals.received) < 100 and \\
                    frame.f_code.co_filename.endswith(("threading.py", "signals.py")):
                signals._on_signal(signal.SIGTERM, None)  # as a signal would, here
            return tracer
        sys.settrace(tracer)
        stopped = signals.stop.wait(5)
        sys.settrace(None)
        print("stopped" if stopped else "timeout")
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=30)
    assert proc.stdout.strip() == "stopped", proc.stderr[-2000:]
