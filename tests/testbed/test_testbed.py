"""The namespace testbed: link shapes and their errors (anywhere), and, as root with iproute2,
a compressed all-reduce across a shaped 2-rank testbed checked against the veth counters, the
removal of stale testbeds, and teardown at exit, on SIGTERM and Ctrl-C, and after SIGKILL.

The root-only tests skip with the reason (:func:`dynamiq.testbed.unavailable_reason`) elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dynamiq
from dynamiq.cli import main
from dynamiq.collectives.api import P2PStats
from dynamiq.collectives.launch import RankFailedError
from dynamiq.testbed import (
    LinkCounters,
    LinkShape,
    Testbed,
    TestbedUnavailable,
    clean_stale,
    interface_counters,
    list_testbeds,
    netns,
    parse_rate,
    unavailable_reason,
)
from dynamiq.testbed.counters import FRAME_HEADER_BYTES, MSS, SLACK_BYTES, wire_bounds
from dynamiq.testbed.netns import TestbedName, delete_namespace, ip, list_namespaces

ROOT = Path(__file__).resolve().parents[2]
REASON = unavailable_reason()
needs_root = pytest.mark.skipif(REASON is not None, reason=f"testbed unavailable: {REASON}")
FEW_THREADS = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


# ---- link shapes ----------------------------------------------------------------------------

@pytest.mark.parametrize("rate, bps, canonical", [
    ("100mbit", 10**8, "100mbit"), ("1gbit", 10**9, "1gbit"), ("100Mbit/s", 10**8, "100mbit"),
    ("1.5gbit", 15 * 10**8, "1500mbit"), ("800kbit", 8 * 10**5, "800kbit"),
    ("0.1mbit", 10**5, "100kbit"), (" 2 gbit ", 2 * 10**9, "2gbit"), (10**9, 10**9, "1gbit"),
    (1e8, 10**8, "100mbit"), ("12345", 12345, "12345bit"),
])
def test_rates_parse_to_bits_per_second(rate, bps, canonical):
    assert parse_rate(rate) == bps
    shape = LinkShape(rate)
    assert shape.rate == canonical and shape.bits_per_second == bps
    assert shape == LinkShape(canonical)


@pytest.mark.parametrize("rate, error, match", [
    ("100mbps", ValueError, "bytes per second to tc"),
    ("100MB", ValueError, "bytes per second"),
    ("100mb", ValueError, "is not a bit rate"),
    ("fast", ValueError, "is not a bit rate"),
    ("-5mbit", ValueError, "is not a bit rate"),
    ("1.0000001kbit", ValueError, "whole number"),
    ("1kbit", ValueError, "outside 8kbit .. 400gbit"),
    ("1tbit", ValueError, "outside"),
    (float("inf"), ValueError, "not a number"),
    (True, TypeError, "got bool"),
    (None, TypeError, "got NoneType"),
])
def test_bad_rates_say_what_is_wrong(rate, error, match):
    with pytest.raises(error, match=match):
        LinkShape(rate)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"delay_ms": -0.1}, ValueError, r"delay_ms must lie in \[0.0, 10000.0\]"),
    ({"delay_ms": float("nan")}, ValueError, "delay_ms"),
    ({"delay_ms": "1ms"}, TypeError, "delay_ms must be a number"),
    ({"loss_pct": 100}, ValueError, r"loss_pct must lie in \[0.0, 100.0\)"),
    ({"loss_pct": -1}, ValueError, "loss_pct"),
    ({"loss_pct": False}, TypeError, "loss_pct must be a number"),
])
def test_bad_delay_or_loss(kwargs, error, match):
    with pytest.raises(error, match=match):
        LinkShape("1gbit", **kwargs)


def test_shape_is_frozen_and_describes_itself():
    s = LinkShape("1gbit", delay_ms=0.1, loss_pct=0.5)
    assert s.describe() == "1gbit, 0.1 ms, 0.5% loss"
    assert s.needs_netem and not LinkShape("1gbit").needs_netem
    with pytest.raises(AttributeError):
        s.rate = "2gbit"  # type: ignore[misc]


def test_tc_commands_rate_then_delay_on_one_side():
    plain = LinkShape("100mbit").tc_commands("dq0")
    assert plain == [["qdisc", "add", "dev", "dq0", "root", "handle", "1:", "tbf", "rate",
                      "100mbit", "burst", "50000", "limit", "1300000"]]
    shaped = LinkShape("1gbit", delay_ms=0.1, loss_pct=1)
    cmds = shaped.tc_commands("dq0")
    assert cmds[0][7:10] == ["tbf", "rate", "1gbit"]
    assert cmds[1][:8] == ["qdisc", "add", "dev", "dq0", "parent", "1:1", "handle", "10:"]
    assert cmds[1][8:] == ["netem", "limit", "100000", "delay", "0.1ms", "loss", "1%"]
    # the switch side shapes the rate only: delay and loss count once per link
    assert shaped.tc_commands("p0", delay=False) == [[*cmds[0][:3], "p0", *cmds[0][4:]]]
    # the burst is about 4 ms of the rate, within [32 KiB, 4 MiB]
    assert LinkShape("10mbit").burst_bytes == 32 << 10
    assert LinkShape("100mbit").burst_bytes == 50_000
    assert LinkShape("10gbit").burst_bytes == 4 << 20


def test_wire_bounds_allow_one_header_per_segment_each_way():
    low, high = wire_bounds(1_000_000, 1_000_000)
    segments = -(-1_000_000 // MSS)
    assert low == 1_000_000
    assert high == 1_000_000 + 2 * segments * FRAME_HEADER_BYTES + SLACK_BYTES
    # equal traffic both ways: about 9.1 % plus the slack, i.e. within 10 % plus a constant
    assert high < 1.10 * low + SLACK_BYTES + 2 * FRAME_HEADER_BYTES
    assert wire_bounds(0, 0, extra=10) == (0, SLACK_BYTES + 10)


def test_counters_from_ip_json_and_arithmetic(monkeypatch):
    text = ('[{"ifname":"dq0","stats64":{"rx":{"bytes":10,"packets":1},'
            '"tx":{"bytes":30,"packets":2}}}]')
    c = LinkCounters.from_ip_json(text)
    assert c == LinkCounters(tx_bytes=30, rx_bytes=10, tx_packets=2, rx_packets=1)
    assert c - c == LinkCounters() and c + c - c == c
    with pytest.raises(ValueError, match="no interface statistics"):
        LinkCounters.from_ip_json("[]")
    monkeypatch.delenv("DYNAMIQ_TESTBED_IFNAME", raising=False)
    with pytest.raises(ValueError, match="not inside a testbed"):
        interface_counters()


def test_names_and_arguments():
    n = TestbedName.parse("dynamiq-123-4-r7", "dynamiq")
    assert n == TestbedName("dynamiq", 123, 4, "r7") and n.testbed == "dynamiq-123-4"
    assert str(n) == "dynamiq-123-4-r7"
    assert TestbedName.parse("dynamiq-123-4-sw", "dynamiq").role == "sw"
    for other in ("dynamiq-123-r0", "dynamiqx-1-2-r0", "dynamiq-1-2-r0x", "foo", "dynamiq-a-1-sw"):
        assert TestbedName.parse(other, "dynamiq") is None
    with pytest.raises(ValueError, match="lower-case letters and digits"):
        Testbed(2, prefix="Dyn-amiq")
    with pytest.raises(ValueError, match=r"world_size must be an int in 1..254"):
        Testbed(0)
    with pytest.raises(ValueError, match=r"1..2 \(subnet 10.0.0.0/30\)"):
        Testbed(3, subnet="10.0.0.0/30")
    bed = Testbed(3, "100mbit")
    assert bed.shape == LinkShape("100mbit") and not bed.is_up
    assert bed.addresses == ["10.231.0.1", "10.231.0.2", "10.231.0.3"]
    assert bed.namespaces == [f"{bed.id}-r{k}" for k in range(3)]
    assert bed.id.startswith(f"dynamiq-{os.getpid()}-")
    with pytest.raises(dynamiq.testbed.TestbedError, match="not up"):
        bed.run(print)


def test_without_root_or_tools_the_message_says_what_is_needed(monkeypatch, capsys):
    monkeypatch.setattr(netns, "_capabilities", lambda: 0)
    reason = unavailable_reason()
    assert reason is not None and "needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN)" in reason
    with pytest.raises(TestbedUnavailable, match="needs root"):
        Testbed(2).up()
    assert main(["testbed", "clean"]) == 3
    assert "dynamiq testbed: the testbed needs root" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(netns, "_capabilities", lambda: -1)  # every capability
    monkeypatch.setattr(netns, "find_tool", lambda name: None if name == "tc" else "/bin/ip")
    assert unavailable_reason() == ("the testbed needs the tc command from iproute2 "
                                    "(Debian/Ubuntu: apt-get install iproute2)")
    monkeypatch.setattr(netns, "find_tool", lambda name: None)
    assert "needs the ip and tc commands from iproute2" in unavailable_reason()


# ---- on a real testbed (root) ---------------------------------------------------------------

def _host_links() -> list[str]:
    return sorted(line.split(":")[1].strip() for line in
                  ip("-o", "link", "show").stdout.splitlines())


def _mine(bed_id: str) -> list[str]:
    etc = os.listdir(netns.NETNS_ETC) if os.path.isdir(netns.NETNS_ETC) else []
    return [n for n in list_namespaces() + etc if n.startswith(f"{bed_id}-")]


def _reduce(rank: int, world_size: int, n: int) -> dict:
    """Each pipeline: a warm-up call, then a measured one between barriers, with the link's
    counters around it."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    out = {}
    for pipe in ("requant-dq4", "passthrough-fp32"):
        dynamiq.all_reduce(x.clone(), pipe)
        t, stats = x.clone(), P2PStats()
        dist.barrier()
        before = interface_counters()
        t0 = time.perf_counter()
        dynamiq.all_reduce(t, pipe, stats=stats)
        seconds = time.perf_counter() - t0
        dist.barrier()
        out[pipe] = {"result": t, "seconds": seconds, "stats": stats,
                     "link": interface_counters() - before}
    return out


