"""`python -m hyperqwen.dev test-models ...` (same as `hyperqwen dev test-models ...`)."""

import sys

from hyperqwen.dev import main

if __name__ == "__main__":
    sys.exit(main(["dev", *sys.argv[1:]]))
