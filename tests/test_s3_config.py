"""The S3 options users set (docs/S3.md, "Configuration"): endpoint, region, credentials,
addressing style, timeouts and retries, each with one clear error when it is wrong. Real
servers on 127.0.0.1: moto / Versity Gateway (``s3_server``), a dedicated Versity Gateway for
virtual-hosted addressing (it checks signatures and routes by Host), a forwarding proxy that
answers 503 SlowDown first (retries), and a socket that never answers (timeouts)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

from flightsrv import Warehouse
from flightsrv.errors import ConfigurationError, PermissionDenied, PreconditionFailed, StoreError
from flightsrv.store import PutMode, open_store
from flightsrv.store.s3 import client_config
from support import HttpForwarder
from tests.conftest import BUCKET

AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
            "AWS_PROFILE", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "FLIGHTSRV_S3_ADDRESSING_STYLE",
            "FLIGHTSRV_S3_CONNECT_TIMEOUT", "FLIGHTSRV_S3_READ_TIMEOUT")


class _Forward(HttpForwarder):
    """An HTTP forwarder to ``upstream`` that also serves as an HTTP proxy (absolute-URI
    requests keep their Host header, so a virtual-hosted request reaches the server as sent).
    The first ``fail_first`` requests are answered 503 SlowDown instead."""

    def __init__(self, upstream: str, fail_first: int = 0):
        super().__init__(upstream)
        self.seen: list[tuple[str, str, str]] = []  # (method, Host, path)
        self.fail_first = fail_first

    def answer(self, method, host, path):
        self.seen.append((method, host, path))
        if len(self.seen) <= self.fail_first:
            return (503, [("Content-Type", "application/xml")],
                    b"<Error><Code>SlowDown</Code><Message>Please reduce your request "
                    b"rate.</Message></Error>")
        return None


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No AWS setting of the machine leaks in: no profile files, no proxies."""
    for name in AWS_VARS + ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


# -- settings: what is read, from where, in which order --------------------------------------


def test_defaults_env_and_profile_in_that_order():
    base = client_config("s3://b/p", {}, {})
    assert base == {"endpoint": None, "region": "us-east-1", "retry_mode": "standard",
                    "max_attempts": 5, "addressing_style": "auto", "connect_timeout": 60.0,
                    "read_timeout": 60.0}
    profile = {"region": "eu-west-2", "retry_mode": "adaptive", "max_attempts": "3",
               "s3": {"addressing_style": "path"}}
    from_profile = client_config("s3://b/p", {}, profile)
    assert (from_profile["region"], from_profile["retry_mode"], from_profile["max_attempts"],
            from_profile["addressing_style"]) == ("eu-west-2", "adaptive", 3, "path")
    env = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "https://s3.example:9000",
           "AWS_DEFAULT_REGION": "ap-south-1", "AWS_RETRY_MODE": "legacy",
           "AWS_MAX_ATTEMPTS": "9", "FLIGHTSRV_S3_ADDRESSING_STYLE": "virtual",
           "FLIGHTSRV_S3_CONNECT_TIMEOUT": "2.5", "FLIGHTSRV_S3_READ_TIMEOUT": "7"}
    c = client_config("s3://b/p", env, profile)
    assert c == {"endpoint": "https://s3.example:9000", "region": "ap-south-1",
                 "retry_mode": "legacy", "max_attempts": 9, "addressing_style": "virtual",
                 "connect_timeout": 2.5, "read_timeout": 7.0}
    assert client_config("s3://b/p", dict(env, AWS_REGION="us-west-2"), {})["region"] == \
        "us-west-2"


def test_the_store_client_carries_the_settings(clean_env, tmp_path):
    (tmp_path / "aws-config").write_text(
        "[profile lake]\nregion = eu-central-1\nmax_attempts = 4\n"
        "s3 =\n    addressing_style = path\n")
    clean_env.setenv("AWS_PROFILE", "lake")
    clean_env.setenv("AWS_ACCESS_KEY_ID", "k")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "s")
    clean_env.setenv("FLIGHTSRV_S3_READ_TIMEOUT", "12")
    client = open_store("s3://bucket/wh").client
    assert client.meta.region_name == "eu-central-1"
    assert client.meta.config.s3["addressing_style"] == "path"
    assert client.meta.config.retries["total_max_attempts"] == 4
    assert client.meta.config.retries["mode"] == "standard"
    assert (client.meta.config.read_timeout, client.meta.config.connect_timeout) == (12.0, 60.0)


