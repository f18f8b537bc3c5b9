#!/usr/bin/env python3
"""Benchmark: the conversation store at 100,000 messages across 1,000 conversations.

Prints the cost of appending one message with our Store (redaction, full-text
index, one transaction per message, as a live run does) against a bare
`INSERT` loop with the same durability settings in the same run, then the time
of `history list` and `history show` on the result — both the query and the
whole CLI command.
Targets: append < 1 ms per message; `history list` < 100 ms.

Usage: python bench/store.py [--conversations 1000] [--messages 100]
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xzatoma_store import Store, new_ulid  # noqa: E402


def message(i):
    if i % 3 == 1:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_%d" % i, "name": "read_file", "arguments": json.dumps({"path": "src/file_%d.py" % i})}]}
    if i % 3 == 2:
        return {"role": "tool", "tool_call_id": "call_%d" % (i - 1), "name": "read_file",
                "content": "def function_%d():\n    return %d\n" % (i, i) * 8}
    return {"role": "user", "content": "Please look at file number %d and tell me what it does." % i}


def bare_inserts(path, conversations, per):
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE m (cid TEXT, seq INTEGER, role TEXT, content TEXT, tool_calls TEXT, "
                 "PRIMARY KEY (cid, seq))")
    started = time.perf_counter()
    for c in range(conversations):
        cid = new_ulid()
        for i in range(per):
            msg = message(i)
            conn.execute("INSERT INTO m VALUES (?, ?, ?, ?, ?)", (cid, i, msg["role"], msg.get("content"),
                                                                 json.dumps(msg.get("tool_calls"))))
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def store_appends(path, conversations, per):
    store = Store(path, secrets=["not-a-real-secret-value"]).open()
    started = time.perf_counter()
    for c in range(conversations):
        cid = store.start_conversation(new_ulid(), "run", "benchmark conversation %d" % c, provider="ollama",
                                       model="m", mode="write", working_dir="/tmp")
        for i in range(per):
            store.append_message(cid, message(i), 100)
        store.finish_conversation(cid, "completed", turns=per // 3, tool_calls=per // 3)
    elapsed = time.perf_counter() - started
    store.close()
    return elapsed


def timed(fn, runs=7):
    values = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        values.append(time.perf_counter() - t)
    return statistics.median(values)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=1000)
    p.add_argument("--messages", type=int, default=100, help="messages per conversation")
    args = p.parse_args()
    total = args.conversations * args.messages
    home = tempfile.mkdtemp(prefix="xzstore-")
    db = os.path.join(home, "conversations.db")

    bare = bare_inserts(os.path.join(home, "bare.db"), args.conversations, args.messages)
    ours = store_appends(db, args.conversations, args.messages)
    print("== append %d messages across %d conversations ==" % (total, args.conversations))
    print("bare INSERT loop (autocommit, WAL)   %7.1f µs/message" % (bare / total * 1e6))
    print("Store.append_message                 %7.1f µs/message   ratio %.2f   (target < 1000 µs)"
          % (ours / total * 1e6, ours / bare))

    store = Store(db).open()
    newest = store.list_conversations(1)[0]["id"]
    q_list = timed(lambda: store.list_conversations(20))
    q_show = timed(lambda: store.messages(newest))
    q_search = timed(lambda: store.search("file number 4242"), runs=3)
    store.close()
    env = dict(os.environ, XZATOMA_HOME=home, XDG_CONFIG_HOME=home, HOME=home)
    installed = os.path.join(os.path.dirname(sys.executable), "xzatoma")
    command = [installed] if os.path.exists(installed) else [sys.executable, os.path.join(ROOT, "xzatoma.py")]
    print("(whole commands run as: %s)" % " ".join(command))
    cli_list = timed(lambda: subprocess.run(command + ["history", "list"], env=env,
                                            stdout=subprocess.DEVNULL, check=True))
    cli_show = timed(lambda: subprocess.run(command + ["history", "show", newest], env=env,
                                            stdout=subprocess.DEVNULL, check=True))
    cli_pass = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    print("== reading the result (median) ==")
    print("history list  query %6.2f ms   whole command %6.1f ms   (target < 100 ms)" % (q_list * 1e3, cli_list * 1e3))
    print("history show  query %6.2f ms   whole command %6.1f ms   (%d messages)" % (
        q_show * 1e3, cli_show * 1e3, args.messages))
    print("history search query %6.1f ms (full-text index)" % (q_search * 1e3))
    print("baseline: python3 -c pass %.1f ms" % (cli_pass * 1e3))
    print("database size: %.1f MB" % (os.path.getsize(db) / 1e6))


if __name__ == "__main__":
    main()
