"""Could the client have limited what it measured? One verdict for the stress test and the
batch converter. Standard library only (a pure function, tested with exact inputs)."""

from __future__ import annotations

# The client must be able to go at least this many times faster than the rate it measured:
# below that, part of what looks like the server's speed may be the client's.
HEADROOM = 2.0


def headroom_verdict(capacity_pages_per_s: float | None, measured_pages_per_s: float, *, waited: bool = False,
                   remedy: str = "") -> str:
    """'not the bottleneck: …' or 'MAY LIMIT THE RESULT: …' (or 'n/a' without figures).
    `waited`: the workers were seen waiting for the client's own preparation."""
    if not capacity_pages_per_s or measured_pages_per_s <= 0:
        return "n/a"
    ratio = capacity_pages_per_s / measured_pages_per_s
    if ratio >= HEADROOM and not waited:
        return (f"not the bottleneck: the client could drive ~{capacity_pages_per_s:,.0f} pages/s, "
                f"{ratio:,.0f}× the measured {measured_pages_per_s:.2f}")
    return (f"MAY LIMIT THE RESULT: the client could drive ~{capacity_pages_per_s:,.1f} pages/s against "
            f"{measured_pages_per_s:.2f} measured" + ("; senders waited for pages to be prepared" if waited else "")
            + (f" ({remedy})" if remedy else ""))
