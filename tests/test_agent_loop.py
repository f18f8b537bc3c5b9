"""The loop's stop conditions, in-process against a scripted provider object (milliseconds each).

The wire formats and the CLI end to end are tested against the fake HTTP server elsewhere; here a
Session is opened with a provider that replays a script, so every way a run can end is checked
without a socket: completed, max turns, timeout, quota, interrupted (Ctrl-C, SIGTERM, cancel),
provider failed, a cut-off answer, malformed calls, and that the conversation is saved whatever
ends it.
"""

import json

import pytest

import xzatoma
from xzatoma import Reply
from xzatoma_tools import RESTRICTED
import xzatoma_store
from xzatoma_store import Store


class Scripted:
    """A provider that replays `script`: Reply objects, exceptions to raise, or callables(messages, tools)."""

    name, model = "scripted", "script-1"

    def __init__(self, *script):
        self.script = list(script)
        self.calls = []

    def complete(self, messages, tools, on_delta=None, deadline=None, estimated_tokens=0):
        self.calls.append({"messages": [dict(m) for m in messages], "tools": [t["name"] for t in tools],
                           "deadline": deadline})
        step = self.script.pop(0) if self.script else Reply("(script exhausted)")
        if callable(step) and not isinstance(step, type):
            step = step(messages, tools)
        if isinstance(step, BaseException) or (isinstance(step, type) and issubclass(step, BaseException)):
            raise step
        return step

    def context_window(self, model=None):
        return None

    def is_local(self):
        return False

    def prefer(self, **sampling):  # the compact profile's sampling (Provider.prefer)
        self.preferred = sampling

    def clone(self):
        return self


def call(name, args, id="c1"):
    return {"id": id, "name": name, "arguments": json.dumps(args)}


def read(path="a.txt", id="c1", usage=None):
    return Reply("", [call("read_file", {"path": path}, id)], usage)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def __getattr__(self, name):  # the rest of the time module
        import time
        return getattr(time, name)


