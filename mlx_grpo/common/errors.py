"""The one exception type for user mistakes.

A UserError is printed as a single line and exits non-zero; anything else is a
bug and keeps its traceback.
"""


from pathlib import Path


def install_hint(extra: str) -> str:
    """The pip command that installs an optional extra. mlx-grpo is installed from its checkout (it is not on
    PyPI, where `pip install 'mlx-grpo[...]'` finds nothing), so the hint names this checkout."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install -e '.[{extra}]' in the mlx-grpo checkout"


class UserError(Exception):
    """A problem the user can fix: bad config, missing file, malformed data."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def yaml_error(source: object, err: Exception) -> UserError:
    """One line for a YAML file that does not parse: `file:line: not valid YAML: problem`."""
    mark = getattr(err, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else str(source)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or ["unreadable"])[0]
    return UserError(f"{where}: not valid YAML: {problem}")
