"""`python -m protoflask`: the `protoflask` command."""

import sys

from .cli.main import main

sys.exit(main())
