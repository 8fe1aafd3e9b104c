import sys

from hyperqwen.bench.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
