"""Issue 38's cost target: held-poll fan-out and publish with presence on
against off, on one node in one run (``python -m loadtest.bench --only presence``).

Rule: the two sides differ only by ``--presence``; each side is a fresh
`pushup serve`, measured by the same code as the ``fanout`` and ``publish``
scenarios (``scenarios.bench_fanout``, ``scenarios.bench_publish``), the sides
taking turns within each repeat, so a ratio
compares what presence adds and the machine's noise lands on both (each side
takes each place in the order in turn: run as many repeats as sides):

* fan-out: ``n`` long polls on one channel re-polling on receipt, ``rounds``
  publishes, each waited for until every poll has it; the figure is the
  node's CPU from the first publish until the last round's re-polls are held,
  per delivery (a delivery and its re-poll, as a long-poll client pays);
* publish: 8 keep-alive publishers for a few seconds, nobody subscribed; the
  node's CPU per publish answered 201.

Two kinds of subscriber: ``plain`` polls (the bench's client: nobody names
itself, so presence counts them while held) and ``members``, where each
subscriber names a ``client`` id and a ``user`` of its own (as the JS client
with ``presence: true`` does): each counts for the window after its poll, is a
member, and no two re-polls share a query string, on both sides alike. The
load generator's CPU is beside each figure; the target is every ratio (on ÷
off) <= 1.05. With ``against`` (``--presence-against SERVER``), a third side,
``base``, is that server command with presence off (e.g. another checkout's
node), taking turns with the others on plain polls and publishes: its ratio to
``off`` says what having presence in the code costs when it is off.
"""

from __future__ import annotations

import dataclasses
import statistics
from multiprocessing.connection import Connection
from typing import Any

from .client import Conn, Worker
from .pool import WorkerPool
from .scenarios import PUSHUP, Context, Target, bench_fanout, bench_publish
from .server import Server, raise_nofile

SIDES = (("off", ()), ("on", ("--presence",)))  # (side, its flags); "base": see above
KINDS = ("plain", "members")
TARGET = 1.05


@dataclasses.dataclass
class _Flagged(Context):
    """A context whose servers all get ``flags`` (the side's), and that notes,
    as each stops, how many subscriptions it counted (``/stats``'s
    ``presence_subscriptions``; None without presence): the scenario's proof
    that the members were members (they linger for the window after their
    clients left) and plain polls anonymous."""

    flags: tuple[str, ...] = ()
    counted: list[int | None] = dataclasses.field(default_factory=list)

    def server(self, name: str, target: Target = PUSHUP, flags: tuple[str, ...] = ()) -> Server:
        srv = super().server(name, target, self.flags + flags)
        plain_stop = srv.stop

        def stop(grace: float = 10.0) -> int | None:
            if srv.proc is not None and srv.proc.poll() is None and srv.port:
                self.counted.append(srv.stats().get("presence", {})
                                    .get("presence_subscriptions"))
            return plain_stop(grace)
        srv.stop = stop  # type: ignore[method-assign]  # (bench_fanout stops it)
        return srv


class MemberWorker(Worker):
    """The bench's load client, each of its subscribers a member: every poll
    of a connection names the same ``client`` and ``user``, its own."""

    def __init__(self, pipe: Connection, index: int) -> None:
        super().__init__(pipe, index)
        self.names: dict[int, bytes] = {}  # by connection (its fd)
        self.named = 0

    def send_poll(self, c: Conn) -> None:
        assert self.sub is not None
        name = self.names.get(c.fd)
        if name is None:
            self.named += 1
            name = self.names[c.fd] = b"&client=w%dn%d&user=user-%d-%d" % (
                self.index, self.named, self.index, self.named)
        self.send(c, self.sub.poll_request(c.position + name))

    def forget(self, c: Conn) -> None:
        self.names.pop(c.fd, None)
        super().forget(c)


def member_worker_main(pipe: Connection, index: int) -> None:
    raise_nofile()
    try:
        MemberWorker(pipe, index).run()
    except (EOFError, KeyboardInterrupt):
        pass


def _fanout_figures(run: dict[str, Any]) -> dict[str, Any]:
    usage = run["usage_all_publishes"]
    delivered = run["deliveries"]
    return {"server_us_per_delivery": 1e6 * usage["server_cpu_s"] / delivered,
            "generator_us_per_delivery": 1e6 * usage["generator_cpu_s"] / delivered,
            "others_us_per_delivery": 1e6 * usage["others_cpu_s"] / delivered,
            "delivered_pct": run["delivered_pct"], "last_p50_s": run["last_p50_s"],
            "client_counters": run["client_counters_end"]}


def _publish_figures(run: dict[str, Any]) -> dict[str, Any]:
    (sample,) = run["samples"]
    usage, ok = sample["usage"], sample["ok"]
    return {"server_us_per_publish": 1e6 * usage["server_cpu_s"] / ok,
            "generator_us_per_publish": 1e6 * usage["generator_cpu_s"] / ok,
            "others_us_per_publish": 1e6 * usage["others_cpu_s"] / ok,
            "per_second": sample["per_second"], "client_counters": sample["client_counters"]}


def _ratio(on: list[float], off: list[float]) -> float | None:
    a, b = statistics.median(on), statistics.median(off)
    return a / b if b else None


