"""The OS sandbox, attacked as a prompt-injected model would: a script it wrote, run with --allow-dangerous so
the policy lets it through and only the kernel stands in the way. Harmless payloads: touch markers, a loopback
listener, unique `sleep` arguments looked for in /proc afterwards."""

import os
import socket
import time

import pytest

from conftest import configure, last_json, processes, run_commands, script, tool_call, wait_for
from xzatoma_tools import (FULL, READ_ONLY, SANDBOX_OFF, WORKSPACE_WRITE, Confinement, Sandbox, ToolContext,
                           build_registry, child_env, landlock_abi, program_dirs, sandbox_rules)

LANDLOCK = landlock_abi()
needs_landlock = pytest.mark.skipif(
    not LANDLOCK, reason="the kernel has no Landlock (Linux >= 5.13 with landlock in the LSM list): nothing to test")


def tool_results(fake, request=-1):
    return [m["content"] for m in fake.model_requests()[request]["body"]["messages"] if m["role"] == "tool"]


def attack(cli, fake, script, *flags, env=None, name="attack.sh", timeout=60):
    """The model writes a script with the file tool, then runs it with the terminal; returns (proc, output)."""
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("write_file", path=name, content=script)]},
             {"tool_calls": [tool_call("terminal", command="sh " + name)]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", *flags, env=env, timeout=timeout)
    return r, tool_results(fake)[-1]


def running_with(token):
    """Host processes (not zombies) whose command line holds token."""
    return [pid for pid, _, _, state, cmdline in processes() if token.encode() in cmdline and state != "Z"]


@needs_landlock
def test_a_script_cannot_write_outside_or_into_git_but_can_inside(cli, fake):
    (cli.workdir / ".git" / "hooks").mkdir(parents=True)
    (cli.workdir / ".git" / "config").write_text("[core]\n")
    (cli.workdir / "vendor" / "lib" / ".git" / "hooks").mkdir(parents=True)
    outside = cli.tmp / "outside-marker"
    home_marker = cli.home / "home-marker"
    script = ("touch %s; touch %s; touch $TMPDIR/tmp-ok && echo TMP-OK\n"
              "echo hook > .git/hooks/pre-commit; echo '[x]' >> .git/config; mv .git moved-git; rm -rf .git\n"
              "echo hook > vendor/lib/.git/hooks/post-checkout; rm -rf vendor\n"
              "mkdir -p src && echo inside > src/made.txt && mv src/made.txt src/renamed.txt && echo INSIDE-OK\n"
              % (outside, home_marker))
    r, out = attack(cli, fake, script)
    assert r.returncode == 0, r.stderr
    assert not outside.exists() and not home_marker.exists()
    assert "Permission denied" in out or "Read-only file system" in out
    assert not (cli.workdir / ".git" / "hooks" / "pre-commit").exists()
    assert (cli.workdir / ".git" / "config").read_text() == "[core]\n" and not (cli.workdir / "moved-git").exists()
    assert (cli.workdir / "vendor" / "lib" / ".git" / "hooks").is_dir()
    assert not (cli.workdir / "vendor" / "lib" / ".git" / "hooks" / "post-checkout").exists()
    assert (cli.workdir / "src" / "renamed.txt").read_text() == "inside\n"
    assert "INSIDE-OK" in out and "TMP-OK" in out


@needs_landlock
def test_a_script_cannot_read_the_home_directory_or_xzatoma_home(cli, fake):
    (cli.home / ".netrc").write_text("machine example.com password home-secret-4711\n")
    (cli.xz_home / "credentials.json").write_text('{"openai": "xz-secret-4712"}')
    script = "cat %s/.netrc; cat %s/credentials.json; ls -a %s; echo listed\n" % (cli.home, cli.xz_home, cli.home)
    r, out = attack(cli, fake, script)
    assert r.returncode == 0, r.stderr
    assert "home-secret-4711" not in out and "xz-secret-4712" not in out and ".netrc" not in out.split("listed")[0]
    # as root, what lies under a directory others may not enter (pytest's 0700 tmp) is not even there
    assert out.count("Permission denied") + out.count("No such file or directory") >= 3


@needs_landlock
def test_a_script_cannot_read_the_agents_environment_through_proc(cli, fake):
    script = ("for p in /proc/[0-9]*; do\n"
              "  if grep -q xzatoma.py $p/cmdline 2>/dev/null; then echo \"agent $p\"; cat $p/environ; "
              "grep -a TOKEN $p/environ; tr '\\0' '\\n' < $p/environ; head -c 64 $p/mem; fi\n"
              "done\n"
              "grep -a -c PATH /proc/self/environ\n")
    r, out = attack(cli, fake, script, env={"FOO_TOKEN": "proc-secret-4713"})
    assert r.returncode == 0, r.stderr
    assert "proc-secret-4713" not in out
    # the sandbox's own /proc does not even list the agent; where the kernel refuses one, Landlock denies
    assert "agent /proc/" not in out or "Permission denied" in out
    report = Sandbox(str(cli.workdir)).report()
    assert report["private_proc"] == ("agent /proc/" not in out)


@needs_landlock
def test_landlock_alone_keeps_other_processes_environment_unreadable(tmp_path):
    """Without the private /proc (a container may refuse one): the system's /proc lists the agent, and
    Landlock's ptrace rules still refuse its environ and memory."""
    ctx = ToolContext(Confinement(str(tmp_path), sandbox=Sandbox(str(tmp_path), assume_missing=("proc",))), {},
                      autonomy=FULL)
    reg = build_registry("write", ctx)
    (tmp_path / "p.sh").write_text("cat /proc/%d/environ | head -c 100; head -c 16 /proc/%d/mem; "
                                   "tr '\\0' ' ' < /proc/%d/cmdline | head -c 30\n" % ((os.getpid(),) * 3))
    with open("/proc/self/cmdline", "rb") as f:  # how the agent's listing reads, whatever path runs pytest
        listed = f.read()[:30].replace(b"\0", b" ").decode()
    try:
        r = reg.execute("terminal", {"command": "sh p.sh"})
        assert not ctx.sandbox.report()["private_proc"]
        assert r.output.count("Permission denied") == 2 and listed in r.output  # listed, but not readable
        assert "PATH=" not in r.output
    finally:
        ctx.sandbox.close()


@needs_landlock
def test_a_script_cannot_connect_to_a_loopback_listener(cli, fake):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    try:
        script = ("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && echo CONNECTED-TCP'\n"
                  "%s -c 'import socket; socket.create_connection((\"127.0.0.1\", %d), 3); print(\"CONNECTED-PY\")'\n"
                  "%s -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                  "s.sendto(b\"x\", (\"127.0.0.1\", %d)); print(\"SENT-UDP\")'\n" % (
                      port, "/usr/bin/python3", port, "/usr/bin/python3", port))
        r, out = attack(cli, fake, script)
        listener.settimeout(0.5)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert r.returncode == 0, r.stderr
    assert "CONNECTED" not in out and "SENT-UDP" not in out


@needs_landlock
def test_the_environment_is_an_allowlist(cli, fake):
    leaks = {"DATABASE_URL": "postgres://u:db-pw-4714@h/d", "FOO_TOKEN": "tok-4715", "MYSQL_PWD": "my-4716",
             "HTTPS_PROXY": "http://u:proxy-4717@proxy:3128", "SSH_AUTH_SOCK": "/tmp/agent-4718.sock",
             "AWS_SECRET_ACCESS_KEY": "aws-4719", "PLAIN_SETTING": "plain-4720", "OPENAI_API_KEY": "sk-4721"}
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="env")]}, {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", env=leaks)
    assert r.returncode == 0, r.stderr
    out = tool_results(fake)[-1]
    assert not [v for v in leaks.values() if v in out]
    names = [line.split("=", 1)[0] for line in out.split("--- stdout ---\n")[1].splitlines() if "=" in line]
    assert "PATH" in names and "HOME" in names and "TMPDIR" in names
    assert set(names) <= {"PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL",
                          "COLORTERM", "NO_COLOR", "PWD", "OLDPWD", "SHLVL", "_"} | {n for n in names
                                                                                  if n.startswith("LC_")}
    home = [line for line in out.splitlines() if line.startswith("HOME=")][0][5:]
    assert home != str(cli.home) and not os.path.exists(home)  # the private temp dir, removed with the run


def test_child_env_passthrough_and_secret_values():
    env = child_env({"PATH": "/bin", "CARGO_HOME": "/c", "CARGO_X": "1", "DB": "secret", "LC_ALL": "C",
                     "TOKEN_LIKE": "v"}, passthrough=("CARGO_*", "DB"), home="/h", tmpdir="/t", secrets=("secret",))
    assert env == {"PATH": "/bin", "CARGO_HOME": "/c", "CARGO_X": "1", "LC_ALL": "C", "HOME": "/h", "TMPDIR": "/t"}


@needs_landlock
def test_nothing_a_command_started_outlives_it(cli, fake):
    token = "61%d.%d" % (os.getpid() % 1000, int(time.time()) % 1000)
    script = ("setsid sleep %s1 >/dev/null 2>&1 &\n"
              "(sh -c 'sleep %s2 >/dev/null 2>&1 &' &)\n"
              "nohup setsid sh -c 'sleep %s3' >/dev/null 2>&1 &\n"
              "echo started\n" % (token, token, token))
    r, out = attack(cli, fake, script)
    assert r.returncode == 0 and "started" in out
    assert wait_for(lambda: not running_with(token), 10), running_with(token)


@needs_landlock
def test_timeout_kills_what_a_command_started(tmp_path):
    token = "62%d.%d" % (os.getpid() % 1000, int(time.time()) % 1000)
    ctx = ToolContext(Confinement(str(tmp_path), terminal={"timeout_seconds": 30}), {}, autonomy=FULL)
    reg = build_registry("write", ctx)
    try:
        started = time.monotonic()
        r = reg.execute("terminal", {"command": "setsid sleep %s1 & sleep %s2" % (token, token), "timeout_seconds": 1})
        assert time.monotonic() - started < 10
        assert r.error.startswith("command timed out after 1s; it and every process it started were killed")
        assert wait_for(lambda: not running_with(token), 10)
    finally:
        ctx.sandbox.close()


def test_run_timeout_holds_while_a_command_runs(cli, fake):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="sleep 60", timeout_seconds=120)]}, {"content": "never"})
    started = time.monotonic()
    r = cli.run("run", "--allow-dangerous", "--timeout", "5", "--json", "--prompt", "x")
    elapsed = time.monotonic() - started
    assert elapsed < 45, elapsed  # the command would sleep 60: the run ended at its own limit, whatever the load
    assert r.returncode == 1
    result = last_json(r.stdout)
    assert result["status"] == "timeout"
    assert len(fake.model_requests()) == 1  # the run ended; the model was not asked again


