"""XZatoma MCP client: tools from Model Context Protocol servers, confined and approved like XZatoma's own.

Read top to bottom: configuration (xzatoma.yaml's `mcp.servers` and a project's `.mcp.json`, with the trust it
needs), JSON-RPC, the stdio transport (the server starts inside XZatoma's OS sandbox), the Streamable HTTP
transport (JSON or SSE answers), OAuth 2.1 (tried only after a 401), the client (which protocol generation a
server speaks: the 2026-07-28 `server/discover` probe, else the 2025 `initialize` handshake; tools/list;
tools/call with progress and cancellation), MCP tools as XZatoma tools (approval rules, results), and the
Servers of one run (started under one deadline, a death reported once, all stopped at the end).

Only the standard library and XZatoma's own tools/store modules are imported; this module never imports
xzatoma: xzatoma hands it the configuration, a factory of sandboxes (xzatoma_tools.Sandbox), a credential
store, the functions that talk to people and whether anyone can be asked. xzatoma imports it only when servers
are configured, so a run without MCP pays nothing for it.
"""

import json
import math
import os
import queue
import re
import threading
import time

from xzatoma_tools import EXECUTE, READ, Tool, ToolError, ToolResult, render_json, render_untrusted
from xzatoma_tools import _shut_down as _shut  # a connection's socket shut under whoever reads it

#: the protocol revisions this client speaks: the stateless one (per-request _meta, `server/discover`), and the
#: handshake ones, newest first (the first is what `initialize` asks for; the others are accepted as answers)
MODERN_VERSIONS = ("2026-07-28",)
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
UNSUPPORTED_VERSION = -32022  #: UnsupportedProtocolVersionError (2026-07-28 schema)
MODERN_ERRORS = (-32020, -32021, UNSUPPORTED_VERSION)  #: HeaderMismatch, MissingRequiredClientCapability, …
METHOD_NOT_FOUND = -32601
DEFAULT_TIMEOUT = 30  #: seconds: start-up + handshake of a server, and each call (mcp.timeout_seconds)
PROBE_SECONDS = 3  #: a stdio server silent this long after `server/discover` speaks the 2025 protocol
MAX_MESSAGE = 32 << 20  #: bytes of one message from a server; a longer line is logged in pieces and dropped
LOG_MAX = 1 << 20  #: bytes of a server's stderr kept in its log per run
NAME_MAX = 64  #: characters of a tool name the providers accept ([A-Za-z0-9_-])
OUTBOX_MAX = 64  #: answers to a server's own requests waiting to be sent; beyond it they are dropped (a flood)
REPLY_SECONDS = 2  #: longest one of those answers (or a cancel) may take to send
CLOSE_SECONDS = 2  #: longest the goodbye to an HTTP server (DELETE of its session) may take
PROGRESS_INTERVAL = 0.25  #: seconds between two progress lines of one call shown to a person (the rest dropped)


class McpError(Exception):
    """Something about a server, as one line for a person or the model."""


class ConfigError(McpError):
    """A mistake in the servers' configuration (exit 2)."""


class AuthNeeded(McpError):
    """The server wants a login that cannot happen here (a headless run): the message says how."""


