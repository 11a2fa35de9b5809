"""`python -m extender` is the `extender` command."""

import sys

from extender.cli import main

sys.exit(main())
