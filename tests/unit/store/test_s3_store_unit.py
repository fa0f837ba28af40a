"""The S3 store without a server: the error mapping as a table over fabricated botocore errors,
the requests each call sends (a fake client records them), and how the client is configured
from the AWS environment and config files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiobotocore.session import AioSession  # type: ignore[import-untyped]
from botocore import exceptions as boto  # type: ignore[import-untyped]

from mushroom_backup.errors import (
    AlreadyExists,
    ConditionalWritesUnsupported,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from mushroom_backup.store import CREATE, OVERWRITE, PutMode, Update, Version
from mushroom_backup.store.s3 import (
    S3Store,
    client_config,
    configured_endpoint,
    map_client_error,
    map_transport_error,
    new_session,
    resolve_region,
)

SECRETISH = "AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY StringToSign"
V1 = Version('"9dd4e461268c8034f5c8564e155c67a6"')


def client_error(status: int, code: str, operation: str = "PutObject") -> Any:
    return boto.ClientError(
        {
            "Error": {"Code": code, "Message": f"the service says {SECRETISH}"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
        },
        operation,
    )


# --- the error table -----------------------------------------------------------------------

NOT_RETRYABLE, RETRYABLE = False, True

CLIENT_ERRORS: list[tuple[int, str, PutMode | None, bool, type[StoreError], bool, str]] = [
    # (status, code, put mode or None for reads/deletes, condition sent,
    #  expected class, retryable, words in the message)
    (412, "PreconditionFailed", CREATE, True, AlreadyExists, NOT_RETRYABLE, "already exists"),
    (412, "PreconditionFailed", Update(V1), True, PreconditionFailed, NOT_RETRYABLE, "412"),
    (412, "PreconditionFailed", None, True, PreconditionFailed, NOT_RETRYABLE, "refused"),
    (409, "ConditionalRequestConflict", CREATE, True, AlreadyExists, NOT_RETRYABLE, "exists"),
    (409, "ConditionalRequestConflict", Update(V1), True, PreconditionFailed, False, "409"),
    (404, "NoSuchKey", None, False, NotFound, NOT_RETRYABLE, "does not exist"),
    (404, "404", None, False, NotFound, NOT_RETRYABLE, "does not exist"),  # HEAD: no body
    (404, "NoSuchKey", Update(V1), True, NotFound, NOT_RETRYABLE, "does not exist"),
    (404, "NoSuchBucket", None, False, StoreError, NOT_RETRYABLE, "check the store URL"),
    (501, "NotImplemented", CREATE, True, ConditionalWritesUnsupported, False, "LEASE_COND"),
    (501, "NotImplemented", None, True, ConditionalWritesUnsupported, False, "If-Match"),
    (501, "NotImplemented", OVERWRITE, False, StoreError, NOT_RETRYABLE, "does not implement"),
    (503, "SlowDown", OVERWRITE, False, StoreError, RETRYABLE, "retry later"),
    (503, "ServiceUnavailable", None, False, StoreError, RETRYABLE, "retry later"),
    (500, "InternalError", CREATE, True, StoreError, RETRYABLE, "retry later"),
    (502, "BadGateway", None, False, StoreError, RETRYABLE, "retry later"),
    (400, "RequestTimeout", OVERWRITE, False, StoreError, RETRYABLE, "retry later"),
    (429, "TooManyRequests", None, False, StoreError, RETRYABLE, "retry later"),
    (409, "OperationAborted", CREATE, True, StoreError, RETRYABLE, "retry later"),
    (403, "AccessDenied", None, False, StoreError, NOT_RETRYABLE, "AWS_ACCESS_KEY_ID"),
    (403, "SignatureDoesNotMatch", None, False, StoreError, NOT_RETRYABLE, "AWS_PROFILE"),
    (403, "SomethingNew", None, False, StoreError, NOT_RETRYABLE, "check the credentials"),
    (400, "RequestTimeTooSkewed", None, False, StoreError, NOT_RETRYABLE, "NTP"),
    (400, "AuthorizationHeaderMalformed", None, False, StoreError, False, "AWS_REGION"),
    (400, "InvalidArgument", OVERWRITE, False, StoreError, NOT_RETRYABLE, "InvalidArgument"),
]


@pytest.mark.parametrize(
    ("status", "code", "mode", "sent", "expected", "retryable", "words"), CLIENT_ERRORS
)
def test_service_errors_map_to_the_store_error_tree(
    status: int,
    code: str,
    mode: PutMode | None,
    sent: bool,
    expected: type[StoreError],
    retryable: bool,
    words: str,
) -> None:
    error = map_client_error(
        client_error(status, code), op="put", key="LEASE", mode=mode, condition_sent=sent
    )

    assert type(error) is expected
    assert error.retryable is retryable
    assert error.key == "LEASE"
    assert words in error.message
    assert "\n" not in error.message
    for secret in SECRETISH.split():
        assert secret not in error.message  # never the service's free text


def test_a_generic_service_error_names_operation_key_status_and_code() -> None:
    error = map_client_error(client_error(503, "SlowDown"), op="put", key="data/ab/cd")
    assert error.message == (
        "S3 put of 'data/ab/cd' failed: HTTP 503 SlowDown: the service is throttling or "
        "failing; retry later"
    )


TRANSPORT_ERRORS: list[tuple[BaseException, bool, str]] = [
    (boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"), RETRYABLE, "retry"),
    (boto.ConnectTimeoutError(endpoint_url="http://h/b/k"), RETRYABLE, "ConnectTimeoutError"),
    (boto.ReadTimeoutError(endpoint_url="http://h/b/k"), RETRYABLE, "ReadTimeoutError"),
    (boto.ConnectionClosedError(endpoint_url="http://h/b/k"), RETRYABLE, "connection failed"),
    (boto.ResponseStreamingError(error="reset"), RETRYABLE, "ResponseStreamingError"),
    (boto.IncompleteReadError(actual_bytes=1, expected_bytes=2), RETRYABLE, "Incomplete"),
    (aiohttp.ClientPayloadError("truncated"), RETRYABLE, "ClientPayloadError"),
    (TimeoutError(), RETRYABLE, "TimeoutError"),
    (ConnectionResetError(104, "reset"), RETRYABLE, "ConnectionResetError"),
    (boto.NoCredentialsError(), NOT_RETRYABLE, "set AWS_ACCESS_KEY_ID and AWS_SECRET"),
    (
        boto.PartialCredentialsError(provider="env", cred_var="aws_secret_access_key"),
        NOT_RETRYABLE,
        "no usable AWS credentials",
    ),
    (boto.ProfileNotFound(profile="ci"), NOT_RETRYABLE, "AWS_PROFILE"),
    (boto.ParamValidationError(report="Invalid bucket\nname"), NOT_RETRYABLE, "Invalid bucket"),
]


@pytest.mark.parametrize(("error", "retryable", "words"), TRANSPORT_ERRORS)
def test_transport_and_configuration_errors_map_to_store_errors(
    error: BaseException, retryable: bool, words: str
) -> None:
    mapped = map_transport_error(error, op="get", key="LEASE")

    assert type(mapped) is StoreError
    assert mapped.retryable is retryable
    assert words in mapped.message
    assert mapped.message.startswith("S3 get of 'LEASE' failed: ")
    assert "\n" not in mapped.message


# --- the requests each call sends (fake client) --------------------------------------------


class FakeBody:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aenter__(self) -> FakeBody:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self.data


class FakeS3:
    """Records every call; answers from ``answers`` (an exception is raised)."""

    def __init__(self, *answers: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers = list(answers)

    def _answer(self, name: str, kwargs: dict[str, Any]) -> Any:
        self.calls.append((name, kwargs))
        answer = self.answers.pop(0) if self.answers else {}
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def put_object(self, **kwargs: Any) -> Any:
        return self._answer("put_object", kwargs)

    async def get_object(self, **kwargs: Any) -> Any:
        return self._answer("get_object", kwargs)

    async def head_object(self, **kwargs: Any) -> Any:
        return self._answer("head_object", kwargs)

    async def delete_object(self, **kwargs: Any) -> Any:
        return self._answer("delete_object", kwargs)


def with_fake(fake: FakeS3, *, conditional: bool = True) -> S3Store:
    store = S3Store("backups", "prod/db1", conditional=conditional)
    store._client = fake  # type: ignore[assignment]
    return store


PUT_HEADERS: list[tuple[PutMode, dict[str, str]]] = [
    (CREATE, {"IfNoneMatch": "*"}),
    (Update(V1), {"IfMatch": '"9dd4e461268c8034f5c8564e155c67a6"'}),  # quoted, as returned
    (Update(Version('W/"weak"', "v2")), {"IfMatch": 'W/"weak"'}),
    (OVERWRITE, {}),
]


@pytest.mark.parametrize(("mode", "conditions"), PUT_HEADERS)
async def test_put_sends_the_mode_as_exactly_one_condition(
    mode: PutMode, conditions: dict[str, str]
) -> None:
    fake = FakeS3({"ETag": '"new"', "VersionId": "v9"})

    version = await with_fake(fake).put("LEASE", b"body", mode)

    assert fake.calls == [
        ("put_object", {"Bucket": "backups", "Key": "prod/db1/LEASE", "Body": b"body"} | conditions)
    ]
    assert version == Version('"new"', "v9")


async def test_a_refused_create_and_a_refused_update_raise_different_errors() -> None:
    fake = FakeS3(client_error(412, "PreconditionFailed"), client_error(412, "PreconditionFailed"))
    store = with_fake(fake)

    with pytest.raises(AlreadyExists):
        await store.put("LEASE", b"x", CREATE)
    with pytest.raises(PreconditionFailed) as refused:
        await store.put("LEASE", b"x", Update(V1))
    assert not isinstance(refused.value, AlreadyExists)


async def test_501_to_a_conditional_write_means_conditional_writes_are_unsupported() -> None:
    fake = FakeS3(client_error(501, "NotImplemented"), client_error(501, "NotImplemented"))
    store = with_fake(fake)

    with pytest.raises(ConditionalWritesUnsupported):
        await store.put("LEASE", b"x", CREATE)
    with pytest.raises(StoreError) as plain:
        await store.put("LEASE", b"x", OVERWRITE)
    assert not isinstance(plain.value, ConditionalWritesUnsupported)


@pytest.mark.parametrize("mode", [CREATE, Update(V1)])
async def test_a_best_effort_client_sends_nothing_conditional(mode: PutMode) -> None:
    fake = FakeS3()
    with pytest.raises(ConditionalWritesUnsupported):
        await with_fake(fake, conditional=False).put("LEASE", b"x", mode)
    assert fake.calls == []


async def test_delete_sends_if_match_only_when_asked() -> None:
    fake = FakeS3({}, {}, client_error(412, "PreconditionFailed"))
    store = with_fake(fake)

    await store.delete("LEASE")
    await store.delete("LEASE", if_match=V1)
    with pytest.raises(PreconditionFailed):
        await store.delete("LEASE", if_match=V1)

    assert [kwargs for _, kwargs in fake.calls] == [
        {"Bucket": "backups", "Key": "prod/db1/LEASE"},
        {"Bucket": "backups", "Key": "prod/db1/LEASE", "IfMatch": V1.etag},
        {"Bucket": "backups", "Key": "prod/db1/LEASE", "IfMatch": V1.etag},
    ]


async def test_get_range_asks_for_an_inclusive_byte_range() -> None:
    fake = FakeS3({"Body": FakeBody(b"cdef"), "ContentRange": "bytes 2-5/10", "ETag": '"e"'})

    assert await with_fake(fake).get_range("data/p", 2, 4) == b"cdef"
    assert fake.calls[0][1]["Range"] == "bytes=2-5"


async def test_get_range_beyond_the_end_is_empty_and_an_ignored_range_is_sliced() -> None:
    fake = FakeS3(
        client_error(416, "InvalidRange", "GetObject"),
        {"Body": FakeBody(b"0123456789"), "ETag": '"e"'},  # no ContentRange: whole object
    )
    store = with_fake(fake)

    assert await store.get_range("data/p", 50, 4) == b""
    assert await store.get_range("data/p", 2, 4) == b"2345"


async def test_get_and_head_return_the_etag_and_version_id_verbatim() -> None:
    fake = FakeS3(
        {"Body": FakeBody(b"x"), "ETag": '"abc"', "VersionId": "3HL4kqtJ"},
        {"ContentLength": 1, "ETag": '"abc"', "VersionId": "3HL4kqtJ"},
    )
    store = with_fake(fake)

    assert (await store.get("LATEST")).version == Version('"abc"', "3HL4kqtJ")
    assert (await store.head("LATEST")).version == Version('"abc"', "3HL4kqtJ")


# --- configuration from the environment ----------------------------------------------------


@pytest.fixture
def aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An AWS config file the session reads (the isolation fixture points elsewhere)."""
    path = tmp_path / "aws-config"
    path.write_text(
        "[default]\nregion = eu-west-3\n\n"
        "[profile ci]\nregion = ap-south-1\nendpoint_url = http://ci.example:9000\n\n"
        "[profile r2]\nservices = r2-services\n\n"
        "[services r2-services]\ns3 =\n  endpoint_url = https://acct.r2.example\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    return path


REGIONS = [
    # (environment, expected region)
    ({}, "eu-west-3"),  # the default profile
    ({"AWS_PROFILE": "ci"}, "ap-south-1"),
    ({"AWS_DEFAULT_REGION": "us-west-2"}, "us-west-2"),
    ({"AWS_REGION": "eu-central-1", "AWS_DEFAULT_REGION": "us-west-2"}, "eu-central-1"),
    ({"AWS_REGION": "eu-central-1", "AWS_PROFILE": "ci"}, "eu-central-1"),
]


@pytest.mark.parametrize(("env", "region"), REGIONS)
def test_the_region_comes_from_aws_region_then_botocore(
    aws_config: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], region: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert resolve_region(AioSession()) == region


def test_without_any_region_configured_it_is_us_east_1() -> None:
    assert resolve_region(AioSession()) == "us-east-1"


ENDPOINTS = [
    ({}, None),
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:8333"}, "http://127.0.0.1:8333"),
    (
        {"AWS_ENDPOINT_URL": "http://global:1", "AWS_ENDPOINT_URL_S3": "http://s3only:2"},
        "http://s3only:2",
    ),
    ({"AWS_PROFILE": "ci"}, "http://ci.example:9000"),
    ({"AWS_PROFILE": "r2"}, "https://acct.r2.example"),
    (
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true",
        },
        None,
    ),
]


