"""`python -m dyndq`: the dyndq command line."""
import sys

from dyndq.cli import main

sys.exit(main())
