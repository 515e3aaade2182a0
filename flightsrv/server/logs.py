"""Structured logs: one JSON object per line, and statement text fit for a log.

Contract:

- ``JsonFormatter``: ``{"ts", "level", "logger", "msg", ...fields}`` on one line;
  ``extra={"fields": {...}}`` or any other ``extra=`` keys add fields.
- ``configure_json_logging(level)`` sends the ``flightsrv`` loggers to stderr as JSON.
- ``StatementText(mode)``: how statement text appears in logs. ``full`` keeps it,
  ``redacted`` (the default) replaces every literal by ``?`` and drops comments (split by
  DuckDB's own tokenizer; text it refuses becomes ``<unparsed statement: N bytes>``), ``off``
  leaves it out.
- ``StatementText.error_text(error, shown, sql, params)``: a failed call's error for the
  log. ``redacted`` and ``off`` never log a message DuckDB, Arrow or Python wrote (DuckDB
  quotes row values in them, unquoted too: ``Invalid Input Error: <value>``): such an error
  is logged as its classes, DuckDB's error kind and the redacted statement; only
  flightsrv's own messages go through ``redact_message``. A logged error is one line: the
  lines after it (an error's ``detail``: DuckDB's hints and its ``LINE n:`` quoting the
  statement) are never logged, whatever the mode.
- ``StatementText.redact_message(message, sql, params)``: an error message fit for the log.
  ``full`` keeps it. ``redacted`` and ``off`` show the statement the message quotes as the
  log shows it (``off``: ``<statement>``) and replace by ``?``: every value of the
  statement's literals and of its bound parameters (``params``), wherever the message
  has it, every single-quoted string (DuckDB quotes the values it cannot convert, also
  those it read from a table), the number in DuckDB's "with value N", every other number
  that stands on its own (overflow operands, dates out of range; a parser error's ``LINE n:``
  and ``DECIMAL(p,s)`` stay) and every double-quoted text that is not a name the statement
  spells as an identifier (DuckDB double-quotes values it cannot parse, as in ``invalid
  date field format: "..."``). The client's own error is not touched: it sent the values.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import re
import sys
import threading
import traceback
from collections import OrderedDict

from flightsrv.runtime import text_cache

#: frames kept when flightsrv formats a traceback for its log or ``--debug``: an explicit
#: limit, which a running server's ``sys.tracebacklimit = 0`` does not shorten (status.py)
LOG_FRAMES = 10_000

RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "fields", "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line. ``static``: fields every line carries (a worker of
    ``serve --workers N`` adds ``{"worker": index}``)."""

    def __init__(self, static: dict | None = None):
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self.static,
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


def configure_json_logging(level: int = logging.INFO, stream=None,
                           static: dict | None = None) -> logging.Handler:
    # what JsonFormatter never writes is not gathered either (the logging HOWTO's
    # "Optimization"): the caller's frame, thread, process and process name of each record;
    # a server logs a few lines per statement (49 -> 32 us of CPU per line, measured)
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(static))
    root = logging.getLogger("flightsrv")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return handler


def _statement_cache(maxsize: int):
    """A cache of a function of one statement's text: :func:`~flightsrv.runtime.text_cache`
    (bounded by entries and by text; it keeps no text over 64 KiB), plus the latest result
    for the latest few longer texts (so the several log lines of one large statement, or of
    a few running at once, compute it once, and memory holds at most ``_LARGE_KEPT`` such
    statements: each at most ``max_statement_bytes``)."""

    def decorate(fn):
        cached = text_cache(maxsize=maxsize, max_key_chars=_LARGE)(fn)
        large: OrderedDict = OrderedDict()  # the latest _LARGE_KEPT long texts
        lock = threading.Lock()

        @functools.wraps(fn)
        def call(sql: str):
            if len(sql) <= _LARGE:
                return cached(sql)
            with lock:
                if sql in large:
                    large.move_to_end(sql)
                    return large[sql]
            value = fn(sql)
            with lock:
                large[sql] = value
                while len(large) > _LARGE_KEPT:
                    large.popitem(last=False)
            return value

        def cache_clear() -> None:
            cached.cache_clear()
            with lock:
                large.clear()

        call.cache_clear = cache_clear
        call.cache_chars = cached.cache_chars
        return call

    return decorate


