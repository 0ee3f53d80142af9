"""The scripts under ci/ are files GitHub Actions runs, not a package: tests import them by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

CI = Path(__file__).resolve().parents[1] / "ci"


def load_ci_script(name: str) -> ModuleType:
    """Import ci/<name>.py once, as module kvgate_ci_<name>; its imports of the scripts beside it (ci_facts) find
    them, as when Python runs it with its own folder on the path."""
    module_name = f"kvgate_ci_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    if str(CI) not in sys.path:
        sys.path.append(str(CI))
    spec = importlib.util.spec_from_file_location(module_name, CI / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
