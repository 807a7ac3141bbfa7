"""The run's own alert rules replayed over its metric records as a reader reads them back.

The dashboard hands an `AlertReplay` to each `RunReader`: the reader reads, the replay analyses. Alerts a
replay raises stand beside alerts.jsonl's (the trainer's copy wins), so a run trained with alerts off, or
read while a rule is about to fire, still shows what its rules say. Imports no mlx.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...common.errors import UserError
from ..alerts.alert import Alert
from ..alerts.config import default_rules, load_alert_rules
from ..alerts.engine import AlertEngine
from ..metrics.other_names import canonical_record


class AlertReplay:
    """One run's rules (from its config: the built-in ones, its alerts file, or none) over its records."""

    def __init__(self) -> None:
        self._engine: AlertEngine | None = None
        self._decided = False  # whether the rules were looked up (or the replay given up)

    def restart(self) -> None:
        """metrics.jsonl was truncated or replaced: the rules start over from its first record."""
        self._engine, self._decided = None, False

    def give_up(self) -> None:
        """The reader skipped the start of the run: rules need it (baselines, windows), so none are replayed."""
        self._engine, self._decided = None, True

    def check(self, config: Mapping[str, Any], records: Sequence[dict]) -> tuple[list[Alert], str | None]:
        """The alerts the records raise, and a note when the run's rules cannot be replayed (said once)."""
        note = None
        if not self._decided:
            self._decided = True
            self._engine, note = self._rules_engine(config)
        if self._engine is None:
            return [], note
        return [alert for rec in records for alert in self._engine.check(canonical_record(rec))], note

    @staticmethod
    def _rules_engine(config: Mapping[str, Any]) -> tuple[AlertEngine | None, str | None]:
        if config.get("enable_alerts") is False:
            return None, None
        rules_file = config.get("alerts_file")
        if rules_file is not None and not isinstance(rules_file, str):
            return None, f"alert rules not evaluated here: alerts_file is {rules_file!r}"
        try:
            rules = load_alert_rules(rules_file) if rules_file else default_rules()
        except UserError as err:
            return None, f"alert rules not evaluated here: {err}"
        return AlertEngine(rules), None
