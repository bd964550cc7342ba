#!/usr/bin/env python3
"""PyTorch reference for the GPT-2 training example.

Reads the initial weights and the training tokens that the Rust side wrote (safetensors files,
parsed here with struct/json/torch.frombuffer: no `safetensors` or `transformers` package), trains
GPT-2 with AdamW for --steps steps and writes the per-step losses, so the Rust driver's losses (and,
with --grads-out, its first-step gradients) can be compared with PyTorch's.

Model (names are those of the weights file, in `named_parameters()` order):
  transformer.wte.weight (Vp, C), transformer.wpe.weight (T, C),
  transformer.h.{l}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
  transformer.ln_f.{weight, bias}.
  x = wte[idx] + wpe[pos]; per block x += attn(ln_1(x)); x += mlp(ln_2(x)); x = ln_f(x);
  logits = x @ wte^T (tied head, Vp columns), sliced to the first V columns;
  loss = cross_entropy(logits, targets), the mean over the B*T positions.
  Layer norm eps 1e-5; GELU with the tanh approximation; attention with explicit matmuls:
  softmax(mask(q k^T * (1/sqrt(HS)))) v, the masked entries -inf.

Config: the weights file's __metadata__ keys layers, heads, channels, seq, vocab, padded_vocab.
Tokens: an I32 tensor "tokens" of at least B*T+1 entries; step i uses window
w = i % ((len - 1) // (B*T)) (= i when the file holds --steps windows):
inputs = tokens[w*B*T : w*B*T + B*T], targets = tokens[w*B*T + 1 : w*B*T + B*T + 1], each (B, T).

Correctness run: for each step: zero_grad(set_to_none=True), forward (under
torch.autocast(bfloat16) for --dtype bf16, with float32 master weights), backward,
[after the first step's backward: --grads-out], optimizer.step(), loss.item().
Prints {"step": i, "loss": x, "ms": t} a line (steps counted from 0) and writes the list to --out.

Bench run (--bench N): the same step, timed after warm-up, eagerly, under torch.compile
(--compile), or as one CUDA graph replayed per step (--cuda-graph); prints the median ms/step
and the peak of torch.cuda.max_memory_allocated as one JSON object (also written to --out).
"""

import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_HEADER_LEN = 100_000_000
DTYPES = {"F32": torch.float32, "I32": torch.int32}
DTYPE_NAMES = {torch.float32: "F32", torch.int32: "I32"}
CONFIG_KEYS = ("layers", "heads", "channels", "seq", "vocab", "padded_vocab")


# ----------------------------------------------------------------------------------------------
# safetensors (F32 and I32 only, little-endian)


