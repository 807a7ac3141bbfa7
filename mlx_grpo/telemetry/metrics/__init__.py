"""Metric names and the numbers behind them: the catalogue, its charts, the names that cross modules,
other tools' names, a step's record, reward statistics, system samples."""
