# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Reset a fleet of N simulated GPU hosts: playbooks/reset_gpus.yml against the one-liner.

Each host is a podman container of the simulated GPU host image (tests/containers), in the
hung-job scenario (8 ranks at 76113 MiB that die on SIGTERM, nvidia-persistenced holding every
device node, 1 s driver release delay), reached over SSH as a real fleet is: sshd runs in every
container, on podman's bridge network. For N = 1, 8 and 32 hosts, and each repetition, the
fleet is put into that scenario and freed by each side in turn, through the same transport
(Ansible over SSH with examples/ansible.cfg: one fork per host, pipelining, ControlPersist;
every run starts with no SSH connection open):

  collection  ansible-playbook gpuops.nvidia.reset_gpus
  one-liner   ansible -m shell -a 'sleep 5; fuser -k /dev/nvidia*; sleep 3;
              nvidia-smi --query-gpu=index,memory.used --format=csv,noheader'
  mitogen     the collection's playbook under Mitogen for Ansible (strategy mitogen_linear,
              on the controller only; its own SSH connection per host, same inventory)

Reports median wall-clock times, their ratio, how each grows with N, the controller's CPU
seconds per host (user + system of the command's whole reaped process tree, from
getrusage(RUSAGE_CHILDREN)), the CPU seconds used on the hosts per host (each container's cgroup,
read before and after the run: what each side runs there, plus the hung job's own ranks, alike
on both sides), and correctness (every GPU at 0 MiB, nvidia-persistenced alive),
and writes docs/fleet-benchmark.md and
docs/fleet-benchmark.png. When Mitogen cannot run with this ansible-core, one line says so
(its version, ansible-core's, and the error) and the other two sides run without it.

Usage (as root): python3 benchmarks/fleet_vs_oneliner.py [--sizes 1,8,32] [--reps 3] [--out docs]
                 [--compare-with DIR]   (also the playbook of an earlier checkout, printed only)
Creates or reuses .venv-bench (requirements/bench.txt) and the image, installing podman first
when it is missing (scripts/molecule.sh's set-up).
"""

import argparse
import concurrent.futures
import datetime
import importlib.metadata
import os
import platform
import resource
import statistics
import subprocess
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(REPO, '.venv-bench')
IMAGE = 'localhost/gpuops-nvidia-gpuhost:latest'
PREFIX = 'gpuops-bench-'
ONELINER = ('sleep 5; fuser -k /dev/nvidia*; sleep 3; '
            'nvidia-smi --query-gpu=index,memory.used --format=csv,noheader')
RELEASE_DELAY = 1
LABELS = {'mitogen': 'collection under mitogen_linear'}
# The modules' default memory_threshold_mib (plugins/module_utils/_common.py): an idle GPU reads at most this.
IDLE_MAX_MIB = 32


def bootstrap():
    """Re-run this script in .venv-bench, with podman configured and the image built."""
    setup = ('set -e; . scripts/lib.sh; '
             'ensure_commands podman:podman runc:runc debootstrap:debootstrap gcc:gcc fuser:psmisc '
             'ssh:openssh-client ssh-keygen:openssh-client; '
             'configure_podman; '
             'ensure_venv "$REPO/.venv-bench" "$REPO/requirements/bench.txt"; '
             'PYTHON="$REPO/.venv-bench/bin/python" tests/containers/build-image.sh')
    subprocess.run(['bash', '-c', setup], cwd=REPO, check=True)
    # podman's settings for these runs (scripts/lib.sh configure_podman wrote them).
    os.environ['CONTAINERS_CONF'] = os.path.join(REPO, '.build', 'containers.conf')
    os.execv(os.path.join(VENV, 'bin', 'python'), [os.path.join(VENV, 'bin', 'python')] + sys.argv)


def podman(*args, check=True):
    return subprocess.run(['podman'] + list(args), capture_output=True, text=True, check=check)


def parallel(function, items):
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(function, items))


def start_hosts(count, public_key):
    """Start the containers with sshd accepting public_key for root; {name: address}."""
    names = ['%s%02d' % (PREFIX, i) for i in range(1, count + 1)]
    parallel(lambda name: podman('run', '--detach', '--replace', '--init',
                                 '--name=' + name, '--hostname=' + name, IMAGE), names)
    for name in names:
        for dummy in range(60):
            if podman('exec', name, 'test', '-e', '/dev/nvidia-uvm', check=False).returncode == 0:
                break
            time.sleep(0.5)
    parallel(lambda name: subprocess.run(
        ['podman', 'exec', '-i', name, 'sh', '-c', 'mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh '
         '&& cat > /root/.ssh/authorized_keys && /usr/sbin/sshd'],
        input=public_key, capture_output=True, text=True, check=True), names)
    return dict((name, podman('inspect', '--format', '{{.NetworkSettings.IPAddress}}', name).stdout.strip())
                for name in names)


def remove_hosts():
    names = podman('ps', '-a', '--format', '{{.Names}}').stdout.split()
    names = [name for name in names if name.startswith(PREFIX)]
    if names:
        podman('rm', '--force', '--time=0', *names)


def hung_job(name):
    podman('exec', name, 'sh', '-c', 'python3 -m gpusim stop --root / && '
           'python3 -m gpusim scenario --root / hung-job --release-delay %s >/dev/null' % RELEASE_DELAY)


def outcome(name):
    """(every GPU at its idle reading, nvidia-persistenced alive) on one host.

    Idle GPUs read 1 MiB (as real H200s): at or below the modules' default threshold is idle."""
    proc = podman('exec', name, 'sh', '-c',
                  'nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; '
                  'echo daemon $(pgrep -f -c "^nvidia-persistenced")', check=False)
    lines = proc.stdout.split('\n')
    used = [int(line) for line in lines if line.strip().isdigit()]
    daemon = [line for line in lines if line.startswith('daemon ')]
    return (len(used) == 8 and all(mib <= IDLE_MAX_MIB for mib in used), bool(daemon) and daemon[0].split()[1] != '0')


def write_inventory(path, addresses, key):
    with open(path, 'w') as f:
        f.write('gpu_hosts:\n  hosts:\n')
        for name, address in sorted(addresses.items()):
            f.write('    %s:\n      ansible_host: %s\n' % (name, address))
        f.write('  vars:\n'
                '    ansible_user: root\n'
                '    ansible_ssh_private_key_file: %s\n'
                # Throw-away containers: their host keys are neither known nor kept. Mitogen puts
                # its own StrictHostKeyChecking before these arguments, from this variable.
                '    ansible_host_key_checking: false\n'
                '    ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'
                ' -o LogLevel=ERROR\n'
                '    ansible_python_interpreter: /usr/bin/python3\n'
                '    gpu_reset_become: false\n' % key)


def environment(checkout=REPO):
    """The environment in which ansible finds the collection of checkout."""
    collections = os.path.join(REPO, '.build', 'collections' if checkout == REPO else 'collections-compare')
    link = os.path.join(collections, 'ansible_collections', 'gpuops', 'nvidia')
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.islink(link) and os.readlink(link) != checkout:
        os.unlink(link)
    if not os.path.islink(link):
        os.symlink(checkout, link)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_NOCOLOR='1',
               ANSIBLE_CONFIG=os.path.join(REPO, 'examples', 'ansible.cfg'))
    env['PATH'] = os.path.join(VENV, 'bin') + os.pathsep + env.get('PATH', '')
    return env


def mitogen_environment(env):
    """(env with Mitogen's strategy mitogen_linear, None), or (None, why it cannot run)."""
    try:
        import ansible_mitogen
    except ImportError as error:
        return None, 'mitogen is not installed in %s (requirements/bench.txt): %s' % (VENV, error)
    strategies = os.path.join(os.path.dirname(ansible_mitogen.__file__), 'plugins', 'strategy')
    mitogen_env = dict(env, ANSIBLE_STRATEGY_PLUGINS=strategies, ANSIBLE_STRATEGY='mitogen_linear')
    # The fleet's inventory names the hosts' Python; so does this check for the controller's.
    command = ['ansible', 'localhost', '-i', 'localhost,', '-c', 'local', '-m', 'ansible.builtin.ping',
               '-e', 'ansible_python_interpreter=' + sys.executable]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=mitogen_env, cwd=REPO,
                              timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return None, 'a ping of the controller through mitogen_linear did not finish within 120 s'
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        errors = [line for line in lines if 'ERROR' in line or 'FAILED' in line or 'UNREACHABLE' in line]
        return None, (errors or lines or ['exit code %d' % proc.returncode])[0]
    return mitogen_env, None


def versions():
    """'mitogen X with ansible-core Y', as installed in this environment."""
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return '(not installed)'
    return 'mitogen %s with ansible-core %s' % (version('mitogen'), version('ansible-core'))


def cgroup_cpu(name):
    """CPU seconds the container name has used (its cgroup: cgroup v2's cpu.stat, v1's cpuacct),
    None when they cannot be read."""
    path = podman('inspect', '--format', '{{.State.CgroupPath}}', name, check=False).stdout.strip()
    if not path:
        return None
    try:
        with open('/sys/fs/cgroup%s/cpu.stat' % path) as handle:
            stat = dict(line.split() for line in handle if line.strip())
        return int(stat['usage_usec']) / 1e6
    except (OSError, KeyError, ValueError):
        pass
    try:
        with open('/sys/fs/cgroup/cpuacct%s/cpuacct.usage' % path) as handle:
            return int(handle.read()) / 1e9
    except (OSError, ValueError):
        return None


def hosts_cpu(names):
    """The CPU seconds of every container in names, summed; None when one cannot be read."""
    used = parallel(cgroup_cpu, names)
    return None if any(value is None for value in used) else sum(used)


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command, env, forks):
    """Run command with a control path directory of its own: every run opens its SSH
    connections, and closes them afterwards. Wall-clock seconds, and CPU seconds of its
    process tree (the SSH masters it leaves behind, ControlPersist, are not reaped by it)."""
    control = tempfile.mkdtemp(prefix='gpuops-bench-cp-')
    env = dict(env, ANSIBLE_SSH_CONTROL_PATH_DIR=control)
    cpu, start = children_cpu(), time.monotonic()
    proc = subprocess.run(command + ['--forks', str(forks)], capture_output=True, text=True,
                          env=env, cwd=REPO, check=False)
    elapsed, cpu = time.monotonic() - start, children_cpu() - cpu
    subprocess.run(['pkill', '-f', control], check=False)
    shutil.rmtree(control, ignore_errors=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit('%s failed with exit code %d' % (command[0], proc.returncode))
    return elapsed, cpu


def run_size(count, reps, env, key, earlier_env=None, mitogen_env=None):
    with open(key + '.pub') as f:
        addresses = start_hosts(count, f.read())
    names = sorted(addresses)
    inventory = tempfile.NamedTemporaryFile('w', suffix='.yml', delete=False).name
    write_inventory(inventory, addresses, key)
    sides = {
        'collection': (['ansible-playbook', '-i', inventory, 'gpuops.nvidia.reset_gpus'], env),
        'one-liner': (['ansible', 'gpu_hosts', '-i', inventory, '-m', 'ansible.builtin.shell',
                       '-a', ONELINER], env),
    }
    if mitogen_env is not None:
        sides['mitogen'] = (['ansible-playbook', '-i', inventory, 'gpuops.nvidia.reset_gpus'], mitogen_env)
    if earlier_env is not None:
        # An earlier version may count the memory the driver reserves (515 MiB on the simulated
        # H200s) as used: its threshold is raised above that, far below a job's 76113 MiB.
        sides['earlier'] = (['ansible-playbook', '-i', inventory, 'gpuops.nvidia.reset_gpus',
                             '-e', 'gpu_reset_memory_threshold_mib=1024'], earlier_env)
    result = {side: {'times': [], 'cpu': [], 'host_cpu': [], 'clean': True, 'daemon': True} for side in sides}
    try:
        for rep in range(reps):
            for side, (command, side_env) in sides.items():
                parallel(hung_job, names)
                before = hosts_cpu(names)
                elapsed, cpu = timed(command, side_env, max(count, 5))
                after = hosts_cpu(names)
                # The hung job's own ranks count too, alike on both sides: the difference is each side's.
                host_cpu = None if before is None or after is None else (after - before) / count
                outcomes = parallel(outcome, names)
                clean = all(host_clean for host_clean, dummy in outcomes)
                daemon = all(host_daemon for dummy, host_daemon in outcomes)
                result[side]['times'].append(elapsed)
                result[side]['cpu'].append(cpu / count)
                result[side]['host_cpu'].append(host_cpu)
                result[side]['clean'] &= clean
                result[side]['daemon'] &= daemon
                print('N=%-3d rep %d  %-10s %6.1f s  controller CPU %.2f s per host  host CPU %s per host  '
                      'all GPUs at 0 MiB: %s  nvidia-persistenced alive: %s' % (
                          count, rep + 1, side, elapsed, cpu / count, seconds(host_cpu), clean, daemon), flush=True)
    finally:
        os.unlink(inventory)
        remove_hosts()
    for side in result:
        result[side]['median'] = statistics.median(result[side]['times'])
        result[side]['cpu_median'] = statistics.median(result[side]['cpu'])
        host_cpu = result[side]['host_cpu']
        result[side]['host_cpu_median'] = None if None in host_cpu else statistics.median(host_cpu)
    return result


def seconds(value):
    return 'n/a' if value is None else '%.2f s' % value


def yes_no(value):
    return 'yes' if value else 'no'


def table(results):
    rows = ['| N hosts | collection median (s) | one-liner median (s) | one-liner / collection '
            '| collection: controller CPU s per host | one-liner: controller CPU s per host | CPU collection / one-liner '
            '| collection: host CPU s per host | one-liner: host CPU s per host '
            '| collection: all GPUs 0 MiB | collection: daemon alive | one-liner: all GPUs 0 MiB '
            '| one-liner: daemon alive |',
            '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: | :---: | :---: |']
    for count, result in sorted(results.items()):
        col, one = result['collection'], result['one-liner']
        rows.append('| %d | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s | %s |' % (
            count, col['median'], one['median'], one['median'] / col['median'],
            col['cpu_median'], one['cpu_median'], col['cpu_median'] / one['cpu_median'],
            seconds(col.get('host_cpu_median')).replace(' s', ''), seconds(one.get('host_cpu_median')).replace(' s', ''),
            yes_no(col['clean']), yes_no(col['daemon']), yes_no(one['clean']), yes_no(one['daemon'])))
    return '\n'.join(rows)


def mitogen_table(results):
    """The collection under Mitogen beside the collection alone, from the same runs."""
    rows = ['| N hosts | collection median (s) | mitogen median (s) | collection / mitogen '
            '| collection: controller CPU s per host | mitogen: controller CPU s per host | CPU mitogen / collection '
            '| mitogen: all GPUs 0 MiB | mitogen: daemon alive |',
            '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: |']
    for count, result in sorted(results.items()):
        col, mit = result['collection'], result['mitogen']
        rows.append('| %d | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %s | %s |' % (
            count, col['median'], mit['median'], col['median'] / mit['median'],
            col['cpu_median'], mit['cpu_median'], mit['cpu_median'] / col['cpu_median'],
            yes_no(mit['clean']), yes_no(mit['daemon'])))
    return '\n'.join(rows)


def sides_of(results):
    return [side for side in ('collection', 'one-liner', 'mitogen') if side in next(iter(results.values()))]


def growth(results):
    sizes = sorted(results)
    lines = []
    for side in sides_of(results):
        first = results[sizes[0]][side]['median']
        steps = ', '.join('N=%d: %.2fx' % (n, results[n][side]['median'] / first) for n in sizes[1:])
        lines.append('- %s: time relative to N=%d: %s' % (side, sizes[0], steps))
    return '\n'.join(lines)


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    sizes = sorted(results)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for side, marker in zip(sides_of(results), 'os^'):
        medians = [results[n][side]['median'] for n in sizes]
        ax.plot(sizes, medians, marker=marker, label=LABELS.get(side, side))
        for n in sizes:
            ax.scatter([n] * len(results[n][side]['times']), results[n][side]['times'],
                       s=10, alpha=0.4, color=ax.lines[-1].get_color())
    ax.set_xscale('log', base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])
    ax.set_xlabel('simulated hosts (containers), 8 GPUs each')
    ax.set_ylabel('wall-clock time (s), median and runs')
    ax.set_ylim(bottom=0)
    ax.set_title('Resetting a fleet after a hung job: reset_gpus.yml vs the one-liner')
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def mitogen_section(results, mitogen):
    """Markdown on the Mitogen side: its table, or the line saying why it could not run."""
    version, problem = mitogen
    if problem:
        return '%s cannot run the playbook: %s' % (version, problem)
    return """The same playbook under {version} (`ANSIBLE_STRATEGY=mitogen_linear`, its
strategy plugins on `ANSIBLE_STRATEGY_PLUGINS`; Mitogen opens one SSH connection per host of
its own and runs the modules in a Python interpreter it keeps on the host), from the same runs:

{table}""".format(version=version, table=mitogen_table(results))


