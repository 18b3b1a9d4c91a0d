"""Diarize many audio files with a pyannote.audio SpeakerDiarization pipeline: RTTM files out, resumable, in
bounded memory, in several processes or as Ray tasks (`run_files`, what rt.integrations.pyannote.diarize_files
runs).

Per file: the audio is read (soundfile for WAV/FLAC/OGG, pyannote's own loader otherwise), mixed down to one
channel and resampled to the pipeline's rate once, then goes through
rlx_triton.integrations._pyannote_streaming.diarize (the pipeline's own steps; clustering and reconstruction
in memory linear in the audio); `<uri>.rttm` and `<uri>.exclusive.rttm` are written under a temporary name
and renamed, so a file under its final name is always complete (the exclusive one is renamed first: the RTTM
marks the file as done). A file that fails is reported, with an error naming it, and the others go on.

Runners: "local" with workers=1 diarizes in the calling process; workers=N starts N processes, each with one
torch thread, that take files one at a time (forked where the platform forks and the pipeline is off CUDA,
so the pipeline is not pickled; spawned otherwise, with the pipeline pickled); a process that dies takes its
file down with it (reported failed; resume=True redoes it). "ray" runs each file as a Ray task on the
cluster the process is connected to (ray.init() if none), the pipeline shipped once through the object
store; a task whose worker dies is retried by Ray. Every runner computes the same bytes.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

RUNNERS = ("local", "ray")
SPEAKER_KEYWORDS = ("num_speakers", "min_speakers", "max_speakers")
SOUNDFILE_SUFFIXES = (".wav", ".wave", ".flac", ".ogg", ".oga")
TEMPORARY_SUFFIX = ".tmp"
RAY_TASK_RETRIES = 2     # attempts after the first when a task's worker process dies


@dataclass(frozen=True)
class Job:
    index: int
    path: str
    uri: str


@dataclass(frozen=True)
class Options:
    out_dir: str
    batch_size: Optional[int]
    speakers: Tuple[Tuple[str, Optional[int]], ...]
    sample_rate: int


# ---------------------------------------------------------------------------------------------
# files on disk
# ---------------------------------------------------------------------------------------------
def rttm_paths(out_dir: Path, uri: str) -> Tuple[Path, Path]:
    """(out_dir/<uri>.rttm, out_dir/<uri>.exclusive.rttm)."""
    return out_dir / f"{uri}.rttm", out_dir / f"{uri}.exclusive.rttm"


def is_complete(out_dir: Path, uri: str) -> bool:
    """Whether both RTTM files of `uri` exist (each is written whole or not at all)."""
    return all(path.is_file() for path in rttm_paths(out_dir, uri))


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{TEMPORARY_SUFFIX}")


def remove_temporaries(out_dir: Path, uri: str) -> None:
    """Removes what an interrupted write of `uri`'s files left behind."""
    for path in rttm_paths(out_dir, uri):
        for leftover in out_dir.glob(f".{path.name}.*{TEMPORARY_SUFFIX}"):
            leftover.unlink(missing_ok=True)


def write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """write(text file) into a temporary file beside `path`, flushed to disk, then renamed to `path`."""
    temporary = _temporary(path)
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load_audio(path: str, sample_rate: int):
    """(1, samples) float32 waveform of `path` at `sample_rate` (channels averaged), and its duration in seconds."""
    import torch

    if Path(path).suffix.lower() in SOUNDFILE_SUFFIXES:
        import soundfile

        data, rate = soundfile.read(path, dtype="float32", always_2d=True)
        waveform = torch.from_numpy(data.T)
    else:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such file: {path}")
        from pyannote.audio.core.io import Audio

        waveform, rate = Audio()({"audio": path})
        waveform = waveform.to(torch.float32)
    if waveform.shape[1] == 0:
        raise ValueError("the file holds no audio samples")
    if waveform.shape[0] > 1:
        waveform = waveform.mean(dim=0, keepdim=True)
    if rate != sample_rate:
        import torchaudio

        waveform = torchaudio.functional.resample(waveform, rate, sample_rate)
    return waveform.contiguous(), waveform.shape[1] / sample_rate


def audio_seconds(path: str) -> Optional[float]:
    """The duration a file's header states (None where it cannot be read cheaply)."""
    if Path(path).suffix.lower() not in SOUNDFILE_SUFFIXES:
        return None
    try:
        import soundfile

        return float(soundfile.info(path).duration)
    except Exception:
        return None


