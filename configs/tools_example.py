"""Tools for `tools: [tools_example.py:convert_units]`: plain functions with type hints and a docstring whose
Args section describes each parameter (the model reads the schema built from them). Return a string (anything
else is sent as JSON). Raise to report a failure: the model reads the error as the tool's result."""


def convert_units(value: float, unit: str) -> str:
    """Convert a length to metres.

    Args:
        value: The length to convert.
        unit: Its unit: one of "mm", "cm", "km", "in", "ft", "mi".
    """
    factors = {"mm": 0.001, "cm": 0.01, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "mi": 1609.344}
    if unit not in factors:
        raise ValueError(f"unknown unit {unit!r}; use one of {', '.join(factors)}")
    return f"{value * factors[unit]:g} m"
