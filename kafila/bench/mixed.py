"""`kafila bench mixed`: a loopback ring with one member on a second llama.cpp build.

(a) without --mixed-builds the host refuses that member, naming what differs;
(b) the exact ring (every member on this build) and the mixed ring (one member on the second
    build, admitted with --mixed-builds) answer the same greedy prompts: how many tokens of each
    mixed reply equal the exact reply's before the first difference, and each ring's speed.
The second build (GGML_NATIVE=ON by default) is built once into the user cache (kafila.engine.variant).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from kafila.engine.request import common_prefix

HELP = "one member on a second llama.cpp build: refused by default; mixed ring's agreement and speed"
PROMPTS = ["What is the capital of France?", "Write a haiku about rivers.", "Explain how a bicycle works.",
           "Name three colours."]
MEMBERS = ("ada", "bo")  # bo runs on the second build
REFUSAL_TIMEOUT_S = 600.0  # the member on the second build probes first (its own build: no cached probe)


def configure(p: argparse.ArgumentParser) -> None:
    from kafila.engine.variant import DEFAULT_CMAKE_ARGS

    p.add_argument("--tokens", type=int, default=32, help="tokens per greedy reply (default 32)")
    p.add_argument("--cmake-args", default=DEFAULT_CMAKE_ARGS,
                   help=f"CMake flags of the second build (default {DEFAULT_CMAKE_ARGS!r})")
    p.add_argument("--build", action="store_true", help="build the second llama.cpp when it is not cached (minutes)")


def identity_of(path: Path | None) -> str:
    """The build tag a process on that llama-cpp-python build announces (None: this process's build)."""
    from kafila.engine.variant import env_for

    code = "from kafila.engine.build import build_identity, build_tag; " \
           "print(build_tag(build_identity()))"
    env = env_for(path) if path is not None else None
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    return out.stdout.strip().splitlines()[-1]


def _refusal(other: Path) -> str:
    """Start the ring without --mixed-builds; the host's note on the refused member."""
    from kafila.errors import SessionError
    from kafila.session.launch.demo import DemoMember, DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread

    members = (DemoMember(MEMBERS[0]), DemoMember(MEMBERS[1], llama_path=other))
    opts = DemoOptions(members=members, api_port=None, context=512)
    refused = threading.Event()
    session = SessionThread(lambda state: run_demo(opts, state))
    session.state.subscribe(lambda s: refused.set() if any(m.status == "refused" for m in s.members.values())
                            else None)
    with session:
        if not refused.wait(REFUSAL_TIMEOUT_S):
            said = " | ".join(text for _, text in session.state.events[-3:])
            raise SessionError(f"the host did not refuse {MEMBERS[1]} within {REFUSAL_TIMEOUT_S:.0f} s "
                               f"(the session's last events: {said})")
        view = session.state.members[MEMBERS[1]]
        return view.note


def _ring(other: Path | None, tokens: int) -> dict[str, Any]:
    """A two-member ring (the second member on `other` when given); greedy replies and speed."""
    from kafila.errors import SessionError
    from kafila.session.launch.demo import DemoMember, DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread
    from kafila.session.terminal.report import reply_via_api

    members = (DemoMember(MEMBERS[0]), DemoMember(MEMBERS[1], llama_path=other))
    opts = DemoOptions(members=members, api_port=0, context=512, mixed_builds=other is not None)
    with SessionThread(lambda state: run_demo(opts, state)) as s:
        state = s.wait_settled(600)
        if state.phase != "admitted":
            raise SessionError(f"the ring was not admitted: {state.rejection or state.phase}")
        url = state.api_url or ""
        reply_via_api(url, PROMPTS[0], 4, 0.0)  # warm-up
        texts, speeds = [], []
        for prompt in PROMPTS:
            text, stats = reply_via_api(url, prompt, tokens, 0.0)
            texts.append(text)
            speeds.append(stats.get("tokens_per_s") or 0.0)
        return {"texts": texts, "tokens_per_s": sum(speeds) / len(speeds), "builds": state.builds,
                "order": (state.plan or {}).get("order")}


def _tokens(texts: list[str]) -> list[list[int]]:
    """The replies as the model's tokens (its vocabulary, whatever build computed them)."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama
    from kafila.model.embedded import default_model_path

    llama()  # its log routed before the vocabulary loads
    vocab = Llama(str(default_model_path()), vocab_only=True, verbose=False)
    try:
        return [vocab.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
    finally:
        vocab.close()


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from kafila.bench.report import emit, envelope
    from kafila.engine.variant import build, is_built, variant_dir
    from kafila.errors import KafilaError

    console = Console(stderr=True)
    other = variant_dir(cmake_args=args.cmake_args)
    if not is_built(other):
        if not args.build:
            raise KafilaError("the second llama.cpp build is not cached: run `make llama-variant` "
                              "or pass --build (about 10 minutes on 2 cores)")
        console.log(f"building llama-cpp-python with {args.cmake_args} (once, minutes)")
        build(other, cmake_args=args.cmake_args)
    mine, theirs = identity_of(None), identity_of(other)
    if mine == theirs:
        raise KafilaError(f"the second build has the same identity as this one ({mine}): nothing to compare")
    console.log(f"builds: this {mine}, second {theirs} ({args.cmake_args})")
    console.log("(a) without --mixed-builds: the member on the second build must be refused")
    note = _refusal(other)
    console.log("(b) the exact ring")
    exact = _ring(None, args.tokens)
    console.log("(b) the mixed ring (--mixed-builds)")
    mixed = _ring(other, args.tokens)
    exact_tok, mixed_tok = _tokens(exact["texts"]), _tokens(mixed["texts"])
    prefixes = [common_prefix(a, b) for a, b in zip(exact_tok, mixed_tok, strict=True)]
    per_prompt = [{"prompt": p, "exact": e, "mixed": m, "exact_tokens": len(et), "equal_prefix_tokens": n}
                  for p, e, m, et, n in zip(PROMPTS, exact["texts"], mixed["texts"], exact_tok, prefixes,
                                            strict=True)]
    total = sum(len(t) for t in exact_tok)
    agreement = {"equal_prefix_tokens": sum(prefixes), "exact_tokens": total,
                 "share": sum(prefixes) / total if total else None,
                 "identical_replies": sum(e == m for e, m in zip(exact["texts"], mixed["texts"], strict=True)),
                 "replies": len(PROMPTS)}
    results: dict[str, Any] = {
        "builds": {"this": mine, "second": theirs, "second_cmake_args": args.cmake_args},
        "refused_without_mixed_builds": note,
        "exact": {"tokens_per_s": exact["tokens_per_s"], "builds": exact["builds"], "order": exact["order"]},
        "mixed": {"tokens_per_s": mixed["tokens_per_s"], "builds": mixed["builds"], "order": mixed["order"]},
        "agreement": agreement,
        "per_prompt": per_prompt,
    }
    emit(envelope("mixed", results), args.json, args.out)
    if not args.json:
        a = agreement
        Console().print(
            f"refused without --mixed-builds: {note}\n"
            f"greedy agreement: {a['equal_prefix_tokens']}/{a['exact_tokens']} tokens equal before the first "
            f"difference, {a['identical_replies']}/{a['replies']} replies identical\n"
            f"speed: exact ring {exact['tokens_per_s']:.1f} tok/s, mixed ring {mixed['tokens_per_s']:.1f} tok/s")
    return 0

