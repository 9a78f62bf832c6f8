"""Network namespaces, veth pairs, a bridge and ``tc``, through the ``ip`` and ``tc`` commands.

Every object a testbed creates lives in a network namespace of its own, named
``<prefix>-<pid>-<seq>-<role>``: ``<pid>`` is the process that owns it, ``<seq>`` tells apart the
testbeds of one process, ``<role>`` is ``r<k>`` for rank ``k`` or ``sw`` for the switch (the
namespace holding the bridge). Nothing is created in the host's namespace, so removing a
testbed is removing its namespaces (their interfaces go with them), and a testbed's traffic
cannot reach the host's interfaces.

A testbed is *stale* when its owner is gone: no process has its pid, or the process with that
pid started after the namespace was created (the pid was reused). :func:`clean_stale` removes
the stale testbeds of a prefix (killing any process still inside their namespaces) and nothing
else: names of other prefixes, other shapes and live owners are left alone.

Only the standard library is imported here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NETNS_DIR", "NETNS_ETC", "TestbedError", "TestbedName", "TestbedUnavailable",
           "clean_stale", "configured_names", "delete_namespace", "find_tool", "ip",
           "list_namespaces", "list_testbeds", "namespace_pids", "owner_alive", "remove_etc",
           "require", "tc", "unavailable_reason", "write_hosts"]

#: Where ``ip netns`` keeps the namespaces' names.
NETNS_DIR = "/run/netns"
#: Where ``ip netns exec NAME`` finds files it mounts over ``/etc`` (a testbed writes a
#: ``hosts`` file there, so the ranks' addresses resolve without DNS).
NETNS_ETC = "/etc/netns"

_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,15}$")


class TestbedError(RuntimeError):
    """A command that builds or removes a testbed failed (the message names it and quotes
    its error output)."""

    __test__ = False  # not a test class, whatever pytest thinks of the name


class TestbedUnavailable(TestbedError):
    """This machine or process cannot build a testbed: not root, ``ip`` or ``tc`` missing, or
    a kernel feature (``netem``) missing. The message says what to do."""

    __test__ = False


def find_tool(name: str) -> str | None:
    """The path of the command ``name``, looked up on ``PATH`` and in the ``sbin`` folders that
    an ordinary user's ``PATH`` often lacks; ``None`` when it is nowhere."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin"):
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return None


def _capabilities() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def unavailable_reason() -> str | None:
    """Why this process cannot build a testbed, or ``None`` when it can.

    It needs Linux, root (or the capabilities ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``: network
    namespaces are mounted under :data:`NETNS_DIR`) and the ``ip`` and ``tc`` commands.
    """
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        return "the testbed needs Linux network namespaces (/proc/self/ns/net is missing)"
    needed = (1 << _CAP_NET_ADMIN) | (1 << _CAP_SYS_ADMIN)
    # the effective capabilities decide (root without them, as in many containers, fails too)
    if _capabilities() & needed != needed:
        return ("the testbed needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
                "namespaces, veth pairs and tc queues: run it as root, e.g. with sudo")
    missing = [t for t in ("ip", "tc") if find_tool(t) is None]
    if missing:
        return (f"the testbed needs the {' and '.join(missing)} command"
                f"{'s' if len(missing) > 1 else ''} from iproute2 (Debian/Ubuntu: "
                f"apt-get install iproute2)")
    return None


def require() -> None:
    """Raise :class:`TestbedUnavailable` with :func:`unavailable_reason` when there is one."""
    reason = unavailable_reason()
    if reason is not None:
        raise TestbedUnavailable(reason)


