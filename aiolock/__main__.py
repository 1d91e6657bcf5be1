"""``python -m aiolock``: the same as the ``aiolock`` command."""

import sys

from ._cli import main

sys.exit(main())
