"""Real cgroups for simulated jobs: a holder placed where slurmstepd puts a job's tasks.

A cgroup is named as /proc/PID/cgroup names it, CONTROLLER:PATH: ``freezer:/slurm/uid_0/job_5/step_0``
(cgroup v1, where Slurm's proctrack/cgroup keeps a job) or ``:/system.slice/slurmstepd.scope/job_5/step_0``
(the unified hierarchy, cgroup v2). Creating one needs root and a writable hierarchy; every
directory made is recorded under ROOT and removed by ``gpusim stop``.
"""

import os

from gpusim.state import read_json, write_json


def job_cgroup(job_id, version=1, uid=0, step="0"):
    """The cgroup slurmstepd gives job_id's step on cgroup v1 or v2."""
    if version == 1:
        return "freezer:/slurm/uid_%d/job_%s/step_%s" % (uid, job_id, step)
    return ":/system.slice/slurmstepd.scope/job_%s/step_%s" % (job_id, step)


def mounts():
    """{controller: mount point}: '' for the unified hierarchy, each v1 controller by name."""
    found = {}
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _sep, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if not extra:
                continue
            if extra[0] == "cgroup2":
                found.setdefault("", fields[4])
            elif extra[0] == "cgroup":
                for option in extra[2].split(","):
                    if option in ("freezer", "memory", "devices", "pids", "cpuset") or option.startswith("name="):
                        found.setdefault(option, fields[4])
    return found


def available(version=1):
    """Why job cgroups of that version cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    where = mounts().get("freezer" if version == 1 else "")
    if where is None:
        return "no cgroup %s hierarchy is mounted" % ("v1 freezer" if version == 1 else "v2")
    if not os.access(where, os.W_OK):
        return "%s cannot be written" % where
    return None


def _record(paths):
    return os.path.join(paths.lib, "cgroups.json")


def enter(paths, spec):
    """Move this process into the cgroup spec (CONTROLLER:PATH), making its directories."""
    controller, _sep, path = spec.partition(":")
    base = mounts().get(controller)
    if base is None or not path.startswith("/"):
        raise RuntimeError("gpusim hold: no cgroup hierarchy %r mounted for %r" % (controller, spec))
    made = read_json(_record(paths)) or []
    current = base
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if not os.path.isdir(current):
            os.mkdir(current)
            made.append(current)
    write_json(_record(paths), made)
    with open(os.path.join(current, "cgroup.procs"), "w") as handle:
        handle.write(str(os.getpid()))


def remove_all(paths):
    """Remove the cgroup directories enter made (their processes are gone), deepest first."""
    made = read_json(_record(paths)) or []
    left = []
    for path in sorted(set(made), key=lambda p: -p.count("/")):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(path)
    if left:
        write_json(_record(paths), left)
    elif os.path.exists(_record(paths)):
        os.unlink(_record(paths))
    return left
