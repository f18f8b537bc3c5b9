#!/usr/bin/env python3
"""XZatoma: an autonomous AI agent for the terminal (started by xzatoma.py, a launcher of a few lines, so
that this module's bytecode is cached; `import xzatoma` is this module).

One file, read top to bottom in sections (each opened by a `# ---- … ----`
header): errors and output, configuration, conversation, providers, the agent
loop and how a run ends (the stop family), a task's progress (update_progress), the Session (what a
run, a chat, a subagent and a watcher event share), subagents, prompts, chat, the command line
(each builder beside its cmd_ function) and the interrupt map. Third-party packages (`yaml`, `keyring`)
are imported inside the functions that need them, so `--help` and `--version`
work with the standard library alone and start fast.
"""

import os
import sys
import time


class _LazyModule:
    """A module imported on first attribute use, then swapped in for good (start-up is a feature)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        # INFO: the import statement's own path (__import__), not importlib.import_module: only it is seen by
        # `python -X importtime` / PYTHONPROFILEIMPORTTIME, which the start-up tests read (the names are top-level)
        module = __import__(self._name)
        globals()[self._name] = module
        return getattr(module, attr)


json = _LazyModule("json")
#: INFO: the modules below this one are handles like `json`: each is imported at the first use of one of its names
#: (`xzatoma_tools.build_registry(...)`), so `--help` and `--version` load none of them and `history` only the store,
#: and every function still names where a name comes from. The optional integrations that may fail to import for want
#: of their package (xzatoma_metrics: prometheus_client) are imported where that failure is handled.
xzatoma_store = _LazyModule("xzatoma_store")
xzatoma_tools = _LazyModule("xzatoma_tools")
xzatoma_plans = _LazyModule("xzatoma_plans")
xzatoma_skills = _LazyModule("xzatoma_skills")
xzatoma_mcp = _LazyModule("xzatoma_mcp")
xzatoma_watch = _LazyModule("xzatoma_watch")

__version__ = "0.1.0"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
EXIT_UNVERIFIED = 3
EXIT_HANGUP = 129  #: 128 + SIGHUP: the terminal or ssh session closed under a run

EXIT_CODES_HELP = """exit codes:
  0    completed
  1    the task failed (provider error after retries, max turns, timeout)
  2    bad usage, configuration, plan, or missing credentials
  3    unverified: the model answered without using any tool on a task that needed one
  129  hung up (SIGHUP: the terminal or ssh session closed)
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)"""

# ---- Errors ----


class XzError(Exception):
    """An error for people: one line, and the exit code it maps to."""

    exit_code = EXIT_FAILED

    def __init__(self, message, exit_code=None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(XzError):
    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    pass


class CredentialsError(UsageError):
    pass


class ProviderError(XzError):
    """A provider failed: `retryable` ones are retried by the HTTP helper first."""

    def __init__(self, message, status=None, retryable=False, retry_after=None, exit_code=None, unreachable=False,
                 window=None):
        super().__init__(message, exit_code)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.unreachable = unreachable  #: nothing is listening: every other request to this server fails too
        self.window = window  #: the context window the server said the request exceeded (tokens), or None


class Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler; unwinds like Ctrl-C."""


def require(module, package=None):
    """Import a third-party module or fail with an install hint."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        pkg = package or module
        raise UsageError("this command needs the Python package '%s', which is not installed: %s"
                         % (pkg, xzatoma_store.install_hint(pkg)))


# ---- Output: stdout is data, stderr is for people ----


class Console:
    """Chrome goes to stderr; colour only on a TTY without NO_COLOR.

    Every line passes through clean(): what a model, file, command or server said reaches the terminal with
    its secrets redacted and its escape sequences shown, never emitted; only our own colours are codes.
    """

    COLORS = {"dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36", "bold": "1"}

    def __init__(self, quiet=False, verbose=False, color=None, err=None):
        self.err = err or sys.stderr
        self.quiet = quiet
        self.verbose = verbose
        if color is None:
            color = _isatty(self.err) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        self.color = color
        self._warned = set()
        import _thread  # built in: costs nothing at start-up
        self._get_ident = _thread.get_ident
        self._out_lock = _thread.allocate_lock()
        self._question = _thread.RLock()  # one question at a time: parallel subagents ask one after another
        self._holder = None  # the thread asking a question; other threads' lines wait until it is answered
        self._held = []
        self._status_shown = False  # a spinner line is on screen
        self.lines = 0  #: lines written so far: text streamed to the same terminal is rewritten only when none came between

    @staticmethod
    def clean(text, exact=False):
        """Untrusted text as it may reach a person: secrets redacted, control characters shown visibly."""
        return xzatoma_store.render_untrusted(xzatoma_store.redact(text), exact)

    def style(self, text, *names):
        if not self.color or not names:
            return text
        codes = ";".join(self.COLORS[n] for n in names)
        return "\033[%sm%s\033[0m" % (codes, text)

    def _write(self, text):
        with self._out_lock:
            if self._holder is not None and self._holder != self._get_ident():
                self._held.append(text)
                return
            self._emit(text)

    def _emit(self, text):
        try:
            if self._status_shown:  # wipe the spinner first; it redraws below on its next tick
                text = "\r\033[K" + text
                self._status_shown = False
            self.err.write(text + "\n")
            self.err.flush()
            self.lines += 1
        except (OSError, ValueError):
            pass

    def status(self, text):
        """A transient line (the spinner): drawn in place, wiped before any other line, never over a question."""
        with self._out_lock:
            if self._holder is not None:
                return
            try:
                self.err.write("\r" + self.clean(text) + "\033[K")
                self.err.flush()
                self._status_shown = True
            except (OSError, ValueError):
                pass

    def clear_status(self):
        with self._out_lock:
            if self._status_shown:
                self._status_shown = False
                try:
                    self.err.write("\r\033[K")
                    self.err.flush()
                except (OSError, ValueError):
                    pass

    def hold(self):
        """`with console.hold():` around a question. Questions come one at a time; while one is open, lines
        from other threads (parallel subagents) wait without blocking them, then print whole."""
        import contextlib

        @contextlib.contextmanager
        def held():
            with self._question:
                with self._out_lock:
                    outer = self._holder is not None  # we own the question lock: only we can be holding
                    self._holder = self._get_ident()
                try:
                    yield
                finally:
                    if not outer:
                        with self._out_lock:
                            self._holder = None
                            waiting, self._held = self._held, []
                            for text in waiting:
                                self._emit(text)
        return held()

    def info(self, text, *styles):
        if not self.quiet:
            self._write(self.style(self.clean(text), *styles))

    def warn(self, text, once_key=None):
        if once_key is not None:
            if once_key in self._warned:
                return
            self._warned.add(once_key)
        if not self.quiet:
            self._write(self.style("warning: ", "yellow") + self.clean(text))

    def error(self, text):
        self._write(self.style("error: ", "red", "bold") + self.clean(text))

    def debug(self, text):
        if self.verbose:
            self._write(self.style("debug: " + self.clean(text), "dim"))


class CleanWriter:
    """stdout for people (history, replay, listings): each write passes through Console.clean."""

    def __init__(self, stream, exact=False):
        self.stream, self.exact = stream, exact

    def write(self, text):
        self.stream.write(Console.clean(text, self.exact))

    def flush(self):
        self.stream.flush()


def json_out(obj, **dumps_args):
    """One JSON document on stdout: secrets redacted, nothing a terminal would act on (see render_json)."""
    sys.stdout.write(xzatoma_store.render_json(obj, **dumps_args) + "\n")


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def one_line(text, width=100):
    """xzatoma_store.one_line: redacted, white space folded, cut to `width` (the store's module is imported on
    first use, not at start-up)."""
    return xzatoma_store.one_line(text, width)


# ---- Configuration: defaults < file < environment < flags ----

class Key:
    """One configuration key, all that loading, checking, `config show`, `config init` and the README's table
    know of it. The type is the default's unless given (a key whose default is None names the type it takes
    when set); None is accepted where the default is None or `nullable` says so. A `path` key names a file or
    directory: written relative in a config file, it is taken from that file's directory (load_config)."""

    __slots__ = ("name", "default", "doc", "type", "choices", "bounds", "nullable", "path")

    def __init__(self, name, default, doc, type=None, choices=None, bounds=None, nullable=None, path=False):
        self.name = name  #: dotted: agent.terminal.timeout_seconds
        self.default = default  #: the value when no file, environment variable or flag gives one
        self.doc = doc  #: what it is for, in a line: the template's comment and the README's table
        self.type = type or default.__class__  #: int, float, bool, str, list, or (int, float)
        self.choices = choices  #: the values it may take, or None
        self.bounds = bounds  #: (low, high), inclusive, None for open; or None
        self.nullable = default is None if nullable is None else nullable  #: None is a value
        self.path = path  #: a file or directory: relative in a config file means beside that file


#: what each provider may send with a request (None: the server's default); provider.<type>.<key>
SAMPLING = ("temperature", "top_p", "max_tokens", "seed", "context_window")


def _sampling(provider):
    """The sampling keys of one provider type: the same five for each."""
    p = "provider.%s." % provider
    return (Key(p + "temperature", None, "sampling temperature sent with each request (unset: the server's default)",
                float, bounds=(0, 2)),
            Key(p + "top_p", None, "nucleus sampling share sent with each request (unset: the server's default)",
                float, bounds=(0, 1)),
            Key(p + "max_tokens", None, "cap on a reply's length in tokens (Ollama: num_predict)", int, bounds=(1, None)),
            Key(p + "seed", None, "sampling seed, for repeatable replies where the server honours it", int,
                bounds=(None, None)),
            Key(p + "context_window", None, "the model's context window in tokens, when the server does not say or "
                "says wrongly (read from llama.cpp /props, LM Studio, vLLM and Ollama otherwise)", int,
                bounds=(512, None)))


KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_RUST_ONLY = "read from configuration files written for the Rust XZatoma; no effect here"

#: every configuration key, in the order `config init` writes them and `config show` lists them. The enum
#: values are the tools' constants written out (xzatoma_tools is not imported at start-up); a test holds
#: them equal.
KEYS = (
    Key("provider.type", "copilot", "copilot | ollama | openai (any OpenAI-compatible server)",
        choices=("copilot", "ollama", "openai")),
    Key("provider.max_retries", 3, "retries on connection errors, 429 and 5xx (exponential backoff with jitter)",
        bounds=(0, 20)),
    Key("provider.retry_backoff_seconds", 1.0, "the first retry's delay; each next one doubles it", bounds=(0, 600)),
    Key("provider.request_timeout_seconds", 300, "per-request read timeout", bounds=(1, None)),
    Key("provider.copilot.model", "gpt-5.3-codex", "the Copilot model (env COPILOT_MODEL, XZATOMA_MODEL; --model)"),
    Key("provider.copilot.api_url", "https://api.githubcopilot.com", "Copilot API base"),
    Key("provider.copilot.github_url", "https://github.com", "GitHub, for the device login (`xzatoma auth login`)"),
    Key("provider.copilot.github_api_url", "https://api.github.com", "GitHub's API, which trades the login for a "
        "Copilot token"),
    *_sampling("copilot"),
    Key("provider.ollama.host", "localhost:11434", "host:port or URL of the Ollama server (env OLLAMA_HOST)"),
    Key("provider.ollama.model", "llama3.2:3b", "the Ollama model (env OLLAMA_MODEL, XZATOMA_MODEL; --model)"),
    *_sampling("ollama"),
    Key("provider.openai.base_url", "https://api.openai.com/v1",
        "OpenAI-compatible API base (vLLM, llama.cpp, LM Studio, OpenRouter…)"),
    Key("provider.openai.model", "gpt-4o-mini", "the model (env XZATOMA_MODEL; --model)"),
    Key("provider.openai.api_key_env", "OPENAI_API_KEY", "environment variable that holds the API key"),
    Key("provider.openai.api", "chat", "chat (/chat/completions) | responses (/responses)",
        choices=("chat", "responses")),
    *_sampling("openai"),
    Key("agent.max_turns", 100, "model calls per task before stopping (env XZATOMA_MAX_TURNS)", bounds=(1, None)),
    Key("agent.timeout_seconds", 600, "wall-clock limit for one task", bounds=(1, None)),
    Key("agent.chat_mode", "planning", "the tool set chat starts with: planning (reads and plans) | write (chat "
        "--mode)", choices=("planning", "write")),
    Key("agent.safety_mode", "safe", "chat's approvals at start: safe (asks before changes and commands) | yolo "
        "(chat --safety)", choices=("safe", "yolo")),
    Key("agent.conversation.max_tokens", 100000, "token budget of the conversation (bounded by the model's window)",
        bounds=(1000, None)),
    Key("agent.conversation.min_retain_turns", 5, "most recent turns always kept when pruning", bounds=(1, None)),
    Key("agent.conversation.prune_threshold", 0.8, "prune when the conversation reaches this share of max_tokens",
        bounds=(0.1, 1.0)),
    Key("agent.tools.profile", "auto", "auto | full | compact: compact offers six tools with short definitions (a "
        "quarter of the tokens) for small models; auto picks it for windows of 16k tokens or less and models of 8B "
        "parameters or fewer", choices=("auto", "full", "compact")),
    Key("agent.read_named", "auto", "auto | on | off: before the model's first turn, read the files (up to 4 KB) and "
        "list the directories the task names, up to three (or grep for the code it names, when it names no file), "
        "as if the model had made those calls (aider adds files to the chat); auto: with the compact tool profile",
        choices=("auto", "on", "off")),
    Key("agent.tools.max_output_size", 1048576, "bytes of one tool result sent to the model", bounds=(1024, None)),
    Key("agent.tools.max_file_read_size", 10485760, "bytes read_file reads of one file", bounds=(1024, None)),
    Key("agent.tools.grep_regex_seconds", 60, "longest one grep call may spend matching a regular expression (a "
        "catastrophic pattern is stopped; the run's --timeout also holds)", bounds=(1, None)),
    Key("agent.tools.undo_max_bytes", 52428800, "largest file or directory whose previous content is kept for "
        "'xzatoma undo'"),
    Key("agent.tools.protected_paths", [], "more paths (relative to the working directory) that need a person's "
        "yes to change, beside .git, shell start-up files and key directories"),
    Key("agent.tools.fetch.timeout_seconds", 60, "longest one fetch may take", bounds=(1, None)),
    Key("agent.tools.fetch.max_response_size", 1048576, "bytes of a response fetch reads", bounds=(1, None)),
    Key("agent.tools.fetch.user_agent", "xzatoma/" + __version__, "the User-Agent fetch sends"),
    Key("agent.tools.fetch.cache_ttl_seconds", 86400, "a fetched page is answered from the store for this long "
        "(0: never)", bounds=(0, None)),
    Key("agent.tools.fetch.rate_limit_per_minute", 30, "fetches of one host a minute (0: no limit)", bounds=(0, None)),
    Key("agent.tools.fetch.allowed_hosts", [], "internal hosts fetch may reach deliberately (private addresses are "
        "refused); host:port allows that port only"),
    Key("agent.terminal.default_mode", "restricted_autonomous", "terminal approval of a run: interactive (asks) | "
        "restricted_autonomous (the allowlist, the rest refused) | full_autonomous (all the policy allows)",
        choices=("interactive", "restricted_autonomous", "full_autonomous")),
    Key("agent.terminal.timeout_seconds", 30, "how long one command runs unless the model asks for longer",
        bounds=(1, None)),
    Key("agent.terminal.max_stdout_bytes", 10485760, "bytes of a command's standard output kept"),
    Key("agent.terminal.max_stderr_bytes", 1048576, "bytes of a command's standard error kept"),
    Key("agent.terminal.allowlist", ["ls", "cat", "head", "tail", "grep", "find", "echo", "printf", "pwd", "which",
                                     "type", "wc", "sort", "uniq", "diff", "file", "stat", "du", "df", "tree",
                                     "basename", "dirname", "realpath", "date", "true", "false", "git"],
        "read-only programs (options and paths checked) or command prefixes such as 'make test' that run without "
        "confirmation, inside the sandbox"),
    Key("agent.terminal.custom_denylist", [], "extra commands never run: 'shutdown', 'rm -rf' (program and flags) or "
        "'re:REGEX'"),
    Key("agent.terminal.audit_max_bytes", 10485760, "rotate $XZATOMA_HOME/audit.log at this size (the previous file "
        "is kept)"),
    Key("agent.terminal.max_timeout_seconds", 300, "cap on the timeout_seconds a model asks for one command",
        bounds=(1, None)),
    Key("agent.terminal.sandbox", "workspace-write", "workspace-write | read-only | off: what commands can touch "
        "(OS-enforced)", choices=("workspace-write", "read-only", "off")),
    Key("agent.terminal.network", False, "let sandboxed commands use the network (shown in the run header)"),
    Key("agent.terminal.require_sandbox", False, "refuse to start (exit 2) where the sandbox is not fully enforced"),
    Key("agent.terminal.env_passthrough", [], "extra environment variables commands get (names or patterns like "
        "CARGO_*)"),
    Key("agent.terminal.keep_home", False, "commands see the real HOME (default: HOME is the run's private temp "
        "dir)"),
    Key("agent.terminal.sandbox_assume_missing", [], "testing: treat kernel features as absent (landlock, userns, "
        "landlock-net, scopes, pidns, proc, seccomp, idmap, readonly-view, abi:N)"),
    Key("agent.terminal.limits.processes", 4096, "most processes and threads a run's commands may have at once (0: "
        "no limit)", bounds=(0, None)),
    Key("agent.terminal.limits.memory_mb", 8192, "most memory (heap and private mappings) one command process may "
        "use (0: none)", bounds=(0, None)),
    Key("agent.terminal.limits.file_size_mb", 8192, "largest file a command may write (0: no limit)",
        bounds=(0, None)),
    Key("agent.subagent.max_depth", 3, "how deep subagents may start subagents of their own (0: no subagents)",
        bounds=(0, 10)),
    Key("agent.subagent.default_max_turns", 10, "model calls a subagent gets when its task names none",
        bounds=(1, None)),
    Key("agent.subagent.output_max_size", 4096, "bytes of a subagent's summary its parent is given"),
    Key("agent.subagent.telemetry_enabled", True, _RUST_ONLY),
    Key("agent.subagent.persistence_enabled", True, "subagents' conversations are stored (history list --kind "
        "subagent)"),
    Key("agent.subagent.provider", None, "the provider type subagents use (default: the parent's)", str),
    Key("agent.subagent.model", None, "the model subagents use (default: the parent's)", str),
    Key("agent.quota.max_executions", 100, "subagents one run or chat may start in all", nullable=True),
    Key("agent.quota.max_total_tokens", 1000000, "tokens one run or chat may use, its subagents' included",
        nullable=True),
    Key("agent.quota.max_total_time_seconds", 3600, "seconds one run or chat may take, its subagents' included",
        (int, float), nullable=True),
    Key("agent.mentions.max_file_size", 10485760, "largest file an @mention (or piped standard input) brings in"),
    Key("agent.mentions.url_cache_ttl_seconds", 86400, _RUST_ONLY + " (an @url is fetch's, cached as it says)"),
    Key("agent.mentions.max_urls_per_request", 10, "@urls one message may bring in"),
    Key("agent.instructions_files", ["AGENTS.md"], "project instructions given to the model, looked for in the "
        "working directory and its parents up to the git root or home (nearest last): e.g. CLAUDE.md, "
        ".github/copilot-instructions.md"),
    Key("agent.instructions_max_bytes", 32768, "cap on the project instructions read (all files together; 0 turns "
        "them off)", bounds=(0, None)),
    Key("agent.skills.enabled", True, "offer skills to the model (false: none is offered)"),
    Key("agent.skills.user_dir", None, "your own skills, used in every project (default: skills/ beside the default "
        "config file, ~/.config/xzatoma/skills)", str, path=True),
    Key("agent.skills.catalog_share", 0.02, "share of the context window the skills' names and descriptions may take",
        bounds=(0.0, 0.2)),
    Key("agent.persistence.enabled", True, "store conversations (false: no history, resume or undo records)"),
    Key("agent.persistence.db_path", None, "defaults to $XZATOMA_HOME/conversations.db", str, path=True),
    Key("watcher.enabled", False, _RUST_ONLY + " (`xzatoma watch` is what starts a watcher)"),
    Key("watcher.kafka.bootstrap_servers", "localhost:9092", "the brokers, host:port[,…] (--brokers)"),
    Key("watcher.kafka.topic", "xzepr.events", "the topic plans come on (--topic)"),
    Key("watcher.kafka.group_id", "xzatoma-watcher", "the consumer group: watchers of one group share the "
        "partitions (--group-id)"),
    Key("watcher.kafka.output_topic", None, "results go here (default: <topic>.results; --output-topic)", str),
    Key("watcher.kafka.dead_letter_topic", None, "copies of messages that cannot run go here (--dead-letter-topic)",
        str),
    Key("watcher.kafka.security_protocol", "PLAINTEXT", " | ".join(KAFKA_PROTOCOLS), choices=KAFKA_PROTOCOLS),
    Key("watcher.kafka.sasl_mechanism", None, "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512", str,
        choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
    Key("watcher.kafka.username", None, "SASL user name (or KAFKA_USERNAME)", str),
    Key("watcher.kafka.password", None, "SASL password (or KAFKA_PASSWORD; KAFKA_USERNAME for the username)", str),
    Key("watcher.kafka.ssl_cafile", None, "CA certificates the brokers' are checked against (PEM)", str, path=True),
    Key("watcher.kafka.ssl_certfile", None, "the client's certificate (PEM), for brokers that ask for one", str,
        path=True),
    Key("watcher.kafka.ssl_keyfile", None, "the client certificate's private key (PEM)", str, path=True),
    Key("watcher.kafka.session_timeout_ms", 45000, "a watcher silent this long loses its partitions to the group",
        bounds=(1000, 3600000)),
    Key("watcher.kafka.max_poll_interval_ms", 300000, "longest a watcher may go between polls before the group "
        "takes its partitions", bounds=(1000, None)),
    Key("watcher.kafka.max_request_size", 1048576, "the producer's largest record: every result and dead-letter copy "
        "is made to fit (keep it at or under the broker's message.max.bytes)", bounds=(16384, None)),
    Key("watcher.filter.event_types", [], "event types that run, exact (--event-types)"),
    Key("watcher.filter.sources", [], "regular expressions (search) the event source must match (--source)"),
    Key("watcher.filter.platforms", [], "XZepr platform_ids that run (--platform)"),
    Key("watcher.filter.packages", [], "XZepr packages that run (--package)"),
    Key("watcher.filter.api_versions", [], "XZepr api_versions that run (--api-version)"),
    Key("watcher.filter.include_failed", False, "also run XZepr events with success: false (--include-failed)"),
    Key("watcher.filter.actions", [], "regular expressions (case-insensitive search) the plan's action must match "
        "(--action)"),
    Key("watcher.filter.names", [], "regular expressions (case-insensitive search) the plan's name must match "
        "(--name)"),
    Key("watcher.filter.match_version", None, "semver constraint for plan versions: 1.2.3, ^1.2, ~1.2.3, >=1.0,<2",
        str),
    Key("watcher.format", "auto", "auto | xzepr | cloudevents | plan: how messages are read (--format)",
        choices=("auto", "xzepr", "cloudevents", "plan")),
    Key("watcher.working_dir", None, "the jail of every plan (default: the current directory; --working-dir)", str,
        path=True),
    Key("watcher.mode", "write", "the tool set of event runs: write | planning (--mode)",
        choices=("write", "planning")),
    Key("watcher.max_concurrent", 1, "plans running at once (--max-concurrent)", bounds=(1, 256)),
    Key("watcher.timeout_seconds", 300, "wall-clock limit of one event's run (--timeout)", bounds=(1, None)),
    Key("watcher.allow_dangerous", False, "full terminal autonomy for event runs (default: restricted)"),
    Key("watcher.shutdown_grace_seconds", 30, "on SIGTERM/SIGINT, running plans may finish for this long",
        bounds=(0, None)),
    Key("watcher.answer_max_bytes", 65536, "bytes of the answer a result event carries", bounds=(256, None)),
    Key("watcher.max_message_bytes", 8388608, "larger messages are rejected unread", bounds=(1024, None)),
    Key("watcher.max_attempts", 2, "a message that stopped the watcher (a crash reading or running it) this many "
        "times is set aside: a failed or rejected result, a dead-letter copy, and the commit", bounds=(1, 100)),
    Key("watcher.claim_lease_seconds", 60, "a watcher that died holding an event id keeps it this long from "
        "watchers of other hosts sharing the store (one of this host takes it over at once)", bounds=(5, None)),
    Key("watcher.log_file", None, "the decision log goes here instead of stderr (--log-file)", str, path=True),
    Key("watcher.metrics_host", "127.0.0.1", "the address --metrics-port listens on: 0.0.0.0 (or this host's) for a "
        "Prometheus on another machine (--metrics-host)"),
    Key("xzepr.enabled", False, _RUST_ONLY + " (xzepr.api_url turns the posts on)"),
    Key("xzepr.api_url", None, "with it, run lifecycle events are posted to XZepr too (key: XZEPR_API_KEY)", str),
    Key("xzepr.api_key", None, "XZepr's API key (or XZEPR_API_KEY)", str),
    Key("xzepr.kafka.bootstrap_servers", "localhost:9092", _RUST_ONLY + " (the watcher's are watcher.kafka.*)"),
    Key("xzepr.kafka.topic", "xzepr.events", _RUST_ONLY),
    Key("xzepr.kafka.group_id", "xzatoma-consumer", _RUST_ONLY),
    Key("xzepr.kafka.security_protocol", "PLAINTEXT", _RUST_ONLY, choices=KAFKA_PROTOCOLS),
    Key("xzepr.kafka.sasl_mechanism", None, _RUST_ONLY, str),
    Key("logging.level", "info", "debug | info | warn | error: the watcher's decision log lines shown",
        choices=("debug", "info", "warn", "error")),
    Key("logging.format", "text", "json | text: the watcher's decision log lines (--log-format)",
        choices=("json", "text")),
    Key("mcp.timeout_seconds", 30, "default for each server: its start-up and handshake, and each call, end after "
        "this long", bounds=(1, None)),
    Key("mcp.project_file", True, "use a project's .mcp.json (its servers start once a person trusted its content)"),
)

#: what a whole section of the configuration file is for (its comment in `config init`'s file)
SECTION_DOCS = {
    "provider": "AI provider settings",
    "agent.skills": "skills: folders holding a SKILL.md, in the project's .xzatoma/skills and .agents/skills and in "
                    "user_dir (xzatoma skills --help)",
    "watcher": "xzatoma watch: Kafka topics to plans (flags override these; ${VAR} is read from the environment)",
    "mcp": "MCP servers: mcp.servers.NAME: {command, args, env} or {url, headers}, with network, sandbox, "
           "tools, allow, read_only … (README, 'MCP servers'; xzatoma mcp list)",
}

ENV_KEYS = (  # environment variable -> config key (XZATOMA_MODEL is applied to the active provider)
    ("XZATOMA_PROVIDER", "provider.type"),
    ("COPILOT_MODEL", "provider.copilot.model"),
    ("OLLAMA_HOST", "provider.ollama.host"),
    ("OLLAMA_MODEL", "provider.ollama.model"),
    ("OPENAI_BASE_URL", "provider.openai.base_url"),
    ("XZATOMA_MAX_TURNS", "agent.max_turns"),
    ("KAFKA_USERNAME", "watcher.kafka.username"),
    ("KAFKA_PASSWORD", "watcher.kafka.password"),
    ("XZEPR_API_KEY", "xzepr.api_key"),
)

SECRET_SUFFIXES = ("api_key", "token", "password", "secret")


def flatten(tree, prefix=""):
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and None are leaves."""
    out = {}
    for key, value in tree.items():
        dotted = prefix + key
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _set(tree, dotted, value):
    parts = dotted.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


KEY = {key.name: key for key in KEYS}  #: the table by dotted name


def _nested(keys):
    tree = {}
    for key in keys:
        _set(tree, key.name, key.default)
    return tree


DEFAULTS = _nested(KEYS)  #: the defaults as the configuration file nests them
SECTIONS = {k.rsplit(".", i)[0] for k in KEY for i in range(1, k.count(".") + 1)}


def _closest(name, candidates):
    import difflib
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return " (did you mean '%s'?)" % match[0] if match else ""


def default_config_path(env):
    """$XDG_CONFIG_HOME/xzatoma/config.yaml, else ~/.config/xzatoma/config.yaml. A relative XDG_CONFIG_HOME is
    ignored, as the XDG spec says: taken from the current directory, a project's folder would be the person's
    configuration."""
    base = env.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "xzatoma", "config.yaml")


def private_home(path):
    """XZATOMA_HOME is 0700 and the files in it 0600: created so, and tightened when looser (never the home
    directory itself)."""
    if os.path.realpath(path) != os.path.realpath(os.path.expanduser("~")):
        xzatoma_store.private_dir(path)
        xzatoma_store.private_files_in(path)
    return path


def xzatoma_home(env):
    """$XZATOMA_HOME (a relative one from the current directory, as a shell means it, made absolute once at
    start), else ~/.xzatoma."""
    home = env.get("XZATOMA_HOME")
    return os.path.abspath(os.path.expanduser(home)) if home else os.path.join(os.path.expanduser("~"), ".xzatoma")


def check_home(env):
    """XZATOMA_HOME (or its default ~/.xzatoma) that is a file, or lies under one: a configuration error naming
    it and what to do; it was 'internal error: NotADirectoryError' or a bare '[Errno 17] File exists' (round 18c)."""
    import stat
    home = xzatoma_home(env)
    try:
        is_dir = stat.S_ISDIR(os.stat(home).st_mode)
    except NotADirectoryError:
        is_dir = False
    except OSError:  # not there yet (made when first needed), or not ours to judge here
        return
    if not is_dir:
        named = "XZATOMA_HOME (%s)" % home if env.get("XZATOMA_HOME") else \
            "%s (the default of XZATOMA_HOME)" % home
        raise ConfigError("%s is not a directory: xzatoma keeps its history and credentials there; move the file "
                          "away, or point XZATOMA_HOME at a directory" % named)


def normalize_ollama_host(value):
    """Accept 'host', 'host:port', ':port' or a URL, as Ollama does; return a base URL. Parsed by urllib, so
    userinfo (sent as Basic auth, redacted wherever shown) and a path (a reverse proxy's /ollama) are kept
    (round 19a: 'http://bob:pw@host:8080' became '…:8080:11434' and '/ollama' was dropped)."""
    from urllib.parse import urlsplit
    value = (value or "").strip().rstrip("/")
    parts = urlsplit(value if "://" in value else "http://" + value)
    try:
        port = parts.port or 11434
    except ValueError:  # the value is not quoted back: its userinfo may hold a password
        raise ConfigError("the port in provider.ollama.host (or OLLAMA_HOST) is not a number from 0 to 65535; "
                          "give host:port or a URL such as http://localhost:11434")
    netloc = parts.netloc
    userinfo = netloc.rpartition("@")[0] + "@" if "@" in netloc else ""
    host = parts.hostname or "127.0.0.1"  # lower-cased by urllib, the brackets of an IPv6 address removed
    if host == "0.0.0.0":
        host = "127.0.0.1"
    if ":" in host:
        host = "[%s]" % host
    return "%s://%s%s:%d%s" % (parts.scheme or "http", userinfo, host, port, parts.path.rstrip("/"))


class Config:
    """A read-only view of the effective configuration and where each value came from."""

    def __init__(self, values, sources, path, path_exists, home, secrets, secret_sources, warnings, network=None):
        self._values = values
        self.sources = sources
        self.path = path
        self.path_exists = path_exists
        self.home = home
        self._secrets = secrets
        self._secret_sources = secret_sources
        self.warnings = warnings
        #: how servers are reached, as the environment says once at start: proxies (http, https, all, no_proxy)
        #: and a CA bundle (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE); see network_settings
        self.network = network or {}

    def get(self, dotted):
        node = self._values
        for part in dotted.split("."):
            node = node[part]
        return node

    def section(self, dotted):
        import copy
        return copy.deepcopy(self.get(dotted))

    def secret(self, name):
        """A credential by provider name ('openai', 'copilot', 'ollama'); never shown."""
        return self._secrets.get(name)

    def secret_values(self):
        return [v for v in self._secrets.values() if v]

    def secret_sources(self):
        """Provider name -> the environment variable its credential comes from."""
        return dict(self._secret_sources)

    def leaves(self):
        return flatten(self._values)

    @property
    def provider_type(self):
        return self.get("provider.type")

    @property
    def model(self):
        return self.get("provider.%s.model" % self.provider_type)

    def db_path(self):
        path = self.get("agent.persistence.db_path")
        return os.path.expanduser(path) if path else os.path.join(self.home, "conversations.db")


def _coerce(dotted, value, origin):
    """Check a value against the key's type, choices and bounds (its row in KEYS). Returns the value or raises."""
    key = KEY[dotted]
    # a secret key's value is never quoted back: a numeric password (YAML reads it as a number, so it is
    # neither registered nor shaped like a credential) was printed whole by "must be text, got 98765432109"
    shown = "a %s (not shown: a credential)" % type(value).__name__ if is_secret_key(dotted) else repr(value)
    expected = key.type
    if value is None and key.nullable:
        return None
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, str) and expected in (int, float) or (
            expected == (int, float) and isinstance(value, str)):
        try:
            value = int(value) if expected is int else float(value)
        except ValueError:
            raise ConfigError("%s: %s must be a number, got %s" % (origin, dotted, shown))
    if expected is bool and isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        value = value.lower() in ("true", "yes", "1")
    ok = isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, float, (int, float)))
    if not ok:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "text",
                 list: "a list", (int, float): "a number"}
        raise ConfigError("%s: %s must be %s, got %s" % (origin, dotted, names.get(expected, expected), shown))
    if key.choices and value not in key.choices:
        raise ConfigError("%s: %s must be one of %s, got %s" % (
            origin, dotted, ", ".join(key.choices), shown))
    if key.bounds:
        low, high = key.bounds
        if (low is not None and value < low) or (high is not None and value > high):
            bound = ("between %s and %s" % (low, high)) if high is not None else ("at least %s" % low)
            raise ConfigError("%s: %s must be %s, got %s" % (origin, dotted, bound, shown))
    if expected is list and any(not isinstance(v, str) for v in value):
        raise ConfigError("%s: %s must be a list of text values" % (origin, dotted))
    return value


def _not_a_section(dotted, value, path):
    """`provider: ollama` (a value where a section belongs): it was warned as an unknown key and ignored, and the
    run then failed on the default provider's missing credentials (round 18c)."""
    kind = {str: "text", int: "a number", float: "a number", bool: "true or false", list: "a list"}.get(
        type(value), type(value).__name__)
    typed = KEY.get(dotted + ".type")
    if typed is not None and typed.choices and value in typed.choices:  # a name: shown (anything else may be secret)
        return ("%s: %s must be a mapping, got %r (%s.type: %s is written '%s:' with '  type: %s' on the next "
                "line)" % (path, dotted, value, dotted, value, dotted.rsplit(".", 1)[-1], value))
    keys = sorted({k[len(dotted) + 1:].split(".")[0] for k in KEY if k.startswith(dotted + ".")},
                  key=lambda k: (k != "type", k))
    return "%s: %s must be a mapping of its keys (%s), got %s" % (
        path, dotted, ", ".join(keys[:6]) + (", …" if len(keys) > 6 else ""), kind)


def _read_config_file(path):
    yaml = require("yaml", "pyyaml")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError("cannot read config file %s: %s" % (path, exc.strerror or exc))
    except UnicodeDecodeError as exc:  # a config error (exit 2), not an internal one
        raise ConfigError("%s: not UTF-8 text (byte 0x%02x at offset %d)" % (path, exc.object[exc.start], exc.start))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = "%s:%d" % (path, mark.line + 1) if mark else path
        raise ConfigError("%s: invalid YAML: %s" % (where, getattr(exc, "problem", None) or exc))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("%s: the configuration must be a mapping of keys, got %s" % (path, type(data).__name__))
    return data


def load_config(flags=None, env=None, config_path=None):
    """Build the effective Config. `flags` maps dotted keys to command-line values."""
    import copy
    env = os.environ if env is None else env
    flags = flags or {}
    values = copy.deepcopy(DEFAULTS)
    sources = {k: "default" for k in KEY}
    warnings = []

    explicit = config_path or env.get("XZATOMA_CONFIG")
    path = os.path.expanduser(explicit) if explicit else default_config_path(env)
    exists = os.path.isfile(path)
    if explicit and not exists:
        how = "--config" if config_path else "XZATOMA_CONFIG"
        raise ConfigError("config file not found: %s (given by %s); create it with 'xzatoma config init'"
                          % (path, how))
    if exists:
        data = _read_config_file(path)
        mcp = data.get("mcp")
        if isinstance(mcp, dict) and "servers" in mcp:  # names are the person's own: not config keys
            data = dict(data, mcp={k: v for k, v in mcp.items() if k != "servers"})
            values["mcp"]["servers"] = mcp["servers"] or {}
            if isinstance(mcp["servers"], dict):  # anything else is named by mcp_configs, where it is used
                sources.update(dict.fromkeys(flatten({"mcp": {"servers": mcp["servers"]}}), "file"))
        for dotted, value in flatten(data).items():
            if dotted not in KEY:
                if dotted in SECTIONS:
                    value = None if value is None else value
                    if value is None:
                        continue
                    raise ConfigError(_not_a_section(dotted, value, path))
                warnings.append("unknown config key '%s' in %s (ignored)%s"
                                % (dotted, path, _closest(dotted, KEY)))
                continue
            if isinstance(value, str) and dotted.startswith(("watcher.", "xzepr.")):
                value = _expand_env(value, env, dotted, warnings)
            value = _coerce(dotted, value, path)
            if KEY[dotted].path and value:  # beside the file that says it, never where xzatoma happens to start
                value = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(path)),
                                                     os.path.expanduser(value)))
            _set(values, dotted, value)
            sources[dotted] = "file"

    for var, dotted in ENV_KEYS:
        raw = env.get(var)
        if raw:
            _set(values, dotted, _coerce(dotted, raw, "environment variable " + var))
            sources[dotted] = "env " + var

    if "provider.type" in flags:
        _set(values, "provider.type", _coerce("provider.type", flags["provider.type"], "--provider"))
        sources["provider.type"] = "flag --provider"
    active = values["provider"]["type"]
    model_key = "provider.%s.model" % active
    if env.get("XZATOMA_MODEL"):
        _set(values, model_key, env["XZATOMA_MODEL"])
        sources[model_key] = "env XZATOMA_MODEL"
    for dotted, value in flags.items():
        if dotted == "provider.type" or value is None:
            continue
        if dotted == "model" or dotted in SAMPLING:  # the active provider's: --model, --temperature …
            dotted = "provider.%s.%s" % (active, "model" if dotted == "model" else dotted)
        _set(values, dotted, _coerce(dotted, value, "command line"))
        sources[dotted] = "flag"

    values["provider"]["ollama"]["host"] = normalize_ollama_host(values["provider"]["ollama"]["host"])
    if not values["agent"]["skills"]["user_dir"]:  # the user's config directory: where config.yaml is by default
        values["agent"]["skills"]["user_dir"] = os.path.join(os.path.dirname(default_config_path(env)), "skills")
    key_env = values["provider"]["openai"]["api_key_env"]
    secrets = {"kafka": values["watcher"]["kafka"]["password"] or None, "xzepr": values["xzepr"]["api_key"] or None,
               "openai": env.get(key_env) or None,
               "copilot": env.get("COPILOT_API_TOKEN") or None,
               "github": env.get("GITHUB_TOKEN") or None,
               "ollama": env.get("OLLAMA_API_KEY") or None}
    secret_sources = {"openai": key_env, "copilot": "COPILOT_API_TOKEN",
                      "github": "GITHUB_TOKEN", "ollama": "OLLAMA_API_KEY"}
    register_credentials(env, values, secrets.values())
    check_home(env)
    register_stored_credentials(xzatoma_home(env))
    return Config(values, sources, path, exists, xzatoma_home(env), secrets, secret_sources, warnings,
                  network_settings(env))


def network_settings(env):
    """Proxies and a CA bundle from the environment, read once (requests read them again for every request):
    {"proxies": {"http": …, "https": …, "all": …}, "no_proxy": "…", "ca_bundle": path or None}. The lower-case
    names win, as curl's do; SSL_CERT_FILE needs nothing here (OpenSSL reads it itself)."""
    def pick(name):
        return env.get(name.lower()) or env.get(name.upper()) or None
    proxies = {scheme: pick(scheme + "_proxy") for scheme in ("http", "https", "all")}
    return {"proxies": {k: v for k, v in proxies.items() if v}, "no_proxy": pick("no_proxy") or "",
            "ca_bundle": env.get("REQUESTS_CA_BUNDLE") or env.get("CURL_CA_BUNDLE") or None}


def register_credentials(env, values, known):
    """Tell the redactor every credential configuration knows: the providers' keys, credential-named
    environment variables (OPENAI_API_KEY, PGPASSWORD, BW_SESSION, …: see env_credential), secret config
    keys, and the credentials in the userinfo of any URL in the configuration or the environment
    (DATABASE_URL, a proxy, a Sentry DSN)."""
    for value in known:
        xzatoma_store.register_secret(value)
    for name, value in env.items():
        if xzatoma_store.env_credential(name, value):  # by its name, and by what it is (round 19d)
            xzatoma_store.register_secret(value)
        xzatoma_store.register_secret(url_password(value))
    for dotted, value in flatten(values).items():
        if isinstance(value, str):
            if is_secret_key(dotted):
                xzatoma_store.register_secret(value)
            xzatoma_store.register_secret(url_password(value))


def url_password(url):
    """The credential in a URL's userinfo, or None: its password (scheme://user:password@host), or a user
    name that is one generated word (https://TOKEN@github.com, a Sentry DSN's key; never 'git' or 'postgres')."""
    if not isinstance(url, str) or "@" not in url or "://" not in url:
        return None
    from urllib.parse import unquote, urlsplit
    try:
        parts = urlsplit(url.strip())
        password, user = parts.password, parts.username
    except ValueError:
        return None
    if password:
        return unquote(password)
    if user and len(user) >= 16 and any(ch.isdigit() for ch in user) and any(ch.isalpha() for ch in user):
        return unquote(user)
    return None


def _expand_env(value, env, dotted, warnings):
    """${VAR} in the watcher's and XZepr's config values comes from the environment (secrets stay out of files)."""
    import re

    def sub(m):
        if m.group(1) not in env:
            warnings.append("config %s refers to ${%s}, which is not set" % (dotted, m.group(1)))
        return env.get(m.group(1), "")
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, value)


def is_secret_key(dotted):
    leaf = dotted.rsplit(".", 1)[-1]
    return any(leaf == s or leaf.endswith("_" + s) for s in SECRET_SUFFIXES)


def render_config_template():
    """A commented config.yaml with every key at its default (parses back to DEFAULTS)."""
    lines = ["# XZatoma configuration (precedence: flags > environment > this file > defaults).",
             "# Show the effective values and their sources: xzatoma config show", ""]

    def emit(tree, prefix, indent):
        for key, value in tree.items():
            dotted = prefix + key
            doc = KEY[dotted].doc if dotted in KEY else SECTION_DOCS.get(dotted)
            pad = "  " * indent
            if isinstance(value, dict):
                if doc:
                    lines.append("%s# %s" % (pad, doc))
                lines.append("%s%s:" % (pad, key))
                emit(value, dotted + ".", indent + 1)
            else:
                text = "%s%s: %s" % (pad, key, json.dumps(value))
                lines.append(text + ("  # " + doc if doc else ""))
    emit(DEFAULTS, "", 0)
    return "\n".join(lines) + "\n"


def render_config_table():
    """The README's table of every configuration key (tests/test_config.py holds README.md to it)."""
    names = {int: "integer", float: "number", bool: "true or false", str: "text", list: "list of text",
             (int, float): "number"}
    rows = ["| key | default | takes | meaning |", "| --- | --- | --- | --- |"]
    for key in KEYS:
        default = "unset" if key.default is None else "`%s`" % json.dumps(key.default).replace(__version__, "VERSION")
        takes = " \\| ".join("`%s`" % c for c in key.choices) if key.choices else \
            "path" if key.path else names[key.type]
        low, high = key.bounds or (None, None)
        if low is not None:
            takes += ", %s to %s" % (low, high) if high is not None else ", at least %s" % low
        rows.append("| `%s` | %s | %s | %s |" % (key.name, default, takes + (", or unset" if key.nullable else ""),
                                               key.doc.replace("|", "\\|")))
    return "\n".join(rows) + "\n"


# ---- Conversation: messages, incremental token count, pruning by whole turns ----


def estimate_tokens(message):
    """About one token per four characters, plus framing."""
    n = len(message.get("content") or "") + 16
    for call in message.get("tool_calls") or ():
        n += len(call["name"]) + len(call.get("arguments") or "") + 16
    return n // 4


def reply_usage(reply, sent_estimate):
    """(prompt, completion, estimated): the server's counts, or our estimate for what it did not count.

    Some servers send no usage when streaming (llama.cpp without include_usage, Ollama with a cached prompt):
    without an estimate, quotas on tokens would never count and the totals would read 0.
    """
    prompt = reply.usage.get("prompt_tokens") or 0
    completion = reply.usage.get("completion_tokens") or 0
    estimated = False
    if not prompt:
        prompt, estimated = sent_estimate, True
    if not completion and (reply.content or reply.tool_calls or reply.thinking):
        completion = estimate_tokens({"content": (reply.content or "") + (reply.thinking or ""),
                                      "tool_calls": reply.tool_calls})
        estimated = True
    return prompt, completion, estimated


#: how much of a task refused as too large is kept, stored and shown to the model after it (Conversation.cut_task)
TASK_KEPT = 2000
#: tokens over which a task waits for the verdict on its size before it is stored (Recorder.hold_over): twice the
#: smallest window worth a run (512 tokens); a shorter one is stored at once
TASK_HELD_OVER = 1024


class Conversation:
    """The message list with a running token estimate (O(1) per message) and pruning.

    Messages are plain dicts: role, content, and for assistant tool calls
    `tool_calls` [{id, name, arguments (JSON text)}]; tool results carry
    `tool_call_id` and `name`. Pruning removes whole units (an assistant
    message with all its tool results, or a user message), so a tool call is
    never separated from its result.
    """

    def __init__(self, max_tokens=100000, min_retain_turns=5, prune_threshold=0.8):
        self.messages = []
        self._estimates = []
        self._estimated = 0
        self._offset = 0  # provider-reported prompt tokens minus our estimate
        self.max_tokens = max_tokens
        self.min_retain_turns = min_retain_turns
        self.prune_threshold = prune_threshold
        self.pruned = {"messages": 0, "turns": 0, "tools": {}, "count": 0}
        self.on_append = None  # callback(message) for persistence
        self.on_replace = None  #: callback(old message, new message) when a message not yet sent is rewritten
        self.calibrated = False  #: the count includes the provider's (tool definitions and all)

    def sent_estimate(self, tools=()):
        """Tokens a request with these tool definitions carries, for servers that do not say."""
        return self.tokens + (0 if self.calibrated else len(json.dumps(list(tools))) // 4)

    # adding
    def add(self, message):
        est = estimate_tokens(message)
        self.messages.append(message)
        self._estimates.append(est)
        self._estimated += est
        if self.on_append is not None:
            self.on_append(message)
        return message

    def add_system(self, content):
        return self.add({"role": "system", "content": content})

    def add_user(self, content):
        return self.add({"role": "user", "content": content})

    def add_assistant(self, content, tool_calls=None):
        msg = {"role": "assistant", "content": content or ""}
        if tool_calls:
            msg["tool_calls"] = [{"id": c["id"], "name": c["name"], "arguments": c.get("arguments") or "{}"}
                                 for c in tool_calls]
        return self.add(msg)

    def add_tool_result(self, call_id, name, content):
        return self.add({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})

    def set_system_prompt(self, content):
        """Replace the leading system prompt (mode switches keep the rest)."""
        if self.messages and self.messages[0]["role"] == "system":
            old = self._estimates[0]
            self.messages[0] = {"role": "system", "content": content}
            self._estimates[0] = estimate_tokens(self.messages[0])
            self._estimated += self._estimates[0] - old
        else:
            self.messages.insert(0, {"role": "system", "content": content})
            self._estimates.insert(0, estimate_tokens(self.messages[0]))
            self._estimated += self._estimates[0]

    # accounting
    @property
    def tokens(self):
        return max(self._estimated + self._offset, 0)

    def calibrate(self, prompt_tokens):
        """Adopt the provider's count for everything sent so far (tool definitions included).

        A count far from our estimate (a server that reports nonsense) is ignored.
        """
        if prompt_tokens and self._estimated / 4 <= prompt_tokens <= self._estimated * 4 + 2000:
            self._offset = prompt_tokens - self._estimated
            self.calibrated = True

    def dangling_calls(self):
        """Tool calls of the last assistant message that have no result yet."""
        for i in range(len(self.messages) - 1, -1, -1):
            msg = self.messages[i]
            if msg["role"] == "assistant":
                answered = {m.get("tool_call_id") for m in self.messages[i + 1:] if m["role"] == "tool"}
                return [c for c in msg.get("tool_calls") or () if c["id"] not in answered]
            if msg["role"] == "user":
                return []
        return []

    def close_dangling(self, text="Error: interrupted"):
        """Give every unanswered tool call a result, so providers accept the history."""
        for call in self.dangling_calls():
            self.add_tool_result(call["id"], call["name"], text)

    # pruning
    def limit(self, context_window=None):
        if context_window:
            return min(self.max_tokens, int(context_window))
        return self.max_tokens

    def needs_pruning(self, context_window=None):
        return self.tokens > self.limit(context_window) * self.prune_threshold

    def _head_end(self):
        """Index after the kept head: leading system messages, the environment, and the original instruction."""
        i = 0
        while i < len(self.messages) and (self.messages[i]["role"] == "system"
                                          or self.messages[i].get("name") == "environment"):
            i += 1
        if i < len(self.messages) and self.messages[i]["role"] == "user":
            i += 1
        if i < len(self.messages) and self.messages[i].get("pruned_summary"):
            i += 1
        return i

    def head_tokens(self):
        """The estimated tokens of what pruning always keeps: the system messages, environment and instruction."""
        return sum(self._estimates[:self._head_end()])

    def prune(self, context_window=None, force=False):
        """Drop the oldest whole turns until well under the threshold. Returns a summary or None.
        force: the server refused the conversation as too long, whatever our count says."""
        limit = self.limit(context_window)
        if force:
            self._offset = max(self._offset, int(limit) + 1 - self._estimated)
        if self.tokens <= limit * self.prune_threshold:
            return None
        target = limit * self.prune_threshold * 0.7  # hysteresis: pruning is rare, not every turn
        head = self._head_end()
        units = []  # start indexes of units after the head
        for i in range(head, len(self.messages)):
            if self.messages[i]["role"] != "tool":
                units.append(i)
        removable = len(units) - (1 if force else self.min_retain_turns)  # refused as too long: keep only the last
        if removable <= 0:
            return None
        tokens = self.tokens
        cut_unit = 0
        while cut_unit < removable and tokens > target:
            end = units[cut_unit + 1] if cut_unit + 1 < len(units) else len(self.messages)
            tokens -= sum(self._estimates[units[cut_unit]:end])
            cut_unit += 1
        if cut_unit == 0:
            return None
        cut = units[cut_unit] if cut_unit < len(units) else len(self.messages)
        removed = self.messages[head:cut]
        stats = self.pruned
        stats["count"] += 1
        stats["messages"] += len(removed)
        for msg in removed:
            if msg["role"] == "assistant":
                stats["turns"] += 1
            for call in msg.get("tool_calls") or ():
                stats["tools"][call["name"]] = stats["tools"].get(call["name"], 0) + 1
        tools = ", ".join("%s ×%d" % kv for kv in sorted(stats["tools"].items(), key=lambda kv: -kv[1]))
        text = ("[CONTEXT PRUNED: %d earlier messages from %d turns were removed to fit the context window; "
                "%d tool calls: %s. Re-run a tool if you need its output again.]"
                % (stats["messages"], stats["turns"], sum(stats["tools"].values()), tools or "none"))
        summary = {"role": "system", "content": text, "pruned_summary": True}
        # replace an earlier summary (it sits just before `head`) rather than stacking them
        start = head
        if head > 0 and self.messages[head - 1].get("pruned_summary"):
            start = head - 1
        removed_est = sum(self._estimates[start:cut])
        self.messages[start:cut] = [summary]
        est = estimate_tokens(summary)
        self._estimates[start:cut] = [est]
        self._estimated += est - removed_est
        return text

    def cut_task(self, note):
        """The task (the instruction pruning keeps) cut to its first TASK_KEPT characters and `note`, which is
        formatted with the characters left out: what was refused is neither stored whole nor sent again."""
        i = self._head_end() - 1
        if i > 0 and self.messages[i].get("pruned_summary"):  # pruned after it: the summary follows the task
            i -= 1
        if i < 0 or self.messages[i]["role"] != "user" or len(self.messages[i].get("content") or "") <= TASK_KEPT:
            return
        old = self.messages[i]
        # redacted before the cut (a secret cut in two is no longer one redact() knows), in a window a secret
        # across the cut fits in: the whole task would cost 0.3 s a MB
        kept = xzatoma_store.redact(old["content"][:TASK_KEPT + 4096])[:TASK_KEPT]
        new = dict(old, content=kept + note % _fmt_tokens(len(old["content"]) - TASK_KEPT))
        est = estimate_tokens(new)
        self.messages[i], self._estimated = new, self._estimated + est - self._estimates[i]
        self._estimates[i] = est
        if self.on_replace is not None:
            self.on_replace(old, new)

    def turn_count(self):
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def last_user_text(self):
        """The latest person's message (what the next run is asked), "" when there is none."""
        for msg in reversed(self.messages):
            if msg["role"] == "user" and not msg.get("name"):
                return msg.get("content") or ""
        return ""

    def read_so_far(self):
        """Everything the model has read (tool results and user messages), for telling a quoted call from one
        it makes."""
        return "\n".join(m.get("content") or "" for m in self.messages if m["role"] in ("tool", "user"))


# ---- Credentials: environment, system keyring, or a 0600 file ----

KEYRING_SERVICE = "xzatoma"
COPILOT_CLIENT_ID = "Iv1.b507a08c87ecfe98"  # the Copilot editor integration's OAuth app
CREDENTIAL_KEYS = {"copilot": ("github_token", "copilot_token"), "openai": ("openai_api_key",),
                   "ollama": ("ollama_api_key",)}


class CredentialStore:
    """Stored credentials: the system keyring (service 'xzatoma') when one works, else
    $XZATOMA_HOME/credentials.json created 0600 (and refused when others can read it)."""

    def __init__(self, home, console):
        self.home = home
        self.file = os.path.join(home, "credentials.json")
        #: the names xzatoma keeps in the keyring (never values): importing keyring and asking its backend costs
        #: more than a whole one-shot run's model call, so a name not listed here is not looked for
        self.index = os.path.join(home, "keyring-names.json")
        self.console = console
        self._keyring = None
        self.no_keyring = None  #: why the system keyring is not used (after keyring()), for `auth status`

    def keyring(self):
        """The keyring module when a real backend works here, else False."""
        if self._keyring is None:
            self._keyring = False
            self.no_keyring = "no system keyring backend works here"
            self._absent = True  #: no keyring here at all (not a locked or failing one): it holds nothing
            try:
                import keyring
                from keyring.backends import fail
                backend = keyring.get_keyring()
                if not isinstance(backend, fail.Keyring) and getattr(backend, "priority", 1) > 0:
                    self._absent = False
                    keyring.get_password(KEYRING_SERVICE, "__probe__")
                    self._keyring, self.no_keyring = keyring, None
            except ImportError:  # the one-file build (xzatoma.pyz) leaves keyring out
                self.no_keyring = "the Python package 'keyring' is not installed"
            except Exception:  # no backend, locked or broken backend: use the file
                self._keyring = False
        return self._keyring

    def where_stored(self):
        """One line for people: where `auth login` puts credentials, and why not in the keyring."""
        if self.keyring():
            return "stored credentials go to the system keyring (service '%s')" % KEYRING_SERVICE
        return "stored credentials go to %s (mode 0600): %s" % (self.file, self.no_keyring)

    def _read_file(self):
        try:
            st = os.stat(self.file)
        except FileNotFoundError:
            return {}
        if st.st_mode & 0o077:
            raise CredentialsError("credentials file %s is readable by other users (mode %s); fix it with "
                                   "'chmod 600 %s'" % (self.file, oct(st.st_mode & 0o777), self.file))
        try:
            with open(self.file, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CredentialsError("cannot read credentials file %s: %s" % (self.file, getattr(exc, "strerror", exc)))
        return data if isinstance(data, dict) else {}

    def _write_file(self, data):
        private_home(self.home)
        xzatoma_store.write_private(self.file, json.dumps(data))

    def describe(self, where):
        return "the system keyring" if where == "keyring" else self.file

    def get(self, name):
        """(value, 'keyring'|'file') or (None, None). Every value read is registered with the redactor."""
        names = self.keyring_names()
        if names is None or name in names:
            kr = self.keyring()
            if kr:
                try:
                    value = kr.get_password(KEYRING_SERVICE, name)
                except Exception:
                    value = None
                if value:
                    return _registered(value), "keyring"
        value = self._read_file().get(name)
        return (_registered(value), "file") if value else (None, None)

    def keyring_names(self):
        """The names xzatoma stored in the keyring, or None when that is not known yet (no index: the keyring
        is asked, and the index written from its answers)."""
        try:
            with open(self.index, encoding="utf-8") as fh:
                names = json.load(fh)
            if isinstance(names, list):
                return set(names)
        except (OSError, ValueError):
            pass
        return self.reindex()

    def reindex(self):
        """Ask the keyring for each name xzatoma uses and write down which it holds (`auth status` does this
        too, so an entry made with another tool is found). None when no keyring works here."""
        kr = self.keyring()
        if not kr:
            if self._absent:  # nothing can be there: later runs need not import keyring to learn it again
                self._write_index(())
                return set()
            return None
        held = set()
        for name in sorted({n for names in CREDENTIAL_KEYS.values() for n in names}):
            try:
                if kr.get_password(KEYRING_SERVICE, name):
                    held.add(name)
            except Exception:
                return None  # a locked keyring answers nothing now: ask it again next time
        self._write_index(held)
        return held

    def _write_index(self, names):
        try:
            private_home(self.home)
            xzatoma_store.write_private(self.index, json.dumps(sorted(names)))
        except OSError as exc:  # no index: the keyring is asked each time, as before
            self.console.debug("cannot write %s: %s" % (self.index, exc))

    def set(self, name, value):
        _registered(value)
        kr = self.keyring()
        if kr:
            try:
                kr.set_password(KEYRING_SERVICE, name, value)
                self._write_index((self.keyring_names() or set()) | {name})
                return "keyring"
            except Exception as exc:
                self.console.debug("keyring refused the credential: %s" % type(exc).__name__)
        data = self._read_file()
        data[name] = value
        self._write_file(data)
        self.console.warn("no system keyring works here; credentials are stored in %s (mode 0600)" % self.file,
                          once_key="credentials-file")
        return "file"

    def delete(self, name):
        removed = []
        kr = self.keyring()
        if kr:
            try:
                if kr.get_password(KEYRING_SERVICE, name):
                    kr.delete_password(KEYRING_SERVICE, name)
                    removed.append("keyring")
            except Exception:
                pass
            self._write_index((self.keyring_names() or set()) - {name})
        data = self._read_file()
        if name in data:
            del data[name]
            self._write_file(data)
            removed.append("file")
        return removed


def register_stored_credentials(home):
    """Every value in credentials.json is a credential this process knows, whichever provider this run uses:
    registered at start, so a stored OpenAI key read from a file (or echoed by a server) during a run on Ollama
    is redacted like the key in use. Only reads: a file others can read is refused where it is used (get())."""
    import stat
    path = os.path.join(home, "credentials.json")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1048576:  # never a FIFO that would block the start
            return
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return
    if isinstance(data, dict):
        for value in data.values():
            _registered(value)


def _registered(value):
    """A credential value, registered with the redactor (a stored Copilot token is JSON: its token too)."""
    if isinstance(value, str):
        xzatoma_store.register_secret(value)
        if value.startswith("{"):
            try:
                xzatoma_store.register_secret(json.loads(value).get("token"))
            except (ValueError, AttributeError):
                pass
    return value


def next_poll_interval(current, response):
    """GitHub's device flow: slow_down asks for the interval it names, or 5 seconds more."""
    if response.get("error") == "slow_down":
        return float(response["interval"]) if "interval" in response else current + 5
    return current


def copilot_device_login(cfg, console, creds):
    """GitHub's OAuth device flow for the Copilot client id; returns the GitHub token."""
    github = cfg.get("provider.copilot.github_url").rstrip("/")
    session = HttpSession(cfg.network)
    headers = {"Accept": "application/json"}
    try:
        resp = session.request("POST", github + "/login/device/code", headers=headers, timeout=(30, 30),
                               data={"client_id": COPILOT_CLIENT_ID, "scope": "read:user"})
        if resp.status_code >= 400:
            raise ValueError("HTTP %d: %s" % (resp.status_code, error_text(resp.text)))
        device = resp.json()
    except (HttpFailure, ValueError) as exc:
        raise XzError("cannot start the GitHub login at %s: %s" % (github, one_line(exc, 160)))
    console._write("To sign in to GitHub Copilot, open %s and enter the code %s"
                   % (console.clean(device["verification_uri"], exact=True),
                      console.style(console.clean(device["user_code"], exact=True), "bold")))
    console._write("Waiting for you to authorise… (Ctrl-C cancels)")
    expired = XzError("the login code expired before it was used; run 'xzatoma auth login' again")
    interval = float(device.get("interval", 5))
    deadline = time.monotonic() + float(device.get("expires_in", 900))
    while True:
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            raise XzError("login cancelled; nothing was stored", EXIT_INTERRUPTED)
        if time.monotonic() > deadline:
            raise expired
        try:
            resp = session.request("POST", github + "/login/oauth/access_token", headers=headers, timeout=(30, 30),
                                   data={"client_id": COPILOT_CLIENT_ID, "device_code": device["device_code"],
                                         "grant_type": "urn:ietf:params:oauth:grant-type:device_code"})
            data = resp.json()
        except (HttpFailure, ValueError) as exc:
            raise XzError("GitHub login failed: %s" % one_line(exc, 160))
        if data.get("access_token"):
            return _registered(data["access_token"])
        error = data.get("error")
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval = next_poll_interval(interval, data)
            continue
        if error == "expired_token":
            raise expired
        if error == "access_denied":
            raise XzError("the authorisation was declined on GitHub; nothing was stored")
        raise XzError("GitHub login failed: %s" % (data.get("error_description") or error or "no token returned"))


def exchange_copilot_token(cfg, github_token, session=None):
    """Trade a GitHub token for a short-lived Copilot token: {token, expires_at, api}."""
    url = cfg.get("provider.copilot.github_api_url").rstrip("/") + "/copilot_internal/v2/token"
    headers = dict(CopilotProvider.EDITOR_HEADERS, Authorization="token " + github_token, Accept="application/json")
    try:
        resp = (session or HttpSession(cfg.network)).request("GET", url, headers=headers, timeout=(30, 30))
    except HttpFailure as exc:
        raise ProviderError("cannot reach GitHub to get a Copilot token: %s" % exc,
                            retryable=exc.kind not in ("dns", "not_http"))
    if resp.status_code in (401, 403, 404):
        raise CredentialsError("GitHub refused the Copilot token exchange (HTTP %d): the GitHub token is invalid, "
                               "expired or has no Copilot access; run 'xzatoma auth login'" % resp.status_code)
    if resp.status_code >= 400:
        raise ProviderError("GitHub returned HTTP %d for the Copilot token exchange" % resp.status_code,
                            retryable=resp.status_code >= 500)
    data = resp.json()
    _registered(data.get("token"))
    return {"token": data["token"], "expires_at": float(data.get("expires_at") or time.time() + 1500),
            "api": (data.get("endpoints") or {}).get("api")}


class CopilotAuth:
    """Where the Copilot token comes from, and keeping it fresh (before expiry, and once after a 401)."""

    REFRESH_MARGIN = 120

    def __init__(self, cfg, console, creds=None):
        import threading
        self.cfg, self.console = cfg, console
        self.lock = threading.RLock()  # parallel subagents share one token
        self.creds = creds or CredentialStore(cfg.home, console)
        self.ready = cfg.secret("copilot")  # COPILOT_API_TOKEN: used as is, cannot be refreshed
        self.github, self.github_source = cfg.secret("github"), "env GITHUB_TOKEN"
        if not self.github and not self.ready:
            self.github, where = self.creds.get("github_token")
            self.github_source = where
        self.current = None
        if not self.ready and self.github_source != "env GITHUB_TOKEN":  # the cached token is the stored login's
            cached, _ = self.creds.get("copilot_token")
            if cached:
                try:
                    self.current = json.loads(cached)
                except ValueError:
                    self.current = None
        if not self.ready and not self.github:
            raise CredentialsError("no Copilot credentials: run 'xzatoma auth login' or set COPILOT_API_TOKEN "
                                   "(or GITHUB_TOKEN to a token with Copilot access)")

    def source(self):
        return "env COPILOT_API_TOKEN" if self.ready else self.github_source

    def token(self):
        if self.ready:
            return self.ready
        with self.lock:
            if not self.current or self.current.get("expires_at", 0) - self.REFRESH_MARGIN < time.time():
                self.refresh()
            return self.current["token"]

    def api_base(self):
        if self.cfg.sources.get("provider.copilot.api_url") == "default" and self.current and self.current.get("api"):
            return self.current["api"].rstrip("/")
        return self.cfg.get("provider.copilot.api_url").rstrip("/")

    def refresh(self):
        """Exchange the GitHub token again; False when there is none to exchange."""
        if not self.github:
            return False
        with self.lock:
            try:
                self.current = exchange_copilot_token(self.cfg, self.github)
            except CredentialsError as exc:
                if self.github_source == "env GITHUB_TOKEN":
                    raise CredentialsError(str(exc).replace("the GitHub token", "GITHUB_TOKEN (from the environment)")
                                           .replace("run 'xzatoma auth login'", "fix or unset it"))
                raise
            if self.github_source != "env GITHUB_TOKEN":
                try:
                    self.creds.set("copilot_token", json.dumps(self.current))
                except XzError:
                    pass
        return True


# ---- HTTP: one kept-alive connection per server, standard library only ----
# INFO: the providers used `requests`. Importing it cost more than a whole bare POST to a local server (the
# floor a one-shot run is measured against), it read the proxy settings again for every request, and a
# stream not read to its very end closed its connection, so every model turn paid a new TCP (and TLS)
# handshake. What the providers need is small: keep-alive, streamed lines, timeouts, proxies and TLS.


class HttpFailure(Exception):
    """A request that got no HTTP answer. `kind`: refused, dns, timeout, tls, proxy, url, network or broken."""

    def __init__(self, message, kind):
        super().__init__(message)
        self.kind = kind


#: the most of one reply's body, and of one line of a stream, that is read: a server answering without end (a
#: broken proxy's endless error page, JSON that never closes) took a watcher past 1.5 GB in 6 s (round 15b)
MAX_BODY_BYTES, MAX_LINE_BYTES = 32 << 20, 16 << 20
#: of an error reply, only what is shown
ERROR_BODY_BYTES = 65536

#: how much of a stream the caller stopped reading early is still read to keep its connection; beyond it (a
#: server still generating after a reply was cut off) the connection is closed, which stops the server
DRAIN_BYTES, DRAIN_SECONDS = 65536, 0.5
#: seconds a host name that did not resolve is answered from memory: a run asks its server three times before
#: the first model call (is it local? its window? the call), and a resolver with no network behind it takes
#: seconds per look-up; a watcher that lives for days asks again after this
UNRESOLVED_SECONDS = 10.0


def _http_failure(exc, connecting=False):
    """An OSError / http.client error as an HttpFailure with a reason a person can act on."""
    import http.client
    import socket
    import ssl
    if isinstance(exc, HttpFailure):
        return exc
    if isinstance(exc, socket.gaierror):
        return HttpFailure("host not found (%s)" % (exc.strerror or exc), "dns")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return HttpFailure("the server's TLS certificate is not trusted here (%s); point REQUESTS_CA_BUNDLE or "
                           "SSL_CERT_FILE at your CA bundle" % (exc.verify_message or exc.reason), "tls")
    if isinstance(exc, ssl.SSLError):
        return HttpFailure("TLS failed: %s" % (exc.reason or exc), "tls")
    if isinstance(exc, socket.timeout) or getattr(exc, "errno", None) == 110:
        return HttpFailure("connection timed out" if connecting else "read timed out", "timeout")
    if isinstance(exc, ConnectionRefusedError):
        return HttpFailure("connection refused", "refused")
    if getattr(exc, "errno", None) in (101, 113):  # ENETUNREACH, EHOSTUNREACH
        return HttpFailure("network unreachable", "network")
    if isinstance(exc, (http.client.BadStatusLine, http.client.LineTooLong)) and \
            not isinstance(exc, ConnectionError):
        # connected, and something else answered (an SSH or SMTP banner, a database): a wrong port, not a
        # transient failure, and said with what it sent (round 18c: retried 4 times as "cannot connect")
        sent = getattr(exc, "line", "") if isinstance(exc, http.client.BadStatusLine) else ""
        shown = json.dumps(sent[:60], ensure_ascii=True) if sent.strip() else "a line longer than HTTP allows"
        return HttpFailure("the server answered, but not in HTTP: %s" % shown, "not_http")
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError):
        return HttpFailure("the server broke the HTTP exchange (%s)" % (type(exc).__name__), "broken")
    return HttpFailure(one_line(exc, 160) or type(exc).__name__, "broken")


class HttpResponse:
    """What the providers read: status_code, headers (case-insensitive .get), json(), text, iter_lines().
    close() reads what is left of a stream (DRAIN_BYTES at most) so the connection serves the next request."""

    def __init__(self, raw, conn, release, sock=None):
        self._raw, self._conn, self._release = raw, conn, release
        self.status_code = raw.status
        self.headers = raw.headers
        #: for the deadline's watchdog, which shuts it down: the request's own socket, which a reply ending with
        #: its connection takes from `conn` (the run's deadline went unenforced on one, found in review)
        self.sock = sock or conn.sock
        self._content = None

    @property
    def content(self):
        if self._content is None:
            try:
                self._content = self._raw.read(MAX_BODY_BYTES + 1)
                if len(self._content) > MAX_BODY_BYTES:
                    self._content = None
                    raise HttpFailure("the reply is larger than %d MB" % (MAX_BODY_BYTES >> 20), "too_large")
            except HttpFailure:
                raise
            except (OSError, ValueError) as exc:
                raise _http_failure(exc)
            except Exception as exc:  # http.client.IncompleteRead and its kin
                raise _http_failure(exc)
        return self._content

    @property
    def text(self):
        return self._decode(self.content)

    def head(self, size=ERROR_BODY_BYTES):
        """The body's first `size` bytes as text (an error reply: only its beginning is ever shown)."""
        if self._content is not None:
            return self._decode(self._content[:size])
        try:
            return self._decode(self._raw.read(size))
        except Exception as exc:  # OSError, http.client.IncompleteRead …
            raise _http_failure(exc)

    def _decode(self, data):
        charset = self.headers.get_content_charset() or "utf-8"
        try:
            return data.decode(charset, "replace")
        except LookupError:
            return data.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)

    def iter_lines(self):
        """The body's lines without their endings (LF, CRLF or CR), as they arrive; none over MAX_LINE_BYTES, and
        all of them MAX_BODY_BYTES at most, as a whole body is: a stream of 300 MB of answer, in lines under the
        bound, took a watcher past 1.7 GB and its store past 2 GB, and the one write of it held the store's lock
        until the watcher's own claims lapsed, so the event ran again, for good (attack round 17b).
        Only the new chunk is searched for a line's end: splitting all that waited was quadratic in a long line."""
        pending, size, total = [], 0, 0  # the line so far, in chunks without a line feed
        while True:
            chunk = self._read_some()
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise HttpFailure("the reply is larger than %d MB" % (MAX_BODY_BYTES >> 20), "too_large")
            if b"\n" not in chunk:
                pending.append(chunk)
                size += len(chunk)
                if size > MAX_LINE_BYTES:
                    raise HttpFailure("a line of the reply is longer than %d MB" % (MAX_LINE_BYTES >> 20),
                                      "too_large")
                continue
            lines = chunk.split(b"\n")
            lines[0] = b"".join(pending) + lines[0]
            tail = lines.pop()
            pending, size = ([tail], len(tail)) if tail else ([], 0)
            for line in lines:
                line = line[:-1] if line.endswith(b"\r") else line
                if b"\r" in line:
                    for part in line.split(b"\r"):
                        yield part
                else:
                    yield line
        if pending:
            yield b"".join(pending)

    def _read_some(self):
        raw = self._raw
        if raw.isclosed() or (not raw.chunked and raw.length == 0):
            return b""
        try:
            return raw.read1(65536)
        except Exception as exc:  # OSError, http.client.IncompleteRead …
            raise _http_failure(exc)

    def close(self):
        """Give the connection back when the body was read to its end (draining a little), else close it."""
        raw, conn = self._raw, self._conn
        if conn is None:
            return
        self._conn = None
        reusable = not raw.will_close
        if reusable and not raw.isclosed():
            try:
                conn.sock.settimeout(DRAIN_SECONDS)
                left = DRAIN_BYTES
                while left > 0 and self._read_some():
                    left -= 65536
                reusable = raw.isclosed() or (not raw.chunked and raw.length == 0)
            except (HttpFailure, OSError, ValueError):
                reusable = False
        if reusable:
            raw.close()
            self._release(conn)
        else:
            raw.close()
            conn.close()


class HttpSession:
    """Requests over one kept-alive connection per server (per thread: Provider.clone makes another)."""

    def __init__(self, network=None, user_agent="xzatoma/" + __version__):
        network = network or {}
        self.proxies = network.get("proxies") or {}
        self.no_proxy = network.get("no_proxy") or ""
        self.ca_bundle = network.get("ca_bundle")
        self.user_agent = user_agent
        self._idle = {}  # (scheme, host, port, proxy) -> an idle connection, checked before it is used again
        self._active = None  # the connection of the request in flight (or of the last one)
        self._active_sock = None  # its socket, which a reply ending with the connection takes from it
        self._cut = False  # cut() was called since the request in flight began
        self._tls = None
        self._unresolved = {}  # host -> (HttpFailure, when): a name that did not resolve, for UNRESOLVED_SECONDS

    def request(self, method, url, json_body=None, data=None, headers=None, stream=False, timeout=(10.0, 300.0)):
        """An HttpResponse, or HttpFailure when no answer came. Redirects are not followed (a provider's
        API does not move; the caller names where it points). A stream is the caller's to close()."""
        import base64
        import http.client
        from urllib.parse import unquote, urlencode, urlsplit
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise HttpFailure("invalid URL: %s" % exc, "url")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpFailure("invalid URL (it needs http:// or https:// and a host)", "url")
        host = parts.hostname
        port = port or (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        sent = {"User-Agent": self.user_agent, "Accept": "*/*", "Accept-Encoding": "identity"}
        sent.update(headers or {})
        if parts.username is not None:  # credentials in the URL are Basic auth, as curl and requests send them
            pair = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
            sent["Authorization"] = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
        body = None
        if json_body is not None:
            body = json.dumps(json_body).encode("utf-8")
            sent["Content-Type"] = "application/json"
        elif data is not None:
            body = urlencode(data).encode("ascii")
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        proxy = self.proxy_for(parts.scheme, host, port)
        if proxy is not None and parts.scheme == "http":  # a plain proxy is asked for the absolute URL
            path = "http://%s%s" % (_host_port(host, port, 80), path)
            if proxy[2]:
                sent["Proxy-Authorization"] = proxy[2]
        key = (parts.scheme, host, port, proxy)
        if proxy is None:
            self._known_unresolved(host)
        self._cut = False
        first = None  # what broke a kept-alive connection, tried once more on a fresh one
        for attempt in (1, 2):
            try:
                conn, reused = self._connection(key, timeout[0])
            except HttpFailure as failure:  # refused just after the server took our request: it went away in it
                raise _http_failure(first) if first is not None and failure.kind == "refused" else failure
            # INFO: the socket itself, not the connection's: a reply that ends by closing the connection takes the
            # socket from it (http.client leaves conn.sock None), and a cut found nothing to shut down: a stopping
            # watcher waited for the model's whole answer (found by attack round 13)
            self._active, self._active_sock = conn, conn.sock
            try:
                conn.sock.settimeout(timeout[1])
                conn.request(method, path, body=body, headers=sent)
                raw = conn.getresponse()
            except Exception as exc:
                conn.close()
                # a kept-alive connection the server closed meanwhile: once more on a fresh one
                if reused and attempt == 1 and not self._cut and \
                        isinstance(exc, (ConnectionError, http.client.BadStatusLine)):
                    first = exc
                    continue
                raise _http_failure(exc)
            break
        response = HttpResponse(raw, conn, lambda c: self._idle.__setitem__(key, c), self._active_sock)
        if not stream:
            try:
                response.content
            finally:
                response.close()
        return response

    def cut(self):
        """The socket of the request in flight, for another thread to shut down (Provider.interrupt): that request
        is not sent again on a new connection, as one the server closed would be."""
        self._cut = True
        return self._active_sock

    def _connection(self, key, connect_timeout):
        """(connection, reused): the idle one for `key` when the server has not closed it, else a new one."""
        import select
        conn = self._idle.pop(key, None)
        if conn is not None and conn.sock is not None:
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if not readable:  # nothing to read on an idle connection: still open (EOF would be readable)
                return conn, True
        if conn is not None:
            conn.close()
        return self._connect(key, connect_timeout), False

    def _connect(self, key, timeout):
        import http.client
        scheme, host, port, proxy = key
        try:
            if proxy is None:
                conn = (http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context())
                        if scheme == "https" else http.client.HTTPConnection(host, port, timeout=timeout))
            elif scheme == "https":  # CONNECT through the proxy, then TLS with the server itself
                conn = http.client.HTTPSConnection(proxy[0], proxy[1], timeout=timeout, context=self._context())
                conn.set_tunnel(host, port, headers={"Proxy-Authorization": proxy[2]} if proxy[2] else None)
            else:
                conn = http.client.HTTPConnection(proxy[0], proxy[1], timeout=timeout)
            conn.connect()
        except Exception as exc:
            failure = _http_failure(exc, connecting=True)
            if failure.kind == "dns" and proxy is None:
                self._unresolved[host] = (failure, time.monotonic())
            if proxy is not None:
                failure = HttpFailure("through the proxy %s: %s" % (_host_port(proxy[0], proxy[1], None), failure),
                                      "proxy" if failure.kind != "timeout" else "timeout")
            raise failure
        return conn

    def _known_unresolved(self, host):
        """Raise the HttpFailure of a recent look-up of `host` that found nothing."""
        known = self._unresolved.get(host)
        if known is not None:
            if time.monotonic() - known[1] < UNRESOLVED_SECONDS:
                raise known[0]
            del self._unresolved[host]

    def addresses(self, host):
        """The IP addresses `host` resolves to (HttpFailure "dns" when it does not, remembered as a request's)."""
        import ipaddress
        import socket
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        self._known_unresolved(host)
        try:
            infos = socket.getaddrinfo(host, None)
        except socket.gaierror as exc:
            failure = _http_failure(exc)
            self._unresolved[host] = (failure, time.monotonic())
            raise failure
        except OSError as exc:
            raise _http_failure(exc)
        out = []
        for info in infos:
            try:
                out.append(ipaddress.ip_address(info[4][0].split("%")[0]))
            except ValueError:
                pass
        return out

    def _context(self):
        """The TLS context, made once: the system's CA certificates (or REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE),
        else certifi's where the system has none and certifi is installed."""
        if self._tls is None:
            import ssl
            if self.ca_bundle:
                self._tls = ssl.create_default_context(cafile=os.path.expanduser(self.ca_bundle))
            else:
                self._tls = ssl.create_default_context()
                paths = ssl.get_default_verify_paths()
                if not any(p and os.path.exists(p) for p in (paths.cafile, paths.capath)) \
                        and not self._tls.cert_store_stats().get("x509_ca"):
                    try:
                        import certifi
                        self._tls.load_verify_locations(certifi.where())
                    except ImportError:
                        pass
        return self._tls

    def proxy_for(self, scheme, host, port):
        """(host, port, Proxy-Authorization or None) of the proxy for this server, or None. Loopback is never
        proxied (a local model behind a corporate proxy setting), and no_proxy is matched as curl does."""
        from urllib.parse import unquote, urlsplit
        url = self.proxies.get(scheme) or self.proxies.get("all")
        if not url or _bypass_proxy(host, port, self.no_proxy):
            return None
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        auth = None
        if parts.username is not None:
            import base64
            pair = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
            auth = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
        return parts.hostname, parts.port or 8080, auth

    def close(self):
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()


def _host_port(host, port, default):
    shown = "[%s]" % host if ":" in host else host
    return shown if port == default else "%s:%s" % (shown, port)


def _bypass_proxy(host, port, no_proxy):
    """True for loopback and for hosts no_proxy names (`*`, a domain and its subdomains, an address, a CIDR
    block, optionally with :port)."""
    import ipaddress
    host = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if host == "localhost" or host.endswith(".localhost") or (address is not None and address.is_loopback):
        return True
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and entry_port != str(port):
            continue
        name = name.strip("[]").lstrip("*").lstrip(".").rstrip(".")
        if address is not None and "/" in name:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
        elif host == name or host.endswith("." + name):
            return True
    return False


# ---- Providers: one HTTP helper, errors, and what servers say about themselves ----


class Reply:
    """One whole model reply: text, tool calls, usage and why it stopped."""

    __slots__ = ("content", "tool_calls", "usage", "finish_reason", "thinking")

    def __init__(self, content="", tool_calls=None, usage=None, finish_reason="stop", thinking=""):
        self.content = content
        self.tool_calls = tool_calls or []
        self.usage = usage or {"prompt_tokens": 0, "completion_tokens": 0}
        self.finish_reason = finish_reason
        self.thinking = thinking


RETRY_STATUSES = (408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 524, 529)


class DeadlineExceeded(XzError):
    """The task's wall-clock budget ran out while waiting for the model. An XzError: one before the loop (a
    probe of the server) that nobody catches is one line and exit 1, as the loop's own timeout is."""

    def __init__(self, message="the run's time limit (agent.timeout_seconds) was reached while waiting for the "
                               "model server"):
        super().__init__(message)


def _watchdog(resp, deadline):
    """A timer that shuts a streaming response's socket down at the deadline (--timeout holds while a server
    streams keep-alives), or None where there is no deadline."""
    if deadline is None or resp.sock is None:
        return None
    sock = resp.sock
    return xzatoma_tools.shutdown_at(deadline, lambda: sock)


def _retry_after(headers):
    value = (headers or {}).get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def error_text(body):
    """The human part of a provider's JSON error body."""
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        return one_line(body or "", 200)
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data.get("detail")))
        if isinstance(err, dict):
            err = err.get("message") or err.get("code") or json.dumps(err)
        if err:
            return one_line(err, 200)
    return one_line(body, 200)


def rejection(body):
    """What a server rejected, in one line: a pydantic/FastAPI validation error is reduced to the field and
    the complaint (messages[2].content: Input should be a valid string), other errors to their message."""
    import re
    text = error_text(body)
    found = re.findall(r"'loc': \(([^)]*)\), 'msg': (['\"])(.*?)\2", body or "")
    if not found:
        return text
    ranked = sorted(found, key=lambda f: ("literal_error" in f[0] or "'role'" in f[0] or "Field required" in f[2],))
    loc, _, msg = ranked[0]
    parts = [p.strip().strip("'\"") for p in loc.split(",") if p.strip()]
    shown = ""
    for part in parts:
        if part == "body" or part.startswith("ChatCompletion") or part.endswith("Message"):
            continue
        shown += "[%s]" % part if part.isdigit() else ("." if shown else "") + part
    return one_line("%s: %s" % (shown or "the request", msg), 200)


def iter_sse(response):
    """Yield (event, data) pairs from a text/event-stream response; an event's data is MAX_LINE_BYTES at most (a
    server sending `data:` lines and never the blank line that ends an event took a run past 3 GB in 7 s)."""
    event, data, size = None, [], 0
    for raw in response.iter_lines():
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data, size = None, [], 0
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
            size += len(value) + 1
            if size > MAX_LINE_BYTES:
                raise HttpFailure("an event of the reply's stream is longer than %d MB" % (MAX_LINE_BYTES >> 20),
                                  "too_large")
    if data:
        yield event, "\n".join(data)


class RepetitionGuard:
    """Notices a reply stuck repeating itself (small models at low temperature fall into loops that run until the
    window is full: minutes of the same lines). True once the last SPAN characters equal the SPAN characters a
    period before them, for a period up to MAX_PERIOD; checked every STEP characters, so it costs little."""

    SPAN, MAX_PERIOD, STEP = 2000, 1000, 1024
    OPENING, WHOLE = '{"name"', 65536  #: how a call written as text begins; how much of a reply is kept to read

    def __init__(self, calls=True):
        """calls: tools were offered, so a call written as text may run (second_call); without them a reply
        that writes calls is an answer about calls, read whole."""
        self.parts, self.size, self.checked = [], 0, 0
        self.whole, self.carry, self.openings = ([] if calls else None), "", 0
        self.cut_at = None  #: where the reply ends when a second call was begun (second_call)

    def feed(self, text):
        """Why to stop reading the reply now, as its finish reason: "repetition", "stop" (a second call begun:
        second_call; trim() keeps the reply before it), or None."""
        if self.second_call(text):
            return "stop"
        self.parts.append(text)
        self.size += len(text)
        if self.size - self.checked < self.STEP or self.size < 2 * self.SPAN:
            return None
        self.checked = self.size
        tail = "".join(self.parts)[-(self.SPAN + self.MAX_PERIOD):]
        self.parts = [tail]
        last = tail[-self.SPAN:]
        repeats = any(tail[-self.SPAN - p:-p] == last for p in range(1, min(self.MAX_PERIOD, len(tail) - self.SPAN) + 1))
        return "repetition" if repeats else None

    def second_call(self, text):
        """True when a reply that holds a whole tool call written as text begins another one. Only the first runs
        (Agent.ask_model: the rest was written before any result), so reading on is waiting for nothing. INFO: a
        1.5B model wrote call after imagined call (echo 'call Bob' >> todo.md, then Alice, then Charlie …) for
        eight minutes; no stretch repeated, so the repetition check never fired."""
        if self.whole is None:
            return False
        self.whole.append(text)
        window = self.carry + text  # the carry is shorter than an opening: none is counted twice
        self.carry = window[-(len(self.OPENING) - 1):]
        found = window.count(self.OPENING)
        if not found:
            return False
        self.openings += found
        reply = "".join(self.whole)
        if len(reply) > self.WHOLE:
            self.whole = None  # a long reply: only repetition is watched
            return False
        if self.openings < 2:
            return False
        at = reply.rfind(self.OPENING)
        written = find_text_tool_calls(reply[:at])
        if written is None or not written.calls or written.malformed:
            return False
        self.cut_at = at  # the reply ends before the second call: its start alone would read as a broken call
        return True

    def trim(self, content):
        """The reply's parts as kept: all of them, or what came before a second call (second_call)."""
        return content if self.cut_at is None else ["".join(content)[:self.cut_at]]


class Provider:
    """complete(messages, tools) -> Reply; models(); context_window(model)."""

    name = "provider"

    def __init__(self, cfg, console, model=None):
        self.cfg = cfg
        self.console = console
        self.model = model or cfg.get("provider.%s.model" % self.name)
        self.max_retries = cfg.get("provider.max_retries")
        self.backoff = cfg.get("provider.retry_backoff_seconds")
        self.timeout = cfg.get("provider.request_timeout_seconds")
        #: provider.<type>.{temperature, top_p, max_tokens, seed, context_window} (None: not set)
        self.settings = {k: cfg.get("provider.%s.%s" % (self.name, k)) for k in SAMPLING}
        #: sampling a run prefers where the person set nothing (prefer()): the compact profile's temperature
        self.preferred = {}
        self.heat = 0.0  #: added to the preferred temperature while the loop is stuck (set per request)
        self.on_retry = None  #: called before a request is tried again (the Agent's display: what streamed is void)
        #: a threading.Event (the asking agent's cancel, set per request): once set, the request in flight is cut
        #: off within 0.25 s and none is retried
        self.interrupt = None
        #: the run's deadline (time.monotonic()), which bounds every request, the probes before the loop included:
        #: a server that never answered held `run --timeout 5` for 60-90 s in its probes (round 18c)
        self.deadline = None
        self._session = None
        self._windows = {}

    # -- HTTP with retries --
    @property
    def session(self):
        """The HttpSession: one kept-alive connection to the server for the whole run (per thread)."""
        if self._session is None:
            self._session = HttpSession(self.cfg.network)
        return self._session

    def headers(self):
        return {}

    def call(self, method, url, handle, body=None, stream=False, deadline=None, what="request", retries=None,
             timeout=None):
        """Send a request and hand the response to `handle`, retrying transient failures.

        Not retried, because waiting cannot help and a person wants one line now, not the same line four
        times: a refused connection to a loopback or private address (nothing is listening there) and a host
        name that does not resolve.
        """
        interrupt = self.interrupt
        cutter = xzatoma_tools.shutdown_when(interrupt, lambda: self.session.cut())
        try:
            return self._call(method, url, handle, body, stream, deadline, what, retries, timeout, interrupt)
        finally:
            if cutter is not None:
                cutter.cancel()

    def _call(self, method, url, handle, body, stream, deadline, what, retries, timeout, interrupt):
        if self.deadline is not None:
            deadline = self.deadline if deadline is None else min(deadline, self.deadline)
        attempts = (self.max_retries if retries is None else retries) + 1
        last, attempt, refreshed = None, -1, False
        reached = False  #: an attempt got past connecting: a server refused after it went away in this request
        while True:
            attempt += 1
            if interrupt is not None and interrupt.is_set():
                raise ProviderError("the %s was cancelled" % what)
            read_timeout = timeout or self.timeout
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded()
                read_timeout = max(0.1, min(read_timeout, remaining))
            watchdog = None
            try:
                sent = time.monotonic()
                resp = self.session.request(method, url, json_body=body, headers=self.headers(), stream=stream,
                                            timeout=(min(10.0, read_timeout), read_timeout))
                watchdog = _watchdog(resp, deadline)
                self.console.debug("%s %s: HTTP %d after %.2fs (attempt %d of %d)" % (
                    method, url.split("?")[0], resp.status_code, time.monotonic() - sent, attempt + 1, attempts))
                try:
                    if resp.status_code >= 400:
                        text = resp.head()
                        raise self.http_error(resp.status_code, text, _retry_after(resp.headers))
                    if 300 <= resp.status_code < 400:
                        raise ProviderError("%s answered with a redirect (HTTP %d) to %s; use that address in the "
                                            "configuration" % (self.label(), resp.status_code,
                                                               resp.headers.get("Location") or "nowhere"),
                                            status=resp.status_code, exit_code=EXIT_USAGE)
                    try:
                        return handle(resp)
                    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
                        raise self.bad_body(resp, exc, what)
                finally:
                    if watchdog is not None:
                        watchdog.cancel()
                    resp.close()  # read to its end: the connection serves the next request
            except ProviderError as exc:
                reached = True
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded()  # the watchdog cut the stream: whatever it broke is the deadline's
                if exc.status == 401 and not refreshed and self.refresh_credentials():
                    refreshed = True  # a fresh token, then the request once more
                    attempt -= 1
                    continue
                if not exc.retryable:
                    raise
                last = exc
            except HttpFailure as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded()
                if exc.kind == "url":
                    raise ProviderError("invalid URL for %s: %s (%s)" % (self.label(), url.split("?")[0], exc),
                                        exit_code=EXIT_USAGE)
                if exc.kind == "not_http":  # a wrong port: asked again, the same service answers
                    raise ProviderError("%s; is the address (its port) right?"
                                        % str(exc).replace("the server", self.label(), 1))
                if exc.kind == "too_large":  # asked again, it answers as much again
                    raise ProviderError("%s sent more than a model's reply can be: %s" % (self.label(), exc))
                if exc.kind == "timeout" and "read" in str(exc):
                    last = ProviderError("%s timed out after %ss waiting for %s" % (what, read_timeout, self.label()),
                                         retryable=True)
                else:
                    last = self.connection_error(exc)
                if exc.kind == "dns":  # resolving again in a second finds the same nothing
                    last.retryable = False
                    raise last
                if exc.kind == "tls":
                    last.retryable = False
                    raise last
                if exc.kind == "refused" and _is_local_url(url, self.session):
                    # unreachable: nothing listened from the start (a watcher waits for it). Refused after this
                    # request got through, the server went away in it: a poison event that crashes a local server
                    # was run again and again, never answered, the partition stopped (attack round 17e)
                    last.retryable, last.unreachable = False, not reached
                    raise last
                reached = reached or not (exc.kind in ("dns", "tls", "network") or "connection timed" in str(exc))
            if attempt + 1 >= attempts:
                break
            delay = self.backoff * (2 ** attempt) * (0.5 + _jitter())
            delay = min(delay, 30.0)
            if last.retry_after is not None:
                delay = min(max(delay, last.retry_after), 120.0)
            if deadline is not None and time.monotonic() + delay >= deadline:
                # the server's own words, not "timed out … raise --timeout": a 429 asking for 600 s was said as a
                # timeout after 3 ms (attack round 15b)
                asks = " (the server asks %.0fs)" % last.retry_after if last.retry_after is not None else ""
                raise ProviderError("%s (not tried again: waiting %.0fs%s would pass the run's deadline)" % (
                    last, delay, asks), status=last.status)
            if interrupt is not None and interrupt.is_set():  # cut off by the cancel: nothing to retry, nor say
                raise ProviderError("the %s was cancelled" % what)
            self.console.info("  retrying in %.1fs (%d/%d): %s" % (delay, attempt + 1, self.max_retries, last),
                              "dim")
            if self.on_retry is not None:  # what the failed attempt streamed is not the answer
                self.on_retry()
            if interrupt is not None:
                interrupt.wait(delay)
            else:
                time.sleep(delay)
        raise ProviderError("%s (gave up after %d attempt%s)" % (last, attempts, "s" if attempts > 1 else ""),
                            status=last.status)

    def get_json(self, url, what="request", retries=None):
        return self.call("GET", url, lambda r: r.json(), what=what, retries=retries,
                         timeout=self.probe_timeout() if retries == 0 else None)

    def probe_timeout(self):
        """Seconds for a one-attempt probe (the model's window, its details): a hung server fails it fast, and
        never later than provider.request_timeout_seconds says."""
        return min(PROBE_TIMEOUT, self.timeout)

    def clone(self):
        """The same provider for another thread: own HTTP session, shared credentials and caches."""
        import copy
        other = copy.copy(self)
        other._session = None
        return other

    def refresh_credentials(self):
        """Get fresh credentials after a 401; True when the request should be tried once more."""
        return False

    def label(self):
        return self.name

    def connection_error(self, exc):
        return ProviderError("cannot connect to %s: %s" % (self.label(), _connection_reason(exc)), retryable=True)

    def expect_stream(self, resp):
        """A web page (a proxy's, a login portal's) where a stream of events should be."""
        if "html" in resp.headers.get("Content-Type", ""):
            raise ValueError("an HTML page")

    def bad_body(self, resp, exc, what):
        """A body that is not the JSON this wire format has: one line naming the server and what it sent."""
        self.console.debug("%s: %s: %s" % (what, type(exc).__name__, exc))
        sample = getattr(exc, "doc", None)
        if not isinstance(sample, str):
            try:
                sample = resp.head(4096)  # 80 characters are shown
            except Exception:  # a consumed stream has no text left
                sample = ""
        kind = "is not JSON" if isinstance(exc, ValueError) else "is JSON of a shape xzatoma does not understand"
        shown = json.dumps(one_line(sample, 80), ensure_ascii=True) if sample.strip() else "an empty body"
        return ProviderError("%s sent a reply that %s (%s; HTTP %d, %s): %s; is the address right?" % (
            self.label(), kind, what, resp.status_code, resp.headers.get("Content-Type") or "no content type", shown))

    def http_error(self, status, body, retry_after=None):
        message = error_text(body)
        if status in (401, 403):
            return ProviderError("%s rejected the credentials (HTTP %d: %s); %s"
                                 % (self.label(), status, message, self.login_hint()),
                                 status=status, exit_code=EXIT_USAGE)
        if status == 404 and "model" in message.lower():
            return ProviderError(self.model_not_found(message), status=status, exit_code=EXIT_USAGE)
        window = window_in(body)
        if window or rejected_request(body):
            return ProviderError("%s rejected the request (HTTP %d): %s" % (self.label(), status, rejection(body)),
                                 status=status, window=window)
        return ProviderError("%s returned HTTP %d: %s" % (self.label(), status, message or "(no details)"),
                             status=status, retryable=status in RETRY_STATUSES, retry_after=retry_after)

    def login_hint(self):
        return "check your credentials"

    def model_not_found(self, message):
        try:
            names = [m["id"] for m in self.models()]
        except XzError:
            names = []
        available = ("; available: " + ", ".join(names[:20])) if names else ""
        return "model '%s' not found on %s%s" % (self.model, self.label(), available)

    # -- interface --
    def complete(self, messages, tools, on_delta=None, deadline=None):  # pragma: no cover - interface
        raise NotImplementedError

    def models(self, retries=None):  # pragma: no cover - interface
        raise NotImplementedError

    def context_window(self, model=None):
        """The model's window: provider.<type>.context_window, else probed once with one attempt (a probe must
        not multiply the retries of the request it serves); an unreachable server is reported at once, since
        the request would fail too."""
        model = model or self.model
        if self.settings.get("context_window"):
            return self.settings["context_window"]
        if model not in self._windows:
            try:
                self._windows[model] = self._context_window(model)
            except ProviderError as exc:
                if exc.unreachable:
                    raise
                self.console.debug("context window of %s unknown: %s" % (model, exc))
                self._windows[model] = None
            except (XzError, ValueError, KeyError, TypeError) as exc:
                self.console.debug("context window of %s unknown: %s" % (model, exc))
                self._windows[model] = None
        return self._windows[model]

    def _context_window(self, model):
        for m in self.models(retries=0):
            if m["id"] == model:
                return m.get("context_window")
        return None

    def learn_window(self, window):
        """The server said how large its window is (refusing a request over it): believe it from now on."""
        self._windows[self.model] = window

    def is_local(self):
        """A server on this machine or the local network (a small model, often; probing it costs little)."""
        return False

    def parameter_billions(self):
        """The model's size in billions of parameters, when the server or the model's name says; else None."""
        return model_size(self.model)

    def sampling(self):
        """The sampling settings sent with each request: {temperature, top_p, max_tokens, seed}, the configured
        ones, else the run's preferred ones; what neither sets is left to the server."""
        chosen = dict(self.preferred)
        if self.heat and "temperature" in chosen:
            chosen["temperature"] = round(min(1.0, chosen["temperature"] + self.heat), 2)
        chosen.update((k, v) for k, v in self.settings.items() if k != "context_window" and v is not None)
        return chosen

    def prefer(self, **sampling):
        """Sampling to send where the configuration sets none (a setting of the person's always wins)."""
        self.preferred.update(sampling)


def model_size(name):
    """Billions of parameters from a model name (qwen2.5-coder-1.5b, Llama-3.2-3B-Instruct, phi3:3.8b), or None."""
    import re
    sizes = [float(m.group(1)) for m in re.finditer(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![\w])", name or "")]
    return sizes[-1] if sizes else None


def window_in(body):
    """The context window a server names when it refuses a request over it: OpenAI, vLLM and llama-cpp-python
    say "maximum context length is N tokens", llama.cpp's server sends n_ctx; None when the body says nothing."""
    import re
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("n_ctx"), int):
            return err["n_ctx"]
    except (ValueError, TypeError, RecursionError):
        pass
    m = re.search(r"(?:maximum context length is|context (?:window|length|size) (?:of|is)) (\d{3,8})", body or "")
    return int(m.group(1)) if m else None


#: what servers say when the request itself is at fault: retrying the same request cannot help
_REJECTED = ("validation error", "invalid_request", "input should be", "field required", "extra inputs are not",
             "literal_error", "jinja", "template", "roles must alternate", "context_length_exceeded",
             "maximum context length", "exceed context", "exceeds the available context", "is not supported",
             "unsupported", "unrecognized", "unknown field", "cannot be null", "must be a string")


def rejected_request(body):
    """True when an error body says the request itself was invalid (llama-cpp-python answers HTTP 500 with a
    pydantic validation error for a null content): such a request is not retried as transient."""
    text = (body or "")[:20000].lower()
    return any(needle in text for needle in _REJECTED)


PROBE_TIMEOUT = 30  # seconds for one-attempt probes (context window): a hung server fails the probe fast


def _jitter():
    import random
    return random.random()


def _is_local_url(url, session):
    """True when the URL's host is loopback, private or link-local (where 'refused' means 'not running').
    Resolved through `session`, the HttpSession that will ask it: a name that does not resolve is looked up once."""
    from urllib.parse import urlsplit
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addresses = session.addresses(host)
    except HttpFailure:
        return False
    return bool(addresses) and all(a.is_loopback or a.is_private or a.is_link_local for a in addresses)


def _connection_reason(exc):
    """What went wrong reaching a server, in a few words (an HttpFailure says it itself)."""
    if isinstance(exc, HttpFailure):
        return str(exc)
    return one_line(exc, 160)


# ---- Providers: the wire formats (Ollama, OpenAI chat completions and Responses, Copilot) ----
# Each provider turns the conversation into its server's messages and its stream back into one Reply. The wire
# is kept exact (llama-cpp-python rejects a null content; Ollama wants arguments as an object, OpenAI as text).


def tool_call_id(position, index, name, arguments):
    """A stable id for providers that send none (Ollama): same history, same id."""
    import hashlib
    digest = hashlib.sha1(("%d:%d:%s:%s" % (position, index, name, arguments)).encode()).hexdigest()
    return "call_" + digest[:16]


def _args_object(arguments):
    """Tool-call arguments as an object for wire formats that want one."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class OllamaProvider(Provider):
    name = "ollama"

    def __init__(self, cfg, console, model=None):
        super().__init__(cfg, console, model)
        self.host = cfg.get("provider.ollama.host")
        self.api_key = stored_key(cfg, console, "ollama")[0]
        self._shown = {}  #: model -> its /api/show (details, model_info), asked once

    def label(self):
        return "Ollama at %s" % self.host

    def headers(self):
        return {"Authorization": "Bearer " + self.api_key} if self.api_key else {}

    def connection_error(self, exc):
        if getattr(exc, "kind", None) == "dns":  # nothing to start: the name is wrong, or the network is
            return ProviderError("cannot connect to Ollama at %s (%s); check OLLAMA_HOST / provider.ollama.host "
                                 "and this machine's network" % (self.host, _connection_reason(exc)))
        if getattr(exc, "kind", None) == "broken":  # it took the connection: something listens there
            return _dropped(self.label(), exc, "OLLAMA_HOST / provider.ollama.host")
        return ProviderError("cannot connect to Ollama at %s (%s); start it with 'ollama serve' or point "
                             "OLLAMA_HOST / provider.ollama.host at it" % (self.host, _connection_reason(exc)),
                             retryable=True)

    def login_hint(self):
        return "set OLLAMA_API_KEY if this server requires a key"

    def model_not_found(self, message):
        try:
            names = [m["id"] for m in self.models()]
        except XzError:
            names = []
        available = ("; available: " + ", ".join(names[:20])) if names else "; no models are installed"
        return "model '%s' not found on %s%s (pull it with 'ollama pull %s')" % (
            self.model, self.label(), available, self.model)

    def models(self, retries=None):
        data = self.get_json(self.host + "/api/tags", "listing models", retries=retries)
        return [{"id": m.get("name") or m.get("model"), "size": m.get("size")} for m in data.get("models", [])]

    def _context_window(self, model):
        data = self._show(model)
        for key, value in (data.get("model_info") or {}).items():
            if key.endswith(".context_length"):
                return int(value)
        return None

    def is_local(self):
        return _is_local_url(self.host, self.session)

    def parameter_billions(self):
        """/api/show's details.parameter_size ("1.5B", "494.03M"), else the model's name."""
        try:
            data = self._show(self.model)
            size = str((data.get("details") or {}).get("parameter_size") or "").upper()
            if size[:-1].replace(".", "", 1).isdigit() and size[-1:] in ("B", "M"):
                return float(size[:-1]) / (1000.0 if size.endswith("M") else 1.0)
        except (XzError, ValueError, KeyError, TypeError, AttributeError):
            pass
        return model_size(self.model)

    def _show(self, model):
        if model not in self._shown:
            self._shown[model] = self.call("POST", self.host + "/api/show", lambda r: r.json(), body={"model": model},
                                           what="model details", retries=0, timeout=self.probe_timeout())
        return self._shown[model]

    def num_ctx(self, estimated_tokens):
        """Ollama truncates silently beyond num_ctx: size it to the conversation, in powers of two (or the
        configured provider.ollama.context_window, exactly)."""
        if self.settings.get("context_window"):
            return self.settings["context_window"]
        needed = estimated_tokens + 4096
        size = 8192
        while size < needed:
            size *= 2
        window = self.context_window()
        return min(size, window) if window else size

    def to_wire(self, messages):
        out = []
        for m in messages:
            role = m["role"]
            if role == "assistant" and m.get("tool_calls"):
                out.append({"role": "assistant", "content": m.get("content") or "",
                            "tool_calls": [{"function": {"name": c["name"], "arguments": _args_object(c["arguments"])}}
                                           for c in m["tool_calls"]]})
            elif role == "tool":
                out.append({"role": "tool", "content": m["content"], "tool_name": m.get("name", "")})
            else:
                out.append({"role": role, "content": m.get("content") or ""})
        return out

    def complete(self, messages, tools, on_delta=None, deadline=None, estimated_tokens=0):
        options = {"num_ctx": self.num_ctx(estimated_tokens)}
        for key, value in self.sampling().items():  # Ollama's names: num_predict caps the reply
            options["num_predict" if key == "max_tokens" else key] = value
        body = {"model": self.model, "messages": self.to_wire(messages), "stream": True, "options": options}
        if tools:
            body["tools"] = [{"type": "function", "function": t} for t in tools]
        position = len(messages)

        def handle(resp):
            self.expect_stream(resp)
            content, thinking, calls, final, guard = [], [], [], {}, RepetitionGuard(calls=bool(tools))
            for raw in resp.iter_lines():
                if not raw:
                    continue
                try:
                    chunk = json.loads(raw)
                except ValueError:
                    raise ProviderError("Ollama sent a malformed stream line: %s" % one_line(raw, 80), retryable=True)
                if chunk.get("error"):
                    raise ProviderError("Ollama error: %s" % one_line(chunk["error"], 200))
                msg = chunk.get("message") or {}
                if msg.get("content"):
                    content.append(msg["content"])
                    if on_delta:
                        on_delta(msg["content"])
                    stop = guard.feed(msg["content"])
                    if stop:  # closing the stream stops the server generating
                        final, content = {"done_reason": stop}, guard.trim(content)
                        break
                if msg.get("thinking"):
                    thinking.append(msg["thinking"])
                for call in msg.get("tool_calls") or ():
                    fn = call.get("function") or {}
                    args = fn.get("arguments")
                    args = args if isinstance(args, str) else json.dumps(args if args is not None else {})
                    name = fn.get("name") or ""
                    calls.append({"id": call.get("id") or tool_call_id(position, len(calls), name, args),
                                  "name": name, "arguments": args})
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded()
                if chunk.get("done"):
                    final = chunk
                    break
            if not final:
                raise ProviderError("Ollama closed the stream before the reply was complete", retryable=True)
            reason = final.get("done_reason") or "stop"
            if calls and reason == "stop":
                reason = "tool_calls"
            return Reply("".join(content), calls,
                         {"prompt_tokens": final.get("prompt_eval_count") or 0,
                          "completion_tokens": final.get("eval_count") or 0},
                         reason, "".join(thinking))

        return self.call("POST", self.host + "/api/chat", handle, body=body, stream=True, deadline=deadline,
                         what="chat request")


class OpenAIProvider(Provider):
    """Any OpenAI-compatible server: /chat/completions (SSE) or /responses (SSE events)."""

    name = "openai"

    def __init__(self, cfg, console, model=None):
        super().__init__(cfg, console, model)
        self.base_url = cfg.get("provider.openai.base_url").rstrip("/")
        self.api = cfg.get("provider.openai.api")
        self.api_key = stored_key(cfg, console, "openai")[0]
        self._model_list = None

    def label(self):
        return "the OpenAI-compatible server at %s" % self.base_url

    def headers(self):
        return {"Authorization": "Bearer " + self.api_key} if self.api_key else {}

    def login_hint(self):
        return "set %s to a valid API key" % self.cfg.get("provider.openai.api_key_env")

    #: what names this provider's address, for its errors
    ADDRESS = "provider.openai.base_url / OPENAI_BASE_URL"

    def connection_error(self, exc):
        if getattr(exc, "kind", None) == "broken":  # it took the connection: something listens there
            return _dropped(self.label(), exc, self.ADDRESS)
        return ProviderError("cannot connect to %s (%s); check %s" % (self.base_url, _connection_reason(exc),
                                                                      self.ADDRESS), retryable=True)

    def raw_models(self, retries=None):
        if self._model_list is None:
            data = self.get_json(self.base_url + "/models", "listing models", retries=retries)
            self._model_list = data.get("data") if isinstance(data, dict) else data
            self._model_list = self._model_list or []
        return self._model_list

    def models(self, retries=None):
        """[{id, context_window, tools, endpoints}] from /models, in the dialects servers use."""
        out = []
        for m in self.raw_models(retries):
            caps = m.get("capabilities") or {}
            limits = caps.get("limits") or {}
            supports = caps.get("supports") or {}
            window = (limits.get("max_context_window_tokens") or limits.get("max_prompt_tokens")
                      or m.get("context_length") or m.get("context_window") or m.get("max_model_len")
                      or (m.get("meta") or {}).get("n_ctx_train"))
            out.append({"id": m.get("id"), "context_window": window,
                        "tools": supports.get("tool_calls") if "tool_calls" in supports else None,
                        "endpoints": m.get("supported_endpoints")})
        return out

    def uses_responses(self):
        return self.api == "responses"

    def is_local(self):
        return _is_local_url(self.base_url, self.session)

    def _context_window(self, model):
        """A local server first says what it runs with (llama.cpp's /props n_ctx, LM Studio's loaded context):
        its /models may give only what the model was trained for; then /models (vLLM's max_model_len …)."""
        if self.is_local():
            root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
            for path, find in (("/props", _props_window), ("/api/v0/models", _lmstudio_window(model))):
                try:
                    window = find(self.get_json(root + path, "server properties", retries=0))
                except ProviderError as exc:
                    if exc.unreachable:
                        raise
                    window = None
                if window:
                    return int(window)
        return super()._context_window(model)

    def complete(self, messages, tools, on_delta=None, deadline=None, estimated_tokens=0):
        if self.uses_responses():
            return self._responses(messages, tools, on_delta, deadline)
        return self._chat(messages, tools, on_delta, deadline)

    # -- /chat/completions --
    @staticmethod
    def chat_wire(messages):
        out = []
        for m in messages:
            role = m["role"]
            if role == "assistant" and m.get("tool_calls"):
                # "" and never null: llama-cpp-python's server rejects null content (HTTP 500, a pydantic error)
                out.append({"role": "assistant", "content": m.get("content") or "",
                            "tool_calls": [{"id": c["id"], "type": "function",
                                            "function": {"name": c["name"], "arguments": c["arguments"] or "{}"}}
                                           for c in m["tool_calls"]]})
            elif role == "tool":
                out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
            else:
                out.append({"role": role, "content": m.get("content") or ""})
        return out

    def _chat(self, messages, tools, on_delta, deadline):
        body = {"model": self.model, "messages": self.chat_wire(messages), "stream": True,
                "stream_options": {"include_usage": True}}
        body.update(self.sampling())
        if tools:
            body["tools"] = [{"type": "function", "function": t} for t in tools]

        def handle(resp):
            if "json" in resp.headers.get("Content-Type", ""):
                return self._chat_reply_from_json(resp.json())
            self.expect_stream(resp)
            content, thinking, calls, usage, finish, cut, done = [], [], {}, {}, None, False, False
            events, guard = 0, RepetitionGuard(calls=bool(tools))
            for _, data in iter_sse(resp):
                events += 1
                if data.strip() == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise ProviderError("malformed stream event from %s: %s" % (self.label(), one_line(data, 80)),
                                        retryable=True)
                if chunk.get("error"):
                    raise ProviderError("%s reported an error: %s" % (self.label(), error_text(data)),
                                        retryable=True)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        content.append(delta["content"])
                        if on_delta:
                            on_delta(delta["content"])
                        stop = guard.feed(delta["content"])
                        if stop:
                            finish, cut, content = stop, True, guard.trim(content)
                    for key in ("reasoning_content", "reasoning"):
                        if isinstance(delta.get(key), str):
                            thinking.append(delta[key])
                    for tc in delta.get("tool_calls") or ():
                        slot = calls.setdefault(tc.get("index", len(calls)), {"id": None, "name": "", "arguments": ""})
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        name = fn.get("name")
                        if name and name != slot["name"]:
                            slot["name"] += name
                        if fn.get("arguments"):
                            slot["arguments"] += fn["arguments"]
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded()
                if cut:
                    break  # closing the stream stops the server generating (llama.cpp, vLLM, Ollama notice)
            if not events:
                raise ProviderError("%s ended the chat stream without sending anything" % self.label(),
                                    retryable=True)
            # INFO: neither `[DONE]` nor a finish_reason: the reply was cut off, by the run's deadline (its watchdog
            # closes the stream) or by the server or the network. Half an answer was a completed run (round 15b).
            if not (done or finish or cut):
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded()
                raise ProviderError("%s closed the chat stream before the reply was complete" % self.label(),
                                    retryable=True)
            tool_calls = []
            for i, idx in enumerate(sorted(calls)):
                c = calls[idx]
                tool_calls.append({"id": c["id"] or tool_call_id(len(messages), i, c["name"], c["arguments"]),
                                   "name": c["name"], "arguments": c["arguments"]})
            return Reply("".join(content), tool_calls, _usage(usage), finish or "stop", "".join(thinking))

        return self.call("POST", self.base_url + "/chat/completions", handle, body=body, stream=True,
                         deadline=deadline, what="chat request")

    @staticmethod
    def _chat_reply_from_json(data):
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        calls = [{"id": c.get("id") or tool_call_id(0, i, c["function"]["name"], c["function"].get("arguments")),
                  "name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}
                 for i, c in enumerate(msg.get("tool_calls") or ())]
        return Reply(msg.get("content") or "", calls, _usage(data.get("usage") or {}),
                     choice.get("finish_reason") or "stop", msg.get("reasoning_content") or "")

    # -- /responses --
    @staticmethod
    def responses_wire(messages):
        instructions, items = [], []
        for i, m in enumerate(messages):
            role = m["role"]
            if role == "system":
                if not items:
                    instructions.append(m["content"])
                else:
                    items.append({"role": "developer", "content": m["content"]})
            elif role == "user":
                items.append({"role": "user", "content": m["content"]})
            elif role == "assistant":
                if m.get("content"):
                    items.append({"role": "assistant", "content": m["content"]})
                for c in m.get("tool_calls") or ():
                    items.append({"type": "function_call", "call_id": c["id"], "name": c["name"],
                                  "arguments": c["arguments"] or "{}"})
            elif role == "tool":
                items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        return "\n\n".join(instructions), items

    def _responses(self, messages, tools, on_delta, deadline):
        instructions, items = self.responses_wire(messages)
        body = {"model": self.model, "input": items, "stream": True, "store": False}
        for key, value in self.sampling().items():  # the Responses API has no seed; it calls the cap max_output_tokens
            if key != "seed":
                body["max_output_tokens" if key == "max_tokens" else key] = value
        if instructions:
            body["instructions"] = instructions
        if tools:
            body["tools"] = [dict(t, type="function") for t in tools]

        def handle(resp):
            if "json" in resp.headers.get("Content-Type", ""):
                return self._responses_reply(resp.json(), [], {})
            self.expect_stream(resp)
            text, items_done, args_by_item, final = [], {}, {}, None
            for event, data in iter_sse(resp):
                try:
                    ev = json.loads(data)
                except ValueError:
                    raise ProviderError("malformed stream event from %s: %s" % (self.label(), one_line(data, 80)),
                                        retryable=True)
                kind = ev.get("type") or event
                if kind == "response.output_text.delta":
                    text.append(ev.get("delta", ""))
                    if on_delta:
                        on_delta(ev.get("delta", ""))
                elif kind == "response.output_item.added":
                    item = ev.get("item") or {}
                    if item.get("type") == "function_call":
                        args_by_item[item.get("id")] = [item.get("arguments") or ""]
                elif kind == "response.function_call_arguments.delta":
                    args_by_item.setdefault(ev.get("item_id"), []).append(ev.get("delta", ""))
                elif kind == "response.output_item.done":
                    items_done[ev.get("output_index", len(items_done))] = ev.get("item") or {}
                elif kind in ("response.completed", "response.incomplete", "response.done"):
                    final = ev.get("response") or {}
                    break
                elif kind == "response.failed":
                    err = (ev.get("response") or {}).get("error") or {}
                    raise ProviderError("%s failed the response: %s" % (self.label(), err.get("message") or err),
                                        retryable=True)
                elif kind == "error":
                    raise ProviderError("%s reported an error: %s" % (self.label(), ev.get("message") or data),
                                        retryable=True)
                if deadline is not None and time.monotonic() > deadline:
                    raise DeadlineExceeded()
            if final is None:
                raise ProviderError("%s closed the stream before the response completed" % self.label(),
                                    retryable=True)
            done = [items_done[k] for k in sorted(items_done)]
            return self._responses_reply(final, done, args_by_item, "".join(text))

        return self.call("POST", self.base_url + "/responses", handle, body=body, stream=True,
                         deadline=deadline, what="responses request")

    @staticmethod
    def _responses_reply(final, done_items, args_by_item, streamed_text=None):
        output = final.get("output") or done_items
        text, calls, thinking = [], [], []
        for item in output:
            kind = item.get("type")
            if kind == "message":
                for part in item.get("content") or ():
                    if part.get("type") in ("output_text", "text"):
                        text.append(part.get("text", ""))
            elif kind == "function_call":
                args = item.get("arguments")
                if args is None:
                    args = "".join(args_by_item.get(item.get("id"), []))
                calls.append({"id": item.get("call_id") or item.get("id"), "name": item.get("name") or "",
                              "arguments": args or "{}"})
            elif kind == "reasoning":
                for part in item.get("summary") or ():
                    thinking.append(part.get("text", ""))
        content = "".join(text) if text or streamed_text is None else streamed_text
        usage = final.get("usage") or {}
        reason = "tool_calls" if calls else "stop"
        if final.get("status") == "incomplete":
            reason = "length"
        return Reply(content, calls, {"prompt_tokens": usage.get("input_tokens") or 0,
                                      "completion_tokens": usage.get("output_tokens") or 0},
                     reason, "".join(thinking))


def _props_window(data):
    """llama.cpp's server: /props default_generation_settings.n_ctx (older builds: n_ctx at the top)."""
    settings = data.get("default_generation_settings") if isinstance(data, dict) else None
    return (settings or {}).get("n_ctx") or (data.get("n_ctx") if isinstance(data, dict) else None)


def _lmstudio_window(model):
    """LM Studio's /api/v0/models: the loaded context length of `model` (or its maximum)."""
    def find(data):
        for m in (data.get("data") or []) if isinstance(data, dict) else ():
            if m.get("id") == model:
                return m.get("loaded_context_length") or m.get("max_context_length")
        return None
    return find


def _usage(usage):
    return {"prompt_tokens": usage.get("prompt_tokens") or 0,
            "completion_tokens": usage.get("completion_tokens") or 0}


def _dropped(label, exc, where):
    """A server that took the connection and closed (or reset) it without an HTTP answer: not "start it" (round
    18c: a port where something else listens said "cannot connect … start it with 'ollama serve'")."""
    return ProviderError("%s closed the connection without an answer (%s); is %s the model server's address?"
                         % (label, _connection_reason(exc), where), retryable=True)


class CopilotProvider(OpenAIProvider):
    """GitHub Copilot: OpenAI wire formats with Copilot's headers; codex models via /responses."""

    name = "copilot"
    ADDRESS = "provider.copilot.api_url"  # its errors named OpenAI's settings (round 18c)
    EDITOR_HEADERS = {"Editor-Version": "vscode/1.104.0", "Editor-Plugin-Version": "copilot-chat/0.31.0",
                      "Copilot-Integration-Id": "vscode-chat", "Openai-Intent": "conversation-agent"}

    def __init__(self, cfg, console, model=None, auth=None):
        Provider.__init__(self, cfg, console, model)
        self.api = "auto"
        self.auth = auth or CopilotAuth(cfg, console)
        self._model_list = None
        self._initiator = "user"

    @property
    def base_url(self):
        self.auth.token()  # the token says which API endpoint serves this account
        return self.auth.api_base()

    def refresh_credentials(self):
        """After a 401: exchange once more, unless the token from the last such exchange was refused too."""
        if self.auth.current and self.auth.current.get("token") == getattr(self, "_refreshed", None):
            return False
        if not self.auth.refresh():
            return False
        self._refreshed = self.auth.current["token"]
        return True

    def label(self):
        return "GitHub Copilot (%s)" % self.auth.api_base()

    def login_hint(self):
        return "run 'xzatoma auth login' or set COPILOT_API_TOKEN"

    def headers(self):
        headers = dict(self.EDITOR_HEADERS)
        headers["Authorization"] = "Bearer " + self.auth.token()
        headers["X-Initiator"] = self._initiator
        return headers

    def uses_responses(self):
        """Models Copilot serves only through /responses (the codex family) go there."""
        try:
            listed = {m["id"]: m for m in self.models()}
        except XzError as exc:
            if getattr(exc, "unreachable", False):
                raise
            self.console.debug("cannot list Copilot models: %s" % exc)
            listed = {}
        info = listed.get(self.model)
        if info and info.get("endpoints"):
            endpoints = info["endpoints"]
            return "/responses" in endpoints and "/chat/completions" not in endpoints
        return "codex" in self.model.lower()

    def complete(self, messages, tools, on_delta=None, deadline=None, estimated_tokens=0):
        last = messages[-1] if messages else {"role": "user"}
        self._initiator = "user" if last["role"] == "user" and not last.get("name") else "agent"
        return super().complete(messages, tools, on_delta, deadline)


PROVIDERS = {"ollama": OllamaProvider, "openai": OpenAIProvider, "copilot": CopilotProvider}
KEY_NAMES = {"openai": "openai_api_key", "ollama": "ollama_api_key"}


def stored_key(cfg, console, provider):
    """An API key: (value, source) from the environment first, then the credential store."""
    env_value = cfg.secret(provider)
    if env_value:
        return env_value, "env " + cfg.secret_sources()[provider]
    try:
        value, where = CredentialStore(cfg.home, console).get(KEY_NAMES[provider])
    except CredentialsError as exc:
        console.warn(str(exc), once_key="credentials-mode")
        return None, None
    return value, where


def model_table(provider):
    """[{id, context_window, tools}] for `xzatoma models`: tools is True/False, or None when unknown."""
    rows = []
    if isinstance(provider, OllamaProvider):
        for m in provider.models():
            try:
                info = provider.call("POST", provider.host + "/api/show", lambda r: r.json(), body={"model": m["id"]},
                                     what="model details")
            except ProviderError:
                info = {}
            window = next((int(v) for k, v in (info.get("model_info") or {}).items()
                           if k.endswith(".context_length")), None)
            caps = info.get("capabilities")
            rows.append({"id": m["id"], "context_window": window, "tools": ("tools" in caps) if caps else None})
        return rows
    return [{"id": m["id"], "context_window": m["context_window"], "tools": m["tools"]} for m in provider.models()]


def make_provider(cfg, console, name=None, model=None):
    return PROVIDERS[name or cfg.provider_type](cfg, console, model)


# ---- Model output repair: <think> blocks and tool calls written as text ----
# Small local models often write their tool calls into the answer the way their chat template taught them
# (Qwen/Hermes `<tool_call>{…}</tool_call>`, Llama 3 `<|python_tag|>` or a bare `{"name", "parameters"}`,
# Mistral `[TOOL_CALLS]`, `<function=name>{…}</function>`, fenced ```json blocks), often with a sentence
# around them, and the server passes that through as text. Such calls are found wherever they stand and
# checked against the tool schemas like native ones (the Registry validates; the approvals, policy and
# sandbox are the same). Two rules keep text from acting by accident:
#   - only a call *shape* counts: a block in one of the forms above holding {"name", "arguments"} (or
#     "parameters"); JSON inside a sentence, an inline `code span` or a ```python block is prose;
#   - a block that already appeared in what the model *read* (a tool result, a user message) is a quote, not
#     a call: a file that says `<tool_call>{"name": "terminal", …}` cannot make its reader run it by echoing it.
# A block that is clearly an attempt (a tag, or a call-shaped start) but does not parse is reported as
# malformed, so the loop can say what was wrong instead of taking the text for a final answer. What a model
# writes after its first call, it wrote without seeing any result ("the count is 1", a made-up
# <tool_response>, a grep for a line it imagined): the loop runs that first call only, and the rest is not
# kept in the conversation, where the model would read its guesses back. It is asked again with the result.

def strip_think(text):
    """Split '<think>…</think>' reasoning from an answer. Returns (answer, thinking)."""
    if not text or "think>" not in text:
        return text, ""
    import re
    thinking = []

    def keep(m):
        thinking.append(m.group(1).strip())
        return ""
    # only up to the last closing tag: past it every '<think>' would scan to the end for one in vain, so
    # '<think>' repeated was quadratic (100 KB of them took seconds, a megabyte minutes)
    end = text.rfind("</think>") + len("</think>")
    answer = re.sub(r"<think>(.*?)</think>", keep, text[:end], flags=re.S) + text[end:] if end > 7 else text
    if "</think>" in answer:  # opening tag was in the chat template
        before, _, answer = answer.partition("</think>")
        thinking.insert(0, before.strip())
    if "<think>" in answer:  # cut off while thinking
        answer, _, rest = answer.partition("<think>")
        thinking.append(rest.strip())
    return answer.strip(), "\n".join(t for t in thinking if t)


class TextCalls:
    """What find_text_tool_calls saw in a reply: calls, the prose around them, and failed attempts."""

    __slots__ = ("calls", "prose", "malformed", "quoted", "form", "after")

    def __init__(self, calls, prose, malformed, quoted, form, after=""):
        self.calls = calls  #: [{name, arguments (JSON text)}] in the order written
        #: the assistant's own words: before its first call (what it wrote after that, it wrote without the
        #: call's result: a guess that, kept, it would read back as a fact), or the reply without its call blocks
        self.prose = prose
        self.malformed = malformed  #: reasons, one per block that was an attempt but could not be read
        self.quoted = quoted  #: call blocks skipped because they repeat something the model read
        self.form = form  #: how the first call was written ("tool_call", "json", …), for the correction turn
        self.after = after  #: the reply from its first call on (the calls, and whatever was guessed after them)


#: opening markers of tagged call forms, and what ends each (None: the end of the reply)
_CALL_TAGS = {"<tool_call>": "</tool_call>", "<|python_tag|>": "<|eom_id|>", "[TOOL_CALLS]": None,
              "<function=": "</function>", "<tools>": "</tools>", "<|tool_call|>": "<|/tool_call|>",
              "<function_call>": "</function_call>"}
_NAME_KEYS = ("name", "tool", "tool_name", "function")
_ARG_KEYS = ("arguments", "parameters", "args", "input")
_FENCE_LANGS = ("", "json", "json5", "jsonc", "tool_call", "tool_code", "tool", "function")
_MAX_BARE = 16  # bare JSON lines tried per reply: each try may scan to the end (a code listing of `{` lines)
_opening = None


def _opening_re():
    global _opening
    if _opening is None:
        import re
        tags = "|".join(re.escape(t) for t in _CALL_TAGS)
        # a fence or a JSON start must begin its line; `[ \t]*` before a one-character look-ahead stays linear
        _opening = re.compile(r"(%s)|^[ \t]*```[ \t]*([\w.-]*)[ \t]*$|^[ \t]*(?=[\[{])" % tags, re.M)
    return _opening


_LENIENT = None


def _lenient():
    """A JSON decoder that takes what models write and JSON does not: raw newlines and tabs inside strings."""
    global _LENIENT
    if _LENIENT is None:
        _LENIENT = json.JSONDecoder(strict=False)
    return _LENIENT


def _mend_escapes(text):
    """`\\d` in a regular expression written into JSON (`"pattern": "\\d+"`) is no JSON escape: taken as the
    backslash it meant, escapes JSON knows kept as they are."""
    import re
    return re.sub(r"\\(.)", lambda m: m.group(0) if m.group(1) in '"\\/bfnrtu' else "\\\\" + m.group(1), text,
                  flags=re.S)


def _loads(text):
    """JSON from a model: as written (raw newlines in strings and unknown backslash escapes forgiven), several
    values one after the other (a list of them: a <tools> block of JSON lines), or with the doubled braces some
    GGUF templates teach ({{"name": …}})."""
    text = text.strip()
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply")
    except ValueError as exc:
        first = exc
        for attempt in (text, _mend_escapes(text)):
            try:
                value, end = _lenient().raw_decode(attempt)
                if not attempt[end:].strip():
                    return value
            except (ValueError, RecursionError):
                pass
        if exc.msg == "Extra data":
            values, pos = [], 0
            try:
                while pos < len(text):
                    value, pos = _raw_decode(text, pos)
                    values.append(value)
                    while pos < len(text) and text[pos] in " \t\r\n,":
                        pos += 1
                return values
            except ValueError:
                pass
        if "{{" not in text:
            raise first
    try:
        return json.loads(text.replace("{{", "{").replace("}}", "}"))
    except (ValueError, RecursionError):
        raise first


_PYTHON_WORDS = {"true": "True", "false": "False", "null": "None"}


def _python_literal(text, start):
    """(value, end) for an object at text[start:] written as a Python literal, or None: a small model wrote
    `"content": '{"version": "2.4.1"}'`, a string in single quotes, three times over. Read by ast.literal_eval,
    which builds values and runs nothing; JSON's true, false and null are taken as Python's."""
    if not text.startswith("{", start):
        return None
    depth, quote, i, n = 0, None, start, min(len(text), start + 100000)
    while i < n:  # where the object ends: its braces balance, outside strings of either quote
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    else:
        return None
    import ast
    import io
    import tokenize
    try:
        tokens = [(kind, _PYTHON_WORDS.get(word, word) if kind == tokenize.NAME else word)
                  for kind, word, _, _, _ in tokenize.generate_tokens(io.StringIO(text[start:i + 1]).readline)]
        value = ast.literal_eval(tokenize.untokenize(tokens).strip())
        json.dumps(value)  # sets, bytes …: not what a call's arguments can be
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, tokenize.TokenError):
        return None
    return (value, i + 1) if isinstance(value, dict) else None


def _raw_decode(text, start):
    """(value, end) for the JSON value at text[start:], doubled braces accepted; ValueError otherwise."""
    decoder = json.JSONDecoder()
    try:
        return decoder.raw_decode(text, start)
    except RecursionError:
        raise ValueError("nested too deeply")
    except ValueError as exc:
        first = exc
    try:  # raw newlines in strings, then unknown escapes (`\\d`): where the value ends is the same or found again
        return _lenient().raw_decode(text, start)
    except (ValueError, RecursionError):
        pass
    mended = _mend_escapes(text[start:])
    try:
        value, end = _lenient().raw_decode(mended)
        return value, start + end - (mended[:end].count("\\") - text[start:start + end].count("\\"))
    except (ValueError, RecursionError):
        if not text.startswith("{{", start):
            found = _python_literal(text, start)
            if found is None:
                raise first
            return found
    # a doubled object ends where its braces balance ({{ … }}): undouble that span only
    depth, i, n = 0, start, len(text)
    while i < n:
        pair = text[i:i + 2]
        if pair == "{{":
            depth, i = depth + 1, i + 2
        elif pair == "}}" and depth:
            depth, i = depth - 1, i + 2
            if depth == 0:
                try:
                    return _loads(text[start:i]), i
                except (ValueError, RecursionError):
                    break
        else:
            i += 1
    raise ValueError("not JSON")


def _call_of(obj, name=None):
    """{name, arguments} from one call-shaped object, None when it is not call-shaped, or a reason (str)."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI's own shape: {"type": "function", "function": {…}}
        obj = obj["function"]
    if name is None:
        name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str)), None)
        key = next((k for k in _ARG_KEYS if k in obj), None)
        if name is None or (key is None and set(obj) - {"name", "type", "id"}):
            return None
        args = obj.get(key, {}) if key else {}
    else:
        args = obj  # <function=name>{…}: the object is the arguments
    if isinstance(args, str):
        try:
            args = _loads(args) if args.strip() else {}
        except ValueError as exc:
            return "the arguments of %s are not JSON (%s)" % (name, exc)
    if not isinstance(args, dict):
        return "the arguments of %s must be a JSON object" % name
    return {"name": name.strip(), "arguments": json.dumps(args, ensure_ascii=False)}


def _calls_in(value, name=None):
    """Calls in a parsed block (an object or a list of them); (calls, reasons)."""
    calls, reasons = [], []
    for obj in (value if isinstance(value, list) else [value]):
        call = _call_of(obj, name)
        if isinstance(call, dict):
            calls.append(call)
        elif isinstance(call, str):
            reasons.append(call)
        elif isinstance(value, list) or name is not None:
            reasons.append("expected {\"name\": …, \"arguments\": {…}}, got %s" % one_line(json.dumps(obj), 60))
    return calls, reasons


def _call_shaped(value):
    """A JSON value that can only be calls: {"name", "arguments"} objects (or OpenAI's {"function": {…}}), alone
    or in a list of nothing else; package.json's {"name", "version"} is data."""
    values = value if isinstance(value, list) else [value]
    return bool(values) and all(isinstance(v, dict) and (isinstance(v.get("function"), dict) or (
        any(isinstance(v.get(k), str) for k in _NAME_KEYS) and any(k in v for k in _ARG_KEYS))) for v in values)


def _mistral_calls(body):
    """[TOOL_CALLS] followed by a JSON list, or by name[ARGS]{…} (or name{…}) repeated (newer templates)."""
    body = body.strip()
    if body.startswith("[") or body.startswith("{"):
        return _calls_in(_loads(body))
    calls, reasons = [], []
    for part in body.split("[TOOL_CALLS]"):
        name, sep, args = part.partition("[ARGS]")
        if not sep:
            brace = part.find("{")
            name, args = (part[:brace], part[brace:]) if brace > 0 else (part, "")
        found, why = _calls_in(_loads(args) if args.strip() else {}, name.strip())
        calls += found
        reasons += why
    return calls, reasons


def find_text_tool_calls(content, seen=""):
    """The tool calls written in a reply's text (see the section note). `seen`: what the model has read so far
    (tool results and user messages, joined; or a function that joins them, called only when needed); a block
    found in it is a quote. Returns TextCalls, or None when
    the text holds neither a call nor an attempt at one."""
    text = content or ""
    if not text.strip() or ("{" not in text and not any(tag in text for tag in _CALL_TAGS)):
        return None
    if "&#34;" in text or "&quot;" in text:  # llama-cpp-python's chatml-function-calling template escapes what
        import html  # the model reads as HTML, and a small model then writes its calls so: {&#34;name&#34;: …}
        for _ in range(3):  # (…and escapes its own escapes again: &amp;#34;)
            unescaped = html.unescape(text)
            if unescaped == text:
                break
            text = unescaped
    scan = _Scan(seen() if callable(seen) else seen)
    scan.run(text)
    if not scan.calls and not scan.malformed and not scan.quoted:
        return None
    if scan.first_call is not None:  # what follows the first call was written before any result came
        return TextCalls(scan.calls, text[:scan.first_call].strip(), scan.malformed, scan.quoted,
                         scan.form or "json", text[scan.first_call:])
    prose, last = [], 0
    for start, end in scan.spans:
        prose.append(text[last:start])
        last = max(last, end)
    prose.append(text[last:])
    return TextCalls(scan.calls, "".join(prose).strip(), scan.malformed, scan.quoted, scan.form or "json")


def _looks_like_call(head):
    """A block that starts like a call ({"name": … after optional brackets) is an attempt even when broken."""
    return head.replace(" ", "").replace("\n", "").lstrip("[{\n\t").startswith(
        tuple('"%s"' % k for k in _NAME_KEYS))


class _Scan:
    """One pass over a reply: each opening found is consumed whole, so the pass is linear in the reply."""

    def __init__(self, seen):
        self.seen = seen
        self.calls, self.malformed, self.spans = [], [], []
        self.quoted, self.form, self.bare_tries, self.first_call = 0, None, 0, None

    def found(self, kind, block, value_calls, reasons, span):
        if block.strip() and block.strip() in self.seen:
            self.quoted += 1
        else:
            if value_calls and self.first_call is None:
                self.first_call = span[0]
            self.calls += value_calls
            self.malformed += reasons
            if value_calls or reasons:
                self.form = self.form or kind
        self.spans.append(span)

    def run(self, text, nested=False):
        opening, pos = _opening_re(), 0
        while True:
            match = opening.search(text, pos)
            if match is None:
                return
            tag, lang, start = match.group(1), match.group(2), match.start()
            if tag:
                pos = self.tagged(text, tag, match)
            elif lang is not None:
                pos = self.fenced(text, lang, match, nested)
            else:
                pos = self.bare(text, match)
                if pos is None:
                    return

    def tagged(self, text, tag, match):
        """<tool_call>…</tool_call> and the other tags: the block runs to its closing tag or the reply's end."""
        body_start, name = match.end(), None
        if tag == "<function=":
            close_name = text.find(">", body_start, body_start + 200)
            if close_name < 0:
                return body_start
            name, body_start = text[body_start:close_name].strip(), close_name + 1
        closing = _CALL_TAGS[tag]
        close = text.find(closing, body_start) if closing else -1
        end = close + len(closing) if close >= 0 else len(text)
        block = text[body_start:close if close >= 0 else len(text)]
        if tag == "<|python_tag|>":
            block = block.split("<|eot_id|>")[0]
        kind = {"[TOOL_CALLS]": "mistral", "<function=": "function"}.get(tag, "tool_call")
        try:
            if kind == "mistral":
                calls, reasons = _mistral_calls(block)
            elif block.strip():
                calls, reasons = _calls_in(_loads(block), name)
            else:
                calls, reasons = [], ["the %s block is empty" % tag]
        except ValueError as exc:
            calls, reasons = [], ["the call is not valid JSON (%s)" % one_line(exc, 80)]
        self.found(kind, block, calls, reasons, (match.start(), end))
        return max(end, match.end())

    def fenced(self, text, lang, match, nested):
        """```json … ```: the inside is read like a reply of its own; other languages are prose."""
        body_start = match.end()
        close = text.find("```", body_start)
        end = len(text) if close < 0 else close + 3
        body = text[body_start:close if close >= 0 else len(text)]
        if nested:
            return end
        if lang.lower() not in _FENCE_LANGS and not any(t in body for t in _CALL_TAGS):
            # ```sh around a call: only a body that is wholly call-shaped JSON counts (code is never a call)
            try:
                value = _loads(body)
            except ValueError:
                return end
            calls, reasons = _calls_in(value) if _call_shaped(value) else ([], [])
            if calls and not reasons:
                self.found("json", body, calls, [], (match.start(), end))
            return end
        inner = _Scan(self.seen)
        inner.bare_tries = self.bare_tries
        inner.run(body, nested=True)
        self.bare_tries = inner.bare_tries
        if inner.calls or inner.malformed or inner.quoted:
            if inner.calls and self.first_call is None:
                self.first_call = match.start()
            self.calls += inner.calls
            self.malformed += inner.malformed
            self.quoted += inner.quoted
            self.form = self.form or inner.form
            self.spans.append((match.start(), end))
        return end

    def bare(self, text, match):
        """A line that starts with JSON: a call when it is call-shaped ({"name", "arguments"}); None: stop."""
        self.bare_tries += 1
        if self.bare_tries > _MAX_BARE:
            return None
        body_start = match.end()
        try:
            value, end = _raw_decode(text, body_start)
        except ValueError as exc:
            if not _looks_like_call(text[body_start:body_start + 60]):
                return body_start + 1
            self.found("json", text[body_start:], [], ["the call is not valid JSON (%s)" % one_line(exc, 80)],
                       (match.start(), len(text)))
            return None  # the rest of the reply is the broken call
        if not _call_shaped(value):
            return end  # JSON data in an answer, not a call
        calls, reasons = _calls_in(value)
        self.found("json", text[body_start:end], calls, reasons, (match.start(), end))
        return end


def call_format_hint(form):
    """How to write a call, in the form the model tried (so the correction speaks its template's language)."""
    example = '{"name": "<tool name>", "arguments": {<arguments as JSON>}}'
    if form == "tool_call":
        return "<tool_call>\n%s\n</tool_call>" % example
    if form == "mistral":
        return "[TOOL_CALLS][%s]" % example
    if form == "function":
        return "<function=<tool name>>{<arguments as JSON>}</function>"
    return example


# ---- Agent loop: how a run ends (the stop family) ----
# A run ends with an answer ("completed") or with one of these. They are raised anywhere below
# Agent.run (the limits check, the model call, the quota, a cancel event) and caught there once;
# KeyboardInterrupt and SIGTERM (Terminated) become Interrupted at that same edge. Failures that the
# model can act on are not here: a tool's failure is an `Error: …` result, never an exception.


class RunStop(Exception):
    """Ends a run with `status` (stored, and in --json) and `exit_code`; the message is one line."""

    status, exit_code = "failed", EXIT_FAILED

    def __init__(self, message, exit_code=None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class MaxTurns(RunStop):
    status = "max_turns"


class Timeout(RunStop):
    status = "timeout"


class QuotaExceeded(RunStop):
    status = "quota_exceeded"

    def __init__(self, message):
        super().__init__("quota exceeded: " + message)


class Interrupted(RunStop):
    status, exit_code = "interrupted", EXIT_INTERRUPTED


class ProviderFailed(RunStop):
    """The provider failed after its retries, or the model's reply cannot be used. `unreachable`: nothing listens
    where the model server should be (ProviderError.unreachable)."""

    def __init__(self, message, exit_code=None, unreachable=False):
        super().__init__(message, exit_code)
        self.unreachable = unreachable


class StuckAfterWork(RunStop):
    """The model kept repeating a call after it had changed files: the changes stand, unchecked."""
    status, exit_code = "unverified", EXIT_UNVERIFIED


ANSWERED = ("completed", "unverified")  #: statuses whose answer is printed as the run's output


class RunResult:
    COUNTS = ("turns", "tool_calls", "prompt_tokens", "completion_tokens")  # what the store keeps per conversation

    def __init__(self, conversation_id, progress=None):
        self.conversation_id = conversation_id
        self.progress = progress  #: the task's Progress (plan instructions or the model's steps), or None
        self.status = "running"
        self.answer = ""
        self.error = None
        self.exit_code = EXIT_OK
        self.turns = 0
        self.tool_calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.estimated = False  #: some token counts are our estimate: the server sent no usage
        self.duration = 0.0
        #: the project files that run later by design (Makefile, conftest.py, CI …) this run created or changed:
        #: not blocked, but a person reviews them before running anything (Confinement.deferred_changed)
        self.review = []
        self.warnings = []  #: what a person should know about how the run ended (an unverified answer)
        self.unreachable = False  #: it failed because nothing listens where the model server should be

    def counts(self):
        return {key: getattr(self, key) for key in self.COUNTS}

    def carry_on(self, stored):
        """A resumed conversation's totals continue from what the store recorded."""
        for key in self.COUNTS:
            setattr(self, key, stored.get(key) or 0)

    def to_json(self):
        return {"conversation_id": self.conversation_id, "status": self.status, "answer": self.answer,
                "turns": self.turns, "tool_calls": self.tool_calls,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                          "total_tokens": self.prompt_tokens + self.completion_tokens, "estimated": self.estimated},
                "duration_seconds": round(self.duration, 3), "error": self.error, "warnings": list(self.warnings),
                "steps": self.progress.to_json() if self.progress is not None else [], "review": self.review}


class Events:
    """What the loop reports while it works; the CLI prints these on stderr."""

    #: tools whose successful calls are drawn another way (update_progress: the list, by progress())
    QUIET_TOOLS = ("update_progress",)

    def __init__(self, console):
        self.console = console

    def delta(self, text):
        pass

    def waiting(self):
        """The model has been asked; nothing has arrived yet."""

    def retrying(self):
        """The reply so far was cut off, and the model is asked again: what it streamed is not the answer."""

    def replied(self):
        """The model's reply is complete (or failed)."""

    def stop(self):
        """The turn or run ended, however (Ctrl-C included): nothing of it stays animated on the screen."""

    def thinking(self, text):
        if text:
            self.console.debug("thinking: " + one_line(text, 400))

    def tool_start(self, name, preview):
        if name not in self.QUIET_TOOLS:
            self.console.info("▶ %s %s" % (name, one_line(preview, 80)), "cyan")

    def tool_end(self, name, result):
        if name in self.QUIET_TOOLS and result.success:
            return
        ok, line = result_summary(result, 100)
        self.console.info("  %s %s" % ("✓" if ok else "✗", line), "dim" if ok else "yellow")
        if self.console.verbose:
            for text in result_detail(result):
                self.console.info("    │ " + text, "dim")

    def note(self, text):
        self.console.info(text, "dim")

    def progress(self, progress, step):
        """The task's steps changed (`step`: the one that did, {step, text, status, added}; None: the list as it
        starts). Drawn as seed 001 draws it: "Completed 1/2 instructions:", then ✓ done, ⧗ in progress, ○ pending."""
        for line in progress.lines():
            self.console.info(line, "dim")

    # what a machine reading --output-format stream-json wants besides the lines above
    def usage(self, prompt, completion, estimated):
        """One model call's token counts (estimated: the server sent none)."""

    def message(self, content, tool_calls):
        """An assistant message: its text and the tool calls it asks for."""

    def tool_call(self, call):
        """A tool call is about to run: {id, name, arguments (JSON text)}."""

    def tool_result(self, call, result):
        """A tool call's ToolResult."""


def command_streams(output):
    """[(stream name, text)] of a terminal result's output (the terminal tool's `--- stdout ---` sections)."""
    import re
    parts = re.split(r"\n--- (stdout|stderr) ---\n", "\n" + (output or ""))
    return [(parts[i], re.sub(r"\n\[(stdout|stderr) truncated: [^\]]*\]$", "", parts[i + 1]))
            for i in range(1, len(parts) - 1, 2)]


def _diff_counts(result):
    """(path, lines added, lines removed, the diff's lines after its header) of the unified diff of a tool's
    change (edit_file's in its metadata; write_file's confirmation-style output), or None when there is none."""
    lines = (result.metadata.get("diff") or result.output or "").split("\n")
    for i in range(min(len(lines) - 1, 5)):
        if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ "):
            body = lines[i + 2:]
            added = sum(1 for line in body if line.startswith("+"))
            removed = sum(1 for line in body if line.startswith("-"))
            path = lines[i + 1][4:].strip()
            return (path[2:] if path.startswith("b/") else path), added, removed, body
    return None


def result_summary(result, width=100):
    """(ok, one line) for a tool result as progress shows it: a command that exited non-zero is not ok and
    shows its exit code and last error line; an edit shows what it changed, counted."""
    meta = result.metadata
    if result.success and "exit_code" in meta:
        code = meta["exit_code"]
        text = "exit %s · %.2fs" % (code, meta.get("duration_seconds") or 0.0)
        if meta.get("edited"):
            text = "ran as you edited it: %s · %s" % (one_line(meta.get("command") or "", 60), text)
        streams = command_streams(result.output)
        lines = [line for _, body in streams for line in body.split("\n") if line.strip()]
        errors = [line for name, body in streams if name == "stderr" for line in body.split("\n") if line.strip()]
        if code != 0 and (errors or lines):
            text += ": " + (errors or lines)[-1].strip()
        elif lines:
            text += " · %s of output" % _plural(len(lines), "line")
        return code == 0, one_line(text, width)
    if result.success:
        counted = _diff_counts(result)
        if counted is not None:
            path, added, removed, _ = counted
            return True, one_line("%s: +%d −%d %s" % (path, added, removed, "line" if added + removed == 1 else
                                                        "lines"), width)
    return result.success, result.preview(width)


DETAIL_LINES = 8  #: lines of a command's output (its end) or of a diff (its start) that --verbose shows


def result_detail(result):
    """The lines --verbose shows under a result: a command's last lines of output, an edit's diff (cleaned
    when printed, like every line)."""
    if not result.success:
        return []
    if "exit_code" in result.metadata:
        lines = [line for _, body in command_streams(result.output) for line in body.split("\n")]
        while lines and not lines[-1].strip():
            lines.pop()
        shown = lines[-DETAIL_LINES:]
        return (["… %s above" % _plural(len(lines) - len(shown), "line")] if len(lines) > len(shown) else []) + shown
    counted = _diff_counts(result)
    if counted is not None:
        lines = counted[3]
        more = len(lines) - DETAIL_LINES
        return lines[:DETAIL_LINES] + (["… %s more" % _plural(more, "line")] if more > 0 else [])
    return []


class StreamedText(Events):
    """The model's words streamed to a terminal (`out`) as they arrive, redacted and neutralised; tool lines,
    spinner and notes on stderr. A reply that turns out to ask for tools was interim: its words are dimmed in
    place (erased with --quiet) where that can be done exactly, else left as they are. What a cut-off reply
    had streamed stays on the screen and in `partial()`, for the conversation."""

    def __init__(self, console, out, waiting_label="thinking"):
        super().__init__(console)
        self.out = out
        self.spinner = Spinner(console)
        self.waiting_label = waiting_label
        self.filter, self.render = ThinkFilter(), xzatoma_store.UntrustedStream()
        self.streamed = False  #: the current line of `out` holds streamed text (a newline ends it)
        self.shown = []  #: what the current reply put on the screen
        self.raw = []  #: the current reply's text as it came, until the loop has it whole (message())
        self.answered = False  #: the last reply was streamed and asked for no tool: the answer is on the screen
        self._lines_at_start = 0

    def waiting(self):
        self.filter, self.render = ThinkFilter(), xzatoma_store.UntrustedStream()
        self.shown, self.raw, self.answered = [], [], False
        self.spinner.start(self.waiting_label)

    def delta(self, text):
        self.raw.append(text)
        self._show(self.render.feed(self.filter.feed(text)))

    def retrying(self):
        """What a cut-off reply streamed stays, marked, and the next attempt starts on a line of its own (it was
        glued to it: 'PARTIAL-FIRST-ATTEMPT The final answer is 42.', attack round 15c)."""
        if self.shown:
            self._show(self.render.finish())
            self.out.write(self.console.style(" [cut off: asked again]", "dim"))
            self._end_line()
        self.waiting()

    def _show(self, visible):
        if visible:
            self.spinner.stop()
            if not self.shown:
                visible = visible.lstrip("\n")
                if not visible:
                    return
                self._lines_at_start = self.console.lines
            self.out.write(visible)
            self.out.flush()
            self.shown.append(visible)
            self.streamed = True

    def replied(self):
        self.spinner.stop()
        self._show(self.render.finish())
        self._end_line()

    def _end_line(self):
        if self.streamed:
            self.out.write("\n")
            self.out.flush()
            self.streamed = False

    def stop(self):
        self.spinner.stop()
        self._end_line()

    def message(self, content, tool_calls):
        self.raw = []  # whole now: the conversation holds it
        if not tool_calls:
            self.answered = bool(self.shown)
            return
        if self.shown:
            self._interim(content)
        elif content.strip() and not self.console.quiet:
            self.console.info(content.strip(), "dim")

    def _interim(self, content):
        """Dim (or, quiet, erase) the reply just streamed: the cursor goes back up over exactly its rows."""
        shown = "".join(self.shown)
        self.shown = []
        quiet = self.console.quiet
        if not (quiet or self.console.color) or self.console.lines != self._lines_at_start or \
                os.environ.get("TERM") == "dumb":
            return  # no dim to show it in, a line came in between (the rows are not known), or no escapes
        size = _terminal_size(self.out)
        rows = _display_rows(shown, size[0]) if size else None
        if rows is None or rows >= size[1]:
            return  # taller than the screen, or of a width not known exactly: left as it is
        self.out.write("\033[%dA\r\033[J" % rows)
        if content.strip() and not quiet:
            self.out.write(self.console.style(self.console.clean(content.strip()), "dim") + "\n")
        self.out.flush()

    def partial(self):
        """What a reply cut short (Ctrl-C) had said, without its thinking, or "" when no reply was cut."""
        return _partial(self.raw)

    def tool_start(self, name, preview):
        self.spinner.stop()
        super().tool_start(name, preview)
        self.spinner.start(name)

    def tool_end(self, name, result):
        self.spinner.stop()
        super().tool_end(name, result)


def _terminal_size(stream):
    """(columns, rows) of the terminal `stream` writes to, or None."""
    try:
        size = os.get_terminal_size(stream.fileno())
        return (size.columns, size.lines) if size.columns > 0 and size.lines > 0 else None
    except (AttributeError, ValueError, OSError):
        return None


def _display_rows(text, columns):
    """How many rows `text` takes on a terminal `columns` wide, or None when that cannot be known exactly
    (a tab, or a character whose width terminals disagree on)."""
    import unicodedata
    rows = 0
    for line in text.split("\n"):
        if "\t" in line:
            return None
        width = len(line)
        if not line.isascii():
            width = 0
            for ch in line:
                if unicodedata.combining(ch):
                    continue
                kind = unicodedata.east_asian_width(ch)
                if kind == "A":
                    return None
                width += 2 if kind in ("W", "F") else 1
        rows += max(1, -(-width // columns))
    return rows


def _partial(raw):
    """What the deltas of a reply cut short said, without its thinking ("" when none came)."""
    return strip_think("".join(raw))[0].strip() if raw else ""


class RunEvents(Events):
    """`run`'s progress on stderr (a spinner with the elapsed time on a terminal); the model's interim words
    (a reply that asks for tools) dimmed. The answer itself is printed at the end (emit_result); what a reply
    cut short had said is kept for the conversation (`partial()`), as on a terminal."""

    def __init__(self, console):
        super().__init__(console)
        self.spinner = Spinner(console)
        self.answered = False  #: the answer was streamed to the terminal already (StreamedRunEvents)
        #: the current reply's text as it comes, until the loop has it whole: a piped run stopped by Ctrl-C or
        #: its time limit stored nothing of it, and answered "" (round 18c)
        self.raw = []

    def waiting(self):
        self.raw = []
        self.spinner.start("waiting for the model")

    def delta(self, text):
        self.raw.append(text)

    def retrying(self):
        self.raw = []

    def partial(self):
        return _partial(self.raw)

    def replied(self):
        self.spinner.stop()

    def stop(self):
        self.spinner.stop()

    def message(self, content, tool_calls):
        self.raw = []  # whole now: the conversation holds it
        if tool_calls and content.strip() and not self.console.quiet:
            self.console.info(content.strip(), "dim")

    def tool_start(self, name, preview):
        super().tool_start(name, preview)
        self.spinner.start(name)

    def tool_end(self, name, result):
        self.spinner.stop()
        super().tool_end(name, result)


class StreamedRunEvents(StreamedText):
    """`run` with its answer on a terminal: the words stream as they come (stdout piped: RunEvents, and the
    answer byte-exact at the end)."""

    def __init__(self, console, out):
        super().__init__(console, out, "waiting for the model")


class StreamJsonEvents(RunEvents):
    """--output-format stream-json: one JSON object per line on stdout as things happen (README: the schema).
    Progress lines stay on stderr as with the other formats."""

    def __init__(self, console):
        super().__init__(console)
        import threading
        self.lock = threading.Lock()  # parallel subagents never share a line

    def emit(self, _type, **fields):
        with self.lock:
            json_out(dict({"type": _type}, **fields))
            sys.stdout.flush()

    def usage(self, prompt, completion, estimated):
        self.emit("usage", prompt_tokens=prompt, completion_tokens=completion,
                  total_tokens=prompt + completion, estimated=estimated)

    def message(self, content, tool_calls):
        self.emit("message", role="assistant", content=content,
                  tool_calls=[{"id": c["id"], "name": c["name"]} for c in tool_calls or ()])

    def tool_call(self, call):
        self.emit("tool_call", id=call["id"], name=call["name"], arguments=_args_object(call.get("arguments")))

    def tool_result(self, call, result):
        self.emit("tool_result", id=call["id"], name=call["name"], success=bool(result.success),
                  preview=result.preview(200), error=result.error if not result.success else None)

    def progress(self, progress, step):
        super().progress(progress, step)
        if step is not None:
            done, total = progress.counts()
            self.emit("step", step=step["step"], text=step["text"], status=step["status"], added=step["added"],
                      completed=done, total=total)


# ---- A task's words and an answer's claims (what honest completion reads) ----

_CHANGES = (r"creat|writ|wrote|add|append|insert|renam|replac|chang|edit|modif|updat|fix|bump|set|delet|remov|"
            r"mov|cop|run|ran|execut|install|build|compil|sav|refactor|implement|generat|format|commit")
_LOOKS = r"count|list|find|search|read|check|show|print|open|look|summari[sz]|tell|report|explain|describe"
_claims = _task_re = None
#: what an answer that claims work says: it holds one of these (lower-cased), or '<tool_response>'
DONE_WORDS = ("created", "written", "wrote", "added", "appended", "inserted", "renamed", "replaced", "changed",
              "edited", "modified", "updated", "fixed", "bumped", "deleted", "removed", "moved", "copied", "ran",
              "run", "executed", "installed", "saved", "implemented", "generated", "formatted")
#: the letters besides ASCII's that re.IGNORECASE matches to an ASCII letter (str.lower() keeps them)
_IGNORECASE_ASCII = {0x130: "i", 0x131: "i", 0x17F: "s", 0x212A: "k"}


def _claims_re():
    """The regex of an answer that claims work, compiled when an answer first holds one of DONE_WORDS."""
    global _claims
    if _claims is None:
        import re
        done = "(%s)" % "|".join(DONE_WORDS)
        _claims = re.compile(r"<tool_response>|\b(I\s*(have|'ve)\s+(now\s+|also\s+|successfully\s+)?%s|"
                             r"I\s+(now\s+)?%s|(has|have|was|were)\s+(now\s+)?(been\s+)?(successfully\s+)?%s|"
                             r"successfully\s+%s|(file|files|changes?)\s+%s)\b" % (done, done, done, done, done),
                             re.I)
    return _claims


def _task_words():
    """The regex of what a task names: files, counts, questions, changes, look-ups and places."""
    global _task_re
    if _task_re is None:
        import re
        _task_re = re.compile(
            r"(?P<file>(^|[\s`'\"(])[\w.-]*\w\.[A-Za-z]\w{0,7}\b)|"
            r"(?P<count>\b(how many|how much|count|number of|list( all| every| the)?)\b)|"
            r"(?P<ask>\b(which|where|what('s| is| are| does)?)\b)|"
            r"(?P<change>\b(%s)\w*)|(?P<look>\b(%s)\w*)|"
            r"(?P<place>\b(files?|director(y|ies)|folders?|repo(sitory)?|project|codebase|here|tests?|scripts?|"
            r"config(uration)?|functions?|class(es)?|modules?)\b)" % (_CHANGES, _LOOKS), re.I | re.M)
    return _task_re


PLAN_FRAME = "You are assisting with the following task:"  #: how Plan.to_prompt begins (xzatoma_plans)


def intent_of(task):
    """The part of a task that says what is wanted: a plan's goal and instructions; otherwise the first three
    lines, without what @mentions and stdin pasted into it (a pasted HTTP dump said "Set-Cookie: … connect.sid",
    and was taken for a request to change a file)."""
    import re
    text = re.sub(r"\[Content of ([^\]\n]*)\]\n.*?\n\[End of \1\]", "", task or "", flags=re.S)
    if text.lstrip().startswith(PLAN_FRAME):
        return text[:8000]
    return "\n".join([line for line in text.splitlines() if line.strip()][:3])[:600]


_TASK_KINDS = {}  # task -> its kinds, for the last tasks seen (cleared at 64)


def _task_kinds(task):
    """The kinds of words a task holds (file, count, ask, change, look, place). Kept for the last few tasks: a
    run asks this of one task three times or more, and a watcher of one plan for every event (issue 22)."""
    kinds = _TASK_KINDS.get(task)
    if kinds is None:
        kinds = frozenset(m.lastgroup for m in _task_words().finditer(task))
        if len(_TASK_KINDS) >= 64:
            _TASK_KINDS.clear()
        _TASK_KINDS[task] = kinds
    return kinds


def is_question(task):
    """True for a task that only asks (what, which, how many …) and names no change to make."""
    found = _task_kinds(task or "")
    return "change" not in found and bool(found & {"ask", "count"}) and (task or "").lstrip().lower().startswith(
        ("what", "which", "where", "how", "who", "when", "why", "is ", "are ", "does ", "do ", "count", "list",
         "show", "find", "tell"))


def claims_work(answer):
    """True when an answer says something was done (created, updated, ran …) or writes a tool's result itself."""
    if not answer:
        return False
    answer = answer[:20000]
    lowered = answer.translate(_IGNORECASE_ASCII).lower()  # most answers hold none of the words: no regex
    # to compile (7 ms of a one-shot run); where one is, the regex decides
    if "<tool_response>" not in lowered and not any(word in lowered for word in DONE_WORDS):
        return False
    return _claims_re().search(answer) is not None


def needs_tools(task, answer, root=None):
    """Whether an answer needs tool work behind it: None, or (strength, kind). kind is "change" when the task
    asks to change something (or the answer says it did) and "facts" when it asks about the workspace. strength
    is "strong" when the answer claims work, or the task names an entry of the working directory (`root`),
    asks to change something written like a file name (create notes.txt) or to count what is there (how many
    files); "weak" when it asks to act on, or about, the workspace in general (fix the failing test, what is in
    app.cfg when there is none). A question the model can answer from what it knows needs none."""
    task = (task or "")[:20000]
    found = dict.fromkeys(("file", "count", "ask", "change", "look", "place"), False)
    found.update(dict.fromkeys(_task_kinds(task), True))
    asks = task.lstrip().lower().startswith(("what", "which", "where", "how", "who", "when", "why", "is ", "are ",
                                             "does ", "do "))
    kind = "change" if found["change"] and not asks else "facts"
    if claims_work(answer):
        return "strong", "change" if kind == "change" or not (found["ask"] or found["count"]) else kind
    acts = found["change"] or found["look"] or found["ask"] or found["count"]
    if (found["file"] and found["change"]) or (found["place"] and found["count"]) or _names_an_entry(task, root):
        return "strong", kind
    if (found["place"] or found["file"]) and acts:
        return "weak", kind
    return None


#: how an answer that says the work could not be done begins (lower-cased, straight apostrophes); an apology
#: counts only with a "but" after it ("I apologize for the confusion. I will now …" is filler)
APOLOGIES = ("i'm sorry", "i am sorry", "sorry", "i apologize", "i apologise")
ADMISSIONS = ("unfortunately", "i cannot", "i can't", "i can not", "i was unable", "i'm unable", "i am unable",
              "i was not able", "i couldn't", "i could not")


def admits_failure(answer):
    """Whether an answer begins by saying the task could not be done ("I'm sorry, but I can't assist with
    that.", "I apologize, but the last call … did not …"): after tool work, that is no report of work done."""
    head = (answer or "").lstrip().lower().replace("\u2019", "'")[:60]
    if head.startswith(APOLOGIES):
        return " but " in head.replace(",", " ")
    return head.startswith(ADMISSIONS)


def counts(task):
    """Whether a task asks for a figure worked out from what is read (how many, the sum …), not one read off."""
    import re
    return re.search(r"(?i)\bhow (many|much|long)\b|\bcount\b|\bnumber of\b|\b(total|sum|average|mean)\b",
                     task or "") is not None


def numbers_in(text):
    """The numbers standing alone in a text (8123, 0.25; not the 3 of qwen3 or a version's parts)."""
    import re
    return re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w]|\.\d)", text or "")


def _to_run(task, name):
    """Whether the task asks to run the entry `name` (Run count.py …): what it prints is wanted, not its text
    (handed count.py before its first turn, a 1.5B model wrote it back instead of running it, three runs of
    three)."""
    import re
    at = task.find(name)
    return at >= 0 and re.search(r"(?i)\b(run|execute|launch|invoke)\b[^.;:\n]{0,40}$", task[:at]) is not None


def _code_names(task):
    """The names of code a task speaks of, in order: `quoted` or called() words, and words written as code
    (parse_args, calcTotal); plain words are not (count, files)."""
    import re
    found = [a or b or c for a, b, c in re.findall(
        r"`([A-Za-z_][\w.]{2,})`|\b([A-Za-z_]\w{2,})\(\)|(?<![\w./-])([a-z]\w*_\w+|[a-z]+[A-Z]\w*)(?![\w/-]|\.\w)",
        task[:20000])]
    return list(dict.fromkeys(found))


def _names_an_entry(task, root):
    """True when a word of the task names an entry of the working directory (Makefile, src/app.py)."""
    return bool(_named_entries(task, root, first=True))


def _named_entries(task, root, first=False):
    """The words of a task that name entries of the working directory, in order (only the first: `first`)."""
    found = []
    if not root or not task:
        return found
    import re
    try:  # one listing for the words' first parts, not a stat of every word (each watcher event asks)
        with os.scandir(root) as listing:
            top = {entry.name for _, entry in zip(range(20000), listing)}
    except OSError:
        return found
    listed = len(top) < 20000  # else the listing was cut short: each word is looked up
    for word in dict.fromkeys(w.rstrip(".") for w in re.findall(r"[\w][\w./-]*", task[:20000])[:400]):
        head, _, rest = word.partition("/")
        if len(word) <= 2 or ".." in word.split("/") or (listed and head not in top):
            continue
        if (listed and not rest) or os.path.lexists(os.path.join(root, word)):
            found.append(word)
            if first:
                break
    return found


# ---- Agent loop ----

MAX_MALFORMED_STREAK = 3
MIN_RESULT_CAP = 2048  #: bytes: a tool result is never cut below this to fit a small window


class Turn:
    """What one model reply asks for: its words, the calls to run, and calls it tried to write but could not."""

    __slots__ = ("content", "calls", "malformed", "form", "raw")

    def __init__(self, content, calls=(), malformed=(), form=None, raw=None):
        self.content = content  #: the assistant's words (text calls taken out)
        self.calls = list(calls)  #: [{id, name, arguments}], native or recovered from the text
        self.malformed = list(malformed)  #: why each attempted call could not be read
        self.form = form  #: how the model writes calls ("tool_call", "json", …): the correction uses it
        self.raw = content if raw is None else raw  #: the reply as written (kept when nothing could run)


# Honest completion (README): a model that answers without touching a tool cannot have changed a file or
# read one. These say when an answer deserves a second look; they only ever add one model call.
NUDGE = ("You answered without doing that with the tools. If the task needs the files or the terminal (to find "
         "something out or to change something), do it now: reply with a tool call, written as "
         '{"name": "<tool name>", "arguments": {<arguments>}}. Tool results come from the tools; never write them '
         "yourself. If the task truly needs no tool, give your final answer again.")
EMPTY_ANSWER = "Error: your reply was empty. Give your final answer, or call a tool."
LEAD_IN = "Error: your reply ends with a colon and nothing after it. Give your final answer, or call a tool."
READ_NAMED_BYTES = 4096  #: the largest file read before the first turn because the task names it (read_named)
#: asked, with no tools offered, of a model stuck on a question after its tools gave it something (Agent.last_word)
SHOWN_HEAD = "What the tools showed:\n"  #: how last_word's request begins (its files count as shown)
LAST_WORD = ("Stop calling tools now: none will run. Answer the task in one or two sentences, from what the "
             "tools showed above.")
HEAT_STEP = 0.3  #: temperature added per stuck turn in a row (0.2, 0.5, 0.8, then 1.0 at most)
REPEATED_CALL = "this is the same call as your last one"
#: what a repeat of a call that changed something is told after its first result
REPEATED_CHANGE = ("That change is made: the same call again changes nothing. If the task is done, reply with one "
                   "sentence saying what you did, and no tool call; if not, make the next change.")
REPEAT_SHOWN = 1500  #: characters of a call's result shown again when the model repeats the call


def _excerpt(text, most):
    return text if len(text) <= most else text[:most] + "\n[… %d more characters]" % (len(text) - most)


def _call_key(call):
    """What makes two calls the same: the tool and its arguments as parsed (key order and spacing aside)."""
    try:
        args = json.dumps(json.loads(call.get("arguments") or "{}"), sort_keys=True)
    except (ValueError, RecursionError):
        args = call.get("arguments")
    return call["name"], args


class RunTerms:
    """The terms one Agent's run is held to: at most `max_turns` model calls, ended by `deadline` (a
    time.monotonic() value, or None; `timeout_seconds` only names it in the message), answers checked when
    `honest` (run, plan, watch: conclude), and `nested` (a subagent's) interrupts re-raised to the top."""

    def __init__(self, max_turns=100, deadline=None, timeout_seconds=None, honest=True, nested=False,
                 read_named=False, timeout_key="agent.timeout_seconds"):
        self.max_turns, self.deadline, self.timeout_seconds = max_turns, deadline, timeout_seconds
        self.timeout_key = timeout_key  #: the setting the message names (a watcher's runs: watcher.timeout_seconds)
        self.honest, self.nested = honest, nested
        self.read_named = read_named  #: the entries the task names are read before the first turn (read_named)


class Agent:
    """The loop: send the conversation with tool definitions, run the calls, stop on an answer.

    Built by Session.agent(); everything it uses comes through here. `result` may be shared by
    several agents in turn (a chat's turns); `terms` are its RunTerms, `shared` the session tree's RunParts
    (the quota, the cancel event and the metrics), or None.
    """

    def __init__(self, provider, registry, conversation, events, result, terms=None, shared=None, recorder=None,
                 review=None, on_step=None):
        terms = terms or RunTerms()
        self.provider = provider
        self.registry = registry
        self.conversation = conversation
        self.events = events
        self.result = result
        self.max_turns = terms.max_turns
        self.deadline = terms.deadline
        self.timeout_seconds = terms.timeout_seconds  #: only for the message when the deadline passes
        self.timeout_key = terms.timeout_key
        self.recorder = recorder  #: Recorder or None: the conversation's counts are saved after every step
        self.quota = shared and shared.quota  #: QuotaTracker shared by a whole tree of agents, or None
        self.cancel = shared and shared.cancel  #: threading.Event: set, this agent stops (parallel subagents, Ctrl-C)
        self.metrics = shared.metrics if shared else NULL_METRICS
        self.on_step = on_step  #: callback(agent) after each step (benchmarks)
        self.review = review  #: () -> the files that run later by design the run changed (top level), or None
        self.nested = terms.nested  #: a subagent: Ctrl-C / SIGTERM are re-raised to the top-level run's edge
        self.honest = terms.honest  #: check an answer given without any tool call (conclude)
        self.malformed_streak = 0  #: turns in a row whose calls were all malformed or invalid
        self.calls_this_run = 0  #: tool calls this run made that succeeded (the totals in `result` carry on)
        self.changes_this_run = 0  #: of them, calls of tools that change or execute (write, terminal …)
        self.nudged = False  #: asked once already to check an answer given without tools
        self.last_call = None  #: (name, arguments) of the call run last: the same again is refused as a loop
        self.asked_empty = False  #: asked once already for an answer after an empty one
        #: why the model is stuck (repeating a call, answering nothing) when it will be asked for its answer
        #: without tools (last_word); "" once that was asked
        self.stuck = None
        self.last_output = ""  #: what the last tool call gave (shown again when the model repeats the call)
        self.last_changed = False  #: the last call changed something (its repeat is told the change is made)
        self.last_again = False  #: the last call's result invites the same call once more (not a loop)
        #: path -> why its last change may not be the one meant (a tool's `doubt`), asked about before the end
        self.doubts = {}
        self.changed_well = set()  #: files changed this run with no doubt about the change
        self.line_counts = set()  #: the line counts of the files read this run (numbers a result implies)
        self.checked_ends = False  #: pointed out once already what an answer after real work left undone
        self.touched = []  #: the arguments of this run's successful calls (which files the tools reached)
        #: what this run was asked: the last person's message when it starts (for conclude)
        asked = conversation.last_user_text()
        self.task = intent_of(asked)
        self.given = "\n[End of " in asked  #: the task holds content: @mentions, or input piped to `run`
        self.read_first = terms.read_named and not self.given  #: read the entries the task names (read_named)
        #: a headless run asked only a question (how many lines …): tools that change files are refused
        self.question = self.honest and is_question(self.task)
        #: the values the task quotes that the files it names do not hold yet, and the code names it speaks of
        #: that they define (values_wanted; checked by values_missing)
        self.wanted, self.kept = self.values_wanted() if self.honest and not self.question else ([], [])

    def run(self, final=True, cancel_text="Error: interrupted"):
        """Repeat step() until an answer or a RunStop; always leaves the history consistent and saved.

        final=False (chat, subagents) records progress instead of finishing the stored conversation;
        a cancelled tool call gets `cancel_text` as its result.
        """
        startup_over()
        if self.recorder is None:
            return self._run(final, cancel_text)
        with self.recorder.held():  # a step's writes in one transaction, flushed before each wait (Recorder)
            try:
                return self._run(final, cancel_text)
            finally:
                self.recorder.settle()  # a task held for the verdict on its size is stored, however the run ended

    def _run(self, final, cancel_text):
        started = time.monotonic()
        result = self.result
        result_turns = result.turns  # the turn limit counts this run's turns; the totals carry on
        caught = None
        try:
            try:
                if self.read_first:
                    self.read_named()
                outcome = None
                while outcome is None:
                    self.check_limits(result.turns - result_turns)
                    outcome = self.step()
            except KeyboardInterrupt as exc:  # the edge where signals join the stop family (see Interrupts)
                caught = exc
                raise Interrupted("interrupted (Ctrl-C)")
            except Terminated as exc:
                caught = exc
                name = exc.args[0] if exc.args else "SIGTERM"
                raise Interrupted("terminated (%s)" % name, EXIT_HANGUP if name == "SIGHUP" else EXIT_TERMINATED)
            result.status = outcome
            result.exit_code = EXIT_UNVERIFIED if outcome == "unverified" else EXIT_OK
        except RunStop as stop:
            result.status, result.exit_code, result.error = stop.status, stop.exit_code, str(stop)
            result.unreachable = getattr(stop, "unreachable", False)
        finally:
            self.conversation.close_dangling(cancel_text if result.status == "interrupted"
                                             else "Error: not run (the task ended)")
            result.duration = time.monotonic() - started
            if final and self.review is not None:
                result.review = self.review()
            if self.recorder is not None:
                if final:
                    self.recorder.finish(result)
                else:
                    self.recorder.progress(result)
            if final:
                self.metrics.run_finished(result)
        if caught is not None and self.nested:
            raise caught
        return result

    def check_limits(self, turns):
        if turns >= self.max_turns:
            raise MaxTurns("stopped after %d turns without a final answer (agent.max_turns); "
                           "raise it with --max-turns or simplify the task" % self.max_turns)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise self.timed_out()
        self.check_cancel()

    def check_cancel(self):
        if self.cancel is not None and self.cancel.is_set():
            raise Interrupted("cancelled")

    def timed_out(self):
        if self.timeout_seconds:
            return Timeout("timed out after %ss (%s); raise it with --timeout" % (self.timeout_seconds,
                                                                                  self.timeout_key))
        return Timeout("the parent run's time limit was reached (%s)" % self.timeout_key)

    def step(self):
        """One turn: ask the model, then act on what it said. Returns how the run ends once the task is
        answered ("completed", or "unverified": see conclude), None to go on."""
        try:
            turn = self.ask_model()
            if turn.calls:
                self.run_tools(turn.calls)
            elif turn.malformed:
                self.correct(turn)
            else:
                return self.conclude(turn.content)
            return self.last_word() if self.stuck else None
        finally:
            self.save()

    # -- the first half: ask the model --
    def ask_model(self):
        """Send the conversation; returns the Turn it answered. Its message is recorded here."""
        conv = self.conversation
        # INFO: what pruning cannot cut (the task itself) is never sent over twice the window: Ollama cuts such a
        # prompt silently, other servers refuse it, and an event's Markdown plan of 1.6 million steps was an 18 MB
        # request (attack round 15a). The task alone: a later turn that big is the server's to refuse, and the loop
        # prunes for it (refused here, a chat lost its recent turns and a run its big tool results, round 15d).
        # A message that may be so refused waits in the Recorder for the verdict, and is stored cut if refused (a
        # 7 MB plan was stored whole for every event, round 15c).
        self.flush()  # the window may be asked of the server: a wait
        window = self.provider.context_window() if conv.tokens > 4096 else None
        if conv.prune(window):
            self.events.note("  context pruned to fit the window (%d tokens now)" % conv.tokens)
        # INFO: the model's window when the server says it, not the larger of it and max_tokens: 128,000 tokens
        # went whole to a model of 4,096 (round 16a); the budget only when the window is not known
        room = window or conv.max_tokens
        if conv.tokens > 2 * room and conv.head_tokens() > 2 * room:
            why = ("the task is about %s tokens, more than twice what the model can take (%s), and pruning never "
                   "cuts the task" % (_fmt_tokens(conv.head_tokens()), _fmt_tokens(room)))
            conv.cut_task("\n[… %%s more characters not sent: %s]" % why)
            raise RunStop(why + ("; shorten it, or use a model with a larger window" if window else
                                 "; shorten it, or raise agent.conversation.max_tokens"))
        if self.recorder is not None and self.recorder.hold_over is not None:
            self.recorder.settle()
            self.flush()
        # INFO: a small model that repeats a call or answers nothing is stuck on its likeliest words; the next
        # request samples hotter (the run's preferred temperature only: one the person set is theirs), and
        # the first good turn cools it again
        stuck = self.malformed_streak + (conv.messages[-1].get("content") == EMPTY_ANSWER)
        self.provider.heat = HEAT_STEP * stuck
        tools = self.registry.definitions()
        if self.question:  # a headless question is answered by reading: a 1.5B model offered write_file used it
            tools = [t for t in tools if getattr(self.registry.get(t["name"]), "permission", "read") != "write"]
        sent = conv.sent_estimate(tools)
        reply = self.complete(tools)
        self.check_cancel()
        self.account(reply, sent)
        if self.quota is not None:
            self.quota.check()  # after each model call: the whole tree's tokens and time
        conv.calibrate(reply.usage.get("prompt_tokens"))
        content, thinking = strip_think(reply.content)
        self.events.thinking("\n".join(t for t in (reply.thinking, thinking) if t))
        turn = Turn(content, reply.tool_calls)
        if not turn.calls and tools:
            written = find_text_tool_calls(content, conv.read_so_far)
            if written is not None and (written.calls or written.malformed):
                # only the first written call runs: the rest of the reply, later calls included, was written
                # before any result (a grep for a line the model imagined, a file rewritten from a guess)
                turn = Turn(written.prose, [dict(c, id=tool_call_id(len(conv.messages), i, c["name"], c["arguments"]))
                                            for i, c in enumerate(written.calls[:1])],
                            ["your tool call could not be read: " + why for why in written.malformed],
                            written.form, raw=content)
                if written.calls:
                    self.events.thinking("written before any result, not kept: " + written.after)
        if reply.finish_reason == "repetition" and not turn.calls:
            turn.malformed.append("your reply kept repeating itself and was cut off; write one tool call, or a "
                                  "short answer")
        self.events.message(turn.content, turn.calls)
        if turn.calls:
            conv.add_assistant(turn.content, turn.calls)
        else:
            # INFO: an empty reply is not kept: a 1.5B model that read its own empty turn back answered empty
            # again, and again when asked for its answer with no tools (recorded, llama-cpp-python)
            if turn.raw.strip() or turn.malformed:
                conv.add_assistant(turn.raw)
            if not turn.malformed and reply.finish_reason == "length":
                self.result.answer = turn.content
                raise ProviderFailed("the model's answer was cut off (finish reason 'length': the output or "
                                     "context limit was reached); the partial answer is not a success")
        return turn

    # -- when the reply holds no call that can run --
    def correct(self, turn):
        """A call the model tried to write but that cannot be read: tell it what was wrong and how to write
        one; the malformed streak stops a model that never gets it right."""
        tools = ", ".join(sorted(self.registry.names()))
        self.conversation.add({"role": "user", "name": NOTE, "content":
                               "Error: %s. To call a tool, write exactly:\n%s\nAvailable tools: %s." % (
                                   "; ".join(turn.malformed[:3]), call_format_hint(turn.form), tools)})
        self.events.note("  %s; told the model how to write a call" % one_line(turn.malformed[0], 100))
        self.count_malformed(True, turn.malformed[0])

    def conclude(self, answer):
        """An answer without a call. A task that asks for a change needs a change made with a tool (write,
        execute) in this run, a question about the workspace a tool call of any kind: without them the model
        may be answering from memory, and it is asked once to check (README, "Honest completion"). Still
        without them, a task that named files or an answer that claims work ends "unverified"."""
        self.result.answer = answer
        if self.parrots(answer):  # a lost small model answered with XZatoma's own correction: no answer either
            self.events.note("  the model answered with XZatoma's own message")
            answer = self.result.answer = ""
        # a headless answer that stops at its lead-in ("…you can use the following command:") gives nothing
        lead_in = self.honest and answer.rstrip().endswith(":")
        if not answer.strip() or lead_in:  # nothing said (only thinking, or a model lost after failed calls)
            what = "a reply that stops at a colon" if lead_in else "an empty reply"
            if self.may_answer_now():  # a question its tools already answered: asked afresh, without them
                self.stuck = "the model gave no answer (%s)" % what
                return self.last_word()
            if not self.asked_empty:
                self.asked_empty = True
                self.conversation.add({"role": "user", "name": NOTE, "content": LEAD_IN if lead_in else EMPTY_ANSWER})
                self.events.note("  the model gave no answer (%s); asking it once for one" % what)
                return None
            if not self.changes_this_run:
                raise ProviderFailed("the model gave no answer (%s, after it was asked for one)" % what)
            if self.honest:  # it changed files, then never said the work was done (then parroted the question)
                raise StuckAfterWork("the model changed files, then gave no answer (%s); the changes stand, "
                                     "unchecked" % what)
            return "completed"
        if self.honest and admits_failure(answer) and self.may_answer_now():  # "I'm sorry, but I can't assist…"
            self.stuck = "the model's answer says it could not do the task"  # after its tools answered it
            return self.last_word()
        if self.question and self.registry.schemas and self.may_answer_now():
            # INFO: a small model's answer to a question is read again from what the tools showed, in a fresh
            # request (last_word): after a listing that said "(7 .md files …)", a 1.5B model read one of the
            # files, grepped it, and answered what that file held, three runs in a row
            self.stuck = "a small model answered a question"
            return self.last_word(fallback=answer)
        need = needs_tools(self.task, answer, self.registry.ctx.root) if self.honest and len(self.registry) else None
        if need is None:
            return "completed"
        strength, kind = need
        provided = kind == "facts" and self.given  # @file mentions or piped input: the facts were given
        if provided or (self.changes_this_run if kind == "change" else self.calls_this_run):
            if self.checked_ends:
                left = self.unsettled(kind, answer)
                if left:  # asked to check, the model answered again without settling it
                    self.result.warnings.append("%s; the model was asked to check and answered without "
                                                "changing it (status unverified)" % left)
                    return "unverified"
            loose = None if self.checked_ends else self.loose_ends(kind, answer)
            if loose:  # work was done, but the answer claims more, or a file the task names was never touched
                self.checked_ends = True
                self.conversation.add({"role": "user", "name": NOTE, "content": loose})
                self.events.note("  the answer may leave work undone or be unfounded; asking the model once to "
                                 "check: %s" % one_line(loose, 120))
                return None
            return "completed"  # the work is there (what the model imagines after it does not undo it)
        if not self.nudged:
            self.nudged = True
            self.conversation.add({"role": "user", "name": NOTE, "content": NUDGE})
            self.events.note("  the answer claims or needs tool work this run did not do; asking the model once "
                             "to check")
            return None
        if strength == "strong":
            self.result.warnings.append(
                "the model answered without %s with a tool, so what it says it did or found was not checked "
                "(status unverified)" % ("making any change" if kind == "change" else "looking anything up"))
            return "unverified"
        return "completed"

    def parrots(self, answer):
        """Whether the answer is XZatoma's own words repeated back: one of the corrections it sent this run (an
        `Error: …` line of a note or a refused call, whole), or an answer that is mostly one stretch of a note
        ("The final answer is that the task names main.py, which no tool has read …"). A tool's error quoted
        in an answer may be the answer (why did the subagent fail?): only a whole one is a parrot."""
        text = answer.strip()
        notes = [m["content"] for m in self.conversation.messages if isinstance(m.get("content"), str) and (
            m.get("name") == NOTE or (m.get("role") == "tool" and m["content"].startswith("Error: ")))]
        if text.startswith("Error: ") and any(text in said for said in notes):
            return True
        ours = [m["content"] for m in self.conversation.messages
                if m.get("name") == NOTE and isinstance(m.get("content"), str)]
        if not 40 <= len(text) <= 600:  # a copied stretch is judged in short answers only (the matcher is O(n·m))
            return False
        import difflib
        for said in ours:
            match = difflib.SequenceMatcher(None, text, said[:4000], autojunk=False).find_longest_match(
                0, len(text), 0, min(len(said), 4000))
            if match.size >= 40 and match.size * 2 >= len(text):
                return True
        return False

    def unseen_numbers(self, answer):
        """The numbers of a fact answer that neither the task nor any tool result of this run showed."""
        if self.given or counts(self.task):  # facts given (@mentions, piped input); a count is worked out
            return []
        seen = set(self.line_counts).union(numbers_in(self.task))  # derived here, once, not at every tool call
        for message in self.conversation.messages:  # what the tools gave, and what last_word showed again
            if message.get("role") == "tool" or (message.get("name") == NOTE and isinstance(message.get("content"), str)
                                                 and message["content"].startswith(SHOWN_HEAD)):
                seen.update(numbers_in(message.get("content")))
        # the answer redacted as the tool results were: a credential's digits were never shown
        return [n for n in dict.fromkeys(numbers_in(xzatoma_store.redact(answer, shapes=False))) if n not in seen]

    def standing_doubts(self):
        """The doubts about this run's changes that the task's words do not explain: a whitespace-only change
        where the task says nothing of spacing or format, a file's lines gone where it asks for no rewrite; a
        line break written out as `\\n` always stands."""
        import re
        spacing = re.search(r"(?i)\b(white ?space|blank|indent\w*|format\w*|spac\w*|newlines?|trailing|tabs?|"
                            r"line endings?|wrap\w*|reflow\w*|lint\w*)\b", self.task or "")
        # lines gone stand unless the task asks for new content in place of the old (a bump of one field
        # that wrote {"version": "2.4.1"} over package.json is not one)
        rewrite = re.search(r"(?i)\b(replac\w*|overwrit\w*|rewrit\w*|writ\w*|creat\w*|clear\w*|empty|reset|"
                            r"truncat\w*|wipe\w*|only|just)\b", self.task or "")
        # lines an edit removed stand where the task only adds (add, append, insert) and names no change of
        # what is there: asked to add a line at the end, a 1.5B model replaced the first one with it
        adds = re.search(r"(?i)\b(add|append|insert|prepend)\w*", self.task or "") and not re.search(
            r"(?i)\b(replac|remov|delet|renam|chang|fix|updat|modif|edit|rewrit|bump|set|mov|sort|dedup)\w*",
            self.task or "")
        # text an empty old_text appended stands only where the task puts it elsewhere: asked for a line at the
        # top, a 1.5B model appended it and said it was at the top
        elsewhere = re.search(r"(?i)\b(top|beginning|start|first line|prepend\w*|before|above)\b", self.task or "")
        excused = {"spacing": spacing, "lines gone": rewrite, "edit lines gone": not adds, "appended": not elsewhere}
        return [d for d in self.doubts.values() if not excused.get(xzatoma_store.doubt_kind(d))] + \
            self.values_missing()

    def values_wanted(self):
        """(wanted, kept): the values a task quotes ('buy milk', "## 1.0.0") or writes as a decimal or a version
        (75.0, 2.4.1) that no file it names holds before the run, which a change that did the task holds
        afterwards; and the code names it speaks of (add(), `calc_total`) that those files define, which a
        change that does not rename or remove them keeps (told add() subtracts, a model renamed it). The
        files are read only when the task quotes or names something (a watcher's plan rarely does)."""
        import re
        task = self.task or ""
        found = [m.group(2) for m in re.finditer(r"(?:^|(?<=[\s(:=]))(['\"])([^'\"\n]{1,80})\1(?=[\s.,;:!?)]|$)",
                                                  task)]
        found += re.findall(r"(?<![\w.])\d+(?:\.\d+)+(?![\w]|\.\d)", task)
        # what a rename, change or set is "to" (cnt to count, the port to 9090): a held-out run wrote stats.py back
        # as it was after an edit that doubled a line, said cnt was renamed, and ended completed
        found += [m.group(1) for m in re.finditer(
            r"(?i)\b(?:renam|chang|set|bump|updat|replac)\w*\b(?:[^.;\n]|\.(?=\w)){0,80}?\bto\s+`?([\w$][\w.$/-]*?)`?"
            r"(?=[.,;:!?](?:\s|$)|$|\s+(?:in|for|everywhere)\b)", task)]
        spoken = [] if re.search(r"(?i)\b(renam|remov|delet|replac|drop|rewrit)\w*", task) else [
            a or b for a, b in re.findall(r"`([A-Za-z_]\w{2,})`|\b([A-Za-z_]\w{2,})\(\)", task)]
        if not found and not spoken:
            return [], []
        named = _named_entries(task, self.registry.ctx.root)
        before = "\n".join(self._text_of(name) for name in named[:10])
        wanted = [v for v in dict.fromkeys(found) if v.strip() and v not in before and v not in named][:10]
        kept = [n for n in dict.fromkeys(spoken) if re.search(r"\b%s\b" % re.escape(n), before)][:10]
        return wanted, kept

    def values_missing(self):
        """The wanted values (values_wanted) that no file the run changed or the task names holds now: asked to
        make an assert expect 75.0, a 1.5B model wrote 80.0 and said the task was done."""
        if not self.wanted and not self.kept:
            return []
        names = list(dict.fromkeys(list(self.changed_well) + list(self.doubts) +
                                   _named_entries(self.task, self.registry.ctx.root)))
        now = "\n".join(self._text_of(name) for name in names[:20])
        import re
        missing = [v for v in self.wanted if v not in now]
        gone = [n for n in self.kept if not re.search(r"\b%s\b" % re.escape(n), now)]
        return (["the task names %s, which no file the run changed holds" % ", ".join(
            repr(v) for v in missing[:3])] if missing else []) + (
            ["%s, which the task names, is gone from the files it names" % ", ".join(gone[:3])] if gone else [])

    def _text_of(self, name):
        """A small regular file's text, read through the jail ("" for anything else)."""
        import stat
        try:
            with self.registry.ctx.jail.resolve(name, must_exist=True) as target:
                st = target.lstat()
                if st is None or not stat.S_ISREG(st.st_mode) or st.st_size > 262144:
                    return ""
                return xzatoma_tools.read_text(target, "")
        except (xzatoma_tools.ToolError, OSError, ValueError):
            return ""

    def unsettled(self, kind, answer):
        """What still stands after the model was asked to check its work: None, or why the run is unverified."""
        if admits_failure(answer):
            return "the model's answer says the task could not be done"
        if kind == "facts":
            unseen = self.unseen_numbers(answer)
            return "the answer gives %s, which no tool result showed" % ", ".join(unseen[:3]) if unseen else None
        doubts = self.standing_doubts() if kind == "change" else None
        if doubts:
            return "; ".join(doubts[:3])
        missed = self.missed_entries() if kind == "change" else None
        return "the task names %s, which no tool read or changed" % ", ".join(missed[:5]) if missed else None

    def missed_entries(self):
        """The entries of the working directory the task names that no successful call of this run reached: by
        a path argument naming it, inside it or above it (a grep of its directory), or in a command's words.
        (Compared as paths, not as text: a 1.5B model created src/stats.py where the task named stats.py.)"""
        root, reached, commands = self.registry.ctx.root, [], []
        for raw in self.touched:
            try:
                args = json.loads(raw or "{}")
            except (ValueError, RecursionError):
                continue
            if not isinstance(args, dict):
                continue
            commands += [v for k, v in args.items() if k == "command" and isinstance(v, str)]
            reached += [os.path.normpath(os.path.join(root, v)) for k, v in args.items()
                        if k in ("path", "source_path", "destination_path") and isinstance(v, str)]
        said = "\n".join(commands)
        missed = []
        for name in _named_entries(self.task, root):
            entry = os.path.normpath(os.path.join(root, name))
            if name not in said and not any(r == entry or r.startswith(entry + "/") or entry.startswith(r + "/")
                                            for r in reached):
                missed.append(name)
        return missed

    def loose_ends(self, kind, answer):
        """What an answer after real work may still have left undone, as a note to the model (or None): a tool
        result it wrote itself ("<tool_response> Updated main.py" where no tool touched main.py), or, for a
        change, a file the task names that no tool of this run read or changed."""
        if "<tool_response>" in answer:
            return ("You wrote a tool result yourself; results come only from the tools. If the task is not "
                    "finished, continue with a tool call; if it is, give your final answer without it.")
        if admits_failure(answer):
            return ("Your answer says the task could not be done. If it is not done, continue with a tool call; "
                    "if it is done, give your final answer again and say so.")
        unseen = self.unseen_numbers(answer) if kind == "facts" else None
        if unseen:  # a small model grepped for the wrong key, found nothing, and answered "port 80"
            return ("Your answer gives %s, which no tool result of this run shows. Check it with a tool "
                    "(read_file shows a whole file) before you answer; if it is right, give your final "
                    "answer again." % ", ".join(unseen[:3]))
        doubts = self.standing_doubts() if kind == "change" else None
        if doubts:
            return ("Check your work before you answer: %s. If that is what the task asks, give your final answer "
                    "again; if not, fix it with a tool call." % "; ".join(doubts[:3]))
        if kind == "change":
            missed = self.missed_entries()
            if missed:
                return ("The task names %s, which no tool has read or changed in this run. If the task needs "
                        "it, continue with a tool call; if not, give your final answer again." % ", ".join(missed[:5]))
        return None

    def complete(self, tools, messages=None):
        """One model call (of the conversation, or of `messages`); provider failures and the deadline become the
        stop family. A server that refuses the conversation as over its context window names the window: it is
        believed, the conversation pruned to it, and the request sent once more."""
        self.flush()
        self.provider.interrupt = self.cancel  # a cancelled run does not wait for the model's answer
        try:
            return self._complete(tools, messages)
        finally:
            self.provider.interrupt = None  # the provider's other callers (a probe, /models) are not this run's

    def _complete(self, tools, messages):
        conv = self.conversation
        for attempt in (1, 2):
            self.events.waiting()
            self.provider.on_retry = self.events.retrying
            try:
                return self.provider.complete(conv.messages if messages is None else messages, tools,
                                              on_delta=self.events.delta, deadline=self.deadline,
                                              estimated_tokens=conv.tokens if messages is None else 0)
            except DeadlineExceeded:
                raise self.timed_out()
            except ProviderError as exc:
                self.check_cancel()  # cut off because the run was cancelled: interrupted, not a failed model
                self.metrics.model_request(self.provider.name, "error")
                if exc.window and attempt == 1 and messages is None and conv.prune(exc.window, force=True):
                    self.provider.learn_window(exc.window)
                    self.events.note("  the server's context window is %d tokens: context pruned to fit (%d tokens "
                                     "now)" % (exc.window, conv.tokens))
                    continue
                raise ProviderFailed(str(exc), exc.exit_code, unreachable=exc.unreachable)
            finally:
                self.events.replied()

    def account(self, reply, sent):
        """A reply's tokens (our estimate where the server sent none; `sent`: the request's estimate) into the
        run's totals, the metrics and the shared quota. The one place tokens are counted."""
        prompt, completion, estimated = reply_usage(reply, sent)
        result = self.result
        result.turns += 1
        result.estimated |= estimated
        result.prompt_tokens += prompt
        result.completion_tokens += completion
        self.metrics.model_request(self.provider.name, "ok")
        self.metrics.tokens(prompt, completion)
        self.events.usage(prompt, completion, estimated)
        if self.quota is not None:
            self.quota.add_tokens(prompt + completion)

    # -- the second half: run the tools --
    def run_tools(self, calls):
        conv, result = self.conversation, self.result
        invalid, last_error = 0, None
        for call in calls:
            self.check_cancel()
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise self.timed_out()  # a tool call's own limits are capped by the run's, but none starts late
            self.events.tool_call(call)
            self.events.tool_start(call["name"], self._preview(call))
            same = _call_key(call)
            tool = self.registry.get(call["name"])
            if same == self.last_call and not self.last_again:  # a loop (the same failing grep three times)
                # its result again, shortly: a small model that repeats a call has lost sight of what it gave
                # (a change made: a small model wrote CHANGES.md as the plan asked, then the same again and again,
                # not knowing how to say it was done)
                tool_result = xzatoma_tools.ToolResult.fail(REPEATED_CALL + ", which gave:\n%s\n%s" % (
                    _excerpt(self.last_output, REPEAT_SHOWN), REPEATED_CHANGE if self.last_changed else
                    "Answer from that, or do something different (another tool, or other arguments)"), invalid=True)
            elif self.question and getattr(tool, "permission", "read") == "write":
                # a small model asked a line count rewrote the file
                tool_result = xzatoma_tools.ToolResult.fail(
                    "the task asks a question and does not ask to change any file: answer it from what you read "
                    "(read_file, grep, list_directory)")
            else:
                self.flush()  # what led to the call is stored before it runs (a command may run for an hour)
                tool_result = self.registry.execute(call["name"], call["arguments"], call_id=call["id"])
            if same != self.last_call or self.last_again:  # a refused repeat keeps the result it repeated
                self.last_output = tool_result.output if tool_result.success else "Error: %s" % tool_result.error
                self.last_changed = tool_result.success and getattr(tool, "permission", "read") == "write"
            self.last_again = bool(tool_result.metadata.get("again"))
            self.last_call = same
            if len(tool_result.output) > MIN_RESULT_CAP:
                tool_result.truncate(self.result_cap())
            result.tool_calls += 1
            self.metrics.tool_call(call["name"], "ok" if tool_result.success else "error")
            conv.add_tool_result(call["id"], call["name"], tool_result.to_message())
            self.events.tool_end(call["name"], tool_result)
            self.events.tool_result(call, tool_result)
            if tool_result.metadata.get("invalid"):
                invalid += 1
                last_error = tool_result.error
            elif tool_result.success and not tool_result.metadata.get("bookkeeping"):  # progress, skills: no work
                # INFO: a command that failed (exit 2 and over: trouble, where 1 is often an answer, as grep's "no
                # match") and printed nothing showed nothing of the workspace, as a read_file error does not:
                # after `ls src/parser.js` (exit 2) a 1.5B model answered "Which file defines Parser?" with
                # "src/parser.js does not exist", completed (bench/tasks.py --set fresh)
                code = tool_result.metadata.get("exit_code")
                self.calls_this_run += not (isinstance(code, int) and code >= 2 and
                                            tool_result.metadata.get("printed") is False)
                self.touched.append(call.get("arguments") or "")
                self.changes_this_run += getattr(tool, "permission", "read") != "read"
                if isinstance(tool_result.metadata.get("lines"), int):
                    self.line_counts.add(str(tool_result.metadata["lines"]))
                changed, doubt = tool_result.metadata.get("changed"), tool_result.metadata.get("doubt")
                if doubt and not (changed in self.changed_well and xzatoma_store.doubt_kind(doubt) == "spacing"):
                    self.doubts[changed] = doubt  # (a file changed well already may be tidied: a last newline)
                elif changed and not doubt:  # a later change of that file settles it
                    self.doubts.pop(changed, None)
                    self.changed_well.add(changed)
        self.count_malformed(invalid == len(calls), last_error)

    def count_malformed(self, malformed, last_error):
        """A turn whose calls were all malformed or invalid extends the streak; one good call ends it."""
        self.malformed_streak = self.malformed_streak + 1 if malformed else 0
        if self.malformed_streak >= MAX_MALFORMED_STREAK and self.changes_this_run and \
                (last_error or "").startswith(REPEATED_CALL):
            # a small model wrote CHANGES.md as the plan asked, then wrote it again and again: the work is
            # there but the model never said it was done
            raise StuckAfterWork("the model repeated its last call %d times after changing files; stopped there "
                                 "(the changes stand, unchecked)" % self.malformed_streak)
        if self.malformed_streak >= MAX_MALFORMED_STREAK and self.may_answer_now():
            self.stuck = "the model repeated its call %d times" % self.malformed_streak  # step() asks last_word
            return
        if self.malformed_streak >= MAX_MALFORMED_STREAK:
            raise ProviderFailed("the model made %d malformed or invalid tool calls in a row; stopping (last: %s). "
                                 "A larger model may follow the tool format better" % (self.malformed_streak,
                                                                                      last_error))

    def read_named(self, most=3):
        """Before the first turn: the small files (READ_NAMED_BYTES) the task names read and the directories it
        names listed, as the model's own read_file and list_directory calls (aider adds the files a person
        names to the chat); a task that names no entry but speaks of code (parse_args, `calc_total`, add())
        has its names searched for with grep (a little of aider's repository map). They run as any call does
        (the jail, the protected paths), are shown and stored as calls, and count as looked up, but not as the
        model reaching a file the task names (missed_entries).
        INFO: a 1.5B model that had not read a file guessed at it: it searched /app.yaml for a key it imagined,
        edited `port: 8080` in a JSON file, and renamed add() to subtract() where add() subtracted; asked which
        file defines parse_args, it read functions.py, which does not exist, and said so."""
        import stat
        ctx, wanted = self.registry.ctx, []
        named = _named_entries(self.task, ctx.root)
        for name in [n for n in named if not _to_run(self.task, n)][:most]:
            try:
                with ctx.jail.resolve(name, must_exist=True) as target:
                    st, real = target.lstat(), target.real
            except (xzatoma_tools.ToolError, OSError):
                continue
            if st is not None and stat.S_ISDIR(st.st_mode):
                wanted.append(("list_directory", {"path": name}))
            elif st is not None and stat.S_ISREG(st.st_mode) and st.st_size <= READ_NAMED_BYTES and \
                    real not in ctx.seen:
                wanted.append(("read_file", {"path": name}))
        if not named:
            wanted += [("grep", {"pattern": name, "fixed_string": True, "max_results": 20})
                       for name in _code_names(self.task)[:2]]
        wanted = [(tool, args) for tool, args in wanted if tool in self.registry.names()]
        calls = [{"id": tool_call_id(len(self.conversation.messages), i, tool, json.dumps(args)), "name": tool,
                  "arguments": json.dumps(args)} for i, (tool, args) in enumerate(wanted)]
        if calls:
            self.events.note("  looking first at what the task names: %s" % ", ".join(
                one_line(args.get("path") or args["pattern"], 80) for _, args in wanted))
            self.conversation.add_assistant("", calls)
            reached = len(self.touched)
            self.run_tools(calls)
            del self.touched[reached:]
            self.last_call = None  # the model's own read of them again is no loop

    def may_answer_now(self):
        """Whether a stuck model may be asked for its answer without tools (last_word): once, in a task that asks
        for no change, after tools of this run gave it something to answer from."""
        # (a headless question's commands are reads: its write tools are refused, and `run` runs only the
        # read-only allowlist unless told otherwise)
        return self.stuck is None and self.calls_this_run > 0 and (self.question or not self.changes_this_run) \
            and "change" not in _task_kinds(self.task)

    def last_word(self, fallback=None):
        """A model stuck on a question (the same grep again and again, empty replies) after its tools showed it
        the answer: one more call with no tools offered, asking for the answer (smolagents asks so at its step
        limit). The answer is checked like any other (numbers no tool showed: unverified); none fails the run,
        unless there is a `fallback` (the model's own answer, which the fresh one would have replaced)."""
        why, self.stuck = self.stuck, ""
        self.events.note("  %s; asking it for its answer with no tools offered" % why)
        # INFO: asked in a fresh request (the task and what the tools showed, once each), not at the end of the
        # conversation: there a 1.5B model read its repeated calls and empty turns back and answered empty again
        # (the task last, just before the answer: asked first, a 1.5B model counted 6 where the listing it was
        # shown said "7 .md files")
        asked = {"role": "user", "content": "%s%s\n\nThe task: %s\n\n%s" % (
            SHOWN_HEAD, self.shown(), self.task, LAST_WORD)}
        self.conversation.add(dict(asked, name=NOTE))
        reply = self.complete([], [asked])
        self.account(reply, estimate_tokens(asked))
        text = strip_think(reply.content)[0].strip()
        written = find_text_tool_calls(text)
        if written is not None:  # a call written anyway runs nowhere: its prose, if any, is the answer
            text = written.prose
        if not text or self.parrots(text) or text.strip() == LAST_WORD:
            if not fallback:
                raise ProviderFailed(why + "; asked for its answer with no tools, it gave none")
            text = fallback
        self.conversation.add_assistant(text)
        self.events.message(text, [])
        self.result.answer = text
        unseen = self.unseen_numbers(text)
        if unseen:
            self.result.warnings.append("the answer gives %s, which no tool result showed (status unverified)"
                                        % ", ".join(unseen[:3]))
            return "unverified"
        return "completed"

    def shown(self, most=12000):
        """What this run's tools showed, for last_word: each distinct result once (errors too: "no such file …
        did you mean src/tokenizer.py?" answers a question), under the call that gave it, the latest kept when
        they are more than `most` characters together."""
        calls, blocks, seen = {}, [], set()
        files = self.small_files_read()
        for message in self.conversation.messages:
            for call in message.get("tool_calls") or ():
                calls[call["id"]] = "%s %s" % (call["name"], call.get("arguments") or "")
            said = message.get("content")
            if message.get("role") == "tool" and isinstance(said, str) and \
                    not said.startswith("Error: " + REPEATED_CALL) and said not in seen:
                seen.add(said)
                # a whole small file read is shown as one, with its line count (read before the first turn,
                # data.csv lost its "12 lines", and asked afresh a 1.5B model counted 13)
                blocks.append(files.pop(said, None) or "[%s]\n%s" % (one_line(calls.get(
                    message.get("tool_call_id"), message.get("name")), 200), _excerpt(said.rstrip("\n"), most // 3)))
        blocks += files.values()  # (each popped above when a result showed it)
        while len(blocks) > 1 and sum(len(b) for b in blocks) > most:
            blocks.pop(0)
        return "\n\n".join(blocks)

    def small_files_read(self, most=3):
        """{read_file's output: its block}: the small files (up to GREP_WHOLE bytes) the task and this run's reads
        and greps named, whole, as read_file gives them, under their line count (a model that grepped app.yaml
        for a key it imagined never saw the one there; grep's "settings.ini:2: port = 5432 / :6: port = 8123"
        lost the [server] line above 8123, and a 1.5B model answered 5432; the file shows which port is in which
        section)."""
        import stat
        blocks, named = {}, list(_named_entries(self.task, self.registry.ctx.root))  # the task's own, then
        for message in self.conversation.messages:
            for call in message.get("tool_calls") or ():
                if call["name"] in ("read_file", "grep"):
                    try:
                        path = json.loads(call.get("arguments") or "{}").get("path")
                    except (ValueError, AttributeError, RecursionError):
                        continue
                    if isinstance(path, str) and path not in named:
                        named.append(path)
        for path in named[:most]:
            try:
                with self.registry.ctx.jail.resolve(path, must_exist=True) as target:
                    st = target.lstat()
                    small = st is not None and stat.S_ISREG(st.st_mode) and st.st_size <= xzatoma_tools.GREP_WHOLE
            except (xzatoma_tools.ToolError, OSError):
                continue
            result = self.registry.execute("read_file", json.dumps({"path": path})) if small else None
            if result is not None and result.success:
                blocks.setdefault(result.output, "[the file %s, whole: %s lines]\n%s" % (
                    one_line(path, 200), result.metadata.get("lines"), result.output.rstrip("\n")))
        return blocks

    def result_cap(self):
        """Bytes of one tool result the model gets: a quarter of its window where the window is known (a 100 KB
        file read into an 8k window left room for nothing else), else only the tools' own cap. At about four
        bytes a token, a quarter of a window of N tokens is N bytes."""
        window = self.provider.context_window()
        return max(MIN_RESULT_CAP, int(window)) if window else None

    def summarise(self, prompt):
        """One more model call, without tools: a subagent's report. Counted like every other call."""
        self.conversation.add_user(prompt)
        sent = self.conversation.sent_estimate()
        reply = self.complete([])
        self.account(reply, sent)
        text = strip_think(reply.content)[0]
        if text:
            self.conversation.add_assistant(text)
        return text

    def flush(self):
        """Before a wait (the model, a tool): what the run said so far goes to the store."""
        if self.recorder is not None:
            self.recorder.flush()

    def save(self):
        if self.recorder is not None:
            self.recorder.progress(self.result)
        if self.on_step:
            self.flush()  # a callback may do anything, wait too: it sees the store as it is at a wait
            self.on_step(self)

    def _preview(self, call):
        tool = self.registry.get(call["name"])
        try:
            args = json.loads(call["arguments"] or "{}")
        except ValueError:
            return call["arguments"] or ""
        if tool is not None and isinstance(args, dict):
            return tool.preview_args(args)
        return call["arguments"] or ""


# ---- Plan progress: a task's steps, and the one tool that marks them ----
# Seed 001 (update 6) draws a plan's progress as "Completed 2/4 instructions" with ✓ done, ⧗ in progress and
# ○ pending. A plan's instructions are its steps (fixed: the model marks them, it cannot add any); a free task
# starts with none and the model adds the steps it will take. The Session shows each change on stderr, streams
# it (--output-format stream-json), stores it with the conversation and puts the list in --json and the
# watcher's result.

PENDING, IN_PROGRESS, DONE = "pending", "in_progress", "done"
STEP_MARKS = {DONE: "✓", IN_PROGRESS: "⧗", PENDING: "○"}
MAX_STEPS = 100  #: steps one list holds (a plan's are cut here too)
MAX_STEP_TEXT = 500  #: characters of one step's text


def _progress_text(text):
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_STEP_TEXT else text[:MAX_STEP_TEXT - 1] + "…"


class Progress:
    """A task's steps and the state of each. Thread-safe; `on_change(progress, step)` hears every change, with
    the step ({step, text, status, added}) that changed."""

    def __init__(self, steps=(), fixed=False, on_change=None, statuses=None):
        import threading
        self.lock = threading.Lock()
        #: [{"text", "status"}] in order; step N is steps[N - 1]
        self.steps = [{"text": _progress_text(t), "status": (statuses or {}).get(i, PENDING)}
                      for i, t in enumerate(list(steps)[:MAX_STEPS])]
        self.fixed = bool(fixed)  #: a plan's instructions: marked, never added to
        self.on_change = on_change

    @classmethod
    def restore(cls, stored, on_change=None):
        """A list as snapshot() stored it (unknown statuses read as pending)."""
        stored = stored if isinstance(stored, dict) else {}
        steps = [s for s in stored.get("steps") or () if isinstance(s, dict) and isinstance(s.get("text"), str)]
        statuses = {i: s["status"] for i, s in enumerate(steps) if s.get("status") in STEP_MARKS}
        return cls([s["text"] for s in steps], stored.get("fixed"), on_change, statuses)

    def __len__(self):
        return len(self.steps)

    def noun(self):
        return "instructions" if self.fixed else "steps"

    def counts(self):
        """(done, total)."""
        return sum(1 for s in self.steps if s["status"] == DONE), len(self.steps)

    def summary(self):
        done, total = self.counts()
        return "Completed %d/%d %s" % (done, total, self.noun())

    def brief(self):
        done, total = self.counts()
        return "%s %d/%d done" % (self.noun(), done, total)

    def lines(self, numbered=False):
        """The list as the seed draws it (numbered: for the model, which marks steps by number)."""
        with self.lock:
            steps = [dict(s) for s in self.steps]
        out = [self.summary() + ":"]
        for i, s in enumerate(steps, 1):
            out.append("%s %s%s%s" % (STEP_MARKS[s["status"]], "%d. " % i if numbered else "", s["text"],
                                      " (in progress)" if s["status"] == IN_PROGRESS else ""))
        return out

    def to_json(self):
        """[{step, text, status}]: --json's `steps`, the watcher's result, stream-json."""
        with self.lock:
            return [{"step": i, "text": s["text"], "status": s["status"]} for i, s in enumerate(self.steps, 1)]

    def snapshot(self):
        """What the store keeps with the conversation (restore() reads it back)."""
        return {"fixed": self.fixed, "steps": self.to_json()}

    def unfinished(self):
        return [s for s in self.to_json() if s["status"] != DONE]

    def mark(self, number, status=DONE):
        with self.lock:
            if not 1 <= number <= len(self.steps):
                raise xzatoma_tools.ToolError("there is no step %d: %s" % (number, "the list has %d %s (1-%d)" % (
                    len(self.steps), self.noun(), len(self.steps)) if self.steps else
                    "the list is empty; add the steps first (add=…)"))
            self.steps[number - 1]["status"] = status
            change = {"step": number, "text": self.steps[number - 1]["text"], "status": status, "added": False}
        self._changed(change)
        return change

    def add(self, text):
        text = _progress_text(text)
        with self.lock:
            if self.fixed:
                raise xzatoma_tools.ToolError("this plan's instructions are its steps and cannot be added to; "
                                              "mark them with step and status")
            if not text:
                raise xzatoma_tools.ToolError("add needs the text of the step")
            if len(self.steps) >= MAX_STEPS:
                raise xzatoma_tools.ToolError("the list already holds %d steps, the most it can" % MAX_STEPS)
            self.steps.append({"text": text, "status": PENDING})
            change = {"step": len(self.steps), "text": text, "status": PENDING, "added": True}
        self._changed(change)
        return change

    def _changed(self, change):
        if self.on_change is not None:
            self.on_change(self, change)


class UpdateProgress:
    """The one progress tool. Its calls change only xzatoma's own list (bookkeeping: they are not work the
    honest-completion check counts). Duck-typed like SubagentTool: the Tool base is in xzatoma_tools, which
    start-up does not import."""

    name = "update_progress"
    description = ("Track the steps of the task: mark step N in_progress when you start it and done when it is "
                   "finished. A plan's instructions are its steps; for another task of several steps, first add "
                   "the steps you will take (add, one call per step). Returns the list.")
    parameters = {"type": "object", "properties": {
        "step": {"type": "integer", "minimum": 1, "description": "the step's number"},
        "status": {"type": "string", "enum": [IN_PROGRESS, DONE, PENDING], "description": "default done"},
        "add": {"type": "string", "description": "the text of a new step (a task without a plan)"}}}
    permission = "read"

    def __init__(self, progress):
        self.progress = progress

    def definition(self):
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def confirmation(self, args, ctx):
        return None

    def preview_args(self, args):
        if args.get("add"):
            return "add: " + xzatoma_store.one_line_path(str(args["add"]))[:70]
        return "step %s %s" % (args.get("step"), args.get("status") or DONE)

    def run(self, args, ctx):
        if args.get("step") is None and not args.get("add"):
            raise xzatoma_tools.ToolError("give step (and status: in_progress, done or pending), "
                                          "or add (a new step's text)")
        if args.get("add"):
            self.progress.add(args["add"])
        if args.get("step") is not None:
            self.progress.mark(args["step"], args.get("status") or DONE)
        return xzatoma_tools.ToolResult.ok("\n".join(self.progress.lines(numbered=True)), bookkeeping=True)


# ---- Session: what a run, a chat, a subagent and a watcher event share ----
# The one place that builds a run's parts: config slice, provider, tool context, registry, store,
# Conversation + Recorder, quota, metrics, cancel event, confirmation callbacks and output sink.
#   session = Session.open(cfg, console, toolset, working_dir, autonomy)     # provider, store, quota
#   session.start("run" | "plan" | "chat" | "subagent" | "watch", resume=…)  # conversation, tools
#   result = session.agent(max_turns=…, timeout_seconds=…).run()            # the loop
#   session.close()                                                          # stop children, close store
# chat calls session.rebuild(…) for /mode, /safe, /yolo, /model; a subagent is session.child(…).

SESSION_KINDS = ("run", "plan", "chat", "subagent", "watch")


def current_dir(path=None):
    """`path` made absolute, or the current directory without one: a usage error when that needs the current
    directory and it was removed under the shell (a rebuilt build directory, a removed worktree); it was an
    internal error, exit 1 (round 18c)."""
    try:
        return os.path.abspath(path or os.getcwd())
    except FileNotFoundError:
        raise UsageError("the current directory no longer exists (it was removed): cd to one that does%s"
                         % (", or give an absolute path" if path else ""))


def check_working_dir(given):
    """The jail for run and chat: --working-dir DIR, or the current directory unless that is the home
    directory or / (cron starts jobs in $HOME: a tool there could rewrite ~/.bashrc or ~/.ssh)."""
    working_dir = current_dir(given)
    if not os.path.isdir(working_dir):
        raise UsageError("working directory does not exist: %s" % working_dir)
    if given:
        return working_dir  # named deliberately; the protected paths still hold inside it
    real = os.path.realpath(working_dir)
    for home in user_homes():
        if real == "/" or real == home or home.startswith(real.rstrip("/") + "/"):
            raise UsageError("refusing to use %s as the working directory: it is %s, where the tools could change "
                             "start-up files and keys; cd to a project, or name it deliberately with --working-dir DIR"
                             % (working_dir, "the filesystem root" if real == "/" else "your home directory"
                                if real == home else "a directory above your home directory"))
    return working_dir


def user_homes():
    """The person's home directories: $HOME and the password database's entry (cron may set neither alike)."""
    homes = {os.path.realpath(os.path.expanduser("~"))}
    try:
        import pwd
        homes.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except (ImportError, KeyError):
        pass
    return sorted(homes)


def private_files(cfg):
    """Files outside XZATOMA_HOME that hold this run's credentials or every conversation: the configuration
    file, and a history database named by agent.persistence.db_path (its undo records say what `xzatoma
    undo` writes, and where) with its journals and undo key. Protected, and empty for commands."""
    out = [os.path.abspath(os.path.expanduser(cfg.path))] if cfg.path else []
    if cfg.get("agent.persistence.db_path"):
        db = os.path.abspath(cfg.db_path())
        out += [db + suffix for suffix in ("", "-wal", "-shm", "-journal")]
        out.append(os.path.join(os.path.dirname(db), "undo.key"))
    return out


OWN_MODULES = ("xzatoma", "xzatoma_core", "xzatoma_tools", "xzatoma_store", "xzatoma_watch", "xzatoma_metrics",
               "xzatoma_mcp")


def own_code():
    """The files XZatoma runs from: its modules and their compiled copies (__pycache__), a .pyz as a whole,
    and the script it was started as: rewritten, the next run would run the agent's code unconfined."""
    paths = []
    for name, module in list(sys.modules.items()):
        if name in OWN_MODULES + ("__main__",) and getattr(module, "__file__", None):
            where = os.path.dirname(os.path.realpath(module.__file__))
            paths += [os.path.join(where, m + ".py") for m in OWN_MODULES] + [os.path.join(where, "__pycache__")]
    if sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
        paths.append(os.path.realpath(sys.argv[0]))
    return sorted(set(paths))


def tool_context(cfg, confinement, store, conversation_id=None, **fields):
    """The tools' view of a session: its Confinement, limits, audit log and undo store."""
    audit = xzatoma_tools.AuditLog(os.path.join(cfg.home, "audit.log"), cfg.get("agent.terminal.audit_max_bytes"),
                                   redact=xzatoma_store.Redactor(cfg.secret_values()))
    return xzatoma_tools.ToolContext(confinement, cfg.section("agent.tools"), store=store,
                                     conversation_id=conversation_id, audit=audit, **fields)


def build_confinement(cfg, working_dir, store=None):
    """What a session (or a watcher process) may touch: the canonical root, the one protected set
    (agent.tools.protected_paths, every home's keys and start-up files, XZatoma's own code, this run's
    configuration and history files), the jail, the command policy and the OS sandbox (started on a first
    command; closed with the Confinement)."""
    if store is not None and cfg.get("agent.persistence.db_path"):
        store.make_undo_key()  # before the sandbox starts: it can hide only a key that exists
    return xzatoma_tools.Confinement(working_dir, cfg.home,
                                     list(cfg.get("agent.tools.protected_paths") or []) + own_code(),
                                     home=os.path.expanduser("~"), homes=user_homes(),
                                     terminal=cfg.get("agent.terminal"), environ=os.environ,
                                     secrets=cfg.secret_values(), private_files=private_files(cfg))


def check_sandbox(cfg, sandbox, console):
    """Before a command can run: one warning line naming what the sandbox does not enforce here (never
    silently weaker), or exit 2 with --require-sandbox. Returns the run header's note."""
    missing = sandbox.not_enforced()
    if missing:
        text = "sandbox %s: not enforced here: %s" % (sandbox.access, "; ".join(missing))
        if cfg.get("agent.terminal.require_sandbox"):
            raise UsageError(text + " (agent.terminal.require_sandbox / --require-sandbox: refusing to run)")
        console.warn(text + " (--require-sandbox makes this an error)")
    return sandbox_note(sandbox.access, sandbox.network)


def sandbox_note(access, network):
    """The run header's and the chat banner's words for the sandbox (what was asked for; nothing started)."""
    if access == "off":
        return "sandbox OFF: commands are not confined"
    return "sandbox %s%s" % (access, ", network on" if network else "")


class SandboxCheck:
    """check_sandbox, once for a session's whole tree, when its first terminal command is about to run: not
    at start, where waiting for the helper was a third of a one-shot run that may never run a command. With
    --require-sandbox it is done at start instead (the run must refuse before it does anything)."""

    def __init__(self, cfg, confinement, console):
        import threading
        self.cfg, self.confinement, self.console = cfg, confinement, console
        self._lock = threading.Lock()
        self.done = False

    def __call__(self):
        with self._lock:
            if not self.done:  # the Confinement makes its sandbox on first use: now, not at start
                check_sandbox(self.cfg, self.confinement.sandbox, self.console)  # a refusal repeats
                self.done = True


def sandbox_note_for_start(cfg, session):
    """The header's sandbox words; with --require-sandbox the check itself, now, before anything runs."""
    if cfg.get("agent.terminal.require_sandbox"):
        session.sandbox_check()
    return sandbox_note(cfg.get("agent.terminal.sandbox"), cfg.get("agent.terminal.network"))


class _SandboxFirst:
    """An agent's events, with the session's SandboxCheck run before the first terminal call of its tree."""

    def __init__(self, events, check):
        self._events, self._check = events, check

    def __getattr__(self, name):
        return getattr(self._events, name)

    def tool_call(self, call):
        if call.get("name") == "terminal" and not self._check.done:
            self._check()
        self._events.tool_call(call)


class RunParts:
    """What a whole tree of sessions shares: a run's (or a chat's, or a watcher event's), its subagents' and
    theirs. Session.open makes them (and closes, with the session, what `owns` names); a subagent's session is
    handed them as they are, owning none."""

    def __init__(self, store, confinement, quota, metrics=None, cancel=None, mcp=None, instructions=None,
                 sandbox_check=None, owns=(), workspace=None):
        import threading
        self.store = store  #: the Store, or None (history off or unusable)
        self.confinement = confinement  #: what the tools may touch: root, protected set, policy, sandbox
        self.quota = quota  #: the QuotaTracker of the whole tree
        self.metrics = metrics or NULL_METRICS
        self.cancel = cancel or threading.Event()  #: set: the tree's agents, commands and children stop
        self.mcp = mcp  #: the run's MCP servers (xzatoma_mcp.Servers), or None
        self.instructions = instructions  #: the project instructions (AGENTS.md …) in every system prompt
        #: says what the sandbox does not enforce here, before the tree's first command (SandboxCheck), or None
        self.sandbox_check = sandbox_check
        #: what the session that made these ends at its close(): "store", "metrics", "cancel", "confinement", "mcp"
        self.owns = frozenset(owns)
        self.workspace = workspace  #: the process's Workspace (a watcher's: what it read once), or None

    def handed_down(self, cancel=None, owns=()):
        """The same parts for another session: a subagent's (owning none), or chat's after a cancelled turn
        (a new `cancel` event: that turn's subagents stay cancelled, the next turn starts afresh)."""
        return RunParts(self.store, self.confinement, self.quota, self.metrics, cancel or self.cancel, self.mcp,
                        self.instructions, self.sandbox_check, owns, self.workspace)


class SubagentLink:
    """What ties a subagent's session to its parent: the parent's conversation, the subagent's label and depth,
    the tool context its tools derive from (the calling run's: its deadline), and the narrower tool set."""

    def __init__(self, parent_id, label, depth, ctx, allowed_tools=None, turn_limit=None):
        self.parent_id = parent_id  #: the parent's conversation id
        self.turn_limit = turn_limit  #: the parent's turns: the most the subagent's own max_turns may be
        self.label = label  #: named in the subagent's progress lines and in every question it asks
        self.depth = depth  #: 1 for a subagent of the top-level run, n for one n levels down
        self.ctx = ctx  #: the parent's ToolContext, from which the subagent's is derived (ToolContext.child)
        self.allowed_tools = allowed_tools  #: the tools it may use (None: all the parent has; []: none)


class Session:
    """Everything one conversation's agents share. Built by `open` (a top-level run) or `child`."""

    def __init__(self, cfg, console, provider, toolset, autonomy, shared, events=None, confirmations=None,
                 skills=(), link=None):
        self.cfg = cfg
        self.console = console
        self.provider = provider  #: the Provider every agent of this session asks
        self.toolset = toolset  #: the tool set: planning (read tools) or write (all tools)
        #: the terminal's autonomy: restricted_autonomous, full_autonomous or interactive (chat's Safe safety)
        self.autonomy = autonomy
        self.shared = shared  #: the RunParts of the whole tree: store, confinement, quota, metrics, cancel, …
        self.events = events or Events(console)  #: the output sink: progress lines, streamed text
        self.confirmations = confirmations  #: chat's Confirmations (a person to ask), None when headless
        self.skills = list(skills)  #: the skills this session may use (trusted, valid): see session_skills
        self.link = link  #: a subagent's SubagentLink to its parent; None at the top
        #: the tool profile (agent.tools.profile; auto resolved on the first build): full or compact
        self.profile = None if cfg.get("agent.tools.profile") == "auto" else cfg.get("agent.tools.profile")
        self.kind = None
        self.id = None  #: the conversation id, from start()
        self.conversation = self.recorder = self.result = self.ctx = self.registry = None
        #: from start(): the conversation's SkillState (which skills are active) and Progress (its steps)
        self.skill_state = self.progress = None
        self.resumed = False  #: start() continued a stored conversation
        #: the turns its last agent() may take: a subagent it starts gets at most as many (`run --max-turns 3`
        #: with `subagent {max_turns: 40}` made 44 model calls: round 19c)
        self.turn_limit = None
        self.recorded = False  #: the conversation is being written to the store

    # the shared parts and the link, as the session's own
    store = property(lambda self: self.shared.store)
    confinement = property(lambda self: self.shared.confinement)
    root = property(lambda self: self.shared.confinement.root)  #: the jail
    quota = property(lambda self: self.shared.quota)
    metrics = property(lambda self: self.shared.metrics)
    cancel = property(lambda self: self.shared.cancel)
    mcp = property(lambda self: self.shared.mcp)
    instructions = property(lambda self: self.shared.instructions)
    sandbox_check = property(lambda self: self.shared.sandbox_check)
    workspace = property(lambda self: self.shared.workspace)
    depth = property(lambda self: self.link.depth if self.link else 0)  #: 0 at the top, n for a subagent n down
    label = property(lambda self: self.link.label if self.link else None)  #: a subagent's label
    parent_id = property(lambda self: self.link.parent_id if self.link else None)  #: the parent's conversation

    @classmethod
    def open(cls, cfg, console, toolset, working_dir, autonomy, events=None, confirmations=None, store=None,
             metrics=None, metrics_port=None, metrics_textfile=None, cancel=None, provider=None, confinement=None,
             workspace=None, deadline=None):
        """A top-level session in `working_dir` (default: the current directory). What is not given is made
        here: the provider (from cfg) and, ended by close(), the store (when history is on), Prometheus
        metrics (with a port or a textfile), the cancel event, the Confinement (its sandbox starts with a first
        command, if any; a watcher gives its process's own) and the MCP servers. Project skills and a project's
        .mcp.json not trusted yet are asked about where `confirmations` can ask (chat), and skipped otherwise.
        `workspace`: the process's Workspace of working_dir (a watcher's): what it keeps is not read again.
        `deadline`: the run's (time.monotonic()), when it is one task with a time limit: MCP start-up ends by it."""
        working_dir = check_working_dir(working_dir) if confinement is None else confinement.root
        provider = provider or make_provider(cfg, console)
        owns = {"cancel"} if cancel is None else set()
        if store is None:
            store = open_store(cfg, console, deadline=deadline, changes="chat" if confirmations else "run")
            owns.add("store")
        if metrics is None and (metrics_port or metrics_textfile):
            metrics = load_metrics(metrics_port, metrics_textfile, console.warn)
            owns.add("metrics")
        if confinement is None:  # built once: a mode switch, a subagent or a resumed turn share it
            confinement = build_confinement(cfg, working_dir, store)
            owns.add("confinement")
        instructions = workspace.instructions() if workspace else project_instructions(cfg, working_dir)
        show_instructions(console, instructions)
        asker = confirmations.asker if confirmations else None
        skills = workspace.skills(console, store) if workspace and asker is None else \
            session_skills(cfg, console, working_dir, store, asker)
        mcp = open_mcp(cfg, console, working_dir, asker=asker, confinement=confinement, deadline=deadline)
        if mcp is not None:
            owns.add("mcp")  # its servers stop with the session: none outlives the run
        shared = RunParts(store, confinement, QuotaTracker(cfg.get("agent.quota")), metrics, cancel, mcp, instructions,
                          SandboxCheck(cfg, confinement, console), owns, workspace)
        return cls(cfg, console, provider, toolset, autonomy, shared, events, confirmations, skills)

    # -- a conversation --
    def start(self, kind, resume=None, title=None, source=None, record=None, steps=None):
        """Start a conversation of `kind`, or continue a stored one (resume: an id prefix, or True for the
        latest). record=None records now, except a new chat (on its first message) and subagents with
        agent.subagent.persistence_enabled off. `steps`: a plan's instructions, the progress list the model
        marks (a stored conversation continues with its own list)."""
        assert kind in SESSION_KINDS, kind
        stored = None
        if resume:
            if self.store is None:
                raise UsageError("cannot resume: conversation history is unavailable")
            try:
                conversation_id = self.store.latest() if resume is True else self.store.resolve(resume)
                stored = self.store.conversation(conversation_id)
            except xzatoma_store.NotFound as exc:
                raise UsageError(str(exc))
            try:  # taken now, before anything runs: a conversation another live process runs is refused
                self.store.resume_conversation(conversation_id)
            except xzatoma_store.Busy as exc:
                raise UsageError(str(exc))
            except Exception:  # a store that cannot be written: the recorder says so at its first write
                pass
        else:
            conversation_id = xzatoma_store.new_ulid()
        self.kind, self.id, self.resumed, self.recorded = kind, conversation_id, stored is not None, False
        conv_cfg = self.cfg.get("agent.conversation")
        self.conversation = Conversation(conv_cfg["max_tokens"], conv_cfg["min_retain_turns"],
                                         conv_cfg["prune_threshold"])
        self.recorder = Recorder(self.store, self.console, conversation_id, hold_over=TASK_HELD_OVER)
        if stored is not None and stored.get("progress"):
            self.progress = Progress.restore(stored["progress"], self._progress_changed)
        else:
            self.progress = Progress(steps or (), fixed=steps is not None, on_change=self._progress_changed)
        self.skill_state = xzatoma_skills.SkillState(self.skills)
        self.result = RunResult(conversation_id, progress=self.progress)
        self._build()
        self.conversation.add_system(self.system_prompt())
        if stored is None:  # after the system prompt, so that stays byte-identical across directories and days
            self.conversation.add(environment_message(self.ctx.root, self.instructions, self.depth, self.label,
                                                      catalog=self.skill_catalog()))
        if stored is not None:  # totals carry on; the turn limit counts each run's own turns
            self.result.carry_on(stored)
            for message in load_history(self.store, conversation_id):
                self.conversation.add(message)
        if record is None:
            record = self.resumed or (kind != "chat" and (
                kind != "subagent" or self.cfg.get("agent.subagent.persistence_enabled")))
        if record:
            self.record(title, source)
        if stored is not None:
            self.conversation.close_dangling("Error: interrupted")
        return stored

    def record(self, title=None, source=None):
        """Write the conversation to the store from now on (what it holds already included)."""
        if self.recorded:
            return
        self.recorded = True
        with self.recorder.held():  # one transaction
            if self.resumed:
                self.recorder.resume(mode=self.toolset, model=self.provider.model, provider=self.provider.name,
                                     safety=safety_of(self.ctx))
            else:
                self.recorder.start(kind=self.kind, title=title or "", provider=self.provider.name,
                                    model=self.provider.model, mode=self.toolset, working_dir=self.ctx.root,
                                    source=source, parent_id=self.parent_id, depth=self.depth, label=self.label,
                                    safety=safety_of(self.ctx))
                for message in self.conversation.messages:
                    self.recorder.append(message)
            if len(self.progress):
                self.recorder.save_progress(self.progress.snapshot())
        self.recorder.attach(self.conversation)

    def finish(self, status="completed"):
        """Close the stored conversation with `status`; False when nothing was recorded."""
        if not self.depth and self.result is not None:
            self.result.review = self.confinement.deferred_changed()
        if self.recorded:
            self.result.status = status
            self.recorder.finish(self.result)
        return self.recorded

    def system_prompt(self):
        return system_prompt(self.toolset, self.registry.names(), compact=self.profile == xzatoma_tools.COMPACT_TOOLS)

    # -- skills and progress --
    def skill_catalog(self):
        """The skills' names and descriptions for the environment message, within agent.skills.catalog_share of
        the context window; "" without skills or without activate_skill to load them (the compact profile)."""
        if not self.skill_state or "activate_skill" not in self.registry:
            return ""
        try:
            window = self.provider.context_window() or self.conversation.max_tokens
        except XzError:  # an unreachable server: the first request says so
            window = self.conversation.max_tokens
        return xzatoma_skills.skill_catalog(self.skill_state.skills.values(),
                                            window * self.cfg.get("agent.skills.catalog_share"))

    def match_skills(self, text):
        """Skills whose triggers match a request (the person's words, a plan's prompt) are activated before the
        model is asked: their instructions follow the request, and their allowed-tools hold from now on."""
        if not self.skill_state:
            return []
        matched, problems = xzatoma_skills.match_triggers(self.skill_state.skills.values(), text,
                                                          given_up=self.skill_state.slow)
        for problem in problems:
            self.console.warn(problem)
        activated = []
        for skill, trigger in matched:
            skill, newly = self.skill_state.activate(skill.name)
            if newly:
                self.conversation.add({"role": "user", "name": NOTE, "content": skill.instructions(
                    "because the request matches its trigger %s" % json.dumps(trigger, ensure_ascii=False))})
                self.events.note("  skill %s activated (trigger %s)" % (skill.name, one_line(trigger, 60)))
                activated.append(skill.name)
        return activated

    def _progress_changed(self, progress, step):
        self.events.progress(progress, step)
        if self.recorded:
            self.recorder.save_progress(progress.snapshot())

    def settle_progress(self):
        """At the end of a run: steps not done are said in the result's warnings (and so in --json, the summary
        and the watcher's log), with why when the model had no tool to mark them (the compact profile)."""
        progress = self.progress
        left = progress.unfinished() if progress is not None else []
        if not left:
            return
        if "update_progress" not in self.registry:
            self.result.warnings.append(
                "the %d %s were not tracked: the %s tool profile has no update_progress tool to mark them (--tools "
                "full offers it)" % (len(progress), progress.noun(), self.profile))
            return
        shown = "; ".join("%d. %s (%s)" % (s["step"], one_line(s["text"], 60), s["status"].replace("_", " "))
                          for s in left[:5])
        self.result.warnings.append("%s of %d %s not marked done: %s%s" % (
            len(left), len(progress), progress.noun(), shown, " …" if len(left) > 5 else ""))

    # -- tools --
    def undo_store(self):
        """Where the file tools record what they change: the Store; without a usable one (history on), this
        process's memory (round 19d: changes went unrecorded); with history off, nowhere (as documented)."""
        if self.store is not None:
            return self.store
        return xzatoma_store.memory_undo() if self.cfg.get("agent.persistence.enabled") else None

    def _build(self):
        if self.link is not None:
            ctx = self.link.ctx.child(self.label, self.id)
        else:
            asks = self.confirmations
            people = xzatoma_tools.Approvals(asks is not None,
                                             asks.confirm_tool if asks and self.autonomy == xzatoma_tools.INTERACTIVE
                                             else None, asks and asks.ask_irreversible, asks and asks.confirm_command)
            make = self.workspace.tool_context if self.workspace is not None else \
                lambda *a, **kw: tool_context(self.cfg, *a, **kw)
            ctx = make(self.confinement, self.undo_store(), self.id, approvals=people, autonomy=self.autonomy,
                       cancel=self.cancel)
        if self.profile is None:
            self.profile = tool_profile(self.cfg, self.provider, self.console)
        if self.profile == xzatoma_tools.COMPACT_TOOLS:
            # INFO: servers default to hot sampling (llama-cpp-python and Ollama: 0.8), under which a small
            # model's calls wander: a misspelt argument, a tool it never had, prose where the call should be.
            # A reply is bounded too: llama-cpp-python generates to the end of the window when nothing is set, and
            # a 1.5B model's reply ran on for over eight minutes on two cores.
            self.provider.prefer(temperature=SMALL_MODEL_TEMPERATURE, max_tokens=SMALL_MODEL_MAX_TOKENS)
        registry = xzatoma_tools.build_registry(self.toolset, ctx,
                                                extra=(SubagentTool(self), ParallelSubagentTool(self),
                                                       xzatoma_skills.ActivateSkill(self.skill_state),
                                                       UpdateProgress(self.progress)),
                                                profile=self.profile, skills=self.skill_state)
        if self.mcp is not None:
            registry = registry.extended(self.mcp.tools())
        if self.link is not None and self.link.allowed_tools is not None:  # []: no tool at all (an active
            registry = registry.narrowed(set(self.link.allowed_tools), ctx)  # skill allowed none of those asked)
        self.ctx, self.registry = ctx, registry

    def rebuild(self, toolset=None, autonomy=None, provider=None):
        """New tools for chat's /mode, /safe, /yolo, /model (and after a cancelled turn); the conversation stays."""
        import threading
        self.toolset = toolset or self.toolset
        self.autonomy = autonomy or self.autonomy
        self.provider = provider or self.provider
        # a cancelled turn's subagents stay cancelled; the next starts afresh
        self.shared = self.shared.handed_down(threading.Event(), self.shared.owns)
        self._build()
        self.conversation.set_system_prompt(self.system_prompt())

    # -- agents --
    def agent(self, max_turns=None, timeout_seconds=None, on_step=None, deadline=None):
        """The Agent for the next run of this conversation. Limits default to the configuration (a subagent:
        agent.subagent.default_max_turns, and its parent's deadline); `deadline`: the run's, set when it began
        (its MCP servers' start-up counts against the time limit)."""
        cfg = self.cfg
        if self.depth:
            max_turns = max_turns or cfg.get("agent.subagent.default_max_turns")
        else:
            max_turns = max_turns or cfg.get("agent.max_turns")
            timeout_seconds = timeout_seconds or cfg.get("agent.timeout_seconds")
        parent_limit = self.link.turn_limit if self.link is not None else None
        if parent_limit:
            max_turns = min(max_turns, parent_limit)
        self.turn_limit = max_turns
        own = time.monotonic() + timeout_seconds if timeout_seconds else self.ctx.deadline
        deadline = own if deadline is None else deadline if own is None else min(own, deadline)
        ctx = self.ctx.with_deadline(deadline)
        events = self.events if self.sandbox_check is None else _SandboxFirst(self.events, self.sandbox_check)
        read_named = cfg.get("agent.read_named")
        terms = RunTerms(max_turns, deadline, timeout_seconds, honest=self.kind in ("run", "plan", "watch"),
                         nested=self.depth > 0, read_named=read_named == "on" or (
                             read_named == "auto" and self.profile == xzatoma_tools.COMPACT_TOOLS),
                         timeout_key="watcher.timeout_seconds" if self.kind == "watch" else "agent.timeout_seconds")
        return Agent(self.provider, self.registry.bound(ctx), self.conversation, events, self.result, terms,
                     self.shared, recorder=self.recorder if self.recorded else None,
                     review=None if self.depth else self.confinement.deferred_changed, on_step=on_step)

    def child(self, label, allowed_tools=None, ctx=None):
        """A subagent's session: depth + 1, the tools narrowed to `allowed_tools`, the same quota, store,
        metrics and cancel; `ctx` is the calling run's tool context (its deadline), default this session's."""
        cfg = self.cfg
        narrowed = self.skill_state.allowed() if self.skill_state is not None else None
        if narrowed is not None:  # an active skill's allowed-tools hold for the subagents it may start too
            allowed_tools = [t for t in (self.registry.names() if allowed_tools is None else allowed_tools)
                             if t in narrowed]
        sub_name, sub_model = cfg.get("agent.subagent.provider"), cfg.get("agent.subagent.model")
        provider = make_provider(cfg, self.console, sub_name, sub_model) if (sub_name or sub_model) \
            else self.provider.clone()
        return Session(cfg, self.console, provider, self.toolset, self.autonomy, self.shared.handed_down(),
                       _ChildEvents(self.console, label, self.depth + 1),
                       link=SubagentLink(self.id, label, self.depth + 1, ctx or self.ctx, allowed_tools,
                                         self.turn_limit))

    def close(self, wait_for_workers=None):
        """The end: whatever still runs below (subagents, their commands) stops; what open() made closes.
        wait_for_workers (seconds; the main thread of a run only): let subagent threads record their end
        in the store before it closes."""
        owns = self.shared.owns
        if "cancel" in owns:
            self.cancel.set()
        if "confinement" in owns:
            self.confinement.close()  # every command still running, and the private TMPDIR, go with the run
        if "mcp" in owns:
            self.mcp.close()  # every MCP server, and what it started, stops with the run
        if wait_for_workers:
            _join_workers(wait_for_workers)
        if "store" in owns and self.store is not None:
            self.store.close()
        if "metrics" in owns:
            self.metrics.close()


# ---- MCP servers: xzatoma_mcp, imported only when some are configured ----
# mcp.servers in the configuration and a project's .mcp.json (mcpServers, as other tools write it). The module
# never imports this one: it gets the servers' configuration, a sandbox per stdio server, the credential store,
# the console's lines and whether a person can be asked. Its tools join the registry (Session._build).

def mcp_configured(cfg, working_dir):
    """Whether this run has MCP servers to look at: a look at the config and one lstat, nothing imported."""
    return bool(cfg.get("mcp").get("servers")) or (
        cfg.get("mcp.project_file") and os.path.lexists(os.path.join(working_dir, ".mcp.json")))


def mcp_configs(cfg, console, working_dir, asker=None, trust_all=False):
    """([ServerConfig] to start, [(name, why[, state])] of a project's servers not started). A project's
    .mcp.json starts programs: its servers are used once a person trusted that content of it (asked here when
    `asker` can, showing everything they would be given and what is wrong in it; a headless run skips them and
    says so). Only the person's own mcp.servers is validated strictly (exit 2): the project's file is the
    project's (the model can write it), so a mistake in it leaves its servers out and never stops a run."""
    warnings = []
    timeout = cfg.get("mcp.timeout_seconds")
    try:
        configs = xzatoma_mcp.parse_servers(cfg.get("mcp").get("servers") or None, cfg.path, os.environ, warnings,
                                            timeout)
    except xzatoma_mcp.ConfigError as exc:
        raise ConfigError(str(exc))
    untrusted = []
    text, path = xzatoma_mcp.read_project_file(working_dir) if cfg.get("mcp.project_file") else (None, None)
    project = problems = None
    if text is not None:
        project, problems, notes = project_mcp(cfg, text, path, {c.name for c in configs})
    if project or problems:  # a file naming no server (or only the person's own names) is nothing to ask about
        names = [c.name for c in project] + [name for name, _ in problems if name is not None]
        trust = xzatoma_mcp.ProjectTrust(cfg.home)
        trusted = trust.trusted(path, text) or trust_all
        asked = False
        if not trusted and asker is not None and project:
            asked = True
            trusted = ask_mcp_trust(console, asker, path, project, problems, notes)
        if trusted:
            if not trust.trusted(path, text):
                trust.trust(path, text)
            configs += project
            if not asked:  # shown with the question otherwise
                warnings += notes + [why for _, why in problems]
            untrusted = [(name, why, "refused") for name, why in problems if name is not None]
        else:
            why = "%s is not trusted: 'xzatoma mcp trust' (or chat) asks once" % path
            untrusted = [(name, why) for name in names]
            listed = " (%s)" % ", ".join(names) if names else ""
            if asker is not None and not asked:  # a person is here, but nothing in it could start: say why
                for warning in notes + [why for _, why in problems]:
                    console.warn(warning)
                console.warn("the MCP servers of %s%s are not started: none of them can (above)" % (path, listed))
            else:
                console.warn("the MCP servers of %s%s are not started: the file starts programs and is not "
                             "trusted yet; review it, then run 'xzatoma mcp trust' (or start a chat, which asks)"
                             % (path, listed))
    for warning in warnings:
        console.warn(warning)
    return configs, untrusted


def mcp_credential_vars(cfg):
    """The environment variables XZatoma reads its own credentials from: the providers' (the configured
    api_key_env too), Kafka's and XZepr's. A project's .mcp.json never gets them (xzatoma_mcp.project_guard)."""
    own = set(cfg.secret_sources().values())
    own.update(var for var, dotted in ENV_KEYS if is_secret_key(dotted) or dotted.endswith(".username"))
    return own


def project_mcp(cfg, text, path, skip=()):
    """A project's .mcp.json read leniently: ([ServerConfig], problems [(name or None, why)], warnings)."""
    return xzatoma_mcp.parse_project(text, path, os.environ, cfg.get("mcp.timeout_seconds"),
                                     own=mcp_credential_vars(cfg), skip=skip)


def show_mcp_project(console, path, configs, problems=(), notes=(), asker=None):
    """What a project's .mcp.json would start and give each server, as written (${VAR} not expanded), and what
    in it cannot start: the question that trusts it is about all of this; shown where `asker` asks, if given."""
    def show(text, warn=False):
        if asker is not None:
            asker.show(console.clean(("warning: " if warn else "") + text))
        else:
            (console.warn if warn else console.info)(text)
    show("%s in this project starts these MCP servers:" % path)
    for c in configs:
        lines = c.written_lines()
        show("  %s: %s" % (c.name, lines[0]))
        for line in lines[1:]:
            show("      " + line)
    for note in list(notes) + [why for _, why in problems]:
        show(note, True)


def ask_mcp_trust(console, asker, path, configs, problems=(), notes=()):
    """Show what a project's .mcp.json would start (show_mcp_project), and ask once."""
    show_mcp_project(console, path, configs, problems, notes, asker)
    answer = asker.ask("Trust this file and start them (they run in the sandbox)? [y/N] > ")
    return (answer or "").strip().lower() in ("y", "yes")


def open_mcp(cfg, console, working_dir, asker=None, start=True, only=None, trust_all=False, confinement=None,
             deadline=None):
    """The run's MCP servers (xzatoma_mcp.Servers), started, or None where none are configured. `only`: the one
    server named (`mcp tools NAME`, `mcp login NAME`); `confinement`: the session's (else one is made);
    `deadline`: the run's, which bounds the servers' start-up as it bounds their calls."""
    if not mcp_configured(cfg, working_dir):
        return None
    configs, untrusted = mcp_configs(cfg, console, working_dir, asker, trust_all)
    if only is not None:
        configs = [c for c in configs if c.name == only]
        untrusted = [u for u in untrusted if u[0] == only]
    if not configs and not untrusted:
        return None

    def browser(url):
        import webbrowser
        try:
            webbrowser.open(url)
        except Exception:  # no browser: the URL is on the screen
            pass
    confinement = confinement or build_confinement(cfg, working_dir)
    servers = xzatoma_mcp.Servers(configs, working_dir, lambda access, network, paths: mcp_sandbox(
        cfg, confinement, access, network, paths), home=cfg.home, credentials=CredentialStore(cfg.home, console),
        interactive=asker is not None, warn=console.warn, note=lambda text: console.info(text, "dim"),
        say=console.info, version=__version__, open_browser=browser,
        require_sandbox=cfg.get("agent.terminal.require_sandbox"), untrusted=untrusted, deadline=deadline)
    return servers.start() if start else servers


def mcp_sandbox(cfg, confinement, access, network, read_paths):
    """An MCP stdio server's own sandbox: the terminal's walls from the session's Confinement (protected paths,
    the hidden XZATOMA_HOME and private files) with the environment allowlist, a private HOME and TMPDIR, and
    network only when its configuration says so. INFO: Sandbox grants reads to the directories on PATH and their
    prefixes, and to nothing else outside the tree: the server's installation (its program's directory,
    read_paths) is put first on the PATH the sandbox is built from."""
    term = cfg.get("agent.terminal")
    environ = dict(os.environ, PATH=os.pathsep.join(list(read_paths) + [os.environ.get("PATH", "")]))
    return xzatoma_tools.Sandbox(confinement, access or term["sandbox"], network=network, environ=environ,
                                 secrets=cfg.secret_values(), assume_missing=term["sandbox_assume_missing"])


COMPACT_WINDOW, COMPACT_BILLIONS = 16384, 8  # auto: the compact tool profile at or below these
SMALL_MODEL_TEMPERATURE = 0.2  #: sent with the compact profile unless provider.<type>.temperature is set
SMALL_MODEL_MAX_TOKENS = 2048  #: the same for provider.<type>.max_tokens (a write of ~8 KB fits)


def tool_profile(cfg, provider, console):
    """agent.tools.profile, with auto resolved: compact for a local server whose model has a small window or
    few parameters (what it says, or the model's name), full otherwise (hosted models: nothing is probed)."""
    chosen = cfg.get("agent.tools.profile")
    if chosen != "auto":
        return chosen
    if not provider.is_local():
        return xzatoma_tools.FULL_TOOLS
    window, size = provider.context_window(), provider.parameter_billions()
    small = (window and window <= COMPACT_WINDOW) or (size and size <= COMPACT_BILLIONS)
    console.debug("tool profile: %s (window %s, %s billion parameters)" % (
        "compact" if small else "full", window or "unknown", size or "unknown"))
    return xzatoma_tools.COMPACT_TOOLS if small else xzatoma_tools.FULL_TOOLS


def run_plan_session(cfg, console, instruction, working_dir, toolset="write", autonomy=None, max_turns=None,
                     timeout_seconds=None, title=None, source=None, metadata=None, store=None, metrics=None,
                     cancel=None, events=None, provider=None, steps=None, confinement=None, workspace=None):
    """Run one plan headless as a Session of kind `watch` and return its RunResult (for the watcher).

    cfg, console: the loaded Config and the Console for progress lines (stderr).
    instruction: the task text (a parsed plan's `to_prompt()`).
    working_dir: the directory the tools are jailed to (must exist; a UsageError otherwise).
    toolset: "write" (all tools) or "planning" (read tools only).
    autonomy: "restricted_autonomous" (default: nobody can be asked, so confirm-level commands are
        refused) or "full_autonomous".
    max_turns, timeout_seconds: limits for this run (default agent.max_turns, agent.timeout_seconds).
    title: stored as the conversation's title (e.g. the plan's goal).
    source, metadata: stored as the conversation's source: the text `source`, or `metadata` (a dict: the
        event's id, type, source, topic, partition, offset) as sorted JSON.
    store: an open Store to record in (kept open; the caller closes it); None opens and closes one.
    metrics: the metrics sink (default none); cancel: a threading.Event that stops the run when set
        (the caller's: never set by this function).
    events: the output sink for progress lines (default: Events(console)).
    provider: the Provider to ask (e.g. a clone of one checked at start-up); default: built from cfg.
    steps: the plan's instructions, the progress list the model marks (in the RunResult's `steps`).
    confinement: the Confinement of `working_dir` shared by every run of a process (a watcher's, kept open;
        its sandbox's helper serves them all); default: one made for this run and closed with it.
    workspace: the process's Workspace of `working_dir` (a watcher's): instructions, skills and the tools'
        configuration read once and checked for change, not read for every event.
    Never raises for a failed run: the RunResult's status/error/exit_code say how it ended. Raises
    UsageError/CredentialsError for a bad working directory or provider configuration.
    """
    deadline = time.monotonic() + (timeout_seconds or cfg.get("agent.timeout_seconds"))  # start-up counts
    session = Session.open(cfg, console, toolset, working_dir, autonomy or xzatoma_tools.RESTRICTED, events=events,
                           metrics=metrics, store=store, cancel=cancel, provider=provider, confinement=confinement,
                           workspace=workspace, deadline=deadline)
    if metadata is not None:
        source = json.dumps(metadata, sort_keys=True)
    try:
        session.start("watch", title=title, source=source, steps=steps, record=False)
        session.conversation.add_user(instruction)
        session.match_skills(instruction if steps is None else "\n".join([title or ""] + list(steps)))
        session.record(title, source)  # all of it so far in one transaction, not one per message (issue 22)
        result = session.agent(max_turns=max_turns, timeout_seconds=timeout_seconds, deadline=deadline).run()
        session.settle_progress()
        return result
    finally:
        session.close()


# ---- Subagents, quotas and metrics ----


class QuotaTracker:
    """agent.quota limits shared by a whole tree of agents (one run or chat session); thread-safe."""

    def __init__(self, limits):
        import threading
        self.limits = dict(limits)
        self.lock = threading.Lock()
        self.executions = 0
        self.tokens = 0
        self.started = time.monotonic()

    def _over(self):
        lim = self.limits
        if lim.get("max_total_tokens") is not None and self.tokens > lim["max_total_tokens"]:
            return "%s tokens used, over agent.quota.max_total_tokens (%s)" % (
                _fmt_tokens(self.tokens), _fmt_tokens(lim["max_total_tokens"]))
        elapsed = time.monotonic() - self.started
        if lim.get("max_total_time_seconds") is not None and elapsed > lim["max_total_time_seconds"]:
            return "%.0fs elapsed, over agent.quota.max_total_time_seconds (%s)" % (
                elapsed, lim["max_total_time_seconds"])
        return None

    def check(self):
        with self.lock:
            reason = self._over()
        if reason:
            raise QuotaExceeded(reason)

    def start_execution(self):
        """Reserve one subagent execution, or refuse with the limit that is reached."""
        with self.lock:
            reason = self._over()
            limit = self.limits.get("max_executions")
            if not reason and limit is not None and self.executions >= limit:
                reason = "%d subagent executions, the agent.quota.max_executions limit" % limit
            if not reason:
                self.executions += 1
        if reason:
            raise QuotaExceeded(reason)

    def add_tokens(self, n):
        with self.lock:
            self.tokens += n

    def usage(self):
        lim = self.limits
        return ["executions %d/%s" % (self.executions, lim.get("max_executions") or "∞"),
                "tokens %s/%s" % (_fmt_tokens(self.tokens), _fmt_tokens(lim["max_total_tokens"])
                                  if lim.get("max_total_tokens") else "∞"),
                "time %ds/%s" % (time.monotonic() - self.started, "%ss" % lim["max_total_time_seconds"]
                                 if lim.get("max_total_time_seconds") else "∞")]


class NullMetrics:
    """Metrics off (the default): every hook is a no-op."""

    def __getattr__(self, name):
        return lambda *args, **kw: None


NULL_METRICS = NullMetrics()


def check_metrics_port(port):
    """A port the metrics server can bind (70000 was an OverflowError: an "internal error", exit 1)."""
    if port is not None and not 0 < port < 65536:
        raise UsageError("--metrics-port must be 1 to 65535, not %s" % port)


def load_metrics(port=None, textfile=None, warn=None, host="127.0.0.1"):
    """The Prometheus metrics module, or a UsageError naming what to install.

    `warn(text)` hears about a textfile that cannot be written: metrics are a side product, so the answer
    and the exit code stay the task's.
    """
    check_metrics_port(port)
    try:
        import xzatoma_metrics
    except ImportError:
        raise UsageError("metrics need the Python package 'prometheus_client': %s"
                         % xzatoma_store.install_hint("prometheus_client", extra="metrics"))
    try:
        return xzatoma_metrics.PrometheusMetrics(port=port, textfile=textfile, warn=warn, host=host)
    except (OSError, ValueError) as exc:  # ValueError: an address that is no address
        raise UsageError("cannot serve metrics on %s:%s: %s (choose another --metrics-port)"
                         % (host, port, getattr(exc, "strerror", None) or exc))


DEFAULT_SUMMARY_PROMPT = ("Summarise your findings concisely for the agent that gave you this task: what you did, "
                          "what you found, and anything it must know. Do not call tools.")


class _ChildEvents(Events):
    """A subagent's progress: indented, labelled lines on stderr; its text is not streamed."""

    def __init__(self, console, label, depth):
        super().__init__(console)
        self.prefix = "  " * depth + "[%s] " % label

    def tool_start(self, name, preview):
        if name not in self.QUIET_TOOLS:
            self.console.info("%s▶ %s %s" % (self.prefix, name, one_line(preview, 70)), "cyan")

    def tool_end(self, name, result):
        if name in self.QUIET_TOOLS and result.success:
            return
        ok, line = result_summary(result, 90)
        self.console.info("%s  %s %s" % (self.prefix, "✓" if ok else "✗", line), "dim" if ok else "yellow")

    def progress(self, progress, step):
        for line in progress.lines():
            self.console.info(self.prefix + line, "dim")

    def note(self, text):
        self.console.info(self.prefix + text.strip(), "dim")


def run_subagent(parent, spec, ctx=None):
    """Run one subagent task to its end and ask it for a summary. Returns a ToolResult; never raises.

    `parent` is the calling Session, `ctx` the calling run's tool context (its deadline)."""
    cfg = parent.cfg
    label = str(spec.get("label") or "subagent")
    depth = parent.depth + 1
    max_depth = cfg.get("agent.subagent.max_depth")
    if depth > max_depth:
        return xzatoma_tools.ToolResult.fail("maximum subagent depth %d reached" % max_depth)
    parent_names = parent.registry.names()
    allowed = spec.get("allowed_tools")  # None: all the parent's tools; []: none (it was all of them: 19c)
    if allowed is not None:
        unknown = [t for t in allowed if t not in parent_names]
        if unknown:
            return xzatoma_tools.ToolResult.fail("allowed_tools names tools this agent does not have: %s; "
                                                 "valid tools: %s" % (", ".join(unknown),
                                                                      ", ".join(sorted(parent_names))))
    try:
        parent.quota.start_execution()
    except QuotaExceeded as exc:
        parent.metrics.subagent_error("quota")
        return xzatoma_tools.ToolResult.fail(str(exc), status="quota_exceeded")
    started = time.monotonic()
    child = parent.child(label, parent_names if allowed is None else allowed, ctx)
    child.start("subagent", title=spec["task_prompt"])
    child.conversation.add_user(spec["task_prompt"])
    agent = child.agent(max_turns=spec.get("max_turns"))
    parent.metrics.subagent_started(depth)
    child.events.note("started (depth %d, up to %d turns)" % (depth, agent.max_turns))
    try:
        result = agent.run(final=False)
        summary, error = result.answer, result.error
        # the summary is a model call too: only with a turn left for it (a subagent held to its parent's one turn
        # made two calls: round 19e); without it, the last answer is the summary
        if result.status in ("completed", "max_turns") and not child.cancel.is_set() and \
                result.turns < agent.max_turns:
            try:
                summary = agent.summarise(spec.get("summary_prompt") or DEFAULT_SUMMARY_PROMPT) or summary
            except RunStop as exc:
                error = "the summary request failed: %s" % exc
    except BaseException:  # Ctrl-C or SIGTERM in the main thread: on to the top-level run's edge
        child.finish("interrupted")
        raise
    if child.cancel.is_set():
        result.status, error = "interrupted", "interrupted"
    result.duration = time.monotonic() - started
    child.finish(result.status)
    tokens = result.prompt_tokens + result.completion_tokens
    parent.metrics.subagent_finished(depth, result.status, result.duration, result.turns, tokens)
    meta = {"label": label, "depth": depth, "turns_used": result.turns, "tokens_used": tokens,
            "status": result.status, "conversation_id": child.id, "duration_seconds": round(result.duration, 3),
            "max_turns_exceeded": result.status == "max_turns"}
    child.events.note("%s: %s, %s tokens, %.1fs" % (result.status, _plural(result.turns, "turn"),
                                                     _fmt_tokens(tokens), result.duration))
    if result.status not in ("completed", "max_turns") or not summary:
        parent.metrics.subagent_error(result.status)
        return xzatoma_tools.ToolResult.fail("subagent %s %s: %s" % (label, result.status, error or "no answer"),
                                             **meta)
    cap = cfg.get("agent.subagent.output_max_size")
    summary, cut = xzatoma_store.bounded_text(summary, cap)
    if cut:
        summary += "\n[summary truncated at %d bytes]" % cap
    head = "[subagent %s · depth %d · %s · %s · %s tokens · conversation %s]" % (
        label, depth, result.status, _plural(result.turns, "turn"), _fmt_tokens(tokens), child.id)
    return xzatoma_tools.ToolResult.ok(head + "\n" + summary, **meta)


_TASK_SCHEMA = {"type": "object", "properties": {
    "label": {"type": "string", "description": "A short name for this task"},
    "task_prompt": {"type": "string", "description": "Everything the subagent needs to know to do the task"},
    "summary_prompt": {"type": "string", "description": "How the subagent should report back"},
    "allowed_tools": {"type": "array", "items": {"type": "string"},
                      "description": "Only these tools (a subset of yours); default: all of yours"},
    "max_turns": {"type": "integer", "minimum": 1}}, "required": ["label", "task_prompt"]}


class SubagentTool:
    name = "subagent"
    description = ("Delegate a self-contained task to a subagent with its own conversation and (optionally) fewer "
                   "tools. It works until done, then returns a concise summary.")
    parameters = _TASK_SCHEMA
    permission = "read"

    def __init__(self, session):
        self.session = session

    def definition(self):
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def confirmation(self, args, ctx):
        return None

    def preview_args(self, args):
        return "%s: %s" % (args.get("label"), one_line(args.get("task_prompt", ""), 60))

    def run(self, args, ctx):
        return run_subagent(self.session, args, ctx)


class ParallelSubagentTool(SubagentTool):
    name = "parallel_subagent"
    description = ("Run several independent subagent tasks at the same time; returns one result per task, in the "
                   "order given, plus totals.")
    parameters = {"type": "object", "properties": {
        "tasks": {"type": "array", "items": _TASK_SCHEMA, "minItems": 1},
        "max_concurrent": {"type": "integer", "minimum": 1, "default": 5},
        "fail_fast": {"type": "boolean", "default": False}}, "required": ["tasks"]}

    def preview_args(self, args):
        return "%d tasks: %s" % (len(args.get("tasks") or ()), ", ".join(
            str(t.get("label")) for t in args.get("tasks") or () if isinstance(t, dict)))

    def run(self, args, ctx):
        tasks = args["tasks"]
        if not tasks:
            raise xzatoma_tools.ToolError("tasks must not be empty")
        checked = []
        for i, task in enumerate(tasks, 1):
            spec, err = xzatoma_tools.validate_arguments(SubagentTool(self.session), task)
            if err:
                raise xzatoma_tools.ToolError("task %d: %s" % (i, err))
            checked.append(spec)
        return run_parallel(self.session, checked, args.get("max_concurrent") or 5, bool(args.get("fail_fast")), ctx)


def run_parallel(session, tasks, max_concurrent, fail_fast, ctx=None):
    import threading
    from concurrent.futures import ThreadPoolExecutor, wait, FIRST_COMPLETED
    started = time.monotonic()
    stop = threading.Event()  # fail_fast: what has not started yet does not start
    results = [None] * len(tasks)

    def one(i, spec):
        if stop.is_set() or session.cancel.is_set():
            return xzatoma_tools.ToolResult.fail(
                "not started (%s)" % ("fail_fast after a failure" if stop.is_set() else "cancelled"),
                label=spec["label"], status="cancelled")
        return run_subagent(session, spec, ctx)

    pool = ThreadPoolExecutor(max_workers=min(max_concurrent, len(tasks)), thread_name_prefix="subagent")
    futures = {pool.submit(one, i, spec): i for i, spec in enumerate(tasks)}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in done:
                i = futures[fut]
                if fut.cancelled():  # fail_fast withdrew it before it started
                    continue
                results[i] = fut.result()
                if fail_fast and not results[i].success:
                    stop.set()
                    for other in pending:
                        other.cancel()
    except BaseException:  # Ctrl-C or SIGTERM: stop every child (their commands' groups are killed)
        session.cancel.set()
        pool.shutdown(wait=False)
        raise
    pool.shutdown(wait=True)
    lines, ok, tokens = [], 0, 0
    for i, (spec, res) in enumerate(zip(tasks, results), 1):
        if res is None:
            res = xzatoma_tools.ToolResult.fail("not started (fail_fast after a failure)", label=spec["label"],
                                                status="cancelled")
            results[i - 1] = res
        meta = res.metadata
        tokens += meta.get("tokens_used", 0)
        ok += res.success
        lines.append("%d. %s — %s (%s, %s tokens, %.1fs)\n%s" % (
            i, spec["label"], "success" if res.success else "failed: " + meta.get("status", "error"),
            _plural(meta.get("turns_used", 0), "turn"), _fmt_tokens(meta.get("tokens_used", 0)),
            meta.get("duration_seconds", 0), res.output if res.success else "Error: " + (res.error or "")))
    total = "%d of %d tasks succeeded · %s tokens · %.1fs wall" % (ok, len(tasks), _fmt_tokens(tokens),
                                                                 time.monotonic() - started)
    output = total + "\n\n" + "\n\n".join(lines)
    return xzatoma_tools.ToolResult(ok > 0, output,
                                    error=None if ok else "all %d subagent tasks failed\n%s" % (len(tasks), output),
                                    metadata={"succeeded": ok, "failed": len(tasks) - ok, "tokens_used": tokens})


# ---- Prompts ----

PLANNING_PROMPT = """You are in PLANNING mode and can only read files and create plans. Never attempt to modify files or execute commands.
Focus on analysis and understanding: explore with the read-only tools, then produce a clear plan (YAML or Markdown) with concrete steps, risks and a safe way to execute them."""

WRITE_PROMPT = """You are in WRITE mode and can modify files and execute commands.
Work in small, verifiable steps: inspect before you change, make the change with a tool, then check it (run the tests when there are any)."""


class ProjectInstructions:
    """What AGENTS.md-style files tell the model about a project, and where it came from."""

    def __init__(self, files=(), text="", notes=()):
        self.files = list(files)  #: display paths (relative to the working directory), farthest first
        self.text = text  #: the block for the system prompt ("" when there is none)
        self.notes = list(notes)  #: files skipped or cut, and why (for --verbose and /status)

    def describe(self):
        return ", ".join(self.files) or "none"


def instruction_dirs(working_dir, home=None):
    """The working directory and its parents up to the git root or the home directory, farthest first.

    With neither above it (a checkout in /tmp), only the working directory: a parent such as /tmp is
    shared with other people, and what it holds must not instruct the model.
    """
    wd = os.path.realpath(working_dir)
    home = os.path.realpath(home) if home else None
    chain, here = [wd], wd
    while not (os.path.lexists(os.path.join(here, ".git")) or here == home):
        parent = os.path.dirname(here)
        if parent == here:
            return [wd]
        chain.append(parent)
        here = parent
    return chain[::-1]


def load_instructions(working_dir, names=("AGENTS.md",), max_bytes=32768, home=None):
    """Read project instructions through the jail of each directory (descriptor-relative, as the file tools
    read): a name that resolves outside its directory (a symlink to ~/.ssh/id_rsa) is refused, special files and binary files are skipped, files
    in parent directories count only when the person (or root) owns them and nobody else may write them,
    and all of it together is capped at `max_bytes`."""
    wd = os.path.realpath(working_dir)
    files, blocks, notes, seen, left = [], [], [], set(), max_bytes
    if max_bytes <= 0:
        return ProjectInstructions()
    for directory in instruction_dirs(wd, home):
        jail = xzatoma_tools.Jail(directory)
        for name in names:
            shown = os.path.relpath(os.path.join(directory, name), wd)
            if not os.path.lexists(os.path.join(directory, name)):
                continue
            try:
                with jail.resolve(name, must_exist=True) as target:  # descriptor-relative, race-free
                    if target.real in seen:  # CLAUDE.md as a link to AGENTS.md: once is enough
                        continue
                    seen.add(target.real)
                    fd = target.open_regular("not read as project instructions")
            except xzatoma_tools.JailError:
                notes.append("%s skipped: it leads outside %s" % (shown, directory))
                continue
            except xzatoma_tools.ToolError as exc:
                notes.append("%s skipped: %s" % (shown, "not a regular file" if "not a regular file" in str(exc)
                                                  else one_line(exc, 120)))
                continue
            except OSError as exc:
                notes.append("%s skipped: %s" % (shown, exc.strerror or exc))
                continue
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fd)
                if st.st_mode & 0o002 or (directory != wd and st.st_uid not in (os.getuid(), 0)):
                    why = "others can write it" if st.st_mode & 0o002 else "another user owns it"
                elif left <= 0:
                    why = "over agent.instructions_max_bytes"
                else:
                    why, data = None, fh.read(left + 1)
            if why:
                notes.append("%s skipped: %s" % (shown, why))
                continue
            if b"\0" in data[:8192]:
                notes.append("%s skipped: a binary file" % shown)
                continue
            cut = len(data) > left
            text = data[:left].decode("utf-8", "replace").strip()
            left -= min(len(data), left)
            if cut:
                notes.append("%s cut at agent.instructions_max_bytes (%d bytes in all)" % (shown, max_bytes))
                text += "\n[… cut: agent.instructions_max_bytes]"
            if text:
                files.append(shown)
                blocks.append("--- %s ---\n%s" % (shown, text))
    if not blocks:
        return ProjectInstructions(notes=notes)
    text = ("Project instructions (%s; the nearest comes last and wins where they differ). Follow them unless "
            "they conflict with the rules above or with what the person asks:\n\n%s"
            % (", ".join(files), "\n\n".join(blocks)))
    return ProjectInstructions(files, text, notes)


def project_instructions(cfg, working_dir):
    """The configured project instructions for a working directory."""
    return load_instructions(working_dir, cfg.get("agent.instructions_files"),
                             cfg.get("agent.instructions_max_bytes"), home=os.path.expanduser("~"))


class Workspace:
    """What a process that opens many sessions in one working directory with one configuration (a watcher: a
    session per event) reads once, then only checks for change: the project instructions, the skills, and the
    tools' configuration, credentials list and audit log. Never shared across directories or configurations.

    INFO: the instructions are read again when a stat of any file they come from (or could: every name in every
    directory instruction_dirs gives) differs, or when one was changed within RACY_SECONDS of being read (a
    write in the same clock tick keeps the mtime, as git's "racily clean" index entries). Skills are kept only
    while no skills directory exists; where one does, every session reads them (their trust is checked against
    their content's digest, which a stat of the folders cannot vouch for)."""

    RACY_SECONDS = 2.0

    def __init__(self, cfg, working_dir):
        import threading
        self.cfg = cfg
        self.root = working_dir  #: the working directory (the Confinement's root)
        self.lock = threading.Lock()
        self._instructions = None  #: (signature, ProjectInstructions) while the files are as they were
        self._no_skills = None  #: the signature of the skill places while none of them exists
        self.tools_config = cfg.section("agent.tools")  #: read-only, shared by every session's ToolContext
        self.audit = xzatoma_tools.AuditLog(os.path.join(cfg.home, "audit.log"),
                                            cfg.get("agent.terminal.audit_max_bytes"),
                                            redact=xzatoma_store.Redactor(cfg.secret_values()))

    def instructions(self):
        signature = self._instruction_files()
        with self.lock:
            if self._instructions is not None and self._instructions[0] == signature:
                return self._instructions[1]
        instructions = project_instructions(self.cfg, self.root)
        settled = time.time() - self.RACY_SECONDS
        if all(st is None or st[-1] < settled * 1e9 for _, st in signature):
            with self.lock:
                self._instructions = (signature, instructions)
        return instructions

    def _instruction_files(self):
        names = self.cfg.get("agent.instructions_files") or ()
        paths = [os.path.join(d, n) for d in instruction_dirs(self.root, os.path.expanduser("~")) for n in names]
        return tuple((path, _stat_key(path)) for path in paths)

    def skills(self, console, store):
        """session_skills, without looking again while there are none to find."""
        if not self.cfg.get("agent.skills.enabled"):
            return []
        signature = tuple(_stat_key(os.path.join(base, rel), follow=False)
                          for _, base, rel, _ in skill_places(self.cfg, os.path.realpath(self.root)))
        if any(signature):
            return session_skills(self.cfg, console, self.root, store)
        if self._no_skills != signature:
            skills = session_skills(self.cfg, console, self.root, store)
            if skills:
                return skills
            self._no_skills = signature
        return []

    def tool_context(self, confinement, store, conversation_id=None, **fields):
        """tool_context with what does not change per session made once."""
        return xzatoma_tools.ToolContext(confinement, self.tools_config, store=store, conversation_id=conversation_id,
                                         audit=self.audit, **fields)


def _stat_key(path, follow=True):
    """What a stat of `path` says of its identity and content (lstat, and stat through a link), or None when it
    does not exist; ends with its latest mtime and ctime in ns."""
    keys = []
    for fn in (os.lstat, os.stat) if follow else (os.lstat,):
        try:
            st = fn(path)
        except OSError:
            keys.append(None)
            continue
        keys.append((st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    if all(k is None for k in keys):
        return None
    return tuple(keys) + (max(t for k in keys if k is not None for t in k[-2:]),)


def show_instructions(console, instructions):
    """--verbose: which project instructions the model gets, and what was skipped."""
    console.debug("project instructions: %s" % instructions.describe())
    for note in instructions.notes:
        console.debug("  " + note)


def system_prompt(toolset, tool_names, compact=False):
    """The system prompt: the same bytes for every directory, day and project, so that a server's prompt cache
    (llama.cpp, vLLM, hosted APIs) keeps the system prompt and the tool definitions after it; what varies
    goes in environment_message. Its words match how calls may be made: natively or written as text. The
    compact tool profile (small models) gets fewer words and one example of a call."""
    if compact:
        return "\n".join([
            "You are XZatoma, an agent that does tasks in the working directory by calling tools. You act: you "
            "never explain to the person how to do the task.",
            "Mode: %s. %s" % (toolset.upper(), "You can read files; you cannot change them." if toolset == "planning"
                              else "You can read and change files and run commands."),
            "Tools: %s." % (", ".join(tool_names) or "none"),
            "",
            "Each reply is either ONE tool call or the final answer.",
            'A tool call is a JSON object: {"name": "<tool name>", "arguments": {<arguments>}}',
            'Example: {"name": "read_file", "arguments": {"path": "notes.txt"}}',
            "After each call you get its result; then make the next call. Never write a tool's result yourself.",
            "Paths are relative to the working directory: notes.txt, not /notes.txt.",
            "To change a file: read it, then edit_file replaces old_text with new_text (replace_all: true for "
            "every occurrence); write_file creates a file or replaces all of its content.",
            "When the task is done, give the final answer: one or two sentences with what you did or found.",
        ])
    mode_text = PLANNING_PROMPT if toolset == "planning" else WRITE_PROMPT
    return "\n".join([
        "You are XZatoma, an autonomous agent that completes tasks by calling tools.",
        "",
        "Mode: %s" % toolset.upper(),
        mode_text,
        "",
        "Available tools: %s." % (", ".join(tool_names) or "none"),
        "",
        "Rules:",
        "- Do the task yourself by calling tools: never tell the person which commands to run or what to edit.",
        "- Use the tools to find facts and to make changes; never guess file contents or command output, and "
        "never say you changed something you did not change with a tool.",
        "- Work one step at a time: call a tool, read its result, then decide the next step.",
        "- Paths are relative to the working directory; paths outside it are refused.",
        "- When a tool returns 'Error: …', read the message and adapt; do not repeat the same failing call.",
        "- When the task has steps (a plan's instructions, or several of your own), track them with "
        "update_progress: a step in_progress when you start it, done when it is finished.",
        "- When a skill listed in the environment message fits the task, load it with activate_skill first.",
        "- When the task is done, reply without a tool call: say briefly what you did and what you found.",
    ])


ENVIRONMENT = "environment"  #: the name of the user message that carries what varies (working directory, date …)
NOTE = "xzatoma"  #: the name of user messages xzatoma itself adds (a correction, a nudge), not a person's


def environment_message(working_dir, instructions=None, depth=0, label=None, today=None, catalog=""):
    """What varies between runs, as a user message after the system prompt (codex's environment context):
    the working directory, the date, a subagent's place, the project instructions (AGENTS.md …) and the
    skills' catalog."""
    lines = ["<environment_context>", "  <cwd>%s</cwd>" % working_dir,
             "  <date>%s</date>" % (today or time.strftime("%Y-%m-%d")), "</environment_context>"]
    if depth:
        lines.append("You are a subagent (label %r, depth %d) working for another agent. Do the task, then answer "
                     "with your findings." % (label, depth))
    if instructions is not None and instructions.text:
        lines += ["", instructions.text]
    if catalog:
        lines += ["", catalog]
    # redacted as every tool result is: a key quoted in AGENTS.md reached the model whole here, and as
    # [REDACTED] through read_file of the same file (round 19d)
    return {"role": "user", "name": ENVIRONMENT, "content": xzatoma_store.redact("\n".join(lines))}


# ---- Persistence glue: recording, history, replay ----


def open_store(cfg, console, required=False, deadline=None, changes=False):
    """The conversation store, or None (with one warning) when it cannot be used.

    An unwritable or corrupt database never stops a task; history commands
    (required=True) fail with the reason instead. `deadline` (time.monotonic()): a run's time limit, which no
    wait for another process's lock on the database outlasts. `changes` ("run" or "chat"): for a session whose
    tools may change files, the warning says their undo records last only as long as this process (MemoryUndo).
    """
    if not cfg.get("agent.persistence.enabled"):
        if required:
            raise UsageError("conversation history is turned off (agent.persistence.enabled: false)")
        return None
    try:
        private_home(cfg.home)
        store = xzatoma_store.Store(cfg.db_path(), secrets=cfg.secret_values())
        store.deadline = deadline
        store.open()
        store.reap()
        return store
    except Exception as exc:  # StoreError, sqlite3.Error, OSError: all mean "no history this time"
        exc = xzatoma_store.describe_error(exc)
        if cfg.get("agent.persistence.db_path"):  # the key that chose it, named beside its path
            exc = str(exc).replace(cfg.db_path(), "%s (agent.persistence.db_path)" % cfg.db_path(), 1)
        if required:
            raise UsageError(str(exc))
        console.warn("%s; continuing without conversation history%s" % (one_line(exc, 240), {
            "run": ": file changes this run makes cannot be undone afterwards ('xzatoma undo' will not see them)",
            "chat": ": file changes can be undone with /undo until this chat ends, not by 'xzatoma undo' later",
        }.get(changes, "")), once_key="store")
        return None


def safety_of(ctx):
    """The safety a conversation runs with, in chat's words (run without --allow-dangerous: 'restricted')."""
    return {"interactive": "safe", "full_autonomous": "yolo"}.get(ctx.autonomy, "restricted")


class Recorder:
    """Writes a conversation to the store as it happens; a failing store is dropped with one warning.

    Inside `held()` (a run, a session's start) writes wait in memory and go to the store in one transaction at
    the next flush(): the Agent flushes before every model request and every tool call, and the last held() ends
    with one. So whatever was said before a wait is stored before it (a kill -9 while the model thinks or a
    command runs loses nothing said), and a step's messages cost one commit instead of one each (issue 22)."""

    def __init__(self, store, console, conversation_id, hold_over=None):
        self.store = store
        self.console = console
        self.id = conversation_id
        self.resume_id = None
        self.pending = []  #: (store method, args, kwargs) held back until the next flush
        self.holding = 0  #: how many held() blocks are open
        #: a message estimated over these tokens waits, with every message after it, for settle(): a task that
        #: may be refused as too large (Agent.ask_model) is stored cut if it is (TASK_HELD_OVER)
        self.hold_over = hold_over
        self.deferred = []  #: (store method, args, kwargs) of the messages waiting for settle()

    def attach(self, conversation):
        conversation.on_append = self.append
        conversation.on_replace = self.replace
        return self

    def _guard(self, fn, *args, **kw):
        if self.store is None:
            return None
        try:
            return fn(*args, **kw)
        except Exception as exc:
            self.console.warn("cannot write conversation history (%s); continuing without it"
                              % one_line(xzatoma_store.describe_error(exc), 200), once_key="store-write")
            self.store = None
            self.pending = []
            return None

    def _write(self, method, *args, **kw):
        if self.store is None:
            return
        if self.holding:
            self.pending.append((method, args, kw))
        else:
            self._guard(getattr(self.store, method), *args, **kw)

    def held(self):
        """`with recorder.held():` writes wait for the next flush (at the latest, the end of the outermost block).
        Flush before anything that waits (a model request, a tool, a person) inside it."""
        return _Held(self)

    def flush(self):
        """Write what is held back, in one transaction."""
        if not self.pending or self.store is None:
            return
        pending, self.pending = self.pending, []
        store = self.store

        def write():
            with store.batch():
                for method, args, kw in pending:
                    getattr(store, method)(*args, **kw)
        try:
            self._guard(write)
        except BaseException:  # Ctrl-C in the middle: rolled back, so written at the next flush
            self.pending = pending + self.pending
            raise

    def start(self, **fields):
        self._write("start_conversation", self.id, **fields)

    def resume(self, **fields):
        self._write("resume_conversation", self.id, **fields)

    def append(self, message):
        # a copy: the message as it is now is what is stored, whenever the write happens
        tokens = estimate_tokens(message)
        if self.deferred or (self.hold_over is not None and tokens > self.hold_over):
            self.deferred.append(("append_message", (self.id, dict(message), tokens), {}))
        else:
            self._write("append_message", self.id, dict(message), tokens)

    def settle(self):
        """The messages that waited for the verdict on the task's size are written (held, or at once). Given
        once: later messages are never refused, and they are stored before each wait as ever."""
        deferred, self.deferred, self.hold_over = self.deferred, [], None
        for method, args, kw in deferred:
            self._write(method, *args, **kw)

    def replace(self, old, new):
        """A message rewritten before it was stored is stored as rewritten (the store never rewrites a row)."""
        for held in (self.pending, self.deferred):
            for i, (method, args, kw) in enumerate(held):
                if method == "append_message" and args[1].get("content") is old.get("content"):
                    held[i] = (method, (args[0], dict(new), estimate_tokens(new)), kw)

    def progress(self, result):
        self._write("update_conversation", self.id, **result.counts())

    def save_progress(self, snapshot):
        """The conversation's steps as they are now (Progress.snapshot())."""
        self._write("update_conversation", self.id, progress=json.dumps(snapshot, ensure_ascii=False))

    def finish(self, result):
        self._write("finish_conversation", self.id, result.status, error=result.error,
                    review="\n".join(result.review) or None, **result.counts())


class _Held:
    def __init__(self, recorder):
        self.recorder = recorder

    def __enter__(self):
        self.recorder.holding += 1
        return self.recorder

    def __exit__(self, kind, exc, tb):
        self.recorder.holding -= 1
        if not self.recorder.holding:
            self.recorder.flush()
        return False


def load_history(store, conversation_id):
    """Stored messages as conversation messages (without the stored system prompt). A damaged row is left out,
    and the tool results right after it (their call went with it: a provider refuses results without one)."""
    messages, dropped = [], False
    for i, msg in enumerate(store.messages(conversation_id)):
        msg.pop("created_at", None)
        if i == 0 and msg["role"] == "system":
            continue
        if msg.pop("damaged", None) or (dropped and msg["role"] == "tool"):
            dropped = True
            continue
        dropped = False
        messages.append(msg)
    return messages


def damaged_note(msg):
    """' [damaged row: …]' for a stored message that is not what xzatoma writes, else ''."""
    return " [damaged row: %s]" % msg["damaged"] if msg.get("damaged") else ""


def _plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


ESTIMATED_NOTE = " (estimated: the server sent no usage)"


def _fmt_tokens(n):
    return "{:,}".format(n or 0)


def local_time(stamp):
    """A stored UTC time (RFC 3339) as local 'YYYY-MM-DD HH:MM' (the header names the zone)."""
    import calendar
    try:
        seconds = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return (stamp or "").replace("T", " ")[:16]
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def short_dir(path, width=28):
    """A working directory for a column: ~ for the home directory, the end kept when it is long."""
    if not path:
        return "-"
    home = os.path.expanduser("~")
    if path == home or path.startswith(home.rstrip(os.sep) + os.sep):
        path = "~" + path[len(home):]
    return path if len(path) <= width else "…" + path[-(width - 1):]


_LINE = "%-12s  %-16s  %-8s %-11s %8s %9s  %-28s  %s"


def conversation_header():
    return _LINE % ("ID", "STARTED (%s)" % (time.strftime("%Z") or "local"), "KIND", "STATUS", "TURNS", "TOKENS",
                    "DIRECTORY", "TITLE")


def conversation_line(c):
    tokens = (c.get("prompt_tokens") or 0) + (c.get("completion_tokens") or 0)
    return _LINE % (c["id"][:12], local_time(c.get("started_at")), c["kind"], c["status"],
                    _plural(c.get("turns") or 0, "turn"), _fmt_tokens(tokens), short_dir(c.get("working_dir")),
                    one_line(c.get("title") or "", 60))


class history_store:
    """`with history_store(args, console) as store:` for commands that read the store: an unknown id is a
    usage error, and the database is closed afterwards."""

    def __init__(self, args, console):
        self.store = open_store(config_from_args(args, console), console, required=True)

    def __enter__(self):
        return self.store

    def __exit__(self, kind, exc, tb):
        self.store.close()
        if isinstance(exc, (xzatoma_store.NotFound, xzatoma_store.Busy)):
            raise UsageError(str(exc))
        return False


def _build_history(sub, common, fmt):
    history = sub.add_parser("history", parents=[common], formatter_class=fmt, help=COMMAND_HELP["history"],
                             description="Every run and chat is stored in $XZATOMA_HOME/conversations.db as it "
                                         "happens. Ids match by unique prefix.")
    hsub = history.add_subparsers(dest="history_command", metavar="ACTION")
    h = hsub.add_parser("list", parents=[common], help="newest first: id, started (local time), kind, status, turns, "
                                                       "tokens, directory, title")
    h.add_argument("--limit", type=int, default=20, metavar="N")
    h.add_argument("--here", action="store_true", help="only conversations that ran in the current directory")
    h.add_argument("--kind", choices=("chat", "run", "plan", "subagent", "watch"))
    h.add_argument("--json", action="store_true", help="print a JSON array of conversation objects")
    h = hsub.add_parser("show", parents=[common], help="the transcript of one conversation")
    h.add_argument("id")
    h.add_argument("--full", action="store_true", help="do not shorten tool calls and results")
    h.add_argument("--json", action="store_true", help="one object: the conversation's fields and its messages")
    h = hsub.add_parser("search", parents=[common], help="conversations whose messages contain TEXT")
    h.add_argument("text")
    h.add_argument("--limit", type=int, default=20, metavar="N")
    h.add_argument("--json", action="store_true")
    h = hsub.add_parser("delete", parents=[common], help="remove a conversation, its subagents and undo records")
    h.add_argument("id")
    h.add_argument("--force", action="store_true", help="delete it even while it is marked running by a process "
                                                        "that may live (one of another host or container, which "
                                                        "cannot be checked from here)")
    h = hsub.add_parser("prune", parents=[common], help="remove conversations older than an age")
    h.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 2w (under an hour asks first)")
    h.add_argument("--yes", "-y", action="store_true", help="do not ask (needed without a terminal for ages under "
                                                           "an hour, such as 0d)")
    history.set_defaults(func=cmd_history)


PRUNE_ASK_BELOW_SECONDS = 3600  # '0d', '30' (seconds, meant as days): an age this short deletes nearly all


def cmd_history(args, console):
    action = args.history_command
    if action is None:
        raise UsageError("say what to do: xzatoma history list|show|search|delete|prune (see --help)")
    out = CleanWriter(sys.stdout)
    with history_store(args, console) as store:
        if action == "list":
            here = os.path.realpath(current_dir()) if args.here else None
            rows = store.list_conversations(args.limit, args.kind, working_dir=here)
            if args.json:
                json_out(rows)
            else:
                if not rows:
                    console.info("no conversations in %s yet" % here if here else "no conversations yet")
                else:
                    out.write(conversation_header() + "\n")
                for row in rows:
                    out.write(conversation_line(row) + "\n")
        elif action == "show":
            cid = store.resolve(args.id)
            conv = store.conversation(cid)
            messages = store.messages(cid)
            if args.json:
                conv["messages"] = [dict({"role": m["role"], "content": m["content"],
                                          "tool_calls": m.get("tool_calls"), "tool_call_id": m.get("tool_call_id"),
                                          "name": m.get("name"), "created_at": m.get("created_at")},
                                         **({"damaged": m["damaged"]} if m.get("damaged") else {}))
                                     for m in messages]
                json_out(conv)
            else:
                out.write(render_transcript(conv, messages, full=args.full))
        elif action == "search":
            rows = store.search(args.text, args.limit)
            if args.json:
                json_out(rows)
            else:
                if not rows:
                    console.info("no conversation contains %r" % args.text)
                else:
                    out.write(conversation_header() + "\n")
                for row in rows:
                    out.write(conversation_line(row) + "\n    … %s\n" % one_line(row["snippet"], 100))
        elif action == "delete":
            cid = store.resolve(args.id)
            n = store.delete_conversation(cid, force=args.force)
            console.info("deleted conversation %s%s" % (cid, " and %d subagent conversations" % (n - 1) if n > 1 else ""))
        elif action == "prune":
            try:
                seconds = xzatoma_store.parse_age(args.older_than)
            except ValueError as exc:
                raise UsageError("--older-than: %s" % exc)
            doomed = store.older_than(seconds)
            if doomed and seconds < PRUNE_ASK_BELOW_SECONDS and not args.yes:
                question = "delete %s (everything last used more than %s ago)? [y/N] " % (
                    _plural(len(doomed), "conversation"), args.older_than)
                if not (_isatty(sys.stdin) and _isatty(sys.stderr)):
                    raise UsageError("--older-than %s would delete %s, nearly everything: add --yes to confirm"
                                     % (args.older_than, _plural(len(doomed), "conversation")))
                sys.stderr.write(question)
                sys.stderr.flush()
                if stdin_line().strip().lower() not in ("y", "yes"):
                    console.info("nothing deleted")
                    return EXIT_OK
            n = store.prune_older_than(seconds)
            console.info("deleted %d conversation%s older than %s" % (n, "" if n == 1 else "s", args.older_than))
        return EXIT_OK


def _short(text, full, width=200):
    text = text or ""
    if full or len(text) <= width:
        return text
    return text[:width].rstrip() + "… (%d more characters; --full shows all)" % (len(text) - width)


def render_transcript(conv, messages, full=False):
    lines = ["conversation %s  %s  %s" % (conv["id"], conv["kind"], conv["status"]),
             "started %s · %s/%s · mode %s · safety %s · %s" % (
                 conv["started_at"], conv.get("provider") or "?", conv.get("model") or "?", conv.get("mode") or "?",
                 conv.get("safety") or "?", conv.get("working_dir") or "?"),
             "%s · %s · %s tokens%s" % (
                 _plural(conv.get("turns") or 0, "turn"), _plural(conv.get("tool_calls") or 0, "tool call"),
                 _fmt_tokens((conv.get("prompt_tokens") or 0) + (conv.get("completion_tokens") or 0)),
                 (" · error: " + conv["error"]) if conv.get("error") else "")]
    if conv.get("review"):  # the files that run later by design the run changed
        lines.append("review before running anything (changed, they run code later): " +
                     ", ".join(conv["review"].split("\n")))
    lines.append("")
    for msg in messages:
        role = msg["role"]
        if msg.get("damaged"):
            lines.append("[%s]%s %s" % (role, damaged_note(msg), _short(msg["content"], full, 200)))
        elif role == "system":
            lines.append("[system] " + _short(msg["content"], full, 120))
        elif role == "user":
            lines.append("[%s] " % (msg.get("name") or "user") + _short(msg["content"], full, 2000))
        elif role == "assistant":
            if msg.get("content"):
                lines.append("[assistant] " + _short(msg["content"], full, 4000))
            for call in msg.get("tool_calls") or ():
                args = call.get("arguments") or ""
                lines.append("  ▶ %s %s" % (call["name"], args if full else
                                             one_line(xzatoma_store.preview_arguments(args), 100)))
        elif role == "tool":
            lines.append("  ← %s: %s" % (msg.get("name") or "tool", _short(msg["content"], full, 200)
                                         if full else one_line(msg["content"], 120)))
    return "\n".join(lines) + "\n"


def _build_replay(sub, common, fmt):
    replay = sub.add_parser("replay", parents=[common], help=COMMAND_HELP["replay"],
                            description="Replay a stored conversation turn by turn: instructions, tool calls, "
                                        "results and answers.")
    replay.add_argument("id")
    replay.add_argument("--tree", action="store_true", help="print the subagent tree below it instead")
    replay.set_defaults(func=cmd_replay)


def cmd_replay(args, console):
    with history_store(args, console) as store:
        cid = store.resolve(args.id)
        conv = store.conversation(cid)
        out = CleanWriter(sys.stdout)  # what the model, files and commands said, shown never obeyed
        if args.tree:
            out.write(tree_line(conv, 0) + "\n")
            for child, level in store.descendants(cid):
                out.write(tree_line(child, level) + "\n")
            return EXIT_OK
        out.write("replay of %s (%s, %s)\n" % (cid, conv["kind"], conv["status"]))
        for msg in store.messages(cid):
            if msg["role"] == "user" and msg.get("name") == ENVIRONMENT:
                continue  # the working directory and AGENTS.md: `history show` has them
            if msg.get("damaged"):
                out.write("  (%s%s: %s)\n" % (msg["role"], damaged_note(msg), one_line(msg["content"], 100)))
            elif msg["role"] == "user" and msg.get("name"):
                out.write("  (%s: %s)\n" % (msg["name"], one_line(msg["content"], 100)))
            elif msg["role"] == "user":
                out.write("\n» %s\n" % msg["content"])
            elif msg["role"] == "assistant":
                for call in msg.get("tool_calls") or ():
                    out.write("▶ %s %s\n" % (call["name"],
                                              one_line(xzatoma_store.preview_arguments(call.get("arguments")), 80)))
                if msg.get("content") and not msg.get("tool_calls"):
                    out.write("\n%s\n" % msg["content"])
                elif msg.get("content"):
                    out.write("  %s\n" % one_line(msg["content"], 100))
            elif msg["role"] == "tool":
                ok = not (msg["content"] or "").startswith("Error: ")
                text = (msg["content"] or "").strip()
                if ok and msg.get("name") == "update_progress":  # the list, as the run showed it
                    out.write("".join("  %s\n" % one_line(line, 120) for line in text.splitlines()[:MAX_SHOWN_STEPS]))
                    continue
                first = text.splitlines()[0] if text else "(no output)"
                more = text.count("\n")
                out.write("  %s %s%s\n" % ("✓" if ok else "✗", one_line(first, 100),
                                           "  (+%d lines)" % more if more else ""))
        if conv.get("progress"):  # where the steps stood at the end (also when the model never marked them)
            lines = Progress.restore(conv["progress"]).lines()
            if len(lines) > 1:
                out.write("\n" + "".join("%s\n" % one_line(line, 120) for line in lines[:MAX_SHOWN_STEPS]))
        if conv.get("error"):
            out.write("\n(%s: %s)\n" % (conv["status"], conv["error"]))
        return EXIT_OK


MAX_SHOWN_STEPS = 101  #: lines of a progress list replay shows (its heading and the steps a list may hold)


def _build_undo(sub, common, fmt):
    undo = sub.add_parser("undo", parents=[common], formatter_class=fmt, help=COMMAND_HELP["undo"],
                          description="Before a tool overwrites, edits, moves over or deletes a file, its previous "
                                      "content is saved. undo puts the most recent change back; files the agent "
                                      "created are removed. A path that changed since the agent touched it is "
                                      "left alone unless --force.")
    undo.add_argument("--all", action="store_true", help="undo every change of the most recent conversation "
                                                         "(or of --conversation), newest first")
    undo.add_argument("--conversation", metavar="ID", help="only changes made in this conversation")
    undo.add_argument("--list", action="store_true", help="show what can be undone")
    undo.add_argument("--force", action="store_true", help="restore even over later changes")
    undo.add_argument("--all-projects", "--global", action="store_true",
                      help="changes made in any directory (default: conversations run in the current one)")
    undo.set_defaults(func=cmd_undo)


def cmd_undo(args, console):
    with history_store(args, console) as store:
        conversation = store.resolve(args.conversation) if args.conversation else None
        here = None if conversation or args.all_projects else os.path.realpath(current_dir())
        records = store.undo_records(conversation_id=conversation, working_dir=here)
        if args.list:
            if not records:
                console.info("nothing to undo")
            for r in records:
                what = {"absent": "created", "moved": "moved to %s" % (r["content"] or b"").decode("utf-8", "replace"),
                        "file": "changed", "dir": "directory changed", "link": "link changed"}.get(r["kind"], r["kind"])
                CleanWriter(sys.stdout).write("#%-5d %s  %s  %-12s %s (%s)\n" % (
                    r["id"], r["created_at"].replace("T", " ")[:16], (r["conversation_id"] or "-")[:12], r["tool"],
                    r["path"], what))
            return EXIT_OK
        if not records:
            console.info("nothing to undo%s" % (" in %s (--all-projects looks everywhere)" % here if here else ""))
            return EXIT_OK
        if args.all:
            conversation = conversation or records[0]["conversation_id"]
            chosen = [r for r in records if r["conversation_id"] == conversation]
        else:
            chosen = records[:1]
        failed = 0
        for record in chosen:  # newest first
            try:
                CleanWriter(sys.stdout).write(xzatoma_tools.undo_change(store, record, force=args.force) + "\n")
            except (xzatoma_tools.UndoError, OSError) as exc:
                failed += 1
                console.error(str(exc))
                if not args.all:
                    break
        return EXIT_FAILED if failed else EXIT_OK


def _build_models(sub, common, fmt):
    models = sub.add_parser("models", parents=[common], formatter_class=fmt, help=COMMAND_HELP["models"],
                            description="List the provider's models with their context window and tool-call "
                                        "support; * marks the configured one. Cached for 5 minutes.")
    models.add_argument("--json", action="store_true", help="print one JSON object")
    models.add_argument("--refresh", action="store_true", help="ignore the 5-minute cache")
    models.set_defaults(func=cmd_models)


def cmd_models(args, console):
    cfg = config_from_args(args, console)
    provider = make_provider(cfg, console)
    store = open_store(cfg, console)
    key = "%s|%s" % (provider.name, getattr(provider, "host", None) or provider.cfg.get("provider.%s.%s" % (
        provider.name, "api_url" if provider.name == "copilot" else "base_url")))
    rows = None
    if store is not None and not args.refresh:
        try:
            rows = store.model_cache_get(provider.name, key, 300)
        except Exception:
            rows = None
    if rows is None:
        rows = model_table(provider)
        if store is not None:
            try:
                store.model_cache_put(provider.name, key, rows)
            except Exception:
                pass
    for row in rows:
        row["configured"] = row["id"] == provider.model
    if args.json:
        json_out({"provider": provider.name, "configured": provider.model, "models": rows})
        return EXIT_OK
    width = max([len(r["id"]) for r in rows] + [5])
    out = CleanWriter(sys.stdout)  # model names come from the server
    out.write("  %-*s  %9s  %s\n" % (width, "MODEL", "CONTEXT", "TOOLS"))
    for r in rows:
        tools = {True: "yes", False: "no", None: "?"}[r["tools"]]
        out.write("%s %-*s  %9s  %s\n" % ("*" if r["configured"] else " ", width, r["id"],
                                                  _fmt_tokens(r["context_window"]) if r["context_window"] else "?",
                                                  tools))
    if not any(r["configured"] for r in rows):
        console.warn("the configured model '%s' is not in this list" % provider.model)
    return EXIT_OK


def _build_auth(sub, common, fmt):
    auth = sub.add_parser("auth", parents=[common], formatter_class=fmt, help=COMMAND_HELP["auth"],
                          description="Credentials live in the system keyring (service 'xzatoma') or, where none "
                                      "works, in $XZATOMA_HOME/credentials.json (mode 0600) — never in the config "
                                      "file. Environment variables override them: COPILOT_API_TOKEN, GITHUB_TOKEN, "
                                      "OPENAI_API_KEY, OLLAMA_API_KEY.",
                          epilog="examples:\n  xzatoma auth login                      # GitHub device flow for Copilot\n"
                                 "  echo \"$KEY\" | xzatoma auth login --provider openai\n  xzatoma auth status")
    asub = auth.add_subparsers(dest="auth_command", metavar="ACTION")
    a = asub.add_parser("login", parents=[common], help="sign in (Copilot: GitHub device flow; others: an API key)")
    a.set_defaults(func=cmd_auth)
    a = asub.add_parser("logout", parents=[common], help="remove stored credentials")
    a.set_defaults(func=cmd_auth)
    a = asub.add_parser("status", parents=[common], help="where each credential comes from and whether it works")
    a.set_defaults(func=cmd_auth)
    auth.set_defaults(func=cmd_auth)


def cmd_auth(args, console):
    cfg = config_from_args(args, console)
    creds = CredentialStore(cfg.home, console)
    action = args.auth_command
    if action is None:
        raise UsageError("say what to do: xzatoma auth login|logout|status (see --help)")
    names = [args.provider] if args.provider else (["copilot", "openai", "ollama"] if action == "status"
                                                   else [cfg.provider_type])
    if action == "login":
        name = names[0]
        if name == "copilot":
            github = copilot_device_login(cfg, console, creds)
            token = exchange_copilot_token(cfg, github)  # proves the account has Copilot
            where = creds.set("github_token", github)
            creds.set("copilot_token", json.dumps(token))
            console.info("Logged in to GitHub Copilot; the GitHub token is stored in %s" % creds.describe(where))
            return EXIT_OK
        if _isatty(sys.stdin):
            import getpass
            key = getpass.getpass("%s API key (input hidden): " % name, stream=sys.stderr)
        else:
            key = stdin_line()
        key = key.strip()
        if not key:
            raise UsageError("no key given; nothing was stored")
        where = creds.set(KEY_NAMES[name], key)
        console.info("stored the %s API key in %s" % (name, creds.describe(where)))
        return EXIT_OK
    if action == "logout":
        for name in names:
            removed = [w for key in CREDENTIAL_KEYS[name] for w in creds.delete(key)]
            console.info("removed stored %s credentials (%s)" % (name, ", ".join(sorted(set(removed))))
                         if removed else "no stored %s credentials" % name)
        return EXIT_OK
    failed = False
    creds.reindex()  # the keyring itself is asked here: an entry made with another tool is found from now on
    for name in names:
        line, ok = auth_status_line(cfg, console, name, asked=bool(args.provider))
        failed |= not ok
        CleanWriter(sys.stdout).write(line + "\n")
    CleanWriter(sys.stdout).write(creds.where_stored() + "\n")
    return EXIT_OK if not failed or args.provider is None else EXIT_FAILED


#: what sets up a provider nobody configured (auth status asks no server for those)
UNCONFIGURED_HINTS = {
    "copilot": "no Copilot credentials (xzatoma auth login, or COPILOT_API_TOKEN / GITHUB_TOKEN)",
    "openai": "no API key or address (OPENAI_API_KEY, OPENAI_BASE_URL, or xzatoma auth login --provider openai)",
    "ollama": "no address or key (OLLAMA_HOST or provider.ollama.host)"}


def provider_configured(cfg, console, name):
    """Whether a person set this provider up: it is the active one, or it has credentials, or its address
    was given in the configuration or the environment. Nothing is asked of any server."""
    if name == cfg.provider_type:
        return True
    if name == "copilot":
        return bool(cfg.secret("copilot") or cfg.secret("github")
                    or CredentialStore(cfg.home, console).get("github_token")[0])
    address = "provider.ollama.host" if name == "ollama" else "provider.openai.base_url"
    return cfg.sources.get(address, "default") != "default" or bool(stored_key(cfg, console, name)[0])


def auth_status_line(cfg, console, name, asked=False):
    """'provider  source  verdict' with one cheap request, for a provider that is configured (or `asked`
    for by name); never shows a secret."""
    quiet = Console(quiet=True, verbose=False, color=False)
    if not asked and not provider_configured(cfg, quiet, name):
        return "%-8s %-24s not configured: %s; nothing asked" % (name, "none", UNCONFIGURED_HINTS[name]), True
    try:
        if name == "copilot":
            auth = CopilotAuth(cfg, quiet)
            source = auth.source()
            provider = CopilotProvider(cfg, quiet, auth=auth)
            provider.max_retries = 0
            count = len(provider.models())
            expires = (auth.current or {}).get("expires_at")
            when = (" · Copilot token expires %s (in %d min)" % (
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)), max(0, (expires - time.time()) // 60))
                if expires else "")
            return "%-8s %-24s works: %d models%s" % (name, source, count, when), True
        key, source = stored_key(cfg, quiet, name)
        provider = make_provider(cfg, quiet, name)
        provider.max_retries = 0
        count = len(provider.models())
        return "%-8s %-24s works: %d models" % (name, source or "none", count), True
    except CredentialsError as exc:
        return "%-8s %-24s %s" % (name, locals().get("source") or "none", one_line(exc, 160)), False
    except XzError as exc:
        return "%-8s %-24s fails: %s" % (name, locals().get("source") or "none", one_line(exc, 160)), False


def tree_line(conv, level):
    tokens = (conv.get("prompt_tokens") or 0) + (conv.get("completion_tokens") or 0)
    label = conv.get("label") or one_line(conv.get("title") or "", 40)
    indent = "" if level == 0 else "   " * (level - 1) + "└─ "
    return "%s%s [%s] depth %d · %s · %s tokens · %s" % (
        indent, conv["id"][:12], label, conv.get("depth") or 0, _plural(conv.get("turns") or 0, "turn"),
        _fmt_tokens(tokens), conv["status"])


# ---- Chat: @mentions ----

#: where a mention may start: at the start, after a blank or after an opening bracket or quote ("(@url:…)")
MENTION_START = r'(?:(?<=[\s(\[{<"\'])|^)'
MENTION_PATTERN = MENTION_START + r'(\\?)@(?:(url):(\S+)|(search|grep):"((?:[^"\\]|\\.)*)"|([^\s"\'`]+))'
TRAILING = ",.;:!?)]}>'\""


def strip_trailing(text):
    """A mention without the sentence's punctuation after it: TRAILING characters are dropped from the end, a
    closing bracket only while it has no partner in the mention (…/Foo_(bar) keeps its own). One rule for @url
    and @path (round 19a: '@url:http://…/doc.' fetched /doc.); a path that exists as written is not stripped."""
    pairs = {")": "(", "]": "[", "}": "{", ">": "<"}
    counts = {c: text.count(c) for c in "()[]{}<>"}
    end = len(text)
    while end and text[end - 1] in TRAILING:
        close = text[end - 1]
        if close in pairs and counts[pairs[close]] >= counts[close]:
            break
        if close in pairs:
            counts[close] -= 1
        end -= 1
    return text[:end]


class Mentions:
    """Expands @path, @path#L10-20, @dir/, @search:"…", @grep:"…" and @url:… through the jailed tools."""

    def __init__(self, registry_factory, console, cfg):
        self.registry_factory = registry_factory  # read-only registry over the session's context
        self.console = console
        self.cfg = cfg
        self.files = {}  # (real path, range) -> (mtime, text)

    def expand(self, text):
        """(text for the model, number of mentions). Failures become blocks that say what went wrong."""
        import re
        blocks, count, urls = [], 0, 0
        registry = None
        for m in re.finditer(MENTION_PATTERN, text):
            if m.group(1):  # \@ escapes a mention
                continue
            if registry is None:
                registry = self.registry_factory()
            count += 1
            label = m.group(0).lstrip("\\")
            if m.group(2):
                urls += 1
                if urls > self.cfg.get("agent.mentions.max_urls_per_request"):
                    blocks.append(self._failed(label, "too many URLs in one message (agent.mentions."
                                                      "max_urls_per_request)", None))
                    continue
                url = strip_trailing(m.group(3))
                blocks.append(self._url(registry, "@url:" + url, url))
            elif m.group(4):
                pattern = m.group(5).replace('\\"', '"')
                args = {"pattern": pattern, "max_results": 100}
                if m.group(4) == "search":
                    args.update(fixed_string=True, case_sensitive=False)
                blocks.append(self._tool(registry, label, "grep", args))
            else:
                blocks.append(self._path(registry, label, m.group(6)))
        clean = re.sub(MENTION_START + r'\\@', "@", text)
        if not blocks:
            return clean, 0
        return "\n\n".join(blocks) + "\n\n" + clean, count

    def _report(self, label, status):
        self.console.info("  %s: %s" % (label, status), "dim")

    def _failed(self, label, error, suggestion):
        self._report(label, "failed (%s)" % error)
        text = "Failed to include %s:\n\n<%s>" % (label, error)
        if suggestion:
            text += "\n\nSuggestion: %s" % suggestion
        return text

    def _block(self, label, content):
        return "[Content of %s]\n%s\n[End of %s]" % (label, content.rstrip("\n"), label)

    def _tool(self, registry, label, name, args):
        result = registry.execute(name, args)
        if not result.success:
            return self._failed(label, result.error, None)
        self._report(label, "loaded" + (" (cached)" if result.metadata.get("cached") else ""))
        return self._block(label, result.to_message())

    def _url(self, registry, label, url):
        if "fetch" not in registry:
            return self._failed(label, "fetching is not available", None)
        return self._tool(registry, label, "fetch", {"url": url})

    def _path(self, registry, label, spec):
        import re
        path, _, fragment = spec.partition("#")
        lines = r"L(\d+)(?:-L?(\d+))?"
        rng = re.fullmatch(lines, fragment) or re.fullmatch(lines, strip_trailing(fragment)) if fragment else None
        if fragment and not rng:
            return self._failed(label, "unknown line range #%s (use #L10 or #L10-20)" % fragment, None)
        root = registry.ctx.root
        try:
            real = xzatoma_tools.resolve_path(path, root)
            if not os.path.lexists(real) and strip_trailing(path) != path:
                path = strip_trailing(path)
                real = xzatoma_tools.resolve_path(path, root)
            xzatoma_tools.resolve_path(path, root, must_exist=True)
        except xzatoma_tools.ToolError as exc:
            message = str(exc)
            hint = message.split("(did you mean ", 1)
            suggestion = ("use %s" % hint[1].rstrip(")?")) if len(hint) > 1 else "check the path (relative to %s)" % root
            return self._failed(label, hint[0].strip(), suggestion)
        import stat
        try:
            with registry.ctx.jail.resolve(path) as target:  # what the tools will see, never a link swapped in
                st = target.lstat()
        except (xzatoma_tools.ToolError, OSError) as exc:
            return self._failed(label, str(exc), None)
        if st is None:
            return self._failed(label, "no such file or directory: %s" % path, None)
        if stat.S_ISDIR(st.st_mode):
            return self._tool(registry, label, "list_directory", {"path": path})
        size = st.st_size
        if size > self.cfg.get("agent.mentions.max_file_size"):
            return self._failed(label, "the file is %d bytes, over agent.mentions.max_file_size" % size, None)
        start = int(rng.group(1)) if rng else None
        end = int(rng.group(2) or rng.group(1)) if rng else None
        key = (real, start, end)
        mtime = st.st_mtime
        cached = self.files.get(key)
        if cached and cached[0] == mtime:
            self._report(label, "cached")
            return self._block(label, cached[1])
        args = {"path": path}
        if start:
            args.update(start_line=start, end_line=end)
        result = registry.execute("read_file", args)
        if not result.success:
            return self._failed(label, result.error, None)
        text = result.to_message()
        self.files[key] = (mtime, text)
        self._report(label, "loaded (%d lines)" % text.count("\n"))
        return self._block(label, text)


# ---- Chat: confirmations, spinner, and output ----

class Asker:
    """Asks the person on the terminal (never through a piped stdin); one question at a time."""

    def __init__(self, console):
        self.console = console

    def ask(self, question, prefill=None):
        """The person's answer, or None. `prefill` starts the line with that text, editable (readline's
        pre-input hook), so [e]dit begins from the proposed command rather than an empty line."""
        with self.console.hold():
            if _isatty(sys.stdin):
                readline = None
                if prefill:
                    try:
                        import readline
                        readline.set_pre_input_hook(lambda: (readline.insert_text(prefill), readline.redisplay()))
                    except (ImportError, AttributeError):
                        readline = None
                try:
                    return prompt_input(question)
                except EOFError:
                    return None
                finally:
                    if readline is not None:
                        readline.set_pre_input_hook()
            try:
                with _Tty() as tty:
                    tty.write(question)
                    return tty.readline()
            except OSError:
                self.console.warn("no terminal to ask for confirmation; declined")
                return None

    def show(self, text):
        """Write what a question is about where the question is asked: chrome's stderr when it is the terminal,
        else stdout on it (`chat 2>chat.log`: the command went to the log and only the choices to the person,
        who answered y to a command not seen: round 19c), else /dev/tty (stdin piped)."""
        if _isatty(self.console.err):
            self.console._write(text)
        elif _isatty(sys.stdin) and _isatty(sys.stdout):
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        else:
            try:
                with _Tty() as tty:
                    tty.write(text + "\n")
            except OSError:
                self.console._write(text)


class _Tty:
    """The controlling terminal, read and written unbuffered: open("/dev/tty", "r+") is refused by Python (a
    terminal cannot seek), so piped chat declined every question without asking (round 19c)."""

    def __enter__(self):
        self.fd = os.open("/dev/tty", os.O_RDWR | getattr(os, "O_NOCTTY", 0))
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        return False

    def write(self, text):
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(self.fd, data):]

    def readline(self, limit=65536):
        """A line typed (the terminal is in line mode: each read is one line), or "" at end of input."""
        data = b""
        while not data.endswith(b"\n") and len(data) < limit:
            chunk = os.read(self.fd, limit - len(data))
            if not chunk:
                break
            data += chunk
        return data.decode("utf-8", "replace")


#: programs whose arguments are only data: an [a]lways for one covers the program, whatever its arguments. Every
#: other program is remembered as the exact command. A list of the dangerous ones was always short of one
#: (`git grep -O'touch x'`, `make test -f evil.mk`, `cmake -E env …`, `pip3.11 wheel ./evil`: rounds 19c, 19e):
#: none of these has an option that runs a program or loads code (GNU install --strip-program, sort
#: --compress-program and split --filter do: not here)
REMEMBERED_PROGRAMS = {"touch", "mkdir", "rmdir", "rm", "cp", "mv", "ln", "chmod", "truncate", "unlink", "mktemp"}
#: git's subcommands whose arguments are only data (paths, refs, messages): [a]lways covers the subcommand (`git
#: add` is not `git push`). What runs behind them (hooks, merge drivers, filters) is git's configuration, which the
#: sandbox keeps read-only and the protected paths keep from the tools.
REMEMBERED_GIT = {"add", "commit", "mv", "rm", "restore", "switch", "checkout", "stash", "branch", "tag", "reset"}


def approval_key(command):
    """What chat's [a]lways / ne[v]er remember for a command: the program for one whose arguments are only data
    (`touch`, `mkdir`, `rm`, …), git and its subcommand for git's data-only ones (`git add`), and otherwise the
    exact command (interpreters, wrappers, build tools, anything not known to be only data, shell syntax)."""
    try:
        script = xzatoma_tools.parse_shell(command)
    except xzatoma_tools.ShellSyntaxError:
        return command.strip()
    if xzatoma_tools.needs_shell(command, script):
        return command.strip()
    argv = xzatoma_tools.simple_argv(command, script)
    if argv and argv[0] in REMEMBERED_PROGRAMS:
        return argv[0]
    if len(argv) > 1 and argv[0] == "git" and argv[1] in REMEMBERED_GIT:
        return "git " + argv[1]
    return command.strip()


def fold_blanks(text, spaces=8):
    """A command as a person approves it, with long runs of blanks counted instead of drawn (`spaces` or more:
    `⟨20000 spaces⟩`; 2 tabs or more, 8 in a diff): 20,000 spaces pushed the end of `touch x #…ls -la` out of sight. A ⟨ or ⟩
    in the command itself is shown escaped, so nothing typed can pass for a fold. A diff folds from 32 spaces:
    its code's indentation stays drawn."""
    import re
    text = text.replace("\u27e8", "\\u27e8").replace("\u27e9", "\\u27e9")
    return re.sub(r" {%d,}|\t{%d,}" % (spaces, 2 if spaces <= 8 else 8), lambda m: "\u27e8%d %s\u27e9" % (
        len(m.group()), "spaces" if m.group()[0] == " " else "tabs"), text)


def wrap_rows(text, columns):
    """`text` cut into the rows a terminal `columns` wide shows it in (a wide character takes two columns, a
    combining one none, a tab reaches the next multiple of 8)."""
    import unicodedata
    rows = []
    for line in text.split("\n"):
        row, width = [], 0
        for ch in line:
            if ch == "\t":
                ch = " " * (8 - width % 8)
                w = len(ch)
            elif ch.isascii():
                w = 1
            else:
                w = 0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
            if width + w > columns and row:
                rows.append("".join(row))
                row, width = [], 0
                if ch.startswith(" ") and len(ch) > 1:
                    ch, w = ch[:min(len(ch), 8)], min(len(ch), 8)
            row.append(ch)
            width += w
        rows.append("".join(row))
    return rows


class Confirmations:
    """Safe mode: the session's always/never answers and the prompts for tools and commands. Tools are
    remembered by name; commands by approval_key (program and subcommand), never `terminal` as a whole."""

    def __init__(self, asker, console):
        self.asker = asker
        self.console = console
        self.always, self.never = set(), set()

    def reset(self):
        self.always.clear()
        self.never.clear()

    def describe(self):
        """/approvals: what this session approves or refuses without asking."""
        def shown(names):
            return ", ".join(sorted(names)) or "-"
        return ["always: %s" % shown(self.always), "never:  %s" % shown(self.never)]

    def _choice(self, header, detail, edit, only_once=False):
        """Ask about a change (a diff): shown as a command is, long blanks counted and a screenful at a time, the
        question after its last line (a hook's 3,000-line diff with 5,000 spaces before `; curl … | sh` was
        written at once: round 19b). only_once: yes or no, nothing remembered (a protected path)."""
        with self.console.hold():
            if not self._present(header, fold_blanks(self.console.clean(detail.rstrip("\n")), 32) if detail
                                 else None):
                return "n"
            return self._ask_choice(None, None, edit, only_once=only_once)

    def _present(self, header, block):
        """The question's header and what it is about, paged when taller than the screen; False when the person
        leaves (Ctrl-D) before its end."""
        if header:
            self.asker.show(self.console.style(self.console.clean(header), "yellow", "bold"))
        if not block:
            return True
        rows = self._screen_rows()
        if self._rows_for(block) + 3 <= rows:
            self.asker.show(block)
            return True
        return self._page(block, rows)

    def _ask_choice(self, header, detail, edit, scope=None, only_once=False):
        if header or detail:
            self._present(header, detail)
        if only_once:
            options = "[y]es / [n]o"
        elif scope and ("\n" in scope or len(scope) > 40):  # a whole command: quoted in full, twice, the question
            # was taller than the screen it was paged onto (round 18c); its beginning names it, on one line
            options = "[y]es / [n]o / [a]lways this command ('%s...') this session / ne[v]er it" % (
                scope.split("\n", 1)[0][:30].rstrip())
        else:
            options = ("[y]es / [n]o / [a]lways '%s' this session / ne[v]er '%s'" % (scope, scope) if scope else
                       "[y]es / [n]o / [a]lways for this tool this session / ne[v]er this session")
        options += " / [e]dit" if edit else ""
        accepted = ("y", "yes", "n", "no", "") + (() if only_once else ("a", "always", "v", "never"))
        while True:
            answer = self.asker.ask(options + " > ")
            if answer is None:
                return "n"
            answer = answer.strip().lower()
            if answer in accepted or (edit and answer in ("e", "edit")):
                return {"yes": "y", "no": "n", "": "n", "always": "a", "never": "v", "edit": "e"}.get(answer, answer)
            self.asker.show("please answer %s" % ("y or n" if only_once else "y, n, a, v%s" % (
                " or e" if edit else "")))

    def _unshowable(self, what, text, changes_only=False):
        """Why `text` cannot be asked about, or None. What a person sees is redacted, and a [REDACTED] covers
        whatever is shaped like a credential: `curl http://u:$(touch x)@host` was shown as
        `curl http://u:[REDACTED]@host` and approved. Nobody says yes to what they did not see, so such a
        question is not asked (declined). changes_only: a diff, where only its context lines may be redacted
        (what is already in the file and stays)."""
        if not text:
            return None
        for start, end in xzatoma_store.redaction_spans(text):
            if changes_only:
                first = text.rfind("\n", 0, start) + 1
                lines = text[first:end].split("\n")
                if all(line.startswith((" ", "@@")) for line in lines):
                    continue
            self.console.warn("declined without asking: part of this %s looks like a credential and would be shown "
                              "as [REDACTED], so what you approve would not be what runs; do it yourself if you "
                              "mean it" % what)
            return True
        return None

    def confirm_tool(self, name, args, detail, always=False):
        if name in self.never:
            return False
        if name in self.always:
            return True
        if self._unshowable("change", detail, changes_only=True):
            return False
        answer = self._choice("Allow %s?" % name, detail, edit=False)
        if answer == "a":
            self.always.add(name)
        if answer == "v":
            self.never.add(name)
        return answer in ("y", "a")

    def confirm_command(self, command, reason, exact=False):
        """The command to run (maybe edited) or None. `exact`: a command asked in every mode (Verdict.person),
        which no program's [a]lways covers: its answer is remembered for this very command only."""
        key = command.strip() if exact else approval_key(command)
        if key in self.never:
            return None
        if key in self.always:
            return command
        if self._unshowable("command", command):
            return None
        shown = fold_blanks(self.console.clean(command, exact=True))  # exactly what will run, long blanks counted
        block = "  $ " + shown.replace("\n", "\n    ")
        with self.console.hold():
            # taller than the screen, its beginning would scroll out of sight where you answer, so it is shown
            # a screenful at a time and the question comes after its last line
            if not self._present("Run this command? (%s)" % reason, block):
                return None
            answer = self._ask_choice(None, None, edit=True, scope=self.console.clean(key, exact=True))
            if answer == "e":  # the line starts from the command only when it is shown as it is (readline
                # would write its hidden characters raw, and the person would edit what they cannot see)
                plain = "\n" not in command and shown == command
                edited = self.asker.ask("edit the command > ", prefill=command if plain else None)
                return edited.strip() if edited and edited.strip() else None
        if answer == "a":
            self.always.add(key)
        if answer == "v":
            self.never.add(key)
        return command if answer in ("y", "a") else None

    def _page(self, text, rows):
        """`text` a screenful at a time, each after Enter; False when the person leaves (Ctrl-D)."""
        lines = wrap_rows(text, self._screen_cols())
        size = max(3, rows - 2)
        for start in range(0, len(lines), size):
            self.asker.show("\n".join(lines[start:start + size]))
            if start + size < len(lines):
                more = self.asker.ask(self.console.style("-- rows %d-%d of %d; Enter shows more --"
                                                         % (start + 1, start + size, len(lines)), "dim"))
                if more is None:
                    return False
        return True

    def _screen_cols(self):
        try:
            return os.get_terminal_size(self.console.err.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            return 80

    def _screen_rows(self):
        try:
            return os.get_terminal_size(self.console.err.fileno()).lines or 24
        except (AttributeError, ValueError, OSError):
            return 24  # no size to ask (the question goes to /dev/tty): a small terminal's

    def _rows_for(self, text):
        """How many terminal rows `text` takes (wrapped at the terminal's width, a tab as 8 columns and a wide
        character as 2: never fewer than a terminal shows)."""
        try:
            cols = os.get_terminal_size(self.console.err.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            cols = 80
        rows = 0
        for line in text.split("\n"):
            width = len(line) + 7 * line.count("\t")
            if not line.isascii():
                import unicodedata
                width += sum(1 for ch in line if unicodedata.east_asian_width(ch) in ("W", "F"))
            rows += max(1, -(-width // cols))
        return rows

    def ask_irreversible(self, name, args, detail):
        if self._unshowable("change", detail, changes_only=True):
            return False
        question, _, change = detail.partition("\n")  # below the question: the diff of what it writes
        return self._choice("Allow %s? %s" % (name, question), change or None, edit=False, only_once=True) == "y"


class Spinner:
    """An elapsed-seconds spinner on stderr, only on a TTY; the console wipes it before any other line."""

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, console):
        import threading
        # not on TERM=dumb (emacs' shell, some CI consoles): it is drawn and wiped with escapes (round 18c)
        self.enabled = _isatty(console.err) and not console.quiet and os.environ.get("TERM") != "dumb"
        self.console = console
        self._stop = None
        self._lock = threading.Lock()

    def start(self, label):
        with self._lock:
            self._start(label)

    def _start(self, label):
        if not self.enabled or self._stop is not None:
            return
        import threading
        self._stop = threading.Event()
        started = time.monotonic()

        def spin(stop):
            i = 0
            while not stop.wait(0.1):
                self.console.status("%s %s %ds" % (self.FRAMES[i % 10], label, time.monotonic() - started))
                i += 1
            self.console.clear_status()
        self._thread = threading.Thread(target=spin, args=(self._stop,), daemon=True)
        self._thread.start()

    def stop(self):
        with self._lock:
            if self._stop is not None:
                self._stop.set()
                self._thread.join()
                self._stop = None


class ThinkFilter:
    """Hides <think>…</think> from streamed text (shown only with --verbose)."""

    def __init__(self):
        self.inside = False
        self.pending = ""

    def feed(self, text):
        text = self.pending + text
        self.pending = ""
        out = []
        while text:
            tag = "</think>" if self.inside else "<think>"
            pos = text.find(tag)
            if pos == -1:
                keep = max(0, len(text) - len(tag) + 1)  # a tag may be split across deltas
                for cut in range(len(text) - 1, keep - 1, -1):
                    if tag.startswith(text[cut:]):
                        self.pending = text[cut:]
                        text = text[:cut]
                        break
                if not self.inside:
                    out.append(text)
                break
            if not self.inside:
                out.append(text[:pos])
            text = text[pos + len(tag):]
            self.inside = not self.inside
        return "".join(out)


class ChatEvents(StreamedText):
    """Chat: the answer streamed to stdout; tool lines, spinner and notes on stderr."""

    def __init__(self, console, out):
        super().__init__(console, out, "thinking")
        self.turn_tool_results = []

    def message(self, content, tool_calls):
        streamed = bool(self.shown)
        super().message(content, tool_calls)
        if not tool_calls and not streamed and content.strip():  # a server that answered in one piece
            self.out.write(self.console.clean(content.strip()) + "\n")
            self.out.flush()

    def tool_end(self, name, result):
        super().tool_end(name, result)
        self.turn_tool_results.append(len(result.to_message()))


# ---- Chat: the REPL (reading input, slash commands, rendering; the Session does the rest) ----

MODE_TEXT = {"planning": "PLANNING (Read-only mode for creating plans)",
             "write": "WRITE (Read/write mode for executing tasks)"}
SAFETY_TEXT = {"safe": "SAFE (Confirm dangerous operations)", "yolo": "YOLO (Execute without confirmation)"}
ARG = object()  # in SLASH_COMMANDS: the handler gets the text after the command
SLASH_COMMANDS = {  # command: (help line, ChatSession method, its argument: ARG, a fixed value, or None)
    "/mode": ("/mode planning|write — switch what the agent may do (the conversation is kept)", "switch_mode", ARG),
    "/planning": ("/planning — read-only tools", "switch_mode", "planning"),
    "/write": ("/write — all tools", "switch_mode", "write"),
    "/safe": ("/safe — confirm dangerous operations (resets always/never answers)", "switch_safety", "safe"),
    "/yolo": ("/yolo — run without confirmations (denied commands stay denied)", "switch_safety", "yolo"),
    "/status": ("/status — mode, model, tools, conversation size", "status", None),
    "/help": ("/help — this list", "help", None),
    "/models": ("/models — the provider's models", "list_models", None),
    "/model": ("/model NAME — switch model, keep the conversation", "switch_model", ARG),
    "/context": ("/context — tokens used, the window, what pruning would drop", "context", None),
    "/clear": ("/clear — start a new conversation", "clear", None),
    "/history": ("/history — recent conversations", "history", None),
    "/resume": ("/resume ID — continue a stored conversation", "resume_cmd", ARG),
    "/undo": ("/undo — put back the last file change", "undo", None),
    "/approvals": ("/approvals [clear] — the programs answered [a]lways / ne[v]er this session", "approvals", ARG),
    "/plan": ("/plan — the task's steps and how far each is (update_progress)", "show_plan", None),
    "/skills": ("/skills — the skills here: usable, active, skipped", "list_skills", None),
    "/mcp": ("/mcp — the MCP servers: state, protocol, tools and their approval", "mcp_status", None),
    "/exit": ("/exit, /quit, exit, quit, Ctrl-D — leave", None, None),
}
ALIASES = {"/quit": "/exit", "/q": "/exit", "exit": "/exit", "quit": "/exit", "/h": "/help", "/?": "/help",
           "/new": "/clear"}


def shell_word(text):
    """`text` as one shell word a person can paste: shlex's quoting, or bash's $'…' with escapes where it holds
    characters a terminal must not get raw (a directory named with ESC or a bidi control was shown made visible
    inside '…', which the shell read as other characters: round 19b)."""
    import shlex
    if text.isprintable():
        return shlex.quote(text)
    return "$'%s'" % "".join(
        "\\" + ch if ch in "\\'" else ch if ch.isprintable() else
        "\\x%02x" % ord(ch) if ord(ch) < 0x100 else "\\u%04x" % ord(ch) if ord(ch) < 0x10000 else
        "\\U%08x" % ord(ch) for ch in text)


def invoked_as():
    """How the person started xzatoma, as a shell command that works from any directory: `xzatoma` when that is
    what PATH finds, else the program's path, or the interpreter and the file (`python3 /srv/xzatoma.pyz`). The
    resume hint named `xzatoma`, which a one-file server does not have (round 18c)."""
    import shlex
    import shutil
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "xzatoma"
    program = os.path.abspath(argv0)
    if not argv0.endswith((".py", ".pyz")) and os.path.basename(argv0) != "__main__.py":  # a console script
        found = shutil.which("xzatoma")
        return "xzatoma" if found and os.path.realpath(found) == os.path.realpath(program) or \
            not os.path.exists(program) else shlex.quote(program)
    python = sys.executable or "python3"
    found = shutil.which(os.path.basename(python))
    if found and os.path.abspath(found) == os.path.abspath(python):  # the same interpreter, by its name
        python = os.path.basename(python)
    return "%s %s" % (shlex.quote(python), shlex.quote(program))


def box(title):
    inner = 62
    return "╔" + "═" * inner + "╗\n║" + title.center(inner) + "║\n╚" + "═" * inner + "╝"


class ChatSession:
    """The REPL over a Session: reading input, slash commands (one table), rendering. The Session holds
    the conversation, tools and provider; this class only talks to the person."""

    def __init__(self, args, cfg, console):
        self.args, self.cfg, self.console = args, cfg, console
        self.out = sys.stdout
        self.interactive = _isatty(sys.stdin)
        self.safety = args.safety or cfg.get("agent.safety_mode")
        self.confirmations = Confirmations(Asker(console), console)
        self.events = ChatEvents(console, self.out)
        self.warned_write = False
        self.failed_turns = 0  #: turns that ended in an error (piped chat exits 1 when there were any)
        target = None
        if args.resume or args.last:  # its provider, model and mode, unless given again
            target = find_resume_target(cfg, console, args)
            self.cfg = cfg = restored_config(args, console, cfg, target[1])
            args.mode = args.mode or (target[1].get("mode") if target[1].get("mode") in ("write", "planning")
                                      else None)
        self.session = Session.open(cfg, console, args.mode or cfg.get("agent.chat_mode"), args.working_dir,
                                    self.autonomy(), events=self.events, confirmations=self.confirmations,
                                    metrics_port=args.metrics_port)
        self.mentions = Mentions(self._mention_registry, console, cfg)
        try:
            self.sandbox_note = sandbox_note_for_start(cfg, self.session)
            if target is not None:
                self.resume(target[0])
            else:
                self.session.start("chat")
        except BaseException:
            self.session.close()
            raise

    def autonomy(self):
        """The terminal's autonomy chat's safety gives: Safe asks (interactive), YOLO does not (full)."""
        return xzatoma_tools.INTERACTIVE if self.safety == "safe" else xzatoma_tools.FULL

    # -- what the Session holds, as the REPL shows it --
    @property
    def toolset(self):
        return self.session.toolset

    @property
    def provider(self):
        return self.session.provider

    @property
    def conversation(self):
        return self.session.conversation

    @property
    def result(self):
        return self.session.result

    @property
    def registry(self):
        return self.session.registry

    @property
    def store(self):
        return self.session.store

    @property
    def id(self):
        return self.session.id

    def _mention_registry(self):
        # read tools over the same jail, whatever the mode
        return xzatoma_tools.build_registry(xzatoma_tools.PLANNING, self.session.ctx)

    def resume(self, prefix):
        if self.store is not None:  # another directory's conversation would run on a different tree
            try:
                stored = self.store.conversation(self.store.resolve(prefix))
            except xzatoma_store.NotFound as exc:
                raise UsageError(str(exc))
            where = stored.get("working_dir")
            if where and os.path.realpath(where) != os.path.realpath(self.session.root):
                raise UsageError("conversation %s ran in %s, not in this chat's %s: continue it there with "
                                 "'%s chat --resume %s --working-dir %s'" % (
                                     stored["id"][:12], where, self.session.root, invoked_as(), stored["id"][:12],
                                     where))
        stored = self.session.start("chat", resume=prefix)
        self.console.info("resumed conversation %s (%d messages, %s)" % (
            self.id, len(self.conversation.messages) - 1, stored["status"]))

    # -- display --
    def prompt(self):
        text = "[%s][%s] >> " % (self.toolset.upper(), self.safety.upper())
        if not (self.console.color and _isatty(sys.stdout)):  # one colour decision: --no-color, NO_COLOR, TTY
            return text
        colour = "36" if self.toolset == "planning" else "33"
        return "\001\033[1;%sm\002[%s]\001\033[0m\002\001\033[1;%sm\002[%s]\001\033[0m\002 >> " % (
            colour, self.toolset.upper(), "32" if self.safety == "safe" else "31", self.safety.upper())

    def banner(self):
        self.console._write("\n".join([box("XZatoma Interactive Chat Mode - Welcome!"), "",
                                       "Mode:   %s" % MODE_TEXT[self.toolset], "Safety: %s" % SAFETY_TEXT[self.safety],
                                       "Model:  %s/%s" % (self.provider.name, self.provider.model),
                                       "Terminal: %s" % self.sandbox_note, "",
                                       "Type '/help' for available commands, 'exit' to quit", ""]))

    def window(self):
        try:
            return self.provider.context_window() or self.conversation.max_tokens
        except XzError:  # an unreachable server: the turn has said so already
            return self.conversation.max_tokens

    def status(self):
        window = self.window()
        used = self.conversation.tokens
        lines = [box("XZatoma Session Status"), "",
                 "Chat Mode:         %s" % MODE_TEXT[self.toolset],
                 "Safety Mode:       %s" % SAFETY_TEXT[self.safety],
                 "Provider / Model:  %s / %s" % (self.provider.name, self.provider.model),
                 "Available Tools:   %d (%s)" % (len(self.registry), ", ".join(self.registry.names())),
                 "Conversation Size: %d messages, ~%s tokens (%d%% of %s)" % (
                     len(self.conversation.messages), _fmt_tokens(used), 100 * used // max(window, 1),
                     _fmt_tokens(window)),
                 "Session Usage:     %s, %s, %s tokens" % (
                     _plural(self.result.turns, "turn"), _plural(self.result.tool_calls, "tool call"),
                     _fmt_tokens(self.result.prompt_tokens + self.result.completion_tokens)),
                 "Instructions:      %s" % self.session.instructions.describe(),
                 "Conversation ID:   %s" % self.id,
                 "Quota:             %s" % ", ".join(self.session.quota.usage()),
                 "Prompt Format:     [%s][%s] >>" % (self.toolset.upper(), self.safety.upper())]
        if self.confirmations.always or self.confirmations.never:
            lines.append("Session answers:   always: %s; never: %s (/approvals clear forgets them)" % (
                ", ".join(sorted(self.confirmations.always)) or "-", ", ".join(sorted(self.confirmations.never)) or "-"))
        self.console._write("\n".join(lines))

    # -- the loop --
    def run(self):
        with leave_on_signals() as signals:
            try:
                code = self._run(signals)
            except Terminated:  # between turns: recorded and closed on the way out (_run's finally)
                code = EXIT_TERMINATED
        return 128 + signals.signum if signals.signum else code

    def _run(self, signals):
        startup_over()
        readline = self.setup_readline() if self.interactive else None
        if self.interactive:
            self.banner()
        last_interrupt, notice = 0.0, False
        first = " ".join(getattr(self.args, "message", None) or ()).strip() or None  # `xzatoma chat "…"`
        try:
            while not signals.signum:
                try:  # everything between turns is guarded: a Ctrl-C may land anywhere here
                    if notice:
                        notice = False
                        self.console._write("\n(Ctrl-C again within a second, Ctrl-D or 'exit' leaves)")
                    if first is not None:  # shown as if typed at the prompt, then answered like any message
                        line, first = first, None
                        if self.interactive:
                            sys.stdout.write(self.prompt().replace("\001", "").replace("\002", "") +
                                             self.console.clean(line) + "\n")
                            sys.stdout.flush()
                    else:
                        line = prompt_input(self.prompt()) if self.interactive else stdin_line()
                        if not self.interactive and line == "":
                            break
                        line = self.continued(line)
                    text = line.strip()
                    if readline is not None and text:  # the whole message, once (answers to questions never)
                        remember_message(readline, line)
                    if text and self.command(text) == "exit":
                        break
                except EOFError:
                    if self.interactive:
                        self.console._write("")
                    break
                except KeyboardInterrupt:  # only bookkeeping here, so a second Ctrl-C cannot escape
                    now = time.monotonic()
                    if now - last_interrupt < 1.0:
                        break
                    last_interrupt, notice = now, True
        finally:
            if readline is not None:
                save_chat_history(readline, self.history_file)
            # a chat SIGTERM or SIGHUP ended is recorded so, not as one the person left (round 18c: "completed")
            self.finish("interrupted" if signals.signum else "completed")
        if self.failed_turns and not self.interactive:  # a script piping turns in learns that one failed
            return EXIT_FAILED
        return EXIT_OK

    def continued(self, line):
        """A line ending in a backslash continues on the next one: several lines, one message. (A paste
        arrives whole anyway where the terminal supports bracketed paste, which readline turns on.)"""
        import io
        done, last, size = io.StringIO(), line.rstrip("\n"), len(line)  # a list of short lines cost 20x (16d)
        while last.endswith("\\") and not last.endswith("\\\\"):
            last = last[:-1]
            more = prompt_input("... ") if self.interactive else stdin_line()
            if not self.interactive and more == "":
                break
            done.write(last + "\n")
            last, size = more.rstrip("\n"), size + len(more)
            if size > MAX_TASK_CHARS:  # the message, not each line: lines ending in \ took chat past 2.8 GB (16c)
                raise UsageError("a message on standard input is longer than %s characters; no model takes one "
                                 "that large" % "{:,}".format(MAX_TASK_CHARS))
        return done.getvalue() + last

    def finish(self, status="completed"):
        recorded = self.session.finish(status)
        show_review(self.console, self.session.result.review)
        if recorded:
            self.console.info("Resume this conversation with: %s chat --resume %s -C %s" % (
                invoked_as(), self.id, shell_word(self.session.root)))
        self.session.close()

    def command(self, text):
        word = text.split()[0].lower()
        word = ALIASES.get(word, word)
        import re
        is_command = word in SLASH_COMMANDS or (text.startswith("/") and re.fullmatch(r"/[a-z?]+", word))
        if not is_command:
            self.turn(text)
            return None
        if word == "/exit":
            return "exit"
        if word not in SLASH_COMMANDS:
            import difflib
            close = difflib.get_close_matches(word, list(SLASH_COMMANDS) + list(ALIASES), n=1, cutoff=0.5)
            self.console.error("unknown command %s%s (see /help)" % (
                word, "; did you mean %s?" % ALIASES.get(close[0], close[0]) if close else ""))
            return None
        _, method, arg = SLASH_COMMANDS[word]
        if arg is ARG:
            arg = text.split(None, 1)[1].strip() if len(text.split(None, 1)) > 1 else ""
        raises = (method, str(arg).strip().lower()) in (("switch_mode", "write"), ("switch_safety", "yolo"))
        if raises and not _isatty(sys.stdin):  # a file piped into chat held `/yolo`: its author had the switches
            self.console.error("%s is taken only from the keyboard, not from piped input; start the chat with %s "
                               "to allow it" % (word, "--mode write" if method == "switch_mode" else "--safety yolo"))
            return None
        try:
            getattr(self, method)(*(() if arg is None else (arg,)))
        except XzError as exc:
            self.console.error(str(exc))
        return None

    def show_plan(self):
        progress = self.session.progress
        if progress is None or not len(progress):
            self.console.info("no steps yet: the model adds them with update_progress as it works on a task of "
                              "several steps")
            return
        self.console._write("\n".join(self.console.clean(line) for line in progress.lines(numbered=True)))

    def list_skills(self):
        state = self.session.skill_state
        usable = set(state.skills) if state else set()
        skills, problems = find_skills(self.cfg, self.session.root)
        if not skills and not problems:
            self.console.info("no skills here (%s)" % ", ".join(p[3] for p in skill_places(self.cfg, self.session.root)))
        for skill in skills:
            status = ("active" if skill.name in state.active else "usable") if skill.name in usable else \
                "skipped: " + skill_trust(self.store, skill)
            self.console._write(self.console.clean("  %-20s %-8s %-18s %s" % (skill.name, skill.scope, status,
                                                                             one_line(skill.description, 70))))
        for p in problems:
            self.console._write(self.console.clean("  %s %s: %s" % ("invalid" if p.level == "error" else "note",
                                                                     p.path, p.reason)))

    def mcp_status(self):
        if self.session.mcp is None:
            self.console.info("no MCP servers: add mcp.servers to the configuration, or a .mcp.json to the project")
            return
        self.console._write("\n".join(self.console.clean(line)
                                      for line in xzatoma_mcp.status_lines(self.session.mcp.rows())))

    def approvals(self, arg):
        arg = arg.lower()
        if arg not in ("", "clear"):
            raise UsageError("usage: /approvals [clear]")
        if arg == "clear":
            self.confirmations.reset()
            self.console.info("cleared: every tool and command asks again")
            return
        self.console._write("\n".join(self.console.clean(line) for line in self.confirmations.describe()))

    def help(self):
        self.console._write("Commands (case-insensitive):\n" + "\n".join("  " + v[0] for v in SLASH_COMMANDS.values()) +
                            "\nMentions: @path, @path#L10-20, @dir/, @search:\"text\", @grep:\"regex\", @url:https://…"
                            " (\\@ for a literal @)")

    def switch_mode(self, mode):
        mode = mode.lower()
        if mode not in ("planning", "write"):
            raise UsageError("usage: /mode planning|write")
        self.session.rebuild(toolset=mode)
        if mode == "write":
            self.console.info("Switched to WRITE mode. All tools now available.")
            if not self.warned_write:
                self.warned_write = True
                self.console.warn("in Write mode the agent can change files and run commands%s" % (
                    "; Safe mode asks before dangerous operations" if self.safety == "safe" else
                    " without asking (YOLO)"))
        else:
            self.console.info("Switched to PLANNING mode. Read-only tools only.")

    def switch_safety(self, safety):
        self.safety = safety
        if safety == "safe":
            self.confirmations.reset()
        self.session.rebuild(autonomy=self.autonomy())
        self.console.info("Switched to SAFE mode. Dangerous operations will ask for confirmation." if safety == "safe"
                          else "Switched to YOLO safety mode. Operations will execute without confirmation.")

    def switch_model(self, name):
        if not name:
            raise UsageError("usage: /model NAME (see /models)")
        try:
            names = [m["id"] for m in self.provider.models()]
        except XzError as exc:  # the provider cannot list: switch, and say it is unchecked
            names = None
            self.console.warn("cannot check the name against the provider's models (%s)" % one_line(exc, 120))
        if names is not None and name not in names:
            raise UsageError("%s has no model '%s'%s (see /models)" % (
                self.provider.name, name, _closest(name, names).replace(" (", "; ").rstrip(")")))
        self.session.rebuild(provider=make_provider(self.cfg, self.console, model=name))
        self.console.info("Switched to model %s (the conversation is kept)" % name)

    def list_models(self):
        for row in model_table(self.provider):
            self.console._write("%s %-40s %s" % ("*" if row["id"] == self.provider.model else " ",
                                                 self.console.clean(row["id"]),
                                                 _fmt_tokens(row["context_window"]) if row["context_window"] else "?"))

    def context(self):
        """The same two figures as run's summary: the context now (what the next request sends) and what the
        session's model calls sent and received in all (each sends the context again, so it grows faster)."""
        conv, result = self.conversation, self.result
        window = self.window()
        limit = conv.limit(window)
        units = sum(1 for m in conv.messages[conv._head_end():] if m["role"] != "tool")
        droppable = max(0, units - conv.min_retain_turns)
        self.console._write(
            "context now: ~%s tokens (what the next request sends: %d messages and the tool definitions), of a %s "
            "budget (window %s; pruning starts at %d%%: %s tokens)\n"
            "this session: %s tokens (%s in / %s out)%s over %s; each call sends the context again\n"
            "pruning would drop up to %d of %d turns, keeping the instruction and the last %d" % (
                _fmt_tokens(context_tokens(self.session)), len(conv.messages), _fmt_tokens(limit),
                _fmt_tokens(window), conv.prune_threshold * 100, _fmt_tokens(int(limit * conv.prune_threshold)),
                _fmt_tokens(result.prompt_tokens + result.completion_tokens), _fmt_tokens(result.prompt_tokens),
                _fmt_tokens(result.completion_tokens), ESTIMATED_NOTE if result.estimated else "",
                _plural(result.turns, "model call"), droppable, units, conv.min_retain_turns))

    def clear(self):
        self.session.finish()
        self.session.start("chat")
        self.console.info("Started a new conversation (%s)" % self.id)

    def history(self):
        if self.store is None:
            raise UsageError("conversation history is unavailable")
        rows = self.store.list_conversations(10, top_level=True)
        if rows:
            self.console._write(conversation_header())
        for row in rows:
            self.console._write(self.console.clean(conversation_line(row)))

    def resume_cmd(self, arg):
        if not arg:
            raise UsageError("usage: /resume ID (see /history)")
        self.session.finish()
        self.resume(arg)

    def undo(self):
        store = self.session.undo_store()  # without a usable database, this process's own records
        if store is None:
            raise UsageError("undo needs conversation history, which is off (agent.persistence.enabled: false)")
        records = store.undo_records(conversation_id=self.id, limit=1)
        if not records:
            self.console.info("nothing to undo in this conversation")
            return
        try:
            self.console.info(xzatoma_tools.undo_change(store, records[0]))
        except (xzatoma_tools.UndoError, OSError) as exc:
            raise XzError(str(exc))

    def turn(self, text):
        session = self.session
        expanded, _ = self.mentions.expand(text)
        session.record(title=text)
        before = self.result.prompt_tokens + self.result.completion_tokens
        if session.cancel.is_set():  # a cancelled turn's subagents stay cancelled; the next turn starts afresh
            session.rebuild()
        session.conversation.add_user(expanded)
        session.skill_state.reset()  # skills are active for one turn: their allowed-tools end with it
        session.match_skills(text)  # the person's words, not what @mentions brought in
        self.events.turn_tool_results = []
        self.result.error = None  # a turn's own: a refused turn's stayed on later ones, and was stored at the end
        try:
            result = session.agent().run(final=False, cancel_text="Error: cancelled by user")
        finally:
            self.events.stop()  # no spinner left ticking over the prompt, whatever ended the turn
        if result.status == "interrupted":
            session.cancel.set()  # subagents still running in other threads stop too
            keep_partial(session, self.events)
            self.console._write("")
            self.console.info("turn cancelled; the conversation is intact")
        elif result.status != "completed":
            self.failed_turns += 1
            self.console.error(result.error)
        result.status = "running"
        self.footer(before)

    def footer(self, before):
        used = self.result.prompt_tokens + self.result.completion_tokens
        window = self.window()
        conv = self.conversation
        now = context_tokens(self.session)
        share = 100 * now // max(window, 1)
        self.console.info("tokens: %s this turn · %s this session%s · context ~%s (%d%% of %s)" % (
            _fmt_tokens(used - before), _fmt_tokens(used), ESTIMATED_NOTE if self.result.estimated else "",
            _fmt_tokens(now), share, _fmt_tokens(window)), "dim")
        limit = conv.limit(window)
        if conv.tokens > limit * conv.prune_threshold * 0.85:
            self.console.warn("the conversation is near its budget (%s of %s tokens): older turns will be pruned soon"
                              " (/context shows what)" % (_fmt_tokens(conv.tokens), _fmt_tokens(limit)))
        big = [n for n in self.events.turn_tool_results if n // 4 > limit * 0.25]
        if big:
            self.console.warn("a single tool result used ~%s tokens, over a quarter of the budget; ask for ranges or "
                              "narrower searches" % _fmt_tokens(max(big) // 4))

    # -- readline --
    def setup_readline(self):
        try:
            import readline
        except ImportError:
            return None
        self.history_file = os.path.join(self.cfg.home, "chat_history")
        try:
            private_home(self.cfg.home)
            xzatoma_store.private_file(self.history_file)  # what people typed: 0600 before it is written
            load_chat_history(readline, self.history_file)
        except OSError:
            pass
        readline.set_auto_history(False)  # the REPL adds each message whole; answers to questions stay out
        readline.set_completer_delims(" \t\n")
        readline.set_completer(self.complete)
        readline.parse_and_bind("tab: complete")
        readline.parse_and_bind("set enable-bracketed-paste on")  # a pasted block is one message
        return readline

    def complete(self, text, state):
        try:
            import readline
            line = readline.get_line_buffer()
        except ImportError:
            line = text
        return (self.completions(line, text) + [None])[state]

    def completions(self, line, text):
        if line.lstrip().startswith("/") and " " not in line.strip():
            return sorted(c + " " for c in list(SLASH_COMMANDS) + [a for a in ALIASES if a.startswith("/")]
                          if c.startswith(text.lower()))
        if line.lower().startswith("/mode "):
            return [m for m in ("planning", "write") if m.startswith(text.lower())]
        if text.startswith("@"):
            partial = text[1:]
            base, prefix = os.path.split(partial)
            try:  # listed through the jail's descriptors, like the tools
                with self.session.ctx.jail.resolve(base or ".") as target:
                    fd = target.open_dir()
                    try:
                        entries = xzatoma_tools.list_fd(fd)
                    finally:
                        os.close(fd)
            except (OSError, xzatoma_tools.ToolError):
                return []
            # readline lists the matches as they are: a name holding a bidi override or a zero-width character
            # would reach the terminal raw (and be typed into the line unseen), so it is never offered
            return ["@" + os.path.join(base, name) + ("/" if kind == "dir" else "")
                    for name, kind in entries if name.startswith(prefix) and not name.startswith(".git")
                    and xzatoma_store.render_untrusted(name, exact=True) == name]
        return []


#: the first line of chat_history since messages of several lines are kept whole (older files: one per line)
HISTORY_HEADER = "#xzatoma chat history 2: one message per line, \\n a newline, \\\\ a backslash"
HISTORY_LENGTH = 1000  #: messages kept


def remember_message(readline, message):
    """A message (of any number of lines) as one history entry, unless it repeats the last one."""
    message = message.rstrip("\n")
    count = readline.get_current_history_length()
    if count and readline.get_history_item(count) == message:
        return
    readline.add_history(message)


def load_chat_history(readline, path):
    """chat_history into readline: whole messages (a pasted block comes back as it was typed)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().split("\n")
    escaped = bool(lines) and lines[0] == HISTORY_HEADER
    for line in lines[1:] if escaped else lines:
        if line:
            readline.add_history(_unescape_history(line) if escaped else line)


def save_chat_history(readline, path):
    """The last HISTORY_LENGTH messages, one per line, redacted (a key typed or pasted stays off disk)."""
    count = readline.get_current_history_length()
    items = [readline.get_history_item(i) for i in range(max(1, count - HISTORY_LENGTH + 1), count + 1)]
    text = HISTORY_HEADER + "\n" + "".join(
        xzatoma_store.redact(item).replace("\\", "\\\\").replace("\n", "\\n") + "\n" for item in items if item)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        pass


def _unescape_history(line):
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            out.append("\n" if line[i + 1] == "n" else line[i + 1])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def _build_chat(sub, common, fmt):
    chat = sub.add_parser(
        "chat", parents=[common], formatter_class=fmt, help=COMMAND_HELP["chat"],
        description="An interactive session. Planning mode offers read-only tools, Write mode all of them; Safe "
                    "asks before dangerous operations, YOLO does not. Answers stream to stdout; tool lines and "
                    "status go to stderr. With stdin piped, each line is a turn (no prompts).",
        epilog="in the chat: /help lists commands; @path, @path#L10-20, @dir/, @search:\"text\", @grep:\"regex\"\n"
               "and @url:https://… inject content; Ctrl-C cancels the running turn; Ctrl-D or 'exit' leaves.")
    chat.add_argument("message", nargs="*", metavar="MESSAGE",
                      help="a first message, answered before the prompt (every word from the first that is not an "
                           "option, as for run)")
    chat.add_argument("--mode", choices=("planning", "write"), help="start mode (default: agent.chat_mode)")
    chat.add_argument("--safety", choices=("safe", "yolo"), help="start safety (default: agent.safety_mode)")
    chat.add_argument("--working-dir", "-C", metavar="DIR", help="the jail (default: current directory)")
    chat.add_argument("--max-turns", type=int, metavar="N", help="model calls per message (agent.max_turns)")
    _model_flags(chat)
    chat.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus /metrics during the session")
    _sandbox_flags(chat)
    _resume_flags(chat)
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args, console):
    extra = {}
    if args.max_turns is not None:
        extra["agent.max_turns"] = args.max_turns
    cfg = config_from_args(args, console, _sandbox_config(args, extra))
    session = ChatSession(args, cfg, console)
    return session.run()


# ---- Skills: where they are found, trust, and `xzatoma skills` ----
# Discovery, parsing and activation are in xzatoma_skills. Here: the places of a working directory,
# which skills a session may use (project skills only once trusted), and the command that lists, shows,
# validates and trusts them. Trust is a generic record of the store (trusted_files: real path, kind, digest),
# so another kind of project file (an .mcp.json) can share it.

SKILL_TRUST = "skill"  #: a skill's kind among the store's trusted project files


def skill_places(cfg, working_dir):
    """Where skills are looked for, first wins: the project's .xzatoma/skills and .agents/skills (in the working
    directory), then agent.skills.user_dir."""
    places = [("project", working_dir, rel, rel) for rel in xzatoma_skills.PROJECT_SKILL_DIRS]
    user = cfg.get("agent.skills.user_dir")
    if user:
        user = os.path.abspath(os.path.expanduser(user))
        places.append(("user", user, ".", short_dir(user, 4096)))
    return places


def find_skills(cfg, working_dir):
    """(skills, problems) of a working directory, whether or not agent.skills.enabled is on."""
    return xzatoma_skills.discover_skills(skill_places(cfg, os.path.realpath(working_dir)), hidden=[cfg.home])


def skill_trust(store, skill):
    """'trusted', 'changed' (since it was trusted) or 'untrusted' for a project skill, or 'untrustable' where no
    digest covers it (skill.untrustable says why: a link out of the project, a folder over the bounds); 'user'
    for the person's own. Without a store nothing can have been trusted."""
    if skill.scope != "project":
        return "user"
    if skill.untrustable or not skill.digest:
        return "untrustable"
    if store is None:
        return "untrusted"
    try:
        return store.trust_state(skill.directory, SKILL_TRUST, skill.digest)
    except Exception:  # a store that fails now: as if nothing were trusted
        return "untrusted"


#: the trust states of a project skill no run uses
NOT_USED = ("untrusted", "changed", "untrustable")


def own_in_place(problems, state_of):
    """{name: the person's own skill} that runs use in place of a project skill of its name not trusted
    (`state_of(name)` says the project skill's trust): discovery kept the project's and left the person's as a
    problem (SkillProblem.shadowed). INFO: the project's silently switched it off, its narrowed allowed-tools too,
    for anything that can write the tree (round 18d); `skills list` called it a duplicate (18f)."""
    return {p.shadowed.name: p.shadowed for p in problems if p.shadowed is not None and p.shadowed.scope != "project"
            and state_of(p.shadowed.name) in NOT_USED}


def session_skills(cfg, console, working_dir, store, asker=None):
    """The skills a session may use. Each invalid one is reported (its file and why), never skipped in silence.
    Project skills not trusted yet (or changed since) are put to a person once through `asker` (chat): yes
    trusts them, for good when the store can keep it; without one (headless runs) they are skipped, and a
    warning names them and how to trust them."""
    if not cfg.get("agent.skills.enabled"):
        return []
    skills, problems = find_skills(cfg, working_dir)
    for problem in problems:
        if problem.level == "error":
            console.warn("skill %s is not used: %s (see xzatoma skills validate)" % (problem.path, problem.reason))
    states = [skill_trust(store, s) for s in skills]
    for skill, state in zip(skills, states):
        if state == "untrustable":
            console.warn("skill %s (%s) is not used: it cannot be trusted: %s" % (
                skill.name, skill.shown, skill.untrustable or "it has no digest"))
    pending = [(s, state) for s, state in zip(skills, states) if state in ("untrusted", "changed")]
    own = own_in_place(problems, dict(zip((s.name for s in skills), states)).get)
    if pending and asker is not None and ask_skill_trust(console, asker, pending):
        if store is None:
            console.warn("conversation history is unavailable, so the trust holds for this session only")
        for skill, _ in pending:
            if store is not None:
                try:
                    store.trust_file(skill.directory, SKILL_TRUST, skill.digest)
                except Exception as exc:
                    console.warn("cannot record the trust (%s): it holds for this session only" % one_line(exc, 120),
                                 once_key="skill-trust")
        return [s for s, state in zip(skills, states) if state != "untrustable"]
    if pending:
        console.warn("skipped %s not trusted%s: %s; read %s, then trust %s with 'xzatoma skills trust %s'" % (
            _plural(len(pending), "project skill"), " (or changed since)" if any(st == "changed" for _, st in pending)
            else " yet", ", ".join("%s (%s)" % (s.name, s.shown) for s, _ in pending[:10]),
            "it" if len(pending) == 1 else "them", "it" if len(pending) == 1 else "them",
            " ".join(s.name for s, _ in pending[:10])))
    used = []
    for skill, state in zip(skills, states):
        if state not in NOT_USED:
            used.append(skill)
        elif skill.name in own:
            console.warn("your own skill %s (%s) is used: the project's skill of that name is not trusted"
                         % (skill.name, own[skill.name].shown))
            used.append(own[skill.name])
    return used


def ask_skill_trust(console, asker, pending):
    """Show the project's skills not trusted yet ([(skill, state)]), and ask once."""
    asker.show(console.clean("This project has %s not trusted yet; trusted, %s instructions guide the model:" % (
        _plural(len(pending), "skill"), "its" if len(pending) == 1 else "their")))
    for skill, state in pending:
        asker.show(console.clean("  %s — %s (%s%s)" % (skill.name, one_line(skill.description, 100), skill.shown,
                                                       ", changed since you trusted it" if state == "changed" else "")))
    answer = asker.ask("Trust %s? (xzatoma skills show NAME shows one) [y/N] > " % (
        "it" if len(pending) == 1 else "them"))
    if (answer or "").strip().lower() in ("y", "yes"):
        return True
    console.info("not trusted: %s skipped this session" % ", ".join(s.name for s, _ in pending))
    return False


def _build_skills(sub, common, fmt):
    skills = sub.add_parser(
        "skills", parents=[common], formatter_class=fmt, help=COMMAND_HELP["skills"],
        description="A skill is a folder holding SKILL.md: YAML front matter (name, as the folder; description: what it\n"
                    "does and when to use it; optional triggers: keywords or /regexes/ that load it when a request\n"
                    "matches; optional allowed-tools: the only tools the agent may use while it is active), then the\n"
                    "instructions, and any files beside it. They are found in the project's .xzatoma/skills/ and\n"
                    ".agents/skills/ and in agent.skills.user_dir (~/.config/xzatoma/skills). The model sees each\n"
                    "skill's name and description and loads one with activate_skill when the task fits. Project\n"
                    "skills come with the repository: they are used only once trusted (chat asks once; run and watch\n"
                    "skip them), and after any change only when trusted again.",
        epilog="examples:\n  xzatoma skills list\n  xzatoma skills show code-review\n"
               "  xzatoma skills validate                  # every skill here; exit 1 when one is invalid\n"
               "  xzatoma skills validate path/to/my-skill  # one folder (or its SKILL.md)\n"
               "  xzatoma skills trust code-review          # after reading it\n\n"
               "a SKILL.md:\n  ---\n  name: code-review\n  description: Review a change for bugs and style. Use "
               "when asked to review code.\n  triggers: [review, \"/check (this|my) (pr|diff)/\"]\n"
               "  allowed-tools: read_file grep find_path\n  ---\n  # Code review\n  1. …")
    ssub = skills.add_subparsers(dest="skills_command", metavar="ACTION")
    a = ssub.add_parser("list", parents=[common], help="the skills found here: scope, trust, triggers, description")
    a.add_argument("--json", action="store_true", help="print {skills: [...], problems: [...]}")
    a = ssub.add_parser("show", parents=[common], help="one skill: its fields, files and instructions")
    a.add_argument("name")
    a = ssub.add_parser("validate", parents=[common], help="check skills; exit 1 when one is invalid")
    a.add_argument("paths", nargs="*", metavar="PATH", help="skill folders (or their SKILL.md, or a directory of "
                                                            "skills); default: every skill found here")
    a = ssub.add_parser("trust", parents=[common], help="trust project skills (their digest is recorded: a "
                                                        "change needs trust again)")
    a.add_argument("names", nargs="*", metavar="NAME")
    a.add_argument("--all", action="store_true", help="every valid project skill here")
    a = ssub.add_parser("untrust", parents=[common], help="forget the trust of project skills")
    a.add_argument("names", nargs="+", metavar="NAME")
    for a in ssub.choices.values():
        a.add_argument("--working-dir", "-C", metavar="DIR", help="the project (default: current directory)")
        a.set_defaults(func=cmd_skills)
    skills.set_defaults(func=cmd_skills)


def cmd_skills(args, console):
    action = args.skills_command
    if action is None:
        raise UsageError("say what to do: xzatoma skills list|show|validate|trust|untrust (see --help)")
    cfg = config_from_args(args, console)
    root = os.path.realpath(current_dir(args.working_dir))
    if not os.path.isdir(root):
        raise UsageError("working directory does not exist: %s" % root)
    if action == "validate" and args.paths:
        return _validate_paths(args.paths, console)
    skills, problems = find_skills(cfg, root)
    if not cfg.get("agent.skills.enabled"):
        console.warn("skills are turned off (agent.skills.enabled: false): runs and chats use none")
    out = CleanWriter(sys.stdout)  # names, descriptions and instructions come from the files
    if action == "validate":
        return _report_validation(out, skills, problems)
    store = open_store(cfg, console, required=action in ("trust", "untrust"))
    try:
        # listed and shown as runs use them: the person's own skill in place of a project one not trusted
        states = {s.name: skill_trust(store, s) for s in skills}
        own = own_in_place(problems, states.get)
        problems = [p for p in problems if p.shadowed not in own.values()]
        if action == "list":
            rows = [{"name": s.name, "description": s.description, "scope": s.scope,
                     "trust": states[s.name] if s.scope == "project" else "user",
                     "trust_problem": s.untrustable, "path": s.shown, "triggers": s.triggers,
                     "allowed_tools": sorted(s.allowed_tools) if s.allowed_tools is not None else None,
                     "files": s.resources, "used": s.scope != "project" or states[s.name] not in NOT_USED}
                    for s in skills + list(own.values())]
            if args.json:
                json_out({"skills": rows, "problems": [{"path": p.path, "reason": p.reason, "level": p.level}
                                                       for p in problems]})
                return EXIT_OK
            if rows:
                width = max([len(r["name"]) for r in rows] + [4])
                out.write("%-*s  %-7s  %-11s  %-8s  %s\n" % (width, "NAME", "SCOPE", "TRUST", "TRIGGERS",
                                                             "DESCRIPTION"))
                for r in rows:
                    out.write("%-*s  %-7s  %-11s  %-8d  %s\n" % (width, r["name"], r["scope"], r["trust"].replace(
                        "user", "-"), len(r["triggers"]), one_line(r["description"], 80)))
            elif not problems:
                console.info("no skills here (looked in %s)" % ", ".join(p[3] for p in skill_places(cfg, root)))
            for p in problems:
                console.warn("%s %s: %s" % ("invalid skill" if p.level == "error" else "skill", p.path, p.reason))
            for r in rows:
                if r["trust"] == "untrustable":
                    console.warn("skill %s cannot be trusted: %s" % (r["name"], r["trust_problem"]))
            for name, skill in own.items():
                console.info("your own skill %s (%s) is used: the project's skill of that name is not trusted"
                             % (name, skill.shown))
            return EXIT_OK
        if action in ("show", "trust", "untrust"):
            names = [args.name] if action == "show" else args.names
            if action == "trust" and args.all:
                names = [s.name for s in skills if s.scope == "project"]
                if not names:
                    console.info("no valid project skills here to trust")
                    return EXIT_OK
            elif not names:
                raise UsageError("name the skills to trust, or --all")
            by_name = {s.name: s for s in skills}
            missing = [n for n in names if n not in by_name]
            if missing:
                bad = [p for p in problems if any("/%s/" % n in p.path + "/" for n in missing)]
                raise UsageError("no valid skill named %s here%s" % (", ".join(missing), (
                    ": " + "; ".join("%s: %s" % (p.path, p.reason) for p in bad[:3])) if bad else
                    " (see xzatoma skills list)"))
            if action == "show":
                if args.name in own:  # what runs use; the project's is named, for trusting it
                    console.info("the project's skill %s (%s) is not trusted: your own is used" % (
                        args.name, by_name[args.name].shown))
                    return _show_skill(out, own[args.name], "user")
                return _show_skill(out, by_name[args.name], skill_trust(store, by_name[args.name]))
            refused = 0
            for name in names:
                skill = by_name[name]
                if skill.scope != "project":
                    console.info("%s is your own skill (%s): it needs no trust" % (name, skill.shown))
                elif action == "trust" and skill_trust(store, skill) == "untrustable":
                    console.error("skill %s (%s) cannot be trusted: %s" % (name, skill.shown, skill.untrustable))
                    refused += 1
                elif action == "trust":
                    store.trust_file(skill.directory, SKILL_TRUST, skill.digest)
                    console.info("trusted skill %s (%s); a change to its folder needs trust again" % (name, skill.shown))
                elif store.untrust_file(skill.directory, SKILL_TRUST):
                    console.info("skill %s is no longer trusted" % name)
                else:
                    console.info("skill %s was not trusted" % name)
            return EXIT_FAILED if refused else EXIT_OK
        return EXIT_OK
    finally:
        if store is not None:
            store.close()


def _show_skill(out, skill, trust):
    rows = [("name", skill.name), ("description", skill.description),
            ("scope", skill.scope + ("" if trust == "user" else " (%s)" % trust)), ("path", skill.shown),
            ("trust", "cannot be trusted: %s" % skill.untrustable if skill.untrustable else None),
            ("triggers", ", ".join(skill.triggers) or "-"),
            ("allowed-tools", "-" if skill.allowed_tools is None else ", ".join(sorted(skill.allowed_tools)) or
             "(none)"), ("files", ", ".join(skill.resources) or "-")]
    rows = [(k, v) for k, v in rows if v is not None] + [("warning", w) for w in skill.warnings]
    out.write("".join("%-14s %s\n" % (k + ":", v) for k, v in rows) + "\n" + (skill.body or "(no instructions)")
              + "\n")
    return EXIT_OK


def _report_validation(out, skills, problems):
    for skill in skills:
        out.write("ok       %s (%s)\n" % (skill.shown, skill.name))
        for warning in skill.warnings:
            out.write("warning  %s: %s\n" % (skill.shown, warning))
    for p in problems:
        out.write("%-8s %s: %s\n" % (p.level, p.path, p.reason))
    errors = sum(1 for p in problems if p.level == "error")
    out.write("%s valid, %s\n" % (_plural(len(skills), "skill"), _plural(errors, "error")))
    return EXIT_FAILED if errors else EXIT_OK


def _validate_paths(paths, console):
    """`skills validate PATH…`: a skill folder, its SKILL.md, or a directory of skill folders."""
    skills, problems = [], []
    for path in paths:
        real = os.path.realpath(path)
        named = os.path.basename(real) == xzatoma_skills.SKILL_FILE
        if named or os.path.isfile(os.path.join(real, xzatoma_skills.SKILL_FILE)):
            folder = os.path.dirname(real) if named else real
            shown = os.path.dirname(path.rstrip("/")) if named else path.rstrip("/")
            try:
                skills.append(xzatoma_skills.load_skill(xzatoma_tools.Jail(os.path.dirname(folder)),
                                                        os.path.basename(folder), "user", shown or "."))
            except xzatoma_skills.SkillProblem as exc:
                problems.append(exc)
        elif os.path.isdir(real):
            found, bad = xzatoma_skills.discover_skills([("user", real, ".", path.rstrip("/") or ".")])
            if not found and not bad:
                bad = [xzatoma_skills.SkillProblem(path, "no skill folders (a folder holding %s) in it"
                                                   % xzatoma_skills.SKILL_FILE)]
            skills += found
            problems += bad
        else:
            problems.append(xzatoma_skills.SkillProblem(path, "no such skill folder or %s" % xzatoma_skills.SKILL_FILE))
    return _report_validation(CleanWriter(sys.stdout), skills, problems)


# ---- Command line: global flags; watch, mcp and publish ----


def _add_global_flags(parser, suppress):
    """Global flags, accepted before or after the subcommand."""
    import argparse
    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    g = parser.add_argument_group("global options")
    g.add_argument("--config", metavar="PATH", default=d(None),
                   help="configuration file (default: $XZATOMA_CONFIG or ~/.config/xzatoma/config.yaml)")
    g.add_argument("--provider", choices=("copilot", "ollama", "openai"), default=d(None),
                   help="AI provider (overrides provider.type and XZATOMA_PROVIDER)")
    g.add_argument("--model", metavar="NAME", default=d(None), help="model of the chosen provider")
    g.add_argument("-v", "--verbose", action="store_true", default=d(False),
                   help="show debug detail, model thinking and tracebacks")
    g.add_argument("-q", "--quiet", action="store_true", default=d(False), help="show only errors on stderr")
    g.add_argument("--no-color", action="store_true", default=d(False), help="never colour output")


def _build_version(sub, common, fmt):
    version = sub.add_parser("version", help=COMMAND_HELP["version"])
    version.set_defaults(func=lambda args, console: (print("xzatoma " + __version__), EXIT_OK)[1])


def _build_watch(sub, common, fmt):
    watch = sub.add_parser(
        "watch", parents=[common], formatter_class=fmt, help=COMMAND_HELP["watch"],
        description="Consume a Kafka topic and run the plan each event carries (XZepr events, CloudEvents 1.0 in "
                    "structured or binary mode, or bare plans), headless, one stored conversation of kind 'watch' per "
                    "event. Each result is published as a CloudEvent on the output topic; offsets are committed only "
                    "after the result is recorded and published. Flags override the environment and the watcher.* "
                    "config keys.",
        epilog="examples:\n"
               "  xzatoma watch --brokers localhost:9092 --topic builds --event-types build.succeeded\n"
               "  xzatoma watch --topic plans --dry-run --idle-exit 10      # what would run, nothing run\n"
               "  xzatoma publish --plan task.yaml --brokers localhost:9092 --topic plans\n\n"
               "needs kafka-python: pip install 'xzatoma[kafka]'. SIGTERM/SIGINT stop taking events and let running\n"
               "plans finish for watcher.shutdown_grace_seconds (default 30 s; give a supervisor a longer stop\n"
               "timeout), exit 0. What was answered is recorded in the store (agent.persistence.db_path, default\n"
               "$XZATOMA_HOME/conversations.db): keep it on a lasting volume; watchers sharing it never run an id\n"
               "twice. exit codes: 0 stopped, 1 an unexpected error (one line; --verbose for the traceback), 2 bad\n"
               "usage, configuration or a missing package.")
    c = watch.add_argument_group("connection")
    c.add_argument("--brokers", metavar="HOST:PORT[,...]", help="bootstrap servers (watcher.kafka.bootstrap_servers)")
    c.add_argument("--topic", metavar="T", help="input topic (watcher.kafka.topic)")
    c.add_argument("--group-id", metavar="G", help="consumer group (default xzatoma-watcher); processes with one "
                                                   "group share the partitions")
    c.add_argument("--output-topic", metavar="T", help="results topic (default <topic>.results)")
    c.add_argument("--dead-letter-topic", metavar="T", help="copies of messages that cannot run")
    c.add_argument("--create-topics", action="store_true", help="create missing topics first")
    r = watch.add_argument_group("runs")
    r.add_argument("--working-dir", "-C", metavar="DIR", help="the jail of every plan (default: current directory)")
    r.add_argument("--mode", choices=("write", "planning"), help="tools offered to plans (default write)")
    r.add_argument("--max-concurrent", type=int, metavar="N", help="plans running at once (default 1)")
    r.add_argument("--max-events", type=int, metavar="N", help="stop after N messages are settled and committed")
    r.add_argument("--idle-exit", type=float, metavar="SECONDS", help="stop when nothing arrives for that long "
                   "(counted from when the broker answers: one away is retried, not idle)")
    r.add_argument("--max-turns", type=int, metavar="N", help="model calls per event (agent.max_turns)")
    r.add_argument("--timeout", type=int, metavar="SECONDS", help="wall-clock limit per event (default 300)")
    r.add_argument("--dry-run", action="store_true", help="print one JSON line per event that would run; run, "
                                                          "publish and commit nothing")
    r.add_argument("--format", choices=("auto", "xzepr", "cloudevents", "plan"), help="message format (default auto)")
    r.add_argument("--log-format", choices=("text", "json"), help="decision log lines (logging.format)")
    r.add_argument("--log-file", metavar="PATH", help="decision log here instead of stderr")
    r.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus /metrics while watching")
    r.add_argument("--metrics-host", metavar="ADDR", help="the address /metrics listens on (default 127.0.0.1: this "
                                                          "machine only; 0.0.0.0 for a Prometheus elsewhere)")
    f = watch.add_argument_group("filters (all given must hold)")
    f.add_argument("--event-types", metavar="A,B", help="event types, exact")
    f.add_argument("--source", metavar="REGEX", help="event source (search)")
    f.add_argument("--platform", metavar="ID", help="XZepr platform_id")
    f.add_argument("--package", metavar="NAME", help="XZepr package")
    f.add_argument("--api-version", metavar="V", help="XZepr api_version")
    f.add_argument("--include-failed", action="store_true", default=None,
                   help="also run XZepr events with success: false")
    f.add_argument("--action", metavar="REGEX", help="plan action (case-insensitive search)")
    f.add_argument("--name", metavar="REGEX", help="plan name (case-insensitive search)")
    f.add_argument("--match-version", metavar="CONSTRAINT", help="plan version: 1.2.3, ^1.2, ~1.2.3, >=1.0,<2")
    watch.set_defaults(func=cmd_watch)


def _build_mcp(sub, common, fmt):
    mcp = sub.add_parser(
        "mcp", parents=[common], formatter_class=fmt, help=COMMAND_HELP["mcp"],
        description="MCP servers give the agent more tools: mcp.servers in the configuration, and a project's "
                    ".mcp.json once trusted. stdio servers start inside the OS sandbox (no network unless their "
                    "configuration says network: true); their tools are asked like terminal commands in Safe mode, "
                    "and a headless run calls only those its configuration allows (allow, read_only).",
        epilog="examples:\n"
               "  xzatoma mcp list                       # servers, state, protocol, tools and their approval\n"
               "  xzatoma mcp tools fs                   # one server's tools\n"
               "  xzatoma mcp login github               # OAuth in the browser (after the server's 401)\n"
               "  echo \"$TOKEN\" | xzatoma mcp login api --token\n"
               "  xzatoma mcp trust                      # start the servers of this project's .mcp.json\n\n"
               "configuration (xzatoma.yaml):\n"
               "  mcp:\n"
               "    servers:\n"
               "      fs: {command: mcp-server-filesystem, args: [\".\"], allow: [read_text_file]}\n"
               "      api: {url: https://example.com/mcp, bearer_token_env: API_TOKEN}")
    msub = mcp.add_subparsers(dest="mcp_command", metavar="ACTION")
    a = msub.add_parser("list", parents=[common], help="every server: state, protocol, tools and their approval")
    a.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = msub.add_parser("tools", parents=[common], help="one server's tools, their approval and descriptions")
    a.add_argument("name", metavar="NAME", help="the server's name")
    a.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = msub.add_parser("login", parents=[common], help="log in to a remote server (OAuth in the browser, or "
                                                         "--token from stdin)")
    a.add_argument("name", metavar="NAME", help="the server's name")
    a.add_argument("--token", action="store_true", help="store a bearer token read from stdin instead")
    a = msub.add_parser("logout", parents=[common], help="forget a server's stored tokens")
    a.add_argument("name", metavar="NAME", help="the server's name")
    a = msub.add_parser("trust", parents=[common], help="trust this project's .mcp.json (as it is now)")
    a.add_argument("--yes", action="store_true", help="without asking (after reading it)")
    mcp.set_defaults(func=cmd_mcp)
    for a in msub.choices.values():
        a.add_argument("--working-dir", "-C", metavar="DIR", help="the project (default: the current directory)")
        a.set_defaults(func=cmd_mcp)


def cmd_mcp(args, console):
    """xzatoma mcp list | tools NAME | login NAME | logout NAME | trust."""
    action = getattr(args, "mcp_command", None) or "list"
    cfg = config_from_args(args, console)
    working_dir = check_working_dir(getattr(args, "working_dir", None))
    if action == "trust":
        return _mcp_trust(args, cfg, console, working_dir)
    name = getattr(args, "name", None)
    if action == "logout":
        removed = CredentialStore(cfg.home, console).delete(xzatoma_mcp.credential_name(name))
        console.info("removed the stored tokens of '%s'" % name if removed else "nothing stored for '%s'" % name)
        return EXIT_OK
    if action == "login" and args.token:
        token = stdin_line().strip() if not _isatty(sys.stdin) else __import__("getpass").getpass(
            "bearer token for '%s': " % name)
        if not token:
            raise UsageError("no token given (pipe it on stdin)")
        stored = {"access_token": token}
        url = _mcp_server_url(cfg, working_dir, name)
        if url:  # what it is for: a project's server of that name elsewhere never gets it
            stored["url"] = url
        where = CredentialStore(cfg.home, console).set(xzatoma_mcp.credential_name(name), json.dumps(stored))
        console.info("stored the token of '%s' (%s)" % (name, "system keyring" if where == "keyring" else where))
        return EXIT_OK
    asker = Asker(console) if action == "login" else None
    servers = open_mcp(cfg, console, working_dir, asker=asker, start=False, only=name)
    if servers is None or (name and servers.get(name) is None and not servers.untrusted):
        if name:
            raise UsageError("no MCP server named '%s' (mcp.servers in %s, or .mcp.json)" % (name, cfg.path))
        console.info("no MCP servers configured: add mcp.servers to %s, or a .mcp.json to the project" % cfg.path)
        return EXIT_OK
    if action == "login" and servers.get(name).config.transport != "http":
        raise UsageError("'%s' is a stdio server: it needs no login (its env names what it needs)" % name)
    try:
        servers.start()
        rows = servers.rows()
    finally:
        servers.close()
    if action == "login":
        row = rows[0]
        if row["state"] != "running":
            return EXIT_FAILED
        console.info("'%s' works: %d tools (MCP %s)" % (name, len(row["tools"]), row["protocol"]))
        return EXIT_OK
    if getattr(args, "json", False):
        json_out({"servers": rows}, indent=2)
    else:
        lines = xzatoma_mcp.status_lines(rows)
        if action == "tools":
            lines = []
            for row in rows:
                if row["state"] != "running":
                    console.warn("MCP server '%s' is %s: %s" % (row["name"], row["state"], row.get("error") or "-"))
                for tool in row["tools"]:
                    lines.append("%s  (%s)" % (tool["name"], xzatoma_mcp.APPROVAL_TEXT[tool["approval"]]))
                    lines.append("    " + one_line(tool["description"] or "-", 200))
        CleanWriter(sys.stdout).write("\n".join(lines) + "\n" if lines else "")
    return EXIT_OK if all(r["state"] in ("running", "disabled", "untrusted") for r in rows) else EXIT_FAILED


def _mcp_server_url(cfg, working_dir, name):
    """The URL of the remote server `name` (the person's own, else the project's .mcp.json's, read leniently
    and quietly), or None."""
    try:
        configs = xzatoma_mcp.parse_servers(cfg.get("mcp").get("servers") or None, cfg.path, os.environ, [])
    except xzatoma_mcp.ConfigError as exc:
        raise ConfigError(str(exc))
    text, path = xzatoma_mcp.read_project_file(working_dir) if cfg.get("mcp.project_file") else (None, None)
    if text is not None:
        configs += project_mcp(cfg, text, path, {c.name for c in configs})[0]
    return next((c.url for c in configs if c.name == name and c.transport == "http"), None)


def _mcp_trust(args, cfg, console, working_dir):
    text, path = xzatoma_mcp.read_project_file(working_dir)
    if text is None:
        raise UsageError("no .mcp.json in %s" % working_dir)
    own = cfg.get("mcp").get("servers")
    configs, problems, notes = project_mcp(cfg, text, path, set(own) if isinstance(own, dict) else ())
    unusable = [why for name, why in problems if name is None]
    if unusable:
        raise ConfigError(unusable[0])
    trust = xzatoma_mcp.ProjectTrust(cfg.home)
    if trust.trusted(path, text):
        console.info("%s is trusted already (as it is now)" % path)
        return EXIT_OK
    if problems and not configs:
        for _, why in problems:
            console.warn(why)
        raise ConfigError("%s: none of its MCP servers can start (above): nothing to trust" % path)
    if args.yes:
        show_mcp_project(console, path, configs, problems, notes)
    if args.yes or ask_mcp_trust(console, Asker(console), path, configs, problems, notes):
        trust.trust(path, text)
        console.info("trusted %s: its servers start with the next run or chat (a change asks again)" % path)
        return EXIT_OK
    console.info("not trusted")
    return EXIT_FAILED


def _watch_module(command, verbose=False):
    try:
        xzatoma_watch.require_kafka(command)
    except xzatoma_watch.WatchError as exc:
        raise UsageError(str(exc))
    xzatoma_watch.quiet_client_logs(verbose, Console.clean)
    return xzatoma_watch


def watch_settings(args, cfg):
    """The watcher's settings: flags > environment > config (watcher.*) > defaults."""
    w = cfg.get("watcher")
    k = w["kafka"]

    def pick(flag, value):
        return value if flag is None else flag
    topic = pick(args.topic, k["topic"])
    given = pick(args.working_dir, w["working_dir"])
    # as run and chat: an implicit $HOME (a user service's and cron's directory), / or above home is refused
    working_dir = check_working_dir(os.path.expanduser(given) if given else None)
    for flag, value in (("--max-concurrent", args.max_concurrent), ("--max-events", args.max_events)):
        if value is not None and value < 1:
            raise UsageError("%s must be at least 1" % flag)
    if args.max_concurrent is not None and args.max_concurrent > 256:  # watcher.max_concurrent's own bound
        raise UsageError("--max-concurrent must be at most 256 (watcher.max_concurrent)")
    check_metrics_port(args.metrics_port)  # before the provider and the store are set up
    if args.idle_exit is not None and not 0 < args.idle_exit < float("inf"):  # nan: never idle
        raise UsageError("--idle-exit must be a positive number of seconds")
    if not pick(args.group_id, k["group_id"]).strip():
        raise UsageError("--group-id (watcher.kafka.group_id) is empty: name the consumer group")
    security = {key: k[key] for key in ("security_protocol", "sasl_mechanism", "username", "password", "ssl_cafile",
                                        "ssl_certfile", "ssl_keyfile")}
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):  # else retried for good as a broker away, unnamed
        if security[key]:
            security[key] = os.path.expanduser(security[key])
            if "SSL" not in (security["security_protocol"] or ""):
                continue  # not opened without TLS (a file left in the configuration of another host)
            try:
                with open(security[key], "rb"):
                    pass
            except OSError as exc:
                raise UsageError("cannot read watcher.kafka.%s %s: %s" % (key, security[key], exc.strerror or exc))
    output_topic = pick(args.output_topic, k["output_topic"])
    dead_letter_topic = pick(args.dead_letter_topic, k["dead_letter_topic"])
    try:
        xzatoma_watch.check_brokers(pick(args.brokers, k["bootstrap_servers"]),
                                    "--brokers (watcher.kafka.bootstrap_servers)")
        xzatoma_watch.check_topic(topic, "--topic (watcher.kafka.topic)")
        for flag, given in (("--output-topic", args.output_topic), ("--dead-letter-topic", args.dead_letter_topic)):
            if given is not None and not given.strip():
                raise xzatoma_watch.WatchError("%s is empty: give a topic, or leave the flag out" % flag)
        if not args.dry_run:  # nothing is published
            xzatoma_watch.check_topic(output_topic or topic + ".results",
                                      "--output-topic (watcher.kafka.output_topic)" if output_topic else
                                      "--output-topic (by default the input topic's name + '.results')")
        if dead_letter_topic and not args.dry_run:
            xzatoma_watch.check_topic(dead_letter_topic, "--dead-letter-topic (watcher.kafka.dead_letter_topic)")
            if dead_letter_topic == topic:
                raise xzatoma_watch.WatchError("--dead-letter-topic (watcher.kafka.dead_letter_topic) is the input "
                                               "topic: each copy of a message that cannot run would come back to "
                                               "be copied again; name another topic")
    except xzatoma_watch.WatchError as exc:
        raise UsageError(str(exc))
    return xzatoma_watch.Settings(
        brokers=pick(args.brokers, k["bootstrap_servers"]), topic=topic, group_id=pick(args.group_id, k["group_id"]),
        output_topic=output_topic, dead_letter_topic=dead_letter_topic, create_topics=args.create_topics,
        security=security, working_dir=working_dir, max_concurrent=pick(args.max_concurrent, w["max_concurrent"]),
        max_events=args.max_events, idle_exit=args.idle_exit, dry_run=args.dry_run,
        format=pick(args.format, w["format"]), shutdown_grace=float(w["shutdown_grace_seconds"]),
        answer_limit=w["answer_max_bytes"], max_request_size=k["max_request_size"],
        max_message_bytes=w["max_message_bytes"], max_attempts=w["max_attempts"],
        claim_lease=float(w["claim_lease_seconds"]),
        consumer_options={"session_timeout_ms": k["session_timeout_ms"],
                          "max_poll_interval_ms": k["max_poll_interval_ms"],
                          "heartbeat_interval_ms": max(100, min(3000, k["session_timeout_ms"] // 3))})


def watch_filters(args, cfg):
    f = cfg.get("watcher.filter")

    def pick(flag, value):
        return value if flag is None else flag
    for flag, given, listed in (("--event-types", args.event_types, True), ("--source", args.source, False),
                                ("--platform", args.platform, True), ("--package", args.package, True),
                                ("--api-version", args.api_version, True), ("--action", args.action, False),
                                ("--name", args.name, False), ("--match-version", args.match_version, False)):
        if given is not None and not (given.replace(",", "") if listed else given).strip():  # `--platform "$P"`
            raise UsageError("%s is empty: give a value, or leave the flag out (an empty filter would let every "
                             "event run)" % flag)  # with P unset ran every event (attack round 17c)
    try:
        return xzatoma_watch.Filters(
            event_types=pick(args.event_types, f["event_types"]), sources=pick(args.source and [args.source],
                                                                                f["sources"]),
            platforms=pick(args.platform, f["platforms"]), packages=pick(args.package, f["packages"]),
            api_versions=pick(args.api_version, f["api_versions"]),
            include_failed=pick(args.include_failed, f["include_failed"]),
            actions=pick(args.action and [args.action], f["actions"]), names=pick(args.name and [args.name],
                                                                                   f["names"]),
            match_version=pick(args.match_version, f["match_version"]))
    except xzatoma_watch.WatchError as exc:
        raise UsageError(str(exc))


def watch_runner(cfg, console, store, settings, toolset, allow_dangerous, metrics=None):
    """The function the watcher calls to run one event's plan: a headless run, stored as a conversation of kind
    'watch' carrying the event's id, type, source, topic, partition and offset. Nothing waits on a person."""
    import threading
    base_provider = make_provider(cfg, console)  # credentials are checked once, at start
    session_skills(cfg, console, settings.working_dir, store)  # invalid and untrusted skills: said once, here
    quiet = Console(quiet=True, color=False)
    per_thread = threading.local()  # each worker thread's own provider: its HTTP connection lives on (issue 22)
    # one Confinement for the process (its protected set, policy and sandbox), not one per event; it goes with
    # the process (the sandbox's helper and TMPDIR at exit), and its sandbox starts only if a command runs
    confinement = build_confinement(cfg, check_working_dir(settings.working_dir), store)
    workspace = Workspace(cfg, confinement.root)  # instructions, skills, the tools' configuration: read once
    if toolset == "write":  # said once at start, as run does; --require-sandbox's config key refuses here
        check_sandbox(cfg, confinement.sandbox, console)

    def run_plan(job):
        provider = getattr(per_thread, "provider", None)
        if provider is None:
            provider = per_thread.provider = base_provider.clone()
        try:
            outcome = run_plan_session(cfg, quiet, job.prompt, settings.working_dir, toolset=toolset,
                                       autonomy=xzatoma_tools.FULL if allow_dangerous else xzatoma_tools.RESTRICTED,
                                       timeout_seconds=cfg.get("watcher.timeout_seconds"), title=job.title,
                                       metadata=job.metadata, store=store, cancel=job.cancel, metrics=metrics,
                                       provider=provider, confinement=confinement, workspace=workspace,
                                       steps=job.plan.instructions if job.plan is not None else None)
        except ProviderError as exc:  # before the loop: the session asks the server for the model's window
            if not exc.unreachable:
                raise
            return {"status": "failed", "error": xzatoma_store.redact(str(exc)), "model_unreachable": True}
        unreachable, outcome = outcome.unreachable, outcome.to_json()
        if unreachable:  # the watcher waits for the model server, and runs the event again (not answered)
            outcome["model_unreachable"] = True
        for key in ("answer", "error"):  # published to every consumer of the results topic, as `run` prints them
            outcome[key] = xzatoma_store.redact(outcome.get(key))
        return outcome
    run_plan.close = confinement.close  # the sandbox's helper and TMPDIR, when the process cannot wait for exit
    return run_plan


def xzepr_client(cfg, watch):
    """The XZepr API client, through the proxy network.proxies names for it and with its CA certificates."""
    url = cfg.get("xzepr.api_url")
    try:
        scheme, host, port = watch.XzeprClient.endpoint(url)
    except ValueError as exc:
        raise UsageError("xzepr.api_url %s" % exc)
    session = HttpSession(cfg.network)
    return watch.XzeprClient(url, cfg.get("xzepr.api_key"), proxy=session.proxy_for(scheme, host, port),
                             ssl_context=session._context() if scheme == "https" else None)


def cmd_watch(args, console):
    """`xzatoma watch`. SIGTERM and SIGINT stop it (exit 0), however many come, whenever they come: before the
    watcher exists (its checks, its sandbox: seconds in a big tree) the first leaves at once, what was set up undone
    (the default action left the sandbox's TMPDIR behind); once it runs they go to it (Watcher.signal_stop). Once a
    signal came, more are ignored until the process is gone: a storm restored to the default action killed it mid-way
    through its clean-up, the TMPDIR left again (attack round 13)."""
    import signal
    watch = _watch_module("watch", args.verbose)
    state = {"signalled": False, "watcher": None}

    def on_signal(signum, frame):
        state["signalled"] = True
        if state["watcher"] is not None:  # takes no lock: the interrupted thread may hold any
            state["watcher"].signal_stop("SIGTERM" if signum == signal.SIGTERM else "SIGINT")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(EXIT_OK)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _watch(args, console, watch, state)
    finally:
        for sig, handler in previous.items():  # leaving on one: more of them change nothing now
            signal.signal(sig, signal.SIG_IGN if state["signalled"] else handler)


def _watch(args, console, watch, state):
    extra = {}
    if args.max_turns is not None:
        extra["agent.max_turns"] = args.max_turns
    if args.timeout is not None:
        extra["watcher.timeout_seconds"] = args.timeout
    cfg = config_from_args(args, console, extra)
    settings = watch_settings(args, cfg)
    filters = watch_filters(args, cfg)
    log_file = args.log_file or cfg.get("watcher.log_file")
    stream = sys.stderr
    if log_file:
        try:  # created private, like every file that holds what events said (issue 12)
            fd = os.open(os.path.expanduser(log_file), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            stream = os.fdopen(fd, "a", encoding="utf-8")
        except OSError as exc:
            raise UsageError("cannot open the log file %s: %s" % (log_file, exc.strerror or exc))
    log = watch.WatchLog(stream, args.log_format or cfg.get("logging.format"), cfg.get("logging.level"),
                         redact=Console.clean)  # redacted, and what a topic said is shown, never obeyed
    store = None
    if not settings.dry_run:  # its exactly-once records are there: without them an id ran once per process
        if not cfg.get("agent.persistence.enabled"):
            raise UsageError("the watcher records every event it answers in the store, so that none runs twice: "
                             "it cannot run with agent.persistence.enabled: false (--dry-run can)")
        try:
            store = open_store(cfg, console, required=True)
        except UsageError as exc:
            raise UsageError("%s (the watcher records every event it answers there, so that none runs twice)"
                             % exc)
    toolset = args.mode or cfg.get("watcher.mode")
    metrics = load_metrics(args.metrics_port, host=args.metrics_host or cfg.get("watcher.metrics_host")) \
        if args.metrics_port else None
    run_plan = None if settings.dry_run else watch_runner(cfg, console, store, settings, toolset,
                                                          cfg.get("watcher.allow_dangerous"), metrics)
    xzepr = None
    if cfg.get("xzepr.api_url") and not settings.dry_run:
        xzepr = xzepr_client(cfg, watch)
    watcher = watch.Watcher(settings, filters, run_plan, store=store, log=log, xzepr=xzepr, metrics=metrics)
    state["watcher"] = watcher  # signals go to it from here on
    startup_over()  # a watcher waits for days: the collector's own threshold from its first poll
    try:
        code = watcher.run()
    except watch.WatchError as exc:  # the client refused its settings: no broker cures it
        raise UsageError(str(exc))
    finally:
        if metrics is not None:
            metrics.close()
        log.close()  # what the log's writer holds, for 2 s at most: a reader that never reads is not waited for
        if stream is not sys.stderr:
            stream.close()
    _exit_if_runs_linger(code, getattr(run_plan, "close", None))
    if store is not None:
        store.close()
    return code


def _exit_if_runs_linger(code, close=None):
    """A run interrupted after the grace period may still be waiting on a model reply (or on a store another
    process holds locked): its event is redelivered anyway, so the watcher exits now instead of waiting for it (its
    conversation is reaped as interrupted). `close` is done first: os._exit skips the clean-ups of exit (the
    sandbox's TMPDIR was left behind)."""
    import threading
    workers = [t for t in threading.enumerate() if t.name.startswith("xzatoma-watch") and t.is_alive()]
    deadline = time.monotonic() + 2.0
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in workers):
        if close is not None:
            try:
                close()
            except Exception:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _build_publish(sub, common, fmt):
    publish = sub.add_parser(
        "publish", parents=[common], formatter_class=fmt, help=COMMAND_HELP["publish"],
        description="Wrap a plan in a CloudEvent (or, with --xzepr, an XZepr event), publish it, and print the "
                    "event id on stdout: test a watch pipeline end to end with one tool.",
        epilog="example:\n  id=$(xzatoma publish --plan task.yaml --brokers localhost:9092 --topic plans)\n\n"
               "exit codes: 0 published, 1 the broker did not take it, 2 bad usage or plan.")
    publish.add_argument("--plan", metavar="FILE", required=True, help="the plan (YAML, JSON, Markdown; - reads stdin)")
    publish.add_argument("--brokers", metavar="HOST:PORT[,...]", help="bootstrap servers "
                                                                     "(watcher.kafka.bootstrap_servers)")
    publish.add_argument("--topic", metavar="T", help="topic (watcher.kafka.topic)")
    publish.add_argument("--type", metavar="TYPE", help="event type (default xzatoma.plan.requested)")
    publish.add_argument("--source", metavar="SRC", help="event source (default xzatoma://<host>/publish)")
    publish.add_argument("--xzepr", action="store_true", help="an XZepr event (plan in data.events[0].payload.plan)")
    publish.add_argument("--key", metavar="K", help="message key (default: the event id)")
    publish.set_defaults(func=cmd_publish)


def cmd_publish(args, console):
    watch = _watch_module("publish", args.verbose)
    cfg = config_from_args(args, console)
    # a watcher rejects a larger message unread (watcher.max_message_bytes): read as characters, then measured
    limit = cfg.get("watcher.max_message_bytes")
    text, source = read_plan_file(args.plan, limit, "watcher.max_message_bytes", unit="bytes")
    if len(text.encode("utf-8", "surrogatepass")) > limit:
        raise UsageError("plan file %s is larger than %s bytes (watcher.max_message_bytes); give a smaller one"
                         % (source, "{:,}".format(limit)))
    k = cfg.get("watcher.kafka")
    try:
        watch.check_brokers(args.brokers or k["bootstrap_servers"], "--brokers (watcher.kafka.bootstrap_servers)")
        watch.check_topic(k["topic"] if args.topic is None else args.topic, "--topic (watcher.kafka.topic)")
        data, plan = watch.plan_payload(text, source)
        event = watch.build_event(data, plan, args.type, args.source, args.xzepr)
        security = {key: k[key] for key in ("security_protocol", "sasl_mechanism", "username", "password",
                                            "ssl_cafile", "ssl_certfile", "ssl_keyfile")}
        event_id = watch.publish(args.brokers or k["bootstrap_servers"], args.topic or k["topic"], event, args.key,
                                 security, max_bytes=limit)
    except watch.WatchError as exc:
        raise UsageError(str(exc))
    except watch.PublishError as exc:
        raise XzError(str(exc), EXIT_FAILED)
    sys.stdout.write(event_id + "\n")
    return EXIT_OK


# ---- Command line: routing, and the parser (only the selected command's is built) ----

COMMAND_HELP = {
    "chat": "an interactive session (Planning/Write, Safe/YOLO, @mentions)",
    "run": "run one task to completion (prompt, stdin or plan)",
    "history": "list, show and search stored conversations",
    "replay": "replay a stored conversation as it was shown",
    "undo": "put back files the agent changed",
    "policy": "check what the terminal, fetch and jail rules say about a command, URL or path",
    "auth": "log in to Copilot, store API keys, check credentials",
    "models": "list the provider's models",
    "config": "show or create the configuration",
    "watch": "run the plans that arrive on a Kafka topic (XZepr, CloudEvents, bare plans)",
    "publish": "publish a plan to a Kafka topic as a CloudEvent",
    "mcp": "MCP servers: list them and their tools, log in, trust a project's .mcp.json",
    "skills": "list, show, validate and trust skills (SKILL.md folders)",
    "version": "print the version",
}
_VALUE_FLAGS = ("--config", "--provider", "--model")
#: what may come before the command: the global flags (and help, version)
_GLOBAL_FLAGS = _VALUE_FLAGS + ("-v", "--verbose", "-q", "--quiet", "--no-color", "-h", "--help", "-V", "--version")


def _misplaced_option(argv):
    """The first option before the command that is not a global flag, or None. argparse read such an option as
    an abbreviation of a global one (`--mode=planning` before `run` became `--model=planning`, and the run went
    on in write mode: round 19c), or its value as the command (`--mode planning run`: a traceback)."""
    value = False
    for token in argv:
        if value:
            value = False
            continue
        if token == "--" or not token.startswith("-") or token == "-":
            return None
        name = token.split("=", 1)[0] if token.startswith("--") else token
        value = token in _VALUE_FLAGS
        if name in _GLOBAL_FLAGS or (not token.startswith("--") and set(token[1:]) <= set("vqhV")):
            continue
        return name
    return None


def _selected_command(argv):
    """The subcommand named in argv (skipping global option values), or None."""
    index = _command_index(argv)
    return argv[index] if index is not None else None


def _command_index(argv):
    """Where the first word that is not a global option (or its value) stands in argv, or None."""
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
        elif token == "--":
            return i + 1 if i + 1 < len(argv) else None
        elif token in _VALUE_FLAGS:
            skip = True
        elif not token.startswith("-") or token == "-":
            return i
    return None


#: subcommands whose words after the options are free text: the task (run) or the first message (chat)
TEXT_COMMANDS = {"run": "task", "chat": "message"}


#: a subcommand's own word, typed as a command (round 18c: `xzatoma login` was a write-mode task for the model)
SUBCOMMAND_HOMES = {"login": "auth login", "logout": "auth logout", "status": "auth status", "signin": "auth login",
                    "list": "history list", "show": "history show"}


def route(argv, stdin_is_terminal):
    """argv as the parser reads it. Bare `xzatoma` on a terminal is `xzatoma chat`; `xzatoma "text"` (a first
    word that is no command) is `xzatoma chat "text"` on a terminal, `xzatoma run "text"` otherwise (a
    pipe, cron). A single word close to a command's name stays a mistake to correct, not a prompt."""
    misplaced = _misplaced_option(argv)
    if misplaced is not None:
        raise UsageError("%s is not an option of xzatoma itself: put it after the command (xzatoma run %s …); only "
                         "--config, --provider, --model, -v, -q and --no-color may come before the command"
                         % (misplaced, misplaced))
    index = _command_index(argv)
    if index is None:
        if any(t in ("-h", "--help", "-V", "--version") for t in argv):
            return argv
        if stdin_is_terminal:
            return argv + ["chat"]
        return argv + ["run"] if _stdin_is_data() else argv
    word = argv[index]
    if word in COMMAND_BUILDERS:
        return argv
    words = argv[index:]
    if words == ["help"]:
        return argv[:index] + ["--help"]
    import difflib
    if len(words) == 1 and " " not in word and difflib.get_close_matches(word, list(COMMAND_BUILDERS), n=1,
                                                                          cutoff=0.6):
        return argv  # argparse says: invalid choice 'chta'; did you mean 'chat'?
    if len(words) == 1 and word.lower() in SUBCOMMAND_HOMES:  # `xzatoma login` went to a model as its task
        raise UsageError("'%s' is not a command: did you mean 'xzatoma %s'? (a one-word task: xzatoma run -- %s)"
                         % (word, SUBCOMMAND_HOMES[word.lower()], word))
    head = [t for t in argv[:index] if t != "--"]
    return head + ["chat" if stdin_is_terminal else "run", "--"] + words


def split_text(parser, argv):
    """(options part, free text) for run and chat: everything from the command's first word that is not an
    option, or from `--`, is the text, options and all (`xzatoma run explain what ls -v does`); the options
    are those before it."""
    import argparse
    index = _command_index(argv)
    if index is None or argv[index] not in TEXT_COMMANDS:
        return argv, None
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = action.choices[argv[index]]._option_string_actions
    longs = [o for o in options if o.startswith("--")]
    i = index + 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i], argv[i + 1:]
        if not token.startswith("-") or token == "-":
            return argv[:i], argv[i:]
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            found = options.get(name) or (lambda m: options[m[0]] if len(m) == 1 else None)(
                [o for o in longs if o.startswith(name)])
            i += 2 if found is not None and found.nargs != 0 and "=" not in token else 1
            continue
        i += 1  # a cluster of short options (-vq), or one with its value (-Cdir, -C dir)
        for k, ch in enumerate(token[1:]):
            found = options.get("-" + ch)
            if found is not None and found.nargs != 0:
                i += 1 if k == len(token) - 2 else 0  # its value is the next word, or the rest of this one
                break
    return argv, []


def _parser_class():
    """argparse, with mistakes answered by the subcommand that was used and a did-you-mean (difflib and re
    are imported for a mistake only: --help shows no guess)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def parse_args(self, args=None, namespace=None):
            namespace, extras = self.parse_known_args(args, namespace)
            if extras:  # argparse blames the top-level parser: show the usage of the command actually used
                import difflib
                parser = self._innermost(namespace)
                options = [o for a in parser._actions for o in a.option_strings]
                words, hinted = [], False
                for token in extras:
                    close = difflib.get_close_matches(token.split("=", 1)[0], options, n=1, cutoff=0.6) \
                        if token.startswith("-") else []
                    words.append("%s (did you mean %s?)" % (token, close[0]) if close else token)
                    hinted |= bool(close)
                parser.error("unrecognized argument%s: %s%s" % ("s" if len(extras) > 1 else "", ", ".join(words),
                                                                "" if hinted else " (see %s --help)" % parser.prog))
            return namespace

        def _innermost(self, namespace):
            parser = self
            while True:
                action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
                name = getattr(namespace, action.dest, None) if action is not None else None
                if name not in getattr(action, "choices", {}):
                    return parser
                parser = action.choices[name]

        def error(self, message):
            import difflib
            import re
            m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
            if m:
                choices = [c.strip(" '\"") for c in m.group(2).split(",")]
                close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
                if close:
                    message += "; did you mean '%s'?" % close[0]
            # argparse quotes unrecognized arguments as they are: a file name from a script's glob can hold ESC
            try:
                message = Console.clean(message)
            except ImportError:  # `python -I xzatoma.py`: no sibling modules on the path; still nothing raw
                message = ascii(message)[1:-1]
            super().error(message)

    return Parser


def build_parser(argv=None):
    """The argument parser; only the selected subcommand's own options are built (start-up is a feature)."""
    import argparse
    fmt = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    _add_global_flags(common, suppress=True)

    parser = _parser_class()(
        prog="xzatoma", formatter_class=fmt, allow_abbrev=False,  # `--mod=x` is not --model (round 19c)
        description="XZatoma: an autonomous AI agent for the terminal. Give it a goal; it works through "
                    "a model (GitHub Copilot, Ollama or any OpenAI-compatible server) using file, search "
                    "and terminal tools inside the working directory. Without a command, 'xzatoma' opens a "
                    "chat on a terminal and 'xzatoma TEXT…' starts one with TEXT (with no terminal, as from a "
                    "pipe or cron, it runs TEXT as 'xzatoma run' does).",
        epilog="examples:\n"
               "  xzatoma                                  # a chat\n"
               "  xzatoma \"why does the build fail?\"      # a chat that starts with this question\n"
               "  xzatoma run explain what ls -v does      # one task: the words after the options\n"
               "  xzatoma run --prompt \"List the Python files and count their lines\"\n"
               "  xzatoma run --plan task.yaml --json > result.json\n"
               "  echo \"Summarise README.md\" | xzatoma run --provider ollama --model qwen3\n"
               "  xzatoma history list\n"
               "  xzatoma config show\n\n" + EXIT_CODES_HELP)
    _add_global_flags(parser, suppress=False)
    parser.add_argument("-V", "--version", action="version", version="xzatoma " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    selected = _selected_command(argv) if argv is not None else None
    for name, builder in COMMAND_BUILDERS.items():
        if argv is None or name == selected:
            builder(sub, common, fmt)
        elif selected not in COMMAND_BUILDERS:  # the list of commands is shown (help, a mistake): all named
            sub.add_parser(name, help=COMMAND_HELP[name])
    return parser


# ---- Command line: run (its task, output and result), policy and config ----

def config_from_args(args, console, extra=None):
    flags = {}
    if getattr(args, "provider", None):
        flags["provider.type"] = args.provider
    if getattr(args, "model", None):
        flags["model"] = args.model
    for key in SAMPLING:
        if getattr(args, key, None) is not None:
            flags[key] = getattr(args, key)
    if getattr(args, "tool_profile", None):
        flags["agent.tools.profile"] = args.tool_profile
    flags.update(extra or {})
    cfg = load_config(flags, config_path=getattr(args, "config", None))
    for warning in cfg.warnings:
        console.warn(warning)
    return cfg


def run_prompt(args):
    """The task given on the command line: `run "…"` or `--prompt "…"` (one of them), else None."""
    task = " ".join(getattr(args, "task", None) or ()) or None  # `xzatoma run list the files` needs no quotes
    if task is not None and (args.prompt is not None or args.plan):
        raise UsageError("give the task once: as an argument, with --prompt, or with --plan")
    return args.prompt if args.prompt is not None else task


def _stdin_is_data():
    """Standard input is a pipe or a file (not a terminal, /dev/null or a socket): something was piped."""
    import stat
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def read_piped_context(args, cap, deadline=None):
    """`cat build.log | xzatoma run "Why did this fail?"`: what was piped, as a context block to put after the
    task (None when the task itself comes from stdin or nothing was piped). Capped at `cap` bytes, with a
    note when cut. Never searched for @mentions: it is data, not the person's words. Read until its end or
    `deadline` (a pipe a CI runner or `ssh` leaves open without a word: an error, not a run that never starts)."""
    prompt = run_prompt(args)
    if args.plan == "-" or prompt in (None, "-") or not _stdin_is_data():
        return None
    data = read_until(sys.stdin.buffer, cap + 1, deadline)
    if data is None:
        raise XzError("standard input stayed open without ending until the run's time limit (agent.timeout_seconds):"
                      " give the command </dev/null (or ssh -n) when nothing is piped in")
    if not data:
        return None
    text = data[:cap].decode("utf-8", "replace")
    note = "\n[standard input cut at %d bytes (agent.mentions.max_file_size); the rest was not read]" % cap \
        if len(data) > cap else ""
    return "[Content of standard input]\n%s%s\n[End of standard input]" % (text.rstrip("\n"), note)


def read_until(stream, size, deadline):
    """Up to `size` bytes of `stream` (to its end), or None when `deadline` (time.monotonic()) comes first."""
    import select
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if deadline is None or fd is None:
        return stream.read(size)
    chunks, got = [], 0
    while got < size:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], min(left, 86400.0))[0]:  # select() refuses centuries
            if time.monotonic() >= deadline:
                return None
            continue
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def find_resume_target(cfg, console, args, deadline=None):
    """resume_target with a store of its own (closed again): before a Session is opened with what it finds."""
    store = open_store(cfg, console, deadline=deadline)
    try:
        return resume_target(store, args, check_working_dir(args.working_dir))
    finally:
        if store is not None:
            store.close()


def resume_target(store, args, working_dir):
    """(id, stored row) for --resume ID / --last. --last means this working directory's latest
    (--all-projects: anyone's); a conversation from another directory is refused unless --working-dir
    names where to continue it (the tools would otherwise work on a different tree than it did)."""
    if store is None:
        raise UsageError("cannot resume: conversation history is unavailable")
    here = os.path.realpath(working_dir)
    try:
        cid = store.resolve(args.resume) if args.resume else store.latest(
            working_dir=None if getattr(args, "all_projects", False) else here)
        stored = store.conversation(cid)
        store.refuse_running(cid)  # before anything starts (the Session takes it over in one transaction)
    except (xzatoma_store.NotFound, xzatoma_store.Busy) as exc:
        raise UsageError(str(exc))
    where = stored.get("working_dir")
    if where and os.path.realpath(where) != here and not args.working_dir:
        raise UsageError("conversation %s ran in %s, not here: continue it there with --working-dir %s"
                         % (cid[:12], where, shell_word(where)))
    return cid, stored


def restored_config(args, console, cfg, stored, extra=None):
    """The configuration a resumed conversation continues with: its stored provider and model unless
    --provider/--model are given again (its mode is restored by the caller)."""
    flags = {}
    if not getattr(args, "provider", None) and stored.get("provider") in PROVIDERS:
        flags["provider.type"] = stored["provider"]
        if not getattr(args, "model", None) and stored.get("model"):
            flags["model"] = stored["model"]
    elif getattr(args, "provider", None):
        flags["provider.type"] = args.provider
    if getattr(args, "model", None):
        flags["model"] = args.model
    if not flags or (flags.get("provider.type") == cfg.provider_type and flags.get("model", cfg.model) == cfg.model):
        return cfg
    flags.update(extra or {})
    return load_config(flags, config_path=getattr(args, "config", None))  # warnings were shown the first time


#: the most of a task or plan `run` reads, in characters: twice the largest window a model has, and more. INFO:
#: `--plan /dev/zero` (or a FIFO, or a log piped in by mistake) was read until memory ran out (attack round 16a)
MAX_TASK_CHARS = 32 << 20


def open_until(path, deadline):
    """open(path) as UTF-8 text; a named pipe nobody opens for writing waits until `deadline` at most (round 18f:
    `run --timeout 3 --plan FIFO` waited for ever in open())."""
    import stat as st
    try:
        fifo = deadline is not None and st.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False
    if not fifo:
        return open(path, encoding="utf-8")
    import threading
    box = []

    def opening():
        try:
            box.append(open(path, encoding="utf-8"))
        except OSError as exc:
            box.append(exc)
    thread = threading.Thread(target=opening, name="xzatoma-open", daemon=True)
    thread.start()
    thread.join(min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX))
    if not box:
        raise XzError("plan file %s: nothing wrote to it before the run's time limit (agent.timeout_seconds)" % path)
    if isinstance(box[0], OSError):
        raise box[0]
    return box[0]


def read_plan_file(path, limit, what, unit="characters", deadline=None):
    """(text, source) of a plan file, or of stdin for '-', read to at most `limit` characters (`what` names the
    bound, `unit` what it counts: more characters than a limit of bytes are more bytes too) and until `deadline`
    (a pipe: `--plan <(slow)`); a UsageError for a file that is missing, unreadable, not UTF-8 text, or larger."""
    try:
        if path == "-":
            return read_bounded(sys.stdin, limit, "the plan on stdin", what, unit, deadline), "<stdin>"
        with open_until(path, deadline) as fh:
            return read_bounded(fh, limit, "plan file %s" % path, what, unit, deadline), path
    except FileNotFoundError:
        raise UsageError("plan file not found: %s" % path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError("cannot read plan file %s: %s" % (path, getattr(exc, "strerror", None) or exc))


def prompt_input(prompt):
    """input(prompt); with stdout not the terminal (`chat > answers.txt`), the prompt goes to the terminal on
    stderr: input() wrote it into the file, and the person never saw the prompt or a question's choices (round
    18c). Python's line editing needs stdout on the terminal too, so there is none then."""
    if _isatty(sys.stdout) or not _isatty(sys.stderr):
        return input(prompt)
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return input("")


def stdin_line():
    """A line of standard input ("" at its end), of at most MAX_TASK_CHARS characters: `chat < /dev/zero` read
    one line without end until memory ran out (round 16b)."""
    line = sys.stdin.readline(MAX_TASK_CHARS + 1)
    if len(line) > MAX_TASK_CHARS:
        raise UsageError("a line on standard input is longer than %s characters; no model takes a message that "
                         "large" % "{:,}".format(MAX_TASK_CHARS))
    return line


def read_bounded(stream, limit, name, what, unit="characters", deadline=None):
    if deadline is None:
        text = stream.read(limit + 1)
    else:  # a pipe left open, or trickling, ends at the run's time limit (round 18f: the task on stdin waited)
        data = read_until(getattr(stream, "buffer", stream), 4 * limit + 4, deadline)
        if data is None:
            raise XzError("%s did not end before the run's time limit (agent.timeout_seconds); give the command "
                          "</dev/null (or ssh -n) when nothing is piped in" % name)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError("%s is not UTF-8 text (%s)" % (name, exc.reason))
    if len(text) > limit:
        raise UsageError("%s is larger than %s %s (%s); give a smaller one" % (name, "{:,}".format(limit), unit, what))
    return text


def read_instruction(args, console, default=None, deadline=None):
    """The task: (text, kind 'run'|'plan', title, source, steps) or a UsageError; steps: a plan's instructions
    (None for a prompt). What is read from stdin or a pipe is read until `deadline`."""
    if args.plan:
        text, source = read_plan_file(args.plan, MAX_TASK_CHARS, "no model takes a task that large",
                                      deadline=deadline)
        if args.plan != "-":
            source = os.path.abspath(args.plan)
        try:
            plan = xzatoma_plans.parse_plan(text, source=args.plan if args.plan != "-" else source)
        except xzatoma_plans.PlanError as exc:
            raise UsageError("invalid plan: %s" % exc)
        for key in getattr(plan, "unknown_keys", ()):
            console.warn("plan key '%s' is not used (known: goal, context, instructions; or name, description, version, action, steps)" % key)
        return plan.to_prompt(), "plan", plan.goal, source, plan.instructions
    prompt = run_prompt(args)
    if prompt == "-" or (prompt is None and not _isatty(sys.stdin)):
        text = read_bounded(sys.stdin, MAX_TASK_CHARS, "the task on stdin", "no model takes a task that large",
                            deadline=deadline)
        if not text.strip() and default:
            text = default
    elif prompt is None:
        if default:
            return default, "run", default, None, None
        raise UsageError("nothing to do: give the task (xzatoma run \"…\"), --plan FILE, or pipe it on stdin "
                         "(see 'xzatoma run --help')")
    else:
        text = prompt
    if not text.strip():
        raise UsageError("the instruction is empty")
    return text.strip(), "run", text.strip(), None, None


def output_format(args):
    """text, json or stream-json: --output-format, with --json as the alias of json."""
    fmt = getattr(args, "output_format", None)
    if getattr(args, "json", False):
        if fmt not in (None, "json"):
            raise UsageError("--json means --output-format json; give one of them")
        fmt = "json"
    return fmt or "text"


def run_events(console, fmt):
    """stream-json: JSON lines on stdout; text on a terminal (stdout and stderr both): the answer streams; else
    progress only. INFO: with stderr redirected (`2>run.log`) a streamed reply that then asked for tools was left
    on stdout, and its words never reached the log (round 18c)."""
    if fmt == "stream-json":
        return StreamJsonEvents(console)
    if fmt == "text" and _isatty(sys.stdout) and _isatty(sys.stderr):
        return StreamedRunEvents(console, sys.stdout)
    return RunEvents(console)


def prepare_task(cfg, console, ctx, instruction, piped=None):
    """The first user message of a run or plan: @mentions expanded through the read tools over the run's
    jail (as chat does), then what was piped on stdin as a context block."""
    text, _ = Mentions(lambda: xzatoma_tools.build_registry("planning", ctx), console, cfg).expand(instruction)
    return text + ("\n\n" + piped if piped else "")


def context_tokens(session):
    """The context now, in tokens: what the next request sends. The server's count of the last request plus
    estimates of what was added since; before any reply, the estimate with the tool definitions."""
    return session.conversation.sent_estimate(session.registry.definitions())


def keep_partial(session, events):
    """A reply Ctrl-C, SIGTERM or the time limit cut short: what it had said joins the conversation (the model's
    next turn and `history show` see it), marked as cut; on a terminal it stays on the screen, elsewhere it is
    the result's (partial) answer."""
    partial = events.partial() if hasattr(events, "partial") else ""
    result = session.result
    if not partial or result.status not in ("interrupted", "timeout"):
        return
    marker = CUT_SHORT if result.exit_code == EXIT_INTERRUPTED else \
        "[cut short: the run's time limit was reached while this reply was arriving]" if result.status == "timeout" \
        else "[cut short: the run was terminated while this reply was arriving]"
    session.conversation.add_assistant(partial + "\n\n" + marker)
    if not isinstance(events, StreamedText) and not result.answer:
        result.answer = partial


CUT_SHORT = "[cut short: the user pressed Ctrl-C while this reply was arriving]"


def emit_result(args, fmt, events, result):
    """The end of a run on stdout, in the chosen format."""
    if fmt == "json":
        json_out(result.to_json())
        sys.stdout.flush()
    elif fmt == "stream-json":
        events.emit("result", **result.to_json())
    elif result.status in ANSWERED and not events.answered:  # streamed to the terminal already, or:
        # data when piped: byte-exact but for secrets; neutralised on a TTY
        answer = xzatoma_store.redact(result.answer.rstrip("\n"))
        sys.stdout.write((Console.clean(answer) if _isatty(sys.stdout) else answer) + "\n")
        sys.stdout.flush()


def _resume_flags(parser):
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", metavar="ID", help="continue a stored conversation (unique id prefix) with its "
                                                      "provider, model and mode unless given again")
    resume.add_argument("--last", action="store_true", help="continue this directory's most recent conversation")
    parser.add_argument("--all-projects", "--global", action="store_true",
                        help="--last looks at every directory's conversations, not only this one's")


def _build_run(sub, common, fmt):
    run = sub.add_parser(
        "run", parents=[common], formatter_class=fmt, help=COMMAND_HELP["run"],
        description="Run one task autonomously and print the final answer on stdout (progress goes to "
                    "stderr; on a terminal the answer streams as it arrives). The task comes as words, --prompt, "
                    "--plan, or standard input; @mentions (@file#L10-20, @dir/, @search:\"…\", @grep:\"…\", "
                    "@url:…) work as in chat. Options go before the task: every word from the first that is not "
                    "an option is the task, as typed, options and all ('xzatoma run explain what ls -v does'); "
                    "'--' also ends the options ('xzatoma run -- -v means what?').",
        epilog="plans are YAML, JSON or Markdown files with a goal, optional context and instructions:\n"
               "  goal: Generate API documentation\n"
               "  context: {directory: src/api/}\n"
               "  instructions: [List all API endpoint files, Create an OpenAPI spec]\n\n"
               "terminal commands: without --allow-dangerous only read-only commands run; others are "
               "refused\nso the model can adapt. --json prints one object: conversation_id, status, answer, "
               "turns,\ntool_calls, usage, duration_seconds, error, warnings, steps (a plan's progress). "
               "--output-format\nstream-json prints JSON lines: start, tool_call, tool_result, message, usage, step, "
               "then result\n(the --json object).\n\n"
               "examples:\n  xzatoma run \"List the Python files\"\n"
               "  cat build.log | xzatoma run \"Why did this fail?\"\n"
               "  xzatoma run \"Explain @src/app.py#L10-40\"\n\n" + EXIT_CODES_HELP)
    run.add_argument("task", nargs="*", metavar="TASK", help="what to do: every word from here on (or --prompt, --plan, "
                                                            "or stdin); with a task, piped stdin is added as context")
    src = run.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", metavar="TEXT", help="the instruction ('-' reads it from stdin)")
    src.add_argument("--plan", metavar="FILE", help="a plan file (.yaml, .yml, .json, .md; '-' reads stdin)")
    run.add_argument("--mode", choices=("write", "planning"),
                     help="write: all tools (default; a resumed conversation keeps its own); planning: read-only tools")
    run.add_argument("--max-turns", type=int, metavar="N", help="stop after N model calls (agent.max_turns)")
    run.add_argument("--timeout", type=int, metavar="SECONDS", help="wall-clock limit (agent.timeout_seconds)")
    run.add_argument("--allow-dangerous", action="store_true",
                     help="full autonomy: run terminal commands that would otherwise need confirmation "
                          "(still inside the sandbox)")
    _sandbox_flags(run)
    _model_flags(run)
    run.add_argument("--working-dir", "-C", metavar="DIR",
                     help="directory the tools work in and cannot leave (default: current directory)")
    run.add_argument("--output-format", choices=("text", "json", "stream-json"),
                     help="text: the answer (default); json: one object at the end; stream-json: one JSON object "
                          "per line as things happen (README: the schema)")
    run.add_argument("--json", action="store_true", help="the same as --output-format json")
    _resume_flags(run)
    run.add_argument("--metrics-textfile", metavar="PATH", help="write Prometheus metrics here at the end "
                                                               "(node_exporter textfile collector)")
    run.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus /metrics while running")
    run.set_defaults(func=cmd_run)


def cmd_run(args, console):
    # SIGTERM and SIGHUP, from the start: before the loop (MCP servers starting, stdin read) they killed the run by
    # their default action, with no line and no record (round 18f); the loop's own catch is inside
    with sigterm_raises():
        return _cmd_run(args, console)


def _cmd_run(args, console):
    # INFO: the time limit counts from here: what comes before the loop (the task piped in, the server's
    # probes, an @url: mention) held `run --timeout 5` for 20-90 s against a silent server or stdin (round 18c)
    started = time.monotonic()
    extra = {}
    if args.max_turns is not None:
        extra["agent.max_turns"] = args.max_turns
    if args.timeout is not None:
        extra["agent.timeout_seconds"] = args.timeout
    cfg = config_from_args(args, console, _sandbox_config(args, extra))
    fmt = output_format(args)
    resume = args.resume or args.last or None
    deadline = started + cfg.get("agent.timeout_seconds")
    instruction, kind, title, source, steps = read_instruction(
        args, console, default="Continue the task from where it stopped." if resume else None, deadline=deadline)
    piped = read_piped_context(args, cfg.get("agent.mentions.max_file_size"), deadline)
    if resume:  # this directory's conversation, with its provider, model and mode unless given again
        resume, stored = find_resume_target(cfg, console, args, deadline)
        cfg = restored_config(args, console, cfg, stored, _sandbox_config(args, extra))
        args.mode = args.mode or (stored.get("mode") if stored.get("mode") in ("write", "planning") else None)
    args.mode = args.mode or "write"
    # nobody can be asked in run: confirm-level commands are refused unless --allow-dangerous
    full = args.allow_dangerous or cfg.get("agent.terminal.default_mode") == xzatoma_tools.FULL
    events = run_events(console, fmt)
    provider = make_provider(cfg, console)
    provider.deadline = deadline
    session = Session.open(cfg, console, args.mode, args.working_dir,
                           xzatoma_tools.FULL if full else xzatoma_tools.RESTRICTED, events=events,
                           metrics_port=args.metrics_port, metrics_textfile=args.metrics_textfile, provider=provider,
                           deadline=deadline)  # --timeout: MCP start-up counts against it
    try:
        session.start(kind, resume=resume, title=title, source=source, steps=steps)
        sandbox_note = None
        if "terminal" in session.registry:  # prepared before its first command (SandboxCheck), not now
            sandbox_note = sandbox_note_for_start(cfg, session)
        console.info("xzatoma %s · %s · %s · conversation %s%s%s" % (
            kind, session.provider.name, session.provider.model, session.id, " (resumed)" if resume else "",
            " · " + sandbox_note if sandbox_note else ""), "dim")
        session.conversation.add_user(prepare_task(cfg, console, session.ctx.with_deadline(deadline), instruction,
                                                   piped))
        if fmt == "stream-json":
            events.emit("start", conversation_id=session.id, kind=kind, provider=session.provider.name,
                        model=session.provider.model, mode=args.mode, working_dir=session.ctx.root,
                        resumed=bool(resume), steps=session.progress.to_json())
        if len(session.progress):
            events.progress(session.progress, None)
        # the task's words (a plan's goal and instructions, not the frame around them), never what was piped in
        session.match_skills(instruction if steps is None else "\n".join([title or ""] + list(steps)))
        try:
            result = session.agent(deadline=deadline).run()
        finally:
            events.stop()  # the spinner, whatever ended the run
        keep_partial(session, events)
        session.settle_progress()
    finally:
        session.close(wait_for_workers=3.0)  # children still running (Ctrl-C, SIGTERM) stop now
    summary = "%s: %s · %s · %s tokens (%s in / %s out)%s · context ~%s%s · %.1fs · conversation %s" % (
        result.status, _plural(result.turns, "turn"), _plural(result.tool_calls, "tool call"),
        _fmt_tokens(result.prompt_tokens + result.completion_tokens),
        _fmt_tokens(result.prompt_tokens), _fmt_tokens(result.completion_tokens),
        ESTIMATED_NOTE if result.estimated else "", _fmt_tokens(context_tokens(session)),
        " · " + result.progress.brief() if result.progress is not None and len(result.progress) else "",
        result.duration, result.conversation_id)
    emit_result(args, fmt, events, result)
    if result.status not in ANSWERED and fmt == "text" and result.answer and not console.quiet \
            and not events.answered:  # streamed: on the screen already
        console.info("partial answer:\n" + result.answer, "dim")
    for warning in result.warnings:
        console.warn(warning)
    if result.status not in ANSWERED:
        console.error(result.error)
    if result.turns or result.status in ANSWERED:  # a run that never reached the model: the error says all
        console.info(summary, "dim")
    show_review(console, result.review)
    return result.exit_code


def show_review(console, review):
    """The files that run later by design this run changed, on stderr: a person looks before running them."""
    if review:
        console.warn("changed files that run code later (a build, the tests, CI, the editor, a virtualenv): "
                     "review them before running anything: " + ", ".join(Console.clean(p, exact=True) for p in review))


def _model_flags(parser):
    """How the model is asked: sampling and window (the active provider's provider.<type>.* keys)."""
    group = parser.add_argument_group("model settings (provider.<type>.* in the configuration)")
    group.add_argument("--temperature", type=float, metavar="T", help="sampling temperature, e.g. 0.2")
    group.add_argument("--top-p", type=float, metavar="P", dest="top_p", help="nucleus sampling, e.g. 0.9")
    group.add_argument("--max-tokens", type=int, metavar="N", dest="max_tokens", help="cap on each reply's length")
    group.add_argument("--seed", type=int, metavar="N", help="sampling seed, for repeatable runs where the server "
                                                             "supports it")
    group.add_argument("--context-window", type=int, metavar="N", dest="context_window",
                       help="the model's context window in tokens, when the server does not say")
    group.add_argument("--tools", choices=("auto", "full", "compact"), dest="tool_profile",
                       help="tool profile: compact offers six short tool definitions for small models "
                            "(agent.tools.profile; auto picks by window and model size)")


def _sandbox_flags(parser):
    parser.add_argument("--sandbox", choices=("workspace-write", "read-only", "off"),
                        help="what terminal commands can touch, enforced by the OS (agent.terminal.sandbox; "
                             "default workspace-write); 'off' only when named")
    parser.add_argument("--require-sandbox", action="store_true",
                        help="exit 2 instead of warning where this machine cannot enforce the sandbox")


def _sandbox_config(args, extra):
    if getattr(args, "sandbox", None):
        extra["agent.terminal.sandbox"] = args.sandbox
    if getattr(args, "require_sandbox", False):
        extra["agent.terminal.require_sandbox"] = True
    return extra


def _build_policy(sub, common, fmt):
    policy = sub.add_parser(
        "policy", parents=[common], formatter_class=fmt, help=COMMAND_HELP["policy"],
        description="Print the verdict the tools would reach, then the reason, without running or fetching "
                    "anything: commands are allow/confirm/deny, URLs allow/block, paths inside/outside.",
        epilog="examples:\n  xzatoma policy command 'rm -rf ~'\n  xzatoma policy command 'make test' --mode full\n"
               "  xzatoma policy url http://169.254.169.254/latest/meta-data\n  xzatoma policy path ../secrets\n"
               "  printf 'ls\\nsudo ls\\n' | xzatoma policy command -     (one verdict per line)\n\n"
               "exit status: 0 when every verdict lets it through (allow, confirm, inside), 1 when any is refused\n"
               "(deny, block, outside), 2 for bad usage; so scripts can write: xzatoma policy command \"$c\" && …")
    psub = policy.add_subparsers(dest="policy_kind", metavar="KIND")
    for kind, help_text in (("command", "judge a terminal command"), ("url", "judge a URL for fetch"),
                            ("path", "judge a path against the working-directory jail")):
        p = psub.add_parser(kind, parents=[common], help=help_text)
        p.add_argument("value", metavar=kind.upper(), help="the %s, or - to read one per line from stdin" % kind)
        p.add_argument("--null", "-0", action="store_true", help="with -: items are separated by NUL bytes")
        if kind != "url":
            p.add_argument("--working-dir", "-C", metavar="DIR", help="the jail (default: current directory)")
        if kind == "command":
            p.add_argument("--mode", choices=("restricted", "full", "interactive"), default="restricted",
                           help="restricted (run's default), full (--allow-dangerous) or interactive (chat Safe)")
        p.set_defaults(func=cmd_policy)
    p = psub.add_parser("tools", parents=[common], help="the tools each profile offers a model, and their token cost",
                        description="The tool definitions the model is sent, per profile (agent.tools.profile: full, "
                                    "or compact for small models), with what each costs in tokens (about four "
                                    "bytes a token, as the context count estimates it; a chat template adds its own).")
    p.add_argument("--mode", choices=("write", "planning"), default="write",
                   help="write (run's default: every tool) or planning (the read-only tools)")
    p.add_argument("--json", action="store_true", help="print {tool: {full, compact}} and the totals as JSON")
    p.set_defaults(func=cmd_policy_tools)
    p = psub.add_parser("sandbox", parents=[common], help="what the OS sandbox enforces on this machine")
    p.add_argument("--working-dir", "-C", metavar="DIR", help="the working directory (default: current directory)")
    _sandbox_flags(p)
    p.set_defaults(func=cmd_policy_sandbox)
    policy.set_defaults(func=lambda args, console: (policy.print_help(sys.stderr), EXIT_USAGE)[1])


#: what the sandbox does not cover, however complete it is here (README: Safety)
SANDBOX_NOT_COVERED = (
    "reading what the system directories, the working directory and PATH programs' directories hold",
    "other processes' command lines in /proc where the kernel refuses the sandbox its own /proc "
    "(environ and memory stay protected)",
    "CPU time (only the timeout bounds a command), memory as a whole and disk use beyond one file's size "
    "(rlimits, no cgroup: agent.terminal.limits)",
    "what the file tools write (they are jailed and protected separately, not sandboxed)")


def cmd_policy_sandbox(args, console):
    cfg = config_from_args(args, console, _sandbox_config(args, {}))
    confinement = build_confinement(cfg, current_dir(args.working_dir))
    sandbox = confinement.sandbox
    try:
        lines = sandbox.describe()
        missing = sandbox.not_enforced()
    finally:
        confinement.close()
    lines.append("not enforced here: %s" % ("; ".join(missing) if missing else "nothing this mode needs"))
    lines += ["not covered: " + item for item in SANDBOX_NOT_COVERED]
    CleanWriter(sys.stdout, exact=True).write("\n".join(lines) + "\n")  # paths come from the tree: a name can hold ESC
    if missing and cfg.get("agent.terminal.require_sandbox"):
        console.error("sandbox %s is not fully enforced here (--require-sandbox)" % sandbox.access)
        return EXIT_USAGE
    return EXIT_OK


def cmd_policy_tools(args, console):
    tools = xzatoma_tools
    offered = [cls() for cls in tools.ALL_TOOLS]
    offered = [t for t in offered if args.mode == "write" or t.permission == tools.READ]
    cost = lambda definition: len(json.dumps(definition)) // 4  # Conversation.sent_estimate's rule
    table = {t.name: {"full": cost(t.definition()),
                      "compact": cost(tools.compact_definition(t.name)) if t.name in tools.COMPACT else None}
             for t in offered}
    totals = {p: sum(row[p] or 0 for row in table.values()) for p in ("full", "compact")}
    if args.json:
        json_out({"tools": table, "total": totals, "mode": args.mode}, indent=2)
        return EXIT_OK
    lines = ["%-18s %6s %8s" % ("tool (%s mode)" % args.mode, "full", "compact")]
    lines += ["%-18s %6d %8s" % (name, row["full"], "-" if row["compact"] is None else row["compact"])
              for name, row in table.items()]
    lines.append("%-18s %6d %8d" % ("total tokens", totals["full"], totals["compact"]))
    CleanWriter(sys.stdout, exact=True).write("\n".join(lines) + "\n")
    return EXIT_OK


#: exit 1: scripts can test a verdict without parsing it ("error": a symlink loop or an over-long name is no
#: answer a script may take for "inside")
REFUSED_VERDICTS = ("deny", "block", "outside", "error")


def cmd_policy(args, console):
    cfg = config_from_args(args, console)
    confinement = build_confinement(cfg, current_dir(getattr(args, "working_dir", None)))
    if args.value == "-":
        data = sys.stdin.read()
        items = [i for i in (data.split("\0") if args.null else data.splitlines()) if i.strip()]
    else:
        items = [args.value]
    policy = confinement.policy  # the one the terminal tool asks, with the same protected set
    allowed_hosts = cfg.get("agent.tools.fetch.allowed_hosts")
    refused = False
    for item in items:
        if args.policy_kind == "command":
            verdict = policy.judge(item)
            word, reason = verdict.level, verdict.reason
            if verdict.person:  # asked in every mode (round 19g)
                word, reason = "ask", reason + " (in every mode: chat asks even in YOLO; run and the watcher refuse " \
                                               "it, --allow-dangerous included)"
            elif word == "confirm":
                reason += {"restricted": " (restricted mode refuses it: run --allow-dangerous runs it)",
                           "full": "; full autonomous mode runs it without asking",
                           "interactive": " (chat in Safe mode asks first)"}[args.mode]
                if args.mode == "full":
                    word = "allow"
        elif args.policy_kind == "url":
            word, reason = xzatoma_tools.url_verdict(item, allowed_hosts)
        else:
            word, reason = xzatoma_tools.path_verdict(item, confinement)
        refused |= word in REFUSED_VERDICTS
        CleanWriter(sys.stdout, exact=True).write("%s: %s\n" % (word, reason))
    return EXIT_FAILED if refused else EXIT_OK


def _build_config(sub, common, fmt):
    config = sub.add_parser("config", parents=[common], formatter_class=fmt, help=COMMAND_HELP["config"],
                            description="Inspect the effective configuration or create a config file.")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", parents=[common], help="effective values and where each came from (secrets masked)")
    show.add_argument("--json", action="store_true", help="print {key: {value, source}} as JSON")
    show.set_defaults(func=cmd_config_show)
    path = csub.add_parser("path", parents=[common], help="print the configuration file path")
    path.set_defaults(func=cmd_config_path)
    init = csub.add_parser("init", parents=[common], help="write a commented default config file (never overwrites)")
    init.set_defaults(func=cmd_config_init)
    config.set_defaults(func=lambda args, console: (config.print_help(sys.stderr), EXIT_USAGE)[1])


def cmd_config_show(args, console):
    cfg = config_from_args(args, console)
    leaves = cfg.leaves()
    if args.json:
        out = {k: {"value": "****" if is_secret_key(k) and v else v, "source": cfg.sources.get(k, "default")}
               for k, v in leaves.items()}
        out["credentials"] = {name: {"env": var, "set": bool(cfg.secret(name))}
                              for name, var in cfg.secret_sources().items()}
        json_out(out, indent=2)
        return EXIT_OK
    width = max(len(k) for k in leaves)
    lines = ["# file: %s%s" % (cfg.path, "" if cfg.path_exists else " (not present; using defaults)"),
             "# home: %s" % cfg.home]
    for key, value in leaves.items():
        shown = "****" if is_secret_key(key) and value else json.dumps(value)
        source = cfg.sources.get(key, "default")
        lines.append("%-*s = %s%s" % (width, key, shown, "" if source == "default" else "   # " + source))
    lines.append("# credentials (values never shown):")
    for name, var in cfg.secret_sources().items():
        lines.append("#   %-8s %s %s" % (name, var, "set" if cfg.secret(name) else "not set"))
    CleanWriter(sys.stdout).write("\n".join(lines) + "\n")  # a password in a base URL is redacted
    return EXIT_OK


def cmd_config_path(args, console):
    env = os.environ
    explicit = getattr(args, "config", None) or env.get("XZATOMA_CONFIG")
    _write_path(os.path.expanduser(explicit) if explicit else default_config_path(env))
    return EXIT_OK


def _write_path(path):
    """A path on stdout: data when piped; on a terminal shown like every other name (XZATOMA_CONFIG can hold ESC)."""
    sys.stdout.write((Console.clean(path, exact=True) if _isatty(sys.stdout) else path) + "\n")


def cmd_config_init(args, console):
    env = os.environ
    explicit = getattr(args, "config", None) or env.get("XZATOMA_CONFIG")
    path = os.path.expanduser(explicit) if explicit else default_config_path(env)
    if os.path.exists(path):
        raise UsageError("config file already exists: %s (not overwritten; edit it or remove it first)" % path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "x", encoding="utf-8") as fh:
        fh.write(render_config_template())
    console.info("wrote %s" % path)
    _write_path(path)
    return EXIT_OK


# Every command's builder sits beside its cmd_ function above; build_parser builds only the selected one.
COMMAND_BUILDERS = {"chat": _build_chat, "run": _build_run, "history": _build_history, "replay": _build_replay,
                    "undo": _build_undo, "policy": _build_policy, "auth": _build_auth, "models": _build_models,
                    "config": _build_config, "watch": _build_watch, "publish": _build_publish, "mcp": _build_mcp,
                    "skills": _build_skills, "version": _build_version}


# ---- Interrupts: how Ctrl-C and SIGTERM travel ----
# Ctrl-C   The terminal sends SIGINT to its foreground process group: xzatoma alone. Commands never see
#          it: the sandbox helper that starts them runs in a session of its own and starts each as PID 1
#          of its own PID namespace; with --sandbox off, each runs in a new session (start_new_session).
#          Python raises KeyboardInterrupt in the main thread, wherever that is:
#          - in a model request: it leaves Provider.call / complete;
#          - in a terminal command (run_command's select loop): its `finally` kills the command and all
#            it started (the helper SIGKILLs the namespace's PID 1; off: _kill_group, SIGTERM then
#            SIGKILL to the process group), then it travels on;
#          - in parallel_subagent's wait (run_parallel): it sets the Session's cancel event, then
#            travels on; the worker threads' agents see the event between steps (Agent.check_cancel)
#            and their commands within 0.25 s (run_command's `cancel`), which kills them;
#          - in a subagent running in the main thread: its Agent.run records "interrupted" and
#            re-raises (run_subagent closes the child's record), so the whole tree stops;
#          - the top-level Agent.run is the edge: it becomes Interrupted (status "interrupted", exit
#            130); its `finally` closes dangling tool calls and saves the conversation.
#          run: cmd_run closes the Session (cancel set: whatever still runs stops; the sandbox closes: its
#          helper kills what is left; subagent threads get 3 s to record their end before the store
#          closes), main returns 130, and
#          _exit_now_if_threads_linger stops waiting after 3 s for threads blocked on a model.
#          chat: the turn ends "turn cancelled" and the Session's cancel event is renewed for the next;
#          between turns the REPL counts Ctrl-C (twice within a second leaves).
#          Before or after the loop (start-up, reading a plan), main() prints "interrupted", exit 130.
# SIGTERM  sigterm_raises(), around a whole run, makes SIGTERM (and SIGHUP) raise Terminated in the main
#          thread: a BaseException that takes exactly the path of KeyboardInterrupt and ends with exit 143 (129).
#          chat: leave_on_signals, for SIGTERM and SIGHUP (its terminal closed): the turn ends as with Ctrl-C,
#          then chat leaves as /exit does (recorded, sandbox closed), exit 128 + the signal.
#          Elsewhere (start-up) SIGTERM keeps its default action.
# watch    cmd_watch handles SIGINT and SIGTERM itself: the watcher stops taking events and sets each
#          running job's cancel event (the Session's `cancel`), which stops its agent and commands.


class leave_on_signals:
    """`with leave_on_signals() as signals:` SIGTERM, and SIGHUP (its terminal closed), raise Terminated in the main
    thread and set signals.signum: chat ends its turn as Ctrl-C does, then leaves as /exit does (the conversation
    recorded, the sandbox closed and its private temp directory removed), where their default action left a
    "running" conversation and the directory behind. After SIGHUP, the standard streams are /dev/null: the
    terminal is gone, and what is still said must not fail on it."""

    def __enter__(self):
        import signal
        self.signum, self.previous = None, {}

        def handler(signum, frame):
            first = self.signum is None
            self.signum = self.signum or signum
            if signum == getattr(signal, "SIGHUP", None):
                try:
                    null = os.open(os.devnull, os.O_RDWR)
                    for fd in (0, 1, 2):
                        os.dup2(null, fd)
                    os.close(null)
                except OSError:
                    pass
            if first:  # once: a second one must not cut short the recording and closing the first started
                raise Terminated("SIGHUP" if signum == getattr(signal, "SIGHUP", None) else "SIGTERM")
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is not None:
                try:
                    self.previous[sig] = signal.signal(sig, handler)
                except (ValueError, OSError):  # not the main thread
                    pass
        return self

    def __exit__(self, kind, exc, tb):
        import signal
        for sig, previous in self.previous.items():  # leaving on one: more of them change nothing now
            signal.signal(sig, signal.SIG_IGN if self.signum else previous)
        return False


class sigterm_raises:
    """`with sigterm_raises():` SIGTERM, and SIGHUP (the ssh session or terminal closed), raise Terminated in the
    main thread (a no-op in other threads). INFO: SIGHUP kept its default action in run: the process died with
    no record of its end and its private temp directory left behind (round 18c)."""

    def __enter__(self):
        import signal

        def handler(signum, frame):
            raise Terminated("SIGHUP" if signum == getattr(signal, "SIGHUP", None) else "SIGTERM")
        self.previous = {}
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            try:
                if sig is not None:
                    self.previous[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # not the main thread
                pass
        return self

    def __exit__(self, kind, exc, tb):
        import signal
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)
        return False


def _join_workers(timeout):
    """Wait (bounded) for subagent threads; True when none is left. Children that run commands stop them
    within a fraction of a second once cancelled."""
    if "threading" not in sys.modules:
        return True
    import threading
    workers = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    deadline = time.monotonic() + timeout
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in workers)


def _exit_now_if_threads_linger(code):
    """After Ctrl-C or SIGTERM, subagent threads blocked in a model request must not hold the exit."""
    if code not in (EXIT_INTERRUPTED, EXIT_TERMINATED) or "threading" not in sys.modules:
        return
    if not _join_workers(3.0):  # the rest wait on a model: do not wait for them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# ---- Main ----
# INFO: start-up creates some 25,000 objects that live as long as the process (the modules' functions and
# classes, the tool definitions, the configuration); the cycle collector's young generation, at its default
# threshold of 700 allocations, went through them 37 times to free nothing: 6% of a one-shot run. Until the
# first model call the threshold is higher; then what start-up made is frozen (gc.freeze: later collections
# skip it, as CPython's documentation advises for a process's long-lived start-up state) and the
# interpreter's own threshold is back. Reference counting frees everything else as always.

STARTUP_GC_THRESHOLD = 50000  #: young-generation allocations between collections until start-up is over
_gc_threshold = None  #: the interpreter's threshold while start-up has it raised, else None


def _startup_begins():
    global _gc_threshold
    import gc
    if _gc_threshold is None:
        _gc_threshold = gc.get_threshold()
        gc.set_threshold(max(_gc_threshold[0], STARTUP_GC_THRESHOLD), *_gc_threshold[1:])


def startup_over(freeze=True):
    """The work starts (a model call, a chat's prompt): the collector's own threshold again."""
    global _gc_threshold
    if _gc_threshold is not None:
        import gc
        if freeze:
            gc.freeze()
        gc.set_threshold(*_gc_threshold)
        _gc_threshold = None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in (["--version"], ["-V"], ["version"]):  # fast path: no argparse, no imports
        sys.stdout.write("xzatoma %s\n" % __version__)
        return EXIT_OK
    _startup_begins()
    saved = sys.stdout, sys.stderr
    try:
        return _main(argv)
    finally:
        startup_over(freeze=False)  # a command that never got to work (history, config …), called in-process
        sys.stdout, sys.stderr = saved


class GuardedOutput:
    """Standard output that a reader gone (`| head -c 10`) or a full disk (`--json > result.json`) cannot turn
    into a crash: the first failed write is kept in `error`, the descriptor is pointed at /dev/null (so the
    interpreter's last flush fails no more: it exited 120 with Python's own messages), and the rest is dropped
    while the run goes on to its end and its record (round 18c: a completed task exited 1, history said
    "killed or crashed")."""

    def __init__(self, stream):
        self._stream = stream
        self.error = None  #: the OSError of the first write that failed, or None

    def write(self, text):
        if self.error is None:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as exc:
                self._failed(exc)
        return len(text)

    def flush(self):
        if self.error is None:
            try:
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._failed(exc)

    def _failed(self, exc):
        self.error = exc
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _ClosedOutput:
    """Standard output that was closed before the process started."""

    encoding, errors = "utf-8", "strict"

    def write(self, text):
        import errno
        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        raise ValueError("standard output is closed")


def _guard_streams():
    """A closed stdout or stderr (`2>&-`: sys.stderr is None) is /dev/null, and stdout is a GuardedOutput."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:  # 1>&-: what is written fails, once, as on a full disk (round 18f: exit 0, silent)
        sys.stdout = GuardedOutput(_ClosedOutput())
    if not isinstance(sys.stdout, GuardedOutput):
        sys.stdout = GuardedOutput(sys.stdout)
    return sys.stdout


def _output_lost(out, console, code):
    """The exit code once stdout failed: a reader that stopped reading is its choice (the task's own code, a note);
    a write that failed otherwise (a full disk) lost the answer, which is a failure, said in one line."""
    out.flush()  # what waits in the buffer is written now, through the guard, not at the interpreter's exit
    if out.error is None:
        return code
    if isinstance(out.error, BrokenPipeError):
        console.info("standard output was closed by its reader; the rest of the output was dropped", "dim")
        return code
    console.error("cannot write standard output: %s" % (getattr(out.error, "strerror", None) or out.error))
    return code if code not in (EXIT_OK, EXIT_UNVERIFIED) else EXIT_FAILED


def _main(argv):
    out = _guard_streams()
    try:
        argv = route(argv, _isatty(sys.stdin))
    except UsageError as exc:
        Console().error(str(exc))
        return exc.exit_code
    parser = build_parser(argv)
    options, text = split_text(parser, argv)
    args = parser.parse_args(options)
    if text is not None:
        setattr(args, TEXT_COMMANDS[args.command], text)
    console = Console(quiet=args.quiet, verbose=args.verbose, color=False if args.no_color else None)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code = _output_lost(out, console, args.func(args, console))
        _exit_now_if_threads_linger(code)
        return code
    except XzError as exc:
        console.error(str(exc))
        return _output_lost(out, console, exc.exit_code)
    except KeyboardInterrupt:
        console.error("interrupted")
        return EXIT_INTERRUPTED
    except Terminated as exc:
        name = exc.args[0] if exc.args else "SIGTERM"
        console.error("terminated (%s)" % name)
        return EXIT_HANGUP if name == "SIGHUP" else EXIT_TERMINATED
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_FAILED
    except Exception as exc:  # a bug: one line unless --verbose
        if args.verbose:
            import traceback  # frames quote model and server text: cleaned like every other line
            console._write(console.clean(traceback.format_exc().rstrip("\n")))
        else:
            console.error("internal error: %s: %s (run again with --verbose for the traceback)"
                          % (type(exc).__name__, one_line(exc, 200)))
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
