"""XZatoma tools: what the model can do, and the rules that keep it safe.

Read top to bottom: results, the registry, the working-directory jail, the
file and search tools, and plan parsing (shared by the `plan` tool and
`xzatoma run --plan`). Only the standard library is imported at module level;
`yaml` is imported where a YAML plan is parsed.
"""

import difflib
import fnmatch
import json
import os
import re
import stat
import time

# ---- Tool results ----

ERROR_PREFIX = "Error: "


class ToolResult:
    """What a tool returns: the model sees `to_message()`, people see `preview()`."""

    __slots__ = ("success", "output", "error", "truncated", "metadata")

    def __init__(self, success, output="", error=None, truncated=False, metadata=None):
        self.success = success
        self.output = output
        self.error = error
        self.truncated = truncated
        self.metadata = metadata or {}

    @classmethod
    def ok(cls, output, **metadata):
        return cls(True, output, metadata=metadata)

    @classmethod
    def fail(cls, error, **metadata):
        return cls(False, "", error=error, metadata=metadata)

    def truncate(self, max_bytes):
        """Cap the output at max_bytes (UTF-8), keeping the head and saying so."""
        data = self.output.encode("utf-8", "surrogateescape")
        if max_bytes is None or len(data) <= max_bytes:
            return self
        self.output = data[:max_bytes].decode("utf-8", "ignore")
        self.truncated = True
        self.metadata["original_size"] = len(data)
        return self

    def to_message(self):
        if not self.success:
            return ERROR_PREFIX + (self.error or "unknown error")
        if self.truncated:
            return "%s\n\n[Note: output truncated at %d of %d bytes]" % (
                self.output, len(self.output.encode("utf-8", "ignore")),
                self.metadata.get("original_size", 0))
        return self.output

    def preview(self, width=100):
        text = self.to_message().strip()
        first = text.splitlines()[0] if text else "(no output)"
        lines = text.count("\n") + 1 if text else 0
        if lines > 1:
            first += "  (+%d lines)" % (lines - 1)
        return first if len(first) <= width else first[: width - 1] + "…"


class ToolError(Exception):
    """Raised inside a tool for a failure the model should see as `Error: …`."""


# ---- Tool and registry ----

READ, WRITE, EXECUTE = "read", "write", "execute"
PLANNING, WRITE_MODE = "planning", "write"


class ToolContext:
    """What a tool run may touch: the jail root, limits, the confirm callback and the undo log.

    `confirm(tool_name, args, detail, always=False) -> bool` is given by chat in Safe mode (None in
    `run` and YOLO: nothing is asked); always=True asks even in YOLO (an irreversible change).
    `store` and `conversation_id` let file tools save what they overwrite, so `xzatoma undo` can
    put it back.
    """

    def __init__(self, working_dir, tools_config=None, confirm=None, mode=WRITE_MODE, store=None,
                 conversation_id=None, interactive=False):
        self.root = os.path.realpath(working_dir)
        self.config = tools_config or {}
        self.confirm = confirm
        self.mode = mode
        self.store = store
        self.conversation_id = conversation_id
        self.interactive = interactive  # a person can be asked (chat), even when confirm is None (YOLO)
        self.ask = None  # callable(tool_name, args, detail) -> bool for irreversible changes in chat
        self.call_id = None

    def limit(self, key, default):
        value = self.config.get(key)
        return default if value is None else value

    # -- undo log --
    def before_change(self, tool, real):
        """Save what is at `real` before a tool changes it. Returns a token for after_change."""
        if self.store is None:
            return None
        cap = self.limit("undo_max_bytes", 52428800)
        kind, blob, mode = snapshot(real, cap)
        record = self.store.record_undo(self.conversation_id, self.call_id, tool, real, kind, blob, mode)
        return record, real

    def record_move(self, source, destination):
        if self.store is None:
            return None
        record = self.store.record_undo(self.conversation_id, self.call_id, "move_path", source, "moved",
                                        destination.encode("utf-8", "surrogateescape"), None)
        return record, destination

    def after_change(self, token, expected=None):
        """Fingerprint the path after the change (or the state `expected` when undo reaches this record)."""
        if token is not None:
            record, real = token
            self.store.set_undo_after(record, expected or state_hash(real))

    def check_undo_cap(self, tool, real, args):
        """A change that could not be undone (over the size cap) asks in chat and is refused otherwise."""
        if self.store is None:
            return
        cap = self.limit("undo_max_bytes", 52428800)
        size = tree_size(real)
        if size <= cap:
            return
        detail = "%s is %s, over the undo cap of %s (agent.tools.undo_max_bytes): this cannot be undone" % (
            display_path(real, self.root), _fmt_size(size), _fmt_size(cap))
        if self.ask is not None and self.ask(tool, args, detail):
            self.store = None  # the person accepted a change without an undo record
            return
        raise ToolError(detail + ("; the user declined" if self.ask is not None else
                                  "; refused without a person to confirm it"))


class Tool:
    """A tool: name, JSON schema, permission level and run(args, ctx)."""

    name = ""
    description = ""
    parameters = {"type": "object", "properties": {}}
    permission = READ

    def run(self, args, ctx):  # pragma: no cover - interface
        raise NotImplementedError

    def definition(self):
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def confirmation(self, args, ctx):
        """What to show a person before this call in Safe mode, or None when it needs no confirmation."""
        return None

    def preview_args(self, args):
        return preview_arguments(args)


def preview_arguments(args):
    """A short argument summary for progress lines: the path, pattern, command or URL when there is one."""
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            return args[:80]
    if not isinstance(args, dict):
        return json.dumps(args, ensure_ascii=False)[:80]
    for key in ("path", "glob", "pattern", "command", "url", "source_path", "label"):
        if isinstance(args.get(key), str):
            return args[key]
    return json.dumps(args, ensure_ascii=False)[:80]