_LARGE = 64 << 10  # statements longer than this are not kept by the caches below
_LARGE_KEPT = 4  # ... except the latest few

#: token kinds of DuckDB's tokenizer whose text a redacted statement keeps; every other kind
#: (string and numeric constants, comments, anything a later DuckDB adds) is left out
_KEPT = frozenset({"keyword", "identifier", "operator"})


@_statement_cache(2048)
def redact_sql(sql: str) -> str:
    """``sql`` on one line with every literal replaced by ``?`` and comments left out.

    The statement is split by DuckDB's own tokenizer (``duckdb.tokenize``, C++, so logging
    a 1,000-literal statement costs well under a millisecond): keywords, identifiers and
    operators keep their text, every constant becomes ``?``, comments are dropped. An
    identifier glued to a constant (``0x1F`` tokenizes as ``0`` and ``x1F``) is part of it;
    a constant right after ``$`` is a parameter number (``$1``) and is kept.

    An ``INSERT ... VALUES`` of rows of constants only (what the engine's fast path reads
    by one regular expression per row, :func:`flightsrv.sql.values.constant_rows_span`)
    gives the same line without tokenizing its rows (:func:`_redact_constant_rows`: a
    10,000-row list's 200,000 tokens took ~0.1-0.2 s of CPU)."""
    fast = _redact_constant_rows(sql)
    if fast is not None:
        return fast
    return _redact_tokens(sql)


def _redact_tokens(sql: str) -> str:
    """:func:`redact_sql` by DuckDB's tokenizer (every statement but a list of constant
    rows)."""
    tokens = _duck_tokens(sql)
    if tokens is None:  # say nothing of text the tokenizer refuses
        return f"<unparsed statement: {len(sql.encode())} bytes>"
    out: list[str] = []
    prev_kind, prev_text, glued = None, "", False
    for kind, text in tokens:
        core = text.rstrip()
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


#: a string of a row of constants, and a number there (once its strings are ``?``: what
#: is left between the numbers is brackets, commas, signs and words without digits)
_ROW_STRING = re.compile(r"'[^']*(?:''[^']*)*'")
_ROW_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_SPACE_RUN = re.compile(r"\s+", re.ASCII)


