"""Reference losses of multi-step AdamW training with PyTorch and transformers (run once, kept in tests/data).

python3 tests/ref/train_ref.py MODEL_DIR IDS.safetensors STEPS [lr beta1 beta2 eps wd] > out.json

Loads MODEL_DIR with transformers in float64 (bf16-stored weights widened exactly), trains on input_ids with
torch.optim.AdamW for STEPS steps on the same batch, and prints {"loss": [...]} (each step's loss before its
update) and "max_abs_param": the largest |parameter| after the last step."""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

d, ids_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
lr, b1, b2, eps, wd = (float(x) for x in (sys.argv[4:9] if len(sys.argv) > 4 else (1e-3, 0.9, 0.95, 1e-8, 0.1)))
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager",
                                         experts_implementation="eager")
m.train()
ids = load_file(ids_path)["input_ids"].long()
opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
losses = []
for _ in range(steps):
    opt.zero_grad()
    out = m(input_ids=ids, labels=ids)
    out.loss.backward()
    losses.append(out.loss.item())
    opt.step()
print(json.dumps({"loss": losses}))
