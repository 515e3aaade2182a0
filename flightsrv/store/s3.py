"""S3 backend of ``ObjectStore`` (AWS S3, MinIO, R2 and other S3-compatible stores).

Configured the usual boto3 way: ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``,
``AWS_REGION`` / ``AWS_DEFAULT_REGION`` (else the profile's region), the standard credential
chain, ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE`` (else the profile's; default 5 attempts,
"standard" mode with backoff), plus ``FLIGHTSRV_S3_ADDRESSING_STYLE`` (auto, path, virtual;
else the profile's ``s3.addressing_style``), ``FLIGHTSRV_S3_CONNECT_TIMEOUT`` and
``FLIGHTSRV_S3_READ_TIMEOUT`` (seconds, default 60 each). A bad value of any of them is a
``ConfigurationError`` naming the setting (``client_config``); docs/S3.md.

Preconditions map to the S3 conditional-write headers: CREATE → ``If-None-Match: *``,
IF_MATCH → ``If-Match`` (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html).
HTTP 412 PreconditionFailed and 409 ConditionalRequestConflict both raise
``PreconditionFailed``: the caller re-reads and retries.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Iterator
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)

from flightsrv.errors import (
    ConfigurationError,
    ObjectNotFound,
    OperationUnsupported,
    PermissionDenied,
    PreconditionFailed,
    StoreError,
)
from flightsrv.store.base import (
    PORTABLE,
    CompletedPart,
    MultipartUpload,
    ObjectMeta,
    PutMode,
)

MIN_PART = 5 * 1024 * 1024
_UPLOAD_PART = 16 * 1024 * 1024
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_TIMEOUT_S = 60.0
_ADDRESSING = ("auto", "path", "virtual")
_RETRY_MODES = ("legacy", "standard", "adaptive")


def _setting(env: dict, name: str, profile: dict, key: str):
    """(value, where it came from) of a setting: the environment first, then the profile."""
    if env.get(name):
        return env[name], name
    if profile.get(key) not in (None, ""):
        return profile[key], f"{key} in the AWS profile"
    return None, None


def _positive(value, where: str, uri: str, kind=float):
    try:
        out = kind(value)
    except (TypeError, ValueError):
        out = None
    if out is None or out <= 0:
        what = "integer" if kind is int else "number"
        raise ConfigurationError(f"{where} must be a positive {what}, not {value!r}", store=uri)
    return out


def client_config(uri: str, env: dict | None = None, profile: dict | None = None) -> dict:
    """The S3 client settings flightsrv takes from ``env`` (default ``os.environ``) and the
    AWS profile's values ``profile``: endpoint, region, retries, timeouts, addressing style.
    Raises ``ConfigurationError`` naming the setting and its bad value."""
    env = os.environ if env is None else env
    profile = profile or {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            which = "AWS_ENDPOINT_URL_S3" if env.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
            raise ConfigurationError(f"{which} must be an http:// or https:// URL with a host, "
                                     f"not {endpoint!r}", store=uri)
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile.get("region") \
        or "us-east-1"
    mode, where = _setting(env, "AWS_RETRY_MODE", profile, "retry_mode")
    if mode is not None and mode not in _RETRY_MODES:
        raise ConfigurationError(f"{where} must be one of {', '.join(_RETRY_MODES)}, not "
                                 f"{mode!r}", store=uri)
    attempts, where = _setting(env, "AWS_MAX_ATTEMPTS", profile, "max_attempts")
    if attempts is not None:
        attempts = _positive(attempts, where, uri, int)
    style = env.get("FLIGHTSRV_S3_ADDRESSING_STYLE") or None
    if style is not None and style not in _ADDRESSING:
        raise ConfigurationError("FLIGHTSRV_S3_ADDRESSING_STYLE must be one of "
                                 f"{', '.join(_ADDRESSING)}, not {style!r}", store=uri)
    if style is None:
        style = (profile.get("s3") or {}).get("addressing_style") if isinstance(
            profile.get("s3"), dict) else None
        if style is not None and style not in _ADDRESSING:
            raise ConfigurationError("s3.addressing_style in the AWS profile must be one of "
                                     f"{', '.join(_ADDRESSING)}, not {style!r}", store=uri)
    timeouts = {}
    for key, name in (("connect_timeout", "FLIGHTSRV_S3_CONNECT_TIMEOUT"),
                      ("read_timeout", "FLIGHTSRV_S3_READ_TIMEOUT")):
        value = env.get(name)
        timeouts[key] = DEFAULT_TIMEOUT_S if not value else _positive(value, name, uri)
    return {"endpoint": endpoint, "region": region, "retry_mode": mode or "standard",
            "max_attempts": attempts or DEFAULT_MAX_ATTEMPTS, "addressing_style": style or "auto",
            **timeouts}


def _retried_into(exc: Exception, *codes: str, status: int | None = None) -> bool:
    """Whether ``exc`` is an S3 error answered to the client's own retry of a request
    (botocore's ``RetryAttempts``): an earlier attempt may have been carried out."""
    if not isinstance(exc, ClientError):
        return False
    meta = exc.response.get("ResponseMetadata", {})
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return bool(meta.get("RetryAttempts")) and (
        code in codes or (status is not None and meta.get("HTTPStatusCode") == status))


def _retried_into_412(exc: Exception) -> bool:
    return _retried_into(exc, "PreconditionFailed", status=412)


def multipart_etag(parts: list[CompletedPart]) -> str:
    """The ETag S3 gives the object a multipart upload of ``parts`` completes to: the MD5
    of the parts' MD5s, a dash and the number of parts."""
    digests = b"".join(bytes.fromhex(p.etag.strip('"')) for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def _ms(dt) -> int:
    return int(dt.timestamp() * 1000) if dt is not None else 0


class S3Store:
    """``ObjectStore`` over ``s3://bucket/prefix``."""

    min_part_size = MIN_PART
    capabilities = PORTABLE  # no local files: stage elsewhere, then put_file or multipart

    def __init__(self, bucket: str, prefix: str = "", *, client=None,
                 equal_part_sizes: bool | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = client or self._default_client(self.uri)
        endpoint = str(getattr(self.client.meta, "endpoint_url", "") or "")
        if equal_part_sizes is None:
            env = os.environ.get("FLIGHTSRV_S3_EQUAL_PARTS")
            equal_part_sizes = (env == "1") if env is not None \
                else "r2.cloudflarestorage" in endpoint
        self.equal_part_sizes = equal_part_sizes
        self._arrow_fs = None
        self._arrow_lock = threading.Lock()

    @staticmethod
    def _default_client(uri: str):
        try:
            core = botocore.session.get_session()
            profile = core.get_scoped_config()
            session = boto3.session.Session(botocore_session=core)
        except ProfileNotFound as exc:
            raise ConfigurationError(f"{exc} (AWS_PROFILE names a profile that is not in "
                                     "~/.aws/config or ~/.aws/credentials)", store=uri) from None
        c = client_config(uri, os.environ, profile)
        # total attempts, first one included, as AWS_MAX_ATTEMPTS counts them (botocore's
        # "max_attempts" key would count retries only, one more request)
        cfg = Config(retries={"total_max_attempts": c["max_attempts"], "mode": c["retry_mode"]},
                     connect_timeout=c["connect_timeout"], read_timeout=c["read_timeout"],
                     s3={"addressing_style": c["addressing_style"]}, max_pool_connections=32)
        try:
            return session.client("s3", endpoint_url=c["endpoint"], region_name=c["region"],
                                  config=cfg)
        except (BotoCoreError, ValueError) as exc:
            raise ConfigurationError(f"cannot configure the S3 client: {exc}", store=uri,
                                     region=c["region"]) from None

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unk(self, full: str) -> str:
        return full[len(self.prefix) + 1:] if self.prefix else full

    def local_path(self, key: str) -> None:
        return None

    def arrow_filesystem(self):
        """pyarrow's native ``S3FileSystem`` for this store's endpoint, region and
        credentials (the boto3 client's), and ``bucket/prefix``; see the protocol's
        contract in :mod:`flightsrv.store.base`. Built once per store."""
        with self._arrow_lock:
            if self._arrow_fs is None:
                self._arrow_fs = self._build_arrow_fs()
        return self._arrow_fs, f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket

    def _build_arrow_fs(self):
        from pyarrow import fs as pafs

        kw: dict = {"region": self.client.meta.region_name or "us-east-1"}
        s3cfg = getattr(getattr(self.client.meta, "config", None), "s3", None) or {}
        if s3cfg.get("addressing_style") == "virtual":
            kw["force_virtual_addressing"] = True
        endpoint = str(getattr(self.client.meta, "endpoint_url", "") or "")
        if endpoint and not urlsplit(endpoint).netloc.endswith("amazonaws.com"):
            parts = urlsplit(endpoint)
            kw["endpoint_override"] = parts.netloc
            kw["scheme"] = parts.scheme or "https"
        signer = getattr(self.client, "_request_signer", None)
        creds = getattr(signer, "_credentials", None)
        if creds is not None:
            frozen = creds.get_frozen_credentials()
            kw["access_key"], kw["secret_key"] = frozen.access_key, frozen.secret_key
            if frozen.token:
                kw["session_token"] = frozen.token
        # the boto3 client's timeouts (its 60 s read timeout, not the AWS C++ SDK's 3 s
        # low-speed limit, which a busy endpoint trips in the middle of a large GET)
        config = getattr(self.client.meta, "config", None)
        for ours, theirs in (("connect_timeout", "connect_timeout"),
                             ("request_timeout", "read_timeout")):
            value = getattr(config, theirs, None)
            if isinstance(value, (int, float)) and value > 0:
                kw[ours] = float(value)
        return pafs.S3FileSystem(**kw)

    def _err(self, exc: Exception, key: str, op: str):
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return ConfigurationError(
                "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                "AWS_PROFILE)", store=self.uri, op=op)
        if isinstance(exc, EndpointConnectionError):
            url = urlsplit(str(getattr(exc, "kwargs", {}).get("endpoint_url") or ""))
            return StoreError("cannot reach the S3 endpoint (check AWS_ENDPOINT_URL and the "
                              "network)", store=self.uri,
                              endpoint=f"{url.scheme}://{url.netloc}" if url.netloc else None,
                              op=op)
        if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
            what = "connect" if isinstance(exc, ConnectTimeoutError) else "answer"
            setting = "FLIGHTSRV_S3_CONNECT_TIMEOUT" if what == "connect" \
                else "FLIGHTSRV_S3_READ_TIMEOUT"
            config = getattr(self.client.meta, "config", None)
            seconds = getattr(config, f"{'connect' if what == 'connect' else 'read'}_timeout",
                              None)
            retries = (getattr(config, "retries", None) or {}).get("total_max_attempts")
            return StoreError(f"the S3 endpoint did not {what} within {seconds} s, "
                              f"{retries} attempts ({setting}, AWS_MAX_ATTEMPTS)",
                              store=self.uri, key=key, op=op)
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return ConfigurationError("no such bucket", store=self.uri, bucket=self.bucket,
                                          op=op)
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                        "AllAccessDisabled", "ExpiredToken", "InvalidToken",
                        "XAdminUserNotFound") or status == 403:
                # Versity Gateway answers an unknown access key with 404 XAdminUserNotFound
                return PermissionDenied(f"the store refused the request ({code or status})",
                                        store=self.uri, key=key, op=op)
            if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict") \
                    or status == 409:
                return PreconditionFailed(f"{op}: precondition failed ({code})", store=self.uri,
                                          key=key)
            # a 404 is a missing object only when it says so (HEAD answers carry no body):
            # another 404 (a store's own code) is not "absent", which would read as no table
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchUpload") or (
                    status == 404 and not code):
                return ObjectNotFound(f"{op}: no such object ({code})", store=self.uri, key=key)
            return StoreError(f"{op} failed: {code} {exc}", store=self.uri, key=key)
        return StoreError(f"{op} failed: {exc}", store=self.uri, key=key)

    def _call(self, op: str, key: str, fn, **kw):
        try:
            return fn(**kw)
        except (ClientError, BotoCoreError) as exc:
            raise self._err(exc, key, op) from exc

    # -- reads -------------------------------------------------------------------
    def get(self, key: str, *, etag: str | None = None) -> tuple[bytes, ObjectMeta]:
        kw = {"Bucket": self.bucket, "Key": self._k(key)}
        if etag:
            kw["IfMatch"] = etag
        r = self._call("GET", key, self.client.get_object, **kw)
        body = r["Body"].read()
        return body, ObjectMeta(key, len(body), r["ETag"], _ms(r.get("LastModified")))

    def get_range(self, key: str, start: int, end: int, *, etag: str | None = None) -> bytes:
        if end <= start:
            return b""
        kw = {"Bucket": self.bucket, "Key": self._k(key), "Range": f"bytes={start}-{end - 1}"}
        if etag:
            kw["IfMatch"] = etag
        try:
            r = self.client.get_object(**kw)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                return b""
            raise self._err(exc, key, "GET range") from exc
        except BotoCoreError as exc:
            raise self._err(exc, key, "GET range") from exc
        return r["Body"].read()

    def head(self, key: str) -> ObjectMeta:
        r = self._call("HEAD", key, self.client.head_object, Bucket=self.bucket, Key=self._k(key))
        return ObjectMeta(key, r["ContentLength"], r["ETag"], _ms(r.get("LastModified")))

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._k(prefix)):
                for o in page.get("Contents", []):
                    yield ObjectMeta(self._unk(o["Key"]), o["Size"], o["ETag"],
                                     _ms(o.get("LastModified")))
        except (ClientError, BotoCoreError) as exc:
            raise self._err(exc, prefix, "LIST") from exc

    # -- writes ------------------------------------------------------------------
    def put(
        self, key: str, data: bytes, *, mode: PutMode = PutMode.CREATE, etag: str | None = None
    ) -> ObjectMeta:
        kw = {"Bucket": self.bucket, "Key": self._k(key), "Body": bytes(data)}
        if mode is PutMode.CREATE:
            kw["IfNoneMatch"] = "*"
        elif mode is PutMode.IF_MATCH:
            if etag is None:
                raise ValueError("IF_MATCH needs an etag")
            kw["IfMatch"] = etag
        try:
            r = self.client.put_object(**kw)
        except (ClientError, BotoCoreError) as exc:
            if mode is PutMode.CREATE and _retried_into_412(exc):
                landed = self._landed(key, lambda meta: self.get(key, etag=meta.etag)[0]
                                      == kw["Body"])
                if landed is not None:
                    return landed
            raise self._err(exc, key, f"PUT({mode.value})") from exc
        return ObjectMeta(key, len(data), r["ETag"])

    def _landed(self, key: str, ours) -> ObjectMeta | None:
        """After the client's retry of a CREATE met an object (412): the object's metadata
        when ``ours(meta)`` says it is the one this write made (its first attempt landed and
        the reply was lost), else None: the 412 stands, and so does any error reading it."""
        try:
            meta = self.head(key)
            return meta if ours(meta) else None
        except (StoreError, ClientError, BotoCoreError):
            return None

    def put_file(self, key: str, path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        size = os.path.getsize(path)
        if size <= _UPLOAD_PART:
            with open(path, "rb") as f:
                return self.put(key, f.read(), mode=mode)
        upload_id = self.create_multipart(key)
        try:
            parts = []
            with open(path, "rb") as f:
                n = 1
                while chunk := f.read(_UPLOAD_PART):
                    parts.append(self.upload_part(key, upload_id, n, chunk))
                    n += 1
            return self.complete_multipart(key, upload_id, parts, mode=mode)
        except BaseException:
            self.abort_multipart(key, upload_id)
            raise

    def _no_local_files(self, op: str):
        return OperationUnsupported("an S3 store keeps no local files (capabilities)",
                                    store=self.uri, op=op)

    def new_temp_file(self) -> str:
        raise self._no_local_files("new_temp_file")

    def write_temp_file(self, tmp_path, pieces, *, source_key, source_etag=None) -> None:
        raise self._no_local_files("write_temp_file")

    def adopt(self, key: str, tmp_path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        raise self._no_local_files("adopt")

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._k(key))
        except (ClientError, BotoCoreError) as exc:
            err = self._err(exc, key, "DELETE")
            if not isinstance(err, ObjectNotFound):
                raise err from exc

    # -- multipart ---------------------------------------------------------------
    def create_multipart(self, key: str) -> str:
        r = self._call("CreateMultipartUpload", key, self.client.create_multipart_upload,
                       Bucket=self.bucket, Key=self._k(key))
        return r["UploadId"]

    def upload_part(self, key: str, upload_id: str, part_number: int, data: bytes) -> CompletedPart:
        r = self._call("UploadPart", key, self.client.upload_part, Bucket=self.bucket,
                       Key=self._k(key), UploadId=upload_id, PartNumber=part_number,
                       Body=bytes(data))
        return CompletedPart(part_number, r["ETag"])

    def upload_part_copy(
        self, key: str, upload_id: str, part_number: int, source_key: str, start: int, end: int,
        *, source_etag: str | None = None,
    ) -> CompletedPart:
        kw = {
            "Bucket": self.bucket, "Key": self._k(key), "UploadId": upload_id,
            "PartNumber": part_number,
            "CopySource": {"Bucket": self.bucket, "Key": self._k(source_key)},
            "CopySourceRange": f"bytes={start}-{end - 1}",
        }
        if source_etag:
            kw["CopySourceIfMatch"] = source_etag
        r = self._call("UploadPartCopy", key, self.client.upload_part_copy, **kw)
        return CompletedPart(part_number, r["CopyPartResult"]["ETag"])

    def complete_multipart(
        self, key: str, upload_id: str, parts: list[CompletedPart], *,
        mode: PutMode = PutMode.CREATE,
    ) -> ObjectMeta:
        kw = {
            "Bucket": self.bucket, "Key": self._k(key), "UploadId": upload_id,
            "MultipartUpload": {"Parts": [{"PartNumber": p.part_number, "ETag": p.etag}
                                          for p in parts]},
        }
        if mode is PutMode.CREATE:
            kw["IfNoneMatch"] = "*"
        try:
            self.client.complete_multipart_upload(**kw)
        except (ClientError, BotoCoreError) as exc:
            # a retry after a lost reply meets the object (412) or an upload that is no
            # more (NoSuchUpload): the object is this upload's when its ETag is the one
            # its parts make
            if mode is PutMode.CREATE and (_retried_into_412(exc) or _retried_into(
                    exc, "NoSuchUpload")):
                landed = self._landed(key, lambda meta: meta.etag == multipart_etag(parts))
                if landed is not None:
                    return landed
            raise self._err(exc, key, "CompleteMultipartUpload") from exc
        return self.head(key)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._k(key),
                                               UploadId=upload_id)
        except (ClientError, BotoCoreError) as exc:
            err = self._err(exc, key, "AbortMultipartUpload")
            if not isinstance(err, ObjectNotFound):
                raise err from exc

    def list_multipart(self, prefix: str = "") -> Iterator[MultipartUpload]:
        paginator = self.client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._k(prefix)):
                for u in page.get("Uploads", []):
                    yield MultipartUpload(self._unk(u["Key"]), u["UploadId"],
                                          _ms(u.get("Initiated")))
        except (ClientError, BotoCoreError) as exc:
            raise self._err(exc, prefix, "ListMultipartUploads") from exc

    def list_prefixes(self, prefix: str = "") -> list[str]:
        """Immediate common prefixes under ``prefix`` (ListObjectsV2 with Delimiter='/')."""
        full = self._k(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        out = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
                for cp in page.get("CommonPrefixes", []):
                    out.append(cp["Prefix"][len(full):].rstrip("/"))
        except (ClientError, BotoCoreError) as exc:
            raise self._err(exc, prefix, "LIST") from exc
        return out
