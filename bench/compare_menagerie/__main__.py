"""``python -m bench.compare_menagerie``: see :mod:`bench.compare_menagerie.cli`."""

from bench.compare_menagerie.cli import main

raise SystemExit(main())
