"""An :class:`~mushroom_backup.store.base.ObjectStore` on S3 or an S3-compatible service
(AWS, Cloudflare R2, MinIO, Ceph RGW, SeaweedFS), on aiobotocore.

Promises
--------
* Keys are ``prefix/key`` in the bucket (just ``key`` for an empty prefix); ``list`` gives them
  back relative to the prefix, in the service's (ascending byte) order.
* Credentials, region, profile and endpoint come from the standard AWS environment variables and
  shared config files, resolved by botocore itself (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL`` and
  ``AWS_ENDPOINT_URL_S3``, ``AWS_DEFAULT_REGION``, profiles in ``~/.aws``). ``AWS_REGION`` is
  honoured too and wins over ``AWS_DEFAULT_REGION`` and the profile, as in the AWS CLI v2 and
  the other SDKs (botocore alone ignores it). No region anywhere: ``us-east-1``.
* With a configured endpoint (MinIO, SeaweedFS, Ceph, R2, ...) requests are path-style
  (``http://host/bucket/key``); without one, botocore's default (virtual-hosted
  ``bucket.s3.region.amazonaws.com`` wherever the bucket name allows it).
* Conditional writes are sent as ``If-None-Match: *`` (CREATE) and ``If-Match: <etag>``
  (Update, conditional delete), the ETag exactly as the service returned it, quotes included.
  A :class:`~mushroom_backup.store.base.Version` is that ETag plus the VersionId if any
  (``list`` gives the ETag alone: ListObjectsV2 reports no VersionId).
* One aiobotocore client per store, created on first use inside the running event loop and
  closed by :meth:`S3Store.close` (or ``async with``). Up to 32 pooled connections, so 16
  concurrent uploads and their reads never queue on the pool.
* Errors (see :func:`map_client_error` and :func:`map_transport_error`): 404 -> NotFound;
  412 -> AlreadyExists for CREATE, else PreconditionFailed; 409 ConditionalRequestConflict
  (a lost race on AWS) likewise; 501 to a conditional request -> ConditionalWritesUnsupported;
  throttling, 5xx, request timeouts, connection failures -> ``StoreError(retryable=True)``;
  anything else -> ``StoreError(retryable=False)``. Messages name the operation, the key, the
  HTTP status and the service's error code -- never credentials, request headers, signed URLs
  or the service's free-text message.

Not promised
------------
* Retries: botocore is configured to make exactly one attempt per call; the one retry layer is
  :mod:`mushroom_backup.retry`, in the caller.
* That the service honours the conditions (Ceph RGW 16 never matches a quoted ``If-Match``;
  MinIO is reported to ignore ``If-Match`` on DELETE). The bucket lease probes for that.
* A store belongs to the event loop of its first use (its client and connections do).
* SeaweedFS quirks (measured with 4.48): it lists in directory-tree order (see base.py), and
  it refuses a create-only write of ``a`` while ``a/...`` keys exist (a false AlreadyExists);
  the mushroom-backup layout never makes a key that is also a "directory" of other keys.
* Checksums beyond what the service requires (``when_required``): some S3-compatible services
  reject botocore's default trailing CRC checksums; data integrity is checked above the store
  (content-addressed chunks).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
from aiobotocore.config import AioConfig  # type: ignore[import-untyped]
from aiobotocore.session import AioSession  # type: ignore[import-untyped]
from botocore import exceptions as boto  # type: ignore[import-untyped]

from ..errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from .base import (
    OVERWRITE,
    Create,
    ObjectInfo,
    ObjectStore,
    Overwrite,
    PutMode,
    StoredObject,
    Update,
    Version,
)

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

log = logging.getLogger("mushroom_backup.store.s3")

DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
MAX_POOL_CONNECTIONS = 32

#: Error codes that mean "the service is busy or failed; the same request may succeed later".
RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)

_CREDENTIALS_HINT = (
    "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the "
    "bucket's permissions"
)
_HINTS = {
    "AccessDenied": _CREDENTIALS_HINT,
    "InvalidAccessKeyId": _CREDENTIALS_HINT,
    "SignatureDoesNotMatch": _CREDENTIALS_HINT,
    "ExpiredToken": "the session token has expired; refresh the credentials",
    "InvalidToken": "the session token is invalid; refresh the credentials",
    "RequestTimeTooSkewed": "this host's clock is off; synchronise it (NTP)",
    "AuthorizationHeaderMalformed": "wrong region; set AWS_REGION to the bucket's region",
    "PermanentRedirect": "wrong region or endpoint; set AWS_REGION to the bucket's region",
    "NoSuchBucket": "the bucket does not exist; check the store URL",
    "InvalidBucketName": "the bucket name is not valid for this service; check the store URL",
}


# --- error mapping (pure) ----------------------------------------------------------------------


def map_client_error(
    error: Any,
    *,
    op: str,
    key: str,
    mode: PutMode | None = None,
    condition_sent: bool = False,
) -> StoreError:
    """The StoreError for a botocore ``ClientError`` (the service answered with an error).

    ``mode`` is the put mode (None for reads and deletes); ``condition_sent`` says whether the
    request carried ``If-None-Match`` / ``If-Match``. See the module docstring for the table.
    """
    response: Mapping[str, Any] = getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = str(response.get("Error", {}).get("Code") or status or "unknown")
    answer = f"HTTP {status if status is not None else '?'} {code}"
    where = f"S3 {op} of {key!r} failed: {answer}"
    create = isinstance(mode, Create)

    if code == "NoSuchBucket":
        return StoreError(f"{where}: {_HINTS[code]}", key=key)
    if status == 412 or code == "PreconditionFailed":
        return AlreadyExists(key) if create else PreconditionFailed(key, answer)
    if code == "ConditionalRequestConflict":
        # AWS answers 409 to one of two racing conditional writes: a lost race.
        return AlreadyExists(key) if create else PreconditionFailed(key, answer)
    if status == 404 or code in ("NoSuchKey", "NotFound"):
        return NotFound(key)
    if status == 501 or code == "NotImplemented":
        if condition_sent:
            return ConditionalWritesUnsupported(
                key,
                f"{where}: the service does not support conditional writes "
                "(If-None-Match / If-Match); set MUSHROOM_BACKUP_LEASE_CONDITIONAL=off to run "
                "with a best-effort lease",
            )
        return StoreError(f"{where}: the service does not implement this request", key=key)
    if code in RETRYABLE_CODES or status == 429 or (status is not None and status >= 500):
        return StoreError(
            f"{where}: the service is throttling or failing; retry later", key=key, retryable=True
        )
    hint = _HINTS.get(code)
    if hint is None and status == 403:
        hint = _CREDENTIALS_HINT
    return StoreError(f"{where}: {hint}" if hint else where, key=key)


#: Transport failures: the request may not have reached the service, or its answer was lost.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    boto.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError
    boto.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
    boto.IncompleteReadError,
    aiohttp.ClientError,
    TimeoutError,
    OSError,
)


def map_transport_error(error: BaseException, *, op: str, key: str) -> StoreError:
    """The StoreError for anything but a service answer: no credentials, a bad profile, a
    connection that failed or timed out (retryable), or another botocore error."""
    where = f"S3 {op} of {key!r} failed"
    if isinstance(error, boto.NoCredentialsError | boto.PartialCredentialsError):
        return StoreError(
            f"{where}: no usable AWS credentials; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
            key=key,
        )
    if isinstance(error, boto.ProfileNotFound):
        return StoreError(
            f"{where}: the AWS profile named by AWS_PROFILE is not in the AWS config files",
            key=key,
        )
    if isinstance(error, _TRANSPORT_ERRORS):
        return StoreError(
            f"{where}: {type(error).__name__} (connection failed or timed out); retry later",
            key=key,
            retryable=True,
        )
    detail = " ".join(str(error).split())  # one line
    return StoreError(f"{where}: {type(error).__name__}: {detail}", key=key)


@contextmanager
def _translated(
    op: str, key: str, mode: PutMode | None = None, *, condition_sent: bool = False
) -> Iterator[None]:
    """Turn botocore/aiohttp failures inside the block into StoreErrors."""
    try:
        yield
    except boto.ClientError as e:
        # `from None`: the ClientError's text carries the service's free-form message.
        raise map_client_error(
            e, op=op, key=key, mode=mode, condition_sent=condition_sent
        ) from None
    except StoreError:
        raise
    except (boto.BotoCoreError, *_TRANSPORT_ERRORS) as e:
        raise map_transport_error(e, op=op, key=key) from e


# --- configuration -----------------------------------------------------------------------------

_data_loader: Any = None


def new_session() -> Any:
    """A fresh AioSession (it reads the environment and config files afresh) that shares one
    botocore data loader per process, so the S3 service model is parsed once rather than for
    every client (~80 ms each)."""
    global _data_loader
    session = AioSession()
    if _data_loader is None:
        _data_loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _data_loader)
    return session


def configured_endpoint(session: Any) -> str | None:
    """The endpoint URL botocore will use for S3, if one is configured (environment variable
    or shared config file, in botocore's own order), else None."""
    if session.get_config_variable("ignore_configured_endpoint_urls"):
        return None
    try:
        from botocore.configprovider import (  # type: ignore[import-untyped]
            ConfiguredEndpointProvider,
        )
    except ImportError:  # pragma: no cover - botocore moved it; fall back to the variables
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    provider = ConfiguredEndpointProvider(
        full_config=session.full_config,
        scoped_config=session.get_scoped_config(),
        client_name="s3",
    )
    endpoint = provider.provide()
    return str(endpoint) if endpoint else None


def resolve_region(session: Any) -> str:
    """``AWS_REGION``, else botocore's region (``AWS_DEFAULT_REGION``, the profile), else
    us-east-1."""
    return os.environ.get("AWS_REGION") or session.get_config_variable("region") or DEFAULT_REGION


def client_config(*, region: str, path_style: bool) -> Any:
    """The aiobotocore client configuration every S3Store uses."""
    return AioConfig(
        region_name=region,
        # One attempt: retries live in one layer, ours (mushroom_backup.retry).
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=MAX_POOL_CONNECTIONS,
        s3={"addressing_style": "path" if path_style else "auto"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


# --- the store ---------------------------------------------------------------------------------


class S3Store(ObjectStore):
    """One bucket and key prefix on an S3-compatible service. See the module docstring."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        conditional: bool = True,
        list_page_size: int = 1000,
    ) -> None:
        """``list_page_size`` is the ListObjectsV2 page size (1000, the service maximum; tests
        use small pages to cross page boundaries cheaply)."""
        if not bucket:
            raise ValueError("an S3 store needs a bucket")
        if not 1 <= list_page_size <= 1000:
            raise ValueError("list_page_size must be between 1 and 1000")
        self.list_page_size = list_page_size
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.conditional = conditional
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client: S3Client | None = None
        self._stack: AsyncExitStack | None = None
        self._opening: asyncio.Lock | None = None

    # --- lifetime ---------------------------------------------------------------------------

    async def _s3(self) -> S3Client:
        if self._client is not None:
            return self._client
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._client is None:
                with _translated("client setup", self.url):
                    stack = AsyncExitStack()
                    session = new_session()
                    endpoint = configured_endpoint(session)
                    region = resolve_region(session)
                    config = client_config(region=region, path_style=endpoint is not None)
                    client: S3Client = await stack.enter_async_context(
                        session.create_client("s3", region_name=region, config=config)
                    )
                    log.debug(
                        "s3_client_opened",
                        extra={
                            "fields": {
                                "bucket": self.bucket,
                                "region": region,
                                "endpoint": endpoint or "aws",
                            }
                        },
                    )
                self._stack, self._client = stack, client
        return self._client

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    # --- keys -------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        if not key:
            raise StoreError("an object key must not be empty", key=key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    @staticmethod
    def _version(answer: Mapping[str, Any]) -> Version:
        return Version(answer.get("ETag"), answer.get("VersionId"))

    # --- reads ------------------------------------------------------------------------------

    async def get(self, key: str) -> StoredObject:
        s3 = await self._s3()
        with _translated("get", key):
            answer = await s3.get_object(Bucket=self.bucket, Key=self._full(key))
            async with answer["Body"] as body:
                data: bytes = await body.read()
        return StoredObject(key, data, self._version(answer))

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError("range start and length must not be negative")
        if length == 0:
            await self.head(key)  # NotFound for a missing key, as for any other range
            return b""
        s3 = await self._s3()
        with _translated("get_range", key):
            try:
                answer = await s3.get_object(
                    Bucket=self.bucket,
                    Key=self._full(key),
                    Range=f"bytes={start}-{start + length - 1}",
                )
            except boto.ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                    return b""  # the object exists and ends before `start`
                raise
            async with answer["Body"] as body:
                data: bytes = await body.read()
        if "ContentRange" not in answer:
            # A service that ignored the Range header sent the whole object.
            data = data[start : start + length]
        return data

    async def head(self, key: str) -> ObjectInfo:
        s3 = await self._s3()
        with _translated("head", key):
            answer = await s3.head_object(Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(
            key, answer["ContentLength"], self._version(answer), answer.get("LastModified")
        )

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        s3 = await self._s3()
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        paginator = s3.get_paginator("list_objects_v2")
        with _translated("list", prefix):
            pages = paginator.paginate(
                Bucket=self.bucket,
                Prefix=full_prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            async for page in pages:
                for entry in page.get("Contents", []):
                    yield ObjectInfo(
                        self._relative(entry["Key"]),
                        entry["Size"],
                        Version(entry.get("ETag")),
                        entry.get("LastModified"),
                    )

    # --- writes -----------------------------------------------------------------------------

    async def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> Version:
        if isinstance(mode, Create | Update) and not self.conditional:
            raise ConditionalWritesUnsupported(key)
        if isinstance(mode, Update) and mode.version.etag is None:
            raise StoreError(
                f"cannot update {key!r} conditionally: its version has no ETag", key=key
            )
        s3 = await self._s3()
        full = self._full(key)
        with _translated("put", key, mode, condition_sent=not isinstance(mode, Overwrite)):
            if isinstance(mode, Create):
                answer = await s3.put_object(
                    Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*"
                )
            elif isinstance(mode, Update):
                answer = await s3.put_object(
                    Bucket=self.bucket, Key=full, Body=data, IfMatch=str(mode.version.etag)
                )
            else:
                answer = await s3.put_object(Bucket=self.bucket, Key=full, Body=data)
        return self._version(answer)

    async def delete(self, key: str, if_match: Version | None = None) -> None:
        s3 = await self._s3()
        if if_match is not None and if_match.etag is None:
            raise StoreError(f"cannot delete {key!r} conditionally: no ETag given", key=key)
        with _translated("delete", key, condition_sent=if_match is not None):
            if if_match is None:
                await s3.delete_object(Bucket=self.bucket, Key=self._full(key))
            else:
                await s3.delete_object(
                    Bucket=self.bucket, Key=self._full(key), IfMatch=str(if_match.etag)
                )


__all__ = [
    "S3Store",
    "client_config",
    "configured_endpoint",
    "map_client_error",
    "map_transport_error",
    "new_session",
    "resolve_region",
]
