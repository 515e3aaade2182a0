"""Structured logs: one JSON object per line, and statement text fit for a log.

Contract:

- ``JsonFormatter``: ``{"ts", "level", "logger", "msg", ...fields}`` on one line;
  ``extra={"fields": {...}}`` or any other ``extra=`` keys add fields.
- ``configure_json_logging(level)`` sends the ``flightsrv`` loggers to stderr as JSON.
- ``StatementText(mode)``: how statement text appears in logs. ``full`` keeps it,
  ``redacted`` (the default) replaces every literal by ``?`` and drops comments (split by
  DuckDB's own tokenizer; text it refuses becomes ``<unparsed statement: N bytes>``), ``off``
  leaves it out. ``redact_message`` applies the same to an error message that quotes the
  statement.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import sys
import traceback

#: frames kept when flightsrv formats a traceback for its log or ``--debug``: an explicit
#: limit, which a running server's ``sys.tracebacklimit = 0`` does not shorten (status.py)
LOG_FRAMES = 10_000

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

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        # an explicit limit: a running server sets sys.tracebacklimit to 0 (see status.py)
        return "".join(traceback.format_exception(ei[0], ei[1], ei[2], limit=LOG_FRAMES)
                       ).rstrip("\n")


def configure_json_logging(level: int = logging.INFO, stream=None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("flightsrv")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return handler


#: token kinds of DuckDB's tokenizer whose text a redacted statement keeps; every other kind
#: (string and numeric constants, comments, anything a later DuckDB adds) is left out
_KEPT = frozenset({"keyword", "identifier", "operator"})


@functools.lru_cache(maxsize=2048)
def redact_sql(sql: str) -> str:
    """``sql`` on one line with every literal replaced by ``?`` and comments left out.

    The statement is split by DuckDB's own tokenizer (``duckdb.tokenize``, C++, so logging
    a 1,000-literal statement costs well under a millisecond): keywords, identifiers and
    operators keep their text, every constant becomes ``?``, comments are dropped. An
    identifier glued to a constant (``0x1F`` tokenizes as ``0`` and ``x1F``) is part of it;
    a constant right after ``$`` is a parameter number (``$1``) and is kept."""
    import duckdb

    try:
        tokens = duckdb.tokenize(sql)
    except Exception:  # noqa: BLE001 - say nothing of text the tokenizer refuses
        return f"<unparsed statement: {len(sql.encode())} bytes>"
    ends = [pos for pos, _ in tokens[1:]] + [len(sql)]
    out: list[str] = []
    prev_kind, prev_text, glued = None, "", False
    for (pos, kind), end in zip(tokens, ends):
        text = sql[pos:end]
        core = text.rstrip()
        kind = getattr(kind, "name", str(kind))
        if kind == "comment":
            if out and out[-1] != " ":
                out.append(" ")
            prev_kind, glued = kind, False
            continue
        if kind in _KEPT and not (kind == "identifier" and prev_kind == "numeric_const"
                                  and glued):
            piece = core
        elif kind == "numeric_const" and prev_kind == "operator" and prev_text == "$" \
                and glued:
            piece = core
        elif out and out[-1] == "?" and glued:
            piece = ""  # the rest of a constant already shown as ?
        else:
            piece = "?"
        if piece:
            out.append(piece)
        glued = core == text
        if not glued and out and out[-1] != " ":
            out.append(" ")
        prev_kind, prev_text = kind, core
    return "".join(out).strip()


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
