//! The model on the GPU: parameters, gradients, AdamW state and activations in one pool, the
//! forward pass, the backward pass and the update, in f32.
//!
//! Layout (row-major, as `torch.nn.Linear` keeps its weights): activations `(B, T, C)`,
//! attention `(B, NH, T, HS)`; every linear layer is `y = x W^T + b` through cuBLASLt with the
//! bias (and for the MLP the GELU, keeping its input) fused as epilogues; the attention is two
//! strided-batched GEMMs around a causal softmax kernel. The kernels are CUDA C++ in
//! `kernels.cu`, compiled at run time by cuda-rtc.

use cudars_blas::{Epilogue, Gemm, LtMatmul, Mat, Op, StridedBatch};
use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
use cudars_rtc::{Kernel, Program};

use crate::init::{param_specs, Config};
use crate::Result;

/// The kernels of `kernels.cu`.
struct Kernels {
    encoder_forward: Kernel,
    layernorm_forward: Kernel,
    permute_qkv: Kernel,
    unpermute: Kernel,
    softmax_causal_forward: Kernel,
    softmax_causal_backward: Kernel,
    unpermute_backward: Kernel,
    permute_qkv_backward: Kernel,
    residual_forward: Kernel,
    crossentropy_forward_backward: Kernel,
    fill_zero: Kernel,
    layernorm_backward_partial: Kernel,
    column_sum_accumulate: Kernel,
    encoder_backward_wpe: Kernel,
    encoder_backward_wte: Kernel,
    adamw_update_dev: Kernel,
}