def test_the_models_timeout_is_capped(tmp_path):
    ctx = ToolContext(Confinement(str(tmp_path), terminal={"timeout_seconds": 30, "max_timeout_seconds": 1}), {},
                      autonomy=FULL)
    reg = build_registry("write", ctx)
    try:
        r = reg.execute("terminal", {"command": "sleep 30", "timeout_seconds": 1000})
        assert r.error.startswith("command timed out after 1s")
    finally:
        ctx.sandbox.close()


@needs_landlock
def test_policy_sandbox_says_what_is_enforced(cli):
    r = cli.run("policy", "sandbox")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "sandbox: workspace-write"
    assert lines[1] == "landlock: ABI %d" % LANDLOCK
    assert lines[2].startswith("filesystem: writes only in the working dir and a private TMPDIR")
    assert lines[3].startswith("network: a new network namespace") or lines[3].startswith("network: Landlock")
    assert "not enforced here: nothing this mode needs" in lines
    (cli.workdir / ".git").mkdir()
    (cli.workdir / "sub" / ".hg").mkdir(parents=True)
    r = cli.run("policy", "sandbox")
    assert "protected paths: read-only bind mounts in a private mount namespace: .git, sub/.hg" in r.stdout
    r = cli.run("policy", "sandbox", "--sandbox", "off")
    assert r.stdout.startswith("sandbox: off\nconfinement: none")
    (cli.workdir / "x\x1b]0;pwned\x07\x1b[2J" / ".git").mkdir(parents=True)  # a vendored repo's hostile name
    r = cli.run("policy", "sandbox")
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "x\\x1b]0;pwned\\x07\\x1b[2J/.git" in r.stdout, r.stdout


