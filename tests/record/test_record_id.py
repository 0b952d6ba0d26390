"""A record's id (``record.new_request_id``): a UUIDv7, so the store's indexes on it grow
at their end, and still unguessable."""

from __future__ import annotations

import time
import uuid

from prefixgate.diagnostics.request import message_id, request_id_of
from prefixgate.record.record import new_request_id


def test_an_id_is_a_uuid7_of_the_time_it_was_given():
    before = time.time_ns() // 1_000_000
    rid = new_request_id()
    after = time.time_ns() // 1_000_000
    u = uuid.UUID(hex=rid)
    assert len(rid) == 32 and rid == rid.lower() and u.hex == rid
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert before <= u.int >> 80 <= after  # its first 48 bits: the Unix time in ms


def test_ids_of_the_same_millisecond_differ_in_their_random_bits():
    ids = [new_request_id(1_790_000_000_000) for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert {i[:12] for i in ids} == {f"{1_790_000_000_000:012x}"}
    # each of the 74 random bits is set in some ids and clear in others
    values = [uuid.UUID(hex=i).int for i in ids]
    random_bits = [*range(0, 62), *range(64, 76)]
    for bit in random_bits:
        ones = sum((v >> bit) & 1 for v in values)
        assert 0.4 * len(ids) < ones < 0.6 * len(ids), bit
    assert all(uuid.UUID(hex=i).version == 7 for i in ids[:100])


def test_ids_sort_in_the_order_of_their_times():
    times = [1_790_000_000_000 + k for k in (0, 1, 2, 1_000, 86_400_000, 2**40)]
    ids = [new_request_id(ms) for ms in times]
    assert ids == sorted(ids)
    assert [uuid.UUID(hex=i).int >> 80 for i in ids] == times


def test_an_answers_id_names_the_record_as_before():
    rid = new_request_id()
    assert request_id_of(message_id(rid)) == rid
    assert request_id_of(rid) == rid
