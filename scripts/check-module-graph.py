#!/usr/bin/env python3
"""The module import graph of each crate source directory given, and its cycles (exit status 1 if any).

    scripts/check-module-graph.py [--self-test] crates/*/src

A node is a module (a file: `a/b.rs` or `a/b/mod.rs` is `a::b`); an edge `a -> b` means code of `a` outside its
tests names an item of `b` (`use crate::b::...`, `super::` and `self::` paths, or a `crate::b::...` path in the
code). A module naming its own ancestors' items is ownership, not an edge. Test modules (`#[cfg(test)] mod ...`
blocks, `tests.rs` files, `tests/` folders) are left out. `--self-test` first checks that a made-up crate with a
cycle fails and one without passes. Run by `scripts/test.sh` (issue 28: no import cycle)."""
import os, re, sys, tempfile


def graph(src):
# module path -> file
    mods = {}
    for d, _, fs in os.walk(src):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(d, f); rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] == 'mod': rel = rel[:-1]
            if rel in (['lib'], ['main']): rel = []
            if rel and rel[-1] == 'main' and len(rel) == 1: continue
            mods['::'.join(rel)] = p
    def lex(text):
        """Rust text without comments, string and char literals (each left as an empty literal)."""
        out, i, n = [], 0, len(text)
        while i < n:
            c = text[i]
            if text.startswith('//', i):
                j = text.find('\n', i); i = n if j < 0 else j
            elif text.startswith('/*', i):
                depth, i = 1, i + 2
                while i < n and depth:
                    if text.startswith('/*', i): depth += 1; i += 2
                    elif text.startswith('*/', i): depth -= 1; i += 2
                    else: i += 1
            elif c == 'r' and re.match(r'r#*"', text[i:i+10]) and (i == 0 or not (text[i-1].isalnum() or text[i-1] == '_')):
                m = re.match(r'r(#*)"', text[i:]); end = '"' + m.group(1)
                j = text.find(end, i + m.end()); i = n if j < 0 else j + len(end); out.append('""')
            elif c == '"':
                i += 1
                while i < n and text[i] != '"':
                    i += 2 if text[i] == '\\' else 1
                i += 1; out.append('""')
            elif c == "'":
                m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
                if m: i += m.end(); out.append("' '")
                else: out.append(c); i += 1
            else:
                out.append(c); i += 1
        return ''.join(out)
    def strip(text):
        text = lex(text)
        out, i = [], 0
        for m in re.finditer(r'#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*(\{|;)', text):
            if m.start() < i: continue
            out.append(text[i:m.start()])
            if m.group(3) == ';': i = m.end(); continue
            depth = 1; j = m.end()
            while depth and j < len(text):
                depth += {'{': 1, '}': -1}.get(text[j], 0); j += 1
            i = j
        out.append(text[i:]); return ''.join(out)
    def expand(prefix, body):
        # body of a brace group, may nest
        items, depth, cur = [], 0, ''
        for ch in body:
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            if ch == ',' and depth == 0: items.append(cur); cur = ''
            else: cur += ch
        items.append(cur)
        res = []
        for it in items:
            it = re.sub(r'\s+', '', it)
            if not it: continue
            m = re.match(r'^([\w:]*?)::\{(.*)\}$', it)
            if m: res += expand(prefix + [x for x in m.group(1).split('::') if x], m.group(2)); continue
            it = it.split(' as ')[0]
            res.append(prefix + [x for x in it.split('::') if x and x != 'self'])
        return res
    def resolve(path):
        for k in range(len(path), 0, -1):
            key = '::'.join(path[:k])
            if key in mods: return key
        return None
    bad_test_files = re.compile(r'(^|/)tests(\.rs|/)')
    edges = {m: {} for m in mods}
    for m, f in mods.items():
        if m == '' or bad_test_files.search(os.path.relpath(f, src)): continue
        t = strip(open(f).read())
        # `super::` and `self::` as crate paths, so one parser reads every path
        here = m.split('::') if m else []
        def absolute(mt):
            n = mt.group(0).count('super::')
            base = here[:len(here) - n] if n <= len(here) else []
            return 'crate::' + ''.join(x + '::' for x in base)
        t = re.sub(r'\b(?:super::)+', absolute, t)
        t = re.sub(r'\buse\s+self::', 'use crate::' + ''.join(x + '::' for x in here), t)
        paths = []
        for u in re.finditer(r'\buse\s+([^;]+);', t, re.S):
            body = re.sub(r'\s+', '', re.sub(r'\s+as\s+\w+', '', u.group(1)))
            if body.startswith('{'):
                found = expand([], body[1:-1])
            else:
                mm = re.match(r'^([\w:]*?)::\{(.*)\}$', body)
                found = expand([x for x in mm.group(1).split('::') if x], mm.group(2)) if mm else expand([], body)
            for q in found:
                if q[:1] == ['crate']:
                    paths.append(q[1:])
                elif q and '::'.join(here + q[:1]) in mods:
                    paths.append(here + q)  # a child module, named relative to this one
        t2 = re.sub(r'\buse\s+[^;]+;', '', t, flags=re.S)
        paths += [p.group(1).split('::') for p in re.finditer(r'\bcrate::((?:\w+::)*\w+)', t2)]
        for p in paths:
            r = resolve(p)
            if r is None or r == '' or r == m: continue
            if m.startswith(r + '::'): continue  # a child using its ancestor's items: ownership, not a cycle
            edges[m].setdefault(r, f)
    return mods, edges


def cycles(edges):
    idx, low, st, on, sccs, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in edges[v]:
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            sccs.append(comp)
    for v in edges:
        if v not in idx: sc(v)
    return [sorted(s) for s in sccs if len(s) > 1]


def report(src):
    mods, edges = graph(src)
    bad = cycles(edges)
    for comp in bad:
        print(f'{src}: import cycle among: ' + ' '.join(comp))
        for a in comp:
            for b in sorted(edges[a]):
                if b in comp:
                    print(f'  {a} -> {b}  ({edges[a][b]})')
    print(f'{src}: {len(mods)} modules, {sum(len(e) for e in edges.values())} imports, {len(bad)} cycles')
    return not bad


def self_test():
    files = {
        'lib.rs': 'pub mod a;\npub mod b;\npub mod c;\n',
        'a.rs': 'use crate::b::Thing;\n// use crate::c::Never; a comment\nconst S: &str = "crate::c::NotCode";\n',
        'b/mod.rs': 'pub mod inner;\npub use inner::Thing;\n',
        'b/inner.rs': 'use super::super::c;\npub struct Thing;\n#[cfg(test)]\nmod tests { use crate::a::X; }\n',
        'c.rs': 'pub fn f() { let _ = \'"\'; }\n',
    }
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
            with open(os.path.join(d, name), 'w') as f:
                f.write(text)
        _, edges = graph(d)
        assert edges['a'] == {'b': os.path.join(d, 'a.rs')}, edges['a']
        assert set(edges['b::inner']) == {'c'}, edges['b::inner']
        assert cycles(edges) == [], cycles(edges)
        with open(os.path.join(d, 'c.rs'), 'a') as f:
            f.write('use crate::{a, b::inner};\n')
        _, edges = graph(d)
        found = cycles(edges)
        assert found == [['a', 'b', 'b::inner', 'c']] or found == [['a', 'b::inner', 'c']], found
    print('check-module-graph: self-test passed (a cycle is found, comments, strings and tests are not imports)')


if __name__ == '__main__':
    args = sys.argv[1:]
    if args[:1] == ['--self-test']:
        self_test()
        args = args[1:]
    ok = all([report(src) for src in args])
    sys.exit(0 if ok else 1)
