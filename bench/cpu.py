"""CPU a request of keysvc's process, scenario by scenario: ``python -m bench.cpu``.

On a machine shared with other work, req/s moves with the load; the CPU the keysvc
process spends on a request (user and system time from /proc/PID/stat around a wrk
run, over the requests it answered) moves much less. One keysvc on a file seeded as
``bench.run`` seeds it, the scenarios named taking turns round by round after one
unrecorded warm-up each; prints one line a round and the medians. It imports only what
every tree since issue 36's named limits has (``bench.seed``, ``bench.scenarios``,
``bench.servers``, ``bench.wrk``), so a copy of it measures an older tree too:
``PYTHONPATH=TREE python cpu.py`` from that tree.
"""

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import scenarios, seed, wrk
from bench.servers import Server, start_keysvc


def process_cpu(server: Server) -> float:
    """The CPU seconds (user and system) ``server``'s process has used so far."""
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return ticks / _TICKS


_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__)
    parser.add_argument("--only", default="verify,verify-limited,verify-identity")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--others", type=int, default=2000)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _args(argv)
    chosen = [scenarios.BY_NAME[name] for name in args.only.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as folder:
        work = Path(folder)
        seeded = seed.seed(work / "keysvc.db", 1000, 1000, others=args.others)
        files = {
            s.name: scenarios.write_requests(s, seeded, work / f"{s.name}.tsv") for s in chosen
        }
        each: dict[str, list[float]] = {s.name: [] for s in chosen}
        with start_keysvc(work / "keysvc.db", work / "keysvc.log") as server:
            for s in chosen:
                status = scenarios.probe(server.base, s.lines(seeded)[0]).status
                if status != 200:
                    raise SystemExit(f"{s.name}: keysvc answers {status}")
                wrk.run("wrk", server.base, files[s.name], wrk.WrkSettings(seconds=args.warmup))
            settings = wrk.WrkSettings(seconds=args.seconds)
            for number in range(1, args.rounds + 1):
                for s in chosen:
                    # Its keys back in the caches (the scenarios' keys outnumber them).
                    wrk.run("wrk", server.base, files[s.name], wrk.WrkSettings(seconds=1))
                    before = process_cpu(server)
                    result = wrk.run("wrk", server.base, files[s.name], settings)
                    used = process_cpu(server) - before
                    if result.non_2xx or result.socket_errors:
                        raise SystemExit(f"{s.name}: {result.non_2xx} not 2xx")
                    each[s.name].append(used / result.requests * 1e6)
                    print(
                        f"cpu {args.label} round {number} {s.name}: {result.rps:,.0f} req/s,"
                        f" {each[s.name][-1]:.0f} us CPU a request",
                        flush=True,
                    )
    plain = statistics.median(each[chosen[0].name])
    for name, values in each.items():
        median = statistics.median(values)
        # As a share of the first scenario's rate, were the process's CPU all that bounds it.
        share = plain / median
        print(f"cpu {args.label} median {name}: {median:.0f} us a request (rate share {share:.2f})")


if __name__ == "__main__":
    main()
