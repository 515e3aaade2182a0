"""Authentication for the Flight SQL server: HTTP basic and bearer tokens.

Contract:

- No ``AuthConfig`` -> no middleware; every caller is ``anonymous`` with role WRITER.
- With an ``AuthConfig`` every RPC (Handshake included) must carry an ``authorization``
  header, else UNAUTHENTICATED:
  - ``Basic base64(user:password)`` is checked against the users file. The response carries
    ``authorization: Bearer <token>``, which is how ADBC's username/password option logs in
    (it sends Basic on Handshake and then uses the returned bearer token).
  - ``Bearer <token>`` is either a token this server issued (HMAC-signed, expires after
    ``token_ttl_s``; the key is random per process, so restarting logs everyone out) or a
    static token from ``AuthConfig.tokens``.
- The role decides what a caller may do: READER may query and read metadata; DML and
  ingest need WRITER (the engine raises PermissionDenied; the server pre-checks ingest).

Users file: one user per line, ``user:password_hash:role``; ``#`` starts a comment.
``password_hash`` is ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``, made by
``hash_password`` (or ``python -m flightsrv.server.auth PASSWORD``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from pyarrow import flight

from flightsrv.engine.api import Role
from flightsrv.errors import ConfigurationError
from flightsrv.runtime import Clock

MIDDLEWARE_KEY = "auth"
_HASH_SCHEME = "pbkdf2_sha256"
DEFAULT_ITERATIONS = 200_000


@dataclass(frozen=True)
class Principal:
    user: str
    role: Role


ANONYMOUS = Principal("anonymous", Role.WRITER)


@dataclass(frozen=True)
class UserRecord:
    name: str
    password_hash: str
    role: Role


@dataclass
class AuthConfig:
    """Who may connect. ``tokens`` maps a static bearer token to its principal."""

    users: dict[str, UserRecord] = field(default_factory=dict)
    tokens: dict[str, Principal] = field(default_factory=dict)
    token_ttl_s: int = 12 * 3600

    @classmethod
    def from_users_file(cls, path: str | Path, tokens: dict[str, Principal] | None = None,
                        token_ttl_s: int = 12 * 3600) -> AuthConfig:  # fmt: skip
        users: dict[str, UserRecord] = {}
        for lineno, raw in enumerate(Path(path).read_text().splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(":")
            if len(parts) != 3 or not all(parts):
                raise ConfigurationError("users file line is not user:hash:role",
                                         path=path, line=lineno)  # fmt: skip
            name, pw_hash, role = parts
            try:
                users[name] = UserRecord(name, pw_hash, Role(role.lower()))
            except ValueError:
                raise ConfigurationError("unknown role (want reader|writer)", path=path,
                                         line=lineno, role=role) from None  # fmt: skip
        return cls(users=users, tokens=dict(tokens or {}), token_ttl_s=token_ttl_s)


def hash_password(password: str, iterations: int = DEFAULT_ITERATIONS,
                  salt: bytes | None = None) -> str:  # fmt: skip
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"{_HASH_SCHEME}${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    try:
        scheme, iterations, salt_b64, digest_b64 = encoded.split("$")
        if scheme != _HASH_SCHEME:
            return False
        salt, want = base64.b64decode(salt_b64), base64.b64decode(digest_b64)
        got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, int(iterations))
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(got, want)


class TokenIssuer:
    """Stateless bearer tokens: ``b64(user|role|expiry_ms).b64(hmac)``."""

    def __init__(self, clock: Clock, ttl_s: int, key: bytes | None = None):
        self._clock = clock
        self._ttl_ms = ttl_s * 1000
        self._key = key if key is not None else os.urandom(32)

    def _sign(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()

    def issue(self, principal: Principal) -> str:
        expiry = self._clock.now_ms() + self._ttl_ms
        body = f"{principal.user}|{principal.role.value}|{expiry}".encode()
        enc = base64.urlsafe_b64encode
        return f"{enc(body).decode()}.{enc(self._sign(body)).decode()}"

    def verify(self, token: str) -> Principal | None:
        try:
            body_b64, sig_b64 = token.split(".")
            body = base64.urlsafe_b64decode(body_b64)
            sig = base64.urlsafe_b64decode(sig_b64)
        except (ValueError, binascii.Error):
            return None
        if not hmac.compare_digest(sig, self._sign(body)):
            return None
        try:
            user, role, expiry = body.decode().rsplit("|", 2)
            if int(expiry) < self._clock.now_ms():
                return None
            return Principal(user, Role(role))
        except ValueError:
            return None


class _BasicCache:
    """Recently verified basic credentials, so PBKDF2 runs once per client, not per RPC."""

    def __init__(self, max_entries: int = 1024):
        self._entries: OrderedDict[bytes, tuple[Principal, int]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get(self, key: bytes, now_ms: int) -> Principal | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[1] < now_ms:
                return None
            self._entries.move_to_end(key)
            return hit[0]

    def put(self, key: bytes, principal: Principal, expiry_ms: int) -> None:
        with self._lock:
            self._entries[key] = (principal, expiry_ms)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


class AuthMiddleware(flight.ServerMiddleware):
    def __init__(self, principal: Principal, issued_token: str | None = None):
        self.principal = principal
        self._issued_token = issued_token

    def sending_headers(self):
        if self._issued_token is None:
            return {}
        return {"authorization": f"Bearer {self._issued_token}"}


class AuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    def __init__(self, config: AuthConfig, clock: Clock | None = None):
        self._config = config
        self._clock = clock or Clock()
        self._issuer = TokenIssuer(self._clock, config.token_ttl_s)
        self._basic_cache = _BasicCache()
        self._static = {
            hashlib.sha256(tok.encode()).digest(): p for tok, p in config.tokens.items()
        }

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            raise flight.FlightUnauthenticatedError(
                f"missing authorization header (method={_method_name(info)})"
            )
        scheme, _, credential = values[0].strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "basic":
            principal = self._check_basic(credential.strip())
            return AuthMiddleware(principal, self._issuer.issue(principal))
        if scheme == "bearer":
            return AuthMiddleware(self._check_bearer(credential.strip()))
        raise flight.FlightUnauthenticatedError(f"unsupported authorization scheme={scheme}")

    def _check_basic(self, credential: str) -> Principal:
        now = self._clock.now_ms()
        cache_key = hashlib.sha256(credential.encode()).digest()
        cached = self._basic_cache.get(cache_key, now)
        if cached is not None:
            return cached
        try:
            padded = credential + "=" * (-len(credential) % 4)  # ADBC (Go) omits padding
            user, _, password = base64.b64decode(padded).decode().partition(":")
        except (ValueError, binascii.Error):
            raise flight.FlightUnauthenticatedError("malformed basic credentials") from None
        record = self._config.users.get(user)
        if record is None or not verify_password(password, record.password_hash):
            raise flight.FlightUnauthenticatedError(f"invalid user or password (user={user})")
        principal = Principal(record.name, record.role)
        self._basic_cache.put(cache_key, principal, now + 60_000)
        return principal

    def _check_bearer(self, token: str) -> Principal:
        static = self._static.get(hashlib.sha256(token.encode()).digest())
        if static is not None:
            return static
        principal = self._issuer.verify(token)
        if principal is None:
            raise flight.FlightUnauthenticatedError("invalid or expired bearer token")
        return principal


class HandshakeHandler(flight.ServerAuthHandler):
    """Accept the Handshake RPC so that basic-token clients can log in; the middleware has
    already checked the credentials and attaches the bearer token to the response. Other
    calls are authenticated by the middleware alone (``is_valid`` accepts everything)."""

    def authenticate(self, outgoing, incoming):
        pass

    def is_valid(self, token):
        return b""


def _method_name(info) -> str:
    try:
        return str(info.method).rsplit(".", 1)[-1]
    except Exception:  # noqa: BLE001 - only for a message
        return "?"


def principal_of(context) -> Principal:
    """The caller of an RPC: from the auth middleware, or ANONYMOUS when auth is off."""
    mw = context.get_middleware(MIDDLEWARE_KEY)
    return mw.principal if mw is not None else ANONYMOUS


if __name__ == "__main__":  # pragma: no cover - operator helper
    import sys

    print(hash_password(sys.argv[1]))
