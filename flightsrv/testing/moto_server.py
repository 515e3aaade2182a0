"""A moto S3 server on 127.0.0.1 whose requests are serialized by one global lock.

moto checks S3 preconditions and then writes with no lock in between, so under concurrency two
conditional writers can both "win" (see FIELD_NOTES). Real S3 and MinIO make conditional writes
atomic; serving moto's WSGI app behind one lock gives tests the same guarantee.

Run as ``python -m flightsrv.testing.moto_server PORT``; or use ``MotoProcess`` to start and
stop it in a subprocess (what the pytest fixture and the benchmarks do).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time


def serve(port: int, host: str = "127.0.0.1") -> None:
    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import WSGIRequestHandler, make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # moto's S3 app itself: its dispatcher would match every request's host against every
    # service moto knows (a quarter of the server's CPU, and this server only speaks S3)
    app = create_backend_app("s3")
    lock = threading.Lock()

    def locked(environ, start_response):
        with lock:
            # read the whole body inside the lock so the handler sees a complete request
            return list(app(environ, start_response))

    class KeepAlive(WSGIRequestHandler):
        """HTTP/1.1: a client's pooled connection serves many requests (HTTP/1.0 made a
        connection and a server thread per request)."""

        protocol_version = "HTTP/1.1"

    server = make_server(host, port, locked, threaded=True, request_handler=KeepAlive)
    server.serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3TestServer:
    """What the test suite needs of any local S3 server it starts (moto, Versity Gateway):
    its ``endpoint`` and the fixed test credentials, as an environment and a bucket."""

    endpoint: str
    ACCESS_KEY = SECRET_KEY = "testing"

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY, "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1"}

    def apply_env(self) -> None:
        os.environ.update(self.env())
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
        os.environ.pop("AWS_PROFILE", None)

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id=self.ACCESS_KEY, aws_secret_access_key=self.SECRET_KEY
                     ).create_bucket(Bucket=name)


class MotoProcess(S3TestServer):
    """Start ``serve`` in a subprocess; ``endpoint`` is its URL."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "MotoProcess":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flightsrv.testing.moto_server", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.proc.stderr.read().decode()[-2000:]
                raise RuntimeError("moto server exited: " + tail)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