def _redact_constant_rows(sql: str) -> str | None:
    """:func:`redact_sql` of an ``INSERT ... VALUES`` whose rows hold constants only, or
    None for any other text. Between its constants such a list holds only ``(``, ``)``,
    ``,`` and whitespace, which DuckDB's tokenizer splits as single operators: the line is
    the head's redaction, then the rows with each string and each number made ``?`` (a
    sign, a type word, NULL/TRUE/FALSE kept: the tokenizer's keywords and operators) and
    each run of whitespace one space (the tokenizer's reading; a test compares the two on
    generated lists)."""
    if "\f" in sql or "\v" in sql:
        return None
    from flightsrv.sql.values import constant_rows_span

    span = constant_rows_span(sql)
    if span is None:
        return None
    start, end = span
    head = sql[:start]
    out = [_redact_tokens(head)]
    if head[-1:].isspace():
        out.append(" ")
    rows = _ROW_NUMBER.sub("?", _ROW_STRING.sub("?", sql[start:end]))
    out.append(_SPACE_RUN.sub(" ", rows))
    tail = sql[end:]
    if ";" in tail:
        out.append(" ;" if tail[:1].isspace() else ";")
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

    def error_text(self, error: BaseException, text: str, sql: str | None,
                   params: object | None = None) -> str:
        """The log's text for a failed call: ``error`` is what was raised, ``text`` the error
        as the client got it. ``full`` logs ``text``. ``redacted`` and ``off`` log only
        text flightsrv wrote itself, never a message of DuckDB, Arrow or Python, whatever
        it quotes: an error whose message is flightsrv's own goes through
        :meth:`redact_message`; any other (a SqlError carrying DuckDB's message, a raw
        DuckDB or Arrow error, an unexpected exception) is logged as its class, DuckDB's
        error kind (``Conversion Error``, from a fixed list) and the redacted statement."""
        # one line: the lines after it are DuckDB's hints and its LINE/caret, which quote
        # the statement's text (the log has the statement on its own, redacted unless
        # ``full``)
        text = text.partition("\n")[0]
        if self.mode == "full":
            return text
        if _own_text(error):
            return self.redact_message(text, sql, params)
        kind = _engine_kind(getattr(error, "message", None) or str(error))
        head = type(error).__name__ + (f": {kind}" if kind else "")
        context = {k: v for k, v in (getattr(error, "context", None) or {}).items()
                   if k != "statement" and v is not None}
        if sql:
            context = {"statement": repr(self(sql) or "<statement>"), **context}
        tail = " ".join(f"{k}={v}" for k, v in context.items())
        return f"{head}: <message not logged>" + (f" ({tail})" if tail else "")

    def redact_message(self, message: str, sql: str | None,
                       params: object | None = None) -> str:
        """``message`` fit for the log (see the module docstring). ``params``: the bound
        parameter values (a ``pyarrow.RecordBatch``), if any."""
        if self.mode == "full":
            return message
        quoted: list[str] = []  # the statement as the log shows it, kept out of the rest

        def hold(text: str) -> str:
            quoted.append(text)
            return f"\x00{chr(0xE000 + len(quoted) - 1)}\x00"

        if sql:
            shown = self(sql) or "<statement>"
            one_line = " ".join(sql.split())
            variants = {sql, one_line}
            for limit in (200,):  # the engine's and the server's shortened forms
                cut = one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."
                variants |= {cut, repr(cut)}
            for variant in sorted(variants, key=len, reverse=True):
                if variant and variant in message:
                    message = message.replace(variant, hold(repr(shown) if variant.startswith(
                        ("'", '"')) else shown))
        values = set(literal_values(sql) if sql else ()) | set(parameter_values(params))
        values |= {line for v in values for line in v.splitlines()}  # messages may cut
        for value in sorted((v for v in values if v.strip()), key=len, reverse=True):
            message = _value_pattern(value).sub("?", message)
        message = _QUOTED.sub("?", message)
        message = _WITH_VALUE.sub(r"\1?", message)
        names = identifier_names(sql) if sql else frozenset()
        message = _DOUBLE_QUOTED.sub(
            lambda m: m.group(0) if m.group(1).lower() in names else "?", message)
        message = _KEPT_NUMBERS.sub(lambda m: hold(m.group(0)), message)
        message = _NUMBER.sub("?", message)
        return _HELD.sub(lambda m: quoted[ord(m.group(1)) - 0xE000], message)


#: DuckDB's error kinds, as its messages begin (``Conversion Error: ...``): the only part of
#: a DuckDB message a redacted log keeps
DUCKDB_ERROR_KINDS = frozenset({
    "Binder", "Catalog", "Connection", "Constraint", "Conversion", "Decimal", "Dependency",
    "Divide by Zero", "Executor", "Expression", "FATAL", "HTTP", "INTERNAL", "INTERRUPT",
    "IO", "Index", "Invalid", "Invalid Input", "Invalid Configuration", "Invalid type",
    "Mismatch Type", "Missing Extension", "Not implemented", "Object Size", "Optimizer",
    "Out of Memory", "Out of Range", "Parameter Not Allowed", "Parameter Not Resolved",
    "Parser", "Permission", "Planner", "Scheduler", "Sequence", "Serialization", "Settings",
    "Stat", "Syntax", "TransactionContext", "Unknown Type"})
