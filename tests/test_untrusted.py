"""Hostile bytes: what a model, a file, a command or a server says never reaches a terminal raw.

Attacker's view with harmless payloads: escape sequences that clear the screen, move the cursor, set the
title or reverse the text, in tool-call arguments, file contents, command output and answers.
"""

import json
import os
import random
import re

import pytest

from conftest import assert_clean, run_calls, tool_call
from ptyrun import PtyProcess
from xzatoma_tools import UntrustedStream, render_json, render_untrusted

ESC = "\x1b"
RLO = "\u202e"


@pytest.mark.parametrize("raw,shown", [
    ("plain text, tabs\tand\nnewlines", "plain text, tabs\tand\nnewlines"),
    ("café 日本語 😀 ✓ ▶", "café 日本語 😀 ✓ ▶"),  # visible non-ASCII text stays
    ("\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07"),  # CSI, OSC, BEL
    ("\x9b2J", "\\x9b2J"),  # C1 CSI
    ("rm -r src #\x1b[2K\r  $ ls -la", "rm -r src #\\x1b[2K\\r  $ ls -la"),  # the spoof from issue 12
    ("crlf\r\nline", "crlf\nline"),  # CRLF is a line end, not an overwrite
    ("back\x08\x7fspace\x00", "back\\x08\\x7fspace\\x00"),
    ("abc\u202edcb\u202c", "abc\\u202edcb\\u202c"),  # bidi override
    ("\u2066x\u2069 \u200e\u200f\u061c", "\\u2066x\\u2069 \\u200e\\u200f\\u061c"),  # isolates and marks
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
    ("tag\U000e0041\U000e007f", "tag\\U000e0041\\U000e007f"),  # invisible tag characters (hidden prompts)
    ("nel\x85ls\u2028ps\u2029", "nel\\x85ls\\u2028ps\\u2029"),
    ("\ud800lone", "\\ud800lone"),  # a lone surrogate cannot even be encoded
])
def test_render_untrusted_shows_every_hidden_character(raw, shown):
    assert render_untrusted(raw) == shown
    assert_clean(render_untrusted(raw), "render_untrusted")


def test_exact_mode_shows_what_could_pass_for_something_else():
    # a command to approve: a no-break space, a joiner or a combining mark must not look like ASCII
    assert render_untrusted("rm\u00a0-rf x\u200dy e\u0301", exact=True) == "rm\\xa0-rf x\\u200dy e\\u0301"
    assert render_untrusted("family \U0001f468\u200d\U0001f469") == "family \U0001f468\u200d\U0001f469"


def test_unknown_format_characters_fail_closed():
    # unassigned and private-use code points: shown in exact mode, unassigned also in text
    assert render_untrusted("\U000e0080") == "\\U000e0080"
    assert render_untrusted("\ue000", exact=True) == "\\ue000"


def test_stream_renders_the_same_whatever_the_split():
    text = ("answer \x1b[2J with a\r\nCRLF, a lone\rCR, \u202ereversed\u202c and a key sk-proj-"
            "abcdefghijklmnop1234567 and Authorization: token abcdefgh1 end")
    whole = UntrustedStream()
    expected = whole.feed(text) + whole.finish()
    assert "sk-proj" not in expected and "abcdefgh1" not in expected
    assert_clean(expected, "stream")
    rng = random.Random(7)
    for _ in range(200):
        stream, out, i = UntrustedStream(), "", 0
        while i < len(text):
            n = rng.randint(1, 6)
            out += stream.feed(text[i:i + n])
            i += n
        assert out + stream.finish() == expected


def test_json_stays_valid_and_equal_but_inert():
    data = {"answer": "\x1b[2J \u202e \x9b done", "k\u2066": [1, None]}
    text = render_json(data)
    assert_clean(text, "json")
    assert json.loads(text) == data


# -- end to end: run --


def hostile_run(cli, fake, *flags):
    (cli.workdir / "evil.txt").write_text("line one\x1b[2J\x1b]0;pwned\x07\n\u202eevil\rsecond\n")
    cli.use(fake, terminal={"default_mode": "restricted_autonomous"})
    fake.add({"tool_calls": [tool_call("read_file", path="evil\x1b[31m\u202e.txt")]},
             {"tool_calls": [tool_call("read_file", path="evil.txt")]},
             {"tool_calls": [tool_call("terminal", command="cat evil.txt # \x1b[2K\r$ ls")]},
             {"content": "done\x1b[2J\x1b]0;title\x07 \u202ereversed\rover", "thinking": "think \x1b[5m"})
    return cli.run("--verbose", "run", *flags, "--prompt", "look at evil.txt")