def _schema_error(name, prop, schema, value):
    """Check one argument against its schema; coerce forgiving cases. Returns (value, error)."""
    expected = schema.get("type")
    if expected == "integer":
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            return value, "parameter '%s' must be an integer, got %s" % (prop, _json_type(value))
        if "minimum" in schema and value < schema["minimum"]:
            return value, "parameter '%s' must be at least %s" % (prop, schema["minimum"])
    elif expected == "boolean":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            return value, "parameter '%s' must be true or false, got %s" % (prop, _json_type(value))
    elif expected == "string":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            return value, "parameter '%s' must be a string, got %s" % (prop, _json_type(value))
    elif expected == "array":
        if not isinstance(value, list):
            return value, "parameter '%s' must be an array, got %s" % (prop, _json_type(value))
    elif expected == "object":
        if not isinstance(value, dict):
            return value, "parameter '%s' must be an object, got %s" % (prop, _json_type(value))
    if "enum" in schema and value not in schema["enum"]:
        return value, "parameter '%s' must be one of %s" % (
            prop, ", ".join(json.dumps(v) for v in schema["enum"]))
    return value, None


def _json_type(value):
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def validate_arguments(tool, raw):
    """Parse and validate raw tool arguments. Returns (args, error_message)."""
    if raw is None or raw == "":
        args = {}
    elif isinstance(raw, dict):
        args = dict(raw)
    else:
        try:
            args = json.loads(raw)
        except ValueError as exc:
            return None, "invalid JSON in arguments for %s: %s" % (tool.name, exc)
        if not isinstance(args, dict):
            return None, "arguments for %s must be a JSON object, got %s" % (tool.name, _json_type(args))
    props = tool.parameters.get("properties", {})
    missing = [p for p in tool.parameters.get("required", []) if args.get(p) is None]
    if missing:
        return None, "missing required parameter%s for %s: %s" % (
            "s" if len(missing) > 1 else "", tool.name, ", ".join(missing))
    for prop, schema in props.items():
        if prop in args and args[prop] is not None:
            args[prop], err = _schema_error(tool.name, prop, schema, args[prop])
            if err:
                return None, err
    return args, None


class Registry:
    """The tools offered to the model in one mode. `execute` never raises."""

    def __init__(self, tools, ctx, all_names=()):
        self.tools = {t.name: t for t in tools}
        self.ctx = ctx
        self.all_names = set(all_names) | set(self.tools)

    def __contains__(self, name):
        return name in self.tools

    def __len__(self):
        return len(self.tools)

    def names(self):
        return list(self.tools)

    def definitions(self):
        return [t.definition() for t in self.tools.values()]

    def get(self, name):
        return self.tools.get(name)

    def check_call(self, name, raw_args):
        """Validate a call without running it. Returns (tool, args, error)."""
        tool = self.tools.get(name)
        if tool is None:
            if name in self.all_names:
                return None, None, "tool %s is not available in %s mode" % (name, self.ctx.mode)
            return None, None, "unknown tool %r; available tools: %s" % (name, ", ".join(sorted(self.tools)))
        args, err = validate_arguments(tool, raw_args)
        return tool, args, err

    def execute(self, name, raw_args, call_id=None):
        """Run one tool call; every failure becomes an error result."""
        tool, args, err = self.check_call(name, raw_args)
        if err:
            return ToolResult.fail(err, invalid=True)
        started = time.monotonic()
        self.ctx.call_id = call_id
        try:
            if self.ctx.confirm is not None:
                detail = tool.confirmation(args, self.ctx)
                if detail is not None and not self.ctx.confirm(name, args, detail):
                    return ToolResult.fail("the user declined %s %s" % (name, tool.preview_args(args)),
                                           declined=True)
            result = tool.run(args, self.ctx)
        except ToolError as exc:
            result = ToolResult.fail(str(exc))
        except (OSError, ValueError, UnicodeError) as exc:
            result = ToolResult.fail(_describe_os_error(exc, self.ctx))
        except Exception as exc:  # a bug in a tool must not end the run
            result = ToolResult.fail("%s failed unexpectedly: %s: %s" % (name, type(exc).__name__, exc))
        result.metadata.setdefault("duration_seconds", round(time.monotonic() - started, 3))
        return result.truncate(self.ctx.limit("max_output_size", 1048576))


def _describe_os_error(exc, ctx):
    if isinstance(exc, OSError) and exc.filename:
        shown = display_path(exc.filename, ctx.root) if isinstance(exc.filename, str) else exc.filename
        reason = exc.strerror or str(exc)
        return "%s: %s" % (reason.lower() if reason else "error", shown)
    return str(exc)


# ---- The working-directory jail ----

class JailError(ToolError):
    pass


def resolve_path(path, root, must_exist=False):
    """Resolve `path` against the jail `root`; refuse anything that lands outside.

    Symlinks are resolved (also dangling and chained ones); names are taken
    literally. Returns the absolute real path.
    """
    if not isinstance(path, str):
        raise JailError("path must be a string")
    if "\x00" in path:
        raise JailError("path contains a NUL byte: %r" % path)
    if path.strip() == "":
        path = "."
    if path.startswith("~"):
        raise JailError("path outside working directory: %s (home paths are not allowed)" % path)
    joined = os.path.join(root, path)
    real = os.path.realpath(joined)
    if not _inside(real, root):
        raise JailError("path outside working directory: %s" % path)
    if must_exist and not os.path.lexists(real):
        raise ToolError("no such file or directory: %s%s" % (path, _suggest(path, root)))
    return real


def path_verdict(path, root):
    """('inside'|'outside', reason) for `xzatoma policy path` and mentions."""
    try:
        real = resolve_path(path, root)
    except ToolError as exc:
        return "outside", str(exc)
    return "inside", "resolves to %s" % (display_path(real, root))


def _inside(real, root):
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def display_path(real, root):
    """Paths shown to people and the model are relative to the working directory."""
    if real == root:
        return "."
    rel = os.path.relpath(real, root)
    return rel if not rel.startswith("..") else real


def _suggest(path, root):
    """A near miss for a missing path: ' (did you mean src/app.py?)'."""
    parent = os.path.dirname(path) or "."
    try:
        parent_real = resolve_path(parent, root)
        names = os.listdir(parent_real)
    except (OSError, ToolError):
        return ""
    close = difflib.get_close_matches(os.path.basename(path), names, n=1, cutoff=0.6)
    if close:
        return " (did you mean %s?)" % os.path.normpath(os.path.join(parent, close[0]))
    return ""


# ---- Shared file helpers ----

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", ".tox", ".mypy_cache", ".pytest_cache"}


def is_binary_file(path, sample=8192):
    with open(path, "rb") as fh:
        head = fh.read(sample)
    return b"\x00" in head


