"""Kafka-compatible key placement: murmur2 vectors, the partition formula, keyless spreading.

Both implementations are proven: the pure-Python reference (``murmur2_py``) and the C
extension ``eventlane.log._native``. The extension is part of the product: if it did not
build, the native tests fail (they are never skipped); the pure-Python tests still run.
"""

from __future__ import annotations

import doctest
import importlib
import threading
from collections import Counter
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlane.log import partitioner
from eventlane.log.partitioner import (
    KeylessSpreader,
    murmur2,
    murmur2_py,
    partition_for_key,
    partitions_for_keys,
    to_positive,
)

# apache/kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
# testMurmur2: the exact cases, expected values as Java ints.
KAFKA_UTILS_TEST_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]

# dpkp/kafka-python, test/producer/test_partitioner.py, test_murmur2_java_compatibility:
# partition of each key among 1000 partitions, "compare with output from Kafka's
# org.apache.kafka.clients.producer.Partitioner".
KAFKA_PYTHON_PARTITIONS_OF_1000 = [
    (b"", 681),
    (b"a", 524),
    (b"ab", 434),
    (b"abc", 107),
    (b"123456789", 566),
    (b"\x00 ", 742),
]


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The C extension; a missing build is a test failure, not a skip."""
    return importlib.import_module("eventlane.log._native")


def _py_partition(key: bytes, n: int) -> int:
    return to_positive(murmur2_py(key)) % n


# ---------------------------------------------------------------------------- vectors


@pytest.mark.parametrize(("data", "expected"), KAFKA_UTILS_TEST_MURMUR2)
def test_murmur2_py_matches_kafka_utils_test(data: bytes, expected: int) -> None:
    assert murmur2_py(data) == expected


@pytest.mark.parametrize(("data", "expected"), KAFKA_UTILS_TEST_MURMUR2)
def test_native_murmur2_matches_kafka_utils_test(
    native: ModuleType, data: bytes, expected: int
) -> None:
    assert native.murmur2(data) == expected


@pytest.mark.parametrize(("key", "expected"), KAFKA_PYTHON_PARTITIONS_OF_1000)
def test_py_partition_matches_kafka_python_vectors(key: bytes, expected: int) -> None:
    assert _py_partition(key, 1000) == expected
    assert partitioner._py_partition_for_key(key, 1000) == expected


@pytest.mark.parametrize(("key", "expected"), KAFKA_PYTHON_PARTITIONS_OF_1000)
def test_native_partition_matches_kafka_python_vectors(
    native: ModuleType, key: bytes, expected: int
) -> None:
    assert native.partition_for_key(key, 1000) == expected


def test_native_batch_form_matches_vectors(native: ModuleType) -> None:
    keys = [key for key, _ in KAFKA_PYTHON_PARTITIONS_OF_1000]
    assert native.partitions_for_keys(keys, 1000) == [p for _, p in KAFKA_PYTHON_PARTITIONS_OF_1000]
    assert partitioner._py_partitions_for_keys(keys, 1000) == [
        p for _, p in KAFKA_PYTHON_PARTITIONS_OF_1000
    ]


def test_public_api_is_native(native: ModuleType) -> None:
    assert partitioner.NATIVE
    assert murmur2 is native.murmur2
    assert partition_for_key is native.partition_for_key
    assert partitions_for_keys is native.partitions_for_keys


def test_every_tail_length_is_a_java_int() -> None:
    # 0..3 tail bytes after 0, 1 and 2 full blocks, with high bytes (Java's signed bytes).
    for n in range(12):
        data = bytes(range(0x80, 0x80 + n))
        value = murmur2_py(data)
        assert -(2**31) <= value < 2**31
        assert murmur2(data) == value


# ---------------------------------------------------------------------------- equivalence


@given(st.binary(max_size=300))
def test_native_equals_pure_python(data: bytes) -> None:
    assert murmur2(data) == murmur2_py(data)


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_is_kafkas_formula(key: bytes, n: int) -> None:
    expected = (murmur2_py(key) & 0x7FFFFFFF) % n
    assert partition_for_key(key, n) == expected
    assert partitioner._py_partition_for_key(key, n) == expected
    assert 0 <= expected < n


@given(st.lists(st.binary(max_size=40), max_size=50), st.integers(min_value=1, max_value=500))
def test_batch_form_equals_single_form(keys: list[bytes], n: int) -> None:
    expected = [_py_partition(key, n) for key in keys]
    assert partitions_for_keys(keys, n) == expected
    assert partitions_for_keys(tuple(keys), n) == expected
    assert partitioner._py_partitions_for_keys(keys, n) == expected


def test_bytes_like_keys_hash_as_their_bytes() -> None:
    data = b"order-42"
    expected = murmur2_py(data)
    for form in (bytearray(data), memoryview(data)):
        assert murmur2(form) == expected
        assert murmur2_py(form) == expected
        assert partition_for_key(form, 7) == _py_partition(data, 7)
    assert (
        partitions_for_keys([bytearray(data), memoryview(data)], 7) == [_py_partition(data, 7)] * 2
    )


def test_to_positive_is_a_mask_not_abs() -> None:
    assert to_positive(-973932308) == 1173551340
    assert to_positive(-(2**31)) == 0  # abs() would overflow in Java; the mask gives 0
    assert to_positive(2**31 - 1) == 2**31 - 1


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("n", [0, -1])
def test_partition_count_must_be_positive(n: int) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_key(b"k", n)
    with pytest.raises(ValueError, match="num_partitions"):
        partitions_for_keys([b"k"], n)
    with pytest.raises(ValueError, match="num_partitions"):
        partitioner._py_partition_for_key(b"k", n)
    with pytest.raises(ValueError, match="num_partitions"):
        KeylessSpreader(n)


def test_bad_keys_raise_type_error() -> None:
    with pytest.raises(TypeError):
        partition_for_key(None, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        partitioner._py_partition_for_key(None, 3)  # type: ignore[arg-type]
    for batch_form in (partitions_for_keys, partitioner._py_partitions_for_keys):
        with pytest.raises(TypeError, match="key 1 must be bytes, not str"):
            batch_form([b"a", "b"], 3)  # type: ignore[list-item]
        with pytest.raises(TypeError, match="key 0 is None"):
            batch_form([None], 3)  # type: ignore[list-item]
    for hash_fn in (murmur2, murmur2_py):
        with pytest.raises(TypeError):
            hash_fn("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            hash_fn(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- keyless


def test_keyless_spreader_is_round_robin_between_batches() -> None:
    spreader = KeylessSpreader(4, start=2)
    assert [spreader.next_partition() for _ in range(9)] == [2, 3, 0, 1, 2, 3, 0, 1, 2]


def test_keyless_spreader_random_start_and_even_spread() -> None:
    starts = {KeylessSpreader(5).next_partition() for _ in range(200)}
    assert starts <= set(range(5))
    assert len(starts) > 1  # random start (200 draws of 5 values)
    spreader = KeylessSpreader(5)
    counts = Counter(spreader.next_partition() for _ in range(1000))
    assert set(counts.values()) == {200}


def test_keyless_spreader_threads_share_the_rotation() -> None:
    spreader = KeylessSpreader(8, start=0)
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        got = [spreader.next_partition() for _ in range(1000)]
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(seen) == dict.fromkeys(range(8), 500)


def test_single_partition_topic() -> None:
    spreader = KeylessSpreader(1)
    assert {spreader.next_partition() for _ in range(10)} == {0}
    assert partition_for_key(b"anything", 1) == 0


# ---------------------------------------------------------------------------- docs


def test_docstring_examples_run() -> None:
    result = doctest.testmod(partitioner, raise_on_error=False)
    assert result.attempted >= 8
    assert result.failed == 0
