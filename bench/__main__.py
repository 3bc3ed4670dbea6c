"""`python -m bench` from the repo root runs the suite (same flags as `lazycandle bench`)."""
import sys

from . import run_cli

sys.exit(run_cli(sys.argv[1:]))