@needs_landlock
def test_a_missing_kernel_feature_warns_once_or_refuses_with_require_sandbox(cli, fake):
    cli.use(fake, terminal={"sandbox_assume_missing": ["landlock"]})
    fake.add({"content": "ok"})
    r = cli.run("run", "--prompt", "x")  # no command ran: the sandbox was never prepared, nothing to say
    assert r.returncode == 0 and "not enforced here" not in r.stderr
    fake.add({"tool_calls": [tool_call("terminal", command="ls")]}, {"tool_calls": [tool_call("terminal", command="ls")]},
             {"content": "ok"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0
    warnings = [l for l in r.stderr.splitlines() if "not enforced here" in l]
    assert len(warnings) == 1 and "Landlock filesystem rules" in warnings[0]
    assert r.stderr.index("not enforced here") < r.stderr.index("▶ terminal ls")  # said before the command
    r = cli.run("run", "--require-sandbox", "--prompt", "x")
    assert r.returncode == 2
    assert "not enforced here: Landlock filesystem rules" in r.stderr and "Traceback" not in r.stderr
    assert len(fake.model_requests()) == 4  # refused before asking the model
    r = cli.run("policy", "sandbox", "--require-sandbox")
    assert r.returncode == 2 and "landlock: not available" in r.stdout


def test_sandbox_off_is_said_in_the_header_and_runs_unconfined(cli, fake):
    outside = cli.tmp / "off-marker"
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="touch %s" % outside)]}, {"content": "ok"})
    r = cli.run("run", "--allow-dangerous", "--sandbox", "off", "--prompt", "x")
    assert r.returncode == 0 and outside.exists()
    assert "sandbox OFF" in r.stderr