def entry(job: Job, status: str, error: Optional[str] = None, seconds: Optional[Dict[str, float]] = None,
          audio: Optional[float] = None, total: Optional[float] = None) -> dict:
    """One file's record in summary.json."""
    from rlx_triton.integrations._pyannote_streaming import STAGES

    stage_seconds: Dict[str, Optional[float]] = {stage: None for stage in STAGES}
    if seconds is not None:
        stage_seconds.update({stage: round(seconds[stage], 4) for stage in STAGES})
    stage_seconds["total"] = None if total is None else round(total, 4)
    audio_seconds = None if audio is None else round(audio, 4)
    # from the figures the record shows, so that rtf = total / audio_seconds holds in summary.json itself
    rtf = round(stage_seconds["total"] / audio_seconds, 6) \
        if stage_seconds["total"] is not None and audio_seconds else None
    return {"file": job.path, "uri": job.uri, "status": status, "error": error, "seconds": stage_seconds,
            "audio_seconds": audio_seconds, "rtf": rtf}


def diarize_one(pipeline, job: Job, options: Options) -> dict:
    """Diarizes one file and writes its two RTTM files; any error becomes a "failed" record naming the file."""
    from rlx_triton.integrations._pyannote_streaming import diarize

    out_dir = Path(options.out_dir)
    start = time.perf_counter()
    audio: Optional[float] = None
    try:
        remove_temporaries(out_dir, job.uri)
        if " " in job.uri:
            raise ValueError("RTTM does not allow spaces in a file's uri (its name without the suffix)")
        waveform, audio = load_audio(job.path, options.sample_rate)
        file = {"waveform": waveform, "sample_rate": options.sample_rate, "uri": job.uri}
        del waveform
        result = diarize(pipeline, file, batch_size=options.batch_size, release_audio=True,
                         **dict(options.speakers))
        rttm, exclusive = rttm_paths(out_dir, job.uri)
        write_atomically(exclusive, result.exclusive_speaker_diarization.write_rttm)
        write_atomically(rttm, result.speaker_diarization.write_rttm)
    except Exception as error:   # one bad file must not stop the others
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return entry(job, "failed", f"{job.path}: {type(error).__name__}: {message}".rstrip(": "), audio=audio)
    return entry(job, "done", seconds=result.seconds, audio=audio, total=time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# runners
# ---------------------------------------------------------------------------------------------
def _pipeline_on_cuda(pipeline) -> bool:
    import torch

    devices = [getattr(pipeline._embedding, "device", None), getattr(pipeline._segmentation, "device", None)]
    return any(isinstance(device, torch.device) and device.type == "cuda" for device in devices)


def _worker(connection, pipeline, options: Options) -> None:
    """A local worker process: one torch thread (forked children must not reuse the parent's OpenMP pool), then
    one file per message until None."""
    import torch

    torch.set_num_threads(1)
    while True:
        job = connection.recv()
        if job is None:
            return
        connection.send(diarize_one(pipeline, job, options))


class _Process:
    def __init__(self, context, pipeline, options: Options):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, pipeline, options), daemon=True)
        try:
            self.process.start()
        except (TypeError, AttributeError, pickle.PicklingError) as error:   # spawn pickles the pipeline
            raise TypeError(f"diarize_files: workers > 1 starts processes with the {context.get_start_method()!r} "
                            f"method here, which pickles the pipeline, and it does not pickle ({error}); "
                            f"use runner='ray' (cloudpickle) or workers=1") from error
        finally:
            child.close()
        self.job: Optional[Job] = None

    def give(self, job: Optional[Job]) -> None:
        self.job = job
        self.connection.send(job)

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=10)
        self.connection.close()


