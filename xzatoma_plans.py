"""XZatoma plans: what a plan file or an event asks for, read from YAML, JSON or Markdown within bounds.

One section: Plan and PlanError; parse_plan (a file's text, its format detected by detect_plan_format),
plan_from_data (an event's parsed payload) and looks_like_plan; and below them the bounded readers of
documents that come from other people: load_json, load_yaml, DocumentError.

The `plan` tool (xzatoma_tools), `run --plan` (xzatoma) and the watcher (xzatoma_watch) read plans here,
each importing this module where it needs it. It imports only the standard library and xzatoma_store;
`yaml` is imported where a YAML document is parsed.
"""

import itertools
import json
import math
import os
import re

from xzatoma_store import json_type


# ---- Plans ----

class PlanError(ValueError):
    """A plan that cannot be used: says the source, the line where known, and what is wrong."""

    def __init__(self, source, message, line=None):
        self.source, self.line = source, line
        where = source + (":%d" % line if line else "")
        super().__init__("%s: %s" % (where, message))


class Plan:
    def __init__(self, goal, context=None, instructions=(), name=None, version=None, action=None):
        self.goal = goal
        self.context = context
        self.instructions = list(instructions)
        self.name = name
        self.version = version  #: text, from the name/description/version/action/steps format
        self.action = action  #: text, ditto; the watcher filters on name, action and version

    def context_lines(self):
        if not (ctx := self.context):
            return []
        if isinstance(ctx, dict):
            return ["- %s: %s" % (_label(k), _scalar(v)) for k, v in ctx.items()]
        if isinstance(ctx, list):
            return ["- %s" % _scalar(v) for v in ctx]
        return [str(ctx).strip()]

    def to_prompt(self):
        """The prompt exactly as the seed's 'Plan to Prompt Translation' shows it."""
        parts = ["You are assisting with the following task:", "", "GOAL: %s" % self.goal, ""]
        if ctx := self.context_lines():
            parts += ["CONTEXT:"] + ctx + [""]
        parts.append("INSTRUCTIONS (follow as guidance):")
        parts += ["%d. %s" % (i, step) for i, step in enumerate(self.instructions, 1)]
        parts += ["", "Use the available tools to accomplish this goal. You may adapt your approach "
                      "as needed, but try to follow the instructions provided."]
        return "\n".join(parts)

    def describe(self):
        lines = []
        if self.name:
            lines.append("NAME: %s" % self.name + (" %s" % self.version if self.version else ""))
        if self.action:
            lines.append("ACTION: %s" % self.action)
        lines.append("GOAL: %s" % self.goal)
        if ctx := self.context_lines():
            lines += ["CONTEXT:"] + ctx
        lines.append("INSTRUCTIONS:")
        lines += ["%d. %s" % (i, s) for i, s in enumerate(self.instructions, 1)]
        return "\n".join(lines)


def _label(key):
    text = str(key).replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def _scalar(value):
    value = json_ready(value)  # as publish writes it, so a plan reads the same run here or sent to a watcher (16d)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def json_ready(value):
    """A plan's data as JSON can carry it: YAML's dates and times as ISO 8601 text, its sets as lists, its binary
    as the base64 it was written in, and numbers JSON has no form for (NaN, Infinity) as YAML spells them. `run
    --plan` reads these plans; publish failed on them, blaming the broker, and sent NaN (attack round 16a), and a
    nested one failed the prompt (round 16c)."""
    import base64
    import datetime
    if isinstance(value, dict):
        ready = {_json_key(k): json_ready(v) for k, v in value.items()}
        if len(ready) < len(value):  # JSON has no other keys than text: `1` and '1' would be one key, the last
            seen = {}                # one's value silently kept (round 16d)
            for key in value:
                if (other := seen.setdefault(_json_key(key), key)) is not key:
                    raise DocumentError("two keys of one mapping, %s and %s, are one key in JSON: rename one"
                                        % (_key_repr(other), _key_repr(key)))
        return ready
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_ready(v) for v in (sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value)]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if value != value else (".inf" if value > 0 else "-.inf")
    return value


