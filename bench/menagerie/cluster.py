"""The menagerie on a Dask cluster: each entry a task that runs the same forked, limited child on a worker.

    python -m bench.menagerie --backend torch --dask-local 4           # a LocalCluster of 4 single-threaded workers
    python -m bench.menagerie --backend torch --dask tcp://host:8786   # a running scheduler's workers

The engine is the one ``tl.extract_dataset(engine=client)`` uses: a
``dask.distributed.Client``. A task is :func:`run_task`: the worker imports the
framework once (its first task), then forks a child per entry under the time and
memory limit, exactly as the single-process runner does
(:func:`bench.menagerie.run.run_entry`), and returns the result record with the
child's output. The driver writes each record to the results file as it
arrives, so ``--resume`` and ``--shard`` work as they do without Dask. Tasks
are submitted with ``retries=0``; a worker that dies while it runs one fails that
entry (check ``crash``, the reason given), and never the run. On
``--dask-local`` the scheduler is also told not to rerun a task whose worker
died (``distributed.scheduler.allowed-failures`` 0); a remote scheduler keeps
its own setting. Its workers must import this repository (``bench``) and the
backend's framework.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from bench.menagerie.entries import Entry

# The tail of the child's output a task sends back for the driver's log.
LOG_TAIL = 4000


def run_task(entry: Entry, timeout: float, memory_bytes: int) -> dict[str, Any]:
    """On a worker: the entry's result record (as :func:`run_entry` makes it), with ``log``, its child's output."""
    from bench.menagerie.run import preload, run_entry

    preload(entry.backend)  # imports once per worker process: the forked children start with them
    with tempfile.TemporaryFile() as log:
        result = run_entry(entry, timeout, memory_bytes, log.fileno())
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - LOG_TAIL))
        result["log"] = log.read().decode(errors="replace")
    return result


@contextlib.contextmanager
def client_for(address: str | None, local_workers: int | None) -> Iterator[Any]:
    """A Client of the scheduler at ``address``, or of a LocalCluster of ``local_workers`` one-thread processes."""
    import dask
    from distributed import Client, LocalCluster

    if address is not None:
        with Client(address) as client:
            yield client
        return
    # a task whose worker died is not handed to another worker: the entry fails, the next worker lives
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        LocalCluster(n_workers=local_workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        yield client


def run_on_dask(
    client: Any, todo: list[Entry], timeout: float, memory_bytes: int, record: Callable[[Entry, dict[str, Any]], None]
) -> None:
    """Submit every entry of ``todo``; call ``record(entry, result)`` for each as it finishes, in finishing order."""
    from distributed import as_completed

    run = uuid.uuid4().hex[:8]  # task keys unique to this run: a resumed run's tasks are new tasks
    futures = {
        client.submit(
            run_task, entry, timeout, memory_bytes, key=f"menagerie-{run}-{entry.name}", pure=False, retries=0
        ): entry
        for entry in todo
    }
    try:
        for future in as_completed(futures):
            entry = futures.pop(future)
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - the worker died (KilledWorker) or the task could not run
                result = {
                    "status": "failed",
                    "check": "crash",
                    "error": f"the Dask task did not return: {type(exc).__name__}: {str(exc)[:200]}",
                }
            future.release()
            record(entry, result)
    finally:
        client.cancel(list(futures))  # an interrupted driver leaves no task running on the cluster
