"""``python -m trainer.report <sweep dir>``: the sweep report."""

import sys

from trainer.report.cli import main

sys.exit(main())
