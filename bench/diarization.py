"""The whole pyannote.audio SpeakerDiarization pipeline: stock vs rt.integrations.pyannote.optimize(pipeline).

The pipeline is built offline with random weights (tests/reference/diarization_pipeline.py): PyanNet
segmentation (10 s chunks, pyannote's 1 s step), WeSpeakerResNet34 embedding, a random PLDA and
agglomerative clustering, the class defaults for the batch sizes (embedding_batch_size=1,
segmentation_batch_size=1), on a synthetic recording of 4 speakers taking turns with overlaps (5 min; 20 s
with quick). Both pipelines run on the same file, alternately (stock first in even rounds), `rounds` times;
each stage's time is read from pyannote's own hook calls (segmentation, then counting to the end of the
embeddings, then clustering and reconstruction to the discrete diarization) and the median per stage is
reported, with the real-time factor (seconds of processing per second of audio). Without pyannote.audio
(tests/integrations/install_pyannote_pipeline.sh installs it; on the GPU machine, bench/gpu_wheels.sh and
gpu_check.sh) the bench reports no rows and says why on stderr.

On CUDA the optimized pipeline overlaps the two stages (rlx_triton.integrations._pyannote_overlap): the
embedding of each chunk batch is queued while the segmentation of the next chunks runs, so most of its
embedding work falls inside the segmentation stage and the embedding stage is what is left to wait for;
compare the whole pipeline there. Each row says whether the embeddings were prefetched (`overlap`).

Each row also carries the 1-minute load average before and after the rounds and torch's thread count: on a
shared machine with fewer free cores than threads, torch's OpenMP threads spin at barriers while one of them
waits for a core, and a stage can take many times its quiet-machine time, on either side.
"""
from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

STAGES = ("segmentation", "embeddings", "clustering", "whole pipeline")


def cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """One case: the recording length in seconds and the number of alternating rounds."""
    return [dict(seconds=20.0 if quick else 300.0, rounds=1 if quick else 2)]


def run(quick: bool = False, progress=None) -> list:
    """Rows per stage (segmentation, embeddings, clustering, whole pipeline): optimized vs stock seconds."""
    from bench.common import each_case, fp32_setup
    from tests.reference.diarization_pipeline import pyannote_audio_missing

    missing = pyannote_audio_missing()
    if missing is not None:   # an optional extra: the other benches' results stand without this one
        print(f"bench diarization: not run, {missing}", file=sys.stderr)
        return []
    device, _backend = fp32_setup()
    return [row for spec in each_case("diarization", cases(quick, gpu=device.type == "cuda"), progress)
            for row in _measure(spec, device)]


def stage_seconds(pipeline, file) -> Dict[str, float]:
    """Seconds of each stage of one pipeline(file) call, from the hook calls that close each stage."""
    marks: Dict[str, float] = {}

    def hook(step, artefact, file=None, total=None, completed=None):
        if completed is None:
            marks[step] = time.perf_counter()

    start = time.perf_counter()
    pipeline(file, hook=hook)
    end = time.perf_counter()
    return {"segmentation": marks["segmentation"] - start,
            "embeddings": marks["embeddings"] - marks["segmentation"],
            "clustering": marks["discrete_diarization"] - marks["embeddings"],
            "whole pipeline": end - start}


def _measure(spec: dict, device: torch.device) -> list:
    from bench.common import case
    from rlx_triton.integrations import pyannote
    from tests.reference.diarization_pipeline import speaker_diarization, synthetic_recording

    stock = speaker_diarization(10.0)
    stock.to(device)
    fast = pyannote.optimize(copy.deepcopy(stock))
    file = synthetic_recording(spec["seconds"])
    times: Dict[str, Dict[str, List[float]]] = {"stock": {s: [] for s in STAGES}, "fast": {s: [] for s in STAGES}}
    load_before = round(os.getloadavg()[0], 2)
    with torch.inference_mode():
        for round_ in range(spec["rounds"]):
            # the side that goes first alternates, so that neither always runs on the machine the other warmed
            order = (("stock", stock), ("fast", fast)) if round_ % 2 == 0 else (("fast", fast), ("stock", stock))
            for name, pipeline in order:
                for stage, seconds in stage_seconds(pipeline, file).items():
                    times[name][stage].append(seconds)
    load = (load_before, round(os.getloadavg()[0], 2))
    overlap = getattr(fast.get_embeddings, "overlap_report", "")
    rows = []
    for stage in STAGES:
        fast_s, stock_s = statistics.median(times["fast"][stage]), statistics.median(times["stock"][stage])
        rows.append(case("diarization", f"{stage}, {spec['seconds']:.0f} s of audio, {device.type}", torch.float32,
                         fast_s * 1e6, "pyannote.audio 4 SpeakerDiarization (stock)", stock_s * 1e6,
                         backend="torch" if device.type == "cpu" else "auto", stage=stage,
                         rtf=round(fast_s / spec["seconds"], 4), baseline_rtf=round(stock_s / spec["seconds"], 4),
                         rounds=spec["rounds"], load_average=load, threads=torch.get_num_threads(),
                         overlap=overlap))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    for row in run(quick="--quick" in sys.argv):
        print(row)