impl Kernels {
    fn load(dev: &Device) -> Result<Kernels> {
        let module = Program::new(include_str!("kernels.cu"))
            .name("gpt2_kernels.cu")
            .device(dev)?
            .compile()?
            .load(dev)?;
        let k = |name: &str| module.kernel(name);
        Ok(Kernels {
            encoder_forward: k("encoder_forward")?,
            layernorm_forward: k("layernorm_forward")?,
            permute_qkv: k("permute_qkv")?,
            unpermute: k("unpermute")?,
            softmax_causal_forward: k("softmax_causal_forward")?,
            softmax_causal_backward: k("softmax_causal_backward")?,
            unpermute_backward: k("unpermute_backward")?,
            permute_qkv_backward: k("permute_qkv_backward")?,
            residual_forward: k("residual_forward")?,
            crossentropy_forward_backward: k("crossentropy_forward_backward")?,
            fill_zero: k("fill_zero")?,
            layernorm_backward_partial: k("layernorm_backward_partial")?,
            column_sum_accumulate: k("column_sum_accumulate")?,
            encoder_backward_wpe: k("encoder_backward_wpe")?,
            encoder_backward_wte: k("encoder_backward_wte")?,
            adamw_update_dev: k("adamw_update_dev")?,
        })
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
    /// Views of `block` laid out as `param_specs(cfg)`.
    fn views(cfg: &Config, block: DevicePtr) -> Result<Params> {
        let mut at = 0usize;
        let mut next = |shape: &[usize]| -> Result<DevicePtr> {
            let n: usize = shape.iter().product::<usize>() * 4;
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
    fch: DevicePtr,
    fch_gelu: DevicePtr,
    residual3: DevicePtr,
}

/// Scratch of the forward and backward passes, reused by every layer.
struct Scratch {
    /// q, k, v of the layer being computed (the backward makes them again from `qkv`).
    q: DevicePtr,
    k: DevicePtr,
    v: DevicePtr,
    atty: DevicePtr,
    proj: DevicePtr,
    // backward
    dresidual: DevicePtr,
    dbt_c: DevicePtr,
    dfch: DevicePtr,
    dqkv: DevicePtr,
    datty: DevicePtr,
    dq: DevicePtr,
    dk: DevicePtr,
    dv: DevicePtr,
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
    batch: usize,
    stream: Stream,
    kernels: Kernels,
    params: Params,
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
    inputs: DevicePtr,
    targets: DevicePtr,
    /// The batch's positions grouped by token (for the deterministic embedding backward):
    /// `order` (BT positions), `starts` (BT + 1), `uniq` (BT), `n_unique` (1).
    order: DevicePtr,
    starts: DevicePtr,
    uniq: DevicePtr,
    n_unique: DevicePtr,
    /// AdamW's bias corrections of the current step, `[1 - beta1^t, 1 - beta2^t]`.
    corrections: DevicePtr,
    /// The layer-norm backward's per-block weight and bias gradients.
    ln_partials: DevicePtr,
    scratch: Scratch,
    step: u64,
    /// Ranks whose batches make up one step's batch (data parallel): the loss gradient is
    /// scaled by `1 / (batch * seq * world)`, so summing the ranks' gradients gives the
    /// gradient of the mean loss over the combined batch.
    world: usize,
}

fn alloc(stream: &Stream, floats: usize) -> Result<DevicePtr> {
    let p = cudars_mempool::driver::malloc(stream, floats * 4)?;
    p.memset_async(0, stream)?;
    Ok(p)
}

impl Model {
    /// The model of `cfg` on `stream`'s device with the parameters `weights` (f32, in
    /// `param_specs` order and shapes), for batches of `batch` sequences. Everything lives in
    /// the default pool.
    pub fn new(cfg: Config, batch: usize, stream: &Stream, weights: &[f32]) -> Result<Model> {
        cfg.validate()
            .map_err(|e| crate::Error::Config(format!("{e:?}")))?;
        let n = param_count(&cfg);
        if weights.len() != n {
            return Err(crate::Error::Layout(
                "weights of another size than the config's",
            ));
        }
        let dev = stream.device();
        let kernels = Kernels::load(&dev)?;
        let pblock = alloc(stream, n)?;
        pblock.copy_from_host(weights)?;
        let params = Params::views(&cfg, pblock)?;
        let grads = Params::views(&cfg, alloc(stream, n)?)?;
        let (b, t, c, nh, vp) = (batch, cfg.seq, cfg.channels, cfg.heads, cfg.padded_vocab);
        let bt = b * t;
        let mut layers = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            layers.push(LayerActs {
                ln1: alloc(stream, bt * c)?,
                ln1_mean: alloc(stream, bt)?,
                ln1_rstd: alloc(stream, bt)?,
                qkv: alloc(stream, bt * 3 * c)?,
                att: alloc(stream, b * nh * t * t)?,
                atty_unperm: alloc(stream, bt * c)?,
                residual2: alloc(stream, bt * c)?,
                ln2: alloc(stream, bt * c)?,
                ln2_mean: alloc(stream, bt)?,
                ln2_rstd: alloc(stream, bt)?,
                fch: alloc(stream, bt * 4 * c)?,
                fch_gelu: alloc(stream, bt * 4 * c)?,
                residual3: alloc(stream, bt * c)?,
            });
        }
        let scratch = Scratch {
            q: alloc(stream, bt * c)?,
            k: alloc(stream, bt * c)?,
            v: alloc(stream, bt * c)?,
            atty: alloc(stream, bt * c)?,
            proj: alloc(stream, bt * c)?,
            dresidual: alloc(stream, bt * c)?,
            dbt_c: alloc(stream, bt * c)?,
            dfch: alloc(stream, bt * 4 * c)?,
            dqkv: alloc(stream, bt * 3 * c)?,
            datty: alloc(stream, bt * c)?,
            dq: alloc(stream, bt * c)?,
            dk: alloc(stream, bt * c)?,
            dv: alloc(stream, bt * c)?,
            datt: alloc(stream, b * nh * t * t)?,
        };
        Ok(Model {
            batch,
            stream: stream.clone(),
            kernels,
            params,
            grads,
            m: alloc(stream, n)?,
            v: alloc(stream, n)?,
            encoded: alloc(stream, bt * c)?,
            layers,
            lnf: alloc(stream, bt * c)?,
            lnf_mean: alloc(stream, bt)?,
            lnf_rstd: alloc(stream, bt)?,
            logits: alloc(stream, bt * vp)?,
            losses: alloc(stream, bt)?,
            inputs: cudars_mempool::driver::malloc(stream, bt * 4)?,
            targets: cudars_mempool::driver::malloc(stream, bt * 4)?,
            order: cudars_mempool::driver::malloc(stream, bt * 4)?,
            starts: cudars_mempool::driver::malloc(stream, (bt + 1) * 4)?,
            uniq: cudars_mempool::driver::malloc(stream, bt * 4)?,
            n_unique: cudars_mempool::driver::malloc(stream, 4)?,
            corrections: cudars_mempool::driver::malloc(stream, 8)?,
            ln_partials: alloc(stream, ln_blocks(bt) * 2 * c)?,
            scratch,
            step: 0,
            world: 1,
            cfg,
        })
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
        comm.all_reduce_in_place::<f32>(
            &self.grads.all,
            n,
            cudars_nccl::ReduceOp::Sum,
            &self.stream,
        )?;
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

    /// Uploads a batch (`batch * seq` input tokens and their targets).
    pub fn set_batch(&self, inputs: &[i32], targets: &[i32]) -> Result<()> {
        let bt = self.batch * self.cfg.seq;
        if inputs.len() != bt || targets.len() != bt {
            return Err(crate::Error::Layout(
                "a batch of another size than batch * seq",
            ));
        }
        if let Some(bad) = inputs
            .iter()
            .chain(targets)
            .find(|&&t| t < 0 || t as usize >= self.cfg.vocab)
        {
            return Err(crate::Error::Token(*bad));
        }
        // The previous step (eager or replayed) reads these buffers: let it finish.
        self.stream.synchronize()?;
        self.inputs.copy_from_host(inputs)?;
        self.targets.copy_from_host(targets)?;
        // Positions grouped by token, in position order within a token (a counting sort).
        let v = self.cfg.vocab;
        let mut count = vec![0u32; v + 1];
        for &t in inputs {
            count[t as usize + 1] += 1;
        }
        for i in 0..v {
            count[i + 1] += count[i];
        }
        let mut next = count.clone();
        let mut order = vec![0i32; bt];
        for (pos, &t) in inputs.iter().enumerate() {
            order[next[t as usize] as usize] = pos as i32;
            next[t as usize] += 1;
        }
        let mut uniq = Vec::new();
        let mut starts = Vec::new();
        for tok in 0..v {
            if count[tok + 1] > count[tok] {
                uniq.push(tok as i32);
                starts.push(count[tok] as i32);
            }
        }
        starts.push(bt as i32);
        let n_unique = uniq.len() as i32;
        uniq.resize(bt, 0);
        starts.resize(bt + 1, bt as i32);
        self.order.copy_from_host(&order)?;
        self.uniq.copy_from_host(&uniq)?;
        self.starts.copy_from_host(&starts)?;
        self.n_unique.copy_from_host(&[n_unique])?;
        Ok(())
    }

    /// A layer norm's backward, deterministic: `dinp +=`, and the weight and bias gradients
    /// added from per-block partial sums in block order.
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
            k.column_sum_accumulate.launch(
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
        let mut mm = LtMatmul::new(
            Mat::<f32>::row_major(inp, bt, ic),
            Mat::row_major(w, oc, ic),
            Mat::row_major(out, bt, oc),
        )
        .op_b(Op::T)
        .bias(b)
        .epilogue(Epilogue::Bias);
        if let Some(a) = aux {
            mm = mm.epilogue(Epilogue::GeluAuxBias).aux(a, oc);
        }
        mm.run(&self.stream)?;
        Ok(())
    }

    /// The backward of [`linear`](Self::linear): `dinp = dout W` (with GELU's backward fused
    /// when `gelu_aux` is the forward's pre-activation of `dinp`'s layer... see callers),
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
        let mut dx = LtMatmul::new(
            Mat::<f32>::row_major(dout, bt, oc),
            Mat::row_major(w, oc, ic),
            Mat::row_major(dinp, bt, ic),
        );
        if let Some(a) = dgelu_aux {
            dx = dx.epilogue(Epilogue::DGelu).aux(a, ic);
        }
        dx.run(&self.stream)?;
        LtMatmul::new(
            Mat::<f32>::row_major(dout, bt, oc),
            Mat::row_major(inp, bt, ic),
            Mat::row_major(dw, oc, ic),
        )
        .op_a(Op::T)
        .epilogue(Epilogue::BgradA)
        .bias(db)
        .run(&self.stream)?;
        Ok(())
    }

    /// Forward pass on the uploaded batch; the logits buffer then holds the loss gradient
    /// (the fused cross-entropy) and `losses` the per-token losses.
    pub fn forward(&self) -> Result<()> {
        let (b, t, c, nh) = (self.batch, self.cfg.seq, self.cfg.channels, self.cfg.heads);
        let (bt, hs, vp, v) = (b * t, c / nh, self.cfg.padded_vocab, self.cfg.vocab);
        let s = &self.stream;
        let k = &self.kernels;
        let p = &self.params;
        let (bi, ti, ci, nhi, hsi) = (b as i32, t as i32, c as i32, nh as i32, hs as i32);
        // SAFETY: (every launch below) the kernels of kernels.cu with the parameter types and
        // order they declare (checked by cuda-rtc against the kernel's parameters); every
        // buffer holds the elements the sizes passed say (allocated above for this config and
        // batch); the grids cover the elements as the kernels expect (one thread per element
        // or one block per row, bounds checked in the kernels).
        unsafe {
            k.encoder_forward.launch(
                s,
                &elementwise(bt * c),
                (&self.encoded, &self.inputs, &p.wte, &p.wpe, bi, ti, ci),
            )?;
        }
        let sc = &self.scratch;
        for (l, a) in self.layers.iter().enumerate() {
            let lp = &p.layers[l];
            let residual = if l == 0 {
                &self.encoded
            } else {
                &self.layers[l - 1].residual3
            };
            // SAFETY: as above.
            unsafe {
                k.layernorm_forward.launch(
                    s,
                    &rows(bt),
                    (
                        &a.ln1,
                        &a.ln1_mean,
                        &a.ln1_rstd,
                        residual,
                        &lp.ln1w,
                        &lp.ln1b,
                        bt as i32,
                        ci,
                    ),
                )?;
            }
            self.linear(&a.qkv, &a.ln1, (&lp.qkvw, &lp.qkvb), (c, 3 * c), None)?;
            // SAFETY: as above.
            unsafe {
                k.permute_qkv.launch(
                    s,
                    &elementwise(bt * c),
                    (&sc.q, &sc.k, &sc.v, &a.qkv, bi, ti, nhi, hsi),
                )?;
            }
            let per = StridedBatch {
                a: t * hs,
                b: t * hs,
                c: t * t,
            };
            Gemm::new(
                Mat::<f32>::row_major(&sc.q, t, hs),
                Mat::row_major(&sc.k, t, hs),
                Mat::row_major(&a.att, t, t),
            )
            .op_b(Op::T)
            .run_strided_batched(s, b * nh, per)?;
            let scale = 1.0 / (hs as f32).sqrt();
            // SAFETY: as above.
            unsafe {
                k.softmax_causal_forward.launch(
                    s,
                    &rows(b * nh * t),
                    (&a.att, &a.att, scale, (b * nh) as i32, ti),
                )?;
            }
            Gemm::new(
                Mat::<f32>::row_major(&a.att, t, t),
                Mat::row_major(&sc.v, t, hs),
                Mat::row_major(&sc.atty, t, hs),
            )
            .run_strided_batched(
                s,
                b * nh,
                StridedBatch {
                    a: t * t,
                    b: t * hs,
                    c: t * hs,
                },
            )?;
            // SAFETY: as above.
            unsafe {
                k.unpermute.launch(
                    s,
                    &elementwise(bt * c),
                    (&a.atty_unperm, &sc.atty, bi, ti, nhi, hsi),
                )?;
            }
            self.linear(
                &sc.proj,
                &a.atty_unperm,
                (&lp.attprojw, &lp.attprojb),
                (c, c),
                None,
            )?;
            // SAFETY: as above.
            unsafe {
                k.residual_forward.launch(
                    s,
                    &elementwise(bt * c),
                    (&a.residual2, residual, &sc.proj, (bt * c) as i64),
                )?;
                k.layernorm_forward.launch(
                    s,
                    &rows(bt),
                    (
                        &a.ln2,
                        &a.ln2_mean,
                        &a.ln2_rstd,
                        &a.residual2,
                        &lp.ln2w,
                        &lp.ln2b,
                        bt as i32,
                        ci,
                    ),
                )?;
            }
            self.linear(
                &a.fch_gelu,
                &a.ln2,
                (&lp.fcw, &lp.fcb),
                (c, 4 * c),
                Some(&a.fch),
            )?;
            self.linear(
                &sc.proj,
                &a.fch_gelu,
                (&lp.fcprojw, &lp.fcprojb),
                (4 * c, c),
                None,
            )?;
            // SAFETY: as above.
            unsafe {
                k.residual_forward.launch(
                    s,
                    &elementwise(bt * c),
                    (&a.residual3, &a.residual2, &sc.proj, (bt * c) as i64),
                )?;
            }
        }
        let last = &self.layers[self.cfg.layers - 1].residual3;
        // SAFETY: as above.
        unsafe {
            k.layernorm_forward.launch(
                s,
                &rows(bt),
                (
                    &self.lnf,
                    &self.lnf_mean,
                    &self.lnf_rstd,
                    last,
                    &p.lnfw,
                    &p.lnfb,
                    bt as i32,
                    ci,
                ),
            )?;
        }
        Gemm::new(
            Mat::<f32>::row_major(&self.lnf, bt, c),
            Mat::row_major(&p.wte, vp, c),
            Mat::row_major(&self.logits, bt, vp),
        )
        .op_b(Op::T)
        .run(s)?;
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
        let (b, t, c, nh) = (self.batch, self.cfg.seq, self.cfg.channels, self.cfg.heads);
        let (bt, hs, vp) = (b * t, c / nh, self.cfg.padded_vocab);
        let s = &self.stream;
        let k = &self.kernels;
        let p = &self.params;
        let g = &self.grads;
        let sc = &self.scratch;
        let (bi, ti, ci, nhi, hsi) = (b as i32, t as i32, c as i32, nh as i32, hs as i32);
        let n = param_count(&self.cfg);
        // SAFETY: as in `forward`.
        unsafe {
            k.fill_zero.launch(s, &elementwise(n), (&g.all, n as i64))?;
            k.fill_zero
                .launch(s, &elementwise(bt * c), (&sc.dresidual, (bt * c) as i64))?;
        }
        // The classifier: dlnf = dlogits wte, dwte = dlogits^T lnf (the tied embedding; the
        // encoder's part is added at the end).
        Gemm::new(
            Mat::<f32>::row_major(&self.logits, bt, vp),
            Mat::row_major(&p.wte, vp, c),
            Mat::row_major(&sc.dbt_c, bt, c),
        )
        .run(s)?;
        Gemm::new(
            Mat::<f32>::row_major(&self.logits, bt, vp),
            Mat::row_major(&self.lnf, bt, c),
            Mat::row_major(&g.wte, vp, c),
        )
        .op_a(Op::T)
        .run(s)?;
        let last = &self.layers[self.cfg.layers - 1].residual3;
        self.layernorm_backward(
            &sc.dresidual,
            (&g.lnfw, &g.lnfb),
            &sc.dbt_c,
            last,
            &p.lnfw,
            (&self.lnf_mean, &self.lnf_rstd),
        )?;
        for l in (0..self.cfg.layers).rev() {
            let a = &self.layers[l];
            let lp = &p.layers[l];
            let lg = &g.layers[l];
            let residual = if l == 0 {
                &self.encoded
            } else {
                &self.layers[l - 1].residual3
            };
            // The MLP: dfch = (dresidual fcprojW) * gelu'(fch), then fc's.
            self.linear_backward(
                &sc.dfch,
                (&lg.fcprojw, &lg.fcprojb),
                &sc.dresidual,
                &a.fch_gelu,
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
            // SAFETY: as in `forward`.
            unsafe {
                k.unpermute_backward.launch(
                    s,
                    &elementwise(bt * c),
                    (&sc.datty, &sc.dbt_c, bi, ti, nhi, hsi),
                )?;
            }
            let bnh = b * nh;
            // q, k, v again from the layer's saved qkv (not kept per layer: memory).
            // SAFETY: as in `forward`.
            unsafe {
                k.permute_qkv.launch(
                    s,
                    &elementwise(bt * c),
                    (&sc.q, &sc.k, &sc.v, &a.qkv, bi, ti, nhi, hsi),
                )?;
            }
            // atty = att v: datt = datty v^T, dv = att^T datty.
            Gemm::new(
                Mat::<f32>::row_major(&sc.datty, t, hs),
                Mat::row_major(&sc.v, t, hs),
                Mat::row_major(&sc.datt, t, t),
            )
            .op_b(Op::T)
            .run_strided_batched(
                s,
                bnh,
                StridedBatch {
                    a: t * hs,
                    b: t * hs,
                    c: t * t,
                },
            )?;
            Gemm::new(
                Mat::<f32>::row_major(&a.att, t, t),
                Mat::row_major(&sc.datty, t, hs),
                Mat::row_major(&sc.dv, t, hs),
            )
            .op_a(Op::T)
            .run_strided_batched(
                s,
                bnh,
                StridedBatch {
                    a: t * t,
                    b: t * hs,
                    c: t * hs,
                },
            )?;
            let scale = 1.0 / (hs as f32).sqrt();
            // SAFETY: as in `forward`.
            unsafe {
                k.softmax_causal_backward.launch(
                    s,
                    &rows(bnh * t),
                    (&sc.datt, &sc.datt, &a.att, scale, bnh as i32, ti),
                )?;
            }
            // preatt = q k^T: dq = dpreatt k, dk = dpreatt^T q (dpreatt in datt's buffer:
            // the softmax backward works in place, row by row).
            Gemm::new(
                Mat::<f32>::row_major(&sc.datt, t, t),
                Mat::row_major(&sc.k, t, hs),
                Mat::row_major(&sc.dq, t, hs),
            )
            .run_strided_batched(
                s,
                bnh,
                StridedBatch {
                    a: t * t,
                    b: t * hs,
                    c: t * hs,
                },
            )?;
            Gemm::new(
                Mat::<f32>::row_major(&sc.datt, t, t),
                Mat::row_major(&sc.q, t, hs),
                Mat::row_major(&sc.dk, t, hs),
            )
            .op_a(Op::T)
            .run_strided_batched(
                s,
                bnh,
                StridedBatch {
                    a: t * t,
                    b: t * hs,
                    c: t * hs,
                },
            )?;
            // SAFETY: as in `forward`.
            unsafe {
                k.permute_qkv_backward.launch(
                    s,
                    &elementwise(bt * c),
                    (&sc.dqkv, &sc.dq, &sc.dk, &sc.dv, bi, ti, nhi, hsi),
                )?;
            }
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
        Ok(())
    }

    /// Counts a step and writes its AdamW bias corrections to the device (waits for the
    /// stream: the previous step reads them). Call before [`apply_update`](Self::apply_update)
    /// or before replaying a captured step.
    pub fn begin_step(&mut self, opt: &AdamW) -> Result<()> {
        self.step += 1;
        let c1 = 1.0 - (opt.beta1 as f64).powi(self.step as i32);
        let c2 = 1.0 - (opt.beta2 as f64).powi(self.step as i32);
        self.stream.synchronize()?;
        self.corrections.copy_from_host(&[c1 as f32, c2 as f32])?;
        Ok(())
    }

    /// Queues one AdamW step over every parameter (PyTorch's order: decay, moments, update),
    /// with the corrections [`begin_step`](Self::begin_step) wrote.
    pub fn apply_update(&self, opt: &AdamW) -> Result<()> {
        let n = param_count(&self.cfg);
        // SAFETY: as in `forward`: four buffers of `n` f32 and the two corrections.
        unsafe {
            self.kernels.adamw_update_dev.launch(
                &self.stream,
                &elementwise(n),
                (
                    &self.params.all,
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

    /// One AdamW step: [`begin_step`](Self::begin_step), then [`apply_update`](Self::apply_update).
    pub fn update(&mut self, opt: &AdamW) -> Result<()> {
        self.begin_step(opt)?;
        self.apply_update(opt)
    }

    /// Captures one training step (forward, backward, AdamW with `opt`) into an executable
    /// graph on the model's stream. Run one eager step first (the cuBLASLt plans and
    /// workspaces are made then). Each replay: [`set_batch`](Self::set_batch),
    /// [`begin_step`](Self::begin_step), then [`replay`](Self::replay).
    pub fn capture_step(&self, opt: &AdamW) -> Result<cudars_graph::GraphExec> {
        let graph =
            cudars_graph::capture(&self.stream, cudars_graph::CaptureMode::ThreadLocal, |_| {
                self.forward().map_err(cudars_graph::Error::other)?;
                self.backward().map_err(cudars_graph::Error::other)?;
                self.apply_update(opt).map_err(cudars_graph::Error::other)
            })?;
        Ok(graph.instantiate()?)
    }

    /// Replays a captured step on the model's stream.
    pub fn replay(&self, exec: &cudars_graph::GraphExec) -> Result<()> {
        exec.launch(&self.stream)?;
        Ok(())
    }

    /// Every parameter's gradient, in `param_specs` order (waits for the device).
    pub fn gradients(&self) -> Result<Vec<f32>> {
        self.stream.synchronize()?;
        let mut host = vec![0f32; param_count(&self.cfg)];
        self.grads.all.copy_to_host(&mut host)?;
        Ok(host)
    }

    /// Every parameter, in `param_specs` order (waits for the device).
    pub fn parameters(&self) -> Result<Vec<f32>> {
        self.stream.synchronize()?;
        let mut host = vec![0f32; param_count(&self.cfg)];
        self.params.all.copy_to_host(&mut host)?;
        Ok(host)
    }
}