_KIND = re.compile(r"(?:syntax error: |cannot tokenize: )?([A-Za-z][A-Za-z ]{0,30}?) Error:")


def _engine_kind(message: str) -> str | None:
    m = _KIND.match(message or "")
    return f"{m.group(1)} Error" if m and m.group(1) in DUCKDB_ERROR_KINDS else None


def _own_text(error: BaseException) -> bool:
    """Whether ``error``'s message is text flightsrv wrote (its own errors, and the Flight
    statuses its handlers raise), not DuckDB's, Arrow's or Python's."""
    from pyarrow import flight

    if getattr(error, "engine_text", False):
        return False
    if isinstance(error, flight.FlightError):
        return True
    return type(error).__module__.split(".")[0] == "flightsrv"


#: a single-quoted string in a message: the quote follows no letter or digit (``can't`` is
#: no string) and the closing one is followed by none (``'O'Brien'`` is one string)
_QUOTED = re.compile(r"(?<![\w'])'.*?'(?![\w'])", re.S)
#: DuckDB's "Type INT64 with value 98765 can't be cast ..." (the value may come from a table)
_WITH_VALUE = re.compile(r"(\bwith value )[-+]?[\w.]+")
_HELD = re.compile("\x00([\ue000-\uf8ff])\x00")
#: a double-quoted text: DuckDB quotes names so, and also values it cannot read (``invalid
#: date field format: "alice@x.org"``, ``Malformed JSON ... Input: "..."``); one is kept
#: only when the statement names it as an identifier
_DOUBLE_QUOTED = re.compile(r'"((?:[^"]|"")*)"')
#: a number standing on its own (not inside a name such as ``INT32``): DuckDB shows the
#: values it could not compute with unquoted (``Overflow in multiplication of INT64
#: (987654321 * 1000)``, ``Date out of range: 10002019-2-3``, ``Interval value 5 years``)
_NUMBER = re.compile(r"(?<![\w.$])[-+]?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?(?![\w])")
#: numbers that are not values: the line of a parser error, a decimal type's width/scale,
#: and the table versions, sizes and counts flightsrv's own errors name (``version=3``)
_KEPT_NUMBERS = re.compile(
    r"\bLINE [0-9]+:|\b(?:DECIMAL|NUMERIC)\([0-9]+,\s*[0-9]+\)|\bversions? [0-9]+\b|"
    r"\b(?:version|versions|head|size|minimum|maximum|declared|actual|rows|row_group|"
    r"row_groups|files|limit|bytes|attempts|offset|length|retry_after_s)=[0-9]+\b")
#: bound values looked at for one message: a bulk insert's batch can be large
MAX_PARAMETER_VALUES = 10_000


def _value_pattern(value: str) -> re.Pattern:
    """``value`` where it stands on its own: not inside a longer word or number."""
    head = r"(?<![\w.])" if value[0].isalnum() or value[0] == "_" else ""
    tail = r"(?![\w])" if value[-1].isalnum() or value[-1] == "_" else ""
    return re.compile(head + re.escape(value) + tail)


def _duck_tokens(sql: str) -> tuple[tuple[str, str], ...] | None:
    """(kind name, text with its trailing space) of each token DuckDB's own tokenizer
    (``duckdb.tokenize``, C++) finds in ``sql``; None for text it refuses. Shared by the
    statement's redaction and the message's, which look at the same statement."""
    return _tokens_of(sql)


