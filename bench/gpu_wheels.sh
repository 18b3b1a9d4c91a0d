#!/usr/bin/env bash
# Downloads into .whl/ the wheels pyannote.audio 4.0.7 needs on the GPU machine's image beyond what that image
# holds, so that bench/gpu_check.sh can install them there (it does when .whl/ exists) and run the pyannote
# checks: the diarization bench stage times on CUDA and the pipeline's GPU tests.
#
#   PYTHON=/work/main/.venv/bin/python bash bench/gpu_wheels.sh    # on a machine that reaches PyPI
#
# The list is computed, not written down: starting from pyannote.audio==4.0.7, each wheel's Requires-Dist
# (markers evaluated for the image's CPython 3.12 on x86_64 Linux, no extras) names the next ones, less the
# packages the image has (IMAGE below, from the device README's package list) and torchcodec, which
# pyannote.audio imports only to decode audio files (it warns and goes on without it; the checks feed
# waveforms in memory). A package the running Python has installed at a version the requirement accepts is
# pinned to that version (the combination the tests here run with); any other is the newest pip finds.
# One version of each is kept (pip install --no-index stops on two). Prints each wheel and the total size,
# and fails when the total passes WHEEL_BUDGET_MIB (what travels to the device machine, the working tree
# included, is at most 64 MiB). .whl/ is ignored by git (.gitignore).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
exec "$PY" - "$@" <<'PYTHON'
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = "pyannote.audio==4.0.7"
FOLDER = Path(".whl")
WHEEL_BUDGET_MIB = 32
# the GPU image's Python packages (the device README's KINDS.md, "Python packages already there")
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp""".split()
LEFT_OUT = {"torchcodec": "pyannote.audio decodes audio files with it and imports without it; the checks feed "
                          "waveforms in memory"}
# the image's interpreter: CPython 3.12 on x86_64 Linux
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
           "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
image = {canonicalize_name(name) for name in IMAGE}


def wheels_of(name):
    return [path for path in FOLDER.glob("*.whl") if canonicalize_name(parse_wheel_filename(path.name)[0]) == name]


def version_of(wheel: Path) -> Version:
    return Version(str(parse_wheel_filename(wheel.name)[1]))


def fitting(name, requirement: Requirement):
    return [path for path in wheels_of(name) if requirement.specifier.contains(version_of(path), prereleases=True)]


def download(requirement: str) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", "--quiet", "--disable-pip-version-check", "-d", str(FOLDER)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    done = subprocess.run(command + [requirement], capture_output=True, text=True)
    if done.returncode != 0:   # pip's own warnings are shown only then
        sys.exit(f"gpu_wheels: pip download {requirement} failed:\n{done.stdout}{done.stderr}")


def pinned(requirement: Requirement) -> str:
    """The requirement pinned to the running Python's installed version when it accepts it."""
    try:
        installed = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return f"{requirement.name}{requirement.specifier}"
    if requirement.specifier.contains(installed, prereleases=True):
        return f"{requirement.name}=={installed}"
    return f"{requirement.name}{requirement.specifier}"


def requirements_of(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", name))
        text = archive.read(metadata).decode()
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(MARKERS):
                yield requirement


FOLDER.mkdir(exist_ok=True)
resolved = {}        # name -> wheel path
todo = [(Requirement(ROOT), "the root")]
while todo:
    requirement, wanted_by = todo.pop(0)
    name = canonicalize_name(requirement.name)
    if name in image:
        continue
    if name in LEFT_OUT:
        print(f"left out: {name} (wanted by {wanted_by}): {LEFT_OUT[name]}")
        continue
    if name in resolved:
        version = version_of(resolved[name])
        if not requirement.specifier.contains(version, prereleases=True):
            sys.exit(f"gpu_wheels: {wanted_by} wants {requirement}, but {name} {version} was chosen")
        continue
    spec = Requirement(pinned(requirement))
    if not fitting(name, spec):
        download(str(spec))
    candidates = fitting(name, spec)
    if not candidates:
        sys.exit(f"gpu_wheels: no wheel of {spec} in {FOLDER}/ after pip download")
    wheel = max(candidates, key=version_of)
    resolved[name] = wheel
    for path in wheels_of(name):
        if path != wheel:   # one version of each
            print(f"removed {path.name} (another version of {name})")
            path.unlink()
    todo += [(needed, name) for needed in requirements_of(wheel)]

total = 0
for name, wheel in sorted(resolved.items()):
    size = wheel.stat().st_size
    total += size
    print(f"{size / 2**20:7.2f} MiB  {wheel.name}")
others = sorted(path.name for path in FOLDER.glob("*.whl") if path not in resolved.values())
if others:
    print(f"also in {FOLDER}/ (not needed by pyannote.audio, installed too by gpu_check.sh): {', '.join(others)}")
print(f"{total / 2**20:7.2f} MiB  total, {len(resolved)} wheels in {FOLDER}/ (budget {WHEEL_BUDGET_MIB} MiB)")
if total > WHEEL_BUDGET_MIB * 2**20:
    sys.exit(f"gpu_wheels: {total / 2**20:.1f} MiB of wheels is over the {WHEEL_BUDGET_MIB} MiB budget")
PYTHON