def _brace_expand(pattern):
    """'src/**/*.{rs,toml}' -> ['src/**/*.rs', 'src/**/*.toml']."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out.extend(_brace_expand(pattern[: m.start()] + alt + pattern[m.end():]))
    return out


_GLOB_CACHE = {}


def glob_regex(pattern):
    """Compile a glob with ** (any depth), * and ? (one segment) and {a,b} braces."""
    cached = _GLOB_CACHE.get(pattern)
    if cached is not None:
        return cached
    parts = []
    for alt in _brace_expand(pattern):
        i, out = 0, ""
        while i < len(alt):
            c = alt[i]
            if alt.startswith("**/", i):
                out += "(?:.*/)?"
                i += 3
            elif alt.startswith("**", i):
                out += ".*"
                i += 2
            elif c == "*":
                out += "[^/]*"
                i += 1
            elif c == "?":
                out += "[^/]"
                i += 1
            elif c == "[":
                j = alt.find("]", i + 1)
                if j == -1:
                    out += re.escape(c)
                    i += 1
                else:
                    out += "[" + alt[i + 1: j].replace("!", "^", 1) + "]"
                    i = j + 1
            else:
                out += re.escape(c)
                i += 1
        parts.append(out)
    compiled = re.compile("(?:%s)\\Z" % "|".join(parts))
    _GLOB_CACHE[pattern] = compiled
    return compiled


def glob_match(pattern, relpath):
    """Match a relative path; a pattern without '/' matches the basename anywhere."""
    if "/" not in pattern:
        return bool(glob_regex(pattern).match(relpath.rsplit("/", 1)[-1]))
    return bool(glob_regex(pattern).match(relpath))


class GitIgnore:
    """The common subset of .gitignore: globs, '/'-anchored, dir-only '/', and '!' negation."""

    def __init__(self, root):
        self.rules = []  # (base_rel, regex, negate, dir_only)
        self.root = root
        self._load("")

    def _load(self, rel_dir):
        path = os.path.join(self.root, rel_dir, ".gitignore")
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.strip("/") if dir_only else line
            anchored = "/" in line.lstrip("/") or line.startswith("/")
            line = line.lstrip("/")
            pattern = line if anchored else "**/" + line
            self.rules.append((rel_dir, glob_regex(pattern), negate, dir_only))

    def enter(self, rel_dir):
        """Read the .gitignore of a directory as the walk reaches it."""
        if rel_dir:
            self._load(rel_dir)

    def ignored(self, rel, is_dir):
        verdict = False
        for base, regex, negate, dir_only in self.rules:
            if dir_only and not is_dir:
                continue
            sub = rel
            if base:
                if not rel.startswith(base + "/"):
                    continue
                sub = rel[len(base) + 1:]
            if regex.match(sub):
                verdict = not negate
        return verdict


def walk_files(root, start, gitignore=True, include_dirs=False):
    """Yield (relpath, path, is_dir) under start in name order, skipping VCS dirs and ignored paths.

    Symlinks are not followed into directories, and a symlink whose target
    lies outside the jail is skipped. Relative paths are built by joining
    names (no per-entry path arithmetic: this walk is the hot loop of grep
    and find_path).
    """
    ignore = GitIgnore(root) if gitignore else None
    first = os.path.relpath(start, root).replace(os.sep, "/")
    stack = [(start, "" if first == "." else first + "/")]
    while stack:
        current, prefix = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            rel = prefix + entry.name
            is_dir = _is_dir(entry)
            if is_dir and entry.name in SKIP_DIRS:
                continue
            if ignore is not None and ignore.rules and ignore.ignored(rel, is_dir):
                continue
            if entry.is_symlink() and not _inside(os.path.realpath(entry.path), root):
                continue
            if is_dir:
                if ignore is not None:
                    ignore.enter(rel)
                subdirs.append((entry.path, rel + "/"))
                if include_dirs:
                    yield rel, entry.path, True
            else:
                yield rel, entry.path, False
        stack.extend(reversed(subdirs))


def _is_dir(entry):
    """DirEntry.is_dir without following symlinks (loops and dangling links are not errors)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _owner(st):
    try:
        import pwd
        return pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        return str(st.st_uid)