def load_json(text):
    """json.loads that fails only with ValueError: text nested deeper than the parser's recursion limit (a
    server's `[[[[…`, a project's .mcp.json) is an invalid document like any other, never a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply")


def _guarded(target, log, what):
    """A thread's target that never dies with a traceback on the person's terminal: whatever escapes it (a
    bug, or a server's message no check foresaw) is written to the server's log."""
    def run(*args):
        try:
            target(*args)
        except Exception as exc:  # noqa: BLE001 - the last line of defence of a thread
            import traceback
            try:
                log.write("internal error in %s: %s: %s\n%s" % (what, type(exc).__name__, exc,
                                                                traceback.format_exc()))
            except Exception:  # noqa: BLE001
                pass
    return run


# ---- Configuration: mcp.servers in xzatoma.yaml, mcpServers in a project's .mcp.json ----

PROJECT_FILE = ".mcp.json"
SANDBOX_CHOICES = ("workspace-write", "read-only", "off")
SERVER_KEYS = {
    "command": "the program of a stdio server (searched on PATH)",
    "args": "its arguments",
    "env": "environment variables it gets beside the allowlist (values may use ${VAR})",
    "url": "the Streamable HTTP endpoint of a remote server",
    "type": "stdio | http (streamable-http); default: http with url, stdio with command",
    "transport": "the same as type",
    "headers": "HTTP headers sent to a remote server (values may use ${VAR})",
    "bearer_token": "a token sent as 'Authorization: Bearer …' (use ${VAR}, never the token itself)",
    "bearer_token_env": "the environment variable holding that token",
    "oauth": "client_id, client_secret, scopes, callback_port for a server's OAuth 2.1 login",
    "network": "the stdio server may use the network (default false: no network in its sandbox)",
    "sandbox": "workspace-write | read-only | off (default: agent.terminal.sandbox)",
    "read_paths": "more directories the stdio server may read (its installation, outside PATH)",
    "timeout_seconds": "its start-up and handshake, and each call, end after this long",
    "tools": "the only tools offered to the model (default: all the server lists)",
    "enabled_tools": "the same as tools",
    "disabled_tools": "tools never offered",
    "allow": "tools that run without asking, in every mode (\"*\": all of this server's)",
    "read_only": "tools you declare read-only: offered in planning mode, run without asking",
    "trust_read_only_hint": "believe this server's readOnlyHint annotations (they then count as read_only)",
    "enabled": "false: not started",
}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(value, env, where, warnings):
    """${VAR} and ${VAR:-default} from the environment (credentials stay out of files)."""
    def sub(m):
        name, default = m.group(1), m.group(2)
        if name in env and (env[name] or default is None):
            return env[name]
        if default is not None:
            return default
        warnings.append("%s refers to ${%s}, which is not set" % (where, name))
        return ""
    return _VAR.sub(sub, value) if isinstance(value, str) else value


class Refused(ConfigError):
    """A project's server whose values would hand it the environment's credentials: it is not started."""


#: a header or env entry by this name carries a credential, whatever variable fills it
_CREDENTIAL_HEADER = re.compile(r"(?i)^(?:authorization|proxy-authorization|cookie)$|key|token|secret|auth|pass|session")


def project_guard(env, own=()):
    """What a project's .mcp.json may take from the environment: why(var, credential_place) is None for a plain
    variable (HOME, a region, a port), else why ${var} is refused there. Refused: the agent's own credentials
    (`own`: the variables XZatoma reads its keys from), XZATOMA_* variables, any variable named like a
    credential (*_KEY, *_TOKEN, *_SECRET, *PASSWORD*, …: xzatoma_store.is_credential_env), any variable whose
    value the redactor knows or recognises as a credential, and any variable at all in a place that carries a
    credential (bearer_token, bearer_token_env, oauth, a credential-named header or env entry). Decided by name
    first, so an unset credential is refused too: what a file may do does not depend on this shell."""
    from xzatoma_store import is_credential_env, redact
    own = set(own)

    def why(var, credential_place=False):
        value = env.get(var) or ""
        if var in own:
            return "the agent's own credential"
        if var.upper().startswith("XZATOMA_"):
            return "XZatoma's own variable"
        if is_credential_env(var, value):
            return "a credential by its name"
        if credential_place:
            return "a credential by where it goes"
        if value and redact(value) != value:
            return "a credential by its value"
        return None
    return why


def _written(value):
    """One value of a server's entry, as written in its file, for a question: quoted as a shell would need it,
    a newline, tab or CR shown as \\n (never a line of its own), every other hidden character made visible."""
    import shlex
    text = "" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = shlex.quote(text) if text == "" or re.search(r"[^\w@%+=:,./${}-]", text) else text
    text = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return render_untrusted(text, exact=True)


class ServerConfig:
    """One server as configured: how to reach it, what it may touch, and which calls need nobody's yes."""

    def __init__(self, name, origin, transport, command=None, args=(), env=None, url=None, headers=None,
                 bearer_token=None, oauth=None, network=False, sandbox=None, read_paths=(), timeout=DEFAULT_TIMEOUT,
                 tools=None, disabled_tools=(), allow=(), read_only=(), trust_read_only_hint=False, enabled=True,
                 written=None):
        self.name = name  #: the key in mcp.servers / mcpServers
        self.origin = origin  #: where it was configured (a file's path), for messages
        self.transport = transport  #: "stdio" or "http"
        self.command, self.args = command, list(args)  #: stdio: the program and its arguments
        self.env = dict(env or {})  #: stdio: environment beside the allowlist
        self.url, self.headers = url, dict(headers or {})  #: http: the MCP endpoint and extra headers
        self.bearer_token = bearer_token  #: http: a configured token (from ${VAR} or bearer_token_env)
        self.oauth = dict(oauth or {})  #: http: client_id, client_secret, scopes, callback_port
        self.network = network  #: stdio: the sandbox lets it use the network
        self.sandbox = sandbox  #: stdio: workspace-write, read-only or off (None: agent.terminal.sandbox)
        self.read_paths = list(read_paths)  #: stdio: more directories it may read
        self.timeout = timeout  #: seconds for start-up + handshake, and for each call
        self.tools = None if tools is None else set(tools)  #: the tools offered (None: all)
        self.disabled_tools = set(disabled_tools)
        self.allow = set(allow)  #: tools that run without asking ("*": all)
        self.read_only = set(read_only)  #: tools declared read-only by the person
        self.trust_read_only_hint = trust_read_only_hint
        self.enabled = enabled
        self.written = dict(written or {})  #: what it sends as its file wrote it (${VAR} not expanded)
        self.project = False  #: from a project's .mcp.json: stored tokens only for its own URL (OAuth._load)

    def describe(self):
        """How it is reached, for `mcp list` and questions: `stdio: node server.js`, `http: https://…` (a newline,
        CR or tab in it shown as \\n: a line of its own could pass for another server or an answer)."""
        from xzatoma_store import one_line_path
        if self.transport == "stdio":
            return one_line_path("stdio: " + " ".join([self.command] + self.args))
        return one_line_path("http: " + self.url)

    def written_lines(self):
        """Everything this server would be given, as its file wrote it (${VAR} as written, not its value), for
        the question that trusts a project's file: `stdio: python3 srv.py`, then `env: LOG_LEVEL=${X}`,
        `header: X-Trace: ${X}`, `bearer_token_env: NAME`, each value made safe to show (_written)."""
        w = self.written
        if self.transport == "stdio":
            head = "stdio: " + " ".join(_written(v) for v in [w.get("command")] + list(w.get("args") or []))
            lines = ["env: %s=%s" % (_written(k), _written(v)) for k, v in (w.get("env") or {}).items()]
        else:
            head = "http: " + _written(w.get("url"))
            lines = ["header: %s: %s" % (_written(k), _written(v)) for k, v in (w.get("headers") or {}).items()]
            for key in ("bearer_token", "bearer_token_env"):
                if w.get(key) is not None:
                    lines.append("%s: %s" % (key, _written(w[key])))
            lines += ["oauth.%s: %s" % (_written(k), _written(v)) for k, v in (w.get("oauth") or {}).items()]
        head += "".join(", " + flag for flag, on in (("network", self.network), ("disabled", not self.enabled)) if on)
        return [head] + lines


def _strings(value, where):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError("%s must be a list of text values" % where)
    return value


def _mapping(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError("%s must be a mapping of names to text values" % where)
    return {k: "" if v is None else str(v) if isinstance(v, (int, float, bool)) else v for k, v in value.items()}


def parse_server(name, raw, origin, env, warnings, default_timeout=DEFAULT_TIMEOUT, guard=None):
    """A ServerConfig from one entry of mcp.servers or mcpServers; ConfigError names the key that is wrong.
    guard (a project's file: project_guard) decides which ${VAR} may be expanded; Refused names the first that
    may not."""
    where = "%s: mcp server '%s'" % (origin, name)

    def refuse(place, var, reason):
        raise Refused("%s not started: %s %s, %s; a project's file cannot hand the environment's credentials to "
                      "a server (give it one in your own configuration, mcp.servers.%s)"
                      % (where, place, var, reason, name))

    def exp(value, place, credential_place=False):
        """`value` with ${VAR} expanded, where the guard lets every variable in it be."""
        if guard is not None and isinstance(value, str):
            for m in _VAR.finditer(value):
                reason = guard(m.group(1), credential_place)
                if reason:
                    refuse(place + " refers to", "${%s}" % m.group(1), reason)
        return expand(value, env, "%s %s" % (where, place), warnings)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}", name or ""):
        raise ConfigError("%s: a server's name is 1-32 letters, digits, '.', '_' or '-' (it is part of its tools' "
                          "names)" % where)
    if not isinstance(raw, dict):
        raise ConfigError("%s must be a mapping (command/args or url)" % where)
    for key in raw:
        if key not in SERVER_KEYS:
            warnings.append("%s: unknown key '%s' (ignored); known: %s" % (where, key, ", ".join(sorted(SERVER_KEYS))))
    kind = raw.get("type") or raw.get("transport") or ("http" if raw.get("url") else "stdio")
    kind = {"streamable-http": "http", "streamable_http": "http", "streamableHttp": "http"}.get(kind, kind)
    if kind == "sse":
        raise ConfigError("%s: the HTTP+SSE transport of 2024-11-05 is deprecated and not supported; use the "
                          "server's Streamable HTTP endpoint (type: http)" % where)
    if kind not in ("stdio", "http"):
        raise ConfigError("%s: type must be stdio or http, got %r" % (where, kind))

    def text(key):
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError("%s: %s must be text" % (where, key))
        return exp(value, key, key == "bearer_token")

    def flag(key, default):
        value = raw.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError("%s: %s must be true or false" % (where, key))
        return value

    fields = {}
    if kind == "stdio":
        command = text("command")
        if not command:
            raise ConfigError("%s: a stdio server needs a command (or give url for a remote one)" % where)
        fields["command"] = command
        written = {"command": raw.get("command"), "args": _strings(raw.get("args") or [], where + ": args"),
                   "env": _mapping(raw.get("env"), where + ": env")}
        from xzatoma_store import is_credential_env
        fields["args"] = [exp(a, "args") for a in written["args"]]
        fields["env"] = {k: exp(v, "env." + k, is_credential_env(k)) for k, v in written["env"].items()}
        fields["read_paths"] = [os.path.abspath(os.path.expanduser(expand(p, env, where, warnings)))
                                for p in _strings(raw.get("read_paths") or [], where + ": read_paths")]
        fields["network"] = flag("network", False)
        sandbox = raw.get("sandbox")
        if sandbox is not None and sandbox not in SANDBOX_CHOICES:
            raise ConfigError("%s: sandbox must be one of %s" % (where, ", ".join(SANDBOX_CHOICES)))
        fields["sandbox"] = sandbox
    else:
        url = text("url")
        if not url or not re.match(r"(?i)https?://[^/\s]", url):
            raise ConfigError("%s: an http server needs url: http(s)://host/path" % where)
        fields["url"] = url
        written = {"url": raw.get("url"), "headers": _mapping(raw.get("headers"), where + ": headers"),
                   "bearer_token": raw.get("bearer_token"), "bearer_token_env": raw.get("bearer_token_env"),
                   "oauth": raw.get("oauth")}
        fields["headers"] = {k: exp(v, "headers." + k, bool(_CREDENTIAL_HEADER.search(k)))
                             for k, v in written["headers"].items()}
        token = text("bearer_token")
        if raw.get("bearer_token_env"):
            if not isinstance(raw["bearer_token_env"], str):
                raise ConfigError("%s: bearer_token_env must be text (a variable's name)" % where)
            reason = guard(raw["bearer_token_env"], True) if guard is not None else None
            if reason:
                refuse("bearer_token_env names", raw["bearer_token_env"], reason)
            token = env.get(raw["bearer_token_env"]) or token
            if not token:
                warnings.append("%s: bearer_token_env names %s, which is not set" % (where, raw["bearer_token_env"]))
        fields["bearer_token"] = token or None
        oauth = raw.get("oauth") or {}
        if not isinstance(oauth, dict):
            raise ConfigError("%s: oauth must be a mapping (client_id, client_secret, scopes, callback_port)" % where)
        fields["oauth"] = {k: exp(v, "oauth." + str(k), True) for k, v in oauth.items()}
    timeout = raw.get("timeout_seconds", default_timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError("%s: timeout_seconds must be a positive number" % where)
    tools = raw.get("tools", raw.get("enabled_tools"))
    allow = _strings(raw.get("allow") or [], where + ": allow")
    return ServerConfig(name, origin, kind, timeout=timeout,
                        tools=None if tools is None else _strings(tools, where + ": tools"),
                        disabled_tools=_strings(raw.get("disabled_tools") or [], where + ": disabled_tools"),
                        allow=allow, read_only=_strings(raw.get("read_only") or [], where + ": read_only"),
                        trust_read_only_hint=flag("trust_read_only_hint", False), enabled=flag("enabled", True),
                        written=written, **fields)


def parse_servers(entries, origin, env, warnings, default_timeout=DEFAULT_TIMEOUT):
    """[ServerConfig] of a mapping name -> entry (mcp.servers, or a .mcp.json's mcpServers)."""
    if entries is None:
        return []
    if not isinstance(entries, dict):
        raise ConfigError("%s: the MCP servers must be a mapping of names to servers" % origin)
    return [parse_server(str(name), raw, origin, env, warnings, default_timeout) for name, raw in entries.items()]


def parse_project(text, path, env, default_timeout=DEFAULT_TIMEOUT, own=(), skip=()):
    """A project's .mcp.json, never fatal (the file is the project's, maybe written by the model; a mistake in it
    must not stop a run): ([ServerConfig], problems, warnings). problems: [(name, why)] of servers that cannot
    start (a mistake, or Refused: a credential from the environment), (None, why) when the file as a whole is
    unusable. `own`: the agent's credential variables (project_guard); `skip`: names the person's own
    configuration has (theirs win)."""
    warnings = []
    try:
        entries = project_servers(text, path, warnings)
    except ConfigError as exc:
        return [], [(None, str(exc))], warnings
    guard = project_guard(env, own)
    configs, problems = [], []
    for name, raw in entries.items():
        if name in skip:
            continue
        try:
            configs.append(parse_server(str(name), raw, path, env, warnings, default_timeout, guard))
            configs[-1].project = True
        except ConfigError as exc:
            problems.append((str(name), str(exc) if isinstance(exc, Refused) else "%s (not started)" % exc))
    return configs, problems, warnings


def read_project_file(root):
    """(the text of the project's .mcp.json, its path) or (None, path) where there is none. Opened without
    following a link or blocking on a FIFO: it is the project's, and the project may be hostile."""
    path = os.path.join(root, PROJECT_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None, path
    try:
        import stat
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return None, path
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace"), path


#: what only the person's own configuration may say: a project's file cannot approve calls, widen what a server
#: reads or turn its sandbox off (trusting a file to start programs is not trusting it with the walls)
OWN_CONFIG_ONLY = ("allow", "read_only", "trust_read_only_hint", "read_paths", "sandbox")


def project_servers(text, path, warnings=None):
    """The mcpServers mapping of a .mcp.json text (the format Claude Code, Cursor and others write), without
    the keys only the person's own configuration may set (named in `warnings`)."""
    try:
        data = load_json(text)
    except ValueError as exc:
        raise ConfigError("%s: not valid JSON: %s" % (path, exc))
    if not isinstance(data, dict):
        raise ConfigError("%s: expected an object with mcpServers" % path)
    servers = data.get("mcpServers", data.get("servers"))
    if not isinstance(servers, dict):
        return {}
    out = {}
    for name, entry in servers.items():
        if isinstance(entry, dict):
            dropped = sorted(k for k in entry if k in OWN_CONFIG_ONLY)
            if dropped and warnings is not None:
                warnings.append("%s: mcp server '%s': %s ignored: only your own configuration (mcp.servers.%s) can "
                                "set them" % (path, name, ", ".join(dropped), name))
            entry = {k: v for k, v in entry.items() if k not in OWN_CONFIG_ONLY}
        out[name] = entry
    return out


class ProjectTrust:
    """Which projects' .mcp.json files a person accepted, by content: a file that changes (the model can write
    files in the tree) is a new question. Kept in XZATOMA_HOME/mcp-trust.json (0600)."""

    def __init__(self, home):
        self.path = os.path.join(home, "mcp-trust.json")

    @staticmethod
    def digest(text):
        import hashlib
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()

    def _load(self):
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def trusted(self, path, text):
        return self._load().get(os.path.realpath(path)) == self.digest(text)

    def trust(self, path, text):
        from xzatoma_store import private_dir, write_private
        data = self._load()
        data[os.path.realpath(path)] = self.digest(text)
        private_dir(os.path.dirname(self.path))
        write_private(self.path, json.dumps(data, indent=1, sort_keys=True))


# ---- JSON-RPC ----

class RpcError(McpError):
    """An error answer from a server: code, message, data."""

    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def _error_of(message):
    err = message.get("error") or {}
    if not isinstance(err, dict):
        err = {"message": str(err)}
    code = err.get("code")
    return RpcError(code if isinstance(code, int) else 0, str(err.get("message") or "error"), err.get("data"))


class _Pending:
    """One request waiting for its answer: the answer, progress callback, and how it was settled."""

    def __init__(self, progress=None):
        self.event = threading.Event()
        self.message = None
        self.progress = progress
        self.id = None  #: the request's id (set when it is sent)


def shown(text, width=200):
    """A server's text for a line a person reads: control characters visible, cut to `width`."""
    text = render_untrusted(str(text)).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


# ---- Transport: stdio, inside the OS sandbox ----
#
# INFO: the sandbox helper starts a command with stdin on /dev/null and hands back pipes for stdout and stderr
# only (xzatoma_tools "Terminal: the OS sandbox"). A stdio server needs its stdin, so it is started as
# `sh -c 'exec "$@" <FIFO'`: a named pipe in the sandbox's private TMPDIR (0700, removed with the sandbox) that
# this process holds open read-write, so neither side blocks on open. Writes are non-blocking with a deadline:
# holding the read end too, we would never see EPIPE from a server that died.

class _ConfinedProcess:
    """A server started by the sandbox helper (PID 1 of its own PID namespace: it and everything it started
    die together)."""

    def __init__(self, sandbox, argv, env):
        fifo = os.path.join(sandbox.tmpdir, "mcp-stdin")
        os.mkfifo(fifo, 0o600)
        self.stdin = os.open(fifo, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            self.job = sandbox.spawn(["/bin/sh", "-c", 'exec "$@" <"$0"', fifo] + list(argv), env)
        except BaseException:
            os.close(self.stdin)
            raise
        self.stdout, self.stderr = self.job.stdout, self.job.stderr
        self._lock = threading.Lock()
        self.code = None

    def exit_code(self):
        """After stdout closed: how it ended (the helper's word), None while unknown."""
        with self._lock:
            if self.code is None and self.job is not None:
                try:
                    reply = self.job.read(timeout=2)
                except (OSError, ValueError):
                    reply = {}
                self.code = reply.get("exit", reply.get("error"))
            return self.code

    def kill(self):
        with self._lock:
            job, self.job = self.job, None
        if job is not None:
            try:
                job.finish()  # kills the namespace's PID 1 (and so every descendant), reaps, closes the pipes
            except OSError:
                pass
        _close(self.stdin)


class _LocalProcess:
    """A server run unconfined (sandbox off, or nowhere to confine it): its own session, killed as a group."""

    def __init__(self, argv, env, cwd):
        import subprocess
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.stdin = self.proc.stdin.fileno()
        os.set_blocking(self.stdin, False)
        self.stdout, self.stderr = self.proc.stdout.fileno(), self.proc.stderr.fileno()

    def exit_code(self):
        try:
            return self.proc.wait(timeout=2)
        except Exception:
            return None

    def kill(self):
        import signal
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=1)
                except Exception:
                    pass
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def _close(fd):
    try:
        os.close(fd)
    except OSError:
        pass


class ServerLog:
    """A server's stderr and notifications/message, redacted, in XZATOMA_HOME/mcp/<name>.log (one run's, capped)."""

    def __init__(self, path):
        self.path = path
        self.size = 0
        self._lock = threading.Lock()
        self._fh = None
        if path:
            from xzatoma_store import private_dir
            try:
                private_dir(os.path.dirname(path))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) |
                             os.O_CLOEXEC, 0o600)
                self._fh = os.fdopen(fd, "w", encoding="utf-8", errors="replace")
            except OSError:
                self._fh = None

    def write(self, text):
        from xzatoma_store import redact
        with self._lock:
            if self._fh is None or self.size > LOG_MAX:
                return
            text = redact(text)
            if not text.endswith("\n"):
                text += "\n"
            self.size += len(text)
            if self.size > LOG_MAX:
                text = "[log cut at %d bytes]\n" % LOG_MAX
            try:
                self._fh.write(text)
                self._fh.flush()
            except (OSError, ValueError):
                pass

    def close(self):
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.close()
                except OSError:
                    pass
                self._fh = None


class StdioTransport:
    """Newline-delimited JSON-RPC over a server's stdin/stdout; its stderr goes to its log."""

    kind = "stdio"

    def __init__(self, config, root, make_sandbox, log, warn, require_sandbox=False):
        self.config = config
        self.root = root
        self.make_sandbox = make_sandbox  #: make_sandbox(access, network, read_paths) -> xzatoma_tools.Sandbox
        self.log = log
        self.warn = warn
        self.require_sandbox = require_sandbox
        self.process = None
        self.sandbox = None
        self.on_message = None  #: set by the Client: every message the server sends
        self.on_closed = None  #: set by the Client: the server's output ended (it exited, or was stopped)
        self.closing = False
        self.confinement = "unconfined"  #: what `mcp list` says about its sandbox
        self._write_lock = threading.Lock()
        self._threads = []

    # -- start --
    def start(self, deadline):
        import shutil
        cfg = self.config
        program = cfg.command
        path_value = os.environ.get("PATH", "")
        found = program if os.sep in program else shutil.which(program, path=path_value)
        if not found:
            raise McpError("cannot start: %s not found on PATH" % program)
        grants = list(cfg.read_paths) + [os.path.dirname(os.path.abspath(found))]
        sandbox = self.make_sandbox(cfg.sandbox, cfg.network, grants)
        self.sandbox = sandbox
        access = sandbox.access if sandbox is not None else "off"
        argv = [found] + cfg.args
        if sandbox is not None and sandbox.confined:
            missing = sandbox.not_enforced()
            if missing:
                text = "MCP server '%s': its sandbox is not enforced here: %s" % (cfg.name, "; ".join(missing))
                if self.require_sandbox:
                    raise McpError(text + " (agent.terminal.require_sandbox: not started)")
                self.warn(text)
            env = dict(sandbox.env, **cfg.env)  # the allowlist, a private HOME and TMPDIR, and what it names
            self.process = _ConfinedProcess(sandbox, argv, env)
            self.confinement = "sandbox %s%s" % (access, ", network" if cfg.network else ", no network")
        else:
            if self.require_sandbox:
                raise McpError("its sandbox is off or unavailable here (agent.terminal.require_sandbox: not started)")
            self.warn("MCP server '%s' runs unconfined (sandbox %s): it can read and write whatever you can" % (
                cfg.name, access if access == "off" else "not available on this system"))
            self.process = _LocalProcess(argv, _plain_env(cfg.env), self.root)
        for target in (self._read_stdout, self._read_stderr):
            thread = threading.Thread(target=_guarded(target, self.log, "the reader of server '%s'" % cfg.name),
                                      name="mcp-%s" % cfg.name, daemon=True)
            thread.start()
            self._threads.append(thread)

    # -- traffic --
    def send(self, message, deadline=None):
        data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
        process = self.process
        if process is None or self.closing:
            raise McpError("the server is not running")
        import select
        # the lock too is waited for only until the deadline: a writer stuck on a server that stopped reading
        # its input must not hold up a cancel (or a call) past its own deadline
        if not self._write_lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise McpError("the server does not read its input (timed out writing to it)")
        try:
            view = memoryview(data)
            while view:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise McpError("the server does not read its input (timed out writing to it)")
                try:
                    written = os.write(process.stdin, view)
                    view = view[written:]
                except BlockingIOError:
                    select.select([], [process.stdin], [], min(remaining or 1.0, 1.0))
                    if self.closing:
                        raise McpError("the server stopped")
                except OSError as exc:
                    raise McpError("the server stopped reading its input (%s)" % (exc.strerror or exc))
        finally:
            self._write_lock.release()

    def _read_stdout(self):
        try:
            for line in _lines(self.process.stdout, MAX_MESSAGE):
                try:
                    self._take(line)
                except Exception as exc:  # noqa: BLE001 - one bad message costs that message, never the reader
                    self.log.write("stdout: a message not handled (%s: %s): %s" % (
                        type(exc).__name__, exc, line[:300].decode("utf-8", "replace")))
        finally:
            if self.on_closed is not None:
                self.on_closed(None if self.closing else self._exit_text())

    def _take(self, line):
        line = line.strip()
        if not line:
            return
        try:
            message = load_json(line.decode("utf-8", "replace"))
        except ValueError as exc:  # junk, or a message over MAX_MESSAGE given in pieces: logged, never kept
            self.log.write("stdout (not JSON-RPC: %s): %s" % (exc, line[:2000].decode("utf-8", "replace")))
            return
        if self.on_message is not None:
            self.on_message(message)  # the Client checks its shape

    def _read_stderr(self):
        for line in _lines(self.process.stderr, 65536):
            self.log.write(line.decode("utf-8", "replace"))

    def _exit_text(self):
        code = self.process.exit_code() if self.process is not None else None
        if isinstance(code, int):
            return "exit code %d" % code if code >= 0 else "killed by signal %d" % -code
        return str(code) if code else "its output closed"

    def abort(self, request_id):
        """Nothing to close on stdio: notifications/cancelled says it."""

    def close(self):
        self.closing = True
        process, self.process = self.process, None
        if process is not None:
            process.kill()
        for thread in self._threads:
            thread.join(timeout=2)
        if self.sandbox is not None:
            self.sandbox.close()


def _lines(fd, limit):
    """The lines of a stream until it ends (the last one unterminated too); a line longer than `limit` comes in
    pieces of that size, so memory stays bounded whatever a server writes."""
    buf = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line
        if len(buf) > limit:
            yield buf
            buf = b""
    if buf:
        yield buf


def _plain_env(extra):
    """An unconfined server's environment: the allowlist a sandboxed command gets, with the real HOME (npx and
    the like keep their caches there), plus what its configuration names."""
    from xzatoma_tools import child_env
    env = child_env(os.environ, home=os.environ.get("HOME"))
    env.update(extra)
    return env


# ---- Transport: Streamable HTTP (a JSON answer or an SSE stream per request) ----

_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")


def header_value(value):
    """A value for an Mcp-Name / Mcp-Param header: as it is when plain ASCII, else the =?base64?…?= sentinel
    form (2026-07-28 Streamable HTTP, "Value Encoding")."""
    import base64
    if isinstance(value, bool):
        value = "true" if value else "false"
    value = str(value)
    plain = _HEADER_SAFE.fullmatch(value) and value == value.strip() and not (
        value.startswith("=?base64?") and value.endswith("?="))
    return value if plain else "=?base64?%s?=" % base64.b64encode(value.encode("utf-8")).decode("ascii")


def parse_sse(readline, limit=None):
    """The events of a text/event-stream, as (event, data) pairs (data lines joined by newlines). An event
    whose data is over `limit` bytes (one long line, or many) is not kept: it comes as (event, None), and
    memory stays bounded whatever a server sends. `readline(size)` reads at most `size` bytes."""
    limit = limit or MAX_MESSAGE
    event, data, size, over = None, [], 0, False
    while True:
        raw = readline(limit + 2)
        if not raw:
            if data or over:
                yield event, None if over else "\n".join(data)
            return
        if not raw.endswith(b"\n") and len(raw) >= limit + 2:  # a line over the limit: the rest is skipped
            over, data, size = True, [], 0
            while raw and not raw.endswith(b"\n"):
                raw = readline(min(limit + 2, 65536))
            continue
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data or over:
                yield event, None if over else "\n".join(data)
            event, data, size, over = None, [], 0, False
        elif line.startswith(":"):
            continue  # a comment (keep-alive)
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data" and not over:
                size += len(value) + 1
                if size > limit:
                    over, data = True, []
                else:
                    data.append(value)
            elif field == "event":
                event = value[:200]


class _Watchdog:
    """Shuts the connection of an HTTP exchange whose deadline has passed. A socket timeout bounds one read
    only: a server that trickles a byte a second keeps every read short and the exchange going for ever, so
    each exchange (a request, a notification, an answer, the goodbye) is watched until its deadline, by one
    thread for all of them."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap = []  #: (deadline, token)
        self._watched = {}  #: token -> socket
        self._next = 0
        self._thread = None

    def watch(self, deadline, sock):
        import heapq
        with self._cond:
            self._next += 1
            token = self._next
            self._watched[token] = sock
            heapq.heappush(self._heap, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mcp-http-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        return token

    def release(self, token):
        with self._cond:
            self._watched.pop(token, None)

    def _run(self):
        import heapq
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._watched:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                now = time.monotonic()
                if now < deadline:
                    self._cond.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
                sock = self._watched.pop(token, None)
            _shut(sock)


_WATCHDOG = _Watchdog()


class HttpError(McpError):
    def __init__(self, status, body, headers):
        super().__init__("HTTP %d" % status)
        self.status, self.body, self.headers = status, body, headers


class HttpTransport:
    """One POST per JSON-RPC message. A request's answer is read on a thread of its own (so a cancel closes its
    connection at once); what arrives, notifications and the answer, goes to on_message."""

    kind = "http"

    def __init__(self, config, auth, log, user_agent):
        from urllib.parse import urlsplit
        self.config = config
        self.url = config.url
        self.parts = urlsplit(config.url)
        self.auth = auth  #: OAuth (or None): tokens, and what to do after a 401
        self.log = log
        self.user_agent = user_agent
        self.session_id = None  #: Mcp-Session-Id (2025 revisions)
        self.version = None  #: the MCP-Protocol-Version header (once known)
        self.modern = False  #: 2026-07-28: Mcp-Method/Mcp-Name headers, no session
        self.on_message = None
        self.on_closed = None
        self.confinement = "remote"
        self._open = {}  #: ("request", id) or a token -> the socket of an exchange under way, to abort
        self._lock = threading.Lock()
        self.tool_headers = {}  #: tool name -> [(header name, property path)] from x-mcp-header

    def start(self, deadline):
        pass

    def _connection(self, timeout):
        import http.client
        host, port = self.parts.hostname, self.parts.port
        if self.parts.scheme.lower() == "https":
            import ssl
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def headers(self, message):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "User-Agent": self.user_agent}
        headers.update(self.config.headers)
        token = self.config.bearer_token or (self.auth.token() if self.auth is not None else None)
        if token:
            headers["Authorization"] = "Bearer " + token
        if self.version:
            headers["MCP-Protocol-Version"] = self.version
        if self.session_id and not self.modern:
            headers["Mcp-Session-Id"] = self.session_id
        method = message.get("method")
        if self.modern and method:
            headers["Mcp-Method"] = method
            params = message.get("params") or {}
            name = params.get("name", params.get("uri")) if method in ("tools/call", "resources/read",
                                                                          "prompts/get") else None
            if name is not None:
                headers["Mcp-Name"] = header_value(name)
            if method == "tools/call":
                for header, path in self.tool_headers.get(params.get("name"), ()):
                    value = params.get("arguments") or {}
                    for key in path:
                        value = value.get(key) if isinstance(value, dict) else None
                    if value is not None and not isinstance(value, (dict, list, float)):
                        headers["Mcp-Param-" + header] = header_value(value)
        return headers

    def post(self, message, deadline, stream=None):
        """POST one message; returns (status, headers, body bytes) for a plain answer, or hands an SSE stream
        to `stream(response)`. A 401 is answered by the auth (once), then raised as HttpError."""
        import http.client
        body = json.dumps(message, ensure_ascii=False).encode("utf-8")
        deadline = deadline or time.monotonic() + DEFAULT_TIMEOUT  # every exchange ends, whatever the server does
        key = ("request", message["id"]) if "method" in message and "id" in message else object()
        for attempt in (1, 2):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise McpError("no answer in time")
            conn = self._connection(remaining)
            watch = None
            try:
                # the socket itself is watched (and aborted): http.client lets go of it once an answer says
                # Connection: close, while the answer is still read from it
                conn.connect()
                watch = _WATCHDOG.watch(deadline, conn.sock)
                with self._lock:
                    self._open[key] = conn.sock
                path = self.parts.path or "/"
                if self.parts.query:
                    path += "?" + self.parts.query
                conn.request("POST", path, body=body, headers=self.headers(message))
                resp = conn.getresponse()
                kind = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
                if resp.getheader("Mcp-Session-Id") and not self.modern:
                    self.session_id = resp.getheader("Mcp-Session-Id")
                if resp.status == 401 and attempt == 1 and self.auth is not None and not self.config.bearer_token:
                    resp.read(1 << 16)
                    self.auth.unauthorized(resp.getheader("WWW-Authenticate") or "")
                    continue  # with the new token
                if resp.status == 200 and kind == "text/event-stream" and stream is not None:
                    stream(resp)
                    return 200, {}, b""
                data = resp.read(MAX_MESSAGE + 1)
                if time.monotonic() >= deadline:  # the watchdog cut it: what came is not the whole answer
                    raise McpError("no answer in time")
                if resp.status == 401:
                    raise AuthNeeded(self._auth_hint(resp))
                if resp.status >= 300 and resp.status != 400 and not (resp.status == 404 and data[:1] == b"{"):
                    raise HttpError(resp.status, data, dict(resp.getheaders()))
                return resp.status, dict(resp.getheaders()), data
            except (OSError, http.client.HTTPException, ValueError) as exc:  # a bad URL or answer, a cut stream
                if time.monotonic() >= deadline:
                    raise McpError("no answer in time")
                raise McpError("cannot reach %s: %s" % (shown(self.url), shown(getattr(exc, "strerror", None) or exc)))
            finally:
                if watch is not None:
                    _WATCHDOG.release(watch)
                with self._lock:
                    self._open.pop(key, None)
                conn.close()
        raise McpError("the server refused the new token")

    def _auth_hint(self, resp):
        if self.config.bearer_token:
            return "the server refused the configured bearer token (HTTP 401)"
        return "the server needs a login (HTTP 401): run 'xzatoma mcp login %s' in a terminal" % self.config.name

    def send(self, message, deadline=None):
        """A request is sent without waiting: its answer (JSON, or SSE events) reaches on_message from a thread
        of its own. A notification, or an answer to the server's own request, is posted here (202 Accepted,
        nothing to read), until `deadline` at the latest."""
        if "method" not in message or "id" not in message:
            try:
                self.post(message, deadline or time.monotonic() + 10)
            except McpError as exc:
                self.log.write("%s not accepted: %s" % (message.get("method") or "an answer", exc))
            return
        thread = threading.Thread(target=_guarded(self._exchange, self.log, "an exchange with server '%s'"
                                                  % self.config.name),
                                  args=(message, deadline), daemon=True, name="mcp-http-%s" % self.config.name)
        thread.start()

    def _exchange(self, message, deadline):
        """One request and its answer. Whatever goes wrong ends with an answer for the waiting call (an error
        it reports at once), never with this thread dying and the call waiting out its deadline; past the
        deadline, the waiting call says so itself (and cancels)."""
        request_id = message["id"]
        answered = []
        dropped = []

        def stream(resp):
            for _, data in parse_sse(resp.readline):
                if data is None:
                    dropped.append("an event over %d bytes" % MAX_MESSAGE)
                    self.log.write("an SSE event over %d bytes dropped" % MAX_MESSAGE)
                    continue
                try:
                    item = load_json(data)
                except ValueError as exc:
                    dropped.append("an event that is not JSON (%s)" % exc)
                    self.log.write("SSE data not JSON-RPC (%s): %s" % (exc, data[:300]))
                    continue
                self.on_message(item)
                if isinstance(item, dict) and "method" not in item and item.get("id") == request_id and \
                        not isinstance(request_id, bool):
                    answered.append(True)
                    return  # the answer ends this request's stream

        def fail(text, status=None, exc=None):
            """The waiting call's answer: `exc` raised (McpError), else an error answer (RpcError)."""
            if time.monotonic() < deadline_at:
                answer = {"id": request_id, "_http_status": status, "error": {"code": 0, "message": text}}
                if exc is not None:
                    answer["_exception"] = exc
                self.on_message(answer)
        deadline_at = deadline or time.monotonic() + DEFAULT_TIMEOUT
        try:
            status, _, data = self.post(message, deadline_at, stream)
        except McpError as exc:
            fail(str(exc), getattr(exc, "status", None), exc)
            return
        if status == 200 and not data:  # an SSE stream: its answer came through on_message, or never will
            if not answered:
                text = "the server's stream ended without an answer%s" % (
                    " (dropped: %s)" % ", ".join(dropped[:3]) if dropped else "")
                fail(text, 200, McpError(text))
            return
        unreadable = None
        try:
            item = load_json(data.decode("utf-8", "replace")) if data else None
        except ValueError as exc:
            item, unreadable = None, str(exc)
        if isinstance(item, dict) and ("result" in item or "error" in item):
            if item.get("id") is None:  # an error about the request itself carries no id (or null)
                item["id"] = request_id
            item["_http_status"] = status
            self.on_message(item)
        elif len(data) > MAX_MESSAGE:
            text = "the server's answer is over %d MB: not read" % (MAX_MESSAGE >> 20)
            fail(text, status, McpError(text))
        elif status == 200 and unreadable:
            text = "the server's answer is not JSON-RPC (%s)" % unreadable
            fail(text, status, McpError(text))
        else:
            fail("HTTP %d: %s" % (status, shown(data[:300].decode("utf-8", "replace"))), status)

    def abort(self, request_id):
        """Close a request's connection: on 2026-07-28 servers that is the cancellation itself."""
        with self._lock:
            sock = self._open.pop(("request", request_id), None)
        _shut(sock)

    def close(self):
        if self.session_id and not self.modern:  # 2025: end the session (a server may answer 405), briefly
            deadline = time.monotonic() + CLOSE_SECONDS
            conn = None
            try:
                import http.client
                conn = self._connection(CLOSE_SECONDS)
                conn.connect()
                watch = _WATCHDOG.watch(deadline, conn.sock)
                try:
                    conn.request("DELETE", self.parts.path or "/", headers=self.headers({}))
                    conn.getresponse().read(1 << 16)
                finally:
                    _WATCHDOG.release(watch)
            except (OSError, McpError, http.client.HTTPException, ValueError):
                pass
            finally:
                if conn is not None:
                    conn.close()
        with self._lock:
            socks = list(self._open.values())
            self._open.clear()
        for sock in socks:  # requests, notifications and answers still under way
            _shut(sock)


