import sys

from hyperqwen.prepare.cli import main

sys.exit(main())
