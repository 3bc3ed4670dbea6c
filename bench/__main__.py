"""`python -m bench` from the repo root runs the suite (same flags as `lazycandle bench`)."""
import sys

from . import main

sys.exit(main())
