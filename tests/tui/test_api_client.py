"""The chat API client against the real API server (kafila.session.api.server), its ring scripted."""

from __future__ import annotations

import pytest

from kafila.errors import KafilaError
from kafila.session.api.client import (
    RAW_TEXT_NOTICE,
    ApiClient,
    ApiError,
    ApiLost,
    ApiTimeout,
    ApiUnreachable,
    Notice,
    ReplyStats,
)
from kafila.session.state import MemberView, SessionState
from tests.tui.scripted_api import Script, refusing_port

pytestmark = pytest.mark.fast


async def collect(client: ApiClient, text: str = "hi") -> tuple[str, list[ReplyStats]]:
    pieces, stats = [], []
    async for item in client.stream_chat([{"role": "user", "content": text}], max_tokens=16, temperature=0.0):
        if isinstance(item, ReplyStats):
            stats.append(item)
        else:
            pieces.append(item)
    return "".join(pieces), stats


async def test_streams_pieces_then_stats(api: str, script: Script) -> None:
    async with ApiClient(api) as client:
        text, stats = await collect(client)
    assert text == "Hello, ring!"
    assert len(stats) == 1
    s = stats[0]
    assert s.tokens_per_s == 42.5 and s.network_share == 0.18
    assert s.stages["alpha"].predicted_s == 0.004 and s.stages["beta"].measured_s == 0.0058
    sent = script.requests[0]
    assert sent["max_tokens"] == 16 and sent["temperature"] == 0.0  # validated fields only (no "stream")
    assert sent["messages"] == [{"role": "user", "content": "hi"}]


async def test_reply_without_stats(api: str, script: Script) -> None:
    script.stats = None
    async with ApiClient(api) as client:
        text, stats = await collect(client)
    assert text == "Hello, ring!" and len(stats) == 1
    assert stats[0].tokens_per_s is None and stats[0].network_share is None and stats[0].stages == {}
    assert stats[0].raw["finish_reason"] == "stop" and stats[0].raw["completion_tokens"] == 4


async def test_notice_arrives_between_pieces(api: str, script: Script) -> None:
    """The server's notice chunk (no choices, a kafila.notice) reaches the caller in its place in the reply."""
    script.notices = {2: "member beta was lost; the reply continues once the host has planned a ring without it"}
    items = []
    async with ApiClient(api) as client:
        async for item in client.stream_chat([{"role": "user", "content": "x"}]):
            items.append(item)
    assert items[:4] == ["Hello", ", ", Notice(script.notices[2]), "ring"]
    assert items[4] == "!" and isinstance(items[5], ReplyStats) and len(items) == 6


async def test_http_error_names_url_and_message(api: str, script: Script) -> None:
    script.refuse("session not admitted yet")
    async with ApiClient(api) as client:
        with pytest.raises(ApiError) as info:
            await collect(client)
    assert info.value.status == 503
    assert api in str(info.value) and "session not admitted yet" in str(info.value)


async def test_error_chunk_mid_stream(api: str, script: Script) -> None:
    script.error_after, script.error_message = 2, "member rtx lost"
    got: list[str] = []
    async with ApiClient(api) as client:
        with pytest.raises(ApiError, match="member rtx lost"):
            async for item in client.stream_chat([{"role": "user", "content": "x"}]):
                got.append(str(item))
    assert got == ["Hello", ", "]


async def test_connection_dropped_mid_stream(api: str, script: Script) -> None:
    script.drop_after = 1
    async with ApiClient(api) as client:
        with pytest.raises(ApiLost) as info:
            await collect(client)
    assert api in str(info.value)


async def test_connection_refused() -> None:
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}"
        async with ApiClient(url, connect_timeout=2) as client:
            with pytest.raises(ApiUnreachable) as info:
                await collect(client)
            with pytest.raises(ApiUnreachable):
                await client.models()
    message = str(info.value)
    assert message.startswith(f"no Kafila session answers at {url}")
    assert "kafila demo" in message and isinstance(info.value, KafilaError)


async def test_read_timeout(api: str, script: Script) -> None:
    script.stall_s = 1.0
    async with ApiClient(api, read_timeout=0.2) as client:
        with pytest.raises(ApiTimeout, match=r"did not answer within 0\.2 s"):
            await collect(client)


async def test_models_and_state(api: str, script: Script) -> None:
    st = SessionState(phase="admitted", model="m")
    st.members["a"] = MemberView("a", bandwidth_bytes_per_s=1e9, probe_samples=[1.0, 2.0])
    script.show(st)
    async with ApiClient(api) as client:
        assert await client.models() == ["m"]  # the session's own model
        got = await client.state()
    assert got.phase == "admitted" and got.members["a"].probe_samples == [1.0, 2.0]


async def test_a_base_model_gets_raw_text_completed_and_the_client_says_so_once(api: str, script: Script) -> None:
    """A chat refused for want of a chat template: the last user message goes to /v1/completions instead."""
    script.chat_template, script.echo = False, True
    history = [{"role": "user", "content": "The capital of France is"}]
    async with ApiClient(api) as client:
        first = [item async for item in client.stream_reply(history, max_tokens=8, temperature=0.0)]
        later = [*history, {"role": "assistant", "content": "x"}, {"role": "user", "content": "Once upon"}]
        second = [item async for item in client.stream_reply(later)]
    assert first[0] == Notice(RAW_TEXT_NOTICE, "model") and "".join(i for i in first if isinstance(i, str)) == \
        "echo: The capital of France is"
    assert not any(isinstance(i, Notice) for i in second)  # said once
    assert "".join(i for i in second if isinstance(i, str)) == "echo: Once upon"
    # the chat was tried once, then only completions of the raw text (no chat template anywhere)
    assert ["messages" in r for r in script.requests] == [True, False, False]
    assert script.requests[1] == {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0.0,
                                  "top_p": 0.95, "top_k": 40, "seed": None}


async def test_a_chat_model_is_chatted_with(api: str, script: Script) -> None:
    async with ApiClient(api) as client:
        items = [item async for item in client.stream_reply([{"role": "user", "content": "hi"}])]
    assert not any(isinstance(i, Notice) for i in items) and "messages" in script.requests[0]
    assert client.raw_text is False


async def test_other_refusals_are_not_taken_for_a_base_model(api: str, script: Script) -> None:
    script.refuse("a member was lost")
    async with ApiClient(api) as client:
        with pytest.raises(ApiError) as info:
            [item async for item in client.stream_reply([{"role": "user", "content": "hi"}])]
    assert info.value.status == 503 and info.value.code == "not_serving" and not client.raw_text


async def test_stream_completion_streams_text(api: str, script: Script) -> None:
    async with ApiClient(api) as client:
        items = [item async for item in client.stream_completion("Once", max_tokens=4)]
    assert "".join(i for i in items if isinstance(i, str)) == "Hello, ring!" and isinstance(items[-1], ReplyStats)
    assert script.requests[0]["prompt"] == "Once" and script.requests[0]["max_tokens"] == 4
