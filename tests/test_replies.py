"""Real servers' replies, replayed: what xzatoma does with what a small local model really sends.

tests/replies/*.json hold the byte-exact replies of real servers to real runs of bench/tasks.py (made with
bench/fixture.py from `bench/tasks.py --record`); the suite's fake server serves them again in order, so CI
covers these shapes without a model. The replies were written for an earlier prompt, so a model would not
say exactly this today; what is checked is xzatoma's part: which calls it finds and runs, what it keeps in the
conversation, and how the run ends.
"""

import importlib.util
import json
import os
import pathlib
import shutil

import pytest

from conftest import ROOT

REPLIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replies")


def _bench_tasks():
    spec = importlib.util.spec_from_file_location("bench_tasks", os.path.join(ROOT, "bench", "tasks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {t.name: t for t in module.TASKS + module.HELDOUT}


TASKS = _bench_tasks()
GGUF = json.load(open(os.path.join(REPLIES, "llama_cpp_gguf_template.json"), encoding="utf-8"))


@pytest.fixture
def recorded_dirs():
    """The working directories the replies were recorded in (the model wrote absolute paths into them, token by
    token, so they cannot be replaced in the stream): made for the test, removed after it. The paths are the same
    for every run of the suite, so one test at a time holds them, across processes: CI runs two interpreters' suites
    at once, and one removed the other's files mid-test ("no such file or directory")."""
    import fcntl
    made = []

    def make(path):
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os.makedirs(path)
        made.append(os.path.dirname(path))
        return pathlib.Path(path)
    with open("/tmp/xzatoma-recorded-dirs.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield make
        finally:
            for path in made:
                shutil.rmtree(path, ignore_errors=True)


def replay(cli, fake, recorded_dirs, fixture, run, task_name, *flags, reread=None, read_named="off"):
    """Set up the bench task's files where they were recorded, serve the recorded replies, and run the task as
    the bench did. `reread`: what the model says when a question's answer is asked again afresh (Agent.last_word;
    recorded before it existed; "" says nothing, so the recorded answer stands). `read_named` (agent.read_named):
    off for runs recorded before the files a task names were read first. Returns (process result, --json object,
    the model requests)."""
    recorded = fixture["runs"][run]
    task = TASKS[task_name]
    work = recorded_dirs(recorded["workdir"])
    cli.workdir = work
    for rel, content in task.files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(content)
    fake.models = {"qwen2.5-coder-1.5b": {}}
    for ex in recorded["exchanges"]:
        body = ex["body"]
        if ex["path"].endswith("/chat/completions"):
            fake.add({"raw": {"status": ex["status"], "content_type": ex["content_type"], "body": body}})
        else:
            fake.raw_routes[ex["path"]] = (ex["status"], ex["content_type"], body)
    if reread is not None:
        fake.add({"content": reread})
    cli.use(fake, provider="openai", model="qwen2.5-coder-1.5b", tools={"profile": "auto"}, read_named=read_named)
    args = ["run", "--json"] + list(flags)
    if task.plan:
        (work / "task.yaml").write_text(task.plan)
        args += ["--plan", "task.yaml"]
    else:
        args += ["--", task.prompt]
    r = cli.run(*args, timeout=120)
    data = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    return r, data, [q["body"] for q in fake.model_requests()]


def calls_made(request):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in request["messages"] for c in m.get("tool_calls") or ()]


def test_a_fenced_call_bumps_the_version_and_the_run_completes(cli, fake, recorded_dirs):
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "bump_version", "bump_version")
    assert r.returncode == 0 and data["status"] == "completed", r.stderr
    assert json.loads((cli.workdir / "package.json").read_text())["version"] == "2.4.1"
    assert len(sent) == 2 and [n for n, _ in calls_made(sent[-1])] == ["edit_file"]
    # the compact profile, chosen for a local 1.5B model: six short tools
    assert sorted(t["function"]["name"] for t in sent[0]["tools"]) == [
        "edit_file", "grep", "list_directory", "read_file", "terminal", "write_file"]


def test_doubled_braces_in_a_tools_tag_are_a_call(cli, fake, recorded_dirs):
    """`<tools>{{"name": "read_file", …}}}</tools>` then a made-up result: the call runs, the guess is dropped."""
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "config_value_tools_tag", "config_value", reread="")
    assert r.returncode == 0 and data["status"] == "completed", r.stderr
    assert [n for n, _ in calls_made(sent[-2])] == ["read_file"]
    assistant = [m for m in sent[-2]["messages"] if m["role"] == "assistant"][0]
    assert assistant["content"] == "" and "8080" not in json.dumps(sent[-2]["messages"])  # its guessed port
    assert "The task: Which port" in sent[-1]["messages"][0]["content"] and "tools" not in sent[-1]  # afresh