def run_local_processes(pipeline, jobs: List[Job], workers: int, options: Options,
                        report: Callable[[int, dict], None]) -> None:
    """Diarizes `jobs` in `workers` processes; report(job index, record) as each file ends."""
    methods = multiprocessing.get_all_start_methods()
    method = "fork" if "fork" in methods and not _pipeline_on_cuda(pipeline) else "spawn"
    context = multiprocessing.get_context(method)
    pending = list(reversed(jobs))
    processes: List[_Process] = []
    try:
        for _ in range(min(workers, len(jobs))):
            process = _Process(context, pipeline, options)
            processes.append(process)
            process.give(pending.pop())
        while any(process.job is not None for process in processes):
            busy = [process for process in processes if process.job is not None]
            waitables: List[Any] = [process.connection for process in busy] + [process.process.sentinel for process in busy]
            ready = multiprocessing.connection.wait(waitables)
            for process in busy:
                job = process.job
                assert job is not None
                if process.connection in ready or process.connection.poll():
                    try:
                        record = process.connection.recv()
                    except (EOFError, OSError):
                        record = None
                    if record is not None:
                        report(job.index, record)
                        process.give(pending.pop() if pending else None)
                        continue
                if process.process.sentinel in ready or not process.process.is_alive():
                    process.process.join(timeout=10)
                    report(job.index, entry(job, "failed", f"{job.path}: the worker process diarizing it died "
                                                           f"(exit code {process.process.exitcode}); "
                                                           f"run again with resume=True to redo it"))
                    process.stop()
                    processes.remove(process)
                    if pending:
                        replacement = _Process(context, pipeline, options)
                        processes.append(replacement)
                        replacement.give(pending.pop())
    finally:
        for process in processes:
            process.stop()


def _ray_task(pipeline, job: Job, options: Options) -> dict:
    return diarize_one(pipeline, job, options)


def import_ray():
    try:
        import ray
    except ImportError as error:
        raise ImportError("runner='ray' needs ray, which is not installed: pip install 'rlx-triton[ray]' "
                          "(or pip install ray)") from error
    return ray


