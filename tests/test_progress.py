"""Plan progress (seed 001, update 6): one tool marks a plan's instructions or a free task's own steps; the list
shows on stderr as the seed draws it, as stream-json `step` events, in --json's `steps`, in the stored
conversation and replay, in chat's /plan and in the watcher's result."""

import json

import pytest

import xzatoma
from conftest import tool_call
from xzatoma import Progress, UpdateProgress
from xzatoma_tools import ToolError, ToolContext, build_registry

PLAN = "goal: Count the lines of notes.txt\ninstructions:\n  - read notes.txt\n  - count its lines\n"


def progress_call(**arguments):
    return {"tool_calls": [tool_call("update_progress", **arguments)]}


def test_the_list_as_the_seed_draws_it_and_the_rules_of_marking():
    changes = []
    p = Progress(["List all API endpoint files", "Extract function signatures", "Create OpenAPI spec",
                  "Generate documentation website"], fixed=True, on_change=lambda progress, step: changes.append(step))
    p.mark(1)
    p.mark(2, "done")
    p.mark(3, "in_progress")
    assert "\n".join(p.lines()) == """Completed 2/4 instructions:
✓ List all API endpoint files
✓ Extract function signatures
⧗ Create OpenAPI spec (in progress)
○ Generate documentation website"""
    assert p.lines(numbered=True)[3] == "⧗ 3. Create OpenAPI spec (in progress)"
    assert changes[-1] == {"step": 3, "text": "Create OpenAPI spec", "status": "in_progress", "added": False}
    with pytest.raises(ToolError, match="there is no step 5: the list has 4 instructions"):
        p.mark(5)
    with pytest.raises(ToolError, match="cannot be added to"):
        p.add("one more")  # a plan's instructions are fixed
    again = Progress.restore(json.loads(json.dumps(p.snapshot())))
    assert again.to_json() == p.to_json() and again.fixed and again.brief() == "instructions 2/4 done"
    free = Progress()
    with pytest.raises(ToolError, match="the list is empty; add the steps first"):
        free.mark(1)
    free.add("  look\naround  ")
    assert free.to_json() == [{"step": 1, "text": "look around", "status": "pending"}]


def test_the_tool_marks_adds_and_never_counts_as_work(tmp_path):
    p = Progress()
    reg = build_registry("planning", ToolContext(str(tmp_path), {}), extra=[UpdateProgress(p)])
    r = reg.execute("update_progress", {"add": "read the file"})
    assert r.success and r.metadata["bookkeeping"] and r.output == "Completed 0/1 steps:\n○ 1. read the file"
    assert reg.execute("update_progress", {"step": 1, "status": "in_progress"}).success
    assert "give step" in reg.execute("update_progress", {}).error
    assert "must be one of" in reg.execute("update_progress", {"step": 1, "status": "finished"}).error
    assert p.to_json()[0]["status"] == "in_progress"


def test_a_two_step_plan_streams_its_steps_and_ends_with_them(cli, fake, tmp_path):
    cli.use(fake)
    (cli.workdir / "notes.txt").write_text("a\nb\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    fake.add(progress_call(step=1, status="in_progress"), {"tool_calls": [tool_call("read_file", path="notes.txt")]},
             progress_call(step=1), progress_call(step=2), {"content": "2 lines"})
    r = cli.run("run", "--plan", plan, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["steps"] == [{"step": 1, "text": "read notes.txt", "status": "done"},
                            {"step": 2, "text": "count its lines", "status": "done"}]
    assert out["warnings"] == []
    assert "Completed 0/2 instructions:\n○ read notes.txt\n○ count its lines\n" in r.stderr  # at the start
    assert "Completed 1/2 instructions:\n✓ read notes.txt\n○ count its lines\n" in r.stderr
    assert "Completed 2/2 instructions:\n✓ read notes.txt\n✓ count its lines\n" in r.stderr
    assert "▶ update_progress" not in r.stderr  # the list is what a person sees of those calls
    assert "· instructions 2/2 done ·" in r.stderr

    fake.add(progress_call(step=1, status="in_progress"), {"tool_calls": [tool_call("read_file", path="notes.txt")]},
             progress_call(step=1), {"content": "2 lines"})
    r = cli.run("run", "--plan", plan, "--output-format", "stream-json")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["type"] == "start" and [s["status"] for s in events[0]["steps"]] == ["pending", "pending"]
    steps = [e for e in events if e["type"] == "step"]
    assert [(e["step"], e["status"], e["completed"], e["total"]) for e in steps] == [
        (1, "in_progress", 0, 2), (1, "done", 1, 2)]
    result = events[-1]
    assert result["type"] == "result" and [s["status"] for s in result["steps"]] == ["done", "pending"]
    assert result["warnings"] == ["1 of 2 instructions not marked done: 2. count its lines (pending)"]
    assert "warning: 1 of 2 instructions not marked done" in r.stderr and "instructions 1/2 done" in r.stderr

    replay = cli.run("replay", result["conversation_id"])
    assert replay.returncode == 0
    assert "  Completed 1/2 instructions:\n  ✓ 1. read notes.txt\n  ○ 2. count its lines\n" in replay.stdout
    assert replay.stdout.endswith("Completed 1/2 instructions:\n✓ read notes.txt\n○ count its lines\n")
    stored = json.loads(cli.run("history", "show", result["conversation_id"], "--json").stdout)
    assert stored["progress"]["steps"] == result["steps"] and stored["progress"]["fixed"] is True


def test_a_free_task_adds_its_own_steps_and_a_compact_plan_says_they_were_not_tracked(cli, fake, tmp_path):
    cli.use(fake)
    (cli.workdir / "notes.txt").write_text("a\n")
    fake.add({"tool_calls": [tool_call("update_progress", add="read notes.txt"),
                             tool_call("update_progress", add="answer")]},
             progress_call(step=3), progress_call(step=1), {"tool_calls": [tool_call("read_file", path="notes.txt")]},
             progress_call(step=2), {"content": "It says a."})
    r = cli.run("run", "--json", "What does notes.txt say?")
    assert r.returncode == 0, r.stderr
    assert [(s["text"], s["status"]) for s in json.loads(r.stdout)["steps"]] == [("read notes.txt", "done"),
                                                                                 ("answer", "done")]
    assert "there is no step 3: the list has 2 steps (1-2)" in json.dumps(fake.model_requests()[2]["body"])

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "1 line"})
    r = cli.run("run", "--plan", plan, "--json", "--tools", "compact")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [s["status"] for s in out["steps"]] == ["pending", "pending"]
    assert out["warnings"] == ["the 2 instructions were not tracked: the compact tool profile has no "
                               "update_progress tool to mark them (--tools full offers it)"]
    assert "update_progress" not in json.dumps(fake.model_requests()[-1]["body"]["tools"])


