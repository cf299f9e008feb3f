"""The Keras 3 pairs' side on the torch backend: importing this module selects it (before Keras is imported).

See :mod:`bench.compare_menagerie.keras_side`.
"""

from bench.compare_menagerie.keras_side import backend_build

build = backend_build("torch")
