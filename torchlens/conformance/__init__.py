"""The shared conformance suite, installed with TorchLens as a pytest plugin.

A backend's author runs it from the backend's own repository, with no
TorchLens source checkout::

    pytest --torchlens-backend mybackend
    pytest --torchlens-backend mybackend --torchlens-expected-failures xfails.txt

:mod:`torchlens.conformance.plugin` is the pytest plugin (registered under the
``pytest11`` entry point, so pytest loads it by itself; it does nothing unless
``--torchlens-backend`` is given) and :mod:`torchlens.conformance.checks`
holds the checks. Importing this package imports neither pytest nor a
framework. See docs/conformance.md.
"""
