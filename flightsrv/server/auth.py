"""Authentication for the Flight SQL server: HTTP basic and bearer tokens.

Contract:

- No ``AuthConfig`` -> no middleware; every caller is ``anonymous`` with role WRITER.
- With an ``AuthConfig`` every RPC (Handshake included) must carry an ``authorization``
  header, else UNAUTHENTICATED:
  - ``Basic base64(user:password)`` is checked against the users file. The response carries
    ``authorization: Bearer <token>``, which is how ADBC's username/password option logs in
    (it sends Basic on Handshake and then uses the returned bearer token).
  - ``Bearer <token>`` is either a token this server issued (HMAC-signed, expires after
    ``token_ttl_s``; the key is random per server run, shared by the workers of ``--workers
    N``, so restarting logs everyone out) or a
    static token from ``AuthConfig.tokens``.
- The role decides what a caller may do: READER may query and read metadata; DML and
  ingest need WRITER (the engine raises PermissionDenied; the server pre-checks ingest).
- Basic auth costs the same for unknown and known users: an unknown name is checked
  against a dummy hash with as many PBKDF2 iterations as the costliest user in the file.
- Password checks (PBKDF2) run at most ``max_concurrent_logins`` at once server-wide
  (default: half the cores, at least 1; over all workers of ``--workers N``): a flood of
  logins, with random names or not, cannot take the cores from callers who are logged in
  (bearer tokens and recently verified credentials need no hash). A login that waits
  ``login_wait_s`` for a check is refused UNAVAILABLE naming
  ``limit=max_concurrent_logins``.
- Failed basic logins back off exponentially per user name (known or not): after
  ``free_failures`` failures, that name's unproven credentials are refused without a
  password check for ``base_s * 2**(n - free_failures - 1)`` seconds (at most ``max_s``).
  A credential that verified in this process within ``token_ttl_s`` (kept only as an
  HMAC under a per-process key, at most 4096) is never backed off, so an unauthenticated
  caller failing logins under a name cannot lock its owner out once the owner has logged
  in; it can delay only a first login after a restart. Verified credentials of the last
  minute skip the hash altogether. (pyarrow's server middleware is not told the peer
  address, so the back-off cannot be per peer.) With ``--workers N`` the failures and the
  verified credentials are the whole server's: each worker tells the others of every
  basic login it checked (a failure, or the verified credential's HMAC).
  Bearer tokens are not throttled: issued ones are 256-bit HMACs, and static tokens must
  be long random strings.

Users file: one user per line, ``user:password_hash:role``; ``#`` starts a comment.
``password_hash`` is ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``, made by
``hash_password`` (or ``python -m flightsrv.server.auth PASSWORD``). A users file with no
user, or with one name twice, is a ``ConfigurationError``.

Principals: every credential is its own principal, and no two credentials share a name
(``AuthConfig`` checks it). A user is named by its users-file name; ``static_tokens`` names
the static tokens ``token:1``, ``token:2``, ... in the order their distinct tokens were
given. A users-file name cannot contain ``:``, so no user can be a token's principal. The
same token given twice with the same role is one credential; with different roles it is a
``ConfigurationError``. No message or log line carries a token itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cachetools import TTLCache
from pyarrow import flight

from flightsrv.engine.api import Role
from flightsrv.errors import ConfigurationError, FlightsrvError
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
    free_failures: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    max_concurrent_logins: int = max(1, (os.cpu_count() or 2) // 2)
    login_wait_s: float = 2.0

    def __post_init__(self) -> None:
        names = [p.user for p in self.tokens.values()] + list(self.users)
        shared = sorted({n for n in names if names.count(n) > 1})
        if shared:
            raise ConfigurationError("two credentials share a principal name",
                                     principal=",".join(shared))

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
            if name in users:
                raise ConfigurationError("users file names a user twice", path=path,
                                         line=lineno, user=name)  # fmt: skip
            try:
                users[name] = UserRecord(name, pw_hash, Role(role.lower()))
            except ValueError:
                raise ConfigurationError("unknown role (want reader|writer)", path=path,
                                         line=lineno, role=role) from None  # fmt: skip
        if not users:
            raise ConfigurationError("users file holds no user (only blank or comment lines)",
                                     path=path)
        return cls(users=users, tokens=dict(tokens or {}), token_ttl_s=token_ttl_s)


def parse_token_spec(spec: str, where: str) -> tuple[str, Role]:
    """``TOKEN[:reader|writer]`` as (token, role); the role defaults to writer. The token
    may hold ``:`` itself (the last one separates the role). ``where`` (the option or
    file it came from) names it in the ``ConfigurationError``; the token is never shown."""
    token, colon, role = spec.rpartition(":")
    if not colon:
        token, role = spec, ""
    if not token.strip() or role.lower() not in ("", "reader", "writer"):
        raise ConfigurationError(f"{where}: a token is TOKEN[:reader|writer]")
    return token, Role(role.lower() or "writer")


def static_tokens(specs: Iterable[tuple[str, str]]) -> dict[str, Principal]:
    """Static bearer tokens from ``(TOKEN[:reader|writer], where)`` pairs, each mapped to
    its principal ``token:N`` (see the module docstring). A token given twice with the same
    role counts once; with different roles it is a ``ConfigurationError`` naming both
    places."""
    tokens: dict[str, Principal] = {}
    given_at: dict[str, str] = {}
    for spec, where in specs:
        token, role = parse_token_spec(spec, where)
        seen = tokens.get(token)
        if seen is None:
            tokens[token] = Principal(f"token:{len(tokens) + 1}", role)
            given_at[token] = where
        elif seen.role != role:
            raise ConfigurationError(
                f"{where}: a token given before as {seen.role.value} is given again as "
                f"{role.value}; give each token one role", first=given_at[token])
    return tokens


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


def _iterations(encoded: str) -> int:
    try:
        return int(encoded.split("$")[1])
    except (IndexError, ValueError):
        return DEFAULT_ITERATIONS


class _Backoff:
    """Failed logins per user name; see the module docstring."""

    def __init__(self, clock: Clock, free: int, base_s: float, max_s: float):
        self._clock, self._free, self._base, self._max = clock, free, base_s, max_s
        self._failures: TTLCache = TTLCache(100_000, max(max_s * 4, 3600),
                                            timer=lambda: clock.now_ms() / 1000.0)
        self._lock = threading.Lock()

    def wait_s(self, name: str) -> float:
        """Seconds until ``name`` may try again (0: now)."""
        with self._lock:
            entry = self._failures.get(name)
        if entry is None:
            return 0.0
        return max(0.0, (entry[1] - self._clock.now_ms()) / 1000.0)

    def failed(self, name: str) -> None:
        with self._lock:
            count = self._failures.get(name, (0, 0))[0] + 1
            over = count - self._free
            delay = 0.0 if over <= 0 else min(self._max, self._base * 2 ** (over - 1))
            self._failures[name] = (count, self._clock.now_ms() + int(delay * 1000))

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name, None)


class AuthMiddleware(flight.ServerMiddleware):
    def __init__(self, principal: Principal, issued_token: str | None = None):
        self.principal = principal
        self._issued_token = issued_token

    def sending_headers(self):
        if self._issued_token is None:
            return {}
        return {"authorization": f"Bearer {self._issued_token}"}


class AuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    def __init__(self, config: AuthConfig, clock: Clock | None = None,
                 on_failure: Callable[[str], None] | None = None,
                 token_key: bytes | None = None, logins=None,
                 on_login: Callable[[str, bytes | None], None] | None = None):
        """``logins``: the server's count of password checks running at once, shared by
        the workers of ``--workers N`` (``broker.SharedConcurrency``), else this process's
        own. ``on_login(user, proof)``: a basic login was checked here (``proof`` of its
        credential when it verified, None when it failed); ``--workers`` tells the other
        workers, which call ``remote_login``, so the back-off and the verified credentials
        are the whole server's."""
        self._config = config
        self._clock = clock or Clock()
        # token_key: shared by the workers of one server (--workers), else random
        self._issuer = TokenIssuer(self._clock, config.token_ttl_s, token_key)
        self._logins = logins
        self._on_login = on_login or (lambda user, proof: None)
        self._basic_cache: TTLCache = TTLCache(4096, 60,
                                               timer=lambda: self._clock.now_ms() / 1000.0)
        self._cache_lock = threading.Lock()
        self._backoff = _Backoff(self._clock, config.free_failures, config.backoff_base_s,
                                 config.backoff_max_s)
        # credentials that verified (HMACs): exempt from the back-off for token_ttl_s; the
        # workers of one server share the key (a proof made on one is known to all)
        self._proven_key = os.urandom(32) if token_key is None else \
            hmac.new(token_key, b"flightsrv verified credentials", hashlib.sha256).digest()
        self._proven: TTLCache = TTLCache(4096, max(config.token_ttl_s, 60),
                                          timer=lambda: self._clock.now_ms() / 1000.0)
        self._hashing = threading.BoundedSemaphore(max(1, config.max_concurrent_logins))
        self._on_failure = on_failure or (lambda reason: None)
        iterations = max((_iterations(u.password_hash) for u in config.users.values()),
                         default=DEFAULT_ITERATIONS)
        # unknown users are checked against this, so they cost what known ones do
        self._dummy_hash = hash_password(os.urandom(16).hex(), iterations=iterations)
        self._static = {
            hashlib.sha256(tok.encode()).digest(): p for tok, p in config.tokens.items()
        }

    def _fail(self, reason: str, message: str):
        self._on_failure(reason)
        return flight.FlightUnauthenticatedError(message)

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            raise self._fail("missing", "missing authorization header "
                             f"(method={_method_name(info)})")
        scheme, _, credential = values[0].strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "basic":
            principal = self._check_basic(credential.strip())
            return AuthMiddleware(principal, self._issuer.issue(principal))
        if scheme == "bearer":
            return AuthMiddleware(self._check_bearer(credential.strip()))
        raise self._fail("scheme", f"unsupported authorization scheme={scheme[:16]}")

    def _check_basic(self, credential: str) -> Principal:
        cache_key = hashlib.sha256(credential.encode()).digest()
        with self._cache_lock:
            cached = self._basic_cache.get(cache_key)
        if cached is not None:
            return cached
        try:
            padded = credential + "=" * (-len(credential) % 4)  # ADBC (Go) omits padding
            user, _, password = base64.b64decode(padded).decode().partition(":")
        except (ValueError, binascii.Error):
            raise self._fail("malformed", "malformed basic credentials") from None
        proof = hmac.new(self._proven_key, credential.encode(), hashlib.sha256).digest()
        with self._cache_lock:
            proven = proof in self._proven
        wait = 0.0 if proven else self._backoff.wait_s(user)
        if wait > 0:
            raise self._fail("backoff", "too many failed logins for this user; retry in "
                             f"{wait:.0f} s")
        record = self._config.users.get(user)
        encoded = record.password_hash if record is not None else self._dummy_hash
        self._take_check()
        try:
            ok = verify_password(password, encoded)  # always runs: same cost either way
        finally:
            self._give_check()
        if record is None or not ok:
            if not proven:
                self._backoff.failed(user)
                self._on_login(user, None)
            raise self._fail("password", "invalid user or password")
        self._backoff.succeeded(user)
        principal = Principal(record.name, record.role)
        with self._cache_lock:
            self._basic_cache[cache_key] = principal
            self._proven[proof] = True
        self._on_login(user, proof)
        return principal

    @property
    def issuer(self) -> TokenIssuer:
        """The issuer of this server's bearer tokens (a worker's call to another worker on
        a principal's behalf carries one)."""
        return self._issuer

    def _busy(self) -> flight.FlightUnavailableError:
        return flight.FlightUnavailableError(
            "too many logins being checked at once; retry (limit=max_concurrent_logins "
            f"value={self._config.max_concurrent_logins})")

    def _take_check(self) -> None:
        if self._logins is None:
            if not self._hashing.acquire(timeout=self._config.login_wait_s):
                raise self._busy()
            return
        try:
            self._logins.acquire("*", time.monotonic() + self._config.login_wait_s)
        except FlightsrvError:  # waited login_wait_s, or too many waiting
            raise self._busy() from None

    def _give_check(self) -> None:
        if self._logins is None:
            self._hashing.release()
        else:
            self._logins.release("*")

    def remote_login(self, user: str, proof: bytes | None) -> None:
        """Another worker of this server checked a basic login of ``user``: count a
        failure, or (``proof``) forget the failures and know the credential as verified."""
        if proof is None:
            self._backoff.failed(user)
            return
        self._backoff.succeeded(user)
        with self._cache_lock:
            self._proven[proof] = True

    def _check_bearer(self, token: str) -> Principal:
        static = self._static.get(hashlib.sha256(token.encode()).digest())
        if static is not None:
            return static
        principal = self._issuer.verify(token)
        if principal is None:
            raise self._fail("token", "invalid or expired bearer token")
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
