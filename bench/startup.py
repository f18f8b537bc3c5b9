#!/usr/bin/env python3
"""Benchmark: start-up of each way XZatoma is run, against `python3 -I -c pass` on the same interpreter.

For each interpreter (default: every Python 3.9+ found, as scripts/build_pyz.py finds them), medians
of interleaved runs of:
  python3 -I -c pass                     the baseline
  xzatoma --version / --help / run --help   installed with pip into a throwaway virtualenv
  python3 xzatoma.py --version           a plain copy of the modules
  python3 -I xzatoma.pyz --version       the one-file build
Targets: installed <= 2x, .pyz <= 3x (stretch 2x). A reference row shows what importing argparse (and
shutil, for the help formatter's width) costs by itself: the floor under `--help`.

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
TARGETS = {"xzatoma": 2.0, "python3 -I xzatoma.pyz": 3.0}


def install(python, work):
    """`xzatoma` installed by pip (without its dependencies: none of these commands imports them)."""
    venv = os.path.join(work, "venv")
    subprocess.run([python, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", ROOT], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(venv, "bin", "xzatoma")


def commands(python, pyz, work):
    plain = os.path.join(work, "plain")
    os.mkdir(plain)
    for module in glob.glob(os.path.join(ROOT, "xzatoma*.py")):
        shutil.copy(module, plain)
    installed = install(python, work)
    return {BASELINE: [python, "-I", "-c", "pass"],
            # what --help cannot avoid: argparse, and shutil for the terminal width its formatter asks
            "(python3 -I -c 'import argparse, shutil')": [python, "-I", "-c", "import argparse, shutil"],
            "xzatoma --version": [installed, "--version"],
            "xzatoma --help": [installed, "--help"],
            "xzatoma run --help": [installed, "run", "--help"],
            "python3 xzatoma.py --version": [python, os.path.join(plain, "xzatoma.py"), "--version"],
            "python3 -I xzatoma.pyz --version": [python, "-I", pyz, "--version"]}


def measure(cmds, runs, cwd):
    for cmd in cmds.values():  # warm the page cache (and check that each command works)
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, cwd=cwd)
    times = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=cwd)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def target(name):
    for prefix, limit in TARGETS.items():
        if name.startswith(prefix + " "):
            return limit
    return None


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
            results = measure(commands(interpreters[tag], pyz, scratch), args.runs, empty)
            base = results[BASELINE]
            print("== %s (%s) ==" % (tag, interpreters[tag]))
            for name, value in results.items():
                limit = target(name)
                ratio = value / base
                if limit:
                    worst[limit] = max(worst.get(limit, 0), ratio)
                print("%-44s %6.1f ms   %5.2fx%s" % (name, value * 1e3, ratio,
                                                     "   (target <= %gx)%s" % (limit, "" if ratio <= limit else "  OVER")
                                                     if limit else ""))
        print("== worst ratio per target: %s" % ", ".join("%.2fx of %gx" % (worst[k], k) for k in sorted(worst)))


if __name__ == "__main__":
    main()
