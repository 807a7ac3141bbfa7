"""What a training run prints when its output is not a terminal (a log file, CI, a pipe)."""

from mlx_grpo.run.console import TrainingConsole


def test_lines_are_not_wrapped_when_the_output_is_not_a_terminal(capsys):
    console = TrainingConsole(total_steps=10)
    long_path = "runs/" + "a-very-long-run-directory-name-" * 6
    console.message(f"finished 10 steps in 3 s — run directory: {long_path}")
    console.step(10, {"rewards/total/mean": 1.5, "accuracy/train": 0.5, "throughput/step_tokens_per_s": 1234.0},
                 every=5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(long_path) and len(lines[0]) > 150
    assert lines[1] == "step 10/10  reward +1.500  acc 50%  1,234 tok/s"
