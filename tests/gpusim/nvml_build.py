"""Builds gpusim's C libraries with gcc, once per source version: libnvidia-ml.so.1 from
libnvml/nvml.c and libcuda.so.1 from libcuda/cuda.c, both over libsim/sim.h."""

import hashlib
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "libsim", "sim.h")
# gpusim in a checkout (CHECKOUT/tests/gpusim) caches its builds in CHECKOUT/.build, as the
# checkout's tools keep theirs: two checkouts never share a build.
TESTS = os.path.dirname(HERE)
CHECKOUT = os.path.dirname(TESTS) if os.path.basename(TESTS) == "tests" else None

# Which entry points a build leaves out, as an older driver's library lacks them: pynvml looks
# each function up by name (dlsym), so a missing symbol is what it meets on such a host.
NVML_FLAVORS = {
    "current": [],
    # No nvmlDeviceGetMemoryInfo_v2 (reserved memory reported apart) and no
    # nvmlDeviceGetComputeRunningProcesses_v3: an older driver's library.
    "old": ["-DGPUSIM_NO_MEMORY_V2", "-DGPUSIM_NO_PROCESSES_V3"],
    # Only the unversioned (v1) process call is left.
    "oldest": ["-DGPUSIM_NO_MEMORY_V2", "-DGPUSIM_NO_PROCESSES_V3", "-DGPUSIM_NO_PROCESSES_V2"],
}

LIBRARIES = {
    "nvml": {"source": os.path.join(HERE, "libnvml", "nvml.c"), "soname": "libnvidia-ml.so.1",
             "flavors": NVML_FLAVORS, "libs": []},
    # The probe's threads each hold a context: the library keeps its records under a mutex.
    "cuda": {"source": os.path.join(HERE, "libcuda", "cuda.c"), "soname": "libcuda.so.1",
             "flavors": {"current": []}, "libs": ["-lpthread"]},
}

# The names older callers import.
SOURCE = LIBRARIES["nvml"]["source"]
SONAME = LIBRARIES["nvml"]["soname"]
FLAVORS = NVML_FLAVORS


class BuildError(RuntimeError):
    pass


def _digest(paths):
    sha = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            sha.update(f.read())
    return sha.hexdigest()[:16]


def default_cache_dir(library="nvml"):
    """Where builds of library are cached: CHECKOUT/.build/gpusim/lib<library> in a checkout;
    gpusim copied elsewhere (a container image's) uses the temporary directory."""
    if CHECKOUT:
        return os.path.join(CHECKOUT, ".build", "gpusim", "lib" + library)
    return os.path.join(tempfile.gettempdir(), "gpusim-lib%s-%d" % (library, os.getuid()))


def build(cache_dir=None, cc=None, flavor="current", library="nvml"):
    """Return the path of a built library ("nvml" or "cuda"), compiling it if its sources are new.

    The cache (cache_dir, default default_cache_dir(library)) is keyed by the sources' hash and
    the flavor (NVML_FLAVORS), so concurrent test workers share one build and an edited source is
    rebuilt. Raises BuildError (with gcc's output) when it cannot build.
    """
    spec = LIBRARIES[library]
    if flavor not in spec["flavors"]:
        raise ValueError("unknown flavor %r (known: %s)" % (flavor, ", ".join(sorted(spec["flavors"]))))
    digest = _digest([spec["source"], SHARED])
    cache_dir = cache_dir or default_cache_dir(library)
    out_dir = os.path.join(cache_dir, digest if flavor == "current" else "%s-%s" % (digest, flavor))
    lib = os.path.join(out_dir, spec["soname"])
    if os.path.isfile(lib):
        return lib
    cc = cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise BuildError("no C compiler found (install gcc)")
    os.makedirs(out_dir, exist_ok=True)
    tmp = "%s.tmp.%d" % (lib, os.getpid())
    flags = ["-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-Wl,-soname," + spec["soname"]]
    proc = subprocess.run([cc] + flags + spec["flavors"][flavor] + ["-o", tmp, spec["source"]] + spec["libs"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError("%s failed (%d):\n%s" % (cc, proc.returncode, proc.stderr))
    os.replace(tmp, lib)
    return lib


if __name__ == "__main__":
    print(build())