def _rfc3339(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _fmt_size(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


# ---- File tools ----

class ListDirectory(Tool):
    name = "list_directory"
    description = ("List the entries of a directory (type and size). Use recursive=true to walk "
                   "subdirectories (skips .git, honours .gitignore); pattern filters by glob "
                   "such as '*.py', '**/*.md' or 'src/**/*.{rs,toml}'.")
    parameters = {"type": "object", "properties": {
        "path": {"type": "string", "description": "Directory relative to the working directory", "default": "."},
        "recursive": {"type": "boolean", "default": False},
        "pattern": {"type": "string", "description": "Glob filter"},
    }}
    MAX_ENTRIES = 1000

    def run(self, args, ctx):
        path = args.get("path") or "."
        real = resolve_path(path, ctx.root, must_exist=True)
        if not os.path.isdir(real):
            raise ToolError("not a directory: %s" % path)
        pattern = args.get("pattern")
        lines, total = [], 0
        if args.get("recursive") or (pattern and ("/" in pattern or "**" in pattern)):
            entries = walk_files(ctx.root, real, include_dirs=True)
        else:
            entries = ((os.path.relpath(e.path, ctx.root).replace(os.sep, "/"), e.path, _is_dir(e))
                       for e in sorted(os.scandir(real), key=lambda e: e.name))
        base = display_path(real, ctx.root)
        for rel, full, is_dir in entries:
            sub = rel if base == "." else rel[len(base) + 1:] if rel.startswith(base + "/") else rel
            if pattern and not glob_match(pattern, sub):
                continue
            total += 1
            if len(lines) >= self.MAX_ENTRIES:
                continue
            if is_dir:
                lines.append("dir   %10s  %s/" % ("-", rel))
            else:
                try:
                    size = os.lstat(full).st_size
                except OSError:
                    size = 0
                kind = "link" if os.path.islink(full) else "file"
                lines.append("%-5s %10s  %s" % (kind, _fmt_size(size), rel))
        if not lines:
            return ToolResult.ok("(no entries%s in %s)" % (" matching %s" % pattern if pattern else "", base),
                                 count=0)
        if total > len(lines):
            lines.append("... %d more entries not shown (narrow with pattern or a subdirectory)" % (total - len(lines)))
        return ToolResult.ok("\n".join(lines), count=total)


class ReadFile(Tool):
    name = "read_file"
    description = ("Read a text file. Lines are 1-based; start_line and end_line (inclusive, "
                   "either optional) select a range. Large files return their head and the total line count.")
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"},
        "start_line": {"type": "integer", "minimum": 1},
        "end_line": {"type": "integer", "minimum": 1},
    }, "required": ["path"]}
    LINE_BUDGET = 2000

    def run(self, args, ctx):
        path = args["path"]
        real = resolve_path(path, ctx.root, must_exist=True)
        if os.path.isdir(real):
            raise ToolError("%s is a directory; use list_directory" % path)
        if is_binary_file(real):
            raise ToolError("%s is a binary file (%s); read_file only reads text" % (
                path, _fmt_size(os.path.getsize(real))))
        start = args.get("start_line") or 1
        end = args.get("end_line")
        if end is not None and end < start:
            raise ToolError("end_line (%d) is before start_line (%d)" % (end, start))
        max_bytes = ctx.limit("max_file_read_size", 10485760)
        budget = self.LINE_BUDGET if end is None else max(end - start + 1, 1)
        out, total, cut = self._scan(real, start, end, budget, max_bytes)
        if start > max(total, 1) and total:
            raise ToolError("start_line %d is past the end of %s (%d lines)" % (start, path, total))
        text = "".join(out)
        if cut:
            shown_end = start + len(out) - 1
            text += ("\n[Showing lines %d-%d of %d. Ask for more with start_line=%d (and end_line).]"
                     % (start, shown_end, total, shown_end + 1))
        return ToolResult.ok(text, lines=total, partial=cut)

    LONG_LINE = 65536

    def _scan(self, real, start, end, budget, max_bytes):
        """Stream the file in chunks: keep the wanted lines, count the rest; memory stays bounded."""
        out, used, number, cut = [], 0, 0, False
        carry, overlong = b"", False
        with open(real, "rb") as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                done = cut or (end is not None and number >= end)
                if done and not carry and not overlong:
                    number += chunk.count(b"\n")  # past the range: just count lines
                    continue
                if overlong:
                    nl = chunk.find(b"\n")
                    if nl == -1:
                        continue
                    chunk, overlong = chunk[nl:], False  # the newline ends the overlong line
                lines = (carry + chunk).split(b"\n")
                carry = lines.pop()
                if len(carry) > self.LONG_LINE:
                    carry, overlong = carry[: self.LONG_LINE] + b" ... [line truncated]", True
                for line in lines:
                    number += 1
                    if number < start or cut or (end is not None and number > end):
                        continue
                    text = line.decode("utf-8", "replace") + "\n"
                    if len(out) >= budget or used + len(text) > max_bytes:
                        cut = True
                        continue
                    out.append(text)
                    used += len(text)
        if carry:
            number += 1
            if number >= start and not cut and (end is None or number <= end):
                text = carry.decode("utf-8", "replace")
                if len(out) >= budget or used + len(text) > max_bytes:
                    cut = True
                else:
                    out.append(text)
        return out, number, cut


class WriteFile(Tool):
    name = "write_file"
    description = "Create or overwrite a text file with the given content; parent directories are created."
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}
    permission = WRITE

    def confirmation(self, args, ctx):
        real = resolve_path(args["path"], ctx.root)
        if not os.path.isfile(real):
            return None
        return "overwrite %s:\n%s" % (args["path"], text_diff(_read_text(real), args["content"],
                                                              display_path(real, ctx.root)) or "(same content)")

    def run(self, args, ctx):
        path = args["path"]
        real = resolve_path(path, ctx.root)
        if os.path.isdir(real):
            raise ToolError("%s is a directory" % path)
        existed = os.path.exists(real)
        data = args["content"].encode("utf-8")
        ctx.check_undo_cap(self.name, real, args)
        token = ctx.before_change(self.name, real)
        os.makedirs(os.path.dirname(real), exist_ok=True)
        write_atomic(real, data)
        ctx.after_change(token)
        return ToolResult.ok("%s %s (%d bytes)" % ("Overwrote" if existed else "Created",
                                                   display_path(real, ctx.root), len(data)),
                             bytes=len(data), created=not existed)


class EditFile(Tool):
    name = "edit_file"
    description = ("Replace old_text with new_text in a file. old_text must occur exactly once "
                   "unless replace_all is true. Returns a unified diff of the change.")
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False}},
        "required": ["path", "old_text", "new_text"]}
    permission = WRITE

    def confirmation(self, args, ctx):
        try:
            _, text, updated = self._apply(args, ctx)
        except ToolError:
            return None  # the call will fail with its own message; nothing to confirm
        return "edit %s:\n%s" % (args["path"], text_diff(text, updated, args["path"]))

    def _apply(self, args, ctx):
        path, old, new = args["path"], args["old_text"], args["new_text"]
        real = resolve_path(path, ctx.root, must_exist=True)
        if not old:
            raise ToolError("old_text must not be empty")
        if os.path.isdir(real):
            raise ToolError("%s is a directory" % path)
        with open(real, encoding="utf-8", newline="") as fh:
            text = fh.read()
        count = text.count(old)
        if count == 0:
            raise ToolError("old_text not found in %s; read the file and copy the text exactly" % path)
        if count > 1 and not args.get("replace_all"):
            lines, pos = [], text.find(old)
            while pos != -1 and len(lines) < 20:
                lines.append(str(text.count("\n", 0, pos) + 1))
                pos = text.find(old, pos + 1)
            raise ToolError("old_text occurs %d times in %s (lines %s); include more context or set replace_all"
                            % (count, path, ", ".join(lines)))
        return real, text, text.replace(old, new)

    def run(self, args, ctx):
        real, text, updated = self._apply(args, ctx)
        token = ctx.before_change(self.name, real)
        write_atomic(real, updated.encode("utf-8"))
        ctx.after_change(token)
        diff = text_diff(text, updated, display_path(real, ctx.root))
        return ToolResult.ok(diff or "(no change)", replacements=text.count(args["old_text"]))


