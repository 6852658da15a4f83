"""`python -m gradscape`: the `gradscape` command."""
import sys

from gradscape.app.cli import main

sys.exit(main())
