"""The coordinator's offer of public URLs of its model: the manifest members check chunks against, and the URLs
that serve the same file.

A URL is offered only after the coordinator fetched its first chunk and it matched (UrlSource.check): one that
serves another file, or answers nothing, is left out with one line saying why, and members get their stages
from the coordinator as before. A model read from the Hugging Face cache records where it came from (its
`models--ORG--NAME/snapshots/REVISION/FILE` path), so that URL is offered without being named.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from kafila.session.delivery.model_chunks import model_manifest
from kafila.session.delivery.url_source import UrlSource
from kafila.session.protocol.model_manifest import ModelSource
from kafila.session.stoppable import run_stoppable

CHECK_S = 30.0  # a URL that cannot send its first chunk in this long is not offered


def hugging_face_url(model: Path) -> str | None:
    """The `resolve` URL of a file in the Hugging Face hub cache (from its snapshot path), else None."""
    parts = Path(os.path.abspath(model)).parts
    for i, part in enumerate(parts):
        if part.startswith("models--") and "--" in part[8:] and i + 3 < len(parts) and parts[i + 1] == "snapshots":
            org, name = part[8:].split("--", 1)
            return f"https://huggingface.co/{org}/{name}/resolve/{parts[i + 2]}/{'/'.join(parts[i + 3:])}"
    return None


def offered_urls(model: Path, named: Sequence[str]) -> tuple[str, ...]:
    """The URLs named with --source, and the Hugging Face URL the model came from when it did."""
    hub = hugging_face_url(model)
    return (*named, hub) if hub is not None and hub not in named else tuple(named)


async def offer_source(root: Path, model: Path, urls: Sequence[str],
                       tell: Callable[[str], None]) -> ModelSource | None:
    """The model's manifest with those of `urls` that serve this very file (None when none does); `tell` hears
    each URL offered or left out, in one line."""
    manifest = await run_stoppable(partial(model_manifest, root, model))
    good, hub = [], hugging_face_url(model)
    for url in urls:
        try:
            async with UrlSource(url, manifest) as source:
                await asyncio.wait_for(source.check(), CHECK_S)
        except Exception as exc:  # whatever a URL does wrong, the members do without it
            tell(f"not offering {url} to members: {exc or f'no first chunk in {CHECK_S:g} s'}")
            continue
        where = " (where the Hugging Face cache says the model came from)" if url == hub else ""
        tell(f"members fetch their stages from {url}{where}, each chunk checked against this model's sha256s")
        good.append(url)
    return ModelSource(manifest, tuple(good)) if good else None
