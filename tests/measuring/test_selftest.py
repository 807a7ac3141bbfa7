"""`mlx-grpo selftest`: every check passes or is skipped with a reason here, the report is one JSON file with
a readable summary rewritten after every check, and each check fails when the defect it guards against is put
back (docs/PLATFORMS.md, "Which check catches which defect")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.cli import main
from mlx_grpo.measuring.selftest import (
    ABORT_ENV,
    CHECKS,
    PERTURB_ENV,
    common,
    devices,
    environment,
    memory,
    numerics,
    real_model,
    runner,
)
from mlx_grpo.planning import machine

QUICK = ("precision", "shared_prompts", "chunked_head", "plan_counts")


def run_selftest(tmp_path, capsys, only: tuple[str, ...]) -> tuple[int, dict, str]:
    out = tmp_path / "report.json"
    code = main(["selftest", "--out", str(out), "--log", str(tmp_path / "log.txt"),
                 "--skip", ",".join(c for c in CHECKS if c not in only)])
    return code, json.loads(out.read_text()), capsys.readouterr().out


def test_the_quick_checks_pass_and_the_report_says_what_ran_where_and_what_to_send(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, report, printed = run_selftest(tmp_path, capsys, QUICK)
    assert code == 0 and report["passed"] and report["finished"] and report["running"] is None
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert [status[name] for name in QUICK] == ["pass"] * len(QUICK)
    assert all(status[name] == "skip" for name in CHECKS if name not in QUICK)
    ran = [c for c in report["checks"] if c["name"] in QUICK]
    assert all(c["device"] in ("cpu", "gpu") and c["dtype"] for c in ran)
    env = report["environment"]
    assert env["mlx"] and env["backend"] in ("cpu", "metal")
    if sys.platform != "darwin":  # said, not left out
        assert env["power_source"] == env["low_power_mode"] == env["thermal_state"] == machine.NOT_ON_THIS_OS
    assert report["summary"][0].startswith("mlx-grpo selftest") and "PASSED" in report["summary"][0]
    assert report["summary"][-1].startswith("send back: ") and "report.json" in report["summary"][-1]
    assert "PASS  shared_prompts" in printed and "send back:" in printed


@pytest.mark.parametrize("broken", ("shared_prompts", "chunked_head"))
def test_a_broken_comparison_fails_with_a_line_naming_it(tmp_path, capsys, monkeypatch, broken):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PERTURB_ENV, broken)
    code, report, printed = run_selftest(tmp_path, capsys, QUICK)
    assert code == 1 and not report["passed"]
    failed = [line for line in printed.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and broken in failed[0] and "tolerance" in failed[0]


def test_b3_float32_by_default_on_a_gpu_fails_precision(monkeypatch):
    from mlx_grpo.models import policy as models

    monkeypatch.setattr(models, "resolve_dtype", lambda config, gpu=None: "float32")
    check = numerics.check_precision()
    assert check.status == "fail" and "LoRA on the gpu: float32 (want bfloat16)" in check.detail


def test_n4_moe_adapters_counted_as_one_dense_mlp_fail_plan_counts(monkeypatch):
    from mlx_grpo.planning.plan import ModelShape

    def dense_only(self, rank, num_layers):  # the plan before N4's fix
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        linears = [(self.hidden, q), (self.hidden, kv), (self.hidden, kv), (q, self.hidden),
                   (self.hidden, self.intermediate), (self.hidden, self.intermediate), (self.intermediate, self.hidden)]
        return num_layers * rank * sum(i + o for i, o in linears)

    assert memory.check_plan_counts().status == "pass"
    monkeypatch.setattr(ModelShape, "lora_parameters", dense_only)
    check = memory.check_plan_counts()
    assert check.status == "fail" and check.measured["llama"]["planned_lora"] == check.measured["llama"]["lora"]


def test_m2_experts_left_out_of_the_plan_fail_plan_counts(monkeypatch):
    from mlx_grpo.planning.plan import ModelShape

    monkeypatch.setattr(ModelShape, "block_parameters", lambda self: self.hidden * self.head_dim * (
        2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.intermediate + 2 * self.hidden)
    assert memory.check_plan_counts().status == "fail"


def test_m4_a_gather_in_the_shared_prompt_copy_shows_as_a_scatter_add_in_the_lora_backward(monkeypatch):
    """resume's promise (bit for bit on Metal) rests on the LoRA backward having no scatter-add; the check
    lists them, so a gather put back fails `resume` with its name."""
    from mlx_grpo import rollout
    from mlx_grpo.trainer import Trainer

    trainer = Trainer.build(common.small_config(use_lora=True, lora_rank=4, lora_layers=-1), Path.cwd())
    batch = common.sample_batch(trainer)[0]
    assert numerics.backward_scatter_adds(trainer, batch) == []
    monkeypatch.setattr(rollout, "repeat_rows", lambda x, rows: x[mx.array(rows)])
    assert numerics.backward_scatter_adds(trainer, batch) == ["Scatter Sum"]


def test_n1_full_fine_tuning_differentiates_through_a_scatter_add_which_the_docs_state():
    """Why `resume` runs LoRA: full fine-tuning's embedding gradient is a scatter-add (docs/PLATFORMS.md)."""
    from mlx_grpo.trainer import Trainer

    trainer = Trainer.build(common.small_config(), Path.cwd())
    assert numerics.backward_scatter_adds(trainer, common.sample_batch(trainer)[0]) == ["Scatter Sum"]
    text = (Path(__file__).parents[2] / "docs" / "PLATFORMS.md").read_text()
    assert "full fine-tuning" in text and "last bits" in text


