"""The one memory unit mlx-grpo reports in: GB = 10**9 bytes.

Every `*_gb` metric, the memory plan, `mlx-grpo bench` and the docs use it, so a plan line and the
metrics of the same run compare directly. (A Mac sold as "16 GB" has 16 GiB = 17.2 GB of memory.)
"""

GB = 1e9
GIB = 2**30
