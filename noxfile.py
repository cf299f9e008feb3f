"""One virtual environment per backend: TensorFlow and Paddle crash when imported in one process."""

from __future__ import annotations

import os
import pathlib
import shutil

import nox

nox.options.default_venv_backend = "virtualenv"  # pip-based: takes wheels from the local cache
nox.options.sessions = ["lint", "core", "torch", "jax", "tf", "paddle", "tinygrad", "compare"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
# The tests run on one worker process per core (pytest-xdist), at most four: a worker of the torch session holds
# up to about 2.6 GB. Each test is independent of the others (its files in tmp_path, its ports picked free).
WORKERS = ("-n", str(min(4, os.cpu_count() or 1)))

# backend -> (extras to install, a program its tests need and how to get it)
BACKENDS = {
    "torch": ("torch,zoo,test,extract,tables", None),
    "jax": ("jax,test,extract", None),
    "tf": ("tf,test,extract", None),
    "paddle": ("paddle,test,extract", None),
    "tinygrad": (
        "tinygrad,test,extract",
        ("clang", "tinygrad's CPU device compiles with clang: apt-get install -y clang"),
    ),
}


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff's checks and formatter, and the other pre-commit hooks (.pre-commit-config.yaml), on every file; mypy
    over the core, the package, the backends and the numpy plugin ([tool.mypy] in pyproject.toml)."""
    session.install("ruff==0.17.6", "pre-commit")  # pinned: another ruff formats and checks otherwise
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure")
    # The core's dependencies (attrs, pluggy, numpy) and pytest (the conformance suite), and no framework: mypy
    # reads the frameworks' imports as Any
    session.install("mypy==2.4.1", "pytest", "-e", ".")
    # A backend installs as torchlens_<fw> from backends/<fw>: mypy sees it under that name through a link of that
    # name. Given the folder itself it would take backends/torch for the module `torch`. Its errors print under the
    # link's path (.../mypy_packages/torchlens_<fw>/...), which is the file backends/<fw>/...
    links = pathlib.Path(session.create_tmp()) / "mypy_packages"
    shutil.rmtree(links, ignore_errors=True)
    links.mkdir()
    root = pathlib.Path(__file__).resolve().parent
    packages = {f"torchlens_{name}": root / "backends" / name for name in BACKENDS}
    packages["torchlens_numpy"] = root / "plugins" / "torchlens-numpy" / "torchlens_numpy"
    for name, folder in packages.items():
        (links / name).symlink_to(folder, target_is_directory=True)
    targets = [arg for name in ("torchlens_core", "torchlens", *packages) for arg in ("-p", name)]
    session.run("mypy", *targets, env={"MYPYPATH": str(links)})


@nox.session(python=PYTHON)
def core(session: nox.Session) -> None:
    """Core tests with no framework installed, plus the third-party numpy plugin through the shared suite.

    zarr and dask (the `extract` extra) are not frameworks: with them the numpy plugin's extraction runs."""
    session.install("-e", ".[test,extract]", "-e", "plugins/torchlens-numpy")
    session.run("pytest", "tests", "-q", *WORKERS, *session.posargs)
    session.run("pytest", "conformance", "--backend", "numpy", "-q", *WORKERS)


# Keras 3 and keras_hub beside a backend that runs Keras models (tf; jax, with KERAS_BACKEND=jax). --no-deps:
# keras-hub declares tensorflow-text, which pulls the full `tensorflow` wheel; these are the dependencies it imports.
KERAS_PACKAGES = (
    ("keras>=3.10",),
    ("--no-deps", "keras-hub", "regex", "kagglehub", "kagglesdk", "sentencepiece", "tokenizers", "protobuf"),
)


def _backend_session(name: str, extras: str, needs: tuple[str, str] | None) -> None:
    def run(session: nox.Session) -> None:
        if needs is not None and shutil.which(needs[0]) is None:
            session.error(needs[1])
        session.install("-e", f".[{extras}]")
        env = {}
        if name in ("tf", "jax"):  # Keras models: keras.applications and keras_hub's backbones
            for packages in KERAS_PACKAGES:
                session.install(*packages)
        if name == "jax":
            # transformers' Flax architectures for the menagerie's CI sample: the 4.x series is the last to ship
            # them (bench/menagerie/jax_hf_entries.py)
            session.install("transformers>=4.40,<5")
            env["KERAS_BACKEND"] = "jax"  # Keras picks its backend at import: its models join the jax zoos
        session.run("pytest", "tests", "-q", *WORKERS, *session.posargs, env=env)  # `-- --runslow`: slow tests too
        session.run("pytest", "conformance", "--backend", name, "-q", *WORKERS, env=env)
        if name == "torch":
            # transformers 4.x, still the most installed series, builds attention masks under torch.vmap: the
            # transform tests run again with it, from a folder put ahead of the session's transformers 5
            older = pathlib.Path(session.create_tmp()) / "transformers4"
            session.install(
                "--upgrade",
                "--target",
                str(older),
                "--no-deps",
                "transformers>=4.57,<5",
                "huggingface_hub>=0.34,<1.0",
                "tokenizers>=0.22,<=0.23.0",
            )
            session.run("pytest", "tests/test_torch_func_transforms.py", "-q", env={"PYTHONPATH": str(older)})

    run.__doc__ = f"{name} backend tests and the {name} conformance zoo."
    nox.session(python=PYTHON, name=name)(run)


for _name, (_extras, _needs) in BACKENDS.items():
    _backend_session(_name, _extras, _needs)

# port builder (tests/ports/build_<name>.py) -> the backend session whose virtualenv runs it
PORT_BUILDERS = {"torch": "torch", "jax": "jax", "paddle": "paddle", "keras": "tf"}


@nox.session(python=PYTHON)
def compare(session: nox.Session) -> None:
    """tl.compare on real ports with injected porting bugs (tests/ports), compared where no framework is installed.

    Each builder runs in its backend session's virtualenv (TensorFlow and Paddle cannot share a process) and
    saves its traces; the tests load and compare them in this session's, which has NumPy and no framework.
    """
    session.install("-e", ".[test]")
    envs = pathlib.Path(session.virtualenv.location).parent
    traces = pathlib.Path(session.create_tmp()) / "port_traces"
    shutil.rmtree(traces, ignore_errors=True)  # a variant no longer built must not linger from an earlier run
    for builder, backend in PORT_BUILDERS.items():
        python = envs / backend / "bin" / "python"
        if not python.exists():
            session.error(
                f"the {builder} port is built with the {backend} session's virtualenv, which is missing: "
                f"run `nox -s {backend}` first"
            )
        session.run(str(python), f"tests/ports/build_{builder}.py", str(traces), external=True)
    # the comparison menagerie's sample: transformers' PyTorch models against their Flax ports (bench/compare_menagerie)
    menagerie = pathlib.Path(session.create_tmp()) / "menagerie_traces"
    shutil.rmtree(menagerie, ignore_errors=True)
    for side, backend in (("torch", "torch"), ("flax", "jax")):  # side a first: it writes what side b reads
        session.run(
            str(envs / backend / "bin" / "python"),
            "-m",
            "bench.compare_menagerie",
            "--build-side",
            side,
            "--out",
            str(menagerie),
            "--sample",
            external=True,
        )
    # docs/compare.md's worked port and teacher forcing run ops in those sessions' virtualenvs
    pythons = {
        f"TORCHLENS_PYTHON_{name.upper()}": str(envs / name / "bin" / "python") for name in ("torch", "jax", "paddle")
    }
    tests = ("tests/test_compare_ports.py", "tests/test_docs_compare.py", "tests/test_compare_menagerie.py")
    session.run(
        "pytest",
        *tests,
        "-q",
        *WORKERS,
        *session.posargs,
        env={"TORCHLENS_PORT_TRACES": str(traces), "TORCHLENS_MENAGERIE_TRACES": str(menagerie), **pythons},
    )


# comparison menagerie pair -> its sides in build order, each (side, the backend session whose virtualenv builds it)
MENAGERIE_SIDES = {
    "hf-torch-flax": (("torch", "torch"), ("flax", "jax")),
    "keras-tf-torch": (("keras-tf", "tf"), ("keras-torch", "torch")),
    "keras-tf-jax": (("keras-tf", "tf"), ("keras-jax", "jax")),
}


@nox.session(python=PYTHON, name="compare-menagerie")
def compare_menagerie(session: nox.Session) -> None:
    """tl.compare on independently written ports of one architecture (bench/compare_menagerie/), with bugs injected.

    Side a (transformers' PyTorch models) is built in the torch session's virtualenv, side b (its Flax ports) in
    the jax session's; the comparisons run in this session's, which has NumPy and no framework; teacher forcing in
    side b's. `-- --pair keras-tf-torch` and `-- --pair keras-tf-jax` compare Keras 3 models on TensorFlow with the
    same models on PyTorch or JAX (Keras and keras_hub are added to that side's virtualenv). Not a default
    session. `-- --sample` builds four small architectures (about a minute on two cores; a full run about six);
    `-- --out DIR` keeps the traces and results there (default: this session's scratch folder); `-- --pair NAME`
    picks another framework pair. A full run rewrites docs/compare-menagerie.md.
    """
    session.install("-e", ".")
    args = list(session.posargs)
    out = pathlib.Path(session.create_tmp()) / "compare_menagerie"
    if "--out" in args:
        out = pathlib.Path(args.pop(args.index("--out") + 1))
        args.remove("--out")
    pair = args[args.index("--pair") + 1] if "--pair" in args else "hf-torch-flax"
    if pair not in MENAGERIE_SIDES:
        session.error(f"no sides known for pair {pair!r}: add it to MENAGERIE_SIDES")
    envs = pathlib.Path(session.virtualenv.location).parent
    for side, backend in MENAGERIE_SIDES[pair]:  # side a first: it writes what side b reads
        python = envs / backend / "bin" / "python"
        if not python.exists():
            session.error(
                f"the {side} side is built with the {backend} session's virtualenv, which is missing: "
                f"run `nox -s {backend}` first"
            )
        if side == "keras-torch":  # Keras beside torch (the tf and jax sessions install it themselves)
            for packages in KERAS_PACKAGES:
                session.run(str(python), "-m", "pip", "install", "-q", *packages, external=True)
        session.run(
            str(python), "-m", "bench.compare_menagerie", "--build-side", side, "--out", str(out), *args, external=True
        )
    session.run("python", "-m", "bench.compare_menagerie", "--compare", "--out", str(out), *args)
    # teacher forcing runs side b's ops again: in side b's virtualenv
    session.run(
        str(envs / MENAGERIE_SIDES[pair][1][1] / "bin" / "python"),
        "-m",
        "bench.compare_menagerie",
        "--force",
        "--out",
        str(out),
        *args,
        external=True,
    )
    if "--sample" not in args and "--only" not in args:
        session.run("python", "-m", "bench.compare_menagerie", "--report", "--out", str(out))


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: trace ResNet-18, print the summary, a few lookups and the audit, draw it.

    The drawing goes to this session's scratch folder (`-- --out docs/images` refreshes the README's picture);
    without Graphviz's dot the demo says how to get it and still prints everything else.
    """
    session.install("-e", ".[torch]")
    session.run("python", "docs/demo.py", *(session.posargs or ["--out", session.create_tmp()]))


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Capture overhead (ResNet-18, GPT-2 small), selective capture, extraction, metadata, save/load, patching,
    comparison, the floor under a capture (torch, and every other backend whose session exists), a jitted JAX target's
    repeat capture part by part (where the jax session exists); then one table for
    every backend (bench/all_backends.py, in each backend session's virtualenv: a missing one gets a row saying
    so), written to this session's scratch folder."""
    # zoo: GPT-2 (transformers); extract: zarr, tqdm; tables: pandas (metadata_cost times trace.to_pandas()).
    session.install("-e", ".[torch,zoo,extract,tables]")
    session.run("python", "bench/capture_overhead.py", *session.posargs)
    session.run("python", "bench/selective_capture.py")
    session.run("python", "bench/extract_dataset.py")
    session.run("python", "bench/metadata_cost.py")
    session.run("python", "bench/save_load.py")
    session.run("python", "bench/intervene_cost.py")
    session.run("python", "bench/compare_cost.py")
    session.run("python", "bench/scale.py")  # every step at 1k, 10k and 50k ops: seconds per 1k ops stay flat
    session.run("python", "bench/capture_floor.py", "--backend", "torch")
    envs = pathlib.Path(session.virtualenv.location).parent  # each backend's own: TF and Paddle cannot share one
    for name in ("tf", "paddle", "tinygrad", "jax"):  # the floor under each backend's capture, where its session is
        python = envs / name / "bin" / "python"
        if python.exists():
            env = {"KERAS_BACKEND": "jax"} if name == "jax" else {}
            session.run(str(python), "bench/capture_floor.py", "--backend", name, external=True, env=env)
    jax_python = envs / "jax" / "bin" / "python"
    if jax_python.exists():
        session.run(str(jax_python), "bench/jax_capture_parts.py", external=True)
    table = pathlib.Path(session.create_tmp()) / "performance-table.md"
    session.run("python", "bench/all_backends.py", "--envs", str(envs), "--out", str(table))


@nox.session(python=PYTHON)
def menagerie(session: nox.Session) -> None:
    """Every architecture the registries list, traced and verified (bench/menagerie/), then docs/menagerie.md.

    `nox -s menagerie -- --backend torch [--shard i/n] [--resume] [--sample]`: runs in that backend session's
    virtualenv (TensorFlow and Paddle cannot share a process), as `compare` does; not a default session (the
    full torch run takes about an hour on two cores). `-- --dask-local N` runs the entries on a local Dask cluster
    of N single-threaded workers, `-- --dask ADDRESS` on a running scheduler's workers (the engine
    tl.extract_dataset takes; each entry is still a forked child under its limits, bench/menagerie/cluster.py).
    """
    args = list(session.posargs)
    backend = args[args.index("--backend") + 1] if "--backend" in args else "torch"
    python = pathlib.Path(session.virtualenv.location).parent / backend / "bin" / "python"
    if not python.exists():
        session.error(
            f"the menagerie runs in the {backend} session's virtualenv, which is missing: run `nox -s {backend}` first"
        )
    session.run(str(python), "-m", "bench.menagerie", *args, external=True)
    if "--sample" not in args and "--list" not in args:
        session.run(str(python), "-m", "bench.menagerie.report", external=True)
