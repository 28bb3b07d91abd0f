"""Issue 36's verify targets, as ``bench.run`` reports them in its section's summary lines:
a plain verify at least 0.60 of bare aiohttp (B/A), a verify counting one autoApply
limit at least 0.9 of a plain verify, and a verify spending identity credits at least 0.5
of a plain verify, all from one run.

A scenario's B against verify's B is taken two ways: the ratio of B's medians, and the
ratio of the two scenarios' B/A (each the median of its rounds' B/A, A and B having run
back to back). The second is the verdict: on a machine shared with other work, B's own
rate moves from scenario to scenario with the load, and A, measured beside it, moves
with it.
"""

import statistics
from collections.abc import Collection

from bench.report import Cell, CellGrid

# (scenario, what it is, target): verify's against A, the others against verify.
TARGETS = (
    ("verify", "plain verify B/A", 0.60),
    ("verify-limited", "one autoApply limit / plain verify", 0.90),
    ("verify-identity", "identity credits / plain verify", 0.50),
)


def _rps(cell: Cell) -> float:
    return cell.median(lambda r: r.rps)


def paired(a: Cell, b: Cell) -> float:
    """The median of the rounds' B/A (0.0 when none was measured)."""
    each = [y.rps / x.rps for x, y in zip(a.rounds, b.rounds, strict=True) if x.rps]
    return statistics.median(each) if each else 0.0


def lines(grid: CellGrid, names: Collection[str], a: str = "A", b: str = "B") -> list[str]:
    """One summary line per target whose scenarios ran (with verify's, for the others)."""
    if "verify" not in names or a not in grid["verify"]:
        return []
    plain = paired(grid["verify"][a], grid["verify"][b])
    found = []
    for name, what, target in TARGETS:
        if name not in names:
            continue
        cells = grid[name]
        if name == "verify":
            ratio, detail = plain, f"medians' B/A {_rps(cells[b]) / (_rps(cells[a]) or 1):.2f}"
        else:
            ratio = paired(cells[a], cells[b]) / plain if plain else 0.0
            raw = _rps(cells[b]) / (_rps(grid["verify"][b]) or 1)
            detail = f"B's medians alone {raw:.2f}"
        verdict = "met" if ratio >= target else "NOT met"
        found.append(f"issue 36, {what} >= {target:.2f}: {ratio:.2f} ({detail}), {verdict}")
    return found
