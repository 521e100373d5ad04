"""benchmark/perf/gpu_side_by_side.py, the script a GPU session runs to train bench's model beside its peers:
its path, for the tests that run it, and the script imported, for those that call its functions."""

import importlib.util
import os
import sys
from types import ModuleType

from conftest import PERF

SCRIPT = str(PERF / "gpu_side_by_side.py")


def side_by_side() -> ModuleType:
    """The script as a module, with its own folder on the path while it imports (as it has when run)."""
    spec = importlib.util.spec_from_file_location("gpu_side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    return module
