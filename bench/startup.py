#!/usr/bin/env python3
"""Benchmark: start-up of each way XZatoma is run, against the floor it stands on, on the same interpreter.

For each interpreter (default: every Python 3.9+ found, as scripts/build_pyz.py finds them), medians
of interleaved runs of:
  python3 -I -c pass                     the baseline of the commands that print and exit
  xzatoma --version / --help / run --help   installed with pip into a throwaway virtualenv
  python3 xzatoma.py --version           a plain copy of the modules
  python3 -I xzatoma.pyz --version       the one-file build
  bare HTTP POST                         python3 -I: http.client POSTs one chat request to a local model
                                         server (tests/fake_model.py, in its own process) and reads the
                                         reply: the baseline of a one-shot run
  xzatoma run hi / python3 xzatoma.py run hi   the whole one-shot run against that server (Ollama's
                                         wire format, no configuration file, a fresh XZATOMA_HOME)
Targets: installed <= 2x, .pyz <= 3x (stretch 2x), the plain file's --version <= 3x a bare interpreter;
`run hi` <= 2.5x the bare POST (issue 24). A reference row shows what importing argparse (and shutil,
for the help formatter's width) costs by itself: the floor under `--help`. Bytecode is cached as on a
person's machine (PYTHONDONTWRITEBYTECODE is left out of the commands' environment).

Usage: python bench/startup.py [--runs 30] [--python PATH ...] [--pyz dist/xzatoma.pyz]
The .pyz is built (into a temporary directory) when --pyz is not given and dist/xzatoma.pyz is missing.
"""

import argparse
import glob
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("build_pyz", os.path.join(ROOT, "scripts", "build_pyz.py"))
build_pyz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_pyz)

BASELINE = "python3 -I -c pass"
POST = "bare HTTP POST (python3 -I, http.client)"
#: row -> (target ratio, the row it is a ratio of); the installed command's other rows: 2x a bare interpreter
TARGETS = {"xzatoma run hi": (2.5, POST), "python3 xzatoma.py run hi": (2.5, POST),
           "python3 xzatoma.py --version": (3.0, BASELINE), "python3 -I xzatoma.pyz --version": (3.0, BASELINE)}

#: a bare client's request: what a one-shot run does at the least (POST, read the streamed reply)
BARE_POST = """import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
c.request("POST", "/api/chat", json.dumps({"model": "llama3.2:3b", "stream": True,
          "messages": [{"role": "user", "content": "hi"}]}), {"Content-Type": "application/json"})
r = c.getresponse()
sys.stdout.write(json.loads(r.read().splitlines()[-1])["done_reason"])
"""