@_statement_cache(512)
def _tokens_of(sql: str) -> tuple[tuple[str, str], ...] | None:
    import duckdb

    try:
        tokens = duckdb.tokenize(sql)
    except Exception:  # noqa: BLE001 - the callers say what refused text means
        return None
    # the tokenizer's offsets count UTF-8 bytes: past a character beyond ASCII they are
    # not the text's indexes (slicing the str there shifted every later token, and a
    # constant's text showed as a keyword's)
    data = sql.encode("utf-8", "surrogatepass")
    ascii_only = len(data) == len(sql)
    ends = [pos for pos, _ in tokens[1:]] + [len(data)]
    # the kind's name looked up once per kind, not per token (an enum's name is a
    # property: on a 10,000-row INSERT's 200,000 tokens it was most of the time)
    names: dict = {}
    out = []
    for (pos, kind), end in zip(tokens, ends):
        name = names.get(kind)
        if name is None:
            name = names[kind] = getattr(kind, "name", str(kind))
        out.append((name, sql[pos:end] if ascii_only
                    else data[pos:end].decode("utf-8", "surrogatepass")))
    return tuple(out)


@_statement_cache(512)
def identifier_names(sql: str) -> frozenset[str]:
    """The names ``sql`` spells as identifiers or keywords (lower case, unquoted): the
    double-quoted texts of a message that stay in the log (none for refused text)."""
    out = set()
    for kind, text in _duck_tokens(sql) or ():
        if kind in ("identifier", "keyword"):
            text = text.rstrip()
            if text.startswith('"') and text.endswith('"') and len(text) >= 2:
                text = text[1:-1].replace('""', '"')
            out.add(text.lower())
    return frozenset(out)


@_statement_cache(512)
def literal_values(sql: str) -> tuple[str, ...]:
    """The values of ``sql``'s string and numeric literals as DuckDB would show them in a
    message: ``'it''s'`` is ``it's``, ``E'a\\nb'`` also ``a<newline>b``, ``$$x$$`` is
    ``x``. Nothing for text DuckDB's tokenizer refuses (the quoted-string rule still
    applies)."""
    out: list[str] = []
    for kind, text in _duck_tokens(sql) or ():
        text = text.rstrip()
        if kind == "numeric_const":
            out.append(text)
        elif kind == "string_const":
            out += _unquote(text)
    return tuple(out)


def _unquote(text: str) -> list[str]:
    if text.startswith("$"):  # $tag$...$tag$
        tag = text[: text.index("$", 1) + 1]
        return [text[len(tag): len(text) - len(tag)]]
    quote = text.find("'")
    if quote < 0 or not text.endswith("'"):
        return [text]
    inner = text[quote + 1: -1]
    out = [inner, inner.replace("''", "'")]
    if text[:quote].lower() == "e":
        try:
            out.append(inner.encode("latin-1", "backslashreplace").decode("unicode_escape"))
        except (UnicodeError, ValueError):
            pass
    return out


def parameter_values(params: object | None) -> list[str]:
    """The bound values of ``params`` (a ``pyarrow.RecordBatch``) as text, in the forms a
    message may show them (``str`` and ISO for dates and times)."""
    if params is None:
        return []
    out: list[str] = []
    budget = MAX_PARAMETER_VALUES
    for column in getattr(params, "columns", ()):
        for value in _python_values(column.slice(0, budget)):
            _value_texts(value, out)
        budget -= min(budget, len(column))
        if budget <= 0:
            break
    return out


def _python_values(column) -> list:
    """``column``'s values as Python objects; a value Python cannot hold (a date past year
    9999, a BC date) as its integer value, and failing that Arrow's text of it: the
    redaction must never fail on the values a statement was refused for."""
    import pyarrow as pa

    try:
        return column.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    for as_type in (pa.int64(), pa.int32(), pa.string()):
        try:
            return column.cast(as_type, safe=False).to_pylist()
        except (OverflowError, ValueError, pa.ArrowException):
            continue
    return []


def _value_texts(value: object, out: list[str]) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, dict):
        for v in value.values():
            _value_texts(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _value_texts(v, out)
    elif isinstance(value, bytes):
        out += [value.decode("utf-8", "replace"), value.hex()]
    else:
        out.append(str(value))
        if hasattr(value, "isoformat"):
            out.append(value.isoformat())
        if isinstance(value, float):
            out.append(repr(value))
