"""Every nats-py error class maps to an eventlane error with the right flags
(eventlane/log/jetstream/errors.py): for writes, an answer that never came is "unknown";
"nothing received it" is "unavailable"; a refusal is permanent; nothing stays a nats error."""

from __future__ import annotations

import inspect

import nats.errors
import nats.js.errors
import pytest

from eventlane.errors import (
    ConcurrencyError,
    FrameworkError,
    LogError,
    LogUnavailableError,
    OutcomeUnknownError,
    RecordTooLargeError,
    UnknownTopicError,
)
from eventlane.log.jetstream.errors import translate


def _api(code: int, err_code: int, text: str) -> nats.js.errors.APIError:
    return nats.js.errors.APIError(code=code, err_code=err_code, description=text)


@pytest.mark.parametrize(
    ("exc", "write", "expected"),
    [
        (nats.errors.TimeoutError(), True, OutcomeUnknownError),
        (nats.errors.TimeoutError(), False, LogUnavailableError),
        (TimeoutError(), True, OutcomeUnknownError),
        (nats.errors.ConnectionClosedError(), True, OutcomeUnknownError),
        (nats.errors.ConnectionClosedError(), False, LogUnavailableError),
        (nats.errors.StaleConnectionError(), True, OutcomeUnknownError),
        (nats.errors.NoRespondersError(), True, LogUnavailableError),
        (nats.js.errors.NoStreamResponseError(), True, LogUnavailableError),
        (nats.errors.NoServersError(), False, LogUnavailableError),
        (_api(409, 10158, "duplicate message id is in process"), True, OutcomeUnknownError),
        (_api(500, 10077, "store is closed"), True, OutcomeUnknownError),
        (_api(503, 10008, "JetStream cluster not available"), True, OutcomeUnknownError),
        (_api(503, 10008, "JetStream cluster not available"), False, LogUnavailableError),
        (_api(429, 10167, "too many requests"), True, OutcomeUnknownError),
        (_api(400, 10071, "wrong last sequence: 7"), True, ConcurrencyError),
        (_api(404, 10059, "stream not found"), True, UnknownTopicError),
        (_api(413, 0, "maximum payload exceeded"), True, RecordTooLargeError),
        (_api(400, 10052, "invalid stream config"), True, LogError),
        # a placement refused while a peer is offline (CI saw it on a just-started cluster):
        # worth waiting for; nothing was created, so never "unknown"
        (
            _api(400, 10005, "no suitable peers for placement, peer offline"),
            False,
            LogUnavailableError,
        ),
        (
            _api(400, 10005, "no suitable peers for placement, peer offline"),
            True,
            LogUnavailableError,
        ),
        (
            _api(400, 10005, "no suitable peers for placement, insufficient resources"),
            False,
            LogError,
        ),
    ],
)
def test_nats_errors_map_to_eventlane_errors_with_their_flags(
    exc: BaseException, write: bool, expected: type[FrameworkError]
) -> None:
    got = translate(exc, topic="t", partition=2, write=write)
    assert type(got) is expected, f"{exc!r} -> {got!r}"
    assert got.topic == "t"
    if expected is OutcomeUnknownError:
        assert got.indeterminate and not got.retriable
    if expected is LogUnavailableError:
        assert got.retriable and not got.indeterminate
    if expected is LogError:  # a refusal: nothing stored, permanent
        assert not got.retriable and not got.indeterminate and "refused" in str(got)


def test_no_nats_error_class_is_left_untranslated() -> None:
    """Every exception class nats-py defines becomes one of eventlane's."""
    classes = {
        cls
        for module in (nats.errors, nats.js.errors)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__.startswith("nats")
    }
    assert len(classes) > 30
    for cls in classes:
        try:
            exc = cls()
        except TypeError:
            continue  # needs arguments: covered by its base class
        for write in (False, True):
            assert isinstance(translate(exc, write=write), FrameworkError), cls


def test_stream_creation_waits_out_an_offline_peer() -> None:
    """``Connection.retry`` asks again while placement fails for an offline peer, and gives up
    on a placement no wait can satisfy."""
    import asyncio  # noqa: PLC0415

    from eventlane.log.jetstream.connection import Connection  # noqa: PLC0415

    conn = Connection("ns", replicas=3, timeout=1.0, retry_s=10.0)
    refusals = [_api(400, 10005, "no suitable peers for placement, peer offline")] * 2

    async def create() -> str:
        if refusals:
            raise refusals.pop()
        return "created"

    assert asyncio.run(conn.retry(create, what="create stream")) == "created"
    assert not refusals

    async def too_few_servers() -> str:
        raise _api(400, 10005, "no suitable peers for placement, insufficient resources")

    with pytest.raises(nats.js.errors.APIError):
        asyncio.run(conn.retry(too_few_servers, what="create stream"))
