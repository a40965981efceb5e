# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A real Slurm cluster of one node, for the Prolog and Epilog hooks: munged, slurmctld and
slurmd from Debian's packages, started as children of this process with a slurm.conf of their
own in a temporary directory, and stopped (and reaped) by pid.

The node has 8 GPUs as Slurm sees them: character device nodes ``gres/nvidia0..7`` (major 195,
as the driver's; Slurm never opens them), listed in gres.conf. Slurm gives a job's Prolog,
Epilog and steps their positions in that list (``SLURM_JOB_GPUS``, ``CUDA_VISIBLE_DEVICES``),
which are the indexes of the simulated host's GPUs: the hooks are pointed at a gpusim host
whose device files live elsewhere, with the same numbering.

    bench = SlurmBench(directory, prolog=..., epilog=...)
    bench.start()          # installs the packages when missing (root, apt), waits for idle
    job = bench.sbatch('--gres=gpu:8', '--wrap', 'nvidia-smi')
    bench.wait_job(job, 'COMPLETED')
    bench.stop()

A simulated reboot (reboot_s): the bench's RebootProgram stops slurmd, does what the reboot does to
the host (reboot_while_down), waits reboot_s and starts slurmd again with an uptime of a second (a
time namespace of its own), so that slurmctld takes it for the node back from the reboot it asked for.
"""

import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

PACKAGES = ('munge', 'slurmctld', 'slurmd', 'slurm-client')
COMMANDS = ('munged', 'mungekey', 'slurmctld', 'slurmd', 'sbatch', 'scontrol', 'sinfo', 'squeue', 'scancel')
SBIN = ('/usr/sbin', '/usr/bin', '/sbin', '/bin')
NVIDIA_MAJOR = 195


class BenchError(RuntimeError):
    """The bench could not be set up, or Slurm did not do what was waited for (with its logs)."""


def which(name):
    return shutil.which(name, path=os.pathsep.join((os.environ.get('PATH', ''),) + SBIN))


def missing_commands():
    return [name for name in COMMANDS if which(name) is None]


def ensure_slurm():
    """Install Debian's Slurm and MUNGE packages when a command is missing.

    Returns None when everything is there, or why it cannot be (not root, no apt-get): the
    caller skips with that reason. An apt-get that fails raises BenchError."""
    if not missing_commands():
        return None
    if os.geteuid() != 0:
        return 'Slurm is not installed (%s missing) and installing it needs root' % ', '.join(missing_commands())
    apt = which('apt-get')
    if apt is None:
        return 'Slurm is not installed (%s missing) and there is no apt-get' % ', '.join(missing_commands())
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    install = [apt, 'install', '-y', '--no-install-recommends'] + list(PACKAGES)
    proc = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        # A fresh machine may have no package lists yet.
        subprocess.run([apt, 'update'], capture_output=True, text=True, env=env, check=False)
        proc = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0 or missing_commands():
        raise BenchError('apt-get install %s failed (rc %d): %s' % (' '.join(PACKAGES), proc.returncode,
                                                                    (proc.stdout + proc.stderr)[-2000:]))
    return None


def skip_reason():
    """Why the bench cannot run here (None when it can): it needs root for slurmd."""
    if os.geteuid() != 0:
        return 'the Slurm bench runs slurmd, which needs root'
    return ensure_slurm()


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def node_topology():
    """NodeName=... CPUs=... Boards=... SocketsPerBoard=... CoresPerSocket=... ThreadsPerCore=...
    as slurmd -C reads this machine, RealMemory left out (jobs do not ask for memory)."""
    out = subprocess.run([which('slurmd'), '-C'], capture_output=True, text=True, check=True).stdout
    line = out.splitlines()[0]
    fields = dict(item.split('=', 1) for item in line.split())
    keep = ('CPUs', 'Boards', 'SocketsPerBoard', 'CoresPerSocket', 'ThreadsPerCore')
    return ' '.join('%s=%s' % (key, fields[key]) for key in keep if key in fields)


SLURM_CONF = """\
ClusterName=gpuops
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/{proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmdTimeout=60
KillWait=2
MinJobAge=600
MessageTimeout=10
GresTypes={gres_types}
PrologFlags=Alloc
{hooks}
NodeName={node} NodeAddr=127.0.0.1 {topology} Gres={gres} State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


FREEZER = '/sys/fs/cgroup/freezer'


def remove_empty_tree(top):
    """rmdir top and the cgroups below it, deepest first (a cgroup with a process stays)."""
    for path, dummy, dummy in sorted(os.walk(top), key=lambda entry: -entry[0].count('/')):
        try:
            os.rmdir(path)
        except OSError:
            pass


# proctrack/cgroup on the cgroup v1 hierarchies: only the freezer, which tracks the job's processes.
CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""


# The bench's RebootProgram (SlurmBench's reboot_s): a simulated reboot that is real as far as Slurm
# can tell. slurmd runs it with system() and waits for it: it only starts the reboot in a session of
# its own (outside slurmd's process group) and returns. The reboot stops slurmd (its pid file), runs
# what the reboot does to the host, waits, and starts slurmd again in a time namespace whose uptime
# is a second (sysinfo(), /proc/uptime and /proc/stat's btime follow it): slurmd reports that uptime
# when it registers, and slurmctld takes the node for back from the reboot it asked for (a boot
# time later than its request) and returns it to service (nextstate=resume).
REBOOT_PROGRAM = """\
#!/bin/sh
if [ "${{1:-}}" != down ]; then
  setsid {program} down </dev/null >>{dir}/reboot.out 2>&1 &
  exit 0
fi
echo $$ >{dir}/reboot.pid
echo "down $(date +%s.%N)" >>{reboots}
pid=$(cat {dir}/slurmd.pid 2>/dev/null)
[ -n "$pid" ] && [ "$(cat /proc/$pid/comm 2>/dev/null)" = slurmd ] || pid=
if [ -n "$pid" ]; then
  kill -TERM "$pid"
  n=0
  # Until it is gone, or a zombie that its parent has yet to reap.
  while [ -e /proc/$pid ] && ! grep -q '^State:[[:space:]]*Z' /proc/$pid/status 2>/dev/null; do
    n=$((n + 1))
    [ $n -le 100 ] || {{ kill -KILL "$pid"; break; }}
    sleep 0.1
  done
fi
{while_down}
sleep {seconds}
cd {dir} || exit 1
# The machine's uptime: this namespace's (slurmd's, after an earlier reboot) less its offset.
read -r up rest </proc/uptime
offset=$(awk '$1 == "boottime" {{ print $2 }}' /proc/self/timens_offsets 2>/dev/null)
up=$((${{up%%.*}} - ${{offset:-0}}))
echo "up $(date +%s.%N)" >>{reboots}
rm -f {dir}/reboot.pid
exec unshare --time --boottime "-$((up - 1))" {slurmd} -D -f {conf} >>{dir}/slurmd.out 2>&1
"""


class SlurmBench:
    """One Slurm node (munged + slurmctld + slurmd) in directory, all started by this process."""

    def __init__(self, directory, prolog=None, epilog=None, include=None, gpus=8, prolog_epilog_timeout=30,
                 extra=(), gres_order=None, shards=0, proctrack='linuxproc', gres_conf=None, reboot_s=None,
                 reboot_while_down=None):
        """prolog, epilog: the scripts; include: a file of slurm.conf lines (the hooks' own, with
        their PrologEpilogTimeout); prolog_epilog_timeout: Slurm's, when include is None; extra:
        more slurm.conf lines (a RebootProgram); gres_order: the numbers N of the device nodes
        nvidiaN in the order gres.conf lists them (default 0 to gpus - 1), which is how Slurm
        numbers the GPUs. shards: gres/shard's shares of each GPU (0: none), a line of gres.conf
        each (Slurm 22.05 gives a job of one GPU's shards a SLURM_JOB_GPUS that is no GPU of it
        when only some GPUs have shards); proctrack: Slurm's process tracking, linuxproc (by parent pid) or cgroup (the
        job's processes in the cgroup v1 freezer hierarchy, /slurm/uid_U/job_N/...); gres_conf: the
        Name=gpu lines of gres.conf instead (gpus of them, as MIG instances' MultipleFiles= lines
        name them), {gres_dir} in it the directory of the device nodes: there each MIG caps node
        nvidia-caps/nvidia-capM it names is a character device of minor M. reboot_s: the bench's own
        RebootProgram, a simulated reboot of that many seconds (REBOOT_PROGRAM; ResumeTimeout
        60 s more); reboot_while_down: a command (argv) that program runs while slurmd is
        down, what the reboot does to the host."""
        self.dir = os.path.abspath(str(directory))
        self.prolog = prolog
        self.epilog = epilog
        self.include = include
        self.gpus = gpus
        self.prolog_epilog_timeout = prolog_epilog_timeout
        self.extra = list(extra)
        self.gres_order = list(gres_order) if gres_order is not None else None
        self.shards = shards
        self.proctrack = proctrack
        self.gres_text = gres_conf
        self.reboot_s = reboot_s
        self.reboot_while_down = list(reboot_while_down or ())
        self.node = socket.gethostname().split('.')[0]
        self.conf = os.path.join(self.dir, 'slurm.conf')
        self.munge_dir = os.path.join(self.dir, 'munge')
        self.munge_socket = os.path.join(self.munge_dir, 'munge.socket.2')
        self.gres_dir = os.path.join(self.dir, 'gres')
        self.procs = {}  # name -> Popen
        self.reboot_program = os.path.join(self.dir, 'reboot-program')
        self.reboots_file = os.path.join(self.dir, 'reboots')

    # -- environment -------------------------------------------------------------------
    @property
    def env(self):
        """The environment for Slurm's commands: this cluster's slurm.conf."""
        return dict(os.environ, SLURM_CONF=self.conf)

    def command(self, *args, timeout=30, check=True):
        proc = subprocess.run([which(args[0])] + list(args[1:]), capture_output=True, text=True, env=self.env,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise BenchError('%s failed (rc %d): %s' % (' '.join(args), proc.returncode, proc.stderr.strip()))
        return proc

    # -- setup ---------------------------------------------------------------------------
    def _write_conf(self):
        hooks = []
        if self.prolog:
            hooks.append('Prolog=%s' % self.prolog)
        if self.epilog:
            hooks.append('Epilog=%s' % self.epilog)
        if self.include:
            hooks.append('Include %s' % self.include)
        else:
            hooks.append('PrologEpilogTimeout=%d' % self.prolog_epilog_timeout)
        hooks.extend(self.extra)
        if self.reboot_s is not None:
            # Slurm marks the node DOWN ("reboot timed out") when slurmd is not back within ResumeTimeout.
            hooks.extend(['RebootProgram=%s' % self.reboot_program, 'ResumeTimeout=%d' % (int(self.reboot_s) + 60)])
        text = SLURM_CONF.format(
            node=self.node, dir=self.dir, ctld_port=self.ctld_port, slurmd_port=self.slurmd_port,
            munge_socket=self.munge_socket, topology=self.topology, hooks='\n'.join(hooks), proctrack=self.proctrack,
            gres_types='gpu,shard' if self.shards else 'gpu',
            gres='gpu:%d' % self.gpus + (',shard:%d' % (self.shards * self.gpus) if self.shards else ''))
        tmp = self.conf + '.tmp'
        with open(tmp, 'w') as handle:
            handle.write(text)
        os.replace(tmp, self.conf)

    def _prepare(self):
        os.makedirs(self.dir, exist_ok=True)
        # munged runs as the munge user, which must reach its socket through this directory.
        os.chmod(self.dir, 0o711)
        for sub in ('state', 'spool'):
            shutil.rmtree(os.path.join(self.dir, sub), ignore_errors=True)
            os.makedirs(os.path.join(self.dir, sub), mode=0o700)
        # MUNGE: its key, socket, log, pid and seed in a directory of the munge user's own;
        # the socket's directory needs mode 711 so that others can reach the socket.
        munge = pwd.getpwnam('munge')
        shutil.rmtree(self.munge_dir, ignore_errors=True)
        os.makedirs(self.munge_dir)
        os.chmod(self.munge_dir, 0o711)
        key = os.path.join(self.munge_dir, 'munge.key')
        subprocess.run([which('mungekey'), '--create', '--keyfile', key], check=True, capture_output=True)
        for path in (self.munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(key, 0o400)
        # The GPUs as Slurm sees them: character device nodes of the driver's major number.
        shutil.rmtree(self.gres_dir, ignore_errors=True)
        os.makedirs(self.gres_dir)
        for index in range(self.gpus):
            os.mknod(os.path.join(self.gres_dir, 'nvidia%d' % index), stat.S_IFCHR | 0o666,
                     os.makedev(NVIDIA_MAJOR, index))
        for minor in re.findall(r'/nvidia-caps/nvidia-cap([0-9]+)\b', self._gres_conf()):
            os.makedirs(os.path.join(self.gres_dir, 'nvidia-caps'), exist_ok=True)
            os.mknod(os.path.join(self.gres_dir, 'nvidia-caps', 'nvidia-cap%s' % minor), stat.S_IFCHR | 0o666,
                     os.makedev(NVIDIA_MAJOR, int(minor)))
        with open(os.path.join(self.dir, 'gres.conf'), 'w') as handle:
            handle.write(self._gres_conf())
            for index in range(self.gpus if self.shards else 0):
                handle.write('Name=shard Count=%d File=%s/nvidia%d\n' % (self.shards, self.gres_dir, index))
        if self.proctrack == 'cgroup':
            with open(os.path.join(self.dir, 'cgroup.conf'), 'w') as handle:
                handle.write(CGROUP_CONF)
        self.ctld_port = free_port()
        self.slurmd_port = free_port()
        self.topology = node_topology()
        if self.reboot_s is not None:
            self._write_reboot_program()
        self._write_conf()

    def _gres_conf(self):
        """gres.conf: the device nodes in gres_order, written three ways (a line of the node's own,
        a bracketed range, a list) around a comment and a line for another node."""
        if self.gres_text is not None:
            return self.gres_text.format(gres_dir=self.gres_dir)
        if self.gres_order is None:
            return 'Name=gpu File=%s/nvidia[0-%d]\n' % (self.gres_dir, self.gpus - 1)
        first, middle, rest = self.gres_order[:1], self.gres_order[1:4], self.gres_order[4:]
        lines = ['# The GPUs out of order: Slurm numbers them as listed here.',
                 'NodeName=other[1-4] Name=gpu Type=h200 File=/dev/nvidia[0-7]',
                 'NodeName=%s Name=gpu Type=h200 File=%s/nvidia%d' % (self.node, self.gres_dir, first[0]),
                 'Name=gpu Type=h200 File=%s/nvidia[%s]' % (self.gres_dir, ','.join(str(n) for n in middle))]
        if rest:
            lines.append('Name=gpu Type=h200 File=%s' % ','.join('%s/nvidia%d' % (self.gres_dir, n) for n in rest))
        return '\n'.join(lines) + '\n'

    def _write_reboot_program(self):
        import shlex

        while_down = ''
        if self.reboot_while_down:
            while_down = '%s || echo "the reboot could not do what it does to the host"' % ' '.join(
                shlex.quote(arg) for arg in self.reboot_while_down)
        text = REBOOT_PROGRAM.format(program=shlex.quote(self.reboot_program), dir=shlex.quote(self.dir),
                                     reboots=shlex.quote(self.reboots_file), while_down=while_down,
                                     seconds='%g' % float(self.reboot_s), slurmd=shlex.quote(which('slurmd')),
                                     conf=shlex.quote(self.conf))
        with open(self.reboot_program, 'w') as handle:
            handle.write(text)
        os.chmod(self.reboot_program, 0o755)
        if os.path.exists(self.reboots_file):
            os.unlink(self.reboots_file)

    def reboots(self):
        """[(what, time.time())] of the simulated reboots so far: ('down', when slurmd was stopped)
        and ('up', when it was started again), in order."""
        if not os.path.exists(self.reboots_file):
            return []
        with open(self.reboots_file) as handle:
            return [(line.split()[0], float(line.split()[1])) for line in handle if len(line.split()) == 2]

    def boottime_offset(self):
        """The node's clock of boot (CLOCK_BOOTTIME) less the machine's, in seconds: 0 until a
        simulated reboot, then minus the machine's uptime when slurmd came back (its time namespace)."""
        pid = self._pid_file('slurmd')
        try:
            with open('/proc/%d/timens_offsets' % pid) as handle:
                for line in handle:
                    if line.split()[:1] == ['boottime']:
                        return int(line.split()[1]) + int(line.split()[2]) / 1e9
        except (OSError, TypeError, ValueError, IndexError):
            pass
        return 0.0

    def _pid_file(self, name):
        """The pid in the daemon's pid file (slurmd.pid, slurmctld.pid) while that process runs it, else None."""
        try:
            with open(os.path.join(self.dir, '%s.pid' % name)) as handle:
                pid = int(handle.read().split()[0])
            with open('/proc/%d/comm' % pid) as handle:
                return pid if handle.read().strip() == name else None
        except (OSError, ValueError, IndexError):
            return None

    def _strays(self):
        """{pid: 'reboot' or 'slurmd'} of the processes not started by this process that run this
        bench's reboot program, or slurmd with its slurm.conf (one the reboot started)."""
        found = {}
        for entry in os.listdir('/proc'):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                    argv = [arg.decode(errors='replace') for arg in handle.read().split(b'\0') if arg]
                with open('/proc/%s/status' % entry) as handle:
                    if re.search(r'^State:\s*Z', handle.read(), re.M):
                        continue
            except OSError:
                continue
            if self.reboot_program in argv:
                found[int(entry)] = 'reboot'
            elif argv and os.path.basename(argv[0]) == 'slurmd' and self.conf in argv:
                found[int(entry)] = 'slurmd'
        return found

    def _stop_strays(self, seconds=10):
        """Stop a reboot that runs (its session, SIGKILL: it must not start slurmd again) and a
        slurmd it started (SIGTERM, SIGKILL after seconds); wait until they are gone."""
        until = time.monotonic() + seconds
        while True:
            strays = self._strays()
            if not strays:
                return
            for pid, what in strays.items():
                try:
                    if what == 'reboot':
                        os.killpg(pid, signal.SIGKILL)
                    else:
                        os.kill(pid, signal.SIGTERM if time.monotonic() < until else signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)

    def _spawn(self, name, argv, **kwargs):
        log = open(os.path.join(self.dir, '%s.out' % name), 'ab')
        try:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, cwd=self.dir, **kwargs)
        finally:
            log.close()

    def _start_munged(self):
        munge = pwd.getpwnam('munge')

        def as_munge():
            os.setgid(munge.pw_gid)
            os.setgroups([])
            os.setuid(munge.pw_uid)
        self._spawn('munged', [which('munged'), '-F', '--force', '--socket', self.munge_socket,
                               '--key-file', os.path.join(self.munge_dir, 'munge.key'),
                               '--pid-file', os.path.join(self.munge_dir, 'munged.pid'),
                               '--log-file', os.path.join(self.munge_dir, 'munged.log'),
                               '--seed-file', os.path.join(self.munge_dir, 'munged.seed')],
                    preexec_fn=as_munge)
        self._until(lambda: os.path.exists(self.munge_socket), 10, 'munged to create its socket')

    def start(self):
        """Write the configuration, start munged, slurmctld and slurmd, and wait until the node is idle."""
        self._prepare()
        try:
            self._start_munged()
            self._spawn('slurmctld', [which('slurmctld'), '-D', '-i', '-f', self.conf])
            self._until(lambda: self.command('scontrol', 'ping', check=False).returncode == 0, 20,
                        'slurmctld to answer')
            self._spawn('slurmd', [which('slurmd'), '-D', '-f', self.conf])
            self.wait_idle(30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stop every daemon this bench started (slurmd first), by pid, and reap it; remove the
        cgroups proctrack/cgroup left."""
        try:
            self._stop_daemons()
        finally:
            if self.proctrack == 'cgroup':
                remove_empty_tree(os.path.join(FREEZER, 'slurm_%s' % self.node))

    def _stop_daemons(self):
        if self.reboot_s is not None:
            # A simulated reboot's first: none may start slurmd again after this.
            self._stop_strays()
        for name in ('slurmd', 'slurmctld', 'munged'):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if name == 'slurmd' and self.reboot_s is not None:
                self._stop_strays()

    def set_hooks(self, prolog=None, epilog=None, include=None):
        """Point Prolog and Epilog elsewhere (None: none) and have the daemons reread slurm.conf."""
        self.prolog, self.epilog, self.include = prolog, epilog, include
        self._write_conf()
        self.command('scontrol', 'reconfigure')
        self.wait_idle(30)

    # -- state ---------------------------------------------------------------------------
    def logs(self):
        """The daemons' logs, last lines, for failure messages."""
        out = []
        for name in ('slurmctld.log', 'slurmd.log', 'slurmctld.out', 'slurmd.out', 'munge/munged.log'):
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                with open(path, errors='replace') as handle:
                    out.append('--- %s\n%s' % (name, ''.join(handle.readlines()[-30:])))
        return '\n'.join(out)

    def _until(self, predicate, seconds, what):
        until = time.monotonic() + seconds
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None and not (name == 'slurmd' and self.reboots()):
                    raise BenchError('%s exited (rc %s) while waiting for %s\n%s'
                                     % (name, proc.returncode, what, self.logs()))
            value = predicate()
            if value:
                return value
            if time.monotonic() > until:
                raise BenchError('gave up after %s s waiting for %s\n%s' % (seconds, what, self.logs()))
            time.sleep(0.05)

    def node_state(self):
        """The node's state as sinfo prints it (%T): idle, mixed, allocated, drained, draining, ..."""
        return self.command('sinfo', '-h', '-o', '%T', check=False).stdout.strip()

    def node_info(self):
        """scontrol show node, as a dict (State, Reason, ...)."""
        out = self.command('scontrol', '-o', 'show', 'node', self.node).stdout
        return parse_fields(out)

    def reason(self):
        """The node's drain reason as sinfo -R prints it (%E, the full reason), or ''."""
        return self.command('sinfo', '-R', '-h', '-o', '%E', check=False).stdout.strip()

    def wait_idle(self, seconds=30):
        return self._until(lambda: self.node_state() == 'idle', seconds, 'the node to be idle (sinfo -h -o %T)')

    def wait_state(self, predicate, seconds, what):
        return self._until(lambda: predicate(self.node_state()), seconds, what)

    # -- jobs ----------------------------------------------------------------------------
    def sbatch(self, *args):
        """Submit a batch job (sbatch --parsable ARGS); returns its id."""
        out = self.command('sbatch', '--parsable', '--chdir', self.dir, *args).stdout.strip()
        return out.split(';')[0]

    def job(self, job_id):
        """scontrol show job, as a dict (JobState, Reason, Restarts, ...); {} once it is gone."""
        proc = self.command('scontrol', '-o', 'show', 'job', str(job_id), check=False)
        return parse_fields(proc.stdout) if proc.returncode == 0 else {}

    def wait_job(self, job_id, states, seconds=60):
        """Wait until the job's JobState is one of states; returns the job."""
        states = (states,) if isinstance(states, str) else tuple(states)

        def reached():
            job = self.job(job_id)
            return job if job.get('JobState') in states else None
        return self._until(reached, seconds, 'job %s to be %s' % (job_id, '/'.join(states)))

    def reset(self, seconds=60):
        """Cancel every job, resume the node and wait until it is idle again, for the next test."""
        self.command('scancel', '--full', '--quiet', '-u', 'root', check=False)
        self._until(lambda: not self.command('squeue', '-h', '-t', 'all', '-o', '%i %T', check=False).stdout.strip()
                    or all(line.split()[1] in ('CANCELLED', 'COMPLETED', 'FAILED', 'TIMEOUT', 'NODE_FAIL',
                                               'PREEMPTED', 'OUT_OF_MEMORY', 'BOOT_FAIL', 'DEADLINE')
                           for line in self.command('squeue', '-h', '-t', 'all', '-o', '%i %T').stdout.split('\n')
                           if line.strip()), seconds, 'every job to end')
        if self.node_state() != 'idle':
            self.command('scontrol', 'update', 'nodename=%s' % self.node, 'state=resume', check=False)
        self.wait_idle(seconds)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, '.build', 'collections')

DEPLOY_PLAYBOOK = """\
- name: Install the gpu_reset Slurm hooks
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Install the hooks
      ansible.builtin.import_role:
        name: gpuops.nvidia.slurm_hooks
"""


def link_collection():
    """This checkout as .build/collections/ansible_collections/gpuops/nvidia (as scripts/lib.sh links it)."""
    parent = os.path.join(COLLECTIONS, 'ansible_collections', 'gpuops')
    os.makedirs(parent, exist_ok=True)
    link = os.path.join(parent, 'nvidia')
    if not os.path.islink(link) or os.path.realpath(link) != os.path.realpath(REPO):
        tmp = link + '.tmp'
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(REPO, tmp)
        os.replace(tmp, link)
    return COLLECTIONS


def deploy_hooks(directory, gpu_reset_vars, **role_vars):
    """Install the hooks into directory with the role gpuops.nvidia.slurm_hooks (ansible-playbook,
    local connection), the Python running this for the hook and this checkout as the collection
    (slurm_hooks_install_runtime false: the role installs neither).

    Returns the role's variables; the files are directory/prolog.sh, epilog.sh, slurm-hooks.conf, ..."""
    import json

    link_collection()
    directory = os.path.abspath(str(directory))
    values = dict(slurm_hooks_dir=directory, slurm_hooks_install_runtime=False, slurm_hooks_python=sys.executable,
                  slurm_hooks_collections_path=COLLECTIONS, slurm_hooks_log=os.path.join(directory, 'hook.log'),
                  slurm_hooks_scontrol=which('scontrol'), slurm_hooks_ansible_home=os.path.join(directory, 'ansible'),
                  slurm_hooks_gpu_reset_vars=gpu_reset_vars)
    values.update(role_vars)
    os.makedirs(directory, exist_ok=True)
    playbook = os.path.join(directory, 'deploy.yml')
    with open(playbook, 'w') as handle:
        handle.write(DEPLOY_PLAYBOOK)
    extra = os.path.join(directory, 'deploy-vars.json')
    with open(extra, 'w') as handle:
        json.dump(values, handle)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_NOCOLOR='1', ANSIBLE_RETRY_FILES_ENABLED='0',
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), 'ansible-playbook'), '-i', 'localhost,',
                           '-c', 'local', playbook, '-e', '@' + extra], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    if proc.returncode != 0:
        raise BenchError('installing the hooks failed (rc %d):\n%s%s' % (proc.returncode, proc.stdout, proc.stderr))
    return values


def parse_fields(text):
    """KEY=VALUE pairs of a one-line scontrol record; Reason may hold spaces, and runs to the
    next ' Key=' of the record."""
    fields = {}
    for match in re.finditer(r'(?:^|\s)([A-Za-z:/_]+)=(.*?)(?=\s[A-Za-z:/_]+=|$)', text.strip()):
        fields[match.group(1)] = match.group(2)
    return fields


def main():
    """python tests/slurm/bench.py: start a bench in a temporary directory, print how to use it,
    and keep it until Ctrl-C."""
    reason = skip_reason()
    if reason:
        sys.exit(reason)
    bench = SlurmBench(tempfile.mkdtemp(prefix='gpuops-slurm-'))
    bench.start()
    print('export SLURM_CONF=%s   # node %s is %s' % (bench.conf, bench.node, bench.node_state()))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        bench.stop()


if __name__ == '__main__':
    main()
