"""`kafila join --model`: a member holding the host's model cuts its stage itself; a different file is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kafila.model.stage_cache import sha256_file
from tests.conftest import llama_cpp_reply
from tests.session.cluster import Cluster
from tests.shared_probe import shared_probe
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast

PROMPT = "What is the capital of France?"
MAX_TOKENS = 16
SENT = re.compile(r"stage delivered to (\w+): (\d+) bytes sent")


def own_cache(tmp: Path) -> Path:
    """A member's cache of its own (so it really cuts), holding the shared probe result (so it does not probe again)."""
    cache = tmp / "own-cache"
    shared_probe(cache)
    return cache


@pytest.mark.slow
def test_a_member_with_the_model_gets_no_stage_bytes_and_the_reply_is_exact(tmp_path: Path, smollm: Path) -> None:
    cache = own_cache(tmp_path)
    with Cluster(tmp_path, [("ada", ["--model", str(smollm)]), ("bo", [])],
                 member_env={"ada": {"KAFILA_CACHE_DIR": str(cache)}}) as ring:
        ring.wait_phase({"admitted"})
        reply = ring.chat(PROMPT, MAX_TOKENS)
        sent = {m.group(1): int(m.group(2)) for line in ring.host.lines if (m := SENT.search(line))}
        host_log, ada_log = ring.host.output, ring.members["ada"].output
    assert reply["choices"][0]["message"]["content"] == llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)
    assert sent["ada"] == 0 and sent["bo"] > 0  # bo received its stage over the network, ada nothing
    assert "ada holds the model (same sha256): it cuts its stage itself" in host_log
    assert "cut locally and verified" in ada_log
    # ada's stage was cut in its own cache, from its own file, and nothing was delivered into it
    assert list((cache / "stages").rglob("*.gguf")) and not list(cache.glob("delivered/*"))
    # the file's hash was remembered by path, size and mtime: a second join does not read it again
    assert sha256_file(smollm) in (cache / "hashes.json").read_text()


@pytest.mark.slow
def test_a_member_whose_model_differs_is_refused_with_both_hashes(tmp_path: Path, smollm: Path) -> None:
    other = write_synthetic(tmp_path / "other.gguf", "llama")
    mine, theirs = sha256_file(smollm), sha256_file(other)
    with Cluster(tmp_path, [("ada", []), ("bo", ["--model", str(other)])]) as ring:
        bo = ring.members["bo"]
        bo.popen.wait(120)
        bo.reader.join(5)
        host_log = ring.host.output
    assert bo.popen.returncode not in (0, None)
    for log in (bo.output, host_log):
        assert theirs in log and mine in log and "not the same model" in log, log


def test_the_hosts_judgement_of_an_announced_model() -> None:
    from kafila.session.delivery.local_model import MODEL_KEY, judge_model

    host = "ab" * 32
    assert judge_model(host, "ada", {}) is None  # no --model: delivered as usual
    assert judge_model(host, "ada", {MODEL_KEY: host}) is None
    refusal = judge_model(host, "ada", {MODEL_KEY: "cd" * 32})
    assert refusal is not None and "cd" * 32 in refusal and host in refusal
    for bad in ("AB" * 32, "ab", 5, None):
        assert "malformed model hash" in str(judge_model(host, "ada", {MODEL_KEY: bad}))


def test_an_assign_with_a_cut_local_that_is_not_a_boolean_is_refused() -> None:
    import json

    from kafila.errors import ProtocolError
    from kafila.session.protocol import messages as m
    from kafila.session.protocol.manifest import StageManifest
    from kafila.session.settings import SessionSettings

    manifest = StageManifest("ab" * 32, 5, 1 << 20, ("cd" * 32,))
    obj = json.loads(m.encode(m.Assign(epoch=1, order=("a",), head="a", ranges={"a": (0, 1)},
                                       settings=SessionSettings(), plan={}, model="x", stage=manifest,
                                       cut_local=True, fingerprints={"a": "e" * 64})))
    assert m.decode(json.dumps(obj).encode()).cut_local is True  # type: ignore[attr-defined]
    for bad in (1, "true", None):
        with pytest.raises(ProtocolError, match="cut_local must be true or false"):
            m.decode(json.dumps({**obj, "cut_local": bad}).encode())
    del obj["cut_local"]
    with pytest.raises(ProtocolError, match="missing field cut_local"):
        m.decode(json.dumps(obj).encode())
