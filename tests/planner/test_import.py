"""The planner's public surface: importable without torch or triton, every public name re-exported."""
import subprocess
import sys

import rlx_triton.planner as planner

PUBLIC_NAMES = """
KernelFamily ScalarType ConvertPolicy RolePrecision HybridPrecisionSpec PrecisionProfile PrecisionProfileTag
ThreadPolicy MemoryPolicy TunePolicy TuneCacheEviction TokenBucketStrategy ObjectiveWeights KernelPlan
KernelPlanBuilder LaunchConfig LaunchBuilder ShapeBucket shape_bucket TuneCacheKey tune_cache_key TuneCache
SdpaDecodeCandidate SdpaDecodeVariant ConvCandidate ConvVariant FbankCandidate FbankVariant LstmCandidate
LstmVariant SegdenseCandidate SegdenseVariant PlanError EmptyCandidates UnsupportedFamily InvalidCandidate
InvalidPrecision InvalidObjectiveWeights LaunchError MissingField InvalidField CandidateNotPresent bucket_pow2
""".split()


def test_every_public_name_is_exported():
    assert set(PUBLIC_NAMES) <= set(planner.__all__)
    for name in planner.__all__:
        assert getattr(planner, name) is not None, name


def test_import_does_not_pull_torch_or_triton():
    code = (
        "import sys, rlx_triton.planner, rlx_triton.planner.tune_cache;"
        "from rlx_triton.planner import KernelPlanBuilder, KernelFamily, LaunchBuilder;"
        "[KernelPlanBuilder(f).build_plan() for f in KernelFamily];"
        "heavy = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_planner_modules_do_not_read_the_environment():
    import inspect
    import pkgutil

    for info in pkgutil.walk_packages(planner.__path__, planner.__name__ + "."):
        source = inspect.getsource(__import__(info.name, fromlist=["_"]))
        assert "os.environ" not in source and "getenv" not in source, info.name


def test_error_hierarchy():
    for name in ("EmptyCandidates", "UnsupportedFamily", "InvalidCandidate", "InvalidPrecision", "InvalidObjectiveWeights"):
        assert issubclass(getattr(planner, name), planner.PlanError)
    for name in ("MissingField", "InvalidField", "CandidateNotPresent"):
        assert issubclass(getattr(planner, name), planner.LaunchError)
    assert issubclass(planner.PlanError, ValueError) and issubclass(planner.LaunchError, ValueError)


def test_enum_values_match_the_settings_names():
    from rlx_triton.config import EVICTION_NAMES, PROFILE_NAMES

    assert tuple(e.value for e in planner.TuneCacheEviction) == EVICTION_NAMES
    assert tuple(p.value for p in planner.PrecisionProfile) == PROFILE_NAMES
    assert [f.value for f in planner.KernelFamily] == ["sdpa_decode", "conv", "fbank", "lstm", "segdense",
                                                      "varlen_attention"]
