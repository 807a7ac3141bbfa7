"""Every colour the dashboard draws with: runs, alert levels, run states, text and chrome.

Widgets take their colours from here; watch.tcss gets the same values as CSS
variables (`$watch-border`, `$watch-warning`, ...) through `css_variables()`.
"""

RUN_COLORS = ("#4ea1ff", "#ff9f43", "#7bd88f", "#d98cff", "#ffd166", "#4dd0e1", "#ff6b9a", "#b0b0b0")

GOOD = "#7bd88f"          # a correct sample, a positive reward
BAD = "#ff5555"           # a wrong sample, a negative reward
ACCENT = "#4ea1ff"        # one run's trend line, section names
HIGHLIGHT = "#ffd166"     # what the user set: the filter, PAUSED, keys in the help
SPARK = "#ff9f43"         # the system view's sparklines
INK = "#101010"           # text on a coloured badge
MUTED = "#8a8a8a"         # axes, secondary text
FADED = "#9a9a9a"         # an alert that no longer stands
LABEL = "#9aa5b1"         # column headers, tile titles
TEXT = "#c9d1d9"          # chart legends and titles
TEXT_SOFT = "#c0c0c0"     # nested config keys
TEXT_BRIGHT = "#e0e0e0"   # a sample's completion
HEADER_TEXT = "#e6e6e6"
CURSOR_BG = "#2b3a4a"     # the highlighted row of the metrics table
BACKGROUND = "#0f1419"
PANEL = "#1a2129"         # header and dialogs
BORDER = "#3a4450"
GRID = "#2c3540"           # chart gridlines: seen, never read as data

LEVEL_COLORS = {"info": ACCENT, "warning": "#ffb020", "error": BAD}

STATE_COLORS = {
    "live": GOOD,
    "starting": "#4dd0e1",
    "stalled": LEVEL_COLORS["warning"],
    "crashed": BAD,
    "failed": BAD,
    "interrupted": LEVEL_COLORS["warning"],
    "finished": ACCENT,
    "waiting": "#888888",
}


def run_color(index: int) -> str:
    """The colour of run number `index` (the colours repeat after the last)."""
    return RUN_COLORS[index % len(RUN_COLORS)]


def level_color(level: str) -> str:
    """An alert level's colour; a level this version does not know is drawn as info."""
    return LEVEL_COLORS.get(level, LEVEL_COLORS["info"])


def state_color(state: str) -> str:
    """A run state's colour; an unknown state is drawn as waiting."""
    return STATE_COLORS.get(state, STATE_COLORS["waiting"])


def dim(color: str, amount: float = 0.4) -> str:
    """The colour mixed toward black: raw points under a smoothed line."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(*(int(c * amount) for c in (r, g, b)))


def css_variables() -> dict[str, str]:
    """The palette as the stylesheet's variables, prefixed so they never replace Textual's theme variables."""
    named = {
        "background": BACKGROUND, "panel": PANEL, "border": BORDER, "label": LABEL, "text": TEXT,
        "text-bright": TEXT_BRIGHT, "header-text": HEADER_TEXT, "highlight": HIGHLIGHT,
        "warning": LEVEL_COLORS["warning"], "error": LEVEL_COLORS["error"],
    }
    return {f"watch-{name}": value for name, value in named.items()}