class FindPath(Tool):
    name = "find_path"
    description = "Find paths matching a glob (e.g. '**/*.py'), sorted, paged with limit and offset."
    parameters = {"type": "object", "properties": {
        "glob": {"type": "string"}, "path": {"type": "string", "default": "."},
        "limit": {"type": "integer", "minimum": 1, "default": 50},
        "offset": {"type": "integer", "minimum": 0, "default": 0}}, "required": ["glob"]}

    def run(self, args, ctx):
        real = resolve_path(args.get("path") or ".", ctx.root, must_exist=True)
        pattern = args["glob"]
        base = display_path(real, ctx.root)
        found = []
        for rel, _, _ in walk_files(ctx.root, real, include_dirs=True):
            sub = rel if base == "." else rel[len(base) + 1:]
            if glob_match(pattern, sub):
                found.append(rel)
        found.sort()
        limit, offset = args.get("limit") or 50, args.get("offset") or 0
        page = found[offset: offset + limit]
        if not page:
            return ToolResult.ok("no paths match %s" % pattern if not found else
                                 "offset %d is past the %d matches" % (offset, len(found)), count=len(found))
        head = "showing %d-%d of %d" % (offset + 1, offset + len(page), len(found))
        return ToolResult.ok(head + "\n" + "\n".join(page), count=len(found))


