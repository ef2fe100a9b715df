"""For each search whose last level was a climb's (no fail, max_levels-1 tried), what each rule would ask."""
import json, math, re, sys, glob, os
def fit(pts):
    xs=[math.log(r) for r,m in pts]; ys=[m for r,m in pts]
    n=len(xs); mx=sum(xs)/n; my=sum(ys)/n
    sxx=sum((x-mx)**2 for x in xs)
    if sxx==0: return None
    return sum((x-mx)*(y-my) for x,y in zip(xs,ys))/sxx
for path in sorted(glob.glob('climbs/tell-*.log')):
    seed=os.path.basename(path)[5:-4]
    js='climbs/rows-%s.json'%seed
    if not os.path.exists(js): continue
    trials=json.load(open(js))[0]['unlimited']['trials']
    truth={round(t['measured'],2):(t['trial'],t['truth']) for t in trials if t['measured']}
    searches={}
    order=[]
    for line in open(path):
        d=dict(kv.split('=') for kv in line.split()[1:]); sid=line.split()[0]
        if sid not in searches or searches[sid]['done']:
            searches[sid]={'cap':float(d['cap']),'max':int(d['max']),'pts':[],'done':False}; order.append(searches[sid])
        s=searches[sid]
        s['pts'].append((float(d['rate']), d['ok']=='True', None if d['m']=='None' else float(d['m'])))
    for s in order:
        pts=s['pts']
        if any(not ok for _,ok,_ in pts[:-1]): continue
        if len(pts)!=s['max']: continue
        # the last level was asked after max-1 levels: it is pts[-1]; the climb before it
        before=pts[:-1]; last=pts[-1]
        passed=max(r for r,_,_ in before)
        start=0.9*s['cap']
        m2=before[-1][2]; 
        sl2=fit([(r,m) for r,_,m in before[-2:]]); slall=fit([(r,m) for r,_,m in before if m is not None])
        def root(sl):
            if sl is None: return None
            if sl<=0: return math.inf
            return passed*math.exp(-m2/sl)
        key=round(passed,2)
        # the trial's truth: by the search's final passed (the row's measured)
        final=max(r for r,ok,_ in pts if ok)
        tr=truth.get(round(final,2))
        print(seed, 'cap %.2f start %.2f'%(s['cap'],start), 'climb', ' '.join('%.2f(%.2f)'%(r,m) for r,_,m in before), 'head-last %.2f'%last[0],
              'R2 %.2f'%min(start,root(sl2) or 0), 'Rall %.2f'%min(start,root(slall) or 0), 'slopes %.2f %.2f'%(sl2 or 0, slall or 0), 'truth', tr)
