"""Byte and packet counters of a network interface, as the kernel keeps them.

A veth's ``tx_bytes`` counts every frame the interface sent after its queueing discipline let
it go: the Ethernet header (14 bytes), the IP and TCP headers and the payload, and nothing of
what the queue dropped. The veth may carry GSO packets (up to 64 KiB under one set of headers),
so the count of headers can be lower than that of a wire with 1500-byte frames; see
:doc:`/testbed` for the allowance between these counts and dynamiq's own.

Read them from the host with :meth:`dynamiq.testbed.Testbed.counters`, or inside a rank with
:func:`interface_counters`.

Only the standard library is imported here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

__all__ = ["FRAME_HEADER_BYTES", "IFNAME_ENV", "MSS", "SLACK_BYTES", "LinkCounters",
           "interface_counters", "wire_bounds"]

#: Environment variable holding the rank's interface name inside a testbed.
IFNAME_ENV = "DYNAMIQ_TESTBED_IFNAME"
#: Payload bytes of a full TCP segment on a 1500-byte MTU with timestamps (1500 - 20 - 32).
MSS = 1448
#: Header bytes of every frame a veth counts: Ethernet 14, IPv4 20, TCP 20 + 12 of timestamps.
FRAME_HEADER_BYTES = 66
#: Bytes a measured interval may hold besides the messages: gloo's headers of each message,
#: a barrier on each side of the interval, ARP, TCP window updates.
SLACK_BYTES = 16 << 10


def wire_bounds(sent: int, received: int, extra: int = 0) -> tuple[int, int]:
    """Bounds on a link's ``tx_bytes`` over an interval in which its rank sent ``sent`` and
    received ``received`` bytes of messages.

    At least the messages themselves. At most the messages, plus a frame header per segment
    of ``sent`` (one per :data:`MSS`), plus a pure ACK frame per segment of ``received`` (TCP
    acknowledges at least every other segment; one per segment bounds quick-ack mode), plus
    :data:`SLACK_BYTES` and ``extra`` (e.g. collectives run in the interval by other means).
    For equal traffic both ways that is about ``1.091 * sent + SLACK_BYTES``; GSO frames on
    the veth only lower the header count.

    Returns:
        ``(low, high)`` in bytes.
    """
    segments = -(-sent // MSS)
    acks = -(-received // MSS)
    return sent, sent + FRAME_HEADER_BYTES * (segments + acks) + SLACK_BYTES + extra


@dataclass(frozen=True)
class LinkCounters:
    """Totals of one interface since it was created; subtract two readings for an interval.

    Attributes:
        tx_bytes: Bytes of the frames sent.
        rx_bytes: Bytes of the frames received.
        tx_packets: Frames sent.
        rx_packets: Frames received.
    """

    tx_bytes: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    rx_packets: int = 0

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(self.tx_bytes - other.tx_bytes, self.rx_bytes - other.rx_bytes,
                            self.tx_packets - other.tx_packets,
                            self.rx_packets - other.rx_packets)

    def __add__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(self.tx_bytes + other.tx_bytes, self.rx_bytes + other.rx_bytes,
                            self.tx_packets + other.tx_packets,
                            self.rx_packets + other.rx_packets)

    @classmethod
    def from_ip_json(cls, text: str) -> LinkCounters:
        """The counters in the output of ``ip -s -j link show dev IF``.

        Raises:
            ValueError: the output holds no statistics of one interface.
        """
        try:
            (entry,) = json.loads(text)
            stats = entry.get("stats64") or entry["stats"]
            tx, rx = stats["tx"], stats["rx"]
            return cls(int(tx["bytes"]), int(rx["bytes"]), int(tx["packets"]),
                       int(rx["packets"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"no interface statistics in ip's output: {text[:200]!r}") from e


def interface_counters(ifname: str | None = None) -> LinkCounters:
    """The counters of an interface of this process's network namespace, from ``/sys``.

    Inside a rank of a testbed (a process started by
    :meth:`dynamiq.testbed.Testbed.run`, whose ``/sys`` shows its namespace), the default
    interface is the rank's link to the switch.

    Args:
        ifname: The interface (default: ``$DYNAMIQ_TESTBED_IFNAME``).

    Raises:
        ValueError: no interface given and the variable is unset (not inside a testbed).
        OSError: no such interface.
    """
    ifname = ifname or os.environ.get(IFNAME_ENV)
    if not ifname:
        raise ValueError(f"no interface given and {IFNAME_ENV} is unset (not inside a testbed "
                         f"rank)")
    base = f"/sys/class/net/{ifname}/statistics"

    def read(name: str) -> int:
        with open(f"{base}/{name}") as f:
            return int(f.read())

    return LinkCounters(read("tx_bytes"), read("rx_bytes"), read("tx_packets"),
                        read("rx_packets"))
