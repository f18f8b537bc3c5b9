#!/usr/bin/env python3
"""Benchmark: the search tools against GNU grep and find, and read_file's memory on a 1 GB file.

Generates a tree of 20,000 text files (~200 MB) plus binaries, then times, in
the same run and with a warm page cache:
  grep tool (literal)  vs  grep -rn LITERAL      target ratio < 2
  grep tool (regex)    vs  grep -rnE REGEX       (reported; matched in a worker process, see Grep)
  find_path '**/*.py'  vs  find -name '*.py'     target ratio < 2
and the peak RSS of a process that runs read_file on a 1 GB file (target < 50 MB).

Usage: python bench/tools.py [--files 20000] [--file-kb 10] [--keep DIR]
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xzatoma_tools import ToolContext, build_registry  # noqa: E402

WORDS = ("alpha beta gamma delta epsilon zeta theta lambda kappa sigma omega function return value "
         "import class object string number list dict error result config").split()


def make_tree(root, files, kb):
    rng = random.Random(42)
    line_pool = [" ".join(rng.choice(WORDS) for _ in range(10)) + "\n" for _ in range(5000)]
    exts = (".py", ".txt", ".md", ".rs", ".json")
    for i in range(files):
        d = os.path.join(root, "pkg%02d" % (i % 50), "mod%02d" % (i % 17))
        os.makedirs(d, exist_ok=True)
        lines = []
        size = 0
        while size < kb * 1024:
            line = rng.choice(line_pool)
            lines.append(line)
            size += len(line)
        if i % 997 == 0:
            lines[len(lines) // 2] = "    raise NeedleError('xyzzy_marker found here')\n"
        with open(os.path.join(d, "file%05d%s" % (i, exts[i % len(exts)])), "w") as fh:
            fh.write("".join(lines))
    for i in range(200):
        with open(os.path.join(root, "pkg%02d" % (i % 50), "blob%03d.bin" % i), "wb") as fh:
            fh.write(os.urandom(64 * 1024) + b"xyzzy_marker")


def best(fn, runs=3):
    values = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        values.append(time.perf_counter() - t)
    return min(values), statistics.median(values)


def rss_of_read_file(path):
    code = ("import resource, sys; sys.path.insert(0, %r)\n"
            "from xzatoma_tools import ToolContext, build_registry\n"
            "reg = build_registry('write', ToolContext(%r, {}))\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "r = reg.execute('read_file', {'path': %r})\n"
            "assert r.success, r.error\n"
            "r2 = reg.execute('read_file', {'path': %r, 'start_line': 9000000, 'end_line': 9000010})\n"
            "print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, r.metadata['lines'])\n"
            % (ROOT, os.path.dirname(path), os.path.basename(path), os.path.basename(path)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]) / 1024, int(out[1]) / 1024, int(out[2])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=20000)
    p.add_argument("--file-kb", type=int, default=10)
    p.add_argument("--big-gb", type=float, default=1.0)
    p.add_argument("--keep", metavar="DIR", help="reuse or keep the generated tree here")
    args = p.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="xztools-")
    tree = os.path.join(root, "tree")
    if not os.path.isdir(tree):
        t = time.perf_counter()
        make_tree(tree, args.files, args.file_kb)
        print("generated %d files in %.1fs" % (args.files, time.perf_counter() - t))
    size = sum(os.path.getsize(os.path.join(b, f)) for b, _, fs in os.walk(tree) for f in fs)
    print("== tree: %d text files + 200 binaries, %.0f MB ==" % (args.files, size / 1e6))
    reg = build_registry("write", ToolContext(tree, {"max_output_size": 10 ** 7}))

    def tool_grep(pattern, fixed):
        r = reg.execute("grep", {"pattern": pattern, "fixed_string": fixed, "max_results": 100000})
        assert r.success, r.error
        return r.metadata["matches"]

    def gnu(argv):
        subprocess.run(argv, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # warm the page cache once for everyone
    gnu(["grep", "-rnI", "xyzzy_marker", "."])
    cases = [
        ("grep literal 'xyzzy_marker'", lambda: tool_grep("xyzzy_marker", True),
         lambda: gnu(["grep", "-rnI", "-F", "xyzzy_marker", "."]), 2.0),
        ("grep regex 'Needle\\w+\\('", lambda: tool_grep(r"Needle\w+\(", False),
         lambda: gnu(["grep", "-rnIE", r"Needle\w+\(", "."]), None),
        ("grep regex '(Needle|Nope)Err'", lambda: tool_grep(r"(Needle|Nope)Err", False),  # no literal to prefilter on:
         lambda: gnu(["grep", "-rnIE", r"(Needle|Nope)Err", "."]), None),  # every file goes to the regex worker
        ("find_path '**/*.py'", lambda: reg.execute("find_path", {"glob": "**/*.py", "limit": 1}),
         lambda: gnu(["find", ".", "-name", "*.py"]), 2.0),
    ]
    print("matches: tool %d literal, %d regex" % (tool_grep("xyzzy_marker", True), tool_grep(r"Needle\w+\(", False)))
    for name, ours, theirs, target in cases:
        o_best, o_med = best(ours)
        t_best, t_med = best(theirs)
        print("%-30s ours %7.1f ms   GNU %7.1f ms   ratio %.2f%s" % (
            name, o_med * 1e3, t_med * 1e3, o_med / t_med, "   (target < %.0f)" % target if target else ""))

    big = os.path.join(root, "big.txt")
    if not os.path.exists(big) or os.path.getsize(big) < args.big_gb * 1e9 * 0.99:
        line = ("0123456789" * 11 + "\n").encode()
        with open(big, "wb") as fh:
            block = line * (8 * 1024 * 1024 // len(line))
            written = 0
            while written < args.big_gb * 1e9:
                fh.write(block)
                written += len(block)
    base, peak, lines = rss_of_read_file(big)
    print("read_file on a %.1f GB file (%d lines): peak RSS %.1f MB (interpreter alone %.1f MB)   (target < 50 MB)"
          % (os.path.getsize(big) / 1e9, lines, peak, base))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