def install(python, work):
    """`xzatoma` installed by pip (without its dependencies: none of these commands imports them), from a copy
    of the project: pip builds in the source tree, and its build/ and *.egg-info stay in the throwaway one."""
    venv, source = os.path.join(work, "venv"), os.path.join(work, "source")
    os.mkdir(source)
    for path in [os.path.join(ROOT, "pyproject.toml"), os.path.join(ROOT, "README.md")] + \
            glob.glob(os.path.join(ROOT, "xzatoma*.py")):
        shutil.copy(path, source)
    subprocess.run([python, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", source], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(venv, "bin", "xzatoma")


def commands(python, pyz, work, port):
    plain = os.path.join(work, "plain")
    os.mkdir(plain)
    for module in glob.glob(os.path.join(ROOT, "xzatoma*.py")):
        shutil.copy(module, plain)
    installed = install(python, work)
    script = os.path.join(plain, "xzatoma.py")
    return {BASELINE: [python, "-I", "-c", "pass"],
            # what --help cannot avoid: argparse, and shutil for the terminal width its formatter asks
            "(python3 -I -c 'import argparse, shutil')": [python, "-I", "-c", "import argparse, shutil"],
            "xzatoma --version": [installed, "--version"],
            "xzatoma --help": [installed, "--help"],
            "xzatoma run --help": [installed, "run", "--help"],
            "python3 xzatoma.py --version": [python, script, "--version"],
            "python3 -I xzatoma.pyz --version": [python, "-I", pyz, "--version"],
            POST: [python, "-I", "-c", BARE_POST, str(port)],
            "xzatoma run hi": [installed, "run", "hi"],
            "python3 xzatoma.py run hi": [python, script, "run", "hi"]}


def run_env(work, port):
    """A person's environment for the runs: their own (bytecode cached), a fresh home, the local server."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith(
        ("XZATOMA_", "OPENAI_", "OLLAMA_", "COPILOT_", "GITHUB_TOKEN"))}
    home = os.path.join(work, "home")
    os.mkdir(home)
    env.update(HOME=home, XZATOMA_HOME=os.path.join(home, ".xzatoma"), XDG_CONFIG_HOME=os.path.join(home, ".config"),
               XZATOMA_PROVIDER="ollama", OLLAMA_HOST="http://127.0.0.1:%d" % port)
    return env


def measure(cmds, runs, cwd, env):
    for name, cmd in cmds.items():  # warm the page cache and the bytecode (and check that each command works)
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
        if out.returncode != 0 or (" hi" in name and out.stdout != b"done\n"):
            raise SystemExit("%s failed (%d): %s" % (name, out.returncode, out.stderr.decode()[-500:]))
    times = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def target(name):
    if name in TARGETS:
        return TARGETS[name]
    return (2.0, BASELINE) if name.startswith("xzatoma ") else (None, None)


def model_server():
    """tests/fake_model.py in a process of its own, answering every chat request 'done'."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "fake_model.py"), "--loop-tool",
                             "list_directory", "--turns", "1"], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--python", action="append", default=[], metavar="PATH")
    p.add_argument("--pyz", help="the archive to measure (default: dist/xzatoma.pyz, built when missing)")
    args = p.parse_args()
    if args.python:
        interpreters = {}
        for exe in args.python:
            tag = build_pyz.probe(shutil.which(exe) or exe)
            if not tag:
                p.error("%s does not run" % exe)
            interpreters[tag[0]] = tag[2]
    else:
        interpreters = build_pyz.find_interpreters()
    server, port = model_server()
    try:
        report(args, interpreters, port)
    finally:
        server.terminate()
        server.wait()


def report(args, interpreters, port):
    with tempfile.TemporaryDirectory(prefix="xzbench-startup-") as work:
        pyz = args.pyz or os.path.join(ROOT, "dist", "xzatoma.pyz")
        if not args.pyz and not os.path.exists(pyz):
            pyz = os.path.join(work, "xzatoma.pyz")
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "build_pyz.py"), "-o", pyz], check=True)
        print("%s (%.1f MB), median of %d interleaved runs" % (pyz, os.path.getsize(pyz) / 1e6, args.runs))
        empty = os.path.join(work, "empty")
        os.mkdir(empty)
        worst = {}
        for tag in sorted(interpreters, key=lambda t: int(t.rpartition("-")[2])):
            scratch = tempfile.mkdtemp(dir=work)
            results = measure(commands(interpreters[tag], pyz, scratch, port), args.runs, empty,
                              run_env(scratch, port))
            print("== %s (%s) ==" % (tag, interpreters[tag]))
            for name, value in results.items():
                limit, of = target(name)
                ratio = value / results[of or BASELINE]
                if limit:
                    worst[(limit, of)] = max(worst.get((limit, of), 0), ratio)
                print("%-44s %6.1f ms   %5.2fx %s%s" % (
                    name, value * 1e3, ratio, "post" if of == POST else "pass",
                    "   (target <= %gx)%s" % (limit, "" if ratio <= limit else "  OVER") if limit else ""))
        print("== worst ratio per target: %s" % ", ".join(
            "%.2fx of %gx %s" % (worst[k], k[0], "the bare POST" if k[1] == POST else "a bare interpreter")
            for k in sorted(worst)))


if __name__ == "__main__":
    main()
