"""Finding ptxas (the CUDA toolkit's assembler) for the tests that assemble PTX; no GPU needed."""
import os
import shutil
from pathlib import Path


def find_ptxas():
    """(path, None), or (None, why) when $PTXAS names no executable, or (None, None) when none is installed."""
    env = os.environ.get("PTXAS")
    if env:
        if os.access(env, os.X_OK):
            return env, None
        return None, f"$PTXAS is set to {env}, which is not an executable"
    found = shutil.which("ptxas")
    if found:
        return found, None
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(Path(root) / "bin" / "ptxas", os.X_OK):
            return str(Path(root) / "bin" / "ptxas"), None
    return None, None