def test_hostile_bytes_never_reach_stderr_or_the_audit_log(cli, fake):
    r = hostile_run(cli, fake)
    assert r.returncode == 0, r.stderr
    assert_clean(r.stderr, "stderr")
    assert "evil\\x1b[31m\\u202e.txt" in r.stderr  # shown, not obeyed
    audit = (cli.xz_home / "audit.log").read_bytes().decode("utf-8")
    assert "cat evil.txt # \\x1b[2K\\r$ ls" in audit
    assert_clean(audit, "audit.log")
    # stdout is data when piped: the answer as it was (byte for byte: see the `| cat` test)
    assert r.stdout.startswith("done\x1b[2J\x1b]0;title\x07 \u202ereversed")


def test_run_piped_through_cat_keeps_the_answer_byte_exact(cli, fake):
    import subprocess
    cli.use(fake)
    answer = "tab\there \x1b[1mbold\x1b[0m \u202eRTL\r\nCRLF \x00nul"
    fake.add({"content": answer})
    cmd = " ".join(map(repr, cli.command("run", "--prompt", "x"))) + " | cat"
    r = subprocess.run(cmd, shell=True, capture_output=True, env=cli.env, cwd=str(cli.workdir))
    assert r.returncode == 0
    assert r.stdout == (answer + "\n").encode()


def test_run_on_a_terminal_neutralises_the_answer(cli, fake):
    cli.use(fake)
    # a slow model brings the spinner, as a loaded machine did: our own chrome is drawn beside the answer
    fake.add({"content": "hello \x1b]0;title\x07\x1b[2J \u202edlrow", "delay": 0.4})
    p = PtyProcess(cli.command("run", "--prompt", "x"), cli.env, str(cli.workdir))
    try:
        assert p.wait() == 0
    finally:
        p.close()
    assert "hello \\x1b]0;title\\x07\\x1b[2J \\u202edlrow" in p.seen
    assert "waiting for the model" in p.seen
    # INFO: the spinner is '\r<status>ESC[K', drawn and wiped in place. Its text goes through the same
    # cleaning, so no ESC or CR can be inside it; whatever else is left must be inert.
    assert_clean(re.sub(r"\r[^\r\n\x1b]*\x1b\[K", "", p.seen), "the terminal")


def test_json_output_is_inert_and_parses_to_the_answer(cli, fake):
    cli.use(fake)
    fake.add({"content": "a\x1b[2J\u202eb\x9bc"})
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 0
    assert_clean(r.stdout, "--json")
    assert json.loads(r.stdout)["answer"] == "a\x1b[2J\u202eb\x9bc"


def test_provider_error_text_is_shown_not_obeyed(cli, fake):
    cli.use(fake)
    fake.add({"status": 400, "body": json.dumps({"error": "bad \x1b[2J\x1b]0;x\x07 request \u202e"})})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 1
    assert "bad \\x1b[2J" in r.stderr
    assert_clean(r.stderr, "stderr")


def test_replay_history_show_and_search_are_inert(cli, fake):
    r = hostile_run(cli, fake)
    assert r.returncode == 0
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    for args in (("replay", cid), ("history", "show", cid), ("history", "show", "--full", cid),
                 ("history", "search", "evil"), ("history", "list"), ("history", "show", "--json", cid),
                 ("replay", "--tree", cid)):
        out = cli.run(*args)
        assert out.returncode == 0, (args, out.stderr)
        assert_clean(out.stdout, " ".join(args))
        assert_clean(out.stderr, " ".join(args))
    assert "\\x1b[2J" in cli.run("history", "show", "--full", cid).stdout


# -- end to end: chat under a pseudo-terminal --


PROMPT = r"\[WRITE\]\[SAFE\] >> "


def test_a_spoofed_confirmation_shows_the_real_command(chat, fake, cli):
    (cli.workdir / "src").mkdir()
    (cli.workdir / "src" / "keep.py").write_text("x = 1\n")
    spoof = "rm -r src #\x1b[2K\r  $ ls -la"
    fake.add({"tool_calls": [tool_call("terminal", command=spoof)]}, {"content": "declined"})
    p = chat("--mode", "write")
    p.expect(PROMPT)
    p.line("tidy up")
    p.expect("declined")  # a command carrying escape sequences is denied outright: nobody is asked (issue 17)
    assert "Run this command?" not in p.seen
    assert (cli.workdir / "src" / "keep.py").exists()
    assert "\x1b[2K" not in p.seen and "\u202e" not in p.seen
    result = [m for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]["content"]
    assert result.startswith("Error: command denied (the command contains a control or invisible character")