def test_the_watchers_result_carries_the_steps(fake, tmp_path):
    import xzatoma_watch as w
    (tmp_path / "notes.txt").write_text("a\nb\n")
    home = tmp_path / "home"
    env = {"HOME": str(home), "XZATOMA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": fake.url, "provider.max_retries": 0,
                               "agent.tools.profile": "full"}, env=env)
    console = xzatoma.Console(quiet=True)
    run_plan = xzatoma.watch_runner(cfg, console, None, w.Settings(working_dir=str(tmp_path)), "planning", False)
    ev = w.decode_message("plans", 0, 7, b"evt-1", json.dumps({"goal": "Count the lines", "instructions": [
        "read notes.txt", "count its lines"]}).encode())
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, progress_call(step=1), {"content": "2 lines"})
    outcome = run_plan(w.Job(ev, None))
    data = w.result_event(ev, outcome, "xzatoma://host/g")["data"]
    assert data["status"] == "completed" and data["answer"] == "2 lines"
    assert data["steps"] == [{"step": 1, "text": "read notes.txt", "status": "done"},
                             {"step": 2, "text": "count its lines", "status": "pending"}]


def test_progress_alone_is_not_work_an_answer_claims(tmp_path):
    """Marking steps done changes nothing in the workspace: a run that only marked them and says it created a
    file is asked to check, then ends unverified."""
    from test_agent_loop import Scripted, call
    home = tmp_path / "home"
    cfg = xzatoma.load_config({"agent.persistence.enabled": False}, env={"HOME": str(home), "XZATOMA_HOME": str(home),
                                                                        "XDG_CONFIG_HOME": str(home)})
    provider = Scripted(xzatoma.Reply("", [call("update_progress", {"add": "create notes.txt"})]),
                        xzatoma.Reply("", [call("update_progress", {"step": 1}, "c2")]),
                        xzatoma.Reply("I have created notes.txt."), xzatoma.Reply("I have created notes.txt."))
    session = xzatoma.Session.open(cfg, xzatoma.Console(quiet=True), "write", str(tmp_path), "restricted_autonomous",
                                   provider=provider)
    try:
        session.start("run")
        session.conversation.add_user("Create notes.txt with a greeting")
        result = session.agent().run()
    finally:
        session.close()
    assert result.status == "unverified" and result.to_json()["steps"][0]["status"] == "done"


def test_chat_plan_shows_the_steps(chat, cli, fake):
    fake.add({"tool_calls": [tool_call("update_progress", add="look around"),
                             tool_call("update_progress", add="write it up")]},
             progress_call(step=1), {"content": "on it"})
    p = chat()
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.line("/plan")
    p.expect(r"no steps yet")
    p.line("plan the docs")
    p.expect(r"Completed 1/2 steps:\s+✓ look around\s+○ write it up")
    p.expect(r"on it")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.line("/plan")
    p.expect(r"Completed 1/2 steps:\s+✓ 1\. look around\s+○ 2\. write it up")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.eof()
    assert p.wait() == 0


def test_a_plan_refused_as_too_large_is_stored_cut(fake, tmp_path):
    """An event's plan too large for the model's window is refused before it is sent (128,000 tokens went whole
    to a model of 4,096: the larger of the window and the budget was the bound, round 16a), and its conversation
    keeps the plan's beginning and a note: a 7 MB plan was stored whole for every event (round 15c)."""
    import xzatoma_watch as w
    from xzatoma_store import Store
    home = tmp_path / "home"
    env = {"HOME": str(home), "XZATOMA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": fake.url, "provider.max_retries": 0,
                               "provider.ollama.model": "qwen3"}, env=env)  # a window of 32,768, a budget of 100,000
    store = Store(str(tmp_path / "x.db")).open()
    try:
        run_plan = xzatoma.watch_runner(cfg, xzatoma.Console(quiet=True), store,
                                        w.Settings(working_dir=str(tmp_path)), "planning", False)
        plan = {"goal": "Sum the numbers", "context": "1 2 3 " * 100000, "instructions": ["add them up"]}
        ev = w.decode_message("plans", 0, 7, b"evt-1", json.dumps(plan).encode())
        outcome = run_plan(w.Job(ev, None))
        assert outcome["status"] == "failed" and "more than twice what the model can take (32,768)" in \
            outcome["error"] and "a model with a larger window" in outcome["error"]
        assert fake.model_requests() == []
        messages = store.messages(outcome["conversation_id"])
        task = [m["content"] for m in messages if m["role"] == "user" and not m.get("name")]
        assert len(task) == 1 and "Sum the numbers" in task[0] and "more characters not sent" in task[0]
        assert sum(len(m["content"] or "") for m in messages) < 100000
    finally:
        store.close()
