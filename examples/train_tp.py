# torchrun --nproc_per_node 2 examples/train_tp.py   (CPU: gloo; on GPUs use "nccl" and "cuda")
import os, torch, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoConfig, AutoModelForCausalLM
import hyperpar as hp, hyperpar.torch

dist.init_process_group("gloo")
torch.manual_seed(0)                                   # the same initial weights on every rank
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(
    os.path.join(os.path.dirname(__file__), "..", "tests/data/forward/llama")))
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
plan = hp.plan(model, mesh=mesh)                       # hyperpar derives and checks the plan ...
print(hp.cost(model, mesh=mesh, mode="train", seq=16, batch=8)["ranks"][0]["total_bytes"], "bytes/rank") \
    if dist.get_rank() == 0 else None
hyperpar.torch.parallelize(model, mesh, plan)          # ... and PyTorch executes it (DTensor)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, model.config.vocab_size, (8, 16), generator=torch.Generator().manual_seed(1))
for step in range(5):
    logits = model(ids).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward(); opt.step(); opt.zero_grad()
    if dist.get_rank() == 0: print(f"step {step + 1} loss {loss.item():.4f}")
dist.destroy_process_group()
