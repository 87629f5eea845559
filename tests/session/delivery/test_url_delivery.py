"""`kafila host MODEL --source URL`: members fetch their stages' chunks from a public URL of the model (a real HTTP
server with Range support on loopback), each checked against the host's manifest, and the host sends nothing;
a URL serving another file is not offered, and a URL failing after the host checked it leaves the stages to the
host. The heir's copy of the model comes from the URL too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.model.stage_cache import sha256_file
from tests.conftest import llama_cpp_reply
from tests.session.cluster import HOST_MEMBER, Cluster
from tests.session.delivery.range_server import Behaviour, served
from tests.shared_probe import shared_probe

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
MAX_TOKENS = 16
SENT = re.compile(r"stage delivered to (\w+): (\d+) bytes sent")


def bytes_sent(ring: Cluster) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for line in ring.host.lines if (m := SENT.search(line))}


def test_stages_come_from_the_url_and_a_url_of_another_file_is_not_offered(tmp_path: Path, smollm: Path) -> None:
    other = write_random_gguf(tmp_path / "other.gguf", TEST_SHAPE, 4, tokenizer=False)
    right, wrong = Behaviour(smollm), Behaviour(other)
    with served(right, wrong) as (good, bad), \
            Cluster(tmp_path, [("ada", []), ("bo", [])],
                    host_args=[str(smollm), "--source", bad.url + "/model.gguf",
                               "--source", good.url + "/redirect"]) as ring:
        ring.wait_phase({"admitted"})
        reply = ring.chat(PROMPT, MAX_TOKENS)
        sent, host_log = bytes_sent(ring), ring.host.output
        logs = {n: ring.members[n].output for n in ("ada", "bo")}
    assert reply["choices"][0]["message"]["content"] == llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)
    assert sent == {"ada": 0, "bo": 0}, host_log  # every stage byte came from the URL
    assert f"not offering {bad.url}/model.gguf to members" in host_log and "serves another file" in host_log
    assert f"members fetch their stages from {good.url}/redirect" in host_log
    assert len(wrong.asked) == 1  # the host's check of the first chunk, and nothing from any member
    for name, log in logs.items():
        assert "cut from the model's verified chunks" in log, (name, log)
    # each member fetched its own stage's chunks: together about the model, never a whole copy each
    fetched = sum(end - start for start, end in right.asked)
    assert fetched < 2 * smollm.stat().st_size


def test_a_url_that_fails_after_the_check_leaves_the_stages_to_the_host(tmp_path: Path, smollm: Path) -> None:
    flaky = Behaviour(smollm, fail_after=1)  # the host's check gets its chunk; every member's request a 503
    with served(flaky) as (server,), \
            Cluster(tmp_path, [("ada", []), ("bo", [])],
                    host_args=[str(smollm), "--source", server.url + "/model.gguf"]) as ring:
        ring.wait_phase({"admitted"})
        reply = ring.chat(PROMPT, MAX_TOKENS)
        sent = bytes_sent(ring)
        logs = {n: ring.members[n].output for n in ("ada", "bo")}
    assert reply["choices"][0]["message"]["content"] == llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)
    assert sent["ada"] > 0 and sent["bo"] > 0
    for name, log in logs.items():
        assert "the stage comes from the host instead" in log, (name, log)


def test_the_heirs_copy_comes_from_the_url_and_it_takes_over_with_it(tmp_path: Path, smollm: Path) -> None:
    """The host serves a stage and no member holds the model: the heir's copy is fetched from the URL (the chunks
    its stage took already are not fetched again), the host sends none of it, and the heir takes over with it."""
    right = Behaviour(smollm)
    caches = {n: tmp_path / f"{n}-cache" for n in ("ada", "bo")}  # machines of their own
    for cache in caches.values():
        shared_probe(cache)
    with served(right) as (server,), \
            Cluster(tmp_path, [(n, ["--api-port", "0"]) for n in caches], serve_host=True,
                    member_env={n: {"KAFILA_CACHE_DIR": str(c)} for n, c in caches.items()},
                    host_args=[str(smollm), "--source", server.url + "/model.gguf"]) as ring:
        plan = ring.wait_phase({"admitted"})["plan"]
        others = [n for n in plan["order"] if n != HOST_MEMBER]
        heir = others[0]
        copied = ring.wait_state(ring.url, lambda s: s["copies"].get(heir) == 1.0, 120)
        heir_log = ring.members[heir].output
        assert "fetching a copy of the model" in heir_log and "receiving a copy" not in heir_log, heir_log
        copy = caches[heir] / "models" / f"{sha256_file(smollm)}.gguf"
        assert copy.read_bytes() == smollm.read_bytes()
        # the heir fetched each chunk once (its stage's, then the rest), the other member its stage's chunks (its
        # stage file's size, and partial chunks at its ranges' ends), the host one chunk: had the heir fetched its
        # stage's chunks again for the copy, tens of MB more
        size, chunk = smollm.stat().st_size, 1 << 20
        stage = copied["delivery"][others[1]][1]
        assert sum(end - start for start, end in right.asked) <= size + stage + 8 * chunk
        ring.host.popen.kill()  # kill -9: the host, its stage and its model file
        url = ring.member_url(others[-1])
        state = ring.wait_state(url, lambda s: s["coordinator"] == heir and s["phase"] == "admitted", 180)
        assert sorted(state["plan"]["order"]) == sorted(others), state["plan"]
        reply = ring.chat(PROMPT, MAX_TOKENS, url=url)
    assert reply["choices"][0]["message"]["content"] == llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)
