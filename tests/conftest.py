import os
import sys

# The shared table of cases (tests/cases.py) is imported as `cases`.
sys.path.insert(0, os.path.dirname(__file__))
