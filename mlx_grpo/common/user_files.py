"""Reading the files a user points at (configs, sweeps, rubrics, alert rules): one reader per kind.

- `read_user_text(path, what)`: the text of a regular file, or a UserError naming the file: missing, not a
  regular file (a directory, a FIFO, a device such as /dev/zero: opening those would hang or never end),
  too large for its kind, or not UTF-8 (with the line of the first bad byte).
- `parse_yaml(text, source)`: safe-loaded YAML, or a UserError `source:line: ...` for YAML that does not
  parse, a value PyYAML cannot build (`2020-02-30`, `!!float abc`), a key given twice in one mapping (the
  last would win silently), nesting deeper than MAX_DEPTH (PyYAML itself recurses, so a file nested 5000
  deep ended in a RecursionError) and more than MAX_NODES values (PyYAML builds ~360 bytes of Python
  objects per value: a 6 MB list took 2.2 GB).
- `load_yaml(text, source)`: the same, but a syntax error stays a yaml.YAMLError (for `--set`, where text
  that is not YAML is taken as a string).
- `read_yaml_file(path, what)`: both.

Imports no mlx: the dashboard reads alert rule files through this.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, yaml_error
from .terminal import terminal_safe

MAX_DEPTH = 64  # nesting levels a config, sweep, rubric or alert file may have (ours use 3)
MAX_BYTES = 1 << 20  # ours are a few KB: a 1 MB config is a mistake (a dataset or a model file named by accident)
MAX_NODES = 100_000  # values in one YAML document (a sweep of 10,000 trials needs far fewer)


def read_regular_bytes(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file. OSError for anything else: a FIFO or a device is opened
    non-blocking and refused before a byte is read (reading one would hang or never end)."""
    with open_regular(path) as f:
        return f.read(limit)


def open_regular(path: str | os.PathLike):
    """A regular file opened for binary reading; OSError (FileNotFoundError when missing) for anything
    else, decided without blocking: a FIFO opened plainly would wait for a writer forever."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(21, "is a directory") if stat.S_ISDIR(mode) else OSError(22, "not a regular file")
    return os.fdopen(fd, "rb")


def read_user_text(path: str | os.PathLike, what: str, limit: int = MAX_BYTES) -> str:
    """A user's file as UTF-8 text; one UserError naming the file (and line) when it cannot be."""
    path = Path(path)
    try:
        data = read_regular_bytes(path, limit + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except OSError as err:
        reason = err.strerror or str(err)
        raise UserError(f"{path}: cannot read the {what}: {reason}" +
                        ("; pass a file" if err.errno in (21, 22) else "")) from None
    if len(data) > limit:
        raise UserError(f"{path}: too large for a {what} (more than {limit / (1 << 20):g} MB); is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x})") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping, naming both lines."""

    source = "YAML"
    nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise UserError(f"{self.source}:{self.peek_event().start_mark.line + 1}: more than {MAX_NODES:,} "
                            "values in one YAML file; is it the right file?")
        return super().compose_node(parent, index)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        # PyYAML's own errors on values it cannot build (AttributeError: `!!timestamp` on text that is no date)
        except (ValueError, KeyError, TypeError, OverflowError, AttributeError) as err:
            kind = node.tag.rpartition(":")[2]
            shown = terminal_safe(repr(node.value))[:60] if isinstance(node.value, str) else "this value"
            where = self.source if self.source.startswith("--set ") else f"{self.source}:{node.start_mark.line + 1}"
            raise UserError(f"{where}: not valid YAML: {shown} is not a valid "
                            f"{kind} ({terminal_safe(str(err))[:80]}); quote it to keep it as text") from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first_line.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    continue
                line = key_node.start_mark.line + 1
                if earlier is not None:
                    raise UserError(f"{self.source}:{line}: key '{key}' is given twice "
                                    f"(lines {earlier} and {line}); keep one")
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)



def _check_depth(data: Any, source: str) -> None:
    level, seen = [data], set()
    for depth in range(MAX_DEPTH + 1):
        children = []
        for item in level:
            if isinstance(item, (dict, list)) and id(item) not in seen:  # aliases can make cycles
                seen.add(id(item))
                children.extend(item.values() if isinstance(item, dict) else item)
        if not children:
            return
        level = children
    raise UserError(f"{source}: YAML nested more than {MAX_DEPTH} levels deep")


def load_yaml(text: str, source: str) -> Any:
    """Safe-loaded YAML; duplicate keys and deep nesting are a UserError, a syntax error a yaml.YAMLError."""
    loader = _StrictLoader(text)
    loader.source = source
    try:
        data = loader.get_single_data()
    except RecursionError:
        raise UserError(f"{source}: YAML nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()
    _check_depth(data, source)
    return data


def parse_yaml(text: str, source: str) -> Any:
    """YAML text parsed strictly (a key given twice is refused); errors name `source` and the line."""
    try:
        return load_yaml(text, source)
    except yaml.YAMLError as err:
        raise yaml_error(source, err) from None


def read_yaml_file(path: str | os.PathLike, what: str) -> Any:
    """A user's YAML file, read and parsed with `read_user_text` and `parse_yaml`."""
    return parse_yaml(read_user_text(path, what), str(path))
