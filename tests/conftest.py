import sys
from pathlib import Path

import pytest

# tests share small helpers (tiny_models) that are not part of the package
sys.path.insert(0, str(Path(__file__).parent))


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