def test_the_diff_for_approval_shows_the_hidden_line(chat, fake, cli):
    (cli.workdir / "notes.txt").write_text("alpha\n")
    content = "alpha\nEVIL LINE\x1b[1A\x1b[2K\r\n\u202eenil\n"
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt"),  # a file is replaced once it was read
                             tool_call("write_file", path="notes.txt", content=content)]},
             {"content": "answer with \x1b]0;title\x07 and \x1b[2J inside"})
    p = chat("--mode", "write")
    p.expect(PROMPT)
    p.line("edit notes")
    p.expect(r"Allow write_file\?")
    p.expect(r"\+EVIL LINE\\x1b\[1A\\x1b\[2K")
    p.expect(r"\+\\u202eenil")
    p.expect(r"ne\[v\]er this session > ")
    p.line("n")
    p.expect(r"answer with \\x1b\]0;title\\x07 and \\x1b\[2J inside")
    p.expect(PROMPT)
    assert (cli.workdir / "notes.txt").read_text() == "alpha\n"
    for raw in ("\x1b[1A", "\x1b[2K", "\x1b]0;", "\x1b[2J", "\u202e", "\x07"):
        assert raw not in p.seen


def test_a_newline_in_a_path_cannot_forge_a_line_of_progress_or_a_question(cli, fake):
    """Newlines pass render_untrusted (text has lines), so a path holding one printed a second, forged line:
    '  ✓ Deleted nothing' under the real call, or a question's 'changes .git' pushed out of sight."""
    (cli.workdir / ".git" / "hooks").mkdir(parents=True)
    cli.use(fake)
    forged = "x\n  \u2713 nothing was written\n\u25b6 read_file README.md"
    r, results = run_calls(cli, fake, [tool_call("write_file", path=forged, content="x"),
                                       tool_call("write_file", path=".git/hooks/a\nall is fine", content="x")])
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert not any(l.startswith("  \u2713 nothing") or l.startswith("\u25b6 read_file") for l in lines), r.stderr
    assert not any(l.startswith("all is fine") for l in lines), r.stderr
    assert "nothing was written\\n\u25b6 read_file README.md" in r.stderr and "a\\nall is fine" in r.stderr


# ---- hostile bytes through argv, paths on a terminal and readline's completion list ----


ESC_TITLE = "\x1b]0;pwned\x07\x1b[2J\u202e"


def pty_run(cli, *args, env=None):
    p = PtyProcess(cli.command(*args), dict(cli.env, TERM="xterm", **(env or {})), str(cli.workdir))
    try:
        code = p.wait()
    finally:
        p.close()
    return code, p.seen


def test_an_unrecognized_argument_is_shown_not_obeyed(cli):
    # argparse quoted it raw: a file name a script passes on (`xzatoma run $f`) could clear the screen
    r = cli.run("run", "--bogus" + ESC_TITLE, "--prompt", "x")
    assert r.returncode == 2
    assert "unrecognized argument: --bogus\\x1b]0;pwned\\x07" in r.stderr
    assert_clean(r.stderr, "stderr")


def test_config_path_is_data_when_piped_and_inert_on_a_terminal(cli):
    path = str(cli.tmp / ("conf" + ESC_TITLE + ".yaml"))
    r = cli.run("config", "path", env={"XZATOMA_CONFIG": path})
    assert r.returncode == 0 and r.stdout == path + "\n"  # a script reading it gets the name as it is
    code, seen = pty_run(cli, "config", "path", env={"XZATOMA_CONFIG": path})
    assert code == 0
    assert "conf\\x1b]0;pwned\\x07\\x1b[2J\\u202e.yaml" in seen
    assert_clean(seen, "the terminal")


def test_config_init_on_a_terminal_shows_the_path_inert(cli):
    path = str(cli.tmp / ("new" + ESC_TITLE + ".yaml"))
    code, seen = pty_run(cli, "config", "init", env={"XZATOMA_CONFIG": path})
    assert code == 0 and os.path.exists(path)
    assert_clean(seen, "the terminal")


def test_chat_completion_never_offers_a_name_with_hidden_characters(chat, fake, cli):
    # readline listed the matches raw: a bidi override in a file name reordered the list on screen, and a
    # zero-width character was typed into the line unseen
    (cli.workdir / "abc-plain.txt").write_text("x")
    (cli.workdir / "ab\u202etxt.exe").write_text("x")
    (cli.workdir / "ab\u200bc-plain.txt").write_text("x")
    p = chat()
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.send("@ab\t\t")
    p.expect("abc-plain.txt")
    p.send("\x15")  # clear the line
    p.line("/status")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    assert "\u202e" not in p.seen and "\u200b" not in p.seen
