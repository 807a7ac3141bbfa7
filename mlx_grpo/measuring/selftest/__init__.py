"""`mlx-grpo selftest`: prove the product on this machine, and write one report to send back.

Each check runs the project's own code (the trainer, its update, the memory plan, resume, bench) and
compares two ways of computing the same thing, two devices, or a prediction with a measurement, against a
stated tolerance. A check passes, fails, or is skipped with its reason, and records the dtype and device it
ran in. The report is rewritten before and after every check, so a run that the OS or Metal ends leaves
the checks so far and the name of the one that was running. docs/PLATFORMS.md explains each line and which
check catches which known Mac defect. One module a family of checks (common: what they share;
runner: the whole test and its report).

Test-only switches (never set by the product): `MLX_GRPO_SELFTEST_PERTURB=<check>` perturbs the first side
of that check's comparison (a relative 1e-3), and `MLX_GRPO_SELFTEST_ABORT=<check>` writes MLX's Metal error
to file descriptor 2 and ends the process with SIGABRT when that check starts, as a Metal abort does: tests
use them to prove each check can fail and that an abort leaves a report and the cause in the log.
"""

from .common import ABORT_ENV, METAL_ABORT_LINE, PERTURB_ENV, Check, small_config
from .runner import CHECKS, QUICK_SKIP, run_selftest

__all__ = ["ABORT_ENV", "CHECKS", "METAL_ABORT_LINE", "PERTURB_ENV", "QUICK_SKIP", "Check", "run_selftest",
           "small_config"]
