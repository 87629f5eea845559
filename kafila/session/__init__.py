"""A session: the rooms that turn measured machines into a serving ring.

Layers, each importing only from those below it (tests/test_architecture.py checks this):

    terminal/     what a person running `kafila host|join|demo|chat` sees: printer, reports, transcripts
    launch/       whole sessions from one process: `kafila host` (the coordinator and this machine's member), the demo
    member/       a ring member: joining, its stage, serving, heartbeats, measurement, taking coordination over
    coordinator/  the host's coordination: admission, epochs (plan, deliver, admit), losses, its runtime, builds
    api/          the local OpenAI-compatible API: server, client, who may call it (guard, token)
    ring/         the data plane: the head's batching and sampling, slots, stage workers, frame checks
    delivery/     stages to members: hashing, sending, receiving, the cache
    protocol/     the wire contract: control messages, activation frames, stage manifests
    state.py, phases.py, options.py, settings.py, stoppable.py   shared by every room
"""