def read_safetensors(path):
    """Returns ({name: tensor} in the order of the data, {key: value} metadata)."""
    if sys.byteorder != "little":
        raise SystemExit("a little-endian host is needed")
    size = os.path.getsize(path)
    if size < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    buf = bytearray(size)
    with open(path, "rb") as f:
        if f.readinto(buf) != size:
            raise ValueError(f"{path}: short read")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > min(size - 8, MAX_HEADER_LEN):
        raise ValueError(f"{path}: header length {n} out of bounds")
    header = json.loads(bytes(buf[8 : 8 + n]).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ is not a string map")
    data_start = 8 + n
    data_len = size - data_start
    entries = []
    for name, info in header.items():
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r}: unsupported dtype {info.get('dtype')!r}")
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        numel = math.prod(shape)
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_len or end - begin != numel * 4:
            raise ValueError(f"{path}: tensor {name!r}: bad shape {shape} or offsets [{begin}, {end})")
        entries.append((begin, end, name, dtype, shape))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    expected = 0
    for begin, end, name, _, _ in entries:
        if begin != expected:
            raise ValueError(f"{path}: tensor {name!r}: data not contiguous")
        expected = end
    if expected != data_len:
        raise ValueError(f"{path}: {data_len - expected} bytes of data belong to no tensor")
    tensors = {}
    for begin, end, name, dtype, shape in entries:
        numel = math.prod(shape)
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=dtype, count=numel, offset=data_start + begin)
            tensors[name] = t.reshape(shape).clone()
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes [(name, tensor)] in the order given, data back to back, header padded to 8."""
    if sys.byteorder != "little":
        raise SystemExit("a little-endian host is needed")
    header = {"__metadata__": {str(k): str(v) for k, v in (metadata or {}).items()}}
    cpu = []
    offset = 0
    for name, t in tensors:
        t = t.detach().to("cpu").contiguous()
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} is not float32 or int32")
        nbytes = t.numel() * 4
        header[name] = {
            "dtype": DTYPE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        cpu.append(t)
        offset += nbytes
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for t in cpu:
            if t.numel() == 0:
                continue
            out = bytearray(t.numel() * 4)
            torch.frombuffer(out, dtype=torch.uint8).copy_(t.reshape(-1).view(torch.uint8))
            f.write(out)


# ----------------------------------------------------------------------------------------------
# model


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, sdpa):
        super().__init__()
        c = cfg["channels"]
        self.n_head = cfg["heads"]
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.sdpa = sdpa
        t = cfg["seq"]
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool)).view(1, 1, t, t)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, c = x.size()
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)  # (B, NH, T, HS)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["channels"]
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, sdpa):
        super().__init__()
        c = cfg["channels"]
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.attn = CausalSelfAttention(cfg, sdpa)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        self.cfg = cfg
        c = cfg["channels"]
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg["padded_vocab"], c),
                wpe=nn.Embedding(cfg["seq"], c),
                h=nn.ModuleList([Block(cfg, sdpa) for _ in range(cfg["layers"])]),
                ln_f=nn.LayerNorm(c, eps=1e-5),
            )
        )
        # The output head is tied to wte: no parameter of its own.

    def forward(self, idx, targets):
        _, t = idx.size()
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = F.linear(x, self.transformer.wte.weight)  # (B, T, Vp)
        v = self.cfg["vocab"]
        logits = logits[..., :v]  # the padded columns take no part in the loss
        return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1))


# ----------------------------------------------------------------------------------------------
# driver


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", required=True, help="initial weights (safetensors, config in metadata)")
    p.add_argument("--tokens", required=True, help='safetensors file with an I32 tensor "tokens"')
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--out", help="losses (JSON list), or the bench result")
    p.add_argument("--grads-out", help="first step's gradients (safetensors), before optimizer.step")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sdpa", action="store_true",
                   help="F.scaled_dot_product_attention (flash) instead of explicit matmuls; bf16 only")
    p.add_argument("--bench", type=int, metavar="N", help="time N steps after --warmup steps")
    p.add_argument("--warmup", type=int, default=5, help="bench warm-up steps")
    p.add_argument("--compile", action="store_true", help="bench torch.compile(model)")
    p.add_argument("--cuda-graph", action="store_true", help="bench the whole step as one CUDA graph")
    a = p.parse_args(argv)
    if a.sdpa and a.dtype == "f32":
        p.error("--sdpa is for --dtype bf16 (the f32 reference uses explicit matmuls)")
    if (a.compile or a.cuda_graph) and a.bench is None:
        p.error("--compile and --cuda-graph are bench modes: give --bench N")
    if a.compile and a.cuda_graph:
        p.error("choose one of --compile and --cuda-graph")
    if a.steps < 1 or a.batch < 1 or (a.bench is not None and a.bench < 1) or a.warmup < 0:
        p.error("--steps, --batch and --bench must be positive, --warmup not negative")
    return a


def load_config(metadata):
    try:
        cfg = {k: int(metadata[k]) for k in CONFIG_KEYS}
    except (KeyError, ValueError) as e:
        raise SystemExit(f"weights metadata lacks the config key or value {e}")
    if min(cfg.values()) <= 0 or cfg["channels"] % cfg["heads"] or cfg["padded_vocab"] < cfg["vocab"]:
        raise SystemExit(f"invalid config {cfg}")
    return cfg


def build_model(args, device):
    weights, metadata = read_safetensors(args.weights)
    cfg = load_config(metadata)
    model = GPT(cfg, sdpa=args.sdpa)
    expected = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    found = [(n, tuple(t.shape)) for n, t in weights.items()]
    if sorted(expected) != sorted(found):
        raise SystemExit(f"weights do not match the model: expected {expected[:4]}..., found {found[:4]}...")
    if any(t.dtype != torch.float32 for t in weights.values()):
        raise SystemExit("weights must be F32")
    model.load_state_dict(weights, strict=True)
    return model.to(device), cfg


def load_tokens(args, cfg, device):
    toks, _ = read_safetensors(args.tokens)
    if "tokens" not in toks:
        raise SystemExit(f'{args.tokens}: no tensor named "tokens"')
    t = toks["tokens"]
    if t.dtype != torch.int32:
        raise SystemExit(f"{args.tokens}: tokens must be I32")
    t = t.reshape(-1)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= cfg["vocab"]):
        raise SystemExit(f"{args.tokens}: a token is outside [0, {cfg['vocab']})")
    n = args.batch * cfg["seq"]
    windows = (t.numel() - 1) // n if t.numel() > 0 else 0
    if windows < 1:
        raise SystemExit(f"{args.tokens}: {t.numel()} tokens, fewer than one window of {n + 1}")
    if windows < args.steps and args.bench is None:
        print(f"note: {windows} windows for {args.steps} steps: the windows repeat", file=sys.stderr)
    return t.to(device=device, dtype=torch.long), windows


def window(tokens, windows, step, b, t):
    n = b * t
    s = (step % windows) * n
    return tokens[s : s + n].view(b, t), tokens[s + 1 : s + n + 1].view(b, t)


def make_optimizer(model, args, capturable=False):
    return torch.optim.AdamW(
        model.parameters(),
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
        weight_decay=args.weight_decay,
        foreach=False,
        fused=False,
        capturable=capturable,
    )


def autocast_ctx(args, device):
    if args.dtype == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return torch.autocast(device_type=torch.device(device).type, enabled=False)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def train(args, model, cfg, tokens, windows, device):
    opt = make_optimizer(model, args)
    records = []
    for i in range(args.steps):
        x, y = window(tokens, windows, i, args.batch, cfg["seq"])
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast_ctx(args, device):
            loss = model(x, y)
        loss.backward()
        spent_saving = 0.0
        if i == 0 and args.grads_out:
            s0 = time.perf_counter()
            grads = []
            for name, p in model.named_parameters():
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                grads.append((name, g.float()))
            meta = {k: str(v) for k, v in cfg.items()}
            meta.update(step="0", loss=repr(loss.item()), dtype=args.dtype, batch=str(args.batch))
            write_safetensors(args.grads_out, grads, meta)
            spent_saving = time.perf_counter() - s0
        opt.step()
        loss_v = loss.item()
        sync(device)
        ms = (time.perf_counter() - t0 - spent_saving) * 1e3
        rec = {"step": i, "loss": loss_v, "ms": ms}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
            f.write("\n")
    return records


def bench(args, model, cfg, tokens, windows, device):
    if torch.device(device).type != "cuda":
        raise SystemExit("--bench needs a CUDA device")
    b, t = args.batch, cfg["seq"]
    torch.cuda.reset_peak_memory_stats()
    times = []
    if args.cuda_graph:
        mode = "cuda-graph"
        opt = make_optimizer(model, args, capturable=True)
        sx, sy = (u.clone() for u in window(tokens, windows, 0, b, t))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(3, args.warmup)):
                opt.zero_grad(set_to_none=True)
                with autocast_ctx(args, device):
                    loss = model(sx, sy)
                loss.backward()
                opt.step()
            del loss  # no autograd graph of the warm-up may outlive it (AccumulateGrad streams)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            with autocast_ctx(args, device):
                static_loss = model(sx, sy)
            static_loss.backward()
            opt.step()
        for i in range(args.bench):
            x, y = window(tokens, windows, i, b, t)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        last_loss = static_loss.item()
    else:
        mode = "compile" if args.compile else "eager"
        run_model = torch.compile(model) if args.compile else model
        opt = make_optimizer(model, args)

        def step(i):
            x, y = window(tokens, windows, i, b, t)
            opt.zero_grad(set_to_none=True)
            with autocast_ctx(args, device):
                loss = run_model(x, y)
            loss.backward()
            opt.step()
            return loss

        for i in range(args.warmup):
            step(i)
        torch.cuda.synchronize()
        for i in range(args.bench):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step(i)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        last_loss = loss.item()
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated()
    result = {
        "mode": mode,
        "dtype": args.dtype,
        "attention": "sdpa" if args.sdpa else "explicit",
        "config": cfg,
        "batch": b,
        "steps_timed": args.bench,
        "warmup": args.warmup,
        "ms_median": med,
        "ms_min": min(times),
        "ms_mean": statistics.fmean(times),
        "tokens_per_s": b * t / (med / 1e3),
        "peak_mem_bytes": peak,
        "peak_mem_gib": peak / 2**30,
        "last_loss": last_loss,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    print(json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


def main(argv=None):
    args = parse_args(argv)
    device = args.device
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (pass --device cpu for a CPU run)")
    # Plain f32 matrix products: no TF32 anywhere.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    model, cfg = build_model(args, device)
    tokens, windows = load_tokens(args, cfg, device)
    if args.bench is not None:
        bench(args, model, cfg, tokens, windows, device)
    else:
        train(args, model, cfg, tokens, windows, device)


if __name__ == "__main__":
    main()
