"""``python -m parallel.plan model=... topology=...``: the planner without workers."""

import sys

from parallel.plan.cli import main

sys.exit(main())
