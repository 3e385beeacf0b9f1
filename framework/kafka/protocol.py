"""Which Kafka APIs the listener speaks, at which versions, and how a request is decoded.

:data:`SUPPORTED` maps an API key to the (min, max) versions this listener implements; it
is what ApiVersions advertises. Caps below kafka-python's maximum are where a later version
needs something eventlane does not have (topic ids in Produce/Fetch v13+, KIP-848 groups).
Error codes are Kafka's (``org.apache.kafka.common.protocol.Errors``).
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

from kafka.protocol.admin import (
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

__all__ = ["REQUESTS", "SUPPORTED", "ErrorCode", "UnsupportedVersionError", "decode_request"]


class ErrorCode(IntEnum):
    """Kafka's error codes used here."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    UNKNOWN_MEMBER_ID = 25
    REBALANCE_IN_PROGRESS = 27
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_CONFIG = 40
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    UNKNOWN_SERVER_ERROR = -1


REQUESTS: dict[int, Any] = {
    cls.API_KEY: cls
    for cls in (
        ProduceRequest,
        FetchRequest,
        ListOffsetsRequest,
        MetadataRequest,
        FindCoordinatorRequest,
        ApiVersionsRequest,
        CreateTopicsRequest,
        DeleteTopicsRequest,
        DeleteRecordsRequest,
        InitProducerIdRequest,
        DescribeConfigsRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        JoinGroupRequest,
        HeartbeatRequest,
        LeaveGroupRequest,
        SyncGroupRequest,
        DescribeGroupsRequest,
        ListGroupsRequest,
        DeleteGroupsRequest,
    )
}

_CAPS: dict[int, int] = {
    0: 12,  # Produce: v13 names topics by id
    1: 12,  # Fetch: v13 names topics by id
    3: 12,  # Metadata
    8: 9,  # OffsetCommit: v10 names topics by id
    9: 9,  # OffsetFetch: v10 names topics by id
}

SUPPORTED: dict[int, tuple[int, int]] = {
    key: (0, min(cls.max_version, _CAPS.get(key, cls.max_version))) for key, cls in REQUESTS.items()
}


class UnsupportedVersionError(Exception):
    """A request whose API or version this listener does not implement."""


def decode_request(payload: bytes) -> Any:
    """The request object of one frame's payload (header included)."""
    api_key, version = struct.unpack_from(">hh", payload)
    supported = SUPPORTED.get(api_key)
    if supported is None or not supported[0] <= version <= supported[1]:
        raise UnsupportedVersionError(f"api key {api_key} version {version} is not supported")
    return REQUESTS[api_key].decode(payload, version=version, header=True)
