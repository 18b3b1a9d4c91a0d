"""Diarization at scale: stock pyannote.audio vs rt.integrations.pyannote.diarize_files on long synthetic audio.

    python bench/diarize.py                      # 60 min: stock vs optimized, then peak RSS at 10 and 60 min
    python bench/diarize.py --minutes 10         # the same on 10 minutes (a shared 2-core machine)
    python bench/diarize.py --memory-only --small   # only the peak-RSS check, narrow models (minutes, not hours)
    python bench/diarize.py --out bench/results  # ... and append the rows to bench/results/all_benchmark_data.csv

The audio is this script's own generator (`write_recording`): 4 speakers with their own pitch and timbre take
turns of 0.5 to 3 s, a fifth of them overlapping the next, with silences, written block by block to a 16 kHz
PCM WAV (so an hour never sits in this process). The pipeline is tests/reference/diarization_pipeline.py's:
PyanNet segmentation (10 s chunks, pyannote's 1 s step), WeSpeakerResNet34 embedding (random weights),
agglomerative centroid clustering, class-default batch sizes; `--small` narrows both models (the memory check
does not depend on their width: what grows with the audio is the same).

Every measurement runs in a fresh child process, so its peak RSS (getrusage's ru_maxrss) is its own:
- stock: `pipeline({"waveform": ..., "sample_rate": 16000})` on the WAV read with soundfile, the stage
  seconds read from pyannote's hook calls (as bench/diarization.py does);
- optimized: `diarize_files(pipeline, [wav], out_dir)`, the stage seconds from its summary.
The memory rule checked (issue 38): the optimized 60-min peak <= the 10-min peak + 1.5 x the extra waveform
bytes (float32, 64,000 bytes per second of 16 kHz audio). Rows: seconds per stage and whole, RTF, peak RSS.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RATE = 16000
BLOCK_SECONDS = 60.0
WAVEFORM_BYTES_PER_SECOND = 4 * SAMPLE_RATE     # float32 mono
MEMORY_SLOPE = 1.5                               # the allowed growth, in waveform bytes


def _turns(seconds: float, speakers: int, rng) -> List[tuple]:
    """(start, end, speaker) turns of 0.5 to 3 s, a fifth overlapping the next, short silences between others."""
    turns, start = [], 0.0
    while start < seconds:
        length = float(rng.uniform(0.5, 3.0))
        turns.append((start, min(seconds, start + length), int(rng.integers(speakers))))
        overlap = rng.random() < 0.2
        start += length * (0.7 if overlap else 1.0) + (0.0 if overlap else float(rng.uniform(0.0, 0.6)))
    return turns


def write_recording(path: Path, seconds: float, speakers: int = 4, seed: int = 0) -> None:
    """A 16 kHz PCM WAV of `seconds` of synthetic conversation, written one block at a time."""
    import soundfile

    rng = np.random.default_rng(seed)
    turns = _turns(seconds, speakers, rng)
    timbres = rng.uniform(0.2, 1.0, size=(speakers, 14))
    total = int(round(seconds * SAMPLE_RATE))
    block = int(BLOCK_SECONDS * SAMPLE_RATE)
    with soundfile.SoundFile(str(path), "w", SAMPLE_RATE, 1, subtype="PCM_16") as out:
        for first in range(0, total, block):
            last = min(total, first + block)
            t = np.arange(first, last) / SAMPLE_RATE
            samples = 0.002 * rng.normal(size=last - first)
            for start, end, speaker in turns:
                a, b = max(first, int(start * SAMPLE_RATE)), min(last, int(end * SAMPLE_RATE))
                if a >= b:
                    continue
                tt = t[a - first:b - first]
                f0 = 95.0 + 45.0 * speaker
                phase = 2 * np.pi * (f0 * tt + 2.0 * np.sin(2 * np.pi * (1.5 + 0.4 * speaker) * tt))
                voice = sum(timbres[speaker, h - 1] / h * np.sin(h * phase) for h in range(1, 15))
                envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * tt) ** 2          # syllable-rate modulation
                samples[a - first:b - first] += 0.15 * envelope * voice
            out.write(samples.astype(np.float32))


def _pipeline(small: bool):
    from tests.reference.diarization_pipeline import speaker_diarization

    return speaker_diarization(10.0, small=small)


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # KiB on Linux


def child(mode: str, wav: str, small: bool, threads: Optional[int]) -> dict:
    """One measurement in this (fresh) process: stage seconds, audio seconds and peak RSS."""
    import torch

    import rlx_triton as rt
    from rlx_triton.config import settings

    if threads is not None:
        torch.set_num_threads(threads)

    pipeline = _pipeline(small)
    backend = "torch" if settings().interpret else "auto"
    with rt.use_backend(backend), torch.inference_mode():
        if mode == "stock":
            import soundfile

            from bench.diarization import stage_seconds

            data, rate = soundfile.read(wav, dtype="float32")
            file = {"waveform": torch.from_numpy(data)[None], "sample_rate": rate, "uri": Path(wav).stem}
            audio = data.shape[0] / rate
            del data
            seconds = stage_seconds(pipeline, file)
            stages = {"segmentation": seconds["segmentation"], "embeddings": seconds["embeddings"],
                      "clustering": seconds["clustering"], "total": seconds["whole pipeline"]}
        else:
            from rlx_triton.integrations.pyannote import diarize_files

            with tempfile.TemporaryDirectory() as out:
                record = diarize_files(pipeline, [wav], out)["files"][0]
            if record["status"] != "done":
                raise RuntimeError(record["error"])
            stages, audio = record["seconds"], record["audio_seconds"]
    return {"mode": mode, "audio_seconds": audio, "seconds": stages, "peak_rss_bytes": _peak_rss_bytes(),
            "threads": torch.get_num_threads()}


def measure(mode: str, wav: Path, small: bool, threads: Optional[int]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYANNOTE_METRICS_ENABLED": "false"}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(wav)] + (["--small"] if small else []) \
        + ([f"--threads={threads}"] if threads is not None else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} on {wav.name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rows(results: Dict[str, dict], small: bool, load: tuple) -> List[dict]:
    rows = []
    for mode, result in results.items():
        name, what = mode.split("@")
        provider = "rlx_triton" if name == "optimized" else "pyannote.audio 4 SpeakerDiarization"
        shape = f"{what} min{' small models' if small else ''}"
        for stage, value in result["seconds"].items():
            rows.append(dict(provider=provider, metric="time", unit="s", x=f"{stage}, {shape}", value=value))
        rows.append(dict(provider=provider, metric="rtf", unit="s/s", x=shape,
                         value=result["seconds"]["total"] / result["audio_seconds"]))
        rows.append(dict(provider=provider, metric="peak_rss", unit="MB", x=shape,
                         value=result["peak_rss_bytes"] / 1e6))
    for row in rows:
        row["load"] = load
    return rows


def _append_csv(rows: List[dict], out: Path, quick: bool) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from bench.run import RECORDS_FILE, append_records, git_sha
    from rlx_triton import __version__

    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    append_records([{"kernel_name": "diarize", "kernel_provider": row["provider"], "kernel_operation_mode": "forward",
                     "metric_name": row["metric"], "metric_unit": row["unit"], "x_name": "stage, audio",
                     "x_value": row["x"], "dtype": "float32", "route": "torch", "y_value_20": None,
                     "y_value_50": round(row["value"], 4), "y_value_80": None, "gpu_name": "cpu", "timestamp": stamp,
                     "rlx_triton_version": __version__, "git_sha": git_sha(), "torch_version": torch.__version__,
                     "triton_version": None, "quick": quick} for row in rows], out / RECORDS_FILE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="audio for the stock vs optimized run (60)")
    parser.add_argument("--memory-minutes", type=float, nargs=2, default=(10.0, 60.0), metavar=("SHORT", "LONG"),
                        help="the two lengths of the peak-RSS check (10 60)")
    parser.add_argument("--memory-only", action="store_true", help="only the peak-RSS check")
    parser.add_argument("--speed-only", action="store_true", help="only stock vs optimized")
    parser.add_argument("--small", action="store_true", help="narrow models (tests' sizes)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in each measured process (default torch's; 1 avoids the barrier stalls "
                             "of a shared machine, bench/README.md)")
    parser.add_argument("--out", metavar="DIR", help="append the rows to DIR/all_benchmark_data.csv")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "WAV"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.small, args.threads)))
        return 0
    results: Dict[str, dict] = {}
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as folder:
        def recording(minutes: float) -> Path:
            wav = Path(folder) / f"talk-{minutes:g}min.wav"
            if not wav.exists():
                start = time.perf_counter()
                write_recording(wav, minutes * 60.0)
                print(f"wrote {minutes:g} min of audio in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            return wav

        if not args.memory_only:
            wav = recording(args.minutes)
            for mode in ("stock", "optimized"):
                results[f"{mode}@{args.minutes:g}"] = measure(mode, wav, args.small, args.threads)
                print(f"{mode} {args.minutes:g} min: {results[f'{mode}@{args.minutes:g}']}", file=sys.stderr)
        if not args.speed_only:
            for minutes in args.memory_minutes:
                key = f"optimized@{minutes:g}"
                if key not in results:
                    results[key] = measure("optimized", recording(minutes), args.small, args.threads)
                print(f"optimized {minutes:g} min: {results[key]}", file=sys.stderr)
    load = (load_before, round(os.getloadavg()[0], 2))
    print(f"load average (1 min) before and after: {load}; models: {'small' if args.small else 'full size'}; "
          f"torch threads: {next(iter(results.values()))['threads'] if results else '-'}")
    print(f"{'run':<22}{'segmentation':>14}{'embeddings':>12}{'clustering':>12}{'total':>10}{'RTF':>9}{'peak RSS':>12}")
    for key, result in results.items():
        s = result["seconds"]
        print(f"{key:<22}{s['segmentation']:>13.1f}s{s['embeddings']:>11.1f}s{s['clustering']:>11.2f}s"
              f"{s['total']:>9.1f}s{s['total'] / result['audio_seconds']:>9.4f}{result['peak_rss_bytes'] / 1e6:>10.0f}MB")
    stock, fast = results.get(f"stock@{args.minutes:g}"), results.get(f"optimized@{args.minutes:g}")
    if stock and fast:
        print(f"whole pipeline: {stock['seconds']['total'] / fast['seconds']['total']:.2f}x stock "
              f"({args.minutes:g} min of audio)")
    short, long = (results.get(f"optimized@{m:g}") for m in args.memory_minutes)
    if short and long:
        extra = (long["audio_seconds"] - short["audio_seconds"]) * WAVEFORM_BYTES_PER_SECOND
        bound = short["peak_rss_bytes"] + MEMORY_SLOPE * extra
        print(f"memory: {args.memory_minutes[1]:g}-min peak {long['peak_rss_bytes'] / 1e6:.0f} MB, bound "
              f"{bound / 1e6:.0f} MB (the {args.memory_minutes[0]:g}-min peak {short['peak_rss_bytes'] / 1e6:.0f} MB "
              f"+ {MEMORY_SLOPE} x {extra / 1e6:.0f} MB of extra waveform): "
              f"{'met' if long['peak_rss_bytes'] <= bound else 'NOT met'}")
    if args.out:
        _append_csv(_rows(results, args.small, load), Path(args.out), quick=args.small)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))   # the repo root: bench.*, tests.*
    raise SystemExit(main())
