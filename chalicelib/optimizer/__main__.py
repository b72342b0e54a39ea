"""``python -m chalicelib.optimizer``: see :mod:`chalicelib.optimizer.cli`."""

import sys

from chalicelib.optimizer.cli import main

sys.exit(main())