# ---- OAuth 2.1: protected-resource metadata, authorization-server metadata, registration, PKCE ----
#
# Tried only after a 401 (MCP authorization, 2025-11-25 and 2026-07-28): the WWW-Authenticate header names the
# protected-resource metadata (RFC 9728), else it is looked for at the well-known places; its authorization
# server's metadata (RFC 8414, or OpenID discovery) must name the issuer we asked (§3.3) and offer PKCE S256;
# a client is the configured one or registered dynamically (RFC 7591) where the server offers it; the browser
# returns to a loopback listener, `iss` is checked (RFC 9207) before the code is redeemed, and `resource`
# (RFC 8707) names the MCP server in both requests. Tokens are stored like other credentials, refreshed when
# they expire. A headless run never opens a browser: it fails with the one line that says how to log in.

def credential_name(server_name):
    return "mcp." + server_name


def _www_authenticate(header):
    """The parameters of a Bearer challenge: {'resource_metadata': …, 'scope': …, 'error': …}."""
    out = {}
    for key, quoted, bare in re.findall(r'([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))', header or ""):
        out[key.lower()] = quoted if quoted or not bare else bare
    return out


def _origin_path(url):
    """(scheme, host, port, path without its trailing slash) of a URL, or None when it has a query, a fragment
    or no host."""
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())
    except ValueError:
        return None
    if not parts.hostname or parts.query or parts.fragment:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port, parts.path.rstrip("/")


