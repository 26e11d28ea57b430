"""`python -m progdesc ...`: the progdesc command."""
import sys

from progdesc.cli import main

sys.exit(main())
