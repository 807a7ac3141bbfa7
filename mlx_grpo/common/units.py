"""The one memory unit mlx-grpo reports in: GB = 10**9 bytes; and counts as people read them.

Every `*_gb` metric, the memory plan, `mlx-grpo bench` and the docs use it, so a plan line and the
metrics of the same run compare directly. (A Mac sold as "16 GB" has 16 GiB = 17.2 GB of memory.)
"""

GB = 1e9
GIB = 2**30


def plural(count: int, noun: str) -> str:
    """'1 step', '2 steps'."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def gb_text(size_bytes: float) -> str:
    """'0.7 GB'; '<0.1 GB' for a size that one decimal would print as 0.0."""
    return f"{size_bytes / GB:.1f} GB" if size_bytes >= 0.05 * GB else "<0.1 GB"


def count_text(count: float) -> str:
    """A parameter count at three significant digits: '1.05M', '137M', '7.62B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.0f}"
