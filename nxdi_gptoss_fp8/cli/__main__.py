"""``python -m nxdi_gptoss_fp8.cli``: the console script."""

import sys

from . import main

sys.exit(main())
