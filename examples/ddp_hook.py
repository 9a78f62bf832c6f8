"""Data-parallel training through dynamiq's DDP communication hook, under torchrun.

    torchrun --nproc-per-node 2 examples/ddp_hook.py --steps 20 --pipeline dynamiq

Every rank trains the same small MLP on its own random regression data; the hook averages the
gradient buckets with the chosen pipeline. Rank 0 prints the loss, the bits per coordinate the
hook sent and where its time went, and at the end whether the replicas are bit-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dynamiq.ddp import DynamiQState, dynamiq_hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pipeline", default="dynamiq")
    ap.add_argument("--width", type=int, default=512)
    args = ap.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" \
        else torch.device("cpu")
    torch.manual_seed(0)  # the same initial parameters everywhere
    net = nn.Sequential(nn.Linear(64, args.width), nn.GELU(), nn.Linear(args.width, args.width),
                        nn.GELU(), nn.Linear(args.width, 1)).to(device)
    model = DDP(net, device_ids=[device.index] if backend == "nccl" else None)
    state = DynamiQState(pipeline=args.pipeline, min_compress_numel=0)
    model.register_comm_hook(state, dynamiq_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    w_true = torch.randn(64, 1, generator=torch.Generator().manual_seed(7))
    for step in range(args.steps):
        x = torch.randn(256, 64, generator=g)
        y = torch.tanh(x @ w_true) + 0.1 * torch.randn(256, 1, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        s = state.stats.reset()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d} loss {loss.item():.4f} | {s.bits_per_coord:5.2f} bits/coord, "
                  f"codec {s.codec_seconds * 1e3:6.1f} ms, wire {s.wire_seconds * 1e3:6.1f} ms, "
                  f"wait {s.wait_seconds * 1e3:6.1f} ms, plain buckets {s.plain_calls}")
    h = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
    every = [None] * world
    dist.all_gather_object(every, h.hexdigest())
    if rank == 0:
        print(f"replicas bit-identical: {len(set(every)) == 1}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
