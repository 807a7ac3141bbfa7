#!/usr/bin/env bash
# Run the fast test suite against the lowest mlx and mlx-lm versions pyproject.toml allows.
#
# The floors are what a user with an older install may have; this proves they work. Run it before every
# release and after raising or lowering a floor (docs/PLATFORMS.md, "Versions"):
#
#   scripts/test_at_floor.sh            # fresh venv in a temporary directory, removed afterwards
#   FLOOR_VENV=/tmp/floor scripts/test_at_floor.sh   # keep (and reuse) the venv
#
# It reads the floors from pyproject.toml, installs the project (".[dev]") with those two pinned, prints the
# versions it got and runs `pytest -m "not slow"`. Exit status is pytest's. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"

read -r mlx_floor mlx_lm_floor < <("$python" - "$root/pyproject.toml" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
def floor(name):
    found = {m.group(1) for d in deps if (m := re.match(rf"{re.escape(name)}(?:\[[^\]]*\])?>=([0-9.]+)", d))}
    if len(found) != 1:
        sys.exit(f"pyproject.toml: expected one floor for {name}, found {sorted(found) or 'none'}")
    return found.pop()
print(floor("mlx"), floor("mlx-lm"))
PY
)
echo "floors from pyproject.toml: mlx ${mlx_floor}, mlx-lm ${mlx_lm_floor}"

venv="${FLOOR_VENV:-}"
if [[ -z "$venv" ]]; then
    venv="$(mktemp -d)/venv"
    trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"

constraints="$(dirname "$venv")/floor-constraints.txt"
{
    echo "mlx==${mlx_floor}"
    echo "mlx-lm==${mlx_lm_floor}"
    # the Linux wheel's CPU backend is a separate package pinned to the same version
    [[ "$(uname)" == Linux ]] && echo "mlx-cpu==${mlx_floor}"
} >"$constraints"

"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -c "$constraints" -e "$root[dev]"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
print("installed:", ", ".join(f"{p} {version(p)}" for p in ("mlx", "mlx-lm", "transformers", "numpy")))
PY

cd "$root"
exec "$venv/bin/python" -m pytest -q -m "not slow" -p no:cacheprovider "$@"
