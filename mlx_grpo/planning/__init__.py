"""The planning wing: what a run needs and what this machine can give, known before a model loads.

`plan` predicts a run's peak memory by phase and `fitting` turns a config into one that fits; `presets` holds
published model shapes, `roofline` the step's FLOPs and the machine's ceilings; `machine`, `chips`, `blas` and
`tf32` say what this computer is (memory, chip, BLAS library, what float32 means on its GPU).
"""
