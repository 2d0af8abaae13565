# Pools the fair-share floor A/B's runs: per arm and case, means and slowest reads, the median of per-round
# dDiskQoS/Original ratios, STARVED reads (each judged against its own run's slowest Original read) and boosts.
import json, glob, statistics as st, sys, re
pat = sys.argv[1] if len(sys.argv) > 1 else 'crates/bench/results/2026-11-28/floor-ab-af6bcc7-run*-floor*-results.json'
runs = sorted(glob.glob(pat), key=lambda p: int(re.search(r'run(\d+)', p).group(1)))
by, starved, boosts, arms = {}, {}, {}, []
for p in runs:
    arm = re.search(r'floor(\d+)', p).group(1)
    if arm not in arms: arms.append(arm)
    d = json.load(open(p))
    m = d['modes'][0]
    boosts[arm] = boosts.get(arm, 0) + m['agent']['metrics']['decisions'].get('boosted', 0)
    for e in m.get('exp1', []) + m.get('exp2', []):
        lab = e['label']
        vs = {v['variant']: v['samples'] for v in e['variants']}
        if 'ddiskqos' not in vs or not vs['ddiskqos']: continue
        omax = max(s['read_ms'] for s in vs['original'])
        for v, ss in vs.items():
            by.setdefault((arm, lab, v), []).extend(s['read_ms'] for s in ss)
        o = {s['round']: s['read_ms'] for s in vs['original']}
        by.setdefault((arm, lab, 'ratio'), []).extend(s['read_ms'] / o[s['round']] for s in vs['ddiskqos'] if s['round'] in o)
        bad = [round(s['read_ms']) for s in vs['ddiskqos'] if s['read_ms'] > 2 * omax]
        run = re.search(r'run\d+', p).group(0)
        starved.setdefault((arm, lab), []).extend(f"{run}:{b} vs {round(omax)}" for b in bad)
labels = []
for (arm, lab, v) in by:
    if lab not in labels: labels.append(lab)
print('runs:', ' '.join(re.search(r'run\d+-floor\d+', p).group(0) for p in runs))
print(f"{'case':10} {'arm':>4} | {'Orig mean/max':>16} | {'dDQ mean/max':>16} | {'n':>4} | {'dDQ/Orig med/means/worst':>25} | STARVED")
for lab in labels:
    for arm in arms:
        if (arm, lab, 'ddiskqos') not in by: continue
        def mm(v):
            x = by.get((arm, lab, v), [])
            return f"{st.mean(x):7.1f}/{max(x):7.1f}" if x else '-'
        dq = by[(arm, lab, 'ddiskqos')]; og = by[(arm, lab, 'original')]; r = by[(arm, lab, 'ratio')]
        s = starved[(arm, lab)]
        print(f"{lab:10} {arm:>4} | {mm('original'):>16} | {mm('ddiskqos'):>16} | {len(dq):4} | {st.median(r):7.2f} {st.mean(dq)/st.mean(og):7.2f} {max(dq)/max(og):7.2f} | {len(s)} {' '.join(s)}")
print('agent boosts (starvation and share):', boosts)