def _arrow_options(store) -> dict:
    fs, _ = store.arrow_filesystem()
    return fs.__reduce__()[1][0]  # pyarrow's own record of the options it was built with


def test_data_file_reads_follow_the_addressing_style(clean_env):
    clean_env.setenv("AWS_ENDPOINT_URL", "http://s3.test:9000")
    clean_env.setenv("AWS_ACCESS_KEY_ID", "k")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "s")
    clean_env.setenv("FLIGHTSRV_S3_READ_TIMEOUT", "12")
    assert _arrow_options(open_store("s3://bucket/wh"))["force_virtual_addressing"] is False
    clean_env.setenv("FLIGHTSRV_S3_ADDRESSING_STYLE", "virtual")
    opts = _arrow_options(open_store("s3://bucket/wh"))
    assert opts["force_virtual_addressing"] is True
    assert (opts["endpoint_override"], opts["request_timeout"]) == ("s3.test:9000", 12.0)


@pytest.mark.parametrize("name,value,says", [
    ("AWS_ENDPOINT_URL", "localhost:9000", "AWS_ENDPOINT_URL must be an http:// or https:// URL"),
    ("AWS_ENDPOINT_URL_S3", "ftp://host", "AWS_ENDPOINT_URL_S3 must be an http:// or https://"),
    ("AWS_REGION", "us east 1", "cannot configure the S3 client"),
    ("AWS_MAX_ATTEMPTS", "zero", "AWS_MAX_ATTEMPTS must be a positive integer, not 'zero'"),
    ("AWS_MAX_ATTEMPTS", "0", "AWS_MAX_ATTEMPTS must be a positive integer"),
    ("AWS_RETRY_MODE", "eager", "AWS_RETRY_MODE must be one of legacy, standard, adaptive"),
    ("FLIGHTSRV_S3_ADDRESSING_STYLE", "host", "FLIGHTSRV_S3_ADDRESSING_STYLE must be one of"),
    ("FLIGHTSRV_S3_READ_TIMEOUT", "-1", "FLIGHTSRV_S3_READ_TIMEOUT must be a positive number"),
    ("FLIGHTSRV_S3_CONNECT_TIMEOUT", "soon", "FLIGHTSRV_S3_CONNECT_TIMEOUT must be a positive"),
    ("AWS_PROFILE", "nowhere", "The config profile (nowhere) could not be found"),
])
def test_each_misconfiguration_is_one_named_error(clean_env, name, value, says):
    clean_env.setenv(name, value)
    with pytest.raises(ConfigurationError) as err:
        open_store("s3://bucket/wh")
    assert says in str(err.value) and "store=s3://bucket/wh" in str(err.value)


