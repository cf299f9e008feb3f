"""TorchLens's global module hooks: put into torch's registries, and taken out again leaving them as found.

``torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)``
adds the hook's id to ``_global_forward_hooks_with_kwargs`` too, but the
handle it returns removes the id only from ``_global_forward_hooks`` and
``_global_forward_hooks_always_called``: each capture left one entry behind.
And ``handle.remove()`` allocates (an iterator over its weak references): a
``MemoryError`` there left the capture's hook registered for good, running
on every module call of the process and keeping the failed capture alive.

Here the entries are made (ids from torch's own handle counter, so none
clashes with another handle's) before anything is registered, each registry
is held directly, and removal is ``dict.pop`` of keys already made, retried
until it holds (:func:`torchlens_torch.restore.until_done`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle

from torchlens_torch.restore import until_done


class GlobalHooks:
    """A global forward pre-hook and a global forward hook (called with kwargs), while a ``with`` block runs."""

    __slots__ = ("_entries", "_remove")

    def __init__(self, pre: Callable[..., Any], post: Callable[..., Any]) -> None:
        pre_hooks, hooks = nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks
        pre_id, post_id = RemovableHandle(pre_hooks).id, RemovableHandle(hooks).id
        # (registry, key, value), in the order they go in: the with_kwargs flag before the hook it is read
        # for, so that no module call in another thread finds the hook without it; taken out in reverse.
        self._entries = (
            (pre_hooks, pre_id, pre),
            (nn_module._global_forward_hooks_with_kwargs, post_id, True),
            (hooks, post_id, post),
        )
        entries = self._entries

        def remove() -> None:  # made now: the finally that runs it must not need to allocate it
            third, second, first = entries[2], entries[1], entries[0]
            third[0].pop(third[1], None)
            second[0].pop(second[1], None)
            first[0].pop(first[1], None)

        self._remove = remove

    def __enter__(self) -> GlobalHooks:
        try:
            for registry, key, value in self._entries:
                registry[key] = value
        except BaseException:
            until_done(self._remove)  # part of them went in
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        until_done(self._remove)
