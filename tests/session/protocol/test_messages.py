"""Session control messages: every type round-trips, and any bytes or JSON decode to a message or a
ProtocolError naming what is wrong, never another exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError
from kafila.session.protocol import messages as m
from kafila.session.protocol.chunks import COPY_BATCH
from kafila.session.protocol.manifest import CHUNK_SIZE, StageManifest
from kafila.session.protocol.model_manifest import ModelManifest, ModelSource
from kafila.session.settings import SessionSettings

pytestmark = pytest.mark.fast

FUZZ = settings(max_examples=400, deadline=None)
names = st.text(min_size=1, max_size=12)
texts = st.text(max_size=40)
epochs = st.integers(0, 2**31 - 1)
seconds = st.floats(0, 1e6, allow_nan=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
sha = st.text("0123456789abcdef", min_size=64, max_size=64)


@st.composite
def manifests(draw: st.DrawFn) -> StageManifest:
    chunk = CHUNK_SIZE  # the only chunk size a manifest may name
    size = draw(st.integers(1, 5 * chunk))
    n = -(-size // chunk)
    return StageManifest(draw(sha), size, chunk, tuple(draw(st.lists(sha, min_size=n, max_size=n))))


@st.composite
def sources(draw: st.DrawFn) -> ModelSource:
    stage = draw(manifests())  # a model this small has the stage manifest's chunk size
    model = ModelManifest(stage.sha256, stage.size, stage.chunk_size, stage.chunks)
    urls = draw(st.lists(st.sampled_from(["https://huggingface.co/o/m/resolve/main/m.gguf", "http://127.0.0.1:9/m"]),
                         min_size=1, max_size=3))
    return ModelSource(model, tuple(urls))


@st.composite
def assigns(draw: st.DrawFn) -> m.Assign:
    order = tuple(draw(st.lists(names, min_size=1, max_size=5, unique=True)))
    ranges = {n: (i * 3, i * 3 + draw(st.integers(1, 3))) for i, n in enumerate(order)}
    size = st.integers(1, 4096)
    settings = SessionSettings(draw(size), draw(size), draw(size), draw(st.sampled_from(["auto", "lookup", "off"])),
                               draw(st.booleans()), draw(st.booleans()), draw(seconds), draw(seconds),
                               draw(st.booleans()), draw(names))
    plan = {"stage_seconds": {n: draw(seconds) for n in order}, "head": order[0]}
    fingerprints = {n: draw(st.text("0123456789abcdef", min_size=64, max_size=64)) for n in order}
    return m.Assign(epoch=draw(epochs), order=order, head=order[0], ranges=ranges, settings=settings, plan=plan,
                    model=draw(texts), stage=draw(manifests()), cut_local=draw(st.booleans()),
                    fingerprints=fingerprints, source=draw(st.none() | sources()))


events = st.one_of(
    st.builds(lambda d, t: {"delta": d, "tokens": t}, texts, st.lists(st.integers(0, 10**6), max_size=5)),
    st.builds(lambda n: {"done": {"completion_tokens": n}}, st.integers(0, 100)),
    st.builds(lambda e, r: {"error": e, "resumable": r}, texts, st.booleans()),
)
edges = st.none() | st.builds(m.EdgeOutcome, st.sampled_from(["direct", "relay"]),
                              st.sampled_from(["direct", "relay", "failed"]), st.none() | seconds, st.none() | texts)


def _finite(v: Any) -> bool:
    return "NaN" not in json.dumps(v) and "Infinity" not in json.dumps(v)


controls = st.one_of(
    assigns(),
    st.builds(m.Need, epochs, st.lists(st.integers(0, 2**31 - 1), max_size=8).map(tuple)),
    st.builds(m.Loaded, epochs), st.builds(m.Connect, epochs), st.builds(m.Admit, epochs),
    st.builds(m.Working, epochs, names),
    st.builds(m.Ready, epochs, edges),
    st.builds(m.Reject, texts), st.builds(m.Refused, texts), st.builds(m.Bye, texts),
    st.builds(m.Lost, names, texts, epochs), st.builds(m.Replan, texts, epochs),
    st.builds(m.Measuring, texts, st.integers(0, 1000), st.booleans(), seconds),
    st.builds(m.MeasuredSelf, st.dictionaries(st.text(max_size=8), json_values.filter(_finite), max_size=4)),
    st.builds(m.Stats, st.dictionaries(names, st.builds(m.StageTime, seconds, st.none() | seconds), max_size=4),
              st.none() | st.floats(0, 1), st.none() | seconds,
              st.none() | st.builds(m.TtftTime, st.integers(0, 2**31 - 1), seconds, st.none() | seconds),
              st.none() | seconds),
    st.builds(m.Copy, manifests()),
    st.builds(m.CopyNeed, st.lists(st.integers(0, 2**31 - 1), max_size=COPY_BATCH).map(tuple)),
    st.builds(m.Copied, st.none() | sha, st.none() | texts),
    st.builds(m.Free, st.integers(0, 0xFFFF)),
    st.builds(m.Chat, names, names, st.dictionaries(st.text(max_size=8), json_values.filter(_finite), max_size=4)),
    st.builds(m.ChatEvt, names, names, events),
    st.builds(m.Roster, names, texts, st.dictionaries(names, st.builds(
        m.Measured, seconds, seconds, st.integers(0, 2**40), seconds, names, st.none() | seconds), max_size=4),
        st.none() | names, st.lists(names, max_size=4).map(tuple), st.none() | sha),
)


@given(controls)
def test_every_message_round_trips(msg: m.Control) -> None:
    raw = m.encode(msg)
    assert m.kind(raw) == "control"
    assert m.decode(raw) == msg


def _decodes_or_refuses(raw: bytes) -> None:
    try:
        msg = m.decode(raw)
    except ProtocolError as exc:
        assert str(exc)  # a message for a person
        return
    assert isinstance(msg, m.Control) and m.decode(m.encode(msg)) == msg


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_bytes(raw: bytes) -> None:
    _decodes_or_refuses(raw)


@FUZZ
@given(st.sampled_from(sorted(m.SCHEMA)), st.dictionaries(st.sampled_from(
    ["epoch", "order", "head", "ranges", "config", "plan", "model", "stage", "chunks", "edge", "reason", "who",
     "stages", "network_share", "tokens_per_s", "seq", "id", "origin", "body", "dest", "evt", "coordinator",
     "members", "beside", "holders", "model_sha256", "settings", "replan", "manifest", "sha256", "error",
     "circuit_gap_s"]), json_values))
def test_fuzz_json_of_each_type(t: str, fields: dict[str, Any]) -> None:
    _decodes_or_refuses(json.dumps({"t": t, **fields}).encode())


@FUZZ
@given(controls, st.data())
def test_fuzz_one_field_of_a_valid_message_replaced(msg: m.Control, data: st.DataObject) -> None:
    obj = json.loads(m.encode(msg))
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = data.draw(json_values)
    _decodes_or_refuses(json.dumps(obj).encode())


def test_deep_nesting_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        m.decode(b'{"t":"chat","body":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


@pytest.mark.parametrize(("raw", "what"), [
    (b'{"t":"free"}', "'free' message: missing field seq"),
    (b'{"t":"free","seq":70000}', r"'free' message: seq must be an integer in \[0, 65535\]"),
    (b'{"t":"free","seq":true}', "seq must be an integer"),
    (b'{"t":"stats","stages":{},"network_share":NaN,"tokens_per_s":null,"ttft":null,"circuit_gap_s":null}',
     "network_share must be a number"),
    (b'{"t":"stats","stages":{},"network_share":null,"tokens_per_s":null,"ttft":{"prompt_tokens":-1,'
     b'"measured_s":1,"predicted_s":null},"circuit_gap_s":null}', "prompt_tokens must be an integer"),
    (b'{"t":"copy_need","chunks":[0,1,2,3,4,5,6,7,8]}', "chunks must be a list of at most 8 items"),
    (b'{"t":"copied","sha256":"ab","error":null}', "sha256 must be a string of 64"),
    (b'{"t":"nope"}', "unknown type 'nope'"),
    (b'[1]', "not a JSON object"),
    (b'{"t":"need","epoch":1,"chunks":[-1]}', r"chunks\[0\] must be an integer"),
    (b'{"t":"chat_evt","id":"a","dest":"b","evt":{"delta":"x"}}', "evt.tokens must be a list"),
    (b'{"t":"roster","coordinator":"a","model":"m","members":{},"beside":null,"holders":"bo","model_sha256":null,'
     b'"strategy":"kafila","mixed_builds":false,"fingerprints":{},"mandates":{}}', "holders must be a list"),
    (b'{"t":"roster","coordinator":"a","model":"m","members":{},"beside":null,"holders":[],"model_sha256":"ab",'
     b'"strategy":"kafila","mixed_builds":false,"fingerprints":{},"mandates":{}}',
     "model_sha256 must be a string of 64"),
    (b'{"t":"roster","coordinator":"a","model":"m","members":{},"beside":null,"holders":[],"model_sha256":null,'
     b'"strategy":"kafila","mixed_builds":false,"fingerprints":{},"mandates":{"a":"x"}}',
     r"mandates\['a'\] must be an object"),
    (b'{"t":"roster","coordinator":"a","model":"m","members":{},"beside":null,"holders":[],"model_sha256":null,'
     b'"strategy":"kafila","mixed_builds":false,"fingerprints":{"a":"ab"},"mandates":{}}',
     r"fingerprints\['a'\] must be a string of 64"),
])
def test_malformed_fields_are_named(raw: bytes, what: str) -> None:
    with pytest.raises(ProtocolError, match=what):
        m.decode(raw)


@given(assigns())
def test_assign_must_be_consistent(a: m.Assign) -> None:
    obj = json.loads(m.encode(a))
    bad_head = {**obj, "head": obj["head"] + "x"}
    missing_range = {**obj, "ranges": {**obj["ranges"], obj["order"][0]: None}}
    extra_range = {**obj, "ranges": {**obj["ranges"], "stranger" * 3: [0, 1]}}
    reversed_range = {**obj, "ranges": {**obj["ranges"], obj["order"][0]: [3, 3]}}
    bad_config = {**obj, "settings": {**obj["settings"], "batch": 0}}
    bad_replan = {**obj, "settings": {**obj["settings"], "replan": "no"}}
    bad_seconds = {**obj, "plan": {"stage_seconds": {"x": "fast"}}}
    for bad in (bad_head, missing_range, extra_range, reversed_range, bad_config, bad_replan, bad_seconds):
        with pytest.raises(ProtocolError):
            m.decode(json.dumps(bad).encode())


def test_a_manifest_with_zero_chunk_size_is_a_protocol_error() -> None:
    obj = json.loads(m.encode(m.Assign(epoch=1, order=("a",), head="a", ranges={"a": (0, 1)},
                                       settings=SessionSettings(), plan={}, model="x",
                                       stage=StageManifest("0" * 64, 1, 1, ("0" * 64,)),
                                       fingerprints={"a": "e" * 64})))
    obj["stage"]["chunk_size"] = 0
    with pytest.raises(ProtocolError, match="chunk_size"):
        m.decode(json.dumps(obj).encode())

