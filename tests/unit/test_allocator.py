"""Freed CPU memory kept for the next step: page faults of repeated training steps, with and without."""

import json
import platform
import statistics
import subprocess
import sys

import pytest

# Sixteen updates of a small MLP whose activations and gradients are 2-8 MiB each; prints the minor
# page faults of each of the last eight.
STEPS = """
import json, resource, sys, torch
from attn.training.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randn(2048, 256)
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults[8:]))
"""


def faults_of_a_late_step(mode: str) -> float:
    """The median minor page faults of the late steps."""
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return statistics.median(json.loads(done.stdout))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's malloc's")
def test_kept_memory_spares_later_steps_their_page_faults():
    default, kept = faults_of_a_late_step("default"), faults_of_a_late_step("keep")
    assert default > 1_000  # glibc's defaults map the large tensors afresh every step
    # Kept, a typical late step faults no page; now and then the heap still grows by a block (a
    # step with 512-2,560 faults in about one run of three), which a median of eight steps ignores.
    assert kept < default / 10