def covers(resource, url):
    """Is `resource` (an RFC 9728 protected-resource identifier) the server at `url`, or a path above it on the
    same origin? INFO: a prefix test of the text took http://127.0.0.1:3738 for the server at
    http://127.0.0.1:37383, and https://api.example.com for https://api.example.com.evil.net (attack round 18d)."""
    mine, theirs = _origin_path(url), _origin_path(resource)
    if mine is None or theirs is None or mine[:3] != theirs[:3]:
        return False
    return mine[3] == theirs[3] or mine[3].startswith(theirs[3] + "/")


def web_endpoint(value, what):
    """An authorization server's endpoint as a URL a browser or this client may be sent to: https, or http on
    the loopback interface; anything else (file:, javascript:, plain http to another host) is refused
    (a hostile server's metadata had the browser open file:///etc/passwd, attack round 18d)."""
    from urllib.parse import urlsplit
    import ipaddress
    try:
        parts = urlsplit(str(value))
        host = parts.hostname or ""
    except ValueError:
        parts, host = None, ""
    loopback = host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if parts is None or not host or re.search(r"[\\\s\x00-\x1f]", str(value)) or \
            not (parts.scheme == "https" or parts.scheme == "http" and loopback):
        # a browser takes `\` for `/`: http://evil.example\@127.0.0.1/ is evil.example to it (round 18f)
        raise McpError("the authorization server's %s is not an https URL (%s): refused" % (what, shown(value)))
    return str(value)


def _well_known(url, name, insert=True):
    """RFC 8414 / 9728 well-known URLs for `url`: the suffix inserted before the path, then at the root."""
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    base = "%s://%s" % (parts.scheme, parts.netloc)
    path = parts.path.rstrip("/")
    urls = []
    if path and insert:
        urls.append("%s/.well-known/%s%s" % (base, name, path))
    urls.append("%s/.well-known/%s" % (base, name))
    return urls


