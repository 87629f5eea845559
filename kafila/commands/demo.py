"""`kafila demo`: a real ring on this machine (rendezvous, host, three emulated members) and a chat through it."""

from __future__ import annotations

import argparse

from kafila.commands._common import chat_template_arg, read_chat_template, read_link_rate, speculate_arg

HELP = "run a whole session on this machine (rendezvous, host, 3 emulated members) and chat through the ring"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="a GGUF file, or a model by name: smollm2 (the default, embedded) or gemma3 (Gemma 3 270M)")
    p.add_argument("--prompt", default=None, help="answer this one message, print the reply and exit")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (0 = greedy)")
    p.add_argument("--throttle", default="1,2,4",
                   help="EMULATION: slow-down of each member, comma-separated (default 1,2,4: three members)")
    p.add_argument("--memory", default=None, help="EMULATION: memory cap in GB of each member, comma-separated")
    p.add_argument("--link-delay", default=None, metavar="MS[,MS,...]",
                   help="EMULATION: one-way delay in ms of every datagram a member sends, one for all or one each")
    p.add_argument("--link-rate", default=None, metavar="MBIT[/MBIT]",
                   help="EMULATION: each member's connection in Mbit/s, one number for both ways or UP/DOWN")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent requests to admit (default 4)")
    p.add_argument("--context", type=int, default=2048, help="context per request in tokens (default 2048)")
    p.add_argument("--api-port", type=int, default=8711, help="the chat API port (default 8711; 0: any free one)")
    p.add_argument("--mixed-builds", action="store_true",
                   help="admit members whose llama.cpp build differs from the host's (the ring is then not bit-exact)")
    p.add_argument("--other-build", default=None, metavar="NAME",
                   help="run member NAME on the second llama.cpp build (make llama-variant builds it)")
    p.add_argument("--draft", default=None, metavar="PATH",
                   help="a small GGUF with the model's vocabulary: the head drafts with it (--speculate draft or auto)")
    speculate_arg(p)
    chat_template_arg(p)
    p.add_argument("--json", action="store_true", help="with --prompt: print one JSON object (text, plan, timings)")


def _members(args: argparse.Namespace) -> tuple:
    from kafila.errors import KafilaError
    from kafila.session.launch.demo import DemoMember
    from kafila.session.options import MAX_LINK_DELAY_MS

    names = ["ada", "bo", "cy", "dee", "eve", "fay", "gus", "hal"]
    try:
        throttles = [float(t) for t in args.throttle.split(",")]
        mems = [float(m) if m else None for m in args.memory.split(",")] if args.memory else [None] * len(throttles)
        delays = [float(d) for d in args.link_delay.split(",")] if args.link_delay else [0.0]
    except ValueError:
        raise KafilaError("--throttle, --memory and --link-delay take comma-separated numbers") from None
    if not 1 <= len(throttles) <= len(names) or len(mems) != len(throttles) or min(throttles) < 1:
        raise KafilaError(f"give 1 to {len(names)} throttles (each >= 1), and as many --memory values")
    if len(delays) == 1:
        delays *= len(throttles)
    if len(delays) != len(throttles) or not all(0 <= d <= MAX_LINK_DELAY_MS for d in delays):
        raise KafilaError(f"give one --link-delay for every member or one per member, each 0 to "
                          f"{MAX_LINK_DELAY_MS:g} ms")
    other = None
    if args.other_build is not None:
        from kafila.engine.variant import is_built, variant_dir

        other = variant_dir()
        if args.other_build not in names[:len(throttles)]:
            raise KafilaError(f"--other-build names a member of this demo ({', '.join(names[:len(throttles)])})")
        if not is_built(other):
            raise KafilaError("the second llama.cpp build is not there: run `make llama-variant` first")
    read_link_rate(args.link_rate)  # a bad value is refused here, before anything starts
    return tuple(DemoMember(n, t, m, other if n == args.other_build else None, d, link_rate=args.link_rate or "")
                 for n, t, m, d in zip(names, throttles, mems, delays, strict=False))


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from rich.console import Console

    from kafila.errors import SessionError
    from kafila.session.launch.demo import DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread
    from kafila.session.terminal.report import plan_summary, reply_via_api

    opts = DemoOptions(model=Path(args.model) if args.model else None, members=_members(args),
                       concurrency=args.concurrency, context=args.context, api_port=args.api_port,
                       mixed_builds=args.mixed_builds, speculate=args.speculate,
                       draft=Path(args.draft).resolve() if args.draft else None,
                       chat_template=read_chat_template(args.chat_template))
    console = Console(stderr=True, highlight=False)
    with SessionThread(lambda state: run_demo(opts, state), console=None if args.json else console) as session:
        state = session.wait_settled(timeout_s=600)
        if state.phase != "admitted":
            raise SessionError(state.rejection or state.lost or f"the demo session did not start ({state.phase}); "
                               f"see the logs in the cache's demo-logs folder")
        if not args.json:
            console.print(plan_summary(state))
        if args.prompt is None:
            from kafila.commands import chat

            return chat.run(argparse.Namespace(api=state.api_url, max_tokens=args.max_tokens,
                                               temperature=args.temperature))
        text, stats = reply_via_api(state.api_url or "", args.prompt, args.max_tokens, args.temperature,
                                    echo=None if args.json else sys.stdout)
        if args.json:
            print(json.dumps({"text": text, "admitted": True, "plan": state.plan, "rejection": None,
                              "tokens_per_s": stats.get("tokens_per_s"), "stages": stats.get("stages"),
                              "completion_tokens": stats.get("completion_tokens"),
                              "speculation": stats.get("speculation"),
                              "network_share": stats.get("network_share"), "builds": state.builds,
                              # this reply's time to first token beside the plan's for as many prompt tokens
                              "ttft": stats.get("ttft"),
                              # one token's time: predicted with the edges' measured round trips, and measured
                              "token_time": {**(state.token_time() or {}), "measured_s":
                                             1 / stats["tokens_per_s"] if stats.get("tokens_per_s") else None},
                              "members": {n: {"emulated": m.emulated} for n, m in state.members.items()}}))
        else:
            sys.stdout.write("\n")
    return 0
