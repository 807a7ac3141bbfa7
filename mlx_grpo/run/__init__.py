"""The run wing: a training run's life from its opening to its last checkpoint.

`loop` is the run read as a page (`train`: open, run the steps, decide after each, finish); `opening`
assembles a run (its sinks, its recorder, its trainer), `resume` reads where a run left off, `signals` and
`run_lock` guard a running one, `console` prints it, `export` fuses and writes the trained model, `replay`
scores a finished run's completions again.
"""
