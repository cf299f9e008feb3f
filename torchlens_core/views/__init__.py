"""Views: read-only ways to look at a finished trace.

The summary and printouts (:mod:`.summary`), drawings (:mod:`.draw`), pandas
tables (:mod:`.tables`), per-op metadata worked out on demand
(:mod:`.metadata`: config, distances), FLOP formulas (:mod:`.flops`) and
structural hashes (:mod:`.hashing`). None of them changes a trace.
"""
