"""`xzatoma chat` under a real pseudo-terminal against the fake model server."""

import json
import subprocess

import pytest

from conftest import said, tool_call, wait_for
from ptyrun import PtyProcess

PROMPT = r"\[%s\]\[%s\] >> "


@pytest.fixture
def chat(chat, cli):
    """conftest's chat, in a working directory with a notes.txt to mention and read."""
    (cli.workdir / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    return chat


def user_messages(fake, index=-1):
    """What the person said (the environment message after the system prompt is xzatoma's)."""
    return [m["content"] for m in fake.model_requests()[index]["body"]["messages"]
            if m["role"] == "user" and not m["content"].startswith("<environment_context>")]


def tool_results(fake, index=-1):
    return [m["content"] for m in fake.model_requests()[index]["body"]["messages"] if m["role"] == "tool"]


def test_banner_turn_status_unknown_command_and_ctrl_d(chat, fake):
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "It has three lines."})
    p = chat()
    p.expect(r"XZatoma Interactive Chat Mode - Welcome!")
    p.expect(r"Mode:   PLANNING \(Read-only mode for creating plans\)")
    p.expect(r"Safety: SAFE \(Confirm dangerous operations\)")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("how many lines in notes.txt?")
    p.expect(r"▶ read_file notes\.txt")
    p.expect(r"✓ alpha  \(\+2 lines\)")
    p.expect(r"It has three lines\.")
    p.expect(r"tokens: [\d,]+ this turn · [\d,]+ this session · context ~[\d,]+ \(\d+% of 131,072\)")
    p.line("/STATUS")
    p.expect(r"XZatoma Session Status")
    p.expect(r"Available Tools:   12 \(list_directory")  # with activate_skill and update_progress
    p.expect(r"Conversation ID:   (\w{26})")
    p.line("/stauts")
    p.expect(r"unknown command /stauts; did you mean /status\?")
    p.line("/help")
    p.expect(r"/mode planning\|write")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.eof()
    assert p.wait() == 0
    assert "Resume this conversation with: xzatoma chat --resume" in p.seen
    assert len(fake.model_requests()) == 2  # /status, /stauts and /help never reached the model


