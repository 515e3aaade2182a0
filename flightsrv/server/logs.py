"""Structured logs: one JSON object per line, and statement text fit for a log.

Contract:

- ``JsonFormatter``: ``{"ts", "level", "logger", "msg", ...fields}`` on one line;
  ``extra={"fields": {...}}`` or any other ``extra=`` keys add fields.
- ``configure_json_logging(level)`` sends the ``flightsrv`` loggers to stderr as JSON.
- ``StatementText(mode)``: how statement text appears in logs. ``full`` keeps it,
  ``redacted`` (the default) replaces every literal by ``?`` (parsed with sqlglot's DuckDB
  dialect; text that does not parse becomes ``<unparsed statement: N bytes>``), ``off``
  leaves it out. ``redact_message`` applies the same to an error message that quotes the
  statement.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import sys

RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "fields", "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if v is not None})
        for k, v in record.__dict__.items():  # plain ``extra={...}`` (e.g. the commit log)
            if k not in RECORD_ATTRS and k not in out and v is not None:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_json_logging(level: int = logging.INFO, stream=None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("flightsrv")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return handler


@functools.lru_cache(maxsize=2048)
def redact_sql(sql: str) -> str:
    """``sql`` with every literal replaced by ``?`` (one line)."""
    import sqlglot
    from sqlglot import exp

    try:
        trees = sqlglot.parse(sql, read="duckdb")
    except Exception:  # noqa: BLE001 - any parse failure: say nothing of the text
        return f"<unparsed statement: {len(sql.encode())} bytes>"

    def blank(node):
        if isinstance(node, exp.Literal):
            return exp.Placeholder()
        return node

    out = []
    for tree in trees:
        if tree is None:
            continue
        try:
            out.append(tree.transform(blank).sql(dialect="duckdb"))
        except Exception:  # noqa: BLE001
            return f"<unparsed statement: {len(sql.encode())} bytes>"
    return "; ".join(out)


class StatementText:
    def __init__(self, mode: str = "redacted"):
        self.mode = mode

    def __call__(self, sql: str | None) -> str | None:
        if sql is None or self.mode == "off":
            return None
        if self.mode == "full":
            return " ".join(sql.split())
        return redact_sql(sql)

    def redact_message(self, message: str, sql: str | None) -> str:
        """``message`` with the statement it quotes (whole or shortened) redacted."""
        if not sql or self.mode == "full":
            return message
        shown = self(sql) or "<statement>"
        one_line = " ".join(sql.split())
        variants = {sql, one_line}
        for limit in (200,):  # the engine's and the server's shortened forms
            cut = one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."
            variants |= {cut, repr(cut)}
        for variant in sorted(variants, key=len, reverse=True):
            if variant and variant in message:
                message = message.replace(variant, repr(shown) if variant.startswith(
                    ("'", '"')) else shown)
        return message