def test_m7_a_run_without_its_cache_limit_fails_memory(tmp_path, monkeypatch):
    env_limit = environment.cache_limit_now()
    check = memory.check_memory(Path.cwd(), tmp_path, env_limit)
    assert check.status == "pass", check.detail
    assert check.measured["cache_limit_read_back"] == check.measured["cache_limit_planned"]
    monkeypatch.setattr(machine, "cache_limit_for", lambda resident, peak: None)  # train no longer sets it
    (tmp_path / "runs").rename(tmp_path / "first")
    check = memory.check_memory(Path.cwd(), tmp_path, env_limit)
    mx.set_cache_limit(env_limit)
    assert check.status == "fail" and "cache limit read back" in check.detail


def test_the_device_comparison_passes_on_one_device_and_fails_when_one_side_is_off(monkeypatch):
    """On a Mac `devices` compares the Metal GPU with the CPU; here both sides are the CPU, which proves the
    comparison and its tolerances, and a perturbed first side (a broken kernel) fails every row."""
    from mlx_grpo.trainer import Trainer

    def compare():
        trainer = Trainer.build(common.small_config(), Path.cwd())
        batch, advantages = common.sample_batch(trainer)
        return devices.compare_devices(mx.cpu, mx.cpu, Path.cwd(), trainer, batch, advantages)

    check = compare()
    assert check.status == "pass" and set(check.measured) == {"log-probs float32", "log-probs bfloat16",
                                                               "log-probs 4-bit", "update float32",
                                                               "update bfloat16 LoRA"}
    assert all(row["difference"] == 0.0 for row in check.measured.values())  # one device: the same sums
    monkeypatch.setenv(PERTURB_ENV, "devices")
    check = compare()
    assert check.status == "fail" and check.detail.count("tol") == 5 and "FAILED" in check.detail
    assert "log-probs TF32" not in check.detail  # no Neural Accelerators: no TF32 row
    if not mx.metal.is_available():
        assert devices.check_devices(Path.cwd()).status == "skip"


