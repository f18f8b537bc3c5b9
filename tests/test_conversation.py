"""Conversation: incremental token accounting and pruning by whole turns."""

import json
import random

import pytest

from conftest import tool_call
from xzatoma import Conversation, estimate_tokens


def build(turns, result_size=2000, calls_per_turn=1, max_tokens=5000, retain=3, threshold=0.8):
    conv = Conversation(max_tokens, retain, threshold)
    conv.add_system("system prompt")
    conv.add_user("the original instruction")
    for t in range(turns):
        calls = [{"id": "c%d_%d" % (t, i), "name": "read_file" if i % 2 == 0 else "grep",
                  "arguments": json.dumps({"path": "f%d" % t})} for i in range(calls_per_turn)]
        conv.add_assistant("", calls)
        for c in calls:
            conv.add_tool_result(c["id"], c["name"], "x" * result_size)
        conv.prune()
    return conv


def assert_paired(messages):
    pending = set()
    for m in messages:
        if m["role"] == "assistant":
            assert not pending
            pending = {c["id"] for c in m.get("tool_calls") or ()}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in pending
            pending.discard(m["tool_call_id"])
        else:
            assert not pending
    assert not pending


def test_token_count_is_the_running_sum_of_estimates():
    conv = Conversation()
    total = 0
    for i in range(50):
        msg = conv.add_user("y" * i)
        total += estimate_tokens(msg)
        assert conv.tokens == total


def test_calibration_adopts_the_provider_count():
    conv = Conversation()
    conv.add_system("s" * 400)
    conv.add_user("u" * 400)
    conv.calibrate(1000)
    assert conv.tokens == 1000
    msg = conv.add_assistant("a" * 400)
    assert conv.tokens == 1000 + estimate_tokens(msg)


