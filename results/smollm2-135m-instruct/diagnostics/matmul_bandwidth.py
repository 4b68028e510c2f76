import torch, time, sys
for th in [1, 2]:
    torch.set_num_threads(th)
    W = torch.randn(1536, 576)
    Ws = [torch.randn(1536, 576) for _ in range(60)]  # 212 MB > cache
    for m in [1, 9, 32]:
        x = torch.randn(m, 576)
        for _ in range(2):
            t0 = time.perf_counter()
            for w in Ws: torch.nn.functional.linear(x, w)
            dt = time.perf_counter() - t0
        gb = 60 * W.numel() * 4 / 1e9
        print(f"threads {th} m={m}: {dt*1000:.1f} ms for 60 mats, {gb/dt:.1f} GB/s, {2*m*60*W.numel()/dt/1e9:.1f} GFLOPS", flush=True)
