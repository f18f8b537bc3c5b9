"""Turn recordings of real servers (bench/tasks.py --record DIR) into a replayed fixture for the suite.

    python bench/fixture.py /work/rec/r4 tests/replies/llama_cpp_gguf_template.json \
        --server "llama-cpp-python 0.3.36, the GGUF's own chat template, Qwen2.5-Coder-1.5B-Instruct Q4_K_M" \
        --only create_file,bump_version

Each task's model replies (status, content type and the body byte for byte) are kept in order, with the
working directory they were recorded in, so tests/test_replies.py can serve them again from the fake server
and check what xzatoma does with them. Probes (/models, /props …) are kept too: they shape the tool profile.
"""

import argparse
import json
import os
import re


def load(path):
    exchanges = [json.loads(line) for line in open(path, encoding="utf-8")]
    workdir = None
    for ex in exchanges:
        for msg in (ex.get("request") or {}).get("messages") or ():
            found = re.search(r"<cwd>(.*?)</cwd>", msg.get("content") or "")
            if found:
                workdir = found.group(1)
                break
        if workdir:
            break
    return workdir, [{"method": ex["method"], "path": ex["path"], "status": ex["status"],
                      "content_type": ex["content_type"], "body": ex["response"]} for ex in exchanges]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("record_dir")
    p.add_argument("output")
    p.add_argument("--server", required=True, help="what served the replies (name, version, template, model)")
    p.add_argument("--only", help="comma-separated task names (default: every recording)")
    args = p.parse_args()
    runs = {}
    for name in sorted(os.listdir(args.record_dir)):
        task = name[:-len(".jsonl")]
        if not name.endswith(".jsonl") or (args.only and task not in args.only.split(",")):
            continue
        workdir, exchanges = load(os.path.join(args.record_dir, name))
        runs[task] = {"workdir": workdir, "exchanges": exchanges}
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump({"server": args.server, "runs": runs}, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print("%s: %d runs, %d exchanges" % (args.output, len(runs), sum(len(r["exchanges"]) for r in runs.values())))


if __name__ == "__main__":
    main()
