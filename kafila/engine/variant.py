"""A second llama-cpp-python build beside the main one, for rings of unlike builds.

The variant holds only the ``llama_cpp`` package (built from source with its own CMake flags)
under the user cache directory, keyed by version and flags, and built once. A process runs on
it with the variant directory first on PYTHONPATH; everything else comes from the main venv.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_VERSION = "0.3.36"
# This CPU's own kernels (AVX-512 where it has them): a build whose identity differs from the
# portable GGML_NATIVE=OFF build that `make setup` makes.
DEFAULT_CMAKE_ARGS = "-DGGML_NATIVE=ON"
# Added to every build's flags, outside the cache key: only the libraries llama_cpp loads are built,
# not libmtmd (multimodal) nor llama.cpp's `common` (see llama_lean.cmake). The Makefile's setup adds them too.
LEAN_CMAKE = Path(__file__).with_name("llama_lean.cmake")


def lean_cmake_args() -> str:
    return f"-DLLAVA_BUILD=OFF {shlex.quote(f'-DCMAKE_PROJECT_INCLUDE={LEAN_CMAKE}')}"


def variant_dir(version: str = DEFAULT_VERSION, cmake_args: str = DEFAULT_CMAKE_ARGS,
                root: Path | None = None) -> Path:
    """Where the build for this version and these flags lives (it need not exist yet)."""
    if root is None:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("kafila")) / "llama-builds"
    key = hashlib.sha256(f"{version}\0{cmake_args}".encode()).hexdigest()[:12]
    return root / f"llama-cpp-python-{version}-{key}"


def is_built(path: Path) -> bool:
    """True when a finished build is there (the marker is written last)."""
    return (path / ".kafila-built").is_file() and (path / "llama_cpp" / "__init__.py").is_file()


def build(path: Path, version: str = DEFAULT_VERSION, cmake_args: str = DEFAULT_CMAKE_ARGS,
          jobs: int = 2) -> Path:
    """Build llama-cpp-python `version` with `cmake_args` into `path` once (minutes)."""
    if is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + f".building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    env = dict(os.environ, CMAKE_ARGS=f"{cmake_args} {lean_cmake_args()}", CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))
    # --no-deps: numpy, jinja2 and the rest come from the running venv; only llama_cpp differs.
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-cache-dir",
           "--no-binary", "llama-cpp-python", "--target", str(staging),
           f"llama-cpp-python=={version}"]
    subprocess.run(cmd, env=env, check=True)
    (staging / ".kafila-built").write_text(f"{version}\n{cmake_args}\n")
    try:
        staging.rename(path)
    except OSError:  # another process finished the same build first: use theirs
        shutil.rmtree(staging, ignore_errors=True)
        if not is_built(path):
            raise
    return path


def env_for(path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python imports ``llama_cpp`` from the variant at `path`."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return env


def main(argv: list[str] | None = None) -> int:
    """``python -m kafila.engine.variant [--cmake-args ARGS] [--version V] [--root DIR]``: build, print the path."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kafila.engine.variant", description=__doc__)
    ap.add_argument("--version", default=DEFAULT_VERSION)
    ap.add_argument("--cmake-args", default=DEFAULT_CMAKE_ARGS)
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")))
    ap.add_argument("--root", type=Path, help="build under this folder, not the user cache (e.g. to time a build)")
    args = ap.parse_args(argv)
    path = variant_dir(args.version, args.cmake_args, args.root)
    print(build(path, args.version, args.cmake_args, args.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
