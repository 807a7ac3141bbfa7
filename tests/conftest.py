import ctypes
import os
import sys
from pathlib import Path

import pytest

from mlx_grpo.planning import blas

# tests share small helpers (tiny_models) that are not part of the package
sys.path.insert(0, str(Path(__file__).parent))

# Train in-process on the BLAS the `mlx-grpo` command uses (it re-executes itself with OpenBLAS preloaded):
# MLX's Linux wheel otherwise runs fp32 matmuls on its reference BLAS, ~30x slower, which made the suite's
# in-process runs most of its time. Loaded with global symbols before anything imports mlx, MLX's matmuls
# bind to it as they would under LD_PRELOAD. MLX_GRPO_OPENBLAS=0 tests on the reference BLAS instead.
# The suite runs on two workers (pyproject's addopts): one BLAS thread each keeps them from fighting over the
# cores (OpenBLAS's threads spin while they wait). Set before OpenBLAS starts; the commands tests launch inherit it.
# pytest-xdist hands its workers the controller's terminal size as COLUMNS and LINES; the commands the tests run
# would take them for the user's (a piped table wraps at COLUMNS): the tests that want a width set their own.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
if sys.platform.startswith("linux") and os.environ.get(blas.SWITCH, "1") != "0" and blas.find_openblas():
    assert "mlx.core" not in sys.modules, "conftest.py must load OpenBLAS before mlx is imported"
    ctypes.CDLL(blas.find_openblas(), mode=os.RTLD_GLOBAL)


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """(run directory, metrics.jsonl records) of a short run of the default config."""
    import short_runs

    return short_runs.default_run(tmp_path_factory.mktemp("default-run"))


@pytest.fixture(scope="session")
def extras_run(tmp_path_factory):
    """The run directory of a short run with every training extra on."""
    import short_runs

    return short_runs.extras_run(tmp_path_factory.mktemp("extras-run"))
