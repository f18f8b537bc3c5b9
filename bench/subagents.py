#!/usr/bin/env python3
"""Benchmark: 8 subagent tasks, sequential `subagent` calls against one `parallel_subagent` call.

The fake model (another process) takes 0.5 s per answer and each task needs 2
answers (its work, then its summary), so one task costs about 1 s. Both ways
run in the same session; the speed-up target is above 5.

Usage: python bench/subagents.py [--tasks 8] [--delay 0.5]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import xzatoma  # noqa: E402

SERVER = r'''
import json, sys, time
sys.path.insert(0, %(tests)r)
from fake_model import FakeModel, _Discard
delay = float(sys.argv[1])
fake = FakeModel()
fake.requests = _Discard()
def brain(body):
    msgs = body["messages"]
    if "You are a subagent" in msgs[0]["content"]:
        if msgs[-1]["content"].startswith("Summarise"):
            return {"content": "summary of " + msgs[1]["content"], "delay": delay}
        return {"content": "answer to " + msgs[1]["content"], "delay": delay}
    return {"content": "unused"}
fake.generator = brain
fake.start()
print(fake.port, flush=True)
time.sleep(3600)
'''


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--delay", type=float, default=0.5)
    args = p.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER % {"tests": os.path.join(ROOT, "tests")},
                               str(args.delay)], stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    try:
        work = tempfile.mkdtemp(prefix="xzsub-")
        env = {"HOME": work, "XDG_CONFIG_HOME": work, "XZATOMA_HOME": work}
        cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": "127.0.0.1:%d" % port,
                                   "agent.persistence.enabled": False}, env=env)
        console = xzatoma.Console(quiet=True)
        session = xzatoma.Session.open(cfg, console, "planning", work, "restricted_autonomous")
        session.start("run")
        registry = session.registry
        tasks = [{"label": "t%d" % i, "task_prompt": "task %d" % i} for i in range(args.tasks)]

        t = time.perf_counter()
        for task in tasks:
            assert registry.execute("subagent", task).success
        sequential = time.perf_counter() - t

        t = time.perf_counter()
        r = registry.execute("parallel_subagent", {"tasks": tasks, "max_concurrent": args.tasks})
        parallel = time.perf_counter() - t
        assert r.success and r.metadata["succeeded"] == args.tasks, r.to_message()[:500]
    finally:
        server.terminate()
        server.wait()
    print("== %d subagent tasks, %.1f s per model answer, 2 answers per task ==" % (args.tasks, args.delay))
    print("sequential subagent calls   %6.2f s" % sequential)
    print("one parallel_subagent call  %6.2f s" % parallel)
    print("speed-up                    %6.2f x   (target > 5)" % (sequential / parallel))


if __name__ == "__main__":
    main()
