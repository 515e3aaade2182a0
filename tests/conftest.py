"""Shared fixtures: real stores only.

- ``moto_s3``: one moto S3 server per test session on 127.0.0.1 (subprocess, HTTP), with
  requests serialized so conditional writes are atomic as on real S3.
- ``local_uri`` / ``s3_uri``: a fresh warehouse location per test.
- ``warehouse_uri``: parametrized over both backends.
- ``spark``: one real local[2] SparkSession for the whole run, shared by every Spark test
  file (start-up costs 12-17 s). It depends on ``moto_s3`` so the AWS_* variables are in the
  environment before the JVM starts and every Spark Python worker inherits them.
"""

from __future__ import annotations

import os
import uuid

import pytest

from flightsrv.testing.moto_server import MotoProcess

BUCKET = "flightsrv-test"


@pytest.fixture(scope="session")
def moto_s3():
    server = MotoProcess().start()
    server.apply_env()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture
def s3_uri(moto_s3, request):
    name = request.node.name.split("[")[0][:40].replace("_", "-")
    return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_uri_factory(moto_s3, request):
    """A function returning a fresh S3 warehouse location per call (for hypothesis tests,
    whose examples share one function-scoped fixture)."""
    name = request.node.name.split("[")[0][:32].replace("_", "-")

    def make() -> str:
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def local_uri(tmp_path):
    return str(tmp_path / "warehouse")


@pytest.fixture(params=["local", "s3"])
def warehouse_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "warehouse")
    return request.getfixturevalue("s3_uri")


@pytest.fixture
def subprocess_env(moto_s3):
    """Environment for child processes that talk to the same moto server."""
    env = dict(os.environ)
    env.update(moto_s3.env())
    return env


def pytest_collection_modifyitems(config, items):
    """``slow`` tests (large hypothesis runs) run only when asked for: ``-m slow`` or
    ``FLIGHTSRV_SLOW=1``; the default run stays a few minutes. The Spark files go first, so the
    one worker that runs them (see ``pytest_xdist_make_scheduler``) starts the longest queue
    at once."""
    items.sort(key=lambda item: not _is_spark_file(item.nodeid))
    if "slow" in (config.getoption("-m") or "") or os.environ.get("FLIGHTSRV_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or FLIGHTSRV_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _is_spark_file(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].startswith("test_spark")


def pytest_xdist_make_scheduler(config, log):
    """How ``-n N`` (pyproject.toml) shares the tests out. A test file that defines a fixture
    of module, class or session scope (a server, the JDBC build, the DuckDB 1.5.5 venv) is one
    unit of work, so that fixture is made once; every ``test_spark*.py`` file is one unit with
    the others, so one worker starts the one SparkSession (12-17 s and a JVM); every other
    test is a unit of its own, so the long CLI files spread over all workers.
    (pytest-xdist's own ``loadgroup`` marks are lost under pytest 9, which no longer reads
    the ``_nodeid`` xdist rewrites.)"""
    import re
    from pathlib import Path

    from xdist.scheduler import LoadScopeScheduling

    shared = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](module|class|session)")
    root = Path(str(config.rootpath))
    whole: dict[str, bool] = {}

    def keep_together(path: str) -> bool:
        if path not in whole:
            try:
                whole[path] = bool(shared.search((root / path).read_text()))
            except OSError:
                whole[path] = True
        return whole[path]

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if _is_spark_file(nodeid):
                return "spark"
            return path if keep_together(path) else nodeid

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def spark(moto_s3):
    pytest.importorskip("pyspark")
    import flightsrv.spark as fs

    s = fs.session("local[2]", "flightsrv-tests", conf={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    yield s
    s.stop()
