"""A model's regular expression cannot hold a run past its deadline: grep matches it in a worker process.

Python's `re` backtracks without releasing the GIL or running signal handlers, so `(a+)+$` on a line of
forty a's followed by '!' (about 2**40 steps) could never be stopped from inside the agent's process.
"""

import os
import time

import pytest

from conftest import last_json, processes, tool_call, tool_results, wait_for
from xzatoma_tools import ToolContext, build_registry

EVIL = "(a+)+$"
LINE = "a" * 40 + "!\n"


def workers_of(pid):
    """grep workers whose parent is `pid`, zombies included (a worker killed but never waited for)."""
    return [child for child, parent, _, _, cmdline in processes() if b"_grep_worker" in cmdline and parent == pid]


def test_the_runs_timeout_stops_a_catastrophic_regex(cli, fake):
    (cli.workdir / "a.txt").write_text("ok\n" + LINE)
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("grep", pattern=EVIL)]}, {"content": "never"})
    started = time.monotonic()
    r = cli.run("run", "--timeout", "4", "--json", "--prompt", "find it", timeout=120)
    assert time.monotonic() - started < 60  # before: the run never ended (the subprocess timeout fired)
    assert r.returncode == 1, r.stderr
    assert last_json(r.stdout)["status"] == "timeout"
    assert len(fake.model_requests()) == 1  # the run ended at its deadline; the model was not asked again


def test_without_a_deadline_the_pattern_gets_its_own_limit_and_the_model_recovers(cli, fake):
    (cli.workdir / "a.txt").write_text(LINE)
    (cli.workdir / "b.txt").write_text("needle\n")
    cli.use(fake, tools={"grep_regex_seconds": 1})
    fake.add({"tool_calls": [tool_call("grep", pattern=EVIL), tool_call("grep", pattern="ne+dle$")]},
             {"content": "found b.txt"})
    r = cli.run("run", "--prompt", "find it", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "found b.txt"
    evil, fine = tool_results(fake)
    assert evil.startswith("Error: grep stopped: matching the regular expression took longer than 1 s"), evil
    assert "fixed_string=true" in evil
    assert fine == "b.txt:1: needle"


def test_the_worker_is_killed_and_reaped_when_it_overruns(tmp_path):
    (tmp_path / "a.txt").write_text(LINE)
    reg = build_registry("write", ToolContext(str(tmp_path), {"grep_regex_seconds": 1}))
    r = reg.execute("grep", {"pattern": EVIL})
    assert r.error.startswith("grep stopped: matching the regular expression took longer than 1 s"), r.error
    assert workers_of(os.getpid()) == []  # killed and waited for: no stray process, no zombie


def test_a_deadline_already_near_wins_over_the_patterns_own_limit(tmp_path):
    (tmp_path / "a.txt").write_text(LINE)
    ctx = ToolContext(str(tmp_path), {"grep_regex_seconds": 3600}).with_deadline(time.monotonic() + 1)
    r = build_registry("write", ctx).execute("grep", {"pattern": EVIL})
    assert r.error.startswith("grep stopped: the run's time limit was reached"), r.error


@pytest.mark.parametrize("pattern", ["(", "a{2,1}", "(?P<x>a)(?P<x>b)", "(" * 2000 + ")" * 2000, "a{99999999999}"])
def test_bad_patterns_are_reported_not_raised(tmp_path, pattern):
    (tmp_path / "a.txt").write_text("a\n")
    r = build_registry("write", ToolContext(str(tmp_path), {})).execute("grep", {"pattern": pattern})
    assert not r.success and r.error.startswith("invalid regular expression"), r.error


def test_a_pattern_that_eats_memory_ends_the_worker_not_the_agent(tmp_path):
    """A huge text times a pattern with big captures: the worker's address-space limit stops it."""
    (tmp_path / "big.txt").write_text(("x" * 4000 + "\n") * 4000)
    r = build_registry("write", ToolContext(str(tmp_path), {"grep_regex_seconds": 20})).execute(
        "grep", {"pattern": "(?s)(.*)(.*)(.*)$", "max_results": 1})
    assert r.success or r.error.startswith("grep"), r.error  # either answer; the agent itself is unharmed
    assert workers_of(os.getpid()) == []


def test_regex_results_match_the_literal_path_and_split_lines_at_newlines_only(tmp_path):
    """Line numbers come from '\\n' alone: a form feed or U+2028 inside a line does not shift them."""
    (tmp_path / "a.txt").write_text("one\x0cstill one\u2028and one\r\ntwo needle\r\nthree\n")
    reg = build_registry("write", ToolContext(str(tmp_path), {}))
    regex = reg.execute("grep", {"pattern": "ne+dle", "context_lines": 1})
    literal = reg.execute("grep", {"pattern": "needle", "context_lines": 1})
    assert regex.output == literal.output
    assert regex.output.split("\n")[1:] == ["a.txt:2: two needle", "a.txt-3- three"]


def test_many_files_and_results_are_counted_across_batches(tmp_path):
    """Also: ^ anchors at every line, as in grep."""
    for i in range(700):  # more files than one batch holds
        (tmp_path / ("f%03d.txt" % i)).write_text("x\nhit %d\nhit again\n" % i)
    reg = build_registry("write", ToolContext(str(tmp_path), {}))
    r = reg.execute("grep", {"pattern": "^hit", "max_results": 1000})
    assert r.metadata["matches"] == 1400
    assert r.output.count("\n") == 999 + 1  # 1000 results and the "stopped at" line
    assert r.output.endswith("... stopped at 1000 results; 400 more matches not shown")
    assert wait_for(lambda: workers_of(os.getpid()) == [], 10)


def test_the_prefilter_never_hides_a_match_fuzzed():
    """Random patterns over a small alphabet: whenever the regex matches a text, the literal the prefilter
    demands is in it (the prefilter may only skip files that cannot match)."""
    import random
    import re
    from xzatoma_tools import _required_literal
    import warnings
    warnings.simplefilter("ignore", FutureWarning)
    rng = random.Random(1234)
    atoms = ["a", "b", "c", "(", ")", "|", "[", "]", "^", "-", "*", "+", "?", "{2}", ".", "\\(", "\\)", "\\w",
             "\\d", "[^]a]", "[]b]", "(?i)", "(?x)", " ", "#", "$", "\\\\", "\\.", "\\b", "\\|"]
    texts = ["".join(rng.choice("abcABC ()|]^-.#\\\n1") for _ in range(rng.randint(0, 12))) for _ in range(400)]
    checked = 0
    for _ in range(4000):
        pattern = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 7)))
        try:
            regex = re.compile(pattern, re.MULTILINE)
        except re.error:
            continue
        literal = _required_literal(pattern)
        if not literal:
            continue
        for text in texts:
            if regex.search(text):
                checked += 1
                assert literal in text, (pattern, literal, text)
    assert checked > 1000  # the fuzz really exercised patterns with a literal