def run_ray(pipeline, jobs: List[Job], options: Options, report: Callable[[int, dict], None]) -> None:
    """Diarizes `jobs` as Ray tasks (one CPU each, or one GPU for a pipeline on CUDA) on the cluster this
    process is connected to, or on a local one started here; report(job index, record) as each ends."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    resources = {"num_gpus": 1} if _pipeline_on_cuda(pipeline) else {"num_cpus": 1}
    task = ray.remote(_ray_task).options(max_retries=RAY_TASK_RETRIES, retry_exceptions=False, **resources)
    shared = ray.put(pipeline)
    waiting = {task.remote(shared, job, options): job for job in jobs}
    while waiting:
        done, _ = ray.wait(list(waiting), num_returns=1)
        job = waiting.pop(done[0])
        try:
            record = ray.get(done[0])
        except Exception as error:   # the task's worker died more often than its retries
            record = entry(job, "failed", f"{job.path}: the Ray task diarizing it failed: {type(error).__name__}: "
                                          f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}")
        report(job.index, record)


# ---------------------------------------------------------------------------------------------
# diarize_files
# ---------------------------------------------------------------------------------------------
def _paths(files) -> List[str]:
    if isinstance(files, (str, os.PathLike)):
        return [os.fspath(files)]
    if isinstance(files, bytes) or not isinstance(files, Iterable):
        raise TypeError(f"diarize_files: files must be audio paths (str or os.PathLike), got {type(files).__name__}")
    paths = []
    for item in files:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"diarize_files: files must hold str or os.PathLike paths, got {type(item).__name__}")
        paths.append(os.fspath(item))
    return paths


def _check_speakers(kwargs: Dict[str, Any]) -> Tuple[Tuple[str, Optional[int]], ...]:
    unknown = [name for name in kwargs if name not in SPEAKER_KEYWORDS]
    if unknown:
        raise TypeError(f"diarize_files got an unexpected keyword argument {unknown[0]!r} "
                        f"(pipeline keywords: {', '.join(SPEAKER_KEYWORDS)})")
    for name, value in kwargs.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"diarize_files: {name} must be None or an int >= 1, got {value!r}")
    from pyannote.audio.pipelines.utils.diarization import set_num_speakers   # its ValueError for min > max

    set_num_speakers(kwargs.get("num_speakers"), kwargs.get("min_speakers"), kwargs.get("max_speakers"))
    return tuple((name, kwargs[name]) for name in SPEAKER_KEYWORDS if name in kwargs)


def _check_arguments(pipeline, out_dir, resume, workers, runner, batch_size, progress) -> None:
    from rlx_triton.integrations._pyannote_pipeline import is_speaker_diarization

    if not is_speaker_diarization(pipeline):
        raise TypeError(f"diarize_files: pipeline must be a pyannote.audio SpeakerDiarization pipeline, "
                        f"got {type(pipeline).__name__}")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"diarize_files: out_dir must be a path (str or os.PathLike), got {type(out_dir).__name__}")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"diarize_files: out_dir {os.fspath(out_dir)!r} exists and is not a directory")
    for name, value in (("resume", resume), ("progress", progress)):
        if not isinstance(value, bool):
            raise TypeError(f"diarize_files: {name} must be True or False, got {value!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"diarize_files: workers must be an int >= 1, got {workers!r}")
    if runner not in RUNNERS:
        raise ValueError(f"diarize_files: runner must be one of {', '.join(map(repr, RUNNERS))}, got {runner!r}")
    if runner == "ray" and workers != 1:
        raise ValueError("diarize_files: workers sets the local processes; with runner='ray' the Ray cluster's "
                         f"CPUs set the parallelism (got workers={workers})")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"diarize_files: batch_size must be None or an int >= 1, got {batch_size!r}")
    if getattr(pipeline, "training", False):
        raise ValueError("diarize_files: the pipeline is in training mode (pipeline.training = False first)")


def _jobs(paths: List[str]) -> List[Job]:
    owners: Dict[str, str] = {}
    jobs = []
    for index, path in enumerate(paths):
        uri = Path(path).stem if Path(path).suffix else Path(path).name
        if uri in owners:
            raise ValueError(f"diarize_files: {owners[uri]!r} and {path!r} would both write {uri}.rttm; "
                             f"give files with distinct names")
        owners[uri] = path
        jobs.append(Job(index, path, uri))
    return jobs


def _summary(records: List[dict]) -> dict:
    return {"files": records, **{status: sum(record["status"] == status for record in records)
                                  for status in ("done", "skipped", "failed")}}


class _Reporter:
    """Collects the records and moves the progress bar: files, hours of audio done and the running RTF."""

    def __init__(self, records: List[Optional[dict]], total: int, enabled: bool):
        from rlx_triton.progress import Progress

        self.records = records
        self.progress = Progress(total, "diarize", unit="file", enabled=enabled)
        self.audio = 0.0
        self.busy = 0.0
        self.failed = 0

    def __call__(self, index: int, record: dict) -> None:
        self.records[index] = record
        if record["status"] == "done":
            self.audio += record["audio_seconds"] or 0.0
            self.busy += record["seconds"]["total"] or 0.0
        self.failed += record["status"] == "failed"
        rtf = f"RTF {self.busy / self.audio:.3f}" if self.audio else "RTF -"
        self.progress.set_label(f"{self.audio / 3600:.2f} h audio, {rtf}"
                                + (f", {self.failed} failed" if self.failed else ""))
        self.progress.update()


def run_files(pipeline, files, out_dir, *, resume: bool, workers: int, runner: str, batch_size: Optional[int],
              progress: bool, optimizer: Callable[[Any], Any], pipeline_kwargs: Dict[str, Any]) -> dict:
    """rt.integrations.pyannote.diarize_files (its docstring says what each argument means); `optimizer` is
    rt.integrations.pyannote.optimize, applied to a pipeline that is not optimized yet."""
    _check_arguments(pipeline, out_dir, resume, workers, runner, batch_size, progress)
    speakers = _check_speakers(pipeline_kwargs)
    jobs = _jobs(_paths(files))
    if runner == "ray":
        import_ray()
    from rlx_triton.integrations._pyannote_pipeline import SharedTrunkEmbeddings

    if not isinstance(pipeline.__dict__.get("get_embeddings"), SharedTrunkEmbeddings):
        optimizer(pipeline)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    options = Options(os.fspath(folder), batch_size, speakers, int(pipeline._audio.sample_rate))
    records: List[Optional[dict]] = [None] * len(jobs)
    reporter = _Reporter(records, len(jobs), progress)
    todo = []
    try:
        for job in jobs:
            if resume and is_complete(folder, job.uri):
                reporter(job.index, entry(job, "skipped", audio=audio_seconds(job.path)))
            else:
                todo.append(job)
        if runner == "ray":
            run_ray(pipeline, todo, options, reporter)
        elif workers > 1 and len(todo) > 1:
            run_local_processes(pipeline, todo, workers, options, reporter)
        else:
            for job in todo:
                reporter(job.index, diarize_one(pipeline, job, options))
    finally:
        reporter.progress.close()
    summary = _summary([record for record in records if record is not None])
    write_atomically(folder / "summary.json", lambda handle: handle.write(json.dumps(summary, indent=2) + "\n"))
    return summary


__all__ = ["diarize_one", "run_files", "is_complete", "load_audio", "rttm_paths", "run_local_processes",
           "run_ray", "write_atomically"]
