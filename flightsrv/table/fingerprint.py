"""Keyed fingerprints of deletion and erasure requests (docs/ERASURE.md §Fingerprints).

The text of a delete (``name = 'alice@example.org'``) and the key list of an erasure by join
usually hold the very value being erased. flightsrv never stores them. Manifests, commit
summaries, erasure certificates, stored error messages and metric labels record only a
**fingerprint**:

    hmac-sha256:<key id>:<64 hex digits>
    = HMAC-SHA256(warehouse key, "flightsrv-erasure/v1" NUL kind NUL canonical request)

Equal requests under the same key give equal fingerprints, so an operator can match a request
to the versions and certificates it produced (``fingerprint(wh, "name = 'x'")`` and compare).
Without the key the fingerprint reveals nothing, not even for guessable values such as e-mail
addresses; *with* the key anyone can test a guess. Who can read the key therefore decides who
can confirm that a given person's rows were erased.

The key, per warehouse, resolved in this order (the first that is present wins):

1. ``Warehouse.erasure_key`` set by the embedding program (bytes, at least 32).
2. ``$FLIGHTSRV_ERASURE_KEY``: the key as hex or base64 (at least 32 bytes once decoded).
3. ``$FLIGHTSRV_ERASURE_KEY_FILE``: a file holding such a value.
4. The object ``_flightsrv-keys/erasure-hmac.json`` at the warehouse root. It is created on
   first use with a conditional create (``If-None-Match: *``, the commit protocol's CREATE):
   of several processes racing to create it exactly one wins and every other one reads the
   winner's key, so all writers of a warehouse agree. Its 256 random bits come from the
   runtime's id source (``os.urandom`` outside tests). Anyone who can read the bucket can read
   this key; keep it under a prefix only writers may read, or use 1-3 (a secret manager) when
   bucket readers must not be able to test guesses.

The key id (16 hex digits of a SHA-256 over the key) is part of each fingerprint, so a
fingerprint made under another key is recognisable as such instead of silently not matching.

Canonical request text: a predicate is parsed with sqlglot (DuckDB dialect), unquoted
identifiers are lower-cased and the tree is printed back, so ``NAME='x'`` and ``name = 'x'``
give the same fingerprint; literals are kept exactly (``'X'`` differs from ``'x'``). Text that
does not parse is fingerprinted with its whitespace collapsed. A key list (erasure by join) is
fingerprinted order-independently: every distinct key row is HMAC'd and the digests are summed
modulo 2**256, so executors can fold partitions separately (:class:`KeySetFingerprint`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import threading
from dataclasses import dataclass

from flightsrv.errors import ConfigurationError, CorruptObject, ObjectNotFound, PreconditionFailed
from flightsrv.store.base import PutMode

__all__ = ["KEY_OBJECT", "ErasureKey", "KeySetFingerprint", "canonical_predicate",
           "fingerprint", "is_fingerprint", "key_for", "keys_fingerprint"]

#: Where the warehouse key lives when no key is configured (relative to the warehouse root;
#: the ``-`` keeps it out of the table namespace).
KEY_OBJECT = "_flightsrv-keys/erasure-hmac.json"
ENV_KEY = "FLIGHTSRV_ERASURE_KEY"
ENV_KEY_FILE = "FLIGHTSRV_ERASURE_KEY_FILE"
MIN_KEY_BYTES = 32
_DOMAIN = b"flightsrv-erasure/v1"
_FINGERPRINT = re.compile(r"^hmac-sha256:[0-9a-f]{16}:[0-9a-f]{64}$")
_lock = threading.Lock()


@dataclass(frozen=True)
class ErasureKey:
    """An HMAC key and where it came from (``source``: "explicit", "env", "file", "warehouse")."""

    secret: bytes
    source: str

    def __post_init__(self):
        if len(self.secret) < MIN_KEY_BYTES:
            raise ConfigurationError("erasure key is too short", source=self.source,
                                     bytes=len(self.secret), minimum=MIN_KEY_BYTES)

    def __repr__(self) -> str:  # never print the secret
        return f"ErasureKey(id={self.key_id}, source={self.source})"

    @property
    def key_id(self) -> str:
        return hashlib.sha256(b"flightsrv-erasure-key-id\x00" + self.secret).hexdigest()[:16]

    def digest(self, kind: str, text: str) -> bytes:
        msg = _DOMAIN + b"\x00" + kind.encode() + b"\x00" + text.encode("utf-8")
        return hmac.new(self.secret, msg, hashlib.sha256).digest()

    def format(self, digest: bytes) -> str:
        return f"hmac-sha256:{self.key_id}:{digest.hex()}"


def _decode_key(value: str, source: str) -> ErasureKey:
    value = value.strip()
    raw: bytes | None = None
    if re.fullmatch(r"[0-9a-fA-F]+", value) and len(value) % 2 == 0:
        raw = bytes.fromhex(value)
    else:
        try:
            raw = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_"
                                   if ("-" in value or "_" in value) else None, validate=True)
        except (binascii.Error, ValueError):
            raw = None
    if raw is None:
        raise ConfigurationError("erasure key must be hex or base64", source=source)
    return ErasureKey(raw, source)


def _from_environment() -> ErasureKey | None:
    value = os.environ.get(ENV_KEY)
    if value:
        return _decode_key(value, "env")
    path = os.environ.get(ENV_KEY_FILE)
    if path:
        try:
            with open(path, encoding="ascii") as fh:
                return _decode_key(fh.read(), "file")
        except OSError as exc:
            raise ConfigurationError("cannot read the erasure key file", variable=ENV_KEY_FILE,
                                     error=exc.strerror) from None
    return None


def _parse_key_object(raw: bytes) -> ErasureKey:
    try:
        d = json.loads(raw)
        key = ErasureKey(base64.b64decode(d["key"], validate=True), "warehouse")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise CorruptObject("warehouse erasure key does not parse", key=KEY_OBJECT,
                            error=type(exc).__name__) from None
    if d.get("key_id") not in (None, key.key_id):
        raise CorruptObject("warehouse erasure key does not match its key_id", key=KEY_OBJECT,
                            expected=d.get("key_id"), found=key.key_id)
    return key


def _warehouse_key(warehouse, *, create: bool) -> ErasureKey | None:
    store = warehouse.store
    try:
        raw, _ = store.get(KEY_OBJECT)
        return _parse_key_object(raw)
    except ObjectNotFound:
        if not create:
            return None
    warehouse.ensure_writable()
    ids = warehouse.runtime.ids
    secret = bytes.fromhex(ids.new_id() + ids.new_id())
    key = ErasureKey(secret, "warehouse")
    body = json.dumps({"format_version": 1, "algorithm": "HMAC-SHA256", "key_id": key.key_id,
                       "key": base64.b64encode(secret).decode(),
                       "created_at_ms": warehouse.runtime.clock.now_ms()}).encode()
    try:
        store.put(KEY_OBJECT, body, mode=PutMode.CREATE)
        return key
    except PreconditionFailed:  # another process created it first: everyone uses the winner's
        raw, _ = store.get(KEY_OBJECT)
        return _parse_key_object(raw)


def key_for(warehouse, *, create: bool = True) -> ErasureKey | None:
    """The warehouse's erasure key (see the module docstring for the resolution order).
    With ``create=False`` a missing warehouse key object is not created (returns None)."""
    explicit = getattr(warehouse, "erasure_key", None)
    if isinstance(explicit, ErasureKey):
        return explicit
    if explicit is not None:
        return ErasureKey(bytes(explicit), "explicit")
    env = _from_environment()
    if env is not None:
        return env
    cached = getattr(warehouse, "_erasure_key_cache", None)
    if cached is not None:
        return cached
    with _lock:
        key = _warehouse_key(warehouse, create=create)
        if key is not None:
            warehouse._erasure_key_cache = key
        return key


def canonical_predicate(text: str) -> str:
    """The text a predicate is fingerprinted as (see the module docstring)."""
    import sqlglot
    from sqlglot.errors import SqlglotError
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

    try:
        tree = sqlglot.parse_one(text, read="duckdb")
        return normalize_identifiers(tree, dialect="duckdb").sql(dialect="duckdb")
    except (SqlglotError, ValueError, RecursionError):  # unparsable: the plain text
        return " ".join(text.split())


def canonical_predicate_tree(tree) -> str:
    """:func:`canonical_predicate` of a predicate already parsed by sqlglot (DuckDB dialect):
    the same text without generating and re-parsing it (sqlglot round-trips its own
    output), which for a 1,000-value IN list is most of a DELETE's planning time.

    ``tree`` is never changed (it may be a cached statement's, shared by threads): the text
    is generated from a private copy whose identifiers are normalised while it is made
    (:func:`_normalized_copy`); that copy is the generator's own, so it is not copied again.
    """
    try:
        copy = _normalized_copy(tree)
    except AttributeError:  # a sqlglot whose nodes keep other private fields: the slow path
        from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

        return normalize_identifiers(tree.copy(), dialect="duckdb").sql(dialect="duckdb")
    return copy.sql(dialect="duckdb", copy=False)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _normalized_copy(tree):
    """``normalize_identifiers(tree.copy(), dialect="duckdb")`` in one pass.

    The copy is made like sqlglot's ``Expr.__deepcopy__`` (same node classes, args, parents,
    comments and types), except that a node's meta dict holding only scalars (the parser's
    token positions) is copied flat instead of through ``copy.deepcopy``, which for a
    1,000-value IN list was most of the time. Identifiers are then normalised as
    ``normalize_identifiers`` does: every ``exp.Identifier`` through the dialect's
    ``normalize_identifier``, except in a subtree whose root carries the meta flag
    ``case_sensitive`` (that root and everything below it stay as written).
    tests/test_fingerprint_canonical.py checks the text equals the old two-step function's."""
    from copy import deepcopy

    from sqlglot import exp
    from sqlglot.dialects.dialect import Dialect

    dialect = Dialect.get_or_raise("duckdb")
    Expr = exp.Expression
    Identifier = exp.Identifier
    root = tree.__class__()
    stack = [(tree, root, True)]
    while stack:
        node, copy, norm = stack.pop()
        if node.comments is not None:
            copy.comments = deepcopy(node.comments)
        if node._type is not None:
            copy._type = deepcopy(node._type)
        meta = node._meta
        if meta is not None:
            copy._meta = dict(meta) if _SCALARS.issuperset(map(type, meta.values())) \
                else deepcopy(meta)
            if norm and meta.get("case_sensitive"):
                norm = False
        if node._hash is not None:
            copy._hash = node._hash
        for k, vs in node.args.items():
            if isinstance(vs, Expr):
                child = vs.__class__()
                stack.append((vs, child, norm))
                copy.set(k, child)
            elif type(vs) is list:
                copy.args[k] = []
                for v in vs:
                    if isinstance(v, Expr):
                        child = v.__class__()
                        stack.append((v, child, norm))
                        copy.append(k, child)
                    else:
                        copy.append(k, v)
            else:
                copy.args[k] = vs
        if norm and isinstance(copy, Identifier):
            dialect.normalize_identifier(copy)
    return root


