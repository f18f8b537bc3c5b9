"""Persistence: sqlite round trips, concurrency, crashes, resume, migration, redaction, history commands."""

import hashlib
import json
import multiprocessing
import os
import re
import signal
import sqlite3
import threading
import time

import pytest

from conftest import needs_landlock, run_calls, said, tool_call, wait_for
from xzatoma_store import MIGRATIONS, SCHEMA_VERSION, Redactor, Store, StoreError, new_ulid, ulid_time

SHAPES = [
    {"role": "system", "content": "You are XZatoma."},
    {"role": "user", "content": "héllo 👋 — «quotes» \"and\" 'more'\nsecond line"},
    {"role": "assistant", "content": ""},
    {"role": "assistant", "content": "thinking aloud", "tool_calls": [
        {"id": "call_1", "name": "read_file", "arguments": '{"path": "a.txt"}'},
        {"id": "call_2", "name": "grep", "arguments": "{not json"}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "x" * 200000},
    {"role": "tool", "tool_call_id": "call_2", "name": "grep", "content": "Error: invalid JSON"},
    {"role": "system", "content": "[CONTEXT PRUNED: …]"},
]


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "db" / "conversations.db")).open()
    yield s
    s.close()


def test_ulids_sort_by_time_and_are_unique():
    ids = [new_ulid() for _ in range(2000)]
    assert ids == sorted(ids) and len(set(ids)) == 2000
    assert all(len(i) == 26 for i in ids)
    assert abs(ulid_time(new_ulid()) - time.time()) < 2


def test_every_message_shape_round_trips(store):
    cid = store.start_conversation(new_ulid(), "run", "title")
    for msg in SHAPES:
        store.append_message(cid, msg, 5)
    back = store.messages(cid)
    for original, stored in zip(SHAPES, back):
        stored.pop("created_at")
        assert stored == original
    assert len(back) == len(SHAPES)


def test_conversation_fields(store):
    cid = store.start_conversation(new_ulid(), "plan", "a" * 300, provider="ollama", model="m", mode="write",
                                   working_dir="/w", source="/w/plan.yaml")
    store.update_conversation(cid, turns=3, tool_calls=4, prompt_tokens=10, completion_tokens=5)
    store.finish_conversation(cid, "max_turns", error="stopped")
    c = store.conversation(cid)
    assert (c["kind"], c["status"], c["turns"], c["tool_calls"], c["error"]) == ("plan", "max_turns", 3, 4, "stopped")
    assert len(c["title"]) == 120 and c["source"] == "/w/plan.yaml" and c["completed_at"].endswith("Z")
    assert c["pid"] == os.getpid()


def test_resolve_by_prefix(store):
    a = store.start_conversation("01AAAAAAAAAAAAAAAAAAAAAAAA", "run")
    store.start_conversation("01AAAAAAAAAAAAAAAAAAAAAAAB", "run")
    assert store.resolve("01aaaaaaaaaaaaaaaaaaaaaaaa") == a
    with pytest.raises(StoreError, match="matches several"):
        store.resolve("01AAAA")
    with pytest.raises(StoreError, match="no conversation matches"):
        store.resolve("ZZZ")


def test_concurrent_threads_lose_no_rows(store):
    ids = [store.start_conversation(new_ulid(), "subagent") for _ in range(8)]
    shared = store.start_conversation(new_ulid(), "run")

    def work(cid):
        for i in range(150):
            store.append_message(cid, {"role": "user", "content": "m%d" % i})
            store.append_message(shared, {"role": "user", "content": "%s-%d" % (cid, i)})
    threads = [threading.Thread(target=work, args=(cid,)) for cid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(store.messages(cid)) == 150 for cid in ids)
    assert len(store.messages(shared)) == 8 * 150


def _writer(path, n):
    s = Store(path).open()
    cid = s.start_conversation(new_ulid(), "run")
    for i in range(n):
        s.append_message(cid, {"role": "user", "content": "p%d" % i})
    s.close()


def test_concurrent_processes_lose_no_rows(tmp_path):
    path = str(tmp_path / "c.db")
    Store(path).open().close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, 200)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 800
    assert conn.execute("SELECT count(*) FROM conversations").fetchone()[0] == 4


def test_migration_from_version_1(tmp_path):
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO conversations (id, kind, status, started_at, updated_at, title) VALUES "
                 "('01OLD0000000000000000000000', 'run', 'completed', '2025-01-01T00:00:00Z', "
                 "'2025-01-01T00:00:00Z', 'old one')")
    conn.execute("INSERT INTO messages (conversation_id, seq, role, content, created_at) VALUES "
                 "('01OLD0000000000000000000000', 0, 'user', 'remember the walrus', '2025-01-01T00:00:00Z')")
    conn.commit()
    conn.close()
    s = Store(path).open()
    assert s.conn().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert s.messages("01OLD0000000000000000000000")[0]["content"] == "remember the walrus"
    assert [c["id"] for c in s.search("walrus")] == ["01OLD0000000000000000000000"]
    s.append_message("01OLD0000000000000000000000", {"role": "assistant", "content": "ok"})
    assert len(s.messages("01OLD0000000000000000000000")) == 2
    s.record_undo("01OLD0000000000000000000000", "c", "write_file", "/x", "absent")


