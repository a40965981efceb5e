# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""A job's GPUs as Slurm numbers them (SLURM_JOB_GPUS) made nvidia-smi indexes, through gres.conf.

slurmd numbers a node's GPUs by their place in its gres.conf: the Name=gpu lines that apply to the
node, in the file's order, each File= expanded in the order written. SLURM_JOB_GPUS in a Prolog or
Epilog holds those places, not the number in a device file's name (Slurm 22.05: with File= listing
nvidia3 first, the first job gets SLURM_JOB_GPUS=0, as Slurm's current gres_common.c sets it). So:

    place in SLURM_JOB_GPUS -> gres.conf's device node there -> its minor number (st_rdev; N of
    nvidiaN for a simulated node, a regular file) -> the GPU the driver attached under that minor
    (/proc/driver/nvidia/gpus, read as the release reads it) -> that GPU's nvidia-smi index

and the order of gres.conf never matters. A MIG instance is one GRES of a MultipleFiles= line
(its GPU's node and its caps nodes, /dev/nvidia-caps/nvidia-capM) or of a File= naming a caps
node: each caps node's minor M is found in the driver's /proc/driver/nvidia/capabilities tree
(gpu<minor>/mig/gi<G>/access, .../ci<C>/access), which gives the instance as N:G (a GPU
instance's node) or N:G:C (with its compute instance's). What cannot be followed is a GresError
naming the problem, never a guess: no gres.conf, AutoDetect (Slurm then orders the GPUs it finds
itself), GPUs of several Type= on the node (slurmd groups them by type), Include, a File= that is
not a GPU's device node, a minor number no GPU has, a caps node the driver does not list, and any
line it cannot read.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import stat

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import check_device_node, nvidia_majors
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import DRIVER_GPUS, HostView, read_driver, under_root
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import CAPABILITIES, caps_minor
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import node_number

DEFAULT_SLURM_CONF = '/etc/slurm/slurm.conf'
# The driver's major number of /dev/nvidiaN (and nvidiactl); nvidia-uvm's and the caps' are dynamic.
NVIDIA_GPU_MAJOR = 195
# Bounds on what is read: a gres.conf past MAX_BYTES, or a hostlist expanding to more than
# MAX_NAMES names, is refused before it costs anything. Slurm's own limit is 1024 files a node.
MAX_BYTES = 1024 * 1024
MAX_NAMES = 100000
MAX_FILES = 1024
# gres.conf's parameters (case-insensitive, as Slurm reads them).
KEYS = frozenset(('autodetect', 'count', 'cores', 'cpus', 'file', 'flags', 'links', 'multiplefiles', 'name',
                  'nodename', 'type'))
RANGE_RE = re.compile(r'^([0-9]{1,9})(?:-([0-9]{1,9}))?$')
CAPS_NODE_RE = re.compile(r'^nvidia-cap([0-9]{1,9})$')
# In the driver's capabilities tree: gpu<minor>/mig/gi<G>/access and gpu<minor>/mig/gi<G>/ci<C>/access.
CAPS_ACCESS_RE = re.compile(r'^gpu([0-9]+)/mig/gi([0-9]+)(?:/ci([0-9]+))?/access$')


class GresError(ValueError):
    """The job's GPUs cannot be followed through gres.conf to the host's."""


def gres_conf_path(environ=None):
    """gres.conf: always in slurm.conf's directory (SLURM_CONF, which slurmd gives its Prolog and Epilog)."""
    environ = os.environ if environ is None else environ
    return os.path.join(os.path.dirname(environ.get('SLURM_CONF') or DEFAULT_SLURM_CONF), 'gres.conf')


def read_text(path):
    """The text of gres.conf, at most MAX_BYTES."""
    try:
        with open(path, 'rb') as handle:
            data = handle.read(MAX_BYTES + 1)
    except (IOError, OSError) as exc:
        raise GresError('cannot read %s (%s): without it the GPUs Slurm gave the job cannot be told apart'
                        % (printable(path), exc.strerror))
    if len(data) > MAX_BYTES:
        raise GresError('%s is larger than %d bytes' % (printable(path), MAX_BYTES))
    return data.decode('utf-8', 'replace')


def logical_lines(text):
    """(line number, text) of each line with its comment cut and its continuations (a trailing
    backslash) joined; empty lines left out."""
    start, pending = None, ''
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.split(r'(?<!\\)#', raw, maxsplit=1)[0].replace('\\#', '#')
        line = '%s %s' % (pending, line) if pending else line
        start = start or number
        if line.rstrip().endswith('\\'):
            pending = line.rstrip()[:-1]
            continue
        if line.strip():
            yield start, line.strip()
        start, pending = None, ''
    if pending.strip():
        yield start, pending.strip()


def parse_line(number, line):
    """{parameter (lower case): value} of one gres.conf line; GresError for what Slurm's own
    parameters are not."""
    where = 'gres.conf line %d' % number
    if line.split(None, 1)[0].lower() == 'include':
        raise GresError('%s includes another file (%s), which the hook does not follow: write the GPUs '
                        'in gres.conf itself' % (where, printable(line, 100)))
    fields = {}
    for token in line.split():
        key, sep, value = token.partition('=')
        if not sep or not key or not value or '"' in token or "'" in token:
            raise GresError("%s: '%s' is not a parameter=value" % (where, printable(token, 60)))
        if key.lower() not in KEYS:
            raise GresError("%s: '%s' is not a gres.conf parameter" % (where, printable(key, 60)))
        if key.lower() in fields:
            raise GresError('%s gives %s twice' % (where, printable(key, 60)))
        fields[key.lower()] = value
    return fields


def split_list(text, what):
    """The parts of a hostlist (a,b[1-2],c) split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(text):
        if char in '[]':
            depth += 1 if char == '[' else -1
            if depth not in (0, 1):
                raise GresError("%s '%s' has unbalanced or nested brackets" % (what, printable(text, 100)))
        elif char == ',' and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    if depth:
        raise GresError("%s '%s' has an unclosed bracket" % (what, printable(text, 100)))
    parts.append(text[start:])
    if not all(parts):
        raise GresError("%s '%s' has an empty name" % (what, printable(text, 100)))
    return parts


def bracket_values(text, what, whole):
    """The names of one bracket (0-3,7; 01-10 keeps its zeros), in the order written."""
    ranges = []
    for part in text.split(','):
        match = RANGE_RE.match(part)
        if not match or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise GresError("%s '%s': '[%s]' is not a range of numbers" % (what, printable(whole, 100), printable(text, 40)))
        ranges.append((match.group(1), int(match.group(2) or match.group(1))))
    if sum(last - int(first) + 1 for first, last in ranges) > MAX_NAMES:
        raise GresError("%s '%s' names more than %d" % (what, printable(whole, 100), MAX_NAMES))
    return ['%0*d' % (len(first), value) for first, last in ranges for value in range(int(first), last + 1)]


def expand(text, what):
    """A Slurm hostlist (node[01-04,07],login1; /dev/nvidia[0-3]) as its names, in the order written."""
    names = []
    for part in split_list(text, what):
        found = ['']
        for piece in re.split(r'(\[[^\]]*\])', part):
            values = bracket_values(piece[1:-1], what, text) if piece.startswith('[') else [piece]
            if len(found) * len(values) + len(names) > MAX_NAMES:
                raise GresError("%s '%s' names more than %d" % (what, printable(text, 100), MAX_NAMES))
            found = [head + value for head in found for value in values]
        names.extend(found)
    return names


def node_records(text, node):
    """(line number, parameters) of each gres.conf line that applies to node, and the AutoDetect
    that applies to it (None when none is set); every line is checked."""
    records, autodetect = [], {}
    for number, line in logical_lines(text):
        fields = parse_line(number, line)
        names = fields.get('nodename')
        if names is not None and node not in expand(names, 'gres.conf line %d: NodeName' % number):
            continue
        if 'autodetect' in fields:
            autodetect['node' if names is not None else 'all'] = (number, fields['autodetect'])
        if 'name' in fields:
            records.append((number, fields))
        elif set(fields) - set(('nodename', 'autodetect')):
            raise GresError('gres.conf line %d has no Name=' % number)
    return records, autodetect.get('node', autodetect.get('all'))


def gpu_files(text, node):
    """The device node of each of node's GPUs as Slurm numbers them (the GPU's own node, nvidiaN,
    of a MultipleFiles= GPU)."""
    return [_gpu_node(place) for place in gpu_places(text, node)]


def _gpu_node(place):
    return next((path for path in place if node_number(path) is not None), place[0])


def gpu_places(text, node):
    """The device nodes of each of node's GPUs as Slurm numbers them: the places of SLURM_JOB_GPUS,
    one node for each of File=, every node of a MultipleFiles= line."""
    records, autodetect = node_records(text, node)
    if autodetect and autodetect[1].lower() != 'off':
        raise GresError('gres.conf line %d: AutoDetect=%s, so Slurm orders the GPUs itself and gres.conf cannot '
                        'tell their device nodes; list them with File= and AutoDetect=off'
                        % (autodetect[0], printable(autodetect[1], 40)))
    gpus = [(number, fields) for number, fields in records if fields['name'].lower() == 'gpu']
    types = sorted(set(fields.get('type', '') for dummy, fields in gpus))
    if len(types) > 1:
        raise GresError('gres.conf gives %s GPUs of several types (%s): slurmd numbers them by type, in an order '
                        'gres.conf does not tell' % (printable(node, 100), printable(', '.join(t or 'none' for t in types), 100)))
    files = []
    for number, fields in gpus:
        files.extend(record_places(number, fields))
        if len(files) > MAX_FILES:
            raise GresError('gres.conf gives %s more than %d GPUs' % (printable(node, 100), MAX_FILES))
    if not files:
        raise GresError('gres.conf has no Name=gpu line with File= for %s' % printable(node, 100))
    return files


def record_places(number, fields):
    """The GPUs of one Name=gpu line, each as the list of its device nodes, each checked to be a path:
    one GPU per node of File=, one of all the nodes of MultipleFiles=."""
    where = 'gres.conf line %d' % number
    if 'multiplefiles' in fields and 'file' in fields:
        raise GresError('%s gives both File= and MultipleFiles=, which Slurm refuses' % where)
    if 'file' not in fields and 'multiplefiles' not in fields:
        raise GresError('%s lists GPUs without File=: Slurm counts them but names no device node' % where)
    key = 'file' if 'file' in fields else 'multiplefiles'
    files = expand(fields[key], '%s: %s' % (where, 'File' if key == 'file' else 'MultipleFiles'))
    if key == 'multiplefiles' and fields.get('count', '1') != '1':
        raise GresError('%s: Count=%s, but a MultipleFiles= line is one GPU' % (where, printable(fields['count'], 20)))
    if key == 'file' and 'count' in fields and fields['count'] != str(len(files)):
        raise GresError('%s: Count=%s is not the %d files of File=' % (where, printable(fields['count'], 20), len(files)))
    for path in files:
        if not os.path.isabs(path):
            raise GresError("%s: File '%s' is not an absolute path" % (where, printable(path, 100)))
    return [files] if key == 'multiplefiles' else [[path] for path in files]


def node_minor(path):
    """The minor number of a GPU's device node: st_rdev of the character device, N of a
    simulated nvidiaN (a regular file the release would accept too)."""
    problem = check_device_node(path, set((NVIDIA_GPU_MAJOR,)))
    if problem:
        raise GresError("gres.conf's %s %s" % (printable(path, 200), problem))
    mode = os.stat(path)
    if stat.S_ISCHR(mode.st_mode):
        return os.minor(mode.st_rdev)
    number = node_number(path)
    if number is None:
        raise GresError("gres.conf's %s is not a GPU's device node (nvidiaN)" % printable(path, 200))
    return number


def index_by_minor(host_root):
    """{minor number: nvidia-smi index} of the GPUs the driver attached (in bus order, as the
    release numbers them); None when the driver's entries cannot be read (a container without
    them): then, as the release does (_host.gpu_nodes), /dev/nvidiaN is taken to be GPU N, so
    the node gres.conf names is the node the release stops the holders of."""
    driver = read_driver(host_root)
    if driver is None:
        return None
    view = HostView(None, driver, host_root)
    return dict((info['minor'], index) for index, info in enumerate(view.attached()) if info['minor'] is not None)


# gres.conf's names for a GPU that Slurm gives to several jobs at once.
SHARING = frozenset(('shard', 'mps'))


def shared_gpu_files(text, node):
    """The device nodes of node's GPUs that gres/shard or gres/mps shares between jobs: those a
    Name=shard or Name=mps line names with File=, every GPU of the node for such a line without
    File= (Slurm then spreads the shares over all of them)."""
    records, dummy = node_records(text, node)
    files = []
    for number, fields in records:
        if fields['name'].lower() not in SHARING:
            continue
        given = fields.get('file') or fields.get('multiplefiles')
        if given is None:
            return gpu_files(text, node)
        files.extend(expand(given, 'gres.conf line %d: File' % number))
    return files


def shared_gpu_indexes(node, path, host_root='/'):
    """The nvidia-smi indexes of node's GPUs that Slurm shares between jobs (shared_gpu_files),
    mapped through their minor numbers as job_gpu_indexes maps them."""
    text = read_text(path)
    indexes = index_by_minor(host_root)
    found = set()
    for device in shared_gpu_files(text, node):
        minor = node_minor(device)
        index = minor if indexes is None else indexes.get(minor)
        if index is None:
            raise GresError("a shared GPU, gres.conf's %s, has minor number %d, which no GPU the driver attached has"
                            % (printable(device, 200), minor))
        found.add(index)
    return sorted(found)


def caps_by_minor(host_root='/'):
    """{caps minor: (GPU minor, GPU instance, compute instance or None)} of every access file of the
    driver's capabilities tree (see the module's doc); {} when there is none."""
    base = under_root(CAPABILITIES, host_root)
    found = {}
    for top, dummy, names in os.walk(base):
        if 'access' not in names:
            continue
        match = CAPS_ACCESS_RE.match(os.path.relpath(os.path.join(top, 'access'), base))
        number = caps_minor(os.path.join(top, 'access')) if match else None
        if number is not None:
            found[number] = (int(match.group(1)), int(match.group(2)), None if match.group(3) is None else int(match.group(3)))
    return found


def caps_node_minor(path):
    """The minor number of a caps node: st_rdev of the character device (of a major the driver
    registered, nvidia-caps' being dynamic; or its fixed one), M of a simulated nvidia-capM (a
    regular file)."""
    problem = check_device_node(path, nvidia_majors() | set((NVIDIA_GPU_MAJOR,)))
    if problem:
        raise GresError("gres.conf's %s %s" % (printable(path, 200), problem))
    mode = os.stat(path)
    return os.minor(mode.st_rdev) if stat.S_ISCHR(mode.st_mode) else int(CAPS_NODE_RE.match(os.path.basename(path)).group(1))


def is_caps_node(path):
    return CAPS_NODE_RE.match(os.path.basename(path)) is not None


def gpu_index(minor, indexes, what):
    """The nvidia-smi index of the GPU of a minor number (indexes: index_by_minor)."""
    if indexes is None:
        return minor
    if minor not in indexes:
        raise GresError('%s, minor number %d, which no GPU the driver attached has (minor numbers %s)'
                        % (what, minor, ', '.join(str(m) for m in sorted(indexes)) or 'none'))
    return indexes[minor]


def mig_instance(files, indexes, host_root='/'):
    """(N:G or N:G:C, the GPU's minor number) of the MIG instance a GRES's device nodes name: its caps
    nodes' minors found in the driver's capabilities tree, the GPU node (when one is given) its parent's."""
    caps = caps_by_minor(host_root)
    named, parents = [], set()
    for path in files:
        if not is_caps_node(path):
            parents.add(node_minor(path))
            continue
        minor = caps_node_minor(path)
        if minor not in caps:
            raise GresError("gres.conf's %s, caps minor %d, is no MIG instance's node in the driver's %s"
                            % (printable(path, 200), minor, under_root(CAPABILITIES, host_root)))
        named.append(caps[minor])
    gpus, gis = set(item[0] for item in named) | parents, set(item[:2] for item in named)
    cis = set(item for item in named if item[2] is not None)
    if len(gpus) != 1 or len(gis) != 1 or len(cis) > 1:
        raise GresError("gres.conf's %s name%s no one MIG instance of one GPU" % (
            printable(','.join(files), 300), '' if len(files) > 1 else 's'))
    gpu, gi = gis.pop()
    ci = cis.pop()[2] if cis else None
    index = gpu_index(gpu, indexes, "gres.conf's %s is of the GPU" % printable(','.join(files), 300))
    return '%s:%s%s' % (index, gi, '' if ci is None else ':%s' % ci), gpu


def _place_gpu(place, files, indexes, host_root):
    """(what the note says of one place of SLURM_JOB_GPUS, its GPU index or MIG instance)."""
    if any(is_caps_node(path) for path in files):
        ref, minor = mig_instance(files, indexes, host_root)
        return '%d is %s (GPU minor %d), MIG instance %s' % (place, printable(','.join(files), 300), minor, ref), ref
    minor = node_minor(files[0])
    index = gpu_index(minor, indexes, "GPU %d is gres.conf's %s" % (place, printable(files[0], 200)))
    return '%d is %s (minor %d), nvidia-smi GPU %d' % (place, printable(files[0], 200), minor, index), index


def job_gpu_indexes(places, node, path, host_root='/'):
    """(the nvidia-smi indexes of the job's GPUs, sorted, then its MIG instances (N:G, N:G:C); a
    line saying how they were found) from places (SLURM_JOB_GPUS, a list of ints) and node's
    gres.conf at path."""
    devices = gpu_places(read_text(path), node)
    indexes = index_by_minor(host_root)
    found = []
    for place in places:
        if place >= len(devices):
            raise GresError('Slurm gave the job GPU %d, but %s lists %d GPUs for %s (0-%d)'
                            % (place, printable(path), len(devices), printable(node, 100), len(devices) - 1))
        found.append(_place_gpu(place, devices[place], indexes, host_root))
    note = 'SLURM_JOB_GPUS %s: %s' % (','.join(str(place) for place in places), '; '.join(text for text, dummy in found))
    if indexes is None:
        note += ' (%s cannot be read: GPU N taken to be /dev/nvidiaN, as the release takes it)' % (
            under_root(DRIVER_GPUS, host_root))
    gpus = set(gpu for dummy, gpu in found)
    return sorted(gpu for gpu in gpus if isinstance(gpu, int)) + sorted(gpu for gpu in gpus if not isinstance(gpu, int)), note
