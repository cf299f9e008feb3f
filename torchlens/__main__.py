"""``python -m torchlens``: the ``torchlens`` command (torchlens/cli.py), for an environment without its script."""

from __future__ import annotations

import sys

from torchlens.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m torchlens"))
