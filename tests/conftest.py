"""Fixtures: a scripted model server on 127.0.0.1 and the real CLI run as a subprocess.

Every CLI run gets its own HOME, XZATOMA_HOME and XDG_CONFIG_HOME under a tmp
dir, and an environment without the caller's credentials, so no test touches
the real home directory, keyring or network.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "xzatoma.py")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_model import FakeModel  # noqa: E402
from xzatoma_tools import landlock_abi  # noqa: E402

# A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in every
# child: the Ctrl-C tests would then test nothing. Handle it here so children get the default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only the I-th of N shares of the tests (by a hash of each test's id): CI runs the "
                          "shares side by side")


#: fixtures that start processes (the CLI, a chat on a pseudo-terminal, a Kafka broker): their tests are "slow";
#: `pytest -m "not slow"` runs the in-process rest, the inner loop's tier
SLOW_FIXTURES = {"cli", "chat", "kafka_broker", "processes"}
#: modules whose tests start sandboxes, servers or interpreters of their own, or race the clock on purpose
SLOW_MODULES = {"test_sandbox", "test_attacks_sandbox", "test_pyz", "test_mcp_interop", "test_terminal"}
SLOW_TESTS = ("swap_race", "dripping_server", "stdio_cancel", "whatever_the_split", "oauth_login",
              "retry_after", "overruns", "deadline_already_near", "runs_deadline_bounds", "concurrent_processes",
              "processes_sharing_a_store")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts processes (the CLI, a pty chat, a broker, a sandbox); "
                                       "deselect with -m 'not slow' for the fast in-process tier")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__ if getattr(item, "module", None) else ""
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or module in SLOW_MODULES or \
                any(part in item.name for part in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    shard = config.getoption("--shard")
    if not shard:
        return
    import zlib
    index, count = (int(part) for part in shard.split("/"))
    mine = [zlib.crc32(item.nodeid.encode()) % count == index - 1 for item in items]
    config.hook.pytest_deselected(items=[item for item, keep in zip(items, mine) if not keep])
    items[:] = [item for item, keep in zip(items, mine) if keep]


SCRUBBED = ("OPENAI_API_KEY", "COPILOT_API_TOKEN", "GITHUB_TOKEN", "OLLAMA_API_KEY", "OLLAMA_HOST",
            "OLLAMA_MODEL", "COPILOT_MODEL", "XZATOMA_PROVIDER", "XZATOMA_MODEL", "XZATOMA_MAX_TURNS",
            "XZATOMA_CONFIG", "OPENAI_BASE_URL", "XZATOMA_HOME", "XDG_CONFIG_HOME")


@pytest.fixture
def fake():
    server = FakeModel().start()
    yield server
    server.stop()


class Cli:
    """Runs `python xzatoma.py …` the way cron and shells do."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.home = tmp_path / "home"
        self.xz_home = tmp_path / "xzhome"
        self.config_home = tmp_path / "config"
        self.workdir = tmp_path / "work"
        self.tmpdir = tmp_path / "tmp"  # what the CLI leaves there when a test kills it goes with tmp_path
        for d in (self.home, self.xz_home, self.config_home, self.workdir, self.tmpdir):
            d.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        self.env.update(HOME=str(self.home), XZATOMA_HOME=str(self.xz_home),
                        XDG_CONFIG_HOME=str(self.config_home), TMPDIR=str(self.tmpdir), NO_COLOR="1",
                        PYTHONUNBUFFERED="1",
                        # never the person's keyring: no backend (credentials go to the 0600 file) unless a
                        # test chooses the file-backed test keyring
                        PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring")

    def use_test_keyring(self):
        """The file-backed keyring of tests/keyring_backend.py, as a real backend."""
        self.keyring_file = self.tmp / "keyring.json"
        self.env.update(PYTHON_KEYRING_BACKEND="keyring_backend.FileKeyring", XZ_TEST_KEYRING_FILE=str(self.keyring_file),
                        PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
        return self

    @property
    def config_path(self):
        return self.config_home / "xzatoma" / "config.yaml"

    def write_config(self, data):
        import yaml
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(data))

    def use(self, fake, provider="ollama", model=None, api="chat", github=False, **agent):
        """Point the config at the fake server, with fast retries."""
        cfg = {"provider": {"type": provider, "max_retries": 2, "retry_backoff_seconds": 0.01,
                            "request_timeout_seconds": 20,
                            "ollama": {"host": fake.url, "model": model or "llama3.2:3b"},
                            "openai": {"base_url": fake.url + "/v1", "model": model or "gpt-test", "api": api},
                            "copilot": {"api_url": fake.url, "model": model or "gpt-5.3-codex",
                                        "github_url": fake.url, "github_api_url": fake.url}}}
        # the full tool set unless a test says otherwise: the fake is local and its default model small, which
        # would pick the compact profile (tests of that profile choose it)
        agent = dict(agent)
        agent["tools"] = dict({"profile": "full"}, **agent.get("tools", {}))
        cfg["agent"] = agent
        self.write_config(cfg)
        if provider == "copilot" and "COPILOT_API_TOKEN" not in self.env and not github:
            self.env["COPILOT_API_TOKEN"] = "tid=fake-copilot-token"
        return self

    def command(self, *args):
        return [sys.executable, SCRIPT] + [str(a) for a in args]

    def run(self, *args, input=None, env=None, timeout=60, cwd=None, stdin=None):
        full_env = dict(self.env, **(env or {}))
        feed = {"input": input} if stdin is None else {"stdin": stdin}  # stdin: a file (/dev/zero), not text
        return subprocess.run(self.command(*args), capture_output=True, text=True, env=full_env,
                              cwd=str(cwd or self.workdir), timeout=timeout, **feed)

    def popen(self, *args, env=None, **kw):
        full_env = dict(self.env, **(env or {}))
        return subprocess.Popen(self.command(*args), env=full_env, cwd=str(self.workdir),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, **kw)


@pytest.fixture
def cli(tmp_path):
    return Cli(tmp_path)


@pytest.fixture
def chat(cli, fake):
    """Starts `xzatoma chat …` under a pseudo-terminal against the fake model; closes them all after."""
    from ptyrun import PtyProcess
    cli.use(fake)
    procs = []

    def start(*args):
        p = PtyProcess(cli.command("chat", *args), dict(cli.env, TERM="xterm"), str(cli.workdir))
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.close()


def wait_for(predicate, timeout=20):
    """Wait for an event (bounded), polling; returns whether it happened."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def processes():
    """[(pid, ppid, pgid, state, cmdline bytes)] of the host's processes, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                cmdline = fh.read()
            with open("/proc/%s/stat" % entry) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out.append((int(entry), int(fields[1]), int(fields[2]), fields[0], cmdline))
    return out


def said(messages):
    """The user messages of a request that a person wrote: not the environment message xzatoma puts after the
    system prompt (working directory, date, AGENTS.md)."""
    return [m["content"] for m in messages
            if m["role"] == "user" and not (m.get("content") or "").startswith("<environment_context>")]


def tool_call(name, **arguments):
    return {"name": name, "arguments": arguments}


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real Kafka-compatible broker (Tansu) on 127.0.0.1 for the whole session; skipped when unavailable."""
    pytest.importorskip("kafka", reason="kafka-python is not installed")
    import kafka_broker as kb
    base = tmp_path_factory.mktemp("broker")
    try:
        binary = kb.broker_binary(base)
    except kb.Unavailable as exc:
        pytest.skip(str(exc))
    broker = kb.Broker(binary, str(base / "broker.log")).start()
    yield broker
    broker.stop()


#: for tests of the walls the kernel's Landlock builds: skipped, with the reason, on a kernel without it
needs_landlock = pytest.mark.skipif(not landlock_abi(), reason="the kernel has no Landlock: nothing to attack")


# ---- tool calls from the fake model against real trees (the file tools' and protected paths' tests) ----

#: what a headless run answers a call that needs a person's approval
HEADLESS = "needs a person's approval; not available in this run"


def tool_results(fake, index=-1):
    """The tool results the model was sent in its `index`-th request."""
    return [m["content"] for m in fake.model_requests()[index]["body"]["messages"] if m["role"] == "tool"]


def run_calls(cli, fake, calls, *extra, timeout=60):
    """One model turn making `calls`, then an answer; returns the CLI result and the tool results."""
    fake.add({"tool_calls": calls}, {"content": "done"})
    r = cli.run("run", "--prompt", "go", *extra, timeout=timeout)
    return r, tool_results(fake)


@pytest.fixture
def outside(cli):
    """A directory beside the working directory, with a victim file the tools must never touch."""
    d = cli.tmp / "outside"
    d.mkdir()
    (d / "victim.txt").write_text("untouched\n")
    return d


def snapshot(root):
    """{relative path: link target, file bytes or "dir"} of a whole tree."""
    out = {}
    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            full = os.path.join(base, name)
            out[os.path.relpath(full, str(root))] = (os.readlink(full) if os.path.islink(full) else
                                                     open(full, "rb").read() if os.path.isfile(full) else "dir")
    return out


def configure(cli, fake, **agent):
    """The fake model as provider, with agent settings merged in (tools:, terminal:)."""
    cli.use(fake)
    import yaml
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg.setdefault("agent", {}).update(agent)
    cli.write_config(cfg)


def run_commands(cli, fake, *commands, flags=(), env=None, timeout=90, code=0):
    """One terminal call per command, one turn each, then an answer; the CLI result and the tool results."""
    for command in commands:
        fake.add({"tool_calls": [tool_call("terminal", command=command)]})
    fake.add({"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", *flags, env=env, timeout=timeout)
    assert r.returncode == code, r.stderr
    return r, tool_results(fake)


def script(cli, name, body):
    (cli.workdir / name).write_text(body)
    return "sh " + name


HOSTILE = ["\x1b", "\u202e", "\x9b", "\x07", "\x08", "\x7f", "\u2066", "\u200b", "\ufeff", "\U000e0041", "\x00"]


def assert_clean(text, where):
    for ch in HOSTILE:
        assert ch not in text, "%r reached %s raw: %r" % (ch, where, text[-500:])
    assert "\r" not in text.replace("\r\n", "\n"), "a lone CR reached %s: %r" % (where, text[-500:])


def pty(cli, *args, rows=40, cols=120, color=False):
    from ptyrun import PtyProcess
    env = dict(cli.env, TERM="xterm")
    if color:
        env.pop("NO_COLOR")
    return PtyProcess(cli.command(*args), env, str(cli.workdir), rows=rows, cols=cols)


def person_messages(request):
    return [m for m in request["body"]["messages"] if not str(m.get("content")).startswith("<environment_context>")]


SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
