"""`mlx-grpo doctor`: what MLX runs on here, how fast its matmuls are, and what to fix."""

from __future__ import annotations

import argparse
import platform
import sys

USES_MLX = True

SLOW_GFLOPS = 20.0  # reference BLAS measures ~5 GFLOP/s on a CPU core; OpenBLAS or Accelerate 100+
LOW_MEMORY = 2 * 2**30
VERSIONS = ("mlx", "mlx-lm", "mlx-grpo", "numpy", "tensorboardX", "textual", "wandb")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="also check this run config's model dtype")


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def diagnose(config_path: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """(rows of what was found, fixes to make)."""
    import mlx.core as mx
    import psutil

    from ..planning.machine import cpu_model

    fixes: list[str] = []
    metal = mx.metal.is_available()
    device = mx.default_device()
    on_cpu = device.type == mx.cpu
    backend = "Metal GPU" if metal else "CPU"
    rows = [("backend", f"MLX {mx.__version__}, {backend} backend" + ("" if metal else " (no Metal GPU here)"))]
    if sys.platform == "darwin" and platform.machine() == "arm64" and not metal:
        fixes.append("MLX sees no Metal GPU on this Mac: install the macOS wheel with `pip install -U mlx`")
    kind = "cpu" if on_cpu else "gpu"
    rows.append(("device", f"{kind}: {cpu_model()}, {psutil.cpu_count(logical=False)} cores"))
    _blas(rows, fixes, on_cpu)
    _run_config(config_path, rows, fixes, on_cpu)
    _machine(rows, fixes, metal)
    return rows, fixes


def _blas(rows: list[tuple[str, str]], fixes: list[str], on_cpu: bool) -> None:
    """The matmul speed and the BLAS MLX's CPU operations use; on Linux, how to get OpenBLAS."""
    from ..planning import blas
    from ..planning.machine import blas_in_use, matmul_gflops

    info = blas_in_use()
    gflops = matmul_gflops()  # on the default device: the GPU when MLX has one, where no BLAS is involved
    if on_cpu:
        rows.append(("BLAS", f"{info.name}, fp32 matmul {gflops:.0f} GFLOP/s"))
    else:
        rows.append(("matmul", f"Metal GPU, fp32 {gflops:.0f} GFLOP/s"))
        rows.append(("BLAS", f"{info.name} (MLX's CPU operations)"))
    if info.library:
        rows.append(("", info.library))
    if sys.platform.startswith("linux") and info.name != "OpenBLAS":
        if info.openblas_found and info.disabled_by_switch:
            rows.append(("", f"OpenBLAS is available ({info.openblas_found}) but not used"))
            fixes.append(f"unset {blas.SWITCH} (it is 0) to let mlx-grpo preload OpenBLAS: 5.7x faster steps")
        elif info.openblas_found:
            rows.append(("", f"OpenBLAS is available ({info.openblas_found}) but not loaded"))
            fixes.append("run through the `mlx-grpo` command (it preloads OpenBLAS), or set "
                         f"LD_PRELOAD={info.openblas_found} when calling python yourself")
        else:
            fixes.append(f"install OpenBLAS for 5.7x faster steps: {blas.INSTALL_HINT}")
    if on_cpu and gflops < SLOW_GFLOPS and not fixes:
        fixes.append(f"fp32 matmul runs at {gflops:.0f} GFLOP/s, far below a fast BLAS; check other load on this "
                     "machine")


def _run_config(config_path: str | None, rows: list[tuple[str, str]], fixes: list[str], on_cpu: bool) -> None:
    """The dtype the run config computes in, and what float32 is on this device."""
    from ..config.train_config import load_config

    config = load_config(config_path) if config_path else load_config()
    source = config_path or "default run config"
    from ..models.policy import resolve_dtype

    dtype = resolve_dtype(config)
    dtype_row = f"{dtype} ({source}{', from auto' if config.dtype == 'auto' else ''})"
    if on_cpu and dtype != "float32":
        fixes.append(f"{source}: set dtype: auto or float32; on the CPU backend {dtype} matmuls skip BLAS and run "
                     "slower")
    rows.append(("dtype", dtype_row))
    from ..planning.tf32 import float32_state

    rows.append(("float32", float32_state().describe()))  # an M5's GPU computes float32 products in TF32


def _machine(rows: list[tuple[str, str]], fixes: list[str], metal: bool) -> None:
    """Memory, versions, packages that clash with ours, the shipped default model."""
    import psutil

    from ..models.policy import DEFAULT_MODEL_DIR
    from ..planning.machine import device_info, package_version

    memory = psutil.virtual_memory()
    working_set = device_info().get("max_recommended_working_set_size", 0) if metal else None
    rows.append(("memory", f"{_gib(memory.total)} total, {_gib(memory.available)} available"
                 + (f"; Metal working set {_gib(working_set)}" if metal else "")))
    if memory.available < LOW_MEMORY:
        fixes.append(f"only {_gib(memory.available)} of memory is free: close other programs or use a smaller batch")

    versions = [f"python {platform.python_version()}"]
    versions += [f"{name} {package_version(name) or '(not installed)'}" for name in VERSIONS]
    rows.append(("versions", ", ".join(versions)))
    rows.append(("os", platform.platform()))

    from ..config.name_clash import clash_message, clashing_packages

    for package in clashing_packages():
        rows.append(("name clash", package))
        fixes.append(clash_message(package))

    if (DEFAULT_MODEL_DIR / "config.json").is_file():
        rows.append(("default model", str(DEFAULT_MODEL_DIR)))
    else:
        rows.append(("default model", f"missing ({DEFAULT_MODEL_DIR})"))
        fixes.append("the shipped default model is missing: reinstall mlx-grpo, or pass a model directory")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ..telemetry.output import output_console

    rows, fixes = diagnose(args.config)
    console = output_console()
    table = Table(show_header=False, box=None, title="mlx-grpo doctor", title_justify="left", title_style="bold")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if not fixes:
        console.print("[green]nothing to fix[/green]")
        return 0
    console.print("[bold]to fix:[/bold]")
    for fix in fixes:
        console.print(f"  [yellow]-[/yellow] {fix}")
    return 1
