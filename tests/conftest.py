import sys
from pathlib import Path

# tests share small helpers (tiny_models) that are not part of the package
sys.path.insert(0, str(Path(__file__).parent))
