"""What a person sees and approves: a confirmation shows exactly what will run, nothing hidden or elided.

Attacker's view with harmless payloads (touch markers): a model proposes a command or a change whose
shown form differs from what would run or be written, and waits for the person's `y`.
"""

import re

from conftest import tool_call

PROMPT = r"\[WRITE\]\[%s\] >> "


def start(chat, safety="safe"):
    p = chat("--mode", "write", "--safety", safety)
    p.expect(PROMPT % safety.upper())
    return p


def test_a_command_redaction_would_hide_part_of_is_not_asked_about(chat, fake, cli):
    # what people see is redacted, and a URL password's shape covers anything up to the '@': the question
    # showed `curl -s http://u:[REDACTED]@127.0.0.1:9/` and a `y` ran the hidden command substitution
    command = "curl -s http://u:$(touch${IFS}pwned)@127.0.0.1:9/ || true"
    fake.add({"tool_calls": [tool_call("terminal", command=command)]}, {"content": "finished"})
    p = start(chat)
    p.line("fetch it")
    p.expect("declined without asking: part of this command looks like a credential")
    p.expect("finished")
    assert "Run this command?" not in p.seen and not (cli.workdir / "pwned").exists()
    result = [m for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]["content"]
    assert result.startswith("Error: the user declined the command")


def test_a_change_redaction_would_hide_is_not_asked_about(chat, fake, cli):
    # a hook's new lines inside what looks like a PEM block were shown as one [REDACTED] line; a secret in
    # the unchanged lines around an edit hides nothing that changes, so that edit is still asked
    (cli.workdir / ".git" / "hooks").mkdir(parents=True)
    (cli.workdir / "conf.py").write_text("A = 1\npassword = 'Xy7hunter2hunter2'\nB = 2\n")
    content = "#!/bin/sh\n# -----BEGIN PRIVATE KEY-----\ntouch pwned\n# -----END PRIVATE KEY-----\n"
    fake.add({"tool_calls": [tool_call("edit_file", path="conf.py", old_text="B = 2", new_text="B = 3")]},
             {"content": "edited"},
             {"tool_calls": [tool_call("write_file", path=".git/hooks/pre-commit", content=content)]},
             {"content": "finished"})
    p = start(chat)
    p.line("bump B")
    p.expect(r"Allow edit_file\?")
    p.expect(r"\+B = 3")
    p.expect(r"ne\[v\]er this session > ")
    p.line("y")
    p.expect("edited")
    assert (cli.workdir / "conf.py").read_text().endswith("B = 3\n")
    assert "hunter2hunter2" not in p.seen
    p.line("add a hook")
    p.expect("declined without asking: part of this change looks like a credential")
    p.expect("finished")
    assert "Allow write_file" not in p.seen and not (cli.workdir / ".git" / "hooks" / "pre-commit").exists()


def test_a_last_line_without_newline_does_not_swallow_the_added_line(chat, fake, cli):
    # difflib's '-echo hi' had no newline, so '+touch pwned' was shown on its line: a removal, no addition
    (cli.workdir / "run.sh").write_text("echo hi")
    fake.add({"tool_calls": [tool_call("read_file", path="run.sh"),  # a file is replaced once it was read
                             tool_call("write_file", path="run.sh", content="touch pwned\n")]},
             {"content": "finished"})
    p = start(chat)
    p.line("rewrite")
    p.expect(r"Allow write_file\?")
    p.expect(r"\n-echo hi\r?\n")
    p.expect(r"\n\+touch pwned\r?\n")
    p.expect(r"ne\[v\]er this session > ")
    p.line("n")
    p.expect("finished")
    assert (cli.workdir / "run.sh").read_text() == "echo hi"


def test_a_huge_change_to_a_protected_path_is_shown_whole(chat, fake, cli):
    # a rewrite too large for difflib was shown as a one-line summary: the person approved a hook unseen
    hooks = cli.workdir / ".git" / "hooks"
    hooks.mkdir(parents=True)
    n = 3400
    (hooks / "pre-commit").write_text("".join("# %d\n" % (i // 2) for i in range(n)))
    new = ["# %d\n" % (i // 3) for i in range(n)]
    new[n // 2] = "touch pwned-%d\n" % n
    fake.add({"tool_calls": [tool_call("write_file", path=".git/hooks/pre-commit", content="".join(new))]},
             {"content": "finished"})
    p = start(chat, "yolo")
    p.line("rewrite the hook")
    p.expect(r"Allow write_file\?")
    while not p.expect(r"Enter shows more|\[y\]es / \[n\]o > ", timeout=30).group().startswith("[y]"):
        p.line("")  # a screenful at a time, the question after the last line (round 19b)
    p.line("n")
    p.expect("finished")
    assert re.search(r"\n\+touch pwned-%d\r?\n" % n, p.seen) and "too many to compare" not in p.seen


def test_edit_starts_empty_when_the_command_has_characters_shown_escaped(chat, fake, cli):
    # [e]dit prefilled readline with the raw command: a line separator (that the policy lets through) went
    # to the terminal raw, and the person edited a line that did not show what it held
    command = "touch safe\u2028ok"
    fake.add({"tool_calls": [tool_call("terminal", command=command)]}, {"content": "finished"})
    p = start(chat)
    p.line("say it")
    p.expect(r"Run this command\?")
    p.expect(r"\$ touch safe\\u2028ok")
    p.expect(r"/ \[e\]dit > ")
    p.line("e")
    p.expect("edit the command > ")
    p.line("touch edited")
    p.expect("finished")
    assert "\u2028" not in p.seen
    assert (cli.workdir / "edited").exists() and not (cli.workdir / "safe\u2028ok").exists()


def test_a_command_taller_than_the_screen_is_shown_whole_before_the_question(chat, fake, cli):
    # the command's start scrolled out of sight: the person saw blank rows, `ls -la` and the question. The
    # blanks are counted now, so all of it stands on one line right above the question (issue 24: it was
    # declined without asking, and the model told the person had declined)
    command = "touch pwned #" + " " * 20000 + "ls -la"
    fake.add({"tool_calls": [tool_call("terminal", command=command)]}, {"content": "finished"})
    p = start(chat)
    p.line("list")
    shown = p.expect(r"\$ (touch pwned #⟨20000 spaces⟩ls -la)\r\n.*\[e\]dit > ")
    assert "declined" not in p.seen and len(shown.group(1)) < 40
    p.line("n")
    p.expect("finished")
    assert not (cli.workdir / "pwned").exists()


def test_progress_lines_show_form_feeds_and_line_separators_not_blanks(cli, fake):
    # one_line() collapsed what str.split() calls whitespace: `a\x0cb.txt` was shown as `a b.txt`, another name
    (cli.workdir / "a\x0cb.txt").write_text("x\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="a\x0cb.txt")]},
             {"tool_calls": [tool_call("find_path", pattern="q\u2028r")]}, {"content": "done"})
    r = cli.run("run", "--prompt", "read it")
    assert r.returncode == 0, r.stderr
    assert "a\\x0cb.txt" in r.stderr and "q\\u2028r" in r.stderr, r.stderr
    assert "a b.txt" not in r.stderr and "q r" not in r.stderr
