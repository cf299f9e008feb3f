"""One virtual environment per backend: TensorFlow and Paddle crash when imported in one process."""

from __future__ import annotations

import shutil

import nox

nox.options.default_venv_backend = "virtualenv"  # pip-based: takes wheels from the local cache
nox.options.sessions = ["lint", "core", "torch", "jax", "tf", "paddle", "tinygrad"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over everything."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python=PYTHON)
def core(session: nox.Session) -> None:
    """Core tests with no framework installed, plus the third-party numpy plugin through the shared suite."""
    session.install("-e", ".[test]", "-e", "plugins/torchlens-numpy")
    session.run("pytest", "tests", "-q", *session.posargs)
    session.run("pytest", "conformance", "--backend", "numpy", "-q")


@nox.session(python=PYTHON)
def torch(session: nox.Session) -> None:
    """Torch backend tests and the torch conformance zoo (add `-- --runslow` for the 2,000-sample extraction)."""
    session.install("-e", ".[torch,zoo,test,extract]")
    session.run("pytest", "tests", "-q", *session.posargs)
    session.run("pytest", "conformance", "--backend", "torch", "-q")


@nox.session(python=PYTHON)
def jax(session: nox.Session) -> None:
    """JAX backend tests and the JAX conformance zoo."""
    session.install("-e", ".[jax,test]")
    session.run("pytest", "tests", "-q", *session.posargs)
    session.run("pytest", "conformance", "--backend", "jax", "-q")


@nox.session(python=PYTHON)
def tf(session: nox.Session) -> None:
    """TensorFlow backend tests and the Keras/TensorFlow conformance zoo."""
    session.install("-e", ".[tf,test]")
    session.run("pytest", "tests", "-q", *session.posargs)
    session.run("pytest", "conformance", "--backend", "tf", "-q")


@nox.session(python=PYTHON)
def paddle(session: nox.Session) -> None:
    """Paddle backend tests and the Paddle conformance zoo."""
    session.install("-e", ".[paddle,test]")
    session.run("pytest", "tests", "-q", *session.posargs)
    session.run("pytest", "conformance", "--backend", "paddle", "-q")


@nox.session(python=PYTHON)
def tinygrad(session: nox.Session) -> None:
    """tinygrad backend tests and the tinygrad conformance zoo (its CPU device compiles with clang)."""
    if shutil.which("clang") is None:
        session.error("tinygrad's CPU device compiles kernels with clang: apt-get install -y clang")
    session.install("-e", ".[tinygrad,test]")
    session.run("pytest", "tests", "-q", *session.posargs)
    session.run("pytest", "conformance", "--backend", "tinygrad", "-q")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: trace ResNet-18, print the summary, a few lookups and the audit."""
    session.install("-e", ".[torch]")
    session.run("python", "docs/demo.py")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Capture overhead (ResNet-18, GPT-2 small), selective capture, dataset extraction."""
    session.install("-e", ".[torch,zoo,extract]")
    session.run("python", "bench/capture_overhead.py", *session.posargs)
    session.run("python", "bench/selective_capture.py")
    session.run("python", "bench/extract_dataset.py")
