"""Sums an ncu CSV (gpu__time_duration.sum per kernel) by kernel: the GEMM share (cuBLAS /
cuBLASLt kernels) against the example's own kernels (kernels.cu)."""
import csv, sys, collections
OURS = {"encoder_forward", "layernorm_forward", "permute_qkv", "unpermute",
        "softmax_causal_forward", "softmax_causal_backward", "unpermute_backward",
        "permute_qkv_backward", "residual_forward", "crossentropy_forward_backward", "fill_zero",
        "layernorm_backward_partial", "column_sum_accumulate", "encoder_backward_wpe",
        "encoder_backward_wte", "adamw_begin_step", "adamw_update_dev", "gelu_forward",
        "residual_layernorm_forward", "column_sum"}
scale = {"ns": 1e-6, "nsecond": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}
tot = collections.Counter(); cnt = collections.Counter()
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0].strip()
    ms = float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1e-6)
    tot[name] += ms; cnt[name] += 1
steps = max(cnt.get("encoder_forward", 1), 1)
ours = sum(v for k, v in tot.items() if k in OURS)
lib = sum(v for k, v in tot.items() if k not in OURS)
print(f"{sys.argv[2] if len(sys.argv) > 2 else ''}: {steps} steps profiled; per step: GEMMs (cuBLAS/cuBLASLt) {lib/steps:.2f} ms, "
      f"our kernels {ours/steps:.2f} ms; GEMM share {lib/(lib+ours):.1%}")
for k, v in tot.most_common(24):
    print(f"  {v/steps:8.3f} ms/step  {cnt[k]//steps:4d}/step  {'ours' if k in OURS else 'gemm'}  {k[:90]}")
