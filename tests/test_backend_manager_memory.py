"""A MemoryError while the plugins load is transient: it must not leave the process without backends."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Runs in a child process: the plugin manager is process-wide and cached, and this check empties it.
_CHILD = textwrap.dedent("""
    import importlib.metadata

    real_entry_points = importlib.metadata.entry_points
    refused = []

    class OutOfMemoryOnce:
        # Wraps one entry point; its first load fails as a load does when memory runs out.
        def __init__(self, ep):
            self.ep, self.name, self.value = ep, ep.name, ep.value

        def load(self):
            if not refused:
                refused.append(self.name)
                raise MemoryError("simulated: out of memory while importing the backend")
            return self.ep.load()

    def entry_points(**kwargs):
        found = real_entry_points(**kwargs)
        if kwargs.get("group") == "torchlens.backends":
            return [OutOfMemoryOnce(ep) for ep in found]
        return found

    importlib.metadata.entry_points = entry_points
    expected = sorted({ep.name for ep in real_entry_points(group="torchlens.backends")})
    assert expected, "no backend entry points installed in this environment"

    import torchlens as tl
    from torchlens_core.backend import manager

    try:
        tl.backends()
    except MemoryError:
        print("first: MemoryError")
    else:
        print("first: no error")
    names = sorted(b["name"] for b in tl.backends())
    print("refused:", refused)
    print("broken:", sorted(manager.broken_plugins))
    print("second:", names == expected, names, expected)
""")


def test_memory_error_while_loading_plugins_is_not_cached() -> None:
    """The first load fails for lack of memory; the next call, with memory, finds every backend."""
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "first: MemoryError" in lines, done.stdout
    assert "broken: []" in lines, done.stdout
    assert any(line.startswith("second: True") for line in lines), done.stdout
