"""The fake dcgmi: `dcgmi discovery -l` against the simulated host's DCGM host engine.

The host engine is a gpusim holder whose comm is nv-hostengine (`hold --name nv-hostengine`, as
the quiesce scenario runs it under nvidia-dcgm.service). dcgmi connects to the host engine on
localhost: with none alive it prints the real tool's two lines (NVIDIA/DCGM#43, #133; its exit
status here is a guess) and fails; with one it lists the GPUs in the real table (NVIDIA/DCGM#229,
KempnerInstitute/kempnerpulse#15). The fault host-engine-hang: the next N host engines started
after it accept the connection and never answer, so dcgmi waits until it is killed; a host
engine started after those answers again (a restart cures it). Any other dcgmi command is refused.
"""

import sys

from gpusim.smi import hang
from gpusim.state import Paths, load_records, load_state, record_alive, write_json

HOST_ENGINE = "nv-hostengine"
NO_HOST_ENGINE = ("Error: unable to establish a connection to the specified host: localhost\n"
                  "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
# Guessed: the real tool's status for a host engine it cannot reach is not in our samples.
EXIT_NO_HOST_ENGINE = 255
RULE = "+--------+----------------------------------------------------------------------+"
# A hung host engine answers never; dcgmi waits this long at most (its caller kills it first).
HUNG_S = 3600.0


def host_engines(paths):
    """[pid, starttime] of the live host engines, the newest last."""
    return [[rec["pid"], rec.get("starttime")] for rec in load_records(paths)
            if rec.get("comm") == HOST_ENGINE and record_alive(rec)]


def is_hung(paths, engine):
    """Whether the host engine answers never: the first time dcgmi meets one started after the
    fault, it is among the next N, or it is not."""
    state = load_state(paths)
    fault = state.get("faults", {}).get("host_engine_hang")
    if not fault:
        return False
    if engine not in fault["known"]:
        fault["known"].append(engine)
        if fault["next"] > 0:
            fault["hung"].append(engine)
            fault["next"] -= 1
        write_json(paths.state, state)
    return engine in fault["hung"]


def discovery(paths, out):
    gpus = load_state(paths)["gpus"]
    out.write("%d GPU%s found.\n%s\n| GPU ID | %-68s |\n%s\n" % (
        len(gpus), "" if len(gpus) == 1 else "s", RULE, "Device Information", RULE))
    for g in gpus:
        for head, text in ((str(g["index"]), "Name: " + g["name"]), ("", "PCI Bus ID: " + g["pci_bus_id"]),
                           ("", "Device UUID: " + g["uuid"])):
            out.write("| %-6s | %-68s |\n" % (head, text))
        out.write(RULE + "\n")
    return 0


def main(root, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] != ["discovery", "-l"]:
        sys.stderr.write("gpusim's dcgmi knows only: dcgmi discovery -l\n")
        return 2
    paths = Paths(root)
    engines = host_engines(paths)
    if not engines:
        sys.stdout.write(NO_HOST_ENGINE)
        return EXIT_NO_HOST_ENGINE
    if is_hung(paths, engines[-1]):
        hang(HUNG_S)
    return discovery(paths, sys.stdout)
