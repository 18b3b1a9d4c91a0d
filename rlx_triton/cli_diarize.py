"""`rlx-triton diarize`: a folder of recordings through a pyannote.audio pipeline, RTTM files out.

    rlx-triton diarize AUDIO_OR_DIR... --pipeline NAME_OR_PATH --out DIR [--resume] [--workers N]
        [--ray [ADDRESS]] [--num-speakers N] [--min-speakers N] [--max-speakers N] [--device cpu|cuda]

It calls rt.integrations.pyannote.diarize_files (rlx_triton/integrations/_pyannote_files.py) with the files
found, shows a progress bar over them (hours of audio done, running real-time factor) and ends with a
one-screen summary. Exit code 0 when every file is done or skipped, 1 when any failed, 2 for a usage error
(no audio found, a pipeline that cannot be loaded, ray missing for --ray).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import List, Optional

from rlx_triton.cli_explain import UsageError
from rlx_triton.json_output import write_json

# the suffixes a folder is searched for (soundfile reads the first five; pyannote's loader the others)
AUDIO_SUFFIXES = (".wav", ".wave", ".flac", ".ogg", ".oga", ".mp3", ".m4a", ".mp4", ".opus", ".aac", ".wma", ".webm")
PICKLED_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle")
CONFIG_SUFFIXES = (".yaml", ".yml")
FAILED_LINES = 10      # failed files listed in the summary; the rest are counted
EXIT_OK, EXIT_FAILED = 0, 1   # rlx_triton.cli's codes (usage errors, 2, are raised as UsageError)

DESCRIPTION = """\
Diarize audio files with a pyannote.audio SpeakerDiarization pipeline, optimized by rlx_triton.
Per file, OUT/<name>.rttm (the diarization) and OUT/<name>.exclusive.rttm (no overlapping turns) are
written whole or not at all; OUT/summary.json lists every file with its status, error, seconds per stage,
audio seconds and real-time factor. A file that cannot be read or diarized is reported and the others go
on. Exit code: 0 when every file is done or skipped, 1 when any failed, 2 for a usage error."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="AUDIO_OR_DIR",
                        help="audio files, and folders searched recursively for audio files ("
                             + " ".join(AUDIO_SUFFIXES) + "); names (without suffix) must differ")
    parser.add_argument("--pipeline", required=True, metavar="NAME_OR_PATH",
                        help="the pyannote.audio pipeline: a Hugging Face name (e.g. "
                             "pyannote/speaker-diarization-community-1; the token is read from HF_TOKEN), a local "
                             "config.yaml or the folder holding it, or a pipeline object saved with "
                             "torch.save (.pt, .pth) or pickle (.pkl, .pickle), which is unpickled: only load "
                             "files you trust")
    parser.add_argument("--out", required=True, metavar="DIR", help="the output folder (created if missing)")
    parser.add_argument("--resume", action="store_true",
                        help="skip the files whose two RTTM files are already in --out")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="local worker processes, one torch thread each (default 1: this process)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run each file as a Ray task: on the cluster at ADDRESS (ray.init(address=ADDRESS)) "
                             "or, without ADDRESS, on a local one started here; needs ray "
                             "(pip install 'rlx-triton[ray]'). Give --ray after the inputs, or as --ray=ADDRESS")
    parser.add_argument("--num-speakers", type=int, default=None, metavar="N",
                        help="the number of speakers, when known (every file)")
    parser.add_argument("--min-speakers", type=int, default=None, metavar="N",
                        help="at least this many speakers (no effect with --num-speakers)")
    parser.add_argument("--max-speakers", type=int, default=None, metavar="N",
                        help="at most this many speakers (no effect with --num-speakers)")
    parser.add_argument("--device", default=None, metavar="cpu|cuda",
                        help="move the pipeline to this device: cpu, cuda or cuda:N (default: where it loads, "
                             "the CPU)")
    parser.add_argument("--json", metavar="PATH",
                        help="write the summary as JSON to PATH ('-': stdout, nothing else)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def audio_files(inputs: List[str]) -> List[str]:
    """The files named and the audio files under the folders named (sorted), in the order given."""
    found: List[str] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += sorted(str(p) for p in path.rglob("*")
                            if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        else:
            found.append(item)   # a missing file is reported as failed, as diarize_files does
    return found


def load_pipeline(name_or_path: str):
    """The pipeline a --pipeline value names (see its help)."""
    path = Path(name_or_path)
    if path.suffix.lower() in PICKLED_SUFFIXES + CONFIG_SUFFIXES and not path.exists():
        raise UsageError(f"--pipeline {name_or_path}: no such file")
    if path.is_file() and path.suffix.lower() in PICKLED_SUFFIXES:
        if path.suffix.lower() in (".pt", ".pth"):
            import torch

            return torch.load(path, map_location="cpu", weights_only=False)
        import pickle

        with open(path, "rb") as handle:
            return pickle.load(handle)
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")   # pyannote's default posts telemetry
    try:
        from pyannote.audio import Pipeline
    except ImportError as error:
        raise UsageError(f"pyannote.audio is not installed ({error}): pip install 'rlx-triton[pyannote]'") from None
    pipeline = Pipeline.from_pretrained(name_or_path, token=os.environ.get("HF_TOKEN"))
    if pipeline is None:
        raise UsageError(f"--pipeline {name_or_path}: pyannote.audio could not load it")
    return pipeline


def _device(name: Optional[str]):
    import torch

    if name is None:
        return None
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {name!r} is not a device name (cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: no CUDA device is visible to torch here")
    return device


def _check(args) -> None:
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.ray is not None and args.workers != 1:
        raise UsageError("--workers sets local processes; with --ray the Ray cluster's CPUs set the parallelism")
    for name in ("num_speakers", "min_speakers", "max_speakers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def summary_lines(summary: dict, out_dir: str) -> List[str]:
    """The one-screen summary: counts, hours of audio and the real-time factor, seconds per stage, failures."""
    done = [record for record in summary["files"] if record["status"] == "done"]
    audio = sum(record["audio_seconds"] or 0.0 for record in done)
    stages = {stage: sum(record["seconds"][stage] or 0.0 for record in done)
              for stage in ("segmentation", "embeddings", "clustering", "total")}
    lines = [f"diarized {len(summary['files'])} files into {out_dir}: {summary['done']} done, "
             f"{summary['skipped']} skipped, {summary['failed']} failed"]
    if done:
        lines.append(f"audio {audio / 3600:.3f} h in {stages['total']:.1f} s of processing, real-time factor "
                     f"{stages['total'] / audio:.4f}" if audio else f"{stages['total']:.1f} s of processing")
        lines.append(f"stages: segmentation {stages['segmentation']:.1f} s, embeddings {stages['embeddings']:.1f} s, "
                     f"clustering {stages['clustering']:.1f} s")
    failed = [record for record in summary["files"] if record["status"] == "failed"]
    if failed:
        lines.append("failed:")
        lines += [f"  {record['error']}" for record in failed[:FAILED_LINES]]
        if len(failed) > FAILED_LINES:
            lines.append(f"  ... and {len(failed) - FAILED_LINES} more (see summary.json)")
    lines.append(f"summary: {Path(out_dir) / 'summary.json'}")
    return lines


def run(args) -> int:
    _check(args)
    files = audio_files(args.inputs)
    if not files:
        raise UsageError(f"no audio files found in {', '.join(args.inputs)} (suffixes: {' '.join(AUDIO_SUFFIXES)})")
    from rlx_triton.integrations._pyannote_files import import_ray

    if args.ray is not None:
        try:
            ray = import_ray()
        except ImportError as error:
            raise UsageError(str(error)) from None
        if args.ray and not ray.is_initialized():
            ray.init(address=args.ray)
    pipeline = load_pipeline(args.pipeline)
    device = _device(args.device)
    if device is not None:
        pipeline.to(device)
    from rlx_triton.integrations.pyannote import diarize_files

    speakers = {name: getattr(args, name) for name in ("num_speakers", "min_speakers", "max_speakers")
                if getattr(args, name) is not None}
    try:
        summary = diarize_files(pipeline, files, args.out, resume=args.resume, workers=args.workers,
                                runner="ray" if args.ray is not None else "local", progress=not args.quiet,
                                **speakers)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    if not write_json(args.json, summary):
        print("\n".join(summary_lines(summary, args.out)))
    return EXIT_FAILED if summary["failed"] else EXIT_OK


def add_parser(sub) -> None:
    """Adds the diarize subcommand to the rlx-triton parser's subparsers."""
    diarize = sub.add_parser("diarize", help="diarize audio files or folders with a pyannote.audio pipeline (RTTM out)",
                             description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(diarize)
    diarize.set_defaults(run=run)

