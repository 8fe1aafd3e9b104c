"""`python -m hyperqwen.monitor [flags]`: the same as `hyperqwen monitor [flags]`."""

import argparse
import sys

from hyperqwen.monitor import add_arguments, run

parser = argparse.ArgumentParser(prog="hyperqwen monitor", allow_abbrev=False)
add_arguments(parser)
sys.exit(run(parser.parse_args()))
