"""A public URL of the model file as a source of its chunks, fetched with HTTP Range requests.

A Hugging Face or mirror `resolve` URL redirects to a CDN that answers `Range: bytes=a-b` with
206 and `Content-Range: bytes a-b/SIZE`; aiohttp follows the redirects (keeping the Range header).
The URL is trusted for nothing: before its first chunk is used the file behind it is checked
(check(): the size it reports and the first chunk's sha256 against the host's model manifest), and
every chunk it sends is verified by the ChunkStore like any other source's. A transfer that stalls
(no byte for `stall_s`) or breaks is asked again from the first byte that has not arrived, after a
back-off that doubles while nothing arrives, up to `attempts` tries in a row. Under an emulated link rate
(`--link-rate`) the bytes are read no faster than the member's downlink lets them through.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from kafila.errors import NetworkError, SessionError
from kafila.net.rate import RateQueue, paced
from kafila.session.protocol.model_manifest import ModelManifest

if TYPE_CHECKING:
    import aiohttp

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_PIECE = 64 << 10  # bytes read at a time: a stall is noticed within one read


class UrlRefused(SessionError):
    """The URL serves something other than the host's model file (one line, naming the URL and why)."""


@dataclass(frozen=True)
class UrlLimits:
    """How long a URL may stall and how often it is asked again."""

    stall_s: float = 15.0  # no byte for this long: the connection is replaced
    attempts: int = 6  # tries in a row without a byte arriving before the chunk is given up on this URL
    backoff_s: float = 0.5  # the first wait before a retry; doubled after each failure, up to backoff_max_s
    backoff_max_s: float = 8.0
    connect_s: float = 15.0


class UrlSource:
    """Chunks of the model from `url`; use as `async with UrlSource(...) as src`, then `await src.check()`."""

    def __init__(self, url: str, manifest: ModelManifest, limits: UrlLimits = UrlLimits(),
                 downlink: RateQueue | None = None) -> None:
        self.url, self.manifest, self.limits = url, manifest, limits
        self.downlink = downlink  # EMULATION (`--link-rate`): the member's downlink, which its datagrams share
        self.name = f"URL {url}"
        self.bytes_received = 0  # every byte that arrived, retried ranges included
        self.retries = 0
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> UrlSource:
        import aiohttp  # only members given a URL pay for importing it

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.limits.connect_s, sock_read=None)
        self._http = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._http is not None:
            await self._http.close()

    async def check(self) -> None:
        """UrlRefused unless the URL serves the host's model: its size as the manifest's, its first chunk's hash."""
        data = await self.fetch(0)
        if hashlib.sha256(data).hexdigest() != self.manifest.chunks[0]:
            raise UrlRefused(f"{self.url} serves another file: its first {len(data)} bytes do not match the host's "
                             f"model (sha256 {self.manifest.sha256[:16]}…)")

    async def fetch(self, index: int) -> bytes:
        """Chunk `index` as the URL serves it (unverified: the store checks it), resuming across broken or
        stalled connections; NetworkError once `attempts` tries in a row brought nothing."""
        start, end = self.manifest.span(index)
        got = bytearray()
        failures = 0
        while len(got) < end - start:
            before = len(got)
            try:
                await self._get(start + len(got), end, got)
            except Exception as exc:
                if not _retryable(exc):
                    raise  # UrlRefused: asking again cannot help
                failures = 0 if len(got) > before else failures + 1
                if failures >= self.limits.attempts:
                    raise NetworkError(f"{self.url} gave no bytes of chunk {index} in {failures} tries in a row "
                                       f"(last: {_describe(exc)})") from None
                self.retries += 1
                await asyncio.sleep(min(self.limits.backoff_s * 2 ** max(failures - 1, 0), self.limits.backoff_max_s))
        return bytes(got)

    async def _get(self, start: int, end: int, into: bytearray) -> None:
        """Bytes [start, end) appended to `into` as they arrive (a stall or a break leaves what came)."""
        assert self._http is not None, "use UrlSource in `async with`"
        headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        async with self._http.get(self.url, headers=headers) as resp:
            if resp.status in (408, 429) or resp.status >= 500:
                raise NetworkError(f"HTTP {resp.status}")
            if resp.status == 200:
                length = resp.content_length
                if length is not None and length != self.manifest.size:
                    raise UrlRefused(self._wrong_size(length))
                raise UrlRefused(f"{self.url} does not answer HTTP Range requests (HTTP 200 to a range), so a member "
                                 f"cannot fetch its part of the model from it")
            if resp.status != 206:
                raise UrlRefused(f"{self.url} answers HTTP {resp.status} {resp.reason or ''}".rstrip())
            total = _total_size(resp.headers.get("Content-Range", ""))
            if total is not None and total != self.manifest.size:
                raise UrlRefused(self._wrong_size(total))
            want = end - start
            wanted_end = len(into) + want
            while len(into) < wanted_end:
                piece = await asyncio.wait_for(resp.content.read(min(_PIECE, wanted_end - len(into))),
                                               self.limits.stall_s)
                if not piece:
                    raise NetworkError(f"the transfer ended after {want - (wanted_end - len(into))} of {want} bytes")
                into += piece
                self.bytes_received += len(piece)
                if self.downlink is not None:  # read no faster than the emulated link: TCP's window then slows it
                    await paced(self.downlink, len(piece))

    def _wrong_size(self, size: int) -> str:
        return (f"{self.url} serves another file: {size} bytes, where the host's model has {self.manifest.size} "
                f"bytes")


def _total_size(content_range: str) -> int | None:
    m = _CONTENT_RANGE.fullmatch(content_range.strip())
    return int(m.group(3)) if m and m.group(3) != "*" else None


def _retryable(exc: Exception) -> bool:
    """A broken, refused or stalled transfer (worth asking again), not a URL serving the wrong thing."""
    import aiohttp

    return isinstance(exc, (OSError, asyncio.TimeoutError, NetworkError, aiohttp.ClientError))


def _describe(exc: Exception) -> str:
    return "no byte for the stall limit" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
