"""Tasks: the answer format every task's completions are written in and its one correctness check
(`answer_format.py`); the synthetic arithmetic task the embedded default model is built and trained on."""