def test_an_m5s_tf32_fails_the_float32_rows_unless_the_selftest_turns_it_off_and_its_own_row_measures_it(
        monkeypatch):
    """An M5's GPU computes float32 products in TF32 unless MLX_ENABLE_TF32=0 (read once, at MLX's first
    matmul). Stood in for here: the first side rounds every matmul's operands to TF32 (tf32.tf32_rounding)
    while the flag is not 0, as MLX does on Neural Accelerators. Flag unset: the float32 rows fail, as on a
    healthy M5 before the fix. With the selftest's own `full_float32()`: they pass, and the TF32 row (the
    first side's default float32) reports the difference, within twice TF32's rounding emulated on the CPU."""
    from mlx_grpo.planning import tf32
    from mlx_grpo.trainer import Trainer

    first = mx.new_stream(mx.cpu)
    logprobs_on, sgd_step = devices.logprobs_on, devices.sgd_step

    def like_an_m5(function):
        def side(device, *args):
            if device == first and os.environ.get(tf32.ENV) != "0":
                with tf32.tf32_rounding():
                    return function(device, *args)
            return function(device, *args)
        return side

    monkeypatch.setattr(devices, "logprobs_on", like_an_m5(logprobs_on))
    monkeypatch.setattr(devices, "sgd_step", lambda config, *args: (like_an_m5(
        lambda device, *rest: sgd_step(config, *rest)))(mx.default_stream(mx.cpu), *args))

    def compare(with_tf32_row: bool = False, gpu_bits: int = tf32.TF32_BITS):
        trainer = Trainer.build(common.small_config(), Path.cwd())
        batch, advantages = common.sample_batch(trainer)

        def gpu_default():  # the child process's figure on an M5: float32 as MLX runs it without the flag
            with tf32.tf32_rounding(), pytest.MonkeyPatch.context() as patch:
                patch.setattr(tf32, "TF32_BITS", gpu_bits)
                return logprobs_on(first, trainer.policy.model, batch, trainer.config.temperature)

        return devices.compare_devices(first, mx.cpu, Path.cwd(), trainer, batch, advantages,
                                        tf32=gpu_default if with_tf32_row else None)

    monkeypatch.delenv(tf32.ENV, raising=False)
    before_the_fix = compare()
    assert before_the_fix.status == "fail" and "FAILED: log-probs float32" in before_the_fix.detail, \
        before_the_fix.detail
    assert before_the_fix.measured["log-probs float32"]["difference"] > 1e-3  # ~4e-3: tens of times 1e-4
    monkeypatch.setattr(os, "environ", dict(os.environ))  # full_float32 sets it: keep it out of other tests
    assert tf32.full_float32() is None and os.environ[tf32.ENV] == "0"

    fixed = compare(with_tf32_row=True)
    rows = fixed.measured
    assert fixed.status == "pass", fixed.detail
    assert rows["log-probs float32"]["difference"] == 0.0 and rows["update float32"]["difference"] == 0.0
    tf32_row = rows["log-probs TF32 (11 bits)"]
    assert 1e-3 < tf32_row["difference"] <= tf32_row["tolerance"] < 0.05, tf32_row
    assert "log-probs TF32 (11 bits)" in fixed.detail
    coarser = compare(with_tf32_row=True, gpu_bits=8)  # a GPU rounding to 8 bits, not 11: the TF32 row fails
    assert coarser.status == "fail" and coarser.detail.endswith("FAILED: log-probs TF32 (11 bits)"), coarser.detail


@pytest.fixture()
def smollm2():
    from mlx_grpo.common.errors import UserError
    from mlx_grpo.models.smollm2 import smollm2_path

    try:
        return smollm2_path(download=True)
    except UserError as err:  # offline: nothing to test against
        pytest.skip(str(err))


SMOLLM2_ROWS = ("SmolLM2 log-probs float32, fused attention", "SmolLM2 LoRA gradient through the 4-bit base",
                "SmolLM2 log-probs bfloat16 on the 4-bit base vs float32")