class OAuth:
    """One remote server's tokens: stored ones (refreshed), and the login that gets them."""

    def __init__(self, config, credentials, interactive, say, open_browser=None, user_agent="xzatoma"):
        self.config = config
        self.credentials = credentials  #: get(name) -> (value, where); set(name, value)
        self.interactive = interactive  #: a person is at a terminal (never a browser otherwise)
        self.say = say  #: one line for the person (stderr)
        self.open_browser = open_browser
        self.user_agent = user_agent
        self.busy = False  #: a login is under way (the request that met the 401 waits for it)
        self._lock = threading.Lock()
        self._stored = None

    # -- stored tokens --
    def _load(self):
        if self._stored is None:
            value, _ = self.credentials.get(credential_name(self.config.name))
            try:
                stored = json.loads(value) if value else {}
            except ValueError:
                stored = {"access_token": value}  # a bare token stored with `mcp login --token` (older versions)
            if not isinstance(stored, dict):
                stored = {}
            if self.config.project and stored.get("url") != self.config.url:
                # tokens are stored by the server's name: a project's server gets only what was got for its own
                # URL, never the login of a same-named server elsewhere (another project's, or one you removed)
                stored = {}
            self._stored = stored
            from xzatoma_store import register_secret
            for key in ("access_token", "refresh_token", "client_secret"):
                register_secret(self._stored.get(key))
        return self._stored

    def _save(self, data):
        from xzatoma_store import register_secret
        for key in ("access_token", "refresh_token", "client_secret"):
            register_secret(data.get(key))
        data = dict(data, url=self.config.url)  # what they were got for (a project's server checks it)
        self._stored = data
        self.credentials.set(credential_name(self.config.name), json.dumps(data, sort_keys=True))

    def token(self):
        """The access token to send, refreshed first when it has expired and can be; None without one."""
        with self._lock:
            data = self._load()
            if data.get("access_token") and data.get("expires_at") and time.time() > data["expires_at"] - 30 \
                    and data.get("refresh_token"):
                try:
                    self._refresh(data)
                except McpError:
                    pass
            return data.get("access_token")

    def unauthorized(self, challenge):
        """After a 401: a refresh, else a login where a person can do it; AuthNeeded otherwise."""
        with self._lock:
            data = self._load()
            if data.get("refresh_token"):
                try:
                    self._refresh(data)
                    return
                except McpError:
                    pass
        if not self.interactive or self.open_browser is None:
            raise AuthNeeded("the server needs a login (HTTP 401): run 'xzatoma mcp login %s' in a terminal"
                             % self.config.name)
        self.login(challenge)

    # -- HTTP (the standard library: one small request at a time) --
    def _http(self, url, form=None, body=None, accept="application/json"):
        import urllib.error
        import urllib.parse
        import urllib.request
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers)
        box = {}

        def fetch():
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    box["answer"] = resp.read(1 << 20), resp.status
            except urllib.error.HTTPError as exc:
                box["answer"] = exc.read(1 << 16), exc.code
            except (OSError, ValueError, http.client.HTTPException) as exc:
                box["error"] = exc
        import http.client
        # on a thread, waited for 30 s in all: urlopen's timeout bounds each read, and a server that trickles
        # its answer a byte at a time would hold the run for ever (that thread is left to its socket timeout)
        worker = threading.Thread(target=fetch, name="mcp-oauth", daemon=True)
        worker.start()
        worker.join(30)
        if worker.is_alive():
            raise McpError("cannot reach %s: no answer within 30s" % shown(url))
        if "error" in box:
            exc = box["error"]
            raise McpError("cannot reach %s: %s" % (shown(url), shown(getattr(exc, "reason", None) or exc)))
        raw, status = box["answer"]
        try:
            parsed = load_json(raw.decode("utf-8", "replace")) if raw else {}
        except ValueError:
            parsed = None
        return status, parsed

    def _json(self, url, what):
        status, data = self._http(url)
        if status != 200 or not isinstance(data, dict):
            return None
        return data

    # -- discovery --
    def resource_metadata(self, challenge):
        params = _www_authenticate(challenge)
        urls = [params["resource_metadata"]] if params.get("resource_metadata") else \
            _well_known(self.config.url, "oauth-protected-resource")
        for url in urls:
            meta = self._json(url, "protected-resource metadata")
            if meta and meta.get("authorization_servers"):
                resource = str(meta.get("resource") or "").rstrip("/")
                if resource and not covers(resource, self.config.url):
                    raise McpError("the protected-resource metadata is for %s, not %s: not used (RFC 9728 §3.3)"
                                   % (shown(resource), self.config.url))
                return meta, params
        raise McpError("the server answered 401 but publishes no OAuth protected-resource metadata; configure "
                       "bearer_token or headers for it instead")

    def server_metadata(self, issuer):
        urls = _well_known(issuer, "oauth-authorization-server") + _well_known(issuer, "openid-configuration")
        from urllib.parse import urlsplit
        if urlsplit(issuer).path.strip("/"):
            urls.append(issuer.rstrip("/") + "/.well-known/openid-configuration")
        for url in urls:
            meta = self._json(url, "authorization-server metadata")
            if meta is None:
                continue
            if meta.get("issuer") != issuer:  # RFC 8414 §3.3: the metadata is the issuer's own, or not used
                raise McpError("the authorization server's metadata names issuer %s, not %s: refused (RFC 8414 "
                               "§3.3)" % (shown(str(meta.get("issuer"))), issuer))
            if "S256" not in (meta.get("code_challenge_methods_supported") or ()):
                raise McpError("the authorization server %s does not offer PKCE S256: no login" % issuer)
            web_endpoint(issuer, "issuer")
            for key in ("authorization_endpoint", "token_endpoint", "registration_endpoint"):
                if key in meta or key != "registration_endpoint":
                    web_endpoint(meta.get(key), key)
            return meta
        raise McpError("no authorization-server metadata found for %s" % issuer)

    # -- the login --
    def login(self, challenge=None, deadline_seconds=300):
        """The whole authorization-code flow with PKCE, through the person's browser. Returns the token data."""
        import base64
        import hashlib
        import secrets as pyrandom
        from urllib.parse import urlencode
        self.busy = True
        try:
            meta, params = self.resource_metadata(challenge or "")
            issuer = meta["authorization_servers"][0]
            server = self.server_metadata(issuer)
            listener = _Callback(int(self.config.oauth.get("callback_port") or 0))
            try:
                redirect = "http://127.0.0.1:%d/callback" % listener.port
                client_id, client_secret = self._client(server, issuer, redirect)
                verifier = pyrandom.token_urlsafe(64)
                challenge_value = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
                state = pyrandom.token_urlsafe(24)
                scopes = params.get("scope") or " ".join(self.config.oauth.get("scopes") or
                                                        meta.get("scopes_supported") or [])
                query = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect,
                         "code_challenge": challenge_value.decode(), "code_challenge_method": "S256",
                         "state": state, "resource": self.resource(meta)}
                if scopes:
                    query["scope"] = scopes
                url = server["authorization_endpoint"] + ("&" if "?" in server["authorization_endpoint"] else "?") \
                    + urlencode(query)
                self.say("MCP server '%s': log in with your browser (opening it now); if it does not open, visit:\n  %s"
                         % (self.config.name, url))
                self.open_browser(url)
                answer = listener.wait(deadline_seconds)
            finally:
                listener.close()
            if answer.get("state") != state:
                raise McpError("the login answer's state does not match: refused")
            iss = answer.get("iss")
            if (iss is not None and iss != issuer) or (iss is None and server.get(
                    "authorization_response_iss_parameter_supported")):  # RFC 9207 §2.4
                raise McpError("the login answer comes from issuer %s, not %s: refused (RFC 9207)"
                               % (shown(str(iss)), issuer))
            if answer.get("error"):
                raise McpError("the login was refused: %s %s" % (shown(answer["error"]),
                                                                shown(answer.get("error_description") or "")))
            form = {"grant_type": "authorization_code", "code": answer.get("code") or "", "redirect_uri": redirect,
                    "client_id": client_id, "code_verifier": verifier, "resource": self.resource(meta)}
            if client_secret:
                form["client_secret"] = client_secret
            status, tokens = self._http(server["token_endpoint"], form=form)
            if status != 200 or not isinstance(tokens, dict) or not tokens.get("access_token"):
                raise McpError("the token endpoint refused the code (HTTP %s)" % status)
            data = {"access_token": tokens["access_token"], "refresh_token": tokens.get("refresh_token"),
                    "expires_at": time.time() + float(tokens["expires_in"]) if tokens.get("expires_in") else None,
                    "token_endpoint": server["token_endpoint"], "client_id": client_id,
                    "client_secret": client_secret, "issuer": issuer, "resource": self.resource(meta)}
            with self._lock:
                self._save(data)
            return data
        finally:
            self.busy = False

    def resource(self, meta):
        return str(meta.get("resource") or self.config.url).rstrip("/")

    def _client(self, server, issuer, redirect):
        """(client_id, client_secret): configured, else dynamic registration where the server offers it."""
        if self.config.oauth.get("client_id"):
            return self.config.oauth["client_id"], self.config.oauth.get("client_secret")
        endpoint = server.get("registration_endpoint")
        if not endpoint:
            raise McpError("the authorization server offers no dynamic client registration: set "
                           "mcp.servers.%s.oauth.client_id" % self.config.name)
        status, reg = self._http(endpoint, body={
            "client_name": "XZatoma", "redirect_uris": [redirect], "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"], "token_endpoint_auth_method": "none", "application_type": "native"})
        if status not in (200, 201) or not isinstance(reg, dict) or not reg.get("client_id"):
            raise McpError("dynamic client registration at %s failed (HTTP %s)" % (endpoint, status))
        return reg["client_id"], reg.get("client_secret")

    def _refresh(self, data):
        form = {"grant_type": "refresh_token", "refresh_token": data["refresh_token"],
                "client_id": data.get("client_id") or "", "resource": data.get("resource") or self.config.url}
        if data.get("client_secret"):
            form["client_secret"] = data["client_secret"]
        status, tokens = self._http(data.get("token_endpoint") or "", form=form)
        if status != 200 or not isinstance(tokens, dict) or not tokens.get("access_token"):
            raise McpError("the refresh token was refused (HTTP %s)" % status)
        data = dict(data, access_token=tokens["access_token"],
                    refresh_token=tokens.get("refresh_token") or data.get("refresh_token"),
                    expires_at=time.time() + float(tokens["expires_in"]) if tokens.get("expires_in") else None)
        self._save(data)


class _Callback:
    """The loopback listener the browser returns to with the authorization code (one answer, then closed)."""

    def __init__(self, port=0):
        from http.server import BaseHTTPRequestHandler, HTTPServer
        from urllib.parse import parse_qs, urlsplit
        self.answer = None
        self.done = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                parts = urlsplit(self.path)
                if parts.path != "/callback":
                    self.send_error(404)
                    return
                outer.answer = {k: v[0] for k, v in parse_qs(parts.query).items()}
                body = b"XZatoma: you can close this window and return to the terminal.\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.done.set()

        self.server = HTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    def wait(self, seconds):
        if not self.done.wait(seconds):
            raise McpError("no answer from the browser within %d seconds" % seconds)
        return self.answer

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ---- The client: which protocol, the tools, calls ----