def _run(tool: str, args: Sequence[str], ns: str | None, check: bool, timeout: float
         ) -> subprocess.CompletedProcess:
    path = find_tool(tool)
    if path is None:
        require()  # names the package
        raise TestbedUnavailable(f"{tool} not found (install iproute2)")
    cmd = [path, *(["-n", ns] if ns else []), *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"`{' '.join([tool, *cmd[1:]])}` did not finish within "
                           f"{timeout}s") from e
    if check and out.returncode != 0:
        shown = " ".join([tool, *cmd[1:]])
        err = (out.stderr or out.stdout).strip()
        if tool == "tc" and "netem" in args and "unknown" in err.lower():
            raise TestbedUnavailable(
                "this kernel has no netem queueing discipline (CONFIG_NET_SCH_NETEM, module "
                "sch_netem), which a link delay or loss needs: load it (modprobe sch_netem) or "
                "use delay_ms=0 and loss_pct=0 (the rate alone works)")
        raise TestbedError(f"`{shown}` failed with exit code {out.returncode}: {err}")
    return out


def ip(*args: str, ns: str | None = None, check: bool = True, timeout: float = 30.0
       ) -> subprocess.CompletedProcess:
    """Run ``ip [-n ns] args...``; raise :class:`TestbedError` quoting its error output when
    it fails and ``check`` is set."""
    return _run("ip", args, ns, check, timeout)


def tc(*args: str, ns: str | None = None, check: bool = True, timeout: float = 30.0
       ) -> subprocess.CompletedProcess:
    """Run ``tc [-n ns] args...``, like :func:`ip`."""
    return _run("tc", args, ns, check, timeout)


def list_namespaces() -> list[str]:
    """The names of every network namespace that ``ip netns`` knows."""
    out = ip("-j", "netns", "list", check=False)
    text = out.stdout.strip()
    if out.returncode == 0 and text:
        try:
            return sorted(e["name"] for e in json.loads(text))
        except (ValueError, KeyError, TypeError):
            pass
    try:
        return sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []


def namespace_pids(name: str) -> list[int]:
    """The processes whose network namespace is ``name``."""
    out = ip("netns", "pids", name, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def delete_namespace(name: str, *, wait: float = 5.0) -> None:
    """Kill the processes inside namespace ``name``, then remove it (its interfaces go with
    it). A namespace that is already gone is no error.

    Raises:
        TestbedError: it could not be removed.
    """
    pids = namespace_pids(name)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + wait
    while pids and time.monotonic() < end:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        if pids:
            time.sleep(0.02)
    if name in list_namespaces():
        ip("netns", "delete", name)
    remove_etc(name)


def write_hosts(name: str, hosts: dict[str, str]) -> None:
    """Give namespace ``name`` its own ``/etc/hosts`` (address → host name), which
    ``ip netns exec`` mounts over the host's; :func:`delete_namespace` removes it."""
    folder = os.path.join(NETNS_ETC, name)
    os.makedirs(folder, exist_ok=True)
    # also as IPv4-mapped IPv6: c10d's store listens on a dual-stack socket and looks up its
    # clients' addresses in that form
    lines = ["127.0.0.1 localhost"] + [f"{a} {h}\n::ffff:{a} {h}" for a, h in hosts.items()]
    with open(os.path.join(folder, "hosts"), "w") as f:
        f.write("\n".join(lines) + "\n")


def remove_etc(name: str) -> None:
    """Remove namespace ``name``'s folder under :data:`NETNS_ETC` (and that folder itself once
    it is empty)."""
    shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
    try:
        os.rmdir(NETNS_ETC)  # only when empty: other namespaces' files stay
    except OSError:
        pass


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (``None``: no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def owner_alive(pid: int, created: float | None) -> bool:
    """Whether process ``pid`` exists and is the one that created a namespace at ``created``
    (seconds since the epoch; ``None``: unknown, the pid alone decides)."""
    if not os.path.exists(f"/proc/{pid}") or _zombie(pid):
        return False
    start = _process_start(pid)
    # a process that started after the namespace was created got a reused pid (1 s of slack
    # for the clock's rounding: a doubt keeps the namespace)
    return start is None or created is None or start <= created + 1.0


@dataclass(frozen=True)
class TestbedName:
    """The parts of a testbed namespace's name ``<prefix>-<pid>-<seq>-<role>``.

    Attributes:
        prefix: Names the namespaces of one tool (``dynamiq`` by default).
        pid: The owning process.
        seq: Tells apart the testbeds of one process.
        role: ``r<k>`` for rank ``k``, ``sw`` for the switch.
    """

    __test__ = False

    prefix: str
    pid: int
    seq: int
    role: str

    @property
    def testbed(self) -> str:
        """The testbed's id, ``<prefix>-<pid>-<seq>``."""
        return f"{self.prefix}-{self.pid}-{self.seq}"

    def __str__(self) -> str:
        return f"{self.testbed}-{self.role}"

    @staticmethod
    def check_prefix(prefix: str) -> str:
        """``prefix`` if it is 1-16 lower-case letters and digits starting with a letter.

        Raises:
            ValueError: it is not.
        """
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ValueError(f"testbed prefix must be 1-16 lower-case letters and digits, "
                             f"starting with a letter; got {prefix!r}")
        return prefix

    @classmethod
    def parse(cls, name: str, prefix: str) -> TestbedName | None:
        """The parts of ``name`` if it is a testbed namespace of ``prefix``, else ``None``."""
        m = re.fullmatch(rf"{re.escape(prefix)}-(\d+)-(\d+)-(r\d+|sw)", name)
        return cls(prefix, int(m[1]), int(m[2]), m[3]) if m else None


def _created(name: str) -> float | None:
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_mtime
    except OSError:
        return None


def list_testbeds(prefix: str = "dynamiq") -> dict[str, dict]:
    """The testbeds of ``prefix`` on this machine, live or stale.

    Returns:
        testbed id → ``{"pid": owner, "alive": whether the owner lives, "namespaces": [...]}``.
    """
    TestbedName.check_prefix(prefix)
    beds: dict[str, dict] = {}
    try:
        configured = os.listdir(NETNS_ETC)
    except OSError:
        configured = []
    for name in configured:  # a folder whose namespace is gone: removed with its testbed
        parsed = TestbedName.parse(name, prefix)
        if parsed is not None:
            bed = beds.setdefault(parsed.testbed, {"pid": parsed.pid, "alive": True,
                                                   "namespaces": []})
            bed["alive"] = bed["alive"] and owner_alive(parsed.pid, None)
    for name in list_namespaces():
        parsed = TestbedName.parse(name, prefix)
        if parsed is None:
            continue
        bed = beds.setdefault(parsed.testbed, {"pid": parsed.pid, "alive": True,
                                               "namespaces": []})
        bed["namespaces"].append(name)
        if not owner_alive(parsed.pid, _created(name)):
            bed["alive"] = False
    return beds


def clean_stale(prefix: str = "dynamiq") -> list[str]:
    """Remove the namespaces of ``prefix``'s testbeds whose owner is gone (see the module's
    docstring), killing the processes left inside them.

    Returns:
        The names of the namespaces removed.

    Raises:
        TestbedUnavailable: not root, or ``ip`` missing.
        TestbedError: a stale namespace could not be removed.
    """
    require()
    removed = []
    for bed_id, bed in list_testbeds(prefix).items():
        if bed["alive"]:
            continue
        # ranks before the switch: a rank namespace's veth peer is in the switch
        for name in sorted(bed["namespaces"], key=lambda n: n.endswith("-sw")):
            delete_namespace(name)
            removed.append(name)
        for name in configured_names(prefix, bed_id):
            remove_etc(name)
    return removed


def configured_names(prefix: str, testbed: str) -> list[str]:
    """The names under :data:`NETNS_ETC` that belong to testbed id ``testbed``."""
    try:
        names = os.listdir(NETNS_ETC)
    except OSError:
        return []
    return [n for n in names if n.startswith(f"{testbed}-")
            and TestbedName.parse(n, prefix) is not None]