def test_the_cli_says_it_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in AWS_VARS}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               FLIGHTSRV_S3_READ_TIMEOUT="later")
    proc = subprocess.run([sys.executable, "-m", "flightsrv.cli", "--warehouse", "s3://b/wh",
                           "table", "list"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FLIGHTSRV_S3_READ_TIMEOUT must be a positive number, not 'later'" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- against real servers ----------------------------------------------------------------------


def test_path_style_reaches_the_server(s3_server, monkeypatch, request):
    monkeypatch.setenv("FLIGHTSRV_S3_ADDRESSING_STYLE", "path")
    with _Forward(s3_server.endpoint) as fwd:
        monkeypatch.setenv("AWS_ENDPOINT_URL", fwd.endpoint)
        store = open_store(f"s3://{BUCKET}/path-style-{request.node.name[-12:]}")
        store.put("k", b"one", mode=PutMode.CREATE)
        with pytest.raises(PreconditionFailed):
            store.put("k", b"two", mode=PutMode.CREATE)
        assert store.get("k")[0] == b"one"
    host = urlsplit(fwd.endpoint).netloc
    assert fwd.seen and all(h == host and p.startswith(f"/{BUCKET}") for _, h, p in fwd.seen)


@pytest.fixture
def versity_virtual(tmp_path):
    """A Versity Gateway that routes ``BUCKET.s3.test`` to BUCKET (``--virtual-domain``)."""
    from flightsrv.testing import versity_server as vs

    if vs.binary() is None:
        pytest.skip(f"Versity Gateway {vs.VERSION} is not built here: run `python -m "
                    "flightsrv.testing.versity_server build` (needs Go; .ci/run does it)")
    server = vs.VersityProcess(str(tmp_path / "vgw"),
                               extra_args=("--virtual-domain", "s3.test")).start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.mark.s3
@pytest.mark.versity
@pytest.mark.parametrize("style", ["virtual", "path"])
def test_virtual_hosted_and_path_style_on_a_virtual_host_gateway(versity_virtual, clean_env,
                                                                  style):
    """``s3.test`` resolves nowhere, so the requests go through an HTTP proxy (``HTTP_PROXY``,
    which boto3 honours) that keeps their Host header: Versity routes virtual-hosted requests
    by Host and checks every signature, so only a correctly addressed request succeeds."""
    for k, v in versity_virtual.env().items():
        clean_env.setenv(k, v)
    endpoint = f"http://s3.test:{versity_virtual.port}"
    clean_env.setenv("AWS_ENDPOINT_URL", endpoint)
    clean_env.setenv("FLIGHTSRV_S3_ADDRESSING_STYLE", style)
    with _Forward(versity_virtual.endpoint) as proxy:
        clean_env.setenv("HTTP_PROXY", proxy.endpoint)
        store = open_store(f"s3://{BUCKET}/wh")
        first = store.put("k", b"one", mode=PutMode.CREATE)
        with pytest.raises(PreconditionFailed):
            store.put("k", b"two", mode=PutMode.IF_MATCH, etag='"0000"')
        store.put("k", b"two", mode=PutMode.IF_MATCH, etag=first.etag)
        assert [m.key for m in store.list()] == ["k"] and store.get("k")[0] == b"two"
    if style == "virtual":
        want_host, want_path = f"{BUCKET}.s3.test:{versity_virtual.port}", "/wh/k"
    else:
        want_host, want_path = f"s3.test:{versity_virtual.port}", f"/{BUCKET}/wh/k"
    assert {h for _, h, _ in proxy.seen} == {want_host}
    assert any(p.startswith(want_path) for m, _, p in proxy.seen if m == "PUT")


def test_throttling_is_retried_with_backoff(s3_server, monkeypatch, request):
    name = f"retry-{request.node.name[-12:]}"
    with _Forward(s3_server.endpoint, fail_first=2) as fwd:
        monkeypatch.setenv("AWS_ENDPOINT_URL", fwd.endpoint)
        store = open_store(f"s3://{BUCKET}/{name}")
        started = time.monotonic()
        store.put("k", b"x", mode=PutMode.CREATE)  # 503, 503, then through
        assert time.monotonic() - started > 0.01  # it waited before retrying
        assert [m for m, _, _ in fwd.seen] == ["PUT", "PUT", "PUT"]
        fwd.seen.clear()
        fwd.fail_first = 3
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
        with pytest.raises(StoreError, match="SlowDown"):
            open_store(f"s3://{BUCKET}/{name}").get("k")
        assert len(fwd.seen) == 2


def test_an_endpoint_that_never_answers_times_out_clearly(clean_env):
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        clean_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        clean_env.setenv("AWS_ACCESS_KEY_ID", "k")
        clean_env.setenv("AWS_SECRET_ACCESS_KEY", "s")
        clean_env.setenv("FLIGHTSRV_S3_READ_TIMEOUT", "0.3")
        clean_env.setenv("AWS_MAX_ATTEMPTS", "2")
        started = time.monotonic()
        with pytest.raises(StoreError) as err:
            open_store("s3://bucket/wh").get("k")
        assert time.monotonic() - started < 30
    assert "the S3 endpoint did not answer within 0.3 s, 2 attempts" in str(err.value)
    assert "FLIGHTSRV_S3_READ_TIMEOUT" in str(err.value)


@pytest.mark.s3
@pytest.mark.versity
@pytest.mark.parametrize("access,secret,code", [
    ("testing", "wrong-secret", "SignatureDoesNotMatch"),
    ("nobody", "testing", "XAdminUserNotFound"),
])
def test_wrong_credentials_on_a_verifying_store_are_refused(versity_s3, clean_env, access,
                                                            secret, code):
    """moto accepts any key; Versity checks them. Its answer to an unknown access key is a
    404 (XAdminUserNotFound), which must not read as "no such object" (no warehouse)."""
    for k, v in versity_s3.env().items():
        clean_env.setenv(k, v)
    clean_env.setenv("AWS_ACCESS_KEY_ID", access)
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(PermissionDenied, match=f"the store refused the request \\({code}\\)"):
        Warehouse.open(f"s3://{BUCKET}/creds").list_tables()
