"""Import verl's real tool interface without its GPU stack (torch, ray), for tests on a CPU machine.

verl is installed with `pip install --no-deps verl==0.9.1` plus `transformers` (hack/bootstrap):
its tool modules (`verl.tools.tool_registry`, `base_tool`, `schemas`) then import as they are,
except for two side effects that need what is left out. `verl/__init__.py` and
`verl/utils/__init__.py` import `DataProto` and device helpers (torch): the two packages are
registered here as bare packages over the installed directories, so their submodules load from
verl's own files but those `__init__`s do not run. `verl.utils.ray_utils` does `import ray` at
the top and uses it only inside functions the tool path never calls: `ray` is registered as a
tripwire that fails loudly on any use. Nothing of verl's is rewritten or replaced.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

BARE_PACKAGES = ("verl", "verl.utils")
ABSENT = ("ray",)


class AbsentModule(types.ModuleType):
    """A module that is deliberately not installed: using any of it raises, naming what was used."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"{self.__name__}.{name} was used, but {self.__name__} is not installed here")


def install() -> Path:
    """Register the bare packages and tripwires (idempotent); returns verl's installed directory."""
    registered = sys.modules.get("verl")
    if registered is not None and getattr(registered, "__path__", None):
        return Path(next(iter(registered.__path__)))  # a second test module asked: already done
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.submodule_search_locations is None:
        raise RuntimeError("verl is not installed: hack/bootstrap installs verl==0.9.1 with --no-deps")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in BARE_PACKAGES:
        if name in sys.modules:
            continue
        package = types.ModuleType(name)
        directory = root.joinpath(*name.split(".")[1:])
        package.__path__ = [str(directory)]
        package.__file__ = str(directory / "__init__.py")
        package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        package.__spec__.submodule_search_locations = [str(directory)]
        sys.modules[name] = package
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, package)
    for name in ABSENT:
        if importlib.util.find_spec(name) is None:
            sys.modules.setdefault(name, AbsentModule(name))
    return root