@pytest.fixture
def open_session(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n")
    home = tmp_path / "home"
    opened = []

    def open_session(*script, persist=False, **flags):
        env = {"HOME": str(home), "XZATOMA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
        cfg = xzatoma.load_config(dict({"agent.persistence.enabled": persist}, **flags), env=env)
        session = xzatoma.Session.open(cfg, xzatoma.Console(quiet=True), "write", str(tmp_path), RESTRICTED,
                                       provider=Scripted(*script))
        opened.append(session)
        return session
    yield open_session
    for session in opened:
        session.close()


def run(session, instruction="do it", **limits):
    if session.conversation is None:
        session.start("run", title=instruction)
    session.conversation.add_user(instruction)
    return session.agent(**limits).run()


def test_an_answer_completes_the_run(open_session):
    s = open_session(read(usage={"prompt_tokens": 10, "completion_tokens": 2}),
                     Reply("done", usage={"prompt_tokens": 20, "completion_tokens": 3}))
    r = run(s)
    assert (r.status, r.exit_code, r.answer, r.error) == ("completed", 0, "done", None)
    assert (r.turns, r.tool_calls, r.prompt_tokens, r.completion_tokens) == (2, 1, 30, 5)
    tool_msg = s.conversation.messages[-2]
    assert tool_msg["role"] == "tool" and "hello" in tool_msg["content"]


def test_max_turns_counts_this_runs_turns(open_session):
    s = open_session(*[read(id="c%d" % i) for i in range(10)])
    r = run(s, max_turns=3)
    assert (r.status, r.exit_code, r.turns) == ("max_turns", 1, 3)
    assert "stopped after 3 turns" in r.error and "--max-turns" in r.error
    r = run(s, "go on", max_turns=2)  # a second run of the same conversation: its own limit, totals carry on
    assert (r.status, r.turns) == ("max_turns", 5)


def test_the_deadline_ends_the_run_between_steps(open_session, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(xzatoma, "time", clock)

    def slow(messages, tools):
        clock.now += 4
        return read(id="c%d" % len(messages))
    s = open_session(slow, slow, slow, slow)
    r = run(s, timeout_seconds=10)
    assert (r.status, r.exit_code, r.turns) == ("timeout", 1, 3)
    assert r.error == "timed out after 10s (agent.timeout_seconds); raise it with --timeout"
    assert s.provider.calls[0]["deadline"] == 1010.0  # the provider and the tools get the same deadline
    s = open_session(slow, slow, slow, slow)  # a watcher's run names the watcher's setting (round 17c)
    s.start("watch", title="do it")
    r = run(s, timeout_seconds=10)
    assert r.error == "timed out after 10s (watcher.timeout_seconds); raise it with --timeout"


def test_a_deadline_inside_the_model_call_is_a_timeout(open_session):
    s = open_session(read(), xzatoma.DeadlineExceeded)
    r = run(s, timeout_seconds=5)
    assert (r.status, r.turns, r.tool_calls) == ("timeout", 1, 1)


def test_the_tools_get_the_runs_deadline(open_session, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(xzatoma, "time", clock)
    s = open_session(Reply("ok"))
    s.start("run")
    agent = s.agent(timeout_seconds=30)
    assert agent.registry.ctx.deadline == agent.deadline == 1030.0
    assert s.ctx.deadline is None  # the session's own context is not changed


def test_quota_of_tokens_stops_the_run(open_session):
    s = open_session(read(usage={"prompt_tokens": 40, "completion_tokens": 20}), Reply("never"),
                     **{"agent.quota.max_total_tokens": 50})
    r = run(s)
    assert (r.status, r.exit_code, r.turns) == ("quota_exceeded", 1, 1)
    assert "agent.quota.max_total_tokens (50)" in r.error and s.quota.tokens == 60


@pytest.mark.parametrize("signal,status,code,text", [
    (KeyboardInterrupt, "interrupted", 130, "interrupted (Ctrl-C)"),
    (xzatoma.Terminated, "interrupted", 143, "terminated (SIGTERM)")])
def test_signals_become_interrupted_at_the_runs_edge(open_session, signal, status, code, text):
    s = open_session(Reply("", [call("read_file", {"path": "a.txt"}, "c1"), call("read_file", {"path": "a.txt"},
                                                                             "c2")]), signal, persist=True)
    r = run(s)
    assert (r.status, r.exit_code, r.error) == (status, code, text)
    assert s.store.conversation(s.id)["status"] == "interrupted"  # saved in the loop's finally


def test_a_signal_during_a_tool_closes_the_dangling_calls(open_session, monkeypatch):
    s = open_session(Reply("", [call("read_file", {"path": "a.txt"}, "c1"),
                                call("read_file", {"path": "a.txt", "start_line": 1}, "c2")]), persist=True)
    s.start("run")
    real = s.registry.execute

    def execute(name, args, call_id=None):
        if call_id == "c2":
            raise KeyboardInterrupt
        return real(name, args, call_id=call_id)
    monkeypatch.setattr(s.registry.__class__, "execute", lambda self, *a, **k: execute(*a, **k))
    r = run(s)
    assert r.status == "interrupted" and r.tool_calls == 1
    results = [m for m in s.conversation.messages if m["role"] == "tool"]
    assert [m["content"] for m in results][-1] == "Error: interrupted"
    stored = s.store.messages(s.id)
    assert [m["tool_call_id"] for m in stored if m["role"] == "tool"] == ["c1", "c2"]


def test_the_cancel_event_interrupts(open_session):
    holder = {}

    def cancel_then_call(messages, tools):
        holder["session"].cancel.set()  # e.g. a parallel sibling failed with fail_fast, or Ctrl-C elsewhere
        return read()
    s = open_session(cancel_then_call)
    holder["session"] = s
    r = run(s)
    assert (r.status, r.exit_code, r.error, r.tool_calls) == ("interrupted", 130, "cancelled", 0)


def test_provider_failure_ends_the_run_with_its_message(open_session):
    s = open_session(read(), xzatoma.ProviderError("the model server said no (HTTP 500); try again later"))
    r = run(s)
    assert (r.status, r.exit_code, r.turns) == ("failed", 1, 1)
    assert r.error == "the model server said no (HTTP 500); try again later"
    assert r.unreachable is False
    s = open_session(read(), xzatoma.ProviderError("cannot connect to Ollama (connection refused)", unreachable=True))
    r = run(s)  # nothing listening: said, so that a watcher waits for the server instead of answering `failed`
    assert (r.status, r.unreachable) == ("failed", True)


def test_a_cut_off_answer_is_not_a_success(open_session):
    s = open_session(Reply("half an ans", finish_reason="length"))
    r = run(s)
    assert r.status == "failed" and "cut off" in r.error and r.answer == "half an ans"


def test_three_malformed_tool_calls_in_a_row_stop(open_session):
    bad = [Reply("", [call("no_such_tool", {}, "c%d" % i)]) for i in range(5)]
    s = open_session(*bad)
    r = run(s)
    assert (r.status, r.turns) == ("failed", 3) and "3 malformed or invalid tool calls" in r.error


def test_progress_is_saved_after_every_step(open_session):
    seen = []
    s = open_session(read(usage={"prompt_tokens": 5, "completion_tokens": 1}), read(id="c2"), Reply("ok"),
                     persist=True)
    s.start("run", title="t")
    s.conversation.add_user("go")
    s.agent(on_step=lambda a: seen.append(s.store.conversation(s.id)["turns"])).run()
    assert seen == [1, 2, 3]
    assert s.store.conversation(s.id)["status"] == "completed"


def test_a_subagent_summary_is_counted_once(open_session):
    task = {"label": "t", "task_prompt": "look"}
    one = {"prompt_tokens": 1, "completion_tokens": 1}
    s = open_session(Reply("", [call("subagent", task)], one),
                     Reply("found it", usage={"prompt_tokens": 7, "completion_tokens": 3}),  # the child's answer
                     Reply("summary", usage={"prompt_tokens": 11, "completion_tokens": 2,  # its report
                                             "total_tokens": 13}),
                     Reply("all done", usage=one))
    r = run(s)
    assert r.status == "completed" and s.quota.tokens == 2 + 23 + 2 and s.quota.executions == 1
    result = [m for m in s.conversation.messages if m["role"] == "tool"][0]["content"]
    assert "summary" in result and "2 turns" in result and "23 tokens" in result


def test_ctrl_c_in_a_subagent_stops_the_whole_tree(open_session):
    s = open_session(Reply("", [call("subagent", {"label": "t", "task_prompt": "look"})]), KeyboardInterrupt,
                     Reply("the parent must not be asked again"), persist=True)
    r = run(s)
    assert (r.status, r.exit_code) == ("interrupted", 130)
    assert len(s.provider.calls) == 2
    child = s.store.list_conversations(5, kind="subagent")[0]
    assert child["status"] == "interrupted" and child["parent_id"] == s.id


def test_a_child_session_is_narrowed_and_shares_what_the_tree_shares(open_session):
    s = open_session()
    s.start("run")
    child = s.child("t", ["read_file", "grep"])
    child.start("subagent")
    assert sorted(child.registry.names()) == ["grep", "read_file"]
    assert child.quota is s.quota and child.cancel is s.cancel and child.store is s.store
    assert (child.depth, child.parent_id, child.ctx.depth, child.ctx.label) == (1, s.id, 1, "t")
    assert "You are a subagent (label 't', depth 1)" in child.conversation.messages[1]["content"]


def test_rebuild_keeps_the_conversation_and_renews_the_tools(open_session):
    s = open_session()
    s.start("chat")
    s.conversation.add_user("hi")
    cancel = s.cancel
    s.rebuild(toolset="planning")
    assert "write_file" not in s.registry and s.cancel is not cancel
    assert s.conversation.messages[0]["content"].count("Mode: PLANNING") == 1
    assert s.conversation.messages[2]["content"] == "hi"


def test_what_was_said_is_stored_before_every_wait(open_session, monkeypatch):
    """A run's writes wait in memory and go in one transaction, but never past a wait: when the model is asked
    and when a tool runs, everything said before is in the store (a kill -9 then loses nothing said), and a
    step costs one commit, not one per message (issue 22)."""
    import xzatoma_tools
    s = open_session(persist=True)
    stored = lambda: [(m["role"], m["content"]) for m in s.store.messages(s.id)]  # noqa: E731
    seen = {}

    def first(messages, tools):
        seen["first ask"] = stored()
        return read()

    def second(messages, tools):
        seen["second ask"] = stored()
        return Reply("the file says hello")
    s.provider.script += [first, second]
    real = xzatoma_tools.ReadFile.run

    def reading(self, args, ctx):
        seen["tool"] = stored()
        return real(self, args, ctx)
    monkeypatch.setattr(xzatoma_tools.ReadFile, "run", reading)
    s.start("run", title="t")
    commits = []
    s.store.conn().set_trace_callback(lambda sql: commits.append(sql) if sql.startswith("COMMIT") else None)
    s.conversation.add_user("what does a.txt say")
    assert run_agent(s).status == "completed"
    assert seen["first ask"][-1] == ("user", "what does a.txt say")
    assert seen["tool"][-1][0] == "assistant"  # the call is stored before it runs
    assert seen["second ask"][-1][0] == "tool" and "hello" in seen["second ask"][-1][1]
    assert stored()[-1] == ("assistant", "the file says hello")
    assert s.store.conversation(s.id)["status"] == "completed"
    assert len(commits) == 4  # before the first ask, before the tool, before the second ask, at the end


def run_agent(session):
    return session.agent().run()


def test_a_task_over_twice_the_window_is_never_sent(open_session):
    """Pruning never cuts the task: one over twice the window was sent whole (an event's Markdown plan of 1.6
    million steps was an 18 MB request; Ollama cuts such a prompt silently). The run fails, saying why."""
    s = open_session(Reply("done"))
    r = run(s, "count these: " + "word " * 200000)  # about 250,000 tokens, the budget 100,000
    assert (r.status, r.exit_code) == ("failed", 1) and s.provider.calls == []
    assert "more than twice what the model can take (100,000)" in r.error and "shorten it" in r.error
    s = open_session(Reply("done"))
    assert run(s, "count these: " + "word " * 100000).status == "completed"  # over the budget, not twice: sent
    # the task alone: a later turn as big is the server's to refuse (refused here, a chat lost its recent turns
    # and a run with big tool results stopped, found by an attack round)
    s = open_session(Reply("first"), Reply("second"))
    assert run(s, "hello").status == "completed"
    assert run(s, "and these: " + "word " * 200000).status == "completed" and len(s.provider.calls) == 2


def test_a_refused_task_is_kept_cut_and_the_conversation_goes_on(open_session):
    """A refused task is stored as its beginning and a note, not whole (an event's 7 MB plan was stored whole for
    every event, attack round 15c), and it is cut in the conversation too: a chat whose first message was
    refused went on refusing every later turn, since pruning keeps the task."""
    s = open_session(Reply("hello back"), persist=True)
    task = "count these: " + "word " * 200000
    r = run(s, task)
    assert (r.status, r.exit_code) == ("failed", 1) and s.provider.calls == []
    stored = [m for m in s.store.messages(s.id) if m["role"] == "user" and not m.get("name")]
    assert len(stored) == 1 and stored[0]["content"].startswith("count these: word word")
    assert len(stored[0]["content"]) < 3000 and "998,013 more characters not sent" in stored[0]["content"]
    assert "not sent" in stored[0]["content"]
    assert run(s, "hello").status == "completed"  # the next turn is sent, the cut task with it
    sent = s.provider.calls[0]["messages"]
    assert sent[-1]["content"] == "hello" and any("not sent" in (m.get("content") or "") for m in sent)
    assert len(s.store.messages(s.id)) < 10


def test_a_secret_across_the_cut_of_a_refused_task_is_not_kept_in_part(open_session):
    s = open_session(Reply("done"), persist=True)
    xzatoma_store.register_secret("s3cr3t-" + "k" * 40)
    task = "x" * (xzatoma.TASK_KEPT - 20) + " s3cr3t-" + "k" * 40 + " " + "word " * 200000
    assert run(s, task).status == "failed"
    stored = [m["content"] for m in s.store.messages(s.id) if m["role"] == "user" and not m.get("name")][0]
    assert "s3cr3t" not in stored and "kkkk" not in stored and "[REDACTED]" in stored


def test_a_task_refused_after_pruning_is_cut_and_the_chat_goes_on(open_session):
    """Pruned, a conversation keeps a summary after its task: cut_task looked at the summary and cut nothing, and
    a chat whose window then shrank (a /model switch, a window learned from a refusal) refused every later turn
    (round 16b). The task is cut, and the next turn is sent."""
    s = open_session(*[Reply("answer %d" % i) for i in range(8)], persist=True)
    task = "remember these: " + "word " * 30000  # about 37,500 tokens: within a window of 131,072
    s.provider.context_window = lambda model=None: 131072
    assert run(s, task).status == "completed"
    for i in range(6):
        assert run(s, "more " * 8000 + "turn %d" % i).status == "completed"
    s.conversation.prune(force=True)
    assert any(m.get("pruned_summary") for m in s.conversation.messages)
    s.provider.context_window = lambda model=None: 4096  # another model, or the server said so
    r = run(s, "and now?")
    assert r.status == "failed" and "more than twice what the model can take (4,096)" in r.error
    task_now = [m for m in s.conversation.messages if m["role"] == "user"][1]["content"]
    assert len(task_now) < 3000 and "more characters not sent" in task_now
    calls = len(s.provider.calls)
    assert run(s, "hello").status == "completed" and len(s.provider.calls) == calls + 1
