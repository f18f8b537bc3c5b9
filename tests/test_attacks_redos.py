"""Untrusted text against regular expressions and super-linear algorithms: globs and .gitignore lines,
token shapes in the redactor, shell commands judged by the policy, previews of huge edits.

Each attack would stall a run far past --timeout (or burn minutes of CPU) on a backtracking or
exponential path; the fix makes the work linear or caps it failing closed. End-to-end cases run the CLI
with --timeout and a generous ceiling on the process; in-process cases assert the bounded result (a
refusal, a summary) rather than a time.
"""

import os

import pytest

import xzatoma_tools
from conftest import run_calls, tool_call
from test_secrets import db_bytes
from xzatoma_tools import GitIgnore, ToolError, glob_match, glob_regex

#: a glob with many stars against a long name of a's: a backtracking regex tries every split
STARS = "*a" * 12 + "*b"
LONG_NAME = "a" * 200
TARGET = "a" * 12 + "b"  # the one name the glob matches


def long_named_tree(work, n=20):
    (work / "d").mkdir()
    for i in range(n):
        (work / "d" / (LONG_NAME + str(i))).write_text("x\n")
    (work / "d" / TARGET).write_text("needle\n")


# ---- globs: find_path, grep include/exclude, list_directory, .gitignore ----

def test_find_path_with_a_catastrophic_glob_finishes(cli, fake):
    long_named_tree(cli.workdir)
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("find_path", glob=STARS),
                                       tool_call("find_path", glob="**/a/**/a/**/a/**/a/**/b")],
                           "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert results[0] == "showing 1-1 of 1\nd/" + TARGET
    assert results[1] == "no paths match **/a/**/a/**/a/**/a/**/b"


def test_grep_include_and_exclude_globs_finish(cli, fake):
    long_named_tree(cli.workdir)
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("grep", pattern="needle|x", include=STARS),
                                       tool_call("grep", pattern="needle", exclude=STARS)],
                           "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert results[0] == "d/%s:1: needle" % TARGET
    assert results[1] == "no matches for needle in the files' contents (list_directory lists names)"


def test_a_hostile_gitignore_line_does_not_stall_the_walk(cli, fake):
    """The repository writes the glob: every name in the tree is matched against it."""
    long_named_tree(cli.workdir)
    (cli.workdir / ".gitignore").write_text("%s\n" % STARS)
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("find_path", glob="d/*")], "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert results[0].startswith("showing 1-20 of 20\nd/" + LONG_NAME)
    assert TARGET not in results[0]  # the line ignores it


def test_brace_alternatives_are_capped_not_generated():
    """{a,b} thirty times is 2**30 patterns: refused at once, in every caller."""
    with pytest.raises(ToolError, match="alternatives"):
        glob_regex("{a,b}" * 30)
    with pytest.raises(ToolError, match="characters long"):
        glob_regex("a" * 5000)
    assert glob_match("src/**/*.{rs,toml}", "src/a/b/c.toml")


@pytest.mark.parametrize("pattern,path,match", [
    (STARS, LONG_NAME + "b", True), (STARS, LONG_NAME, False), ("*a*a*b", "xaab", True),
    ("**/a/**/b", "x/a/y/z/b", True), ("**/a/**/b", "x/a/y/z/c", False), ("*a*/**/*b*", "xa/q/r/sbt", True),
    ("x/a**b", "x/a/y/b", True), ("[!a]*x*y", "bqxqy", True), ("*[ab]*[ab]*c", "zzabzc", True),
])
def test_globs_matched_without_backtracking_keep_their_meaning(pattern, path, match):
    assert glob_match(pattern, path) is match


def test_gitignore_rules_are_bounded(tmp_path):
    """A .gitignore of 100,000 lines (and one of 100,000 copies of a line) is matched against every path of
    the walk: only its first MAX_RULES count, and runs of rules of one kind are one regex."""
    lines = ["x%d" % i for i in range(100000)] + ["!x1", "y*"]
    (tmp_path / ".gitignore").write_text("\n".join(lines) + "\n")
    fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        ignore = GitIgnore(fd)
    finally:
        os.close(fd)
    groups = ignore.rules[""]
    assert len(groups) == 1  # the first MAX_RULES lines, one merged regex
    assert ignore.ignored("x5", False) and ignore.ignored("sub/x999", False)
    assert not ignore.ignored("x5000", False)  # past the cap: not a rule


# ---- the redactor: it runs over every message, tool result and output ----