@needs_landlock
def test_read_only_mode_writes_nothing(tmp_path):
    ctx = ToolContext(Confinement(str(tmp_path), terminal={"sandbox": READ_ONLY}), {}, autonomy=FULL)
    reg = build_registry("write", ctx)
    (tmp_path / "f.txt").write_text("data\n")
    try:
        r = reg.execute("terminal", {"command": "cat f.txt; touch new.txt; touch $TMPDIR/t; echo x > /dev/null && "
                                                "echo NULL-OK"})
        assert "data" in r.output and "NULL-OK" in r.output and r.output.count("Read-only file system") == 2
        assert not (tmp_path / "new.txt").exists()
    finally:
        ctx.sandbox.close()


def test_rules_never_grant_home_or_xzatoma_home(tmp_path):
    home = tmp_path / "home"
    for d in ("home/.cargo/bin", "home/.local/bin", "home/bin", "home/.xzatoma/bin", "opt/tool/bin",
              "home/.pyenv/shims", "home/.pyenv/versions"):
        (tmp_path / d).mkdir(parents=True)
    (home / ".cargo" / "credentials.toml").write_text("token")
    (home / ".pyenv" / "version").write_text("3.12")
    path = os.pathsep.join(str(tmp_path / d) for d in ("home/.cargo/bin", "home/.local/bin", "home/bin",
                                                       "home/.xzatoma/bin", "opt/tool/bin", "home/.pyenv/shims"))
    dirs = program_dirs(path + ":relative:", str(home), str(home / ".xzatoma"))
    assert str(home / ".pyenv" / "versions") in dirs and str(home / ".pyenv" / "version") in dirs
    assert str(home / ".pyenv") not in dirs
    assert str(home / ".cargo" / "bin") in dirs and str(home / "bin") in dirs
    assert str(tmp_path / "opt" / "tool") in dirs  # a prefix outside home: whole
    assert str(home) not in dirs and str(home / ".cargo") not in dirs and str(home / ".local") not in dirs
    assert not [d for d in dirs if d.startswith(str(home / ".xzatoma"))]
    rules = dict(sandbox_rules(str(tmp_path / "opt"), WORKSPACE_WRITE, str(tmp_path), path, str(home)))
    assert rules[str(tmp_path / "opt")] == "rw" and rules.get("/dev/null") == "dev-rw"
    assert dict(sandbox_rules(str(tmp_path / "opt"), READ_ONLY, str(tmp_path), path))[str(tmp_path / "opt")] == "r"


