"""The sizes a transaction's buffer and the publishers count records by: the columnar
sum over a list equals the record-by-record one, whatever the list holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidings import Record
from tidings.client.batching import record_size, records_size

records = st.builds(
    Record,
    st.binary(max_size=40),
    st.none() | st.binary(max_size=10),
    st.dictionaries(st.text(max_size=5), st.binary(max_size=5), max_size=3),
    st.none() | st.integers(1, 100),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=40), max_size=20)
    | st.lists(records, max_size=20)
    | st.lists(st.binary(max_size=40) | records, max_size=20)
)
def test_records_size_is_the_sum_of_record_sizes(batch: list[bytes | Record]) -> None:
    assert records_size(batch) == sum(map(record_size, batch))


def test_records_size_counts_keys_and_headers_but_not_ttl() -> None:
    keyed = [Record(b"abc", b"kk"), Record(b"", None, {"n": b"vv"}, 5)]
    assert records_size(keyed) == 3 + 2 + 1 + 2
    assert records_size([b"abc", b""]) == 3
    assert records_size([]) == 0