def test_only_the_first_written_call_runs_and_the_guess_after_it_is_dropped(cli, fake, recorded_dirs):
    """The reply held a listing, a grep for `\\.md$` and the count it guessed before any result ("1")."""
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "count_files_guess_after_calls", "count_files",
                           reread="")
    assert [n for n, _ in calls_made(sent[1])] == ["list_directory"]
    assert "(7 .md files, 1 .png file, 1 .txt file; 9 entries in all)" in json.dumps(sent[1]["messages"])
    assert "directory is 1" not in json.dumps(sent[1]["messages"])  # "The number of .md files … is 1"
    assert data["status"] == "completed"  # the recorded model still answered 1: a fact nothing can check


def test_work_done_stays_done_whatever_the_model_imagines_after_it(cli, fake, recorded_dirs):
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "create_file", "create_file")
    assert r.returncode == 0 and data["status"] == "completed", r.stderr
    assert (cli.workdir / "greeting.txt").read_text() == "Hello, world"
    # the third reply made up <tool_response>s: pointed out once; the fourth (more of them) ends it: the file
    # was written by a tool, whatever the model imagines after that
    assert len(sent) == 4 and sent[3]["messages"][-1]["content"].startswith("You wrote a tool result yourself")
    results = [m["content"] for m in sent[2]["messages"] if m["role"] == "tool"]
    assert results[0] == "Created greeting.txt (12 bytes)"
    assert results[1] == "file        12 B  greeting.txt" and len(results) == 2  # of <tools> list + read: the first


def test_a_tutorial_instead_of_work_is_asked_once_then_unverified(cli, fake, recorded_dirs):
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "fix_assert_tutorial", "fix_assert")
    assert r.returncode == 3 and data["status"] == "unverified", r.stderr
    assert "status unverified" in data["warnings"][0] and "warning:" in r.stderr
    assert sent[1]["messages"][-1]["content"].startswith("You answered without doing that with the tools")
    assert "70.0" in (cli.workdir / "test_prices.py").read_text()  # nothing was changed, and it says so


def test_a_call_in_an_sh_fence_after_the_nudge_runs(cli, fake, recorded_dirs):
    """A plan in prose with no call, the nudge, then three calls each alone in a ```sh fence: the first runs."""
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "rename_sh_fences", "rename_function", "--max-turns", "2")
    assert data["status"] == "max_turns" and r.returncode == 1 and len(sent) == 2
    show = cli.run("history", "show", data["conversation_id"], "--full")
    ran = [line.split()[1] for line in show.stdout.splitlines() if line.startswith("  ▶ ")]
    assert ran == ["list_directory"], show.stdout


def test_a_plan_answered_done_after_only_looking_is_unverified(cli, fake, recorded_dirs):
    """A <tools> block of JSON lines (a listing, then the write); the listing runs, the model says "The task is
    complete.", is asked once, says so again: nothing was written, and the run does not claim it was."""
    r, data, sent = replay(cli, fake, recorded_dirs, GGUF, "two_step_plan", "two_step_plan")
    assert r.returncode == 3 and data["status"] == "unverified", r.stderr
    assert not (cli.workdir / "CHANGES.md").exists()
    assert [n for n, _ in calls_made(sent[1])] == ["list_directory"]


# ---- llama-cpp-python's chatml-function-calling format ----

CFC = json.load(open(os.path.join(REPLIES, "llama_cpp_chatml_function_calling.json"), encoding="utf-8"))


def test_chatml_function_calling_a_fenced_call_creates_the_file(cli, fake, recorded_dirs):
    """Streamed with tools, that chat format hands the model's text through: the call comes as a fenced block."""
    r, data, requests = replay(cli, fake, recorded_dirs, CFC, "create_file", "create_file")
    assert r.returncode == 0 and data["status"] == "completed", r.stderr
    assert (cli.workdir / "greeting.txt").read_text().startswith("Hello, world")
    assert [name for name, _ in calls_made(requests[-1])] == ["write_file"]


