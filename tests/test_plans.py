"""Plan parsing (YAML, JSON, Markdown) and the plan-to-prompt translation."""

import json
import re

import pytest

from xzatoma_plans import DocumentError, PlanError, detect_plan_format, load_json, parse_plan

SEED_MD = """# Task: Generate Project Documentation

## Goal

Create comprehensive documentation for the project

## Context

- Repository: /path/to/project
- Focus on: Architecture and API reference

## Steps

1. Scan repository structure
2. Read main source files
3. Generate docs/architecture.md
4. Generate docs/api.md
"""


@pytest.mark.parametrize("text,fmt,goal,steps,context", [
    ("goal: G\ninstructions:\n  - a\n  - b\n", "yaml", "G", ["a", "b"], None),
    ('{"goal": "G", "context": {"directory": "src/"}, "instructions": ["x"]}', "json", "G", ["x"],
     ["- Directory: src/"]),
    ("goal: G\nsteps: [one, two]\n", "yaml", "G", ["one", "two"], None),
    ("goal: G\ninstructions:\n  - {name: build, description: run make}\n", "yaml", "G", ["run make"], None),
    ("goal: G\ncontext: plain words\ninstructions: [a]\n", "yaml", "G", ["a"], ["plain words"]),
    ("goal: G\ninstructions: |\n  - first\n  - second\n", "yaml", "G", ["first", "second"], None),
    (SEED_MD, "markdown", "Create comprehensive documentation for the project",
     ["Scan repository structure", "Read main source files", "Generate docs/architecture.md",
      "Generate docs/api.md"], ["- Repository: /path/to/project", "- Focus on: Architecture and API reference"]),
    ("# Task: Fix the build\n\n## Instructions\n- [ ] run tests\n- [x] read logs\n", "markdown",
     "Fix the build", ["run tests", "read logs"], None),
])
def test_parse_plan(text, fmt, goal, steps, context):
    assert detect_plan_format(text) == fmt
    plan = parse_plan(text)
    assert plan.goal == goal and plan.instructions == steps
    assert (plan.context_lines() or None) == context


@pytest.mark.parametrize("text,source,message", [
    ("", "p.yaml", "p.yaml: the plan is empty"),
    ("- a\n- b\n", "p.yaml", "p.yaml: a plan must be a mapping"),
    ("goal: G\n", "p.yaml", "p.yaml: missing required key 'instructions'"),
    ("goal: G\ninstructions: []\n", "p.yaml", "p.yaml:2: 'instructions' must be a non-empty list"),
    ("goal: [1]\ninstructions: [a]\n", "p.yaml", "p.yaml:1: 'goal' must be text"),
    ("goal: G\ninstructions:\n - ok\n - \n", "p.yaml", "step 2 of 'instructions' is empty"),
    ("goal: 'G\ninstructions: [a]\n", "p.yaml", "p.yaml:3: invalid YAML"),
    ('{"goal": "G"\n"instructions": []}', "p.json", "p.json:2: invalid JSON"),
    ("# Title only\n\nSome prose\n", "p.md", "p.md: no instructions found"),
    ("# T\n## Steps\nno list here\n", "p.md", "p.md:2: the instructions section has no list items"),
])
def test_plan_errors_name_source_and_line(text, source, message):
    with pytest.raises(PlanError) as err:
        parse_plan(text, source=source)
    assert message in str(err.value)


@pytest.mark.parametrize("text,source,line", [
    ("goal: tidy\ninstructions:\n  - list\n  - count\n  - write\n  - ''\n", "p.yaml", 6),
    ("goal: G\ninstructions:\n - ok\n - \n", "p.yaml", 4),
    ("context:\n  goal: the team's goal\n  owner: me\ngoal: 5\ninstructions:\n  - a\n", "p.yaml", 4),
    ("context:\n  instructions: x\ngoal: G\ninstructions: []\n", "p.yaml", 4),
    ("name: n\ndescription: d\nsteps:\n  - name: a\n    action: b\n  - []\n", "p.yaml", 6),
    ('{\n  "context": {"goal": "x"},\n  "goal": ["not", "text"],\n  "instructions": ["a"]\n}\n', "p.json", 3),
    ('{"context": {"goal": 1},\n "goal": 5,\n "instructions": ["a"]}', "p.json", 2),
    ('{\n "context": {"instructions": "x"},\n "goal": "g",\n "instructions": [\n  "a",\n  {"x": [1, 2]},\n\n'
     '  ""\n ]\n}\n', "p.json", 8),
])
def test_plan_errors_name_the_line_of_what_is_wrong(text, source, line):
    """From the parser's own marks, not a search for the key's text: an empty step 4 was named at its list's
    line, and a bad top-level goal at a `goal:` nested under `context:` (round 18c)."""
    with pytest.raises(PlanError) as err:
        parse_plan(text, source=source)
    assert err.value.line == line and str(err.value).startswith("%s:%d: " % (source, line)), str(err.value)


