"""The small-m GEMM's "n" form (x @ w with w (k, n) row-major) against its "t" form (x @ w.T)
and NumPy, f32 1 x 4096 @ 4096 x 4096 at 1 thread, for several k chunk lengths (kc is a runtime
size, so one compiled kernel serves them all), alternating in one loop, median of 9:

    python bench/skinny_n_form.py
"""
import numpy as np, time, statistics
from lazycandle.runtime import matmul_skinny as SK, matmul as MM
from lazycandle.runtime.buffers import address
from lazycandle.layout import Layout
from lazycandle.dtype import DType
f32=DType.from_name("f32")
K_, N_ = 4096, 4096
r=np.random.default_rng(0)
x=r.standard_normal((1,K_)).astype(np.float32); w=r.standard_normal((K_,N_)).astype(np.float32)
wt=np.ascontiguousarray(w.T)
out=np.zeros((1,N_),np.float32)
pn=SK.SkinnyPlan(MM.geometry(Layout((1,K_),(K_,1)), Layout((K_,N_),(N_,1)), f32), 1)
pt=SK.SkinnyPlan(MM.geometry(Layout((1,K_),(K_,1)), Layout((K_,N_),(1,K_)), f32), 1)
idx=SK.K.SIZES.index("kc")
variants={}
for kc in (16, 32, 64, 128, 512, K_):
    s=pn.sizes.copy(); s[idx]=kc; s[idx+1]=-(-K_//kc); variants[kc]=s
times={k:[] for k in list(variants)+["t","np"]}
for rnd in range(9):
    for kc,s in variants.items():
        pn.sizes=s; a=time.perf_counter(); pn.run(address(x),address(w),address(out)); times[kc].append(time.perf_counter()-a)
        if rnd==0: assert np.allclose(out, x@w, rtol=1e-3, atol=1e-2)
    a=time.perf_counter(); pt.run(address(x),address(wt),address(out)); times["t"].append(time.perf_counter()-a)
    a=time.perf_counter(); x@w; times["np"].append(time.perf_counter()-a)
for k,v in times.items(): print(k, round(1e3*statistics.median(v),2))