def test_sandbox_modes_are_checked():
    with pytest.raises(ValueError):
        Sandbox("/", "workspace")
    assert Sandbox("/", SANDBOX_OFF).confined is False


@needs_landlock
def test_a_program_that_is_not_there_is_an_error_the_model_can_read(tmp_path):
    ctx = ToolContext(str(tmp_path), {}, autonomy=FULL)
    reg = build_registry("write", ctx)
    try:
        assert reg.execute("terminal", {"command": "no-such-program-4722 --x"}).error == \
            "no such file or directory: no-such-program-4722"
        assert "not found" in reg.execute("terminal", {"command": "no-such-program-4722 | cat"}).output
        for _ in range(3):  # the helper keeps serving after a failed start and many quick commands
            assert reg.execute("terminal", {"command": "echo ok"}).output.endswith("ok")
    finally:
        ctx.sandbox.close()


@needs_landlock
@pytest.mark.parametrize("abi", range(1, min(LANDLOCK, 7) + 1))
def test_every_landlock_abi_confines_with_its_own_rights(tmp_path, abi):
    """As a kernel with only ABI N would: the ruleset must be valid for N and still confine."""
    work = tmp_path / "work"
    work.mkdir()
    sandbox = Sandbox(str(work), assume_missing=("abi:%d" % abi, "readonly-view", "idmap"))  # Landlock alone
    ctx = ToolContext(Confinement(str(work), sandbox=sandbox), {}, autonomy=FULL)
    reg = build_registry("write", ctx)
    try:
        report = sandbox.report()
        assert report["landlock"] == abi and report["filesystem"]
        assert report["truncate"] == (abi >= 3) and report["landlock_net"] == (abi >= 4)
        assert report["scopes"] == (abi >= 6)
        r = reg.execute("terminal", {"command": "mkdir -p a b && echo x > a/f && mv a/f b/f && cat b/f && "
                                                "echo y > b/f && touch %s/outside" % tmp_path})
        assert "Permission denied" in r.output and "x" in r.output
        assert (work / "b" / "f").read_text() == "y\n" and not (tmp_path / "outside").exists()
        missing = sandbox.not_enforced()
        assert ("signal/abstract-socket scoping (Landlock ABI 6)" in missing) == (abi < 6)
    finally:
        sandbox.close()


@needs_landlock
def test_a_command_inherits_no_descriptor_but_its_own_three(cli, fake):
    r, out = attack(cli, fake, "ls /proc/self/fd\n")
    fds = set(out.split("--- stdout ---\n")[1].split())
    assert fds <= {"0", "1", "2", "3"}, fds  # 3: the directory ls itself is reading


