#!/usr/bin/env python3
"""Benchmark: what MCP support costs a run, interleaved medians against a baseline.

1. `xzatoma run "hi"` with no MCP server configured, this tree against a baseline tree (default: the `main`
   branch, exported with `git archive` into a temporary directory): target ratio <= 1.02 (nothing
   measurable: one lstat for .mcp.json, and xzatoma_mcp never imported).
2. The same run with one stdio server (tests/fake_mcp.py) in its sandbox, and unconfined, against no server:
   what a server's start, handshake and stop add (informational: mostly the server's own interpreter start).
3. Importing xzatoma_mcp by itself (informational).

The model is tests/fake_model.py in another process, answering at once.
Usage: python bench/mcp.py [--runs 10] [--baseline REF]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_model():
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "fake_model.py"), "--loop-tool", "read_file",
                             "--turns", "1"],  # answers at once
                            stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, "http://127.0.0.1:%d" % port


def export(ref, work):
    """The tree at `ref`, as files (the baseline's code, without touching any checkout)."""
    out = os.path.join(work, "baseline")
    os.makedirs(out)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def config(work, name, url, servers=None):
    import yaml
    home = os.path.join(work, name)
    for d in ("home", "xz", "cfg/xzatoma", "work"):
        os.makedirs(os.path.join(home, d), exist_ok=True)
    cfg = {"provider": {"type": "ollama", "ollama": {"host": url, "model": "llama3.2:3b"}},
           "agent": {"tools": {"profile": "full"}}}
    if servers:
        cfg["mcp"] = {"servers": servers}
    with open(os.path.join(home, "cfg", "xzatoma", "config.yaml"), "w") as fh:
        yaml.safe_dump(cfg, fh)
    env = dict(os.environ, HOME=home + "/home", XZATOMA_HOME=home + "/xz", XDG_CONFIG_HOME=home + "/cfg",
               NO_COLOR="1", PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring",
               PYTHONPYCACHEPREFIX=os.path.join(work, "pyc"))  # bytecode, as an installed copy has it
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env, home + "/work"


def measure(cases, runs):
    """Interleaved: each round runs every case once, so the machine's load falls on all alike."""
    times = {name: [] for name in cases}
    for argv, env, cwd in cases.values():  # warm: bytecode written, caches filled
        subprocess.run(argv, env=env, cwd=cwd, capture_output=True)
    for _ in range(runs):
        for name, (argv, env, cwd) in cases.items():
            started = time.monotonic()
            r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
            times[name].append(time.monotonic() - started)
            if r.returncode != 0:
                raise SystemExit("%s failed: %s" % (name, r.stderr[-500:]))
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--baseline", default="main", help="git ref of the baseline tree (default main)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="xz-bench-mcp-")
    model, url = start_model()
    try:
        baseline = export(args.baseline, work)
        fake = os.path.join(ROOT, "tests", "fake_mcp.py")
        server = {"command": sys.executable, "args": [fake], "read_paths": [os.path.dirname(fake)]}
        plain_env, plain_cwd = config(work, "plain", url)
        mcp_env, mcp_cwd = config(work, "mcp", url, {"fake": server})
        off_env, off_cwd = config(work, "off", url, {"fake": dict(server, sandbox="off")})
        run = ["run", "hi"]
        cases = {
            "baseline (%s), no MCP" % args.baseline: ([sys.executable, os.path.join(baseline, "xzatoma.py")] + run,
                                                      plain_env, plain_cwd),
            "this tree, no MCP": ([sys.executable, os.path.join(ROOT, "xzatoma.py")] + run, plain_env, plain_cwd),
            "this tree, one sandboxed stdio server": ([sys.executable, os.path.join(ROOT, "xzatoma.py")] + run,
                                                      mcp_env, mcp_cwd),
            "this tree, one unconfined stdio server": ([sys.executable, os.path.join(ROOT, "xzatoma.py")] + run,
                                                       off_env, off_cwd),
        }
        medians = measure(cases, args.runs)
        names = list(cases)
        base, plain = medians[names[0]], medians[names[1]]
        print("%-44s %8.0f ms" % (names[0], base * 1e3))
        print("%-44s %8.0f ms   %5.3fx of the baseline (target <= 1.02x)%s" % (
            names[1], plain * 1e3, plain / base, "" if plain / base <= 1.02 else "  OVER"))
        for name in names[2:]:
            print("%-44s %8.0f ms   %+6.0f ms over no MCP" % (name, medians[name] * 1e3, (medians[name] - plain) * 1e3))
        imports = []
        env = plain_env
        for i in range(args.runs + 1):
            started = time.monotonic()
            subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import xzatoma_tools" % ROOT],
                           check=True, env=env)
            middle = time.monotonic()
            subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import xzatoma_mcp" % ROOT],
                           check=True, env=env)
            if i:  # the first wrote the bytecode
                imports.append((time.monotonic() - middle) - (middle - started))
        print("%-44s %+8.1f ms over importing xzatoma_tools" % ("import xzatoma_mcp", statistics.median(imports) * 1e3))
    finally:
        model.kill()
        model.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