@pytest.mark.parametrize(("env", "endpoint"), ENDPOINTS)
def test_the_endpoint_is_found_where_botocore_finds_it(
    aws_config: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], endpoint: str | None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert configured_endpoint(AioSession()) == endpoint


def test_the_client_makes_one_attempt_with_bounded_timeouts_and_a_pool_for_16_uploads() -> None:
    config = client_config(region="eu-west-3", path_style=True)

    assert config.retries == {"mode": "standard", "total_max_attempts": 1}
    assert (config.connect_timeout, config.read_timeout) == (10.0, 60.0)
    assert config.max_pool_connections >= 16 + 8
    assert config.s3 == {"addressing_style": "path"}
    assert client_config(region="eu-west-3", path_style=False).s3 == {"addressing_style": "auto"}


@pytest.fixture
async def opened() -> AsyncIterator[S3Store]:
    store = S3Store("backups", "p")
    try:
        yield store
    finally:
        await store.close()


async def test_with_an_endpoint_the_client_is_path_style_on_that_endpoint(
    monkeypatch: pytest.MonkeyPatch, opened: S3Store
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")

    client: Any = await opened._s3()

    assert client.meta.endpoint_url == "http://127.0.0.1:8333"
    assert client.meta.region_name == "eu-west-3"
    assert client.meta.config.s3 == {"addressing_style": "path"}
    assert await opened._s3() is client  # one client per store


async def test_without_an_endpoint_the_client_talks_to_aws(opened: S3Store) -> None:
    client: Any = await opened._s3()

    assert client.meta.region_name == "us-east-1"
    assert "amazonaws.com" in client.meta.endpoint_url
    assert client.meta.config.s3 == {"addressing_style": "auto"}


async def test_close_releases_the_client_and_is_idempotent(opened: S3Store) -> None:
    await opened._s3()
    await opened.close()
    await opened.close()
    assert opened._client is None


async def test_a_missing_profile_is_a_clear_error_at_first_use(
    monkeypatch: pytest.MonkeyPatch, opened: S3Store
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")

    with pytest.raises(StoreError) as failed:
        await opened.get("LEASE")

    assert "the AWS profile named by AWS_PROFILE" in failed.value.message
    assert not failed.value.retryable


async def test_each_store_reads_the_environment_afresh_but_parses_the_model_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoints = []
    sessions = []
    for port in (8333, 9000):
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        async with S3Store("backups", "p") as store:
            client: Any = await store._s3()
            endpoints.append(client.meta.endpoint_url)
        sessions.append(new_session())

    assert endpoints == ["http://127.0.0.1:8333", "http://127.0.0.1:9000"]
    assert sessions[0] is not sessions[1]
    assert sessions[0].get_component("data_loader") is sessions[1].get_component("data_loader")
