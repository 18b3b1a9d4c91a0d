"""torchaudio's `compliance.kaldi` module for the demo, the fbank benchmark and the parity tests.

They compare rt.fbank with `torchaudio.compliance.kaldi.fbank`. That module is pure Python (torch
ops only), but importing it runs `torchaudio/__init__.py`, which loads torchaudio's C++ extension,
and the extension loads only beside the torch build it was compiled for (PyPI's Linux wheels also
need CUDA's libraries). Where that load fails, the file `torchaudio/compliance/kaldi.py` is run on
its own: its one use of the `torchaudio` package (`create_dct`, for MFCCs) is not on fbank's path.

`make venv` installs torchaudio's files outside sys.path, in REFERENCE_DIR, so that libraries which
import torchaudio whenever it is installed (transformers does) never meet the failing extension.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path
from typing import Optional

REFERENCE_DIR = Path(sys.prefix) / "share" / "rlx_triton" / "torchaudio"
_STANDALONE_NAME = "rlx_triton._torchaudio_kaldi"


@functools.lru_cache(maxsize=1)
def kaldi_compliance() -> Optional[types.ModuleType]:
    """torchaudio.compliance.kaldi, or None when torchaudio is neither installed nor in REFERENCE_DIR."""
    spec = importlib.util.find_spec("torchaudio")
    if spec is not None and spec.submodule_search_locations:
        try:
            from torchaudio.compliance import kaldi

            return kaldi
        except (ImportError, OSError):  # the compiled extension was built for another torch
            return _load_standalone(Path(list(spec.submodule_search_locations)[0]))
    if (REFERENCE_DIR / "torchaudio" / "compliance" / "kaldi.py").is_file():
        return _load_standalone(REFERENCE_DIR / "torchaudio")
    return None


def _load_standalone(package_dir: Path) -> types.ModuleType:
    path = package_dir / "compliance" / "kaldi.py"
    file_spec = importlib.util.spec_from_file_location(_STANDALONE_NAME, path)
    if file_spec is None or file_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(file_spec)
    # kaldi.py starts with `import torchaudio`: an empty placeholder answers it while the file runs, so
    # the failing extension is not loaded (again), and is removed afterwards
    previous = sys.modules.get("torchaudio")
    sys.modules["torchaudio"] = types.ModuleType("torchaudio", "placeholder while compliance/kaldi.py loads")
    try:
        file_spec.loader.exec_module(module)
    finally:
        if previous is None:
            sys.modules.pop("torchaudio", None)
        else:
            sys.modules["torchaudio"] = previous
    sys.modules[_STANDALONE_NAME] = module
    return module
