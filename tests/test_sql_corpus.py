"""Run every ``sql/*.test`` corpus file in process (DuckEngine) against plain DuckDB.

The server tests run the same files through a Flight SQL client with
``flightsrv.testing.corpus.DbapiExecutor``.
"""

from __future__ import annotations

import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.testing import corpus

FILES = corpus.corpus_files()


def test_corpus_present():
    assert len(FILES) >= 4


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_file(path, tmp_path):
    engine = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    try:
        report = corpus.run(corpus.parse_file(path), corpus.EngineExecutor(engine),
                            corpus.DuckReference())
    finally:
        engine.close()
    assert report.ok, report.summary()


def test_format_parsing():
    recs = corpus.parse_text(
        "# c\nstatement ok\nSELECT 1\n\nstatement count 3 noref\nDELETE FROM t\n\n"
        "statement error nope\nCOPY t TO 'x'\n\nquery IT rowsort\nSELECT 1,\n 'a'\n----\n1\ta\n")
    assert [(r.kind, r.expect) for r in recs] == [
        ("statement", "ok"), ("statement", "count"), ("statement", "error"), ("query", "ok")]
    assert recs[1].count == 3 and not recs[1].reference
    assert recs[2].error == "nope" and not recs[2].reference
    assert recs[3].types == "IT" and recs[3].sort == "rowsort"
    assert recs[3].expected == [["1", "a"]] and recs[3].sql == "SELECT 1,\n 'a'"
    with pytest.raises(corpus.CorpusFormatError):
        corpus.parse_text("query XY\nSELECT 1\n")
    with pytest.raises(corpus.CorpusFormatError):
        corpus.parse_text("query I noref\nSELECT 1\n")


def test_runner_reports_differences(tmp_path):
    engine = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    recs = corpus.parse_text("query I\nSELECT 2\n----\n1\n\nstatement error\nSELECT 1\n")
    report = corpus.run(recs, corpus.EngineExecutor(engine), corpus.DuckReference())
    assert len(report.failures) == 2
    assert "differs" in str(report.failures[0]) and "expected" in str(report.failures[1])


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_through_flight_sql(path, tmp_path):
    """The same files through the ADBC Flight SQL driver and the real server."""
    import warnings

    dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi")
    from flightsrv.server.app import start_in_thread

    engine = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    server, port = start_in_thread(engine)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(f"grpc://127.0.0.1:{port}")
        try:
            report = corpus.run(corpus.parse_file(path), corpus.DbapiExecutor(conn),
                                corpus.DuckReference())
        finally:
            conn.close()
    finally:
        server.shutdown()
        engine.close()
    assert report.ok, report.summary()
