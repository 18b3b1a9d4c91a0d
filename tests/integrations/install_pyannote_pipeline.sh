#!/bin/sh
# Installs pyannote.audio 4.0.7 into the venv of PYTHON ($1) for tests/integrations/test_pyannote_pipeline.py
# and bench/diarization.py, keeping the venv's torch.
#
# pyannote.audio requires torchaudio and torchcodec. Each torchaudio release pins one torch release and
# PyPI's Linux wheels carry a CUDA extension, so torchaudio goes in with --no-deps and without its compiled
# libraries: `import torchaudio` then runs its pure-Python parts (compliance.kaldi, functional.resample),
# all the pipeline uses. torchcodec (media decoding) is left out: the tests and the bench feed the pipeline
# {"waveform": tensor, "sample_rate": 16000} dicts (diarize_files reads WAV/FLAC/OGG with soundfile, which the
# `pyannote` extra requires and the second install line adds). Every other requirement installs as pip resolves it.
set -eu
PY="$1"
"$PY" -m pip install -q --no-deps "pyannote.audio==4.0.7" "torchaudio==2.11.1" "torch-audiomentations>=0.12" \
    "torch-pitch-shift>=1.2.2" primePy julius
"$PY" -m pip install -q "asteroid-filterbanks>=0.4.0" "einops>=0.8.1" "huggingface-hub>=0.28.1" "lightning>=2.4" \
    "matplotlib>=3.10.0" "opentelemetry-api>=1.34.0" "opentelemetry-exporter-otlp>=1.34.0" \
    "opentelemetry-sdk>=1.34.0" "pyannote-core>=6.0.1" "pyannote-database>=6.1.1" "pyannote-metrics>=4.0.0" \
    "pyannote-pipeline>=4.0.0" "pyannoteai-sdk>=0.3.0" "pytorch-metric-learning>=2.8.1" "rich>=13.9.4" \
    "safetensors>=0.5.2" "torchmetrics>=1.6.1" "soundfile>=0.12"
"$PY" - <<'PYTHON'
import pathlib, importlib.util
lib = pathlib.Path(importlib.util.find_spec("torchaudio").submodule_search_locations[0]) / "lib"
for shared in lib.glob("*.so"):
    shared.unlink()
PYTHON
PYANNOTE_METRICS_ENABLED=false "$PY" -W ignore -c "import pyannote.audio.pipelines, torchaudio.compliance.kaldi, soundfile"
