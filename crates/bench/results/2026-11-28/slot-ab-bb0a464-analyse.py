import json, glob, statistics as st, sys, re
runs = sorted(glob.glob('crates/bench/results/2026-11-28/slot-ab-bb0a464-run*-slot*-results.json'), key=lambda p: int(re.search(r'run(\d+)-', p).group(1)))
by = {}
starved = {}
for p in runs:
    arm = re.search(r'slot(\d+)', p).group(1)
    d = json.load(open(p))
    m = d['modes'][0]
    for e in m.get('exp1', []) + m.get('exp2', []):
        lab = e['label']
        vs = {v['variant']: v['samples'] for v in e['variants']}
        omax = max(s['read_ms'] for s in vs['original'])
        for v, ss in vs.items():
            by.setdefault((arm, lab, v), []).extend(s['read_ms'] for s in ss)
        o = {s['round']: s['read_ms'] for s in vs['original']}
        ratios = [s['read_ms'] / o[s['round']] for s in vs['ddiskqos'] if s['round'] in o]
        by.setdefault((arm, lab, 'ratio'), []).extend(ratios)
        starved[(arm, lab)] = starved.get((arm, lab), 0) + sum(s['read_ms'] > 2 * omax for s in vs['ddiskqos'])
labels = []
for (arm, lab, v) in by:
    if lab not in labels: labels.append(lab)
print('runs:', ' '.join(re.search(r'run\d+-slot\d+', p).group(0) for p in runs))
print(f"{'case':10} {'arm':>4} | {'Alone mean/max':>16} | {'Orig mean/max':>16} | {'dDQ mean/max':>16} | {'dDQ>100ms':>9} | {'dDQ/Orig med/means/worst':>25} | STARVED")
for lab in labels:
    for arm in ['16', '32']:
        def mm(v):
            x = by.get((arm, lab, v), [])
            return f"{st.mean(x):7.1f}/{max(x):7.1f}" if x else '-'
        dq = by[(arm, lab, 'ddiskqos')]; og = by[(arm, lab, 'original')]
        r = by[(arm, lab, 'ratio')]
        print(f"{lab:10} {arm:>4} | {mm('alone'):>16} | {mm('original'):>16} | {mm('ddiskqos'):>16} | {sum(x>100 for x in dq):3}/{len(dq):<5} | {st.median(r):7.2f} {st.mean(dq)/st.mean(og):7.2f} {max(dq)/max(og):7.2f} | {starved[(arm, lab)]}")