@pytest.mark.parametrize("turns,calls,retain", [(5, 1, 3), (40, 1, 3), (40, 3, 2), (200, 2, 5), (30, 4, 1)])
def test_pruning_keeps_head_tail_and_pairs(turns, calls, retain):
    conv = build(turns, calls_per_turn=calls, retain=retain, max_tokens=6000)
    msgs = conv.messages
    assert msgs[0] == {"role": "system", "content": "system prompt"}
    assert msgs[1] == {"role": "user", "content": "the original instruction"}
    assert_paired(msgs)
    assert sum(1 for m in msgs if m.get("pruned_summary")) <= 1
    last_ids = ["c%d_0" % t for t in range(turns - retain, turns)]
    kept_ids = [c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    for cid in last_ids:
        assert cid in kept_ids, "a recent turn was pruned"
    assert conv.tokens == sum(estimate_tokens(m) for m in msgs)


def test_pruning_summary_names_the_tools_and_accumulates():
    conv = build(60, calls_per_turn=2, retain=2, max_tokens=4000)
    summary = [m for m in conv.messages if m.get("pruned_summary")][0]["content"]
    assert summary.startswith("[CONTEXT PRUNED:")
    assert "read_file ×" in summary and "grep ×" in summary
    removed_turns = 60 - conv.turn_count()
    assert "from %d turns" % removed_turns in summary


def test_pruning_never_drops_below_min_retain_turns():
    conv = build(10, result_size=20000, retain=4, max_tokens=1000)
    assert conv.turn_count() == 4
    assert_paired(conv.messages)


def test_no_pruning_below_threshold():
    conv = build(3, result_size=100, max_tokens=100000)
    assert not any(m.get("pruned_summary") for m in conv.messages)
    assert len(conv.messages) == 2 + 3 * 2


def test_pruning_is_rare_thanks_to_hysteresis():
    conv = Conversation(20000, 3, 0.8)
    conv.add_system("s")
    conv.add_user("u")
    prunes = 0
    for t in range(300):
        conv.add_assistant("", [{"id": str(t), "name": "read_file", "arguments": "{}"}])
        conv.add_tool_result(str(t), "read_file", "z" * 2000)
        if conv.prune():
            prunes += 1
    assert 5 <= prunes <= 40


def test_context_window_bounds_the_limit():
    conv = Conversation(100000, 2, 0.8)
    assert conv.limit(8192) == 8192 and conv.limit(None) == 100000 and conv.limit(200000) == 100000


def test_close_dangling_answers_every_unanswered_call():
    conv = Conversation()
    conv.add_user("u")
    conv.add_assistant("", [{"id": "a", "name": "t", "arguments": "{}"}, {"id": "b", "name": "t", "arguments": "{}"}])
    conv.add_tool_result("a", "t", "done")
    conv.close_dangling("Error: interrupted")
    assert conv.messages[-1] == {"role": "tool", "tool_call_id": "b", "name": "t", "content": "Error: interrupted"}
    conv.close_dangling()
    assert len(conv.messages) == 4
    assert_paired(conv.messages)


def test_random_histories_stay_paired():
    rng = random.Random(7)
    for _ in range(30):
        conv = Conversation(rng.choice([1000, 3000, 8000]), rng.randint(1, 4), rng.choice([0.5, 0.8, 1.0]))
        conv.add_system("s")
        conv.add_user("u")
        for t in range(rng.randint(1, 80)):
            if rng.random() < 0.1:
                conv.add_user("more " * rng.randint(1, 50))
                continue
            n = rng.randint(0, 3)
            calls = [{"id": "%d.%d" % (t, i), "name": "grep", "arguments": "{}"} for i in range(n)]
            conv.add_assistant("thinking " * rng.randint(0, 30), calls)
            for c in calls:
                conv.add_tool_result(c["id"], "grep", "r" * rng.randint(0, 3000))
            conv.prune(rng.choice([None, 4096]))
        assert_paired(conv.messages)
        assert conv.messages[1] == {"role": "user", "content": "u"}
        assert conv.tokens == sum(estimate_tokens(m) for m in conv.messages)


def test_set_system_prompt_keeps_history():
    conv = Conversation()
    conv.add_system("planning")
    conv.add_user("u")
    conv.set_system_prompt("write mode prompt")
    assert conv.messages[0]["content"] == "write mode prompt" and len(conv.messages) == 2
    assert conv.tokens == sum(estimate_tokens(m) for m in conv.messages)


# ---- honest usage: estimates end to end ----


@pytest.mark.parametrize("provider,api", [("openai", "chat"), ("ollama", "chat"), ("openai", "responses")])
def test_a_server_without_usage_gets_an_estimate(cli, fake, provider, api):
    (cli.workdir / "notes.txt").write_text("alpha\n" * 200)
    cli.use(fake, provider=provider, api=api)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")], "usage": None},
             {"content": "two hundred alphas", "usage": None})
    r = cli.run("run", "--json", "--prompt", "count the alphas")
    assert r.returncode == 0, r.stderr
    usage = json.loads(r.stdout)["usage"]
    assert usage["estimated"] is True
    # the second request carries the first plus a 1,200-character tool result: about 300 tokens more
    assert usage["prompt_tokens"] > 2 * 300 and usage["completion_tokens"] > 0
    assert "(estimated: the server sent no usage)" in r.stderr
    if provider == "openai" and api == "chat":
        assert all(q["body"]["stream_options"] == {"include_usage": True} for q in fake.model_requests())


def test_reported_usage_is_not_marked_estimated(cli, fake):
    cli.use(fake, provider="openai")
    fake.add({"content": "ok", "usage": {"prompt_tokens": 123, "completion_tokens": 4}})
    r = cli.run("run", "--json", "--prompt", "x")
    usage = json.loads(r.stdout)["usage"]
    assert usage == {"prompt_tokens": 123, "completion_tokens": 4, "total_tokens": 127, "estimated": False}
    assert "estimated" not in r.stderr


def test_token_quota_counts_estimates(cli, fake):
    (cli.workdir / "big.txt").write_text("word " * 2000)
    cli.use(fake, provider="openai", quota={"max_total_tokens": 5000})
    fake.add(*[{"tool_calls": [tool_call("read_file", path="big.txt", start_line=1, end_line=i)], "usage": None}
               for i in range(1, 11)])  # ten different reads: the same call twice in a row is refused as a loop
    r = cli.run("run", "--json", "--prompt", "read it again and again")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "quota_exceeded", r.stderr
    assert out["turns"] < 10 and out["usage"]["estimated"] is True


def test_chat_footer_says_estimated(cli, fake):
    cli.use(fake, provider="openai")
    fake.add({"content": "hello there", "usage": None})
    r = cli.run("chat", input="hi\n")
    assert r.returncode == 0 and "hello there" in r.stdout
    assert "this session (estimated: the server sent no usage)" in r.stderr
