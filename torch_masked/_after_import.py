"""Registrations that wait for a module of torch to be imported, so that
importing torch_masked does not import it (Inductor's lowerings, DTensor,
Dynamo: each would add a large part to torch_masked's import time)."""
import importlib.abc
import importlib.machinery
import sys


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` as the import system would, and runs each of its
    callbacks(module) right after the module has been executed; then steps
    aside."""

    def __init__(self, name):
        self.name = name
        self.callbacks = []

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        del _WAITING[self.name]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_run(module):
            exec_module(module)
            for callback in self.callbacks:
                callback(module)

        spec.loader.exec_module = exec_then_run
        return spec


# The finder of each module that callbacks wait for: one a module, since the
# import system asks only the first finder that knows it.
_WAITING = {}


def when_imported(name, callback):
    """callback(module) now if the module `name` is imported, else as soon as it is."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    if name not in _WAITING:
        _WAITING[name] = _RunAfterImport(name)
        sys.meta_path.insert(0, _WAITING[name])
    _WAITING[name].callbacks.append(callback)
