"""Synthetic tasks with known answers, used to build and train the embedded default model."""
