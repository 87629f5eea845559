"""A program squatting on the session's port gets neither the token nor the conversation (issue 34 item 5).

When another local user binds 127.0.0.1:8711 first, the session moves to the next free port; `kafila chat`
talking to 8711 used to send the whole conversation there (and, with KAFILA_API_TOKEN set, the token too).
Now a client first asks the server to prove it holds the token (an HMAC over the client's nonce), and sends
nothing else until it has. The squatter here is a real HTTP server on loopback that records what it gets."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kafila.session.api.client import ApiClient, ApiNotYours
from kafila.session.api.server import ApiServer
from kafila.session.api.token import TOKEN_ENV, token_dir, token_path, write_token
from tests.session.api_fixtures import start_server

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def own_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Token files of this test's own: a killed session's token left in the user's runtime directory for the
    port the squatter drew would give the client a token to try (seen: 132 stale files after killed loops)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)  # platformdirs falls back to /tmp/runtime-UID when it does not exist
    assert token_dir() == tmp_path / "run" / "kafila"


@contextlib.asynccontextmanager
async def catch_all(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """An HTTP server on a free loopback port whose `handler` answers every request; its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def squatter() -> AsyncIterator[tuple[str, list[str]]]:
    """A server answering every request with 200 and a made-up proof; what it received, as text."""
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path_qs} {dict(request.headers)} {await request.text()}")
        return web.json_response({"proof": "00" * 32, "data": [{"id": "m"}]})

    async with catch_all(anything) as url:
        yield url, seen


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_without_a_token_for_the_port_nothing_is_sent(squatter: tuple[str, list[str]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = squatter
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    async with ApiClient(url) as client:
        with pytest.raises(ApiNotYours, match=rf"not a Kafila session of yours \(you hold no token for it: no "
                                              rf"{token_path(port_of(url))}\); nothing was sent"):
            async for _ in client.stream_chat([{"role": "user", "content": "my secret plans"}]):
                pass
    assert len(seen) == 1 and seen[0].startswith("GET /kafila/proof?nonce=")  # the proof was asked, no more
    assert "my secret plans" not in seen[0] and "Bearer" not in seen[0]


@pytest.mark.parametrize("how", ["env", "file"])
async def test_a_server_that_cannot_prove_it_holds_the_token_gets_neither(squatter: tuple[str, list[str]], how: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = squatter
    token = "the-real-sessions-token-" + how
    if how == "env":
        monkeypatch.setenv(TOKEN_ENV, token)
    else:  # a token file left for this port (a session of ours that served here before)
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        path: Path = write_token(port_of(url), token)
    try:
        async with ApiClient(url) as client:
            with pytest.raises(ApiNotYours, match="it cannot prove it holds your session's token"):
                await client.models()
            with pytest.raises(ApiNotYours):
                async for _ in client.stream_chat([{"role": "user", "content": "my secret plans"}]):
                    pass
    finally:
        if how == "file":
            path.unlink()
    assert seen and all(s.startswith("GET /kafila/proof?nonce=") for s in seen)
    assert not any(token in s or "my secret plans" in s for s in seen)


async def test_the_session_itself_proves_it_and_serves() -> None:
    server, ring = await start_server()
    try:
        async with ApiClient(f"http://127.0.0.1:{server.guard.port}") as client:
            assert await client.models()
            pieces = [p async for p in client.stream_chat([{"role": "user", "content": "hi"}]) if isinstance(p, str)]
        assert "".join(pieces) == "Hello, world" and ring.bodies[0]["messages"][0]["content"] == "hi"
        # the proof endpoint answers only a well-formed nonce, and proves nothing else
        async with ApiClient(f"http://127.0.0.1:{server.guard.port}") as client:
            http = client._http()
            async with http.get(f"{client.url}/kafila/proof?nonce=xyz") as resp:
                assert resp.status == 400 and "nonce" in json.dumps(await resp.json())
    finally:
        await server.stop()


@pytest.fixture
async def relay() -> AsyncIterator[tuple[ApiServer, str, list[str]]]:
    """The real session's server, and a squatter on another port that relays every request to it (the Host
    header rewritten, as the session checks it) and its answer back; what the squatter received, as text."""
    server, _ring = await start_server()
    real = f"http://127.0.0.1:{server.guard.port}"
    seen: list[str] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(f"{request.method} {request.path_qs} {dict(request.headers)} {body.decode(errors='replace')}")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with aiohttp.ClientSession() as http, \
                http.request(request.method, real + request.path_qs, headers=headers, data=body) as resp:
            return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)

    try:
        async with catch_all(forward) as url:
            yield server, url, seen
    finally:
        await server.stop()


@pytest.mark.parametrize("how", ["env", "file", "argument", "none"])
async def test_a_squatter_relaying_the_proof_gets_no_token_and_no_conversation(
        relay: tuple[ApiServer, str, list[str]], how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 56 item 2: a squatter on the port the client dials, the real session on another, relayed the
    client's nonce to the session and its proof back (an HMAC over the nonce alone), and got the token and the
    chat. Now the proof is for the address the session was reached at, which the client checks against the one
    it dialled: the relay gets neither, whatever tells the client the token."""
    server, url, seen = relay
    token = server.token
    assert token is not None
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    if how == "env":
        monkeypatch.setenv(TOKEN_ENV, token)
    elif how == "file":  # the session's token written for the squatted port (a copy the user made)
        write_token(port_of(url), token)
    async with ApiClient(url, token=token if how == "argument" else None) as client:
        with pytest.raises(ApiNotYours) as refused:
            await client.models()
        with pytest.raises(ApiNotYours):
            async for _ in client.stream_chat([{"role": "user", "content": "my secret plans"}]):
                pass
    where = f"127.0.0.1:{server.guard.port}"
    assert (f"it relays your session, which serves at {where}: connect there" in str(refused.value)) == (how != "none")
    assert seen and all(s.startswith("GET /kafila/proof?nonce=") for s in seen)
    assert not any(token in s or "Bearer" in s or "my secret plans" in s for s in seen)
    async with ApiClient(f"http://{where}", token=token) as client:  # the session itself still proves it
        assert await client.models()