def _json_key(key):
    """A mapping's key as JSON writes it (YAML allows any scalar): always text."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return json.dumps(key)
    return str(json_ready(key))


def _key_repr(key):
    return "'%s'" % key if isinstance(key, str) else _json_key(key)


def detect_plan_format(text, filename=None):
    ext = os.path.splitext(filename or "")[1].lower()
    if ext in (".json",):
        return "json"
    if ext in (".yaml", ".yml"):
        return "yaml"
    if ext in (".md", ".markdown"):
        return "markdown"
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        return "json"
    if stripped.startswith("#") and re.search(r"^#{1,6}\s", stripped, re.M):
        return "markdown"
    return "yaml"


def parse_plan(text, source="<plan>", fmt=None):
    """Parse plan text into a Plan, or raise PlanError naming the source and line."""
    fmt = fmt or detect_plan_format(text, source)
    if not text.strip():
        raise PlanError(source, "the plan is empty")
    if fmt == "markdown":
        return _parse_markdown_plan(text, source)
    try:
        data = load_json(text) if fmt == "json" else load_yaml(text)
    except DocumentError as exc:
        raise PlanError(source, str(exc), exc.line)
    return _plan_from_mapping(data, source, text, fmt)


# Plans and the events that carry them come from other people (a Kafka topic, a repository): parsing one is
# bounded in depth, in values and, for YAML, in what its aliases expand to. A 300-byte YAML of nested aliases
# is a billion strings once written out (issue 22: 47 s and a 684 MB database), and `[` x 1500 raised
# RecursionError, which nothing expected. Limits are checked on the parsed shape, so any document that
# passes is one the rest of the program can walk, dump and store.
MAX_PLAN_STEPS = 1000  #: instructions in one plan: the model reads them all in its first request
MAX_DOCUMENT_DEPTH = 64  #: nesting of lists and mappings (events and plans use under 15)
MAX_DOCUMENT_VALUES = 100000  #: values in a document, every alias counted as what it expands to
ALIAS_ALLOWANCE = 1 << 20  #: bytes of text aliases may add beyond the document's own length


class DocumentError(ValueError):
    """A document that is not valid, or over the limits: the message says which; `line` when known;
    `over_limit` when it is valid but too deep or too big (another parser would not do better)."""

    def __init__(self, message, line=None, over_limit=False):
        super().__init__(message)
        self.line, self.over_limit = line, over_limit


def load_json(text, max_depth=MAX_DOCUMENT_DEPTH, max_values=MAX_DOCUMENT_VALUES):
    """json.loads, bounded: DocumentError for invalid JSON, too deep, too many values (never another error)."""
    if text.count(",") + text.count("[") + text.count("{") >= max_values and _json_values(text) > max_values:
        # not over_limit: the count is exact for valid JSON only, and YAML (a plan whose first key is quoted)
        # may read the text (round 17d); a parser of either stops a document this large on its own count
        raise DocumentError("more than %d values" % max_values)
    try:
        data = json.loads(text)
    except RecursionError:
        raise DocumentError("invalid JSON: nested deeper than %d levels" % max_depth, over_limit=True)
    except ValueError as exc:  # JSONDecodeError, or an integer of more digits than Python converts
        raise DocumentError("invalid JSON: %s" % (getattr(exc, "msg", None) or exc),
                            getattr(exc, "lineno", None))
    _check_values(data, max_depth, max_values)
    if _SURROGATE_ESCAPE.search(text):  # JSON may name half a character (\ud800), which nothing can store or
        try:                            # send: each becomes '?'
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            data = json.loads(json.dumps(data, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8"))
    return data


_SURROGATE_ESCAPE = re.compile(r"\\[uU][dD][89a-fA-F]")

# INFO: json.loads builds the whole document before its values can be counted: 8 MB of `[{}, {}, ...]` took 1.3 s
# and 450 MB only to be refused. Counted on the text first (C-speed passes that build no object), a document of
# valid JSON has exactly 1 + its commas + its non-empty lists and mappings values: a comma outside strings
# separates two of a container's elements, and a non-empty container holds one more element than its commas.
# Strings are found once their escaped backslashes and quotes are gone, by one character class: a pattern that
# stepped over escapes was quadratic on `"\",\",...` (300 KB took 284 s) and kept a backtracking entry for each
# escape (8 MB of them, 307 MB), round 17d; a quote left open now fails once, with no quote after it.
_JSON_STRING = re.compile(r'"[^"]*"')
_JSON_SPACE = dict.fromkeys(map(ord, " \t\n\r"))  #: str.translate's table that deletes JSON's whitespace


def _json_values(text):
    """How many values json.loads would build from this text, were it valid JSON."""
    bare = _JSON_STRING.sub("0", text.replace("\\\\", "").replace('\\"', "")).translate(_JSON_SPACE)
    return 1 + bare.count(",") + bare.count("[") + bare.count("{") - bare.count("[]") - bare.count("{}")


def has_surrogate_escape(text):
    """Whether JSON text may name half a character (load_json mends each to '?')."""
    return bool(_SURROGATE_ESCAPE.search(text))


def _check_values(data, max_depth, max_values):
    """Depth and value count of parsed JSON, without recursion (a JSON document is a tree)."""
    count, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > max_values:
            raise DocumentError("more than %d values" % max_values, over_limit=True)
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise DocumentError("nested deeper than %d levels" % max_depth, over_limit=True)
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))


def load_yaml(text, max_depth=MAX_DOCUMENT_DEPTH, max_values=MAX_DOCUMENT_VALUES, allowance=ALIAS_ALLOWANCE):
    """yaml.safe_load, bounded: its parser events are counted before a node is made, and the node graph is
    measured before anything is built from it, counting each alias as the whole of what it names.
    DocumentError for invalid YAML or a document over the limits."""
    try:
        import yaml
    except ImportError:
        raise DocumentError("YAML needs the Python package 'pyyaml' (pip install pyyaml)")
    try:
        _check_events(yaml, text, max_values)
        loader = _bounded_loader(yaml)(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_nodes(yaml, node, max_depth, max_values, len(text) + allowance)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except DocumentError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise DocumentError("invalid YAML: %s" % problem, mark.line + 1 if mark else None)
    except RecursionError:
        raise DocumentError("invalid YAML: nested deeper than %d levels" % max_depth, over_limit=True)
    except Exception as exc:  # a constructor's ValueError (an integer of 5000 digits), or what was not foreseen
        raise DocumentError("invalid YAML: %s" % (str(exc).splitlines() or [type(exc).__name__])[0][:200])


_LOADERS = {}


def _bounded_loader(yaml):
    """libyaml's safe loader (it stops at 1000 levels itself), else the Python one with a depth guard: its
    composer recurses, and a deep document would only stop at the interpreter's recursion limit. Either builds
    base-60 numbers of at most MAX_BASE60_CHARS characters."""
    if "loader" not in _LOADERS:
        loader = getattr(yaml, "CSafeLoader", None)
        if loader is not None:
            loader = type("BoundedCSafeLoader", (loader,), {})  # its own constructors, not the shared class's
        else:
            class BoundedSafeLoader(yaml.SafeLoader):
                depth = 0

                def compose_node(self, parent, index):
                    self.depth += 1
                    try:
                        if self.depth > MAX_DOCUMENT_DEPTH:
                            raise DocumentError("nested deeper than %d levels" % MAX_DOCUMENT_DEPTH,
                                                over_limit=True)
                        return super().compose_node(parent, index)
                    finally:
                        self.depth -= 1
            loader = BoundedSafeLoader
        for tag, build in (("int", yaml.constructor.SafeConstructor.construct_yaml_int),
                           ("float", yaml.constructor.SafeConstructor.construct_yaml_float)):
            loader.add_constructor("tag:yaml.org,2002:" + tag, _bounded_number(build))
        loader.construct_mapping = _unique_keys(yaml.constructor.SafeConstructor.construct_mapping)
        _LOADERS["loader"] = loader
    return _LOADERS["loader"]


def _unique_keys(construct_mapping):
    """A mapping whose keys are one key once built (`a:` twice, `true:` and `1:`, `null:` and `~:`, `0x10:` and
    `16:`) is refused, naming both: PyYAML keeps the last value under the first spelling, silently, and a plan
    lost an instruction or a value of its context (round 17d). Keys merged in with `<<:` may be overridden."""
    def construct(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # a list as a key: PyYAML's own error says so
                continue
            if first is not key_node:
                raise DocumentError("two keys of one mapping, %s and %s, are one key: rename one"
                                    % (_spelled(first), _spelled(key_node)), key_node.start_mark.line + 1)
        return construct_mapping(self, node, deep)
    return construct


def _spelled(node):
    text = getattr(node, "value", "")
    return repr(text[:40]) if isinstance(text, str) else "a mapping"


MAX_BASE60_CHARS = 1000  #: of a YAML 1.1 base-60 number (`1:1:1:…`), a product per part: 600 KB of it held a
#: watcher's consumer loop 38 s, 8 MB for hours (attack round 15c). Decimal ones stop at Python's 4,300 digits.
#: INFO: an integer written in hex, octal or binary (`0x` and 5,000 f's) is built whatever its size, and could then
#: not be written in decimal (the prompt, JSON): it killed the watcher (round 16b). Any base: 4,300 digits at most.
MAX_INT_BITS = 14284  # 10**4300 < 2**14285


def _bounded_number(build):
    def construct(loader, node):
        if ":" in node.value and len(node.value) > MAX_BASE60_CHARS:
            raise DocumentError("a base-60 number (x:y:z) of %d characters, over the limit of %d; quote it to keep "
                                "it as text" % (len(node.value), MAX_BASE60_CHARS),
                                node.start_mark.line + 1, over_limit=True)
        value = build(loader, node)
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise DocumentError("a number of more than 4,300 digits; quote it to keep it as text",
                                node.start_mark.line + 1, over_limit=True)
        return value
    return construct


def _check_events(yaml, text, max_values):
    """The document's parser events counted before a node is built. A value is one event, a mapping or sequence
    two, so a document within max_values has at most 2 * max_values + 4 (its stream and document marks); the
    aliases are measured after, on the nodes (_check_nodes). libyaml composes a whole document in C before any
    check can see it: 8 MB of `{a, a, a, …}` made 8 million nodes, 4 GB and 70 s of one message (attack round 15)."""
    loader = _bounded_loader(yaml)(text)
    try:
        limit, count = 2 * max_values + 4, 0
        while loader.check_event():
            loader.get_event()
            count += 1
            if count > limit:
                raise DocumentError("more than %d values" % max_values, over_limit=True)
    finally:
        loader.dispose()


def _check_nodes(yaml, root, max_depth, max_values, max_bytes):
    """Depth, values and scalar bytes of a composed YAML graph as if its aliases were written out; a node
    an alias reaches twice is measured once (memo), a node that contains itself is refused."""
    sizes = {}  # id(node) -> (values, bytes, depth) once measured
    on_path = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            values, size, depth = 1, 0, 1
            for child in _children(yaml, node):
                v, b, d = sizes[id(child)]
                values, size, depth = values + v, size + b, max(depth, d + 1)
            if values > max_values:
                raise DocumentError("more than %d values once its aliases are expanded" % max_values,
                                    over_limit=True)
            if size > max_bytes:
                raise DocumentError("its aliases expand to more than %d bytes" % max_bytes, over_limit=True)
            if depth > max_depth:
                raise DocumentError("nested deeper than %d levels" % max_depth, over_limit=True)
            sizes[key] = (values, size, depth)
            continue
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = (1, len(node.value), 0)
            continue
        if key in on_path:
            raise DocumentError("an alias refers to a node that contains it", over_limit=True)
        on_path.add(key)
        stack.append((node, True))
        for child in _children(yaml, node):
            if id(child) in on_path:
                raise DocumentError("an alias refers to a node that contains it", over_limit=True)
            if id(child) not in sizes:
                stack.append((child, False))


def _children(yaml, node):
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return ()


def _key_line(text, fmt, key, index=None):
    """The line a top-level key is written on, or with `index` the line of that step of its list, or None: from
    the parser's own marks (YAML's nodes, JSON's positions), so a `goal:` nested under `context:` is not the
    plan's goal, and an empty step 4 is named at its own line, not its list's (round 18c)."""
    try:
        if fmt == "yaml":
            return _yaml_key_line(text, key, index)
        return _json_key_line(text, key, index)
    except Exception:  # a line is a help; never a second error in place of the plan's
        return None


def _yaml_key_line(text, key, index):
    import yaml
    loader = _bounded_loader(yaml)(text)
    try:
        root = loader.get_single_node()
    finally:
        loader.dispose()
    if not isinstance(root, yaml.MappingNode):
        return None
    found = None
    for key_node, value_node in root.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            found = (key_node, value_node)
    if found is None:
        return None
    key_node, value_node = found
    if index is not None and isinstance(value_node, yaml.SequenceNode) and 0 < index <= len(value_node.value):
        return value_node.value[index - 1].start_mark.line + 1
    return key_node.start_mark.line + 1


_JSON_WS = re.compile(r"[ \t\n\r]*")


def _json_key_line(text, key, index):
    """Walks the top-level object with json's own decoder, counting lines only up to what it looks for."""
    decode = json.JSONDecoder().raw_decode
    pos = _JSON_WS.match(text, 1 if text[:1] == "\ufeff" else 0).end()
    if text[pos:pos + 1] != "{":
        return None
    found = None
    pos = _JSON_WS.match(text, pos + 1).end()
    while text[pos:pos + 1] == '"':
        name, end = decode(text, pos)
        start = _JSON_WS.match(text, _JSON_WS.match(text, end).end() + 1).end()  # past the ':'
        _, after = decode(text, start)
        if name == key:
            found = (pos, start)
        pos = _JSON_WS.match(text, after).end()
        pos = _JSON_WS.match(text, pos + 1).end() if text[pos:pos + 1] == "," else pos
    if found is None:
        return None
    at, start = found
    if index is not None and text[start:start + 1] == "[":
        item = _JSON_WS.match(text, start + 1).end()
        for _ in range(index - 1):
            _, item = decode(text, item)
            item = _JSON_WS.match(text, item).end()
            item = _JSON_WS.match(text, item + 1).end()  # past the ','
        at = item
    return text.count("\n", 0, at) + 1


