"""The menagerie: every architecture the frameworks' own registries list, traced and verified one by one.

``python -m bench.menagerie --backend torch`` enumerates the entries
(:mod:`bench.menagerie.entries`), runs each in its own forked subprocess under a
time and a memory limit (:mod:`bench.menagerie.run`; as tasks on a Dask cluster's
workers with ``--dask``, :mod:`bench.menagerie.cluster`), verifies it with the shared
conformance checks (:mod:`bench.menagerie.verify`) and appends one JSON line per
entry to the results file; ``python -m bench.menagerie.report`` turns that file
into ``docs/menagerie.md``. Exclusions, each with its reason, live in
:mod:`bench.menagerie.exclusions`.
"""
