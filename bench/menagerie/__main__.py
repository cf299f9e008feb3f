"""``python -m bench.menagerie``: see :mod:`bench.menagerie.run`."""

from bench.menagerie.run import main

raise SystemExit(main())
