"""What several test modules share: independent references, the S3 server, checks of Kafka's files.

Test modules import from here, never from each other."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository root (tests/helpers/__init__.py is two levels below it)."""
