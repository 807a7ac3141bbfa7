"""Colours shared by the dashboard's widgets (runs, alert levels, run states)."""

RUN_COLORS = ("#4ea1ff", "#ff9f43", "#7bd88f", "#d98cff", "#ffd166", "#4dd0e1", "#ff6b9a", "#b0b0b0")

LEVEL_COLORS = {"info": "#4ea1ff", "warning": "#ffb020", "error": "#ff5555"}
LEVEL_RANK = {"info": 0, "warning": 1, "error": 2}

STATE_COLORS = {
    "live": "#7bd88f",
    "starting": "#4dd0e1",
    "stalled": "#ffb020",
    "crashed": "#ff5555",
    "failed": "#ff5555",
    "interrupted": "#ffb020",
    "finished": "#4ea1ff",
    "waiting": "#888888",
}


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


def dim(color: str, amount: float = 0.4) -> str:
    """The colour mixed toward black: raw points under a smoothed line."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(*(int(c * amount) for c in (r, g, b)))
