# Summarises a trace of scripts/diag/reaction.bt: per new Docker cgroup (blkio hierarchy id 7 here, see
# /proc/cgroups), the time from its mkdir to the agent's write of a 5-byte weight ("1000\n") into its
# blkio.bfq.weight; and how long the agent's daemon thread waited runnable for a CPU.
import sys
ev = []
for line in open(sys.argv[1], errors="replace"):
    p = line.split()
    if len(p) >= 2 and p[1].isdigit():
        ev.append((int(p[1]), p[0], line.rstrip()))
ev.sort()
mk, res, pending = {}, {}, None
for t, k, l in ev:
    if k == "M":
        parts = l.split()
        if parts[2] == "7":
            mk.setdefault(parts[4].split("/")[2], t)
    elif k == "P" and l.endswith("/blkio.bfq.weight"):
        pending = l.split()[2].split("/")[-2]
    elif k == "X" and pending:
        if l.endswith("n=5") and pending in mk and pending not in res:
            res[pending] = t - mk[pending]
        pending = None
    elif k == "P":
        pending = None
# waits of the agent thread while runnable (switch-in latency after preemption or wakeup)
lat = sorted(int(l.split("lat=")[1].split()[0]) / 1e6 for t, k, l in ev if k == "S" and "ddiskqos-agent" in l)
v = sorted(x / 1e6 for x in res.values())
q = lambda a, f: a[min(len(a) - 1, int(len(a) * f))]
print(f"mkdir(blkio) -> agent's write of 1000: n={len(v)} median={q(v,.5):.2f} p90={q(v,.9):.2f} max={v[-1]:.2f} ms; over 20 ms: {sum(x > 20 for x in v)}")
print(f"agent thread runnable->running: n={len(lat)} p99={q(lat,.99):.2f} max={lat[-1]:.2f} ms; over 10 ms: {sum(x > 10 for x in lat)}")
