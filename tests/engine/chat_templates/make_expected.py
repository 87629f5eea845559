"""Writes expected.json: what llama.cpp's own chat pipeline renders and parses for cases.py.

    python -m tests.engine.chat_templates.make_expected LLAMA_CPP_CHECKOUT [--out FILE]

It compiles reference.cpp against the checkout's common/chat.cpp, minja and json-schema-to-grammar
(the engine `llama-server --jinja` runs; no model or libllama is needed: the llama.cpp functions those
files name are never called with a template given as text), then runs every case of cases.py through
it. The test compares Kafila's rendering and parsing with the file; this script is how the file is
made again for another llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.engine.chat_templates.cases import CASES, HERE, OUTPUTS, TEMPLATES, inputs_digest, template

LOG_H = """#pragma once
#include <cstdio>
#define LOG(...) do {} while (0)
#define LOG_INF(...) do {} while (0)
#define LOG_WRN(...) do {} while (0)
#define LOG_ERR(...) do {} while (0)
#define LOG_DBG(...) do {} while (0)
#define LOG_CNT(...) do {} while (0)
#define LOG_DEFAULT_DEBUG 1
#define LOG_DEFAULT_LLAMA 0
struct common_log;
extern int common_log_verbosity_thold;
struct common_log * common_log_main();
void common_log_add(struct common_log * log, int level, const char * fmt, ...);
"""
LOG_CPP = """#include "log.h"
int common_log_verbosity_thold = 0;
struct common_log * common_log_main() { return nullptr; }
void common_log_add(struct common_log *, int, const char *, ...) {}
"""
SOURCES = ("common/chat.cpp", "common/json-schema-to-grammar.cpp", "common/common.cpp")


def build(checkout: Path, work: Path) -> Path:
    """The reference renderer, compiled from the checkout's sources (the log replaced by a no-op)."""
    src = work / "src"
    shutil.copytree(checkout / "common", src / "common")
    for name in ("include", "ggml/include"):
        shutil.copytree(checkout / name, src / name)
    (src / "common" / "log.h").write_text(LOG_H)  # logging would need ggml's clock: a no-op instead
    (src / "common" / "logstub.cpp").write_text(LOG_CPP)
    shutil.copy(HERE / "reference.cpp", src / "reference.cpp")
    flags = ["-std=c++17", "-O1", "-w", f"-I{src / 'common'}", f"-I{src / 'include'}", f"-I{src / 'ggml/include'}",
             f"-I{src / 'common/minja'}"]
    units = [src / "reference.cpp", src / "common" / "logstub.cpp", *(src / s for s in SOURCES)]
    exe = work / "reference"
    subprocess.run(["g++", *flags, "-no-pie", "-o", str(exe), *map(str, units),
                    "-Wl,--unresolved-symbols=ignore-all", "-lpthread"], check=True)
    return exe


def run(exe: Path, case: dict) -> dict:
    done = subprocess.run([str(exe)], input=json.dumps(case), capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkout", type=Path)
    p.add_argument("--out", type=Path, default=HERE / "expected.json")
    p.add_argument("--commit", default="", help="the checkout's commit, when it is not a git work tree")
    p.add_argument("--keep", type=Path, help="keep the built renderer here (and reuse it when it is there)")
    args = p.parse_args()
    commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or args.commit
    with tempfile.TemporaryDirectory() as tmp:
        exe = args.keep if args.keep is not None and args.keep.exists() else build(args.checkout, Path(tmp))
        if args.keep is not None and not args.keep.exists():
            shutil.copy(exe, args.keep)
        results: dict[str, dict] = {}
        for name, (bos, eos) in TEMPLATES.items():
            for case_name, case in CASES.items():
                body = {"template": template(name), "bos": bos, "eos": eos, "outputs": OUTPUTS, **case}
                results[f"{name}/{case_name}"] = run(exe, body)
    out = {"llama.cpp": commit, "inputs": inputs_digest(), "results": results}
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(results)} results to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