class Grep(Tool):
    name = "grep"
    description = ("Search text files for a regular expression (or a literal with fixed_string). "
                   "Results are 'path:line: text'. include/exclude are globs on paths.")
    parameters = {"type": "object", "properties": {
        "pattern": {"type": "string"}, "path": {"type": "string", "default": "."},
        "include": {"type": "string"}, "exclude": {"type": "string"},
        "case_sensitive": {"type": "boolean", "default": True},
        "context_lines": {"type": "integer", "minimum": 0, "default": 0},
        "max_results": {"type": "integer", "minimum": 1, "default": 100},
        "fixed_string": {"type": "boolean", "default": False}}, "required": ["pattern"]}

    def run(self, args, ctx):
        real = resolve_path(args.get("path") or ".", ctx.root, must_exist=True)
        flags = 0 if args.get("case_sensitive", True) else re.IGNORECASE
        source = re.escape(args["pattern"]) if args.get("fixed_string") else args["pattern"]
        try:
            regex = re.compile(source, flags)
        except re.error as exc:
            raise ToolError("invalid regular expression %r: %s (set fixed_string=true for a literal)"
                            % (args["pattern"], exc))
        include, exclude = args.get("include"), args.get("exclude")
        ctx_lines = args.get("context_lines") or 0
        max_results = args.get("max_results") or 100
        files = [(display_path(real, ctx.root), real, False)] if os.path.isfile(real) else \
            walk_files(ctx.root, real)
        quick = _byte_prefilter(args["pattern"], args.get("fixed_string"), flags)
        out, hits, extra = [], 0, 0
        for rel, full, _ in files:
            if include and not glob_match(include, rel):
                continue
            if exclude and glob_match(exclude, rel):
                continue
            try:
                with open(full, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            if b"\x00" in data[:8192] or (quick is not None and not quick(data)):
                continue  # binary, or cannot contain a match
            text = data.decode("utf-8", "replace")
            if not regex.search(text):
                continue
            lines = None
            for m in regex.finditer(text):
                hits += 1
                if hits > max_results:
                    extra += 1
                    continue
                if lines is None:
                    lines = text.splitlines()
                    starts = _line_starts(text)
                i = _line_of(starts, m.start())
                if out and out[-1][0] == (rel, i):
                    hits -= 1  # several matches on one line count once
                    continue
                block = []
                for j in range(max(0, i - ctx_lines), i):
                    block.append("%s-%d- %s" % (rel, j + 1, lines[j]))
                block.append("%s:%d: %s" % (rel, i + 1, lines[i] if i < len(lines) else ""))
                for j in range(i + 1, min(len(lines), i + 1 + ctx_lines)):
                    block.append("%s-%d- %s" % (rel, j + 1, lines[j]))
                out.append(((rel, i), block))
        if not out:
            return ToolResult.ok("no matches for %s" % args["pattern"], matches=0)
        text_out = [line for _, block in out for line in block]
        if extra:
            text_out.append("... stopped at %d results; %d more matches not shown" % (max_results, extra))
        return ToolResult.ok("\n".join(text_out), matches=hits)


_REGEX_SPECIAL = set("\\.^$*+?{}[]|()")


def _byte_prefilter(pattern, fixed, flags):
    """A fast bytes test that rejects files that cannot match (never one that can), or None."""
    if flags & re.IGNORECASE:
        return None
    literal = pattern if fixed else _required_literal(pattern)
    if not literal:
        return None
    needle = literal.encode("utf-8")
    return lambda data: needle in data


def _required_literal(pattern):
    """The longest run of characters every match of a simple regex must contain ('' if unsure)."""
    if "|" in pattern or "(" in pattern:
        return ""
    runs, run, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _REGEX_SPECIAL or nxt in "/-'\" #":
                char, i = nxt, i + 2
            else:  # \d, \w, \b, ...: not a literal
                runs.append(run)
                run, i = "", i + 2
                continue
        elif c == "[":
            close = pattern.find("]", i + 2)
            runs.append(run)
            run, i = "", (close + 1 if close != -1 else len(pattern))
            continue
        elif c in ".^$":
            runs.append(run)
            run, i = "", i + 1
            continue
        elif c in "*?{+":
            if c != "+" and run:
                run = run[:-1]  # the preceding character is optional
            runs.append(run)
            run, i = "", i + 1
            if c == "{":
                close = pattern.find("}", i)
                i = close + 1 if close != -1 else len(pattern)
            continue
        else:
            char, i = c, i + 1
        if i < len(pattern) and pattern[i] in "*?{":
            runs.append(run)  # this character is optional; the run ends before it
            run = ""
            continue
        run += char
    runs.append(run)
    return max(runs, key=len) if runs else ""


def _line_starts(text):
    starts, pos = [0], text.find("\n")
    while pos != -1:
        starts.append(pos + 1)
        pos = text.find("\n", pos + 1)
    return starts


def _line_of(starts, offset):
    import bisect
    return bisect.bisect_right(starts, offset) - 1


class PlanTool(Tool):
    name = "plan"
    description = ("Parse a plan file (JSON, YAML or Markdown) and return its goal, context and "
                   "numbered instructions, or the parse error with its line.")
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def run(self, args, ctx):
        real = resolve_path(args["path"], ctx.root, must_exist=True)
        with open(real, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        try:
            plan = parse_plan(text, source=display_path(real, ctx.root))
        except PlanError as exc:
            raise ToolError(str(exc))
        return ToolResult.ok(plan.describe(), instructions=len(plan.instructions))


class CopyPath(Tool):
    name = "copy_path"
    description = "Copy a file or a directory (recursively). overwrite=true replaces an existing destination."
    parameters = {"type": "object", "properties": {
        "source_path": {"type": "string"}, "destination_path": {"type": "string"},
        "overwrite": {"type": "boolean", "default": False}}, "required": ["source_path", "destination_path"]}
    permission = WRITE
    verb = "copied"

    def confirmation(self, args, ctx):
        dst = resolve_path(args["destination_path"], ctx.root)
        if args.get("overwrite") and os.path.lexists(dst):
            return "%s %s over the existing %s" % (self.name.split("_")[0], args["source_path"],
                                                  args["destination_path"])
        return None

    def _paths(self, args, ctx):
        src = resolve_path(args["source_path"], ctx.root, must_exist=True)
        dst = resolve_path(args["destination_path"], ctx.root)
        if os.path.isdir(dst) and not os.path.isdir(src):
            dst = os.path.join(dst, os.path.basename(src))  # like cp file dir/
        if src == dst:
            raise ToolError("source and destination are the same: %s" % args["source_path"])
        if os.path.isdir(src) and _inside(dst, src):
            raise ToolError("cannot put %s inside itself" % args["source_path"])
        if os.path.lexists(dst) and not args.get("overwrite"):
            raise ToolError("%s already exists; set overwrite=true to replace it" % display_path(dst, ctx.root))
        return src, dst

    def run(self, args, ctx):
        import shutil
        src, dst = self._paths(args, ctx)
        tokens = []
        if os.path.lexists(dst):
            ctx.check_undo_cap(self.name, dst, args)
            tokens.append(ctx.before_change(self.name, dst))
            remove_path(dst)
        else:
            tokens.append(ctx.before_change(self.name, dst))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        count = self._transfer(src, dst, ctx)
        for token in tokens:
            ctx.after_change(token)
        return ToolResult.ok("%s %s to %s (%d item%s)" % (self.verb.capitalize(), display_path(src, ctx.root),
                                                         display_path(dst, ctx.root), count,
                                                         "" if count == 1 else "s"), items=count)

    def _transfer(self, src, dst, ctx):
        import shutil
        if os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True)
            return sum(len(files) + len(dirs) for _, dirs, files in os.walk(dst)) + 1
        shutil.copy2(src, dst, follow_symlinks=False)
        return 1


class MovePath(CopyPath):
    name = "move_path"
    description = "Move or rename a file or directory. overwrite=true replaces an existing destination."
    verb = "moved"

    def run(self, args, ctx):
        import shutil
        src, dst = self._paths(args, ctx)
        if os.path.lexists(dst):
            ctx.check_undo_cap(self.name, dst, args)
            token = ctx.before_change(self.name, dst)
            remove_path(dst)
            ctx.after_change(token, expected="absent")  # undone after the move back, when dst is gone again
        count = tree_count(src)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        token = ctx.record_move(src, dst)
        shutil.move(src, dst)
        ctx.after_change(token)
        return ToolResult.ok("Moved %s to %s (%d item%s)" % (display_path(src, ctx.root),
                                                            display_path(dst, ctx.root), count,
                                                            "" if count == 1 else "s"), items=count)


class DeletePath(Tool):
    name = "delete_path"
    description = "Delete a file or directory. A non-empty directory needs recursive=true."
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"}, "recursive": {"type": "boolean", "default": False}}, "required": ["path"]}
    permission = WRITE

    def confirmation(self, args, ctx):
        real = resolve_path(args["path"], ctx.root)
        if not os.path.lexists(real):
            return None
        return "delete %s (%d item%s)" % (args["path"], tree_count(real), "" if tree_count(real) == 1 else "s")

    def run(self, args, ctx):
        path = args["path"]
        real = resolve_path(path, ctx.root, must_exist=True)
        if real == ctx.root:
            raise ToolError("refusing to delete the working directory itself")
        if os.path.isdir(real) and not os.path.islink(real) and os.listdir(real) and not args.get("recursive"):
            raise ToolError("%s is a non-empty directory (%d items); set recursive=true to delete it"
                            % (path, tree_count(real) - 1))
        count = tree_count(real)
        ctx.check_undo_cap(self.name, real, args)
        token = ctx.before_change(self.name, real)
        remove_path(real)
        ctx.after_change(token)
        return ToolResult.ok("Deleted %s (%d item%s)" % (display_path(real, ctx.root), count,
                                                        "" if count == 1 else "s"), items=count)


class CreateDirectory(Tool):
    name = "create_directory"
    description = "Create a directory and any missing parents (like mkdir -p)."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    permission = WRITE

    def run(self, args, ctx):
        real = resolve_path(args["path"], ctx.root)
        if os.path.isdir(real):
            return ToolResult.ok("%s already exists" % display_path(real, ctx.root), created=False)
        if os.path.lexists(real):
            raise ToolError("%s exists and is not a directory" % args["path"])
        top = real  # the highest missing ancestor is what undo removes
        while not os.path.exists(os.path.dirname(top)):
            top = os.path.dirname(top)
        token = ctx.before_change(self.name, top)
        os.makedirs(real)
        ctx.after_change(token)
        return ToolResult.ok("Created directory %s" % display_path(real, ctx.root), created=True)


class FileMetadata(Tool):
    name = "file_metadata"
    description = "Type, size, permissions, owner, modification and change times, symlink target, and line count."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def run(self, args, ctx):
        path = args["path"]
        real = resolve_path(path, ctx.root, must_exist=True)
        link = os.path.join(ctx.root, path)
        st = os.lstat(link) if os.path.islink(link) else os.stat(real)
        kind = "symlink" if stat.S_ISLNK(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else \
            "file" if stat.S_ISREG(st.st_mode) else "other"
        lines = ["path: %s" % display_path(real, ctx.root), "type: %s" % kind,
                 "size: %d bytes (%s)" % (st.st_size, _fmt_size(st.st_size)),
                 "mode: %s (%s)" % (oct(stat.S_IMODE(st.st_mode)), stat.filemode(st.st_mode)),
                 "owner: %s" % _owner(st), "modified: %s" % _rfc3339(st.st_mtime),
                 "changed: %s" % _rfc3339(st.st_ctime)]
        if kind == "symlink":
            lines.append("target: %s" % display_path(real, ctx.root))
        if os.path.isfile(real) and not is_binary_file(real):
            with open(real, "rb") as fh:
                lines.append("lines: %d" % sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b"")))
        elif os.path.isdir(real):
            lines.append("entries: %d" % len(os.listdir(real)))
        return ToolResult.ok("\n".join(lines), type=kind, size=st.st_size)


