//! The model on the GPU: parameters, gradients, AdamW state and activations in one pool, the
//! forward pass, the backward pass and the update, in f32 or in bf16 mixed precision
//! ([`Precision`]).
//!
//! Layout (row-major, as `torch.nn.Linear` keeps its weights): activations `(B, T, C)`,
//! attention matrices `(B, NH, T, T)`; every linear layer is `y = x W^T + b` through cuBLASLt
//! with the bias (and for the MLP the GELU, keeping its input) fused as epilogues; the
//! attention is strided-batched GEMMs over each sequence's heads around a causal softmax
//! kernel, reading q, k, v where the QKV projection wrote them `(B, T, 3, NH, HS)` and writing
//! its output as `(B, T, NH, HS)` (no permutation kernels). The MLP's activation is not kept
//! per layer: the backward recomputes it from the pre-activation. The kernels are CUDA C++ in
//! `kernels.cu`, compiled at run time by cuda-rtc (once per precision).
//!
//! In [`Precision::Bf16`] activations, gradients and the weights the matmuls read are bf16
//! (the matmuls accumulate in f32, every kernel computes in f32); AdamW keeps f32 master
//! weights and moments and writes the bf16 copy as it updates them.

use cudars_blas::{bf16, Element, Epilogue, Gemm, LtMatmul, Mat, Op, StridedBatch};
use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
use cudars_rtc::{Kernel, Program};

use crate::init::{param_specs, Config};
use crate::Result;

/// The kernels of `kernels.cu`.
struct Kernels {
    encoder_forward: Kernel,
    layernorm_forward: Kernel,
    softmax_causal_forward: Kernel,
    softmax_causal_backward: Kernel,
    residual_layernorm_forward: Kernel,
    crossentropy_forward_backward: Kernel,
    fill_zero: Kernel,
    layernorm_backward_partial: Kernel,
    column_sum: Kernel,
    encoder_backward_wpe: Kernel,
    encoder_backward_wte: Kernel,
    adamw_begin_step: Kernel,
    adamw_update_dev: Kernel,
    gelu_forward: Kernel,
}

impl Kernels {
    fn load(dev: &Device, prec: Precision) -> Result<Kernels> {
        let mut program = Program::new(include_str!("kernels.cu")).name("gpt2_kernels.cu");
        if prec == Precision::Bf16 {
            program = program.define("GPT2_BF16", 1);
        }
        let module = program.device(dev)?.compile()?.load(dev)?;
        let k = |name: &str| module.kernel(name);
        Ok(Kernels {
            encoder_forward: k("encoder_forward")?,
            layernorm_forward: k("layernorm_forward")?,
            softmax_causal_forward: k("softmax_causal_forward")?,
            softmax_causal_backward: k("softmax_causal_backward")?,
            residual_layernorm_forward: k("residual_layernorm_forward")?,
            crossentropy_forward_backward: k("crossentropy_forward_backward")?,
            fill_zero: k("fill_zero")?,
            layernorm_backward_partial: k("layernorm_backward_partial")?,
            column_sum: k("column_sum")?,
            encoder_backward_wpe: k("encoder_backward_wpe")?,
            encoder_backward_wte: k("encoder_backward_wte")?,
            adamw_begin_step: k("adamw_begin_step")?,
            adamw_update_dev: k("adamw_update_dev")?,
            gelu_forward: k("gelu_forward")?,
        })
    }
}

/// The precision of a model's activations, gradients and matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in f32 (the exact comparison with PyTorch).
    #[default]
    F32,
    /// Mixed precision: bf16 activations, gradients and matmul inputs (f32 accumulation),
    /// f32 master weights and AdamW moments (PyTorch's `torch.autocast(dtype=bfloat16)` with
    /// f32 parameters is the reference).
    Bf16,
}

impl Precision {
    /// Bytes of one activation or gradient element.
    pub fn size(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 => 2,
        }
    }
}

/// Threads per block of every launch.
const BLOCK: u32 = 256;

fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig::for_elements(n as u64, BLOCK)
}

fn rows(n: usize) -> LaunchConfig {
    LaunchConfig::new((n as u32, 1, 1), (BLOCK, 1, 1))
}

/// A warp per row, `BLOCK / 32` rows per block.
fn warp_rows(n: usize) -> LaunchConfig {
    let per = (BLOCK / 32) as usize;
    LaunchConfig::new((n.div_ceil(per).max(1) as u32, 1, 1), (BLOCK, 1, 1))
}

/// Blocks of a layer-norm backward over `n` rows.
fn ln_blocks(n: usize) -> usize {
    n.clamp(1, 512)
}

/// `layernorm_backward`: at most 512 blocks over the rows, each summing its rows' weight and
/// bias gradients in `2 * C` floats of shared memory.
fn ln_backward(n: usize, c: usize) -> LaunchConfig {
    let mut cfg = LaunchConfig::new((ln_blocks(n) as u32, 1, 1), (BLOCK, 1, 1));
    cfg.shared_mem_bytes = (2 * c * 4) as u32;
    cfg
}

/// One layer's parameters (or their gradients), as views into the one block.
#[derive(Clone)]
struct Layer {
    ln1w: DevicePtr,
    ln1b: DevicePtr,
    qkvw: DevicePtr,
    qkvb: DevicePtr,
    attprojw: DevicePtr,
    attprojb: DevicePtr,
    ln2w: DevicePtr,
    ln2b: DevicePtr,
    fcw: DevicePtr,
    fcb: DevicePtr,
    fcprojw: DevicePtr,
    fcprojb: DevicePtr,
}

/// Every parameter (or gradient) as a view, in `param_specs` order.
#[derive(Clone)]
struct Params {
    all: DevicePtr,
    wte: DevicePtr,
    wpe: DevicePtr,
    layers: Vec<Layer>,
    lnfw: DevicePtr,
    lnfb: DevicePtr,
}