def test_readline_history_is_kept_between_sessions(chat, fake, cli):
    fake.add({"content": "one"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("remember this line")
    p.expect("one")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.eof()
    assert p.wait() == 0
    assert "remember this line" in (cli.xz_home / "chat_history").read_text()
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.send("\x1b[A")  # arrow up recalls the previous session's line
    p.expect("remember this line")


def test_mode_switch_offers_write_tools_and_keeps_history(chat, fake):
    fake.add({"content": "planning answer"}, {"content": "write answer"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("first question")
    p.expect("planning answer")
    p.line("/mode write")
    p.expect(r"Switched to WRITE mode\. All tools now available\.")
    p.expect(r"warning: in Write mode the agent can change files")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("second question")
    p.expect("write answer")
    first, second = fake.model_requests()
    tools = lambda req: {t["function"]["name"] for t in req["body"]["tools"]}
    assert "write_file" not in tools(first) and {"write_file", "terminal"} <= tools(second)
    assert user_messages(fake) == ["first question", "second question"]
    assert "Mode: WRITE" in second["body"]["messages"][0]["content"]
    assert "planning answer" in [m["content"] for m in second["body"]["messages"]]
    p.line("/planning")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("/write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert p.seen.count("warning: in Write mode") == 1


def test_confirmations_no_always_and_edit(chat, fake, cli):
    fake.add({"tool_calls": [tool_call("write_file", path="notes.txt", content="replaced\n")]},
             {"content": "declined noted"},
             {"tool_calls": [tool_call("write_file", path="notes.txt", content="v2\n")]},
             {"tool_calls": [tool_call("write_file", path="notes.txt", content="v3\n")]},
             {"content": "written twice"},
             {"tool_calls": [tool_call("terminal", command="touch wanted.txt")]},
             {"content": "ran edited"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("overwrite notes")
    p.expect(r"Allow write_file\?")
    p.expect(r"-alpha")
    p.expect(r"\+replaced")
    p.expect(r"\[y\]es / \[n\]o / \[a\]lways for this tool this session / ne\[v\]er this session > ")
    p.line("n")
    p.expect("declined noted")
    assert tool_results(fake)[0] == "Error: the user declined write_file notes.txt"
    assert (cli.workdir / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"
    p.line("write it twice")
    p.expect(r"Allow write_file\?")
    p.line("a")
    p.expect("written twice")
    assert (cli.workdir / "notes.txt").read_text() == "v3\n"
    assert p.seen.count("Allow write_file?") == 2  # the second write was covered by 'always'
    p.line("/status")
    p.expect(r"Session answers:   always: write_file; never: -")
    p.line("make a file")
    p.expect(r"Run this command\? \(touch is not on the read-only allowlist\)")
    p.expect(r"\$ touch wanted\.txt")
    p.expect(r"/ \[e\]dit > ")
    p.line("e")
    p.expect("edit the command > ")
    p.expect("touch wanted.txt")  # the line starts from the proposed command
    p.line("\x15touch edited.txt")  # Ctrl-U clears it
    p.expect("ran edited")
    assert (cli.workdir / "edited.txt").exists() and not (cli.workdir / "wanted.txt").exists()
    p.line("/safe")
    p.line("/status")
    p.expect(r"Prompt Format")
    assert "Session answers" not in p.buffer


def test_yolo_runs_without_asking_and_safe_asks_again(chat, fake, cli):
    fake.add({"tool_calls": [tool_call("write_file", path="notes.txt", content="yolo\n")]}, {"content": "done"},
             {"tool_calls": [tool_call("terminal", command="sudo rm -rf /")]}, {"content": "refused"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("/yolo")
    p.expect(r"Switched to YOLO safety mode")
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.line("write")
    p.expect("done")
    assert (cli.workdir / "notes.txt").read_text() == "yolo\n" and "Allow write_file" not in p.seen
    p.line("dangerous")
    p.expect("refused")
    assert tool_results(fake)[-1].startswith("Error: command denied (privilege escalation")
    p.line("/safe")
    p.expect(PROMPT % ("WRITE", "SAFE"))


def test_ctrl_c_cancels_a_slow_tool_and_the_next_turn_works(chat, fake, cli):
    fake.add({"tool_calls": [tool_call("terminal", command="echo $$ > pgid; sleep 30")]},
             {"content": "next turn fine"})
    p = chat("--mode", "write", "--safety", "yolo")
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.line("run something slow")
    p.expect(r"▶ terminal echo")
    assert wait_for(lambda: (cli.workdir / "pgid").exists() and (cli.workdir / "pgid").read_text().strip())
    p.interrupt()
    p.expect(r"turn cancelled; the conversation is intact")
    p.expect(PROMPT % ("WRITE", "YOLO"))
    from test_terminal import group_gone
    assert group_gone(int((cli.workdir / "pgid").read_text()))
    p.line("and now?")
    p.expect("next turn fine")
    messages = fake.model_requests()[-1]["body"]["messages"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["Error: cancelled by user"]
    assert said(messages) == ["run something slow", "and now?"]


def test_ctrl_c_at_the_prompt_reminds_then_double_exits(chat, fake):
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.interrupt()
    p.expect(r"Ctrl-C again within a second, Ctrl-D or 'exit' leaves")
    p.expect(PROMPT % ("PLANNING", "SAFE"))  # a person presses again once the prompt is back
    p.interrupt()
    assert p.wait() == 0


def test_mentions(chat, fake, cli):
    (cli.workdir / "src").mkdir()
    (cli.workdir / "src" / "app.py").write_text("print('hi')\n")
    cli.use(fake, tools={"fetch": {"allowed_hosts": []}})
    fake.add({"content": "seen"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line('look at @notes.txt#L2-3 and @notes.txt#L1 and @src/ and @nothere.txt and \\@notes.txt '
           'and me@example.com and @search:"GAMMA" and @url:http://169.254.169.254/latest')
    p.expect("seen")
    message = user_messages(fake)[0]
    assert "[Content of @notes.txt#L2-3]\nbeta\ngamma\n[End of @notes.txt#L2-3]" in message
    assert "[Content of @notes.txt#L1]\nalpha\n[End of @notes.txt#L1]" in message
    assert "src/app.py" in message
    assert "Failed to include @nothere.txt:\n\n<no such file or directory: nothere.txt>\n\nSuggestion: use notes.txt" \
        in message
    assert "notes.txt:3: gamma" in message
    assert "Failed to include @url:http://169.254.169.254/latest:\n\n<169.254.169.254 is a link-local address" in message
    assert message.endswith("and @notes.txt and me@example.com and @search:\"GAMMA\" and "
                            "@url:http://169.254.169.254/latest")
    assert message.count("[Content of") == 4
    for line in ("@notes.txt#L2-3: loaded (2 lines)", "@nothere.txt: failed", "@url:http://169.254.169.254/latest: failed"):
        assert line in p.seen


def test_piped_stdin_runs_lines_as_turns(cli, fake):
    cli.use(fake)
    fake.add({"content": "answer one"}, {"content": "answer two"})
    r = subprocess.run(cli.command("chat"), input="first line\n\nsecond line\n", capture_output=True, text=True,
                       env=cli.env, cwd=str(cli.workdir), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "answer one\nanswer two\n"
    assert ">>" not in r.stdout + r.stderr and "Welcome" not in r.stderr and "\033[" not in r.stdout + r.stderr
    assert user_messages(fake) == ["first line", "second line"]
    assert "Resume this conversation with: xzatoma chat --resume" in r.stderr
    fake.add({"content": "continued"})
    r = subprocess.run(cli.command("chat", "--last"), input="third line\n", capture_output=True, text=True,
                       env=cli.env, cwd=str(cli.workdir), timeout=60)
    assert r.stdout == "continued\n" and user_messages(fake) == ["first line", "second line", "third line"]


def test_resume_clear_history_undo_context_and_model(chat, fake, cli):
    fake.add({"content": "remembered"})
    r = cli.run("run", "--json", "--prompt", "the secret word is walrus")
    cid = json.loads(r.stdout)["conversation_id"]
    fake.add({"tool_calls": [tool_call("write_file", path="new.txt", content="x")]}, {"content": "made"},
             {"content": "after clear"})
    p = chat("--resume", cid[:14], "--mode", "write", "--safety", "yolo")
    p.expect(r"resumed conversation %s \(\d+ messages, completed\)" % cid)
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.line("make a file")
    p.expect("made")
    assert "the secret word is walrus" in user_messages(fake)
    assert (cli.workdir / "new.txt").exists()
    p.line("/undo")
    p.expect(r"removed .*new\.txt \(created by the agent\)")
    assert not (cli.workdir / "new.txt").exists()
    p.line("/context")
    p.expect(r"context now: ~[\d,]+ tokens .*, of a 100,000 budget")
    p.line("/history")
    p.expect(cid[:12])
    p.line("/model qwen3")
    p.expect(r"Switched to model qwen3 \(the conversation is kept\)")
    p.line("/clear")
    p.expect(r"Started a new conversation \((\w{26})\)")
    p.line("fresh start")
    p.expect("after clear")
    assert user_messages(fake) == ["fresh start"] and fake.model_requests()[-1]["body"]["model"] == "qwen3"
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.eof()
    assert p.wait() == 0
    rows = json.loads(cli.run("history", "list", "--json").stdout)
    assert [r["kind"] for r in rows] == ["chat", "run"] and rows[1]["id"] == cid
    assert rows[1]["turns"] == 3 and rows[0]["status"] == "completed"


def test_tab_completion(cli, fake):
    import argparse
    import xzatoma
    (cli.workdir / "notes.txt").write_text("x")
    (cli.workdir / "notebook").mkdir()
    cli.use(fake)
    cfg = xzatoma.load_config({}, env=cli.env)
    args = argparse.Namespace(mode=None, safety=None, working_dir=str(cli.workdir), resume=None, last=False,
                              metrics_port=None)
    session = xzatoma.ChatSession(args, cfg, xzatoma.Console(quiet=True))
    assert session.completions("/mo", "/mo") == ["/mode ", "/model ", "/models "]
    assert session.completions("/mode p", "p") == ["planning"]
    assert session.completions("read @no", "@no") == ["@notebook/", "@notes.txt"]
    assert session.completions("read @../", "@../") == []


@pytest.mark.parametrize("flags,coloured", [((), True), (("--no-color",), False)])
def test_no_color_leaves_the_prompt_plain(cli, fake, flags, coloured):
    import re
    cli.use(fake)
    env = {k: v for k, v in cli.env.items() if k != "NO_COLOR"}
    p = PtyProcess(cli.command("chat", *flags), dict(env, TERM="xterm"), str(cli.workdir))
    try:
        p.expect(r" >> ")
        colours = re.findall(r"\x1b\[[\d;]*m", p.seen)
        assert bool(colours) == coloured, colours
        if not coloured:
            assert re.search(PROMPT % ("PLANNING", "SAFE"), p.seen)
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