def _is_id(value):
    """A JSON-RPC id: text or an integer (a list, an object or true cannot name a request)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _malformed(message):
    """Why a JSON value a server sent is not a message this client can take, or None. The one check of a
    message's shape: what passes has a text method (a request also an id) and object params, or is an
    answer with an id and a result or an error."""
    if not isinstance(message, dict):
        return "not an object"
    if "method" in message:
        if not isinstance(message["method"], str):
            return "its method is not text"
        if "id" in message and not _is_id(message["id"]):
            return "its id is neither text nor an integer"
        if message.get("params") is not None and not isinstance(message["params"], dict):
            return "its params are not an object"
        return None
    if not _is_id(message.get("id")):
        return "an answer whose id is neither text nor an integer"
    if "result" not in message and "error" not in message:
        return "an answer with neither result nor error"
    return None


def _excerpt(message):
    try:
        text = json.dumps(message, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        text = repr(type(message))
    return text[:300]


class Client:
    """One server's conversation: era detection and handshake, tools/list, tools/call. Thread-safe: parallel
    subagents may call at once."""

    def __init__(self, config, transport, log, client_version="0", on_progress=None, on_death=None):
        self.config = config
        self.transport = transport
        self.log = log
        self.client_info = {"name": "xzatoma", "version": client_version}
        self.on_progress = on_progress  #: on_progress(server, tool, progress, total, message) for people
        self.on_death = on_death  #: on_death(why): the server stopped on its own
        self.modern = False  #: 2026-07-28 (per-request _meta) or a 2025 handshake session
        self.version = None  #: the protocol revision in use
        self.server_info = {}
        self.capabilities = {}
        self.instructions = None
        self.tools = []  #: the server's tool definitions (dicts), as listed
        self.dead = None  #: why it stopped, once it has
        self.probe_killed = False  #: it died of the `server/discover` probe (a strict 2025 server)
        self._next = 0
        self._pending = {}
        self._lock = threading.Lock()
        self._outbox = None  #: answers to the server's requests (and HTTP cancels), sent by one thread
        self._dropped = 0  #: of them, dropped because too many waited
        self._stopped = False  #: closed: nothing more is sent
        transport.on_message = self.dispatch
        transport.on_closed = self._closed

    # -- messages --
    def _id(self):
        with self._lock:
            self._next += 1
            return self._next

    def dispatch(self, message):
        """Every JSON value a server sends comes here, from its transport's thread. Its shape is checked here,
        once (a batch is its messages, each on its own); a message that is not JSON-RPC, or that something here
        cannot handle, costs that message only: it is logged, and a call it answered fails at once with the
        reason. Nothing a server sends ends the thread that reads it."""
        if isinstance(message, list):  # a batch (2025-03-26 allowed them): its messages, none of them a batch
            for item in message[:OUTBOX_MAX * 16]:
                self.dispatch(item if not isinstance(item, list) else None)
            return
        why = _malformed(message)
        if why is not None:
            self.log.write("a message that is not JSON-RPC ignored (%s): %s" % (why, _excerpt(message)))
            return
        try:
            if "method" in message:
                if "id" in message:
                    self._answer_server(message)
                else:
                    self._notification(message)
                return
            with self._lock:
                pending = self._pending.get(message.get("id"))
            if pending is not None:
                pending.message = message
                pending.event.set()
        except Exception as exc:  # noqa: BLE001 - a bug, or a message no check foresaw
            self.log.write("a message not handled (%s: %s): %s" % (type(exc).__name__, exc, _excerpt(message)))
            with self._lock:
                pending = self._pending.get(message.get("id")) if "method" not in message else None
            if pending is not None and not pending.event.is_set():
                error = McpError("the server's answer could not be read (%s)" % type(exc).__name__)
                pending.message = {"error": {"code": 0}, "_exception": error}
                pending.event.set()

    def _answer_server(self, message):
        """Requests from the server: ping is answered; we offer no sampling, roots or elicitation. The answers
        go out from one thread through a short queue: a server that floods requests (and stops reading) gets
        the rest dropped, and neither the thread that reads it nor a call waits on it."""
        if message["method"] == "ping":
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
        else:
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "error": {"code": METHOD_NOT_FOUND, "message": "XZatoma offers no %s" % message["method"][:100]}}
        self._post(reply)

    def _post(self, message):
        """Send a message from the outgoing thread (not waited for); dropped, and logged once a while, when
        OUTBOX_MAX are waiting already."""
        with self._lock:
            if self._outbox is None:
                self._outbox = queue.Queue(OUTBOX_MAX)
                threading.Thread(target=_guarded(self._send_out, self.log, "the sender of server '%s'"
                                                 % self.config.name),
                                 name="mcp-out-%s" % self.config.name, daemon=True).start()
        try:
            self._outbox.put_nowait(message)
        except queue.Full:
            self._dropped += 1
            if self._dropped in (1, 10, 100, 1000) or self._dropped % 10000 == 0:
                self.log.write("the server sends more requests than it reads answers: %d answer%s dropped" % (
                    self._dropped, "" if self._dropped == 1 else "s"))

    def _send_out(self):
        while True:
            message = self._outbox.get()
            if message is None or self.dead or self._stopped:
                return
            try:
                self.transport.send(message, time.monotonic() + REPLY_SECONDS)
            except McpError as exc:
                self.log.write("%s not sent: %s" % (message.get("method") or "an answer", exc))

    def _notification(self, message):
        method, params = message.get("method"), message.get("params") or {}
        if method == "notifications/progress":
            with self._lock:
                pending = self._pending.get(params.get("progressToken")) if _is_id(params.get("progressToken")) \
                    else None
            if pending is not None and pending.progress is not None:
                pending.progress(params.get("progress"), params.get("total"), params.get("message"))
        elif method == "notifications/message":
            self.log.write("log %s: %s" % (shown(params.get("level"), 20),
                                           json.dumps(params.get("data"), ensure_ascii=False)[:4000]))
        elif method == "notifications/tools/list_changed":
            self.log.write("the server's tool list changed (the tools offered stay those of the start)")

    def _closed(self, why):
        if why is None:
            return  # we stopped it
        self.dead = why
        with self._lock:
            waiting = list(self._pending.values())
        for pending in waiting:
            pending.message = {"error": {"code": 0}, "_exception": McpError("the server stopped (%s)" % why)}
            pending.event.set()
        if self.on_death is not None:
            self.on_death(why)

    def meta(self, progress_token=None):
        meta = {}
        if self.modern:
            meta = {"io.modelcontextprotocol/protocolVersion": self.version,
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": self.client_info}
        if progress_token is not None:
            meta["progressToken"] = progress_token
        return meta

    def _send(self, method, params=None, progress=None, meta=True, deadline=None):
        """Send a request; returns its _Pending (the answer arrives through dispatch)."""
        if self.dead:
            raise McpError("the server has stopped (%s)" % self.dead)
        request_id = self._id()
        params = dict(params or {})
        if meta:
            extra = self.meta(request_id if progress is not None else None)
            if extra:
                params["_meta"] = dict(params.get("_meta") or {}, **extra)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params:
            message["params"] = params
        pending = _Pending(progress)
        pending.id = request_id
        with self._lock:
            self._pending[request_id] = pending
        try:
            self.transport.send(message, deadline)
        except BaseException:
            self._forget(pending)
            raise
        return pending

    def _forget(self, pending):
        with self._lock:
            self._pending.pop(pending.id, None)

    @staticmethod
    def _settle(pending):
        """The result of an answered request, or its error raised."""
        answer = pending.message
        if "error" in answer:
            if isinstance(answer.get("_exception"), McpError) and not isinstance(answer["_exception"], HttpError):
                raise answer["_exception"]
            error = _error_of(answer)
            error.http_status = answer.get("_http_status")
            raise error
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    def request(self, method, params=None, deadline=None, cancel=None, progress=None, meta=True):
        """Send a request and wait for its answer (the result), until `deadline`; cancel (an Event) or Ctrl-C
        sends notifications/cancelled (stdio and 2025 sessions) or closes its stream (2026 HTTP)."""
        pending = self._send(method, params, progress, meta, deadline)
        try:
            reason = self._wait(pending, deadline, cancel)
            if reason is not None:
                self._cancel(pending.id, reason)
                raise McpError(reason)
        except BaseException as exc:
            if not isinstance(exc, McpError):  # Ctrl-C, SIGTERM while waiting: the server is told too
                self._cancel(pending.id, "interrupted")
            raise
        finally:
            self._forget(pending)
        return self._settle(pending)

    def _wait(self, pending, deadline, cancel):
        """None once answered, else why not (timed out, cancelled)."""
        auth = getattr(self.transport, "auth", None)
        while not pending.event.is_set():
            if cancel is not None and cancel.is_set():
                return "cancelled"
            now = time.monotonic()
            if deadline is not None and now >= deadline and not (auth is not None and auth.busy):
                return "no answer in time"
            pending.event.wait(0.1 if deadline is None else max(0.0, min(0.1, deadline - now)) or 0.01)
        return None

    def _cancel(self, request_id, reason):
        """Tell the server a request is given up, without waiting on it past REPLY_SECONDS: on stdio it is
        written at once (before what is sent next: a server reads in order); over HTTP it is posted from the
        outgoing thread, so a server that is slow to take it (or trickles its answer) keeps no call waiting."""
        self.transport.abort(request_id)
        if self.modern and self.transport.kind == "http":
            return  # closing the stream is the cancellation (2026-07-28)
        message = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": request_id, "reason": reason}}
        if self.transport.kind == "http":
            self._post(message)
            return
        try:
            self.transport.send(message, time.monotonic() + REPLY_SECONDS)
        except McpError:
            pass

    def notify(self, method, params=None):
        message = {"jsonrpc": "2.0", "method": method}
        if params:
            message["params"] = params
        self.transport.send(message, time.monotonic() + 5)

    # -- the start: which protocol --
    def connect(self, deadline, probe=True):
        """Start the transport and agree on a protocol: the 2026-07-28 discovery first, the 2025 handshake for a
        server that does not know it (probe=False: the handshake at once). Raises McpError naming what the
        server speaks when nothing fits; `probe_killed` says a server died of the probe itself."""
        self.transport.start(deadline)
        try:
            if probe and self.transport.kind == "stdio":
                self._probe_stdio(deadline)  # a 2025 session is open when it says False
                return
            if probe and self._discover(deadline):
                return
            if self.dead:
                raise McpError("the server stopped during start-up (%s)" % self.dead)
        except McpError:
            self.probe_killed = probe and bool(self.dead)
            raise
        self._initialize(deadline)

    def _discover(self, deadline):
        """True when the server answered `server/discover` (2026-07-28); False for a 2025 server: one that
        answers with any error but a modern one, or (stdio) stays silent for PROBE_SECONDS."""
        self._modern(MODERN_VERSIONS[0])
        probe = min(deadline, time.monotonic() + PROBE_SECONDS) if self.transport.kind == "stdio" else deadline
        for _ in range(2):
            try:
                result = self.request("server/discover", deadline=probe)
            except RpcError as exc:
                supported = exc.data.get("supported") if isinstance(exc.data, dict) else None
                if exc.code != UNSUPPORTED_VERSION or not isinstance(supported, list):
                    break
                fits = [v for v in MODERN_VERSIONS if v in supported]
                if fits and fits[0] != self.version:
                    self._modern(fits[0])
                    continue  # once more, in a version it named
                if not any(v in LEGACY_VERSIONS for v in supported):
                    raise McpError("the server speaks MCP %s; XZatoma speaks %s" % (
                        ", ".join(shown(v, 20) for v in supported), ", ".join(MODERN_VERSIONS + LEGACY_VERSIONS)))
                break
            except McpError as exc:
                if self.dead or isinstance(exc, AuthNeeded):
                    raise
                break
            if self._take_discovery(result):
                return True
            break  # a dual-era server without our modern revision: its handshake then
        self._legacy()
        return False

    def _probe_stdio(self, deadline):
        """stdio (2026-07-28 "Backward compatibility"): `server/discover` first. A server still silent after
        PROBE_SECONDS is sent the 2025 `initialize` as well, and whichever succeeds decides: a 2026 server that
        is merely slow to start (a Python SDK server imports for seconds) still answers discover and refuses
        initialize; a 2025 one that ignores unknown requests answers initialize. True: modern, False: a 2025
        session is open already; McpError when neither works."""
        self._modern(MODERN_VERSIONS[0])
        discover = self._send("server/discover", deadline=deadline)
        init, probe_end = None, time.monotonic() + PROBE_SECONDS
        try:
            while True:
                if discover is not None and discover.event.is_set():
                    try:
                        if self._take_discovery(self._settle(discover)):
                            return True
                    except RpcError as exc:
                        supported = exc.data.get("supported") if isinstance(exc.data, dict) else None
                        if exc.code == UNSUPPORTED_VERSION and isinstance(supported, list):
                            fits = [v for v in MODERN_VERSIONS if v in supported]
                            if fits and fits[0] != self.version:
                                self._modern(fits[0])
                                discover = self._send("server/discover", deadline=deadline)
                                continue
                            if not any(v in LEGACY_VERSIONS for v in supported):
                                raise McpError("the server speaks MCP %s; XZatoma speaks %s" % (
                                    ", ".join(shown(v, 20) for v in supported),
                                    ", ".join(MODERN_VERSIONS + LEGACY_VERSIONS)))
                    except McpError:
                        if self.dead:
                            raise
                    self._forget(discover)
                    discover = None
                if init is not None and init.event.is_set():
                    try:
                        result = self._settle(init)
                    except RpcError as exc:
                        if discover is None:
                            raise McpError("the server refused both the 2026-07-28 discovery and the %s "
                                           "handshake: %s" % (LEGACY_VERSIONS[0], shown(exc.message)))
                        self._forget(init)
                        init = None
                        probe_end = float("inf")  # its discovery answer is still to come
                    else:
                        self._legacy()
                        self._take_initialize(result)
                        return False
                if self.dead:
                    raise McpError("the server stopped during start-up (%s)" % self.dead)
                now = time.monotonic()
                if now >= deadline:
                    raise McpError("no answer in time")
                if init is None and (discover is None or now >= probe_end):
                    init = self._send("initialize", self._initialize_params(), meta=False, deadline=deadline)
                waiting = discover or init
                waiting.event.wait(0.05)
        finally:
            for pending in (discover, init):
                if pending is not None:
                    self._forget(pending)

    def _take_discovery(self, result):
        """A DiscoverResult: True when it offers a revision we speak (then in use), False otherwise."""
        versions = result.get("supportedVersions") or [self.version]
        fits = [v for v in MODERN_VERSIONS if v in versions]
        if not fits:
            return False
        self._modern(fits[0])
        self.capabilities = result.get("capabilities") or {}
        self.instructions = result.get("instructions")
        self.server_info = ((result.get("_meta") or {}).get("io.modelcontextprotocol/serverInfo") or
                            result.get("serverInfo") or {})
        return True

    def _modern(self, version):
        self.modern, self.version = True, version
        if self.transport.kind == "http":
            self.transport.modern, self.transport.version = True, version

    def _legacy(self):
        self.modern, self.version = False, None
        if self.transport.kind == "http":
            self.transport.modern, self.transport.version = False, None

    def _initialize(self, deadline):
        if self.dead:
            raise McpError("the server stopped during start-up (%s)" % self.dead)
        try:
            result = self.request("initialize", self._initialize_params(), deadline=deadline, meta=False)
        except RpcError as exc:
            raise McpError("the server refused both the 2026-07-28 discovery and the %s handshake: %s" % (
                LEGACY_VERSIONS[0], shown(exc.message)))
        self._take_initialize(result)

    def _initialize_params(self):
        return {"protocolVersion": LEGACY_VERSIONS[0], "capabilities": {}, "clientInfo": self.client_info}

    def _take_initialize(self, result):
        """An InitializeResult: the revision it chose (one we speak, or McpError), then notifications/initialized."""
        version = result.get("protocolVersion")
        if version not in LEGACY_VERSIONS:
            raise McpError("the server speaks MCP %s; XZatoma speaks %s" % (
                shown(str(version)), ", ".join(MODERN_VERSIONS + LEGACY_VERSIONS)))
        self.version = version
        if self.transport.kind == "http":
            self.transport.version = version
        self.capabilities = result.get("capabilities") or {}
        self.server_info = result.get("serverInfo") or {}
        self.instructions = result.get("instructions")
        self.notify("notifications/initialized")

    # -- tools --
    def list_tools(self, deadline):
        tools, cursor, names, cursors = [], None, set(), set()
        for _ in range(100):  # pages; a server that never stops paging is cut off
            result = self.request("tools/list", {"cursor": cursor} if cursor else None, deadline=deadline)
            for tool in result.get("tools") or []:  # a name given again (a page served twice) is the first one's
                if isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool["name"] not in names:
                    names.add(tool["name"])
                    tools.append(tool)
            cursor = result.get("nextCursor")
            if not cursor or not isinstance(cursor, str) or cursor in cursors:  # a cursor again: the same pages
                break
            cursors.add(cursor)
        self.tools = tools
        return tools

    def call_tool(self, name, arguments, deadline, cancel=None, progress=None):
        return self.request("tools/call", {"name": name, "arguments": arguments}, deadline=deadline, cancel=cancel,
                            progress=progress)

    def close(self):
        self.transport.close()
        with self._lock:
            self._stopped = True
            outbox = self._outbox
        if outbox is not None:
            try:
                outbox.put_nowait(None)  # the outgoing thread ends (or at its next message)
            except queue.Full:
                pass


# ---- MCP tools as XZatoma tools: names, approvals, results ----

#: what the model reads when an MCP call needs a yes nobody can give (run, the watcher)
HEADLESS_REFUSAL = ("MCP tool %s (server '%s', tool '%s') needs a person's approval; not available in this run. Not "
                    "run. A headless run calls an MCP tool only when the configuration allows it "
                    "(mcp.servers.%s.allow, or read_only for a tool that changes nothing). Use the other tools, "
                    "or say in your answer what the person should allow or run.")
APPROVAL_TEXT = {"read-only": "read-only (runs; offered in planning mode)", "allowed": "allowed (runs without asking)",
                 "ask": "asks in Safe mode; refused headless"}


#: the most tools, and bytes of their definitions (schemas, descriptions), one server offers the model
TOOLS_PER_SERVER, TOOLS_BYTES = 128, 128 << 10


def tool_name(server, remote, taken):
    """mcp__SERVER__TOOL in the characters every provider accepts, at most 64, unique in `taken` (the server's own
    tools named before, in its order). A server name holding the separator `__`, or ending with `_` (server `a_`
    with tool `x` and server `a` with tool `_x`), always gets a suffix of the hash of both names, as a name cut
    to 64 does, so no server's plain name is another's. INFO: server `a` with
    tool `b__x` and server `a__b` with tool `x` were both mcp__a__b__x, and the plain name went to whichever server
    started first: one name meant another server's tool from one run to the next (attack round 18d)."""
    base = "mcp__%s__%s" % (re.sub(r"[^A-Za-z0-9_-]", "_", server), re.sub(r"[^A-Za-z0-9_-]", "_", remote))
    name = base[:NAME_MAX]
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", server)  # server `a..b` is a__b once its dots are replaced (round 18f)
    if name != base or "__" in safe or safe.endswith("_") or name in taken:
        import hashlib
        suffix = hashlib.sha256(("%s\0%s" % (server, remote)).encode()).hexdigest()[:8]
        name = base[: NAME_MAX - 9] + "_" + suffix
    return name


