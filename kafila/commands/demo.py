"""`kafila demo`: the embedded model, split into three stages, answering a chat on this machine."""

from __future__ import annotations

import argparse
import sys

from kafila.commands._common import add_model_arg, add_sampling_args, byte_progress

HELP = "chat with the embedded model split into a chain of three stages on this machine"


def configure(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    add_sampling_args(p)
    p.add_argument("--split", default="10,20", help="block boundaries (default 10,20)")
    p.add_argument("--prompt", default=None, help="answer this one message and exit")


def run(args: argparse.Namespace) -> int:
    from kafila.engine.chain import open_chain
    from kafila.engine.request import Request
    from kafila.engine.sampler import Sampler, SamplingParams
    from kafila.engine.stage import ContextConfig
    from kafila.model.embedded import resolve_model
    from kafila.model.stage_cache import StageCache

    config = ContextConfig(n_ctx_per_seq=args.context, n_seq_max=1)
    with byte_progress("cutting stages") as progress:
        chain = open_chain(resolve_model(args.model), args.split, config, StageCache(), progress)
    history: list[dict[str, str]] = []
    try:
        interactive = args.prompt is None
        if interactive:
            print(f"Kafila demo: {len(chain.stages)} stages (split {args.split}). Type a message; Ctrl-D quits.")
        while True:
            if interactive:
                try:
                    line = input("you> ").strip()
                except EOFError:
                    print()
                    return 0
                if not line:
                    continue
            else:
                line = args.prompt
            history.append({"role": "user", "content": line})
            tokens = chain.vocab.chat_tokens(history)
            request = Request(0, tokens, args.max_tokens, args.context,
                              Sampler(SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)), chain.vocab)
            reply = []
            for _, piece in chain.run([request]):
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            history.append({"role": "assistant", "content": "".join(reply)})
            if not interactive:
                return 0
    finally:
        chain.close()