def _fail_on_one(rank: int, world_size: int) -> int:
    if rank == 1:
        addr = ip("-4", "-o", "addr", "show", "dev", os.environ["GLOO_SOCKET_IFNAME"]).stdout
        raise ValueError(f"rank 1 gives up in {addr.split()[3].split('/')[0]}")
    dist.barrier()  # waits for rank 1, which never comes
    return rank


@needs_root
def test_compressed_all_reduce_across_a_shaped_testbed():
    links_before = _host_links()
    handler_before = signal.getsignal(signal.SIGTERM)
    n = 1 << 20
    shape = LinkShape("100mbit")
    # one TCP segment per frame: the counters see the headers a wire carries
    with Testbed(2, shape, gso=False) as bed:
        bed_id = bed.id
        qdiscs = bed.qdiscs()
        assert len(qdiscs) == 4  # each rank's dq0 and its switch port
        assert all("tbf 1: root" in q and "rate 100Mbit" in q for q in qdiscs.values())
        before = bed.counters()
        res = bed.run(_reduce, (n,), timeout=300, env=FEW_THREADS, num_threads=1)
        total = [b - a for a, b in zip(before, bed.counters())]
        assert len(_mine(bed_id)) == 5  # 3 namespaces, 2 hosts files
        # a second world on the same testbed: a failing rank is named, as by launch()
        with pytest.raises(RankFailedError, match="rank 1 of 2") as info:
            bed.run(_fail_on_one, timeout=120, env=FEW_THREADS, num_threads=1)
        assert "ValueError: rank 1 gives up in 10.231.0.2" in str(info.value)
    # torn down: no namespace, no hosts file; the host's own links never changed
    assert _mine(bed_id) == []
    assert _host_links() == links_before
    assert signal.getsignal(signal.SIGTERM) == handler_before  # the handler is given back

    x = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    exact = (x[0].double() + x[1].double())
    for pipe in ("requant-dq4", "passthrough-fp32"):
        r0, r1 = res[0][pipe], res[1][pipe]
        assert torch.equal(r0["result"], r1["result"])  # bit-identical on both ranks
        err = float(((r0["result"].double() - exact) ** 2).sum() / (exact**2).sum())
        assert err < (0.05 if pipe == "requant-dq4" else 1e-12), (pipe, err)
        for rank, r in enumerate((r0, r1)):
            st, link = r["stats"], r["link"]
            assert st.bytes_sent > 0 and st.bytes_received == st.bytes_sent
            # the bytes on the veth: the payload, plus at most one frame header per segment
            # each way and a constant (see wire_bounds); never less than the payload
            low, high = wire_bounds(st.bytes_sent, st.bytes_received, 2 * st.metadata_bytes)
            assert low <= link.tx_bytes <= high, (pipe, rank, st.bytes_sent, link)
            # frames of one segment: a header on every (at most 1460-byte) segment sent
            assert link.tx_bytes >= st.bytes_sent + 54 * -(-st.bytes_sent // 1460)
            assert st.bytes_received <= link.rx_bytes <= wire_bounds(
                st.bytes_received, st.bytes_sent, 2 * st.metadata_bytes)[1]
            # the peer's bytes crossed two token buckets at the rate (one burst may pass free)
            floor = (st.bytes_received - shape.burst_bytes) * 8 / shape.bits_per_second
            assert r["seconds"] >= floor, (pipe, rank, r["seconds"], floor)
            assert total[rank].tx_bytes >= link.tx_bytes  # the host reads the same counters
    # compression shows on the wire: requant-dq4 sends about 4.5 of 32 bits per coordinate
    dq4, fp32 = res[0]["requant-dq4"]["link"], res[0]["passthrough-fp32"]["link"]
    assert dq4.tx_bytes < 0.2 * fp32.tx_bytes
    # and takes correspondingly less time at 100 Mbit/s (the floor of fp32 is about 0.33 s)
    assert res[0]["passthrough-fp32"]["seconds"] > 0.3


def _make_namespace(name: str, peer: str | None = None) -> None:
    ip("netns", "add", name)
    if peer is not None:
        ip("link", "add", "x0", "type", "veth", "peer", "name", "x1", "netns", peer, ns=name)


@needs_root
def test_stale_testbeds_of_a_dead_owner_are_cleaned():
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now (reuse within the test would only keep the namespaces)
    stale = [f"dqtest-{dead.pid}-0-r0", f"dqtest-{dead.pid}-0-sw"]
    live = f"dqtest-{os.getpid()}-999-r0"  # this process is alive: not stale
    other = f"dqother-{dead.pid}-0-r0"  # another prefix: not ours to judge
    made = []
    sleeper = None
    try:
        for name in (stale[1], live, other):
            _make_namespace(name)
            made.append(name)
        _make_namespace(stale[0], peer=stale[1])
        made.append(stale[0])
        netns.write_hosts(stale[0], {"10.231.0.1": "rank0"})
        # a process left inside a stale namespace is killed with it
        sleeper = subprocess.Popen(["ip", "netns", "exec", stale[0], "sleep", "60"])
        end = time.monotonic() + 10
        while sleeper.pid not in netns.namespace_pids(stale[0]) and time.monotonic() < end:
            time.sleep(0.05)
        beds = list_testbeds("dqtest")
        assert beds[f"dqtest-{dead.pid}-0"] == {"pid": dead.pid, "alive": False,
                                                 "namespaces": sorted(stale)}
        assert beds[f"dqtest-{os.getpid()}-999"]["alive"]
        assert main(["testbed", "status", "--prefix", "dqtest"]) == 0
        removed = clean_stale("dqtest")
        assert sorted(stale) == sorted(n for n in removed if n.startswith(f"dqtest-{dead.pid}-"))
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        names = list_namespaces()
        assert not set(stale) & set(names)
        assert live in names and other in names
        assert not os.path.exists(os.path.join(netns.NETNS_ETC, stale[0]))
        # a testbed's start cleans the stale ones of its prefix
        _make_namespace(stale[0])
        bed = Testbed(1, prefix="dqtest")
        with bed:
            assert stale[0] in bed.cleaned and len(_mine(bed.id)) == 3
        assert _mine(bed.id) == []
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
        for name in made:
            delete_namespace(name)
    assert not {*stale, live, other} & set(list_namespaces())


_OWNER = textwrap.dedent("""
    import signal, sys, time
    # as in a program started from a shell, whatever this test's process ignores
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from dynamiq.testbed import Testbed
    bed = Testbed(2, "1gbit", prefix=sys.argv[1])
    if sys.argv[2] == "with":
        with bed:
            print(bed.id, flush=True)
            time.sleep(120)
    else:
        bed.up()
        print(bed.id, flush=True)
        if sys.argv[2] == "exit":  # ends normally without teardown(): atexit removes it
            sys.stdin.readline()
        else:
            time.sleep(120)
""")


def _owner(prefix: str, how: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _OWNER, prefix, how], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    bed_id = p.stdout.readline().strip()
    assert bed_id.startswith(f"{prefix}-{p.pid}-"), bed_id
    assert len(_mine(bed_id)) == 5
    return p, bed_id


@needs_root
def test_teardown_at_exit_on_sigterm_and_ctrl_c_and_after_sigkill():
    p, bed_id = _owner("dqsig", "exit")
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.wait(timeout=60) == 0
    assert _mine(bed_id) == []
    p, bed_id = _owner("dqsig", "up")  # no with block: the SIGTERM handler tears it down
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == -signal.SIGTERM  # and the signal still ends the process
    assert _mine(bed_id) == []
    p, bed_id = _owner("dqsig", "with")  # Ctrl-C: KeyboardInterrupt leaves the with block
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) != 0
    assert _mine(bed_id) == []
    p, bed_id = _owner("dqsig", "up")  # nothing runs on SIGKILL: the next start cleans up
    p.kill()
    p.wait(timeout=60)
    left = [n for n in list_namespaces() if n.startswith(f"{bed_id}-")]
    assert len(left) == 3 and len(_mine(bed_id)) == 5
    assert list_testbeds("dqsig")[bed_id]["alive"] is False
    assert set(left) <= set(clean_stale("dqsig"))
    assert _mine(bed_id) == []


@needs_root
def test_delay_and_loss_use_netem_or_say_why():
    shape = LinkShape("1gbit", delay_ms=0.1, loss_pct=0.5)
    bed = Testbed(1, shape, prefix="dqtest")
    try:
        bed.up()
    except TestbedUnavailable as e:
        assert "no netem queueing discipline" in str(e) and "modprobe sch_netem" in str(e)
        assert not bed.is_up and _mine(bed.id) == []
        return
    try:
        q = bed.qdiscs()[f"{bed.namespaces[0]}/dq0"]
        assert "netem" in q and "delay 100us" in q and "loss 0.5%" in q
        assert "netem" not in bed.qdiscs()[f"{bed.switch}/p0"]
    finally:
        bed.teardown()
    assert _mine(bed.id) == []
