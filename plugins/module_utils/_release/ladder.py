# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The signal ladder of one release: each holder that is signalled (a target), the step of the
ladder it has reached and when the next one is due. A process that appears meanwhile joins at the
step its relative (parent, session or cgroup) has reached, or from the first step when unrelated;
one that keeps coming back is left alone. The last step, when it is KILL, stops the whole set with
SIGSTOP first, so that no fork can escape it. Right before each signal the observer
(observation.Observer) says which targets must be left alone now (another job's)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import signal

from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import ancestors, cgroup
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.observation import TICK_SKEW, boot_ticks, process_key
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import NotPermittedError, ProcessRef

# How often one command line may come back (a supervisor restarting it) and be stopped
# again before it is left alone and reported as respawned.
RESPAWN_LIMIT = 1
# Rescans of the frozen set before the final KILL: each finds processes forked before SIGSTOP landed.
FREEZE_RESCANS = 5
# Descriptors kept free for nvidia-smi's pipes, the lock and /proc reads when pidfds pile up.
FD_RESERVE = 64


class Target:
    """A holder that is (or would be) signalled, and where it stands on the ladder."""

    def __init__(self, holder, ref, cgroup_path):
        self.holder = holder
        self.ref = ref
        self.cgroup = cgroup_path
        self.signals_sent = []
        self.step = 0          # the index in the ladder of the next signal
        self.due = None        # when that signal (or, past the last one, the end of the wait) is due
        self.signalled_tick = None  # clock ticks since boot when the first signal went out
        self.gone_tick = None  # clock ticks since boot when it was first seen gone
        self.not_permitted = None  # the uid the kernel would not let us signal


def _identity(holder):
    return (holder.uid, holder.comm, holder.cmdline)


class Ladder:
    """The targets of one release. options: the release's (signals, grace_period); signaller: the
    one place that signals (_signals.Signaller); seen: the release's Observer; fd_limit: the open
    files this process may have."""

    def __init__(self, options, signaller, seen, fd_limit):
        self.options = options
        self.signaller = signaller
        self.seen = seen
        self.fd_limit = fd_limit
        self.targets = {}
        self.left_alone = {}
        self.respawns = {}

    def has(self, holder):
        return process_key(holder) in self.targets

    def target(self, holder):
        return self.targets.get(process_key(holder))

    def pidfds(self):
        """The pidfds of the targets alive, to wait on."""
        return [target.ref.pidfd for target in self.targets.values()
                if not target.ref.exited() and target.ref.pidfd is not None]

    def next_due(self, wake):
        """The earlier of wake and the next signal due."""
        for target in self.targets.values():
            if target.step < len(self.options.signals) and target.not_permitted is None and not target.ref.exited():
                wake = min(wake, target.due)
        return wake

    def close(self):
        for target in self.targets.values():
            target.ref.close()

    def _confirm(self, due):
        """The targets of due that may still be signalled now (the observer reads each one's job
        again); the others leave the ladder, never signalled."""
        spared = self.seen.left_alone_now([target.holder for target in due],
                                          [target.holder for target in self.targets.values()])
        for target in due:
            if process_key(target.holder) in spared:
                target.ref.close()
                del self.targets[process_key(target.holder)]
        return [target for target in due if process_key(target.holder) not in spared]

    def relative(self, holder):
        """The target that holder was forked from or belongs with, or None.

        A descendant of a target is part of its job. So is a process that started before the
        target was seen gone and shares its session or cgroup, or runs as the same user and
        started after the target was first signalled: a fork racing the ladder, even one that
        called setsid() and lost its parent. A process that started after the target was seen
        gone is a successor (a respawn), not a fork.
        """
        chain = ancestors(holder.ppid, self.seen.proc) if holder.ppid else set()
        holder_cgroup = None
        for target in self.targets.values():
            other = target.holder
            if other.pid in chain:
                return target
            if target.gone_tick is not None and holder.starttime > target.gone_tick + TICK_SKEW:
                continue
            if holder.session and holder.session == other.session and holder.session != self.seen.own_session:
                return target
            if holder.uid == other.uid and target.signalled_tick is not None \
                    and holder.starttime >= target.signalled_tick - TICK_SKEW:
                return target
            if target.cgroup and target.cgroup not in ('/', self.seen.own_cgroup):
                if holder_cgroup is None:
                    holder_cgroup = cgroup(holder.pid, self.seen.proc) or ''
                if holder_cgroup == target.cgroup:
                    return target
        return None

    def _is_successor(self, holder):
        identity = _identity(holder)
        return any(_identity(target.holder) == identity and target.ref.exited() for target in self.targets.values())

    def enlist(self, holders, now):
        """Make targets of the unprotected holders not yet on the ladder; True when any joined."""
        joined = False
        for holder in holders:
            key = process_key(holder)
            if holder.protected or key in self.targets or key in self.left_alone:
                continue
            relative = self.relative(holder)
            if relative is None and self._is_successor(holder):
                identity = _identity(holder)
                count = self.respawns.get(identity, 0)
                if count >= RESPAWN_LIMIT:
                    self.left_alone[key] = holder
                    continue
                self.respawns[identity] = count + 1
            target = Target(holder, ProcessRef(holder.pid, holder.starttime, self.seen.proc, use_pidfd=self._pidfd_room()),
                            cgroup(holder.pid, self.seen.proc))
            target.due = now
            if relative is not None:
                # Where its relative stands: the next signal at the same moment. (Sending again
                # the signal the relative got would only make a job that forks on it fork again.)
                last = len(self.options.signals) - 1
                target.step = min(relative.step, last)
                if relative.step <= last:
                    target.due = relative.due
            self.targets[key] = target
            joined = True
        return joined

    def _pidfd_room(self):
        """None (a pidfd where the kernel has them) while descriptors are left for one, else False:
        a target is then pinned by its start time alone, so that a thousand targets cannot leave
        nvidia-smi without the descriptors it needs to start."""
        open_pidfds = sum(1 for target in self.targets.values() if target.ref.pidfd is not None)
        return None if open_pidfds + FD_RESERVE < self.fd_limit else False

    def _grace(self, now, remaining):
        """The wait before the next signal, squeezed so that the remaining ones fit the deadline."""
        left = max(self.seen.signal_deadline - now, 0.0)
        return min(self.options.grace_period, left / max(remaining, 1))

    def _send(self, target, name, number):
        """Signal target; True when the signal went out. SIGSTOP, part of the final step, is
        logged but not listed in signals_sent, which lists the ladder's signals."""
        holder = target.holder
        # Read before the signal goes out: a process it makes the target fork starts after it.
        tick = boot_ticks() if target.signalled_tick is None else target.signalled_tick
        try:
            sent = self.signaller.send(target.ref, name, number, holder.user,
                                       holder.cmdline or holder.name, holder.devices)
        except NotPermittedError as exc:
            target.not_permitted = exc.uid if exc.uid is not None else holder.uid
            return False
        if sent and number != signal.SIGSTOP:
            target.signals_sent.append(name)
        if sent:
            target.signalled_tick = tick
        return sent

    def advance(self, now):
        """Send every signal that is due; the final KILL goes to the whole set at once."""
        ladder = self.options.signals
        last = len(ladder) - 1
        final = []
        due = [target for target in self.targets.values() if self._due(target, now)]
        for target in self._confirm(due):
            if target.step == last and ladder[last][0] == 'KILL':
                final.append(target)
                continue
            name, number = ladder[target.step]
            self._send(target, name, number)
            target.step += 1
            target.due = now + self._grace(now, len(ladder) - target.step)
        if final:
            self._freeze_and_kill(final, now)

    def _due(self, target, now):
        """Whether target's next signal is due now: it has one left, it is alive, and may be signalled."""
        return target.step < len(self.options.signals) and target.due <= now and \
            target.not_permitted is None and not target.ref.exited()

    def _freeze_and_kill(self, group, now):
        """SIGSTOP the group, then any process forked meanwhile, and SIGKILL them all.

        A stopped process cannot fork, so the set stops growing and the KILL reaches all of it.
        """
        frozen = [target for target in group if self._send(target, 'STOP', signal.SIGSTOP)]
        for dummy in range(FREEZE_RESCANS):
            holders = self.seen.discover(None)
            fresh = [holder for holder in holders if not holder.protected and process_key(holder) not in self.targets
                     if process_key(holder) not in self.left_alone and self.relative(holder) is not None]
            if not fresh:
                break
            self.enlist(fresh, now)
            for holder in fresh:
                target = self.targets[process_key(holder)]
                if self._send(target, 'STOP', signal.SIGSTOP):
                    frozen.append(target)
        for target in group + [target for target in frozen if target not in group]:
            self._send(target, 'KILL', signal.SIGKILL)
            target.step = len(self.options.signals)
            target.due = now + self._grace(now, 0)

    def finish(self, now):
        """At the deadline: every target still alive gets the rest of its ladder at once.
        True when any signal went out."""
        sent = sum(len(target.signals_sent) for target in self.targets.values())
        for dummy in self.options.signals:
            for target in self.targets.values():
                target.due = min(target.due, now)
            self.advance(now)
        return sum(len(target.signals_sent) for target in self.targets.values()) > sent

    def note_exits(self, clock):
        """Note the targets seen gone; when every target is gone, when that was seen (clock())."""
        tick = None
        for target in self.targets.values():
            if target.gone_tick is None and target.ref.exited():
                tick = boot_ticks() if tick is None else tick
                target.gone_tick = tick
                target.ref.close()
        if self.targets and all(target.gone_tick is not None for target in self.targets.values()):
            return clock()
        return None

    def pending(self, now, holders):
        """True while a target may still get a signal or is within the wait after its last one,
        or a holder has yet to join the ladder."""
        for target in self.targets.values():
            if target.not_permitted is None and not target.ref.exited() and \
                    (target.step < len(self.options.signals) or target.due > now):
                return True
        return any(not holder.protected and process_key(holder) not in self.targets and process_key(holder) not in self.left_alone
                   for holder in holders)