def bench_presence(ctx: Context, n: int, rounds: int, round_timeout: float, publishers: int,
                   publish_seconds: float, reps: int,
                   against: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"subscribers": n, "rounds": rounds, "publishers": publishers,
                           "publish_seconds": publish_seconds, "reps": reps,
                           "against": None if against is None else " ".join(against)}
    sides = [(side, ctx.server_command, flags) for side, flags in SIDES]
    if against is not None:
        sides.append(("base", against, ()))
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        f"{kind}_{side}": {"fanout": [], "publish": []} for kind in KINDS for side, _, _ in sides
        if kind == "plain" or side != "base"}
    size = len(ctx.pool.pids)
    with WorkerPool(size, target=member_worker_main) as members_pool:
        pools = {"plain": ctx.pool, "members": members_pool}
        for rep in range(reps):
            # each side first, in the middle and last in turn (rotated: a side's
            # place within a repeat is no bias of its median)
            order = sides[rep % len(sides):] + sides[:rep % len(sides)]
            for kind in KINDS:
                for side, command, flags in order:
                    key = f"{kind}_{side}"
                    if key not in samples:
                        continue
                    flagged = _Flagged(**{f.name: getattr(ctx, f.name)
                                          for f in dataclasses.fields(Context)},
                                       flags=flags)
                    flagged.pool = pools[kind]
                    flagged.server_command = command
                    fan = _fanout_figures(bench_fanout(
                        flagged, f"presence-{key}-{rep}", n, rounds, round_timeout))
                    fan["members_counted"] = flagged.counted[0] if flagged.counted else None
                    samples[key]["fanout"].append(fan)
                    ctx.log(f"    presence {kind} {side} rep={rep}: fan-out "
                            f"{fan['server_us_per_delivery']:.1f} us node CPU per delivery, "
                            f"generator {fan['generator_us_per_delivery']:.1f} us")
                    if kind == "plain":  # a publish names no subscriber: once per side
                        pub = _publish_figures(bench_publish(flagged, publishers,
                                                             publish_seconds, 1))
                        samples[key]["publish"].append(pub)
                        ctx.log(f"    presence {side} rep={rep}: publish "
                                f"{pub['server_us_per_publish']:.1f} us node CPU per publish, "
                                f"generator {pub['generator_us_per_publish']:.1f} us")
    for key, runs in samples.items():
        side: dict[str, Any] = {}
        for what, unit in (("fanout", "delivery"), ("publish", "publish")):
            rows = runs[what]
            if not rows:
                continue
            side[what] = {
                f"server_us_per_{unit}": statistics.median(r[f"server_us_per_{unit}"]
                                                           for r in rows),
                f"generator_us_per_{unit}": statistics.median(r[f"generator_us_per_{unit}"]
                                                              for r in rows),
                "samples": rows,
            }
        out[key] = side
    out["ratios"] = {}
    for kind in KINDS:
        for what, unit in (("fanout", "delivery"), ("publish", "publish")):
            on, off = out[f"{kind}_on"].get(what), out[f"{kind}_off"].get(what)
            if on is None or off is None:
                continue
            field = f"server_us_per_{unit}"
            out["ratios"][f"{kind}_{what}"] = _ratio([r[field] for r in on["samples"]],
                                                     [r[field] for r in off["samples"]])
            base = out.get(f"{kind}_base", {}).get(what)
            if base is not None:  # presence off here against the other node
                out["ratios"][f"{kind}_{what}_off_vs_base"] = _ratio(
                    [r[field] for r in off["samples"]], [r[field] for r in base["samples"]])
    return out


def table(res: dict[str, Any]) -> str:
    lines = [f"Presence on against off, one node ({res['subscribers']:,} long polls x "
             f"{res['rounds']} publishes; {res['publishers']} publishers for "
             f"{res['publish_seconds']:g} s; median of {res['reps']}; generator CPU in "
             "brackets)", ""]
    head = f"{'figure':40} {'off':>18} {'on':>18} {'on/off':>7}"
    lines += [head, "-" * len(head)]
    for kind in KINDS:
        for what, unit in (("fanout", "delivery"), ("publish", "publish")):
            off, on = res[f"{kind}_off"].get(what), res[f"{kind}_on"].get(what)
            if off is None or on is None:
                continue
            cells = [f"{s[f'server_us_per_{unit}']:.1f} us ({s[f'generator_us_per_{unit}']:.1f})"
                     for s in (off, on)]
            ratio = res["ratios"].get(f"{kind}_{what}")
            label = (f"{kind} polls: node CPU per delivery" if what == "fanout"
                     else "node CPU per publish")
            lines.append(f"{label:40} {cells[0]:>18} {cells[1]:>18} "
                         f"{'-' if ratio is None else f'{ratio:.3f}':>7}")
            base = res.get(f"{kind}_base", {}).get(what)
            if base is not None:
                vs = res["ratios"].get(f"{kind}_{what}_off_vs_base")
                cell = (f"{base[f'server_us_per_{unit}']:.1f} us "
                        f"({base[f'generator_us_per_{unit}']:.1f})")
                lines.append(f"{'  base (presence off), off/base':40} {cell:>18} {'':>18} "
                             f"{'-' if vs is None else f'{vs:.3f}':>7}")
    lines.append(f"(target: every on/off <= {TARGET}"
                 + (f"; base: {res['against']})" if res.get("against") else ")"))
    return "\n".join(lines)