@pytest.mark.slow  # SmolLM2 loaded 4 times, bf16 forward passes on the CPU: minutes
def test_the_real_kernel_rows_pass_on_one_device_and_each_fails_with_a_kernel_off(smollm2, monkeypatch):
    """`devices` on SmolLM2 (head dim 64: Metal's fused attention; a 4-bit base; the quantized matmul's
    backward), both sides the CPU here. Metal's quantized kernels accumulate in float32 where MLX's CPU
    accumulates bf16 in bf16 (2.4 nats on this model): the first side does as Metal does. Then every row
    fails with kernels broken on the first side only: attention off by 1e-3 (the only kernel of the float32
    row), the quantized matmul's bf16 sums rounded as the CPU rounds them, its backward off by 1%."""
    first = mx.new_stream(mx.cpu)
    quantized_matmul, attention = mx.quantized_matmul, mx.fast.scaled_dot_product_attention
    broken = set()

    def on_first() -> bool:
        return mx.default_stream(mx.cpu) == first

    def qmm(x, w, **kwargs):
        if not on_first() or (x.dtype == mx.float32 and "backward" not in broken):
            return quantized_matmul(x, w, **kwargs)
        if x.dtype == mx.float32:  # a backward kernel 1% off
            @mx.custom_function
            def forward(x):
                return quantized_matmul(x, w, **kwargs)

            @forward.vjp
            def backward(primals, cotangent, output):
                return (quantized_matmul(cotangent, w, **{**kwargs, "transpose": not kwargs["transpose"]}) * 1.01,)

            return forward(x)
        if "bf16 sums" in broken:  # the CPU's own bf16 accumulation
            return quantized_matmul(x, w, **kwargs)
        up = {k: v.astype(mx.float32) if k in ("scales", "biases") and v is not None else v
              for k, v in kwargs.items()}
        return quantized_matmul(x.astype(mx.float32), w, **up).astype(x.dtype)  # Metal: float32 sums

    def sdpa(q, k, v, *args, **kwargs):
        out = attention(q, k, v, *args, **kwargs)
        return out * (1 + 1e-3) if on_first() and "attention" in broken else out

    monkeypatch.setattr(mx, "quantized_matmul", qmm)
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", sdpa)
    rows = devices.compare_real_kernels(first, mx.cpu, Path.cwd())
    assert set(rows) == set(SMOLLM2_ROWS)
    assert all(r["difference"] <= r["tolerance"] for r in rows.values()), rows
    float32, gradient, bf16 = (rows[name] for name in SMOLLM2_ROWS)
    assert float32["difference"] == 0.0 and gradient["difference"] == 0.0  # one device: the same sums
    # bf16 activations, scales and biases over 30 blocks: 0.21 nats measured here, the same weights computed plain
    # in bf16 0.26 (tolerance 0.52); the CPU's own bf16 sums in the quantized matmul move them by 2.4
    assert 0.01 < bf16["difference"] <= bf16["tolerance"] < 1.0, bf16
    assert float32["tolerance"] < 1e-3 and gradient["tolerance"] < 1e-3
    broken.update(("attention", "backward", "bf16 sums"))  # the float32 row can fail only by attention
    rows = devices.compare_real_kernels(first, mx.cpu, Path.cwd())
    assert all(rows[name]["difference"] > rows[name]["tolerance"] for name in SMOLLM2_ROWS), rows


