"""Optional training features from the TinyZero/verl family: adaptive generation window, S-GRPO
early exits, per-token entropy dumps. Each is off by default; see docs/TRAINING_EXTRAS.md."""
