"""The host's offer of public URLs of its model: the Hugging Face URL read from the cache's path, and only URLs
that serve this very file offered (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.model_chunks import model_manifest
from kafila.session.delivery.model_source import hugging_face_url, offer_source, offered_urls
from tests.session.delivery.range_server import Behaviour, range_server

pytestmark = pytest.mark.fast


def test_the_hugging_face_cache_path_names_the_url_the_file_came_from(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/snapshots/0a1b2c/q4/m.gguf"
    url = "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/0a1b2c/q4/m.gguf"
    assert hugging_face_url(snapshot) == url
    assert offered_urls(snapshot, ["https://mirror/m.gguf"]) == ("https://mirror/m.gguf", url)
    assert offered_urls(snapshot, [url]) == (url,)  # named already: once
    for elsewhere in (tmp_path / "m.gguf", tmp_path / "models--x/snapshots/r/m.gguf",  # no org--name
                      tmp_path / "models--o--m/blobs/abc", tmp_path / "models--o--m/snapshots/r"):
        assert hugging_face_url(elsewhere) is None
    assert offered_urls(tmp_path / "m.gguf", []) == ()


async def test_only_urls_serving_this_file_are_offered_each_with_a_line(tmp_path: Path) -> None:
    model = write_random_gguf(tmp_path / "m.gguf", TEST_SHAPE, 4, tokenizer=False)
    other = write_random_gguf(tmp_path / "o.gguf", TEST_SHAPE, 3, tokenizer=False)
    lines: list[str] = []
    async with range_server(Behaviour(model)) as good, range_server(Behaviour(other)) as bad:
        urls = [f"{bad.url}/model.gguf", f"{good.url}/redirect", f"{good.url}/missing"]
        source = await offer_source(tmp_path / "cache", model, urls, lines.append)
        assert source is not None and source.urls == (f"{good.url}/redirect",)
        assert source.manifest == model_manifest(tmp_path / "cache", model)
        assert len(good.behaviour.asked) == 1  # the check read one chunk
        starts = (f"not offering {bad.url}/model.gguf to members: ",
                  f"members fetch their stages from {good.url}/redirect",
                  f"not offering {good.url}/missing to members: ")
        assert len(lines) == 3 and all(line.startswith(start) for line, start in zip(lines, starts, strict=True))
        assert "serves another file" in lines[0] and "HTTP 404" in lines[2]
        assert await offer_source(tmp_path / "cache", model, urls[:1], lines.append) is None
