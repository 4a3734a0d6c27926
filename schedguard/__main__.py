"""``python -m schedguard``: the same as the ``schedguard`` command."""

import sys

from schedguard.cli import main

sys.exit(main())