def test_chatml_function_calling_calls_written_html_escaped_run(cli, fake, recorded_dirs):
    """Its template escapes what the model reads as HTML, and the model wrote its calls so ({&#34;name&#34;: …}):
    recorded, the escaped read_file runs; a tool named after the file gets the list of tools."""
    r, data, requests = replay(cli, fake, recorded_dirs, CFC, "bump_version", "bump_version")
    results = [m["content"] for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("Error: unknown tool 'package.json'; available tools:")
    assert '"version": "2.4.0"' in results[1]  # the escaped call ran: the file as it is
    assert calls_made(requests[-1])[1][0] == "read_file"


# Recorded with this stop's loop (issue 21): a file replaced only once seen, a repeated change told it is made,
# the doubts asked before the end, and a small model's answer to a question read again afresh.
CHECKED = json.load(open(os.path.join(REPLIES, "llama_cpp_gguf_template_checked.json"), encoding="utf-8"))


def test_a_list_rewritten_without_its_first_line_ends_unverified_not_completed(cli, fake, recorded_dirs):
    r, data, sent = replay(cli, fake, recorded_dirs, CHECKED, "append_line", "append_line")
    assert (r.returncode, data["status"]) == (3, "unverified"), r.stderr
    results = [m["content"] for m in sent[-1]["messages"] if m["role"] == "tool"]
    assert results[0].endswith("todo.txt already exists and you have not read it; write_file would replace all of "
                               "it. It holds now:\nwrite report\ncall Sam\nTo add or change lines, use edit_file; "
                               "to replace the file, call write_file again with the complete new content")
    assert results[2].endswith("That change is made: the same call again changes nothing. If the task is done, "
                               "reply with one sentence saying what you did, and no tool call; if not, make the "
                               "next change.")
    assert data["warnings"][0].startswith("write_file replaced all of todo.txt and 1 of its earlier lines are gone "
                                          "(write report)")


def test_a_question_the_model_lost_its_way_on_is_answered_afresh_from_what_the_tools_showed(cli, fake,
                                                                                           recorded_dirs):
    r, data, sent = replay(cli, fake, recorded_dirs, CHECKED, "count_files", "count_files")
    assert (r.returncode, data["status"], data["answer"]) == (0, "completed",
                                                              "There are 7 .md files in the docs directory."), r.stderr
    last = sent[-1]
    assert "tools" not in last and len(last["messages"]) == 1
    assert last["messages"][0]["content"].startswith("What the tools showed:\n[list_directory ")
    assert "(7 .md files, 1 .png file, 1 .txt file; 9 entries in all)" in last["messages"][0]["content"]


# Held-out tasks recorded with the files a task names read first (agent.read_named), the code it names grepped
# for, loose edits and grep's longest word (issue 21).
READ_FIRST = json.load(open(os.path.join(REPLIES, "llama_cpp_gguf_template_read_first.json"), encoding="utf-8"))


def test_the_code_a_question_names_is_found_before_the_first_turn_and_answered(cli, fake, recorded_dirs):
    r, data, sent = replay(cli, fake, recorded_dirs, READ_FIRST, "find_function", "find_function",
                           read_named="auto")
    assert (r.returncode, data["status"]) == (0, "completed"), r.stderr
    assert "app/cli.py" in data["answer"]
    assert calls_made(sent[0]) == [("grep", {"pattern": "parse_args", "fixed_string": True, "max_results": 20})]
    assert [m["content"] for m in sent[0]["messages"] if m["role"] == "tool"] == ["app/cli.py:4: def parse_args(argv):"]
    assert "looking first at what the task names: parse_args" in r.stderr


@pytest.mark.parametrize("run, check", [
    ("set_port", lambda work, data: json.loads((work / "server.json").read_text())["port"] == 9090),
    ("yaml_value", lambda work, data: "45" in data["answer"]),
])
def test_a_task_that_names_a_file_starts_from_what_it_holds(cli, fake, recorded_dirs, run, check):
    r, data, sent = replay(cli, fake, recorded_dirs, READ_FIRST, run, run, read_named="auto")
    assert (r.returncode, data["status"]) == (0, "completed"), r.stderr
    assert check(cli.workdir, data)
    assert [name for name, _ in calls_made(sent[0])] == ["read_file"]
