"""Use the system OpenBLAS on Linux: MLX's Linux CPU wheel links a slow reference BLAS.

Preloading OpenBLAS at process start makes fp32 matmul ~30x faster there; loading it
later from Python helps far less, so the `mlx-grpo` command re-executes itself once
with LD_PRELOAD set. MLX_GRPO_OPENBLAS=0 turns this off. This module imports no mlx.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)
SWITCH = "MLX_GRPO_OPENBLAS"
INSTALL_HINT = "sudo apt-get install libopenblas0-pthread  (Debian/Ubuntu)"


def find_openblas() -> str | None:
    for candidate in CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    return None


def preloaded_openblas() -> str | None:
    """The OpenBLAS library this process preloads, if any."""
    for entry in os.environ.get("LD_PRELOAD", "").split(":"):
        if "openblas" in entry:
            return entry
    return None


def reexec_with_openblas(command: list[str] | None = None) -> None:
    """Replace this process with itself plus OpenBLAS preloaded, when that applies.

    `command` is what to re-run after the interpreter: by default the `mlx-grpo` command
    line; a benchmark script passes its own path and arguments.
    """
    if not sys.platform.startswith("linux") or os.environ.get(SWITCH, "1") == "0" or preloaded_openblas():
        return
    library = find_openblas()
    if library is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    env[SWITCH] = "1"
    command = command if command is not None else ["-m", "mlx_grpo.cli", *sys.argv[1:]]
    os.execve(sys.executable, [sys.executable, *command], env)
