"""Influence geometry: receptive fields (back toward an input) and projective fields (forward), see docs/fields.md.

Layered above ``grads`` (a field's ``check`` measures the gradient support)
and below ``views``. ``op.receptive_field`` / ``op.projective_field`` import
this package when read.
"""

from torchlens_core.fields.field import ProjectiveField, ReceptiveField, projective_field, receptive_field
from torchlens_core.fields.records import BOUNDED, EXACT, NOT_WINDOWED, AxisBox, Box, FieldCheck, FieldStatus

__all__ = [
    "BOUNDED",
    "EXACT",
    "NOT_WINDOWED",
    "AxisBox",
    "Box",
    "FieldCheck",
    "FieldStatus",
    "ProjectiveField",
    "ReceptiveField",
    "projective_field",
    "receptive_field",
]