def test_token_shaped_runs_in_a_file_do_not_stall_the_redactor(cli, fake):
    """A megabyte of '-eyJ' is one run with a JWT start after every '-': each start re-ran the whole run
    (minutes per redaction, and a tool result is redacted several times). PEM headers each scanned 16 KB."""
    (cli.workdir / "jwt.txt").write_text("-eyJ" * 200000 + "\n")
    (cli.workdir / "pem.txt").write_text("-----BEGIN PRIVATE KEY-----!" * 20000 + "\n")
    token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlc2lnbmF0dXJl"
    (cli.workdir / "real.txt").write_text("auth-%s done\n" % token)
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("read_file", path="jwt.txt"), tool_call("read_file", path="pem.txt"),
                                       tool_call("read_file", path="real.txt")], "--timeout", "20")
    assert r.returncode == 0, r.stderr
    # each whole file was redacted (in time), then cut to a quarter of the model's window (131,072 tokens)
    assert results[0].startswith("-eyJ" * 30000) and results[1].startswith("-----BEGIN PRIVATE KEY-----!")
    stored = db_bytes(cli)  # the store keeps the results redacted
    assert b"-eyJ-eyJ-eyJ" in stored and b"auth-[REDACTED] done" in stored
    assert token.encode() not in stored  # the shape still holds


# ---- the terminal policy: it judges whatever command a model writes, in-process, before any deadline ----

DENY, CONFIRM, ALLOW = "deny", "confirm", "allow"


def judge_table(cli, items, *extra):
    """`xzatoma policy command` on each command; the ceiling on the process is cli.run's timeout."""
    r = cli.run("policy", "command", "-", "--null", *extra, input="\0".join(items))
    lines = r.stdout.splitlines()
    assert len(lines) == len(items), r.stdout + r.stderr
    return [tuple(line.split(": ", 1)) for line in lines]


def test_commands_built_to_backtrack_are_judged_promptly(cli):
    """Each stalled the policy for minutes or more: sed addresses and backslashes (exponential), `{`
    repeated (quadratic), a brace range of 10**11 words (built whole), long /proc and rm shapes, a run of
    dots removed after an unknown cd (exponential)."""
    verdicts = judge_table(cli, [
        "sed '%sx' f" % ("1" * 40),
        "sed 's/%s' f" % ("\\\\" * 40),
        "echo " + "{" * 30000,
        "echo {1..99999999999}",
        "cat /proc/" + "/" * 30000,
        "rm " + "-r " * 10000 + "x",
        'cd "$X"; rm -r ' + "." * 60 + "x",
    ])
    assert verdicts[0][0] == CONFIRM and verdicts[1][0] == CONFIRM and verdicts[6][0] == CONFIRM
    assert verdicts[2] == (ALLOW, "echo only prints its arguments")
    assert verdicts[3][0] == CONFIRM and verdicts[3][1].startswith("brace expansion makes too many words to check")
    assert verdicts[4][0] in (CONFIRM, DENY) and verdicts[5][0] == "ask"  # past the 256 words judged (19g)


def test_a_command_too_long_or_too_braced_to_check_is_denied():
    """Caps fail closed: past them the command is refused, not allowed."""
    policy = xzatoma_tools.CommandPolicy("/tmp")
    v = policy.judge("echo " + "a " * 20000)
    assert v.level == DENY and "over the 32768" in v.reason
    for command in ("echo " + "x" * 30000 + "{a,b}" * 40, "echo " + "{a," * 64 + "b" + "}" * 64 + "x" * 30000,
                    "echo " + "{a,b}" * 65):
        v = policy.judge(command)
        assert v.level == DENY and "could not be checked" in v.reason, v


def test_globs_through_symlink_loops_are_bounded(cli):
    """Ten links to '.' make `*/*/*/*/*/*/*/*/*/x` 10**9 paths for glob.glob: the policy stops reading and
    fails closed (a read asks, a removal is denied)."""
    for i in range(10):
        os.symlink(".", str(cli.workdir / ("l%d" % i)))
    pattern = "*/" * 9 + "x"
    verdicts = judge_table(cli, ["ls " + pattern, "rm " + pattern, "ls -la l1/l2"])
    assert verdicts[0][0] == CONFIRM
    assert verdicts[0][1].startswith("ls reads %s, a pattern matching too many files to check" % pattern)
    assert verdicts[1][0] == DENY and "too many paths to check" in verdicts[1][1]
    assert verdicts[2][0] == ALLOW


# ---- model output repair: <think> blocks and tool calls printed as text ----

@pytest.mark.parametrize("content", ["<think>" * 100000 + "answer", "<tool_call>" * 70000 + "answer"],
                         ids=["think", "tool_call"])  # short ids: the test id travels in the environment
def test_a_reply_of_unclosed_tags_is_repaired_promptly(cli, fake, content):
    """Every unclosed tag scanned the rest of the reply for its closing tag (minutes for these 700 KB)."""
    cli.use(fake)
    fake.add({"content": content}, {"content": "done"})
    r = cli.run("run", "--prompt", "go", "--timeout", "20")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    # all reasoning repeating itself (cut), or an attempted call that cannot be read: the model is asked again
    asked = fake.model_requests()[1]["body"]["messages"][-1]["content"]
    assert asked.startswith("Error: your reply kept repeating itself" if content.startswith("<think>") else
                            "Error: your tool call could not be read")


# ---- diffs for previews, edit results and diff_files ----

