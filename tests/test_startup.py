"""Start-up is a feature: what a run, `--help` and `history` import, the plain file's start, the collector held back
only until the work starts, and no sandbox helper before a command runs. The CLI as a subprocess (import times from
PYTHONPROFILEIMPORTTIME); bench/startup.py measures the times themselves."""

import json
import re

from conftest import tool_call


def sandbox_helpers(pid):
    """The sandbox helper processes `pid` started (xzatoma_tools._sandbox_helper), still running."""
    from conftest import processes
    return [p for p, ppid, _, state, cmdline in processes() if ppid == pid and state != "Z"
            and b"_sandbox_helper" in cmdline]


def test_a_run_that_runs_no_command_waits_for_no_sandbox(cli, fake):
    """The helper (a third of a one-shot run's time) starts when a command is about to run: while the model
    is asked, a run that has run none has no helper; one that has, has it."""
    cli.use(fake)
    seen = {}

    def look(name):
        def at_request(body):
            seen[name] = sandbox_helpers(proc.pid)
        return at_request
    fake.add({"content": "hello", "expect": look("no command yet")})
    proc = cli.popen("run", "say hello")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "hello\n", err
    fake.add({"tool_calls": [tool_call("terminal", command="ls")], "expect": look("before the command")},
             {"content": "listed", "expect": look("after the command")})
    proc = cli.popen("run", "list the files")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "listed\n", err
    assert seen["no command yet"] == [] and seen["before the command"] == []
    assert len(seen["after the command"]) == 1  # the same look finds a helper when there is one


def imported(stderr):
    """The modules a run imported, from PYTHONPROFILEIMPORTTIME's report."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_run_imports_keyring_only_where_it_holds_something(cli, fake):
    cli.use(fake, provider="openai").use_test_keyring()
    fake.add({"content": "one"}, {"content": "two"}, {"content": "three"}, {"content": "four"})
    first = cli.run("run", "x")  # no index yet: the keyring is asked once, and what it holds written down
    assert first.returncode == 0, first.stderr
    assert json.loads((cli.xz_home / "keyring-names.json").read_text()) == []
    second = cli.run("run", "x", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert second.returncode == 0 and "keyring" not in imported(second.stderr)
    assert "authorization" not in fake.model_requests()[-1]["headers"]
    # a key stored by `auth login` is listed, so runs look for it
    assert cli.run("auth", "login", "--provider", "openai", input="sk-in-the-keyring-0123456789\n").returncode == 0
    assert json.loads((cli.xz_home / "keyring-names.json").read_text()) == ["openai_api_key"]
    third = cli.run("run", "x")
    assert third.returncode == 0
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer sk-in-the-keyring-0123456789"
    # one put there by another tool is found once `auth status` has looked in the keyring itself
    cli.run("auth", "logout", "--provider", "openai")
    cli.keyring_file.write_text(json.dumps({"xzatoma/openai_api_key": "sk-set-elsewhere-0123456789"}))
    assert cli.run("auth", "status").returncode == 0
    assert cli.run("run", "x").returncode == 0
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer sk-set-elsewhere-0123456789"


def test_help_and_history_import_only_what_they_show(cli, fake):
    for args in (["--help"], ["run", "--help"], ["chat", "--help"]):
        r = cli.run(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert r.returncode == 0 and "usage:" in r.stdout
        loaded = imported(r.stderr)
        assert not loaded & {"xzatoma_tools", "xzatoma_skills", "xzatoma_plans", "xzatoma_store", "json",
                             "sqlite3", "difflib", "http.client"}, args
    fake.add({"content": "stored"})
    assert cli.run("run", "--provider", "ollama", "x", env={"OLLAMA_HOST": fake.url}).returncode == 0
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    for args in (["history", "list"], ["history", "show", cid], ["replay", cid]):
        r = cli.run(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert r.returncode == 0 and cid[:12] in r.stdout, r.stderr[-300:]
        loaded = imported(r.stderr)
        assert "sqlite3" in loaded and not loaded & {"xzatoma_tools", "xzatoma_skills", "xzatoma_plans",
                                                     "http.client", "ssl", "keyring", "yaml"}, args


def test_the_plain_file_start_compiles_nothing_it_can_cache(cli, tmp_path):
    """python3 xzatoma.py: the script Python is given is compiled at every start; it is a launcher of a few
    lines, and the program comes from cached bytecode from the second start on."""
    import os
    import shutil
    import subprocess
    import sys
    from conftest import ROOT
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in os.listdir(ROOT):
        if name.startswith("xzatoma") and name.endswith(".py"):
            shutil.copy(os.path.join(ROOT, name), str(plain / name))
    assert len((plain / "xzatoma.py").read_text().splitlines()) < 30
    env = {k: v for k, v in cli.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    first = subprocess.run([sys.executable, str(plain / "xzatoma.py"), "--version"], capture_output=True, text=True,
                           env=env, cwd=str(cli.workdir))
    second = subprocess.run([sys.executable, "-v", str(plain / "xzatoma.py"), "--version"], capture_output=True,
                            text=True, env=env, cwd=str(cli.workdir))
    assert first.stdout == second.stdout and first.stdout.startswith("xzatoma ")
    assert re.search(r"code object from '[^']*__pycache__/xzatoma_core\.[^']*\.pyc'", second.stderr)


def test_start_up_holds_the_collector_back_only_until_the_work_starts(cli, fake):
    """Start-up's long-lived objects are not scanned over and over (bench/startup.py measures what that
    saves); the collector's own threshold is back once the work starts, and after a command that never
    got to work (in-process callers)."""
    import gc
    import xzatoma
    before = gc.get_threshold()
    xzatoma._startup_begins()
    try:
        assert gc.get_threshold()[0] == max(before[0], xzatoma.STARTUP_GC_THRESHOLD)
    finally:
        frozen = gc.get_freeze_count()
        xzatoma.startup_over()
    assert gc.get_threshold() == before and gc.get_freeze_count() >= frozen
    gc.unfreeze()
    assert xzatoma.main(["config", "path", "--config", str(cli.tmp / "c.yaml")]) == 0  # prints a path
    assert gc.get_threshold() == before
    # a run: the threshold is the interpreter's again from the agent loop on (its first model call)
    import os
    cli.use(fake)
    script = cli.tmp / "threshold.py"
    script.write_text("import gc, sys\nsys.path.insert(0, %r)\nimport xzatoma_core\n"
                      "seen = []\nstep = xzatoma_core.Agent.step\n"
                      "def spy(self, *a, **k):\n    seen.append(gc.get_threshold())\n    return step(self, *a, **k)\n"
                      "xzatoma_core.Agent.step = spy\ncode = xzatoma_core.main(['run', 'hi'])\n"
                      "sys.stderr.write('THRESHOLDS %%r %%r\\n' %% (seen, gc.get_threshold()))\nsys.exit(code)\n"
                      % os.path.dirname(xzatoma.__file__))
    fake.add({"content": "hello"})
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cli.env,
                       cwd=str(cli.workdir), timeout=60)
    assert r.returncode == 0 and r.stdout == "hello\n", r.stderr
    seen = re.search(r"THRESHOLDS (.*)", r.stderr).group(1)
    assert seen == "[%r] %r" % (before, before), seen
