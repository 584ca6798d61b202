"""`python -m dyndq.cli`: the same as `python -m dyndq`."""
import sys

from dyndq.cli import main

sys.exit(main())
