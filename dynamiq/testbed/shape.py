"""What a testbed's links look like: :class:`LinkShape` (rate, one-way delay, loss), validated,
and the ``tc`` commands that give a link that shape.

A rate is written as ``tc`` writes bit rates (``"100mbit"``, ``"1gbit"``, ``"1.5gbit"``,
``"100Mbit/s"``, or a number of bits per second); the units are decimal (``kbit`` = 1000 bit/s).
``tc``'s byte units (``"100mbps"`` is 100 *megabytes* per second to ``tc``) are refused, since
they are a classic way to get a link eight times too fast.

Only the standard library is imported here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

__all__ = ["LinkShape", "format_rate", "parse_rate"]

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_RATE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?:(?P<unit>[kmgt]?)bit(?:/s)?)?\s*$",
                   re.IGNORECASE)

#: Slowest and fastest rates accepted, bits per second (``tc``'s 32-bit rate tables and
#: shaping on a CPU make little sense outside these).
MIN_RATE = 8_000
MAX_RATE = 400 * 10**9


def parse_rate(rate: str | int | float) -> int:
    """A bit rate in bits per second.

    Args:
        rate: ``"100mbit"``, ``"1gbit"``, ``"1.5Gbit/s"``, ``"800kbit"`` (decimal units, case
            ignored), or a number of bits per second.

    Returns:
        Bits per second, an integer.

    Raises:
        ValueError: the rate is not a bit rate (byte units such as ``"mbps"`` included), or
            lies outside 8 kbit/s .. 400 gbit/s.
        TypeError: ``rate`` is neither a string nor a number.
    """
    if isinstance(rate, bool) or not isinstance(rate, (str, int, float)):
        raise TypeError(f"rate must be a string such as '100mbit' or a number of bits per "
                        f"second, got {type(rate).__name__} {rate!r}")
    if isinstance(rate, str):
        if re.search(r"bps|byte", rate, re.IGNORECASE) or re.search(r"[\dkKmMgGtT]B", rate):
            raise ValueError(f"rate {rate!r}: give a bit rate such as '100mbit' ('bps' is "
                             f"bytes per second to tc, 8 times faster than it reads)")
        m = _RATE.match(rate)
        if not m:
            raise ValueError(f"rate {rate!r} is not a bit rate: write e.g. '100mbit', '1gbit', "
                             f"'1.5gbit' or '800kbit' (decimal units)")
        value = Decimal(m["num"]) * _UNITS[(m["unit"] or "").lower()]
    else:
        if not math.isfinite(rate):
            raise ValueError(f"rate {rate!r} is not a number of bits per second")
        value = Decimal(rate)
    if value != value.to_integral_value():
        raise ValueError(f"rate {rate!r} is not a whole number of bits per second")
    bps = int(value)
    if not MIN_RATE <= bps <= MAX_RATE:
        raise ValueError(f"rate {rate!r} = {bps} bit/s is outside {format_rate(MIN_RATE)} .. "
                         f"{format_rate(MAX_RATE)}")
    return bps


def format_rate(bps: int) -> str:
    """``bps`` in the largest decimal unit that writes it exactly (``100000000`` → ``"100mbit"``),
    the form ``tc`` reads."""
    for unit in ("t", "g", "m", "k"):
        if bps % _UNITS[unit] == 0:
            return f"{bps // _UNITS[unit]}{unit}bit"
    return f"{bps}bit"


def _number(name: str, value: float, low: float, high: float, high_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or value < low or above:
        bound = f"{high})" if high_open else f"{high}]"
        raise ValueError(f"{name} must lie in [{low}, {bound}, got {value!r}")
    return value


@dataclass(frozen=True)
class LinkShape:
    """The shape of every rank's link to the testbed's switch.

    Each rank's network interface sends at most ``rate`` and receives at most ``rate`` (like a
    full-duplex NIC on a non-blocking switch); what it sends is delayed by ``delay_ms`` and
    dropped with probability ``loss_pct`` percent. A message from one rank to another thus
    takes ``delay_ms`` one way (``2 * delay_ms`` round trip) plus its bytes at ``rate``.

    ``LinkShape("100mbit")``, ``LinkShape("1gbit", delay_ms=0.1)``. The rate is kept in the
    canonical form ``tc`` reads (``LinkShape("100Mbit/s").rate == "100mbit"``), so equal
    shapes compare equal.

    Delay and loss need the kernel's ``netem`` queueing discipline (``CONFIG_NET_SCH_NETEM``,
    module ``sch_netem``); a testbed refuses a shape with either when the kernel lacks it. The
    rate alone uses ``tbf``.

    Attributes:
        rate: Bit rate in each direction: ``"100mbit"``, ``"1gbit"``, a number of bits per
            second (see :func:`parse_rate`).
        delay_ms: One-way delay added to every packet a rank sends, in milliseconds
            (0 .. 10000).
        loss_pct: Percentage of the packets a rank sends that are dropped (0 .. 100, 100
            excluded); TCP resends them, so it costs time, not data.
    """

    rate: str = "1gbit"
    delay_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", format_rate(parse_rate(self.rate)))
        object.__setattr__(self, "delay_ms", _number("delay_ms", self.delay_ms, 0.0, 1e4, False))
        object.__setattr__(self, "loss_pct", _number("loss_pct", self.loss_pct, 0.0, 100.0,
                                                     True))

    @property
    def bits_per_second(self) -> int:
        """The rate in bits per second."""
        return parse_rate(self.rate)

    @property
    def needs_netem(self) -> bool:
        """Whether the shape has a delay or a loss (which ``netem`` implements)."""
        return self.delay_ms > 0 or self.loss_pct > 0

    @property
    def burst_bytes(self) -> int:
        """Bytes the token bucket lets through at once: about 4 ms of the rate, at least 32 KiB
        (a 64 KiB GSO packet is then split in two rather than stalled), at most 4 MiB."""
        return int(min(4 << 20, max(32 << 10, self.bits_per_second // 8 * 4 // 1000)))

    @property
    def queue_bytes(self) -> int:
        """Bytes a link may hold queued before dropping: 100 ms of the rate plus a burst."""
        return int(self.bits_per_second // 8 // 10 + self.burst_bytes)

    def describe(self) -> str:
        """A short human-readable form, e.g. ``"100mbit, 0.1 ms, 0% loss"``."""
        return f"{self.rate}, {self.delay_ms:g} ms, {self.loss_pct:g}% loss"

    def tc_commands(self, dev: str, *, delay: bool = True) -> list[list[str]]:
        """The ``tc`` argument lists that shape the egress of ``dev`` (run in its namespace).

        Args:
            dev: The interface.
            delay: Whether this side also adds the delay and loss (one side of each link
                does, so they are counted once).

        Returns:
            ``tbf`` at the rate as the root queueing discipline and, when ``delay`` and the
            shape has a delay or loss, ``netem`` as its child.
        """
        cmds = [["qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", self.rate,
                 "burst", str(self.burst_bytes), "limit", str(self.queue_bytes)]]
        if delay and self.needs_netem:
            netem = ["qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                     "limit", "100000"]
            if self.delay_ms > 0:
                netem += ["delay", f"{self.delay_ms:g}ms"]
            if self.loss_pct > 0:
                netem += ["loss", f"{self.loss_pct:g}%"]
            cmds.append(netem)
        return cmds
