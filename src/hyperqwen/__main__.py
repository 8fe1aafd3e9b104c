import sys

from hyperqwen.cli import main

sys.exit(main())
