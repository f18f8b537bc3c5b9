#!/usr/bin/env python3
"""Benchmark: the terminal tool's overhead and its memory under an output flood.

1. `true` run 200 times through the terminal tool (policy check, own process
   group, streaming capture, audit line) against subprocess.run(["true"]) 200
   times, interleaved in the same run: target ratio < 1.5.
2. Peak RSS of a process whose terminal tool runs `yes` for 10 s under the
   default caps (10 MB stdout, 1 MB stderr): target < 60 MB.

Usage: python bench/terminal.py [--runs 200] [--flood-seconds 10]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xzatoma_tools import FULL, AuditLog, ToolContext, build_registry  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--flood-seconds", type=int, default=10)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="xzterm-")
    ctx = ToolContext(work, {}, terminal={"timeout_seconds": 30, "max_stdout_bytes": 10485760,
                                          "max_stderr_bytes": 1048576},
                      terminal_mode=FULL, audit=AuditLog(os.path.join(work, "audit.log")))
    reg = build_registry("write", ctx)

    ours = theirs = 0.0
    for _ in range(args.runs):
        t = time.perf_counter()
        r = reg.execute("terminal", {"command": "true"})
        ours += time.perf_counter() - t
        assert r.success
        t = time.perf_counter()
        subprocess.run(["true"])
        theirs += time.perf_counter() - t
    print("== `true` x %d ==" % args.runs)
    print("subprocess.run(['true'])   %6.2f ms each" % (theirs / args.runs * 1e3))
    print("terminal tool              %6.2f ms each   ratio %.2f   (target < 1.5)"
          % (ours / args.runs * 1e3, ours / theirs))

    code = ("import resource, sys; sys.path.insert(0, %r)\n"
            "from xzatoma_tools import FULL, ToolContext, build_registry\n"
            "ctx = ToolContext(%r, {}, terminal={'max_stdout_bytes': 10485760, 'max_stderr_bytes': 1048576},\n"
            "                  terminal_mode=FULL)\n"
            "r = build_registry('write', ctx).execute('terminal', {'command': 'yes', 'timeout_seconds': %d})\n"
            "assert 'timed out' in r.error\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n" % (ROOT, work, args.flood_seconds))
    t = time.perf_counter()
    peak = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    print("== `yes` flood for %ds under the default caps ==" % args.flood_seconds)
    print("peak RSS %.1f MB   (target < 60 MB; wall %.1fs)" % (peak / 1024, time.perf_counter() - t))


if __name__ == "__main__":
    main()