def approval(config, spec):
    """read-only (a rule or a trusted hint: planning mode offers it, headless runs call it), allowed (a rule:
    it runs without asking) or ask."""
    name = spec["name"]
    hint = (spec.get("annotations") or {}).get("readOnlyHint") is True
    if name in config.read_only or (config.trust_read_only_hint and hint):
        return "read-only"
    if "*" in config.allow or name in config.allow:
        return "allowed"
    return "ask"


def mcp_headers(schema):
    """[(header name, property path)] of the x-mcp-header annotations in a tool's inputSchema (2026-07-28);
    ValueError for an annotation a client must reject (the tool is then not offered)."""
    out, seen = [], set()

    def walk(node, path):
        for prop, sub in ((node or {}).get("properties") or {}).items():
            if not isinstance(sub, dict):
                continue
            header = sub.get("x-mcp-header")
            if header is not None:
                if not isinstance(header, str) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", header):
                    raise ValueError("x-mcp-header %r is not a header name" % (header,))
                if header.lower() in seen:
                    raise ValueError("x-mcp-header %r is used twice" % header)
                if sub.get("type") not in ("string", "integer", "boolean"):
                    raise ValueError("x-mcp-header on %s, which is not a string, integer or boolean" % prop)
                seen.add(header.lower())
                out.append((header, path + [prop]))
            walk(sub, path + [prop])
    walk(schema, [])
    return out