def test_newer_database_is_refused_and_untouched(cli, fake):
    db = cli.xz_home / "conversations.db"
    conn = sqlite3.connect(str(db))
    conn.execute("CREATE TABLE future (x)")
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    r = cli.run("history", "list")
    assert r.returncode == 2 and "written by a newer xzatoma (schema 99" in r.stderr
    cli.use(fake)
    fake.add({"content": "still works"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "still works\n"
    assert r.stderr.count("continuing without conversation history") == 1
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_corrupt_or_unwritable_database_never_stops_a_run(cli, fake):
    (cli.xz_home / "conversations.db").write_bytes(b"this is not a database" * 100)
    cli.use(fake)
    fake.add({"content": "ok"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "ok\n" and "warning:" in r.stderr
    r = cli.run("history", "list")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_persistence_can_be_turned_off(cli, fake):
    cli.use(fake, persistence={"enabled": False})
    fake.add({"content": "ok"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stderr.count("warning") == 0
    assert not (cli.xz_home / "conversations.db").exists()


def test_redaction():
    r = Redactor(["configured-secret-value"])
    assert r("key configured-secret-value here") == "key [REDACTED] here"
    assert r("ghp_" + "a" * 36) == "[REDACTED]"
    assert r("gho_" + "B" * 36 + " and ghs_" + "c" * 36) == "[REDACTED] and [REDACTED]"
    assert r("github_pat_" + "x1" * 20) == "[REDACTED]"
    assert r("export OPENAI_API_KEY=sk-proj-" + "z" * 30) == "export OPENAI_API_KEY=[REDACTED]"
    assert r("Authorization: Bearer abcdefghijklmnopqrstuvwxyz") == "Authorization: [REDACTED]"
    assert r('curl -H "authorization: token ghu_' + "q" * 36 + '"') == 'curl -H "authorization: token [REDACTED]"'
    assert r("the token count was 12") == "the token count was 12"


def test_secrets_never_reach_the_store(cli, fake):
    secret = "sk-test-" + "s3cr3t" * 5
    (cli.workdir / "env.txt").write_text("OPENAI_API_KEY=%s\nGH=ghp_%s\n" % (secret, "k" * 36))
    cli.use(fake, provider="openai")
    fake.add({"tool_calls": [tool_call("read_file", path="env.txt")]},
             {"content": "the key is %s" % secret})
    r = cli.run("run", "--prompt", "print the key %s" % secret, env={"OPENAI_API_KEY": secret})
    assert r.returncode == 0
    raw = b"".join(p.read_bytes() for p in cli.xz_home.iterdir() if p.is_file())
    assert secret.encode() not in raw and b"ghp_kkkk" not in raw
    assert b"[REDACTED]" in raw


def test_kill_9_keeps_completed_turns(cli, fake):
    (cli.workdir / "a.txt").write_text("A\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="a.txt")]},
             {"tool_calls": [tool_call("list_directory")]}, {"hang": 60})
    proc = cli.popen("run", "--prompt", "crash test")
    try:
        assert wait_for(lambda: len(fake.model_requests()) == 3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    r = cli.run("history", "list", "--json")
    conv = json.loads(r.stdout)[0]
    assert conv["status"] == "interrupted" and conv["turns"] == 2 and conv["title"] == "crash test"
    r = cli.run("history", "show", conv["id"][:10], "--json")
    data = json.loads(r.stdout)
    assert [m["role"] for m in data["messages"]] == ["system", "user", "user", "assistant", "tool", "assistant",
                                                      "tool"]  # the environment message, then the task
    assert data["messages"][4]["content"] == "A\n" and data["status"] == "interrupted"


def test_resume_sends_the_whole_history_with_pairs_intact(cli, fake):
    s = Store(str(cli.xz_home / "conversations.db")).open()
    cid = s.start_conversation(new_ulid(), "run", "earlier task")
    for msg in [{"role": "system", "content": "old system prompt"},
                {"role": "user", "content": "earlier task"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "name": "list_directory", "arguments": "{}"},
                    {"id": "c2", "name": "read_file", "arguments": '{"path": "a"}'}]},
                {"role": "tool", "tool_call_id": "c1", "name": "list_directory", "content": "(no entries)"}]:
        s.append_message(cid, msg)
    s.update_conversation(cid, turns=1, tool_calls=1)
    s.finish_conversation(cid, "interrupted")
    s.close()

    def check(body):
        msgs = body["messages"]
        if msgs[0]["role"] != "system" or "You are XZatoma" not in msgs[0]["content"]:
            return "the current system prompt is missing"
        if [m["role"] for m in msgs[1:]] != ["user", "assistant", "tool", "tool", "user"]:
            return "unexpected history %s" % [m["role"] for m in msgs]
        if msgs[4] != {"role": "tool", "tool_call_id": "c2", "content": "Error: interrupted"}:
            return "the dangling call has no result: %s" % msgs[4]
        if msgs[5]["content"] != "now finish":
            return "the new instruction is missing"
        return None
    cli.use(fake, provider="openai")
    fake.add({"content": "finished", "expect": check})
    r = cli.run("run", "--resume", cid[:12], "--prompt", "now finish", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["conversation_id"] == cid and data["turns"] == 2 and "(resumed)" in r.stderr
    r = cli.run("history", "show", cid, "--json")
    stored = json.loads(r.stdout)
    assert stored["status"] == "completed" and stored["messages"][-1]["content"] == "finished"
    assert stored["messages"][4]["content"] == "Error: interrupted"


def test_resume_errors(cli, fake):
    cli.use(fake)
    r = cli.run("run", "--last")
    assert r.returncode == 2 and "no stored conversation" in r.stderr
    r = cli.run("run", "--resume", "NOPE", "--prompt", "x")
    assert r.returncode == 2 and "no conversation matches 'NOPE'" in r.stderr
    assert fake.requests == []


def test_history_commands(cli, fake):
    cli.use(fake)
    fake.add({"content": "first answer"}, {"content": "second answer about zebras"})
    assert cli.run("run", "--prompt", "task one").returncode == 0
    (cli.workdir / "p.yaml").write_text("goal: plan goal\ninstructions: [a]\n")
    assert cli.run("run", "--plan", "p.yaml").returncode == 0
    rows = json.loads(cli.run("history", "list", "--json").stdout)
    assert [r["kind"] for r in rows] == ["plan", "run"] and rows[0]["title"] == "plan goal"
    assert rows[0]["source"].endswith("p.yaml")
    assert len(json.loads(cli.run("history", "list", "--json", "--kind", "run").stdout)) == 1
    assert len(json.loads(cli.run("history", "list", "--json", "--limit", "1").stdout)) == 1
    out = cli.run("history", "list").stdout.splitlines()
    assert out[0].split()[:2] == ["ID", "STARTED"]
    assert out[1].startswith(rows[0]["id"][:12]) and "plan" in out[1] and "completed" in out[1]
    found = cli.run("history", "search", "zebras")
    assert found.returncode == 0 and rows[0]["id"][:12] in found.stdout and rows[1]["id"][:12] not in found.stdout
    assert cli.run("history", "search", "ze").stdout.count("\n") == 3  # short text falls back to LIKE (+ header)
    show = cli.run("history", "show", rows[1]["id"][-14:] and rows[1]["id"][:20])
    assert "[user] task one" in show.stdout and "[assistant] first answer" in show.stdout
    r = cli.run("history", "delete", rows[1]["id"])
    assert r.returncode == 0 and "deleted conversation" in r.stderr
    assert len(json.loads(cli.run("history", "list", "--json").stdout)) == 1
    assert cli.run("history", "prune", "--older-than", "bogus").returncode == 2
    r = cli.run("history", "prune", "--older-than", "0s", "--yes")
    assert r.returncode == 0 and "deleted 1 conversation" in r.stderr
    assert json.loads(cli.run("history", "list", "--json").stdout) == []


def test_replay_and_tree(cli, fake, tmp_path):
    (cli.workdir / "a.txt").write_text("A\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="a.txt")]}, {"content": "The file says A."})
    r = cli.run("run", "--json", "--prompt", "what is in a.txt?")
    cid = json.loads(r.stdout)["conversation_id"]
    s = Store(str(cli.xz_home / "conversations.db")).open()
    child = s.start_conversation(new_ulid(), "subagent", "child task", parent_id=cid, depth=1, label="research")
    s.update_conversation(child, turns=4, prompt_tokens=2000, completion_tokens=500)
    s.finish_conversation(child, "completed")
    s.close()
    replay = cli.run("replay", cid)
    assert replay.returncode == 0
    assert replay.stdout.splitlines()[1:] == ["", "» what is in a.txt?", "▶ read_file a.txt", "  ✓ A", "",
                                              "The file says A."]
    tree = cli.run("replay", cid, "--tree").stdout.splitlines()
    assert tree[0].startswith(cid[:12]) and tree[1].startswith("└─ " + child[:12])
    assert "[research] depth 1 · 4 turns · 2,500 tokens · completed" in tree[1]
    assert cli.run("history", "delete", cid).stderr.strip().endswith("and 1 subagent conversations")


def test_undo_command_after_a_run(cli, fake):
    (cli.workdir / "app.py").write_text("print('v1')\n")
    (cli.workdir / "old").mkdir()
    (cli.workdir / "old" / "keep.txt").write_text("keep me\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="app.py"),
                             tool_call("write_file", path="app.py", content="print('v2')\n"),
                             tool_call("write_file", path="new.txt", content="fresh\n"),
                             tool_call("delete_path", path="old", recursive=True)]},
             {"tool_calls": [tool_call("edit_file", path="app.py", old_text="v2", new_text="v3")]},
             {"content": "done"})
    r = cli.run("run", "--json", "--prompt", "change things")
    assert r.returncode == 0, r.stderr
    cid = json.loads(r.stdout)["conversation_id"]
    listing = cli.run("undo", "--list").stdout.splitlines()
    assert len(listing) == 4 and "edit_file" in listing[0] and cid[:12] in listing[0]
    r = cli.run("undo")
    assert r.returncode == 0 and r.stdout.startswith("restored %s" % (cli.workdir / "app.py"))
    assert (cli.workdir / "app.py").read_text() == "print('v2')\n"
    (cli.workdir / "new.txt").write_text("the person changed this\n")
    r = cli.run("undo", "--all")
    assert r.returncode == 1 and "new.txt changed since the agent touched it" in r.stderr
    assert (cli.workdir / "app.py").read_text() == "print('v1')\n"
    assert (cli.workdir / "old" / "keep.txt").read_text() == "keep me\n"
    assert (cli.workdir / "new.txt").read_text() == "the person changed this\n"
    r = cli.run("undo", "--all", "--force", "--conversation", cid)
    assert r.returncode == 0 and "removed %s (created by the agent)" % (cli.workdir / "new.txt") in r.stdout
    assert not (cli.workdir / "new.txt").exists()
    assert cli.run("undo").stderr.strip().startswith("nothing to undo in ")


# ---- the watcher's claims and message attempts (issue 22) ----

def _claimer(path, owner, ids, out, release):
    s = Store(path).open()
    won = [i for i in ids if s.claim_event(i, owner, 60)[0]]
    with open(out + ".part", "w") as fh:
        json.dump(won, fh)
    os.replace(out + ".part", out)
    release.wait(60)  # alive until all have tried: a claim of a process that is gone is taken over, by design
    s.close()


def test_processes_sharing_a_store_never_hold_one_event_id_at_once(tmp_path):
    path = str(tmp_path / "claims.db")
    Store(path).open().close()
    ids = ["e%d" % i for i in range(60)]
    ctx = multiprocessing.get_context("spawn")
    release = ctx.Event()
    procs = [ctx.Process(target=_claimer, args=(path, "owner-%d" % n, ids, str(tmp_path / ("won%d" % n)), release))
             for n in range(4)]
    for p in procs:
        p.start()
    try:
        assert wait_for(lambda: all((tmp_path / ("won%d" % n)).exists() for n in range(4)), 60)
    finally:
        release.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    won = [i for n in range(4) for i in json.loads((tmp_path / ("won%d" % n)).read_text())]
    assert sorted(won) == sorted(ids)  # every id claimed, each by exactly one process


def test_a_result_recorded_renews_its_claim_for_the_time_it_takes_to_go_out(store):
    """Found by an attack round: a record that waited on a locked store past its claim's lease went in, and a
    watcher of another host took the claim over and published the stored result too (two results). The record
    renews its owner's claim in its own transaction, so no one takes it over before the result is out."""
    assert store.claim_event("r", "A", 6)[0]
    store.conn().execute("UPDATE event_claims SET host = 'elsewhere', expires_at = ? WHERE event_id = 'r'",
                         (time.time() - 1,))  # the lease ran out while the store was locked
    assert store.record_event("r", "c", "completed", result="{}", owner="A", lease=60)
    expires = store.conn().execute("SELECT expires_at FROM event_claims WHERE event_id = 'r'").fetchone()[0]
    assert expires > time.time() + 50
    assert store.claim_event("r", "B", 60)[0] is False  # held: A publishes now
    assert not store.record_event("r", "c", "completed", result="{}", owner="B", lease=60)  # the fence
    # no claim at all (its taker since stopped and released it: found by the next round): taken again with the
    # record, so a claimant of the redelivered message waits for the result instead of publishing it too
    assert store.claim_event("s", "B", 60)[0]
    store.release_claim("s", "B")
    assert store.record_event("s", "c", "completed", result="{}", owner="A", lease=60)
    assert store.conn().execute("SELECT owner FROM event_claims WHERE event_id = 's'").fetchone()[0] == "A"
    store.conn().execute("UPDATE event_claims SET host = 'elsewhere' WHERE event_id = 's'")
    assert store.claim_event("s", "C", 60)[0] is False


def test_a_claim_is_taken_over_after_its_lease_or_when_its_process_is_gone(store, tmp_path):
    import subprocess
    import sys
    from conftest import wait_for
    assert store.claim_event("a", "A", 60) == (True, 1, None)
    assert store.claim_event("a", "A", 60)[0]  # its owner again: still its claim, not a new attempt
    assert store.claim_event("a", "B", 60) == (False, 1, None)  # held: A lives and its lease runs
    # A of another host: held while it beats, by this process's clock (not by its expiry against ours: a host
    # whose clock ran ahead took a live claim over, attack round 16a); taken over (one more attempt) once it has
    # not beaten for its lease since this process saw it
    now = [1000.0]
    store.clock = lambda: now[0]
    store.conn().execute("UPDATE event_claims SET host = 'elsewhere', expires_at = ? WHERE event_id = 'a'",
                         (time.time() - 600,))  # expired by our clock, 600 s ahead of A's
    assert not store.claim_event("a", "B", 60)[0]
    for _ in range(5):  # A beats every 15 s: held for 75 s, whatever its expiry says
        now[0] += 15
        store.renew_claims("A", 60)
        store.conn().execute("UPDATE event_claims SET host = 'elsewhere', expires_at = expires_at - 600")
        assert not store.claim_event("a", "B", 60)[0]
    now[0] += 59
    assert not store.claim_event("a", "B", 60)[0]  # silent for 59 s of its 60
    now[0] += 2
    assert store.claim_event("a", "B", 60) == (True, 2, None)
    # its owner's lease, not the taker's: a row of an older version has none, and what it spans counts (a taker
    # of a lease of 5 took a live claim renewed every 75 s: round 16b)
    store.conn().execute("UPDATE event_claims SET owner = 'A', host = 'elsewhere', lease = NULL, claimed_at = ?, "
                         "expires_at = ? WHERE event_id = 'a'", (time.time(), time.time() + 300))
    assert not store.claim_event("a", "B", 5)[0]
    now[0] += 200
    assert not store.claim_event("a", "B", 5)[0]
    now[0] += 101
    assert store.claim_event("a", "B", 5) == (True, 3, None)
    store.conn().execute("UPDATE event_claims SET attempts = 2")
    # a process of this host that is gone (kill -9) holds nothing, lease or not
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.conn().execute("UPDATE event_claims SET owner = 'C', pid = ?, host = ? WHERE event_id = 'a'",
                         (dead.pid, __import__("xzatoma_store")._process_space()))
    assert store.claim_event("a", "B", 60) == (True, 3, None)
    # but a pid of another machine named alike, in its init pid namespace (which reads the same on every machine),
    # is not ours to judge (taken at once, the event ran twice: attack round 16a): its claim holds while it beats
    space = __import__("xzatoma_store")._process_space()
    assert len(space.split()) == 3 and len(space.split()[2]) == 69  # host, pid namespace, machine id/boot id
    store.conn().execute("UPDATE event_claims SET owner = 'M', pid = ?, host = ? WHERE event_id = 'a'",
                         (dead.pid, space[:-69] + "0" * 32 + "/" + "0" * 36))
    assert store.claim_event("a", "B", 60) == (False, 3, None)
    now[0] += 61
    assert store.claim_event("a", "B", 60) == (True, 4, None)
    store.conn().execute("UPDATE event_claims SET attempts = 3")
    # nor one killed and not yet reaped (a zombie: a supervisor that never waits keeps it for good)
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open("/proc/%d/stat" % zombie.pid, "rb") as fh:
            started = int(fh.read().rsplit(b")", 1)[1].split()[19])
        store.conn().execute("UPDATE event_claims SET owner = 'Z', pid = ?, started = ? WHERE event_id = 'a'",
                             (zombie.pid, started))
        assert store.claim_event("a", "B", 60) == (False, 3, None)  # it lives: its claim holds
        os.kill(zombie.pid, 9)
        assert wait_for(lambda: open("/proc/%d/stat" % zombie.pid, "rb").read().rsplit(b")", 1)[1].split()[0]
                        == b"Z", 10)  # dead, not reaped: its pid is still taken
        assert store.claim_event("a", "B", 60) == (True, 4, None)
        assert store.claim_event("a", "B", 60) == (True, 4, None)
    finally:
        zombie.kill()
        zombie.wait()
    # a live process of this host holds its claim past its lease (it is frozen, not gone: it will run on) ...
    store.conn().execute("UPDATE event_claims SET owner = 'C', pid = ?, expires_at = 0 WHERE event_id = 'a'",
                         (os.getpid(),))
    assert store.claim_event("a", "B", 60) == (False, 4, None)
    # ... unless its pid now names another process than the one that claimed (a pid used again: another start)
    assert store.conn().execute("SELECT started FROM event_claims").fetchone()[0] > 0
    store.conn().execute("UPDATE event_claims SET started = started - 1 WHERE event_id = 'a'")
    assert store.claim_event("a", "B", 60) == (True, 5, None)
    # a row written before claims knew their process's start holds until its lease ends, as it did then
    store.conn().execute("UPDATE event_claims SET owner = 'C', started = NULL, expires_at = ? WHERE event_id = 'a'",
                         (time.time() + 60,))
    assert not store.claim_event("a", "B", 60)[0]
    store.conn().execute("UPDATE event_claims SET expires_at = 0 WHERE event_id = 'a'")
    assert store.claim_event("a", "B", 60) == (True, 6, None)
    # a result is recorded under its claim only: not by an owner whose claim was taken over
    assert not store.record_event("a", "C1", "completed", result="{}", owner="C")
    assert store.conn().execute("SELECT count(*) FROM processed_events").fetchone()[0] == 0
    # renewing extends only the owner's claims; releasing ends them
    store.claim_event("b", "B", 1)
    store.renew_claims("B", 600)
    assert store.conn().execute("SELECT min(expires_at) FROM event_claims").fetchone()[0] > time.time() + 500
    store.release_claim("a", "someone else")
    assert not store.claim_event("a", "D", 60)[0]
    store.release_claim("a", "B")
    assert store.claim_event("a", "D", 60) == (True, 1, None)
    # a finished and published event is never claimed; a published record ends the claim with it
    assert store.record_event("a", "C1", "completed", result="{}", owner="D")
    store.event_published("a", "D")
    assert not store.record_event("a", "C1", "failed", result="{}", owner="D")  # out already: never replaced
    assert store.conn().execute("SELECT count(*) FROM event_claims WHERE event_id = 'a'").fetchone()[0] == 0
    claimed, _, record = store.claim_event("a", "E", 60)
    assert not claimed and record["status"] == "completed" and record["published_at"]


def test_message_attempts_count_a_single_offset_begun_again(store):
    key = "g/t/0"
    assert store.begin_attempt(key, 10, 19, "A") == (None, 1)
    store.end_attempt(key, "A")  # read through: nothing left behind
    assert store.begin_attempt(key, 20, 29, "B") == (None, 1)
    # B died reading 20..29: C reads them one at a time, each begun again counted
    assert store.begin_attempt(key, 20, 35, "C") == ((20, 29), 1)
    assert store.begin_attempt(key, 20, 20, "C") == ((20, 29), 1)  # B's mark was kept until now
    assert store.begin_attempt(key, 21, 35, "C") == (None, 1)  # 20 read: the rest as one range again
    assert store.begin_attempt(key, 21, 21, "C") == (None, 1)
    assert store.begin_attempt(key, 21, 35, "D") == ((21, 21), 1)  # C died on 21: D keeps its mark…
    assert store.begin_attempt(key, 21, 21, "D") == ((21, 21), 2)  # …and counts it begun a second time
    assert store.begin_attempt(key, 21, 21, "E") == ((21, 21), 3)
    store.end_attempt(key, "someone else")
    assert store.conn().execute("SELECT count(*) FROM message_attempts").fetchone()[0] == 1
    store.end_attempt(key, "E")
    assert store.conn().execute("SELECT count(*) FROM message_attempts").fetchone()[0] == 0


def test_search_leaves_out_the_head_every_conversation_shares(tmp_path):
    """The system prompt and the environment message are XZatoma's own text, the same in every conversation:
    indexed, every conversation matched their words (and they were most of what a short run indexed). Stored
    and shown as before; what was said is found."""
    s = Store(str(tmp_path / "h.db")).open()
    assert s.has_fts
    cid = s.start_conversation(new_ulid(), "run")
    s.append_message(cid, {"role": "system", "content": "You are XZatoma; call tools"})
    s.append_message(cid, {"role": "user", "name": "environment", "content": "<cwd>/srv/okapi</cwd>"})
    s.append_message(cid, {"role": "user", "content": "count the walruses"})
    assert [m["content"] for m in s.messages(cid)][:2] == ["You are XZatoma; call tools", "<cwd>/srv/okapi</cwd>"]
    assert s.search("XZatoma") == [] and s.search("okapi") == []
    found = s.search("walrus")
    assert [c["id"] for c in found] == [cid] and "count the walruses" in found[0]["snippet"]
    # under 3 characters (no trigram): the same rows left out (round 19d: "XZ", "_" and "<c" found every one)
    assert s.search("XZ") == [] and s.search("_") == [] and s.search("<c") == [] and s.search(";") == []
    assert [c["id"] for c in s.search("wa")] == [cid]


def test_messages_wait_for_the_search_index_in_batches_and_are_found_meanwhile(tmp_path):
    """The full-text index is written SEARCH_BATCH messages at a time (a commit that touches it costs a new
    segment and merges); search indexes what waits first, so nothing stored is missed, not even by another
    process, nor after a kill -9 (the backlog is a table); a deleted conversation leaves nothing waiting."""
    from xzatoma_store import SEARCH_BATCH
    path = str(tmp_path / "s.db")
    s = Store(path).open()

    def waiting():
        return s.conn().execute("SELECT count(*) FROM search_backlog").fetchone()[0]

    def indexed():
        return s.conn().execute("SELECT count(*) FROM messages_fts").fetchone()[0]
    cid = s.start_conversation(new_ulid(), "watch")
    s.append_message(cid, {"role": "system", "content": "You are XZatoma"})  # never indexed
    s.append_message(cid, {"role": "user", "content": "count the narwhals"})
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "tusk"}'}}
    s.append_message(cid, {"role": "assistant", "content": "", "tool_calls": [call]})
    assert (waiting(), indexed()) == (2, 0)
    other = Store(path).open()  # another process's view: it indexes what this one left waiting
    assert [c["id"] for c in other.search("narwhal")] == [cid] and [c["id"] for c in other.search("tusk")] == [cid]
    assert (waiting(), indexed()) == (0, 2) and other.search("XZatoma") == []
    s = Store(path).open()  # counts what it adds itself
    for i in range(SEARCH_BATCH):
        s.append_message(cid, {"role": "user", "content": "message %d of many" % i})
    assert waiting() == 0 and indexed() == 2 + SEARCH_BATCH  # the batch went in with the message that filled it
    gone = s.start_conversation(new_ulid(), "watch")
    s.append_message(gone, {"role": "user", "content": "a dugong"})
    assert waiting() == 1
    s.delete_conversation(gone)
    assert waiting() == 0 and s.search("dugong") == []


def test_a_batch_is_one_transaction(tmp_path):
    s = Store(str(tmp_path / "b.db")).open()
    cid = s.start_conversation(new_ulid(), "run")
    with pytest.raises(RuntimeError):
        with s.batch():
            s.append_message(cid, {"role": "user", "content": "one"})
            with s.batch():  # joins the outer one
                s.append_message(cid, {"role": "user", "content": "two"})
            raise RuntimeError("rolled back, both")
    assert s.messages(cid) == [] and s.search("two") == []
    other = Store(str(tmp_path / "b.db")).open()  # another connection sees nothing before the commit
    with s.batch():
        s.append_message(cid, {"role": "user", "content": "three"})
        assert other.messages(cid) == []
    assert [m["content"] for m in other.messages(cid)] == ["three"]


@needs_landlock
def test_parallel_first_undo_records_share_one_key(tmp_path):
    """Parallel subagents' first writes each made the undo key at once: O_EXCL failed one of them ("file
    exists": the write was lost; test_subagents' concurrent-confirmations flake) or let it read an empty key."""
    import threading
    from xzatoma_store import Store
    for i in range(40):
        db = str(tmp_path / ("c%d.db" % i))
        stores, keys = [Store(db) for _ in range(4)], []
        barrier = threading.Barrier(4)

        def first_record(store):
            barrier.wait()
            try:
                keys.append(store._undo_key(True))
            except Exception as exc:  # noqa: BLE001 - what a write would have reported
                keys.append(exc)
        threads = [threading.Thread(target=first_record, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(keys) == 4 and all(isinstance(k, bytes) and len(k) == 32 for k in keys), keys
        assert len(set(keys)) == 1 and not [n for n in os.listdir(str(tmp_path)) if n.endswith(".tmp")]
        for s in stores:
            s.close()


def test_a_file_name_that_is_not_utf8_does_not_switch_the_history_off(cli, fake):
    """A repository ships a name with a byte that is not UTF-8: listing it made every later message of the
    run unstorable ("continuing without it"), so `history show` no longer showed what the agent did next."""
    import json
    work = os.fsencode(str(cli.workdir))
    with open(os.path.join(work, b"bad\xff\x1b[2J.txt"), "w") as fh:
        fh.write("needle\n")
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("list_directory"), tool_call("grep", pattern="needle"),
                                       tool_call("write_file", path="after.txt", content="later\n")])
    assert r.returncode == 0, r.stderr
    assert "history" not in r.stderr, r.stderr
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    shown = cli.run("history", "show", "--full", cid)
    assert shown.returncode == 0, shown.stderr
    assert "bad\\udcff\\x1b[2J.txt" in shown.stdout and "Created after.txt" in shown.stdout, shown.stdout
    assert "\x1b" not in shown.stdout


# ---- sessions belong to a project: last, resume, undo ----


def test_last_is_this_directorys_and_resume_refuses_another(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other"
    other.mkdir()
    fake.add({"content": "here 1"}, {"content": "there 1"}, {"content": "here 2"})
    cli.run("run", "task in work")
    cli.run("run", "task in other", cwd=other)
    r = cli.run("run", "--last", "continue")  # the latest overall is other's; --last means this directory's
    assert r.returncode == 0, r.stderr
    users = said(fake.model_requests()[-1]["body"]["messages"])
    assert users == ["task in work", "continue"]
    rows = json.loads(cli.run("history", "list", "--json").stdout)
    other_id = [x["id"] for x in rows if x["title"] == "task in other"][0]
    r = cli.run("run", "--resume", other_id[:10], "go on")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "ran in %s, not here: continue it there with --working-dir %s" % (other, other) in r.stderr
    fake.add({"content": "continued there"})
    r = cli.run("run", "--resume", other_id[:10], "--working-dir", other, "go on")
    assert r.returncode == 0 and r.stdout == "continued there\n", r.stderr
    empty = cli.tmp / "empty"
    empty.mkdir()
    r = cli.run("run", "--last", "x", cwd=empty)
    assert r.returncode == 2 and "no stored conversation to resume in %s" % empty in r.stderr
    r = cli.run("run", "--last", "--global", "x", cwd=empty)
    assert r.returncode == 2 and "ran in" in r.stderr  # found another directory's, and refused it


def test_resume_restores_provider_model_and_mode(cli, fake):
    cli.use(fake)  # ollama by default
    fake.add({"content": "one"}, {"content": "two"}, {"content": "three"}, {"content": "four"})
    r = cli.run("run", "--provider", "openai", "--model", "gpt-4.1", "--mode", "planning", "start")
    assert r.returncode == 0, r.stderr
    r = cli.run("run", "--last", "continue")
    assert r.returncode == 0, r.stderr
    q = fake.model_requests()[-1]
    assert q["path"] == "/v1/chat/completions" and q["body"]["model"] == "gpt-4.1"
    names = {t["function"]["name"] for t in q["body"]["tools"]}
    assert "read_file" in names and "write_file" not in names  # still planning
    r = cli.run("run", "--last", "--model", "gpt-test", "--mode", "write", "more")  # given again: these win
    q = fake.model_requests()[-1]
    assert q["body"]["model"] == "gpt-test" and "write_file" in {t["function"]["name"] for t in q["body"]["tools"]}
    r = cli.run("chat", "--last", input="and in chat?\n")
    assert r.returncode == 0, r.stderr
    q = fake.model_requests()[-1]
    assert q["path"] == "/v1/chat/completions" and q["body"]["model"] == "gpt-test"
    assert said(q["body"]["messages"])[-1] == "and in chat?"


def test_undo_defaults_to_this_directorys_changes(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other"
    other.mkdir()
    fake.add({"tool_calls": [tool_call("write_file", path="here.txt", content="x")]}, {"content": "done"},
             {"tool_calls": [tool_call("write_file", path="there.txt", content="y")]}, {"content": "done"})
    cli.run("run", "write here")
    cli.run("run", "write there", cwd=other)
    r = cli.run("undo")  # the newest change overall is other's; undo here undoes this directory's
    assert r.returncode == 0, r.stderr
    assert not (cli.workdir / "here.txt").exists() and (other / "there.txt").exists()
    assert "nothing to undo in" in cli.run("undo").stderr
    r = cli.run("undo", "--all-projects")
    assert r.returncode == 0 and not (other / "there.txt").exists()


# ---- sessions belong to a project: the store and history ----


def test_every_conversation_records_where_and_how_it_ran(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other-project"
    other.mkdir()
    fake.add({"content": "a"}, {"content": "b"}, {"content": "c"})
    assert cli.run("run", "--prompt", "in work").returncode == 0
    assert cli.run("run", "--allow-dangerous", "--mode", "planning", "--prompt", "in other", cwd=other).returncode == 0
    assert cli.run("chat", "--safety", "yolo", "--mode", "write", input="hello\n").returncode == 0
    rows = {r["title"]: r for r in json.loads(cli.run("history", "list", "--json").stdout)}
    work, elsewhere, chat = rows["in work"], rows["in other"], rows["hello"]
    assert work["working_dir"] == os.path.realpath(str(cli.workdir)) and elsewhere["working_dir"] == str(other)
    assert (work["provider"], work["model"], work["mode"], work["safety"]) == ("ollama", "llama3.2:3b", "write",
                                                                                "restricted")
    assert (elsewhere["mode"], elsewhere["safety"]) == ("planning", "yolo")
    assert (chat["kind"], chat["mode"], chat["safety"]) == ("chat", "write", "yolo")
    show = cli.run("history", "show", work["id"]).stdout
    assert "mode write · safety restricted · " + work["working_dir"] in show


def test_history_list_shows_directories_local_times_and_filters_here(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other-project"
    other.mkdir()
    fake.add({"content": "a"}, {"tool_calls": [tool_call("list_directory", path=".")]}, {"content": "b"})
    cli.run("run", "--prompt", "first")
    cli.run("run", "--prompt", "second", cwd=other)
    lines = cli.run("history", "list", env={"TZ": "UTC"}).stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STARTED", "(UTC)"] and "DIRECTORY" in lines[0]
    assert " 1 turn " in lines[2] and " 2 turns " in lines[1]
    assert re.search(r"/other-project +second$", lines[1]) and re.search(r"/work +first$", lines[2]), lines
    here = cli.run("history", "list", "--here", cwd=other).stdout.splitlines()
    assert len(here) == 2 and here[1].rstrip().endswith("second")
    assert json.loads(cli.run("history", "list", "--here", "--json").stdout)[0]["title"] == "first"
    stored = json.loads(cli.run("history", "list", "--json").stdout)[0]["started_at"]  # '…T13:40:00Z' in UTC
    tokyo = cli.run("history", "list", env={"TZ": "Asia/Tokyo"}).stdout.splitlines()
    assert "STARTED (JST)" in tokyo[0]
    utc_hour = int(stored[11:13])
    assert tokyo[1].split()[2].startswith("%02d:" % ((utc_hour + 9) % 24))


def test_prune_everything_asks_or_needs_yes(cli, fake):
    cli.use(fake)
    fake.add({"content": "a"})
    cli.run("run", "--prompt", "keep me")
    r = cli.run("history", "prune", "--older-than", "0d")
    assert r.returncode == 2 and "add --yes" in r.stderr and "1 conversation" in r.stderr
    assert len(json.loads(cli.run("history", "list", "--json").stdout)) == 1
    assert cli.run("history", "prune", "--older-than", "30d").returncode == 0  # a real age needs no answer
    from ptyrun import PtyProcess
    p = PtyProcess(cli.command("history", "prune", "--older-than", "0d"), cli.env, str(cli.workdir))
    try:
        p.expect(r"delete 1 conversation \(everything last used more than 0d ago\)\? \[y/N\] ")
        p.line("n")
        p.expect("nothing deleted")
        assert p.wait() == 0
    finally:
        p.close()
    assert len(json.loads(cli.run("history", "list", "--json").stdout)) == 1
    p = PtyProcess(cli.command("history", "prune", "--older-than", "0d"), cli.env, str(cli.workdir))
    try:
        p.expect(r"\[y/N\] ")
        p.line("y")
        p.expect("deleted 1 conversation older than 0d")
        assert p.wait() == 0
    finally:
        p.close()
    assert json.loads(cli.run("history", "list", "--json").stdout) == []


def test_migration_adds_safety_to_an_old_database(tmp_path):
    import sqlite3
    from xzatoma_store import MIGRATIONS, SCHEMA_VERSION, Store
    path = str(tmp_path / "v2.db")
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:2]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO conversations (id, kind, status, started_at, updated_at, working_dir) VALUES "
                 "('01OLD0000000000000000000000', 'run', 'completed', '2025-01-01T00:00:00Z', "
                 "'2025-01-01T00:00:00Z', '/src/app')")
    conn.commit()
    conn.close()
    s = Store(path).open()
    assert s.conn().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert s.conversation("01OLD0000000000000000000000")["safety"] is None
    assert s.latest(working_dir="/src/app") == "01OLD0000000000000000000000"
    s.resume_conversation("01OLD0000000000000000000000", provider="openai", safety="safe")
    assert s.conversation("01OLD0000000000000000000000")["safety"] == "safe"


def test_migration_drops_the_text_of_results_already_published(tmp_path):
    """A published result's text is not kept (up to 1 MB an event, for good): a store of schema 11 loses what it
    kept, and keeps what a restart would still publish."""
    import sqlite3
    from xzatoma_store import SCHEMA_VERSION, Store
    path = str(tmp_path / "v11.db")
    s = Store(path).open()
    s.record_event("out", "c1", "completed", result='{"subject": "out"}')
    s.event_published("out")
    s.record_event("waiting", "c2", "completed", result='{"subject": "waiting"}')
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE processed_events SET result = '{\"subject\": \"out\"}' WHERE event_id = 'out'")
    conn.execute("PRAGMA user_version = 11")
    conn.commit()
    conn.close()
    s = Store(path).open()
    assert s.conn().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert s.event_record("out")["result"] is None and s.event_record("out")["status"] == "completed"
    assert s.event_record("waiting")["result"] == '{"subject": "waiting"}'


def test_reap_judges_only_its_own_process_space(store):
    """A conversation left running by a process that is gone is interrupted, one whose pid is used again by
    another process too; one of another pid namespace or machine under the same host name is not ours to judge
    (a `history list` in a container sharing the store marked a live watcher's run interrupted, round 16a)."""
    import subprocess
    import sys
    import xzatoma_store
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = ("gone", "elsewhere", "reused", "alive", "rebooted", "same name", "no machine id", "written before",
             "then, gone", "then, alive")
    for cid in names:
        store.start_conversation(cid, "watch")
    space = xzatoma_store._process_space()
    rows = {"gone": (dead.pid, space), "elsewhere": (dead.pid, space.replace("pid:[", "pid:[9")),
            "reused": (os.getpid(), space), "rebooted": (os.getpid(), space[:-36] + "0" * 36),
            "same name": (dead.pid, space[:-69] + "0" * 32 + "/" + "0" * 36),  # another machine (its machine id)
            "no machine id": (os.getpid(), space[:-69] + "-/" + "0" * 36),  # a reboot is likelier (16d)
            "written before": (os.getpid(), space[:-69] + "0" * 36),  # no machine id in the row: as then
            "then, gone": (dead.pid, space[:-69] + space[-36:]),
            "then, alive": (os.getpid(), space[:-69] + space[-36:])}
    for cid, (pid, where) in rows.items():
        store.conn().execute("UPDATE conversations SET pid = ?, space = ? WHERE id = ?", (pid, where, cid))
    store.conn().execute("UPDATE conversations SET started = started - 1 WHERE id = 'reused'")
    store.reap()
    status = {cid: store.conversation(cid)["status"] for cid in names}
    assert status == {"gone": "interrupted", "elsewhere": "running", "reused": "interrupted", "alive": "running",
                      "rebooted": "interrupted",  # its pid lives, in this boot: not the process of the other
                      "same name": "running",  # a live run of another machine named alike was pruned (16c)
                      "no machine id": "interrupted", "written before": "interrupted",
                      "then, gone": "interrupted", "then, alive": "running"}  # this boot's, by its pid (16e)


def test_the_claims_another_host_beats_are_remembered_within_a_bound(store):
    """30,000 ids seen held within an hour grew the table past its cap, at 8.6 ms a look (round 16b): the oldest
    seen are forgotten, which only makes a taker wait a whole lease again."""
    import xzatoma_store
    for i in range(xzatoma_store.MAX_SEEN_CLAIMS + 500):
        store._holds({"event_id": "e%d" % i, "owner": "A", "beat": 0, "expires_at": 1.0, "host": "elsewhere",
                      "pid": 1, "lease": 60, "claimed_at": 0.0}, "here")
    assert len(store._seen_claims) == xzatoma_store.MAX_SEEN_CLAIMS and "e0" not in store._seen_claims
    assert "e%d" % (xzatoma_store.MAX_SEEN_CLAIMS + 499) in store._seen_claims
    # the last looked at are kept: a dead claim still asked about is not forgotten, however many others pass
    # (forgotten, it waited a whole lease again at every look, for good: round 16c)
    now = [0.0]
    store.clock = lambda: now[0]
    dead = {"event_id": "dead", "owner": "A", "beat": 0, "expires_at": 1.0, "host": "elsewhere", "pid": 1,
            "lease": 60, "claimed_at": 0.0}
    assert store._holds(dead, "here")
    for i in range(120):  # 100 other ids a second, the dead one looked at every second
        now[0] += 1
        for j in range(100):
            store._holds(dict(dead, event_id="o%d-%d" % (i, j)), "here")
        if not store._holds(dead, "here"):
            break
    assert now[0] == 60  # taken over after its lease


def test_a_message_takes_its_place_from_the_database_not_a_stale_count(tmp_path):
    """Two processes writing one conversation: each message's seq is taken inside its write's transaction, so
    neither collides with the other's rows (round 19d: a count kept per process went stale, and one run's
    history was dropped on a UNIQUE constraint)."""
    path = str(tmp_path / "c.db")
    a, b = Store(path).open(), Store(path).open()
    cid = a.start_conversation(new_ulid(), "run")
    for i in range(3):
        a.append_message(cid, {"role": "user", "content": "a%d" % i})
        b.append_message(cid, {"role": "user", "content": "b%d" % i})
    assert [m["content"] for m in a.messages(cid)] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    a.delete_conversation(cid)
    with pytest.raises(StoreError, match="no longer stored"):  # never rows nothing can reach
        b.append_message(cid, {"role": "user", "content": "late"})
    assert b.conn().execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_a_conversation_a_live_process_runs_is_neither_continued_nor_deleted(cli, fake):
    """round 19d: `run --resume ID` beside a run of ID interleaved both tasks in one transcript, and `history
    delete ID` reported success while the run went on writing rows nothing could reach. Both are refused with
    the process named; once it is gone, both work."""
    cli.use(fake)
    fake.add({"hang": 60})
    proc = cli.popen("run", "--prompt", "long task")
    try:
        assert wait_for(lambda: len(fake.model_requests()) == 1)
        cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
        for args in (("run", "--resume", cid[:10], "--prompt", "other task"), ("run", "--last", "--prompt", "x"),
                     ("history", "delete", cid[:10])):
            r = cli.run(*args)
            assert r.returncode == 2 and r.stdout == "", r.stderr
            assert r.stderr.strip() == "error: conversation %s is running in process %d: let it finish or stop it " \
                "first, then %s" % (cid, proc.pid, "delete it" if "delete" in args else "continue it")
        assert len(fake.model_requests()) == 1  # nothing was asked for the refused runs
    finally:
        proc.kill()
        proc.wait(10)
    fake.add({"content": "continued"})
    r = cli.run("run", "--resume", cid[:10], "--prompt", "go on")
    assert r.returncode == 0 and r.stdout == "continued\n", r.stderr
    messages = json.loads(cli.run("history", "show", cid[:10], "--json").stdout)["messages"]
    assert [m["content"] for m in messages if m["role"] == "user" and not m.get("name")] == ["long task", "go on"]
    r = cli.run("history", "delete", cid[:10])
    assert r.returncode == 0 and "deleted conversation" in r.stderr


def test_a_conversation_another_host_runs_is_deleted_only_with_force(cli, fake):
    """A run of a container that was killed stays marked running under a host name no process here can check
    (16c); refused as possibly live (round 19d), it needs a way out: --force, which the refusal names."""
    cli.use(fake)
    fake.add({"content": "done"})
    assert cli.run("run", "--prompt", "x").returncode == 0
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    conn = sqlite3.connect(str(cli.xz_home / "conversations.db"))
    with conn:
        conn.execute("UPDATE conversations SET status = 'running', host = 'gone-container', pid = 4242 WHERE id = ?",
                     (cid,))
    conn.close()
    r = cli.run("history", "delete", cid)
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "(that process cannot be checked from here: if it is gone, delete it with --force)"), r.stderr
    r = cli.run("history", "delete", cid, "--force")
    assert r.returncode == 0 and json.loads(cli.run("history", "list", "--json").stdout) == []


def test_a_locked_database_never_holds_a_run_past_its_time_limit(cli, fake):
    """round 19d: another process holding the database (a backup's BEGIN EXCLUSIVE) held `run --timeout 5` for
    the store's 30 s busy wait, and it failed although the model answered at once. A wait for the lock takes at
    most half the time the run has left; the run answers without its history, and says why."""
    cli.use(fake)
    fake.add({"content": "warm"}, {"content": "the answer"})
    assert cli.run("run", "--prompt", "warm").returncode == 0
    conn = sqlite3.connect(str(cli.xz_home / "conversations.db"), isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        r = cli.run("run", "--timeout", "6", "--prompt", "say it")
        took = time.monotonic() - started
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert r.returncode == 0 and r.stdout == "the answer\n", r.stderr
    assert took < 15, took  # the 30 s wait it replaced, far from it (a loaded machine starts slowly)
    assert r.stderr.count("warning:") == 1 and "locked by another process" in r.stderr


def test_a_damaged_row_is_shown_as_damaged_and_the_rest_works(cli, fake):
    """round 19d: tool calls that were not JSON (or not a list), or content stored as a BLOB, made `history show`,
    `replay`, `history search` (for the whole store) and `run --resume` exit 1 with "internal error"."""
    cli.use(fake)
    fake.add({"content": "first answer"})
    assert cli.run("run", "--prompt", "first task about otters").returncode == 0
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    conn = sqlite3.connect(str(cli.xz_home / "conversations.db"))
    rows = [(cid, 10, "assistant", "", "{not json"), (cid, 11, "tool", "orphan result", None),
            (cid, 12, "assistant", "", '{"a": 1}'), (cid, 13, "user", b"\xff\xfebinary otters", None),
            (cid, 14, "assistant", "", json.dumps([{"type": "function", "function": {"name": "terminal"}}]))]
    for row in rows:
        conn.execute("INSERT INTO messages (conversation_id, seq, role, content, tool_calls, tool_call_id, "
                     "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)", row + (("c1" if row[2] == "tool" else None),
                                                                   b"\xffwhen"))
    conn.commit()
    conn.close()
    r = cli.run("history", "show", cid[:10])
    assert r.returncode == 0 and r.stdout.count("[damaged row: its tool calls are not a list of calls]") == 3
    assert "[damaged row: its content is not text]" in r.stdout and "binary otters" in r.stdout
    r = cli.run("history", "show", "--json", cid[:10])
    assert r.returncode == 0 and sum("damaged" in m for m in json.loads(r.stdout)["messages"]) == 4
    r = cli.run("replay", cid[:10])
    assert r.returncode == 0 and "first answer" in r.stdout and "damaged row" in r.stdout
    r = cli.run("history", "search", "otters", "--json")
    assert r.returncode == 0 and [c["id"] for c in json.loads(r.stdout)] == [cid]
    fake.add({"content": "resumed"})
    r = cli.run("run", "--resume", cid[:10], "--prompt", "go on")
    assert r.returncode == 0 and r.stdout == "resumed\n", r.stderr
    sent = fake.model_requests()[-1]["body"]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"][-2:] == ["first task about otters", "go on"]
    assert not any(m["role"] == "tool" for m in sent)  # the result whose call was damaged went with it


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_db_path_that_is_not_a_file_is_said_so_and_left_as_it_is(cli, fake, tmp_path, kind):
    """round 19d: a db_path naming a directory (or a FIFO, or a device) had its mode changed to 0600: a directory
    nobody could enter any more. Only a regular file is ever chmod-ed; anything else is one warning."""
    target = tmp_path / "shared_data"
    if kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(str(target))
    os.chmod(str(target), 0o755)
    cli.use(fake, persistence={"db_path": str(target)})
    fake.add({"content": "fine"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "fine\n"
    assert r.stderr.count("warning:") == 1 and "is a %s, not a file" % ("directory" if kind == "directory" else
                                                                      "named pipe") in r.stderr
    assert os.stat(str(target)).st_mode & 0o777 == 0o755


def test_a_database_reached_through_a_symlink_and_its_wal_are_private(cli, fake, tmp_path):
    """round 19d: conversations.db a symlink to a database not made yet (on another disk): sqlite made it, and
    its -wal and -shm, 0644 under umask 022. The target is created 0600 first, whatever the umask."""
    data = tmp_path / "data"
    data.mkdir()
    (cli.xz_home / "conversations.db").symlink_to(data / "conversations.db")
    cli.use(fake)
    fake.add({"hang": 60})
    old = os.umask(0o022)
    try:
        proc = cli.popen("run", "--prompt", "private task")
    finally:
        os.umask(old)
    try:
        assert wait_for(lambda: len(fake.model_requests()) == 1)
        modes = {p.name: p.stat().st_mode & 0o777 for p in data.iterdir()}
    finally:
        proc.kill()
        proc.wait(10)
    assert modes == {"conversations.db": 0o600, "conversations.db-wal": 0o600, "conversations.db-shm": 0o600}
    assert (cli.xz_home / "conversations.db").is_symlink()


def test_migration_seals_undo_content_an_earlier_version_stored_as_it_was(tmp_path):
    """round 19d: the redaction migration cannot touch undo content (it must restore byte for byte), and nothing
    sealed it: a `.env`'s key stayed readable in the database file. It is sealed as new records are, and still
    restores as it was."""
    path = str(tmp_path / "old.db")
    key = b"OPENAI_API_KEY=sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2\n"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    for migration in MIGRATIONS[:4]:
        for statement in migration.split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute("PRAGMA user_version = 4")
    conn.execute("INSERT INTO undo (conversation_id, tool_call_id, tool, path, kind, content, created_at) VALUES "
                 "('01OLD', 'c1', 'edit_file', '/w/.env', 'file', ?, '2025-01-01T00:00:00Z')", (key,))
    conn.execute("INSERT INTO undo (conversation_id, tool_call_id, tool, path, kind, content, created_at) VALUES "
                 "('01OLD', 'c2', 'move_path', '/w/a', 'moved', ?, '2025-01-01T00:00:00Z')", (b"/w/b",))
    conn.close()
    s = Store(path).open()
    records = s.undo_records()
    assert [(r["kind"], r["content"]) for r in records] == [("moved", b"/w/b"), ("file", key)]
    s.close()
    data = b"".join(open(p, "rb").read() for p in (path, path + "-wal") if os.path.exists(p))
    assert b"sk-proj-Zz9Yy8" not in data and b"/w/b" in data  # a move's destination is a path, shown by --list
    assert os.stat(str(tmp_path / "undo.key")).st_mode & 0o777 == 0o600
