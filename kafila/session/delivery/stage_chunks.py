"""Which chunks of the whole model a stage needs, and its cut from a model that holds only those.

Cutting a stage reads the GGUF header and the byte ranges of the tensors it keeps (model.cut.source_ranges),
nothing else. So a member that fetches those chunks of the whole file into its ChunkStore can cut its
stage there, without the rest of the model: for a middle stage that is its share of the blocks plus a
header of a few MB. The header's own length is learnt from the header, so it is read first, from the
file's verified start, fetching twice as many chunks each round until it parses (header_wanted).
"""

from __future__ import annotations

from pathlib import Path

from kafila.errors import SessionError
from kafila.model.cut import Progress, StageSpec, source_ranges, write_stage
from kafila.model.gguf_file import GGUFFile, HeaderIncomplete
from kafila.session.delivery.model_chunks import ChunkStore, UnverifiedRead
from kafila.session.delivery.stage_files import manifest_for
from kafila.session.protocol.manifest import StageManifest
from kafila.session.protocol.model_manifest import ModelManifest


def read_header(store: ChunkStore) -> GGUFFile | None:
    """The model's GGUF header from the store's verified start; None while it ends inside the header.

    It is parsed from a chunk of the start, then twice as much each time that ends inside it, so memory holds
    about the header, never the whole verified file."""
    size = store.manifest.chunk_size
    while True:
        prefix = store.prefix(size)
        if not prefix:
            return None
        try:
            return GGUFFile.from_prefix(f"model {store.manifest.sha256[:12]}", prefix, store.manifest.size)
        except HeaderIncomplete:
            if len(prefix) < size:
                return None  # the verified start ends inside the header: more chunks are needed
            size *= 2


def header_wanted(store: ChunkStore) -> list[int]:
    """The chunks to fetch next to read the header: as many again as the verified start holds (the first chunk
    alone at first); empty once the header parses."""
    if read_header(store) is not None:
        return []
    n = store.prefix_chunks()
    return store.missing(range(n, min(max(2 * n, 1), store.manifest.n_chunks)))


def stage_chunks(header: GGUFFile, manifest: ModelManifest, spec: StageSpec) -> list[int]:
    """Every chunk of the whole file that cutting `spec` reads: the header's (up to where tensor data
    begins) and those holding the tensors the stage keeps, in order."""
    wanted = set(manifest.covering(0, header.data_start))
    for start, end in source_ranges(header.tensors.values(), spec):
        wanted.update(manifest.covering(start, end))
    return sorted(wanted)


def cut_stage(store: ChunkStore, spec: StageSpec, dest: Path, progress: Progress | None = None) -> Path:
    """Cut `spec` from the store into `dest`; UnverifiedRead (before anything is read) when any chunk the cut
    would read is not verified, so a hole's zeros can never become a stage's weights."""
    header = read_header(store)
    if header is None:
        raise UnverifiedRead("the model's header has not arrived yet: no stage can be cut from it")
    lacking = store.missing(stage_chunks(header, store.manifest, spec))
    if lacking:
        raise UnverifiedRead(f"stage {spec.tag} needs {len(lacking)} chunks of the model not verified here "
                             f"(first: {lacking[:8]})")
    return write_stage(store.path, spec, dest, progress)


def cut_and_check(store: ChunkStore, spec: StageSpec, dest: Path, expected: StageManifest,
                  progress: Progress | None = None) -> Path:
    """cut_stage, then the cut checked against the host's stage manifest, as a delivered stage is."""
    path = cut_stage(store, spec, dest, progress)
    got = manifest_for(path, progress=progress)
    if got != expected:
        path.unlink(missing_ok=True)
        raise SessionError(f"the stage {spec.tag} cut from the model's verified chunks has sha256 {got.sha256} "
                           f"({got.size} bytes), but the host's manifest says {expected.sha256} "
                           f"({expected.size} bytes): is this Kafila the host's version?")
    return path
