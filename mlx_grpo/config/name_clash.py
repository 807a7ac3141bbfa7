"""Packages on PyPI that install the same import name (`mlx_grpo`) or command (`mlx-grpo`) as this project.

PyPI's `mlx-guided-grpo` (2.x) ships an import package `mlx_grpo` and a console script `mlx-grpo`: with
both installed, whichever was installed last overwrites the other's files, silently. We keep our names
(they came first here and are what the docs say) and detect the other package instead: `mlx-grpo doctor`
lists it as something to fix, and every `mlx-grpo` command warns once. One metadata lookup per name
(about 1 ms), so it is cheap enough to run on every command. Imports no mlx.
"""

from __future__ import annotations

from importlib import metadata

CLASHING = ("mlx-guided-grpo",)  # distributions known to install mlx_grpo/ and the mlx-grpo command


def clashing_packages() -> list[str]:
    """'name version' of each installed distribution that clashes with ours."""
    found = []
    for name in CLASHING:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return found


def clash_message(package: str) -> str:
    name = package.split()[0]
    return (f"the package {package} is also installed: it uses the same import name (mlx_grpo) and command "
            f"(mlx-grpo) as this project, so one overwrites the other's files. Remove it with `pip uninstall "
            f"{name}` (then reinstall this one: pip install -e .), or keep each in its own virtual environment")
