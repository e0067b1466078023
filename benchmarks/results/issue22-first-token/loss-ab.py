"""The loss before (d9e3e61) and after the softmax-kept change, in one process, alternating.

    git show d9e3e61:src/attn/training/losses.py > /tmp/old_losses.py
    PYTHONPATH=src:. python benchmarks/results/issue22-first-token/loss-ab.py THREADS REPS
"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, "/tmp")
import old_losses
from attn.training import losses as new_losses
import attn.training.trainer as trainer_mod
from benchmarks.quickstart import BENCHMARK_RECIPES, RECIPES, build_trainer
torch.set_num_threads(int(sys.argv[1]))
# micro: loss forward + backward at the translator's and d256's logits
for n in (32 * 36, 64 * 32):
    z0 = torch.randn(n, 4000); t = torch.randint(1, 4000, (n,))
    res = {}
    for rep in range(9):
        for name, mod in (("old", old_losses), ("new", new_losses)):
            z = z0.clone().requires_grad_()
            s = time.perf_counter(); mod.label_smoothed_cross_entropy(z, t, 0.1, 0).loss.backward(); e = time.perf_counter() - s
            if rep: res.setdefault(name, []).append(e * 1000)
    print(f"loss fwd+bwd N={n} V=4000: old {statistics.median(res['old']):.2f} ms, new {statistics.median(res['new']):.2f} ms")
# whole step: the translation and d256 recipes' train_step with either loss, alternating
for key, recipe in (("translation", BENCHMARK_RECIPES["translation"]), ("d256", RECIPES["d256"])):
    with tempfile.TemporaryDirectory() as d:
        tr = build_trainer(recipe, Path(d) / "run")
        targets = [trainer_mod]  # the one module that imports the loss
        def use(mod):
            for m in targets: m.label_smoothed_cross_entropy = mod.label_smoothed_cross_entropy
        times = {"old": [], "new": []}
        for name, mod in (("old", old_losses), ("new", new_losses)): use(mod); tr.train_step()
        for r in range(int(sys.argv[2])):
            order = (("old", old_losses), ("new", new_losses)) if r % 2 == 0 else (("new", new_losses), ("old", old_losses))
            for name, mod in order:
                use(mod); s = time.perf_counter(); tr.train_step(); times[name].append(time.perf_counter() - s)
        o, nw = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"{key} step ({[m.__name__ for m in targets]}): old {o*1000:.1f} ms, new {nw*1000:.1f} ms, old/new {o/nw:.3f}")
