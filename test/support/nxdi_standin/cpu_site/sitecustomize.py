"""Installs the test-only Neuron stand-ins (``nxdi_standin.cpu_roots``) at interpreter start
when ``NXDI_SRC`` and ``NXD_SRC`` are set; a no-op otherwise."""

import os
import sys

if os.environ.get("NXDI_SRC") and os.environ.get("NXD_SRC"):
    _TEST_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, _TEST_DIR)
    from nxdi_standin import cpu_roots

    cpu_roots.install(os.environ["NXDI_SRC"], os.environ["NXD_SRC"])
    sys.path.remove(_TEST_DIR)
