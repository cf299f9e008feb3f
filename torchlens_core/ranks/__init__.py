"""Rank traces of one distributed job: diagnose them (``tl.merge_report``) and merge them (``tl.merge_ranks``).

Framework-neutral: it reads what a backend recorded while ``tl.distributed``
was armed (:mod:`torchlens_core.ranks.notes` has the contract), so traces
loaded where the framework is not installed merge too. docs/distributed.md
describes the merged trace.
"""

from torchlens_core.ranks.findings import KINDS, MergeReport, RankFinding, RankMergeError
from torchlens_core.ranks.merge import merge_ranks
from torchlens_core.ranks.report import merge_report

__all__ = ["KINDS", "MergeReport", "RankFinding", "RankMergeError", "merge_ranks", "merge_report"]
