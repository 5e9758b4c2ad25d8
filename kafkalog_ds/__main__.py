"""`python -m kafkalog_ds ...` runs the `kafkalog` command."""

import sys

from .cli import main

sys.exit(main())