impl Params {
    /// Views of `block` laid out as `param_specs(cfg)`, `elem` bytes per element.
    fn views(cfg: &Config, block: DevicePtr, elem: usize) -> Result<Params> {
        let mut at = 0usize;
        let mut next = |shape: &[usize]| -> Result<DevicePtr> {
            let n: usize = shape.iter().product::<usize>() * elem;
            let v = block.slice(at..at + n)?;
            at += n;
            Ok(v)
        };
        let specs = param_specs(cfg);
        let mut it = specs.iter().map(|(_, s)| s.clone());
        let mut take = || -> Result<DevicePtr> {
            let s = it
                .next()
                .ok_or(crate::Error::Layout("parameter list too short"))?;
            next(&s)
        };
        let wte = take()?;
        let wpe = take()?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            layers.push(Layer {
                ln1w: take()?,
                ln1b: take()?,
                qkvw: take()?,
                qkvb: take()?,
                attprojw: take()?,
                attprojb: take()?,
                ln2w: take()?,
                ln2b: take()?,
                fcw: take()?,
                fcb: take()?,
                fcprojw: take()?,
                fcprojb: take()?,
            });
        }
        let lnfw = take()?;
        let lnfb = take()?;
        Ok(Params {
            all: block,
            wte,
            wpe,
            layers,
            lnfw,
            lnfb,
        })
    }
}

/// The number of f32 parameters of `cfg`.
pub fn param_count(cfg: &Config) -> usize {
    param_specs(cfg)
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum()
}

/// The i32 words of a packed batch of `bt` positions: inputs, targets, order (`bt` each),
/// starts (`bt + 1`), distinct tokens (`bt`) and their count (1).
fn batch_words(bt: usize) -> usize {
    5 * bt + 2
}

/// [`Model::pack_batch`] for a model of `cfg` and `batch` sequences: the inputs, the targets,
/// then `order` (the positions sorted by token, in position order within a token), `starts`
/// (where each distinct token's positions begin, then `bt` to the end), `uniq` (the distinct
/// tokens, ascending, then zeros) and their count.
pub fn pack_batch(
    cfg: &Config,
    batch: usize,
    inputs: &[i32],
    targets: &[i32],
    out: &mut [i32],
) -> Result<()> {
    let bt = batch * cfg.seq;
    if inputs.len() != bt || targets.len() != bt {
        return Err(crate::Error::Layout(
            "a batch of another size than batch * seq",
        ));
    }
    if out.len() != batch_words(bt) {
        return Err(crate::Error::Layout(
            "a batch buffer of another size than batch_words",
        ));
    }
    if let Some(bad) = inputs
        .iter()
        .chain(targets)
        .find(|&&t| t < 0 || t as usize >= cfg.vocab)
    {
        return Err(crate::Error::Token(*bad));
    }
    let (inp, rest) = out.split_at_mut(bt);
    let (tgt, rest) = rest.split_at_mut(bt);
    let (order, rest) = rest.split_at_mut(bt);
    let (starts, rest) = rest.split_at_mut(bt + 1);
    let (uniq, n_unique) = rest.split_at_mut(bt);
    inp.copy_from_slice(inputs);
    tgt.copy_from_slice(targets);
    // Positions grouped by token, in position order within a token (a counting sort).
    let v = cfg.vocab;
    let mut count = vec![0u32; v + 1];
    for &t in inputs {
        count[t as usize + 1] += 1;
    }
    for i in 0..v {
        count[i + 1] += count[i];
    }
    let mut next = count.clone();
    for (pos, &t) in inputs.iter().enumerate() {
        order[next[t as usize] as usize] = pos as i32;
        next[t as usize] += 1;
    }
    let mut u = 0usize;
    for tok in 0..v {
        if count[tok + 1] > count[tok] {
            uniq[u] = tok as i32;
            starts[u] = count[tok] as i32;
            u += 1;
        }
    }
    uniq[u..].fill(0);
    starts[u..].fill(bt as i32);
    n_unique[0] = u as i32;
    Ok(())
}

/// A part of the gradient block that the backward pass finishes at once.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// The final layer norm's weight and bias (finished first).
    FinalNorm,
    /// One layer's twelve tensors.
    Layer(usize),
    /// The token and position embeddings (finished last: the tied classifier and the
    /// encoder both write the token embedding's gradient).
    Embeddings,
}

/// The gradient elements of `part`, in `param_specs` order.
fn part_range(cfg: &Config, part: Part) -> std::ops::Range<usize> {
    let sizes: Vec<usize> = param_specs(cfg)
        .iter()
        .map(|(_, s)| s.iter().product())
        .collect();
    let per_layer = (sizes.len() - 4) / cfg.layers.max(1);
    let (first, count) = match part {
        Part::Embeddings => (0, 2),
        Part::Layer(l) => (2 + l * per_layer, per_layer),
        Part::FinalNorm => (sizes.len() - 2, 2),
    };
    let start: usize = sizes[..first].iter().sum();
    start..start + sizes[first..first + count].iter().sum::<usize>()
}

/// One layer's saved activations.
struct LayerActs {
    ln1: DevicePtr,
    ln1_mean: DevicePtr,
    ln1_rstd: DevicePtr,
    qkv: DevicePtr,
    att: DevicePtr,
    atty_unperm: DevicePtr,
    residual2: DevicePtr,
    ln2: DevicePtr,
    ln2_mean: DevicePtr,
    ln2_rstd: DevicePtr,
    /// The MLP's pre-activation (its GELU is recomputed in the backward: memory).
    fch: DevicePtr,
    residual3: DevicePtr,
}

/// Scratch of the forward and backward passes, reused by every layer.
struct Scratch {
    proj: DevicePtr,
    /// The MLP's activation GELU(fch) of the layer being computed (forward), or recomputed
    /// from `fch` (backward).
    fch_gelu: DevicePtr,
    // backward
    dresidual: DevicePtr,
    dbt_c: DevicePtr,
    dfch: DevicePtr,
    dqkv: DevicePtr,
    datt: DevicePtr,
}

/// AdamW's settings (PyTorch's `torch.optim.AdamW`).
#[derive(Debug, Clone, Copy)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// GPT-2 on one device, for batches of `batch` sequences.
pub struct Model {
    cfg: Config,
    prec: Precision,
    batch: usize,
    stream: Stream,
    kernels: Kernels,
    /// The f32 master weights (AdamW updates these).
    params: Params,
    /// The weights the forward and backward passes read: `params` itself in f32, their bf16
    /// copy (written by AdamW) in bf16.
    params_x: Params,
    /// Gradients, of the activation type.
    grads: Params,
    m: DevicePtr,
    v: DevicePtr,
    encoded: DevicePtr,
    layers: Vec<LayerActs>,
    lnf: DevicePtr,
    lnf_mean: DevicePtr,
    lnf_rstd: DevicePtr,
    logits: DevicePtr,
    losses: DevicePtr,
    /// The current batch, one block of [`batch_words`](Model::batch_words) i32 (see
    /// [`pack_batch`](Model::pack_batch)): inputs, targets, and the positions grouped by
    /// token for the deterministic embedding backward.
    data: DevicePtr,
    inputs: DevicePtr,
    targets: DevicePtr,
    /// `order` (BT positions), `starts` (BT + 1), `uniq` (BT), `n_unique` (1).
    order: DevicePtr,
    starts: DevicePtr,
    uniq: DevicePtr,
    n_unique: DevicePtr,
    /// AdamW's step count (one i32 on the device, counted by the step itself so that a
    /// replayed graph counts too) and the current step's bias corrections,
    /// `[1 - beta1^t, 1 - beta2^t]`.
    step_count: DevicePtr,
    corrections: DevicePtr,
    /// The layer-norm backward's per-block weight and bias gradients (f32).
    ln_partials: DevicePtr,
    scratch: Scratch,
    /// Ranks whose batches make up one step's batch (data parallel): the loss gradient is
    /// scaled by `1 / (batch * seq * world)`, so summing the ranks' gradients gives the
    /// gradient of the mean loss over the combined batch.
    world: usize,
    /// The stream the overlapped gradient all-reduce runs on
    /// ([`backward_all_reduce`](Model::backward_all_reduce)).
    comm_stream: Stream,
}

