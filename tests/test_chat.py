"""`xzatoma chat` under a real pseudo-terminal against the fake model server."""

import json
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import SPINNER, person_messages, pty, said, tool_call, wait_for
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
    assert re.search(r"Resume this conversation with: \S+ \S+xzatoma\.py chat --resume", p.seen)
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
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt"),  # a file is replaced once it was read
                             tool_call("write_file", path="notes.txt", content="replaced\n")]},
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
    assert tool_results(fake)[1] == "Error: the user declined write_file notes.txt"
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
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt"),  # a file is replaced once it was read
                             tool_call("write_file", path="notes.txt", content="yolo\n")]}, {"content": "done"},
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
    assert re.search(r"Resume this conversation with: \S+ \S+xzatoma\.py chat --resume", r.stderr)
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


# ---- Ctrl-C: a clean prompt, and what was streamed is kept ----


def quiet_after(p, seconds=0.6):
    """What the program writes in the next `seconds` (the spinner redraws every 0.1 s: it would show)."""
    start = len(p.seen)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        p._read(deadline - time.monotonic())
    return p.seen[start:]


def test_ctrl_c_in_a_streamed_answer_keeps_it_and_leaves_a_clean_prompt(chat, fake):
    fake.add({"content": "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu.", "chunk_delay": 0.3},
             {"content": "fine"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("recite")
    p.expect("Alpha beta")
    p.interrupt()
    p.expect("turn cancelled; the conversation is intact")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    assert not set(quiet_after(p)) & set(SPINNER)
    p.line("go on")
    p.expect("fine")
    messages = person_messages(fake.model_requests()[-1])
    kept = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(kept) == 1 and kept[0].startswith("Alpha beta") and kept[0].endswith(
        "[cut short: the user pressed Ctrl-C while this reply was arriving]")
    assert "lambda mu." not in kept[0]  # what had arrived, not the rest


def asked_to_run(chat, fake, command, then):
    """A chat in Write/Safe mode, its model proposing `command` (then answering `then`), at the question."""
    fake.add({"tool_calls": [tool_call("terminal", command=command)]}, {"content": then})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("do it")
    p.expect(r"/ \[e\]dit > ")
    return p


def test_ctrl_c_at_a_confirmation_leaves_no_spinner(chat, fake, cli):
    p = asked_to_run(chat, fake, "touch never.txt", "after")
    p.interrupt()
    p.expect("turn cancelled")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert not set(quiet_after(p)) & set(SPINNER)
    assert not (cli.workdir / "never.txt").exists()


def test_ctrl_c_during_a_command_leaves_a_clean_prompt(chat, fake, cli):
    """Asked, approved, running: Ctrl-C stops the command and the spinner that ran beside it."""
    p = asked_to_run(chat, fake, "echo $$ > pgid; sleep 30", "next fine")
    p.line("y")
    assert wait_for(lambda: (cli.workdir / "pgid").exists() and (cli.workdir / "pgid").read_text().strip())
    p.expect(r"[%s] terminal \d+s" % SPINNER)  # the spinner ticks while the command runs
    p.interrupt()
    p.expect("turn cancelled; the conversation is intact")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert not set(quiet_after(p)) & set(SPINNER)
    from test_terminal import group_gone
    assert group_gone(int((cli.workdir / "pgid").read_text()))
    p.line("and now?")
    p.expect("next fine")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"] == [
        "Error: cancelled by user"]


def test_a_closed_terminal_or_sigterm_ends_chat_as_exit_does(chat, fake, cli):
    """SIGHUP (the terminal window closed) mid-command, and SIGTERM at the prompt, killed chat by their default
    action: its conversation was left "running" until reaped, and its sandbox's private temp directory stayed in
    /tmp. Now the turn ends as with Ctrl-C, the command's group is killed, and chat leaves as /exit does."""
    import os
    import signal
    from test_terminal import group_gone
    p = asked_to_run(chat, fake, "echo $$ > pgid; sleep 30", "never")
    p.line("y")
    assert wait_for(lambda: (cli.workdir / "pgid").exists() and (cli.workdir / "pgid").read_text().strip())
    assert [d for d in os.listdir(cli.tmpdir) if d.startswith("xzatoma-run-")]  # the sandbox's, while it runs
    p.proc.send_signal(signal.SIGHUP)
    assert p.proc.wait(20) == 128 + signal.SIGHUP
    assert group_gone(int((cli.workdir / "pgid").read_text())) and os.listdir(cli.tmpdir) == []
    conv = json.loads(cli.run("history", "list", "--json").stdout)[0]
    # recorded, not reaped; as what ended it (round 18c: "completed", and the cut reply said "the user pressed Ctrl-C")
    assert conv["status"] == "interrupted" and conv["error"] == "terminated (SIGHUP)"
    assert "pressed Ctrl-C" not in cli.run("history", "show", conv["id"]).stdout

    p = chat()  # the reply the cut turn never asked for answers this one
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("hi")
    p.expect("never")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.wait_idle()  # in select(): a signal between the prompt and select() waits for a key (see wait_idle)
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait() == 128 + signal.SIGTERM
    p.expect("Resume this conversation with")  # left as /exit leaves
    assert os.listdir(cli.tmpdir) == []
    assert json.loads(cli.run("history", "list", "--json").stdout)[0]["status"] == "interrupted"


# ---- what a person sees and keeps: edited commands, history, long commands ----


def test_an_edited_command_is_what_the_model_and_the_store_see(chat, fake, cli):
    p = asked_to_run(chat, fake, "touch wanted.txt", "ran edited")
    p.line("e")
    p.expect("edit the command > touch wanted.txt")  # the line starts from the proposed command
    p.line("\x15touch edited.txt; cat nothere")  # Ctrl-U: a new line, which fails where the original would not
    p.expect(r"✗ ran as you edited it: touch edited.txt; cat nothere · exit 1 · [\d.]+s: cat: nothere")
    p.expect("ran edited")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.eof()
    assert p.wait() == 0
    assert (cli.workdir / "edited.txt").exists() and not (cli.workdir / "wanted.txt").exists()
    result = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"][0]
    assert result.startswith("The user edited the command before it ran; it ran as: touch edited.txt; cat nothere\n"
                             "exit code: 1"), result
    conv = json.loads(cli.run("history", "list", "--json").stdout)[0]
    assert "it ran as: touch edited.txt; cat nothere" in cli.run("history", "show", conv["id"]).stdout
    assert "it ran as: touch edited.txt; cat nothere" in cli.run("replay", conv["id"]).stdout
    kept = (cli.xz_home / "chat_history").read_text().split("\n")
    assert kept[1:] == ["do it", ""]  # neither the answer 'e' nor the edited command


def test_history_keeps_whole_messages_and_no_answers(chat, fake, cli):
    fake.add({"tool_calls": [tool_call("terminal", command="touch a.txt")]}, {"content": "one"},
             {"content": "two"}, {"content": "three"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("make a file")
    p.expect(r"/ \[e\]dit > ")
    p.line("y")
    p.expect("one")
    p.send("\x1b[200~first pasted line\nsecond pasted line\x1b[201~\r")
    p.expect("two")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.eof()
    assert p.wait() == 0
    kept = (cli.xz_home / "chat_history").read_text().split("\n")
    assert kept[1:] == ["make a file", "first pasted line\\nsecond pasted line", ""]  # no 'y'
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.send("\x1b[A")  # the pasted message comes back whole
    p.expect("second pasted line")
    p.send("\r")
    p.expect("three")
    assert person_messages(fake.model_requests()[-1])[-1]["content"] == "first pasted line\nsecond pasted line"


def write_chat_on(cli, fake, rows, cols):
    """chat in write mode on a terminal of rows x cols, at its first prompt."""
    cli.use(fake)
    p = PtyProcess(cli.command("chat", "--mode", "write"), dict(cli.env, TERM="xterm"), str(cli.workdir), rows=rows,
                   cols=cols)
    p.expect(PROMPT % ("WRITE", "SAFE"))
    return p


def test_a_long_command_on_a_short_terminal_is_folded_or_paged(cli, fake):
    spaced = "touch folded.txt #" + " " * 20000 + "ls -la"
    script = "\n".join("echo line %d >> paged.txt" % i for i in range(30))
    fake.add({"tool_calls": [tool_call("terminal", command=spaced)]}, {"content": "folded ran"},
             {"tool_calls": [tool_call("terminal", command=script)]}, {"content": "paged ran"})
    p = write_chat_on(cli, fake, rows=14, cols=60)
    try:
        p.line("fold it")
        p.expect("touch folded.txt #⟨20000 spaces⟩ls -la")  # all of it on one line, the blanks counted
        p.expect(r"\[e\]dit > ")
        p.line("y")
        p.expect("folded ran")
        p.line("page it")
        p.expect(r"-- rows 1-12 of 30; Enter shows more --")
        p.line("")
        p.expect(r"-- rows 13-24 of 30")
        p.line("")
        p.expect("echo line 29 >> paged.txt")
        p.expect(r"\[e\]dit > ")
        p.line("y")
        p.expect("paged ran")
    finally:
        p.close()
    assert (cli.workdir / "folded.txt").exists() and (cli.workdir / "paged.txt").read_text().count("line") == 30
    assert "declined" not in p.seen


def test_the_question_after_a_tall_command_is_one_bounded_line(cli, fake):
    """[a]lways and ne[v]er quoted the whole command: after a 42-line here-document paged onto a 12-row
    terminal, the question itself was 85 lines and scrolled the command away (round 18c)."""
    script = "cat > out.txt <<'EOF'\n" + "\n".join("line%02d text" % i for i in range(40)) + "\nEOF"
    fake.add({"tool_calls": [tool_call("terminal", command=script)]}, {"content": "first ran"},
             {"tool_calls": [tool_call("terminal", command=script)]}, {"content": "second ran"})
    p = write_chat_on(cli, fake, rows=12, cols=80)
    try:
        p.line("write it")
        for _ in range(6):
            question = p.expect(r"Enter shows more --|\[y\]es / \[n\]o /[^\r\n]*\[e\]dit > ").group(0)
            if question.startswith("[y]es"):
                break
            p.line("")
        assert question == "[y]es / [n]o / [a]lways this command ('cat > out.txt <<'EOF'...') this session / " \
                           "ne[v]er it / [e]dit > ", question
        p.line("a")
        p.expect("first ran")
        p.line("again")  # the same command is approved for the session: not asked again
        p.expect("second ran")
    finally:
        p.close()
    assert p.seen.count("line39 text") == 1 and p.seen.count("[y]es") == 1, p.seen[-2000:]
    assert (cli.workdir / "out.txt").read_text().count("text") == 40


def test_bare_xzatoma_opens_a_chat_and_text_starts_one(cli, fake):
    cli.use(fake)
    fake.add({"content": "four"})
    p = pty(cli)
    try:
        p.expect("XZatoma Interactive Chat Mode - Welcome!")
        p.expect(PROMPT % ("PLANNING", "SAFE"))
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    p = pty(cli, "what", "is", "2+2?")
    try:
        p.expect(PROMPT % ("PLANNING", "SAFE") + r"what is 2\+2\?")
        p.expect("four")
        p.expect(PROMPT % ("PLANNING", "SAFE"))  # and the chat goes on
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    assert person_messages(fake.model_requests()[0])[-1]["content"] == "what is 2+2?"


def test_chat_context_agrees_with_the_runs_own_count(cli, fake):
    import subprocess
    (cli.workdir / "notes.txt").write_text("alpha\n" * 300)
    cli.use(fake)
    script = [{"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "ok"}]
    fake.add(*script)
    r = cli.run("run", "read notes.txt")
    run = re.search(r"([\d,]+) tokens \(([\d,]+) in / ([\d,]+) out\) · context ~([\d,]+)", r.stderr).groups()
    fake.add(*script)
    c = subprocess.run(cli.command("chat", "--mode", "write"), input="read notes.txt\n/context\n", text=True,
                       capture_output=True, env=cli.env, cwd=str(cli.workdir), timeout=60)
    session = re.search(r"this session: ([\d,]+) tokens \(([\d,]+) in / ([\d,]+) out\) over 2 model calls", c.stderr)
    now = re.search(r"context now: ~([\d,]+) tokens", c.stderr)
    assert session and now, c.stderr
    assert session.groups() + now.groups() == run
    assert "context ~%s" % run[3] in c.stderr  # the footer says the same


# ---- approvals people expect, pasting, models, exit codes ----


def test_always_approves_the_program_and_subcommand_not_every_command(chat, fake, cli):
    subprocess.run(["git", "init", "-q", str(cli.workdir)], check=True)
    fake.add({"tool_calls": [tool_call("terminal", command="touch a.txt")]}, {"content": "one"},
             {"tool_calls": [tool_call("terminal", command="touch b.txt")]}, {"content": "two"},
             {"tool_calls": [tool_call("terminal", command="mkdir newdir")]}, {"content": "three"},
             {"tool_calls": [tool_call("terminal", command="git add a.txt")]}, {"content": "four"},
             {"tool_calls": [tool_call("terminal", command="git rm -q --cached a.txt")]}, {"content": "five"},
             {"tool_calls": [tool_call("terminal", command="touch c.txt")]}, {"content": "six"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("first")
    p.expect(r"\$ touch a\.txt")
    p.expect(r"\[a\]lways 'touch' this session / ne\[v\]er 'touch' / \[e\]dit > ")
    p.line("a")
    p.expect("one")
    p.line("second")  # touch again: approved without asking
    p.expect("two")
    assert (cli.workdir / "b.txt").exists() and p.seen.count("Run this command?") == 1
    p.line("third")  # another program asks
    p.expect(r"\$ mkdir newdir")
    p.expect(r"ne\[v\]er 'mkdir'")
    p.line("v")
    p.expect("three")
    assert not (cli.workdir / "newdir").exists()
    p.line("fourth")
    p.expect(r"\[a\]lways 'git add' this session")
    p.line("a")
    p.expect("four")
    p.line("fifth")  # git with another subcommand asks again
    p.expect(r"\[a\]lways 'git rm' this session")
    p.line("n")
    p.expect("five")
    p.line("/approvals")
    p.expect(r"always: git add, touch")
    p.expect(r"never: +mkdir")
    p.line("/approvals clear")
    p.expect("cleared")
    p.line("sixth")  # touch asks again after the clear
    p.expect(r"\$ touch c\.txt")
    p.line("y")
    p.expect("six")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.eof()
    assert p.wait() == 0, p.seen[-2000:]


def test_approval_keys():
    from xzatoma import approval_key
    assert approval_key("git add a.txt") == "git add"
    assert approval_key("git commit -m 'x y'") == "git commit"
    assert approval_key("touch x") == "touch" and approval_key("rm -rf build") == "rm"
    # everything not known to take only data is approved as the exact command, never as a family (rounds 19c,
    # 19e): a list of the dangerous ones was always short of one
    for command in ("git push origin main", "git -C sub add x", "git grep -O'touch x' TODO", "git init -q",
                    "npm run lint", "npm explore lodash -- ls", "make", "make test", "cmake -E env sh",
                    "pip3.11 list", "cargo build", "pytest -q", "env FOO=1 rm -rf x", "timeout 5 curl x",
                    "python3 -c 'print(1)'", "python3.11 -c 'print(1)'", "mawk 1", "sed -n p f", "./touch x",
                    "/usr/bin/git add x", "touch a && rm b", "ls $HOME", "sort --compress-program=sh f"):
        assert approval_key(command) == command, command


def test_multi_line_paste_and_backslash_continuation_are_one_message(chat, fake):
    fake.add({"content": "got the paste"}, {"content": "got the continuation"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.send("\x1b[200~first pasted line\nsecond pasted line\x1b[201~\r")  # a terminal's bracketed paste
    p.expect("got the paste")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("one \\")
    p.expect(r"\.\.\. ")
    p.line("two")
    p.expect("got the continuation")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.eof()
    assert p.wait() == 0
    users = [text for q in fake.model_requests() for text in said(q["body"]["messages"])]
    assert "first pasted line\nsecond pasted line" in users and "one \ntwo" in users
    assert len(fake.model_requests()) == 2


def test_model_switch_checks_the_name(chat, fake):
    fake.add({"content": "on qwen"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("/model qwen4")
    p.expect(r"error: ollama has no model 'qwen4'; did you mean 'qwen3'\? \(see /models\)")
    p.line("/model qwen3")
    p.expect("Switched to model qwen3")
    p.line("hello")
    p.expect("on qwen")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.eof()
    assert p.wait() == 0
    assert fake.model_requests()[-1]["body"]["model"] == "qwen3"


def test_piped_chat_exits_1_when_a_turn_failed(cli, fake):
    cli.use(fake)
    fake.add({"content": "fine"}, {"status": 400, "body": '{"error": "bad request"}'}, {"content": "fine again"})
    r = cli.run("chat", input="one\ntwo\nthree\n")
    assert r.returncode == 1, r.stderr
    assert r.stdout.count("fine") == 2 and "bad request" in r.stderr
    fake.add({"content": "ok"})
    assert cli.run("chat", input="only\n").returncode == 0


def test_the_exit_hint_works_as_printed(cli, fake, tmp_path):
    import shlex
    project = cli.tmp / "my project"
    project.mkdir()
    cli.use(fake)
    fake.add({"content": "first"}, {"content": "second"})
    r = cli.run("chat", "-C", project, input="remember the walrus\n")
    hint = [l for l in r.stderr.splitlines() if l.startswith("Resume this conversation with: ")][0]
    command = hint.split(": ", 1)[1]
    argv = shlex.split(command)
    # how it was started (the interpreter by its name when PATH finds that one, and the file): `xzatoma` is not
    # a command there (round 18c)
    assert [shutil.which(argv[0], path=cli.env["PATH"]), argv[1], argv[2]] == cli.command("chat"), command
    again = subprocess.run(["sh", "-c", command], input="and now?\n", capture_output=True, text=True, env=cli.env,
                           cwd=str(cli.home), timeout=60)  # from another directory, as printed
    assert again.returncode == 0, again.stderr
    users = said(fake.model_requests()[-1]["body"]["messages"])
    assert users == ["remember the walrus", "and now?"]


def test_a_failed_turn_s_error_does_not_stay_on_the_turns_after_it(cli, fake):
    """A refused turn's error stayed on the chat's result through later turns that went well, and was stored as
    the conversation's error at its end (round 16b)."""
    import argparse
    import xzatoma
    cli.use(fake)
    cfg = xzatoma.load_config({"provider.max_retries": 0}, env=cli.env)
    args = argparse.Namespace(mode=None, safety=None, working_dir=str(cli.workdir), resume=None, last=False,
                              metrics_port=None)
    session = xzatoma.ChatSession(args, cfg, xzatoma.Console(quiet=True))
    fake.add({"status": 400}, {"content": "hello"})
    session.turn("first")
    assert session.result.error and "400" in session.result.error
    session.turn("second")
    assert session.result.error is None


def test_with_stdout_in_a_file_the_prompt_and_questions_stay_on_the_terminal(cli, fake, tmp_path):
    """Round 18c: `chat > answers.txt` wrote the prompt and the [y]es/[n]o choices into the file; the person at the
    terminal saw neither."""
    import os
    import pty as ptymod
    import select
    import subprocess
    import time
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="touch marker")]}, {"content": "not run, fine"})
    master, slave = ptymod.openpty()
    answers = tmp_path / "answers.txt"
    seen = b""

    def read_until(needle, timeout=20, count=1):
        nonlocal seen
        end = time.monotonic() + timeout
        while seen.count(needle) < count and time.monotonic() < end:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
        return seen.count(needle) >= count
    with open(answers, "wb") as out:
        proc = subprocess.Popen(cli.command("chat", "--mode", "write"), env=dict(cli.env, TERM="xterm"),
                                cwd=str(cli.workdir), stdin=slave, stdout=out, stderr=slave, start_new_session=True)
        os.close(slave)
        try:
            assert read_until(b">> "), seen
            os.write(master, b"make the marker\r")
            assert read_until(b"[e]dit"), seen
            os.write(master, b"n\r")
            assert read_until(b">> ", count=2), seen  # the next prompt: the turn is over
            os.write(master, b"\x04")
            assert proc.wait(timeout=20) == 0
        finally:
            proc.kill()
            os.close(master)
    text = answers.read_text()
    assert ">> " not in text and "[e]dit" not in text, text


def test_always_for_an_interpreter_with_a_version_approves_only_that_command(chat, fake, cli):
    """Round 19c: [a]lways for `python3.11 -c 'print(1)'` approved every later python3.11 command."""
    python = "python%d.%d" % sys.version_info[:2]
    if not shutil.which(python):
        pytest.skip("no %s on PATH" % python)
    fake.add({"tool_calls": [tool_call("terminal", command="%s -c 'print(1)'" % python)]},
             {"tool_calls": [tool_call("terminal", command="%s -c 'open(\"marker\", \"w\")'" % python)]},
             {"content": "done"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("print one")
    p.expect(r"\[a\]lways '%s -c" % re.escape(python))
    p.line("a")
    p.expect(r"Run this command\?")  # the second command is asked about again
    p.line("n")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert not (cli.workdir / "marker").exists()


def _write_then_chat(cli, fake, command):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command=command)]}, {"content": "over"})


def test_piped_chat_asks_on_the_terminal_and_shows_the_command_there(cli, fake, tmp_path):
    """Round 19c: piped chat opened /dev/tty with mode "r+", which Python refuses for a terminal, so every question
    was declined without asking; asked, the command went to the redirected stderr and only the choices to the
    person."""
    import subprocess as sp
    _write_then_chat(cli, fake, "touch marker")
    with open(str(tmp_path / "chat.log"), "wb") as log:
        with PtyProcess(cli.command("chat", "--mode", "write"), dict(cli.env, TERM="xterm"), str(cli.workdir),
                        stdin=sp.PIPE, stderr=log) as p:
            p.proc.stdin.write(b"make the marker\n")
            p.proc.stdin.close()
            p.expect(r"\$ touch marker")  # on the terminal, before the question
            p.expect(r"\[e\]dit > ")
            p.line("y")
            assert p.wait() == 0
    assert (cli.workdir / "marker").exists()
    assert "no terminal to ask" not in (tmp_path / "chat.log").read_text()


def test_with_stderr_in_a_file_the_command_is_shown_where_the_question_is(cli, fake, tmp_path):
    _write_then_chat(cli, fake, "touch marker")
    with open(str(tmp_path / "chat.log"), "wb") as log:
        with PtyProcess(cli.command("chat", "--mode", "write"), dict(cli.env, TERM="xterm"), str(cli.workdir),
                        stderr=log) as p:
            p.expect(r">> ")
            p.line("make the marker")
            seen = p.expect(r"\[e\]dit > ")
            assert "$ touch marker" in p.seen[:p.seen.index("[e]dit")]
            p.line("n")
            p.expect(r">> ")
            p.eof()
            p.wait()
    assert seen and not (cli.workdir / "marker").exists()


def test_piped_lines_cannot_switch_on_write_or_yolo(cli, fake):
    """Round 19c: a file piped into chat held `/write` and `/yolo`, and its author had the session's switches."""
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="touch marker")]}, {"content": "over"})
    r = cli.run("chat", input="/write\n/mode write\n/yolo\nmake the marker\n")
    assert r.stderr.count("is taken only from the keyboard") == 3, r.stderr
    assert not (cli.workdir / "marker").exists()
    names = {t["function"]["name"] for t in fake.model_requests()[0]["body"]["tools"]}
    assert "terminal" not in names and "write_file" not in names  # still planning
    r = cli.run("chat", "--mode", "write", input="/planning\n/safe\nhello\n")  # lowering is fine
    assert "keyboard" not in r.stderr


def test_a_protected_path_question_is_folded_and_paged_and_only_yes_or_no(cli, fake):
    """Round 19b: a hook's 3,000-line diff was written at once, with 5,000 blanks drawn before `; curl … | sh`;
    the question offered [a]lways, which it never remembered."""
    subprocess.run(["git", "init", "-q", str(cli.workdir)], check=True)
    content = "#!/bin/sh\n" + "".join("# line %d\n" % i for i in range(200)) + "echo ok" + " " * 5000 + "; evil\n"
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("write_file", path=".git/hooks/pre-commit", content=content)]},
             {"content": "over"})
    with PtyProcess(cli.command("chat", "--mode", "write", "--safety", "yolo"), dict(cli.env, TERM="xterm"),
                    str(cli.workdir), rows=30, cols=100) as p:
        p.expect(r">> ")
        p.line("install the hook")
        pages = 0
        while True:
            m = p.expect(r"Enter shows more|\[y\]es / \[n\]o > ")
            if m.group().startswith("[y]"):
                break
            pages += 1
            p.line("")
        p.line("n")
        p.expect(r">> ")
    assert "\u27e85000 spaces\u27e9; evil" in p.seen and " " * 100 not in p.seen
    assert "[a]lways" not in p.seen and pages >= 7  # 205 rows, 28 a screen
    assert not (cli.workdir / ".git" / "hooks" / "pre-commit").exists()