def test_a_diff_difflib_would_take_minutes_over_is_a_summary(cli, fake):
    """Lines repeated twice against lines repeated three times: difflib's matching is quadratic on them
    (60,000 lines took minutes). The lines between the common start and end are compared only up to a
    bound; past it the result says what changed, in lines. An edit in such a file still shows the lines
    around the change, promptly, with their real numbers."""
    n = 60000
    a = ["%d\n" % (i // 2) for i in range(n)]
    (cli.workdir / "a.txt").write_text("".join(a))
    (cli.workdir / "b.txt").write_text("".join("%d\n" % (i // 3) for i in range(n)))
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("diff_files", path1="a.txt", path2="b.txt"),
                                       tool_call("edit_file", path="a.txt", old_text="15000\n15000\n",
                                                 new_text="changed\n")], "--timeout", "20")
    assert r.returncode == 0, r.stderr
    assert results[0] == ("--- a.txt\n+++ b.txt\n@@ lines 3-60000 (59998 lines) become 59998 lines: too many to "
                          "compare line by line @@\n")
    edited = a[:30000] + ["changed\n"] + a[30002:]
    assert results[1] == "Edited a.txt: 1 replacement, saved. Lines 29999-30003 now read:\n" + "\n".join(
        "%6d\t%s" % (i + 1, edited[i].rstrip("\n")) for i in range(29998, 30003))


# ---- plan files ----

def test_a_hostile_markdown_plan_is_parsed_promptly(cli, fake):
    """A list marker followed by 300,000 spaces: the item regex tried every split of them (minutes)."""
    (cli.workdir / "plan.md").write_text("# Task: tidy\n\n## Steps\n\n- first step\n-" + " " * 300000 + "\n- second\n")
    cli.use(fake)
    fake.add({"content": "done"})
    r = cli.run("run", "--plan", "plan.md", "--timeout", "20")
    assert r.returncode == 0, r.stderr
    prompt = fake.model_requests()[0]["body"]["messages"][-1]["content"]
    assert "1. first step\n2. second" in prompt



def test_a_heading_of_blanks_and_a_key_after_blank_lines_are_parsed_promptly(cli, fake):
    """A heading of 60,000 blanks: its regex backtracked in cubic time (3 KB held a watcher's every thread for
    seconds, 64 KB for days). A key looked for after 45,000 blank lines of spaces: quadratic (45 s)."""
    (cli.workdir / "plan.md").write_text("# Task" + " " * 60000 + "tidy ##\n\n## Steps ##\n\n- first step\n")
    (cli.workdir / "bad.yaml").write_text(" \n" * 45000 + "{goal: G, instructions: 5}\n")
    cli.use(fake)
    fake.add({"content": "done"})
    r = cli.run("run", "--plan", "plan.md", "--timeout", "20", timeout=30)
    assert r.returncode == 0, r.stderr
    prompt = fake.model_requests()[0]["body"]["messages"][-1]["content"]
    assert "tidy" in prompt and "1. first step" in prompt and "##" not in prompt
    r = cli.run("run", "--plan", "bad.yaml", "--timeout", "20", timeout=30)
    assert r.returncode == 2 and "bad.yaml:45001: 'instructions' must be a non-empty list" in r.stderr, r.stderr

# ---- the chat's streamed answer ----

def test_a_streamed_secret_that_never_ends_is_held_without_rescanning(monkeypatch):
    """A key block's base64 streamed on and on stays held (never shown in part); looking at all of it
    again for every delta was quadratic. Counted: the looks grow with the log of the held text."""
    import xzatoma_store
    looks = []
    real = xzatoma_store.redaction_spans
    monkeypatch.setattr(xzatoma_store, "redaction_spans", lambda text: looks.append(len(text)) or real(text))
    stream = xzatoma_tools.UntrustedStream()
    text = "key: -----BEGIN PRIVATE KEY-----\n" + "QUJD" * 10000
    shown = [stream.feed(text[i:i + 10]) for i in range(0, len(text), 10)]
    shown.append(stream.finish())
    assert "".join(shown) == "key: [REDACTED]"
    assert len(looks) < 250 and sum(looks) < 4 * len(text) + 1024 * 120, (len(looks), sum(looks))


# ---- fetch: HTML from a hostile page ----

@pytest.fixture
def hostile_page():
    """A loopback server whose page opens 100,000 tags it never closes."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    body = ("<html><body><p>hello page</p>" + "<a " * 100000).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d/page.html" % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_a_page_of_unclosed_tags_is_converted_promptly(cli, fake, hostile_page):
    """html.parser scanned to the end of the page from each '<' with no '>' after it (minutes for 300 KB
    before Python 3.11.13/3.12.11): such a tail is text."""
    cli.use(fake, tools={"fetch": {"allowed_hosts": ["127.0.0.1"]}})
    fake.add({"tool_calls": [tool_call("fetch", url=hostile_page)]}, {"content": "ok"})
    r = cli.run("run", "--mode", "planning", "--prompt", "x", "--timeout", "20")
    assert r.returncode == 0, r.stderr
    result = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]
    assert "hello page" in result and "<a <a <a" in result