/// `bytes` of the default pool on `stream`, zeroed.
fn alloc(stream: &Stream, bytes: usize) -> Result<DevicePtr> {
    let p = cudars_mempool::driver::malloc(stream, bytes)?;
    p.memset_async(0, stream)?;
    Ok(p)
}

/// An operand of the attention's per-head products ([`Model::attention_mm`]): in `buf`,
/// sequence `b`'s first head at element `b * per_seq + offset`, each head a row-major
/// `rows x cols` matrix with leading dimension `ld`, the heads `stride` elements apart.
#[derive(Clone, Copy)]
struct Heads<'a> {
    buf: &'a DevicePtr,
    per_seq: usize,
    offset: usize,
    rows: usize,
    cols: usize,
    ld: usize,
    stride: usize,
}

/// One matrix product of the model, row-major, in the model's precision (see [`Model::mm`]):
/// `C = op(A) op(B)` through cuBLAS (`Gemm`) or, with [`lt`](Mm::lt), cuBLASLt with an
/// epilogue.
#[derive(Clone, Copy)]
struct Mm<'a> {
    a: (&'a DevicePtr, usize, usize),
    op_a: Op,
    b: (&'a DevicePtr, usize, usize),
    op_b: Op,
    c: (&'a DevicePtr, usize, usize),
    /// Leading dimensions of A, B, C (their columns: packed, unless set).
    lds: [usize; 3],
    lt: bool,
    epilogue: Epilogue,
    bias: Option<&'a DevicePtr>,
    aux: Option<(&'a DevicePtr, usize)>,
    batch: Option<(usize, StridedBatch)>,
}

impl<'a> Mm<'a> {
    fn new(
        a: (&'a DevicePtr, usize, usize),
        b: (&'a DevicePtr, usize, usize),
        c: (&'a DevicePtr, usize, usize),
    ) -> Self {
        Mm {
            a,
            op_a: Op::N,
            b,
            op_b: Op::N,
            c,
            lds: [a.2, b.2, c.2],
            lt: false,
            epilogue: Epilogue::None,
            bias: None,
            aux: None,
            batch: None,
        }
    }
    fn ta(self) -> Self {
        Mm {
            op_a: Op::T,
            ..self
        }
    }
    fn tb(self) -> Self {
        Mm {
            op_b: Op::T,
            ..self
        }
    }
    /// Through cuBLASLt with `epilogue` (its bias and auxiliary buffer set by the caller).
    fn lt(self, epilogue: Epilogue) -> Self {
        Mm {
            lt: true,
            epilogue,
            ..self
        }
    }
    /// `count` products, the i-th matrices `i * stride` elements after the first.
    fn batched(self, count: usize, strides: StridedBatch) -> Self {
        Mm {
            batch: Some((count, strides)),
            ..self
        }
    }

    fn run<T: Element>(&self, stream: &Stream) -> Result<()> {
        let mat = |(p, r, c): (&'a DevicePtr, usize, usize), ld: usize| {
            Mat::<T>::row_major(p, r, c).with_ld(ld)
        };
        let (a, b, c) = (
            mat(self.a, self.lds[0]),
            mat(self.b, self.lds[1]),
            mat(self.c, self.lds[2]),
        );
        if self.lt {
            let mut mm = LtMatmul::new(a, b, c)
                .op_a(self.op_a)
                .op_b(self.op_b)
                .epilogue(self.epilogue);
            if let Some(b) = self.bias {
                mm = mm.bias(b);
            }
            if let Some((a, ld)) = self.aux {
                mm = mm.aux(a, ld);
            }
            match self.batch {
                None => mm.run(stream)?,
                Some((n, st)) => mm.run_strided_batched(stream, n, st)?,
            }
        } else {
            let g = Gemm::new(a, b, c).op_a(self.op_a).op_b(self.op_b);
            match self.batch {
                None => g.run(stream)?,
                Some((n, st)) => g.run_strided_batched(stream, n, st)?,
            }
        }
        Ok(())
    }
}

impl Model {
    /// The model of `cfg` on `stream`'s device with the parameters `weights` (f32, in
    /// `param_specs` order and shapes), for batches of `batch` sequences, in f32. Everything
    /// lives in the default pool.
    pub fn new(cfg: Config, batch: usize, stream: &Stream, weights: &[f32]) -> Result<Model> {
        Model::with_precision(cfg, batch, stream, weights, Precision::F32)
    }

    /// [`new`](Model::new) in the precision `prec`.
    pub fn with_precision(
        cfg: Config,
        batch: usize,
        stream: &Stream,
        weights: &[f32],
        prec: Precision,
    ) -> Result<Model> {
        cfg.validate()
            .map_err(|e| crate::Error::Config(format!("{e:?}")))?;
        if batch == 0 {
            return Err(crate::Error::Config("a batch of 0 sequences".into()));
        }
        let n = param_count(&cfg);
        if weights.len() != n {
            return Err(crate::Error::Layout(
                "weights of another size than the config's",
            ));
        }
        let x = prec.size();
        let dev = stream.device();
        let kernels = Kernels::load(&dev, prec)?;
        let pblock = alloc(stream, n * 4)?;
        pblock.copy_from_host(weights)?;
        let params = Params::views(&cfg, pblock, 4)?;
        let params_x = match prec {
            Precision::F32 => params.clone(),
            Precision::Bf16 => {
                let copy: Vec<bf16> = weights.iter().map(|&w| bf16::from_f32(w)).collect();
                let block = alloc(stream, n * 2)?;
                block.copy_from_host(&copy)?;
                Params::views(&cfg, block, 2)?
            }
        };
        let grads = Params::views(&cfg, alloc(stream, n * x)?, x)?;
        let (b, t, c, nh, vp) = (batch, cfg.seq, cfg.channels, cfg.heads, cfg.padded_vocab);
        let bt = b * t;
        // Activations of the model's type, and f32 statistics.
        let ax = |elems: usize| alloc(stream, elems * x);
        let f = |elems: usize| alloc(stream, elems * 4);
        let mut layers = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            layers.push(LayerActs {
                ln1: ax(bt * c)?,
                ln1_mean: f(bt)?,
                ln1_rstd: f(bt)?,
                qkv: ax(bt * 3 * c)?,
                att: ax(b * nh * t * t)?,
                atty_unperm: ax(bt * c)?,
                residual2: ax(bt * c)?,
                ln2: ax(bt * c)?,
                ln2_mean: f(bt)?,
                ln2_rstd: f(bt)?,
                fch: ax(bt * 4 * c)?,
                residual3: ax(bt * c)?,
            });
        }
        let scratch = Scratch {
            proj: ax(bt * c)?,
            fch_gelu: ax(bt * 4 * c)?,
            dresidual: ax(bt * c)?,
            dbt_c: ax(bt * c)?,
            dfch: ax(bt * 4 * c)?,
            dqkv: ax(bt * 3 * c)?,
            datt: ax(b * nh * t * t)?,
        };
        let data = alloc(stream, batch_words(bt) * 4)?;
        let mut at = 0usize;
        let mut part = |words: usize| -> Result<DevicePtr> {
            let v = data.slice(at * 4..(at + words) * 4)?;
            at += words;
            Ok(v)
        };
        let (inputs, targets, order) = (part(bt)?, part(bt)?, part(bt)?);
        let (starts, uniq, n_unique) = (part(bt + 1)?, part(bt)?, part(1)?);
        Ok(Model {
            prec,
            batch,
            stream: stream.clone(),
            kernels,
            params,
            params_x,
            grads,
            m: f(n)?,
            v: f(n)?,
            encoded: ax(bt * c)?,
            layers,
            lnf: ax(bt * c)?,
            lnf_mean: f(bt)?,
            lnf_rstd: f(bt)?,
            logits: ax(bt * vp)?,
            losses: f(bt)?,
            data,
            inputs,
            targets,
            order,
            starts,
            uniq,
            n_unique,
            step_count: f(1)?,
            corrections: f(2)?,
            ln_partials: f(ln_blocks(bt) * 2 * c)?,
            scratch,
            world: 1,
            comm_stream: Stream::new(&dev)?,
            cfg,
        })
    }

    /// The model's precision.
    pub fn precision(&self) -> Precision {
        self.prec
    }

    /// Sequences per batch.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Runs `mm` in the model's precision on its stream.
    fn mm(&self, mm: Mm<'_>) -> Result<()> {
        match self.prec {
            Precision::F32 => mm.run::<f32>(&self.stream),
            Precision::Bf16 => mm.run::<bf16>(&self.stream),
        }
    }

    /// Makes this model one of `world` data-parallel ranks (see
    /// [`all_reduce_gradients`](Self::all_reduce_gradients)); 1 by default.
    pub fn set_world(&mut self, world: usize) {
        self.world = world.max(1);
    }

    /// Sums every parameter's gradient over the ranks of `comm` (in place, on the model's
    /// stream), after [`backward`](Self::backward) and before the update: with
    /// [`set_world`](Self::set_world) each rank then holds the gradient of the mean loss over
    /// the combined batch. One all-reduce of the one gradient block. Ranks driven from one
    /// thread call it inside `cudars_nccl::group::group`.
    pub fn all_reduce_gradients(&self, comm: &cudars_nccl::Communicator) -> Result<()> {
        let n = param_count(&self.cfg);
        let (g, op, s) = (&self.grads.all, cudars_nccl::ReduceOp::Sum, &self.stream);
        match self.prec {
            Precision::F32 => comm.all_reduce_in_place::<f32>(g, n, op, s)?,
            Precision::Bf16 => comm.all_reduce_in_place::<bf16>(g, n, op, s)?,
        }
        Ok(())
    }

    /// The model's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Writes a batch (`batch * seq` input tokens and their targets) into `out`, a block of
    /// [`batch_words`](Model::batch_words) i32 as the model's batch buffer holds it: the
    /// inputs, the targets, and the positions grouped by token (a counting sort: `order`, the
    /// `starts` of each distinct token, the distinct tokens `uniq` and their count) that the
    /// deterministic embedding backward reads. Host work only: a loader does it while the
    /// device runs the previous step ([`Loader`](crate::loader::Loader)).
    pub fn pack_batch(&self, inputs: &[i32], targets: &[i32], out: &mut [i32]) -> Result<()> {
        pack_batch(&self.cfg, self.batch, inputs, targets, out)
    }

    /// The i32 words of one packed batch (see [`pack_batch`](Model::pack_batch)).
    pub fn batch_words(&self) -> usize {
        batch_words(self.batch * self.cfg.seq)
    }

    /// The device buffer the step reads its batch from ([`batch_words`](Model::batch_words)
    /// i32): the loader copies packed batches into it, in the model's stream order. Not
    /// public: only [`pack_batch`](Model::pack_batch)'s checked output goes in.
    pub(crate) fn batch_buffer(&self) -> &DevicePtr {
        &self.data
    }

    /// Uploads a batch (`batch * seq` input tokens and their targets), synchronously: waits
    /// for the previous step (eager or replayed), which reads the batch buffer. A
    /// [`Loader`](crate::loader::Loader) uploads on a second stream instead, overlapped with
    /// the previous step.
    pub fn set_batch(&self, inputs: &[i32], targets: &[i32]) -> Result<()> {
        let mut packed = vec![0i32; self.batch_words()];
        self.pack_batch(inputs, targets, &mut packed)?;
        self.stream.synchronize()?;
        self.data.copy_from_host(&packed)?;
        Ok(())
    }

    /// A layer norm's backward, deterministic: `dinp +=`, and the weight and bias gradients
    /// written from per-block partial sums added in block order.
    #[allow(clippy::too_many_arguments, reason = "the layer norm's tensors")]
    fn layernorm_backward(
        &self,
        dinp: &DevicePtr,
        (dw, db): (&DevicePtr, &DevicePtr),
        dout: &DevicePtr,
        inp: &DevicePtr,
        w: &DevicePtr,
        (mean, rstd): (&DevicePtr, &DevicePtr),
    ) -> Result<()> {
        let bt = self.batch * self.cfg.seq;
        let c = self.cfg.channels;
        let k = &self.kernels;
        // SAFETY: as in `forward`: the partials buffer holds ln_blocks(bt) * 2C floats, the
        // grid's blocks.
        unsafe {
            k.layernorm_backward_partial.launch(
                &self.stream,
                &ln_backward(bt, c),
                (
                    dinp,
                    &self.ln_partials,
                    dout,
                    inp,
                    w,
                    mean,
                    rstd,
                    bt as i32,
                    c as i32,
                ),
            )?;
            k.column_sum.launch(
                &self.stream,
                &elementwise(2 * c),
                (dw, db, &self.ln_partials, ln_blocks(bt) as i32, c as i32),
            )?;
        }
        Ok(())
    }

    /// `out (BT x OC) = inp (BT x IC) W^T + b` (a linear layer; `epilogue` Bias, or GeluAuxBias
    /// with `aux` = the pre-activation).
    fn linear(
        &self,
        out: &DevicePtr,
        inp: &DevicePtr,
        (w, b): (&DevicePtr, &DevicePtr),
        (ic, oc): (usize, usize),
        aux: Option<&DevicePtr>,
    ) -> Result<()> {
        let bt = self.batch * self.cfg.seq;
        let mut mm = Mm::new((inp, bt, ic), (w, oc, ic), (out, bt, oc))
            .tb()
            .lt(Epilogue::Bias);
        mm.bias = Some(b);
        if let Some(a) = aux {
            mm.epilogue = Epilogue::GeluAuxBias;
            mm.aux = Some((a, oc));
        }
        self.mm(mm)
    }

    /// The backward of [`linear`](Self::linear): `dinp = dout W` (times GELU's derivative at
    /// `dgelu_aux`, the pre-activation of the layer that produced `inp`, when given),
    /// `dW = dout^T inp`, `db = sum over rows of dout`.
    #[allow(clippy::too_many_arguments, reason = "the layer's tensors")]
    fn linear_backward(
        &self,
        dinp: &DevicePtr,
        (dw, db): (&DevicePtr, &DevicePtr),
        dout: &DevicePtr,
        inp: &DevicePtr,
        w: &DevicePtr,
        (ic, oc): (usize, usize),
        dgelu_aux: Option<&DevicePtr>,
    ) -> Result<()> {
        let bt = self.batch * self.cfg.seq;
        let mut dx = Mm::new((dout, bt, oc), (w, oc, ic), (dinp, bt, ic)).lt(Epilogue::None);
        if let Some(a) = dgelu_aux {
            dx.epilogue = Epilogue::DGelu;
            dx.aux = Some((a, ic));
        }
        self.mm(dx)?;
        let mut dw = Mm::new((dout, bt, oc), (inp, bt, ic), (dw, oc, ic))
            .ta()
            .lt(Epilogue::BgradA);
        dw.bias = Some(db);
        self.mm(dw)
    }

    /// The attention's products for every sequence: for each `b`, a cuBLAS strided batch over
    /// the heads, `c = op(a) op(b)`, each operand as [`heads`](Self::heads) views it.
    fn attention_mm(&self, a: Heads, b: Heads, c: Heads, (ta, tb): (bool, bool)) -> Result<()> {
        for seq in 0..self.batch {
            let (pa, pb, pc) = (
                self.heads(a, seq)?,
                self.heads(b, seq)?,
                self.heads(c, seq)?,
            );
            let mut mm = Mm::new(
                (&pa, a.rows, a.cols),
                (&pb, b.rows, b.cols),
                (&pc, c.rows, c.cols),
            )
            .batched(
                self.cfg.heads,
                StridedBatch {
                    a: a.stride,
                    b: b.stride,
                    c: c.stride,
                },
            );
            mm.lds = [a.ld, b.ld, c.ld];
            if ta {
                mm = mm.ta();
            }
            if tb {
                mm = mm.tb();
            }
            self.mm(mm)?;
        }
        Ok(())
    }

    /// Sequence `seq`'s view of `h`: its first head.
    fn heads(&self, h: Heads<'_>, seq: usize) -> Result<DevicePtr> {
        Ok(h.buf
            .slice((seq * h.per_seq + h.offset) * self.prec.size()..)?)
    }

    /// Heads of a `(B, T, ld)` activation starting at column `col` (q, k or v of `qkv`,
    /// or the `(B, T, NH, HS)` attention output): `T x HS`, rows `ld` apart, heads `HS`
    /// apart.
    fn token_heads<'b>(&self, buf: &'b DevicePtr, ld: usize, col: usize) -> Heads<'b> {
        let (t, hs) = (self.cfg.seq, self.cfg.channels / self.cfg.heads);
        Heads {
            buf,
            per_seq: t * ld,
            offset: col,
            rows: t,
            cols: hs,
            ld,
            stride: hs,
        }
    }

    /// The `(B, NH, T, T)` attention matrices: `T x T`, packed, heads `T * T` apart.
    fn att_heads<'b>(&self, buf: &'b DevicePtr) -> Heads<'b> {
        let t = self.cfg.seq;
        Heads {
            buf,
            per_seq: self.cfg.heads * t * t,
            offset: 0,
            rows: t,
            cols: t,
            ld: t,
            stride: t * t,
        }
    }

    /// Forward pass on the uploaded batch; the logits buffer then holds the loss gradient
    /// (the fused cross-entropy) and `losses` the per-token losses.
    pub fn forward(&self) -> Result<()> {
        let (b, t, c, nh) = (self.batch, self.cfg.seq, self.cfg.channels, self.cfg.heads);
        let (bt, hs, vp, v) = (b * t, c / nh, self.cfg.padded_vocab, self.cfg.vocab);
        let s = &self.stream;
        let k = &self.kernels;
        let p = &self.params_x;
        let (bi, ti, ci) = (b as i32, t as i32, c as i32);
        // SAFETY: (every launch below) the kernels of kernels.cu with the parameter types and
        // order they declare (checked by cuda-rtc against the kernel's parameters); every
        // buffer holds the elements the sizes passed say (allocated above for this config and
        // batch); the grids cover the elements as the kernels expect (one thread per element
        // or one block per row, bounds checked in the kernels).
        unsafe {
            k.encoder_forward.launch(
                s,
                &elementwise(bt * c),
                (
                    &self.encoded,
                    &self.inputs,
                    &p.wte,
                    &p.wpe,
                    bi,
                    ti,
                    ci,
                    v as i32,
                ),
            )?;
        }
        let sc = &self.scratch;
        // The first layer norm; every later one is fused with the residual before it.
        let first = &self.layers[0];
        // SAFETY: as above.
        unsafe {
            k.layernorm_forward.launch(
                s,
                &warp_rows(bt),
                (
                    &first.ln1,
                    &first.ln1_mean,
                    &first.ln1_rstd,
                    &self.encoded,
                    &p.layers[0].ln1w,
                    &p.layers[0].ln1b,
                    bt as i32,
                    ci,
                ),
            )?;
        }
        for (l, a) in self.layers.iter().enumerate() {
            let lp = &p.layers[l];
            let residual = if l == 0 {
                &self.encoded
            } else {
                &self.layers[l - 1].residual3
            };
            self.linear(&a.qkv, &a.ln1, (&lp.qkvw, &lp.qkvb), (c, 3 * c), None)?;
            // q, k, v where the projection left them: (B, T, 3, NH, HS).
            let (q, kk, v) = (
                self.token_heads(&a.qkv, 3 * c, 0),
                self.token_heads(&a.qkv, 3 * c, c),
                self.token_heads(&a.qkv, 3 * c, 2 * c),
            );
            let att = self.att_heads(&a.att);
            // preatt = q k^T, per head.
            self.attention_mm(q, kk, att, (false, true))?;
            let scale = 1.0 / (hs as f32).sqrt();
            // SAFETY: as above.
            unsafe {
                k.softmax_causal_forward.launch(
                    s,
                    &warp_rows(b * nh * t),
                    (&a.att, &a.att, scale, (b * nh) as i32, ti),
                )?;
            }
            // atty = att v, per head, written as (B, T, NH, HS).
            let atty = self.token_heads(&a.atty_unperm, c, 0);
            self.attention_mm(att, v, atty, (false, false))?;
            self.linear(
                &sc.proj,
                &a.atty_unperm,
                (&lp.attprojw, &lp.attprojb),
                (c, c),
                None,
            )?;
            // residual2 = residual + proj, ln2 = LN(residual2).
            // SAFETY: as above.
            unsafe {
                k.residual_layernorm_forward.launch(
                    s,
                    &warp_rows(bt),
                    (
                        &a.residual2,
                        &a.ln2,
                        &a.ln2_mean,
                        &a.ln2_rstd,
                        residual,
                        &sc.proj,
                        &lp.ln2w,
                        &lp.ln2b,
                        bt as i32,
                        ci,
                    ),
                )?;
            }
            self.linear(
                &sc.fch_gelu,
                &a.ln2,
                (&lp.fcw, &lp.fcb),
                (c, 4 * c),
                Some(&a.fch),
            )?;
            self.linear(
                &sc.proj,
                &sc.fch_gelu,
                (&lp.fcprojw, &lp.fcprojb),
                (4 * c, c),
                None,
            )?;
            // residual3 = residual2 + proj, and the next layer norm: the next layer's first,
            // or the final one.
            let (out, mean, rstd, w, bias) = match self.layers.get(l + 1) {
                Some(next) => (
                    &next.ln1,
                    &next.ln1_mean,
                    &next.ln1_rstd,
                    &p.layers[l + 1].ln1w,
                    &p.layers[l + 1].ln1b,
                ),
                None => (&self.lnf, &self.lnf_mean, &self.lnf_rstd, &p.lnfw, &p.lnfb),
            };
            // SAFETY: as above.
            unsafe {
                k.residual_layernorm_forward.launch(
                    s,
                    &warp_rows(bt),
                    (
                        &a.residual3,
                        out,
                        mean,
                        rstd,
                        &a.residual2,
                        &sc.proj,
                        w,
                        bias,
                        bt as i32,
                        ci,
                    ),
                )?;
            }
        }
        self.mm(Mm::new((&self.lnf, bt, c), (&p.wte, vp, c), (&self.logits, bt, vp)).tb())?;
        // SAFETY: as above.
        unsafe {
            k.crossentropy_forward_backward.launch(
                s,
                &rows(bt),
                (
                    &self.logits,
                    &self.losses,
                    &self.targets,
                    bt as i32,
                    v as i32,
                    vp as i32,
                    1.0 / (bt * self.world) as f32,
                ),
            )?;
        }
        Ok(())
    }

    /// The mean loss of the last forward pass (waits for it).
    pub fn loss(&self) -> Result<f32> {
        let bt = self.batch * self.cfg.seq;
        self.stream.synchronize()?;
        let mut host = vec![0f32; bt];
        self.losses.copy_to_host(&mut host)?;
        Ok((host.iter().map(|&x| x as f64).sum::<f64>() / bt as f64) as f32)
    }

    /// Backward pass: every parameter's gradient (overwritten).
    pub fn backward(&self) -> Result<()> {
        self.backward_with(|_| Ok(()))
    }

    /// [`backward`](Self::backward) with the gradients summed over the ranks of `comm` as the
    /// pass finishes them (data parallel, with [`set_world`](Self::set_world)): each part of
    /// the gradient block (the final layer norm, each layer from the last, then the tied
    /// embeddings) is all-reduced on a stream of its own as soon as the backward pass has
    /// written it, overlapped with the rest of the pass; the model's stream waits for the
    /// last all-reduce before anything queued after this call (the update). Every rank
    /// reduces the same parts in the same order. Ranks driven from one thread must use
    /// [`all_reduce_gradients`](Self::all_reduce_gradients) inside a group instead.
    pub fn backward_all_reduce(&self, comm: &cudars_nccl::Communicator) -> Result<()> {
        let pass = self.backward_with(|part| {
            // The part is written in the model's stream order; the reduction follows it.
            let written = self.stream.record(None)?;
            self.comm_stream.wait_event(&written)?;
            self.all_reduce_part(comm, part, &self.comm_stream)
        });
        // Whatever happened, nothing queued on the model's stream after this call runs
        // before the reductions already queued (they write the gradient block).
        let joined = self
            .comm_stream
            .record(None)
            .and_then(|reduced| self.stream.wait_event(&reduced));
        pass?;
        joined?;
        Ok(())
    }

    fn all_reduce_part(
        &self,
        comm: &cudars_nccl::Communicator,
        part: Part,
        stream: &Stream,
    ) -> Result<()> {
        let r = part_range(&self.cfg, part);
        let x = self.prec.size();
        let g = self.grads.all.slice(r.start * x..r.end * x)?;
        let (n, op) = (r.len(), cudars_nccl::ReduceOp::Sum);
        match self.prec {
            Precision::F32 => comm.all_reduce_in_place::<f32>(&g, n, op, stream)?,
            Precision::Bf16 => comm.all_reduce_in_place::<bf16>(&g, n, op, stream)?,
        }
        Ok(())
    }

    /// The backward pass, calling `done` with each part of the gradient block once the pass
    /// has queued its last write to it.
    fn backward_with(&self, mut done: impl FnMut(Part) -> Result<()>) -> Result<()> {
        let (b, t, c, nh) = (self.batch, self.cfg.seq, self.cfg.channels, self.cfg.heads);
        let (bt, hs, vp) = (b * t, c / nh, self.cfg.padded_vocab);
        let s = &self.stream;
        let k = &self.kernels;
        let p = &self.params_x;
        let g = &self.grads;
        let sc = &self.scratch;
        let (bi, ti, ci) = (b as i32, t as i32, c as i32);
        // Every parameter gradient is written below (the products overwrite theirs, the layer
        // norms' and the position embedding's are written whole); only the residual stream's
        // gradient accumulates.
        // SAFETY: as in `forward`.
        unsafe {
            k.fill_zero
                .launch(s, &elementwise(bt * c), (&sc.dresidual, (bt * c) as i64))?;
        }
        // The classifier: dlnf = dlogits wte, dwte = dlogits^T lnf (the tied embedding; the
        // encoder's part is added at the end).
        self.mm(Mm::new(
            (&self.logits, bt, vp),
            (&p.wte, vp, c),
            (&sc.dbt_c, bt, c),
        ))?;
        self.mm(Mm::new((&self.logits, bt, vp), (&self.lnf, bt, c), (&g.wte, vp, c)).ta())?;
        let last = &self.layers[self.cfg.layers - 1].residual3;
        self.layernorm_backward(
            &sc.dresidual,
            (&g.lnfw, &g.lnfb),
            &sc.dbt_c,
            last,
            &p.lnfw,
            (&self.lnf_mean, &self.lnf_rstd),
        )?;
        done(Part::FinalNorm)?;
        for l in (0..self.cfg.layers).rev() {
            let a = &self.layers[l];
            let lp = &p.layers[l];
            let lg = &g.layers[l];
            let residual = if l == 0 {
                &self.encoded
            } else {
                &self.layers[l - 1].residual3
            };
            // The MLP: its activation again from the saved pre-activation (memory), then
            // dfch = (dresidual fcprojW) * gelu'(fch), then fc's.
            // SAFETY: as in `forward`: fch and the scratch hold BT * 4C elements.
            unsafe {
                k.gelu_forward.launch(
                    s,
                    &elementwise((bt * 4 * c).div_ceil(8)),
                    (&sc.fch_gelu, &a.fch, (bt * 4 * c) as i64),
                )?;
            }
            self.linear_backward(
                &sc.dfch,
                (&lg.fcprojw, &lg.fcprojb),
                &sc.dresidual,
                &sc.fch_gelu,
                &lp.fcprojw,
                (4 * c, c),
                Some(&a.fch),
            )?;
            self.linear_backward(
                &sc.dbt_c,
                (&lg.fcw, &lg.fcb),
                &sc.dfch,
                &a.ln2,
                &lp.fcw,
                (c, 4 * c),
                None,
            )?;
            self.layernorm_backward(
                &sc.dresidual,
                (&lg.ln2w, &lg.ln2b),
                &sc.dbt_c,
                &a.residual2,
                &lp.ln2w,
                (&a.ln2_mean, &a.ln2_rstd),
            )?;
            // The attention projection.
            self.linear_backward(
                &sc.dbt_c,
                (&lg.attprojw, &lg.attprojb),
                &sc.dresidual,
                &a.atty_unperm,
                &lp.attprojw,
                (c, c),
                None,
            )?;
            // datty is dbt_c as (B, T, NH, HS); q, k, v are read from the saved qkv and
            // dq, dk, dv written into dqkv, both (B, T, 3, NH, HS).
            let datty = self.token_heads(&sc.dbt_c, c, 0);
            let (q, kk, v) = (
                self.token_heads(&a.qkv, 3 * c, 0),
                self.token_heads(&a.qkv, 3 * c, c),
                self.token_heads(&a.qkv, 3 * c, 2 * c),
            );
            let (dq, dk, dv) = (
                self.token_heads(&sc.dqkv, 3 * c, 0),
                self.token_heads(&sc.dqkv, 3 * c, c),
                self.token_heads(&sc.dqkv, 3 * c, 2 * c),
            );
            let (att, datt) = (self.att_heads(&a.att), self.att_heads(&sc.datt));
            // atty = att v: datt = datty v^T, dv = att^T datty.
            self.attention_mm(datty, v, datt, (false, true))?;
            self.attention_mm(att, datty, dv, (true, false))?;
            let scale = 1.0 / (hs as f32).sqrt();
            // SAFETY: as in `forward`.
            unsafe {
                k.softmax_causal_backward.launch(
                    s,
                    &warp_rows(b * nh * t),
                    (&sc.datt, &sc.datt, &a.att, scale, (b * nh) as i32, ti),
                )?;
            }
            // preatt = q k^T: dq = dpreatt k, dk = dpreatt^T q (dpreatt in datt's buffer:
            // the softmax backward works in place, row by row).
            self.attention_mm(datt, kk, dq, (false, false))?;
            self.attention_mm(datt, q, dk, (true, false))?;
            self.linear_backward(
                &sc.dbt_c,
                (&lg.qkvw, &lg.qkvb),
                &sc.dqkv,
                &a.ln1,
                &lp.qkvw,
                (c, 3 * c),
                None,
            )?;
            self.layernorm_backward(
                &sc.dresidual,
                (&lg.ln1w, &lg.ln1b),
                &sc.dbt_c,
                residual,
                &lp.ln1w,
                (&a.ln1_mean, &a.ln1_rstd),
            )?;
            done(Part::Layer(l))?;
        }
        // SAFETY: as in `forward`; the grouped positions hold BT, BT + 1 and BT entries and
        // the count of distinct tokens (set_batch).
        unsafe {
            k.encoder_backward_wpe.launch(
                s,
                &elementwise(t * c),
                (&g.wpe, &sc.dresidual, bi, ti, ci),
            )?;
            k.encoder_backward_wte.launch(
                s,
                &elementwise(bt * c),
                (
                    &g.wte,
                    &sc.dresidual,
                    &self.order,
                    &self.starts,
                    &self.uniq,
                    &self.n_unique,
                    bt as i32,
                    ci,
                    self.cfg.vocab as i32,
                ),
            )?;
        }
        done(Part::Embeddings)
    }

    /// Queues one AdamW step over every parameter (PyTorch's order: decay, moments, update):
    /// a one-thread kernel counts the step on the device and writes its bias corrections,
    /// then the update reads them (so a replayed step counts too). In bf16 the update also
    /// writes the weights' bf16 copy.
    pub fn update(&self, opt: &AdamW) -> Result<()> {
        let n = param_count(&self.cfg);
        let k = &self.kernels;
        // SAFETY: as in `forward`: the step count is one i32 and the corrections two f32;
        // params, m and v hold `n` f32, grads and the weights' copy `n` of the model's type
        // (in f32 the copy is the master block itself, which the kernel then skips).
        unsafe {
            k.adamw_begin_step.launch(
                &self.stream,
                &LaunchConfig::new((1, 1, 1), (32, 1, 1)),
                (&self.step_count, &self.corrections, opt.beta1, opt.beta2),
            )?;
            k.adamw_update_dev.launch(
                &self.stream,
                &elementwise(n),
                (
                    &self.params.all,
                    &self.params_x.all,
                    &self.grads.all,
                    &self.m,
                    &self.v,
                    n as i64,
                    opt.lr,
                    opt.beta1,
                    opt.beta2,
                    &self.corrections,
                    opt.eps,
                    opt.weight_decay,
                ),
            )?;
        }
        Ok(())
    }

    /// Captures one training step (forward, backward, AdamW with `opt`) into an executable
    /// graph on the model's stream. Run one eager step first (the cuBLASLt plans and
    /// workspaces are made then). Each replay: a batch ([`set_batch`](Self::set_batch) or a
    /// [`Loader`](crate::loader::Loader)), then [`replay`](Self::replay).
    pub fn capture_step(&self, opt: &AdamW) -> Result<cudars_graph::GraphExec> {
        let graph =
            cudars_graph::capture(&self.stream, cudars_graph::CaptureMode::ThreadLocal, |_| {
                self.forward().map_err(cudars_graph::Error::other)?;
                self.backward().map_err(cudars_graph::Error::other)?;
                self.update(opt).map_err(cudars_graph::Error::other)
            })?;
        Ok(graph.instantiate()?)
    }

    /// Replays a captured step on the model's stream.
    pub fn replay(&self, exec: &cudars_graph::GraphExec) -> Result<()> {
        exec.launch(&self.stream)?;
        Ok(())
    }

    /// Every parameter's gradient, in `param_specs` order, as f32 (waits for the device).
    pub fn gradients(&self) -> Result<Vec<f32>> {
        self.stream.synchronize()?;
        let n = param_count(&self.cfg);
        match self.prec {
            Precision::F32 => {
                let mut host = vec![0f32; n];
                self.grads.all.copy_to_host(&mut host)?;
                Ok(host)
            }
            Precision::Bf16 => {
                let mut host = vec![bf16::ZERO; n];
                self.grads.all.copy_to_host(&mut host)?;
                Ok(host.iter().map(|g| g.to_f32()).collect())
            }
        }
    }

    /// Every parameter (the f32 master weights), in `param_specs` order (waits for the
    /// device).
    pub fn parameters(&self) -> Result<Vec<f32>> {
        self.stream.synchronize()?;
        let mut host = vec![0f32; param_count(&self.cfg)];
        self.params.all.copy_to_host(&mut host)?;
        Ok(host)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    #[test]
    fn a_packed_batch_groups_the_positions_by_token() {
        let cfg = Config::tiny();
        let bt = cfg.seq;
        let inputs: Vec<i32> = (0..bt).map(|i| [5, 3, 5, 0][i % 4]).collect();
        let targets: Vec<i32> = (0..bt).map(|i| (i % 7) as i32).collect();
        let mut out = vec![-1i32; batch_words(bt)];
        pack_batch(&cfg, 1, &inputs, &targets, &mut out).unwrap();
        let (inp, rest) = out.split_at(bt);
        let (tgt, rest) = rest.split_at(bt);
        let (order, rest) = rest.split_at(bt);
        let (starts, rest) = rest.split_at(bt + 1);
        let (uniq, n) = rest.split_at(bt);
        assert_eq!((inp, tgt), (&inputs[..], &targets[..]));
        assert_eq!(n, [3]);
        assert_eq!(&uniq[..3], [0, 3, 5]);
        assert!(uniq[3..].iter().all(|&u| u == 0));
        let q = bt / 4;
        assert_eq!(&starts[..4], [0, q as i32, 2 * q as i32, bt as i32]);
        for u in 0..3 {
            let run = &order[starts[u] as usize..starts[u + 1] as usize];
            assert!(run.windows(2).all(|w| w[0] < w[1]), "position order");
            assert!(run.iter().all(|&p| inputs[p as usize] == uniq[u]));
        }
    }

    #[test]
    fn the_gradient_parts_cover_the_block_once() {
        let cfg = Config::tiny();
        let mut parts = vec![part_range(&cfg, Part::Embeddings)];
        parts.extend((0..cfg.layers).map(|l| part_range(&cfg, Part::Layer(l))));
        parts.push(part_range(&cfg, Part::FinalNorm));
        let mut at = 0;
        for r in &parts {
            assert_eq!(r.start, at, "{parts:?}");
            assert!(r.end > r.start);
            at = r.end;
        }
        assert_eq!(at, param_count(&cfg));
        assert_eq!(parts.last().unwrap().len(), 2 * cfg.channels);
    }

    #[test]
    fn a_bad_batch_is_refused_and_the_buffer_is_untouched() {
        let cfg = Config::tiny();
        let bt = cfg.seq;
        let good = vec![1i32; bt];
        let mut out = vec![-1i32; batch_words(bt)];
        let mut bad = good.clone();
        bad[3] = cfg.vocab as i32;
        assert!(matches!(
            pack_batch(&cfg, 1, &bad, &good, &mut out),
            Err(crate::Error::Token(t)) if t == cfg.vocab as i32
        ));
        bad[3] = -2;
        assert!(pack_batch(&cfg, 1, &good, &bad, &mut out).is_err());
        assert!(pack_batch(&cfg, 2, &good, &good, &mut out).is_err());
        assert!(pack_batch(&cfg, 1, &good, &good, &mut out[1..]).is_err());
        assert!(out.iter().all(|&w| w == -1));
    }
}
