"""XZatoma persistence: identifiers now; sqlite3 storage of conversations lands here.

Nothing heavy is imported at module level: `sqlite3` is imported by the
functions that open the database, so `xzatoma --help` stays fast.
"""

import os
import threading
import time

# ---- Identifiers ----

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ulid_lock = threading.Lock()
_ulid_last = [0, 0]  # last millisecond, last random part (monotonic within one ms)


def new_ulid(now=None):
    """A ULID: 48-bit millisecond time + 80 random bits, Crockford base32, 26 chars.

    Monotonic within a process: two ids made in the same millisecond still sort
    in creation order.
    """
    ms = int((time.time() if now is None else now) * 1000)
    with _ulid_lock:
        if ms <= _ulid_last[0]:
            ms = _ulid_last[0]
            rand = (_ulid_last[1] + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _ulid_last[0], _ulid_last[1] = ms, rand
    value = (ms << 80) | rand
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid_time(ulid):
    """The creation time (seconds since the epoch) encoded in a ULID."""
    value = 0
    for ch in ulid[:10].upper():
        value = value * 32 + _CROCKFORD.index(ch)
    return value / 1000.0
