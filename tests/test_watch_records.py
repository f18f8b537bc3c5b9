"""Records the Kafka client cannot read (xzatoma_watch's batch reader), in-process: batches built by kafka-python's
own builder, then broken the way a hostile or buggy producer breaks them (the broker keeps what it is sent:
tests/test_watch.py sends such batches through a real one). What is read must be exactly what was sent; what is
not must be a stand-in naming its offsets; no offset may be given out twice."""

import gzip
import json
import struct

import pytest

import xzatoma_watch as w

kafka = pytest.importorskip("kafka")
records = pytest.importorskip("kafka.record.default_records")
w.guard_client(kafka)


def build(values, deltas=None, headers=None):
    """A v2 batch (uncompressed) of `values` at offset deltas `deltas` (default 0, 1, 2, …)."""
    builder = records.DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                                producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(deltas[i] if deltas else i, timestamp=1700000000000, key=None, value=value,
                       headers=(headers or {}).get(i, []))
    return bytearray(builder.build())


def spans(buf):
    """(start, length of its length prefix, length) of each record of an uncompressed batch."""
    out, pos = [], records.DefaultRecordBatch.HEADER_STRUCT.size
    while pos < len(buf):
        length, after = records.decode_varint(buf, pos)
        out.append((pos, after - pos, length))
        pos = after + length
    return out


def set_length(buf, record, length):
    """Rewrite one record's length prefix (the batch's own length and CRC made right again)."""
    start, size, _ = spans(buf)[record]
    prefix = bytearray()
    records.encode_varint(length, prefix.append)
    buf[start:start + size] = prefix
    reseal(buf)


def reseal(buf):
    struct.pack_into(">i", buf, records.DefaultRecordBatch.AFTER_LEN_OFFSET - 4,
                     len(buf) - records.DefaultRecordBatch.AFTER_LEN_OFFSET)
    crc = records.calc_crc32c(memoryview(buf)[records.DefaultRecordBatch.ATTRIBUTES_OFFSET:])
    struct.pack_into(">I", buf, records.DefaultRecordBatch.CRC_OFFSET, crc)


def read(buf):
    """What the client is given for a batch: (offset, value) for each record, ('unread', first, last) for each
    stand-in."""
    out = []
    for record in records.DefaultRecordBatch(bytes(buf)):
        unread = w.unread_stand_in(record.headers)
        out.append(("unread", unread[0], record.offset) if unread else (record.offset, record.value))
    return out


def offsets_given(items):
    seen = []
    for item in items:
        seen.extend(range(item[1], item[2] + 1) if item[0] == "unread" else [item[0]])
    return seen


VALUES = [b"e%d" % i for i in range(6)]


def test_a_readable_batch_is_read_as_sent_and_gaps_of_compaction_are_not_noted():
    assert read(build(VALUES)) == list(enumerate(VALUES))
    assert read(build(VALUES[:3], deltas=[0, 2, 5])) == [(0, b"e0"), (2, b"e1"), (5, b"e2")]


def test_a_record_whose_header_name_is_not_utf8_is_a_stand_in_and_its_batch_mates_are_read():
    class Undecodable(str):
        def encode(self, *args, **kwargs):
            return b"\xff\xfe"
    got = read(build(VALUES, headers={1: [(Undecodable("x"), b"v")]}))
    assert got == [(0, b"e0"), ("unread", 1, 1)] + [(i, VALUES[i]) for i in range(2, 6)]


def test_a_flood_of_headers_is_not_built():
    got = read(build(VALUES[:3], headers={1: [("h", b"")] * (w.MAX_BUILT_HEADERS + 1)}))
    assert got == [(0, b"e0"), ("unread", 1, 1), (2, b"e2")]


@pytest.mark.parametrize("claim, expect", [
    # e1 claims the bytes of e1..e4: the records it hid are named, e5 is read
    ("swallow", [(0, b"e0"), ("unread", 1, 1), ("unread", 2, 4), (5, b"e5")]),
    # e1 ends inside e2: nothing after it can be told apart
    ("into", [(0, b"e0"), ("unread", 1, 1), ("unread", 2, 5)]),
    # e1 claims more than the batch holds
    ("past", [(0, b"e0"), ("unread", 1, 5)]),
])
def test_a_record_length_that_lies_costs_what_it_covers_and_names_it(claim, expect):
    buf = build(VALUES)
    parts = spans(buf)
    covers = {"swallow": sum(size + length for _, size, length in parts[1:5]) - parts[1][1],
              "into": parts[1][2] + parts[2][1] + parts[2][2] // 2,
              "past": len(buf)}[claim]
    set_length(buf, 1, covers)
    got = read(buf)
    assert got == expect
    assert offsets_given(got) == list(range(6))  # every offset once: none lost, none twice


def test_offsets_that_repeat_or_go_back_are_never_given_out_twice():
    got = read(build(VALUES[:4], deltas=[0, 1, 0, 3]))
    assert got == [(0, b"e0"), (1, b"e1"), ("unread", 2, 3)]
    got = read(build(VALUES[:4], deltas=[0, 0, 0, 0]))
    assert got == [(0, b"e0")]  # the batch claims offset 0 only: the others had none of their own
    for deltas in ([0, 1, 0, 3], [0, 0, 0, 0], [0, 2, 1, 3]):
        given = offsets_given(read(build(VALUES[:4], deltas=deltas)))
        assert given == sorted(set(given))


def test_a_batch_whose_crc_fails_is_one_stand_in_for_all_its_offsets():
    buf = build(VALUES)
    buf[-1] ^= 1
    got = read(buf)
    assert got == [("unread", 0, 5)]


def test_gzip_is_inflated_bounded_and_in_members_like_gzip_itself():
    body = b"".join(gzip.compress(b"part%d " % i * 50) for i in range(3)) + b"\x00" * 10
    assert w._bounded_gunzip(memoryview(body)) == gzip.decompress(body)
    many = gzip.compress(b"x") + gzip.compress(b"") * 20000 + gzip.compress(b"y")
    assert w._bounded_gunzip(many) == b"xy"
    with pytest.raises(ValueError, match="inflates past"):
        w._bounded_gunzip(gzip.compress(bytes(w.MAX_INFLATED_BATCH + 1)))
    with pytest.raises(ValueError, match="cut short"):
        w._bounded_gunzip(gzip.compress(b"z" * 1000)[:-12])
    with pytest.raises(Exception):
        w._bounded_gunzip(gzip.compress(b"z") + b"garbage")
