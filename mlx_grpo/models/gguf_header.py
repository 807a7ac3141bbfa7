"""A GGUF file's header, read with every count and length checked against the file's size.

The header is the metadata (key, type, value), then one entry per tensor (name, dims, type, offset). A
damaged or hostile header can claim 2^62 tensors, a 2^60-byte key or an array longer than the file; each such
claim is refused here, as "cannot be read as GGUF", before any loop or allocation trusts it and before any
library sees the file. So is a tensor table that would load wrong weights without a word: a tensor of an
unknown type or of rows that are not whole blocks, at an offset off the file's alignment, past the end of
the file, or sharing bytes with another tensor (llama.cpp refuses all of these too). Tensor data is not
touched: `TensorInfo` says where each tensor's bytes are.

The block sizes of the tensor types come from the `gguf` package (llama.cpp's own Python library).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..common.errors import UserError
from ..common.terminal import terminal_safe

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 counted in 32 bits; llama.cpp has not written it since 2023
STRING, ARRAY = 8, 9
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
ARRAY_DTYPES = {0: "u1", 1: "i1", 7: "bool"}  # numpy's names where struct's differ
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # name length, dims count, one dim, type, offset
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 2  # arrays of arrays: no file llama.cpp writes goes deeper


def _shown(name: str) -> str:
    """A key or tensor name read from the file, as a message quotes it: control characters escaped (a damaged
    header's names hold newlines and escape sequences) and cut to 60 characters."""
    safe = terminal_safe(name).replace("\n", "\\x0a").replace("\t", "\\x09")  # one line, whatever it holds
    return safe if len(safe) <= 60 else safe[:57] + "..."


class Corrupt(Exception):
    """What is wrong with the bytes; becomes the UserError's detail."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: GGUF lists the innermost dimension first
    type_id: int
    offset: int  # from the start of the file
    nbytes: int  # whole blocks of a type the gguf package knows (read_header refuses anything else)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    file_size: int


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes, size: int):
        self.data, self.pos, self.size = data, 0, size

    def need(self, count: int, what: str) -> None:
        if count < 0 or self.pos + count > self.size:
            raise Corrupt(f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)")

    def scalar(self, fmt: str, what: str) -> Any:
        width = struct.calcsize(fmt)
        self.need(width, what)
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += width
        return value

    def string(self, what: str) -> str:
        length = self.scalar("<Q", what)
        self.need(length, f"{what} ({length} bytes)")
        raw = self.data[self.pos:self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Corrupt(f"{what} at byte {self.pos - length} is not UTF-8") from None

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind == STRING:
            return self.string(what)
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], what)
        if kind != ARRAY or depth >= MAX_NESTING:
            raise Corrupt(f"{what}: value type {kind} is not a GGUF type")
        item, count = self.scalar("<I", what), self.scalar("<Q", what)
        if item in SCALARS:  # one read for the whole array (a 262k-token vocabulary's scores)
            dtype = np.dtype(ARRAY_DTYPES.get(item, SCALARS[item]))
            self.need(count * dtype.itemsize, f"{what} ({count} values)")
            values = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return values.tolist()
        self.need(count * 8, f"{what} ({count} items)")  # every string or array item takes 8 bytes at least
        return [self.value(item, what, depth + 1) for _ in range(count)]


def read_header(path: Path) -> Header:
    """The file's metadata and tensor table; a UserError, one line, for anything that is not a whole GGUF
    header (or that claims more than the file holds)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                raise Corrupt("the file is empty")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(_Cursor(data, size))
    except Corrupt as err:
        raise UserError(f"{path}: cannot be read as GGUF ({err}; an incomplete download or a corrupt file?)") from None
    except (OSError, ValueError) as err:  # ValueError: mmap of a special file
        raise UserError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None


def _parse(cursor: _Cursor) -> Header:
    cursor.need(24, "the 24-byte header")
    if bytes(cursor.data[:4]) != MAGIC:
        raise Corrupt("it does not start with 'GGUF'")
    cursor.pos = 4
    version = cursor.scalar("<I", "version")
    if version not in VERSIONS:
        raise Corrupt(f"GGUF version {version}; versions {' and '.join(map(str, VERSIONS))} are read")
    tensor_count, kv_count = cursor.scalar("<Q", "tensor count"), cursor.scalar("<Q", "metadata count")
    if tensor_count * MIN_TENSOR_BYTES + kv_count * MIN_KV_BYTES > cursor.size - cursor.pos:
        raise Corrupt(f"the header claims {tensor_count} tensors and {kv_count} metadata entries, more than "
                      f"its {cursor.size} bytes can hold")
    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        key = cursor.string(f"metadata key {index}")
        metadata[key] = cursor.value(cursor.scalar("<I", f"type of '{_shown(key)}'"), f"metadata '{_shown(key)}'")
    infos = []
    for index in range(tensor_count):
        name = cursor.string(f"tensor name {index}")
        dims_count = cursor.scalar("<I", f"dims of tensor '{_shown(name)}'")
        if not 1 <= dims_count <= MAX_DIMS:
            raise Corrupt(f"tensor '{_shown(name)}' has {dims_count} dimensions (1 to {MAX_DIMS} are possible)")
        dims = [cursor.scalar("<Q", f"dims of tensor '{_shown(name)}'") for _ in range(dims_count)]
        type_id = cursor.scalar("<I", f"type of tensor '{_shown(name)}'")
        offset = cursor.scalar("<Q", f"offset of '{_shown(name)}'")
        infos.append((name, dims, type_id, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise Corrupt(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, dims, type_id, offset in infos:
        if any(d <= 0 or d > cursor.size * 8 for d in dims) or np.prod(dims, dtype=object) > cursor.size * 8:
            raise Corrupt(f"tensor '{_shown(name)}' claims shape {dims}, more than the file can hold")
        nbytes = tensor_bytes(dims, type_id)
        if nbytes is None:
            raise Corrupt(f"tensor '{_shown(name)}' has {_type_problem(dims, type_id)}")
        if offset % alignment:
            raise Corrupt(f"tensor '{_shown(name)}' starts at data offset {offset}, not a multiple of the file's "
                          f"alignment ({alignment})")
        start = data_start + offset
        if start + nbytes > cursor.size:
            raise Corrupt(f"tensor '{_shown(name)}' ({nbytes} bytes at byte {start}) runs past the end of the file "
                          f"({cursor.size} bytes)")
        if name in tensors:
            raise Corrupt(f"tensor '{_shown(name)}' is listed twice")
        tensors[name] = TensorInfo(name, tuple(reversed(dims)), type_id, start, nbytes)
    _check_no_overlap(list(tensors.values()))
    return Header(version, metadata, tensors, cursor.size)


def _check_no_overlap(tensors: list[TensorInfo]) -> None:
    """Each tensor's bytes its own: two tensors sharing bytes (llama.cpp refuses such a file) would load
    as weights that are not what was trained."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    for before, after in zip(ordered, ordered[1:]):
        if after.offset < before.offset + before.nbytes:
            raise Corrupt(f"tensors '{before.name}' (bytes {before.offset} to {before.offset + before.nbytes}) and "
                          f"'{after.name}' (from byte {after.offset}) overlap")


def _type_problem(dims: list[int], type_id: int) -> str:
    """Why `tensor_bytes` has no size for this tensor: an unknown type, or rows that are not whole blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][0]
    except (ValueError, KeyError):
        return f"type {type_id}, which is not a ggml tensor type"
    return (f"type {type_name(type_id)} in blocks of {block} values, but its rows hold {dims[0]} values "
            "(not whole blocks)")


def tensor_bytes(dims: list[int], type_id: int) -> int | None:
    """Bytes of a tensor of `dims` (innermost first) in ggml type `type_id`; None for a type unknown to the
    gguf package or a row that is not whole blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None
    if dims[0] % block:
        return None
    return int(np.prod(dims, dtype=object)) // block * block_bytes


def type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"