def report(results, reps, out, mitogen):
    md = os.path.join(out, 'fleet-benchmark.md')
    png = os.path.join(out, 'fleet-benchmark.png')
    plot(results, png)
    ansible_version = subprocess.run(['ansible', '--version'], capture_output=True, text=True,
                                     env=environment(), check=False).stdout.split('\n')[0]
    text = """# Fleet benchmark: reset_gpus.yml against the one-liner

`python3 benchmarks/fleet_vs_oneliner.py` (as root) resets N simulated GPU hosts, each a podman
container of the simulated host image (`tests/containers`), in the hung-job scenario: 8 ranks
holding 76113 MiB each at 0 % utilisation that die on SIGTERM, `nvidia-persistenced` holding
every device node, and a {delay} s driver release delay. Every container runs sshd on podman's
bridge network, and both sides reach the hosts the way a real fleet is reached: Ansible over
SSH with `examples/ansible.cfg` (one fork per host, pipelining, ControlPersist), every run
starting with no SSH connection open:

- collection: `ansible-playbook gpuops.nvidia.reset_gpus`
- one-liner: `ansible -m shell -a '{oneliner}'`
- mitogen: the collection's command under Mitogen for Ansible, when it can run (below)

Times are wall-clock for the whole command, median of {reps} runs; controller CPU is the user
and system seconds of the command's process tree (getrusage of the reaped children; the SSH
masters that ControlPersist leaves running are not counted) divided by N, median of the same
runs; the fleet is put back into the scenario before every run. Correctness is checked after every run on every host: all 8
GPUs at 0 MiB, and `nvidia-persistenced` still running.

{table}

How the time grows with N:

{growth}

{mitogen}

![time against N](fleet-benchmark.png)

Measured {date} on {machine} ({cpus} CPUs), {ansible}, podman
{podman}. Here the controller and all N hosts share these CPUs, so everything each host runs
(Ansible's module start, about 0.25 s of CPU per module call here, and the release's polling)
adds to the controller's work; on a real fleet each host brings its own CPUs and only the
controller's share grows with N.

The role's usual path is five tasks per host, one of them the module call: argument
validation, the settings check, the release (it reads the GPUs first itself, signals
nothing on a clean host, and its verdict on the state at its end is the clean test), one
skipped include of every further step (a query of the user's own, verification, escalation,
report files, metrics, the failure), and the report; then the playbook's summary and final
check. Each task costs the controller some 20-60 ms of CPU per host here (variables, a forked
worker, and every template, which ansible-core compiles each time it renders one; an
expression also renders every variable it names, whichever branch it takes), so the usual
path keeps its conditions and report short. The playbook imports the role rather than
including it, and `examples/ansible.cfg` turns `inject_facts_as_vars` off, which spares the
controller re-injecting facts for every task and host. The release polls the GPUs from
0.05 s after each round of signals, doubling the interval up to 0.25 s: each poll scans /proc and
reads every GPU. The one-liner's single task spends 8 s in sleeps that cost no CPU, so on a
small controller the collection's lead narrows as N grows. Through the
`containers.podman.podman` connection, which cannot pipeline, each module call costs over 1 s
of CPU in `podman` processes; that transport measures podman rather than the collection, and
is used here only for Molecule.
""".format(delay=RELEASE_DELAY, oneliner=ONELINER, reps=reps, table=table(results),
           growth=growth(results), mitogen=mitogen_section(results, mitogen), date=datetime.date.today().isoformat(),
           machine=platform.platform(terse=True), cpus=os.cpu_count(), ansible=ansible_version,
           podman=podman('--version').stdout.split()[-1])
    with open(md, 'w') as f:
        f.write(text)
    return md, png


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--sizes', default='1,8,32')
    parser.add_argument('--reps', type=int, default=3)
    parser.add_argument('--out', default=os.path.join(REPO, 'docs'))
    parser.add_argument('--compare-with', metavar='DIR',
                        help='a checkout of an earlier version, whose playbook runs too (printed, not plotted)')
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit('run as root (rootful podman)')
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        bootstrap()
    env = environment()
    mitogen_env, problem = mitogen_environment(env)
    mitogen = (versions(), problem)
    print('%s: %s' % (mitogen[0], 'cannot run the playbook: ' + problem if problem else 'strategy mitogen_linear'),
          flush=True)
    results = {}
    remove_hosts()
    keys = tempfile.mkdtemp(prefix='gpuops-bench-key-')
    key = os.path.join(keys, 'id_ed25519')
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', key], check=True)
    try:
        for count in [int(n) for n in args.sizes.split(',')]:
            results[count] = run_size(count, args.reps, env, key,
                                      environment(os.path.abspath(args.compare_with)) if args.compare_with else None,
                                      mitogen_env)
    finally:
        shutil.rmtree(keys, ignore_errors=True)
    print()
    print(table(results))
    print()
    for count, result in sorted(results.items()):
        print('N=%d  CPU on the hosts per host (their containers\' cgroups, the hung job included): collection %s, '
              'one-liner %s' % (count, seconds(result['collection']['host_cpu_median']),
                                seconds(result['one-liner']['host_cpu_median'])))
    print()
    print(growth(results))
    print()
    print(mitogen_section(results, mitogen))
    if args.compare_with:
        print()
        for count, result in sorted(results.items()):
            print('N=%d  controller CPU s per host: this version %.2f (%.2fx the one-liner), from %s %.2f (%.2fx); '
                  'wall %.1f s against %.1f s' % (
                      count, result['collection']['cpu_median'],
                      result['collection']['cpu_median'] / result['one-liner']['cpu_median'], args.compare_with,
                      result['earlier']['cpu_median'], result['earlier']['cpu_median'] / result['one-liner']['cpu_median'],
                      result['collection']['median'], result['earlier']['median']))
    os.makedirs(args.out, exist_ok=True)
    md, png = report(results, args.reps, args.out, mitogen)
    print('\nwrote %s and %s' % (md, png))


if __name__ == '__main__':
    main()
