#!/usr/bin/env python3
"""XZatoma: an autonomous AI agent for the terminal.

This file only starts it. The program is xzatoma_core.py (the command line, configuration, providers, the
agent loop, the session and chat; xzatoma_tools.py and xzatoma_store.py below it), imported from its cached
bytecode: `python3 xzatoma.py` compiles the file it is given at every start and caches nothing, which for
7,000 lines cost 8-9x a bare interpreter's start; these few lines cost nothing. `import xzatoma` gives the
program itself: this module steps aside for it in sys.modules.
"""

import os
import sys

_here = os.path.dirname(os.path.realpath(__file__))
if _here not in sys.path:  # `python3 -I xzatoma.py`: isolated mode leaves the script's own directory out
    sys.path.insert(0, _here)

import xzatoma_core  # noqa: E402

if __name__ == "__main__":
    sys.exit(xzatoma_core.main())
sys.modules[__name__] = xzatoma_core
