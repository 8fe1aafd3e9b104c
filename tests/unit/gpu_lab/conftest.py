import sys
from pathlib import Path

# The lab lives in scripts/gpu_lab (developer tooling, not the runtime package).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
