"""Builds gpusim's libnvidia-ml.so.1 from libnvml/nvml.c with gcc, once per source version."""

import hashlib
import os
import shutil
import subprocess
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libnvml", "nvml.c")
SONAME = "libnvidia-ml.so.1"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-Wl,-soname," + SONAME]


# Which entry points a build leaves out, as an older driver's library lacks them: pynvml looks
# each function up by name (dlsym), so a missing symbol is what it meets on such a host.
FLAVORS = {
    "current": [],
    # No nvmlDeviceGetMemoryInfo_v2 (reserved memory reported apart) and no
    # nvmlDeviceGetComputeRunningProcesses_v3: an older driver's library.
    "old": ["-DGPUSIM_NO_MEMORY_V2", "-DGPUSIM_NO_PROCESSES_V3"],
    # Only the unversioned (v1) process call is left.
    "oldest": ["-DGPUSIM_NO_MEMORY_V2", "-DGPUSIM_NO_PROCESSES_V3", "-DGPUSIM_NO_PROCESSES_V2"],
}


class BuildError(RuntimeError):
    pass


def build(cache_dir=None, cc=None, flavor="current"):
    """Return the path of a built libnvidia-ml.so.1, compiling it if this source is new.

    The cache is keyed by the source's hash and the flavor (FLAVORS), so concurrent test
    workers share one build and an edited source is rebuilt. Raises BuildError (with gcc's
    output) when it cannot build.
    """
    if flavor not in FLAVORS:
        raise ValueError("unknown flavor %r (known: %s)" % (flavor, ", ".join(sorted(FLAVORS))))
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "gpusim-libnvml-%d" % os.getuid())
    out_dir = os.path.join(cache_dir, digest if flavor == "current" else "%s-%s" % (digest, flavor))
    lib = os.path.join(out_dir, SONAME)
    if os.path.isfile(lib):
        return lib
    cc = cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise BuildError("no C compiler found (install gcc)")
    os.makedirs(out_dir, exist_ok=True)
    tmp = "%s.tmp.%d" % (lib, os.getpid())
    proc = subprocess.run([cc] + CFLAGS + FLAVORS[flavor] + ["-o", tmp, SOURCE], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise BuildError("%s failed (%d):\n%s" % (cc, proc.returncode, proc.stderr))
    os.replace(tmp, lib)
    return lib


if __name__ == "__main__":
    print(build())
