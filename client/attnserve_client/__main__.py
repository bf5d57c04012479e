"""``python -m attnserve_client``: the same command line as ``attnserve-client``."""

import sys

from attnserve_client.cli import main

sys.exit(main())
