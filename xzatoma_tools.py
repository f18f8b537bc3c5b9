"""XZatoma tools: what the model can do, and below them the safety kernel that decides what it may touch.

Read top to bottom, in sections opened by `# ---- Name ----`. The tools: ToolResult, Tool, ToolContext, Registry;
file and search tools (the `plan` tool reads a plan with xzatoma_plans); undo; the terminal tool; fetch;
build_registry. Beside them, their own modules: plans (xzatoma_plans) and skills (xzatoma_skills: SKILL.md
folders, triggers, the catalog, activate_skill); a task's progress and update_progress are the program's.

The safety kernel (below `# ==== The safety kernel ====`) imports nothing from the tools. Its API:
  Confinement(root, xzatoma_home, extra, home, homes, terminal, …): .root .jail .policy .sandbox, .reason(path)
      (the one protected set), .target_reason/.copied_reason (a file tool's change), .binds(), .deferred_changed()
  is_git_dir (git's rule), git_config (git itself), repository_runs_code, venv_code; PROTECTED_NAMES, fold_name
  render_untrusted(text, exact), render_json(obj), UntrustedStream (xzatoma_store's, beside redaction, so that
      history and replay show stored text without the tools; imported here and part of this API);
  ToolError, JailError, PathError, UrlBlocked
  Jail(root, hidden).resolve(path) -> Target, resolve_path, path_verdict, display_path, read_fd, glob_match
  parse_shell, needs_shell, command_argv; CommandPolicy(confinement).judge(command) -> Verdict (allow/confirm/deny)
  Sandbox(confinement, access, …, limits), SANDBOX_LIMITS, ProtectedWatch, run_command, child_env, trusted_realpath
      (read grants never through what commands write); check_url, url_verdict; AuditLog

Only the standard library (and xzatoma_store) is imported at module level.
"""


import errno
import fnmatch
import json
import os
import re
import signal
import stat
import sys
import threading
import time

from xzatoma_store import (APPENDED, MAX_DIFF_CELLS, PATCH_SUFFIXES, REDACTED, WHITESPACE_ONLY,  # noqa: F401
                           AuditLog, LazyRegex, UntrustedStream, bounded_diff, bounded_text, change_doubt,
                           changed_lines, fmt_size, head_of, html_to_text, json_type, looks_like_diff,
                           lost_credentials, loose_replacement, missing_text, one_line_path, only_dropped,
                           preview_arguments, render_json, render_untrusted, rfc3339, same_words, several_places,
                           text_diff)


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
        head, cut = bounded_text(self.output, max_bytes) if max_bytes is not None else (None, False)
        if cut:
            self.metadata["original_size"] = len(self.output.encode("utf-8", "replace"))
            self.output, self.truncated = head, True
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
        from xzatoma_store import redact  # before the cut: half a secret is no longer a secret redact() knows
        text = redact(self.to_message()).strip()
        first = text.splitlines()[0] if text else "(no output)"
        lines = text.count("\n") + 1 if text else 0
        if lines > 1:
            first += "  (+%d lines)" % (lines - 1)
        return first if len(first) <= width else first[: width - 1] + "…"


# ---- Tool and registry ----

READ, WRITE, EXECUTE = "read", "write", "execute"  # a tool's permission; planning mode offers only READ
PLANNING, WRITE_MODE = "planning", "write"  # tool sets (chat's /mode, run --mode)
RESTRICTED, FULL, INTERACTIVE = "restricted_autonomous", "full_autonomous", "interactive"  # terminal autonomy


class Approvals:
    """The people a tool run can ask, and how (chat's Confirmations give them; the default: nobody).

    confirm(tool_name, args, detail) -> bool before a call whose tool asks for it (chat in Safe mode only);
    ask(tool_name, args, detail) -> bool for an irreversible change; confirm_command(command, reason, exact) -> the
    command to run (maybe edited) or None (exact: an [a]lways or ne[v]er covers this very command only). `interactive`: a person can be asked (chat), even with no confirm
    (YOLO); a callback alone (a test's) does not make a run interactive."""

    def __init__(self, interactive=False, confirm=None, ask=None, confirm_command=None):
        self.interactive, self.confirm, self.ask, self.confirm_command = interactive, confirm, ask, confirm_command

    def prefixed(self, prefix):
        """The same people, each question opened by `prefix` (a subagent's label)."""
        confirm, ask, confirm_command = self.confirm, self.ask, self.confirm_command
        return Approvals(
            self.interactive,
            None if confirm is None else (lambda name, args, detail: confirm(name, args, prefix + (detail or ""))),
            None if ask is None else (lambda name, args, detail: ask(name, args, prefix + detail)),
            None if confirm_command is None else (lambda command, reason, exact=False: confirm_command(
                command, prefix + reason, exact)))


NOBODY = Approvals()  #: a headless run's: nobody to ask


class ToolContext:
    """What a tool run may touch (the Confinement), limits, the people who can be asked, the undo log.

    Every field is given to the constructor (the Session builds it; tests pass what they need) and
    documented here; tools read them directly, never probing with getattr. `child()` derives a
    subagent's context, `with_deadline()` one run's. `confinement` may be a working directory: a Confinement
    of it is made with agent.tools.protected_paths (tests, embedding; build one to give it more).
    """

    def __init__(self, confinement, tools_config=None, approvals=None, autonomy=None, store=None,
                 conversation_id=None, audit=None, cancel=None, deadline=None):
        #: the agent.tools configuration slice (limits such as max_output_size, fetch, undo_max_bytes)
        self.config = tools_config or {}
        if not isinstance(confinement, Confinement):
            confinement = Confinement(confinement, extra=self.config.get("protected_paths") or ())
        #: the session's Confinement: the root, the jail, the protected set, the policy and the sandbox
        self.confinement = confinement
        #: who can be asked, and how (Approvals); nobody by default
        self.approvals = approvals or NOBODY
        #: the terminal's autonomy: restricted_autonomous (run), full_autonomous (--allow-dangerous, YOLO) or
        #: interactive (chat's Safe safety)
        self.autonomy = autonomy or RESTRICTED
        #: the Store for undo records and the fetch cache, or None (no history this run)
        self.store = store
        #: the stored conversation the undo records belong to
        self.conversation_id = conversation_id
        #: the AuditLog every terminal command is written to, or None
        self.audit = audit
        #: a threading.Event; set, it stops running commands and subagents (Ctrl-C, SIGTERM, fail_fast)
        self.cancel = cancel
        #: time.monotonic() by which the run must end (--timeout), or None; tools and commands honour it
        self.deadline = deadline
        #: 0 for the top-level agent, n for a subagent n levels down (child())
        self.depth = 0
        #: the subagent's label, named in every question it asks; None at the top (child())
        self.label = None
        #: the id of the tool call in progress (set by the Registry for each call; undo records name it)
        self.call_id = None
        #: the person accepted this call's change without an undo record (over the cap); reset for each call
        self.undo_waived = False
        #: the files (real paths) this agent has read, written or edited: write_file replaces only those
        #: (read_file first, as Claude Code's Write asks); a subagent starts with its own (child())
        self.seen = set()
        self.made = set()  #: of them, the files this agent wrote or edited
        #: (real path, text) of overwrites refused once for keeping only lines the file had: the same again
        #: goes through (WriteFile)
        self.warned = set()

    @property
    def terminal(self):
        """The agent.terminal configuration slice (timeouts, output caps, allowlist, custom denylist): the
        Confinement's, which its policy and sandbox were made from."""
        return self.confinement.terminal

    @property
    def root(self):
        """The working directory (the Confinement's, canonical)."""
        return self.confinement.root

    @property
    def jail(self):
        return self.confinement.jail

    @property
    def sandbox(self):
        return self.confinement.sandbox

    @property
    def xzatoma_home(self):
        return self.confinement.xzatoma_home

    def _derived(self, **changes):
        import copy
        ctx = copy.copy(self)  # the Confinement and every field not named are shared
        ctx.__dict__.update(changes, call_id=None, undo_waived=False)
        return ctx

    def child(self, label, conversation_id):
        """A subagent's context: same jail, policy, store, cancel and deadline; its questions name it."""
        return self._derived(label=label, depth=self.depth + 1, conversation_id=conversation_id,
                             approvals=self.approvals.prefixed("[subagent %s] " % label), seen=set(), made=set(),
                             warned=set())

    def with_deadline(self, deadline):
        """The same context for one run that must end by `deadline` (time.monotonic(), or None)."""
        return self if deadline == self.deadline else self._derived(deadline=deadline)

    def check_deadline(self, what):
        """Raise a tool error once the run's deadline has passed (long walks call this in their loops)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise ToolError("%s stopped: the run's time limit was reached" % what)

    def limit(self, key, default):
        value = self.config.get(key)
        return default if value is None else value

    # -- undo log --
    @property
    def undo_cap(self):
        return self.limit("undo_max_bytes", 52428800)

    def _at(self, where):
        """A Target for `where` (a Target already, or an absolute path resolved again, links not followed)."""
        if isinstance(where, Target):
            import contextlib
            return contextlib.nullcontext(where)  # lent to the with-block, not closed at its end
        return self.jail.resolve(where, follow=False)

    def before_change(self, tool, where):
        """Save what is at `where` (a Target or a path) before a tool changes it. Returns a token for after_change."""
        if self.store is None or self.undo_waived:
            return None
        with self._at(where) as target:
            kind, blob, mode = snapshot_at(target, self.undo_cap, lambda: self.check_deadline(tool))
            real = target.real
        record = self.store.record_undo(self.conversation_id, self.call_id, tool, real, kind, blob, mode)
        return record, real

    def before_create(self, tool, target):
        """Like before_change for a Target, but when parent directories are missing the record covers
        the highest new one, so undo removes everything the change created."""
        if target.missing:
            return self.before_change(tool, os.path.join(self.root, *(target.names + target.missing[:1])))
        return self.before_change(tool, target)

    def record_move(self, source, destination):
        if self.store is None or self.undo_waived:
            return None
        record = self.store.record_undo(self.conversation_id, self.call_id, "move_path", source, "moved",
                                        destination.encode("utf-8", "surrogateescape"), None)
        return record, destination

    def forget_change(self, token):
        """A change recorded with before_change/record_move that was taken back: undo has nothing to do."""
        if token is not None:
            self.store.mark_restored(token[0])

    def after_change(self, token, expected=None):
        """Fingerprint the path after the change (or the state `expected` when undo reaches this record)."""
        self.confinement.changed()
        if token is not None:
            record, real = token
            if expected is None:
                with self.jail.resolve(real, follow=False) as target:
                    try:
                        expected = state_hash_at(target, lambda: self.check_deadline("fingerprinting the change"))
                    except ToolError:  # the change is made; undo will not take it for unchanged since
                        expected = UNFINGERPRINTED
            self.store.set_undo_after(record, expected)

    def check_undo_cap(self, tool, target, args):
        """A change that could not be undone (over the size cap) asks in chat and is refused otherwise."""
        if self.store is None or self.undo_waived:
            return
        cap = self.undo_cap
        size = tree_size_at(target, lambda: self.check_deadline(tool))
        if size <= cap:
            return
        detail = "%s is %s, over the undo cap of %s (agent.tools.undo_max_bytes): this cannot be undone" % (
            display_path(target.real, self.root), fmt_size(size), fmt_size(cap))
        ask = self.approvals.ask
        if ask is not None and ask(tool, args, detail):
            self.undo_waived = True  # the person accepted this change without an undo record
            return
        raise ToolError(detail + ("; the user declined" if ask is not None else
                                  "; refused without a person to confirm it"))

    # -- protected paths --
    def guard(self, tool, args, target, source=None, shows=None):
        """A change at a protected path (or a directory holding one) needs a person's yes, in every mode;
        so does a copy of `source` (a Target) that creates one below `target`. `shows()` gives what the
        change writes (a diff): the person sees the code a hook or start-up file would run before saying yes.
        Returns True when a person said yes."""
        conf, check = self.confinement, lambda: self.check_deadline(tool)
        conf.before_change()
        what = conf.target_reason(target, check)
        if what is None and source is not None:
            what = conf.copied_reason(source, target.real, check)
        if what is None:
            return
        detail = "%s %s changes %s, a protected path (agent.tools.protected_paths)" % (
            tool, one_line_path(display_path(target.real, self.root)), one_line_path(what))
        if not self.approvals.interactive or self.approvals.ask is None:
            raise ToolError("%s; it needs a person's approval; not available in this run" % detail)
        change = shows() if shows is not None else None
        if not self.approvals.ask(tool, args, detail + ("\n" + change if change else "")):
            raise ToolError("the user declined: %s" % detail)
        conf.accept(target.real)
        return True


class Tool:
    """A tool: name, JSON schema, permission level and run(args, ctx)."""

    name = ""
    description = ""
    parameters = {"type": "object", "properties": {}}
    permission = READ
    #: why the tool can no longer run (an MCP server that stopped), or None: a withdrawn tool is neither
    #: offered nor run, and the model is told why
    withdrawn = None

    def run(self, args, ctx):  # pragma: no cover - interface
        raise NotImplementedError

    def definition(self):
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def confirmation(self, args, ctx):
        """What to show a person before this call in Safe mode, or None when it needs no confirmation."""
        return None

    def preview_args(self, args):
        return preview_arguments(args)


def _schema_error(name, prop, schema, value):
    """Check one argument against its schema; coerce forgiving cases. Returns (value, error)."""
    expected = schema.get("type")
    if expected == "integer":
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            return value, "parameter '%s' must be an integer, got %s" % (prop, json_type(value))
        if "minimum" in schema and value < schema["minimum"]:
            return value, "parameter '%s' must be at least %s" % (prop, schema["minimum"])
    elif expected == "boolean":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            return value, "parameter '%s' must be true or false, got %s" % (prop, json_type(value))
    elif expected == "string":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            return value, "parameter '%s' must be a string, got %s" % (prop, json_type(value))
    elif expected == "array":
        if not isinstance(value, list):
            return value, "parameter '%s' must be an array, got %s" % (prop, json_type(value))
        if isinstance(schema.get("items"), dict):  # each item as its schema says (an MCP server's may be a
            # list, JSON Schema's tuple form: not checked): `allowed_tools: [null]` was a TypeError (round 19c)
            value = list(value)
            for i, item in enumerate(value):
                value[i], err = _schema_error(name, "%s[%d]" % (prop, i), schema["items"], item)
                if err:
                    return value, err
    elif expected == "object":
        if not isinstance(value, dict):
            return value, "parameter '%s' must be an object, got %s" % (prop, json_type(value))
        inner = schema.get("properties")
        if isinstance(inner, dict) and all(isinstance(sub, dict) for sub in inner.values()):
            value = dict(value)
            required = schema.get("required")
            missing = [k for k in (required if isinstance(required, list) else ()) if value.get(k) is None]
            if missing:
                return value, "parameter '%s' lacks %s" % (prop, ", ".join(missing))
            for key, sub in inner.items():
                if value.get(key) is not None:
                    value[key], err = _schema_error(name, "%s.%s" % (prop, key), sub, value[key])
                    if err:
                        return value, err
    if "enum" in schema and value not in schema["enum"]:
        return value, "parameter '%s' must be one of %s" % (
            prop, ", ".join(json.dumps(v) for v in schema["enum"]))
    return value, None


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
            return None, "arguments for %s must be a JSON object, got %s" % (tool.name, json_type(args))
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
    """The tools offered to the model in one tool set (planning, write). `execute` never raises."""

    def __init__(self, tools, ctx, toolset=WRITE_MODE, all_names=(), schemas=None, skills=None):
        self.tools = {t.name: t for t in tools}
        self.ctx = ctx
        self.toolset = toolset
        self.all_names = set(all_names) | set(self.tools)
        self.schemas = schemas or {}  #: name -> the definition offered instead of the tool's own (a profile's)
        #: the session's SkillState, or None: while active skills narrow the tools (allowed-tools), only those
        #: are offered and run
        self.skills = skills

    def narrowed(self, names, ctx):
        """The same tools, only those named, over another context (a subagent's)."""
        return Registry([t for n, t in self.tools.items() if n in names], ctx, self.toolset, self.all_names,
                        self.schemas, self.skills)

    def bound(self, ctx):
        """The same tools over another context (one run's deadline)."""
        return self if ctx is self.ctx else Registry(self.tools.values(), ctx, self.toolset, self.all_names,
                                                     self.schemas, self.skills)

    def extended(self, tools):
        """The same registry with more tools (an MCP server's), those the tool set offers: planning keeps the
        read ones. Every profile offers them: the person configured them."""
        offered = [t for t in tools if self.toolset == WRITE_MODE or t.permission == READ]
        return Registry(list(self.tools.values()) + offered, self.ctx, self.toolset,
                        self.all_names | {t.name for t in tools}, self.schemas, self.skills)

    def __contains__(self, name):
        return name in self.tools

    def __len__(self):
        return len(self.tools)

    def names(self):
        return list(self.tools)

    def definitions(self):
        allowed = self.skills.allowed() if self.skills is not None else None
        return [self.schemas.get(n) or t.definition() for n, t in self.tools.items()
                if not getattr(t, "withdrawn", None)  # duck-typed tools (subagents) have none
                and (allowed is None or n in allowed)]

    def get(self, name):
        return self.tools.get(name)

    def check_call(self, name, raw_args):
        """Validate a call without running it. Returns (tool, args, error)."""
        tool = self.tools.get(name)
        if tool is None:
            if name in self.all_names:
                return None, None, "tool %s is not available in %s mode" % (name, self.toolset)
            return None, None, "unknown tool %r; available tools: %s" % (name, ", ".join(sorted(self.tools)))
        withdrawn = getattr(tool, "withdrawn", None)
        if withdrawn:
            return None, None, "tool %s is no longer available: %s" % (name, withdrawn)
        allowed = self.skills.allowed() if self.skills is not None else None
        if allowed is not None and name not in allowed:
            return None, None, self.skills.why(name)
        args, err = validate_arguments(tool, raw_args)
        if err:
            err += "; expected %s" % self.signature(name)
        return tool, args, err

    def signature(self, name):
        """A call's expected shape for error messages: write_file(path: string, content: string, mode?: …)."""
        schema = (self.schemas.get(name) or self.tools[name].definition())["parameters"]
        required = schema.get("required") or ()
        params = ["%s%s: %s" % (p, "" if p in required else "?", s.get("type", "any"))
                  for p, s in schema.get("properties", {}).items()]
        return "%s(%s)" % (name, ", ".join(params))

    def execute(self, name, raw_args, call_id=None):
        """Run one tool call; every failure becomes an error result."""
        tool, args, err = self.check_call(name, raw_args)
        if err:
            return ToolResult.fail(err, invalid=True)
        started = time.monotonic()
        self.ctx.call_id, self.ctx.undo_waived = call_id, False
        try:
            if (confirm := self.ctx.approvals.confirm) is not None:
                detail = tool.confirmation(args, self.ctx)
                if detail is not None and not confirm(name, args, detail):
                    return ToolResult.fail("the user declined %s %s" % (name, tool.preview_args(args)),
                                           declined=True)
            result = tool.run(args, self.ctx)
        except ToolError as exc:
            result = ToolResult.fail(str(exc), **exc.metadata)
        except (OSError, ValueError, UnicodeError) as exc:
            result = ToolResult.fail(_describe_os_error(exc, self.ctx))
        except Exception as exc:  # a bug in a tool must not end the run
            result = ToolResult.fail("%s failed unexpectedly: %s: %s" % (name, type(exc).__name__, exc))
        result.metadata.setdefault("duration_seconds", round(time.monotonic() - started, 3))
        from xzatoma_store import redact  # the process's own credentials never reach the model (`env`, a 401 body)
        result.output, result.error = redact(result.output, shapes=False), redact(result.error, shapes=False)
        return result.truncate(self.ctx.limit("max_output_size", 1048576))


def _describe_os_error(exc, ctx):
    if isinstance(exc, OSError) and exc.filename:
        shown = display_path(exc.filename, ctx.root) if isinstance(exc.filename, str) else exc.filename
        reason = exc.strerror or str(exc)
        return "%s: %s" % (reason.lower() if reason else "error", shown)
    return str(exc)


# ---- Shared file helpers ----

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", ".tox", ".mypy_cache", ".pytest_cache"}


#: the largest file a tool reads whole into memory (edit_file, diffs, plans, grep): a multi-gigabyte or
#: sparse file in the tree must cost an error, not the machine's memory
MAX_WHOLE_FILE = 64 << 20


def read_whole(fd, name, what="read whole"):
    """Every byte of the open regular file fd, or a ToolError when it is over MAX_WHOLE_FILE."""
    size = os.fstat(fd).st_size
    data = read_fd(fd, MAX_WHOLE_FILE + 1, size=min(size, MAX_WHOLE_FILE))
    if size > MAX_WHOLE_FILE or len(data) > MAX_WHOLE_FILE:
        raise ToolError("%s is %s, over the %s a tool can %s" % (
            name, fmt_size(max(size, len(data))), fmt_size(MAX_WHOLE_FILE), what))
    return data


def read_text(target, what, errors="replace"):
    """The text of the regular file at a Target (never following a link, never blocking on a FIFO)."""
    fd = target.open_regular(what)
    try:
        return read_whole(fd, display_path(target.real, target.root)).decode("utf-8", errors)
    finally:
        os.close(fd)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def is_binary_fd(fd, sample=8192):
    head = os.pread(fd, sample, 0) if hasattr(os, "pread") else os.read(fd, sample)
    return b"\x00" in head


_SETID = stat.S_ISUID | stat.S_ISGID


def write_atomic_at(dir_fd, name, data, mode=None):
    """Replace `name` in the directory `dir_fd` in one step, keeping its permissions.

    The temporary file has an unpredictable name and is created with O_CREAT|O_EXCL|O_NOFOLLOW in
    the checked directory, so a planted file or symlink of any name is never written through; the
    rename replaces the directory entry itself (a symlink swapped in is replaced, not followed).
    """
    import secrets
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if mode is None and st is not None and stat.S_ISREG(st.st_mode):
        mode = stat.S_IMODE(st.st_mode) & ~_SETID  # new content never inherits set-user/group-ID (as write(2))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    for _ in range(16):
        tmp = ".xzatoma-%s.tmp" % secrets.token_hex(8)
        try:
            # an existing file's content is never visible wider than it was: 0600 until the chmod
            fd = os.open(tmp, flags, 0o600 if mode is not None else 0o666, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise ToolError("could not create a temporary file in %s" % name)
    try:
        try:
            write_all(fd, data)
            if mode is not None:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


class GitIgnore:
    """The common subset of .gitignore: globs, '/'-anchored, dir-only '/', and '!' negation.

    A .gitignore comes with the repository, so it is bounded like any untrusted input: its globs match in
    linear time (glob_regex), a rule whose glob is refused is skipped, a file's rules past MAX_RULES are
    ignored, and a path is tested only against the rules of the directories above it, consecutive rules
    of one kind merged into one regex (a file of 100,000 lines cost 100,000 matches per path).
    """

    MAX_RULES = 1000  # per .gitignore (large real ones, such as Visual Studio's, have about 400)

    def __init__(self, root_fd):
        self.rules = {}  # base_rel -> [[matcher, negate, dir_only, [regex sources] or None]]
        self._load("", root_fd)

    def _load(self, rel_dir, dir_fd):
        if (fd := open_if_regular(".gitignore", dir_fd)) is None:
            return
        try:
            lines = read_fd(fd, 1 << 20).decode("utf-8", "replace").splitlines()
        finally:
            os.close(fd)
        groups, count = [], 0
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            if negate := line.startswith("!"):
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.strip("/") if dir_only else line
            anchored = "/" in line.lstrip("/") or line.startswith("/")
            line = line.lstrip("/")
            pattern = line if anchored else "**/" + line
            try:
                matcher = glob_regex(pattern)
            except ToolError:
                continue  # a glob too large to match safely: the rule is skipped
            count += 1
            if count > self.MAX_RULES:
                break
            source = matcher.pattern if isinstance(matcher, re.Pattern) else None
            last = groups[-1] if groups else None
            if last is not None and last[1:3] == [negate, dir_only] and last[3] is not None and source is not None:
                if source not in last[3]:
                    last[3].append(source)
            else:
                groups.append([matcher, negate, dir_only, [source] if source is not None else None])
        for group in groups:
            if group[3] is not None and len(group[3]) > 1:
                group[0] = re.compile("|".join("(?:%s)" % s for s in group[3]))
        if groups:
            self.rules[rel_dir] = groups

    def enter(self, rel_dir, dir_fd):
        """Read the .gitignore of a directory as the walk reaches it."""
        if rel_dir:
            self._load(rel_dir, dir_fd)

    def ignored(self, rel, is_dir):
        """The last matching rule decides; rules apply below their own directory, which the walk entered
        (and loaded) before anything in it, parents before children."""
        verdict = False
        base, end = "", -1
        while True:
            if groups := self.rules.get(base):
                sub = rel[end + 1:]
                for matcher, negate, dir_only, _ in groups:
                    if dir_only and not is_dir:
                        continue
                    if matcher.match(sub):
                        verdict = not negate
            end = rel.find("/", end + 1)
            if end == -1:
                return verdict
            base = rel[:end]


def _entry_kind(entry):
    """'dir', 'file', 'link' or 'special' for a DirEntry, never following a symlink."""
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "special"


def list_fd(fd):
    """The entries of an open directory, sorted by name, as (name, kind)."""
    with os.scandir(fd) as it:
        return sorted((e.name, _entry_kind(e)) for e in it)


def walk_files(jail, start, gitignore=True, include_dirs=False, check=None):
    """Yield (relpath, dir_fd, name, kind) under the directory Target `start`, in name order.

    The walk is walk_at's (by descriptors: a directory swapped for a symlink mid-walk is never entered),
    each directory's entries before what is below them. It skips VCS directories and ignored paths; kind is
    'dir', 'file', 'link' (never followed here: callers resolve it through the jail, and a link out of the
    tree is skipped) or 'special' (FIFO, socket, device). `dir_fd` is valid until the next item is asked
    for. `check()` runs before each entry (the deadline).
    """
    ignore = None
    if gitignore:
        root_fd = jail.open_root()
        try:
            ignore = GitIgnore(root_fd)
        finally:
            os.close(root_fd)
    first = display_path(start.real, jail.root)
    top = "" if first == "." else first + "/"

    def listing(fd, prefix):
        if prefix and ignore is not None:
            ignore.enter(top + prefix[:-1], fd)
        try:
            entries = list_fd(fd)
        except OSError:
            return []
        keep = []
        for name, kind in entries:
            rel, is_dir = top + prefix + name, kind == "dir"
            if is_dir and name in SKIP_DIRS:
                continue
            if jail.hidden_rel and is_dir and fold_path(rel) in jail.hidden_rel:
                continue  # XZATOMA_HOME in the tree: never listed, searched or copied
            if ignore is not None and ignore.rules and ignore.ignored(rel, is_dir):
                continue
            if kind == "link" and not _link_inside(jail, rel):
                continue
            keep.append((name, kind, is_dir))
        return keep

    for rel, fd, name, kind, _ in walk_at(start.dir_fd, start.name, check, listing, lenient=True, files_first=True):
        if rel and (kind != "dir" or include_dirs):
            yield top + rel, fd, name, kind


def _link_inside(jail, rel):
    try:
        with jail.resolve(rel):
            return True
    except (ToolError, OSError):
        return False


def _owner(st):
    try:
        import pwd
        return pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        return str(st.st_uid)


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

    LABELS = {"file": "file", "link": "link", "special": "other"}

    def run(self, args, ctx):
        path = args.get("path") or "."
        with ctx.jail.resolve(path, must_exist=True) as target:
            st = target.lstat()
            if not stat.S_ISDIR(st.st_mode):
                raise ToolError("not a directory: %s" % path)
            return self._list(args, ctx, target)

    def _list(self, args, ctx, target):
        pattern = args.get("pattern")
        lines, total, kinds = [], 0, {}
        base = display_path(target.real, ctx.root)
        if args.get("recursive") or (pattern and ("/" in pattern or "**" in pattern)):
            entries = walk_files(ctx.jail, target, include_dirs=True,
                                 check=lambda: ctx.check_deadline("list_directory"))
        else:
            entries = _flat_entries(target, "" if base == "." else base + "/")
        for rel, dir_fd, name, kind in entries:
            sub = rel if base == "." else rel[len(base) + 1:] if rel.startswith(base + "/") else rel
            if pattern and not glob_match(pattern, sub):
                continue
            total += 1
            ext = "directories" if kind == "dir" else os.path.splitext(name)[1].lower() or "no extension"
            kinds[ext] = kinds.get(ext, 0) + 1
            if len(lines) >= self.MAX_ENTRIES:
                continue
            if kind == "dir":
                lines.append("dir   %10s  %s/" % ("-", rel))
            else:
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    size, label = st.st_size, self.LABELS[kind] if kind != "special" else _kind_of(st.st_mode)
                except OSError:
                    size, label = 0, self.LABELS[kind]
                lines.append("%-5s %10s  %s" % (label, fmt_size(size), rel))
        if not lines:
            return ToolResult.ok("(no entries%s in %s)" % (" matching %s" % pattern if pattern else "", base),
                                 count=0)
        if total > len(lines):
            lines.append("... %d more entries not shown (narrow with pattern or a subdirectory)" % (total - len(lines)))
        if total > 1:  # counted here, so that "how many .md files" needs no counting by the model
            lines.append("(%s; %d entries in all)" % (", ".join(
                "%d %s" % (n, {"directories": "director" + ("y" if n == 1 else "ies"),
                               "no extension": ("file" if n == 1 else "files") + " without extension"}.get(
                                   ext, ext + (" file" if n == 1 else " files")))
                for ext, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))), total))
        return ToolResult.ok("\n".join(lines), count=total)


def _flat_entries(target, prefix):
    """(rel, dir_fd, name, kind) for the entries of one directory Target, in name order."""
    fd = target.open_dir()
    try:
        for name, kind in list_fd(fd):
            yield prefix + name, fd, name, kind
    finally:
        os.close(fd)


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
        start = args.get("start_line") or 1
        end = args.get("end_line")
        if end is not None and end < start:
            raise ToolError("end_line (%d) is before start_line (%d)" % (end, start))
        with ctx.jail.resolve(path, must_exist=True) as target:
            if stat.S_ISDIR(target.lstat().st_mode):
                raise ToolError("%s is a directory; use list_directory" % path)
            fd = target.open_regular("read_file only reads regular files")
            ctx.seen.add(target.real)
        with open(fd, "rb"):  # closes fd
            if is_binary_fd(fd):
                raise ToolError("%s is a binary file (%s); read_file only reads text" % (
                    path, fmt_size(os.fstat(fd).st_size)))
            max_bytes = ctx.limit("max_file_read_size", 10485760)
            budget = self.LINE_BUDGET if end is None else max(end - start + 1, 1)
            chunks = file_chunks(fd, lambda: ctx.check_deadline("read_file"), hole_as=self.LONG_LINE + 1)
            out, total, cut = self._scan(chunks, start, end, budget, max_bytes)
        if start > max(total, 1) and total:
            raise ToolError("start_line %d is past the end of %s (%d lines)" % (start, path, total))
        text = "".join(out)
        if cut:
            shown_end = start + len(out) - 1
            text += ("\n[Showing lines %d-%d of %d. Ask for more with start_line=%d (and end_line).]"
                     % (start, shown_end, total, shown_end + 1))
        return ToolResult.ok(text, lines=total, partial=cut)

    LONG_LINE = 65536

    def _scan(self, chunks, start, end, budget, max_bytes):
        """Stream the file in chunks: keep the wanted lines, count the rest; memory stays bounded."""
        out, used, number, cut = [], 0, 0, False
        carry, overlong = b"", False
        for chunk in chunks:
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


LOST_SHOWN = 4096  #: bytes: an overwritten file this small is shown in write_file's result when its content was lost


class WriteFile(Tool):
    name = "write_file"
    description = "Create or overwrite a text file with the given content; parent directories are created."
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}
    permission = WRITE

    def confirmation(self, args, ctx):
        with ctx.jail.resolve(args["path"]) as target:
            st = target.lstat()
            if st is None or not stat.S_ISREG(st.st_mode) or (st.st_size and target.real not in ctx.seen):
                return None  # nothing to replace, or the call is refused until the file is read (run)
            old = read_text(target, "")
            return "overwrite %s:\n%s" % (_named(args["path"], target, ctx), text_diff(
                old, args["content"], display_path(target.real, ctx.root), whole=True) or "(same content)")

    def run(self, args, ctx):
        path = args["path"]
        data = args["content"].encode("utf-8")
        with ctx.jail.resolve(path) as target:
            st = target.lstat()
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise ToolError("%s is a directory" % path)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise special_error(target, st.st_mode, "write_file only replaces regular files")
            if st is not None and looks_like_diff(args["content"]) and not path.endswith(PATCH_SUFFIXES):
                # a small model wrote an edit's diff back over the file it had just edited
                raise ToolError("the content is a diff, and write_file writes content as it is: %s would hold the "
                                "diff itself. To change part of a file use edit_file; to replace it, give the "
                                "whole new text" % path)
            lost = lost_credentials(path, read_text(target, ""), args["content"]) \
                if st is not None and REDACTED in args["content"] else None
            if lost:
                raise ToolError(lost)
            approved = ctx.guard(self.name, args, target, shows=lambda: _change_shown(
                read_text(target, "") if st is not None else "", args["content"], target))
            if approved:
                ctx.seen.add(target.real)  # the person saw the change, and said yes
            if st is not None and st.st_size and target.real not in ctx.seen:
                # INFO: a file is replaced only by an agent that has seen it (Claude Code's Write asks the same):
                # a small model asked to add a line to todo.txt wrote the line alone over the list, and one asked
                # to bump a version wrote {"version": "2.4.1"} over package.json. Refused once, with the content
                # (after the walls: a protected path gets its own message first).
                ctx.seen.add(target.real)
                raise ToolError("%s already exists and you have not read it; write_file would replace all of it. "
                                "It holds now:\n%s\nTo add or change lines, use edit_file; to replace the file, "
                                "call write_file again with the complete new content" % (
                                    path, head_of(read_text(target, ""), LOST_SHOWN)))
            # the file as it is, for the checks of what the write would do (a person who approved it saw that)
            now = read_text(target, "") if not approved and st is not None and 0 < st.st_size <= 262144 else None
            if now is not None and same_words(now, args["content"]):
                # INFO: a small model handed a file (read_named) wrote it straight back, in three tasks of ten
                # (a rename, a fix, a script to run), then said the work was done; nothing is written, and the
                # way to change white space alone is said
                # (after a change of its own, a 1.5B model wrote the changed file back again and again: told the
                # change is made; told so about a file it had not changed, a model answered that none was needed)
                raise ToolError("%s already holds that text (at most its white space differs): nothing was "
                                "written. %s; to change only white space, use edit_file" % (path, (
                                    "It reads as your change left it: if the task is done, answer in one sentence; "
                                    "if not, make the next change" if target.real in ctx.made else
                                    "Write the new text the task asks for")))
            dropped = only_dropped(now, args["content"]) if now is not None and \
                (target.real, args["content"]) not in ctx.warned else None
            if dropped:
                # INFO: a plan said "create notes.md with '# Notes'", then "append '- item one'": a 1.5B model
                # wrote both lines, then wrote '- item one' alone over them; refused once, as a deletion can be meant
                ctx.warned.add((target.real, args["content"]))
                raise ToolError("write_file replaces the whole file, and this text keeps only lines %s has already: "
                                "%d would be gone (%s). To add lines, use edit_file (an empty old_text adds "
                                "new_text at the end); if removing them is the task, make this same call again" % (
                                    path, len(dropped), "; ".join(d[:60] for d in dropped[:3]) + (
                                        " …" if len(dropped) > 3 else "")), again=True)
            ctx.check_undo_cap(self.name, target, args)
            old = (read_text(target, "") if now is None else now) if st is not None and st.st_size <= LOST_SHOWN \
                else None
            token = ctx.before_create(self.name, target)
            target.make_parents()
            write_atomic_at(target.dir_fd, target.name, data)
            ctx.after_change(token)
            ctx.seen.add(target.real)
            ctx.made.add(target.real)
            shown = display_path(target.real, ctx.root)
            if st is None:
                return ToolResult.ok("Created %s (%d bytes)" % (shown, len(data)), bytes=len(data), created=True,
                                     changed=shown, doubt=change_doubt(shown, None, args["content"]))
            # what the old content became, said plainly, and shown when the new one lost it: a small model that
            # meant to add a line replaced a whole to-do list with it, and could not know what was gone
            lost = "" if not old or old.strip() in args["content"] else \
                " Its content before was:\n%s" % old.rstrip("\n")
            return ToolResult.ok("Overwrote %s (%d bytes; it had %d before: its whole content was replaced).%s" % (
                shown, len(data), st.st_size, lost), bytes=len(data), created=False, changed=shown,
                doubt=change_doubt(shown, old, args["content"], whole=True))


class EditFile(Tool):
    name = "edit_file"
    description = ("Replace old_text with new_text in a file. old_text must occur exactly once "
                   "unless replace_all is true; an empty old_text adds new_text at the end of the file. "
                   "Returns the changed lines as they now read.")
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False}},
        "required": ["path", "old_text", "new_text"]}
    permission = WRITE

    def confirmation(self, args, ctx):
        try:
            with ctx.jail.resolve(args["path"], must_exist=True) as target:
                text, updated, _ = self._apply(args, target)
            shown = _named(args["path"], target, ctx)
        except ToolError:
            return None  # the call will fail with its own message; nothing to confirm
        return "edit %s:\n%s" % (shown, text_diff(text, updated, display_path(target.real, ctx.root), whole=True))

    def _apply(self, args, target):
        path, old, new = args["path"], args["old_text"], args["new_text"]
        if stat.S_ISDIR(target.lstat().st_mode):
            raise ToolError("%s is a directory" % path)
        try:
            text = read_text(target, "edit_file only edits regular files", errors="strict")
        except UnicodeDecodeError:
            raise ToolError("%s is not valid UTF-8 text; edit_file only edits text" % path)
        if not old:  # nothing to find: new_text goes at the end (as an empty SEARCH block appends in aider), on a
            # line of its own; small models asked to add a line wrote exactly this call
            return text, text + ("\n" if text and not text.endswith("\n") else "") + new, None
        count = text.count(old)
        loose = loose_replacement(text, old, new) if count == 0 else None
        if loose:
            start, end, put = loose
            return text, text[:start] + put + text[end:], "old_text matched where only quotes or spacing differ"
        if count == 0:
            message, whole = missing_text(path, text, old, new, LOST_SHOWN)
            raise ToolError(message, shows_file=whole)  # shown whole: the model has read it now (ToolContext.seen)
        if count > 1 and not args.get("replace_all"):
            raise ToolError(several_places(path, text, args))
        return text, text.replace(old, new), None

    def run(self, args, ctx):
        with ctx.jail.resolve(args["path"], must_exist=True) as target:
            try:
                text, updated, loose = self._apply(args, target)
            except ToolError as exc:
                if exc.metadata.get("shows_file"):
                    ctx.seen.add(target.real)
                raise
            if updated == text:
                # INFO: an edit that changes nothing is no change: a 1.5B model "renamed" cnt with new_text equal to
                # old_text, was told it had made a change, and said the task was done (status completed)
                ctx.seen.add(target.real)
                raise ToolError("new_text is the same as old_text: nothing was changed in %s. Put in new_text the "
                                "text as the task wants it" % args["path"])
            lost = lost_credentials(args["path"], text, updated)
            if lost:
                raise ToolError(lost)
            ctx.guard(self.name, args, target, shows=lambda: _change_shown(text, updated, target))
            # over the undo cap the record would hold the file cut short, and undo "restored" it so (round 19b)
            ctx.check_undo_cap(self.name, target, args)
            token = ctx.before_change(self.name, target)
            write_atomic_at(target.dir_fd, target.name, updated.encode("utf-8"))
            ctx.after_change(token)
            ctx.seen.add(target.real)
            ctx.made.add(target.real)
            shown = display_path(target.real, ctx.root)
            diff = text_diff(text, updated, shown)
        count = text.count(args["old_text"]) if args["old_text"] and not loose else 1
        # The lines as they now read, numbered like `cat -n`, not a diff: small models took a diff (even after
        # "saved.") for text to write back, and overwrote the file they had just edited with it.
        first, last, lines = changed_lines(text, updated)
        return ToolResult.ok("Edited %s: %s, saved. Lines %d-%d now read:\n%s" % (
            shown, "new_text added at the end" if not args["old_text"] else loose or "%d replacement%s" % (
                count, "" if count == 1 else "s"), first, last, lines), replacements=count, diff=diff,
            changed=shown, doubt=change_doubt(shown, args["old_text"], args["new_text"], within=text) or (
                None if args["old_text"] else APPENDED % shown))


class FindPath(Tool):
    name = "find_path"
    description = "Find paths matching a glob (e.g. '**/*.py'), sorted, paged with limit and offset."
    parameters = {"type": "object", "properties": {
        "glob": {"type": "string"}, "path": {"type": "string", "default": "."},
        "limit": {"type": "integer", "minimum": 1, "default": 50},
        "offset": {"type": "integer", "minimum": 0, "default": 0}}, "required": ["glob"]}

    def run(self, args, ctx):
        pattern = args["glob"]
        found = []
        with ctx.jail.resolve(args.get("path") or ".", must_exist=True) as target:
            if not stat.S_ISDIR(target.lstat().st_mode):
                raise ToolError("not a directory: %s" % (args.get("path") or "."))
            base = display_path(target.real, ctx.root)
            for rel, _, _, _ in walk_files(ctx.jail, target, include_dirs=True,
                                           check=lambda: ctx.check_deadline("find_path")):
                sub = rel if base == "." else rel[len(base) + 1:]
                if glob_match(pattern, sub):
                    found.append(rel)
        found.sort()
        limit, offset = args.get("limit") or 50, args.get("offset") or 0
        if not (page := found[offset: offset + limit]):
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
        with ctx.jail.resolve(args.get("path") or ".", must_exist=True) as target:
            found = self._search(args, ctx, target)
            looser = found.metadata.get("matches") == 0 and _looser_pattern(args)
            if looser:
                # INFO: a pattern that finds nothing is tried again as its longest word, in any case: a small
                # model asked which file defines parse_args grepped for "parse_args.py", found nothing, and
                # answered that no file does
                wider = self._search(dict(args, pattern=looser, fixed_string=True, case_sensitive=False,
                                          context_lines=0, max_results=20), ctx, target)
                if wider.metadata.get("matches"):
                    return ToolResult.ok("%s\nLines with %s, in any case:\n%s" % (
                        found.output, looser, wider.output), matches=0, looser=wider.metadata["matches"])
            return found

    def _search(self, args, ctx, target):
        # ^ and $ anchor at each line, as in grep (re alone anchors them at the file's ends)
        flags = re.MULTILINE | (0 if args.get("case_sensitive", True) else re.IGNORECASE)
        pattern = args["pattern"]
        literal = args.get("fixed_string") or not (set(pattern) & _REGEX_SPECIAL)
        if literal:  # searching for a literal is linear: it stays in this process
            matcher = _LiteralMatcher(re.compile(re.escape(pattern), flags))
        else:
            matcher = _RegexWorker(pattern, flags, ctx.deadline, ctx.limit("grep_regex_seconds", GREP_REGEX_SECONDS))
        try:
            return self._walk(args, ctx, target, flags, matcher)
        finally:
            matcher.close()

    def _walk(self, args, ctx, target, flags, matcher):
        include, exclude = args.get("include"), args.get("exclude")
        ctx_lines = args.get("context_lines") or 0
        max_results = args.get("max_results") or 100
        if stat.S_ISDIR(target.lstat().st_mode):
            files = walk_files(ctx.jail, target, check=lambda: ctx.check_deadline("grep"))
        else:  # one file named: what it is decides, before anything opens it
            kind = "file" if stat.S_ISREG(target.lstat().st_mode) else "special"
            files = [(display_path(target.real, ctx.root), target.dir_fd, target.name, kind)]
        quick = _byte_prefilter(args["pattern"], args.get("fixed_string"), flags)
        out, hits, special, batch, size = [], 0, [], [], 0

        def show(done):  # the results of one batch: (rel, data) pairs and (count, [line, ...]) for each
            nonlocal hits
            for (rel, data), (count, found) in done:
                hits += count
                if not (found := found[:max(0, max_results - len(out))]):
                    continue
                lines = data.decode("utf-8", "replace").split("\n")
                for i in found:
                    first, last = max(0, i - ctx_lines), min(len(lines), i + 1 + ctx_lines)
                    out.append(["%s%s%d%s %s" % (rel, ":" if j == i else "-", j + 1, ":" if j == i else "-",
                                                  lines[j].rstrip("\r")) for j in range(first, last)])

        whole = None  #: the one file named, read whole (for a pattern that matches nothing in it)
        for rel, dir_fd, name, kind in files:
            if include and not glob_match(include, rel):
                continue
            if exclude and glob_match(exclude, rel):
                continue
            if kind == "special":
                special.append(rel)
                continue
            if (data := _grep_read(ctx, rel, dir_fd, name, kind)) is None:
                special.append(rel)
                continue
            whole = data if isinstance(files, list) and len(files) == 1 else None
            if b"\x00" in data[:8192] or (quick is not None and not quick(data)):
                continue  # binary, or cannot contain a match
            batch.append((rel, data))
            size += len(data)
            if matcher.full(len(batch), size):
                show(matcher.feed(batch, max(0, max_results - len(out))))
                batch, size = [], 0
        show(matcher.feed(batch, max(0, max_results - len(out))) if batch else [])
        show(matcher.finish())
        note = ("[skipped %d special file%s (FIFO, socket or device), not read: %s]" % (
            len(special), "" if len(special) == 1 else "s", ", ".join(special[:10]) + (" …" if len(special) > 10 else ""))
            if special else "")
        if not out:  # what to do next, said: small models looked for file names with grep, or for a concept
            one = isinstance(files, list)  # one file named (a directory is walked)
            hint = ("in %s (read_file shows all of it)" % files[0][0] if one else
                    "in the files' contents (list_directory lists names)")
            if one and whole is not None and len(whole) <= GREP_WHOLE and b"\x00" not in whole:
                # a small model grepped settings.ini for a key it imagined (server_port) three times over:
                # the small file it asked about, shown, answers what the pattern missed
                hint = "in %s; it is small, so here it is whole:\n%s" % (
                    files[0][0], whole.decode("utf-8", "replace").rstrip("\n"))
            return ToolResult.ok("no matches for %s %s" % (args["pattern"], hint) + ("\n" + note if note else ""),
                                 matches=0)
        text_out = [line for block in out for line in block]
        if hits > len(out):
            text_out.append("... stopped at %d results; %d more matches not shown" % (len(out), hits - len(out)))
        if note:
            text_out.append(note)
        return ToolResult.ok("\n".join(text_out), matches=hits)


def _looser_pattern(args):
    """The longest word of a grep pattern (parse_args of "parse_args.py", Timeout of "Timeout:"), when searching
    for it, as a literal in any case, is a different search; else None."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]{2,}", args["pattern"])
    if not words:
        return None
    word = max(words, key=len)
    same = word == args["pattern"] and not args.get("case_sensitive", True)
    return None if same else word


GREP_WHOLE = 2048  #: bytes of a single file grep shows whole when the pattern matches nothing in it


def grep_match_lines(regex, text, need):
    """(lines that match, the first `need` of their 0-based numbers), lines split at '\\n' only."""
    count, found, last, starts = 0, [], -1, None
    end = len(text) if text.endswith("\n") or not text else None  # after the last newline there is no line
    for m in regex.finditer(text):
        if m.start() == end:
            break  # `.*` matched there: grep counted an empty line 13 in a file of 12
        if starts is None:
            starts = _line_starts(text)
        i = _line_of(starts, m.start())
        if i == last:
            continue  # several matches on one line count once
        last, count = i, count + 1
        if len(found) < need:
            found.append(i)
    return count, found


class _LiteralMatcher:
    """Literal patterns: matched here, one file at a time (searching for a literal is linear)."""

    def __init__(self, regex):
        self.regex = regex

    def full(self, files, size):
        return True

    def feed(self, batch, need):
        return [(item, grep_match_lines(self.regex, item[1].decode("utf-8", "replace"), need)) for item in batch]

    def finish(self):
        return []

    def close(self):
        pass


#: How long one grep call may spend matching a regular expression when the run has no deadline of its own.
GREP_REGEX_SECONDS = 60


class _RegexWorker:
    """A model's regular expression is matched in a small worker process (`python -I -S`, ~20 ms), so that
    a catastrophic pattern (`(a+)+$` on a line of a's) is stopped at the run's deadline or after
    `grep_regex_seconds`. INFO: nothing in this process could stop it: `re` holds the GIL while it
    backtracks and runs no signal handler until it returns.

    Batches of file bytes go through two shared-memory slots (memfd), so the worker matches one batch while
    this process reads the next; the pipes carry only small JSON lines, so a write here never waits on a
    stuck worker and every wait is a select() bounded by the deadline."""

    BATCH_BYTES, BATCH_FILES = 4 << 20, 512

    def __init__(self, pattern, flags, deadline, seconds=GREP_REGEX_SECONDS):
        import subprocess
        self.seconds = seconds
        own = time.monotonic() + seconds
        self.deadline = own if deadline is None else min(deadline, own)
        self.own_limit = deadline is None or own < deadline
        self.slots = [_shared_memory(), _shared_memory()]
        self.free = [0, 1]
        self.pending = []  # (slot, batch) sent, in order, whose answers have not been read
        self._buf = b""
        here = os.path.dirname(os.path.abspath(__file__))
        boot = "import sys; sys.path.insert(0, %r); import xzatoma_tools; xzatoma_tools._grep_worker()" % here
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", boot], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={}, bufsize=0,
                                         pass_fds=self.slots)
        except OSError as exc:
            self._close_slots()
            raise ToolError("grep could not start its regular-expression worker: %s" % exc)
        self._send({"pattern": pattern, "flags": flags, "slots": self.slots})
        reply = self._reply()
        if "error" in reply:
            self.close()
            raise ToolError("invalid regular expression %r: %s (set fixed_string=true for a literal)"
                            % (pattern, reply["error"]))

    def full(self, files, size):
        return files >= self.BATCH_FILES or size >= self.BATCH_BYTES

    def feed(self, batch, need):
        """Send a batch; returns the answers of batches that had to be waited for to free a slot."""
        done = []
        if not self.free:
            done += self._collect()
        slot = self.free.pop(0)
        fd, blobs = self.slots[slot], [d for _, d in batch]
        total = sum(len(b) for b in blobs)
        os.ftruncate(fd, total)
        written = os.pwritev(fd, blobs, 0) if blobs else 0  # BATCH_FILES stays below IOV_MAX (1024)
        if written < total:  # a short write (rare): the rest in one piece
            rest = memoryview(b"".join(blobs))
            while written < total:
                written += os.pwrite(fd, rest[written:], written)
        self._send({"slot": slot, "need": need, "sizes": [len(b) for b in blobs]})
        self.pending.append((slot, batch))
        return done

    def finish(self):
        return [answer for _ in list(self.pending) for answer in self._collect()]

    def _collect(self):
        slot, batch = self.pending.pop(0)
        answers = self._reply()
        self.free.append(slot)
        return list(zip(batch, [tuple(a) for a in answers]))

    def _send(self, message):
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")  # small: the pipe never fills
        except OSError:
            self._fail()

    def _reply(self):
        import select
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.close()
                if self.own_limit:
                    raise ToolError("grep stopped: matching the regular expression took longer than %g s (it may "
                                    "backtrack catastrophically); simplify it, or set fixed_string=true for a literal"
                                    % self.seconds)
                raise ToolError("grep stopped: the run's time limit was reached while matching the regular "
                                "expression (it may backtrack catastrophically); simplify it")
            if not (chunk := os.read(fd, 1 << 16)):
                self._fail()
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _fail(self):
        code = self.proc.poll()
        self.close()
        raise ToolError("grep's regular-expression worker ended unexpectedly%s; simplify the pattern"
                        % ("" if code is None else " (exit status %d, perhaps out of memory)" % code))

    def _close_slots(self):
        for fd in self.slots:
            try:
                os.close(fd)
            except OSError:
                pass
        self.slots = []

    def close(self):
        if (proc := getattr(self, "proc", None)) is not None:
            if proc.poll() is None:
                proc.kill()
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            proc.wait()
        self._close_slots()


def _shared_memory():
    """An anonymous file both processes can map (memfd on Linux, an unlinked temporary file elsewhere)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("xzatoma-grep", os.MFD_CLOEXEC)
    import tempfile
    with tempfile.TemporaryFile() as fh:
        return os.dup(fh.fileno())


def _grep_worker():
    """The worker's side: a JSON header line {pattern, flags, slots}; then per batch a JSON line
    {slot, need, sizes} naming bytes in a shared-memory slot; it answers each with [[count, [line, ...]], ...]."""
    import mmap
    try:
        import resource  # a pattern or text that would eat the machine's memory ends this process instead
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    except (ImportError, ValueError, OSError):
        pass
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    head = json.loads(inp.readline())
    try:
        regex = re.compile(head["pattern"], head["flags"])
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        out.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        out.flush()
        return
    out.write(b"{}\n")
    out.flush()
    for line in iter(inp.readline, b""):
        req = json.loads(line)
        need, replies, offset, total = req["need"], [], 0, sum(req["sizes"])
        view = mmap.mmap(head["slots"][req["slot"]], total, access=mmap.ACCESS_READ) if total else b""
        try:
            for n in req["sizes"]:
                count, found = grep_match_lines(regex, view[offset:offset + n].decode("utf-8", "replace"), need)
                offset += n
                need -= len(found)
                replies.append([count, found])
        finally:
            if total:
                view.close()
        out.write(json.dumps(replies).encode() + b"\n")
        out.flush()


def _grep_read(ctx, rel, dir_fd, name, kind):
    """The bytes of one file for grep; b'' for what cannot be read, None for a special file."""
    ctx.check_deadline("grep")
    try:
        if kind == "link":  # followed through the jail: in-tree targets only (the walk skipped the others)
            with ctx.jail.resolve(rel) as target:
                st = target.lstat()
                if st is None or stat.S_ISDIR(st.st_mode):
                    return b""
                if not stat.S_ISREG(st.st_mode):
                    return None  # never opened (open_if_regular)
                fd = target.open_file(os.O_RDONLY)
        else:
            fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    except (OSError, ToolError):
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return read_fd(fd, MAX_WHOLE_FILE, size=min(st.st_size, MAX_WHOLE_FILE))  # a huge file: its head
    finally:
        os.close(fd)


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
    runs, run, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c in "(|)":  # a group, an inline flag such as (?i) or (?x), or an alternative: unsure
            return ""
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _REGEX_SPECIAL or nxt in "/-'\" #":
                char, i = nxt, i + 2
            else:  # \d, \w, \b, ...: not a literal
                runs.append(run)
                run, i = "", i + 2
                continue
        elif c == "[":  # a class; a ']' first (after an optional '^') is a member, not its end
            close = pattern.find("]", i + (3 if pattern[i + 1:i + 2] == "^" else 2))
            runs.append(run)
            run, i = "", (close + 1 if close != -1 else len(pattern))
            continue
        elif c in ".^$":
            runs.append(run)
            run, i = "", i + 1
            continue
        elif c in "*?{+":  # a quantifier after a class, escape or group: its operand was never added to run
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


# ---- File tools: plans, copies, moves, deletions, metadata ----

class PlanTool(Tool):
    name = "plan"
    description = ("Parse a plan file (JSON, YAML or Markdown) and return its goal, context and "
                   "numbered instructions, or the parse error with its line.")
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def run(self, args, ctx):
        from xzatoma_plans import PlanError, parse_plan
        with ctx.jail.resolve(args["path"], must_exist=True) as target:
            text = read_text(target, "plan reads plan files only")
            source = display_path(target.real, ctx.root)
        try:
            plan = parse_plan(text, source=source)
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
    follow_source = True  # cp copies what a link names; mv renames the link itself

    def confirmation(self, args, ctx):
        question = self._question(args, ctx)
        return question[0] if question and question[1] and args.get("overwrite") else None

    def _question(self, args, ctx):
        """(question, over an existing one) naming what changes as the tool will find it: a destination that is a
        link is the file it leads to, an existing directory the name inside it (`copy draft.txt over the existing
        notes.md` wrote deploy/prod.sh, never named: round 19e); None when the call will fail anyway."""
        try:
            src, dst = self._targets(args, ctx)
        except ToolError:
            return None
        with src, dst:
            exists = dst.lstat() is not None
            source, destination = _named(args["source_path"], src, ctx), _named(args["destination_path"], dst, ctx)
        verb = self.name.split("_")[0]
        if exists:
            return "%s %s over the existing %s" % (verb, source, destination), True
        return "%s %s to %s" % (verb, source, destination), False

    def _targets(self, args, ctx):
        """(source, destination) Targets, both open; the destination checked against the source."""
        src = ctx.jail.resolve(args["source_path"], follow=self.follow_source, must_exist=True)
        try:
            dst = ctx.jail.resolve(args["destination_path"])
            src_st, dst_st = src.lstat(), dst.lstat()
            if dst_st is not None and stat.S_ISDIR(dst_st.st_mode) and not stat.S_ISDIR(src_st.st_mode):
                inner = ctx.jail.resolve(os.path.join(dst.real, src.name if not src.is_root else "."),
                                         follow=False)
                dst.close()
                dst = inner  # like cp file dir/
            self._check_destination(args, ctx, src, dst)
            return src, dst
        except BaseException:
            src.close()
            if "dst" in locals():
                dst.close()
            raise

    def _check_destination(self, args, ctx, src, dst):
        src_real, dst_real = src.real, dst.real
        if src.is_root:
            raise ToolError("refusing to %s the working directory itself" % self.name.split("_")[0])
        if dst_real == ctx.root:
            raise ToolError("refusing to %s onto the working directory itself (%s)" % (
                self.name.split("_")[0], args["destination_path"]))
        if src_real == dst_real:
            raise ToolError("source and destination are the same: %s" % args["source_path"])
        if _inside(src_real, dst_real):
            raise ToolError("the destination %s contains the source %s; replacing it would destroy the source"
                            % (display_path(dst_real, ctx.root), args["source_path"]))
        if stat.S_ISDIR(src.lstat().st_mode) and _inside(dst_real, src_real):
            raise ToolError("cannot put %s inside itself" % args["source_path"])
        if stat.S_ISDIR(src.lstat().st_mode) and ctx.jail.hides(src_real):
            raise ToolError("%s holds XZATOMA_HOME (xzatoma's credentials and conversations): no tool copies or "
                            "moves it" % args["source_path"])
        if dst.lstat() is not None and not args.get("overwrite"):
            raise ToolError("%s already exists; set overwrite=true to replace it" % display_path(dst_real, ctx.root))

    def run(self, args, ctx):
        src, dst = self._targets(args, ctx)
        try:
            return self._run(args, ctx, src, dst)
        finally:
            src.close()
            dst.close()

    def _replace_destination(self, args, ctx, dst, src=None):
        """Clear an existing destination (overwrite=true), recorded for undo; returns the undo token.
        `src` (a copy's source) is checked for protected paths it would create below the destination."""
        ctx.guard(self.name, args, dst, src, shows=lambda: _copy_shown(src, dst))
        if dst.lstat() is None:
            return None
        ctx.check_undo_cap(self.name, dst, args)
        token = ctx.before_change(self.name, dst)
        remove_at(dst.dir_fd, dst.name, lambda: ctx.check_deadline(self.name))
        return token

    def _run(self, args, ctx, src, dst):
        st = src.lstat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise special_error(src, st.st_mode, "copy_path copies files, directories and links")
        _keeps_credentials(args, src, dst)
        if (token := self._replace_destination(args, ctx, dst, src)) is None:
            token = ctx.before_create(self.name, dst)
        dst.make_parents()
        skipped = []
        check = lambda: ctx.check_deadline(self.name)  # noqa: E731
        count = copy_at(src.dir_fd, src.name, dst.dir_fd, dst.name, check, skipped)
        escaping = escaping_links(ctx.jail, dst.real, check)
        for path in escaping:  # a link that would lead out of the tree from its new place is not kept
            with ctx.jail.resolve(path, follow=False) as link:
                os.unlink(link.name, dir_fd=link.dir_fd)
        count -= len(escaping)
        ctx.after_change(token)
        return ToolResult.ok("%s %s to %s (%d item%s)%s%s" % (
            self.verb.capitalize(), display_path(src.real, ctx.root), display_path(dst.real, ctx.root), count,
            "" if count == 1 else "s", _skipped_note(skipped), _escaping_note(escaping)), items=count)


def _change_shown(old, new, target):
    """The diff a protected change is asked with ('(same content)' when there is none)."""
    return text_diff(old, new, display_path(target.real, target.root), whole=True) or "(same content)"


def _copy_shown(src, dst):
    """What copying or moving `src` over `dst` writes there: a text file's diff, else what it is."""
    st, dst_st = src.lstat(), dst.lstat()
    if st is None or not stat.S_ISREG(st.st_mode):
        return "(%s %s, %d item%s)" % (_kind_of(st.st_mode) if st else "nothing at", display_path(
            src.real, src.root), tree_count_at(src), "" if tree_count_at(src) == 1 else "s")
    fd = src.open_regular("")
    try:
        if is_binary_fd(fd):
            return "(binary file %s, %s)" % (display_path(src.real, src.root), fmt_size(os.fstat(fd).st_size))
        new = read_whole(fd, display_path(src.real, src.root)).decode("utf-8", "replace")
    finally:
        os.close(fd)
    old = read_text(dst, "") if dst_st is not None and stat.S_ISREG(dst_st.st_mode) else ""
    return _change_shown(old, new, dst)


def _escaping_note(links):
    if not links:
        return ""
    return "; left out %d link%s that would lead outside the working directory from there: %s" % (
        len(links), "" if len(links) == 1 else "s", ", ".join(links[:10]))


def _skipped_note(skipped):
    if not skipped:
        return ""
    return "; skipped %d special file%s (FIFO, socket or device): %s" % (
        len(skipped), "" if len(skipped) == 1 else "s", ", ".join(skipped[:10]))


def _keeps_credentials(args, src, dst, most=1 << 20):
    """ToolError when a file copied or moved over another puts [REDACTED] where that one held a credential (a
    write_file refused, then `write a.env.new` and a move over a.env, lost the key: round 19f); files up to
    `most` bytes, as write_file's check reads them."""
    sst, dst_st = src.lstat(), dst.lstat()
    if sst is None or dst_st is None or not (stat.S_ISREG(sst.st_mode) and stat.S_ISREG(dst_st.st_mode)) or \
            max(sst.st_size, dst_st.st_size) > most:
        return
    new = read_text(src, "")
    if REDACTED in new:
        lost = lost_credentials(args["destination_path"], read_text(dst, ""), new)
        if lost:
            raise ToolError(lost)


class MovePath(CopyPath):
    name = "move_path"
    description = "Move or rename a file or directory. overwrite=true replaces an existing destination."
    verb = "moved"
    follow_source = False

    def confirmation(self, args, ctx):
        """Always asked in Safe mode: a move takes the source's name away, as a delete does. Asked only over an
        existing destination, `move run.sh .old` then `write_file run.sh` replaced a file with no question
        (round 19c)."""
        question = self._question(args, ctx)
        return question[0] if question else None

    def _refuse_escaping(self, links, args):
        raise ToolError("moving %s to %s would make the link%s %s lead outside the working directory; not moved" % (
            args["source_path"], args["destination_path"], "" if len(links) == 1 else "s", ", ".join(links[:10])))

    def _run(self, args, ctx, src, dst):
        ctx.guard(self.name, args, src)
        _keeps_credentials(args, src, dst)
        # the tree is judged at its new place, as a copy's is: a staged `evil.pth` moved in as site-packages
        # runs at the next Python start; and the question shows what lands there (round 19b: without src it
        # was never checked, and in chat the question crashed)
        if (token := self._replace_destination(args, ctx, dst, src)) is not None:
            ctx.after_change(token, expected="absent")  # undone after the move back, when dst is gone again
        check = lambda: ctx.check_deadline(self.name)  # noqa: E731
        count = tree_count_at(src, check)
        st = src.lstat()
        if stat.S_ISLNK(st.st_mode):  # the plain case first, before anything changes
            link = os.readlink(src.name, dir_fd=src.dir_fd)
            if not link.startswith("/") and _leads_out(ctx.jail, os.path.join(os.path.dirname(dst.real), link)):
                self._refuse_escaping([args["source_path"]], args)
        dst.make_parents()
        token = ctx.record_move(src.real, dst.real)
        copied = False
        try:
            os.rename(src.name, dst.name, src_dir_fd=src.dir_fd, dst_dir_fd=dst.dir_fd)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            copy_at(src.dir_fd, src.name, dst.dir_fd, dst.name, check, [])
            copied = True
        escaping = escaping_links(ctx.jail, dst.real, check) if not stat.S_ISREG(st.st_mode) else []
        if escaping:  # links inside the tree that lead out from its new place: put it back
            if copied:
                remove_at(dst.dir_fd, dst.name)
            else:
                os.rename(dst.name, src.name, src_dir_fd=dst.dir_fd, dst_dir_fd=src.dir_fd)
            ctx.forget_change(token)
            self._refuse_escaping(escaping, args)
        if copied:
            remove_at(src.dir_fd, src.name)
        ctx.after_change(token)
        return ToolResult.ok("Moved %s to %s (%d item%s)" % (display_path(src.real, ctx.root),
                                                            display_path(dst.real, ctx.root), count,
                                                            "" if count == 1 else "s"), items=count)


def _leads_out(jail, path):
    try:
        jail.resolve(path).close()
    except JailError:
        return True
    except (ToolError, OSError):
        pass
    return False


class DeletePath(Tool):
    name = "delete_path"
    description = ("Delete a file or directory. A non-empty directory needs recursive=true. A symlink is "
                   "removed itself, never what it points to.")
    parameters = {"type": "object", "properties": {
        "path": {"type": "string"}, "recursive": {"type": "boolean", "default": False}}, "required": ["path"]}
    permission = WRITE

    def confirmation(self, args, ctx):
        with ctx.jail.resolve(args["path"], follow=False) as target:
            if target.lstat() is None:
                return None
            count = tree_count_at(target)
            named = _named(args["path"], target, ctx)  # `notes/prod.sh` through a link to deploy (round 19e)
        return "delete %s (%d item%s)" % (named, count, "" if count == 1 else "s")

    def run(self, args, ctx):
        path = args["path"]
        with ctx.jail.resolve(path, follow=False, must_exist=True) as target:
            if target.is_root:
                raise ToolError("refusing to delete the working directory itself")
            st = target.lstat()
            count = tree_count_at(target, lambda: ctx.check_deadline(self.name))
            if stat.S_ISDIR(st.st_mode) and count > 1 and not args.get("recursive"):
                raise ToolError("%s is a non-empty directory (%d items); set recursive=true to delete it"
                                % (path, count - 1))
            ctx.guard(self.name, args, target)
            ctx.check_undo_cap(self.name, target, args)
            token = ctx.before_change(self.name, target)
            remove_at(target.dir_fd, target.name, lambda: ctx.check_deadline(self.name))
            ctx.after_change(token)
            return ToolResult.ok("Deleted %s (%d item%s)" % (display_path(target.real, ctx.root), count,
                                                            "" if count == 1 else "s"), items=count)


class CreateDirectory(Tool):
    name = "create_directory"
    description = "Create a directory and any missing parents (like mkdir -p)."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    permission = WRITE

    def run(self, args, ctx):
        with ctx.jail.resolve(args["path"]) as target:
            st = target.lstat()
            if st is not None and stat.S_ISDIR(st.st_mode):
                return ToolResult.ok("%s already exists" % display_path(target.real, ctx.root), created=False)
            if st is not None:
                raise ToolError("%s exists and is not a directory" % args["path"])
            ctx.guard(self.name, args, target)
            token = ctx.before_create(self.name, target)
            target.make_parents()
            os.mkdir(target.name, 0o777, dir_fd=target.dir_fd)
            ctx.after_change(token)
            return ToolResult.ok("Created directory %s" % display_path(target.real, ctx.root), created=True)


class FileMetadata(Tool):
    name = "file_metadata"
    description = "Type, size, permissions, owner, modification and change times, symlink target, and line count."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def run(self, args, ctx):
        path = args["path"]
        with ctx.jail.resolve(path, must_exist=True) as resolved, ctx.jail.resolve(path, follow=False) as entry:
            st = entry.lstat() or resolved.lstat()
            kind = _kind_of(st.st_mode)
            kind = kind if kind in ("file", "directory", "symlink") else "other (%s)" % kind
            lines = ["path: %s" % display_path(resolved.real, ctx.root), "type: %s" % kind,
                     "size: %d bytes (%s)" % (st.st_size, fmt_size(st.st_size)),
                     "mode: %s (%s)" % (oct(stat.S_IMODE(st.st_mode)), stat.filemode(st.st_mode)),
                     "owner: %s" % _owner(st), "modified: %s" % rfc3339(st.st_mtime),
                     "changed: %s" % rfc3339(st.st_ctime)]
            if kind == "symlink":
                lines.append("target: %s" % display_path(resolved.real, ctx.root))
            real_st = resolved.lstat()
            if stat.S_ISREG(real_st.st_mode):
                fd = resolved.open_regular("")
                try:
                    if not is_binary_fd(fd):
                        count = 0
                        for chunk in file_chunks(fd, lambda: ctx.check_deadline(self.name)):
                            count += chunk.count(b"\n")
                        lines.append("lines: %d" % count)
                finally:
                    os.close(fd)
            elif stat.S_ISDIR(real_st.st_mode):
                fd = resolved.open_dir()
                try:
                    lines.append("entries: %d" % len(os.listdir(fd)))
                finally:
                    os.close(fd)
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
            with ctx.jail.resolve(args[key], must_exist=True) as target:
                st = target.lstat()
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError("%s is not a text file" % args[key])
                fd = target.open_regular("diff_files compares regular files")
            try:
                if is_binary_fd(fd):
                    raise ToolError("%s is not a text file" % args[key])
                texts.append(read_whole(fd, args[key], "compare").decode("utf-8", "replace"))
            finally:
                os.close(fd)
        n = args.get("context_lines")
        diff = bounded_diff(texts[0].splitlines(True), texts[1].splitlines(True), args["path1"], args["path2"],
                            n=3 if n is None else n)
        return ToolResult.ok(diff or "the files are identical", identical=not diff)


# ---- Undo: nothing lost ----
#
# Every helper here works on a directory descriptor and a name, never following a symlink: the
# same descriptor-relative discipline as the tools, so a snapshot never reads outside the tree and
# a restore never writes there.


def remove_at(dir_fd, name, check=None):
    """Delete `name` in dir_fd: a file, a link (never its target) or a whole tree (never entering links).

    walk_at's walk, each directory removed once all below it is: a tree thousands of directories deep (past
    Python's recursion limit, or the open-file limit, which a command can build in a second) is removed whole,
    not left half-removed with what it hides (a `.git` whose hooks sort after the deep branch)."""
    for _, fd, child, st, left in walk_at(dir_fd, name, check, leave=True):
        if left:
            os.rmdir(child, dir_fd=fd)
        elif not stat.S_ISDIR(st.st_mode):
            os.unlink(child, dir_fd=fd)


def copy_at(src_dir_fd, src_name, dst_dir_fd, dst_name, check=None, skipped=None, rel=""):
    """Copy `src_name` to `dst_name` (which must not exist): files with their mode and times, links as
    links, directories by walk_at (each made 0700 until its entries are in); FIFOs, sockets and devices are
    skipped (listed in `skipped`). Returns the number of items copied."""
    if check is not None:
        check()
    count, dsts = 0, [dst_dir_fd]  # the copy of each directory the walk is in
    try:
        for sub, fd, name, st, left in walk_at(src_dir_fd, src_name, check, leave=True):
            target = name if sub else dst_name
            if left:
                dfd = dsts.pop()
                try:
                    os.fchmod(dfd, stat.S_IMODE(st.st_mode))
                finally:
                    os.close(dfd)
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o700, dir_fd=dsts[-1])
                dsts.append(os.open(target, _LIST_DIR, dir_fd=dsts[-1]))
                count += 1
            else:
                count += _copy_leaf(fd, name, dsts[-1], target, st, check, skipped, rel + sub)
    finally:
        for dfd in dsts[1:]:
            os.close(dfd)
    return count


def _copy_leaf(src_dir_fd, src_name, dst_dir_fd, dst_name, st, check, skipped, rel):
    """Copy one entry that is not a directory: a link as a link, a regular file; anything else is skipped."""
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src_name, dir_fd=src_dir_fd), dst_name, dir_fd=dst_dir_fd)
        return 1
    if not stat.S_ISREG(st.st_mode):
        if skipped is not None:
            skipped.append(rel.rstrip("/") or src_name)
        return 0
    sfd = os.open(src_name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=src_dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            if skipped is not None:
                skipped.append(rel.rstrip("/") or src_name)
            return 0
        dfd = os.open(dst_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600,
                      dir_fd=dst_dir_fd)
        try:
            copy_data(sfd, dfd, check)
            os.fchmod(dfd, stat.S_IMODE(st.st_mode) & ~_SETID)  # a copy is not set-ID, as cp without -p
            os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    return 1


def data_extents(fd, pos=0):
    """(start, end) of the ranges of the regular file fd that hold data, from `pos` to its size: a sparse
    file's holes (`truncate -s 1T`) are left out where the system can say (SEEK_DATA/SEEK_HOLE), else one
    range of everything."""
    size = os.fstat(fd).st_size
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    while pos < size:
        if seek_data is None:
            yield pos, size
            return
        try:
            start = os.lseek(fd, pos, seek_data)
            end = min(os.lseek(fd, start, seek_hole), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to the end
                return
            seek_data = None  # the filesystem cannot say: everything is data
            continue
        if start >= size:
            return
        yield start, end
        pos = end


def file_chunks(fd, check=None, hole_as=1 << 20):
    """The bytes of the regular file fd from its start to its end, in chunks of at most 1 MB (read with
    pread: the offset is left alone). A hole longer than `hole_as` comes as `hole_as` zero bytes: a hole
    is zeros, with no newline in it, so counting lines, or cutting a line that runs on, gives the same
    answer without reading a terabyte of zeros. `check()` runs before each read (the deadline)."""
    pos = 0
    size = os.fstat(fd).st_size
    for start, end in list(data_extents(fd)) + [(size, size)]:
        if start > pos:  # a hole
            yield bytes(min(start - pos, hole_as))
            pos = start
        while pos < end:
            if check is not None:
                check()
            if not (chunk := os.pread(fd, min(1 << 20, end - pos), pos)):
                return  # shrank while read
            yield chunk
            pos += len(chunk)
    while True:  # grown while read
        if check is not None:
            check()
        if not (chunk := os.pread(fd, 1 << 20, pos)):
            return
        yield chunk
        pos += len(chunk)


def copy_data(sfd, dfd, check=None):
    """Copy a regular file's bytes, keeping its holes: a sparse file of a terabyte (`truncate -s 1T`) costs
    what it holds, not a terabyte of zeros written to the disk. Holes are found with data_extents, and zero
    blocks read are skipped in the copy as well (as cp --sparse=auto)."""
    size = os.fstat(sfd).st_size
    zero = bytes(1 << 16)
    for pos, end in data_extents(sfd):
        while pos < end:
            if check is not None:
                check()
            if not (chunk := os.pread(sfd, min(1 << 20, end - pos), pos)):
                size = pos  # shrank while copied
                break
            for i in range(0, len(chunk), len(zero)):
                block = chunk[i:i + len(zero)]
                if block != zero[:len(block)]:
                    os.lseek(dfd, pos + i, os.SEEK_SET)
                    write_all(dfd, block)
            pos += len(chunk)
        else:
            continue
        break
    os.ftruncate(dfd, size)


def escaping_links(jail, real, check=None):
    """The relative symlinks at or below the real path `real` that, from where they stand now, lead out of the
    jail (display paths). A relative link's meaning depends on its place: `../..` copied or moved two levels
    up points above the working directory, and a person, git or a build tool following it later leaves the
    tree. (An absolute link means the same wherever it stands: `venv/bin/python` -> /usr/bin/python3.)"""
    out = []
    with jail.resolve(real, follow=False) as target:
        if target.lstat() is None:
            return out
        for rel, fd, name, st, _ in walk_at(target.dir_fd, target.name, check):
            if stat.S_ISLNK(st.st_mode) and not os.readlink(name, dir_fd=fd).startswith("/"):
                path = os.path.join(real, rel) if rel else real
                if _leads_out(jail, path):
                    out.append(display_path(path, jail.root))
    return out


def tree_count_at(target, check=None):
    if target.lstat() is None:
        return 0
    return sum(1 for _ in walk_at(target.dir_fd, target.name, check))


def tree_size_at(target, check=None):
    if target.lstat() is None:
        return 0
    return sum(st.st_size for _, _, _, st, _ in walk_at(target.dir_fd, target.name, check)
               if not stat.S_ISDIR(st.st_mode))


def _file_hash(dir_fd, name, h, check=None):
    fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            h.update(b"special")
            return
        if st.st_size > MAX_WHOLE_FILE:  # a terabyte sparse file must not cost minutes of hashing zeros:
            # its size, identity and change time, with its first and last megabyte
            h.update(b"large:%d:%d:%d:%d:" % (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
            h.update(os.pread(fd, 1 << 20, 0) + os.pread(fd, 1 << 20, st.st_size - (1 << 20)))
            return
        for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
            h.update(chunk)
            if check is not None:
                check()
    finally:
        os.close(fd)


def state_hash_at(target, check=None):
    """A fingerprint of what is at a Target now: absent, a file's bytes, a link, or a whole tree; `check()`
    runs for each entry and megabyte (the run's deadline: round 19b, 300 sparse files took 50 s past it)."""
    import hashlib
    if (st := target.lstat()) is None:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(target.name, dir_fd=target.dir_fd)
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        _file_hash(target.dir_fd, target.name, h, check)
        return "file:" + h.hexdigest()
    if not stat.S_ISDIR(st.st_mode):
        return "special:" + _kind_of(st.st_mode)
    h = hashlib.sha256()
    for rel, fd, name, est, _ in walk_at(target.dir_fd, target.name, check):
        kind = _kind_of(est.st_mode)
        h.update(("%s:%s:" % (kind, rel)).encode("utf-8", "surrogateescape"))
        if stat.S_ISLNK(est.st_mode):
            h.update(os.readlink(name, dir_fd=fd).encode("utf-8", "surrogateescape"))
        elif stat.S_ISREG(est.st_mode):
            _file_hash(fd, name, h, check)
        h.update(b"\n")
    return "dir:" + h.hexdigest()


def snapshot_at(target, cap, check=None):
    """(kind, content, mode) of what is at a Target, for an undo record; `check()` runs for each entry of a
    tree (the run's deadline: a tool stopped by it leaves no record behind)."""
    if (st := target.lstat()) is None:
        return "absent", None, None
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "link", os.readlink(target.name, dir_fd=target.dir_fd).encode("utf-8", "surrogateescape"), mode
    if stat.S_ISREG(st.st_mode):
        fd = target.open_regular("")
        try:
            data = read_fd(fd, cap + 1)
        finally:
            os.close(fd)
        # past the cap (grown since check_undo_cap looked): a record saying so, never a cut file to restore whole
        return ("too large", None, mode) if len(data) > cap else ("file", data, mode)
    if stat.S_ISFIFO(st.st_mode):
        return "fifo", None, mode
    if not stat.S_ISDIR(st.st_mode):
        return "special", None, mode
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, fd, name, est, _ in walk_at(target.dir_fd, target.name, check):
            info = tarfile.TarInfo("./" + rel if rel else ".")
            info.mode, info.mtime = stat.S_IMODE(est.st_mode), int(est.st_mtime)
            if stat.S_ISDIR(est.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(est.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=fd)
                tar.addfile(info)
            elif stat.S_ISREG(est.st_mode):
                efd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=fd)
                try:
                    data = read_fd(efd, cap + 1) if stat.S_ISREG(os.fstat(efd).st_mode) else b""
                finally:
                    os.close(efd)
                if len(data) > cap:
                    return "too large", None, mode
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return "dir", buf.getvalue(), mode


class UndoError(Exception):
    pass


#: the after-hash of a change whose fingerprint the run's deadline cut short: undo asks for --force
UNFINGERPRINTED = "unknown: the time limit came first"


def undo_root(store, record):
    """The jail an undo record is restored in: its conversation's working directory."""
    paths = [record["path"]]
    if record["kind"] == "moved":
        paths.append(record["content"].decode("utf-8", "surrogateescape"))
    try:
        conversation = store.conversation(record["conversation_id"]) if record["conversation_id"] else None
    except Exception:  # the store's NotFound: records of a conversation never stored (tests, a crashed run)
        conversation = None
    root = os.path.realpath(conversation["working_dir"]) if conversation and conversation.get("working_dir") else None
    if root and all(_inside(p, root) for p in paths):
        return root
    # no stored working directory: the record's own parent directory, which must still be the real
    # directory it was (records hold resolved paths) and not a symlink planted since
    parent = os.path.dirname(os.path.commonpath(paths)) if len(paths) > 1 else os.path.dirname(paths[0])
    if os.path.realpath(parent) != parent:
        raise UndoError("%s: not restored (a symlink now stands in its path)" % record["path"])
    return parent


def undo_change(store, record, force=False, root=None):
    """Put back what a tool changed; refuse when the path changed since unless force. Returns a sentence.

    Everything happens through the jail of the record's working directory, descriptor-relative."""
    try:
        return _undo(store, record, force, Jail(root or undo_root(store, record)))
    except ToolError as exc:
        raise UndoError("%s: not restored (%s)" % (record["path"], exc))


def _undo_resolve(jail, path):
    """The Target of a recorded path, which must still be reached without a symlink: records hold resolved
    paths, so a link standing in one now (a `git pull`, a command) would redirect the restore elsewhere in the
    tree: into .git/hooks, onto a start-up file. Refused, --force included."""
    target = jail.resolve(path, follow=False)
    if target.followed or target.real != path:
        target.close()
        raise UndoError("%s: not restored (a symlink now stands in its path)" % path)
    return target


def _undo(store, record, force, jail):
    path, kind = record["path"], record["kind"]
    if record.get("unreadable"):
        raise UndoError("%s: not restored (its saved content cannot be read: undo.key beside the history "
                        "database is missing or another)" % path)
    where = record["content"].decode("utf-8", "surrogateescape") if kind == "moved" else path
    with _undo_resolve(jail, where) as target:
        current = state_hash_at(target)
    if record["after_hash"] == UNFINGERPRINTED and not force:
        raise UndoError("%s was not fingerprinted after the change (the run's time limit came first), so a change "
                        "since cannot be ruled out; not restored (use --force to restore anyway)" % where)
    if record["after_hash"] and current != record["after_hash"] and not force:
        raise UndoError("%s changed since the agent touched it; not restored (use --force to restore anyway)"
                        % where)
    if kind == "too large":  # nothing was saved: the file stays as it is (never replaced by a part of it)
        raise UndoError("%s: not restored (it was over the undo cap, agent.tools.undo_max_bytes, when it was "
                        "changed; nothing of it was saved)" % path)
    with _undo_resolve(jail, path) as target:
        if kind == "moved":
            if target.lstat() is not None and not force:
                raise UndoError("%s exists again; not moving %s back over it (use --force)" % (path, where))
            with _undo_resolve(jail, where) as moved:
                if target.lstat() is not None:
                    remove_at(target.dir_fd, target.name)
                target.make_parents()
                os.rename(moved.name, target.name, src_dir_fd=moved.dir_fd, dst_dir_fd=target.dir_fd)
            message = "moved %s back to %s" % (where, path)
        elif kind == "absent":
            if target.lstat() is not None:
                remove_at(target.dir_fd, target.name)
            message = "removed %s (created by the agent)" % path
        else:
            if target.lstat() is not None:
                remove_at(target.dir_fd, target.name)
            target.make_parents()
            mode = record.get("mode")
            if kind == "file":
                write_atomic_at(target.dir_fd, target.name, record["content"], mode=mode)
                message = "restored %s (%s)" % (path, fmt_size(len(record["content"])))
            elif kind == "link":
                os.symlink(record["content"].decode("utf-8", "surrogateescape"), target.name, dir_fd=target.dir_fd)
                message = "restored link %s" % path
            elif kind == "fifo":
                os.mkfifo(target.name, mode if mode is not None else 0o600, dir_fd=target.dir_fd)
                message = "restored FIFO %s" % path
            elif kind == "dir":
                _extract_at(record["content"], target.dir_fd, target.name, mode)
                message = "restored directory %s (%d items)" % (path, tree_count_at(target))
            else:
                raise UndoError("%s was a %s; it cannot be restored" % (path, kind))
    store.mark_restored(record["id"])
    return message


def _extract_at(blob, dir_fd, name, mode):
    """Unpack an undo snapshot into a new directory `name`: only directories, files and links, each
    created beneath it with O_EXCL/O_NOFOLLOW (an entry naming '..' or an absolute path is refused)."""
    import io
    import tarfile
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    top = os.open(name, _LIST_DIR, dir_fd=dir_fd)
    dir_modes = []
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            for member in tar:
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if member.name.startswith("/") or ".." in parts or not (member.isdir() or member.isfile()
                                                                       or member.issym()):
                    raise UndoError("refusing to restore %s: the archive entry %s escapes it or is special"
                                    % (name, member.name))
                if not parts:
                    continue
                parent = _open_beneath(top, parts[:-1])
                try:
                    leaf = parts[-1]
                    if member.isdir():
                        os.mkdir(leaf, 0o700, dir_fd=parent)
                        dir_modes.append((parts, member.mode))
                    elif member.issym():
                        os.symlink(member.linkname, leaf, dir_fd=parent)
                    else:
                        data = tar.extractfile(member).read()
                        fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                                     0o600, dir_fd=parent)
                        try:
                            write_all(fd, data)
                            os.fchmod(fd, member.mode & 0o7777)
                        finally:
                            os.close(fd)
                finally:
                    if parent != top:
                        os.close(parent)
        for parts, dmode in reversed(dir_modes):
            fd = _open_beneath(top, parts)
            try:
                os.fchmod(fd, dmode & 0o7777)
            finally:
                os.close(fd)
        if mode is not None:
            os.fchmod(top, mode)
    finally:
        os.close(top)


def _open_beneath(top, parts):
    """An fd of the directory top/parts…, each step opened with O_NOFOLLOW (top itself when parts is empty)."""
    fd = top
    for part in parts:
        nxt = os.open(part, _LIST_DIR, dir_fd=fd)
        if fd != top:
            os.close(fd)
        fd = nxt
    return fd


# ---- Terminal tool ----

#: what the model reads when a command needs a yes nobody can give (run, the watcher): what to do instead
HEADLESS_REFUSAL = ("command needs a person's approval; not available in this run: %s (%s). Not run. Use the "
                    "read-only commands (ls, cat, grep, find, head, wc, git status/diff/log …) with plain arguments "
                    "inside the working directory, or the file tools to change files; a person can run it in chat "
                    "or with --allow-dangerous.")
#: the same for a command a person must approve in every mode (Verdict.person)
PERSON_REFUSAL = ("command needs a person's approval; not available in this run: %s (%s). Not run, and "
                  "--allow-dangerous does not run it either: do the task another way, or leave it to a person "
                  "in chat.")


class Terminal(Tool):
    name = "terminal"
    description = ("Run a shell command in the working directory and return its exit code, stdout and stderr. "
                   "Read-only commands (ls, cat, grep, find, wc, …) run directly; others may need confirmation "
                   "or be refused, and destructive ones (rm -rf /, sudo, curl | sh, …) are never run. Commands "
                   "run in an OS sandbox: by default they can write only in the working directory (not .git) "
                   "and $TMPDIR, cannot read the home directory, and have no network; every process a command "
                   "starts ends with it.")
    parameters = {"type": "object", "properties": {
        "command": {"type": "string", "description": "The command line (POSIX shell syntax)"},
        "timeout_seconds": {"type": "integer", "minimum": 1,
                            "description": "Kill it after this many seconds (capped by the configuration)"}},
        "required": ["command"]}
    permission = EXECUTE

    def run(self, args, ctx):
        term, conf = ctx.terminal, ctx.confinement
        policy = conf.policy
        command = args["command"]
        autonomy = ctx.autonomy
        audit = ctx.audit

        def judge(command):  # deny is refused at every autonomy, also after a person's edit
            verdict = policy.judge(command)
            if verdict.level == DENY:
                _audit(audit, ctx, command, "denied", 0, DENY)
                raise ToolError("command denied (%s); it is never run: %s" % (verdict.reason, command))
            return verdict

        verdict = judge(command)
        if verdict.level == CONFIRM and (autonomy != FULL or verdict.person):  # person: in every mode (19g)
            people = ctx.approvals
            if (autonomy != INTERACTIVE and not verdict.person) or people.confirm_command is None or \
                    not people.interactive:  # headless: nobody
                _audit(audit, ctx, command, "refused", 0, CONFIRM)
                raise ToolError((PERSON_REFUSAL if verdict.person else HEADLESS_REFUSAL) % (command, verdict.reason))
            # a command asked in every mode is covered by no program's [a]lways, only by its own (round 19h:
            # [a]lways 'mv' let `mv -- git -c core.fsmonitor=… status` run unasked)
            if (answer := people.confirm_command(command, verdict.reason, *((True,) if verdict.person else ()))) \
                    is None:
                _audit(audit, ctx, command, "declined", 0, CONFIRM)
                raise ToolError("the user declined the command: %s" % command)
            if answer != command:  # the person's edit is their approval, but it is validated again
                command = answer
                verdict = judge(command)
        timeout = min(args.get("timeout_seconds") or term.get("timeout_seconds") or 30,
                      term.get("max_timeout_seconds") or 300)
        by_run = False
        if ctx.deadline is not None:  # --timeout holds while a command runs, not only between turns
            remaining = ctx.deadline - time.monotonic()
            if remaining <= 0:
                raise ToolError("the run's time limit (agent.timeout_seconds) is reached; command not run: %s"
                                % command)
            if remaining < timeout:
                timeout, by_run = remaining, True
        sandbox = conf.sandbox
        conf.before_change()
        if (watch := sandbox.watch()) is not None:
            watch.begin()  # what changed since the last command (a file tool a person approved) is not its doing
        try:
            try:
                res = self._run(ctx, command, verdict, timeout, sandbox)
            except Exception:
                raise
            except BaseException:  # Ctrl-C, SIGTERM: what the command planted goes, unasked, before it travels on
                if watch is not None:
                    _remove_protected(ctx, watch, watch.found())
                raise
            body = _format_streams(res, ctx.limit("max_output_size", 1048576))
            conf.changed()
            if watch is not None:
                _settle_protected(ctx, watch, command, body)
        finally:
            if watch is not None:
                watch.end()
        if res.timed_out:
            killed = "it and every process it started were killed" if sandbox.confined else \
                "its process group was killed"
            if by_run:
                raise ToolError("the run's time limit (agent.timeout_seconds) was reached while the command ran; "
                                "%s%s" % (killed, body))
            raise ToolError("command timed out after %ss; %s%s" % (timeout, killed, body))
        if res.cancelled:
            raise ToolError("cancelled by user" + body)
        duration = round(res.duration, 3)  # one figure: the text and the metadata never disagree
        head = "exit code: %s · %.2fs" % (res.exit_code, duration)
        edited = command != args["command"]
        if edited:  # chat's [e]dit: the model (and the stored conversation) learn what really ran
            head = "The user edited the command before it ran; it ran as: %s\n%s" % (command, head)
        return ToolResult(True, head + body, metadata={"exit_code": res.exit_code, "duration_seconds": duration,
                                                       "command": command, "edited": edited,
                                                       "printed": bool(res.stdout_total)})

    def _run(self, ctx, command, verdict, timeout, sandbox):
        term = ctx.terminal
        res = run_command(command, ctx.root, timeout, term.get("max_stdout_bytes") or 10485760,
                          term.get("max_stderr_bytes") or 1048576, cancel=ctx.cancel,
                          env=sandbox.env, argv=command_argv(command, verdict), sandbox=sandbox)
        outcome = "timeout" if res.timed_out else "cancelled" if res.cancelled else "exit:%s" % res.exit_code
        _audit(ctx.audit, ctx, command, outcome, res.duration, verdict.level)
        return res


def _settle_protected(ctx, watch, command, body):
    """After a command: protected paths it created, and repositories made during the run that it armed,
    are a person's to keep (chat, every mode) or are removed (headless); the model is told either way."""
    if not (found := watch.found()):
        return
    detail = "the command made %s (%s): git or a shell would run or read what it holds outside the sandbox" % (
        ", ".join(display_path(p, ctx.root) for p, _ in found), "; ".join(r for _, r in found))
    people = ctx.approvals
    if people.interactive and people.ask is not None:
        try:
            keep = people.ask("terminal", {"command": command}, detail + ". Keep it (no removes it)?")
        except BaseException:  # Ctrl-C at the question is not a yes
            _remove_protected(ctx, watch, found)
            raise
        if keep:
            for path, _ in found:
                watch.keep(path, accepted=True)
            return
    removed, failed = _remove_protected(ctx, watch, found)
    why = "the user declined" if people.interactive and people.ask is not None else \
        "it needs a person's approval; not available in this run"
    raise ToolError("%s; %s. Removed: %s%s%s" % (
        detail, why, ", ".join(removed) or "nothing",
        "; COULD NOT REMOVE: %s" % ", ".join(failed) if failed else "", body))


def _remove_protected(ctx, watch, found):
    """Remove what watch.found() found: ([removed, ...], [failed with why, ...]), both shown relative. A
    directory of the person's (the working directory) that a command made a repository of loses only what made
    it one."""
    removed, failed = [], []
    for path, _ in found:
        try:  # through its parent: a directory deeper than a path can name is removed too
            for target in [os.path.join(path, n) for n in ("HEAD", "commondir")] if path in watch.defuse else [path]:
                rel = os.path.relpath(target, ctx.root)
                with ctx.jail.resolve(os.path.dirname(rel) or ".") as parent:
                    fd = parent.open_dir()
                    try:
                        os.stat(os.path.basename(rel), dir_fd=fd, follow_symlinks=False)
                        remove_at(fd, os.path.basename(rel))
                    except FileNotFoundError:
                        pass  # gone already
                    finally:
                        os.close(fd)
            removed.append(display_path(path, ctx.root))
        except (OSError, ToolError) as exc:
            failed.append("%s (%s)" % (display_path(path, ctx.root), getattr(exc, "strerror", None) or exc))
    watch.refresh()
    return removed, failed


def _format_streams(res, limit):
    """The streams as the model sees them: no more than the tool result can carry (no large copies)."""
    parts = []
    for name, data, total in (("stdout", res.stdout, res.stdout_total), ("stderr", res.stderr, res.stderr_total)):
        if not total:
            continue
        shown = memoryview(data)[:limit]
        text = bytes(shown).decode("utf-8", "replace")
        parts.append("\n--- %s ---\n%s" % (name, text.rstrip("\n")))
        if total > len(shown):
            parts.append("\n[%s truncated: showing %d of %d bytes]" % (name, len(shown), total))
        limit = max(limit - len(shown), 4096)
    return "".join(parts)


def _audit(audit, ctx, command, outcome, duration, verdict):
    if audit is not None:
        try:
            audit.record(ctx.root, command, outcome, duration, verdict)
        except OSError:
            pass  # an unwritable audit log must not stop the work


# ---- Fetch ----

_rate_lock = threading.Lock()
_rate_log = {}


def _rate_check(host, address, per_minute):
    """Count a fetch of `host` against its limit, keyed by the checked address (round 19a: 8.8.8.8, 134744072,
    0x08080808 and [::ffff:8.8.8.8] were eight hosts to a limit that counted spellings)."""
    import ipaddress
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
        key = str(getattr(ip, "ipv4_mapped", None) or ip)
    except ValueError:
        key = address.lower()
    now = time.monotonic()
    with _rate_lock:
        recent = [t for t in _rate_log.get(key, ()) if now - t < 60]
        if per_minute and len(recent) >= per_minute:
            named = host if host == key else "%s (%s)" % (host, key)
            raise ToolError("rate limit: %d fetches from %s in the last minute; try again later"
                            % (len(recent), named))
        recent.append(now)
        _rate_log[key] = recent


def _http_get(scheme, host, port, path, address, timeout, max_bytes, user_agent, deadline=None):
    """GET from the checked address (no second DNS lookup). Returns (status, headers, body, truncated).

    `timeout` bounds each socket operation; `deadline` (time.monotonic()) the whole request (shutdown_at)."""
    import http.client
    import socket
    import ssl

    class Pinned(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.create_connection((address, self.port), self.timeout)

    class PinnedTLS(http.client.HTTPSConnection):
        def connect(self):
            sock = socket.create_connection((address, self.port), self.timeout)
            self.sock = self._context.wrap_socket(sock, server_hostname=self.host)

    if deadline is not None:
        timeout = max(0.001, min(timeout, deadline - time.monotonic()))
    if scheme == "https":
        conn = PinnedTLS(host, port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = Pinned(host, port, timeout=timeout)
    timer = shutdown_at(deadline, lambda: conn.sock)

    def expired():
        return deadline is not None and time.monotonic() >= deadline

    try:
        conn.request("GET", path, headers={"User-Agent": user_agent, "Accept-Encoding": "identity",
                                           "Accept": "text/html, text/plain;q=0.9, */*;q=0.5"})
        resp = conn.getresponse()
        chunks, size, truncated = [], 0, False
        while not expired():
            if not (chunk := resp.read1(min(65536, max_bytes + 1 - size))):
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                truncated = True
                break
        if expired():
            raise socket.timeout("the whole request took longer than its time limit")
        body = b"".join(chunks)[:max_bytes]
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body, truncated
    except (OSError, http.client.HTTPException) as exc:
        if expired():
            raise socket.timeout("the whole request took longer than its time limit")
        if isinstance(exc, OSError):
            raise
        if isinstance(exc, http.client.InvalidURL):  # raised before sending: the URL's fault, not the server's
            raise OSError("the URL cannot be sent (%s)" % exc)
        raise OSError("the server's answer is not valid HTTP (%s)" % type(exc).__name__)
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()


def shutdown_at(deadline, sock):
    """A started timer that shuts the socket `sock()` returns down at `deadline` (time.monotonic()), or None
    without a deadline; cancel() it when done. INFO: a socket timeout bounds one wait, not a request: a
    server dripping a byte (or an SSE keep-alive) at a time never lets a read time out. shutdown() wakes
    a read blocked in another thread; close() would not."""
    if deadline is None:
        return None
    return DEADLINES.at(deadline, lambda: _shut_down(sock()))


def _shut_down(target):
    """Shut a socket down (a read blocked on it in another thread wakes); None or one already gone is let be."""
    if target is not None:
        import socket
        try:
            target.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Watch:
    """shutdown_when's poller: looks at its event every `every` seconds on the deadline thread."""

    def __init__(self, event, sock, every):
        self.event, self.sock, self.every, self.done = event, sock, every, False
        self.alarm = DEADLINES.at(time.monotonic() + every, self.check)

    def check(self):
        if self.done:
            return
        if self.event.is_set():
            _shut_down(self.sock())
        self.alarm = DEADLINES.at(time.monotonic() + self.every, self.check)  # a connection made since: cut too

    def cancel(self):
        self.done = True
        self.alarm.cancel()


def shutdown_when(event, sock, every=0.25):
    """A poller that shuts the socket `sock()` returns down once `event` is set (a run cancelled while its model
    request waits: a watcher stopping after its grace waited for the server's answer, 12 s and more), or None
    without an event; cancel() it when done."""
    return None if event is None else _Watch(event, sock, every)


class _Alarm:
    """One deadline of Deadlines: cancel() before it is due and it never fires."""
    __slots__ = ("when", "seq", "action", "cancelled")

    def __init__(self, when, seq, action):
        self.when, self.seq, self.action, self.cancelled = when, seq, action, False

    def __lt__(self, other):
        return (self.when, self.seq) < (other.when, other.seq)

    def cancel(self):
        DEADLINES.cancel(self)


class Deadlines:
    """One thread for every deadline of the process (each model request and fetch has one), instead of a
    threading.Timer each. INFO: starting a thread waits until it runs; on a busy machine that cost a watcher
    more than the model's instant answer (1.5 ms of 10 per event, issue 22). Actions run on this thread, one
    after another: they must be quick (a socket's shutdown)."""

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.heap = []  #: _Alarm, soonest first (cancelled ones are dropped when due, or in a sweep)
        self.cancelled = 0  #: how many in the heap are cancelled
        self.seq = 0
        self.thread = None
        if hasattr(os, "register_at_fork"):  # a forked child has the heap but not the thread
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self):
        self.cond = threading.Condition(threading.Lock())
        self.heap, self.cancelled, self.thread = [], 0, None

    def at(self, when, action):
        """Call `action()` at time.monotonic() `when`; returns an _Alarm to cancel()."""
        import heapq
        with self.cond:
            self.seq += 1
            alarm = _Alarm(when, self.seq, action)
            heapq.heappush(self.heap, alarm)
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="xzatoma-deadlines", daemon=True)
                self.thread.start()
            elif self.heap[0] is alarm:
                self.cond.notify()
        return alarm

    def cancel(self, alarm):
        import heapq
        with self.cond:
            if alarm.cancelled or alarm.action is None:
                return
            alarm.cancelled = True
            alarm.action = None
            self.cancelled += 1
            if self.cancelled > 64 and self.cancelled * 2 > len(self.heap):  # a long request's deadline is far
                self.heap = [a for a in self.heap if not a.cancelled]  # off: sweep, so memory stays bounded
                heapq.heapify(self.heap)
                self.cancelled = 0

    def _serve(self):
        import heapq
        while True:
            with self.cond:
                while True:
                    while self.heap and self.heap[0].cancelled:
                        heapq.heappop(self.heap)
                        self.cancelled -= 1
                    if not self.heap:
                        self.cond.wait()
                        continue
                    wait = self.heap[0].when - time.monotonic()
                    if wait <= 0:
                        break
                    self.cond.wait(wait)
                alarm = heapq.heappop(self.heap)
                action, alarm.action = alarm.action, None
            try:
                action()
            except Exception:  # an action that fails must not end every other deadline
                pass


DEADLINES = Deadlines()


TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-yaml",
              "application/yaml", "application/xhtml+xml", "application/x-sh", "application/toml",
              "application/ld+json", "application/rss+xml", "application/atom+xml")


class Fetch(Tool):
    name = "fetch"
    description = ("Fetch a web page or text file over http(s) and return it as readable text (HTML is converted). "
                   "Private, loopback and cloud-metadata addresses are refused.")
    parameters = {"type": "object", "properties": {
        "url": {"type": "string"}, "max_bytes": {"type": "integer", "minimum": 1}}, "required": ["url"]}

    def preview_args(self, args):
        return args.get("url", "")

    def run(self, args, ctx):
        cfg = ctx.config.get("fetch") or {}
        url = args["url"].strip()
        cap = cfg.get("max_response_size") or 1048576
        max_bytes = min(args.get("max_bytes") or cap, cap)
        ttl = cfg.get("cache_ttl_seconds", 86400)
        store = ctx.store
        allowed = cfg.get("allowed_hosts") or ()
        timeout = cfg.get("timeout_seconds") or 60
        deadline = time.monotonic() + timeout  # for the whole fetch: resolving, redirects and conversion
        if ctx.deadline is not None:
            deadline = min(deadline, ctx.deadline)
        # Only whole pages are cached, so only a call that would read a whole page is answered from the cache
        # (round 19a: max_bytes 10 cached its 10 bytes as the page for a day).
        whole = max_bytes == cap
        if store is not None and ttl and whole:
            try:
                hit = store.cache_get(url, ttl)
            except Exception:
                hit = None
            if hit is not None:  # today's verdict, not the one from the day it was cached (issue 12)
                check_url(url, allowed, deadline)
                if hit.get("final_url") and hit["final_url"] != url:
                    check_url(hit["final_url"], allowed, deadline)
                return ToolResult.ok(hit["body"], cached=True, status=hit["status"])
        current = url
        for hop in range(6):
            scheme, host, port, path, address = check_url(current, allowed, deadline)
            _rate_check(host, address, cfg.get("rate_limit_per_minute", 30))
            ctx.check_deadline("fetch")
            try:
                status, headers, body, truncated = _http_get(scheme, host, port, path, address, timeout, max_bytes,
                                                             cfg.get("user_agent") or "xzatoma", deadline)
            except OSError as exc:
                if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                    raise ToolError("fetch stopped: the run's time limit was reached while fetching %s" % current)
                raise ToolError("cannot fetch %s: %s" % (current, getattr(exc, "strerror", None) or exc))
            if status in (301, 302, 303, 307, 308) and headers.get("location"):
                if hop == 5:
                    raise ToolError("too many redirects (more than 5) starting at %s" % url)
                current = _redirect_target(current, headers["location"])
                continue
            break
        ctype = (headers.get("content-type") or "").split(";")[0].strip().lower()
        body, cut = _decoded_body(body, headers.get("content-encoding") or "", max_bytes, current)
        truncated = truncated or cut
        is_text = ctype.startswith("text/") or ctype in TEXT_TYPES or ctype.endswith(("+json", "+xml"))
        if not ctype:
            is_text = b"\x00" not in body[:4096]
        if not is_text:
            raise ToolError("%s is binary content (%s, %d bytes); fetch returns only text" % (current, ctype, len(body)))
        is_html = ctype in ("text/html", "application/xhtml+xml")
        text = _body_text(body, headers.get("content-type") or "", is_html)
        if is_html:
            text = html_to_text(text, current, ctx.limit("max_output_size", 1048576), deadline)
        head = "URL: %s\nStatus: %d\nContent-Type: %s\n" % (current, status, ctype or "unknown")
        if truncated:
            head += "[Truncated at %d bytes]\n" % max_bytes
        output = head + "\n" + text
        if store is not None and ttl and 200 <= status < 300 and not truncated:
            try:
                store.cache_put(url, status, ctype, current, output)
            except Exception:
                pass
        return ToolResult.ok(output, status=status, truncated_body=truncated)


def _redirect_target(current, location):
    """The URL a Location header names, relative to `current`. Its bytes are read as UTF-8, as browsers do
    (http.client decodes headers as Latin-1: /wiki/Caf\u00e9 arrived as mojibake, round 19a)."""
    from urllib.parse import urljoin
    try:
        location = location.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    try:
        return urljoin(current, location.strip())
    except ValueError as exc:
        raise ToolError("%s redirected to an invalid URL %r: %s" % (current, location, exc))


def _decoded_body(body, encoding, max_bytes, url):
    """(body, truncated) with a gzip or deflate Content-Encoding undone, never to more than max_bytes (a gzip
    bomb stops there, round 19a); fetch asks for identity, but servers send gzip anyway."""
    import zlib
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body, False
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ToolError("%s came encoded as %r, which fetch cannot decode (it reads gzip and deflate)"
                        % (url, encoding))
    tries = (16 + zlib.MAX_WBITS,) if encoding != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)  # zlib or raw
    for wbits in tries:
        out, pos, view = bytearray(), 0, memoryview(body)
        try:
            # Round 19f2: a gzip body may be several members, one after another (RFC 1952 2.2), and all of
            # them are the body (only the first was read). Together they stay within max_bytes + 1; the body
            # is fed in pieces from an offset, never copied per member (50,000 empty members cost 2 s so).
            while pos < len(body) and len(out) <= max_bytes and (pos == 0 or body.startswith(b"\x1f\x8b", pos)):
                member = zlib.decompressobj(wbits)  # what follows the last member (zeros, garbage) is left,
                while pos < len(body) and not member.eof and len(out) <= max_bytes:  # as gzip -d leaves it
                    piece = view[pos:pos + 65536]
                    out += member.decompress(piece, max_bytes + 1 - len(out))
                    pos += len(piece) - len(member.unconsumed_tail) - len(member.unused_data)
                if not member.eof or wbits < 0 or wbits == zlib.MAX_WBITS:  # deflate is one stream
                    break
        except zlib.error:
            if not out:
                continue
        return bytes(out[:max_bytes]), len(out) > max_bytes
    raise ToolError("%s came %s-encoded, but its body is not valid %s data" % (url, encoding, encoding))


#: WHATWG encoding labels (and a common server misspelling) that Python does not know, or reads otherwise
#: (round 19f2: each made fetch fail). x-user-defined is read as windows-1252, as HTML's prescan does: its own
#: decoder maps every byte past ASCII to the private use area, which nobody can read.
CHARSET_ALIASES = {
    "x-user-defined": "cp1252", "utf-16": "utf-16-le", "utf8mb4": "utf-8", "utf8mb3": "utf-8", "unicode-1-1-utf-8": "utf-8",
    "unicode11utf8": "utf-8", "unicode20utf8": "utf-8", "x-unicode20utf8": "utf-8", "iso-8859-8-i": "iso-8859-8",
    "csiso88598i": "iso-8859-8", "logical": "iso-8859-8", "iso-8859-8-e": "iso-8859-8", "csiso88598e": "iso-8859-8",
    "visual": "iso-8859-8", "iso-8859-6-i": "iso-8859-6", "iso-8859-6-e": "iso-8859-6", "csiso88596i": "iso-8859-6",
    "csiso88596e": "iso-8859-6", "windows-874": "cp874", "dos-874": "cp874", "tis-620": "cp874",
    "iso-8859-11": "cp874", "iso8859-11": "cp874", "x-mac-cyrillic": "mac-cyrillic", "x-mac-ukrainian": "mac-cyrillic",
    "x-mac-roman": "mac-roman", "x-sjis": "shift_jis", "ms_kanji": "shift_jis", "windows-31j": "cp932",
    "x-euc-jp": "euc-jp", "x-gbk": "gbk", "gb2312": "gbk", "gb_2312": "gbk", "gb_2312-80": "gbk", "chinese": "gbk",
    "csgb2312": "gbk", "iso-ir-58": "gbk", "euc-kr": "cp949", "ks_c_5601-1987": "cp949", "ks_c_5601-1989": "cp949",
    "ksc5601": "cp949", "ksc_5601": "cp949", "korean": "cp949", "windows-949": "cp949", "x-x-big5": "big5",
    "big5-hkscs": "big5hkscs", "ascii": "cp1252", "us-ascii": "cp1252", "iso-8859-1": "cp1252",
    "iso8859-1": "cp1252", "latin1": "cp1252", "l1": "cp1252", "iso_8859-1": "cp1252",
}
#: text codecs of Python that are no character set of the web: never a page's (idna cannot even 'replace')
NOT_CHARSETS = frozenset(("idna", "punycode", "unicode-escape", "raw-unicode-escape", "undefined", "utf-7",
                          "mbcs", "oem"))
_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def _body_charset(body, content_type, is_html):
    """The body's character set, as HTML's encoding sniffing finds it: a byte order mark, else the
    Content-Type's charset (quoted or not, RFC 9110), else for HTML a <meta charset> in the first 1024 bytes
    (the prescan), else UTF-8. Unknown names and codecs that are no character set mean UTF-8."""
    import codecs
    for bom, name in _BOMS:
        if body.startswith(bom):
            return name
    found = re.search(r"charset\s*=\s*[\"']?([\w.:-]+)", content_type, re.I)
    meta = not found and is_html
    if meta:
        found = re.search(rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([\w.:-]+)", body[:1024], re.I)
    if not found:
        return "utf-8"
    name = found.group(1)
    name = (name.decode("ascii") if isinstance(name, bytes) else name).lower()
    name = CHARSET_ALIASES.get(name, name)
    try:
        codec = codecs.lookup(name)  # round 19f2: b"".decode(name) never looks the codec up
    except LookupError:
        return "utf-8"
    if not codec._is_text_encoding or codec.name in NOT_CHARSETS:  # hex, rot13, base64; idna
        return "utf-8"
    if meta and codec.name.startswith(("utf-16", "utf-32")):  # a <meta> read as ASCII is no UTF-16 page: the
        return "utf-8"  # prescan's rule (round 19f2: an ASCII page came back as CJK)
    return codec.name


def _body_text(body, content_type, is_html):
    """The body decoded by _body_charset; a codec that fails anyway gives UTF-8, never an error."""
    try:
        return body.decode(_body_charset(body, content_type, is_html), "replace")
    except Exception:  # round 19f2: a codec's own failure made the whole fetch fail
        return body.decode("utf-8", "replace")


# ---- Registry builder: the tools of a tool set ----

ALL_TOOLS = (ListDirectory, ReadFile, WriteFile, EditFile, CopyPath, MovePath, DeletePath, CreateDirectory,
             FileMetadata, FindPath, Grep, DiffFiles, PlanTool, Terminal, Fetch)

FULL_TOOLS, COMPACT_TOOLS = "full", "compact"  # tool profiles (agent.tools.profile)

#: The compact profile, for small models and small context windows: six tools whose definitions say only what a
#: first call needs (~25% of the full set's tokens; the schema of each is the full one's subset, so validation
#: and the tools themselves are unchanged). name -> (description, {parameter: (type, description)}, required)
COMPACT = {
    "list_directory": ("List the files in a directory.",
                       {"path": ("string", "directory, default '.'"),
                        "recursive": ("boolean", "include subdirectories")}, []),
    "read_file": ("Read a text file.", {"path": ("string", "")}, ["path"]),
    "grep": ("Search files for a regular expression. Returns path:line: text.",
             {"pattern": ("string", ""), "path": ("string", "file or directory, default '.'")}, ["pattern"]),
    "write_file": ("Create or overwrite a file.", {"path": ("string", ""), "content": ("string", "")},
                   ["path", "content"]),
    "edit_file": ("Replace old_text with new_text in a file (old_text must appear exactly once, unless "
                  "replace_all; an empty old_text adds new_text at the end).",
                  {"path": ("string", ""), "old_text": ("string", ""), "new_text": ("string", ""),
                   "replace_all": ("boolean", "")}, ["path", "old_text", "new_text"]),
    "terminal": ("Run a shell command in the working directory. Returns the exit code and output.",
                 {"command": ("string", "")}, ["command"]),
}


def compact_definition(name):
    """The short definition of a tool in the compact profile."""
    description, params, required = COMPACT[name]
    props = {}
    for prop, (kind, doc) in params.items():
        props[prop] = {"type": kind, "description": doc} if doc else {"type": kind}
    schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return {"name": name, "description": description, "parameters": schema}


def build_registry(toolset, ctx, extra=(), profile=FULL_TOOLS, skills=None):
    """The registry of a tool set: planning offers the tools whose permission is read, write offers all;
    the compact profile offers only the COMPACT tools, with their short definitions (`extra` tools, such as
    activate_skill and update_progress, are not among them). `skills`: the SkillState whose active skills
    narrow the tools.

    `ctx` is only referenced, never changed: a chat's @mentions use a planning registry over the
    same context as its Write-mode agent.
    """
    tools = [cls() for cls in ALL_TOOLS] + list(extra)
    offered = [t for t in tools if toolset == WRITE_MODE or t.permission == READ]
    schemas = None
    if profile == COMPACT_TOOLS:
        offered = [t for t in offered if t.name in COMPACT]
        schemas = {t.name: compact_definition(t.name) for t in offered}
    return Registry(offered, ctx, toolset, all_names=[t.name for t in tools], schemas=schemas, skills=skills)


# ==== The safety kernel ====
# Everything below decides what the agent may touch; it imports nothing from the tools above (they ask it). Its
# API is listed in the module docstring.


# ---- Confinement: what the agent may touch ----
# One object per session (per watcher process) answers "is this protected?" for every wall: the file tools before
# a change, the policy before a write, the sandbox for its read-only binds, the watch after a command.

class ToolError(Exception):
    """Raised inside a tool (or by a wall of the kernel) for a failure the model should see as `Error: …`;
    `metadata` goes into the failed ToolResult (again=True: the same call once more is not a loop)."""

    def __init__(self, message, **metadata):
        super().__init__(message)
        self.metadata = metadata


#: THE list of protected names, beneath the working directory and every home directory: what runs code or hands
#: over credentials the next time a person, git or a shell uses it. A file tool changes them only with a
#: person's yes (never headless), the sandbox binds them read-only and the watch removes new ones; outside the
#: tree (and a repository's metadata inside it) the policy denies commands that write them. Matched after
#: resolution and folded as filesystems fold names (`.GIT/config` is `.git/config` on macOS).
PROTECTED_NAMES = (
    # version control: hooks, config (core.fsmonitor, core.hooksPath), a worktree's `.git` pointer file
    ".git", ".hg", ".gitconfig", ".config/git", ".git-credentials",
    # shells and their start-up files
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zprofile", ".zshenv",
    ".zlogin", ".zlogout", ".cshrc", ".tcshrc", ".login", ".kshrc", ".mkshrc", ".inputrc", ".config/fish",
    ".xprofile", ".xinitrc", ".xsession", ".pam_environment", ".config/autostart", ".config/systemd",
    ".bash_aliases", ".xsessionrc", ".config/environment.d",
    # keys and credentials, and what picks the code Python and pip load (a keyring backend, an index)
    ".ssh", ".gnupg", ".aws", ".kube", ".docker/config.json", ".netrc", ".npmrc", ".pypirc", ".pgpass",
    ".config/gh", ".config/xzatoma", ".config/python_keyring", ".config/pip", ".pip", ".pydistutils.cfg",
)
#: protected in a home directory only (outside the tree, or a home the tree is, holds or lies in): what runs code
#: at the next login, shell, Python start or tool use there, under names a project uses for its own files (`bin/`)
HOME_PROTECTED_NAMES = (
    ".local/bin", "bin", ".local/lib", ".local/share/applications", ".local/share/systemd", ".config/nvim",
    ".vimrc", ".vim", ".emacs", ".emacs.d", ".gdbinit", ".pdbrc", ".pythonrc", ".ipython", ".tmux.conf",
    ".screenrc", ".psqlrc", ".sqliterc", ".curlrc", ".wgetrc", ".cargo", ".m2", ".gradle", ".docker",
    ".config/gcloud", ".azure",
)
#: in a home directory, what a command must not read and send over the network (the policy's exfiltration check)
CREDENTIAL_NAMES = (".ssh", ".gnupg", ".aws", ".netrc", ".pgpass", ".docker", ".kube", ".npmrc", ".pypirc",
                    ".config/gh", ".config/gcloud", ".azure", ".git-credentials")
#: directory names protected wherever they appear: nested repositories' metadata
PROTECTED_ANYWHERE = (".git", ".hg")
#: outside the tree, whatever the home directories: a change there is the system's, not the project's
SYSTEM_PROTECTED = ("/etc", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys",
                    "/root", "/var/spool/cron", "/var/lib", "/dev/mem", "/dev/kmem", "/dev/port",
                    "/proc/sysrq-trigger", "/proc/sys")
_DEVICE = LazyRegex(r"^/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|mapper/|md|loop|dm-|sr|fd\d|nbd|rbd|zd|mtd)")
_fold_memo = {}


def fold_name(name):
    """A path component as filesystems that fold names may see it, for matching protected names: case
    folded (macOS, Windows, ext4 casefold), compatibility forms and combining marks reduced (a fullwidth
    `.git`), invisible characters dropped (HFS+ ignores a U+200C inside `.git`), trailing dots and spaces dropped
    and the 8.3 short name `GIT~1` read as `.git` (NTFS): git refuses these spellings for the same reason.
    Over-matching only asks a person more often; under-matching would let a hook through."""
    if (folded := _fold_memo.get(name)) is None:
        if name.isascii():  # the same, for ASCII: the normal forms change nothing, Cc is what is unprintable
            folded = name.lower() if name.isprintable() else "".join(ch for ch in name.lower() if ch.isprintable())
            folded = folded.rstrip(". ")
        else:
            import unicodedata
            folded = unicodedata.normalize("NFKD", name)
            folded = "".join(ch for ch in folded if unicodedata.category(ch) not in ("Mn", "Me", "Cf", "Cc", "Cn"))
            folded = unicodedata.normalize("NFKC", folded.casefold()).rstrip(". ")
        if short := re.match(r"(git|hg)~\d+\Z", folded):
            folded = "." + short.group(1)
        if len(_fold_memo) < 65536:
            _fold_memo[name] = folded
    return folded


def fold_path(path):
    return "/".join(fold_name(part) for part in path.split("/"))


def protected_paths(root, xzatoma_home=None, extra=(), homes=()):
    """The absolute protected paths under `root`: PROTECTED_NAMES, XZATOMA_HOME, `extra` (relative to the root
    or absolute, globs too: agent.tools.protected_paths) and the names of the `homes` that lie in it; those
    outside are left out (the jail keeps tools out of them), one the root lies in stands for all of it (`cd
    ~/.ssh`), as does repository metadata around it (`cd .git/hooks`, a bare clone)."""
    root = os.path.realpath(root)
    out = [os.path.join(root, name) for name in PROTECTED_NAMES]
    path = root
    while True:  # the root or a directory above it is a repository's metadata: names like `hooks` are git's
        if (fold_name(os.path.basename(path)) in PROTECTED_ANYWHERE or is_git_dir(path)) and path not in out:
            out.append(path)
        if os.path.dirname(path) == path:
            break
        path = os.path.dirname(path)
    extra = list(extra or ()) + [os.path.join(h, n) for h in homes for n in PROTECTED_NAMES + HOME_PROTECTED_NAMES
                                 if _inside(os.path.join(h, n), root) or _inside(root, os.path.join(h, n))]
    for path in ([xzatoma_home] if xzatoma_home else []) + [p for p in extra if isinstance(p, str) and p]:
        path = os.path.expanduser(path)
        if _is_glob(path):  # '*.pem', 'secrets/**': matched against paths relative to the root
            full = os.path.join(root, path)  # an absolute glob as it is ('~/proj/*.key', '/**/*.crt')
            fixed = os.path.dirname(full[:min(full.find(c) for c in "*?[" if c in full)]) or "/"
            real = os.path.realpath(fixed)  # the part before the first wildcard, where it really is
            full = real.rstrip("/") + full[len(fixed):] if real != fixed else full
            # it can match below the root: it starts inside it, or above it (an absolute glob was left out)
            if (_inside(real, root) or _inside(root, real)) and full not in out:
                out.append(full)
            continue
        full = os.path.normpath(os.path.join(root, path))
        # the name as given (its directories resolved) and where it leads: a config file named by a link is
        # replaced by deleting the link and writing a file under its name (round 19b: only the target was kept)
        for real in (os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full)),
                     os.path.realpath(full)):
            # below the root, or the root itself lies in it (`cd ~/.ssh`, XZATOMA_HOME): then all of the root is
            if ((_inside(real, root) and real != root) or _inside(root, real)) and real not in out:
                out.append(real)
    return out


def _is_glob(path):
    return any(c in path for c in "*?[")


class Confinement:
    """What the agent may touch: the canonical root, the one protected set, the jail, the command policy and
    the OS sandbox, built once per session (once per watcher process) from the working directory and the
    configuration. `reason(path)` is the one answer to "is this protected?" that every wall asks.

    `extra`: agent.tools.protected_paths (and the agent's own code); `home`: what `~` means to commands;
    `homes`: every home whose keys and start-up files are protected; `terminal`: agent.terminal (sandbox,
    network, allowlist …); `private_files`: credentials or every conversation outside XZATOMA_HOME (protected,
    and empty for commands); `sandbox`: one made already (tests)."""

    def __init__(self, root, xzatoma_home=None, extra=(), home=None, homes=(), terminal=None, environ=None,
                 secrets=(), private_files=(), sandbox=None):
        self.root = os.path.realpath(root)  #: the working directory, canonical: every wall compares with this one
        self.home = os.path.realpath(home or os.path.expanduser("~"))  #: what `~` means to the policy
        self.homes = tuple(dict.fromkeys((self.home,) + tuple(os.path.realpath(h) for h in homes or ())))
        self.xzatoma_home = xzatoma_home
        self.terminal, self.environ, self.secrets = dict(terminal or {}), environ, tuple(secrets)
        self.private_files = tuple(private_files or ())
        #: every path a tool names resolves beneath the root; XZATOMA_HOME in the tree is hidden
        self.jail = Jail(self.root, hidden=[xzatoma_home] if xzatoma_home else ())
        #: the protected set beneath the root (absolute paths and globs), built once; globs relative, lowered
        self.protected = protected_paths(self.root, xzatoma_home, list(extra or ()) + list(self.private_files),
                                         self.homes)
        self.globs = [display_path(p, self.root).lower() for p in self.protected if _is_glob(p)]
        #: outside the root: (folded path, as shown) for the homes' names, XZATOMA_HOME and the private files
        self._outside = [(fold_path(os.path.join(h, n)), ("~/" if h == self.home else h + "/") + n)
                         for h in self.homes for n in PROTECTED_NAMES + HOME_PROTECTED_NAMES]
        self._outside += [(fold_path(os.path.abspath(p)), p) for p in [xzatoma_home] + list(self.private_files) + [
            e for e in extra or () if isinstance(e, str) and os.path.isabs(e) and not _is_glob(e)] if p]
        self._sandbox, self._policy, self._lock = sandbox, None, threading.RLock()
        self._resolved = None  #: [(path, folded)] of _resolved_protected, until the next change
        #: whether _resolved_protected saw every link of the protected directories (_linked_from's bound): when
        #: not, a file tool's change anywhere needs a person (fail closed: an unseen link may lead to it)
        self.links_complete = True
        self._around = {}  #: a repository's top -> [(path, folded)] its config names (_named_by_repository)
        self._deferred = None  #: deferred_files() before this run's first change
        self._git = {}  #: PATH -> the git program outside the tree (or None)

    def __eq__(self, other):  # (unhashable then: a Confinement is never a key)
        return isinstance(other, Confinement) and (other.root, other.protected) == (self.root, self.protected)

    @property
    def policy(self):
        """The CommandPolicy (agent.terminal.allowlist, custom_denylist), built on first use."""
        with self._lock:
            if self._policy is None:
                self._policy = CommandPolicy(self, self.terminal.get("allowlist") or DEFAULT_ALLOWLIST,
                                             self.terminal.get("custom_denylist") or ())
            return self._policy

    @property
    def sandbox(self):
        """The Sandbox terminal commands run in, built on first use, started on the first command."""
        with self._lock:
            if self._sandbox is None:
                t = self.terminal
                self._sandbox = Sandbox(self, t.get("sandbox") or WORKSPACE_WRITE, network=t.get("network"),
                                        environ=self.environ, env_passthrough=t.get("env_passthrough") or (),
                                        keep_home=t.get("keep_home"), secrets=self.secrets,
                                        assume_missing=t.get("sandbox_assume_missing") or (),
                                        limits=t.get("limits"))
            return self._sandbox

    def close(self):  # every command still running ends, the sandbox's TMPDIR goes
        if self._sandbox is not None:
            self._sandbox.close()

    def changed(self):  # a command ran, a file tool wrote: what is derived from the tree is looked at again
        self._resolved = None
        self._around = {}

    def _resolved_set(self):
        with self._lock:
            if self._resolved is None:
                self._resolved = [(p, fold_path(p)) for p in _resolved_protected(self)]
            return self._resolved

    def reason(self, path, holding=True):
        """What protected path a change at the absolute `path` touches (as shown to people), or None: the path
        itself, anything inside a protected path and, holding=True, a directory that holds one (deleting or
        replacing `src/` deletes `src/.git`). Inside the tree: the protected set, configured globs,
        repositories and virtualenvs' start-up code by their own rules (also one this change would make);
        outside: the home directories' names, XZATOMA_HOME, the private files, system directories, disks."""
        folded = fold_path(path)

        def hits(q):
            return folded == q or folded.startswith(q + "/") or (holding and q.startswith(folded.rstrip("/") + "/"))
        if _inside(path, self.root):
            hit = next((p for p, q in self._resolved_set() if hits(q)), None)
            return display_path(hit, self.root) if hit else _protected_rel(
                display_path(path, self.root), self.globs, self.root) or self._code_around(path, holding)
        hit = next((shown for q, shown in self._outside if hits(q)), None)
        hit = hit or next((name for name in SYSTEM_PROTECTED if path == name or path.startswith(name + "/")), None)
        return hit or ("a disk device" if _DEVICE.match(path) else None)

    def runs_later(self, path):
        """For a path in the tree: the repository or virtualenv start-up code a change there is in or would make
        (a .git/.hg anywhere, a directory git takes for a repository, where a .git really is and the hooks its
        config names, a .pth file …), or None. The policy denies writing these; the tree's other protected
        names are the sandbox's and the watch's to keep (a person may say yes to them)."""
        folded, static = fold_path(path), set(self.protected)
        hit = next((p for p, q in self._resolved_set() if p not in static and (
            folded == q or folded.startswith(q + "/"))), None)
        return display_path(hit, self.root) if hit else _protected_rel(
            display_path(path, self.root), (), self.root) or self._code_around(path, False)

    def _code_around(self, real, holding):
        """A repository or virtualenv start-up file that a change at `real` is (holding=True), is in, or would
        make: each directory from `real` up to the root is judged as git judges one, with the entry this change
        adds to it, and as Python finds a virtualenv's start-up code."""
        if holding and (is_git_dir(real) or os.path.lexists(os.path.join(real, "pyvenv.cfg"))):
            return display_path(real, self.root) + (" (a git directory)" if is_git_dir(real) else " (a virtualenv)")
        if hit := venv_code(display_path(real, self.root), venv=False, top=self.root):
            return "%s (%s)" % (display_path(real, self.root), hit)
        d, child = os.path.dirname(real), os.path.basename(real)
        while _inside(d, self.root):
            if is_git_dir(d, adding=child):
                return display_path(d, self.root) + " (a git directory)"
            if hit := self._named_by_repository(d, real):
                return hit
            if os.path.lexists(os.path.join(d, "pyvenv.cfg")) or (d, fold_name(child)) == (
                    os.path.dirname(real), "pyvenv.cfg"):  # a virtualenv, or one this change makes
                if hit := venv_code(os.path.relpath(real, d), top=d):
                    return "%s (%s)" % (display_path(real, self.root), hit)
            if d == self.root:
                return None
            d, child = os.path.dirname(d), os.path.basename(d)
        return None

    def _named_by_repository(self, top, real):
        """When `top` holds a `.git` (a directory, a link or a file; not its own metadata): what of `real` its
        config makes git run or read (core.hooksPath, include.path …), or the links in it lead to, else None.
        INFO: the scan of the whole tree (nested_repositories) stops after 2000 directories, and a repository
        past them lost its hooksPath (round 19b); the repository a write is in is judged here on demand."""
        folded = fold_path(real)
        hit = next((p for p, q in self.repository_paths(top) if folded == q or folded.startswith(q + "/")), None)
        return display_path(hit, self.root) if hit else None

    def repository_paths(self, top):
        """[(path, folded)] in the tree of the repository whose `.git` (a directory, link or file) is in `top`:
        where git really keeps it, what its config names and what links in those lead to; [] without one."""
        dot = os.path.join(top, ".git")
        if fold_name(os.path.basename(top)) in PROTECTED_ANYWHERE or not os.path.lexists(dot):
            return []
        with self._lock:
            if (paths := self._around.get(top)) is None:
                paths = []
                gitdirs = _gitdirs(dot)
                for gitdir in gitdirs:
                    paths += [gitdir] if _inside(gitdir, self.root) else []
                    paths += _git_config_paths(self, top, gitdir)
                paths += _linked_from(self, paths, [g for g in gitdirs if not _inside(g, self.root)])[0]
                if len(self._around) > 256:
                    self._around.clear()
                self._around[top] = paths = [(p, fold_path(p)) for p in dict.fromkeys(paths)]
            return paths

    def target_reason(self, target, check=None):
        """reason() for a file tool's Target, and for a directory anything protected below it. A path is judged
        at the name it was given, at every link it passed and where it leads: `.git/hooks/pre-commit` linked to
        `scripts/pre-commit` (the usual way to share a hook) is a hook, whatever file holds it (round 19b)."""
        found = self.reason(target.real) or next(filter(None, (self.reason(p, holding=False) for p in getattr(
            target, "passed", ()))), None) or self.copied_reason(target, target.real, check)
        if found is None and not self.links_complete:
            found = ("somewhere the protected directories' links may lead (they hold over %s entries, too many "
                     "to follow every link)" % "{:,}".format(LINKED_MOST))
        return found

    def copied_reason(self, source, where, check=None):
        """The first protected path below the directory Target `source` were its tree at `where`: a `.git`, a
        glob's match, a git directory by git's rules, a virtualenv's start-up code; else None."""
        st = source.lstat()
        if st is None or not stat.S_ISDIR(st.st_mode):
            return None
        names, venvs = {}, [d for d in _venvs_above(where, self.root)]
        for sub, _, name, _, _ in walk_at(source.dir_fd, source.name, check):
            path = os.path.join(where, sub)
            if hit := sub and _protected_rel(display_path(path, self.root), self.globs, self.root):
                return hit
            if sub:
                names.setdefault(os.path.dirname(path), []).append(name)
                venvs += [os.path.dirname(path)] if fold_name(name) == "pyvenv.cfg" else []
        for d, entries in names.items():
            hit = is_git_dir(d, names=entries) and "a git directory" or next(filter(None, [venv_code(
                display_path(os.path.join(d, n), self.root), venv=False, top=self.root) for n in entries] + [venv_code(
                    os.path.relpath(os.path.join(d, n), v), top=v) for v in venvs if _inside(d, v) for n in entries]), None)
            if hit:
                return "%s (%s)" % (display_path(d, self.root), hit)
        return None

    def binds(self):
        """What the sandbox makes read-only for commands: the protected set as it really is (a `.git` link's
        target, a gitdir, the hooks and programs a repository's config names), existing, links left out."""
        return list(dict.fromkeys(p for p, _ in self._resolved_set() if not _is_glob(p) and os.path.lexists(p)
                                  and not os.path.islink(p)))

    def accept(self, path):
        """A person said yes to a change at `path`: the after-command watch does not ask about it again."""
        if watch := getattr(self._sandbox, "_watch", None):
            watch.keep(path, accepted=True)

    def git(self, path=None):
        """The git program a command would run (the first on `path`, default the environment's PATH), when it
        lies outside the tree, or None: the one asked what a repository's configuration says."""
        path = path if path is not None else (self.environ or os.environ).get("PATH", os.defpath)
        with self._lock:
            if path not in self._git:
                real = next((os.path.realpath(os.path.join(e, "git")) for e in path.split(os.pathsep) if e.startswith(
                    "/") and os.path.isfile(os.path.join(e, "git")) and os.access(os.path.join(e, "git"), os.X_OK)), None)
                self._git[path] = None if real is None or _inside(real, self.root) else real
            return self._git[path]

    def before_change(self):
        """A tool is about to change the tree: the files that run later by design are noted first (once per
        run), so that the run's end can list those it changed."""
        with self._lock:
            if self._deferred is None:
                self._deferred = deferred_files(self.root)

    def deferred_changed(self):
        """The files that run later by design (deferred_files) created or changed since this run's first change,
        relative and sorted ([] without one); the next run starts a list of its own."""
        with self._lock:
            before, self._deferred = self._deferred, None
        if before is None:
            return []
        now, complete = deferred_files(self.root)
        changed = sorted(p for p, ident in now.items() if before[0].get(p) != ident)
        # a tree too large to look at whole: said, never taken for "nothing changed" (round 19b)
        return changed + ([] if complete and before[1] else [INCOMPLETE_REVIEW])


# ---- Repositories and virtualenvs, judged by their own rules ----
# What runs code later without anyone running it: a repository's hooks and configuration (the next `git status`),
# a virtualenv's .pth files, sitecustomize and interpreter (the next Python start). Found the way git and Python
# find them, whatever order their parts were made in; a configuration is read by git itself, never by our parser.

def is_git_dir(path, adding=None, names=None):
    """Would git use `path` as a repository directory, or is it one part from it? setup.c's is_git_directory
    wants HEAD, and objects and refs (or a commondir saying where they are), of any kind (git asks access(),
    not the type); HEAD with any one of them counts here, so that the last part is never the one unnoticed.
    `adding` is an entry a change is about to make there; `names`, its entries when they are known."""
    added = fold_name(adding) if adding else None
    if names is None and added != "head" and not os.path.lexists(os.path.join(path, "HEAD")):
        return False
    have = {fold_name(n) for n in names} if names is not None else {"head"} | {
        n for n in ("objects", "refs", "commondir") if os.path.lexists(os.path.join(path, n))}
    have.add(added)
    return "head" in have and bool(have & {"objects", "refs", "commondir"})


def _read_small(path, limit=4096):
    """The first bytes of a regular file, or None: never opening a FIFO or device a repository planted."""
    if (fd := open_if_regular(path, follow=True)) is None:
        return None
    try:
        return read_fd(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _gitdirs(dot):
    """The real git directories a `.git` entry (or a bare repository) stands for: itself or the `gitdir:` its
    file names, and a linked worktree's common one; [] when the file says nothing git would read. A file is read
    as git's read_gitfile_gently reads it ("gitdir: ", then every byte to the end but the line endings there) and
    also leniently (a stripped first line): the directory git uses, and the one a reader may take it for, are
    both protected. INFO: the lenient reading alone named another directory than git uses (`gitdir:  meta`,
    `gitdir: meta\nx`), whose harmless config was checked (attack round 18b)."""
    if os.path.isdir(dot):  # a directory, or a link to one: git follows it (round 19b: `sub/.git -> ../meta`)
        candidates = [dot]
    else:
        data, candidates = _read_small(dot, 1 << 16) or b"", []
        if data.startswith(b"gitdir: ") and len(data) < 1 << 16:
            candidates.append(os.path.join(os.path.dirname(dot), os.fsdecode(data[8:].rstrip(b"\r\n"))))
        line = data.decode("utf-8", "replace").strip().splitlines()
        if line and line[0].startswith("gitdir:"):
            candidates.append(os.path.join(os.path.dirname(dot), line[0][7:].strip()))
    out = []
    for gitdir in dict.fromkeys(os.path.realpath(c) for c in candidates):
        common = (_read_small(os.path.join(gitdir, "commondir")) or b"").strip()
        out += [gitdir] + ([os.path.realpath(os.path.join(gitdir, os.fsdecode(common)))] if common else [])
    return list(dict.fromkeys(out))


def _resolved_protected(conf):
    """The protected set plus where it really is: `.git` may be a symlink to `repo-meta/`, or a worktree's
    `.git` file naming its gitdir; the hooks and programs a repository's config names, also of the
    repositories nested in the tree and of the one enclosing it. Changing those is changing .git."""
    out, dots = list(conf.protected), [(d, os.path.dirname(d)) for d in nested_repositories(conf.root)[0] +
                                       git_dirs(conf.root) if fold_name(os.path.basename(d)) == ".git"]
    for path in conf.protected:
        try:
            with conf.jail.resolve(path) as target:
                real, st = target.real, target.lstat()
        except (ToolError, OSError):
            continue
        out += [real] if real != path else []
        dots += [(real, os.path.dirname(path))] if st is not None and fold_name(os.path.basename(path)) == ".git" else []
    tops = []  # every gitdir, the enclosing repository's outside the tree too: its hooks may link into it (19f)
    for dot, top in dots:  # a `.git` (or what it links to) and the top of its working tree
        gitdirs = _gitdirs(dot)
        tops += gitdirs
        out += [d for d in gitdirs if _inside(d, conf.root)]
        for gitdir in gitdirs:
            out += _git_config_paths(conf, top, gitdir)
    out = list(dict.fromkeys(out))
    # every repository around the tree, not only the nearest: a nested one's own .git hides the outer from git
    # rev-parse, and the outer's hooks still run at its commits
    up = os.path.dirname(conf.root)
    while up != os.path.dirname(up):
        if os.path.isdir(os.path.join(up, ".git")):
            tops.append(os.path.join(up, ".git"))
        up = os.path.dirname(up)
    linked, complete = _linked_from(conf, out, list(dict.fromkeys(t for t in tops if not _inside(t, conf.root))))
    conf.links_complete = complete
    known = set(out)
    return out + [p for p in linked if p not in known]


#: entries of protected directories looked at for links, in all (a home directory's ~/.cargo/registry)
LINKED_MOST = 200000
#: a git directory's data, never run: not looked into for links
_GIT_DATA = {"objects", "lfs", "refs", "logs", "packed-refs", "rr-cache"}


def _linked_from(conf, protected, outside=(), most=LINKED_MOST):
    """(where the links inside protected directories lead in the tree, and the links there in turn; whether all
    were seen): `.git/hooks/pre-commit -> ../../scripts/pre-commit`, `.git/hooks -> ../githooks`, `.git/config
    -> ../repo.gitconfig`, `~/.ssh/config -> ../dotfiles/ssh/config`. git and ssh read those files through the
    link, so the file it leads to is the hook or the config: protected under its own name too, and read-only
    for commands (round 19b). Breadth first over all of them at once, shallow entries (hooks, config) before
    deep ones, a repository's data never (a 20,000-file ~/.cargo/registry walked first had hidden ~/.ssh's links,
    round 19f); a link is followed as the kernel follows it (`../` above the tree and back in counts), and
    `outside`: git directories outside the tree whose links may lead into it (the enclosing repository's)."""
    import collections
    root = conf.root
    found, known = [], set(protected)
    queue = collections.deque(p for p in dict.fromkeys(protected) if not _is_glob(p) and _inside(p, root))
    queue.extend(outside)
    seen = 0
    while queue:
        top = queue.popleft()
        # not the tree, nor a place around it (`--working-dir ~/.ssh/x`: all of the tree is protected already)
        if _inside(root, top) or os.path.islink(top) or not os.path.isdir(top):
            continue
        data = is_git_dir(top)
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    seen += 1
                    if seen > most:
                        return found, False
                    if entry.is_symlink():
                        real = os.path.realpath(entry.path)
                        if _inside(real, root) and real != root and real not in known:
                            known.add(real)
                            found.append(real)
                            queue.append(real)
                    elif entry.is_dir(follow_symlinks=False) and not (data and entry.name in _GIT_DATA):
                        queue.append(entry.path)
        except OSError:
            continue
    return found, True


def _git_config_paths(conf, top, gitdir):
    """In-tree paths a repository's own config makes git run or read as config: core.hooksPath, programs
    named with a slash (fsmonitor, pager, textconv, filters, aliases, helpers …), include paths. Writing them
    runs code at the person's next git command, like writing .git/hooks does."""
    out, entries = [], git_config(gitdir, conf.git())
    if entries is None:  # git cannot say: each `key = value` line of its own files, as written
        entries = [(k.strip().lower(), v, f) for f in (os.path.join(gitdir, n) for n in ("config", "config.worktree"))
                   for k, eq, v in (re.sub(r'^\s*\[[^\]]*\]', "", line).partition("=") for line in
                                    (_read_small(f, 1 << 20) or b"").decode("utf-8", "replace").split("\n")) if eq]
    for key, value, origin in entries:
        name = key.rsplit(".", 1)[-1].lower()
        for token in re.split(r"[\s;|&()<>`]+", value.replace('"', " ").replace("'", " ")):
            token = token.lstrip("!")
            if not token or token.startswith("-") or token[:1] in "#;" or not (
                    name in ("hookspath", "path") or "/" in token or token.startswith("~")):
                continue
            base = os.path.dirname(origin) if name == "path" else top
            try:
                with conf.jail.resolve(os.path.join(base, os.path.expanduser(token))) as target:
                    found = target.real
            except (ToolError, OSError):
                continue
            if found != conf.root and found not in out:
                out.append(found)
    return out


def _protected_rel(rel, globs, root):
    """rel (or the part of it up to a protected name) when a .git/.hg component or a glob from the
    configuration matches it, case-insensitively; else None. A glob that begins above the root (absolute, as
    display_path left it) is matched against the absolute path."""
    parts = rel.split("/")
    for i, part in enumerate(parts):
        if fold_name(part) in PROTECTED_ANYWHERE:
            return "/".join(parts[: i + 1])
    for lowered in {rel.lower(), fold_path(rel)}:
        for pattern in globs:
            for i in range(len(parts)):  # the path or a directory above it
                sub = "/".join(lowered.split("/")[: i + 1])
                if glob_match(pattern, os.path.join(root.lower(), sub) if pattern.startswith("/") else sub):
                    return "/".join(parts[: i + 1])
    return None


def _tree(root, max_dirs, enter, first=None):
    """Breadth-first over the directories below `root`, never following links: yields (directory, its entries)
    for at most `max_dirs` directories (then (None, None): the bound cut it short); `enter(entry)` says
    whether to look into a subdirectory, `first(entry)` whether to look into it before the others waiting."""
    import collections
    queue = collections.deque([root])
    while queue:
        if max_dirs <= 0:
            yield None, None
            return
        path, max_dirs = queue.popleft(), max_dirs - 1
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        yield path, entries
        subdirs = [e for e in entries if e.is_dir(follow_symlinks=False) and enter(e)]
        queue.extend(e.path for e in subdirs if first is None or not first(e))
        queue.extendleft(e.path for e in subdirs if first is not None and first(e))


def nested_repositories(root, max_dirs=2000):
    """Repository metadata below the top of the working directory (submodules, vendored clones): (paths,
    complete), at most max_dirs directories looked at, so a huge tree costs a bounded start-up."""
    root, found = os.path.realpath(root), []
    for path, entries in _tree(root, max_dirs, lambda e: fold_name(e.name) not in PROTECTED_ANYWHERE):
        if path is None:
            return found, False
        # a `.git` link too: git follows it to the repository (round 19b), whose config is judged as any other
        found += [e.path for e in entries if path != root and fold_name(e.name) in PROTECTED_ANYWHERE]
    return found, True


#: repository configuration that only holds data, as git names its keys (`remote.*.url`: any remote's url).
#: Everything else a repository's own configuration sets (core.fsmonitor, include.path, a diff driver,
#: lfs.customtransfer.*.path, a key nobody here has heard of) makes git status/diff/log/show a `confirm`: a
#: hostile repository ships its config, and only what is known to be data is allowed. No wildcard stands for a
#: key, but for color.* and advice.*, whose every key is a colour or a boolean.
GIT_DATA_KEYS = frozenset("""
core.repositoryformatversion core.filemode core.bare core.logallrefupdates core.ignorecase core.precomposeunicode
core.symlinks core.autocrlf core.eol core.safecrlf core.quotepath core.abbrev core.compression
core.loosecompression core.sharedrepository core.untrackedcache core.splitindex core.checkstat core.trustctime
core.preloadindex core.commentchar core.commentstring core.whitespace core.multipackindex core.commitgraph
core.longpaths core.fscache core.warnambiguousrefs core.deltabasecachelimit core.bigfilethreshold
core.packedgitlimit core.packedgitwindowsize core.checkroundtripencoding core.notesref core.filesreflocktimeout
core.packedrefstimeout core.fsyncmethod core.fsync core.sparsecheckout core.sparsecheckoutcone
remote.*.url remote.*.pushurl remote.*.fetch remote.*.push remote.*.tagopt remote.*.prune remote.*.prunetags
remote.*.mirror remote.*.skipdefaultupdate remote.*.skipfetchall remote.*.promisor remote.*.partialclonefilter
branch.*.remote branch.*.merge branch.*.rebase branch.*.pushremote branch.*.description
submodule.*.url submodule.*.active submodule.*.branch submodule.*.path
user.name user.email user.useconfigonly author.name author.email committer.name committer.email
init.defaultbranch pull.rebase pull.ff push.default push.autosetupremote push.followtags fetch.prune
fetch.prunetags fetch.writecommitgraph column.ui column.branch column.status column.tag i18n.commitencoding
i18n.logoutputencoding rerere.enabled gc.auto gc.autodetach gc.writecommitgraph index.version index.threads
index.skiphash feature.manyfiles maintenance.auto maintenance.strategy extensions.objectformat
extensions.refstorage extensions.partialclone extensions.preciousobjects extensions.worktreeconfig
lfs.repositoryformatversion lfs.url worktree.guessremote status.showuntrackedfiles
""".split())
_git_config_cache = {}


def _state(paths):
    """What stands at each path, as far as a change to it goes (a ctime cannot be set back)."""
    return tuple((p,) + ((st.st_ino, st.st_ctime_ns, st.st_size) if st else ()) for p, st in (
        (p, os.stat(p) if os.path.exists(p) else None) for p in paths))


def git_config(gitdir, git):
    """The configuration of the repository at `gitdir` as git itself reads it (its config, a worktree's, a
    linked worktree's common one, and what they include, whether or not git takes the directory for a
    repository yet), without the system's, the person's or a command line's: [(key, value, origin file)],
    keys as git writes them (`x.Sub.key`), or None when git (the program `git`, outside the tree) cannot be
    asked or refuses. Asked once per state of the files it named."""
    common = (_read_small(os.path.join(gitdir, "commondir")) or b"").strip()
    files = [os.path.join(gitdir, "config"), os.path.join(gitdir, "config.worktree")] + (
        [os.path.join(gitdir, os.fsdecode(common), "config")] if common else [])
    if not git or "\n" in gitdir or any(os.path.lexists(f) and not stat.S_ISREG(os.lstat(f).st_mode) for f in files):
        return None  # no git to ask, a name git's syntax cannot quote, a FIFO as the config (git would hang)
    cached = _git_config_cache.get((gitdir, git))
    if cached is not None and _state(cached[0]) == cached[1]:
        return cached[2]
    import subprocess
    env = {"PATH": os.path.dirname(git), "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent", "LC_ALL": "C",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CEILING_DIRECTORIES": "/"}
    blob = "[include]\n" + "".join('\tpath = "%s"\n' % f.replace("\\", "\\\\").replace('"', '\\"') for f in files)
    try:  # git config only reads files (it runs nothing); no terminal to open, a time limit for a FIFO include
        done = subprocess.run([git, "config", "--file", "-", "--list", "-z", "--includes", "--show-origin"],
                              env=env, cwd="/", input=blob.encode("utf-8", "surrogateescape"), capture_output=True,
                              timeout=3, start_new_session=True)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    items = done.stdout.decode("utf-8", "surrogateescape").split("\0")
    entries = [entry.partition("\n")[::2] + (origin[5:],) for origin, entry in zip(items[0::2], items[1::2])
               if origin.startswith("file:")]  # not the include lines of the blob above
    if len(_git_config_cache) > 256:
        _git_config_cache.clear()
    watched = files + [o for _, _, o in entries]
    _git_config_cache[(gitdir, git)] = (watched, _state(watched), entries)
    return entries


def _submodules(gitdir):
    """The repositories of a repository's submodules (modules/…, nested ones too, and what holds a config or
    hooks there, a repository or not yet); past 64, 65 of them."""
    out = []
    for top, subdirs, files in os.walk(os.path.join(gitdir, "modules")):
        out += [top] if is_git_dir(top, names=subdirs + files) or {"config", "hooks"} & set(subdirs + files) else []
        subdirs[:] = [d for d in subdirs if d not in ("objects", "refs", "logs", "hooks")][:max(0, 65 - len(out))]
    return out


#: hooks only commands that write run (a commit, a merge, a push, a checkout …); any other hook, and a name nobody
#: here has heard of, may run at a read-only command: post-index-change runs when `git status` refreshes the index
WRITING_HOOKS = frozenset("""applypatch-msg pre-applypatch post-applypatch pre-commit pre-merge-commit
prepare-commit-msg commit-msg post-commit pre-rebase post-checkout post-merge pre-push pre-receive update
proc-receive post-receive post-update push-to-checkout pre-auto-gc post-rewrite sendemail-validate
p4-changelist p4-prepare-changelist p4-post-changelist p4-pre-submit""".split())


def _git_repo_reason(dot, git, submodule=False, hooks=False):
    """The first key of the configuration of a repository (a .git directory or file, or a bare one) and of its
    submodules' (modules/) that is not known to hold only data (as git names it), or None; a reason too when
    git cannot be asked. hooks=True: then the first hook they hold (a submodule's run at `git submodule update`);
    hooks="read": the first a read-only command may run (not in WRITING_HOOKS)."""
    if not (gitdirs := _gitdirs(dot)):
        return "a .git file git may read differently"
    for gitdir in gitdirs:  # as git reads a .git file, as it may be taken for, and a worktree's common directory
        if reason := _gitdir_reason(gitdir, git, submodule, hooks):
            return reason
    return None


def _gitdir_reason(gitdir, git, submodule=False, hooks=False):
    """_git_repo_reason of the repository directory git uses."""
    if len(gitdirs := [gitdir] + _submodules(gitdir)) > 64:
        return "too many submodule repositories to check"
    for i, gitdir in enumerate(gitdirs):
        if (entries := git_config(gitdir, git)) is None:
            return "a configuration git could not be asked about" if git else "no git outside the tree to ask"
        for key, _, _ in entries:
            section, _, rest = key.partition(".")
            name = section.lower() + (".*." if "." in rest else ".") + rest.rsplit(".", 1)[-1].lower()
            if section.lower() not in ("color", "advice") and name not in GIT_DATA_KEYS and not (
                    (submodule or i) and name == "core.worktree"):  # a submodule's repository names its working tree
                return ("git config: " if hooks else "") + key
    # a linked worktree runs the hooks of its common directory (main/.git/hooks), not its own (round 18e)
    common = (_read_small(os.path.join(gitdirs[0], "commondir")) or b"").strip()
    commons = [os.path.realpath(os.path.join(gitdirs[0], os.fsdecode(common)))] if common else []
    for path in [os.path.join(d, "hooks") for d in gitdirs + commons] if hooks else []:
        try:
            live = [n for n in (os.listdir(path) if os.path.lexists(path) else []) if not n.endswith(".sample")]
        except OSError:
            return "unreadable hooks"
        live = [n for n in live if hooks is True or n not in WRITING_HOOKS]
        if os.path.islink(path) or live:
            return "a hooks link" if os.path.islink(path) else "%s/%s" % (os.path.relpath(path, gitdirs[0]), live[0])
    return None


def _git_config_runs(dirs, git):
    """The first key in the configuration of the repositories a git command in `dirs` meets, or a hook it may
    run, or None. The repositories are found by git itself: the one each dir is in (`git rev-parse`), then the
    submodules its index holds (`git ls-files`), whose own repositories `git status` and `git diff` run in.
    INFO: a walk of our own missed what git finds: a submodule past the first 500 directories, a `.git` that is
    a link, an empty `.git/` that git passes over for the repository above it (attack round 18b)."""
    if not git:
        return "no git outside the tree to ask"
    seen = set()
    for start in dirs:
        if reason := _git_tree_reason(start, git, seen, None):
            return reason
    return None


def _git(git, args, cwd, env=None, limit=1 << 20):
    """(exit code, stdout, stderr) of git asked about a repository; None when it could not answer (it runs
    nothing a repository names: no system or person's configuration, no fsmonitor, no hooks, no pager)."""
    import subprocess
    base = {"PATH": os.path.dirname(git), "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent", "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
    base.update(env or {})
    try:
        done = subprocess.run([git, "-c", "core.fsmonitor=false", "-c", "core.hookspath=/nonexistent",
                               "--no-pager"] + args, env=base, cwd=cwd, capture_output=True, timeout=10,
                              start_new_session=True, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return None if len(done.stdout) > limit else (done.returncode, done.stdout, done.stderr)


def _git_tree_reason(start, git, seen, env, submodule=False):
    """_git_config_runs for the repository git uses in `start` (with `env`: GIT_DIR=.git, as git starts a
    submodule's status) and, recursively, its submodules'."""
    found = _git(git, ["rev-parse", "--absolute-git-dir", "--is-bare-repository", "--show-cdup"], start, env)
    if found is None:
        return "git could not say which repository is here"
    code, out, err = found
    if code != 0:
        return None if b"not a git repository" in err else "git could not say which repository is here (%s)" % (
            err.decode("utf-8", "replace").strip().splitlines() or ["exit %d" % code])[-1][:200]
    lines = out.split(b"\n")  # a bare repository has no --show-cdup line
    if len(lines) != (3 if lines[1:2] == [b"true"] else 4) or lines[-1] or lines[1] not in (b"true", b"false"):
        return "git named a repository this check cannot read"  # a name with a line feed in it, say
    gitdir = os.path.realpath(os.fsdecode(lines[0]))
    if submodule:  # core.worktree, allowed a submodule's repository, must name this checkout: elsewhere, git
        # status reads another tree and index than the one looked at here (round 18e)
        for key, value, _ in git_config(gitdir, git) or ():
            if key.lower() == "core.worktree" and os.path.realpath(os.path.join(gitdir, value)) != \
                    os.path.realpath(start):
                return "a submodule whose core.worktree names another directory (%s)" % value[:200]
    if gitdir in seen:
        return None
    seen.add(gitdir)
    if len(seen) > 64:
        return "too many repositories to check"
    if reason := _gitdir_reason(gitdir, git, submodule, hooks="read"):
        return reason
    if lines[1] == b"true":
        return None
    top = os.path.realpath(os.path.join(start, os.fsdecode(lines[2])))
    listed = _git(git, ["ls-files", "--stage", "-z"], top, env, limit=256 << 20)
    if listed is None or listed[0] != 0:
        return "git could not list the submodules"
    for entry in listed[1].split(b"\0"):
        if entry.startswith(b"160000 "):  # a gitlink: a submodule
            path = os.path.join(top, os.fsdecode(entry.partition(b"\t")[2]))
            if os.path.lexists(os.path.join(path, ".git")) and (reason := _git_tree_reason(
                    path, git, seen, {"GIT_DIR": ".git"}, True)):
                return reason
    return None


def repository_runs_code(dot, root, git):
    """Would git or hg run something from this `.git`/`.hg` (a directory, a `gitdir:` file or a link) or bare
    repository below root? A reason, or None for a repository as `git init`/`git clone` make it. Anything
    unsure is a reason."""
    if os.path.islink(dot):
        return "a link"
    if fold_name(os.path.basename(dot)) == ".hg":
        return "an hgrc" if os.path.lexists(os.path.join(dot, "hgrc")) else None
    if any(not _inside(d, root) for d in _gitdirs(dot)):
        return "a gitdir outside the working directory"
    return _git_repo_reason(dot, git, hooks=True)


def venv_code(rel, venv=True, top=None):
    """What Python runs at every start without anyone running it, from `rel`: anywhere, sitecustomize and
    usercustomize (a module, a compiled or native one, a package: imported from wherever the path finds it), a
    site directory's .pth files (an `import` line runs) and, with `top` (the directory `rel` is relative to),
    the modules such a line names; with venv=True (`rel` relative to a virtualenv's top, where pyvenv.cfg is)
    its configuration (`home` picks the standard library) and interpreter links. Or None."""
    parts = [fold_name(p) for p in rel.split("/")]
    if any(p.split(".")[0] in ("sitecustomize", "usercustomize") for p in parts):
        return "code every Python start runs"
    if len(parts) > 1 and parts[-1].endswith(".pth") and parts[-2] in ("site-packages", "dist-packages"):
        return "a .pth file every Python start reads"
    site = next((i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), None)
    if top is not None and site is not None and site + 1 < len(parts):
        # INFO: virtualenv's _virtualenv.pth runs `import _virtualenv`, setuptools' distutils-precedence.pth
        # imports _distutils_hack: the .pth files were protected, the code they run was not (attack round 18a)
        module = parts[site + 2] if parts[site + 1] == "__pycache__" and site + 2 < len(parts) else parts[site + 1]
        if module.split(".")[0] in _pth_names(os.path.join(top, *rel.split("/")[:site + 1])):
            return "a module a .pth file imports at every Python start"
    if venv and parts == ["pyvenv.cfg"]:
        return "a virtualenv's configuration"
    if venv and len(parts) == 2 and parts[0] in ("bin", "scripts") and parts[1].startswith(("python", "pypy")):
        return "a virtualenv's interpreter"
    return None


def _venvs_above(path, root):
    """The virtualenvs (their tops) that `path` lies in or is."""
    out = []
    while _inside(path, root):
        out += [path] if os.path.lexists(os.path.join(path, "pyvenv.cfg")) else []
        if path == root:
            break
        path = os.path.dirname(path)
    return out


def startup_runs_code(path, root):
    """Would Python run something from this virtualenv start-up file a command made? A reason, or None for what
    `python -m venv` makes: pyvenv.cfg with its `home` outside the tree, interpreter links to a program
    outside it."""
    name = fold_name(os.path.basename(path))
    if name == "pyvenv.cfg":
        home = [v.strip() for k, _, v in (line.partition("=") for line in (_read_small(path) or b"").decode(
            "utf-8", "replace").split("\n")) if k.strip().lower() == "home"]
        return None if home and home[0] and not _inside(os.path.realpath(home[0]), root) else \
            "a virtualenv configuration whose home is %s" % (home[0] if home else "missing")
    if not name.startswith(("python", "pypy")):
        return "code every Python start there runs"
    return None if os.path.islink(path) and os.path.isfile(path) and not _inside(os.path.realpath(path), root) else \
        "an interpreter that is not a link to one outside the working directory"


#: project files that are code by design and run later, when a person runs the build, the tests, the CI or
#: opens the editor: a run changing them is not blocked, but they are listed at its end for review
DEFERRED_NAMES = ("makefile", "gnumakefile", "*.mk", "conftest.py", "package.json", ".envrc", "justfile",
                  "taskfile.yml", "noxfile.py", "tox.ini", "setup.py", "pyproject.toml", ".pre-commit-config.yaml",
                  "dockerfile", ".gitlab-ci.yml", ".travis.yml", "jenkinsfile", "azure-pipelines.yml",
                  "bitbucket-pipelines.yml", ".gitattributes", ".gitmodules",
                  # what a build, a test run or an editor reads as code or as a program to run (round 18a)
                  "pytest.ini", "setup.cfg", ".pylintrc", "pylintrc", ".mcp.json", ".yarnrc.yml", ".yarnrc", ".npmrc",
                  "build.rs", "cmakelists.txt", "*.cmake", "build.gradle", "build.gradle.kts", "settings.gradle",
                  "settings.gradle.kts", "gradlew", "mvnw", "pom.xml", "gemfile", "rakefile", "*.gemspec",
                  "docker-compose.yml", "docker-compose.yaml", "compose.yml", "compose.yaml", ".gitpod.yml",
                  "*.config.js", "*.config.cjs", "*.config.mjs", "*.config.ts", ".eslintrc.js", ".eslintrc.cjs",
                  ".babelrc.js", "meson.build", "configure", "build.sh", "cargo.toml", ".drone.yml", ".woodpecker.yml")
DEFERRED_DIRS = (".github/workflows", ".github/actions", ".circleci", ".vscode", ".devcontainer", ".husky",
                 ".idea/runconfigurations", ".cargo", ".buildkite", ".gitea/workflows", ".forgejo/workflows",
                 ".woodpecker", ".mvn", ".githooks")
#: DEFERRED_DIRS and the directories on the way to them (`.github`)
DEFERRED_PREFIXES = tuple({d.rsplit("/", i)[0] for d in DEFERRED_DIRS for i in range(d.count("/") + 1)})
#: the last entry of a review list when the tree was too large to compare whole
INCOMPLETE_REVIEW = "(the tree is too large to compare whole: this list may be incomplete)"


_pth_cache = {}  # site directory -> (its mtime, the .pth files' state, the names their import lines hold)


class _EveryName:
    """The names of .pth files too many or too large to read: every module of that site directory is start-up code."""

    def __contains__(self, name):
        return True


_EVERY_NAME = _EveryName()


def _pth_names(site):
    """Every name in the `import` lines of a site directory's .pth files (folded), which Python runs at each
    start: a module named there is start-up code. Read again when the directory or a .pth file changes."""
    try:
        mtime = os.stat(site).st_mtime_ns
    except OSError:
        return frozenset()
    cached = _pth_cache.get(site)
    if cached is not None and cached[0] == mtime and _state(cached[1]) == cached[2]:
        return cached[3]
    try:
        files = sorted(e.path for e in os.scandir(site) if e.name.endswith(".pth"))
    except OSError:
        return frozenset()
    names = set()
    for path in files[:256]:
        data = _read_small(path, 1 << 20) or b""
        if len(data) >= 1 << 20:
            names = _EVERY_NAME  # past what is read: any module may be one it imports (round 18e: 64 KB)
            break
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith(("import ", "import\t")):
                names.update(fold_name(n) for n in re.findall(r"\w+", line))
    if len(files) > 256:
        names = _EVERY_NAME
    if len(_pth_cache) > 64:
        _pth_cache.clear()
    _pth_cache[site] = (mtime, files, _state(files), names if names is _EVERY_NAME else frozenset(names))
    return _pth_cache[site][3]


def deferred_files(root, max_dirs=20000):
    """({relative path: identity}, complete) of the files in the tree that run later by design: DEFERRED_NAMES
    anywhere, what DEFERRED_DIRS (at any depth: cargo reads `.cargo/config.toml` in every directory) and a
    virtualenv's bin/ hold (not its libraries, not node_modules/). A link counts by what it leads to, and a link
    to a directory is looked into (`Makefile -> mk/rules.txt`, `.vscode -> editor/`), so an edit through either
    changes the identity. complete=False: past max_dirs directories the rest was not looked at (round 19b)."""
    out, whole, venvs, cut, dirs = {}, set(), set(), len(root.rstrip("/")) + 1, [max_dirs]
    names = re.compile("|".join(fnmatch.translate(n) for n in DEFERRED_NAMES))

    def deferred_dir(rel, leading=False):  # rel is one (leading=True: or on the way to one, looked at first)
        rel = "/" + rel.lower()
        return any(rel.endswith("/" + d) for d in (DEFERRED_PREFIXES if leading else DEFERRED_DIRS))

    def identity(path):
        st = os.stat(path, follow_symlinks=False)
        ident = (st.st_ino, st.st_ctime_ns, st.st_size)
        if stat.S_ISLNK(st.st_mode):  # the file it leads to, and where it leads
            try:
                real = os.stat(path)
                ident += (os.readlink(path), real.st_ino, real.st_ctime_ns, real.st_size)
            except OSError:
                ident += (os.readlink(path),)
        return ident

    def linked_tree(link, rel):  # a deferred directory that is a link: what it holds, under the link's name
        real = os.path.realpath(link)
        if not _inside(real, root) or real == root:
            return True
        for path, entries in _tree(real, dirs[0], lambda e: True):
            dirs[0] -= 1
            if path is None:
                return False
            for e in entries:
                if not e.is_dir(follow_symlinks=False):
                    try:
                        out[rel + e.path[len(real):]] = identity(e.path)
                    except OSError:
                        continue
        return True

    def enter(entry):
        name, up = entry.name.lower(), os.path.dirname(entry.path)
        if up in venvs or up in whole or deferred_dir(entry.path[cut:]):
            whole.add(entry.path)
        return name in ("bin", "scripts") if up in venvs else name not in (".git", ".hg", "node_modules", "__pycache__")
    complete = True
    for path, entries in _tree(root, max_dirs, enter, first=lambda e: deferred_dir(e.path[cut:], True)):
        if path is None:
            complete = False
            break
        dirs[0] -= 1
        venvs |= {path} if any(e.name == "pyvenv.cfg" for e in entries) else set()
        for e in entries:
            try:
                # a link on the way to one too (`.github -> ci/gh`: its workflows were missed, round 19f): all of
                # what it holds is listed, more than the deferred directory alone, never less
                if e.is_symlink() and e.is_dir() and (path in whole or deferred_dir(e.path[cut:], True)):
                    complete = linked_tree(e.path, e.path[cut:]) and complete
                elif (path in whole or names.match(e.name.lower())) and not e.is_dir(follow_symlinks=False):
                    out[e.path[cut:]] = identity(e.path)
            except OSError:
                continue
    return out, complete


# ---- The working-directory jail ----
#
# Checking a path and then opening it by name is a race: between the two a directory can be swapped
# for a symlink to somewhere else. So every file tool resolves its path *relative to an open
# descriptor of the working directory*, one component at a time, opening each directory with
# O_NOFOLLOW|O_DIRECTORY and following in-tree symlinks itself (a bounded number of them), and then
# operates on the descriptor it checked (os.open/os.stat/os.unlink/os.rename with dir_fd). Where the
# kernel has openat2 (Linux 5.6+), RESOLVE_BENEATH resolves the directory part in one call and the
# kernel itself refuses to leave the tree; everything it cannot do (absolute in-tree links, errors
# worth a clear message) goes through the portable walk, which is the authority.

NAME_MAX = 255  #: bytes in one path component (Linux, macOS, the BSDs)
PATH_MAX = 4096  #: bytes in a whole path
MAX_SYMLINKS = 40  #: symlinks followed in one resolution, as Linux's own limit (ELOOP beyond)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: how the walk opens a directory it passes through: never a symlink, never without O_DIRECTORY
_WALK_DIR = (getattr(os, "O_PATH", 0) or os.O_RDONLY) | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
#: how a directory is opened to be listed or walked
_LIST_DIR = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC


class JailError(ToolError):
    """A path that lands outside the working directory."""


class PathError(ToolError):
    """A path that cannot be resolved at all: a symlink loop, an over-long name."""


def _kind_of(mode):
    return {stat.S_IFREG: "file", stat.S_IFDIR: "directory", stat.S_IFLNK: "symlink", stat.S_IFIFO: "FIFO",
            stat.S_IFSOCK: "socket", stat.S_IFCHR: "device", stat.S_IFBLK: "device"}.get(stat.S_IFMT(mode),
                                                                                          "special file")


_OPENAT2 = None  #: None: not tried yet; False: the kernel (or a seccomp filter) says no; else the function
RESOLVE_NO_MAGICLINKS, RESOLVE_BENEATH = 0x02, 0x08


def _openat2_beneath(dir_fd, rel, flags):
    """openat2(dir_fd, rel, RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS) -> fd, or None where unavailable.

    Raises OSError for what the kernel refused (EXDEV: it would leave the tree or meets an absolute
    symlink; ELOOP; ENOENT; ENOTDIR); callers fall back to the component walk for those.
    """
    global _OPENAT2
    if _OPENAT2 is False:
        return None
    if _OPENAT2 is None:
        _OPENAT2 = _load_openat2()
        if _OPENAT2 is False:
            return None
    return _OPENAT2(dir_fd, rel, flags)


def _load_openat2():
    if not sys.platform.startswith("linux"):
        return False
    # openat2 is 437 in the unified table of every architecture added since 5.6 (not alpha/ia64/mips); the
    # machine as uname says it (platform.machine() is the same, after importing platform: 3 ms of a run)
    if os.uname().machine not in ("x86_64", "aarch64", "arm64", "armv7l", "armv6l", "i686", "i386", "riscv64",
                                  "ppc64le", "ppc64", "s390x", "loongarch64"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError, ImportError):  # no _ctypes (a Python built without libffi): the slower walk
        return False
    syscall.restype = ctypes.c_long
    syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)

    class OpenHow(ctypes.Structure):
        _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))

    def openat2(dir_fd, rel, flags):
        how = OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
        fd = syscall(437, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), rel)
        return fd

    try:  # probe once: "." beneath an open root always works where openat2 exists
        probe = os.open("/", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            os.close(openat2(probe, ".", _WALK_DIR & ~_O_NOFOLLOW))
        finally:
            os.close(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG, errno.EACCES):
            return False
    return openat2


def use_openat2(enabled):
    """Turn the openat2 fast path off (False) or back to auto-detection (True): tests run both ways."""
    global _OPENAT2
    _OPENAT2 = None if enabled else False


class Target:
    """A checked place in the jail: an open descriptor of its parent directory and its name there.

    `dir_fd` was reached from the working directory without following any symlink the walk did not
    check; `name` is one component ('.' for the working directory itself). `missing` lists parent
    directories that do not exist yet (`make_parents()` creates them, each checked again). Always
    close() it (or use it as a context manager).
    """

    __slots__ = ("root", "_fds", "names", "missing", "name", "followed", "passed")

    def __init__(self, root, fds, names, missing, name, followed, passed=()):
        self.root = root
        #: where the path was read through on its way to `real`: the name as it was given (lexically, in the tree)
        #: and every symlink followed, at the place it stands; a change is judged at each of them too (round 19b)
        self.passed = list(passed)
        self._fds = fds  # descriptors from the root down to the parent (None: not open, reopen on need)
        self.names = names  # components from the root to the parent, symlinks resolved
        self.missing = missing
        self.name = name
        self.followed = followed  # symlinks followed on the way

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for fd in self._fds:
            if fd is not None:
                os.close(fd)
        self._fds = []

    @property
    def dir_fd(self):
        return self._fds[-1]

    @property
    def is_root(self):
        return self.name == "." and not self.names and not self.missing

    @property
    def real(self):
        parts = self.names + self.missing + ([] if self.name == "." else [self.name])
        return os.path.join(self.root, *parts) if parts else self.root

    def lstat(self):
        """The entry itself (a symlink is not followed), or None when it does not exist."""
        if self.missing:
            return None
        try:
            return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def open_file(self, flags, mode=0o666):
        """Open the entry itself: never following a symlink, never blocking on a FIFO or device."""
        return os.open(self.name, flags | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, mode, dir_fd=self.dir_fd)

    def open_regular(self, what):
        """An fd of the regular file here, for reading; anything else is an error saying what it is."""
        if (st := self.lstat()) is None:
            raise ToolError("no such file or directory: %s" % display_path(self.real, self.root))
        if not stat.S_ISREG(st.st_mode):
            raise special_error(self, st.st_mode, what)
        fd = self.open_file(os.O_RDONLY)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the lstat and the open
            os.close(fd)
            raise special_error(self, st.st_mode, what)
        return fd

    def open_dir(self):
        """An fd of the directory here (listable), never through a symlink."""
        if self.is_root:
            return os.open(".", _LIST_DIR, dir_fd=self.dir_fd)
        return os.open(self.name, _LIST_DIR, dir_fd=self.dir_fd)

    def make_parents(self):
        """Create the missing parent directories, each opened again with O_NOFOLLOW after mkdir."""
        while self.missing:
            name = self.missing[0]
            if len(self.names) + 1 > 255:
                raise PathError("too many nested directories")
            try:
                os.mkdir(name, 0o777, dir_fd=self.dir_fd)
            except FileExistsError:
                pass
            fd = os.open(name, _WALK_DIR, dir_fd=self.dir_fd)  # a symlink planted meanwhile fails here
            self._fds.append(fd)
            self.names.append(name)
            self.missing.pop(0)


def special_error(target, mode, what):
    return ToolError("%s is a %s, not a regular file; %s" % (display_path(target.real, target.root),
                                                             _kind_of(mode), what))


def open_if_regular(name, dir_fd=None, follow=False):
    """A read-only fd of `name` (relative to dir_fd) when it is a regular file, else None (also when it is
    missing or unreadable). INFO: it is looked at before it is opened, and never opened otherwise: opening a
    FIFO releases the writer waiting on it (and takes its data), opening a device talks to its driver (a tape
    rewinds, a watchdog arms). Checked again on the descriptor, for a swap in between."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=follow).st_mode):
            return None
        fd = os.open(name, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | (0 if follow else _O_NOFOLLOW), dir_fd=dir_fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


class Jail:
    """The working directory, and every path a tool names resolved beneath it.

    `hidden` names directories inside it that no tool may read, list, copy or change: XZATOMA_HOME when it
    lies in the tree (its credentials, every project's conversations, the undo data and its key), as the
    sandbox hides it from commands behind an empty tmpfs."""

    def __init__(self, root, hidden=()):
        self.root = os.path.realpath(root)
        reals = [os.path.realpath(p) for p in hidden if p]
        #: the root itself lies in a hidden directory (`--working-dir $XZATOMA_HOME`): every path is refused, as
        #: commands find an empty tmpfs there (credentials.json and undo.key were read_file's to return)
        self.hidden_root = next((h for h in reals if _inside(fold_path(self.root), fold_path(h))), None)
        #: real paths beneath the root that resolve() refuses and walks skip
        self.hidden = tuple(h for h in reals if h != self.root and _inside(h, self.root))
        #: the same as a filesystem that folds names sees them (`.XZ` is `.xz` on macOS): compared folded
        self._hidden_folded = tuple(fold_path(h) for h in self.hidden)
        #: the same, relative to the root (walk_files compares its relative paths)
        self.hidden_rel = frozenset(fold_path(os.path.relpath(h, self.root)) for h in self.hidden)

    def hides(self, real):
        """Is this real path (or what it holds) hidden? (True for a directory that contains a hidden one.)"""
        real = fold_path(real)
        return bool(self.hidden_root) or any(_inside(real, h) or _inside(h, real) for h in self._hidden_folded)

    def __eq__(self, other):
        return isinstance(other, Jail) and other.root == self.root

    def __hash__(self):
        return hash(self.root)

    def open_root(self):
        return os.open(self.root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)

    def relative(self, path):
        """Check a path's spelling and make it relative to the root (JailError / PathError)."""
        if not isinstance(path, str):
            raise JailError("path must be a string")
        if "\x00" in path:
            raise JailError("path contains a NUL byte: %r" % path)
        if path.strip() == "":
            path = "."
        if path.startswith("~"):
            raise JailError("path outside working directory: %s (home paths are not allowed)" % path)
        shown = path
        if path == self.root or path.startswith(self.root.rstrip("/") + "/"):
            # resolved from the root's descriptor: what must fit is the part below it (tools hand back the
            # absolute paths they resolved; a deep file's was refused after the edit was made)
            path = path[len(self.root):].lstrip("/") or "."
        encoded = os.fsencode(path)
        if len(encoded) >= PATH_MAX:
            raise PathError("path too long: %d bytes (the limit is %d)" % (len(encoded), PATH_MAX - 1))
        for part in path.split("/"):
            if len(os.fsencode(part)) > NAME_MAX:
                raise PathError("file name too long: %d bytes in %s… (the limit is %d per name)" % (
                    len(os.fsencode(part)), part[:40], NAME_MAX))
        if not os.path.isabs(path):
            return path
        return self._absolute(path, shown)

    def _absolute(self, path, shown):
        """An absolute path (or absolute symlink target) as a path relative to the root."""
        root = self.root
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return path[len(root):].lstrip("/") or "."
        # spelled through another name for the root (/tmp -> /private/tmp): the shortest beginning that leads
        # into the tree is resolved, and the rest walked by the jail as written, so the links it passes are seen
        # (resolving all of it, `alias/link` deleted what the link leads to and `alias/.git/hooks/x` was
        # written through the hook's link unseen: round 19f)
        parts = path.split("/")
        for i in range(2, len(parts) + 1):
            real = os.path.realpath("/".join(parts[:i]))
            if _inside(real, root):
                return "/".join(p for p in [real[len(root):].strip("/")] + parts[i:] if p) or "."
        # a small model wrote /app.yaml for the working directory's app.yaml: named, not followed
        near = path.lstrip("/")
        hint = " (did you mean %s? paths are relative to the working directory)" % near \
            if near and ".." not in near.split("/") and os.path.lexists(os.path.join(root, near)) else ""
        raise JailError("path outside working directory: %s%s" % (shown, hint))

    def resolve(self, path, follow=True, must_exist=False):
        """A Target for `path`: its parent directory open, checked beneath the root.

        follow=True resolves a symlink in the last component too (reading and writing a file through
        an in-tree link); follow=False leaves it (delete, move, metadata of the link itself).
        """
        rel = self.relative(path)
        root_fd = self.open_root()
        try:
            target = self._resolve(root_fd, rel, path, follow)
        except BaseException:
            os.close(root_fd)
            raise
        lexical = os.path.normpath(os.path.join(self.root, rel))
        if _inside(lexical, self.root) and lexical != target.real and lexical not in target.passed:
            target.passed.insert(0, lexical)
        if self.hidden_root or self.hidden and any(_inside(fold_path(target.real), h) for h in self._hidden_folded):
            target.close()
            raise ToolError("%s is inside XZATOMA_HOME (xzatoma's credentials, conversations and undo data): "
                            "no tool reads or changes it" % path)
        if must_exist and target.lstat() is None:
            target.close()
            raise ToolError("no such file or directory: %s%s" % (path, self.suggest(path)))
        return target

    def _resolve(self, root_fd, rel, shown, follow):
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if len(parts) > 1 and ".." not in parts:
            if (fds := self._fast_parent(root_fd, parts[:-1])) is not None:
                names = fds.pop()
                return self._walk(fds, names, [parts[-1]], shown, follow)
        return self._walk([root_fd], [], parts, shown, follow)

    def _fast_parent(self, root_fd, parent_parts):
        """The parent directory through openat2 (RESOLVE_BENEATH): [root_fd, None…, fd, names] or None."""
        try:
            fd = _openat2_beneath(root_fd, "/".join(parent_parts), _WALK_DIR & ~_O_NOFOLLOW)
        except OSError:
            return None  # the walk gives the precise error (or handles the absolute in-tree link)
        if fd is None:
            return None
        try:
            where = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            where = ""
        if not (where == self.root or where.startswith(self.root.rstrip("/") + "/")):
            os.close(fd)
            return None
        names = [n for n in where[len(self.root):].split("/") if n]
        if names != parent_parts:  # a link on the way (or none to shortcut): the walk notes where each one stands
            os.close(fd)
            return None
        return [root_fd] + [None] * (len(names) - 1) + [fd] + [names]

    def _walk(self, fds, names, parts, shown, follow):
        """Resolve `parts` from the directory fds[-1] (reached through `names`), one component at a time."""
        todo = list(reversed(parts))
        links = retries = 0
        passed = []  # the symlinks followed, where they stand (Target.passed)
        missing = []  # components below a missing one: taken lexically, as realpath does
        while True:
            while todo and todo[-1] in ("", "."):
                todo.pop()
            if missing and not todo:
                return Target(self.root, fds, names, missing[:-1], missing[-1], links, passed)
            if missing:
                comp = todo.pop()
                if comp == "..":
                    missing.pop()
                elif len(os.fsencode(comp)) > NAME_MAX:
                    raise PathError("file name too long: %d bytes in %s… (the limit is %d per name)" % (
                        len(os.fsencode(comp)), comp[:40], NAME_MAX))
                else:
                    missing.append(comp)
                continue
            if not todo:  # the path names a directory we are in: step back up to name it in its parent
                if not names:
                    return Target(self.root, fds, names, [], ".", links, passed)
                name = names.pop()
                if (fd := fds.pop()) is not None:
                    os.close(fd)
                self._reopen(fds, names)
                return Target(self.root, fds, names, [], name, links, passed)
            comp = todo.pop()
            if comp == "..":
                if not names:
                    raise JailError("path outside working directory: %s" % shown)
                names.pop()
                if (fd := fds.pop()) is not None:
                    os.close(fd)
                continue
            if len(os.fsencode(comp)) > NAME_MAX:
                raise PathError("file name too long: %d bytes in %s… (the limit is %d per name)" % (
                    len(os.fsencode(comp)), comp[:40], NAME_MAX))
            last = all(p in ("", ".") for p in todo)
            dir_fd = self._reopen(fds, names)
            try:
                st = os.stat(comp, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                missing.append(comp)
                continue
            if stat.S_ISLNK(st.st_mode) and (follow or not last):
                links += 1
                if links > MAX_SYMLINKS:
                    raise PathError("too many levels of symbolic links: %s" % shown)
                passed.append(os.path.join(self.root, *names, comp))
                target = os.readlink(comp, dir_fd=dir_fd)
                if target.startswith("/"):
                    inner = self._absolute(target, shown)
                    while len(fds) > 1:
                        if (fd := fds.pop()) is not None:
                            os.close(fd)
                    del names[:]
                    todo.extend(reversed(inner.split("/")))
                else:
                    todo.extend(reversed(target.split("/")))
                continue
            if last:
                return Target(self.root, fds, names, [], comp, links, passed)
            if not stat.S_ISDIR(st.st_mode):
                raise ToolError("not a directory: %s (in %s)" % ("/".join(names + [comp]), shown))
            try:
                fd = os.open(comp, _WALK_DIR, dir_fd=dir_fd)
            except OSError:
                # swapped (for a symlink, a file, nothing) since the stat: look again, a bounded number of times
                retries += 1
                if retries > 8:
                    raise PathError("%s keeps changing while it is resolved: %s" % (comp, shown))
                todo.append(comp)
                continue
            fds.append(fd)
            names.append(comp)

    def _reopen(self, fds, names):
        """The fd of the current directory, reopening ancestors left unopened by the openat2 shortcut."""
        if fds[-1] is not None:
            return fds[-1]
        base = max(i for i, fd in enumerate(fds) if fd is not None)
        for i in range(base + 1, len(fds)):
            fds[i] = os.open(names[i - 1], _WALK_DIR, dir_fd=fds[i - 1])
        return fds[-1]

    def suggest(self, path):
        """A near miss for a missing path: ' (did you mean src/app.py?)'."""
        parent = os.path.dirname(path) or "."
        try:
            with self.resolve(parent) as target:
                fd = target.open_dir()
                try:
                    names = os.listdir(fd)
                finally:
                    os.close(fd)
        except (OSError, ToolError):
            return ""
        if len(names) > 5000:  # get_close_matches is ~50 µs a name: a hint is not worth seconds
            return ""
        import difflib
        base = os.path.basename(path)
        if base in names:  # it is there, and leads nowhere: a link to a missing file (never "did you mean" itself)
            return " (%s is a link to something missing)" % path
        if close := difflib.get_close_matches(base, names, n=1, cutoff=0.6):
            return " (did you mean %s?)" % os.path.normpath(os.path.join(parent, close[0]))
        found = self.find_name(base)
        return " (did you mean %s?)" % found if found and os.path.normpath(found) != os.path.normpath(path) else ""

    def find_name(self, name, most=3000):
        """The first entry under the root named `name` whatever its case, else the first file of that name
        with another extension (a small model asked where class Tokenizer is tried Tokenizer.py and
        Tokenizer.java at the top; it is src/tokenizer.py). A bounded walk by descriptors (walk_at), a
        directory's entries before what lies below them; hidden entries are passed over."""
        want, alike = name.lower(), None
        stem = os.path.splitext(want)[0]
        listing = lambda fd, prefix: sorted(n for n in os.listdir(fd) if not n.startswith(".") and  # noqa: E731
                                            os.path.join(self.root, prefix + n) not in self.hidden)
        try:
            with self.resolve(".") as start:
                for seen, (rel, _, entry, info, _) in enumerate(walk_at(start.dir_fd, start.name, listing=listing,
                                                                        lenient=True, files_first=True)):
                    if seen > most:
                        break
                    if rel and entry.lower() == want:
                        return rel
                    if rel and alike is None and os.path.splitext(entry.lower())[0] == stem and \
                            stat.S_ISREG(info.st_mode):
                        alike = rel
        except (OSError, ToolError):
            pass
        return alike


def resolve_path(path, root, must_exist=False, follow=True):
    """Resolve `path` against the jail `root`; refuse anything that lands outside.

    Symlinks are resolved (also dangling and chained ones, a bounded number: loops are errors);
    names are taken literally. Returns the absolute real path. Tools use `Jail.resolve`, which
    keeps the checked directory open; this is for showing and judging paths.
    """
    with Jail(root).resolve(path, follow=follow, must_exist=must_exist) as target:
        return target.real


def path_verdict(path, conf):
    """('inside'|'outside'|'error', reason) for `xzatoma policy path`, as the file tools would decide: the
    reason names a protected path a change would touch (Confinement.target_reason); XZATOMA_HOME is refused as
    the tools refuse it: an error. `conf` may be a working directory (a Confinement of it is made)."""
    conf = conf if isinstance(conf, Confinement) else Confinement(conf)
    root = conf.root
    try:
        with conf.jail.resolve(path) as target:
            real = target.real
            what = conf.target_reason(target)
    except JailError as exc:
        return "outside", str(exc)
    except (ToolError, OSError) as exc:
        return "error", str(exc) if isinstance(exc, ToolError) else "%s: %s" % (exc.strerror or exc, path)
    note = "; protected (%s): changes need a person's yes" % what if what else ""
    return "inside", "resolves to %s%s" % (display_path(real, root), note)


def _inside(real, root):
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _named(path, target, ctx):
    """`path` as a question names it, with the file it leads to when that is another (a link followed): `edit
    notes.md` changed deploy/prod.sh, which the question never named (round 19c)."""
    real = display_path(target.real, ctx.root)
    return path if os.path.normpath(path) == real else "%s (that is %s)" % (path, real)


def display_path(real, root):
    """Paths shown to people and the model are relative to the working directory."""
    if real == root:
        return "."
    rel = os.path.relpath(real, root)
    return real if rel == ".." or rel.startswith("../") else rel  # `..name` is a name inside


def read_fd(fd, limit=None, size=None):
    """Everything from fd (at most `limit` bytes); reads until EOF, so a file that grows is not cut short.

    `size` (from fstat) sizes the first read: a 10 KB file costs one read of 10 KB, not a 1 MB buffer.
    """
    chunks, total = [], 0
    first = None if size is None else size + 1
    while limit is None or total < limit:
        want = first or (1 << 20)
        first = None
        chunk = os.read(fd, want if limit is None else min(want, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


#: directories one walk_at keeps open at once; deeper, it climbs back by `..`
_WALK_OPEN = 32


class _Level:
    """A directory walk_at is in: its fd (None while closed for depth), where it is, what is left of it."""

    __slots__ = ("fd", "prefix", "name", "info", "items", "later", "descending", "ident")

    def __init__(self, fd, prefix, name, info):
        st = os.fstat(fd)
        self.fd, self.prefix, self.name, self.info, self.items = fd, prefix, name, info, iter(())
        self.later, self.descending, self.ident = [], False, (st.st_dev, st.st_ino)


def walk_at(dir_fd, name, check=None, listing=None, leave=False, lenient=False, files_first=False):
    """The one walk of a tree by descriptors (listing, searching, hashing, copying, removing): yield (rel, fd,
    name, info, left) for `name` in dir_fd (rel "", info its lstat) and everything below it, never following a
    symlink. `fd` holds `name` and is valid until the next item is asked for.

    Each directory is opened relative to its parent with O_NOFOLLOW|O_DIRECTORY: one swapped for a link
    mid-walk is never entered. At most _WALK_OPEN are open at once; past that depth the way back up is `..`,
    taken only while it is still the directory the walk came down from (device and inode; else OSError
    ESTALE): a tree thousands of levels deep (a command builds one in a second) costs neither the recursion
    limit nor the open-file limit. `listing(fd, prefix)` gives a directory's entries in walk order, each a
    name (lstat()ed as it is reached; one gone by then is passed over) or (name, info, descend); by default
    its sorted names. files_first: all of a directory's entries come before anything below them (else each
    subdirectory's tree follows it); leave: a directory comes again (left=True, `fd` its parent) once all
    below it has; lenient: a subdirectory that cannot be opened is passed over, not raised. `check()` runs
    before each entry (the deadline)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    yield "", dir_fd, name, st, False
    if not stat.S_ISDIR(st.st_mode):
        return
    listing = listing or (lambda fd, prefix: sorted(os.listdir(fd)))
    levels, child, info = [], name, st
    try:
        while True:
            if child is not None:  # go down into `child` of the current directory
                parent = levels[-1].fd if levels else dir_fd
                try:
                    sub = os.open(child, _LIST_DIR, dir_fd=parent)
                except OSError:
                    if not lenient or not levels:
                        raise
                    sub = None  # swapped for a symlink or removed since the listing: not entered
                if sub is not None:
                    levels.append(_Level(sub, levels[-1].prefix + child + "/" if levels else "", child, info))
                    if len(levels) > _WALK_OPEN and levels[-_WALK_OPEN - 1].fd is not None:
                        os.close(levels[-_WALK_OPEN - 1].fd)
                        levels[-_WALK_OPEN - 1].fd = None
                    levels[-1].items = iter(listing(sub, levels[-1].prefix))
                child = None
            if not levels:
                return
            level = levels[-1]
            item = next(level.items, None)
            if item is None and level.later:  # files_first: below the entries now, in their order
                level.items, level.later, level.descending = iter(level.later), [], True
                continue
            if item is None:  # done here: back up to the parent (reopened by `..` where closed for depth)
                levels.pop()
                try:
                    if levels and levels[-1].fd is None:
                        levels[-1].fd = os.open("..", _LIST_DIR, dir_fd=level.fd)
                        up = os.fstat(levels[-1].fd)
                        if (up.st_dev, up.st_ino) != levels[-1].ident:
                            raise OSError(errno.ESTALE, "moved while it was walked", levels[-1].prefix or name)
                finally:
                    os.close(level.fd)
                if leave:
                    yield level.prefix[:-1], levels[-1].fd if levels else dir_fd, level.name, level.info, True
                continue
            if level.descending:
                child, info = item
                continue
            if check is not None:
                check()
            if isinstance(item, str):
                try:
                    info = os.stat(item, dir_fd=level.fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                item = (item, info, stat.S_ISDIR(info.st_mode))
            yield level.prefix + item[0], level.fd, item[0], item[1], False
            if item[2] and files_first:
                level.later.append(item[:2])
            elif item[2]:
                child, info = item[:2]
    finally:
        for level in levels:
            if level.fd is not None:
                os.close(level.fd)


# ---- Globs: matched in linear time ----

#: a glob's limits (a model or a repository's .gitignore writes it): longer patterns and more {a,b}
#: alternatives are refused, so matching stays bounded whatever the pattern
MAX_GLOB_LENGTH = 4096
MAX_GLOB_ALTERNATIVES = 256


def _glob_alternatives(pattern, limit=MAX_GLOB_ALTERNATIVES):
    """'src/**/*.{rs,toml}' -> ['src/**/*.rs', 'src/**/*.toml'] (no {1..3}: not bash_brace_expand); a ToolError
    past `limit` alternatives ({a,b} thirty times is 2**30 patterns: refused, never generated)."""
    out, todo = [], [pattern]
    while todo:
        item = todo.pop()
        if not (m := re.search(r"\{([^{}]*)\}", item)):
            out.append(item)
        else:
            todo.extend(item[: m.start()] + alt + item[m.end():] for alt in reversed(m.group(1).split(",")))
        if len(out) + len(todo) > limit:
            raise ToolError("the glob %s has more than %d {…} alternatives; narrow it" % (pattern[:80], limit))
    return out


_GLOB_CACHE = {}


def _glob_tokens(alt):
    """A glob's tokens: ('**/',) any text ending in / or nothing; ('**',) any text; ('*',) and ('?',) within
    one path segment; (regex, ) one character of a [class]; a literal character."""
    i, tokens = 0, []
    while i < len(alt):
        c = alt[i]
        if alt.startswith("**/", i):
            tokens.append("**/")
            i += 3
        elif alt.startswith("**", i):
            tokens.append("**")
            i += 2
        elif c in "*?":
            tokens.append(c)
            i += 1
        elif c == "[" and _glob_class(alt, i) is not None:
            j = alt.find("]", i + 1)
            tokens.append(_glob_class(alt, i))
            i = j + 1
        else:
            tokens.append(("lit", c))
            i += 1
    return tokens


def _glob_class(alt, i):
    """The [class] at alt[i] as a one-character regex, or None ('[' is then a literal character)."""
    j = alt.find("]", i + 1)
    if j == -1:
        return None
    try:
        return re.compile("[" + alt[i + 1: j].replace("!", "^", 1) + "]")
    except re.error:
        return None


def _glob_regex_text(tokens):
    out = []
    for t in tokens:
        if t == "**/":
            out.append("(?:.*/)?")
        elif t == "**":
            out.append(".*")
        elif t == "*":
            out.append("[^/]*")
        elif t == "?":
            out.append("[^/]")
        elif isinstance(t, tuple):
            out.append(re.escape(t[1]))
        else:
            out.append(t.pattern)
    return "".join(out)


def _glob_backtracks(tokens):
    """True unless a backtracking regex matches this glob in linear time. Safe: at most one '**' (as '**/'
    when a floating '*' comes after it), no floating '*' before it, and at most one floating '*' per
    segment ('*' followed by '/' or the end is pinned: it has one way to match). Anything else, such as
    `*a*a*a*b` against a long name of a's or `**/a/**/a/**/b`, is polynomial of degree the number of
    stars in a backtracking engine."""
    free, floating_seen, floating_here = None, False, False
    for k, t in enumerate(tokens):
        if t in ("**/", "**"):
            if free is not None or floating_seen:
                return True
            free = t
        elif t == "*":
            if k + 1 < len(tokens) and tokens[k + 1] != ("lit", "/"):  # floating
                if free == "**" or floating_here:
                    return True
                floating_seen = floating_here = True
        elif t == ("lit", "/"):
            floating_here = False
    return False


class _GlobAutomaton:
    """Matches a glob without backtracking: the states of its automaton are advanced together, one
    character at a time (Thompson's construction), so the time is linear in the path for any pattern.
    Sets of states are memoised as they are met (a lazy DFA), up to a bound."""

    MAX_MEMO = 20000

    def __init__(self, alternatives):
        self.tokens = []  # the alternatives laid out one after another; each ends in an accepting state
        self.starts, self.accept = [], set()
        for tokens in alternatives:
            self.starts.append(len(self.tokens))
            self.tokens.extend(tokens)
            self.accept.add(len(self.tokens))
            self.tokens.append(None)
        self.start = self._closure(self.starts)
        self.memo = {}

    def _closure(self, states):
        out, todo = set(), list(states)
        while todo:
            s = todo.pop()
            if s in out:
                continue
            out.add(s)
            t = self.tokens[s] if s >= 0 else None
            if t in ("**/", "**", "*"):  # may match nothing
                todo.append(s + 1)
        return frozenset(out)

    def _step(self, states, ch):
        nxt = []
        for s in states:
            if s < 0:  # inside '**/' after at least one character: -(index + 1)
                if ch != "\n":
                    nxt.append(s)
                if ch == "/":
                    nxt.append(-s)
                continue
            if (t := self.tokens[s]) is None:
                continue
            if t == "**/":
                if ch != "\n":
                    nxt.append(-s - 1)
                if ch == "/":
                    nxt.append(s + 1)
            elif t == "**":
                if ch != "\n":  # as the regex's '.'
                    nxt.append(s)
            elif t == "*":
                if ch != "/":
                    nxt.append(s)
            elif t == "?":
                if ch != "/":
                    nxt.append(s + 1)
            elif isinstance(t, tuple):
                if ch == t[1]:
                    nxt.append(s + 1)
            elif t.match(ch):
                nxt.append(s + 1)
        return self._closure(nxt)

    def match(self, text):
        states, memo = self.start, self.memo
        for ch in text:
            key = (states, ch)
            if (new := memo.get(key)) is None:
                new = self._step(states, ch)
                if len(memo) < self.MAX_MEMO:
                    memo[key] = new
            if not (states := new):
                return False
        return not self.accept.isdisjoint(states)


def glob_regex(pattern):
    """Compile a glob with ** (any depth), * and ? (one segment) and {a,b} braces into an object whose
    .match(path) is true when the glob matches the whole path.

    Globs come from models and from .gitignore files in the tree, so matching must stay linear: a glob a
    backtracking regex handles in linear time is one (the fast, common case: '*.py', '**/*.md',
    'src/**/*.rs'); any other runs through _GlobAutomaton. Too long or too many alternatives: ToolError.
    """
    if (cached := _GLOB_CACHE.get(pattern)) is not None:
        return cached
    if len(pattern) > MAX_GLOB_LENGTH:
        raise ToolError("the glob is %d characters long, over the %d a glob may have" % (len(pattern), MAX_GLOB_LENGTH))
    expanded = _glob_alternatives(pattern)
    if sum(map(len, expanded)) > 4 * MAX_GLOB_LENGTH:
        raise ToolError("the glob %s expands to more than %d characters; narrow it" % (pattern[:80], 4 * MAX_GLOB_LENGTH))
    alternatives = [_glob_tokens(alt) for alt in expanded]
    if any(_glob_backtracks(tokens) for tokens in alternatives):
        compiled = _GlobAutomaton(alternatives)
    else:
        compiled = re.compile("(?:%s)\\Z" % "|".join(_glob_regex_text(tokens) for tokens in alternatives))
    if len(_GLOB_CACHE) > 1024:
        _GLOB_CACHE.clear()
    _GLOB_CACHE[pattern] = compiled
    return compiled


def glob_match(pattern, relpath):
    """Match a relative path; a pattern without '/' matches the basename anywhere."""
    if "/" not in pattern:
        return bool(glob_regex(pattern).match(relpath.rsplit("/", 1)[-1]))
    return bool(glob_regex(pattern).match(relpath))


# ---- Terminal: parsing shell syntax ----
#
# A small recursive-descent parser for the POSIX shell language (plus the bash
# forms agents write): lists, pipelines, subshells, brace groups, function
# definitions, case, coproc, quoting (ANSI-C $'…' included), $(…) and `…`
# substitutions, <(…) and >(…) process substitution, ${…} and $((…)) with
# whatever they nest, redirections and here-documents (an unquoted delimiter makes
# the body's substitutions live, so they are parsed too). It never runs anything:
# it turns a command line into simple commands that the policy judges one by one.
# What it cannot parse is a ShellSyntaxError, and the policy fails closed on it.

class ShellSyntaxError(ValueError):
    pass


class Word:
    """One shell word after quote removal; expansions are kept as their source text."""

    __slots__ = ("text", "dynamic", "subs", "glob", "tilde", "quoted", "variables", "parts", "start", "end")

    def __init__(self):
        self.text = ""
        self.dynamic = False  # contains $VAR, ${…}, $(…), `…` or $((…))
        self.subs = []  # Scripts of command and process substitutions inside the word
        self.glob = False  # unquoted * ? [
        self.tilde = False  # unquoted leading ~
        self.quoted = False
        self.variables = []
        self.parts = []  # (text, kind): "lit" unquoted character, "q" quoted text, "x"/"qx" an expansion's
        # source unquoted/inside double quotes: what brace expansion, field splitting and globbing act on
        self.start = self.end = None  # where the word is in the command line parse_shell was given (or None)

    def __repr__(self):
        return "Word(%r)" % self.text


def make_word(text, like=None):
    """A static word (the result of an expansion the policy worked out)."""
    w = Word()
    w.text = text
    w.parts = [(text, "q")]
    if like is not None:
        w.quoted = like.quoted
    return w


class Simple:
    """A simple command: assignments, words and redirections."""

    def __init__(self):
        self.assigns = []
        self.words = []
        self.redirects = []  # [operator, target Word or None, here-document text or None, live body Word or None]
        self.background = False


class Group:
    def __init__(self, kind, script):
        self.kind = kind  # "subshell" | "brace" | "case"
        self.script = script
        self.words = []  # words the group itself expands (a case subject and its patterns)
        self.redirects = []
        self.background = False


class FunctionDef:
    def __init__(self, name, body):
        self.name = name
        self.body = body
        self.redirects = []
        self.background = False


class Pipeline:
    def __init__(self):
        self.commands = []


class Script:
    def __init__(self):
        self.pipelines = []
        self.stdin_data = False  # a >(…) process substitution: its standard input is data from the command


_RESERVED_PREFIX = {"if", "then", "elif", "else", "do", "while", "until", "!", "time"}
_RESERVED_ALONE = {"fi", "done", "esac", "}", "{"}
_ANSI_C = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
           "\\": "\\", "'": "'", '"': '"', "?": "?"}


def ansi_c_decode(body):
    """The text of a bash $'…' string."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 >= len(body):
            out.append(c)
            i += 1
            continue
        n = body[i + 1]
        if n in _ANSI_C:
            out.append(_ANSI_C[n])
            i += 2
        elif n in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            out.append(chr(int(m.group(0), 8) & 0xFF))
            i += 1 + len(m.group(0))
        elif n in "xuU":
            if m := re.match(r"[0-9A-Fa-f]{1,%d}" % {"x": 2, "u": 4, "U": 8}[n], body[i + 2:]):
                code = int(m.group(0), 16)
                out.append(chr(code) if code < 0x110000 else "\ufffd")
                i += 2 + len(m.group(0))
            else:
                out.append("\\" + n)
                i += 2
        elif n == "c" and i + 2 < len(body):
            out.append(chr(ord(body[i + 2]) & 0x1F))
            i += 3
        else:
            out.append("\\" + n)
            i += 2
    return "".join(out)


class ShellParser:
    def __init__(self, text, depth=0, top=None):
        self.s = text
        self.i = 0
        self.depth = depth
        self.top = top  # the command line itself: a word read from it knows where it begins (Word.start)
        self.pending_heredocs = []
        if depth > 20:
            raise ShellSyntaxError("commands are nested too deeply")

    # -- low level --
    def peek(self, n=0):
        j = self.i + n
        return self.s[j] if j < len(self.s) else ""

    def startswith(self, token):
        return self.s.startswith(token, self.i)

    def skip_blanks(self):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c == "#" and (self.i == 0 or self.s[self.i - 1] in " \t\n;&|()"):
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def skip_newlines(self):
        while True:
            self.skip_blanks()
            if self.peek() != "\n":
                return
            self.read_heredocs()
            self.i += 1

    # -- grammar --
    def parse(self):
        script = self.parse_script(None)
        if self.i < len(self.s):
            raise ShellSyntaxError("unexpected %r at position %d" % (self.s[self.i], self.i))
        if self.pending_heredocs:
            raise ShellSyntaxError("a here-document has no body")
        return script

    def at_closer(self, closer):
        if closer == ")":
            return self.peek() == ")"
        if closer == "}":
            return self.at_word("}")
        if closer == "esac":
            return self.startswith(";;") or self.startswith(";&") or self.at_word("esac")
        return False

    def parse_script(self, closer):
        """Pipelines separated by ; & && || and newlines, up to `closer` (')', '}', 'esac') or the end."""
        script = Script()
        while True:
            self.skip_blanks()
            while self.peek() in (";", "\n") and not (self.startswith(";;") or self.startswith(";&")):
                if self.peek() == "\n":
                    self.read_heredocs()
                self.i += 1
                self.skip_blanks()
            if self.i >= len(self.s) or self.at_closer(closer):
                break
            if self.startswith(";;") or self.startswith(";&"):
                raise ShellSyntaxError("unexpected %s at position %d" % (self.s[self.i:self.i + 2], self.i))
            pipeline = self.parse_pipeline(closer)
            if pipeline.commands:
                script.pipelines.append(pipeline)
            self.skip_blanks()
            if self.startswith("&&") or self.startswith("||"):
                self.i += 2
                continue
            if self.peek() == "&" and not self.startswith("&>"):
                self.i += 1
                if pipeline.commands:
                    pipeline.commands[-1].background = True
                continue
            if self.peek() in (";", "\n") and not (self.startswith(";;") or self.startswith(";&")):
                continue
            if self.i >= len(self.s) or self.at_closer(closer):
                break
            raise ShellSyntaxError("unexpected %r at position %d" % (self.peek(), self.i))
        return script

    def at_word(self, word):
        end = self.i + len(word)
        return self.s.startswith(word, self.i) and (end >= len(self.s) or self.s[end] in " \t\n;&|()<>")

    def parse_pipeline(self, closer):
        pipeline = Pipeline()
        while True:
            self.skip_blanks()
            if self.peek() == "!" and self.peek(1) in " \t":
                self.i += 1
                continue
            if (command := self.parse_command(closer)) is not None:
                pipeline.commands.append(command)
            self.skip_blanks()
            if self.startswith("||"):
                break
            if self.startswith("|&") or self.peek() == "|":
                self.i += 2 if self.startswith("|&") else 1
                self.skip_newlines()
                continue
            break
        return pipeline

    def arithmetic(self, start):
        """From just inside '((' to past the closing '))'; the expression as a dynamic word with its subs."""
        word = Word()
        depth = 0
        while True:
            if self.i >= len(self.s):
                raise ShellSyntaxError("unterminated (( ))")
            c = self.s[self.i]
            if c == "(":
                depth += 1
                self.i += 1
            elif c == ")":
                if depth == 0:
                    if self.peek(1) != ")":
                        raise ShellSyntaxError("unterminated (( ))")
                    self.i += 2
                    break
                depth -= 1
                self.i += 1
            elif c == "$":
                self.read_dollar(word, [])
            elif c == "`":
                self.read_backtick(word, [])
            elif c == "\\":
                self.i += 2
            else:
                self.i += 1
        word.text = self.s[start:self.i]
        word.parts = [(word.text, "x")]
        word.dynamic = True
        word.variables.append("((arithmetic))")
        return word

    def parse_command(self, closer):
        self.skip_blanks()
        if self.startswith("(("):  # arithmetic command
            start = self.i
            self.i += 2
            simple = Simple()
            simple.words.append(self.arithmetic(start))
            self.parse_redirects(simple)
            return simple
        if self.peek() == "(":
            self.i += 1
            group = Group("subshell", self.parse_script(")"))
            if self.peek() != ")":
                raise ShellSyntaxError("missing ) for a subshell")
            self.i += 1
            self.parse_redirects(group)
            return group
        if self.at_word("{"):
            self.i += 1
            group = Group("brace", self.parse_script("}"))
            self.skip_blanks()
            if not self.at_word("}"):
                raise ShellSyntaxError("missing } for a { group")
            self.i += 1
            self.parse_redirects(group)
            return group
        if self.at_word("case"):
            self.i += 4
            group = self.parse_case()
            self.parse_redirects(group)
            return group
        if self.at_word("function"):  # function NAME [()] BODY
            self.i += 8
            self.skip_blanks()
            name = self.read_word()
            self.skip_blanks()
            if m := re.match(r"\(\s*\)", self.s[self.i:]):
                self.i += m.end()
            self.skip_newlines()
            return FunctionDef(name.text, self.parse_command(closer))
        if self.at_word("coproc"):  # coproc [NAME] COMMAND: the command runs in the background
            self.i += 6
            self.skip_blanks()
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*[ \t]+(?=[{(])", self.s[self.i:])
            if m:
                self.i += m.end()
            if (command := self.parse_command(closer)) is not None:
                command.background = True
            return command
        simple = Simple()
        while True:
            self.skip_blanks()
            c = self.peek()
            if not c or c in ";\n" or (c == "&" and not self.startswith("&>")) or c == "|" or \
                    (c == ")" and closer is not None):
                break
            if c == ")":
                raise ShellSyntaxError("unexpected ) at position %d" % self.i)
            if closer == "}" and not simple.words and self.at_word("}"):
                break
            if self.try_redirect(simple):
                continue
            if c == "(":
                if len(simple.words) == 1 and re.match(r"\(\s*\)", self.s[self.i:]):
                    self.i += re.match(r"\(\s*\)", self.s[self.i:]).end()  # name () body: a function
                    self.skip_newlines()
                    body = self.parse_command(closer)
                    return FunctionDef(simple.words[0].text, body)
                raise ShellSyntaxError("unexpected ( at position %d" % self.i)
            word = self.read_word()
            if not simple.words and not simple.assigns and not simple.redirects and not word.quoted and \
                    word.text in _RESERVED_PREFIX:
                self.skip_blanks()
                if word.text == "time" and self.at_word("-p"):  # time -p COMMAND
                    self.i += 2
                return self.parse_command(closer)  # if (…), while { …; }, time (…), ! cmd: whatever follows
            if not simple.words and not simple.assigns and not word.quoted and word.text == "for" and \
                    (self.skip_blanks() or self.startswith("((")):  # for ((i=0; i<3; i++))
                start = self.i
                self.i += 2
                simple.words.extend([word, self.arithmetic(start)])
                continue
            if not simple.words and not simple.assigns and not word.quoted and word.text == "[[":
                simple.words.append(word)
                self.read_test(simple)
                continue
            if not simple.words and _is_assignment(word):
                simple.assigns.append(word)
                continue
            simple.words.append(word)
        if len(simple.words) == 1 and simple.words[0].text in _RESERVED_ALONE and not simple.words[0].quoted \
                and not simple.redirects:
            simple.words = []
        if not simple.words and not simple.assigns and not simple.redirects:
            return None
        return simple

    def read_test(self, simple):
        """The words of [[ … ]] up to ]]: && || ( ) < > ! are its operators here, and the operand of =~ is
        a regular expression read as one word."""
        while True:
            self.skip_blanks()
            if self.i >= len(self.s):
                raise ShellSyntaxError("[[ without ]]")
            if self.at_word("]]"):
                self.i += 2
                simple.words.append(make_word("]]"))
                return
            if self.peek() == "\n":
                self.i += 1
                continue
            for op in ("&&", "||", "(", ")", "<", ">", "!"):
                if self.startswith(op):
                    self.i += len(op)
                    simple.words.append(make_word(op))
                    break
            else:
                word = self.read_word()
                simple.words.append(word)
                if word.text == "=~" and not word.quoted:
                    self.skip_blanks()
                    start, depth = self.i, 0
                    while self.i < len(self.s) and (depth or self.s[self.i] not in " \t\n"):
                        c = self.s[self.i]
                        if c == "\\":
                            self.i += 1
                        elif c == "(":
                            depth += 1
                        elif c == ")":
                            depth -= 1
                        elif c == "`" or (c == "$" and re.match(r"[({A-Za-z0-9_@*#?!$-]", self.peek(1) or " ")):
                            raise ShellSyntaxError("an expansion inside a [[ =~ ]] pattern")
                        self.i += 1
                    simple.words.append(make_word(self.s[start:self.i]))
                elif not word.text and not word.quoted:
                    raise ShellSyntaxError("unexpected %r inside [[ ]]" % self.peek())

    def parse_case(self):
        """`case WORD in PATTERN) LIST ;; … esac`: the arms' lists are judged like any other commands."""
        group = Group("case", Script())
        self.skip_blanks()
        group.words.append(self.read_word())
        self.skip_newlines()
        if not self.at_word("in"):
            raise ShellSyntaxError("case without in")
        self.i += 2
        while True:
            self.skip_newlines()
            if self.at_word("esac"):
                self.i += 4
                return group
            if self.i >= len(self.s):
                raise ShellSyntaxError("case without esac")
            if self.peek() == "(":
                self.i += 1
            while True:
                self.skip_blanks()
                group.words.append(self.read_word())
                self.skip_blanks()
                if self.peek() == "|":
                    self.i += 1
                    continue
                if self.peek() == ")":
                    self.i += 1
                    break
                raise ShellSyntaxError("bad case pattern at position %d" % self.i)
            body = self.parse_script("esac")
            group.script.pipelines.extend(body.pipelines)
            for token in (";;&", ";;", ";&"):
                if self.startswith(token):
                    self.i += len(token)
                    break

    def parse_redirects(self, node):
        while True:
            self.skip_blanks()
            holder = Simple()
            if not self.try_redirect(holder):
                break
            node.redirects.extend(holder.redirects)

    _REDIRECT = LazyRegex(r"(\d*|\{[A-Za-z_][A-Za-z0-9_]*\})(&>>|&>|>>|>\||>&|<<<|<<-|<<|<&|<>|>|<)")

    def try_redirect(self, simple):
        if self.peek() in "<>" and self.peek(1) == "(":
            return False  # process substitution: a word
        if not (m := self._REDIRECT.match(self.s, self.i)):
            return False
        op = m.group(2)
        self.i = m.end()
        self.skip_blanks()
        if op in ("<<", "<<-"):
            delim = self.read_word()
            entry = [op, delim, None, None]
            simple.redirects.append(entry)
            self.pending_heredocs.append((entry, delim, op == "<<-"))
            return True
        if self.i >= len(self.s) or self.peek() in ";&|\n)":
            raise ShellSyntaxError("redirection %s has no target" % op)
        target = self.read_word()
        simple.redirects.append([op, target, None, None])
        return True

    def read_heredocs(self):
        """At a newline: consume the bodies of pending here-documents. With an unquoted delimiter the
        body is expanded like a double-quoted string, so its substitutions run: parse them."""
        pending, self.pending_heredocs = self.pending_heredocs, []
        for entry, delim_word, strip in pending:
            delim = delim_word.text
            start = self.i + 1
            lines, pos, found = [], start, False
            while pos <= len(self.s):
                end = self.s.find("\n", pos)
                line = self.s[pos:end if end != -1 else len(self.s)]
                if (line.lstrip("\t") if strip else line) == delim:
                    self.i = (end if end != -1 else len(self.s)) - 1
                    found = True
                    break
                lines.append(line)
                if end == -1:
                    break
                pos = end + 1
            if not found:
                self.i = len(self.s) - 1  # bash reads to the end of input (and warns): so do we
            body = "\n".join(lines)
            entry[2] = body
            if not delim_word.quoted and not delim_word.dynamic:
                entry[3] = ShellParser(body, self.depth + 1).expansion_text()
            elif delim_word.dynamic:
                raise ShellSyntaxError("a here-document delimiter with an expansion")
            self.i += 1

    def expansion_text(self):
        """The whole text as a here-document body (or other double-quote-like context): a Word whose
        subs are the substitutions that run."""
        word = Word()
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                self.i += 2
            elif c == "$":
                self.read_dollar(word, [])
            elif c == "`":
                self.read_backtick(word, [])
            else:
                self.i += 1
        word.text = self.s
        word.parts = [(self.s, "q")]
        return word

    def read_word(self):
        word = Word()
        buf, mask = [], []
        start = self.i
        if self.s is self.top:
            word.start = start

        def add(text, kind="q"):
            buf.append(text)
            mask.append(kind)
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\n;&|)" or (c in "<>" and self.peek(1) != "("):
                break
            if c == "(":
                if buf and re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=$", "".join(buf)):
                    self.read_array(word, add)  # name=(a b c)
                    continue
                if buf:
                    break
                raise ShellSyntaxError("unexpected ( at position %d" % self.i)
            if c == "\\":
                if self.peek(1) == "\n":
                    self.i += 2
                    continue
                add(self.peek(1))
                word.quoted = True
                self.i += 2
            elif c == "'":
                end = self.s.find("'", self.i + 1)
                if end == -1:
                    raise ShellSyntaxError("unterminated single quote")
                add(self.s[self.i + 1:end])
                word.quoted = True
                self.i = end + 1
            elif c == '"':
                self.i += 1
                word.quoted = True
                self.read_double_quoted(word, buf, mask)
            elif c == "$" and self.peek(1) == "'":  # ANSI-C quoting: $'\x72m' is rm
                j = self.i + 2
                while j < len(self.s) and self.s[j] != "'":
                    j += 2 if self.s[j] == "\\" else 1
                if j >= len(self.s):
                    raise ShellSyntaxError("unterminated $' quote")
                add(ansi_c_decode(self.s[self.i + 2:j]))
                word.quoted = True
                self.i = j + 1
            elif c == "$" and self.peek(1) == '"':  # $"…" (locale translation) is a double-quoted string
                self.i += 2
                word.quoted = True
                self.read_double_quoted(word, buf, mask)
            elif c == "$":
                self.read_dollar(word, buf, mask)
            elif c == "`":
                self.read_backtick(word, buf, mask)
            elif c in "<>" and self.peek(1) == "(":
                self.i += 2
                sub = self.parse_script(")")
                if self.peek() != ")":
                    raise ShellSyntaxError("missing ) for a process substitution")
                self.i += 1
                sub.stdin_data = c == ">"
                word.subs.append(sub)
                word.dynamic = True
                add("%s(…)" % c, "x")
            else:
                if c in "*?[":
                    word.glob = True
                if c == "~" and self.i == start:
                    word.tilde = True
                add(c, "lit")
                self.i += 1
        word.text = "".join(buf)
        word.parts = list(zip(buf, mask))
        if word.start is not None:
            word.end = self.i
        return word

    def read_array(self, word, add):
        self.i += 1
        add("(")
        while True:
            self.skip_newlines()
            if self.i >= len(self.s):
                raise ShellSyntaxError("unterminated array")
            if self.peek() == ")":
                self.i += 1
                add(")")
                return
            inner = self.read_word()
            if not inner.text and self.peek() not in ")":
                raise ShellSyntaxError("unexpected %r in an array" % self.peek())
            word.subs.extend(inner.subs)
            word.variables.extend(inner.variables)
            word.dynamic = word.dynamic or inner.dynamic
            add(inner.text + " ")

    def read_double_quoted(self, word, buf, mask=None):
        mask = mask if mask is not None else []
        while True:
            if self.i >= len(self.s):
                raise ShellSyntaxError("unterminated double quote")
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\" and self.peek(1) in '$`"\\\n':
                if self.peek(1) != "\n":
                    buf.append(self.peek(1))
                    mask.append("q")
                self.i += 2
            elif c == "$":
                self.read_dollar(word, buf, mask, "qx")
            elif c == "`":
                self.read_backtick(word, buf, mask, "qx")
            else:
                buf.append(c)
                mask.append("q")
                self.i += 1

    def read_dollar(self, word, buf, mask=None, kind="x"):
        mask = mask if mask is not None else []
        start = self.i
        if self.startswith("$(("):
            self.i += 3
            inner = self.arithmetic(start)
            word.subs.extend(inner.subs)
            word.variables.append("((arithmetic))")
            word.dynamic = True
        elif self.startswith("$("):
            self.i += 2
            sub = ShellParser(self.s, self.depth + 1, self.top)
            sub.i = self.i
            script = sub.parse_script(")")
            if sub.peek() != ")":
                raise ShellSyntaxError("missing ) for $(")
            self.i = sub.i + 1
            word.subs.append(script)
            word.dynamic = True
        elif self.startswith("${"):
            self.i += 2
            inner_start = self.i
            self.braced(word)
            inner = self.s[inner_start:self.i]
            self.i += 1
            name = re.match(r"[#!]?([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])", inner)
            simple = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])$", inner)
            word.variables.append(name.group(1) if simple else ("${%s}" % inner if name else "?"))
            word.dynamic = True
        else:
            m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|\d|[@*#?$!-])", self.s[self.i:])
            if not m:
                buf.append("$")
                mask.append("q" if kind == "qx" else "lit")
                self.i += 1
                return
            word.variables.append(m.group(1))
            word.dynamic = True
            self.i += len(m.group(0))
        buf.append(self.s[start:self.i])
        mask.append(kind)

    def braced(self, word):
        """Inside ${…}: up to the matching }, collecting the substitutions the operand holds (backticks
        and $(…) in ${x:-…} run). Single quotes count as plain characters here (inside double quotes
        they are), so whatever they hold is judged as live: the safe side."""
        while True:
            if self.i >= len(self.s):
                raise ShellSyntaxError("unterminated ${")
            c = self.s[self.i]
            if c == "}":
                return
            if c == "\\":
                self.i += 2
            elif c == '"':
                self.i += 1
                self.read_double_quoted(word, [])
            elif c == "$":
                self.read_dollar(word, [])
            elif c == "`":
                self.read_backtick(word, [])
            elif c == "{":
                self.i += 1
                self.braced(word)
                self.i += 1
            else:
                self.i += 1

    def read_backtick(self, word, buf, mask=None, kind="x"):
        mask = mask if mask is not None else []
        end = self.i + 1
        body = []
        while end < len(self.s) and self.s[end] != "`":
            if self.s[end] == "\\" and end + 1 < len(self.s):
                if self.s[end + 1] not in "$`\\\n\"":
                    body.append("\\")
                body.append(self.s[end + 1])
                end += 2
                continue
            body.append(self.s[end])
            end += 1
        if end >= len(self.s):
            raise ShellSyntaxError("unterminated backtick")
        word.subs.append(ShellParser("".join(body), self.depth + 1).parse())
        word.dynamic = True
        buf.append(self.s[self.i:end + 1])
        mask.append(kind)
        self.i = end + 1


def parse_shell(text, offsets=False):
    """The Script of a command line; with `offsets`, each word read from it knows where it begins (Word.start)."""
    return ShellParser(text, top=text if offsets else None).parse()


def _is_assignment(word):
    """NAME=…, NAME+=…, NAME[i]=…: the name and the = unquoted (the value may be quoted: x='a b')."""
    prefix = []
    for text, kind in word.parts:
        if kind != "lit":
            break
        prefix.append(text)
    return bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=", "".join(prefix)))


def bash_brace_expand(word, limit=256):
    """The token lists bash makes of `word` by brace expansion ({a,b}, {1..3}): each a list of (text, kind)
    with unquoted characters one token each; a single list when there is none (a glob's: _glob_alternatives)."""
    tokens = []
    for text, kind in (word.parts or [(word.text, "q")]):
        tokens.extend([(ch, kind) for ch in text] if kind == "lit" else [(text, kind)])
    if not any(c == "{" and k == "lit" for c, k in tokens):
        return [tokens]
    if len(_brace_pairs(tokens)) > MAX_BRACE_PAIRS:  # each expansion re-reads the word: fail closed
        raise ShellSyntaxError("more than %d {…} groups in one word" % MAX_BRACE_PAIRS)
    return _brace(tokens, limit, [BRACE_BUDGET])[:limit]


#: brace groups one word may have, and the characters expanding one word may read in all: `{a,b}` 2,000
#: times is 2**2000 words, and each step towards the first 1,024 of them re-reads the whole word (64 groups
#: in a 30 KB word took 10 seconds). Past either the command is refused (the policy fails closed).
MAX_BRACE_PAIRS = 64
BRACE_BUDGET = 1 << 20


def _brace_pairs(chars):
    """[(start, end, commas, nested)] for each unquoted '{' with its matching '}', in order of start; nested:
    another '{' inside. One pass with a stack (scanning ahead from every '{' made `{` repeated 10,000 times
    cost 14 seconds to judge)."""
    stack, pairs = [], []
    for j, (c, kind) in enumerate(chars):
        if kind != "lit":
            continue
        if c == "{":
            if stack:
                stack[-1][2] = True
            stack.append([j, [], False])
        elif c == "}" and stack:
            start, commas, nested = stack.pop()
            pairs.append((start, j, commas, nested))
        elif c == "," and stack:
            stack[-1][1].append(j)
    pairs.sort()
    return pairs


def _brace(chars, limit, budget):
    budget[0] -= len(chars)
    if budget[0] < 0:
        raise ShellSyntaxError("brace expansion too large to check")
    for start, end, commas, nested in _brace_pairs(chars):
        if commas:
            bounds = [start] + commas + [end]
            alts = [chars[bounds[k] + 1:bounds[k + 1]] for k in range(len(bounds) - 1)]
        elif nested:  # {{…}} is no range: skipped without joining its body (bodies of outer pairs overlap)
            continue
        else:
            body = "".join(ch for ch, _ in chars[start + 1:end])
            if not (m := re.match(r"^(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?$", body)):
                continue
            a, b = m.group(1), m.group(2)
            step = abs(int(m.group(3) or 1)) or 1
            # a range object, sliced before a list is made: {1..99999999999} is a few words to check
            if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
                lo, hi = int(a), int(b)
                seq = [str(n) for n in (range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step))[:limit]]
            elif not a.lstrip("-").isdigit() and not b.lstrip("-").isdigit():
                lo, hi = ord(a), ord(b)
                seq = [chr(n) for n in (range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step))[:limit]]
            else:
                continue
            alts = [[(ch, "lit") for ch in item] for item in seq]
        out = []
        for alt in alts:
            out.extend(_brace(chars[:start] + alt + chars[end + 1:], limit, budget))
            if len(out) >= limit:
                break
        return out
    return [chars]


def needs_shell(text, script=None):
    """True when a command uses shell syntax (operators, expansions, globs, redirections)."""
    try:
        script = script or parse_shell(text)
    except ShellSyntaxError:
        return True
    if len(script.pipelines) != 1 or len(script.pipelines[0].commands) != 1:
        return True
    cmd = script.pipelines[0].commands[0]
    if not isinstance(cmd, Simple) or cmd.redirects or cmd.assigns or cmd.background:
        return True
    if cmd.words and cmd.words[0].text in _SHELL_ONLY:
        return True
    return any(w.dynamic or w.glob or w.tilde for w in cmd.words) or bool(re.search(r"[;&|<>\n]", text))


def simple_argv(text, script=None):
    cmd = (script or parse_shell(text)).pipelines[0].commands[0]
    return [w.text for w in cmd.words]


def command_argv(command, verdict=None):
    """How a validated command runs: an argument list when it has no shell syntax, else /bin/sh -c (as the
    policy rewrote it: Verdict.run_as)."""
    if getattr(verdict, "run_as", None) is not None:
        return ["/bin/sh", "-c", verdict.run_as]
    script = getattr(verdict, "script", None)
    if needs_shell(command, script):
        return ["/bin/sh", "-c", command]
    return simple_argv(command, script)


# ---- Terminal: the policy (allow / confirm / deny) ----
#
# Two passes over the parsed command and every command nested in it (substitutions, here-document
# bodies, process substitutions, function bodies, case arms, the code of sh -c / eval / trap / alias /
# watch / su -c, and the command any wrapper runs):
#  1. The denylist, on a normalised view: NFKC (full-width look-alikes), brace expansion, ANSI-C quoting,
#     $IFS and variables set earlier in the script, wrappers stripped recursively — every suffix of a
#     wrapper's arguments is tried, so a misread option cannot hide the command. A catastrophe found
#     anywhere is `deny`, in every mode (--allow-dangerous included).
#  2. Classification: `allow` only when every part is proven read-only and inside the working
#     directory — static words, a program resolved from PATH outside the tree, options on the
#     program's list of safe options (parsed as getopt_long does), path operands inside the jail after
#     symlinks and globs. Whatever is not understood is `confirm`: a person decides, or, headless, the
#     command is refused. The OS sandbox (issue 17) is the wall behind both.

ALLOW, CONFIRM, DENY = "allow", "confirm", "deny"
_SEVERITY = {ALLOW: 0, CONFIRM: 1, DENY: 2}

DEFAULT_ALLOWLIST = ("ls", "cat", "head", "tail", "grep", "find", "echo", "printf", "pwd", "which", "type", "wc",
                     "sort", "uniq", "diff", "file", "stat", "du", "df", "tree", "basename", "dirname", "realpath",
                     "date", "true", "false", "git")
SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh", "fish", "csh", "tcsh", "yash", "posh", "rbash",
          "ksh93", "pdksh", "oksh", "loksh", "elvish", "nu", "xonsh", "ion", "rc", "es", "scsh"}
_INTERPRETER = LazyRegex(r"^(python|pypy|perl|ruby|php|lua|luajit|tclsh|wish|jython|node|nodejs|deno|bun|"
                          r"Rscript|R|pwsh|powershell|osascript|irb|julia|guile|racket|sbcl|ghci|runghc|groovy|"
                          r"jshell|scala|expect|ipython|bpython|erl|escript|elixir|iex|swift|"
                          r"sqlite3|psql|mysql|mariadb|gdb|lldb|ed|ex|at|batch|crontab)[0-9.]*$")
#: programs that read commands (not data) from standard input even when given a file argument
_STDIN_COMMANDS = {"sqlite3", "psql", "mysql", "mariadb", "gdb", "lldb", "ed", "ex", "at", "batch"}
DOWNLOADERS = {"curl", "wget", "fetch", "aria2c", "http", "https", "lwp-request", "lwp-download", "GET", "xh",
               "lynx", "links", "w3m", "httpie", "axel", "tftp", "ftp", "scp", "sftp", "rsync", "nc", "ncat"}
PRIVILEGE = {"sudo", "su", "doas", "pkexec", "runuser", "sudoedit", "calife", "super", "ksu", "machinectl"}
DISK_TOOLS = {"mke2fs", "mkswap", "wipefs", "mkdosfs", "mkntfs", "fdisk", "sfdisk", "cfdisk", "parted", "sgdisk",
              "gdisk", "blkdiscard", "hdparm", "dmsetup", "cryptsetup", "zpool", "lvremove", "vgremove",
              "pvremove", "mdadm", "badblocks", "e2fsck", "fsck", "tune2fs", "debugfs", "mount", "umount",
              "swapon", "swapoff", "losetup", "insmod", "rmmod", "modprobe", "kexec", "sysctl", "iptables",
              "nft", "ip6tables"}
POWER = {"shutdown", "reboot", "poweroff", "halt", "telinit", "init", "killall5"}
#: programs that run another command given as their arguments (or a string of shell code)
WRAPPERS = {"env", "exec", "command", "builtin", "nice", "nohup", "time", "timeout", "strace", "ltrace", "taskset",
            "chrt", "ionice", "watch", "flock", "setsid", "stdbuf", "unbuffer", "systemd-run", "busybox", "toybox",
            "xargs", "parallel", "chroot", "unshare", "nsenter", "firejail", "bwrap", "setpriv", "prlimit",
            "numactl", "valgrind", "faketime", "proxychains", "proxychains4", "torsocks", "tsocks", "chronic",
            "caffeinate", "script", "sg", "catchsegv", "cgexec", "runcon", "daemonize", "start-stop-daemon",
            "xvfb-run", "dbus-launch", "dbus-run-session", "ssh-agent", "fakeroot", "eatmydata", "nocache",
            "trickle", "perf", "sudo", "doas", "su", "pkexec", "runuser", "ssh", "tmux", "screen", "nq", "tsp",
            "with-lock-ex", "lckdo", "setarch", "linux32", "linux64", "schedtool", "cpulimit", "rlwrap", "expect",
            "sshpass", "retry", "until", "while", "if", "then", "do", "else", "elif", "!", "coproc", "exec-path",
            "pv", "ts", "dotenv", "direnv", "npx", "pnpx", "uvx", "pipx", "ifne", "vipe", "sem", "tini",
            "dumb-init", "gosu", "su-exec", "chpst", "softlimit", "setuidgid", "envdir", "sandbox-exec",
            "flatpak-spawn", "distrobox-host-exec", "host-spawn", "stdbuf", "systemd-inhibit", "ulimit"}
#: wrappers whose arguments may be shell code run by a shell
CODE_WRAPPERS = {"watch", "script", "su", "flock", "sg", "runuser", "ssh", "parallel", "tmux", "screen", "sem",
                 "expect", "systemd-run", "sshpass", "nq", "tsp", "xvfb-run", "lckdo", "with-lock-ex", "retry"}
SYSTEM_ROOTS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
                "/root", "/sbin", "/srv", "/sys", "/usr", "/var", "/home", "/Users", "/System", "/Library", "/snap",
                "/run", "/mnt", "/media")
SAFE_SINKS = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/zero")
#: another process's secrets and escape routes out of every check: environment, memory, root, cwd, fds
_PROC_SECRET = LazyRegex(r"/proc/+(?:[^/\s]+/+)?(task/+(?:[^/\s]+/+)?)?(environ|mem|root|cwd|fd|fdinfo|map_files|"
                          r"pagemap|syscall|auxv|exe/)|/proc/+(kcore|kmem|self/+mem)|/dev/+(k?mem|port)\b")
#: options whose value is a command line some program runs
_COMMAND_OPTION = LazyRegex(r"(?i)^(proxycommand|localcommand|remotecommand|to-command|checkpoint-action|"
                             r"use-compress-program|compress-program|rsh|rsync-path|unzip-command|info-script|"
                             r"new-volume-script|rmt-command|rsh-command|exec|execute|command|shell-command|editor|"
                             r"pager|askpass|ssh|ssh-command|run|pre-exec|post-exec|onsuccess|onfailure|hook|"
                             r"filter-program|sendmail|lesspipe|lessopen)$")
#: environment variables that make ordinary programs load or run code chosen by whoever sets them: denied
_LOADS_CODE_ENV = LazyRegex(r"^(LD_PRELOAD|LD_AUDIT|DYLD_INSERT_LIBRARIES|GIT_SSH|GIT_SSH_COMMAND|GIT_EXTERNAL_DIFF|"
                             r"GIT_ASKPASS|SSH_ASKPASS|SUDO_ASKPASS|GIT_PROXY_COMMAND|GIT_EXEC_PATH|GIT_TEMPLATE_DIR|"
                             r"GIT_CONFIG_PARAMETERS|GIT_CONFIG_COUNT|GIT_CONFIG_KEY_\d+|GIT_CONFIG_VALUE_\d+|"
                             r"GIT_CONFIG_GLOBAL|GIT_CONFIG_SYSTEM|GIT_CONFIG|GIT_DIR|GIT_COMMON_DIR|BASH_ENV|PERL5OPT|PERL5DB|"
                             r"NODE_OPTIONS|RUBYOPT)$")
#: environment variables holding a command line (PAGER=cat is fine): their value is judged as code
_COMMAND_ENV = LazyRegex(r"^(PAGER|GIT_PAGER|MANPAGER|EDITOR|VISUAL|GIT_EDITOR|LESSOPEN|LESSCLOSE|PS1|PS4|ENV|"
                          r"PROMPT_COMMAND|GIT_SEQUENCE_EDITOR|SYSTEMD_PAGER|BROWSER)$")
_PROC_SENSITIVE = ("environ", "mem", "root", "cwd", "fd", "fdinfo", "map_files", "pagemap", "auxv", "syscall",
                   "kcore", "kmem", "exe")
#: C0/C1 controls (but tab and newline), DEL, bidirectional overrides, zero-width characters
_CONTROL = LazyRegex("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
SHELL_BUILTINS = {"echo", "printf", "pwd", "type", "true", "false", "test", "[", ":", "command", "time", "[[", "exit"}
#: shell builtins that only test or end the shell: read-only with any static arguments, allowlist or not
_ALWAYS_READ_ONLY = {"true", "false", ":", "test", "[", "[[", "exit"}
#: quoted text that still runs when a builtin evaluates it (test -v 'a[$(cmd)]', [[ 'a[`cmd`]' -eq 1 ]])
_EVALUATED = LazyRegex(r"\$[({\[]|`")
#: an option whose value may be a command line another program runs (--exec=CMD, -e CMD, --call CMD)
_COMMAND_NAMED = LazyRegex(r"^-(?:-?(?:[a-z-]*(?:exec|cmd|command|shell|call|run|script|hook|eval)[a-z-]*)|[ecx])$",
                           re.IGNORECASE)
#: while a tail or an argument is judged as the command it may be (CommandPolicy._guessing), in this thread
_GUESSING = threading.local()
#: a word that may be a command line another program hands to a shell: a program's name, a blank, then more
_SHELL_CODE_WORD = LazyRegex(r"^[\s({!;&|]*(?:\w+=\S*\s+)*[\\\"']?[\w./-]+[\"']?\s+\S")  # `(rm …)`, `X=1 rm …`
#: a word that may name a program another one runs (a name, or a path to one)
_PROGRAM_WORD = LazyRegex(r"^(/|\./|\.\./)?[\w.+-]+(/[\w.+-]+)*$")
#: bash builtins that evaluate an argument as a variable name or arithmetic (array subscripts included)
_EVALUATING_BUILTINS = {"test", "[", "[[", "printf", "let", "declare", "typeset", "local", "export", "readonly",
                        "read", "unset", "getopts", "wait", "mapfile", "readarray", "shift", "return", "exit"}
#: builtins with no program of their own on most systems: such a command runs through /bin/sh
_SHELL_ONLY = {"command", "type", "cd", "exec", "builtin", "trap", "alias", "eval", "source", ".", "export", "set",
               "unset", "read", "ulimit", "umask", "wait", "jobs", "time", "local", "declare", "typeset", "shopt",
               "[[", "exit", ":"}

# Defence in depth: shapes that are denied even when the command cannot be parsed. They run over the whole
# command a model wrote, so each is linear: a start is tried only where a word or segment begins, and what a
# failed start scanned is never scanned again from a later start in it (`(\S+)\s*\(` tried every suffix of a
# long word, `/proc/+X*/+` every split of a run of slashes: 40 KB took seconds each).
RAW_DENY = [
    (LazyRegex(r"(?<![^\s;&|(){}])([^\s;&|(){}]{1,64})\s*\(\s*\)\s*\{(?=[^}(]*\})(?=[^}(]*?\1\s*\|\s*\1)(?=[^}(]*&)"),
     "a fork bomb"),
    (LazyRegex(r"(?:^|[|;&])(?=([^|;&]*?\b(?:curl|wget)\b))\1[^|;&]*\|\s*(sudo\s+)?(ba|z|da|k)?sh\b"),
     "download-and-execute (pipes a download into a shell)"),
    (LazyRegex(r"(^|[\s;&|(`'\"])(sudo|doas|pkexec)\s"), "privilege escalation"),
    (LazyRegex(r"(^|[\s;&|(`'\"])mkfs(\.\w+)?\s"), "formatting a filesystem (mkfs)"),
    (LazyRegex(r"(?<![\w-])rm\s+(?=(?:-\w+\s+)*?-\w*[rR])(?=((?:-\w+\s+)+))\1(/|/\*|~|~/|\$HOME|\$\{HOME\})"
                r"([\s'\";)}`|&\]]|$)"),
     "recursive rm of / or home"),
    (LazyRegex(r"--no-preserve-root"), "rm --no-preserve-root"),
    (LazyRegex(r"dup2\(.{0,80}(/bin/)?(ba)?sh\b|pty\.spawn\(\s*['\"](/bin/)?(ba)?sh"), "a reverse shell"),
    (LazyRegex(r"rmtree\(\s*(os\.path\.expanduser\(\s*)?['\"](/|~|~/|/\*)['\"]|(Path\.home|expanduser)\(.{0,40}rmtree"),
     "removes the root or home directory tree"),
    (LazyRegex(r"\bfork\s+while\s+fork\b|while\s*(?:\(\s*)?(1|True|true)\s*(?:\)\s*)?(?:[:{]\s*)?(os\.)?fork\s*\("),
     "a fork bomb"),
    (LazyRegex(r"/proc/+(?:[^/\s'\"]+/+)?(environ|mem)\b"), "reads another process's environment or memory"),
]


class Verdict:
    __slots__ = ("level", "reason", "script", "run_as", "person")

    def __init__(self, level, reason, script=None, run_as=None, person=False):
        self.level = level
        self.reason = reason
        self.script = script
        #: a confirm that needs a person in every mode: asked in chat in YOLO too, refused headless whatever
        #: --allow-dangerous says (what an unknown program may run would be denied on its own, round 19g)
        self.person = person
        #: the command line as it runs, when it differs: each pattern that could expand to a file named like an
        #: option (`?exec` to `-exec`) gets `./` before it, so what the policy judged as a path is one
        self.run_as = run_as

    def __repr__(self):
        return "Verdict(%s, %r)" % (self.level, self.reason)

    def worse(self, other):
        if other is None:
            return self
        if _SEVERITY[other.level] > _SEVERITY[self.level] or (other.level == self.level and not self.reason):
            return other
        return self


def _nfkc(text):
    import unicodedata
    return unicodedata.normalize("NFKC", text) if not text.isascii() else text


def prog_name(text):
    """The program a word names, as the denylist compares it: NFKC, no directory, no leading backslash."""
    return os.path.basename(_nfkc(text).lstrip("\\").rstrip("/")) if text else ""


def is_interpreter(name):
    return name in SHELLS or bool(_INTERPRETER.match(name))


# -- the safe options of the read-only programs --

class OptionSpec:
    """The options of one program that are safe, parsed the way getopt_long does: clustered short flags
    (-la), attached or separate values (-n5, -n 5, -o/x), --long, --long=value, `--` ending the options.
    Long options must be spelled out: an abbreviation is accepted only as a prefix of a listed *unsafe*
    option, so that --compress-prog is caught and nothing unlisted is ever taken as safe."""

    def __init__(self, flags="", args="", pargs="", longs="", bad=None, operands="paths", digits=False, walk="",
                 oargs=""):
        self.oargs = set(oargs)  #: short options whose value is optional and attached (date -Iseconds)
        self.flags = set(flags.replace(" ", ""))  #: short options without a value
        self.args = set(args)  #: short options with a value that is not a file
        self.pargs = set(pargs)  #: short options whose value is a file to read (checked like an operand)
        self.longs = {}  #: name -> None (flag) | "=" (value) | "[=]" (optional value) | "=@" (file value)
        for item in longs.split():
            m = re.match(r"^([\w-]+)(=@|\[=\]|=)?$", item)
            self.longs[m.group(1)] = m.group(2)
        self.bad = bad or {}  #: option -> why it is not read-only (runs code, writes, follows the clock…)
        self.operands = operands  #: "paths" | "none" | "grep" | "date" | "uniq"
        self.digits = digits  #: -5 means -n 5 (head, tail)
        self.walk = set(walk.split())  #: options that follow symbolic links while recursing


_COMMON = "help version"
SAFE_OPTIONS = {
    "ls": OptionSpec("aAbBcCdDfFgGhHiklLmnNopqQrRsStuUvxXZ1", "ITw", "",
                     "all almost-all author escape block-size= ignore-backups color[=] colour[=] directory dired "
                     "classify[=] file-type format= full-time group-directories-first no-group human-readable si "
                     "dereference dereference-command-line dereference-command-line-symlink-to-dir hide= "
                     "hyperlink[=] indicator-style= inode ignore= kibibytes literal numeric-uid-gid "
                     "hide-control-chars show-control-chars quote-name quoting-style= reverse recursive size sort= "
                     "time= time-style= tabsize= width= context zero " + _COMMON, walk="L dereference"),
    "cat": OptionSpec("AbeEnstTuv", "", "", "show-all number-nonblank show-ends number squeeze-blank show-tabs "
                      "show-nonprinting " + _COMMON),
    "head": OptionSpec("qvz", "nc", "", "bytes= lines= quiet silent verbose zero-terminated " + _COMMON,
                       digits=True),
    "tail": OptionSpec("qvz", "ncs", "", "bytes= lines= quiet silent verbose zero-terminated retry pid= "
                       "sleep-interval= max-unchanged-stats= " + _COMMON, digits=True,
                       bad={"f": "tail -f follows the file and never ends", "F": "tail -F never ends",
                            "follow": "tail --follow never ends"}),
    "grep": OptionSpec("abcEFGhHiIlLnoqrRsTuUvVwxyzZP", "ABCmdDe", "f",
                       "extended-regexp fixed-strings basic-regexp perl-regexp regexp= file=@ ignore-case "
                       "no-ignore-case word-regexp line-regexp null-data no-messages invert-match max-count= "
                       "byte-offset line-number line-buffered with-filename no-filename label= only-matching quiet "
                       "silent binary-files= text directories= devices= recursive dereference-recursive include= "
                       "exclude= exclude-from=@ exclude-dir= files-without-match files-with-matches count "
                       "initial-tab null before-context= after-context= context= color[=] colour[=] binary "
                       + _COMMON, operands="grep", walk="R dereference-recursive"),
    "echo": None, "printf": None, "true": None, "false": None,  # no files: any arguments are fine
    "pwd": OptionSpec("LP", "", "", "logical physical " + _COMMON, operands="none"),
    "which": OptionSpec("as", "", "", "all skip-alias skip-functions " + _COMMON, operands="none"),
    "type": OptionSpec("aftpP", "", "", "", operands="none"),
    "wc": OptionSpec("clmwL", "", "", "bytes chars lines words max-line-length total= " + _COMMON,
                     bad={"files0-from": "wc --files0-from reads the names of files to read from a file"}),
    "sort": OptionSpec("bdfgiMhnRrVcCsuzm", "ktS", "",
                       "ignore-leading-blanks dictionary-order ignore-case general-numeric-sort ignore-nonprinting "
                       "month-sort human-numeric-sort numeric-sort random-sort random-source=@ reverse sort= "
                       "version-sort key= field-separator= buffer-size= check[=] merge stable unique "
                       "zero-terminated parallel= debug batch-size= " + _COMMON,
                       bad={"files0-from": "sort --files0-from reads the names of files to read from a file","o": "sort -o writes a file", "output": "sort --output writes a file",
                            "compress-program": "sort --compress-program runs a program",
                            "T": "sort -T writes temporary files into a directory",
                            "temporary-directory": "sort --temporary-directory writes files there"}),
    "uniq": OptionSpec("cdDiuz", "fsw", "", "count repeated all-repeated[=] skip-fields= skip-chars= check-chars= "
                       "ignore-case unique zero-terminated group[=] " + _COMMON, operands="uniq"),
    "diff": OptionSpec("abBdeEiNnpqrsStTuwyZ", "CUWxIDFLS", "X",
                       "normal brief report-identical-files context[=] unified[=] ed rcs side-by-side left-column "
                       "suppress-common-lines show-c-function show-function-line= label= expand-tabs initial-tab "
                       "tabsize= suppress-blank-empty new-file unidirectional-new-file ignore-case "
                       "ignore-file-name-case no-ignore-file-name-case ignore-tab-expansion ignore-trailing-space "
                       "ignore-space-change ignore-all-space ignore-blank-lines ignore-matching-lines= text "
                       "strip-trailing-cr recursive no-dereference exclude= exclude-from=@ starting-file= "
                       "from-file=@ to-file=@ minimal horizon-lines= speed-large-files color[=] palette= width= "
                       "line-format= old-line-format= new-line-format= unchanged-line-format= old-group-format= "
                       "new-group-format= changed-group-format= unchanged-group-format= " + _COMMON,
                       bad={"l": "diff -l runs pr", "paginate": "diff --paginate runs pr"}, walk="r recursive"),
    "file": OptionSpec("bcdEhiklLNnprsS0", "eFP", "",
                       "brief checking-printout exclude= exclude-quiet= extension separator= mime "
                       "mime-type mime-encoding keep-going list dereference no-dereference no-pad preserve-date raw "
                       "special-files print0 parameter= apple " + _COMMON,
                       bad={"m": "file -m loads a magic file", "magic-file": "file --magic-file loads a magic file",
                            "C": "file -C compiles and writes a magic file", "compile": "file --compile writes",
                            "z": "file -z runs decompressors", "Z": "file -Z runs decompressors",
                            "uncompress": "file --uncompress runs decompressors",
                            "uncompress-noreport": "runs decompressors", "no-sandbox": "turns off file's sandbox",
                            "f": "file -f reads the names of files to read from a file",
                            "files-from": "file --files-from reads the names of files to read from a file"}),
    "stat": OptionSpec("LftZ", "c", "", "dereference file-system format= printf= terse cached= " + _COMMON),
    "du": OptionSpec("0abcDhHklmLsSxP", "dBt", "X",
                     "null all apparent-size block-size= bytes total dereference-args max-depth= human-readable "
                     "inodes si summarize threshold= time[=] time-style= exclude= exclude-from=@ one-file-system "
                     "count-links separate-dirs dereference no-dereference " + _COMMON,
                     walk="L dereference",
                     bad={"files0-from": "du --files0-from reads the names of files to read from a file"}),
    "df": OptionSpec("ahHiklPTv", "tBx", "", "all block-size= human-readable si inodes local no-sync sync output[=] "
                     "portability print-type type= exclude-type= total " + _COMMON),
    "tree": OptionSpec("adfilpsugDFqNQrtvUcSnCJXhA", "LPIT", "",
                       "noreport charset= filelimit= dirsfirst filesfirst prune matchdirs ignore-case du timefmt= "
                       "sort= gitignore inodes device metafirst " + _COMMON,
                       bad={"o": "tree -o writes a file", "R": "tree -R writes files", "H": "tree -H writes HTML",
                            "fromfile": "tree --fromfile reads a listing", "fromtabfile": "reads a listing"},
                       walk="l"),
    "basename": OptionSpec("az", "s", "", "multiple suffix= zero " + _COMMON, operands="none"),
    "dirname": OptionSpec("z", "", "", "zero " + _COMMON, operands="none"),
    "realpath": OptionSpec("eLmPqsz", "", "", "canonicalize-existing canonicalize-missing logical physical quiet "
                           "relative-to=@ relative-base=@ strip no-symlinks zero " + _COMMON),
    "date": OptionSpec("uR", "d", "r", "date= iso-8601[=] rfc-email rfc-3339= universal utc reference=@ debug "
                       "resolution " + _COMMON, operands="date",
                       bad={"s": "date -s sets the clock", "set": "date --set sets the clock",
                            "f": "date -f reads dates from a file", "file": "date --file reads dates from a file"},
                       oargs="I"),
}
for _name in ("wc", "cat", "head", "tail", "sort", "uniq"):
    SAFE_OPTIONS[_name].longs.setdefault("help", None)

#: find: the tests and actions that only read and print
FIND_SAFE = {"-name": 1, "-iname": 1, "-path": 1, "-ipath": 1, "-wholename": 1, "-iwholename": 1, "-lname": 1,
             "-ilname": 1, "-regex": 1, "-iregex": 1, "-regextype": 1, "-type": 1, "-xtype": 1, "-maxdepth": 1,
             "-mindepth": 1, "-mtime": 1, "-mmin": 1, "-atime": 1, "-amin": 1, "-ctime": 1, "-cmin": 1, "-size": 1,
             "-empty": 0, "-print": 0, "-print0": 0, "-printf": 1, "-prune": 0, "-not": 0, "!": 0, "(": 0, ")": 0,
             "-o": 0, "-a": 0, "-or": 0, "-and": 0, ",": 0, "-user": 1, "-group": 1, "-uid": 1, "-gid": 1,
             "-nouser": 0, "-nogroup": 0, "-perm": 1, "-links": 1, "-inum": 1, "-xdev": 0, "-mount": 0,
             "-depth": 0, "-d": 0, "-readable": 0, "-writable": 0, "-executable": 0, "-true": 0, "-false": 0,
             "-quit": 0, "-ls": 0, "-newer": "path", "-anewer": "path", "-cnewer": "path", "-samefile": "path",
             "-used": 1, "-fstype": 1, "-noleaf": 0, "-daystart": 0, "-ignore_readdir_race": 0,
             "-noignore_readdir_race": 0, "-warn": 0, "-nowarn": 0, "-sparse": 0, "-context": 1}
FIND_BAD = {"-exec": "find -exec runs commands", "-execdir": "find -execdir runs commands",
            "-ok": "find -ok runs commands", "-okdir": "find -okdir runs commands", "-delete": "find -delete deletes",
            "-fprint": "find -fprint writes a file", "-fprint0": "find -fprint0 writes a file",
            "-fprintf": "find -fprintf writes a file", "-fls": "find -fls writes a file",
            "-follow": "find -follow follows symbolic links", "-files0-from": "find -files0-from reads a list"}

#: git: the read-only subcommands (as codex allows them) and their safe options
_GIT_DIFF = ("p u s patch no-patch unified= U stat[=] numstat shortstat dirstat[=] summary name-only name-status "
             "raw patch-with-stat patch-with-raw color[=] no-color word-diff[=] word-diff-regex= color-words[=] "
             "color-moved[=] no-color-moved no-renames find-renames[=] M find-copies[=] find-copies-harder full-index "
             "binary abbrev[=] B D l R a text ignore-space-change ignore-all-space ignore-blank-lines "
             "ignore-space-at-eol ignore-cr-at-eol w b W function-context minimal patience histogram diff-algorithm= "
             "anchored= relative[=] no-relative z no-ext-diff no-textconv ignore-submodules[=] src-prefix= "
             "dst-prefix= no-prefix default-prefix line-prefix= stat-width= stat-count= compact-summary G S "
             "pickaxe-all pickaxe-regex exit-code quiet cached staged merge-base indent-heuristic "
             "no-indent-heuristic check ws-error-highlight= inter-hunk-context= irreversible-delete "
             "rename-empty no-rename-empty")
_GIT_LOG = (_GIT_DIFF + " oneline n max-count= skip= since= after= until= before= author= committer= grep= "
            "all-match invert-grep i regexp-ignore-case E F P basic-regexp extended-regexp fixed-strings "
            "perl-regexp graph decorate[=] no-decorate decorate-refs= decorate-refs-exclude= all branches[=] "
            "tags[=] remotes[=] glob= exclude= reverse first-parent merges no-merges min-parents= max-parents= "
            "no-min-parents no-max-parents follow date= pretty[=] format= abbrev-commit no-abbrev-commit "
            "relative-date parents children left-right cherry-pick cherry-mark cherry topo-order date-order "
            "author-date-order full-history simplify-merges simplify-by-decoration ancestry-path[=] mailmap "
            "use-mailmap no-mailmap encoding= notes[=] no-notes show-notes[=] expand-tabs[=] no-expand-tabs source "
            "log-size walk-reflogs g boundary cc c m diff-merges= dd remerge-diff no-walk[=] do-walk count "
            "show-linear-break[=] dense sparse single-worktree reflog no-standard-notes")
GIT_READ_ONLY = {
    "status": "s b short branch porcelain[=] long v verbose u untracked-files[=] ignored[=] z column[=] no-column "
              "ahead-behind no-ahead-behind renames no-renames find-renames[=] show-stash ignore-submodules[=]",
    "diff": _GIT_DIFF,
    "log": _GIT_LOG,
    "show": _GIT_LOG,
    "branch": "a all r remotes v vv verbose list l show-current merged[=] no-merged[=] contains[=] "
              "no-contains[=] points-at= sort= format= color[=] no-color column[=] no-column i ignore-case "
              "abbrev= no-abbrev omit-empty",
}
GIT_BAD = {"ext-diff": "git --ext-diff runs an external diff program", "textconv": "git --textconv runs filters",
           "submodule": "git --submodule diffs inside the submodules history holds, with their own configuration",
           "output": "git --output writes a file", "show-signature": "git --show-signature runs gpg",
           "no-index": "git diff --no-index compares files anywhere", "O": "reads an order file",
           "open-files-in-pager": "runs a pager", "exec": "runs a command", "upload-pack": "runs a program",
           "receive-pack": "runs a program", "config": "sets configuration", "template": "copies hooks"}
#: the git configuration a command line may set: only settings that run nothing and load nothing. Any other
#: key is refused (fail closed): a list of the dangerous ones missed trailer.<t>.command and imap.tunnel
#: (round 19e), and git adds more in every release
_GIT_HARMLESS_KEY = LazyRegex(
    r"^(user\.(name|email|useconfigonly)|(author|committer)\.(name|email)|color\.[a-z0-9.-]+|"
    r"core\.(quotepath|autocrlf|safecrlf|filemode|ignorecase|precomposeunicode|abbrev|eol|whitespace)|i18n\.[a-z]+|"
    r"advice\.[a-z]+|column\.[a-z]+|init\.defaultbranch|pull\.(rebase|ff)|push\.(default|autosetupremote)|"
    r"commit\.(verbose|cleanup|status)|merge\.(conflictstyle|ff|log|stat)|rebase\.(autosquash|autostash|stat)|"
    r"diff\.(renames|algorithm|noprefix|mnemonicprefix|context|interhunkcontext|relative|statgraphwidth|colormoved|"
    r"indentheuristic|suppressblankempty)|log\.(date|decorate|follow|abbrevcommit|mailmap)|format\.pretty|"
    r"status\.(short|branch|showuntrackedfiles|relativepaths)|grep\.(linenumber|extendedregexp|patterntype|fullname|"
    r"column)|blame\.(date|coloring|markunblamablelines|markignoredlines)|fetch\.prune|protocol\.version|"
    r"branch\.sort|tag\.sort|versionsort\.suffix|gc\.auto|maintenance\.auto)$",
    re.IGNORECASE)
#: git configuration known to run programs: denied on a command line; any other key not above needs a person in
#: every mode (round 19g: denied, `git -c commit.gpgsign=false` could be run by nobody)
_GIT_DANGEROUS_KEY = LazyRegex(
    r"^(alias\.|core\.(sshcommand|fsmonitor|hookspath|pager|editor|gitproxy|askpass|attributesfile|worktree|"
    r"alternaterefscommand|excludesfile)|diff\.(external|tool|guitool|[^.]+\.)|difftool\.|merge\.(tool|guitool|[^.]+\.)|"
    r"mergetool\.|filter\.|pager\.|protocol\.|"
    r"uploadpack\.|receivepack\.|credential\.|sequence\.editor|gpg\.|http\.|https\.|remote\.|include\.|includeif\.|"
    r"init\.templatedir|url\.|submodule\.|ssh\.|uploadarchive\.|safe\.|transfer\.|fetch\.|gc\.|interactive\.|"
    r"sendemail\.|instaweb\.|web\.|browser\.|man\.|help\.|pack\.|status\.|log\.|trailer\.|imap\.|"
    r"format\.pretty)", re.IGNORECASE)


def _set_by_option(args):
    """The code-loading variable a wrapper's option sets (`systemd-run --setenv=LD_PRELOAD=…`, `bwrap --setenv
    LD_PRELOAD x`, `firejail --env=…`), or None: only env, export and declare were read (round 19g)."""
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name.lower() in ("--setenv", "--set-env", "--env", "--environment") and eq:
            candidate = value.split("=", 1)[0]
        elif a.lower() in ("--setenv", "--set-env", "--env", "--environment") and i + 1 < len(args):
            candidate = args[i + 1].split("=", 1)[0]
        else:
            continue
        if _LOADS_CODE_ENV.match(candidate.strip()):
            return candidate.strip()
    return None


#: git's commands that run programs their arguments name (round 19g: only a confirm, so YOLO ran them)
_GIT_RUNNERS = {"difftool", "mergetool", "filter-branch", "filter-repo", "send-email", "instaweb", "p4", "svn",
                "archimport", "cvsimport", "cvsexportcommit", "quiltimport", "request-pull", "credential"}
#: git's own options that take a value (as the next word, or after `=`)
_GIT_VALUED = {"-C", "-c", "--config-env", "--git-dir", "--work-tree", "--namespace", "--super-prefix",
               "--exec-path", "--list-cmds", "--attr-source"}


def _git_settings(args):
    """(the values of git's own -c / --config-env (before the subcommand), and of `clone` and `submodule add`'s
    -c/--config, which write the new repository's configuration; the subcommand and what follows it). A
    subcommand's `-c` is its own (`git switch -c feature/login` is a branch, round 19g)."""
    out, i = [], 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        a = args[i]
        if a in ("-c", "--config-env") and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith("--config-env="):
            out.append(a.split("=", 1)[1])
        elif a.startswith("-c") and not a.startswith("--"):
            out.append(a[2:])
        i += 2 if a in _GIT_VALUED else 1
    rest = args[i:]
    if rest[:1] == ["clone"] or rest[:2] == ["submodule", "add"]:
        for j, a in enumerate(rest):
            if a in ("-c", "--config") and j + 1 < len(rest):
                out.append(rest[j + 1])
            elif a.startswith("--config="):
                out.append(a.split("=", 1)[1])
    return out, rest


def _git_spec(items):
    flags = "".join(t for t in items.split() if len(t) == 1 and t not in "UnGS")
    args = "".join(t for t in items.split() if t in ("U", "n", "G", "S"))
    return OptionSpec(flags, args, "", " ".join(t for t in items.split() if len(t) > 1), bad=GIT_BAD,
                      operands="none", digits=True)


GIT_SPECS = {name: _git_spec(items) for name, items in GIT_READ_ONLY.items()}


def bounded_glob(pattern, max_matches, max_entries=100000):
    """(the first max_matches matches, exhausted) for an absolute glob.glob pattern (same rules: '*' skips
    dot files, no '**'), reading at most `max_entries` directory entries. glob follows symbolic links: ten
    links to '.' make `*/*/*/*/*/*/*/*/x` a hundred million paths (glob.glob ran for hours); here the walk
    stops, and `exhausted` (the answer is not known) is the caller's cue to fail closed."""
    import glob
    parts = pattern.split("/")
    frontier, budget = ["/" if pattern.startswith("/") else ""], max_entries
    for k, part in enumerate(parts[1:] if pattern.startswith("/") else parts):
        last = k == len(parts) - (2 if pattern.startswith("/") else 1)
        nxt = []
        for base in frontier:
            if not part:  # a trailing or doubled '/': directories only
                if os.path.isdir(base or "."):
                    nxt.append(base if base.endswith("/") else base + "/")
                continue
            if not glob.has_magic(part):
                path = os.path.join(base, part)
                if os.path.lexists(path) if last else os.path.isdir(path):
                    nxt.append(path)
                continue
            try:
                with os.scandir(base or ".") as it:
                    for entry in it:
                        budget -= 1
                        if budget < 0:
                            return [], True
                        if entry.name.startswith(".") and not part.startswith("."):
                            continue
                        if fnmatch.fnmatch(entry.name, part):
                            nxt.append(os.path.join(base, entry.name))
                            if last and len(nxt) >= max_matches:
                                return nxt, False
            except OSError:
                continue
        frontier = nxt
    return frontier[:max_matches], False


# ---- Terminal: the policy, pass 1: the denylist ----

class Denylist:
    """The first pass of CommandPolicy (its base): the catastrophes, found anywhere in a command however it
    is wrapped or spelled, on the normalised view of its words (what the shell will make of them)."""

    def _deny_script(self, script, depth, env, first_piped=False):
        if depth > 16:
            return Verdict(DENY, "commands are nested too deeply to check")
        for pipeline in script.pipelines:
            if (verdict := self._deny_exfiltration(pipeline, env)) is not None:
                return verdict
            upstream = None
            for position, command in enumerate(pipeline.commands):
                if (verdict := self._deny_node(command, depth, env, position > 0 or first_piped, upstream)) is not None:
                    return verdict
                upstream = _printed(command)
        return None

    def _deny_network_argv(self, prog, args):
        """What one argument list alone gives away over the network: a shell (`nc -e`, `socat exec:`) or a secret
        file it sends. Also where a wrapper nobody listed runs it (round 19g: `cmake -E env nc -e /bin/sh …` and
        `timeout 5 curl -d @~/.ssh/id_ed25519 …` were a confirm; the rule was the pipeline's alone)."""
        if prog in ("nc", "ncat", "netcat") and any(a in ("-e", "-c", "--exec", "--sh-exec", "--lua-exec")
                                                    for a in args):
            return Verdict(DENY, "%s -e gives a shell to whoever is at the other end" % prog)
        if prog == "socat" and any(re.match(r"(?i)^(exec|system):", a) for a in args):
            return Verdict(DENY, "socat exec: gives a shell to whoever is at the other end")
        if (prog in DOWNLOADERS or prog in ("nc", "ncat", "netcat", "socat", "telnet", "ssh", "openssl")) and \
                any(self._secret_file(a) for a in args):
            return Verdict(DENY, "sends a secret file over the network (%s)" % prog)
        return None

    def _deny_exfiltration(self, pipeline, env):
        """A secret file or the environment read and sent over the network in one pipeline, or a shell
        whose input and output are a network connection through /dev/tcp (a reverse shell)."""
        secret_seen = False
        for command in pipeline.commands:
            if not isinstance(command, Simple) or not command.words:
                continue
            for argv in self._argvs(command.words, env, ("empty",))[:2]:
                if not argv:
                    continue
                prog = prog_name(argv[0])
                secrets = [a for a in argv[1:] if self._secret_file(a)] + [
                    s for w in command.words for s in w.subs if self._reads_secret(s, env)]  # -d "$(cat ~/.ssh/x)"
                if prog in DOWNLOADERS or prog in ("nc", "ncat", "netcat", "socat", "telnet", "ssh", "openssl"):
                    if secret_seen or secrets:  # (a shell handed over alone: _deny_network_argv, per command)
                        return Verdict(DENY, "sends a secret file or the environment over the network (%s)" % prog)
                if secrets or prog in ("env", "printenv", "set", "export", "declare") and len(argv) == 1:
                    secret_seen = True
                targets = [r[1].text for r in command.redirects if r[1] is not None]
                if any(re.match(r"^/dev/(tcp|udp)/", t) for t in targets) and (
                        is_interpreter(prog) or prog in ("exec",) or secret_seen or secrets):
                    return Verdict(DENY, "connects a shell or a secret to the network through /dev/tcp")
        return None

    def _reads_secret(self, script, env):
        for pipeline in script.pipelines:
            for command in pipeline.commands:
                if isinstance(command, Simple) and command.words:
                    argvs = self._argvs(command.words, env, ("empty",))[:2]
                    if any(self._secret_file(a) for argv in argvs for a in argv[1:]) or any(
                            r[1] is not None and self._secret_file(r[1].text) for r in command.redirects):
                        return True
        return False

    def _secret_file(self, text):
        """Does an argument (curl's @file and name=@file too) name a key or credential file?"""
        for path in filter(None, map(self._abs, (text, text.lstrip("@<"), text.split("=", 1)[-1].lstrip("@<")))):
            if any(p == q or p.startswith(q + "/") for p in (path, os.path.realpath(path))
                   for q in (os.path.join(self.home, name) for name in CREDENTIAL_NAMES)):
                return True
        return False

    def _deny_node(self, node, depth, env, piped, upstream=None):
        if isinstance(node, FunctionDef):
            if _calls_itself(node):
                return Verdict(DENY, "a fork bomb (function %s calls itself in the background)" % node.name)
            return self._deny_node(node.body, depth + 1, env, piped) if node.body is not None else None
        if (verdict := self._deny_redirects(node.redirects, depth, env)) is not None:
            return verdict
        if isinstance(node, Group):
            for word in node.words:
                for sub in word.subs:
                    verdict = verdict or self._deny_script(sub, depth + 1, env)
            return verdict or self._deny_script(node.script, depth + 1, env, piped and node.kind != "case")
        for word in node.assigns + node.words:
            for sub in word.subs:
                if (verdict := self._deny_script(sub, depth + 1, env, sub.stdin_data)) is not None:
                    return verdict
        for word in node.assigns:
            name, _, value = word.text.partition("=")
            name = name.rstrip("+")
            values = [" ".join(f) for f in self._argvs([_value_word(word)], env, ("empty",))] or [""]
            env[name] = values[:8]
            if values[0].startswith("(") and values[0].rstrip().endswith(")"):  # a=(/ x): an array
                items = values[0].strip()[1:-1].split()
                env[name] = items[:1] or [""]
                for n, item in enumerate(items[:32]):
                    env["%s[%d]" % (name, n)] = [item]
                env[name + "[@]"] = env[name + "[*]"] = [" ".join(items)]
            if (verdict := self._deny_setting(name, value, depth)) is not None:
                return verdict
        if not node.words:
            return None
        stdin_code = upstream
        for op, target, body, live in node.redirects:
            if op in ("<<", "<<-"):
                stdin_code = body or ""
            elif op == "<<<" and target is not None:
                stdin_code = target.text
        argvs = self._argvs(node.words, env)
        fetched = [s for w in node.words[1:] for s in w.subs] + \
            [s for r in node.redirects if r[1] is not None for s in r[1].subs]
        if any(_script_downloads(s) for s in fetched):
            for argv in argvs:
                runner = [a for a in argv[:8] if is_interpreter(prog_name(a)) or
                          prog_name(a) in ("eval", ".", "source")]
                if runner:
                    return Verdict(DENY, "download-and-execute: %s runs fetched code" % prog_name(runner[0]))
        downloads = env.setdefault("\0downloads", [])
        for argv in argvs:
            if not argv:
                continue
            if (verdict := self._deny_argv(argv, depth, piped, stdin_code)) is not None:
                return verdict
            runs = [self._abs(a) for a in argv[:3] if a and not a.startswith("-")]
            if downloads and any(path in downloads for path in runs) and (
                    "/" in argv[0] or is_interpreter(prog_name(argv[0])) or prog_name(argv[0]) in (".", "source")):
                return Verdict(DENY, "download-and-execute: runs a file downloaded earlier in the command")
            if prog_name(argv[0]) in DOWNLOADERS:
                outputs = _write_targets("curl", argv[1:]) + [t.text for op, t, b, l in node.redirects
                                                               if t is not None and op in (">", ">>", ">|", "&>")]
                outputs += [a.rsplit("/", 1)[-1] for a in argv[1:] if "://" in a and
                            any(o in argv for o in ("-O", "--remote-name")) or ("://" in a and
                                                                                prog_name(argv[0]) == "wget")]
                downloads.extend(self._abs(o) for o in outputs if self._abs(o))
        first = argvs[0] if argvs else []
        self._remember_variables(first, env, stdin_code)
        if first and first[0] in ("cd", "pushd", "popd", "chdir"):  # later relative paths are relative to it
            target = (_operands(first[1:]) or ["~"])[0] if first[0] != "popd" else "-"
            path = self._abs(target) if target != "-" else ""
            self._cwd = os.path.realpath(path) if path else None
        if len(first) >= 3 and first[0] in ("for", "select") and first[2] == "in":
            env[first[1]] = (first[3:] or [""])[:8]
        return None

    def _remember_variables(self, argv, env, stdin_code):
        """Variables a builtin sets (export X=/, declare, readonly, local, printf -v, read <<< /, set -- /),
        so that a later $X is seen as what it holds."""
        if not argv:
            return
        prog, args = argv[0], argv[1:]
        if prog in ("export", "declare", "typeset", "local", "readonly"):
            for a in args:
                if m := re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", a, re.S):
                    env[m.group(1)] = [m.group(2)]
        elif prog == "printf" and len(args) >= 3 and args[0] == "-v":
            out = _trivial_output("$(printf %s)" % " ".join(shlex_quote(a) for a in args[2:]))
            env[args[1]] = [out if out is not None else ""]
        elif prog == "read" and stdin_code is not None:
            names = [a for a in args if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", a)]
            values = stdin_code.split()
            for n, name in enumerate(names):
                env[name] = [(" ".join(values[n:]) if n == len(names) - 1 else values[n]) if n < len(values) else ""]
        elif prog == "set" and "--" in args:
            values = args[args.index("--") + 1:]
            for n, value in enumerate(values[:9]):
                env[str(n + 1)] = [value]
            env["@"] = env["*"] = [" ".join(values)]

    def _deny_redirects(self, redirects, depth, env):
        for op, target, body, live in redirects:
            for word in (target, live):
                if word is None:
                    continue
                for sub in word.subs:
                    if (verdict := self._deny_script(sub, depth + 1, env)) is not None:
                        return verdict
            if target is None or op in ("<<", "<<-"):
                continue
            for argv in self._argvs([target], env):
                for text in argv:
                    if self._proc_secret(text):
                        return Verdict(DENY, "reads or writes another process's secrets or escapes through "
                                             "/proc (%s)" % text)
                    if op in ("<", "<<<", "<&") or (op == ">&" and (text.isdigit() or text == "-")):
                        continue
                    if reason := self._protected(text):
                        return Verdict(DENY, "redirects output into %s (%s)" % (reason, text))
        return None

    def _proc_secret(self, text):
        """Does an argument name another process's environment, memory, root, cwd or descriptors?"""
        for path in (p for t in (text, text.split("=", 1)[-1]) for p in (t, self._abs(t)) if p):
            parts = path.split("/")
            if _PROC_SECRET.search(path) or len(parts) > 2 and parts[:2] == ["", "proc"] and any(
                    fnmatch.fnmatchcase(name, part) for part in parts[2:] for name in _PROC_SENSITIVE):
                return True
        return False

    def _deny_code(self, code, depth):
        """Shell code run by sh -c, eval, trap, alias, watch …: parsed and judged like the command itself."""
        if not code or not code.strip():
            return None
        try:
            script = ShellParser(_nfkc(code), min(depth, 20)).parse()
        except ShellSyntaxError as exc:
            raw = self._raw_deny(" ".join(code.split()))
            if raw is None and getattr(_GUESSING, "depth", 0):
                return None  # a guess (_guessing): words, not code
            return raw or Verdict(DENY, "runs shell code that cannot be checked (%s)" % exc)
        return self._deny_script(script, depth + 1, {})

    def _deny_argv(self, argv, depth, piped=False, stdin_code=None):
        """The denylist on one normalised argument list, then on whatever it runs, and on the tails an unknown
        program may run (_deny_tails). In a guess (_guessing) the rules on a program's name alone (sudo, reboot,
        init, mkfs) do not apply (`cargo init`, `npm install sudo` are no wrappers)."""
        if depth > 16:
            return Verdict(DENY, "commands are nested too deeply to check")
        if not (argv := [a for a in argv]):
            return None
        prog = prog_name(argv[0])
        args = argv[1:]
        for rule in self.custom:
            if rule[0] == "words" and _matches_custom(rule, prog, args):
                return Verdict(DENY, "matches the custom denylist entry %r" % rule[2])
        if not getattr(_GUESSING, "depth", 0) and (verdict := self._deny_name(prog, args)) is not None:
            return verdict
        if prog in ("kill", "pkill", "killall") and any(a in ("-1", "--", "1") for a in args[-1:]) and \
                prog == "kill":
            return Verdict(DENY, "kill -1 signals every process")
        for text in argv:
            if self._proc_secret(text):
                return Verdict(DENY, "reads or writes another process's secrets or escapes through /proc (%s)" % text)
        if (verdict := self._deny_network_argv(prog, args)) is not None:
            return verdict
        if prog not in SAFE_OPTIONS and (name := _set_by_option(args)) is not None:
            return Verdict(DENY, "sets %s, which makes other programs load or run code" % name)
        if prog in ("cd", "pushd", "chdir") and any(self._abs(a).startswith("/proc") for a in args):
            return Verdict(DENY, "changes into /proc, where another process's secrets are")
        if prog in _EVALUATING_BUILTINS and not getattr(_GUESSING, "depth", 0):  # no builtin another runs
            for text in args:
                if _EVALUATED.search(text):  # bash runs the $(…) of a quoted array subscript it evaluates
                    verdict = self._deny_code(": " + text, depth)
                    if verdict is not None and verdict.level == DENY:
                        return verdict
        if (verdict := self._deny_hidden_programs(prog, args, depth)) is not None:
            return verdict
        if is_interpreter(prog) or prog in ("source", ".", "eval"):
            if (verdict := self._deny_interpreter(prog, args, depth, piped, stdin_code)) is not None:
                return verdict
        if (verdict := self._deny_program(prog, args, depth)) is not None:
            return verdict
        if prog in WRAPPERS or prog in ("trap", "alias"):
            return self._deny_wrapped(prog, args, depth, piped, stdin_code)
        return self._deny_tails(prog, argv, depth, piped, stdin_code)

    def _guessing(self, judge, *args):
        """`judge(*args)` as a guess (_deny_tails): no rule on a name alone, text that is no shell code is words,
        and nothing below is guessed again (the flag holds through wrappers a tail goes through)."""
        _GUESSING.depth = getattr(_GUESSING, "depth", 0) + 1
        try:
            return judge(*args)
        finally:
            _GUESSING.depth -= 1

    @staticmethod
    def _deny_name(prog, args):
        """The programs denied by their name: privilege, disks, power."""
        if prog in PRIVILEGE:
            return Verdict(DENY, "privilege escalation (%s) is never run" % prog)
        if prog.startswith("mkfs") or prog in DISK_TOOLS:
            return Verdict(DENY, "%s changes disks, filesystems or the kernel" % prog)
        if prog in POWER or (prog == "systemctl" and set(args) & {"poweroff", "reboot", "halt", "kexec",
                                                                   "suspend", "hibernate", "rescue", "emergency"}):
            return Verdict(DENY, "%s stops or restarts the machine" % prog)
        return None

    def _deny_tails(self, prog, argv, depth, piped, stdin_code):
        """A program the policy does not know may run the words after any of its arguments as a command:
        `cmake -E env git -c core.fsmonitor=… status` ran in YOLO what plain git was denied, and `npm explore
        pkg -- sh -c …` likewise (round 19e); no list of wrappers is ever whole. So each tail that begins with a
        program's name, and each argument after `--` or of an option that names a command (`--exec=`, `--call`,
        `-e`) read as a command line, is judged by the denylist. A tail is a guess, never a verdict: what the
        denylist would refuse makes the command one a person must approve in every mode, YOLO included, and
        headless runs refuse it (CommandPolicy._guessed); denied outright, `jq .` and `docker exec web chown …`
        could be run by nobody (round 19g). Returns None: the guess is kept for the verdict."""
        if prog in SAFE_OPTIONS or prog in SHELL_BUILTINS or prog in _SHELL_ONLY or is_interpreter(prog) or \
                prog == "git" or getattr(_GUESSING, "depth", 0):
            return None  # known programs are judged by their own rules; a guess is not guessed again
        seen = 0
        for i in range(1, len(argv)):
            word = argv[i]
            if word == "--":
                continue
            name, eq, value = word.partition("=") if word.startswith("-") else ("", "", "")
            if eq and _COMMAND_NAMED.search(name):  # --exec=CMD, --call=CMD
                verdict = self._guessing(self._deny_code, value, depth + 1)
            elif i > 1 and _COMMAND_NAMED.search(argv[i - 1]) and argv[i - 1].startswith("-") or \
                    _SHELL_CODE_WORD.search(word):  # -e CMD, -- 'CMD', 'CMD': its first word must be the denied one
                verdict = self._guessing(self._deny_code, word, depth + 1)
            elif word and word[0] not in "-=+@%:" and _PROGRAM_WORD.match(word) and \
                    prog_name(word) not in _SHELL_ONLY and prog_name(word) not in SHELL_BUILTINS:
                verdict = self._guessing(self._deny_argv, argv[i:], depth + 1, piped, stdin_code)
            else:
                continue
            if verdict is not None and verdict.level == DENY:
                self._guess("%s may run what is denied on its own (%s): a person must approve it" % (
                    prog, verdict.reason))
                return None
            seen += 1
            if seen >= 64:  # more than a wrapper's words: what the rest may run is not known
                self._guess("%s has more arguments than the policy follows to see what it may run: a person must "
                            "approve it" % prog)
                return None
        return None

    def _guess(self, reason):
        """Keep the first guess of this command's judgement (_judge turns it into the verdict)."""
        if getattr(self, "_guessed", None) is None:
            self._guessed = reason

    def _deny_setting(self, name, value, depth):
        """A variable set for a command or exported: the ones that load code are denied; command lines
        (PAGER, EDITOR, PS4 …) and values with substitutions are judged as code."""
        if _LOADS_CODE_ENV.match(name):
            return Verdict(DENY, "sets %s, which makes other programs load or run code" % name)
        if _COMMAND_ENV.match(name) or "$(" in value or "`" in value:
            return self._deny_code(value, depth + 1)
        return None

    def _deny_hidden_programs(self, prog, args, depth):
        """Programs run through an option (--to-command=, ProxyCommand=, --rsh …), an environment variable
        (GIT_SSH_COMMAND, LD_PRELOAD …), an editor command (vim -c '!…'), awk's system(), sed's e;
        attaching to another process (gdb -p, strace -p); containers that mount the host."""
        for i, a in enumerate(args):
            key, eq, value = a.lstrip("-").partition("=")
            if eq and _COMMAND_OPTION.search(key):
                verdict = self._deny_code(value[5:] if value.startswith("exec=") else value, depth + 1)
                if verdict is not None:
                    return verdict
            elif not eq and a.startswith("-") and _COMMAND_OPTION.search(key) and i + 1 < len(args):
                if (verdict := self._deny_code(args[i + 1], depth + 1)) is not None:
                    return verdict
            if eq and prog in ("env", "export", "declare", "typeset", "local", "readonly", "setenv"):
                if (verdict := self._deny_setting(a.split("=", 1)[0].lstrip("-"), value, depth)) is not None:
                    return verdict
        if prog in ("gdb", "lldb", "strace", "ltrace", "gcore", "perf", "bpftrace", "pstack", "eu-stack") and any(
                a in ("-p", "--pid", "--attach", "attach") or a.startswith("--pid=") or
                (a.startswith("-p") and a[2:].isdigit()) for a in args) or prog in ("gcore", "pstack", "eu-stack"):
            return Verdict(DENY, "%s attaches to another process and reads its memory" % prog)
        if prog == "ps" and any(not a.startswith("-") and "e" in a and re.fullmatch(r"[a-zA-Z]+", a) for a in args):
            return Verdict(DENY, "ps e shows other processes' environment")
        if prog in ("docker", "podman", "nerdctl") and any(
                a == "--privileged" or re.match(r"^(-v|--volume|--mount)[= ]?(type=bind,)?(source=|src=)?/(:|,|$)", a)
                or a in ("--pid=host", "--userns=host") for a in args) or (
                prog in ("docker", "podman") and any(a in ("-v", "--volume") and i + 1 < len(args) and
                                                     re.match(r"^/(:|$)", args[i + 1]) for i, a in enumerate(args))):
            return Verdict(DENY, "%s gives a container the whole host" % prog)
        if prog in ("awk", "gawk", "mawk", "nawk", "busybox-awk"):
            program = _operands(args, takes_value={"-F", "-v", "-f", "--field-separator", "--assign", "--file"})
            if program and "-f" not in args:
                for m in re.finditer(r"\|\s*\"([^\"]+)\"", program[0]):
                    sink = m.group(1).split()
                    if sink and (is_interpreter(prog_name(sink[0])) and len(sink) == 1 or
                                 prog_name(sink[0]) in SHELLS and "-s" in sink):
                        return Verdict(DENY, "awk pipes its data into %s, which runs it as code" % sink[0])
                return self._deny_embedded(program[0], depth)
        if prog in ("sed", "gsed"):
            # one way to read each character: `(?:[0-9,]+)*` and a backslash matched both as `\\.` and as `.`
            # made these exponential in a run of digits or backslashes (thirty took minutes)
            for script in _operands(args, takes_value={"-e", "-f", "-l", "--expression", "--file"})[:1] + \
                    [args[i + 1] for i, a in enumerate(args) if a in ("-e", "--expression") and i + 1 < len(args)]:
                for m in re.finditer(r"(?:^|[;\n{}])\s*(?:[0-9,$!~+]|/[^/]*/[IM]*)*\s*e\s+([^;\n}]+)", script):
                    if (verdict := self._deny_code(m.group(1), depth + 1)) is not None:
                        return verdict
                for m in re.finditer(r"(?:^|[;\n{}]|/[a-z]*)\s*[wW]\s+(\S+)", script):
                    if reason := self._protected(m.group(1)):
                        return Verdict(DENY, "sed writes to %s (%s)" % (reason, m.group(1)))
                for m in re.finditer(r"s([^\w\s\\])((?:\\.|(?!\1)[^\\\n])*)\1((?:\\.|(?!\1)[^\\\n])*)\1([a-zA-Z0-9]*)", script):
                    if "e" in m.group(4) or "w" in m.group(4):
                        replacement = re.sub(r"\\(.)", r"\1", m.group(3))
                        if (verdict := self._deny_code(replacement, depth + 1)) is not None:
                            return verdict
        if prog in ("vi", "vim", "nvim", "ex", "view", "gvim", "emacs", "less", "more", "man"):
            for i, a in enumerate(args):
                text = args[i + 1] if a in ("-c", "--cmd", "--eval", "-e") and i + 1 < len(args) else \
                    a[1:] if a.startswith("+") else None
                if text and "!" in text:
                    if (verdict := self._deny_code(text.split("!", 1)[1], depth + 1)) is not None:
                        return verdict
        return None

    def _deny_interpreter(self, prog, args, depth, piped, stdin_code):
        if prog == "eval":
            if any("$" in a or "`" in a or "<(" in a for a in args):
                return Verdict(DENY, "eval of substituted input is never run")
            return self._deny_code(" ".join(args), depth)
        if prog in ("source", "."):
            if piped and (not args or args[0] in ("/dev/stdin", "-", "/proc/self/fd/0", "/dev/fd/0")):
                return Verdict(DENY, "data piped into %s runs as code" % prog)
            return None
        if (code := _code_argument(prog, args)) is not None:
            if not code.strip():
                return Verdict(DENY, "%s without its code (under xargs or parallel the input becomes the code)" % prog)
            if prog in SHELLS and "{}" in code:
                return Verdict(DENY, "%s -c runs input data as shell code ({} inside the code)" % prog)
            if prog in SHELLS:
                positional = args[args.index(code) + 1:] if code in args else []
                if positional and re.search(r"\$\{?[0-9@*]", code):  # sh -c '$0 -rf /' rm: the arguments
                    filled = code
                    for n, value in enumerate(positional[:10]):
                        filled = re.sub(r"\$\{?%d\}?" % n, lambda m, v=value: v, filled)
                    filled = re.sub(r"\"?\$\{?[@*]\}?\"?", lambda m: " ".join(positional[1:]), filled)
                    if (verdict := self._deny_code(filled, depth)) is not None:
                        return verdict
                return self._deny_code(code, depth)
            return self._deny_embedded(code, depth)
        ops = _operands(args, takes_value={"-o", "+o", "-O", "+O", "--rcfile", "--init-file", "-W", "-X"})
        if ops and ops[0].startswith(("<(", "/dev/fd/", "/proc/self/fd/")) and ops[0] != "/dev/fd/0":
            return Verdict(DENY, "%s runs another command's output as code (%s)" % (prog, ops[0]))
        reads_code = _reads_stdin(prog, args)
        if piped and reads_code:
            return Verdict(DENY, "data piped into %s runs as code (a shell or interpreter reading its "
                                 "standard input)" % prog)
        if reads_code and stdin_code is not None:
            return self._deny_code(stdin_code, depth) if prog in SHELLS else self._deny_embedded(stdin_code, depth)
        return None

    def _deny_embedded(self, code, depth):
        """Code for another interpreter (python -c, perl -e): the shell commands in its string literals."""
        if (raw := self._raw_deny(" ".join(code.split()))) is not None:
            return raw
        if "/proc" in code and re.search(r"environ|\bmem\b|/root\b|/cwd\b", code):
            return Verdict(DENY, "code that reads another process's environment or memory through /proc")
        for m in re.finditer(r"'([^'\n]{2,})'|\"([^\"\n]{2,})\"|`([^`\n]{2,})`", code):
            literal = m.group(1) or m.group(2) or m.group(3)
            try:
                script = ShellParser(_nfkc(literal), min(depth + 1, 20)).parse()
            except ShellSyntaxError:
                continue
            if (verdict := self._deny_script(script, depth + 1, {})) is not None:
                return verdict
        return None

    def _deny_wrapped(self, prog, args, depth, piped, stdin_code):
        """A wrapper's command: every suffix of its arguments is tried as the command it runs (so no
        misread option count can hide it), and code strings (-c, -S, watch's words) are parsed."""
        if prog == "xargs" or prog == "parallel":
            piped = False  # their standard input becomes arguments, not the command's input
            if stdin_code:  # known input (echo / | xargs rm -rf, xargs rm -rf <<< ~): as the arguments
                items = stdin_code.split()[:16]
                replace = [a for a in args if a in ("-I", "-i", "{}") or a.startswith(("-I", "--replace"))]
                for start in range(len(args)):
                    if args[start].startswith("-") or (start and args[start - 1] in ("-I", "-n", "-P", "-L", "-d",
                                                                                      "-s", "-E", "-a")):
                        continue
                    inner = args[start:]
                    tries = [[w.replace("{}", item) for w in inner] for item in items] if replace else \
                        [inner + items]
                    for argv in tries:
                        if (verdict := self._deny_argv(argv, depth + 1)) is not None:
                            return verdict
                    break
            stdin_code = None
        strings = []
        for i, a in enumerate(args):
            if a in ("-c", "--command", "-S", "--split-string", "-e") and i + 1 < len(args):
                strings.append(args[i + 1])
            elif a.startswith(("--command=", "--split-string=", "-S")) and len(a) > 2:
                strings.append(a.split("=", 1)[1] if "=" in a else a[2:])
            elif prog in ("trap", "alias"):
                strings.append(a.split("=", 1)[1] if prog == "alias" and "=" in a else a)
        if prog in CODE_WRAPPERS:
            strings.extend(args)
            strings.extend(" ".join(args[i:]) for i in range(1, min(len(args), 24)))
        if prog == "parallel" and ":::" in args:  # parallel 'cmd {}' ::: values
            at = args.index(":::")
            for value in args[at + 1:at + 9]:
                strings.extend(" ".join(args[:at]).replace("{}", value) for _ in (0,))
        for code in strings:
            if (verdict := self._deny_code(code, depth + 1)) is not None:
                return verdict
        if prog in ("trap", "alias"):
            return None
        for start in range(len(args)):
            if start > 40:
                break
            head = args[start]
            if not head or head.startswith("-") or head in (":::", "::::"):
                continue
            inner = args[start:]
            if prog == "xargs" and any(a in ("-I", "-i") or a.startswith(("-I", "--replace")) for a in args[:start]):
                inner = [a for a in inner]
            if (verdict := self._deny_argv(inner, depth + 1, piped, stdin_code)) is not None:
                return verdict
        return None

    def _deny_program(self, prog, args, depth):
        """The catastrophes of one program."""
        if prog in ("rm", "unlink", "rmdir", "shred", "srm", "trash", "trash-put", "gio"):
            if (verdict := self._deny_rm(prog, args)) is not None:
                return verdict
        check = {"find": self._deny_find, "git": self._deny_git, "scalar": self._deny_git, "hub": self._deny_git,
                 "rsync": self._deny_rsync}.get(prog)  # scalar and hub take git's -c (round 19g)
        if check is not None and (verdict := check(args, depth)) is not None:
            return verdict
        if prog == "dd":
            for a in args:
                if a.startswith("of="):
                    target = self._abs(a[3:])
                    if target and target.startswith("/dev/") and target not in SAFE_SINKS:
                        return Verdict(DENY, "dd onto a device (%s)" % a[3:])
                    if reason := self._protected(a[3:]):
                        return Verdict(DENY, "dd writes to %s (%s)" % (reason, a[3:]))
        if prog in ("chmod", "chown", "chgrp", "setfacl", "chattr", "chcon", "setfattr"):
            operands = _operands(args)
            for target in operands[1:] if prog not in ("setfacl",) else operands:
                if self._is_system_path(self._abs(target)):
                    return Verdict(DENY, "%s on a system path (%s)" % (prog, target))
        if prog in ("mv", "gmv"):
            for source in _operands(args, takes_value={"-t", "--target-directory", "-S", "--suffix"})[:-1]:
                if reason := self._catastrophic(source, True, tree_ok=True):
                    return Verdict(DENY, "mv moves %s away (%s)" % (reason, source))
        for target in _write_targets(prog, args):
            if reason := self._protected(target):
                return Verdict(DENY, "%s writes to %s (%s)" % (prog, reason, target))
        return None

    def _deny_rm(self, prog, args):
        flags, targets, end = set(), [], False
        for t in args:
            if not end and t == "--":
                end = True
            elif not end and t.startswith("--"):
                flags.add(t.split("=", 1)[0])
            elif not end and t.startswith("-") and len(t) > 1:
                flags.update(t[1:])
            else:
                targets.append(t)
        if any("--no-preserve-root".startswith(f) and len(f) > 5 for f in flags):
            return Verdict(DENY, "rm --no-preserve-root")
        recursive = bool(flags & {"r", "R"}) or any("--recursive".startswith(f) and len(f) > 4 for f in flags) or \
            prog in ("rmdir", "trash", "trash-put", "gio")
        for target in targets:
            if reason := self._catastrophic(target, recursive):
                return Verdict(DENY, "%s of %s (%s)" % ("recursive rm" if recursive else prog, reason, target))
            if protected := self._protected(target):
                return Verdict(DENY, "%s removes %s (%s)" % (prog, protected, target))
        return None

    def _catastrophic(self, text, recursive, tree_ok=False):
        """Why removing `text` would be a catastrophe: the root, the home directory, a system directory,
        the working directory or a directory above it; None when it is not one of those."""
        if not text or "$" in text:
            return None
        # `(?:\.+/)*\.*`: one way to read a run of dots (`(\.\.?/?)*` had exponentially many: fifty took minutes)
        if getattr(self, "_cwd", self.root) is None and (recursive or tree_ok) and \
                re.fullmatch(r"(?:\.+/)*\.*\*?|\.\*|\*/?", text):
            return "everything in a directory that cannot be known (after cd)"
        base = text
        while True:  # `dir/*`, `dir/.*`, `dir/{a,b}*`: the contents of dir are as bad as dir
            head, tail = os.path.split(base.rstrip("/") or "/")
            if tail and re.match(r"^[.]?[*?\[]", tail) and re.fullmatch(r"[.*?\[\]!^a-zA-Z0-9_-]*", tail):
                base = head or "."
                continue
            break
        whole = base != text
        if not (path := self._abs(base)):
            return None
        real = os.path.realpath(path)
        home = self.home.rstrip("/")
        for p in (path.rstrip("/") or "/", real):
            if p == "/":
                return "the root directory"
            if p == home:
                return "the home directory"
            if p in SYSTEM_ROOTS or os.path.dirname(p) == "/" or (
                    recursive and self._is_system_path(p) and not p.startswith(("/tmp/", "/var/tmp/"))):
                if recursive or whole:
                    return "a system directory"
            if (p == self.root and not tree_ok) or self.root.startswith(p.rstrip("/") + "/"):
                if recursive or (whole and p != self.root):
                    return "the working directory or a directory above it"
        return None

    def _deny_find(self, args, depth):
        starts, i = [], 0
        while i < len(args) and args[i] in ("-H", "-L", "-P") or (i < len(args) and args[i].startswith(("-D", "-O"))):
            i += 2 if args[i] == "-D" else 1
        while i < len(args) and not (args[i].startswith("-") and len(args[i]) > 1) and args[i] not in ("(", "!", ","):
            starts.append(args[i])
            i += 1
        starts = starts or ["."]
        expression = args[i:]
        destructive = any(a in ("-delete",) for a in expression)
        for j, a in enumerate(expression):
            if a in ("-fprint", "-fprint0", "-fprintf", "-fls") and j + 1 < len(expression):
                if reason := self._protected(expression[j + 1]):
                    return Verdict(DENY, "find %s writes to %s" % (a, reason))
            if a in ("-exec", "-execdir", "-ok", "-okdir"):
                inner = []
                for w in expression[j + 1:]:
                    if w in (";", "+"):
                        break
                    inner.append(w)
                for start in starts:
                    outside = bool(self._catastrophic(start, True, tree_ok=True))
                    fill = start if outside else "./{}"
                    if (verdict := self._deny_argv([w.replace("{}", fill) for w in inner], depth + 1)) is not None:
                        return verdict
                    if prog_name(inner[0] if inner else "") in ("rm", "shred", "unlink") and outside:
                        destructive = True
        if destructive:
            for start in starts:
                if reason := self._catastrophic(start, True, tree_ok=True):
                    return Verdict(DENY, "find deletes everything under %s (%s)" % (reason, start))
                if reason := self._protected(start):
                    return Verdict(DENY, "find deletes %s (%s)" % (reason, start))
        return None

    def _deny_rsync(self, args, depth):
        operands = _operands(args, takes_value={"-e", "--rsh", "-f", "--filter", "--exclude", "--include",
                                                "--rsync-path", "-T", "--temp-dir", "--backup-dir"})
        for i, a in enumerate(args):
            if a in ("-e", "--rsh", "--rsync-path") and i + 1 < len(args):
                if (verdict := self._deny_code(args[i + 1], depth + 1)) is not None:
                    return verdict
            elif a.startswith(("--rsh=", "--rsync-path=")):
                if (verdict := self._deny_code(a.split("=", 1)[1], depth + 1)) is not None:
                    return verdict
        deleting = any(a.startswith("--del") or a in ("--remove-source-files", "--remove-sent-files") for a in args)
        if deleting and len(operands) >= 2:
            if reason := self._catastrophic(operands[-1], True):
                return Verdict(DENY, "rsync --delete onto %s (%s)" % (reason, operands[-1]))
        return None

    def _deny_git(self, args, depth):
        settings, rest = _git_settings(args)
        if rest[:1] and rest[0] in _GIT_RUNNERS:  # `git difftool -x 'rm -rf …'`, `filter-branch --tree-filter`
            self._guess("git %s runs programs its arguments or configuration name: a person must approve it"
                        % rest[0])
        for value in settings:
            key = value.split("=", 1)[0].strip()
            if _GIT_HARMLESS_KEY.match(key):
                continue
            if _GIT_DANGEROUS_KEY.match(key):
                return Verdict(DENY, "git -c %s can run a program" % key)
            self._guess("git -c %s: only settings known to run and load nothing (user.*, color.*, "
                        "core.quotepath, …) are judged; a person must approve this one" % key)
        words = [a for a in args if not a.startswith("-")]
        for a in args:
            name = a.split("=", 1)[0]
            if a.startswith("--") and len(name) >= 6 and any(
                    option.startswith(name) for option in ("--upload-pack", "--receive-pack", "--exec",
                                                           "--exec-path", "--extcmd", "--template", "--tool")):
                return Verdict(DENY, "git %s runs a program chosen on the command line" % name)
            if "ext::" in a or a.startswith("fd::") or "::" in a and re.match(r"^[a-z]+::", a):
                return Verdict(DENY, "git with a remote helper that runs a command (%s)" % a)
        if "submodule" in words and "foreach" in words:
            return Verdict(DENY, "git submodule foreach runs a command in every submodule")
        if words[:1] and words[0] in ("config",) or "config" in words[:2]:
            setting = _operands(args[args.index("config") + 1:], takes_value={
                "-f", "--file", "--blob", "--type", "--default", "--comment", "--value"}) if "config" in args else []
            if setting[:1] and setting[0] in ("set", "add"):
                setting = setting[1:]
            if len(setting) >= 2 and _GIT_DANGEROUS_KEY.match(setting[0]) and not _GIT_HARMLESS_KEY.match(setting[0]):
                return Verdict(DENY, "git config %s can make git run a program" % setting[0])
        if "-u" in args and any(w in ("clone", "ls-remote") for w in words):
            return Verdict(DENY, "git -u (--upload-pack) runs a program chosen on the command line")
        for i, a in enumerate(args):
            if a in ("-x", "--exec") and i + 1 < len(args) and "rebase" in words:
                if (verdict := self._deny_code(args[i + 1], depth + 1)) is not None:
                    return verdict
        if "bisect" in words and "run" in words:
            return self._deny_argv(args[args.index("run") + 1:], depth + 1)
        return None

    # -- the normalised view: what the shell will make of the words --

    def _argvs(self, words, env, modes=("empty", "keep")):
        """The argument lists the words may become: brace expansion, field splitting ($IFS), ANSI-C
        quoting, NFKC, and variables — those set earlier in the script, HOME and PWD, and unknown ones
        both empty ("empty") and left as written ("keep")."""
        names = {v for w in words for v in w.variables}
        count = min(max([len(env[n]) for n in names if n in env] + [1]), 8)
        if len(words) > 256:  # the words past these are not judged (`rm -rf <254 words> *` was a confirm: 19g)
            self._guess("the command has more words than the policy judges (256): a person must approve it")
        out = []
        for mode in modes:
            for k in range(count):
                argv = []
                for word in words[:256]:
                    for tokens in bash_brace_expand(word, 64):
                        argv.extend(self._fields(tokens, word, env, mode, k))
                argv = [_nfkc(a) for a in argv]
                if argv not in out:
                    out.append(argv)
        return out

    def _fields(self, tokens, word, env, mode, k):
        fields, cur, started = [], "", False
        for text, kind in tokens:
            if kind in ("lit", "q"):
                cur, started = cur + text, True
            elif kind == "qx":
                cur, started = cur + self._value(text, env, mode, k), True
            else:
                ifs = env["IFS"][0] if env.get("IFS") else " \t\n"
                value = self._value(text, env, mode, k)
                pieces = re.split("[%s]+" % re.escape(ifs), value) if ifs else [value]
                cur += pieces[0]
                started = started or bool(pieces[0])
                for piece in pieces[1:]:
                    if started:
                        fields.append(cur)
                    cur, started = piece, bool(piece)
        if started:
            fields.append(cur)
        if word.tilde and fields and (fields[0] == "~" or fields[0].startswith("~/")):
            fields[0] = self.home + fields[0][1:]
        return fields

    def _value(self, src, env, mode, k):
        unknown = "" if mode == "empty" else src
        if src.startswith("$((") or src.startswith("<(") or src.startswith(">("):
            return unknown
        if re.fullmatch(r"\$\(\s*pwd\s*\)|`\s*pwd\s*`", src):
            return getattr(self, "_cwd", None) or self.root
        if src.startswith("$(") or src.startswith("`"):
            out = _trivial_output(src)
            return unknown if out is None else out
        inner = src[2:-1] if src.startswith("${") else src[1:]
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])", inner)
        if not m:
            return unknown
        name, rest = m.group(1), inner[m.end():]
        index = re.match(r"^\[([0-9@*]+)\]", rest)
        if index and name + index.group(0) in env:  # ${a[0]}, ${a[@]}
            name, rest = name + index.group(0), rest[index.end():]
        if name == "IFS":
            return env["IFS"][0] if env.get("IFS") else " "
        if name == "HOME":
            value = self.home
        elif name == "PWD":
            value = self.root
        elif name in env:
            value = env[name][k % len(env[name])]
        elif name.isdigit() or name in ("@", "*"):
            value = ""
        else:
            value = None
        if not rest:
            return unknown if value is None else value
        if op := re.match(r"^(:?[-=?+])(.*)$", rest, re.S):
            word = op.group(2).strip("'\"")
            if op.group(1).endswith("+"):
                return word if value else ("" if value is not None else unknown)
            return value if value else word
        return unknown

    def _abs(self, text):
        """An argument as an absolute, lexically normalised path ('' when it cannot be known)."""
        if not text or "$" in text or "`" in text or "\x00" in text:
            return ""
        if text == "~" or text.startswith("~/"):
            text = self.home + text[1:]
        elif text.startswith("~"):
            user, _, rest = text[1:].partition("/")
            try:
                import pwd
                text = os.path.join(pwd.getpwnam(user).pw_dir, rest)
            except (ImportError, KeyError, ValueError):
                return ""
        cwd = getattr(self, "_cwd", self.root)
        if cwd is None and not text.startswith("/"):
            return ""  # after `cd $X`: relative paths are unknown
        path = text if text.startswith("/") else os.path.join(cwd, text)
        norm = os.path.normpath(path)
        return "/" + norm.lstrip("/") if norm.startswith("//") else norm

    def _protected(self, text):
        """Why writing `text` is denied (a system directory, a key or start-up file in the home directory,
        the repository's hooks/config), looking through symbolic links and globs; None when it is not."""
        if not (path := self._abs(text)):
            return None
        candidates = [path, os.path.realpath(path),
                      os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))]
        if any(c in text for c in "*?["):
            matches, exhausted = bounded_glob(path, 64)
            if exhausted:
                return "%s, a pattern matching too many paths to check" % text
            for match in matches:
                candidates.extend((match, os.path.realpath(match)))
        for p in candidates:
            if reason := self._protected_path(p):
                return reason
        return None

    def _protected_path(self, p):
        conf = self.confinement
        return conf.runs_later(p) if _inside(p, self.root) else conf.reason(p, holding=False)

    def _is_system_path(self, path):
        if not path:
            return False
        base = path.rstrip("/") or "/"
        if _inside(os.path.realpath(base), self.root):
            return False
        if base in SYSTEM_ROOTS or base == self.home.rstrip("/") or self._protected_path(base):
            return True
        return any(base.startswith(root + "/") for root in SYSTEM_ROOTS
                   if root not in ("/", "/home", "/Users", "/opt", "/srv", "/mnt", "/media", "/run"))


# ---- Terminal: the policy, pass 2: only what is proven read-only ----

#: the longest command the policy judges: judging is linear, but a model can write megabytes, and a verdict
#: must come in well under a second whatever it writes (longer commands are denied)
MAX_COMMAND_LENGTH = 32768


class CommandPolicy(Denylist):
    """Judges a command line: deny (never runs), allow (proven read-only, inside the jail), or confirm."""

    def __init__(self, root, allowlist=DEFAULT_ALLOWLIST, custom_denylist=(), home=None, path=None):
        #: what is protected (Confinement.reason); `root` may be a working directory to make one of
        self.confinement = root if isinstance(root, Confinement) else Confinement(root, home=home)
        self.root = self.confinement.root
        entries = [e.split() for e in allowlist if e and e.strip()]
        #: read-only programs whose every option and operand is checked
        known = set(SAFE_OPTIONS) | {"git", "find"}
        self.allowlist = {e[0] for e in entries if len(e) == 1 and e[0] in known}
        #: configured command prefixes (`make test`, `pytest`): run unasked, confined by the sandbox
        self.prefixes = [e for e in entries if not (len(e) == 1 and e[0] in known)]
        self.custom = [_custom_rule(entry) for entry in custom_denylist if entry and entry.strip()]
        self.home = self.confinement.home
        #: the PATH commands are looked up in (the child's: the sandbox keeps PATH)
        self.path = path if path is not None else os.environ.get("PATH", os.defpath)
        #: while the denylist walks a script: the directory `cd` moved to (None once it cannot be known)
        self._cwd = self.root
        #: programs looked up on PATH during one judgement (_resolve)
        self._resolved = {}
        #: during one judgement, the words that could expand to an option: start -> (end, the text they run as)
        self._option_patterns = {}

    def judge(self, command):
        try:
            return self._judge(command)
        except (RecursionError, ValueError, IndexError, KeyError, TypeError, OSError) as exc:  # fail closed
            return Verdict(DENY, "the command could not be checked (%s: %s); it is not run"
                           % (type(exc).__name__, exc))

    def _judge(self, command):
        if not command or not command.strip():
            return Verdict(CONFIRM, "the command is empty")
        if len(command) > MAX_COMMAND_LENGTH:
            return Verdict(DENY, "the command is %d characters long, over the %d the policy checks; write long "
                                 "content with write_file" % (len(command), MAX_COMMAND_LENGTH))
        if "\x00" in command:
            return Verdict(DENY, "the command contains a NUL byte")
        if m := _CONTROL.search(command):
            return Verdict(DENY, "the command contains a control or invisible character (U+%04X)" % ord(m.group(0)))
        flat = " ".join(command.replace("\\\n", " ").split())
        try:
            script = parse_shell(command, offsets=True)
        except ShellSyntaxError as exc:
            raw = self._raw_deny(flat)
            return raw or Verdict(DENY, "cannot check the command (%s); it is not run: write it in plainer shell "
                                        "syntax" % exc)
        self._cwd = self.root
        self._resolved = {}
        self._guessed = None  #: _deny_tails' guess: a person must approve this command, in every mode
        verdict = self._deny_script(script, 0, {})
        self._cwd = self.root
        if verdict is None and not command.isascii():  # full-width and other look-alikes, as NFKC sees them
            try:
                verdict = self._deny_script(parse_shell(_nfkc(command)), 0, {})
            except ShellSyntaxError:
                pass
        if verdict is None:
            verdict = self._raw_deny(flat, always_only=True)
        run_as = None
        if verdict is None:
            self._option_patterns = {}
            verdict = self._script(script, 0)
            if verdict.level == ALLOW and not script.pipelines:
                verdict = Verdict(CONFIRM, "nothing to run")
            for start, (end, text) in sorted(self._option_patterns.items(), reverse=True):
                run_as = (run_as or command)[:start] + text + (run_as or command)[end:]
        if verdict.level != DENY and self._guessed:
            return Verdict(CONFIRM, self._guessed, script, run_as, person=True)
        return Verdict(verdict.level, verdict.reason, script, run_as)

    def _raw_deny(self, flat, always_only=False):
        for pattern, reason in (RAW_DENY[:1] + RAW_DENY[-1:]) if always_only else RAW_DENY:
            if pattern.search(flat):
                return Verdict(DENY, reason)
        for rule in self.custom:
            if rule[0] == "regex" and rule[1].search(flat):
                return Verdict(DENY, "matches the custom denylist entry %r" % rule[2])
        return None

    # -- pass 2: classification (allow only what is proven read-only) --

    def _script(self, script, depth):
        verdict = Verdict(ALLOW, "read-only commands inside the working directory")
        if depth > 10:
            return Verdict(CONFIRM, "commands are nested too deeply to check")
        commands = [c for pipeline in script.pipelines for c in pipeline.commands]
        for command in commands:
            one = self._classify(command, depth)
            if len(commands) == 1 and one.level == ALLOW and one.reason:
                verdict = one  # a single command: say why it is read-only
            verdict = verdict.worse(one)
            if getattr(command, "background", False):
                verdict = verdict.worse(Verdict(CONFIRM, "runs a command in the background"))
        return verdict

    def _classify(self, node, depth):
        if isinstance(node, FunctionDef):
            return Verdict(CONFIRM, "defines a shell function")
        if isinstance(node, Group):
            if node.kind == "case":
                return Verdict(CONFIRM, "a case statement")
            return self._script(node.script, depth + 1).worse(self._redirect_verdict(node.redirects, depth))
        return self._simple(node, depth)

    def _simple(self, simple, depth):
        verdict = Verdict(ALLOW, "")
        for word in simple.assigns + simple.words:
            for sub in word.subs:
                verdict = verdict.worse(self._script(sub, depth + 1))
        verdict = verdict.worse(self._redirect_verdict(simple.redirects, depth))
        if simple.assigns:
            verdict = verdict.worse(Verdict(CONFIRM, "sets environment variables for the command" if simple.words
                                            else "sets shell variables"))
        if not simple.words:
            return verdict
        for word in simple.words:
            if word.dynamic:
                return verdict.worse(Verdict(CONFIRM, "uses a shell expansion (%s): only a static command is "
                                                      "judged read-only" % word.text))
        words = _brace_words(simple.words)  # cat {README.md,/etc/passwd} is two operands
        if words is None:
            return verdict.worse(Verdict(CONFIRM, "brace expansion makes too many words to check"))
        simple = Simple()
        simple.words = words
        first = simple.words[0]
        if not first.text.isascii():
            return verdict.worse(Verdict(CONFIRM, "the program name has non-ASCII characters (%s)" % first.text))
        if (first.glob and first.text not in ("[", "[[")) or first.tilde or not first.text:
            return verdict.worse(Verdict(CONFIRM, "the program name is a pattern (%s)" % first.text))
        if first.text != "[[":  # [[ … ]] matches its patterns; it expands no file names
            find = False  # a find met so far (after a wrapper too: timeout 5 find . -name *.py)
            for before, word in zip(words, words[1:]):
                find = find or os.path.basename(before.text) == "find"
                if word.glob and word.text.startswith("-") and _option_name_open(word):
                    # an option with a pattern expands to more options (`sort -t -*` beside a file named
                    # --compress-program=sh): no rewrite keeps its meaning (round 18e)
                    return verdict.worse(Verdict(CONFIRM, "%s is an option with a pattern: it may expand to other "
                                                          "options" % word.text))
                if not _may_expand_to_option(word):
                    continue
                # INFO: `find . ?exec pytho?? ?c …` beside files named -exec, python3 and -c ran code as a read-only
                # find (attack round 18a). The pattern runs as ./?exec, so it expands to paths only, whatever files
                # exist by then (another tool may make one while this command starts)
                if word.start is None:  # in code the shell reads again (sh -c, a here-document): not rewritten
                    return verdict.worse(Verdict(CONFIRM, "the pattern %s may expand to a file named like an "
                                                          "option; write ./%s" % (word.text, word.text)))
                if find and before.text in FIND_PATTERNS and word.end is not None and not word.dynamic:
                    # find's own pattern (find . -name *.py), as it was meant, and judged: not the files it matches
                    self._option_patterns[word.start] = (word.end, shlex_quote(word.text))
                else:
                    self._option_patterns.setdefault(word.start, (word.start, "./"))
        texts = [w.text for w in simple.words]
        for entry in self.prefixes:
            if texts[:len(entry)] == entry and ("/" in entry[0] or self._resolve(entry[0]) is None):
                return verdict.worse(Verdict(ALLOW, "%s is on the configured allowlist" % " ".join(entry)))
        return verdict.worse(self._argv_verdict(simple.words, depth))

    def _argv_verdict(self, words, depth):
        name = words[0].text
        prog = os.path.basename(name)
        if prog in ("timeout", "nice", "nohup", "command", "time", "stdbuf", "env"):
            if (inner := _unwrap(prog, words[1:])) is None:
                return Verdict(CONFIRM, "%s with options that are not on its read-only list" % prog)
            if reason := self._resolve(name):
                return Verdict(CONFIRM, reason)
            if inner == "prints":
                return Verdict(ALLOW, "%s only prints" % prog)
            if not inner:
                return Verdict(CONFIRM, "%s without a command" % prog)
            return self._argv_verdict(inner, depth + 1)
        if prog == "printf" and len(words) > 1 and words[1].text.startswith("-v"):
            return self._evaluated(words, Verdict(CONFIRM, "printf -v sets a shell variable (PATH, IFS, or an "
                                                           "array subscript bash evaluates, $(…) included)"), depth)
        if name in _ALWAYS_READ_ONLY and any(_EVALUATED.search(w.text) for w in words[1:]):
            return self._evaluated(words, Verdict(CONFIRM, "%s may evaluate an operand as a variable name or "
                                                           "arithmetic, and bash runs the $(…) of an array subscript "
                                                           "even when it is quoted" % name), depth)
        if name in _ALWAYS_READ_ONLY and self._resolve(name) is None:
            return Verdict(ALLOW, "%s only tests" % name)
        if prog not in self.allowlist:
            return Verdict(CONFIRM, "%s is not on the read-only allowlist" % prog)
        if reason := self._resolve(name):
            return Verdict(CONFIRM, reason)
        if prog == "git":
            return self._git_verdict(words[1:])
        if prog == "find":
            return self._find_verdict(words[1:])
        if (spec := SAFE_OPTIONS[prog]) is None:
            return Verdict(ALLOW, "%s only prints its arguments" % prog)
        verdict, _, _ = self._options_verdict(prog, spec, words[1:])
        return verdict

    def _evaluated(self, words, verdict, depth):
        """Quoted words a builtin evaluates (an array subscript runs its $(…)): judged as the code they hold,
        so the denylist sees `test -v 'a[$(rm -rf ~)]'`."""
        for word in words[1:]:
            if _EVALUATED.search(word.text):
                try:
                    verdict = verdict.worse(self._script(parse_shell(": " + word.text), depth + 1))
                except ShellSyntaxError:
                    pass
        return verdict

    def _resolve(self, name):
        """_resolve_program, remembered for one judgement: `true;` 20,000 times looked PATH up 20,000 times."""
        memo = self._resolved
        if name not in memo:
            if len(memo) > 4096:
                memo.clear()
            memo[name] = self._resolve_program(name)
        return memo[name]

    def _resolve_program(self, name):
        """None when `name` runs a program from a system or PATH directory outside the working tree; else
        why not (a file in the tree, `./ls`, a relative or in-tree PATH entry, not found)."""
        if "/" in name:
            if not name.startswith("/"):
                return "%s runs a file from the working directory, not a system program" % name
            real = os.path.realpath(name)
            directory = os.path.dirname(os.path.normpath(name))
            trusted = {os.path.normpath(e) for e in self.path.split(os.pathsep) if e.startswith("/")}
            trusted.update(("/bin", "/usr/bin", "/sbin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"))
            if _inside(real, self.root) or directory not in trusted or not os.path.isfile(real):
                return "%s is not a program in a system or PATH directory" % name
            return None
        for entry in self.path.split(os.pathsep):
            if not entry.startswith("/"):
                return "PATH has a relative entry (%r): %s could be a file in the working directory" % (entry, name)
            if _inside(os.path.realpath(entry), self.root):
                return "PATH has an entry inside the working directory (%s): %s could be a file there" % (entry, name)
            candidate = os.path.join(entry, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                if _inside(os.path.realpath(candidate), self.root):
                    return "%s resolves to a file in the working directory" % name
                return None
        if name in SHELL_BUILTINS:
            return None
        return "%s is not found on PATH" % name

    def _options_verdict(self, prog, spec, args):
        """(verdict, operand words, option names seen): options parsed as getopt_long does."""
        operands, values, seen, i, end = [], [], set(), 0, False
        while i < len(args):
            w = args[i]
            t = w.text
            i += 1
            if end or t == "-" or not t.startswith("-") or (spec.operands == "date" and t.startswith("+")):
                operands.append(w)
                continue
            if t == "--":
                end = True
                continue
            if w.tilde or (w.glob and self._glob_matches(t)):
                return Verdict(CONFIRM, "%s: an option with a pattern that matches files (%s)" % (prog, t)), [], seen
            if t.startswith("--"):
                name, eq, value = t[2:].partition("=")
                if name in spec.longs:
                    kind = spec.longs[name]
                    if kind is None and eq:
                        return Verdict(CONFIRM, "%s --%s takes no value" % (prog, name)), [], seen
                    value_word = make_word(value) if eq else None
                    if kind in ("=", "=@") and not eq:
                        if i >= len(args):
                            return Verdict(CONFIRM, "%s --%s needs a value" % (prog, name)), [], seen
                        value_word, i = args[i], i + 1
                    if kind == "=@" and value_word is not None:
                        values.append(value_word)
                    seen.add(name)
                    continue
                for bad, reason in spec.bad.items():
                    if len(bad) > 1 and name and bad.startswith(name):
                        return Verdict(CONFIRM, reason + ("" if bad == name else " (--%s abbreviates --%s)"
                                                          % (name, bad))), [], seen
                return Verdict(CONFIRM, "%s option --%s is not on its list of read-only options" % (prog, name)), \
                    [], seen
            if spec.digits and t[1:].isdigit():
                seen.add("n")
                continue
            j = 1
            while j < len(t):
                c = t[j]
                if c in spec.bad:
                    return Verdict(CONFIRM, spec.bad[c]), [], seen
                if c in spec.flags:
                    seen.add(c)
                    j += 1
                    continue
                if c in spec.oargs:
                    seen.add(c)
                    break
                if c in spec.args or c in spec.pargs:
                    if j + 1 < len(t):
                        value_word = make_word(t[j + 1:])
                    elif i < len(args):
                        value_word, i = args[i], i + 1
                    else:
                        return Verdict(CONFIRM, "%s -%s needs a value" % (prog, c)), [], seen
                    if c in spec.pargs:
                        values.append(value_word)
                    seen.add(c)
                    break
                return Verdict(CONFIRM, "%s option -%s is not on its list of read-only options" % (prog, c)), \
                    [], seen
        if spec.operands == "grep" and not seen & {"e", "f", "regexp", "file"} and operands:
            operands = operands[1:]  # the pattern
        elif spec.operands == "date":
            for w in operands:
                if not w.text.startswith("+"):
                    return Verdict(CONFIRM, "date %s sets the clock" % w.text), [], seen
            operands = []
        elif spec.operands == "uniq" and len(operands) > 1:
            return Verdict(CONFIRM, "uniq with two file operands writes the second"), [], seen
        elif spec.operands == "none":
            operands = []
        for w in operands + values:
            if reason := self._operand_reason(w):
                return Verdict(CONFIRM, "%s reads %s" % (prog, reason)), [], seen
        if seen & spec.walk:
            for w in (operands or [make_word(".")]):
                if self._escapes(w.text):
                    return Verdict(CONFIRM, "%s follows symbolic links out of the working directory (under %s)"
                                   % (prog, w.text)), [], seen
        return Verdict(ALLOW, "%s is read-only and stays in the working directory" % prog), operands, seen

    def _glob_matches(self, text):
        import glob
        matches, exhausted = bounded_glob(os.path.join(glob.escape(self.root), text), 1)
        return bool(matches) or exhausted  # not known: as if it matched

    def _operand_reason(self, word):
        """None when the path operand resolves inside the working directory (after symbolic links and
        glob expansion); else what is wrong with it."""
        import glob
        text = word.text
        if word.dynamic:
            return "%s, a path that cannot be known before it runs" % text
        if word.tilde and text.startswith("~"):
            if text == "~" or text.startswith("~/"):
                text = self.home + text[1:]
            else:
                return "%s (~user cannot be resolved)" % text
        if word.glob:
            if re.search(r"(^|/)\.[*?\[]", text):
                return "%s, a pattern that matches .. (outside the working directory)" % text
            pattern = text if text.startswith("/") else os.path.join(glob.escape(self.root), text)
            matches, exhausted = bounded_glob(pattern, 2001)
            if exhausted or len(matches) > 2000:
                return "%s, a pattern matching too many files to check" % text
            paths = matches or [text]
        else:
            paths = [text]
        for p in paths:
            real = os.path.realpath(p if p.startswith("/") else os.path.join(self.root, p))
            if not _inside(real, self.root):
                return "%s, outside the working directory" % (text if p == text else "%s (%s)" % (text, p))
        return None

    def _escapes(self, text):
        """Does a recursion that follows symbolic links from `text` leave the working directory?"""
        start = os.path.realpath(os.path.join(self.root, text))
        if not _inside(start, self.root):
            return True
        for path, entries in _tree(start, 20000, lambda entry: True):  # too large to check (None): fail closed
            if path is None or any(e.is_symlink() and not _inside(os.path.realpath(e.path), self.root) for e in entries):
                return True
        return False

    def _find_verdict(self, args):
        i, walk = 0, False
        while i < len(args) and args[i].text in ("-H", "-L", "-P"):
            walk = walk or args[i].text == "-L"
            i += 1
        starts = []
        while i < len(args) and not (args[i].text.startswith("-") and len(args[i].text) > 1) and \
                args[i].text not in ("(", "!", ","):
            starts.append(args[i])
            i += 1
        while i < len(args):
            t = args[i].text
            if t == "-follow":
                walk = True
                i += 1
                continue
            if t in FIND_BAD:
                return Verdict(CONFIRM, FIND_BAD[t])
            kind = FIND_SAFE.get(t, 1 if re.match(r"^-newer[amcBt]{2}$", t) else None)
            if kind is None:
                return Verdict(CONFIRM, "find %s is not on its list of read-only tests" % t)
            if kind == "path":
                if i + 1 >= len(args):
                    return Verdict(CONFIRM, "find %s needs a file" % t)
                if reason := self._operand_reason(args[i + 1]):
                    return Verdict(CONFIRM, "find reads %s" % reason)
            i += 1 + (1 if kind else 0)
        for w in starts:
            if reason := self._operand_reason(w):
                return Verdict(CONFIRM, "find searches %s" % reason)
        if walk and any(self._escapes(w.text) for w in (starts or [make_word(".")])):
            return Verdict(CONFIRM, "find -L follows symbolic links out of the working directory")
        return Verdict(ALLOW, "find only lists files inside the working directory")

    def _git_verdict(self, args):
        i, dirs = 0, [self.root]
        while i < len(args) and args[i].text.startswith("-"):
            t = args[i].text
            if t == "-C" and i + 1 < len(args):
                if reason := self._operand_reason(args[i + 1]):
                    return Verdict(CONFIRM, "git -C %s" % reason)
                # each -C is taken from the one before, as git takes it (-C a -C b is a/b: round 18e)
                dirs.append(os.path.realpath(os.path.join(dirs[-1], args[i + 1].text)))
                if not _inside(dirs[-1], self.root):
                    return Verdict(CONFIRM, "git -C leads outside the working directory (%s)" % dirs[-1])
                i += 2
                continue
            if t in ("--no-pager", "-P", "--no-optional-locks", "--literal-pathspecs", "--no-replace-objects",
                     "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--no-advice"):
                i += 1
                continue
            return Verdict(CONFIRM, "git %s is not a read-only git option" % t)
        if i >= len(args):
            return Verdict(CONFIRM, "git without a subcommand")
        sub = args[i].text
        if (spec := GIT_SPECS.get(sub)) is None:
            return Verdict(CONFIRM, "git %s is not one of the read-only git commands (status, diff, log, show, "
                                    "branch)" % sub)
        rest = args[i + 1:]
        if sub == "branch":
            verdict, _, seen = self._options_verdict("git branch", spec, rest)
            names = [w for w in rest if not w.text.startswith("-")]
            if verdict.level == ALLOW and names and not seen & {"list", "l"}:
                return Verdict(CONFIRM, "git branch NAME creates a branch")
        else:
            verdict, _, _ = self._options_verdict("git " + sub, spec, rest)
        if verdict.level != ALLOW:
            return verdict
        if any("%G" in w.text for w in rest if w.text.startswith(("--format", "--pretty", "%"))) or any(
                "%G" in b.text for a, b in zip(rest, rest[1:]) if a.text in ("--format", "--pretty")):
            # a signature's placeholder runs gpg, as --show-signature does (round 19g)
            return Verdict(CONFIRM, "git %s with a signature placeholder (%%G) runs gpg" % sub)
        if reason := _git_config_runs(dirs, self.confinement.git(self.path)):
            return Verdict(CONFIRM, "the repository's git configuration may run commands (%s)" % reason)
        return Verdict(ALLOW, "git %s only reads the repository" % sub)

    def _redirect_verdict(self, redirects, depth):
        verdict = Verdict(ALLOW, "")
        for op, target, body, live in redirects:
            for word in (target, live):
                if word is not None:
                    for sub in word.subs:
                        verdict = verdict.worse(self._script(sub, depth + 1))
            if op in ("<<", "<<-") or target is None:
                continue
            if target.dynamic:
                verdict = verdict.worse(Verdict(CONFIRM, "the redirection target comes from an expansion (%s)"
                                                % target.text))
                continue
            if op == "<<<":
                continue
            if op in (">&", "<&") and re.fullmatch(r"\d*-?", target.text):
                continue
            if op == "<":
                if reason := self._operand_reason(target):
                    verdict = verdict.worse(Verdict(CONFIRM, "reads %s" % reason))
                continue
            if self._abs(target.text) in SAFE_SINKS and op not in ("<>",):
                continue
            verdict = verdict.worse(Verdict(CONFIRM, "writes to a file (%s %s)" % (op, target.text)))
        return verdict


def _printed(node):
    """What a static `echo …` / `printf …` prints (a pipeline's known data), or None."""
    if isinstance(node, Simple) and node.words and not node.redirects and not any(w.dynamic for w in node.words):
        source = " ".join(shlex_quote(w.text) for w in node.words)
        return _trivial_output("$(%s)" % source)
    return None


def shlex_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def _brace_words(words, limit=1024):
    """The words after brace expansion, as the shell makes them (each result a word of its own, with its
    own glob and tilde), or None when there would be more than `limit`."""
    out = []
    for word in words:
        variants = bash_brace_expand(word, limit + 1)
        if len(variants) == 1 and not any(t == "{" and k == "lit" for t, k in variants[0]):
            out.append(word)
            continue
        for tokens in variants:
            w = Word()
            w.parts = list(tokens)
            w.text = "".join(t for t, _ in tokens)
            w.quoted, w.dynamic, w.subs, w.variables = word.quoted, word.dynamic, word.subs, word.variables
            w.glob = any(k == "lit" and t in "*?[" for t, k in tokens)
            w.tilde = bool(tokens) and tokens[0] == ("~", "lit")
            w.start = word.start  # ./ before the braces is ./ before every word they make
            out.append(w)
        if len(out) > limit:
            return None
    return out


#: find's tests whose value is a pattern find matches itself
FIND_PATTERNS = {"-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-lname", "-ilname", "-regex",
                 "-iregex"}


def _option_name_open(word):
    """Does a pattern in this option-like word come before its name is fixed? `--include=*.py` expands to
    --include= options only (its name and '=' are literal); `-*`, `--*`, `-t*` may expand to any option."""
    prefix = []
    for text, kind in word.parts:
        if kind == "lit" and text in "*?[":
            break
        prefix.append(text)
    prefix = "".join(prefix)
    return prefix != word.text and not (prefix.startswith("--") and "=" in prefix)


def _may_expand_to_option(word):
    """Can pathname expansion make `word` begin with '-' (a file named like an option)? It can when the word
    begins with an unquoted * or ?, or with a bracket expression that matches '-' (negated, a class, '-' itself,
    or a range over it)."""
    parts = [p for p in word.parts if p[0]]  # '' before a pattern is nothing: ''?delete is ?delete (round 18e)
    if not word.glob or not parts or parts[0] != ("[", "lit") and parts[0] not in (("*", "lit"), ("?", "lit")):
        return False
    if parts[0][0] != "[":
        return True
    text = word.text
    i = 1
    if i < len(text) and text[i] in "!^":
        return True
    end = text.find("]", i + 1)  # a ] first in the expression is one of its characters
    if end == -1:
        return False  # no bracket expression: a literal [
    members = text[i:end]
    if "[" in members:  # [[:punct:]] and its kin: not worked out, as if it matched
        return True
    j = 0
    while j < len(members):
        if j + 2 < len(members) and members[j + 1] == "-":
            if members[j] <= "-" <= members[j + 2]:
                return True
            j += 3
            continue
        if members[j] == "-":
            return True
        j += 1
    return False


def _value_word(word):
    """The value of an assignment word (NAME=VALUE) as a word of its own."""
    value, seen = Word(), False
    for text, kind in word.parts:
        if seen:
            value.parts.append((text, kind))
        elif kind == "lit" and text == "=":
            seen = True
    value.text = "".join(t for t, _ in value.parts)
    value.variables = word.variables
    return value


def _trivial_output(src):
    """What `$(echo rm)`, `$(printf '\\x72m')` or `$(echo cm0= | base64 -d)` print; None for anything else."""
    body = src[2:-1] if src.startswith("$(") else src[1:-1]
    try:
        script = parse_shell(body)
    except ShellSyntaxError:
        return None
    if len(script.pipelines) != 1 or not 1 <= len(script.pipelines[0].commands) <= 2:
        return None
    commands = script.pipelines[0].commands
    if not all(isinstance(c, Simple) and c.words and not c.redirects and not c.assigns and
               not any(w.dynamic for w in c.words) for c in commands):
        return None
    texts = [w.text for w in commands[0].words]
    if texts[0] == "echo":
        args = texts[1:]
        while args and args[0] in ("-n", "-e", "-E", "-ne", "-en"):
            args = args[1:]
        out = " ".join(args)
    elif texts[0] == "printf" and len(texts) > 1:
        out = ansi_c_decode(texts[1])
        for arg in texts[2:]:
            out = out.replace("%s", arg, 1)
    else:
        return None
    if len(commands) == 2:
        decoder = [w.text for w in commands[1].words]
        if decoder[0] in ("base64", "basenc") and any(a in ("-d", "--decode", "-D") for a in decoder[1:]):
            import base64
            import binascii
            try:
                out = base64.b64decode(out.strip() + "==="[:(4 - len(out.strip()) % 4) % 4]).decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                return None
        elif decoder[0] == "rev":
            out = "\n".join(line[::-1] for line in out.split("\n"))
        else:
            return None
    return out.rstrip("\n")


def _unwrap(prog, words):
    """The command a plain wrapper (timeout, nice, nohup, command, time, stdbuf, env) runs, when its options
    are all understood; "prints" for `command -v`; None for anything else."""
    i = 0
    if prog == "timeout":
        while i < len(words) and words[i].text.startswith("-"):
            t = words[i].text
            if t in ("-s", "-k", "--signal", "--kill-after"):
                i += 2
            elif t.startswith(("--signal=", "--kill-after=")) or t in ("--preserve-status", "--foreground", "-v",
                                                                       "--verbose") or re.match(r"^-[sk].", t):
                i += 1
            else:
                return None
        if i >= len(words) or not re.match(r"^\d+(\.\d+)?[smhd]?$", words[i].text):
            return None
        return words[i + 1:]
    if prog == "nice":
        while i < len(words) and words[i].text.startswith("-"):
            t = words[i].text
            if t == "-n":
                i += 2
            elif re.match(r"^(-n)?-?\d+$", t) or re.match(r"^--adjustment=-?\d+$", t):
                i += 1
            else:
                return None
        return words[i:]
    if prog == "command":
        texts = [w.text for w in words]
        if texts[:1] in (["-v"], ["-V"]):
            return "prints"
        if texts[:1] == ["-p"]:
            return words[1:]
        return None if texts[:1] and texts[0].startswith("-") else words
    if prog == "time":
        return words[1:] if words[:1] and words[0].text == "-p" else (
            None if words[:1] and words[0].text.startswith("-") else words)
    if prog == "stdbuf":
        while i < len(words) and words[i].text.startswith("-"):
            t = words[i].text
            if t in ("-i", "-o", "-e"):
                i += 2
            elif re.match(r"^(-[ioe].|--(input|output|error)=.)", t):
                i += 1
            else:
                return None
        return words[i:]
    if prog == "nohup" or prog == "env":
        return None if not words or words[0].text.startswith("-") or "=" in words[0].text else words
    return None


def _operands(args, takes_value=()):
    """The operands of a string argument list: options (and the values of `takes_value` options) skipped."""
    out, end, skip = [], False, False
    for a in args:
        if skip:
            skip = False
        elif not end and a == "--":
            end = True
        elif not end and a.startswith("-") and len(a) > 1:
            skip = a in takes_value
        else:
            out.append(a)
    return out


def _write_targets(prog, args):
    """The files a writing program changes (or, for mv, moves away; for ln, links to)."""
    targets = []
    if prog in ("cp", "mv", "install", "ln", "rsync", "scp", "rcp", "gcp", "gmv", "ginstall", "link"):
        ops = _operands(args, takes_value={"-t", "--target-directory", "-S", "--suffix", "-m", "--mode", "-o",
                                           "--owner", "-g", "--group", "-e", "--rsh", "-f", "--filter", "-i", "-P",
                                           "-F", "-l", "-c", "--exclude", "--include", "--backup-dir"})
        directory = None
        for i, a in enumerate(args):
            if a in ("-t", "--target-directory") and i + 1 < len(args):
                directory = args[i + 1]
            elif a.startswith("--target-directory="):
                directory = a.split("=", 1)[1]
            elif prog in ("cp", "mv", "install", "ln", "gcp", "gmv") and re.match(r"^-[a-zA-Z]*t.", a) and \
                    not a.startswith("--"):
                directory = a[a.index("t", 1) + 1:]
        if directory is not None:
            targets.append(directory)
            if prog in ("mv", "gmv", "ln"):
                targets.extend(ops)
        elif ops:
            targets.append(ops[-1])
            if prog in ("mv", "gmv", "ln", "link") or (prog == "rsync" and "--remove-source-files" in args):
                targets.extend(ops[:-1])
    elif prog in ("tee", "touch", "truncate", "shred", "rmdir", "unlink", "mkdir", "mkfifo", "mknod", "chmod",
                  "chown", "chgrp", "chattr", "setfacl", "fallocate", "sponge", "split", "csplit", "mktemp"):
        targets = _operands(args, takes_value={"-s", "--size", "-r", "--reference", "-m", "--mode", "-o", "-l",
                                               "--length", "-d", "-b", "-n", "-f", "-p", "--prefix"})
    elif prog in ("sed", "gsed", "perl"):
        in_place = any(a == "--in-place" or a.startswith("--in-place=") or
                       (re.match(r"^-[a-zA-Z]*i", a) and not a.startswith("--")) for a in args)
        if in_place:
            ops = _operands(args, takes_value={"-e", "--expression", "-f", "--file", "-l", "-E", "-M", "-m", "-I"})
            scripted = any(a in ("-e", "--expression", "-f", "--file", "-E") or a.startswith(("--expression=",
                                                                                              "--file="))
                           or (re.match(r"^-[a-zA-Z]*[eE]", a) and not a.startswith("--")) for a in args)
            targets = ops if scripted else ops[1:]
    elif prog in ("curl", "wget", "aria2c", "tar", "unzip", "bsdtar", "7z", "cpio", "patch", "git", "ssh-keygen",
                  "openssl", "gpg", "sqlite3", "xxd", "base64", "sort", "uniq", "tree", "find", "gzip", "gunzip"):
        for i, a in enumerate(args):
            if a in ("-o", "--output", "-O", "--output-document", "-P", "--directory-prefix", "-C", "--directory",
                     "-d", "--dir", "-f", "--file", "--output-dir", "-out", "--out") and i + 1 < len(args):
                targets.append(args[i + 1])
            elif re.match(r"^--(output|output-document|directory-prefix|directory|dir|output-dir|file)=", a):
                targets.append(a.split("=", 1)[1])
            elif re.match(r"^-[oOPCd]./?", a) and not a.startswith("--"):
                targets.append(a[2:])
        if prog == "git" and "clone" in args:
            targets.extend(_operands(args)[-1:])
        if prog == "uniq":
            targets.extend(_operands(args)[1:2])
    if prog in ("dd",):
        targets.extend(a[3:] for a in args if a.startswith("of="))
    return targets


def _code_argument(prog, args):
    """The code an interpreter is given on its command line (sh -c CODE, python -c, perl -e …), or None."""
    if prog in SHELLS:
        options, ops = [], []
        skip = False
        for a in args:
            if skip:
                skip = False
                continue
            if not ops and a[:1] in "-+" and len(a) > 1 and a != "--":
                options.append(a)
                skip = a in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file")
                continue
            ops.append(a)
        if any("c" in o[1:] and not o.startswith("--") for o in options):
            return ops[0] if ops else ""
        return None
    flags = {"python": ("-c",), "pypy": ("-c",), "perl": ("-e", "-E"), "ruby": ("-e",), "node": ("-e", "-p",
             "--eval", "--print"), "nodejs": ("-e", "-p", "--eval", "--print"), "deno": ("eval",), "bun": ("-e",
             "--eval"), "php": ("-r",), "lua": ("-e",), "luajit": ("-e",), "Rscript": ("-e",), "R": ("-e",),
             "pwsh": ("-c", "-Command", "-command"), "powershell": ("-c", "-Command"), "osascript": ("-e",),
             "julia": ("-e", "-E"), "tclsh": (), "expect": ("-c",), "psql": ("-c", "--command"),
             "mysql": ("-e", "--execute"), "mariadb": ("-e", "--execute"), "gdb": ("-ex", "--eval-command"),
             "irb": ("-e",), "elixir": ("-e",), "erl": ("-eval",), "groovy": ("-e",), "guile": ("-c",),
             "sqlite3": ()}
    base = prog if prog in flags else re.sub(r"[0-9.]+$", "", prog)
    codes = []
    for i, a in enumerate(args):
        for flag in flags.get(base, ("-c", "-e")):
            if a == flag and i + 1 < len(args):
                codes.append(args[i + 1])
            elif flag.startswith("--") and a.startswith(flag + "="):
                codes.append(a.split("=", 1)[1])
            elif len(flag) == 2 and a.startswith(flag) and len(a) > 2 and not a.startswith("--"):
                codes.append(a[2:])
            elif len(flag) == 2 and re.match(r"^-[a-zA-Z]*%s$" % flag[1], a) and i + 1 < len(args):
                codes.append(args[i + 1])  # perl -pe CODE, python -Bc CODE
    if base == "sqlite3":
        codes.extend(_operands(args)[1:])
    return "\n".join(codes) if codes else None


def _reads_stdin(prog, args):
    """Does a shell or interpreter take its program from standard input?"""
    base = prog if prog in _STDIN_COMMANDS else re.sub(r"[0-9.]+$", "", prog)
    if base == "crontab":
        ops = _operands(args, takes_value={"-u"})
        return not any(a in ("-l", "-r", "-e") for a in args) and (not ops or ops == ["-"])
    if base in _STDIN_COMMANDS:
        if base == "sqlite3":
            return len(_operands(args)) <= 1
        if base == "at" or base == "batch":
            return "-f" not in args
        return not any(a in ("-c", "--command", "-f", "--file", "-e", "--execute", "-batch") for a in args)
    if _code_argument(prog, args) is not None:
        return False
    if prog in SHELLS:
        if any(a == "-s" or (re.match(r"^-[a-zA-Z]*s", a) and not a.startswith("--")) for a in args):
            return True
        ops = _operands(args, takes_value={"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
    else:
        if any(a in ("-m", "-r", "--require", "-M") for a in args):
            return False
        ops = _operands(args, takes_value={"-W", "-X", "-I", "-r", "--require", "-M"})
    return not ops or ops[0] in ("-", "/dev/stdin", "/proc/self/fd/0", "/dev/fd/0")


def _script_downloads(script):
    """Does a (substitution) script run a downloader anywhere?"""
    for pipeline in script.pipelines:
        for command in pipeline.commands:
            if isinstance(command, Simple) and command.words:
                if any(prog_name(w.text) in DOWNLOADERS for w in command.words[:4]):
                    return True
                if any(_script_downloads(s) for w in command.words for s in w.subs):
                    return True
            elif isinstance(command, Group) and _script_downloads(command.script):
                return True
    return False


def _calls_itself(func):
    body = func.body
    scripts = [body.script] if isinstance(body, Group) else []
    for script in scripts:
        for pipeline in script.pipelines:
            names = [c.words[0].text for c in pipeline.commands if isinstance(c, Simple) and c.words]
            if func.name in names and (len(pipeline.commands) > 1 or any(
                    getattr(c, "background", False) for c in pipeline.commands)):
                return True
    return False


def _custom_rule(entry):
    """'sudo' or 'rm -rf' (program plus required flags/words), or 're:REGEX' on the whole command."""
    entry = entry.strip()
    if entry.startswith("re:"):
        return ("regex", re.compile(entry[3:]), entry)
    words = entry.split()
    return ("words", words, entry)


def _matches_custom(rule, program, texts):
    words = rule[1]
    if os.path.basename(words[0]) != program:
        return False
    flags = set()
    for t in texts:
        if t.startswith("--"):
            flags.add(t)
        elif t.startswith("-"):
            flags.update("-" + c for c in t[1:])
    for want in words[1:]:
        if want.startswith("--"):
            if want not in flags:
                return False
        elif want.startswith("-"):
            if not all("-" + c in flags for c in want[1:]):
                return False
        elif want not in texts:
            return False
    return True


# ---- Terminal: running commands ----

#: what a command's environment may hold (plus LC_*, HOME, TMPDIR and agent.terminal.env_passthrough); an
#: allowlist, because a denylist of secret-looking names misses DATABASE_URL, MYSQL_PWD, proxy credentials…
CHILD_ENV_NAMES = frozenset(("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "COLORTERM",
                             "NO_COLOR"))


def child_env(environ, passthrough=(), home=None, tmpdir=None, secrets=()):
    """The environment a command gets: allow-listed names only; no value that holds one of our credentials,
    whole or inside (`https://me:KEY@host`, `Bearer KEY`), in any spelling the redactor knows (URL-encoded,
    base64): a passed-through name must not become a way to hand the agent's keys to a command."""
    from urllib.parse import unquote
    from xzatoma_store import MIN_SECRET_LENGTH, redact
    patterns = [p for p in passthrough if p]
    secrets = set(s for s in secrets if isinstance(s, str) and s)
    long_secrets = [s.strip() for s in secrets if len(s.strip()) >= MIN_SECRET_LENGTH]  # "x" is inside PATH
    env = {}
    for name, value in environ.items():
        if name in CHILD_ENV_NAMES or name.startswith("LC_") or any(fnmatch.fnmatchcase(name, p) for p in patterns):
            plain = unquote(value) if "%" in value else value  # `me:%73k-…@host` is the key too
            if value not in secrets and not any(s in value or s in plain for s in long_secrets) \
                    and redact(plain, shapes=False) == plain \
                    and redact(value, shapes=False) == value:
                env[name] = value
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if home:
        env["HOME"] = home
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


class CommandResult:
    __slots__ = ("exit_code", "duration", "stdout", "stderr", "stdout_total", "stderr_total", "timed_out",
                 "cancelled")


def run_command(command, cwd, timeout, max_stdout, max_stderr, shell=None, env=None, cancel=None, argv=None,
                sandbox=None):
    """Run a validated command; bounded memory; the command and everything it started killed at the end.

    With a confining `sandbox` the command is started by the run's sandbox helper (see "Terminal: the OS
    sandbox") and watched through its own socket; otherwise it runs in its own process group here. stdout and
    stderr are drained concurrently (one selector loop, no threads) and kept up to their caps; the rest is
    counted and dropped, so memory stays bounded however much a command prints. The exit is watched in the same
    loop (a pidfd or the helper's socket), so there is no polling delay.
    """
    import selectors
    if argv is None:
        if shell is None:
            shell = needs_shell(command)
        argv = ["/bin/sh", "-c", command] if shell else simple_argv(command)
    started = time.monotonic()
    if env is None:
        env = child_env(os.environ)
    job = sandbox.spawn(argv, env) if sandbox is not None and sandbox.confined else _LocalJob(argv, cwd, env)
    res = CommandResult()
    res.timed_out = res.cancelled = False
    out_fd, err_fd = job.stdout, job.stderr
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    caps = {out_fd: max_stdout, err_fd: max_stderr}
    totals = dict.fromkeys(bufs, 0)
    deadline = started + timeout
    sel = selectors.DefaultSelector()
    sel.register(out_fd, selectors.EVENT_READ)
    sel.register(err_fd, selectors.EVENT_READ)
    if (exit_fd := job.exit_fd) is not None:
        sel.register(exit_fd, selectors.EVENT_READ)
    streams, exited = 2, False
    try:
        while streams or not exited:
            if not exited and exit_fd is None and not streams:
                if exited := job.poll():
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                res.timed_out = True
                break
            if cancel is not None and cancel.is_set():
                res.cancelled = True
                break
            wait = min(remaining, 0.25) if (streams or exit_fd is not None) else min(remaining, 0.01)
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == exit_fd:
                    sel.unregister(fd)
                    exited = job.exited()
                    continue
                if not (data := os.read(fd, 65536)):
                    sel.unregister(fd)
                    streams -= 1
                    continue
                totals[fd] += len(data)
                buf, cap = bufs[fd], caps[fd]
                if len(buf) < cap:
                    buf += data[: cap - len(buf)]
    finally:
        sel.close()
        res.exit_code = job.finish()  # kills whatever is left of the command, then reaps it
    res.duration = time.monotonic() - started
    res.stdout, res.stderr = bufs[out_fd], bufs[err_fd]
    res.stdout_total, res.stderr_total = totals[out_fd], totals[err_fd]
    return res


class _LocalJob:
    """A command run here, unconfined (--sandbox off, or no way to confine it): its own session and
    process group, killed as a group. A descendant that calls setsid() leaves the group: only the sandbox
    (a PID namespace per command) catches those, which is why `off` says so in the run header."""

    def __init__(self, argv, cwd, env):
        import subprocess
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.stdout, self.stderr = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        try:
            self.exit_fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self.exit_fd = None

    def poll(self):
        return self.proc.poll() is not None

    def exited(self):
        return True

    def finish(self):
        _kill_group(self.proc)  # also kills anything the command left running in its group
        if self.exit_fd is not None:
            os.close(self.exit_fd)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode


def _kill_group(proc):
    try:
        pgid = proc.pid  # start_new_session: the group id is the leader's pid
        if proc.poll() is None and proc.returncode is None:
            os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=1.0)
            except Exception:
                pass
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except Exception:
        pass


# ---- Terminal: the OS sandbox ----
#
# The policy decides whether to ask; the sandbox decides what a command can touch, so that whatever the
# policy misses, the kernel still stops. Modes (agent.terminal.sandbox, --sandbox):
#   workspace-write  write only in the working directory and a private TMPDIR (removed after the run); .git
#                    and the protected paths read-only; read the system, the working directory and where the
#                    programs on PATH live; no network unless agent.terminal.network
#   read-only        the same with no writes at all (the private TMPDIR too, as codex does)
#   off              no confinement; only when asked for by name (the denylist still applies)
#
# How (Linux): once per run a helper process is started (`python -I -S`, ~30 ms). It enters new user, mount,
# IPC and (without network) network namespaces (as root: a uid that is nobody to the kernel), makes its view
# of the system read-only but for the working directory and TMPDIR, bind-mounts .git and the protected paths
# read-only, sets no_new_privs, makes itself undumpable, applies a seccomp filter (no unix socket that can be
# pointed at a name, no keyring) and a Landlock ruleset (filesystem, TCP and scope rules, as far as the
# kernel's ABI goes) and the resource limits. Read grants never come from what commands write. Then it waits for commands on a socket and starts each with posix_spawn
# (vfork: no copy of a large Python process) as PID 1 of a fresh PID namespace, so every process the command
# starts — setsid and double forks included — dies with it: when the command ends, at its timeout, or when
# the run ends (the helper's socket closes and it kills what is left). Starting commands from a small helper
# that is already confined is what keeps `true` within 2x of subprocess.run: a fork of the agent per command
# (preexec_fn) alone costs that, and it is unsafe with the subagents' threads.
#
# Landlock also keeps commands from ptrace-ing or reading /proc/<pid>/environ|mem of any process outside the
# sandbox (the agent's API keys), and from mounting anything, which is what keeps the read-only bind mounts in
# place. The helper is in the commands' Landlock domain but not in their PID namespaces, and undumpable, so
# they can neither signal nor trace it.

WORKSPACE_WRITE, READ_ONLY, SANDBOX_OFF = "workspace-write", "read-only", "off"
SANDBOX_ACCESS = (WORKSPACE_WRITE, READ_ONLY, SANDBOX_OFF)  #: what a sandbox lets commands write

# Landlock (include/uapi/linux/landlock.h). The syscall numbers are those of the generic table, shared by
# x86_64 and aarch64 (and every architecture added since 5.13).
_LL_CREATE_RULESET, _LL_ADD_RULE, _LL_RESTRICT_SELF = 444, 445, 446
_LL_VERSION = 1  # LANDLOCK_CREATE_RULESET_VERSION
_LL_RULE_PATH_BENEATH, _LL_RULE_NET_PORT = 1, 2
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_REMOVE_DIR, _FS_REMOVE_FILE, _FS_MAKE_CHAR, _FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_FS_MAKE_REG, _FS_MAKE_SOCK, _FS_MAKE_FIFO, _FS_MAKE_BLOCK, _FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
#: the filesystem rights each ABI knows (ABI 4 added only network rules, 6 scopes, 7 audit-log flags);
#: a newer kernel gets the rights of the newest ABI this code was written for
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1,
                 6: (1 << 16) - 1, 7: (1 << 16) - 1}
_LL_KNOWN_ABI = 7
_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_WRITE = (_FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_DIR | _FS_MAKE_REG | _FS_MAKE_SOCK |
          _FS_MAKE_FIFO | _FS_MAKE_SYM | _FS_REFER | _FS_TRUNCATE)  # never device nodes
_FILE_ONLY = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_ACCESS = {"r": _READ, "rw": _READ | _WRITE, "dev-r": _FS_READ_FILE | _FS_IOCTL_DEV,
           "dev-rw": _FS_READ_FILE | _FS_WRITE_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV}

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x20000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
_PR_SET_DUMPABLE, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 4, 28, 38
_SECBIT_NOROOT_AND_LOCKED = 0x3

#: read-only system locations (those that exist); /proc is safe to read because Landlock refuses access to
#: other processes' environ and mem (ptrace rules), /sys only where runtimes look for CPUs and cgroup limits
SANDBOX_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix",
                       "/snap", "/run/systemd/resolve", "/proc", "/sys/devices/system/cpu", "/sys/fs/cgroup")
SANDBOX_DEVICES = (("/dev/null", "dev-rw"), ("/dev/full", "dev-rw"), ("/dev/zero", "dev-r"),
                   ("/dev/random", "dev-r"), ("/dev/urandom", "dev-r"))
#: what each confining access needs from the kernel, named as the warning names it
_NEEDS = (("filesystem", "Landlock filesystem rules"), ("network", "network isolation"),
          ("protected", "read-only .git and protected paths"), ("descendants", "killing setsid/double-forked "
                                                                                "descendants (PID namespaces)"),
          ("unix_sockets", "keeping unix sockets on the system out of reach (seccomp)"),
          ("ipc", "a System V IPC namespace"), ("keyring", "keeping the kernel keyring out of reach (seccomp)"),
          ("metadata", "read-only metadata outside the writable roots (a read-only mount view)"),
          ("root_files", "keeping files only root may read from commands (running as root: idmapped mounts)"))
#: resource limits of every command (agent.terminal.limits; 0 = none): tasks (processes and threads, counted
#: in the sandbox's user namespace), memory per process (RLIMIT_DATA: heap and private writable mappings, so
#: the address space a JVM, Go or V8 reserves is not counted) and the size of one file written
SANDBOX_LIMITS = {"processes": 4096, "memory_mb": 8192, "file_size_mb": 8192}


def landlock_abi():
    """The kernel's Landlock ABI version, or 0 where there is none (not Linux, disabled, or no ctypes)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(ctypes.c_long(_LL_CREATE_RULESET), None, ctypes.c_long(0), ctypes.c_long(_LL_VERSION))
    except (OSError, AttributeError, ImportError):
        return 0
    return max(0, int(abi))


def trusted_realpath(path, untrusted=()):
    """realpath(path), or None when a link on the way lies in one of the `untrusted` real directories (the
    working directory and the TMPDIR: a command may have planted it there to point anywhere)."""
    parts, real, hops = [p for p in os.path.join(os.getcwd(), path).split("/") if p], "/", 0
    while parts:
        name = parts.pop(0)
        if name in (".", ".."):
            real = os.path.dirname(real) if name == ".." else real
            continue
        step = os.path.join(real, name)
        if not os.path.islink(step):
            real = step
            continue
        hops += 1
        if hops > 40 or any(_inside(step, top) for top in untrusted):
            return None
        try:
            target = os.readlink(step)
        except OSError:
            return None
        parts[:0] = [p for p in target.split("/") if p]
        real = "/" if target.startswith("/") else real
    return real


def program_dirs(path_value, home=None, xzatoma_home=None, untrusted=()):
    """Where the programs on PATH live, for read and execute: each PATH directory, its installation prefix
    (…/bin -> …), and the prefixes of programs that are symlinks elsewhere (a venv's python -> its
    interpreter). Never the home directory itself or /, nothing inside XZATOMA_HOME; under the home directory
    only a prefix's bin, lib, libexec and share (not ~/.cargo/credentials.toml, ~/.local/share/keyrings).
    Never derived from what commands can write (`untrusted`: the working directory, the TMPDIR): a PATH
    entry there (an activated .venv/bin) is readable anyway, and a link there may have been planted by
    an earlier run to make this one's grants reach ~/.ssh."""
    untrusted = [os.path.realpath(u) for u in untrusted if u]
    home = os.path.realpath(home) if home else None
    xz = os.path.realpath(xzatoma_home) if xzatoma_home else None
    out = []

    def inside(path, top):
        return top is not None and (path == top or path.startswith(top.rstrip("/") + "/"))

    def allowed(path):
        if path == "/" or inside(path, xz):
            return False
        return not any(top is not None and inside(top, path) for top in (home, xz))  # no ancestor of them

    #: per-user data and settings (keyrings, shell histories, tokens): never granted as a prefix's share/…
    private = {os.path.join(home, d) for d in (".local/share", ".local/state", ".config", ".cache")} if home else set()

    def add(path):
        if path not in out and allowed(path) and path not in private and os.path.isdir(path):
            out.append(path)

    def add_prefix(prefix):
        if not allowed(prefix):
            return
        if inside(prefix, home):
            for sub in ("bin", "sbin", "lib", "lib64", "libexec", "share"):
                add(os.path.join(prefix, sub))
            add_file(os.path.join(prefix, "pyvenv.cfg"))
        else:
            add(prefix)

    def add_file(path):
        if path not in out and allowed(path) and os.path.isfile(path):
            out.append(path)

    def add_dir(real):
        add(real)
        if os.path.basename(real) in ("bin", "sbin"):
            add_prefix(os.path.dirname(real))
        elif os.path.basename(real) == "shims":  # pyenv, rbenv, nodenv: the versions and the chosen one
            add(os.path.join(os.path.dirname(real), "versions"))
            add_file(os.path.join(os.path.dirname(real), "version"))

    system = tuple(d for d in SANDBOX_SYSTEM_DIRS if d != "/proc")
    for entry in (path_value or "").split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue  # "" and "." mean the current directory: never a grant of their own
        real = trusted_realpath(entry, untrusted)
        if real is None or any(inside(real, u) for u in untrusted) or not os.path.isdir(real):
            continue
        add_dir(real)
        if any(inside(real, s) for s in system):
            continue  # system programs' links stay in the system
        try:
            links = [e.path for e in os.scandir(real) if e.is_symlink()]
        except OSError:
            continue
        for link in links[:2000]:
            target = trusted_realpath(link, untrusted)
            if target and os.path.isfile(target) and not any(inside(target, s) for s in system + tuple(untrusted)):
                add_dir(os.path.dirname(target))
    return out


def git_dirs(root, untrusted=None):
    """Repository metadata outside the working directory that git needs to read: the enclosing repository
    of a subdirectory, and the real git directory of a worktree or submodule (a `.git` file).

    With `untrusted` (the directories commands write: read grants are made of these), a `.git` file in
    the working directory, which a command may have written, counts only where git's own link comes back:
    a worktree's directory whose `gitdir` names this `.git`, or a submodule's inside a repository that holds
    the tree (`…/.git/modules/…`); never through a link a command could have planted."""
    path = root = os.path.realpath(root)
    while not os.path.lexists(os.path.join(path, ".git")):
        if os.path.dirname(path) == path:
            return []
        path = os.path.dirname(path)
    dot = os.path.join(path, ".git")
    own = untrusted is not None and path == root
    gitdirs = [] if os.path.isdir(dot) or (own and os.path.islink(dot)) else _gitdirs(dot)
    if own and gitdirs and not _links_back(gitdirs[0], dot):
        gitdirs = []
    out = ([dot] if path != root else []) + gitdirs
    return [p for p in out if os.path.exists(p) and not any(_inside(p, u) for u in untrusted or ())]


def _links_back(gitdir, dot):
    """Did git make `gitdir` for the `.git` file `dot`: a worktree's (its `gitdir` file names dot) or a
    submodule's (under `.git/modules/` of a directory holding dot)?"""
    back = _read_small(os.path.join(gitdir, "gitdir"))
    if back and os.path.realpath(os.path.join(gitdir, os.fsdecode(back.strip()))) == dot:
        return True
    holder = gitdir.split("/.git/modules/")[0]
    return holder != gitdir and _inside(os.path.dirname(dot), holder)


def _pinned_parents(paths, root):
    """The directories between the root and each protected path, shallowest first: the sandbox makes mount
    points of them (bound onto themselves, still writable) so that a command can neither rename nor remove
    them (EBUSY) and so carry a protected path away: `mv sub $TMPDIR/` would take sub/.git out of the tree
    and into the TMPDIR removed at the end of the run; `mv deploy d2` would let the file tools edit
    d2/keys under a name nobody protects."""
    out = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent != root and _inside(parent, root):
            out.add(parent)
            parent = os.path.dirname(parent)
    return sorted(out - set(paths), key=lambda p: (p.count("/"), p))


def sandbox_rules(root, access, tmpdir, path_value, home=None, xzatoma_home=None):
    """The Landlock rules of an access: [(path, "r" | "rw" | "dev-r" | "dev-rw")], existing paths only. Nothing
    granted is derived from the working directory or the TMPDIR, where commands write."""
    untrusted = (os.path.realpath(root), os.path.realpath(tmpdir))
    rules = [(d, "r") for d in SANDBOX_SYSTEM_DIRS if os.path.exists(d)]
    rules += [(d, access) for d, access in SANDBOX_DEVICES if os.path.exists(d)]
    rules += [(d, "r") for d in program_dirs(path_value, home, xzatoma_home, untrusted)]
    rules += [(d, "r") for d in git_dirs(root, untrusted)]
    writable = "rw" if access == WORKSPACE_WRITE else "r"
    rules += [(os.path.realpath(root), writable), (os.path.realpath(tmpdir), writable)]
    return rules


def _root_mounts(root, tmpdir, rules, writable):
    """Running as root, the mounts that give commands (nobody to the kernel: see _enter_as_nobody) what they
    need and nothing of root's more: {"covers": [...], "entries": [[path, writable, idmapped, is_dir], ...]}.
    Idmapped, root's files shown as the commands' own: the working directory and TMPDIR (writable where the
    mode writes) and, read-only, the repositories outside that git checks the owner of. A directory others
    may not enter (/root, 0700) above something granted is covered by an empty tmpfs holding only what is
    granted beneath it, bound as it is: root-only files there stay root's."""
    root, tmpdir = os.path.realpath(root), os.path.realpath(tmpdir)
    git = git_dirs(root, (root, tmpdir))
    owned = [root, tmpdir] + sorted(set(git) | {os.path.dirname(g) for g in git if os.path.basename(g) == ".git"})
    owned = [p for i, p in enumerate(owned) if i < 2 or not any(_inside(p, q) for q in owned[:i] + owned[i + 1:])]
    granted = [p for p, _ in rules if not any(_inside(p, q) for q in owned)]
    covers = set()
    for path in granted + owned:
        cur = ""
        for part in path.strip("/").split("/"):
            cur += "/" + part
            try:
                mode = os.stat(cur).st_mode
            except OSError:
                break
            if stat.S_ISDIR(mode) and not mode & 0o001:
                if cur != path:
                    covers.add(cur)
                break
    covers = sorted(c for c in covers if not any(_inside(c, q) for q in covers - {c} | set(owned)))
    reach = [p for p in granted if any(_inside(p, c) for c in covers)]
    reach = [p for p in reach if not any(_inside(p, q) and p != q for q in reach)]
    entries = [[p, writable if p in (root, tmpdir) else False, True, True] for p in owned]
    entries += [[p, False, False, os.path.isdir(p)] for p in reach]
    return {"covers": covers, "entries": sorted(entries, key=lambda e: e[0].count("/"))}


# ---- Terminal: the after-command watch ----

class ProtectedWatch:
    """What terminal commands create among the protected paths. INFO: the sandbox makes the protected paths
    that exist when it starts read-only, but a mount needs a place to exist: a `.git` a command creates
    (`mkdir -p sub/.git/hooks`, or `.git` where there was none), a new `.bashrc` or `.ssh/` would be
    writable, and the person's next `git status` there would run its hooks outside any sandbox. So the
    terminal tool asks this before and after each command what appeared, and what appeared is a
    person's to keep (chat) or is removed (headless), as a file tool's change there would be. Repositories
    (a `.git`, any directory by git's own rules, the working directory too) and virtualenv start-up files that
    would run nothing (`git init`, `git clone`, `python -m venv`) are kept, and checked after later commands.
    Cheap per command: one lstat per known directory; only directories whose mtime/ctime changed (or
    changed too recently to tell) are listed again. At most `max_dirs` directories are followed; directories
    that appear during the run past that bound are searched whole after every command instead (a command
    that makes 20,000 directories must not blind the watch), and a directory a command made that cannot be
    looked into (deeper than a path can name, unreadable) counts as protected itself: what it holds is
    unknown. Names a configured glob protects (`*.pem`) are matched as directories are listed."""

    #: a directory changed this close before we looked is listed again next time (coarse file timestamps)
    HOT_NS = 200 * 1000 * 1000

    #: directories followed at most (a huge tree costs a bounded look; `policy sandbox` says when it is cut)
    MAX_DIRS = 20000

    def __init__(self, conf, max_dirs=MAX_DIRS):
        self.conf = conf
        self.root = conf.root
        xz = os.path.realpath(conf.xzatoma_home) if conf.xzatoma_home else None
        #: fixed protected names (repositories are found anywhere, below); XZATOMA_HOME is ours to create
        self.static = [p for p in conf.protected if not _is_glob(p) and p != self.root and not (xz and _inside(p, xz))
                       and fold_name(os.path.basename(p)) not in PROTECTED_ANYWHERE]
        #: configured globs, matched against every name listed
        self.globs = conf.globs
        self.max_dirs = max_dirs
        self.dirs = {}  #: directory -> (mtime_ns, ctime_ns, inode) when last listed
        self.repos = set()  #: .git/.hg entries and directories git takes for a repository, present
        self.defuse = set()  #: directories that were there before and became a repository: only its parts go
        self.venvs = set()  #: virtualenvs (where pyvenv.cfg is)
        self.code = set()  #: start-up files (venv_code: a virtualenv's, sitecustomize and .pth anywhere), present
        self.present = {}  #: static protected paths present -> _ident
        self.matched = set()  #: paths a configured glob protects, present
        self.ids = {}  #: repository or glob match -> _ident: a `.git` link swapped for a directory is new
        self.unfollowed = set()  #: directories that appeared past max_dirs: searched whole after each command
        self.unwatchable = {}  #: directory a command made that could not be looked into -> why
        self.blind = set()  #: directories unreadable at the first look (not a command's doing)
        self.created = set()  #: repositories and start-up files that appeared and were kept (checked again)
        self.accepted = set()  #: paths a person chose to keep: never asked about again
        self.complete = True
        self.running = 0  #: commands running now (subagents run them in parallel)
        self.pending = []  #: what a look before a command found while others ran: theirs to answer for
        self._lock = threading.Lock()
        started = time.time_ns()
        self._list([self.root], None)
        self._seen_at = started
        self.present = self._static_present()

    def begin(self):
        """Before a command: what appeared since the last look is not its doing (a file tool a person
        approved), unless another command is running: then it may be that one's, and the next refresh()
        reports it (a parallel subagent's look must not swallow what another's command is planting)."""
        with self._lock:
            new = self._refresh()
            if self.running:
                self.pending += [p for p in new if p not in self.pending]
            else:  # not a person's yes (they are accepted): checked again after this command, like a command's
                self.created |= {p for p in new if (p in self.repos or p in self.code) and p not in self.accepted}
            self.running += 1

    def end(self):
        with self._lock:
            self.running -= 1

    def refresh(self):
        """What appeared since the last call: [absolute path, ...] (new repositories and protected names)."""
        with self._lock:
            new, self.pending = [p for p in self.pending if not _gone(p)], []  # removed by another since
            new += [p for p in self._refresh() if p not in new]
            return [p for p in new if p not in self.accepted]

    def _refresh(self):
        new, changed = [], []
        now = time.time_ns()
        for d, sig in list(self.dirs.items()):
            try:
                st = os.lstat(d)
            except OSError:
                del self.dirs[d]
                continue
            if not stat.S_ISDIR(st.st_mode):
                del self.dirs[d]
            elif (st.st_mtime_ns, st.st_ctime_ns, st.st_ino) != sig or st.st_mtime_ns >= self._seen_at - self.HOT_NS \
                    or st.st_ctime_ns >= self._seen_at - self.HOT_NS:
                changed.append(d)
        self._seen_at = now
        self._list(changed, new)
        self.unfollowed = {d for d in self.unfollowed if os.path.isdir(d) and not os.path.islink(d)}
        if self.unfollowed:
            self._list(sorted(self.unfollowed), new, follow=False)
        self.repos = {r for r in self.repos if os.path.lexists(r) and (
            fold_name(os.path.basename(r)) in PROTECTED_ANYWHERE or is_git_dir(r))}
        self.venvs = {v for v in self.venvs if os.path.lexists(os.path.join(v, "pyvenv.cfg"))}
        self.matched = {m for m in self.matched if os.path.lexists(m)}
        self.code = {c for c in self.code if os.path.lexists(c) and any(_inside(c, v) for v in self.venvs)}
        self.ids = {p: i for p, i in self.ids.items() if p in self.repos or p in self.matched or p in self.code}
        present = self._static_present()
        new += sorted(p for p, ident in present.items() if self.present.get(p) != ident)  # appeared or replaced
        self.present = present
        self.created &= self.repos | self.code
        return new

    def _static_present(self):
        present = {}
        for path in self.static:
            try:
                present[path] = _ident(path, os.lstat(path).st_mode)
            except OSError:
                continue
        return present

    def _seen(self, path, ident, new):
        """Record what stands at a protected `path`; one that appeared, or was replaced since (a `.git` or
        `.bashrc` link swapped for a directory or file of the command's own), is new, even if accepted."""
        if self.ids.get(path, ident) != ident:
            self.accepted.discard(path)
            self.created.discard(path)
        elif path in self.repos or path in self.matched or path in self.code:
            return
        self.ids[path] = ident
        if new is not None:
            new.append(path)

    def _list(self, dirs, new, follow=True):
        """List `dirs` and the directories new below them; follow=False searches whole subtrees and keeps
        none of their directories (past max_dirs)."""
        queue = list(dirs)
        while queue:
            d = queue.pop()
            try:
                st = os.lstat(d)
                entries = list(os.scandir(d))
            except OSError as exc:
                self.dirs.pop(d, None)
                if exc.errno in (errno.ENOENT, errno.ENOTDIR) or d == self.root or d in self.blind:
                    continue
                if new is None:  # the first look: the person's own tree
                    self.blind.add(d)
                    self.complete = False
                else:  # made during the run (ENAMETOOLONG: a path too long to name; EACCES: chmod 000)
                    self.unwatchable[d] = exc.strerror or str(exc)
                    new.append(d)
                continue
            known = self.dirs.get(d, (0, 0, 0)) != (0, 0, 0) or d == self.root
            if follow:
                self.dirs[d] = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            names = [e.name for e in entries]
            if is_git_dir(d, names=names):  # a bare clone, a mirror, HEAD/objects/refs made one by one: git's rules
                if d not in self.repos and new is not None and known:
                    self.defuse.add(d)
                self._seen(d, (stat.S_IFDIR, None), new)
                self.repos.add(d)
                if d != self.root:
                    continue  # its hooks and config are judged by repository_runs_code, as a .git's are
            if "pyvenv.cfg" in names:
                self.venvs.add(d)
            venvs = [v for v in self.venvs if _inside(d, v)]
            for entry in entries:
                if fold_name(entry.name) in PROTECTED_ANYWHERE:
                    self._seen(entry.path, _entry_ident(entry), new)
                    self.repos.add(entry.path)
                    continue  # never listed: git's own files are judged by armed()
                if self.globs:
                    rel = entry.path[len(self.root) + 1:]
                    if entry.path in self.matched or _protected_rel(rel, self.globs, self.root) == rel:
                        self._seen(entry.path, _entry_ident(entry), new)
                        self.matched.add(entry.path)
                if venv_code(entry.path[len(self.root) + 1:], venv=False, top=self.root) or any(
                        venv_code(os.path.relpath(entry.path, v), top=v) for v in venvs):
                    self._seen(entry.path, _entry_ident(entry), new)
                    self.code.add(entry.path)
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if not is_dir:
                    continue
                if not follow:
                    queue.append(entry.path)
                elif entry.path not in self.dirs and entry.path not in self.unfollowed:
                    if len(self.dirs) >= self.max_dirs:
                        self.complete = False
                        if new is not None:  # appeared during the run: searched whole after every command
                            self.unfollowed.add(entry.path)
                        continue
                    self.dirs[entry.path] = (0, 0, 0)  # listed below (or next time, if the bound cut in)
                    queue.append(entry.path)

    def keep(self, path, accepted=False):
        """A repository that appeared and is kept: checked again after later commands, or never again
        when a person accepted it."""
        with self._lock:
            (self.accepted if accepted else self.created).add(path)

    def armed(self):
        """Repositories and start-up files kept earlier (created during the run) that would now run code."""
        with self._lock:
            candidates = [r for r in self.created if r not in self.accepted]
        return [r for r in candidates if self.runs_code(r)]

    def runs_code(self, path):
        """Why a repository or virtualenv start-up file at `path` would run code (None: it would not)."""
        if path in self.repos:
            return repository_runs_code(path, self.root, self.conf.git())
        return startup_runs_code(path, self.root) if path in self.code else "a protected path"

    def found(self):
        """[(path, reason)]: what appeared among the protected paths since the last look, and what was kept
        earlier that would now run code; repositories and start-up files that would run nothing are kept."""
        found = []
        for path in self.refresh():
            reason = ("a directory that cannot be looked into: %s" % self.unwatchable[path]) if \
                path in self.unwatchable else self.runs_code(path)
            if reason is None:
                self.keep(path)  # inert (git init, git clone, python -m venv): kept, checked after later commands
            else:
                found.append((path, reason))
        return found + [(path, self.runs_code(path) or "changed") for path in self.armed()
                        if path not in [f for f, _ in found]]


def _ident(path, mode):
    """What stands at a protected path, for noticing it was replaced: its file type, and a link's target.
    Not its inode: a person's editor saving `.bashrc` by rename is not a command's replacement (and what
    exists at the start is read-only for commands), but a link swapped for a directory or another link is."""
    if stat.S_ISLNK(mode):
        try:
            return mode & 0o170000, os.readlink(path)
        except OSError:
            return mode & 0o170000, None
    return stat.S_IFMT(mode), None


def _entry_ident(entry):
    """_ident of a scandir entry (its type from the directory listing: no stat for directories)."""
    try:
        mode = stat.S_IFLNK if entry.is_symlink() else stat.S_IFDIR if entry.is_dir(follow_symlinks=False) else \
            entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return 0, None
    return _ident(entry.path, mode)


def _gone(path):
    """Does nothing stand at `path` (a path too long to look at still stands)?"""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        pass
    return False


# ---- Terminal: the sandbox and its helper process ----

# ---- Terminal: the run's sandbox (the agent's side) ----

class Sandbox:
    """One run's sandbox: its access (workspace-write, read-only, off), the commands' environment, the private TMPDIR, and the helper that
    starts confined commands. Shared by the run's subagents (thread-safe); `close()` (or interpreter exit)
    ends every command still running and removes the TMPDIR.

    `assume_missing` names kernel features to treat as absent ("landlock", "userns", "landlock-net",
    "scopes", "pidns", "proc", "seccomp", "idmap", "readonly-view", or "abi:N" for a Landlock ABI of at
    most N): agent.terminal.sandbox_assume_missing, for testing the warnings, --require-sandbox and every
    ABI's rules on a machine that has them all.

    What is protected (bound read-only, hidden, watched) it asks its Confinement; `root` may be a working
    directory instead, with `xzatoma_home`, `protected` and `private_files` to make one of (tests, embedding).
    """

    def __init__(self, root, access=WORKSPACE_WRITE, network=False, environ=None, env_passthrough=(),
                 keep_home=False, xzatoma_home=None, protected=(), secrets=(), assume_missing=(), private_files=(),
                 limits=None):
        import sys
        if access not in SANDBOX_ACCESS:
            raise ValueError("unknown sandbox %r (choose %s)" % (access, ", ".join(SANDBOX_ACCESS)))
        if not isinstance(root, Confinement):
            root = Confinement(root, xzatoma_home, protected, environ=environ, secrets=secrets,
                               private_files=private_files, sandbox=self)
        #: what is protected: the read-only binds, the hidden files, what the watch looks for
        self.confinement = root
        self.root = root.root
        self.access = access  #: what commands may write: workspace-write, read-only, or off (unconfined)
        self.network = bool(network)
        self.environ = dict(os.environ if environ is None else environ)
        self.env_passthrough = tuple(env_passthrough or ())
        self.keep_home = keep_home
        self.xzatoma_home, self.private_files = root.xzatoma_home, root.private_files  #: hidden from commands
        self.secrets = tuple(secrets)
        self.assume_missing = frozenset(assume_missing or ())
        #: rlimits of every command (SANDBOX_LIMITS, agent.terminal.limits)
        self.limits = dict(SANDBOX_LIMITS, **(limits or {}))
        self.linux = sys.platform.startswith("linux")
        #: False for `off` and where nothing can be confined (not Linux): commands run unconfined, said aloud
        self.confined = access != SANDBOX_OFF and self.linux
        self._lock = threading.Lock()
        self._ready = threading.Lock()  # one thread reads the helper's report; the others wait for it
        self._state = {"tmpdir": None, "proc": None, "ctl": None}
        self._report = None
        self._env = None
        self._watch = None
        import weakref
        self._finalizer = weakref.finalize(self, _sandbox_cleanup, self._state)

    # -- what commands get --
    @property
    def tmpdir(self):
        with self._lock:
            if self._state["tmpdir"] is None:
                import tempfile
                self._state["tmpdir"] = os.path.realpath(tempfile.mkdtemp(prefix="xzatoma-run-"))
            return self._state["tmpdir"]

    @property
    def env(self):
        if self._env is None:
            tmp = self.tmpdir
            self._env = child_env(self.environ, self.env_passthrough, None if self.keep_home else tmp, tmp,
                                  self.secrets)
        return self._env

    # -- the helper --
    def _spec(self):
        home = self.environ.get("HOME")
        # where .git really lives (a link's target, a gitdir file's directory) and the hooks directory and
        # programs the repositories' config names are as protected as .git itself (Confinement.binds)
        protected = self.confinement.binds()
        watch = self.watch() if self.access == WORKSPACE_WRITE else None  # its first look finds the nested ones
        nested = sorted(r for r in watch.repos if not os.path.islink(r) and not (  # the top's own are protected
            os.path.dirname(r) == self.root and fold_name(os.path.basename(r)) in PROTECTED_ANYWHERE)) if watch else []
        complete = watch.complete if watch else True
        # `*.pem` that exist, a virtualenv's .pth files and sitecustomize (links are watched, not bound)
        globbed = sorted(p for p in watch.matched | watch.code if not os.path.islink(p)) if watch else []
        protected += [p for p in nested + globbed if p not in protected]
        # what the config of a repository the watch found names (core.hooksPath …): the capped scan behind
        # binds() passed over one past its first 2000 directories, and a script rewrote its hooks (round 19b)
        named = [p for r in (watch.repos if watch else ()) if fold_name(os.path.basename(r)) == ".git"
                 for p, _ in self.confinement.repository_paths(os.path.dirname(r))]
        protected += [p for p in dict.fromkeys(named) if p not in protected and os.path.lexists(p) and
                      not os.path.islink(p)]
        hidden = self._hidden()
        rules = sandbox_rules(self.root, self.access, self.tmpdir, self.env.get("PATH"), home, self.xzatoma_home)
        mounts = _root_mounts(self.root, self.tmpdir, rules, self.access == WORKSPACE_WRITE) \
            if os.getuid() == 0 and "idmap" not in self.assume_missing else None
        return {"access": self.access, "network": self.network, "root": self.root, "rules": rules, "mounts": mounts,
                "writable": [self.root, self.tmpdir] if self.access == WORKSPACE_WRITE else [], "limits": self.limits,
                "protected": protected, "hidden": hidden,
                "pinned": _pinned_parents(protected + hidden, self.root) if self.access == WORKSPACE_WRITE else [],
                "nested_complete": complete, "assume_missing": sorted(self.assume_missing)}

    def _hidden(self):
        """XZATOMA_HOME (credentials, conversations) and the private files, where a readable directory holds
        them (the working dir, a PATH prefix): Landlock cannot take back what it grants beneath a directory, so
        an empty read-only tmpfs covers XZATOMA_HOME and /dev/null each file. A command's output goes to the
        model: what it can read, it can hand over in any encoding the redactor does not know (`rev`, `od`)."""
        xz = os.path.realpath(self.xzatoma_home) if self.xzatoma_home else None
        granted = [self.root, self.tmpdir] + [d for d, _ in sandbox_rules(
            self.root, self.access, self.tmpdir, self.env.get("PATH"), self.environ.get("HOME"), xz)]
        if xz and not os.path.lexists(xz) and any(_inside(xz, d) for d in granted):
            # made now (0700), so that it can be covered: left for a command to make, it would be the
            # command's (a credentials.json of its own, an audit.log linked to ~/.bashrc the agent appends to)
            from xzatoma_store import private_dir
            try:
                private_dir(xz)
            except OSError:
                pass
        wanted = [xz] if xz and os.path.isdir(xz) else []
        for path in self.private_files:
            real = os.path.realpath(path)
            if os.path.isfile(real) and not (xz and _inside(real, xz)) and real not in wanted:
                wanted.append(real)
        return [p for p in wanted if any(_inside(p, d) for d in granted)]

    def start(self):
        """Start the helper (once); returns at once, report() waits for it."""
        import socket
        import subprocess
        with self._lock:
            if not self.confined or self._state["proc"] is not None:
                return
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._state["ctl"] = mine
        spec = self._spec()
        spec["fd"] = theirs.fileno()
        here = os.path.dirname(os.path.abspath(__file__))
        # the spec on standard input, not as an argument: one argument holds at most 128 KB (MAX_ARG_STRLEN), and
        # a tree with 2,000 protected links made it larger (round 19f)
        boot = ("import sys; sys.path.insert(0, %r); import xzatoma_tools; "
                "xzatoma_tools._sandbox_helper(sys.stdin.buffer.read().decode())")
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", boot % here],
                                    cwd=self.root, env=self.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                    start_new_session=True)
            try:
                proc.stdin.write(json.dumps(spec).encode())  # the helper reads it whole before anything else
            finally:
                proc.stdin.close()
        except OSError as exc:
            self._report = {"ok": False, "error": "the sandbox helper could not start: %s" % exc}
            proc = None
        finally:
            theirs.close()
        with self._lock:
            self._state["proc"] = proc or False

    def report(self, timeout=20.0):
        """What is enforced here (the helper's own account, once it has confined itself)."""
        with self._ready:
            return self._read_report(timeout)

    def _read_report(self, timeout):
        if self._report is None:
            if not self.confined:
                self._report = {"ok": False, "error": "off" if self.access == SANDBOX_OFF else
                                "not enforced on this system (Linux Landlock and namespaces only)"}
            else:
                self.start()
                ctl = self._state["ctl"]
                if self._report is None:
                    ctl.settimeout(timeout)
                    try:
                        data = ctl.recv(_REPORT_MAX)  # one message (SOCK_SEQPACKET): a larger one is cut
                        self._report = json.loads(data.decode()) if data else {
                            "ok": False, "error": "the sandbox helper exited during set-up"}
                    except (OSError, ValueError) as exc:
                        self._report = {"ok": False, "error": "the sandbox helper did not answer: %s" % exc}
                    ctl.settimeout(None)
        return self._report

    def not_enforced(self):
        """What this access needs that this machine does not enforce, as short phrases ([] when all is)."""
        if self.access == SANDBOX_OFF:
            return []
        report = self.report()
        if not report.get("ok"):
            return ["everything (%s)" % report.get("error", "no sandbox")]
        missing = []
        if not self.network and report.get("landlock_net") and not report.get("netns"):
            missing.append("UDP/DNS isolation (no network namespace; Landlock stops TCP only)")
        for key, label in _NEEDS:
            if key == "network" and self.network:
                continue
            if key == "protected" and not report.get("protected_needed"):
                continue
            if not report.get(key):
                missing.append(label)
        if not report.get("scopes"):
            missing.append("signal/abstract-socket scoping (Landlock ABI 6)")
        return missing

    def describe(self):
        """Lines for `xzatoma policy sandbox` and the run header: what is enforced, first things first."""
        report = self.report() if self.access != SANDBOX_OFF else {}
        lines = ["sandbox: %s%s" % (self.access, "" if self.confined or self.access == SANDBOX_OFF else
                                    " (requested; NOT enforced on this system)")]
        if self.access == SANDBOX_OFF:
            lines.append("confinement: none (--sandbox off): commands can read and write whatever this user "
                         "can; only the policy's denylist applies")
            lines.append("descendants: process group only (a setsid child can outlive the run)")
            lines.append("environment: allowlist (PATH, HOME, LANG, LC_*, TERM, TZ, USER, SHELL, TMPDIR…)")
            return lines
        if not report.get("ok"):
            lines.append("confinement: NOT enforced: %s" % report.get("error"))
            if not self.linux:
                lines.append("macOS sandbox-exec profiles are not implemented (untested here); "
                             "--require-sandbox refuses to run")
            return lines
        abi = report.get("landlock", 0)
        lines.append("landlock: ABI %d%s" % (abi, (" (this code knows up to %d)" % _LL_KNOWN_ABI)
                                              if abi > _LL_KNOWN_ABI else "") if abi else
                     "landlock: not available — filesystem NOT confined")
        if report.get("filesystem"):
            lines.append("filesystem: writes only in %s%s; reads: system dirs, the working dir, PATH programs' "
                         "dirs%s" % (
                             "the working dir and a private TMPDIR" if self.access == WORKSPACE_WRITE else
                             "nothing (read-only)", "" if report.get("truncate") else
                             " (truncate not mediated: ABI < 3)", ""))
        else:
            lines.append("filesystem: NOT confined (%s)" % report.get("filesystem_error", "no Landlock"))
        if self.network:
            lines.append("network: allowed (agent.terminal.network: true)")
        else:
            how = []
            if report.get("netns"):
                how.append("a new network namespace (no interfaces)")
            if report.get("landlock_net"):
                how.append("Landlock TCP bind/connect denied")
            lines.append("network: %s" % (" + ".join(how) if how else "NOT isolated"))
        prot = report.get("protected_paths") or []
        more = (report.get("protected_count") or len(prot)) - len(prot)
        lines.append("protected paths: %s" % (
            ("read-only bind mounts in a private mount namespace: " + ", ".join(
                display_path(p, self.root) for p in prot) + (" and %d more" % more if more > 0 else ""))
            if report.get("protected") and prot else
            "none present" if report.get("protected") else "NOT read-only (%s)" % report.get(
                "protected_error", "no mount namespace")))
        lines.append("descendants: %s" % ("a PID namespace per command: everything it starts dies with it"
                                          if report.get("descendants") else
                                          "process group only (%s)" % report.get("pidns_error", "no PID namespace")))
        lines.append("unix sockets: %s" % ("none reachable by name (seccomp: no socket(AF_UNIX), socketpair() "
                                            "makes connected stream/seqpacket pairs only): docker, the session bus, "
                                            "/dev/log, agents' sockets are out of reach" if report.get("unix_sockets")
                                            else "reachable by path (%s)" % report.get("unix_sockets_error", "no seccomp")))
        lines.append("ipc: %s" % ("a namespace of its own: System V objects and POSIX queues of this run only%s" % (
            ", and a private /dev/shm" if report.get("shm") else "") if report.get("ipc") else
            "the system's System V objects are reachable (no IPC namespace)"))
        lines.append("keyring: %s" % ("a fresh session keyring; add_key, keyctl and request_key refused (seccomp)"
                                      if report.get("keyring") else "the kernel keyring is reachable (%s)" % (
                                          "no seccomp" if report.get("unix_sockets") is False else "no fresh keyring")))
        lines.append("metadata: %s" % ("read-only outside the writable roots (a read-only mount view): chmod, "
                                       "setuid bits, chown, utime and xattrs fail there" if report.get("metadata")
                                       else "chmod/utime/xattrs of files outside follow file ownership only (%s)"
                                       % report.get("metadata_error", "no mount namespace")))
        lines.append("root-only files: %s" % (
            "closed by the system's permissions (not running as root)" if os.getuid() != 0 else
            "closed: commands are root inside, nobody to the kernel (idmapped mounts give them the working dir "
            "and TMPDIR)" if report.get("root_files") else
            "READABLE: commands run as root (%s)" % report.get("root_files_error", "no user namespace")))
        limits = report.get("limits") or {}
        lines.append("limits: %s (agent.terminal.limits)" % (", ".join(text % limits[key] for key, text in (
            ("processes", "%d processes"), ("memory_mb", "%d MB of memory per process"),
            ("file_size_mb", "files up to %d MB")) if key in limits) or "none"))
        lines.append("read grants: never derived from the working dir or TMPDIR (PATH entries, links and .git "
                     "files there, which commands can plant)")
        lines.append("scopes: %s" % ("signals and abstract unix sockets stay inside the sandbox"
                                     if report.get("scopes") else "not scoped (Landlock ABI < 6)"))
        lines.append("other processes: %s%s" % (
            "not visible (a /proc of the sandbox's own); " if report.get("private_proc") else "",
            "environ and mem unreadable, no ptrace (Landlock)" if report.get("filesystem") else
            "NOT protected by Landlock"))
        lines.append("environment: allowlist (PATH, HOME=%s, LANG, LC_*, TERM, TZ, USER, SHELL, TMPDIR%s)" % (
            "kept" if self.keep_home else "private TMPDIR",
            ", " + ", ".join(self.env_passthrough) if self.env_passthrough else ""))
        lines.append("user namespace: %s" % ("yes" if report.get("userns") else
                                             "no (%s)" % report.get("userns_error", "unavailable")))
        for err in report.get("errors") or ():
            lines.append("note: %s" % err)
        return lines

    def spawn(self, argv, env):
        """Start a confined command; returns a job for run_command."""
        import socket
        report = self.report()
        ctl = self._state["ctl"]
        if not report.get("ok") or ctl is None:
            raise ToolError("the sandbox is unavailable (%s); the command was not run" % report.get("error"))
        request = json.dumps({"argv": list(argv), "env": env}).encode("utf-8", "surrogateescape")
        if len(request) > _SPAWN_MAX:
            raise ToolError("command too long for the sandbox (%d bytes; at most %d)" % (len(request), _SPAWN_MAX))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                socket.send_fds(ctl, [request], [out_w, err_w, theirs.fileno()])
        except OSError as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            mine.close()
            raise ToolError("the sandbox helper is gone (%s); no command can run in this run" % exc)
        finally:
            os.close(out_w)
            os.close(err_w)
            theirs.close()
        return _SandboxJob(mine, out_r, err_r, argv[0])  # no round trip: the exit (or error) comes on `mine`

    def watch(self):
        """The run's ProtectedWatch (made at the first command), or None where commands cannot write."""
        with self._lock:
            if self._watch is None:
                self._watch = False if self.confined and self.access == READ_ONLY else ProtectedWatch(self.confinement)
            return self._watch or None

    def close(self):
        self._finalizer()


_SPAWN_MAX = 200000  # bytes of one request; the helper reads requests into a buffer of this size
_REPORT_MAX = 1 << 20  # bytes of the helper's report, read as one message


def _sandbox_cleanup(state):
    import shutil
    ctl, proc = state.get("ctl"), state.get("proc")
    if ctl is not None:
        ctl.close()  # the helper kills every command still running and exits
    if proc:
        try:
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait()
    if state.get("tmpdir"):
        shutil.rmtree(state["tmpdir"], ignore_errors=True)


class _SandboxJob:
    """A command the helper started: its stdout/stderr pipes and its socket (exit status; closing kills)."""

    def __init__(self, sock, out_fd, err_fd, program):
        self.sock, self.stdout, self.stderr = sock, out_fd, err_fd
        self.exit_fd = sock.fileno()
        self.program = program
        self.code = None
        self.error = None

    def read(self, timeout=None):
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except OSError:
            data = b""
        return json.loads(data.decode()) if data else {}

    def poll(self):
        return self.code is not None

    def exited(self):
        self._take(self.read())
        return True

    def _take(self, reply):
        if "error" in reply:  # it never started (not found, not executable): as Popen would say it
            self.error = OSError(reply.get("errno") or 0, reply["error"], self.program)
        self.code = reply.get("exit", -9)  # no answer: the helper died, and with it the command

    def finish(self):
        if self.code is None:
            try:
                self.sock.send(b"kill")  # PID 1 of its namespace: SIGKILL takes every descendant along
            except OSError:
                pass
            self._take(self.read(timeout=10))
        self.close()
        if self.error is not None:
            raise self.error
        return self.code

    def close(self):
        self.sock.close()
        for fd in (self.stdout, self.stderr):
            try:
                os.close(fd)
            except OSError:
                pass


# ---- Terminal: the sandbox helper (inside its namespaces) ----

def _sandbox_helper(spec_text):
    """The helper process: confine itself once, then start commands on request (see the section header).

    Runs as `python -I -S -c …` with the commands' environment; everything below happens in this small,
    single-threaded process, never in the agent.
    """
    import array  # noqa: F401 (socket.recv_fds) — all imported now: as nobody (see _enter_as_nobody) this
    import ctypes  # process may not reach the interpreter's own directory once its mounts are made
    import resource  # noqa: F401
    import selectors  # noqa: F401
    import signal
    import socket
    import struct  # noqa: F401
    spec = json.loads(spec_text)
    os.set_inheritable(spec["fd"], False)  # commands never get the agent's end of the conversation
    ctl = socket.socket(fileno=spec["fd"])
    missing = set(spec.get("assume_missing") or ())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    report = {"ok": True, "errors": [], "access": spec["access"], "protected_needed": bool(spec["protected"] or spec.get("hidden"))}
    if not spec.get("nested_complete", True):
        report["errors"].append("the working directory is too large to look for every nested .git/.hg: "
                                "those past the first %d directories are not read-only, and a new one there "
                                "is not noticed" % ProtectedWatch.MAX_DIRS)

    def check(result, what):
        if result == -1:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def prctl(option, value):
        return libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                          ctypes.c_ulong(0))

    def bind_read_only(source, path):
        """`source` bound over `path`, read-only (the remount keeps the flags the mount was locked with)."""
        s, p = source.encode("utf-8", "surrogateescape"), path.encode("utf-8", "surrogateescape")
        check(libc.mount(s, p, None, ctypes.c_ulong(_MS_BIND | _MS_REC), None), "bind %s" % path)
        vfs = os.statvfs(path)
        locked = 0
        for st_flag, ms_flag in ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
                                 (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME),
                                 (os.ST_RELATIME, _MS_RELATIME)):
            if vfs.f_flag & st_flag:
                locked |= ms_flag
        check(libc.mount(None, p, None, ctypes.c_ulong(_MS_BIND | _MS_REMOUNT | _MS_RDONLY | locked), None),
              "read-only %s" % path)

    uid, gid = os.getuid(), os.getgid()
    # 1. namespaces: user (to be allowed the rest; as root, nobody to the kernel), mount (read-only views),
    #    IPC (System V objects and POSIX queues of the run's own), network (none), PID (ours, and one per
    #    command inside it)
    flags = _CLONE_NEWNS | _CLONE_NEWIPC | (0 if spec["network"] else _CLONE_NEWNET) | (
        0 if "pidns" in missing else _CLONE_NEWPID)
    idmapped = []
    try:
        if "userns" in missing:
            raise OSError(0, "assumed missing (agent.terminal.sandbox_assume_missing)")
        if uid == 0 and spec.get("mounts"):
            try:
                idmapped = _enter_as_nobody(libc, spec, ctl)  # only the child comes back
            except OSError as exc:
                report["root_files_error"] = "idmapped mounts refused: %s" % (exc.strerror or exc)
        if not idmapped:
            check(libc.unshare(ctypes.c_int(_CLONE_NEWUSER)), "unshare(user)")
            _write_once("/proc/self/setgroups", "deny")
            _write_once("/proc/self/uid_map", "%d %d 1" % (uid, uid))
            _write_once("/proc/self/gid_map", "%d %d 1" % (gid, gid))
        check(libc.unshare(ctypes.c_int(flags)), "unshare")
        report["userns"] = True
    except OSError as exc:
        report["userns"], report["userns_error"] = False, exc.strerror or str(exc)
        if "userns" not in missing and libc.unshare(ctypes.c_int(flags)) == 0:  # privileged: no user ns needed
            report["errors"].append("no user namespace (%s); namespaces made with our own privileges"
                                    % report["userns_error"])
        else:
            flags = 0
    report["netns"], report["ipc"] = bool(flags & _CLONE_NEWNET), bool(flags & _CLONE_NEWIPC)
    report["root_files"] = uid != 0 or bool(idmapped and flags & _CLONE_NEWNS)
    if uid == 0 and not spec.get("mounts"):
        report["root_files_error"] = "assumed missing (agent.terminal.sandbox_assume_missing)"
    # a session keyring of its own: the agent's is not this process's to search (seccomp, below, also
    # refuses commands the keyring calls, since no namespace separates the kernel's keys)
    calls = _SECCOMP_ARCH.get(os.uname().machine, (0, {}))[1]
    report["keyring"] = "keyctl" in calls and libc.syscall(  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
        ctypes.c_long(calls["keyctl"]), ctypes.c_long(1), None) >= 0
    protected = []
    report.update(metadata=False, shm=False)
    if flags & _CLONE_NEWNS:
        try:  # nothing mounted here may propagate back to the system's mount namespace
            check(libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "make / private")
            _read_only_view(libc, spec, idmapped, report)
            for path in spec.get("pinned") or ():  # first: a bind made after would hide the read-only ones
                p = path.encode("utf-8", "surrogateescape")
                check(libc.mount(p, p, None, ctypes.c_ulong(_MS_BIND | _MS_REC), None), "pin %s" % path)
            for path in spec["protected"]:
                bind_read_only(path, path)
                protected.append(path)
            for path in spec.get("hidden") or ():  # nothing to read: an empty read-only tmpfs, or /dev/null
                p = path.encode("utf-8", "surrogateescape")
                if os.path.isdir(path):
                    check(libc.mount(b"tmpfs", p, b"tmpfs", ctypes.c_ulong(_MS_RDONLY | _MS_NOSUID | _MS_NODEV |
                                                                           _MS_NOEXEC), b"size=4k,mode=000"),
                          "hide %s" % path)
                else:
                    bind_read_only("/dev/null", path)
                protected.append(path)
            # the working directory again, through the new mounts: the cwd this process started with still
            # reaches the directory *under* a read-only bind of the jail itself or of a directory holding it
            # (a jail inside .git or ~/.ssh), and every command inherits it
            os.chdir(spec["root"])
            report["protected"] = True
        except OSError as exc:
            report["protected"], report["protected_error"] = False, exc.strerror or str(exc)
    else:
        report["protected"], report["protected_error"] = False, "no mount namespace"
    # what `profile sandbox` names: the first of them and how many (the report is one message of at most
    # _REPORT_MAX bytes: 2,000 protected links cut it, and every command was refused, round 19f)
    report["protected_paths"], report["protected_count"] = protected[:200], len(protected)
    own_pidns = None
    if flags & _CLONE_NEWPID:
        child = os.fork()  # the child is PID 1 of the run's PID namespace: when it dies, every command dies
        if child:
            _stay_behind(child, ctl)
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the process the agent started goes, this one goes
        try:
            own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            check(libc.unshare(ctypes.c_int(_CLONE_NEWPID)), "unshare(pid)")  # probe, then put back
            check(libc.setns(ctypes.c_int(own_pidns), ctypes.c_int(_CLONE_NEWPID)), "setns(pid)")
            report["descendants"] = True
        except OSError as exc:
            report["descendants"], report["pidns_error"] = False, exc.strerror or str(exc)
        # a /proc of this PID namespace: the agent and every other process of the system are not even listed
        # (their command lines included); where the kernel refuses (a container's masked /proc), the system's
        # /proc stays, and Landlock still keeps other processes' environ and memory unreadable
        report["private_proc"] = bool(flags & _CLONE_NEWNS) and "proc" not in missing and libc.mount(
            b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC), None) == 0
        if own_pidns is not None:
            os.close(own_pidns)  # opened through the system's /proc: take it again through ours
            own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    else:
        report["descendants"] = False
        report["pidns_error"] = "assumed missing" if "pidns" in missing else "no PID namespace"
    for listing in ("/proc/keys", "/proc/key-users") if flags & _CLONE_NEWNS else ():
        try:  # every key this uid may view, the agent's included: described by name, in any namespace
            bind_read_only("/dev/null", listing)
        except OSError:
            report["keyring"] = False
    # 2. no new privileges, no tracing of this process, no root privileges gained by exec in the namespace
    prctl(_PR_SET_DUMPABLE, 0)
    if os.getuid() == 0:
        prctl(_PR_SET_SECUREBITS, _SECBIT_NOROOT_AND_LOCKED)
    check(prctl(_PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    # 3. no unix sockets by path (seccomp): Landlock does not mediate connect(), and a socket anywhere on the
    #    system is reachable by its name: the session bus or systemd's (systemd-run --user starts a process
    #    outside the sandbox that outlives the run), docker.sock (root), gpg-agent, ssh-agent
    try:
        if "seccomp" in missing:
            raise OSError(0, "assumed missing (agent.terminal.sandbox_assume_missing)")
        _seccomp_filter(libc)
        report["unix_sockets"] = True
    except OSError as exc:
        report["unix_sockets"], report["unix_sockets_error"] = False, exc.strerror or str(exc)
    report["keyring"] = report["keyring"] and report["unix_sockets"]
    # 4. Landlock
    abi = 0 if "landlock" in missing else landlock_abi()
    for item in missing:  # "abi:N": behave as a kernel with Landlock ABI N at most (tests every ABI's masks)
        if item.startswith("abi:") and item[4:].isdigit():
            abi = min(abi, int(item[4:]))
    report["landlock"] = abi
    report.update(filesystem=False, landlock_net=False, scopes=False, truncate=abi >= 3)
    if abi:
        try:
            _landlock_restrict(libc, abi, spec, missing, report)
        except OSError as exc:
            report["filesystem_error"] = exc.strerror or str(exc)
            report["filesystem"] = report["landlock_net"] = report["scopes"] = False
    else:
        report["filesystem_error"] = "no Landlock in this kernel" if "landlock" not in missing else \
            "Landlock assumed missing (agent.terminal.sandbox_assume_missing)"
    report["network"] = report["netns"] or report["landlock_net"]
    report["limits"] = _set_limits(spec.get("limits") or {})
    ctl.send(json.dumps(report).encode())
    _helper_loop(libc, ctl, own_pidns, check)


def _helper_loop(libc, ctl, own_pidns, check):
    """Start commands (each PID 1 of a new PID namespace when there is one), report exits, kill on request
    or when the command's socket closes; on EOF from the agent kill everything and leave."""
    import ctypes
    import selectors
    import socket
    import struct
    devnull = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    jobs = {}  # pid -> its socket, or None once the agent closed it

    def kill(pid):
        for send in (os.kill, os.killpg):  # PID 1 of its namespace takes every descendant along
            try:
                send(pid, signal.SIGKILL)  # the pid is ours until we reap it: never someone else's
            except OSError:
                pass

    running = True
    while running or jobs:
        for key, _ in sel.select():
            what = key.data
            if what == "ctl":
                try:  # MSG_CMSG_CLOEXEC: a command must not inherit another's pipes or its own socket
                    msg, anc, _flags, _addr = ctl.recvmsg(_SPAWN_MAX, socket.CMSG_LEN(3 * 4), socket.MSG_CMSG_CLOEXEC)
                    fds = [fd for level, kind, data in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                           for fd in struct.unpack("%di" % (len(data) // 4), data[:len(data) // 4 * 4])]
                except OSError:
                    msg, fds = b"", []
                if not msg or len(fds) != 3:
                    for fd in fds:
                        os.close(fd)
                    if not msg:
                        running = False
                        sel.unregister(ctl)
                        for pid in jobs:
                            kill(pid)
                    continue
                out_fd, err_fd, sock_fd = fds
                sock = socket.socket(fileno=sock_fd)
                try:
                    req = json.loads(msg.decode("utf-8", "surrogateescape"))
                    if own_pidns is not None:  # the next child is PID 1 of a namespace of its own
                        check(libc.setns(ctypes.c_int(own_pidns), ctypes.c_int(_CLONE_NEWPID)), "setns(pid)")
                        check(libc.unshare(ctypes.c_int(_CLONE_NEWPID)), "unshare(pid)")
                    pid = os.posix_spawnp(req["argv"][0], req["argv"], req["env"], setsid=True,
                                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD),
                                          file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),
                                                        (os.POSIX_SPAWN_DUP2, out_fd, 1),
                                                        (os.POSIX_SPAWN_DUP2, err_fd, 2)])
                except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
                    try:
                        sock.send(json.dumps({"error": getattr(exc, "strerror", None) or str(exc),
                                              "errno": getattr(exc, "errno", 0) or 0}).encode())
                    except OSError:
                        pass
                    sock.close()
                    continue
                finally:
                    os.close(out_fd)
                    os.close(err_fd)
                jobs[pid] = sock
                sel.register(sock, selectors.EVENT_READ, pid)
            elif what == "child":
                try:
                    os.read(wake_r, 512)
                except OSError:
                    pass
                while True:  # reap every child that ended: commands, and orphans handed to us
                    try:
                        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    except ChildProcessError:
                        break
                    if info is None or not info.si_pid:
                        break
                    pid = info.si_pid
                    if pid in jobs:
                        kill(pid)  # not reaped yet: without a PID namespace, what is left in its group
                    _, status = os.waitpid(pid, 0)
                    if pid not in jobs:
                        continue
                    if (sock := jobs.pop(pid)) is not None:
                        sel.unregister(sock)
                        try:
                            sock.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                        except OSError:
                            pass
                        sock.close()
            else:  # a command's socket: "kill", or closed by the agent
                pid = what
                if jobs.get(pid) is not key.fileobj:
                    continue  # reaped earlier in this batch: its pid is no longer ours to signal
                try:
                    data = key.fileobj.recv(64)
                except OSError:
                    data = b""
                kill(pid)
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    jobs[pid] = None
    os._exit(0)


def _stay_behind(child, ctl):
    """The parent's part once its child carries on (into a PID namespace, or as nobody): wait, then exit with
    the child's status, holding nothing of the conversation with the agent."""
    ctl.close()
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _enter_as_nobody(libc, spec, ctl):
    """Running as root (CI containers do): a child enters a user namespace where it is uid 0 but, to the
    kernel, nobody (65534), so files only root may read (/etc/shadow, keys under /etc/ssl/private) are closed
    to every command by the system's own permissions; capabilities would not help, root owns those files.
    What commands must own is mounted idmapped, root's files shown as theirs, and what they must reach under
    a directory others cannot enter is bound as it is (spec["mounts"], see _root_mounts). Only root in the
    system's namespace may write such a uid map, idmap a mount or reach into /root, so this process does
    it all, hands the mounts over and stays behind as the child's waiter.
    Returns the mount descriptors in the child; OSError (the child gone, nothing changed) where refused."""
    import ctypes
    import socket
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    os.setgroups([])  # root's supplementary groups would be the child's
    child = os.fork()
    if child == 0:
        here.close()
        there.send(b"ready" if libc.unshare(ctypes.c_int(_CLONE_NEWUSER)) == 0 else b"refused")
        msg, fds, _, _ = socket.recv_fds(there, 16, len(spec["mounts"]["entries"]), socket.MSG_CMSG_CLOEXEC)
        if msg != b"go":
            os._exit(0)
        there.close()
        os.setresgid(0, 0, 0)  # root inside, 65534 outside; the namespace's capabilities stay for the set-up
        os.setresuid(0, 0, 0)
        libc.prctl(ctypes.c_int(1), ctypes.c_ulong(9), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        return fds  # PR_SET_PDEATHSIG SIGKILL: its waiter gone, it goes
    there.close()
    libc.prctl(ctypes.c_int(_PR_SET_DUMPABLE), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))
    fds, userns = [], None
    try:
        if here.recv(16) != b"ready":
            raise OSError(0, "no user namespace")
        if len(spec["mounts"]["entries"]) > 250:  # SCM_MAX_FD
            raise OSError(0, "too many directories to mount")
        for name, text in (("setgroups", "deny"), ("uid_map", "0 65534 1"), ("gid_map", "0 65534 1")):
            _write_once("/proc/%d/%s" % (child, name), text)
        userns = os.open("/proc/%d/ns/user" % child, os.O_RDONLY | os.O_CLOEXEC)
        for path, writable, idmapped, _ in spec["mounts"]["entries"]:
            fds.append(_syscall(libc, _OPEN_TREE, _AT_FDCWD, path.encode("utf-8", "surrogateescape"),
                                _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC))
            _mount_setattr(libc, fds[-1], b"", _AT_EMPTY_PATH | _AT_RECURSIVE, (_MOUNT_ATTR_IDMAP if idmapped
                           else 0) | (0 if writable else _MOUNT_ATTR_RDONLY), userns=userns if idmapped else 0)
        socket.send_fds(here, [b"go"], fds)
    except OSError:
        try:
            here.send(b"no")
        except OSError:
            pass
        os.waitpid(child, 0)
        raise
    finally:
        for fd in fds + ([userns] if userns is not None else []):
            os.close(fd)
        here.close()
    os.setresgid(65534, 65534, 65534)  # a waiter needs no privilege
    os.setresuid(65534, 65534, 65534)
    _stay_behind(child, ctl)


def _read_only_view(libc, spec, idmapped, report):
    """The mount namespace's view: everything read-only, so that what Landlock does not mediate (chmod and
    the setuid bit, chown, utime, xattrs) fails outside the writable roots too; then the writable roots
    writable again (the mounts made for a root run, or the working directory and TMPDIR bound onto
    themselves), and a /dev/shm of the run's own (POSIX semaphores and shared memory: multiprocessing)."""
    import ctypes
    try:
        if "readonly-view" in spec["assume_missing"]:
            raise OSError(0, "assumed missing (agent.terminal.sandbox_assume_missing)")
        _mount_setattr(libc, _AT_FDCWD, b"/", _AT_RECURSIVE, _MOUNT_ATTR_RDONLY)
        report["metadata"] = True
    except OSError as exc:
        report["metadata_error"] = exc.strerror or str(exc)
    covers = spec["mounts"]["covers"] if idmapped else []
    for path in covers:  # what lies under /root stays out of sight, but for what is mounted below
        if libc.mount(b"tmpfs", path.encode("utf-8", "surrogateescape"), b"tmpfs",
                      ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC), b"mode=755,size=64k") != 0:
            raise OSError(ctypes.get_errno(), "cover %s" % path)
    for (path, _, _, is_dir), fd in zip(spec["mounts"]["entries"] if idmapped else (), idmapped):
        if not os.path.lexists(path):  # a mount point in a cover
            os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
            if not is_dir:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        _syscall(libc, _MOVE_MOUNT, fd, b"", _AT_FDCWD, path.encode("utf-8", "surrogateescape"),
                 _MOVE_MOUNT_F_EMPTY_PATH)
        os.close(fd)
    for path in covers:
        _mount_setattr(libc, _AT_FDCWD, path.encode("utf-8", "surrogateescape"), 0, _MOUNT_ATTR_RDONLY)
    for path in spec["writable"] if report["metadata"] and not idmapped else ():
        p = path.encode("utf-8", "surrogateescape")
        if libc.mount(p, p, None, ctypes.c_ulong(_MS_BIND | _MS_REC), None) != 0:
            raise OSError(ctypes.get_errno(), "bind %s" % path)
        try:
            _mount_setattr(libc, _AT_FDCWD, p, _AT_RECURSIVE, 0, _MOUNT_ATTR_RDONLY)
        except OSError:  # a mount inside it that the system made read-only stays so
            _mount_setattr(libc, _AT_FDCWD, p, 0, 0, _MOUNT_ATTR_RDONLY)
    memory = int((spec.get("limits") or {}).get("memory_mb") or 0)
    if spec["writable"] and os.path.isdir("/dev/shm") and libc.mount(
            b"tmpfs", b"/dev/shm", b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC),
            b"mode=1777" + (b",size=%dm" % memory if memory else b"")) == 0:
        spec["rules"].append(("/dev/shm", "rw"))
        report["shm"] = True


def _set_limits(limits):
    """agent.terminal.limits as rlimits of this process and so of every command (soft = hard: a command
    cannot raise them). Tasks are counted per user namespace, so only the sandbox's own count."""
    import resource
    applied = {}
    for name, which, scale in (("processes", resource.RLIMIT_NPROC, 1), ("memory_mb", resource.RLIMIT_DATA, 1 << 20),
                               ("file_size_mb", resource.RLIMIT_FSIZE, 1 << 20)):
        value = int(limits.get(name) or 0) * scale
        hard = resource.getrlimit(which)[1]
        if value and (hard == resource.RLIM_INFINITY or value < hard):
            try:
                resource.setrlimit(which, (value, value))
                applied[name] = limits[name]
            except (OSError, ValueError):
                pass
    return applied


def _write_once(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _syscall(libc, *args):
    import ctypes
    result = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _mount_setattr(libc, dirfd, path, flags, attr_set, attr_clr=0, userns=0):
    import ctypes
    attr = (ctypes.c_uint64 * 4)(attr_set, attr_clr, 0, userns)  # struct mount_attr
    _syscall(libc, _MOUNT_SETATTR, dirfd, path, flags, ctypes.byref(attr), ctypes.sizeof(attr))


# the new mount API (linux/mount.h, 5.12+); syscall numbers of the generic table, as Landlock's
_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442
_AT_FDCWD, _AT_EMPTY_PATH, _AT_RECURSIVE = -100, 0x1000, 0x8000
_OPEN_TREE_CLONE, _MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 1, 4, 1, 0x100000

#: seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h) for _seccomp_filter: the native architecture and
#: the numbers of the syscalls it judges
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "io_uring_setup": 425, "add_key": 248,
                            "request_key": 249, "keyctl": 250, "openat2": 437,
                            "mode1": (90, 91, 85, 133), "mode2": (268, 452, 2, 259), "mode3": (257,)}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "io_uring_setup": 425, "add_key": 217,
                             "request_key": 218, "keyctl": 219, "openat2": 437,
                             "mode1": (52,), "mode2": (53, 452, 33), "mode3": (56,)})}
#: where a file's mode is the Nth argument: chmod, fchmod, creat, mknod (1); fchmodat, fchmodat2, open,
#: mknodat (2); openat (3)
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_BPF = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "and": 0x54, "ret": 0x06}  # ld = BPF_LD|BPF_W|BPF_ABS
_AF_UNIX, _AF_VSOCK, _EACCES, _SOCK_STREAM, _SOCK_SEQPACKET = 1, 40, 13, 1, 5
_EPERM, _ENOSYS, _S_ISUID_ISGID = 1, 38, 0o6000


def _seccomp_filter(libc):
    """A seccomp filter for this process and every command; what it refuses fails with EACCES.

    Unix sockets: a command can hold none but connected pairs of its own. socket(AF_UNIX) fails, and
    socketpair() makes stream and seqpacket pairs only: a datagram pair can be pointed at any named socket
    by sendto() or connect() (/dev/log, journald, sockets under /tmp), and seccomp cannot read the address
    those calls are given (it is behind a pointer; checking it from outside races with the command's other
    threads). Nor can a mount view help: connect() looks the name up whatever Landlock grants, and a socket
    may lie inside the working directory. So nothing the command holds can be pointed anywhere, whatever
    the name: docker.sock, the session bus, an agent's socket. AF_VSOCK is refused too (a VM's host is not
    behind the network namespace), and io_uring cannot be set up (it makes sockets without socket()).
    The kernel keyring, which no namespace separates: add_key, request_key and keyctl fail (as in Docker's
    default profile). No setuid or setgid file is made, in the tree either (EPERM for a mode with those bits
    to chmod, open, mknod and their kin, as Flatpak does; openat2, whose mode seccomp cannot see, is ENOSYS
    and callers fall back to openat): written as a uid the host knows, such a file would give whoever runs
    it that uid. A foreign architecture's syscalls (i386 through int 0x80, x32) fail, since their
    numbers differ. OSError where it cannot be applied."""
    import ctypes
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCH:
        raise OSError(0, "no seccomp filter for %s" % machine)
    arch, nr = _SECCOMP_ARCH[machine]
    code = [("ld", 4), ("jeq", arch, None, "deny"),      # seccomp_data.arch
            ("ld", 0), ("jge", 0x40000000, "deny"),      # seccomp_data.nr; x32 (x86_64 with __X32_SYSCALL_BIT)
            *[("jeq", nr[name], "deny") for name in ("io_uring_setup", "add_key", "request_key", "keyctl")],
            ("jeq", nr["socket"], "socket"), ("jeq", nr["socketpair"], "pair"), ("jeq", nr["openat2"], "nosys"),
            *[("jeq", number, label) for label in ("mode1", "mode2", "mode3") for number in nr[label]],
            ("ret", _SECCOMP_RET_ALLOW),
            "socket", ("ld", 16), ("jeq", _AF_UNIX, "deny"), ("jeq", _AF_VSOCK, "deny"),  # args[0], low half
            ("ret", _SECCOMP_RET_ALLOW),
            "pair", ("ld", 16), ("jeq", _AF_UNIX, None, "deny"), ("ld", 24), ("and", 0xF),  # args[1]: the type
            ("jeq", _SOCK_STREAM, "allow"), ("jeq", _SOCK_SEQPACKET, "allow"), ("ret", _SECCOMP_RET_ERRNO | _EACCES),
            *[item for n in (1, 2, 3) for item in ("mode%d" % n, ("ld", 16 + 8 * n), ("and", _S_ISUID_ISGID),
                                                   ("jeq", 0, "allow", "setuid"))],
            "setuid", ("ret", _SECCOMP_RET_ERRNO | _EPERM), "nosys", ("ret", _SECCOMP_RET_ERRNO | _ENOSYS),
            "deny", ("ret", _SECCOMP_RET_ERRNO | _EACCES), "allow", ("ret", _SECCOMP_RET_ALLOW)]
    labels, at = {}, 0
    for item in code:
        if isinstance(item, str):
            labels[item] = at
        else:
            at += 1
    program = []
    for item in code:
        if not isinstance(item, str):
            op, k, jt, jf = (item + (None, None))[:4]
            hop = [labels[j] - len(program) - 1 if j else 0 for j in (jt, jf)]
            program.append((_BPF[op], hop[0], hop[1], k))

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*ins) for ins in program])
    prog = Prog(len(program), filters)
    libc.prctl.argtypes = None
    if libc.prctl(ctypes.c_int(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "seccomp: %s" % os.strerror(err))


def _landlock_restrict(libc, abi, spec, missing, report):
    import ctypes

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    handled_fs = _LL_FS_BY_ABI[min(abi, _LL_KNOWN_ABI)]
    attr = RulesetAttr(handled_fs, 0, 0)
    size = 8
    if abi >= 4 and not spec["network"] and "landlock-net" not in missing:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP  # and no rule allows a port
        size = 16
    if abi >= 6 and "scopes" not in missing:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
        size = 24
    ruleset = _syscall(libc, _LL_CREATE_RULESET, ctypes.byref(attr), size, 0)
    try:
        for path, access in spec["rules"]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since the rules were made: nothing to grant
            try:
                allowed = _ACCESS[access] & handled_fs
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    allowed &= _FILE_ONLY
                rule = PathBeneath(allowed, fd)
                _syscall(libc, _LL_ADD_RULE, ruleset, _LL_RULE_PATH_BENEATH, ctypes.byref(rule), 0)
            finally:
                os.close(fd)
        _syscall(libc, _LL_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    report["filesystem"] = True
    report["landlock_net"] = bool(attr.handled_access_net)
    report["scopes"] = bool(attr.scoped)


# ---- SSRF guard: every URL checked after DNS resolution ----

class UrlBlocked(ToolError):
    pass


def parse_ipv4_loose(host):
    """inet_aton's spellings: 127.0.0.1, 2130706433, 0x7f000001, 0177.0.0.1, 127.1 -> IPv4Address or None."""
    import ipaddress
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or any(p == "" for p in parts):
        return None
    try:  # 0x…: hexadecimal, 0…: octal, else decimal
        values = [int(p[2:] or "0", 16) if p.lower().startswith("0x") else int(p, 8 if len(p) > 1 and p[0] == "0" else 10)
                  for p in parts]
    except ValueError:
        return None
    last_bits = 32 - 8 * (len(values) - 1)
    if any(v > 255 for v in values[:-1]) or values[-1] >= (1 << last_bits) or min(values) < 0:  # int() takes "-1"
        return None
    number = 0
    for v in values[:-1]:
        number = (number << 8) | v
    number = (number << last_bits) | values[-1]
    return ipaddress.IPv4Address(number)


# IANA's special-purpose address registries (iana-ipv4-special-registry, iana-ipv6-special-registry): every
# range that is not globally reachable, plus multicast. Checked as a table, because ipaddress's own flags
# differ between Python versions; then anything ipaddress does not call global is refused too, so a range
# this table misses fails closed.
SPECIAL_RANGES = (
    ("0.0.0.0/8", "a 'this network' address"), ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a carrier-grade NAT address"), ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address (cloud metadata lives here)"), ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol assignment address"), ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a deprecated 6to4 relay address"), ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"), ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"), ("224.0.0.0/4", "a multicast address"),
    ("255.255.255.255/32", "the broadcast address"), ("240.0.0.0/4", "a reserved address"),
    ("::/128", "the unspecified address"), ("::1/128", "a loopback address"),
    ("::/96", "a deprecated IPv4-compatible address"), ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"), ("100:0:0:1::/64", "a dummy address"),
    ("2001::/23", "an IETF protocol assignment address"), ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"), ("5f00::/16", "a segment-routing address"),
    ("fc00::/7", "a unique-local (private) address"), ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"), ("ff00::/8", "a multicast address"),
)
_special = []


def _special_ranges():
    if not _special:
        import ipaddress
        _special.extend((ipaddress.ip_network(net), reason) for net, reason in SPECIAL_RANGES)
    return _special


def _embedded_ipv4(ip):
    """(form, IPv4 address) for IPv6 forms that reach an IPv4 address, or None."""
    import ipaddress
    if ip.ipv4_mapped:
        return "IPv4-mapped", ip.ipv4_mapped
    packed = ip.packed
    if packed[:12] == b"\x00\x64\xff\x9b" + b"\x00" * 8:  # 64:ff9b::/96
        return "NAT64", ipaddress.IPv4Address(packed[-4:])
    if ip.sixtofour:
        return "6to4", ip.sixtofour
    if packed[:12] == b"\x00" * 12 and packed[12:] not in (b"\x00\x00\x00\x00", b"\x00\x00\x00\x01"):
        return "IPv4-compatible", ipaddress.IPv4Address(packed[-4:])
    return None


def address_block_reason(ip):
    """Why an address must not be fetched, or None for a public one. Embedded IPv4 forms are unwrapped."""
    import ipaddress
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip.split("%")[0])
    if ip.version == 6:
        if embedded := _embedded_ipv4(ip):
            form, v4 = embedded
            if inner := address_block_reason(v4):
                return "%s address embedding %s (%s)" % (form, v4, inner)
            if form != "IPv4-compatible":
                return None  # reaches exactly the embedded address, which is public
        if ip.teredo:
            for v4 in ip.teredo:
                if inner := address_block_reason(v4):
                    return "Teredo address embedding %s (%s)" % (v4, inner)
    for network, reason in _special_ranges():
        if ip.version == network.version and ip in network:
            return reason
    if ip.version == 6 and ip not in ipaddress.ip_network("2000::/3"):
        return "not a global unicast address"
    if not ip.is_global:
        return "not a public address"
    return None


def host_allowed(host, port, allowed_hosts):
    """Whether agent.tools.fetch.allowed_hosts allows `host` (as check_url spells it) on `port`: names compare
    without case or a trailing dot; an entry 'host:port' (or '[v6]:port') allows that port only. One rule for
    fetch and `policy url` (round 19a: policy url compared exactly and called LocalHost's loopback public)."""
    for entry in allowed_hosts:
        entry = str(entry).strip().lower()
        name, entry_port = entry, None
        if entry.startswith("["):
            name, _, rest = entry[1:].partition("]")
            entry_port = rest[1:] if rest.startswith(":") else None
        elif entry.count(":") == 1:
            name, entry_port = entry.split(":")
        if name.rstrip(".") == host.lower().rstrip(".") and (entry_port is None or entry_port == str(port)):
            return True
    return False


def _resolve(host, port, deadline):
    """socket.getaddrinfo, waited for until `deadline` (time.monotonic(), None: no limit). INFO: the system
    resolver cannot be interrupted; past the deadline its thread is left to finish alone (round 19a: a slow
    DNS server held a fetch with a 2 s limit for 8 s)."""
    import socket
    if deadline is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    answer = {}

    def lookup():
        try:
            answer["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except Exception as exc:
            answer["error"] = exc

    thread = threading.Thread(target=lookup, name="xzatoma-resolve", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        raise UrlBlocked("resolving %s took longer than the fetch's time limit" % host)
    if "error" in answer:
        raise answer["error"]
    return answer["infos"]


#: ASCII a URL's path and query keep as written; the rest (spaces, non-ASCII as UTF-8, "<>`{}) is
#: percent-encoded, as browsers do (round 19a: /wiki/Café failed with an 'ascii' codec error)
URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7f) if chr(c) not in '"<>`{}')


def check_url(url, allowed_hosts=(), deadline=None):
    """Validate a URL and resolve its host once (by `deadline`, time.monotonic()). Returns (scheme, host, port,
    path, address), the path and query percent-encoded, or raises UrlBlocked saying what is wrong."""
    import ipaddress
    import socket
    from urllib.parse import quote, urlsplit
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UrlBlocked("invalid URL %r: %s" % (url, exc))
    if parts.scheme not in ("http", "https"):
        raise UrlBlocked("only http and https URLs can be fetched, not %r" % (parts.scheme or url))
    if not (host := (parts.hostname or "").rstrip(".")):
        raise UrlBlocked("the URL has no host: %s" % url)
    port = port or (443 if parts.scheme == "https" else 80)
    path = quote(parts.path or "/", safe=URL_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=URL_SAFE)
    allowed = host_allowed(host, port, allowed_hosts)
    literal = None
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = parse_ipv4_loose(host)
    if literal is not None:
        if not allowed and (reason := address_block_reason(literal)):
            raise UrlBlocked("%s is %s" % (literal, reason))
        return parts.scheme, host, port, path, str(literal)
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise UrlBlocked("the host %r is not a valid name" % host)
    if not re.fullmatch(r"[A-Za-z0-9._-]+", ascii_host):
        raise UrlBlocked("the host %r is not a valid name" % host)
    try:
        infos = _resolve(host, port, deadline)
    except (socket.gaierror, UnicodeError) as exc:
        raise UrlBlocked("cannot resolve %s: %s" % (host, exc.strerror if hasattr(exc, "strerror") and
                                                    exc.strerror else exc))
    addresses = []
    for info in infos:
        addr = info[4][0]
        if addr not in addresses:
            addresses.append(addr)
    if not allowed:
        for addr in addresses:
            if reason := address_block_reason(addr):
                raise UrlBlocked("%s resolves to %s, %s" % (host, addr, reason))
    return parts.scheme, host, port, path, addresses[0]


def url_verdict(url, allowed_hosts=()):
    """('allow'|'block', reason) for `xzatoma policy url`."""
    try:
        scheme, host, port, path, address = check_url(url, allowed_hosts)
    except UrlBlocked as exc:
        return "block", str(exc)
    if host_allowed(host, port, allowed_hosts):
        return "allow", "%s is in agent.tools.fetch.allowed_hosts (connects to %s)" % (host, address)
    return "allow", "%s resolves to %s, a public address" % (host, address) if host != address else \
        "%s is a public address" % address
