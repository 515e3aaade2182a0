"""``flightsrv store check``: the conditional-write contract run as a command, against moto
(serialized: safe), Versity Gateway (safe) and against moto behind a proxy that drops the
conditional headers (the store then ignores every precondition: unsafe, naming the missing
guarantees). Real HTTP on 127.0.0.1 throughout; the CLI runs in a subprocess.

The unsafe stand-in is always moto: moto does not verify signatures, so a request whose signed
If-Match header was dropped still goes through (Versity would answer 403)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest

from support import HttpForwarder
from tests.conftest import BUCKET

CMD = [sys.executable, "-m", "flightsrv.cli"]
STRIPPED = {"if-match", "if-none-match"}
RACE = ["--threads", "4", "--increments", "5"]


class _Proxy(HttpForwarder):
    """Forwards every request to ``upstream`` without its If-Match / If-None-Match headers
    (moto does not verify signatures, so the request still goes through)."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.stripped = 0

    def headers(self, headers):
        kept = {k: v for k, v in headers.items() if k.lower() not in STRIPPED}
        self.stripped += len(headers) - len(kept)
        return kept


def _run(env, *args, timeout=120):
    return subprocess.run([*CMD, "store", "check", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _leftovers(endpoint: str, prefix: str) -> list:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    keys = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    uploads = s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
    return keys + uploads


def test_each_test_server_is_safe(s3_server, subprocess_env):
    proc = _run(subprocess_env, f"s3://{BUCKET}/check-safe", "--json", *RACE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["safe"] is True and report["missing"] == []
    names = [c["name"] for c in report["checks"]]
    assert names == ["if-none-match", "if-match", "ranged-get", "multipart-copy",
                     "multipart-if-none-match", "list-paging", "cas-race"]
    race = report["checks"][-1]["figures"]
    assert race["increments"] == 20 and race["final"] == 20 and race["lost_updates"] == 0
    assert "[7/7] cas-race: ok" in proc.stderr  # progress
    assert _leftovers(s3_server.endpoint, "check-safe/") == []


@pytest.mark.s3
def test_a_store_that_ignores_preconditions_is_unsafe_and_named(moto_s3):
    with _Proxy(moto_s3.endpoint) as proxy:
        env = {**os.environ, **moto_s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
        proc = _run(env, f"s3://{BUCKET}/check-unsafe", *RACE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proxy.stripped > 0
    out = proc.stdout
    assert "verdict: UNSAFE" in out
    assert "conditional create (PutObject If-None-Match: *)" in out
    assert "compare-and-swap (PutObject If-Match)" in out
    failed = {ln.split()[1] for ln in out.splitlines() if ln.startswith("FAIL")}
    assert {"if-none-match", "if-match", "ranged-get", "multipart-if-none-match",
            "cas-race"} <= failed
    assert "multipart-copy" not in failed and "list-paging" not in failed
    assert _leftovers(moto_s3.endpoint, "check-unsafe/") == []


@pytest.mark.s3
def test_json_names_the_lost_updates(moto_s3):
    with _Proxy(moto_s3.endpoint) as proxy:
        env = {**os.environ, **moto_s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
        proc = _run(env, f"s3://{BUCKET}/check-json", "--json", "--quiet", *RACE)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["safe"] is False
    assert "atomic If-Match under concurrent writers (no lost updates)" in report["missing"]
    assert proc.stderr == ""


def test_a_missing_bucket_is_an_error_not_a_verdict(s3_server, subprocess_env):
    proc = _run(subprocess_env, "s3://no-such-bucket-here/x", "--quiet", *RACE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no such bucket" in proc.stderr and "verdict" not in proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_local_directory_is_safe(tmp_path):
    env = dict(os.environ)
    proc = _run(env, str(tmp_path / "wh"), "--quiet", *RACE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: SAFE" in proc.stdout
    # checking a directory leaves nothing behind: it does not become a warehouse
    assert not (tmp_path / "wh").exists()
    assert _run(env, str(tmp_path / "nest" / "a" / "b"), "--quiet", *RACE).returncode == 0
    assert not (tmp_path / "nest").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    assert _run(env, str(tmp_path / "mine"), "--quiet", *RACE).returncode == 0
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args", [["ftp://x/y"], ["s3:///nobucket"], ["--threads", "0", "x"]])
def test_usage_errors_exit_2(tmp_path, args):
    proc = _run(dict(os.environ), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("flightsrv: error:")
