"""The shared conformance checks, as installed with TorchLens (torchlens/conformance/checks.py).

Run here with ``pytest conformance --backend NAME``; anywhere else, with
``pytest --torchlens-backend NAME``. One copy of the checks: this module only
collects them, and conftest.py hands this checkout's options and expected
failures to the plugin that parametrizes them.
"""

from torchlens.conformance.checks import *  # noqa: F403 - the checks and their fixture, collected here