def test_the_exit_hint_names_a_directory_with_control_characters_as_the_shell_reads_it(cli, fake):
    """Round 19b: a directory named with ESC or a bidi control was shown made visible inside '…', which the shell
    read as other characters; bash's $'…' says it exactly, and nothing raw reaches the terminal."""
    project = cli.tmp / "w $(touch M) 'q\"\x1b[5m\u202e"
    project.mkdir()
    cli.use(fake)
    fake.add({"content": "first"})
    r = cli.run("chat", "-C", project, input="hello\n")
    hint = [l for l in r.stderr.splitlines() if l.startswith("Resume this conversation with: ")][0]
    assert "\x1b" not in hint and "\u202e" not in hint
    word = hint.split(" -C ", 1)[1]
    said_back = subprocess.run(["bash", "-c", "printf %s " + word], capture_output=True, timeout=30).stdout
    assert said_back.decode() == str(project)


def test_undo_works_within_a_chat_whose_history_cannot_be_stored(chat, fake, cli, tmp_path):
    """round 19d: with a database that cannot be opened (or no sqlite3), the file tools changed files with no undo
    record and only "no conversation history" was said. The warning says changes can be undone only in the chat,
    and /undo works there: the records are kept in memory."""
    (cli.workdir / "notes.txt").write_text("precious original\n")
    (tmp_path / "a-directory").mkdir()  # no database can be there
    cli.use(fake, persistence={"db_path": str(tmp_path / "a-directory")})
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]},
             {"tool_calls": [tool_call("write_file", path="notes.txt", content="overwritten\n")]}, {"content": "done"})
    p = chat("--mode", "write", "--safety", "yolo")
    p.expect(r"continuing without conversation history: file changes can be undone with /undo until this chat "
             r"ends, not by 'xzatoma undo' later")
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.line("rewrite the notes")
    p.expect(r"\ndone")
    assert (cli.workdir / "notes.txt").read_text() == "overwritten\n", p.seen
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.line("/undo")
    p.expect(r"restored \S*notes\.txt")
    assert (cli.workdir / "notes.txt").read_text() == "precious original\n", p.seen
    p.expect(PROMPT % ("WRITE", "YOLO"))
    p.eof()
    assert p.wait() == 0
