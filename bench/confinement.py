#!/usr/bin/env python3
"""Benchmark: what a session's Confinement costs before any tool runs.

`xzatoma run "say hi"` against a fake model (the same wire format as Ollama, on 127.0.0.1) that answers
without calling a tool, in a fresh HOME and working directory: the number of os.path.realpath calls the
whole run makes (issue 23: 419 when the protected set was built twice per session; target <= 150), where
they come from, and the run's wall time. With --baseline DIR (another checkout, e.g. a worktree of main) the
same run there, side by side, as a ratio.

Usage: python bench/confinement.py [--baseline DIR] [--runs 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

COUNTER = r"""
import collections, os, posixpath, runpy, sys
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
calls, real = collections.Counter(), os.path.realpath
def counted(*a, **k):
    f = sys._getframe(1)
    calls["%s (%s)" % (f.f_code.co_name, os.path.basename(f.f_code.co_filename))] += 1
    return real(*a, **k)
os.path.realpath = posixpath.realpath = counted
sys.argv = [script, "run", "--working-dir", sys.argv[2], "say hi"]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
finally:
    sys.stderr.write("\nREALPATH " + repr(sum(calls.values())) + " " + repr(calls.most_common(6)) + "\n")
"""


def one_run(checkout, url):
    tmp = tempfile.mkdtemp(prefix="xzbench-")
    for d in ("home", "xz", "cfg/xzatoma", "work"):
        os.makedirs(os.path.join(tmp, d))
    with open(os.path.join(tmp, "cfg", "xzatoma", "config.yaml"), "w") as fh:
        fh.write(json.dumps({"provider": {"type": "ollama", "ollama": {"host": url, "model": "llama3.2:3b"}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XZATOMA_", "OPENAI_", "OLLAMA_"))}
    env.update(HOME=tmp + "/home", XZATOMA_HOME=tmp + "/xz", XDG_CONFIG_HOME=tmp + "/cfg", NO_COLOR="1")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", COUNTER, os.path.join(checkout, "xzatoma.py"), tmp + "/work"],
                          env=env, capture_output=True, text=True, cwd=tmp + "/work")
    wall = time.perf_counter() - started
    line = [x for x in done.stderr.splitlines() if x.startswith("REALPATH ")]
    if done.returncode or not line:
        sys.exit("the run failed:\n" + done.stderr[-2000:])
    count, where = line[-1].split(" ", 2)[1:]
    return int(count), where, wall


def main():
    from fake_model import FakeModel
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", help="another checkout to compare with")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    fake = FakeModel().start()
    fake.generator = lambda body: {"content": "hello"}
    rows = [("this checkout", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    results = {}
    for name, checkout in rows:
        runs = [one_run(checkout, fake.url) for _ in range(args.runs)]
        results[name] = (runs[0][0], runs[0][1], statistics.median(r[2] for r in runs))
    for name, (count, where, wall) in results.items():
        print("%-14s realpath calls %4d (target <= 150)  run %.3f s  top: %s" % (name, count, wall, where))
    if args.baseline:
        mine, base = results["this checkout"], results["baseline"]
        print("ratio          realpath %.2fx  run time %.2fx" % (mine[0] / base[0], mine[2] / base[2]))


if __name__ == "__main__":
    main()
