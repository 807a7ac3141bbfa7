"""Alerts: the engine and its rules, their YAML configuration, and their console lines."""
