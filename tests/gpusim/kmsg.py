"""The simulated kernel log: a file of /dev/kmsg records, one a line, as the kernel's ring gives
them (Documentation/ABI/testing/dev-kmsg): "PRIO,SEQ,USEC,FLAGS;MESSAGE", then continuation
lines " KEY=VALUE". PRIO is facility << 3 | level; the kernel's own records are facility 0, and
what userspace (root) writes to /dev/kmsg is filed as the user facility (1) unless it names
another, never as the kernel's (printk.c, devkmsg_write). SEQ counts every record; USEC is the
time in microseconds since boot (this machine's boot: /proc/stat's btime, as the collection
reads it). The file only grows: no record is overwritten, so none is lost to a reader.
"""

import fcntl
import os
import re

KERNEL, USER = 0, 1
LEVEL_ERR, LEVEL_WARNING, LEVEL_DEFAULT = 3, 4, 4
RECORD = "{prio},{seq},{usec},-;{text}\n"
RECORD_RE = re.compile(r"^([0-9]+),([0-9]+),([0-9]+),[^;]*;")
PREFIX_RE = re.compile(r"^<([0-9]+)>")
UNPRINTABLE_RE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
TAIL = 65536


def boot_time():
    with open("/proc/stat") as handle:
        for line in handle:
            if line.startswith("btime "):
                return int(line.split()[1])
    raise OSError("no btime in /proc/stat")


def usec(when):
    """The record time of epoch seconds when: microseconds since boot (none before it)."""
    return max(0, int(round((when - boot_time()) * 1000000)))


def create(path, mode=0o644):
    """A fresh, empty ring (a new file: a reader starts over), writable by its owner only."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w"):
        pass
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def append(path, records):
    """Append records, (prio, usec, text, dictionary lines), numbered on from the last one there."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        seq = _next_seq(handle)
        lines, escaped = [], {}
        for prio, time_us, text, extra in records:
            if text not in escaped:
                escaped[text] = _escape(text)
            lines.append(RECORD.format(prio=prio, seq=seq, usec=time_us, text=escaped[text]))
            lines.extend(" %s\n" % line for line in extra)
            seq += 1
        handle.write("".join(lines))


def kernel(text, when_us, level=LEVEL_ERR, extra=()):
    """A record the kernel writes (facility 0)."""
    return (KERNEL << 3 | level, when_us, text, tuple(extra))


def from_user(line, when_us):
    """The record of a line that root's userspace writes to /dev/kmsg (echo LINE > /dev/kmsg): a
    "<N>" prefix gives the level and facility, but facility 0 is filed as the user's."""
    level, facility = LEVEL_DEFAULT, USER
    match = PREFIX_RE.match(line)
    if match:
        value = int(match.group(1))
        level = value & 7
        facility = (value >> 3) or USER
        line = line[match.end():]
    return (facility << 3 | level, when_us, line.rstrip("\n"), ())


def records(path):
    """[(facility, level, seq, usec, message)] of every record in the file."""
    found = []
    with open(path) as handle:
        for line in handle:
            match = RECORD_RE.match(line)
            if match:
                prio, seq, time_us = (int(group) for group in match.groups())
                found.append((prio >> 3, prio & 7, seq, time_us, line[match.end():].rstrip("\n")))
    return found


def _next_seq(handle):
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - TAIL))
    for line in reversed(handle.read().splitlines()):
        match = RECORD_RE.match(line)
        if match:
            return int(match.group(2)) + 1
    return 0


def _escape(text):
    """As the kernel prints a message in a record: each byte of a control character, a backslash
    or a character beyond ASCII as \\xNN."""
    return UNPRINTABLE_RE.sub(lambda match: "".join("\\x%02x" % byte for byte in match.group().encode("utf-8")), text)