def plan_from_data(data, source="<plan>"):
    """A Plan from already-parsed data (an event's payload): same rules as a plan file."""
    try:
        text = json.dumps(data, indent=1, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = ""
    return _plan_from_mapping(data, source, text, "json")


def looks_like_plan(data):
    """True for a mapping in either plan format (used to find a plan inside an event)."""
    if not isinstance(data, dict):
        return False
    if "goal" in data:
        return True
    return any(k in data for k in ("steps", "tasks", "instructions")) and \
        any(isinstance(data.get(k), str) for k in ("name", "description", "action"))


def _text_field(data, key, source, text, fmt):
    if (value := data.get(key)) is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PlanError(source, "'%s' must be text, got %s" % (key, json_type(value)),
                         _key_line(text, fmt, key))
    return str(value).strip() or None


def _step_text(step):
    """One instruction from a step: text, or {name, action, context} (steps format), or another mapping."""
    if not isinstance(step, dict):
        return step
    head = None
    if isinstance(step.get("action"), str) and isinstance(step.get("name"), str):
        head = "%s: %s" % (step["name"].strip(), step["action"].strip())
    else:
        for field in ("instruction", "description", "task", "action", "name", "step"):
            if isinstance(step.get(field), str):
                head = step[field]
                break
    if head is None:
        return ", ".join("%s: %s" % (k, _scalar(v)) for k, v in step.items())
    ctx = step.get("context")
    if ctx not in (None, "", {}, []):
        if isinstance(ctx, dict):
            ctx = ", ".join("%s: %s" % (k, _scalar(v)) for k, v in ctx.items())
        head = "%s (context: %s)" % (head, _scalar(ctx))
    return head


def _plan_from_mapping(data, source, text, fmt):
    if not isinstance(data, dict):
        raise PlanError(source, "a plan must be a mapping with 'goal' and 'instructions', got %s"
                        % json_type(data))
    try:
        json_ready(data)  # as publish sends it and the prompt writes it
    except DocumentError as exc:
        raise PlanError(source, str(exc))
    known = {"goal", "context", "instructions", "steps", "tasks", "name", "title", "description", "version",
             "action"}
    name = _text_field(data, "name", source, text, fmt) or _text_field(data, "title", source, text, fmt)
    version = _text_field(data, "version", source, text, fmt)
    action = _text_field(data, "action", source, text, fmt)
    goal = data.get("goal")
    if goal is None and any(k in data for k in ("steps", "tasks")):
        # the name/description/version/action/steps format: the description (else the action, else the
        # name) is the goal
        if (goal := _text_field(data, "description", source, text, fmt) or action or name) is None:
            raise PlanError(source, "missing 'description' (or 'goal'): what the agent should achieve")
    if goal is None or (isinstance(goal, str) and not goal.strip()):
        raise PlanError(source, "missing required key 'goal' (what the agent should achieve)")
    if not isinstance(goal, str):
        raise PlanError(source, "'goal' must be text, got %s" % json_type(goal), _key_line(text, fmt, "goal"))
    key = next((k for k in ("instructions", "steps", "tasks") if k in data), "instructions")
    if (steps := data.get(key)) is None:
        raise PlanError(source, "missing required key 'instructions' (a list of steps)")
    if isinstance(steps, str):
        steps = [s for s in (line.strip(" -\t") for line in steps.splitlines()) if s]
    if not isinstance(steps, list) or not steps:
        raise PlanError(source, "'%s' must be a non-empty list of steps" % key, _key_line(text, fmt, key))
    if len(steps) > MAX_PLAN_STEPS:
        raise PlanError(source, _too_many_steps(len(steps)), _key_line(text, fmt, key))
    instructions = []
    for i, step in enumerate(steps, 1):
        step = _step_text(step)
        if isinstance(step, bool) or not isinstance(step, (str, int, float)) or not str(step).strip():
            raise PlanError(source, "step %d of '%s' is empty or not text" % (i, key),
                             _key_line(text, fmt, key, i))
        instructions.append(str(step).strip())
    context = data.get("context")
    if context is not None and not isinstance(context, (dict, list, str, int, float)):
        raise PlanError(source, "'context' must be a mapping, list or text", _key_line(text, fmt, "context"))
    unknown = sorted(set(data) - known)
    plan = Plan(goal.strip(), context, instructions, name, version, action)
    plan.unknown_keys = unknown
    return plan


def _too_many_steps(count=None):
    """A plan of more than MAX_PLAN_STEPS: its whole list is the model's first request (1.6 million Markdown
    items made one of 18 MB, and a conversation of as much in the store: attack round 15a)."""
    if count:
        return "{:,} steps, more than {:,}: split the plan into smaller ones".format(count, MAX_PLAN_STEPS)
    return "more than {:,} steps: split the plan into smaller ones".format(MAX_PLAN_STEPS)


def _md_heading(line):
    """(level, text) of an ATX heading ('## Steps', '## Steps ##'), or None. A scan, not the regex
    `^(#{1,6})\\s+(.*?)\\s*#*\\s*$`, which backtracked in cubic time: a 3 KB heading of blanks held the
    interpreter (every thread of a watcher) for seconds, 4 KB for minutes. As CommonMark, a closing run of '#'
    counts only after a blank ('C#' is a name)."""
    level = len(line) - len(line.lstrip("#"))
    if not 1 <= level <= 6 or not line[level:level + 1].isspace():
        return None
    text = line[level:].strip()
    closed = text.rstrip("#")
    if closed != text and (not closed or closed[-1].isspace()):
        text = closed.rstrip()
    return level, text
_MD_MARKER = re.compile(r"\s*(?:[-*+]|\d+[.)])(?=\s)")


def _md_item(line):
    """The text of a list item ('- x', '1. x', '- [ ] x'), or None: what the regex `\\s+(\\[[ xX]\\]\\s+)?(.*\\S)\\s*$`
    after the marker meant, without its backtracking (a '-' and 100,000 spaces took 28 seconds)."""
    if not (m := _MD_MARKER.match(line)):
        return None
    rest = line[m.end():].strip()
    if rest[:1] == "[" and rest[2:3] == "]" and rest[1:2] in " xX" and rest[3:4].isspace():
        return rest[3:].lstrip()  # a checkbox followed by text (alone, it is the text)
    return rest or None


def _parse_markdown_plan(text, source):
    title, sections, current = None, {}, None
    for lineno, line in enumerate(text.splitlines(), 1):
        if heading := _md_heading(line):
            level, name = heading
            if level == 1 and title is None:
                title = re.sub(r"^(task|plan)\s*:\s*", "", name, flags=re.I)
                current = None
                continue
            current = name.lower().rstrip(":")
            sections[current] = {"line": lineno, "lines": []}
            continue
        if current is not None:
            sections[current]["lines"].append(line)

    def find(*names):
        for key, value in sections.items():
            if any(key == n or key.startswith(n + " ") for n in names):
                return value
        return None

    goal_sec = find("goal", "objective")
    goal = " ".join(l.strip() for l in goal_sec["lines"] if l.strip()) if goal_sec else (title or "")
    if not goal:
        raise PlanError(source, "no goal found (add a '## Goal' section or a '# Task: …' title)")
    if (steps_sec := find("steps", "instructions", "tasks", "plan")) is None:
        raise PlanError(source, "no instructions found (expected a '## Steps' or '## Instructions' "
                                "section with a list)")
    steps = list(itertools.islice(filter(None, map(_md_item, steps_sec["lines"])), MAX_PLAN_STEPS + 1))
    if not steps:
        raise PlanError(source, "the instructions section has no list items", steps_sec["line"])
    if len(steps) > MAX_PLAN_STEPS:
        raise PlanError(source, _too_many_steps(), steps_sec["line"])
    ctx_sec = find("context", "background")
    context = None
    if ctx_sec:
        items = [item for item in map(_md_item, ctx_sec["lines"]) if item]
        prose = " ".join(l.strip() for l in ctx_sec["lines"] if l.strip())
        context = items if items else (prose or None)
    plan = Plan(goal, context, steps, title)
    plan.unknown_keys = []
    return plan
