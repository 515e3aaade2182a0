"""Versity Gateway (posix backend) on 127.0.0.1: the second, independent S3 implementation
the tests run against (docs/S3.md, docs/DEVELOPMENT.md).

Versity Gateway is a Go program (Apache-2.0). ``build()`` installs one pinned version from the
Go module proxy with ``go install`` into ``~/.cache/flightsrv/versitygw-<version>/`` (once; the
first build costs about 160 s of CPU: 2 min 40 s on a 2-core machine at load 5) and deletes
the Go module and build caches it used. ``binary()`` finds it there (or at
``$FLIGHTSRV_VERSITYGW``), ``VersityProcess`` starts it on a free port over a directory of its
own, with the interface of :class:`flightsrv.testing.moto_server.MotoProcess`.

Run ``python -m flightsrv.testing.versity_server build`` (what ``.ci/run`` does) to build it;
``python -m flightsrv.testing.versity_server serve DIR [PORT]`` to serve ``DIR`` by hand.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from flightsrv.testing.moto_server import S3TestServer, free_port

VERSION = "v1.8.0"
MODULE = "github.com/versity/versitygw/cmd/versitygw"
ACCESS_KEY = S3TestServer.ACCESS_KEY
SECRET_KEY = S3TestServer.SECRET_KEY


class Unavailable(RuntimeError):
    """versitygw is not built here and cannot be (the message says why and what to run)."""


def cache_dir() -> str:
    base = os.environ.get("FLIGHTSRV_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "flightsrv")
    return os.path.join(base, f"versitygw-{VERSION}")


def binary() -> str | None:
    """Path of a runnable versitygw: ``$FLIGHTSRV_VERSITYGW`` if set, else the cached build;
    None when there is none."""
    explicit = os.environ.get("FLIGHTSRV_VERSITYGW")
    path = explicit or os.path.join(cache_dir(), "versitygw")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def build(timeout: float = 1800.0) -> str:
    """Build versitygw ``VERSION`` from the Go module proxy into ``cache_dir()`` unless it is
    there already; returns its path. Raises ``Unavailable`` when Go is missing or the build
    fails."""
    have = binary()
    if have:
        return have
    go = shutil.which("go")
    if go is None:
        raise Unavailable(f"Go is not installed, so versitygw {VERSION} cannot be built "
                          f"(`go install {MODULE}@{VERSION}` needs Go 1.25 or newer)")
    target = cache_dir()
    os.makedirs(target, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="versitygw-build-") as tmp:
        env = dict(os.environ, GOBIN=os.path.join(tmp, "bin"), GOPATH=os.path.join(tmp, "go"),
                   GOCACHE=os.path.join(tmp, "cache"), GOFLAGS="-modcacherw")
        try:
            r = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], env=env,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"building versitygw {VERSION} took over {timeout:.0f} s") from None
        if r.returncode != 0:
            raise Unavailable(f"`go install {MODULE}@{VERSION}` failed: "
                              f"{(r.stderr or r.stdout)[-600:]}")
        # move into place atomically: a concurrent reader sees no binary or a whole one
        staged = os.path.join(target, f".versitygw.{os.getpid()}")
        shutil.copy2(os.path.join(tmp, "bin", "versitygw"), staged)
        os.replace(staged, os.path.join(target, "versitygw"))
    return os.path.join(target, "versitygw")


class VersityProcess(S3TestServer):
    """versitygw's posix backend over ``root`` (a directory; each subdirectory is a bucket) on
    127.0.0.1 and a free port, in a subprocess; ``endpoint`` is its URL."""

    def __init__(self, root: str, port: int | None = None, exe: str | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.root = root
        self.extra_args = tuple(extra_args)  # global options, e.g. ("--virtual-domain", D)
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.exe = exe or binary()
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 30.0) -> "VersityProcess":
        if self.exe is None:
            raise Unavailable(f"versitygw {VERSION} is not built: run `python -m "
                              "flightsrv.testing.versity_server build` (needs Go; .ci/run does)")
        os.makedirs(self.root, exist_ok=True)
        # its log goes to a file beside the data, read back only when it fails to start
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [self.exe, "--port", f"127.0.0.1:{self.port}", "--access", ACCESS_KEY,
             "--secret", SECRET_KEY, "--region", "us-east-1", "--quiet", *self.extra_args,
             "posix", self.root],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("versitygw exited: " + self._tail())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"versitygw did not start on port {self.port}: {self._tail()}")

    def _tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"]:
        start = time.monotonic()
        try:
            path = build()
        except Unavailable as exc:
            print(f"versitygw: {exc}", file=sys.stderr)
            return 1
        print(f"{path} ({time.monotonic() - start:.0f} s)")
        return 0
    if argv[:1] == ["serve"] and len(argv) in (2, 3):
        proc = VersityProcess(argv[1], int(argv[2]) if len(argv) == 3 else None).start()
        print(proc.endpoint, flush=True)
        try:
            proc.proc.wait()
        except KeyboardInterrupt:
            proc.stop()
        return 0
    print("usage: python -m flightsrv.testing.versity_server build | serve DIR [PORT]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
