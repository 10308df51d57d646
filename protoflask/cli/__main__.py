"""`python -m protoflask.cli`: the `protoflask` command."""

import sys

from .main import main

sys.exit(main())
