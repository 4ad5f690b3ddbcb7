"""``python -m rlcore`` is the ``rlcore`` command."""

import sys

from rlcore.cli import main

sys.exit(main())