def test_a_check_that_raises_keeps_its_whole_error_and_the_report_keeps_the_log_tail(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def broken():
        raise RuntimeError("first line\nsecond line: the detail a maintainer needs")

    monkeypatch.setattr(runner, "check_precision", broken)
    code, report, _ = run_selftest(tmp_path, capsys, ("precision", "shared_prompts"))
    assert code == 1
    check = report["checks"][0]
    assert check["status"] == "fail" and "second line" in check["detail"]
    assert "Traceback" in check["error"] and "second line: the detail" in check["error"]
    assert isinstance(report["log_tail"], list)


def test_an_abort_mid_check_leaves_the_report_so_far_and_a_stack_in_the_log(tmp_path):
    """A Metal abort (out of memory, the GPU watchdog) ends the process past Python: the report written before
    the check still names it, and faulthandler puts the stack into the log."""
    env = {**os.environ, ABORT_ENV: "shared_prompts"}
    skip = ",".join(c for c in CHECKS if c not in ("precision", "shared_prompts"))
    result = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "selftest", "--skip", skip], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    report = json.loads((tmp_path / "mlx-grpo-selftest.json").read_text())
    assert report["running"] == "shared_prompts" and not report["passed"] and not report["finished"]
    assert [c["name"] for c in report["checks"]] == ["precision"]
    assert "STOPPED during 'shared_prompts'" in report["summary"][0]
    assert "send back" in report["summary"][-1]
    log = (tmp_path / "mlx-grpo-selftest.log").read_text()
    assert "Fatal Python error: Aborted" in log
    # MLX's own message, written natively to file descriptor 2, is in the log (the cause), not lost on a terminal
    assert common.METAL_ABORT_LINE in log and common.METAL_ABORT_LINE not in result.stderr


def test_a_read_only_directory_is_one_line_naming_the_report(tmp_path, capsys, monkeypatch):
    if os.geteuid() == 0:  # root writes anywhere: a directory that is not one stands in
        monkeypatch.chdir(tmp_path)
        code = main(["selftest", "--out", str(tmp_path / "missing" / "report.json")])
    else:
        tmp_path.chmod(0o500)
        monkeypatch.chdir(tmp_path)
        code = main(["selftest"])
        tmp_path.chmod(0o700)
    err = capsys.readouterr().err
    assert code == 2 and "cannot write its report" in err and "Traceback" not in err


def test_quick_leaves_out_the_two_checks_that_train(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    code = main(["selftest", "--quick", "--out", str(out), "--skip",
                 ",".join(c for c in CHECKS if c not in ("precision", "real_model", "learning"))])
    report = json.loads(out.read_text())
    status = {c["name"]: c for c in report["checks"]}
    assert code == 0 and status["precision"]["status"] == "pass"
    for name in ("real_model", "learning"):
        assert status[name]["status"] == "skip" and "--quick" in status[name]["detail"]


def test_an_unknown_check_to_skip_is_one_line(capsys):
    assert main(["selftest", "--skip", "warp_drive"]) == 2
    assert "unknown check 'warp_drive'" in capsys.readouterr().err


@pytest.mark.slow
def test_m10_a_quantized_base_left_in_its_file_dtype_fails_real_model(monkeypatch):
    """SmolLM2's GGUF stores float16 scales; a model whose dtype is not set keeps them (M10)."""
    import mlx.nn as nn

    monkeypatch.setattr(nn.Module, "set_dtype", lambda self, dtype, predicate=None: None)
    check = real_model.check_real_model(Path.cwd())
    assert check.status == "fail" and "frozen weights in" in check.detail


@pytest.mark.slow
def test_every_check_but_the_speed_goals_passes_or_skips_with_reasons_here(tmp_path, capsys, monkeypatch):
    """`bench` compares speeds, which a shared CI machine cannot promise (a fresh-clone run failed it); the
    speed goals are measured and reported by `mlx-grpo bench` itself, not asserted here."""
    monkeypatch.chdir(tmp_path)
    checked = tuple(c for c in CHECKS if c != "bench")
    code, report, _ = run_selftest(tmp_path, capsys, checked)
    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    assert next(c for c in report["checks"] if c["name"] == "bench")["status"] == "skip"
    assert all(c["status"] in ("pass", "skip") and c["detail"] for c in report["checks"]), report["summary"]
    assert code == 0
    assert np.isfinite(next(c for c in report["checks"] if c["name"] == "real_model")["measured"]["losses"]).all()