def test_seed_translation_exactly():
    plan = parse_plan("goal: \"Generate API documentation\"\ncontext:\n  directory: \"src/api/\"\n"
                      "instructions:\n  - List all API endpoint files\n  - Extract function signatures\n"
                      "  - Create OpenAPI spec\n")
    assert plan.to_prompt() == """You are assisting with the following task:

GOAL: Generate API documentation

CONTEXT:
- Directory: src/api/

INSTRUCTIONS (follow as guidance):
1. List all API endpoint files
2. Extract function signatures
3. Create OpenAPI spec

Use the available tools to accomplish this goal. You may adapt your approach as needed, but try to follow the instructions provided."""


def test_plan_without_context_has_no_context_block():
    prompt = parse_plan("goal: G\ninstructions: [a]\n").to_prompt()
    assert "CONTEXT" not in prompt and "GOAL: G\n\nINSTRUCTIONS" in prompt


def test_unknown_keys_are_reported():
    assert parse_plan("goal: G\ninstructions: [a]\nowner: me\n").unknown_keys == ["owner"]


STEPS_YAML = """name: release-notes
description: Write the release notes for the new tag
version: 1.4.2
action: docs.release-notes
steps:
  - name: collect
    action: list the merged pull requests since the last tag
    context: {since: v1.4.1}
  - name: write
    action: write RELEASE_NOTES.md
"""


def test_steps_format_in_yaml_and_json():
    import json
    import yaml
    for text in (STEPS_YAML, json.dumps(yaml.safe_load(STEPS_YAML))):
        plan = parse_plan(text)
        assert plan.goal == "Write the release notes for the new tag"
        assert (plan.name, plan.version, plan.action) == ("release-notes", "1.4.2", "docs.release-notes")
        assert plan.instructions == ["collect: list the merged pull requests since the last tag (context: since: v1.4.1)",
                                     "write: write RELEASE_NOTES.md"]
        assert plan.unknown_keys == []
        assert "GOAL: Write the release notes" in plan.to_prompt()


def test_steps_format_accepts_tasks_and_falls_back_to_action_then_name():
    plan = parse_plan("name: n\naction: do.it\ntasks: [one]\n")
    assert plan.goal == "do.it" and plan.instructions == ["one"]
    assert parse_plan("name: only-name\nsteps: [one]\n").goal == "only-name"
    with pytest.raises(PlanError, match="missing 'description'"):
        parse_plan("version: 1.0.0\nsteps: [one]\n")
    with pytest.raises(PlanError, match="'version' must be text"):
        parse_plan("name: n\nversion: [1]\nsteps: [one]\n")


def test_plan_from_data_and_looks_like_plan():
    from xzatoma_plans import looks_like_plan, plan_from_data
    assert plan_from_data({"goal": "G", "instructions": ["a"]}, "event").goal == "G"
    with pytest.raises(PlanError, match="^event: missing required key 'instructions'"):
        plan_from_data({"goal": "G"}, "event")
    assert looks_like_plan({"name": "n", "steps": []}) and looks_like_plan({"goal": 1})
    assert not looks_like_plan({"cluster": "prod"}) and not looks_like_plan("goal: x")


