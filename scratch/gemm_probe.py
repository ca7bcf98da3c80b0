"""Probe: bandwidth of the decode GEMMs of the 1.5B shape at batch 256, several layouts/backends."""
import torch, torch.nn.functional as F, time
torch.manual_seed(0)
dev = "cuda"
M = 256
shapes = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960), "lm_head": (151936, 1536)}
def bench(fn, reps=200):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps // 20): g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps
for name, (N, K) in shapes.items():
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    wt = w.t().contiguous()
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    b = w.numel() * 2
    r = {}
    r["F.linear (NT)"] = bench(lambda: F.linear(x, w))
    r["x @ wT stored KN"] = bench(lambda: torch.matmul(x, wt))
    r["mm out="] = bench(lambda: torch.mm(x, w.t(), out=out))
    for m2 in (64, 128, 512):
        x2 = torch.randn(m2, K, device=dev, dtype=torch.bfloat16)
        r[f"F.linear M={m2}"] = bench(lambda: F.linear(x2, w))
    print(name, f"{b/1e6:.1f} MB", " | ".join(f"{k}: {v*1e6:.1f}us {b/v/1e12:.2f}TB/s" for k, v in r.items()), flush=True)
try:
    lin = torch.compile(lambda a, bb: F.linear(a, bb), mode="max-autotune-no-cudagraphs")
    for name in ("gate_up", "down"):
        N, K = shapes[name]
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16); w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        lin(x, w); t = bench(lambda: lin(x, w))
        print("max-autotune", name, f"{t*1e6:.1f}us {w.numel()*2/t/1e12:.2f}TB/s", flush=True)
except Exception as e:
    print("autotune failed", type(e).__name__, str(e)[:200])
