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


def build(values, deltas=None, headers=None, compression=0):
    """A v2 batch (uncompressed unless told) of `values` at offset deltas `deltas` (default 0, 1, 2, …)."""
    builder = records.DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0,
                                                producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                                batch_size=1 << 20)
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


# ---- the codecs of the kafka-codecs extra: read as kafka-python reads them, under the same bound as gzip ----

#: codec name: (the module kafka-python reads it with, its id in a batch's attributes)
CODECS = {"zstd": ("zstandard", 4), "lz4": ("lz4.frame", 3), "snappy": ("snappy", 2)}


def codec(name):
    """The id of a codec whose library is installed; else the test is skipped, saying so."""
    module, code = CODECS[name]
    pytest.importorskip(module, reason="%s is not installed (the kafka-codecs extra)" % module)
    return code


def reasons(buf):
    return [w.unread_stand_in(r.headers)[1] for r in records.DefaultRecordBatch(bytes(buf))
            if w.unread_stand_in(r.headers)]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_a_batch_in_each_codec_is_read_as_sent(name):
    values = [v * 500 for v in VALUES]
    buf = build(values, compression=codec(name))
    assert len(buf) < sum(map(len, values))  # compressed, not sent as it was for no gain
    assert read(buf) == list(enumerate(values))


def test_each_codec_is_inflated_as_kafka_python_inflates_it():
    import os
    import kafka.codec as kc
    body = os.urandom(3000) * 40
    cases = []
    if kc.has_zstd():
        import zstandard
        frame = zstandard.ZstdCompressor().compress(body)
        cases += [(w._bounded_unzstd, kc.zstd_decode, frame + frame)]  # frames one after another: all are read
    if kc.has_lz4():
        import lz4.frame
        cases += [(w._bounded_unlz4, kc.lz4_decode, lz4.frame.compress(body) + b"trailing")]  # one frame is read
    if kc.has_snappy():
        import snappy
        cases += [(w._bounded_unsnappy, kc.snappy_decode, kc.snappy_encode(body)),  # xerial's blocks (Java's)
                  (w._bounded_unsnappy, kc.snappy_decode, snappy.compress(body))]  # one raw block
    if not cases:
        pytest.skip("no codec library of the kafka-codecs extra is installed")
    for bounded, theirs, payload in cases:
        assert bounded(payload) == theirs(payload) == (body * 2 if bounded is w._bounded_unzstd else body)
    if kc.has_lz4():
        with pytest.raises(ValueError, match="cut short"):
            w._bounded_unlz4(lz4.frame.compress(body)[:-9])
    if kc.has_snappy():
        xerial = kc.snappy_encode(body)
        with pytest.raises(ValueError, match="cut short"):
            w._bounded_unsnappy(xerial[:-1])
        with pytest.raises(ValueError, match="cut short"):
            w._bounded_unsnappy(xerial[:16] + struct.pack(">i", -4) + xerial[20:])


def _bomb(name):
    """A body that inflates to twice the bound: zeros, compressed as a producer would."""
    zeros = bytes(2 * w.MAX_INFLATED_BATCH)
    if name == "zstd":
        import zstandard
        return zstandard.ZstdCompressor().compress(zeros)
    if name == "lz4":
        import lz4.frame
        return lz4.frame.compress(zeros)
    import kafka.codec
    import snappy
    return kafka.codec.snappy_encode(zeros) if name == "snappy" else snappy.compress(zeros)


@pytest.mark.parametrize("name", ["zstd", "lz4", "snappy", "snappy-raw"])
def test_a_bomb_in_each_codec_is_set_aside_and_never_inflated_past_the_bound(name, monkeypatch):
    """A 4 KB zstd batch inflated whole took a watcher from 34 MB to 844 MB: kafka-python inflates every codec
    but gzip without a bound. The batch is now a stand-in, like a gzip bomb, its inflation stopped at the bound."""
    import tracemalloc
    code = codec(name.split("-")[0])
    bomb = _bomb(name)
    # kafka-python's CRC-32C is pure Python: 1.5 s for a 6 MB snappy bomb, 30 s under tracemalloc
    monkeypatch.setattr(records, "calc_crc32c", lambda data: 0)
    with monkeypatch.context() as mp:
        mp.setattr(records, name.split("-")[0] + "_encode", lambda data: bomb)
        buf = build([b" " * (len(bomb) + 1)], compression=code)  # else "no gain": sent uncompressed
    tracemalloc.start()
    try:
        got = reasons(buf)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 1 and "inflates past %d bytes" % w.MAX_INFLATED_BATCH in got[0], got
    # the bound and copies of the body on the wire (65-76 MiB); unbounded, the 128 MiB it inflates to is held
    # twice (kafka-python copies it into a bytearray): 256-280 MiB
    assert peak < w.MAX_INFLATED_BATCH * 3 // 2, peak


@pytest.mark.parametrize("name", sorted(CODECS))
def test_a_codec_whose_library_is_missing_still_says_what_to_install(name, monkeypatch):
    import kafka.codec
    monkeypatch.setattr(kafka.codec, "has_" + name, lambda: True)
    monkeypatch.setattr(records, name + "_encode", lambda data: b"body")
    buf = build([b" " * 100], compression=CODECS[name][1])
    monkeypatch.setattr(kafka.codec, "has_" + name, lambda: False)
    reason = w._unread_reason(0, 0, reasons(buf)[0])  # the watcher's log line and dead-letter note
    assert "UnsupportedCodecError" in reason and name in reason and "kafka-codecs" in reason, reason
    if name == "lz4":  # lz4 read by kafka-python with lz4f or lz4framed, which have no bound: refused, and named
        monkeypatch.setattr(kafka.codec, "has_lz4", lambda: True)
        monkeypatch.setitem(__import__("sys").modules, "lz4.frame", None)
        reason = w._unread_reason(0, 0, reasons(buf)[0])
        assert "UnsupportedCodecError" in reason and "kafka-codecs" in reason, reason


def test_the_crc_module_the_kafka_extra_installs_is_what_kafka_python_uses(monkeypatch):
    """The kafka extra brings `crc32c`: without it kafka-python checks every batch in pure Python (0.11 us a
    byte, 110 ms of CPU for a 1 MB result, holding the GIL), and the watcher says so once it is connected."""
    pytest.importorskip("kafka")
    from kafka.record import util
    assert w.crc_in_c() == (util.crc32c_c is not None)
    monkeypatch.setattr(util, "crc32c_c", None)
    assert not w.crc_in_c()
