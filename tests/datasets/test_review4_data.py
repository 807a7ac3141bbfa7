"""Review 4's U10 and U11: `plan` says when it cannot read the dataset (it planned at max_prompt_length), and
the lines for a UTF-16 file without its mark, a .tsv file and a checkpoint reached through a link say what
is wrong."""

from __future__ import annotations

import pytest

from mlx_grpo.checkpoint import DamagedCheckpoint, read_state
from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.data import read_dataset_file

ROW = '{"prompt": "caf\u00e9 1+1", "answer": "2"}\n'


def test_plan_notes_a_dataset_it_cannot_read(tmp_path, capsys):
    bad = tmp_path / "excel.jsonl"
    bad.write_bytes(ROW.encode("cp1252"))
    code = main(["plan", "--set", f"dataset={bad}"])
    err = capsys.readouterr().err
    assert code in (0, 1) and "note: the dataset could not be read" in err and "not UTF-8 text (byte 0xe9)" in err
    assert "prompts planned at max_prompt_length" in err


def test_utf16_without_a_mark_and_tsv_files_are_named_for_what_they_are(tmp_path):
    utf16 = tmp_path / "u16.jsonl"
    utf16.write_bytes(ROW.encode("utf-16-le"))
    with pytest.raises(UserError, match="UTF-16 text without a byte-order mark"):
        read_dataset_file(utf16, "auto", "prompt", "answer")
    tsv = tmp_path / "rows.tsv"
    tsv.write_text("prompt\tanswer\n1+1\t2\n")
    with pytest.raises(UserError, match=r"rows.tsv: tab-separated files are not read; save it as .csv"):
        read_dataset_file(tsv, "auto", "prompt", "answer")


def test_a_checkpoint_reached_through_a_link_is_called_a_link(tmp_path):
    real = tmp_path / "elsewhere" / "step_2"
    real.mkdir(parents=True)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_2").symlink_to(real)
    with pytest.raises(DamagedCheckpoint, match="a symbolic link"):
        read_state(tmp_path / "checkpoints" / "step_2")
