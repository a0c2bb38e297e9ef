"""``python -m nxdi_gptoss_fp8``: the ``nxdi-gptoss-fp8`` command, for hosts where the console
script is not on PATH (a virtualenv that is not activated, ``pip install --user``)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nxdi_gptoss_fp8"))