class DiffFiles(Tool):
    name = "diff_files"
    description = "Unified diff between two text files."
    parameters = {"type": "object", "properties": {
        "path1": {"type": "string"}, "path2": {"type": "string"},
        "context_lines": {"type": "integer", "minimum": 0, "default": 3}}, "required": ["path1", "path2"]}

    def run(self, args, ctx):
        texts = []
        for key in ("path1", "path2"):
            real = resolve_path(args[key], ctx.root, must_exist=True)
            if os.path.isdir(real) or is_binary_file(real):
                raise ToolError("%s is not a text file" % args[key])
            texts.append(_read_text(real))
        n = args.get("context_lines")
        diff = "".join(difflib.unified_diff(texts[0].splitlines(True), texts[1].splitlines(True),
                                            args["path1"], args["path2"], n=3 if n is None else n))
        return ToolResult.ok(diff or "the files are identical", identical=not diff)


ALL_TOOLS = (ListDirectory, ReadFile, WriteFile, EditFile, CopyPath, MovePath, DeletePath, CreateDirectory,
             FileMetadata, FindPath, Grep, DiffFiles, PlanTool)
PLANNING_TOOLS = {"list_directory", "read_file", "find_path", "file_metadata", "grep", "diff_files",
                  "plan", "fetch", "subagent", "parallel_subagent"}


def build_registry(mode, ctx, extra=()):
    """The registry for a mode: planning offers read-only tools, write offers all."""
    tools = [cls() for cls in ALL_TOOLS] + list(extra)
    ctx.mode = mode
    offered = [t for t in tools if mode == WRITE_MODE or t.name in PLANNING_TOOLS]
    return Registry(offered, ctx, all_names=[t.name for t in tools])


# ---- Undo: nothing lost ----


def write_atomic(real, data):
    """Replace a file's content in one step, keeping its permissions."""
    tmp = "%s.xzatoma-%d.tmp" % (real, os.getpid())
    with open(tmp, "wb") as fh:
        fh.write(data)
    if os.path.exists(real):
        os.chmod(tmp, stat.S_IMODE(os.stat(real).st_mode))
    os.replace(tmp, real)


def _read_text(real):
    with open(real, encoding="utf-8", errors="replace", newline="") as fh:
        return fh.read()


def text_diff(old, new, name):
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/" + name, "b/" + name))


def remove_path(real):
    import shutil
    if os.path.isdir(real) and not os.path.islink(real):
        shutil.rmtree(real)
    else:
        os.unlink(real)


def tree_count(real):
    if os.path.isdir(real) and not os.path.islink(real):
        return 1 + sum(len(files) + len(dirs) for _, dirs, files in os.walk(real))
    return 1


def tree_size(real):
    if not os.path.lexists(real):
        return 0
    if os.path.isdir(real) and not os.path.islink(real):
        total = 0
        for base, _, files in os.walk(real):
            for name in files:
                try:
                    total += os.lstat(os.path.join(base, name)).st_size
                except OSError:
                    pass
        return total
    return os.lstat(real).st_size