def render_result(result, label):
    """A tools/call result as XZatoma's tools answer: the text the model reads (its size cap, redaction and
    the terminal's neutralisation are the Registry's and the display's, as for every tool). Images and audio
    are noted, never dropped silently; structured content is shown where no text block says it (servers
    SHOULD repeat it as text: the filesystem server's read_text_file would otherwise cost its file twice)."""
    parts, texts = [], []
    for block in result.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text") or ""))
            texts.append(parts[-1])
        elif kind in ("image", "audio"):
            size = len(block.get("data") or "") * 3 // 4
            parts.append("[%s from the tool: %s, about %d bytes; not shown to the model]" % (
                kind, block.get("mimeType") or "unknown type", size))
        elif kind == "resource_link":
            parts.append("[resource link] %s <%s>%s%s" % (
                block.get("name") or block.get("title") or "", block.get("uri") or "",
                " (%s)" % block["mimeType"] if block.get("mimeType") else "",
                ": %s" % block["description"] if block.get("description") else ""))
        elif kind == "resource":
            res = block.get("resource") or {}
            if isinstance(res.get("text"), str):
                parts.append("[resource %s]\n%s" % (res.get("uri") or "", res["text"]))
            else:
                parts.append("[resource %s: %s, about %d bytes of binary data; not shown to the model]" % (
                    res.get("uri") or "", res.get("mimeType") or "unknown type", len(res.get("blob") or "") * 3 // 4))
        else:
            parts.append("[content of type %r; not shown to the model]" % (kind,))
    structured = result.get("structuredContent")
    if structured is not None and not texts:  # a text block, by the spec's advice, already carries it
        parts.append("structured content:\n" + json.dumps(structured, indent=2, ensure_ascii=False))
    text = "\n".join(parts)
    if result.get("isError"):
        return ToolResult.fail("%s reported an error: %s" % (label, text or "(no details)"))
    return ToolResult.ok(text or "(the tool returned no content)")


class McpTool(Tool):
    """One tool of one server, in XZatoma's registry: its name mcp__SERVER__TOOL, its schema, a permission from
    the approval rules (read for read-only, else execute), and the questions and refusals terminal commands get."""

    def __init__(self, server, spec, name):
        self.server = server  #: the Server it belongs to (its client, configuration, state)
        self.spec = spec  #: the server's definition (name, description, inputSchema, annotations)
        self.remote = spec["name"]
        self.name = name
        self.approval = approval(server.config, spec)
        self.permission = READ if self.approval == "read-only" else EXECUTE
        title = spec.get("title") or (spec.get("annotations") or {}).get("title")
        description = str(spec.get("description") or title or "")
        if len(description) > 2048:
            description = description[:2047] + "…"
        self.description = "%s (MCP server '%s')" % (description.strip() or "Tool " + self.remote, server.config.name)
        schema = spec.get("inputSchema") if isinstance(spec.get("inputSchema"), dict) else {}
        schema = dict(schema)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self.parameters = schema

    @property
    def withdrawn(self):
        """Why the tool can no longer run (its server stopped), or None."""
        return self.server.gone

    def label(self):
        return "MCP tool '%s' of server '%s'" % (shown(self.remote, 80), self.server.config.name)

    def confirmation(self, args, ctx):
        """Safe mode asks for every call no rule allows: the server, the tool and the arguments, as they are
        (the question shows their hidden characters)."""
        if self.approval != "ask":
            return None
        hints = self.spec.get("annotations") or {}
        said = [k for k in ("readOnlyHint", "destructiveHint", "openWorldHint") if k in hints]
        return "MCP server '%s' (%s), tool '%s'%s, with arguments:\n%s" % (
            self.server.config.name, self.server.config.describe(), self.remote,
            " (the server says: %s)" % ", ".join("%s=%s" % (k, json.dumps(hints[k])) for k in said) if said else "",
            render_json(args, indent=2))

    def preview_args(self, args):
        from xzatoma_tools import preview_arguments
        return preview_arguments(args)

    def run(self, args, ctx):
        if self.withdrawn:
            raise ToolError("%s is no longer available: %s" % (self.label(), self.withdrawn))
        if self.approval == "ask" and not ctx.approvals.interactive:
            raise ToolError(HEADLESS_REFUSAL % (self.name, self.server.config.name, self.remote,
                                                self.server.config.name))
        deadline = time.monotonic() + self.server.config.timeout
        if ctx.deadline is not None:
            deadline = min(deadline, ctx.deadline)
        server = self.server
        last = []

        def progress(done, total, message):  # a few lines a second at most: a server may send thousands
            now = time.monotonic()
            if last and now - last[0] < PROGRESS_INTERVAL:
                return
            last[:] = [now]
            server.progress(self.remote, done, total, message)
        try:
            try:
                result = server.client.call_tool(self.remote, args, deadline, cancel=ctx.cancel, progress=progress)
            finally:
                self._settle(ctx)
        except RpcError as exc:
            raise ToolError("%s refused the call: %s%s" % (self.label(), exc.message,
                                                           " (code %s)" % exc.code if exc.code else ""))
        except McpError as exc:
            why = str(exc)
            if why == "no answer in time":
                timed = ctx.deadline is not None and ctx.deadline <= deadline
                why = ("the run's time limit (agent.timeout_seconds) was reached" if timed else
                       "no answer within %gs (mcp.servers.%s.timeout_seconds)" % (server.config.timeout,
                                                                                   server.config.name))
                why += "; the server was told to cancel it"
            elif why == "cancelled":
                why = "cancelled by user; the server was told to cancel it"
            raise ToolError("%s: %s" % (self.label(), why))
        if result.get("resultType") == "input_required":  # 2026-07-28 multi round-trip: we declared no such capability
            raise ToolError("%s asks for input XZatoma does not give servers (sampling, elicitation, roots); the call "
                            "cannot complete here" % self.label())
        return render_result(result, self.label())

    def _settle(self, ctx):
        """After a call, as after a terminal command: protected paths the server created in the tree (a `.git`
        whose hooks the person's next git command would run) are the person's to keep in chat, and removed in
        a headless run; the model is told either way (xzatoma_tools' after-command watch). INFO: a server runs
        between calls too: what it made then is found after its next call (or never, after its last)."""
        sandbox = getattr(self.server.client.transport, "sandbox", None)
        watch = sandbox.watch() if sandbox is not None and sandbox.confined else None
        if watch is not None:
            from xzatoma_tools import _settle_protected
            _settle_protected(ctx, watch, "MCP tool %s" % self.name, "")


# ---- The servers of one run: started together, a death reported once, all stopped at the end ----

class Server:
    """One configured server in a run: its client and state ('starting', 'running', 'failed', 'stopped',
    'disabled', 'untrusted'), its tools, and its log."""

    def __init__(self, config, servers):
        self.config = config
        self.servers = servers
        self.state = "disabled" if not config.enabled else "starting"
        self.error = None  #: why it failed or stopped
        self.client = None
        self.tools = []  #: McpTool
        self.skipped = []  #: (tool name, why) of tools not offered
        self.log = None
        self.gone = None  #: why its tools are withdrawn
        self._reported = False

    def start(self, deadline):
        s = self.servers
        cfg = self.config
        self.log = ServerLog(os.path.join(s.home, "mcp", cfg.name + ".log") if s.home else None)
        from xzatoma_store import env_credential, register_secret
        if cfg.transport == "stdio":
            # a credential written in the config itself, as one taken from the environment is: redacted wherever the
            # server echoes it (attack round 18d: SERVICE_TOKEN's literal value reached the model and the history)
            for name, value in cfg.env.items():
                if env_credential(name, value):
                    register_secret(value)
            transport = StdioTransport(cfg, s.root, s.make_sandbox, self.log, s.warn, s.require_sandbox)
        else:
            register_secret(cfg.bearer_token)
            for name, value in cfg.headers.items():
                if name.lower() in ("authorization", "proxy-authorization", "cookie") or \
                        re.search(r"(?i)key|token|secret|auth", name):
                    register_secret(value.split(" ", 1)[-1] if name.lower() == "authorization" else value)
            auth = OAuth(cfg, s.credentials, s.interactive, s.say, s.open_browser, s.user_agent) \
                if s.credentials is not None else None
            transport = HttpTransport(cfg, auth, self.log, s.user_agent)
        self.client = Client(cfg, transport, self.log, s.version, on_death=self._died)
        try:
            self.client.connect(deadline)
        except McpError:
            if not self.client.probe_killed:
                raise
            # a 2025 server that exits on a request it does not know: once more, with the handshake at once
            self.client.close()  # its transport, and its outgoing thread
            transport = StdioTransport(cfg, s.root, s.make_sandbox, self.log, s.warn, s.require_sandbox)
            self.client = Client(cfg, transport, self.log, s.version, on_death=self._died)
            self.client.connect(deadline, probe=False)
        listed = self.client.list_tools(deadline)
        taken = set(s.names)
        room, over = TOOLS_BYTES, []
        for spec in listed:
            remote = spec["name"]
            if (cfg.tools is not None and remote not in cfg.tools) or remote in cfg.disabled_tools:
                self.skipped.append((remote, "not enabled in the configuration"))
                continue
            # INFO: 3,000 tools went into one request of 1.6M tokens for a 131k window (attack round 18d): a
            # server's tools are offered up to TOOLS_PER_SERVER of them and TOOLS_BYTES of definitions
            size = len(json.dumps(spec.get("inputSchema"), default=str)) + min(len(str(spec.get("description") or
                                                                                      "")), 2048)
            if len(self.tools) >= TOOLS_PER_SERVER or size > room:
                over.append(remote)
                self.skipped.append((remote, "over the tools one server may offer"))
                continue
            room -= size
            if transport.kind == "http":
                try:
                    transport.tool_headers[remote] = mcp_headers(spec.get("inputSchema"))
                except ValueError as exc:
                    self.skipped.append((remote, str(exc)))
                    s.warn("MCP server '%s': tool '%s' not offered: %s" % (cfg.name, shown(remote, 80), exc))
                    continue
            name = tool_name(cfg.name, remote, taken)
            taken.add(name)
            self.tools.append(McpTool(self, spec, name))
        if over:
            s.warn("MCP server '%s' offers more tools than are offered to the model (%d, %d KB of definitions at "
                   "most): %d left out (%s); choose the ones you need with mcp.servers.%s.tools" % (
                       cfg.name, TOOLS_PER_SERVER, TOOLS_BYTES >> 10, len(over), ", ".join(shown(n, 40) for n in
                                                                                            over[:5]) +
                       (", …" if len(over) > 5 else ""), cfg.name))
        with s.lock:
            s.names.update(t.name for t in self.tools)
        if cfg.tools is not None:
            missing = sorted(set(cfg.tools) - {t["name"] for t in listed})
            if missing:
                s.warn("MCP server '%s' has no tool named %s (mcp.servers.%s.tools)" % (
                    cfg.name, ", ".join(shown(m, 60) for m in missing), cfg.name))
        self.state = "running"

    def logging_in(self):
        auth = getattr(self.client.transport, "auth", None) if self.client is not None else None
        return bool(auth is not None and auth.busy)

    def _died(self, why):
        if self.state != "running":
            return  # during start-up: start() says why it failed
        self.gone = "its MCP server '%s' stopped (%s)" % (self.config.name, why)
        self.error = why
        if not self._reported and not self.servers.closing:
            self._reported = True
            self.state = "stopped"
            self.servers.warn("MCP server '%s' stopped (%s); its %d tool%s removed%s" % (
                self.config.name, why, len(self.tools), " is" if len(self.tools) == 1 else "s are",
                " (its log: %s)" % self.log.path if self.log is not None and self.log.path else ""))
        self.state = "stopped"

    def progress(self, tool, done, total, message):
        if done is None:
            return
        amount = "?"
        if isinstance(done, (int, float)) and not isinstance(done, bool):
            try:
                amount = "%g" % done
            except OverflowError:  # an integer past any float
                amount = "?"
            if isinstance(total, (int, float)) and not isinstance(total, bool) and total:
                try:
                    share = 100.0 * done / total
                except (ArithmeticError, ValueError):
                    share = float("nan")
                if math.isfinite(share) and 0 <= share <= 1000:
                    amount = "%d%%" % share
        self.servers.note("  mcp %s/%s: %s%s" % (self.config.name, shown(tool, 60), amount,
                                                  " " + shown(message, 120) if message else ""))

    def describe(self):
        """One row for `mcp list` and /mcp."""
        protocol = "-"
        if self.client is not None and self.client.version:
            protocol = self.client.version
        how = self.client.transport.confinement if self.client is not None else "-"
        return {"name": self.config.name, "state": self.state, "transport": self.config.transport,
                "protocol": protocol, "confinement": how, "error": self.error, "origin": self.config.origin,
                "server": self.config.describe(),
                "tools": [{"name": t.name, "tool": t.remote, "approval": t.approval,
                           "description": t.spec.get("description") or ""} for t in self.tools],
                "skipped": [{"tool": n, "why": w} for n, w in self.skipped],
                "log": self.log.path if self.log is not None else None}

    def close(self):
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # nothing a server does keeps the others running
                pass
        if self.log is not None:
            self.log.close()
        if self.state in ("starting", "running"):
            self.state = "stopped"


class Servers:
    """The MCP servers of one run (or chat): started in parallel at its start, each under its own deadline
    (timeout_seconds: start-up and handshake); their tools for the registry; all stopped by close().

    configs: [ServerConfig]; untrusted: [(name, why[, state])] of a project's servers not started (state
    'untrusted': its file is not trusted; 'refused': trusted, but the entry is wrong or wants a credential);
    root: the working directory; make_sandbox(access, network, read_paths) -> xzatoma_tools.Sandbox (or None
    where nothing confines); home: XZATOMA_HOME (logs); credentials: get/set of stored credentials;
    interactive: a person can be asked (logins may open a browser); warn/note/say: lines for people;
    version: XZatoma's, for clientInfo; require_sandbox: a stdio server that cannot be confined is not started.
    """

    def __init__(self, configs, root, make_sandbox, home=None, credentials=None, interactive=False, warn=None,
                 note=None, say=None, version="0", open_browser=None, require_sandbox=False, untrusted=(),
                 deadline=None):
        self.root = root
        self.deadline = deadline  #: the run's own deadline (time.monotonic()), which bounds start-up too
        self.make_sandbox = make_sandbox
        self.home = home
        self.credentials = credentials
        self.interactive = interactive
        self.warn = warn or (lambda text: None)
        self.note = note or (lambda text: None)
        self.say = say or self.warn
        self.version = version
        self.user_agent = "xzatoma/%s" % version
        self.open_browser = open_browser
        self.require_sandbox = require_sandbox
        self.servers = [Server(c, self) for c in configs]
        self.untrusted = list(untrusted)
        self.names = set()
        self.lock = threading.Lock()
        self.closing = False
        self.started = False

    def start(self):
        """Start every enabled server at once; one line for each that failed (it is left out). Returns self."""
        self.started = True
        try:
            return self._start_all()
        except BaseException:  # Ctrl-C or SIGTERM during start-up: what started stops
            self.close()
            raise

    def _start_all(self):
        threads = []
        for server in self.servers:
            if server.state != "starting":
                continue
            deadline = time.monotonic() + server.config.timeout
            if self.deadline is not None:
                deadline = min(deadline, self.deadline)
            thread = threading.Thread(target=self._start_one, args=(server, deadline), daemon=True,
                                      name="mcp-start-%s" % server.config.name)
            thread.start()
            threads.append((server, thread, deadline))
        for server, thread, deadline in threads:
            thread.join(min(max(0.0, deadline - time.monotonic()) + 1.0, threading.TIMEOUT_MAX))
            while thread.is_alive() and server.logging_in():  # a person in the browser: not a server's delay
                thread.join(0.2)
            late = thread.is_alive() or server.state == "starting" or (
                server.state == "failed" and str(server.error).startswith("no answer in time"))
            if late:
                server.state, server.error = "failed", "no answer within %gs (start-up and handshake; " \
                    "mcp.servers.%s.timeout_seconds)" % (server.config.timeout, server.config.name)
                if self.deadline is not None and self.deadline <= deadline:
                    server.error = "not started within the run's time limit (agent.timeout_seconds, --timeout)"
                server.close()
                server.state = "failed"
            if server.state == "failed":
                self.warn("MCP server '%s' not used: %s%s" % (
                    server.config.name, server.error,
                    " (its log: %s)" % server.log.path if server.log is not None and server.log.path and
                    server.config.transport == "stdio" else ""))
        return self

    def _start_one(self, server, deadline):
        try:
            server.start(deadline)
        except McpError as exc:
            server.state, server.error = "failed", str(exc)
            server.close()
            server.state = "failed"
        except Exception as exc:  # a bug or an odd server: that server is left out, the run goes on
            server.state, server.error = "failed", "%s: %s" % (type(exc).__name__, exc)
            server.close()
            server.state = "failed"

    def tools(self):
        """The tools of the servers that run, for the registry (planning mode keeps the read-only ones)."""
        return [t for s in self.servers if s.state == "running" for t in s.tools]

    def get(self, name):
        return next((s for s in self.servers if s.config.name == name), None)

    def rows(self):
        rows = [s.describe() for s in self.servers]
        rows += [{"name": entry[0], "state": entry[2] if len(entry) > 2 else "untrusted", "error": entry[1],
                  "transport": "-", "protocol": "-", "confinement": "-", "tools": [], "skipped": [],
                  "origin": PROJECT_FILE, "server": "-", "log": None}
                 for entry in self.untrusted]
        return rows

    def close(self):
        """Stop every server (none outlives the run)."""
        self.closing = True
        threads = [threading.Thread(target=s.close, daemon=True) for s in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)


def status_lines(rows, tools=True):
    """`mcp list` / `/mcp` as lines: a server, its state and protocol, then its tools with their approval."""
    lines = []
    for row in rows:
        state = row["state"]
        head = "%s  %s  %s" % (row["name"], state, row["server"])
        if row["protocol"] != "-":
            head += "  (MCP %s, %s)" % (row["protocol"], row["confinement"])
        lines.append(head)
        if row.get("error"):
            lines.append("    " + str(row["error"]))
        if tools:
            for tool in row["tools"]:
                lines.append("    %-40s %s" % (tool["name"], APPROVAL_TEXT[tool["approval"]]))
            for skipped in row["skipped"]:
                lines.append("    %-40s not offered: %s" % (skipped["tool"], skipped["why"]))
    return lines