@needs_landlock
def test_network_is_an_explicit_opt_in_shown_in_the_header(cli, fake):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    try:
        cli.use(fake, terminal={"network": True})
        fake.add({"tool_calls": [tool_call("write_file", path="c.sh", content=(
            "bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && echo CONNECTED-TCP'\n" % port))]},
            {"tool_calls": [tool_call("terminal", command="sh c.sh")]}, {"content": "done"})
        r = cli.run("run", "--allow-dangerous", "--prompt", "x")
        listener.settimeout(5)
        listener.accept()[0].close()
    finally:
        listener.close()
    assert r.returncode == 0 and "CONNECTED-TCP" in tool_results(fake)[-1]
    assert "sandbox workspace-write, network on" in r.stderr


@needs_landlock
def test_commands_die_with_the_agent_even_when_it_is_killed(cli, fake):
    import signal
    token = "63%d.%d" % (os.getpid() % 1000, int(time.time()) % 1000)
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("terminal", command="sleep %s" % token, timeout_seconds=200)]},
             {"content": "never"})
    proc = cli.popen("run", "--allow-dangerous", "--prompt", "x")
    try:
        assert wait_for(lambda: running_with(token), 30)
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up code runs in the agent
        proc.wait(10)
        assert wait_for(lambda: not running_with(token), 10), running_with(token)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@needs_landlock
def test_without_user_namespaces_the_warning_names_what_is_lost(tmp_path):
    sandbox = Sandbox(str(tmp_path), assume_missing=("userns",))
    try:
        missing = sandbox.not_enforced()
        report = sandbox.report()
        if not report.get("netns"):  # unprivileged: no namespaces at all
            assert "UDP/DNS isolation (no network namespace; Landlock stops TCP only)" in missing
            assert any(m.startswith("killing setsid/double-forked descendants") for m in missing)
        else:  # root makes its namespaces without a user namespace, and says so
            assert any("no user namespace" in e for e in report["errors"])
        assert "Landlock filesystem rules" not in missing
    finally:
        sandbox.close()


@needs_landlock
def test_no_unix_socket_on_the_system_is_reachable_from_a_command(cli, fake):
    """Landlock does not mediate connect(): a socket reached by its name (the session bus, whose systemd
    starts a process outside the sandbox that outlives the run; docker.sock; an agent's socket) would be."""
    import socket
    import threading
    configure(cli, fake)
    run_dir = cli.tmp / "run-user"
    run_dir.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(run_dir / "bus"))
    listener.listen(4)
    accepted, stop = [], threading.Event()
    listener.settimeout(0.05)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            accepted.append(True)
            conn.sendall(b"OUTSIDE-REACHED\n")
            conn.close()
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    probe = script(cli, "probe.py", "import socket\n"
                                    "a, b = socket.socketpair()\na.send(b'pair-ok')\nprint(b.recv(16).decode())\n"
                                    "for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):\n"
                                    "    try:\n"
                                    "        s = socket.socket(socket.AF_UNIX, kind)\n"
                                    "        s.connect(%r)\n"
                                    "        print(s.recv(64).decode())\n"
                                    "    except OSError as exc:\n"
                                    "        print('refused', exc.errno)\n"
                                    "try:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
                                    "except OSError as exc:\n    print('vsock refused', exc.errno)\n" % str(run_dir / "bus"))
    try:
        r, [out] = run_commands(cli, fake, "python3 " + probe.split()[1])
    finally:
        stop.set()
        server.join(5)
        listener.close()
    assert "pair-ok" in out and out.count("refused 13") == 4 and "vsock refused 13" in out, out
    assert "OUTSIDE-REACHED" not in out and not accepted
    policy = cli.run("policy", "sandbox")
    assert "unix sockets: none reachable by name (seccomp" in policy.stdout, policy.stdout
