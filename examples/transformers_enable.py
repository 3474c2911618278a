#!/usr/bin/env python3
"""One call puts transformers' MambaForCausalLM on libselscan: the fused training call, the causal conv1d, the
scan, generate()'s conv update and decode step. The model code stays as it is.

    SELSCAN_LIBRARY=build/<dir>/libselscan.so PYTHONPATH=python python3 examples/transformers_enable.py

A tiny random-weight model; CUDA when torch sees a GPU (a CUDA build of libselscan), else CPU.
"""

import torch
from transformers import MambaConfig, MambaForCausalLM

import selscan.integrations.transformers as selscan_transformers

selscan_transformers.enable()  # the one call; selscan_transformers.disable() undoes it

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
config = MambaConfig(vocab_size=1000, hidden_size=64, state_size=16, num_hidden_layers=2)
model = MambaForCausalLM(config).to(device)

prompt = torch.randint(0, config.vocab_size, (2, 16), device=device)
model.eval()
with torch.no_grad():
    tokens = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False)
print("generated:", tokens[:, prompt.shape[1]:].tolist())

model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
batch = torch.randint(0, config.vocab_size, (4, 64), device=device)
loss = model(input_ids=batch, labels=batch).loss
loss.backward()
optimizer.step()
print(f"one training step on {device}: loss {loss.item():.4f}")