def state_hash(real):
    """A fingerprint of what is at a path now: absent, a file's bytes, a link, or a whole tree."""
    import hashlib
    if not os.path.lexists(real):
        return "absent"
    if os.path.islink(real):
        return "link:" + os.readlink(real)
    h = hashlib.sha256()
    if os.path.isdir(real):
        for base, dirs, files in os.walk(real):
            dirs.sort()
            rel = os.path.relpath(base, real)
            h.update(("d:%s\n" % rel).encode("utf-8", "surrogateescape"))
            for name in sorted(files):
                full = os.path.join(base, name)
                h.update(("f:%s/%s:%s\n" % (rel, name, state_hash(full))).encode("utf-8", "surrogateescape"))
        return "dir:" + h.hexdigest()
    with open(real, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "file:" + h.hexdigest()


def snapshot(real, cap):
    """(kind, content, mode) of what is at a path, for an undo record."""
    if not os.path.lexists(real):
        return "absent", None, None
    mode = stat.S_IMODE(os.lstat(real).st_mode)
    if os.path.islink(real):
        return "link", os.readlink(real).encode("utf-8", "surrogateescape"), mode
    if os.path.isdir(real):
        import io
        import tarfile
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(real, arcname=".")
        return "dir", buf.getvalue(), mode
    with open(real, "rb") as fh:
        return "file", fh.read(cap + 1), mode


class UndoError(Exception):
    pass


def undo_change(store, record, force=False):
    """Put back what a tool changed; refuse when the path changed since unless force. Returns a sentence."""
    path, kind = record["path"], record["kind"]
    target = record["content"].decode("utf-8", "surrogateescape") if kind == "moved" else path
    current = state_hash(target)
    if record["after_hash"] and current != record["after_hash"] and not force:
        raise UndoError("%s changed since the agent touched it; not restored (use --force to restore anyway)"
                        % target)
    if kind == "moved":
        if os.path.lexists(path) and not force:
            raise UndoError("%s exists again; not moving %s back over it (use --force)" % (path, target))
        if os.path.lexists(path):
            remove_path(path)
        import shutil
        shutil.move(target, path)
        message = "moved %s back to %s" % (target, path)
    elif kind == "absent":
        if os.path.lexists(path):
            remove_path(path)
        message = "removed %s (created by the agent)" % path
    else:
        if os.path.lexists(path):
            remove_path(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if kind == "file":
            write_atomic(path, record["content"])
            message = "restored %s (%s)" % (path, _fmt_size(len(record["content"])))
        elif kind == "link":
            os.symlink(record["content"].decode("utf-8", "surrogateescape"), path)
            message = "restored link %s" % path
        else:
            _extract_tree(record["content"], path)
            message = "restored directory %s (%d items)" % (path, tree_count(path))
        if record.get("mode") is not None and kind != "link":
            os.chmod(path, record["mode"])
    store.mark_restored(record["id"])
    return message


def _extract_tree(blob, path):
    import io
    import tarfile
    os.makedirs(path, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for member in tar.getmembers():
            dest = os.path.realpath(os.path.join(path, member.name))
            if not _inside(dest, os.path.realpath(path)) or member.isdev():
                raise UndoError("refusing to restore %s: the archive entry %s escapes it" % (path, member.name))
        try:
            tar.extractall(path, filter="tar")
        except TypeError:  # Python without extraction filters; members were checked above
            tar.extractall(path)


# ---- Plans ----

class PlanError(ValueError):
    """A plan that cannot be used: says the source, the line where known, and what is wrong."""

    def __init__(self, source, message, line=None):
        self.source, self.line = source, line
        where = source + (":%d" % line if line else "")
        super().__init__("%s: %s" % (where, message))


class Plan:
    def __init__(self, goal, context=None, instructions=(), name=None):
        self.goal = goal
        self.context = context
        self.instructions = list(instructions)
        self.name = name

    def context_lines(self):
        ctx = self.context
        if not ctx:
            return []
        if isinstance(ctx, dict):
            return ["- %s: %s" % (_label(k), _scalar(v)) for k, v in ctx.items()]
        if isinstance(ctx, list):
            return ["- %s" % _scalar(v) for v in ctx]
        return [str(ctx).strip()]

    def to_prompt(self):
        """The prompt exactly as the seed's 'Plan to Prompt Translation' shows it."""
        parts = ["You are assisting with the following task:", "", "GOAL: %s" % self.goal, ""]
        ctx = self.context_lines()
        if ctx:
            parts += ["CONTEXT:"] + ctx + [""]
        parts.append("INSTRUCTIONS (follow as guidance):")
        parts += ["%d. %s" % (i, step) for i, step in enumerate(self.instructions, 1)]
        parts += ["", "Use the available tools to accomplish this goal. You may adapt your approach "
                      "as needed, but try to follow the instructions provided."]
        return "\n".join(parts)

    def describe(self):
        lines = []
        if self.name:
            lines.append("NAME: %s" % self.name)
        lines.append("GOAL: %s" % self.goal)
        ctx = self.context_lines()
        if ctx:
            lines += ["CONTEXT:"] + ctx
        lines.append("INSTRUCTIONS:")
        lines += ["%d. %s" % (i, s) for i, s in enumerate(self.instructions, 1)]
        return "\n".join(lines)


def _label(key):
    text = str(key).replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def _scalar(value):
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


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
    if fmt == "json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PlanError(source, "invalid JSON: %s" % exc.msg, getattr(exc, "lineno", None))
    else:
        try:
            import yaml
        except ImportError:
            raise PlanError(source, "YAML plans need the Python package 'pyyaml' (pip install pyyaml)")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc)
            raise PlanError(source, "invalid YAML: %s" % problem, mark.line + 1 if mark else None)
    return _plan_from_mapping(data, source, text)


def _key_line(text, key):
    m = re.search(r'^\s*"?%s"?\s*:' % re.escape(key), text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _plan_from_mapping(data, source, text):
    if not isinstance(data, dict):
        raise PlanError(source, "a plan must be a mapping with 'goal' and 'instructions', got %s"
                        % _json_type(data))
    known = {"goal", "context", "instructions", "steps", "name", "title", "description"}
    goal = data.get("goal")
    if goal is None or (isinstance(goal, str) and not goal.strip()):
        raise PlanError(source, "missing required key 'goal' (what the agent should achieve)")
    if not isinstance(goal, str):
        raise PlanError(source, "'goal' must be text, got %s" % _json_type(goal), _key_line(text, "goal"))
    key = "instructions" if "instructions" in data else "steps"
    steps = data.get(key)
    if steps is None:
        raise PlanError(source, "missing required key 'instructions' (a list of steps)")
    if isinstance(steps, str):
        steps = [s for s in (line.strip(" -\t") for line in steps.splitlines()) if s]
    if not isinstance(steps, list) or not steps:
        raise PlanError(source, "'%s' must be a non-empty list of steps" % key, _key_line(text, key))
    instructions = []
    for i, step in enumerate(steps, 1):
        if isinstance(step, dict):
            for field in ("instruction", "description", "task", "action", "name", "step"):
                if isinstance(step.get(field), str):
                    step = step[field]
                    break
            else:
                step = ", ".join("%s: %s" % (k, _scalar(v)) for k, v in step.items())
        if not isinstance(step, (str, int, float)) or not str(step).strip():
            raise PlanError(source, "step %d of '%s' is empty or not text" % (i, key), _key_line(text, key))
        instructions.append(str(step).strip())
    context = data.get("context")
    if context is not None and not isinstance(context, (dict, list, str, int, float)):
        raise PlanError(source, "'context' must be a mapping, list or text", _key_line(text, "context"))
    unknown = sorted(set(data) - known)
    plan = Plan(goal.strip(), context, instructions, data.get("name") or data.get("title"))
    plan.unknown_keys = unknown
    return plan


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_MD_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?:\[[ xX]\]\s+)?(.*\S)\s*$")


def _parse_markdown_plan(text, source):
    title, sections, current = None, {}, None
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _MD_HEADING.match(line)
        if m:
            name = m.group(2).strip()
            if len(m.group(1)) == 1 and title is None:
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
    steps_sec = find("steps", "instructions", "tasks", "plan")
    if steps_sec is None:
        raise PlanError(source, "no instructions found (expected a '## Steps' or '## Instructions' "
                                "section with a list)")
    steps = [m.group(1) for m in (_MD_ITEM.match(l) for l in steps_sec["lines"]) if m]
    if not steps:
        raise PlanError(source, "the instructions section has no list items", steps_sec["line"])
    ctx_sec = find("context", "background")
    context = None
    if ctx_sec:
        items = [m.group(1) for m in (_MD_ITEM.match(l) for l in ctx_sec["lines"]) if m]
        prose = " ".join(l.strip() for l in ctx_sec["lines"] if l.strip())
        context = items if items else (prose or None)
    plan = Plan(goal, context, steps, title)
    plan.unknown_keys = []
    return plan
