""":class:`Testbed`: ranks in network namespaces, joined by shaped veth links to a bridge.

Layout of a testbed of id ``<prefix>-<pid>-<seq>`` (see :mod:`dynamiq.testbed.netns`)::

    namespace <id>-r0              namespace <id>-sw               namespace <id>-r1
    lo, dq0 10.231.0.1/24 ---veth--- p0  [bridge dqbr]  p1 ---veth--- dq0 10.231.0.2/24, lo
    tbf (+ netem) on dq0           tbf on p0, p1                    tbf (+ netem) on dq0

Each rank's ``dq0`` egress is shaped to the rate (and, with ``netem``, delayed and lossy): what
the rank sends. The switch port's egress towards the rank is shaped to the rate too: what the
rank receives, so several senders to one rank share its link as on a real switch. The bridge
and every interface live in the testbed's own namespaces; the host's namespace holds nothing
of it, and the subnet can be the same for every testbed since no two of them meet.

Teardown always runs: on leaving the ``with`` block (an exception or Ctrl-C's
``KeyboardInterrupt`` included), at interpreter exit (``atexit``), and on SIGTERM or SIGHUP
(when their handlers were the default ones, the testbeds are torn down and the signal then
ends the process as it would have). What none of these can catch (SIGKILL, a power cut) leaves
stale namespaces, which the next testbed of the same prefix removes before it starts (or
``dynamiq testbed clean``).
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dynamiq.testbed.counters import LinkCounters
from dynamiq.testbed.netns import (
    TestbedError,
    TestbedName,
    clean_stale,
    configured_names,
    delete_namespace,
    ip,
    list_namespaces,
    remove_etc,
    tc,
    write_hosts,
)
from dynamiq.testbed.shape import LinkShape
from dynamiq.testbed.world import RankPlacement, run_ranks

__all__ = ["IFNAME", "Testbed"]

#: The name of each rank's link inside its namespace (``GLOO_SOCKET_IFNAME``).
IFNAME = "dq0"
_BRIDGE = "dqbr"
_BASE_PORT = 29500
_DEFAULT_SHAPE = LinkShape()

_seq = itertools.count()
_lock = threading.RLock()
_active: dict[int, Testbed] = {}
_saved_handlers: dict[int, Any] = {}
_atexit_registered = False
_log = logging.getLogger(__name__)


def _teardown_all() -> None:
    with _lock:
        beds = list(_active.values())
    for bed in beds:
        try:
            bed.teardown()
        except Exception as e:  # at exit or in a signal: report, do not stop the others
            _log.error("testbed %s: %s", bed.id, e)


def _on_signal(signum: int, frame) -> None:
    _teardown_all()
    signal.signal(signum, _saved_handlers.pop(signum, signal.SIG_DFL))
    os.kill(os.getpid(), signum)  # end as the signal would have ended the process


def _guard() -> None:
    """Register the exit hook once, and the signal handlers while a testbed is up."""
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_teardown_all)
        _atexit_registered = True
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still works
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if sig not in _saved_handlers and signal.getsignal(sig) == signal.SIG_DFL:
            _saved_handlers[sig] = signal.signal(sig, _on_signal)


def _unguard() -> None:
    if _active or threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in list(_saved_handlers.items()):
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, previous)
        del _saved_handlers[sig]


class Testbed:
    """A world of ``world_size`` ranks, each in its own network namespace with a shaped link.

    Use it as a context manager (or call :meth:`up` and :meth:`teardown`)::

        with Testbed(2, LinkShape("100mbit")) as bed:
            results = bed.run(fn, (arg,))   # fn(rank, world_size, arg) in each namespace
            print(bed.counters())           # bytes each rank's link sent and received

    It needs root (or ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``) and iproute2's ``ip`` and
    ``tc``; without them :meth:`up` raises :class:`~dynamiq.testbed.TestbedUnavailable`
    saying what is missing. Before building, :meth:`up` removes the stale testbeds of the
    same prefix (see :func:`~dynamiq.testbed.clean_stale`).

    Args:
        world_size: Ranks (1 .. the subnet's host count).
        shape: Every rank's link (a :class:`LinkShape`, or a rate such as ``"100mbit"``).
        prefix: First part of the namespaces' names; stale testbeds are looked for under it.
        subnet: The ranks' IPv4 subnet; rank ``k`` gets its ``k+1``-th address.
        gso: Let the links carry GSO packets (up to 64 KiB under one set of headers, the
            kernel's default). ``False`` limits every frame to one TCP segment, so the
            counters see a header per segment as a wire carries, at a CPU cost per frame that
            can keep a small machine below the rate (about 180 Mbit/s of a 1 Gbit/s link on
            2 shared cores; 100 Mbit/s is kept either way).

    Attributes:
        world_size, shape, prefix, gso: As given.
        id: ``<prefix>-<pid>-<seq>``, the start of every namespace's name.
        namespaces: Per rank, its namespace.
        switch: The namespace of the bridge.
        addresses: Per rank, its IPv4 address.
        ifname: The rank's link inside its namespace (the same name in every rank).
        cleaned: The stale namespaces that :meth:`up` removed.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, world_size: int, shape: LinkShape | str = _DEFAULT_SHAPE, *,
                 prefix: str = "dynamiq", subnet: str = "10.231.0.0/24",
                 gso: bool = True) -> None:
        if isinstance(shape, str):
            shape = LinkShape(shape)
        if not isinstance(shape, LinkShape):
            raise TypeError(f"shape must be a LinkShape or a rate string, got {shape!r}")
        net = ipaddress.ip_network(subnet)
        if not isinstance(net, ipaddress.IPv4Network):
            raise ValueError(f"subnet must be IPv4, got {subnet!r}")
        hosts = list(itertools.islice(net.hosts(), 4096))
        if isinstance(world_size, bool) or not isinstance(world_size, int) or not (
                1 <= world_size <= len(hosts)):
            raise ValueError(f"world_size must be an int in 1..{len(hosts)} (subnet {net}), "
                             f"got {world_size!r}")
        self.world_size = world_size
        self.shape = shape
        self.prefix = TestbedName.check_prefix(prefix)
        self.id = f"{prefix}-{os.getpid()}-{next(_seq)}"
        self.switch = f"{self.id}-sw"
        self.namespaces = [f"{self.id}-r{k}" for k in range(world_size)]
        self.addresses = [str(h) for h in hosts[:world_size]]
        self.ifname = IFNAME
        self.gso = bool(gso)
        self.cleaned: list[str] = []
        self._prefixlen = net.prefixlen
        self._procs: list[subprocess.Popen] = []
        self._runs = 0
        self._up = False

    def __repr__(self) -> str:
        state = "up" if self._up else "down"
        return f"Testbed({self.world_size}, {self.shape!r}, id={self.id!r}, {state})"

    # ---- building and removing ------------------------------------------------------------

    def up(self) -> Testbed:
        """Build the testbed (removing stale ones of the prefix first).

        Returns:
            ``self``.

        Raises:
            TestbedUnavailable: not root, ``ip``/``tc`` missing, or the shape needs ``netem``
                and the kernel lacks it (nothing is left behind).
            TestbedError: a command failed (the testbed is torn down before this is raised).
        """
        if self._up:
            return self
        self.cleaned = clean_stale(self.prefix)  # also checks root and the tools
        if self.cleaned:
            _log.info("removed %d stale testbed namespace(s) of prefix %r", len(self.cleaned),
                      self.prefix)
        with _lock:
            _active[id(self)] = self
            _guard()
        self._up = True
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        _log.info("testbed %s up: %d ranks, %s", self.id, self.world_size, self.shape)
        return self

    def _build(self) -> None:
        sw = self.switch
        ip("netns", "add", sw)
        ip("link", "set", "lo", "up", ns=sw)
        ip("link", "add", _BRIDGE, "type", "bridge", "stp_state", "0", ns=sw)
        # no IPv6 link-local address, hence no neighbour discovery chatter on the counters
        ip("link", "set", _BRIDGE, "addrgenmode", "none", ns=sw)
        ip("link", "set", _BRIDGE, "up", ns=sw)
        hosts = {addr: f"rank{k}" for k, addr in enumerate(self.addresses)}
        for k, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            port = f"p{k}"
            write_hosts(ns, hosts)  # c10d looks up its peers' names: no DNS to ask here
            ip("netns", "add", ns)
            ip("link", "set", "lo", "up", ns=ns)
            ip("link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns, ns=sw)
            ip("link", "set", port, "master", _BRIDGE, "addrgenmode", "none", ns=sw)
            ip("link", "set", IFNAME, "addrgenmode", "none", ns=ns)
            if not self.gso:  # frames of one segment each, headers as on a wire
                ip("link", "set", IFNAME, "gso_max_segs", "1", ns=ns)
                ip("link", "set", port, "gso_max_segs", "1", ns=sw)
            ip("addr", "add", f"{addr}/{self._prefixlen}", "dev", IFNAME, ns=ns)
            for args in self.shape.tc_commands(IFNAME, delay=True):
                tc(*args, ns=ns)
            for args in self.shape.tc_commands(port, delay=False):
                tc(*args, ns=sw)
            ip("link", "set", port, "up", ns=sw)
            ip("link", "set", IFNAME, "up", ns=ns)

    def teardown(self) -> None:
        """Kill the ranks still running and remove every namespace of this testbed (found by
        name, so also those a failed or interrupted :meth:`up` left half-built). Safe to
        call twice, and from a signal handler.

        Raises:
            TestbedError: a namespace could not be removed (the others are removed anyway).
        """
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
        problems = []
        if self._up:
            mine = [n for n in list_namespaces() if n.startswith(f"{self.id}-")
                    and TestbedName.parse(n, self.prefix) is not None]
            for name in sorted(mine, key=lambda n: n.endswith("-sw")):
                try:
                    delete_namespace(name)
                except TestbedError as e:
                    problems.append(str(e))
            for name in configured_names(self.prefix, self.id):
                remove_etc(name)
        with _lock:
            _active.pop(id(self), None)
            _unguard()
        if self._up:
            _log.info("testbed %s torn down", self.id)
        self._up = False
        if problems:
            raise TestbedError(f"testbed {self.id} not fully removed: " + "; ".join(problems))

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.teardown()
        except TestbedError as e:
            if exc_type is None:
                raise
            _log.error("%s (while handling %s)", e, exc_type.__name__)

    # ---- using it -------------------------------------------------------------------------

    @property
    def is_up(self) -> bool:
        """Whether the testbed is built and not yet torn down."""
        return self._up

    def _check_up(self) -> None:
        if not self._up:
            raise TestbedError(f"testbed {self.id} is not up (use it in a with block or call "
                               f"up())")

    def placements(self) -> list[RankPlacement]:
        """Per rank, its namespace, address and interface."""
        return [RankPlacement(ns, addr, IFNAME)
                for ns, addr in zip(self.namespaces, self.addresses)]

    def run(self, fn: Callable[..., Any], args: tuple = (), *, timeout: float = 300.0,
            group_timeout: float | None = None, env: Mapping[str, str] | None = None,
            num_threads: int | None = None) -> list[Any]:
        """Run ``fn(rank, world_size, *args)`` on every rank, each inside its namespace, as
        :func:`dynamiq.collectives.launch.launch` does on localhost.

        The ranks join the default gloo process group at rank 0's address (a fresh port each
        run), with ``GLOO_SOCKET_IFNAME`` set to their link; inside ``fn``,
        :func:`~dynamiq.testbed.interface_counters` reads the link's counters.

        Args:
            fn: A module-level function; what it returns must be picklable.
            args: Further picklable arguments of ``fn``.
            timeout: Seconds for the whole run (process start included).
            group_timeout: The process group's timeout (default: ``timeout``).
            env: Extra environment variables of the ranks (e.g. thread counts).
            num_threads: ``torch.set_num_threads`` in every rank.

        Returns:
            What ``fn`` returned on each rank, in rank order.

        Raises:
            RankFailedError: a rank raised or died (the first one that failed is named).
            TimeoutError: the ranks did not finish within ``timeout``.
            TestbedError: the testbed is not up.
        """
        self._check_up()
        self._runs += 1
        outcome = run_ranks(self.placements(), fn, tuple(args),
                            port=_BASE_PORT + self._runs % 1000, timeout=timeout,
                            group_timeout=group_timeout, env=env, num_threads=num_threads,
                            started=self._procs.append)
        self._procs = [p for p in self._procs if p.poll() is None]
        return outcome.check()

    def counters(self) -> list[LinkCounters]:
        """Per rank, the counters of its link (``dq0``, read from the host): bytes and frames
        it sent and received since the testbed was built. Subtract two readings for an
        interval.

        Raises:
            TestbedError: the testbed is not up, or a reading failed.
        """
        self._check_up()
        out = []
        for ns in self.namespaces:
            text = ip("-s", "-j", "link", "show", "dev", IFNAME, ns=ns).stdout
            out.append(LinkCounters.from_ip_json(text))
        return out

    def qdiscs(self) -> dict[str, str]:
        """Every shaped interface (``<namespace>/<interface>``) → its ``tc qdisc show`` lines,
        to see what is shaped where."""
        self._check_up()
        out = {}
        for k, ns in enumerate(self.namespaces):
            out[f"{ns}/{IFNAME}"] = tc("qdisc", "show", "dev", IFNAME, ns=ns).stdout.strip()
            out[f"{self.switch}/p{k}"] = tc("qdisc", "show", "dev", f"p{k}",
                                            ns=self.switch).stdout.strip()
        return out