def _nested_aliases(levels=9, width=9):
    """A YAML 'billion laughs': a few hundred bytes that name width**levels strings."""
    lines = ["goal: G", "instructions: [a]", "context:", '  l0: &l0 [%s]' % ", ".join(['"x"'] * width)]
    lines += ["  l%d: &l%d [%s]" % (n, n, ", ".join(["*l%d" % (n - 1)] * width)) for n in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,fmt,message", [
    (_nested_aliases(), "yaml", "more than 100000 values once its aliases are expanded"),
    ("goal: G\ninstructions: [a]\nc: &s '%s'\nd: [%s]\n" % ("x" * 100000, ", ".join(["*s"] * 20)), "yaml",
     "its aliases expand to more than"),
    ("goal: G\ninstructions: [a]\nc: &a [1, *a]\n", "yaml", "an alias refers to a node that contains it"),
    ("[" * 1500 + "]" * 1500, "json", "nested deeper than 64 levels"),
    ('{"a":' * 1500 + "1" + "}" * 1500, "json", "nested deeper than 64 levels"),
    ("[" * 70 + "]" * 70, "json", "nested deeper than 64 levels"),  # parses, but deeper than anything walks
    # libyaml's parser stops it ("exceeded maximum nesting depth"); pure-Python PyYAML (no libyaml wheel, as on
    # some 3.9 installs) is stopped by the composer's guard
    ("[" * 1500 + "]" * 1500, "yaml", ("nesting depth", "nested deeper than 64 levels")),
    ("goal: G\ninstructions: [a]\nc: " + "[" * 70 + "]" * 70 + "\n", "yaml", "nested deeper than 64 levels"),
    ("goal: " + "1" * 5000 + "\ninstructions: [a]\n", "yaml", "invalid YAML: Exceeds the limit"),
    ('{"goal": ' + "1" * 5000 + ', "instructions": ["a"]}', "json", "invalid JSON: Exceeds the limit"),
    ('{"goal": "G", "instructions": [%s]}' % ",".join(["0"] * 100001), "json", "more than 100000 values"),
    # libyaml composes a whole document before it can be measured: 8 MB of these made 8 million nodes (4 GB)
    ("goal: G\ninstructions: [a]\nx: {" + "a," * 300000 + "a}\n", "yaml", "more than 100000 values"),
    ("goal: G\ninstructions: [a]\nx: [" + "a," * 300000 + "a]\n", "yaml", "more than 100000 values"),
    ("goal: G\ninstructions: [a]\nx:\n" + "- a\n" * 300000, "yaml", "more than 100000 values"),
    # YAML 1.1's base 60 is a product per part: 200 KB took 4.4 s, 8 MB hours (one scalar, few events)
    ("goal: G\ninstructions: [a]\nnote: " + ":".join(["1"] * 100000) + "\n", "yaml",
     "a base-60 number (x:y:z) of 199999 characters, over the limit of 1000; quote it"),
    # hex, octal and binary are built whatever their size, then cannot be written in decimal (the prompt, JSON):
    # one killed the watcher (round 16b)
    ("goal: G\ninstructions: [a]\nn: 0x" + "f" * 5000 + "\n", "yaml", "a number of more than 4,300 digits"),
    ("goal: G\ninstructions: [a]\nn: 0b" + "1" * 20000 + "\n", "yaml", "a number of more than 4,300 digits"),
])
def test_hostile_plans_are_plan_errors_with_bounded_memory(text, fmt, message):
    """Issue 22: a 356-byte plan of nested aliases took 47 s and 684 MB; `[` x 1500 raised RecursionError.
    Every hostile document is a PlanError, found on the parsed shape before anything is built from it."""
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(PlanError) as exc:
            parse_plan(text, source="p", fmt=fmt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert any(m in str(exc.value) for m in ((message,) if isinstance(message, str) else message)), exc.value
    assert peak < 64 * 1024 * 1024, peak


@pytest.mark.parametrize("text", [
    "[" + "{}, " * 500000 + "{}]",  # 2 MB of empty mappings: 500,001 dicts, once built
    "[" + ",".join(["[" * 60 + "1" + "]" * 60] * 17000) + "]",  # chains json.loads takes, over a million lists
    '{"goal": "G", "instructions": ["a"], "x": [' + '"s",' * 300000 + '"s"]}',
])
def test_json_over_the_value_limit_is_refused_before_it_is_built(text):
    """json.loads builds a whole document before it can be measured: 8 MB of `[{}, {}, ...]` took 1.3 s and
    450 MB only to be refused (round 16e). Its values are counted on the text first."""
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(PlanError, match="more than 100000 values"):
            parse_plan(text, source="p", fmt="json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(text), (peak, len(text))


def test_the_count_on_the_text_is_linear_whatever_the_quotes_and_escapes():
    """Round 17d: the count's string pattern stepped over escapes, and `"` then `\\",` 100,001 times (300 KB)
    took 284 s, quadratic in the size; 8 MB of escapes in one valid string took 307 MB of backtracking. A ceiling
    on a process of its own (the old pattern needed minutes for 1 MB), and the memory of the valid one."""
    import subprocess
    import sys
    import tracemalloc
    from conftest import ROOT
    code = ("import sys; sys.path.insert(0, %r); import xzatoma_plans as p\n"
            "try:\n    p.load_json('\"' + '\\\\\",' * 350000)\nexcept p.DocumentError as e:\n    print(e)" % ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "more than 100000 values", (r.stdout, r.stderr)
    text = '["' + "\\n," * 1000000 + '"]'
    tracemalloc.start()
    try:
        assert load_json(text) == ["\n," * 1000000]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * len(text), (peak, len(text))


@pytest.mark.parametrize("text", [
    '[]', '{}', '1', '"a,[{"', '[[], {}, [[]], {"a": {}}]', '{"a,": [1, "]", {"b\\"": [ ]}], "c": null}',
    '[ 1 , [ 2 ,\n\t3 ] , { "k" : "v" , "l" : [ ] } , "\\\\" , "\\",\\"" ]',
    json.dumps({"goal": "G", "instructions": ["a", "b, c [d] {e}"], "context": {"x": [[], {}, [1, [2, {}]]]}}),
])
def test_the_count_on_the_text_is_the_count_of_the_parsed_document(text):
    from xzatoma_plans import _json_values
    count, stack = 0, [json.loads(text)]
    while stack:
        value = stack.pop()
        count += 1
        stack.extend(value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())
    assert _json_values(text) == count, text
    assert load_json(text, max_values=count) == json.loads(text)
    with pytest.raises(DocumentError, match="more than %d values" % (count - 1)):
        load_json(text, max_values=count - 1)


def test_pure_python_yaml_is_bounded_too(monkeypatch):
    """Without libyaml the Python composer recurses: its depth is guarded before the interpreter's limit."""
    import yaml
    import xzatoma_plans
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    monkeypatch.setattr(xzatoma_plans, "_LOADERS", {})
    with pytest.raises(PlanError, match="nested deeper than 64 levels"):
        parse_plan("goal: G\ninstructions: [a]\nc: " + "[" * 300 + "]" * 300 + "\n", source="p", fmt="yaml")
    with pytest.raises(PlanError, match="more than 100000 values"):
        parse_plan(_nested_aliases(), source="p", fmt="yaml")
    plan = parse_plan("goal: G\nx: &x {k: 1}\ny: {<<: *x}\ninstructions: [a]\n", source="p", fmt="yaml")
    assert plan.goal == "G" and plan.instructions == ["a"]


@pytest.mark.parametrize("fmt,make", [
    ("markdown", lambda n: "# Task: count\n\n## Steps\n" + "".join("- step %d\n" % i for i in range(n))),
    ("yaml", lambda n: "goal: count\ninstructions:\n" + "".join("  - step %d\n" % i for i in range(n))),
    ("yaml", lambda n: "goal: count\ninstructions: |\n" + "".join("  step %d\n" % i for i in range(n))),
    ("json", lambda n: json.dumps({"goal": "count", "steps": ["step %d" % i for i in range(n)],
                                   "description": "d"})),
])
def test_a_plan_holds_at_most_1000_steps_in_any_format(fmt, make):
    """The model reads a plan's whole list in its first request: 1.6 million Markdown items (under an event's
    8 MB) were an 18 MB request and as big a stored conversation (attack round 15a)."""
    assert len(parse_plan(make(1000), source="p", fmt=fmt).instructions) == 1000
    with pytest.raises(PlanError, match="more than 1,000: split the plan|more than 1,000 steps: split") as exc:
        parse_plan(make(1001), source="p", fmt=fmt)
    assert exc.value.line is not None or fmt == "json"  # the line of the list (one-line JSON has none)


def test_a_long_decimal_number_is_still_a_number_and_base_60_is_bounded():
    """The bound is on base 60 alone, the costly one (a plan carrying an RSA-4096 modulus of 1,234 digits was
    refused by a bound on every number, found by an attack round)."""
    modulus = "9" * 1234
    plan = parse_plan("goal: G\ninstructions: [a]\ncontext:\n  modulus: %s\n  at: 1:30\n" % modulus, source="p",
                      fmt="yaml")
    assert plan.context == {"modulus": int(modulus), "at": 90}
    nested = parse_plan("goal: G\ninstructions: [a]\ncontext:\n  release: {due: 2024-06-01, tags: !!set {x}, "
                        "blob: !!binary aGk=}\n", source="p", fmt="yaml")  # `run --plan` crashed on it (16c)
    assert '"due": "2024-06-01"' in nested.to_prompt() and '"tags": ["x"]' in nested.to_prompt()
    top = parse_plan("goal: G\ninstructions: [a]\ncontext:\n  tags: !!set {y, x}\n  at: 2024-06-01 10:00:00\n"
                     "  blob: !!binary aGk=\n", source="p", fmt="yaml").to_prompt()  # as publish writes them (16d)
    assert '["x", "y"]' in top and "2024-06-01T10:00:00" in top and "aGk=" in top
    big = parse_plan("goal: G\ninstructions: [a]\ncontext:\n  n: 0x%s\n" % ("f" * 3500), source="p", fmt="yaml")
    assert str(big.context["n"]).startswith("2") and big.to_prompt()  # 4,214 digits: within the bound


@pytest.mark.parametrize("mapping,first,second", [
    ("{1: a, '1': b}", "1", "'1'"),
    ("{2024-01-02: a, '2024-01-02': b}", "2024-01-02", "'2024-01-02'"),
    ("{'true': a, true: b}", "'true'", "true"),
    ("{null: a, 'null': b}", "null", "'null'"),
    ("{1.5: a, '1.5': b}", "1.5", "'1.5'"),
])
def test_keys_that_are_one_key_in_json_are_refused_not_merged(mapping, first, second):
    """YAML keys may be any scalar; JSON's are text. `1` and '1' became one key as publish sent the plan, and the
    prompt of `run --plan` kept only the last one's value (rounds 16d, 16e)."""
    with pytest.raises(PlanError, match="two keys of one mapping, %s and %s, are one key in JSON: rename one"
                       % (re.escape(first), re.escape(second))):
        parse_plan("goal: G\ninstructions: [a]\ncontext:\n  nested: %s\n" % mapping, source="p.yaml")


@pytest.mark.parametrize("mapping,first,second", [
    ("{a: 1, a: 2}", "a", "a"), ("{true: a, 1: b}", "true", "1"), ("{1: a, 1.0: b}", "1", "1.0"),
    ("{null: a, ~: b}", "null", "~"), ("{0x10: a, 16: b}", "0x10", "16"), ("{-0.0: a, 0.0: b}", "-0.0", "0.0"),
])
def test_keys_yaml_would_build_as_one_are_refused_not_merged(mapping, first, second):
    """PyYAML keeps the last value under the first key's spelling, silently: a plan lost a value of its context,
    or an instruction under a repeated key (round 17d). Keys merged in with `<<:` may still be overridden."""
    with pytest.raises(PlanError, match="p.yaml:4: two keys of one mapping, '%s' and '%s', are one key: rename one"
                       % (re.escape(first), re.escape(second))):
        parse_plan("goal: G\ninstructions: [a]\ncontext:\n  nested: %s\n" % mapping, source="p.yaml")
    with pytest.raises(PlanError, match="two keys of one mapping, 'goal' and 'goal'"):
        parse_plan("goal: G\ngoal: H\ninstructions: [a]\n", source="p.yaml")
    plan = parse_plan("goal: G\nx: &x {k: 1, j: 2}\ncontext: {y: {<<: *x, k: 3}}\ninstructions: [a]\n",
                      source="p.yaml")
    assert plan.context == {"y": {"k": 3, "j": 2}}


def test_keys_of_other_scalars_read_as_json_writes_them():
    plan = parse_plan("goal: G\ninstructions: [a]\ncontext:\n  ports: {1: a, 2.5: b, false: c, null: d}\n",
                      source="p.yaml")
    assert '{"1": "a", "2.5": "b", "false": "c", "null": "d"}' in plan.to_prompt()