def fingerprint_canonical(warehouse, canon: str, *, kind: str = "predicate") -> str:
    """:func:`fingerprint` of an already canonical predicate text."""
    key = key_for(warehouse)
    return key.format(key.digest(kind, canon))


def fingerprint(warehouse, text: str, *, kind: str = "predicate") -> str:
    """Fingerprint a delete's predicate (``kind="predicate"``, canonicalised) or a whole
    statement's text (``kind="statement"``, whitespace collapsed) under the warehouse key."""
    key = key_for(warehouse)
    canon = canonical_predicate(text) if kind == "predicate" else " ".join(text.split())
    return key.format(key.digest(kind, canon))


def _row_text(values) -> str:
    return json.dumps(list(values), default=str, separators=(",", ":"), ensure_ascii=False)


class KeySetFingerprint:
    """Order-independent fingerprint of a set of key rows (erasure by join).

    ``update(table)`` folds distinct key rows in; partial results made on different machines
    (``partial()``) combine with ``merge``. Callers must feed each distinct row once."""

    MOD = 1 << 256

    def __init__(self, key: ErasureKey, columns):
        self.key = key
        self.columns = list(columns)
        self.count = 0
        self.total = 0

    def update(self, table) -> KeySetFingerprint:
        cols = [table.column(c).to_pylist() for c in self.columns]
        return self.update_texts(_row_text(row) for row in zip(*cols))

    def update_texts(self, texts) -> KeySetFingerprint:
        """:meth:`update` for rows already spelled by ``_row_text``."""
        for text in texts:
            d = self.key.digest("key-row", text)
            self.total = (self.total + int.from_bytes(d, "big")) % self.MOD
            self.count += 1
        return self

    def partial(self) -> tuple[int, str]:
        return self.count, f"{self.total:064x}"

    def merge(self, count: int, total_hex: str) -> KeySetFingerprint:
        self.count += int(count)
        self.total = (self.total + int(total_hex, 16)) % self.MOD
        return self

    def result(self) -> str:
        text = f"{','.join(self.columns)}:{self.count}:{self.total:064x}"
        return self.key.format(self.key.digest("key-set", text))


def keys_fingerprint(warehouse, columns, table) -> str:
    """Fingerprint of the distinct key rows in the Arrow ``table`` over ``columns``: a row
    with a NULL key matches nothing and is left out, a row given twice counts once, as
    ``delete_matching`` records its request (so a list with duplicates or NULLs gives the
    fingerprint its erasure recorded)."""
    columns = list(columns)
    cols = [table.column(c).to_pylist() for c in columns]
    # dict: the distinct texts in their first order (the sum does not depend on it)
    texts = dict.fromkeys(_row_text(row) for row in zip(*cols)
                          if not any(v is None for v in row))
    return KeySetFingerprint(key_for(warehouse), columns).update_texts(texts).result()


def is_fingerprint(value) -> bool:
    return isinstance(value, str) and bool(_FINGERPRINT.match(value))
