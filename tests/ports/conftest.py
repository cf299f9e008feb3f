"""tests/ports holds scripts, not tests: each builder imports a framework and runs as ``python build_<fw>.py OUT``."""

collect_ignore_glob = ["*.py"]
