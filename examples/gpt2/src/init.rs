//! Deterministic GPT-2 parameters and training tokens.
//!
//! The Rust driver and the PyTorch reference (`reference/train_gpt2_ref.py`) start from the same
//! bits: the driver calls [`init_params`] and [`tokens`], writes them with
//! [`crate::safetensors::write()`] (the weights with [`Config::metadata`], the tokens as one `I32`
//! tensor named [`TOKENS_NAME`]), and the reference reads both files. So the generator here
//! need not be reproduced in Python.
//!
//! # Parameters
//!
//! [`param_specs`] lists them in the order of PyTorch's `named_parameters()` for the reference
//! model, under its names: `transformer.wte.weight` (Vp, C), `transformer.wpe.weight` (T, C),
//! then for each layer `l` the twelve tensors of `transformer.h.{l}.` (`ln_1.weight`,
//! `ln_1.bias`, `attn.c_attn.weight` (3C, C), `attn.c_attn.bias`, `attn.c_proj.weight` (C, C),
//! `attn.c_proj.bias`, `ln_2.weight`, `ln_2.bias`, `mlp.c_fc.weight` (4C, C), `mlp.c_fc.bias`,
//! `mlp.c_proj.weight` (C, 4C), `mlp.c_proj.bias`), then `transformer.ln_f.weight` and
//! `.bias`. Linear weights are (out, in), row-major, as `nn.Linear` stores them; the output
//! head is tied to `wte` (no tensor of its own).
//!
//! [`init_params`]: every Linear weight and both embeddings are N(0, 0.02), except the two
//! residual projections (`attn.c_proj.weight`, `mlp.c_proj.weight`), which are
//! N(0, 0.02 / sqrt(2 * layers)); biases are 0, layer-norm weights 1 and biases 0; the rows of
//! `wte` past the true vocabulary (`vocab..padded_vocab`) are 0.
//!
//! Each tensor draws from its own generator ([`Rng::for_stream`] with the seed and the tensor's
//! index in [`param_specs`]): xoshiro256** seeded through SplitMix64; normals by Box-Muller in
//! `f64` (both of each pair used), scaled by the std in `f64` and rounded to `f32` once. The
//! values are bit for bit the same wherever `f64::ln`, `sqrt`, `cos` and `sin` round the same
//! (true of the usual x86-64 and AArch64 libms); the reference never recomputes them.
//!
//! # Tokens
//!
//! [`tokens`] makes a stream that a model can learn quickly, documented there.

use crate::safetensors::Tensor;

/// The name of the `I32` tensor of the tokens file the reference reads.
pub const TOKENS_NAME: &str = "tokens";

/// The std of the embeddings and Linear weights.
pub const INIT_STD: f64 = 0.02;

/// A GPT-2 shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// Transformer blocks (L).
    pub layers: usize,
    /// Attention heads (NH).
    pub heads: usize,
    /// Model width (C).
    pub channels: usize,
    /// Sequence length, also the number of positions of `wpe` (T).
    pub seq: usize,
    /// True vocabulary (V): tokens and the loss use `0..vocab`.
    pub vocab: usize,
    /// Rows of `wte` (Vp >= V), padded for the matrix products; rows past V are 0.
    pub padded_vocab: usize,
}

/// Why a [`Config`] or its metadata is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A size is zero.
    #[error("{0} must be greater than 0")]
    Zero(&'static str),
    /// `channels` is not a multiple of `heads`.
    #[error("channels ({channels}) must be a multiple of heads ({heads})")]
    HeadsDoNotDivide {
        /// C.
        channels: usize,
        /// NH.
        heads: usize,
    },
    /// `padded_vocab < vocab`.
    #[error("padded_vocab ({padded_vocab}) must be at least vocab ({vocab})")]
    PaddedVocabTooSmall {
        /// V.
        vocab: usize,
        /// Vp.
        padded_vocab: usize,
    },
    /// The vocabulary does not fit the `i32` tokens.
    #[error("vocab ({0}) must fit in i32")]
    VocabTooLarge(usize),
    /// A tensor's byte size or the parameter count overflows.
    #[error("the parameter sizes overflow")]
    Overflow,
    /// A metadata key is missing or its value is not a decimal integer.
    #[error("metadata key {0:?} missing or not an integer")]
    Metadata(&'static str),
}

impl Config {
    /// GPT-2 small: 12 layers, 12 heads, 768 channels, 1024 positions, vocabulary 50257
    /// padded to 50304. 124,475,904 parameters.
    pub fn gpt2_124m() -> Config {
        Config {
            layers: 12,
            heads: 12,
            channels: 768,
            seq: 1024,
            vocab: 50257,
            padded_vocab: 50304,
        }
    }

    /// A model for tests: 2 layers, 4 heads, 128 channels, 64 positions, vocabulary 512.
    pub fn tiny() -> Config {
        Config {
            layers: 2,
            heads: 4,
            channels: 128,
            seq: 64,
            vocab: 512,
            padded_vocab: 512,
        }
    }

    /// Checks that every size is positive, `channels % heads == 0`, `padded_vocab >= vocab`,
    /// `vocab` fits `i32`, and every tensor's byte size and the total fit `usize`. The other
    /// functions of this module assume a valid config (they do not panic on another, but their
    /// output is then meaningless).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("layers", self.layers),
            ("heads", self.heads),
            ("channels", self.channels),
            ("seq", self.seq),
            ("vocab", self.vocab),
            ("padded_vocab", self.padded_vocab),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if !self.channels.is_multiple_of(self.heads) {
            return Err(ConfigError::HeadsDoNotDivide {
                channels: self.channels,
                heads: self.heads,
            });
        }
        if self.padded_vocab < self.vocab {
            return Err(ConfigError::PaddedVocabTooSmall {
                vocab: self.vocab,
                padded_vocab: self.padded_vocab,
            });
        }
        if i32::try_from(self.vocab).is_err() {
            return Err(ConfigError::VocabTooLarge(self.vocab));
        }
        let mut total: usize = 0;
        for (_, shape) in param_specs(self) {
            let n = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(4).map(|_| n))
                .ok_or(ConfigError::Overflow)?;
            total = total.checked_add(n).ok_or(ConfigError::Overflow)?;
        }
        total.checked_mul(4).ok_or(ConfigError::Overflow)?;
        Ok(())
    }

    /// Channels per head (C / NH).
    pub fn head_size(&self) -> usize {
        self.channels.checked_div(self.heads).unwrap_or(0)
    }

    /// The safetensors metadata the reference reads its config from: keys `layers`, `heads`,
    /// `channels`, `seq`, `vocab`, `padded_vocab`, decimal values.
    pub fn metadata(&self) -> Vec<(String, String)> {
        [
            ("layers", self.layers),
            ("heads", self.heads),
            ("channels", self.channels),
            ("seq", self.seq),
            ("vocab", self.vocab),
            ("padded_vocab", self.padded_vocab),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// The config [`Config::metadata`] wrote (other keys are ignored), validated.
    pub fn from_metadata(metadata: &[(String, String)]) -> Result<Config, ConfigError> {
        let get = |key: &'static str| -> Result<usize, ConfigError> {
            metadata
                .iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .ok_or(ConfigError::Metadata(key))
        };
        let cfg = Config {
            layers: get("layers")?,
            heads: get("heads")?,
            channels: get("channels")?,
            seq: get("seq")?,
            vocab: get("vocab")?,
            padded_vocab: get("padded_vocab")?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The parameters' names and shapes, in the reference model's `named_parameters()` order (see
/// the module's documentation).
pub fn param_specs(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let c = cfg.channels;
    let c3 = c.saturating_mul(3);
    let c4 = c.saturating_mul(4);
    let mut specs =
        Vec::with_capacity(cfg.layers.saturating_mul(12).saturating_add(4).min(1 << 20));
    specs.push((
        "transformer.wte.weight".to_string(),
        vec![cfg.padded_vocab, c],
    ));
    specs.push(("transformer.wpe.weight".to_string(), vec![cfg.seq, c]));
    for l in 0..cfg.layers {
        let p = format!("transformer.h.{l}.");
        let layer: [(&str, Vec<usize>); 12] = [
            ("ln_1.weight", vec![c]),
            ("ln_1.bias", vec![c]),
            ("attn.c_attn.weight", vec![c3, c]),
            ("attn.c_attn.bias", vec![c3]),
            ("attn.c_proj.weight", vec![c, c]),
            ("attn.c_proj.bias", vec![c]),
            ("ln_2.weight", vec![c]),
            ("ln_2.bias", vec![c]),
            ("mlp.c_fc.weight", vec![c4, c]),
            ("mlp.c_fc.bias", vec![c4]),
            ("mlp.c_proj.weight", vec![c, c4]),
            ("mlp.c_proj.bias", vec![c]),
        ];
        for (n, s) in layer {
            specs.push((format!("{p}{n}"), s));
        }
    }
    specs.push(("transformer.ln_f.weight".to_string(), vec![c]));
    specs.push(("transformer.ln_f.bias".to_string(), vec![c]));
    specs
}

/// The total number of parameters (elements of all [`param_specs`]), saturating.
pub fn num_params(cfg: &Config) -> usize {
    param_specs(cfg)
        .iter()
        .map(|(_, s)| s.iter().fold(1usize, |a, &d| a.saturating_mul(d)))
        .fold(0usize, |a, n| a.saturating_add(n))
}

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InitKind {
    /// Normal with mean 0 and this std.
    Normal(f64),
    /// Normal with this std on the first `rows` rows (of `cols` each), 0 after (`wte`).
    NormalRows {
        /// Std.
        std: f64,
        /// Rows drawn (the true vocabulary).
        rows: usize,
        /// Elements per row.
        cols: usize,
    },
    /// Every element this constant (0 for biases, 1 for layer-norm weights).
    Constant(f32),
}

/// The init of the parameter named `name` (one of [`param_specs`]).
pub fn init_kind(cfg: &Config, name: &str) -> InitKind {
    let proj_std = INIT_STD / (2.0 * cfg.layers as f64).sqrt();
    if name == "transformer.wte.weight" {
        InitKind::NormalRows {
            std: INIT_STD,
            rows: cfg.vocab,
            cols: cfg.channels,
        }
    } else if name.ends_with("ln_1.weight")
        || name.ends_with("ln_2.weight")
        || name.ends_with("ln_f.weight")
    {
        InitKind::Constant(1.0)
    } else if name.ends_with(".bias") {
        InitKind::Constant(0.0)
    } else if name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight") {
        InitKind::Normal(proj_std)
    } else {
        InitKind::Normal(INIT_STD)
    }
}

/// The initial parameters, in [`param_specs`] order, as `F32` tensors (see the module's
/// documentation). The same `cfg` and `seed` give the same bytes.
pub fn init_params(cfg: &Config, seed: u64) -> Vec<Tensor> {
    param_specs(cfg)
        .into_iter()
        .enumerate()
        .map(|(index, (name, shape))| {
            let n = shape.iter().fold(1usize, |a, &d| a.saturating_mul(d));
            let values: Vec<f32> = match init_kind(cfg, &name) {
                InitKind::Constant(v) => vec![v; n],
                InitKind::Normal(std) => {
                    let mut rng = Rng::for_stream(seed, index as u64);
                    (0..n).map(|_| (rng.normal() * std) as f32).collect()
                }
                InitKind::NormalRows { std, rows, cols } => {
                    let mut rng = Rng::for_stream(seed, index as u64);
                    let drawn = rows.saturating_mul(cols).min(n);
                    let mut v: Vec<f32> = (0..drawn).map(|_| (rng.normal() * std) as f32).collect();
                    v.resize(n, 0.0);
                    v
                }
            };
            Tensor::f32(name, shape, &values)
        })
        .collect()
}

/// One step of SplitMix64: advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** seeded by SplitMix64, with Box-Muller normals.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
    /// The second normal of the last Box-Muller pair, not yet returned.
    spare: Option<f64>,
}

impl Rng {
    /// The generator of `seed`: its state is four SplitMix64 outputs from `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        // SplitMix64 never gives four zeros in a row from one state, but stay safe.
        let s = if s == [0; 4] { [1, 0, 0, 0] } else { s };
        Rng { s, spare: None }
    }

    /// An independent generator for stream `stream` of `seed` (the parameter's index, or a
    /// purpose such as the tokens): `Rng::new` of a SplitMix64 mix of both.
    pub fn for_stream(seed: u64, stream: u64) -> Rng {
        let mut sm = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mixed = splitmix64(&mut sm);
        Rng::new(mixed ^ stream)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (Lemire's multiply-shift; `n == 0` gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Standard normal by Box-Muller: `sqrt(-2 ln u1) * (cos, sin)(2 pi u2)` with `u1` in (0, 1],
    /// the sine half kept for the next call.
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln never sees 0
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }
}

/// The stream index [`tokens`] draws from (far from any parameter index).
const TOKEN_STREAM: u64 = 0x746F_6B65_6E73; // "tokens"

/// The alphabet [`tokens`] uses: `min(vocab, TOKEN_ALPHABET)` distinct token ids.
pub const TOKEN_ALPHABET: usize = 1024;

/// One token in `TOKEN_NOISE_DENOM` is a uniformly random alphabet token instead of the
/// cycle's next.
pub const TOKEN_NOISE_DENOM: u64 = 8;

/// `steps * batch * cfg.seq + 1` training tokens in `0..cfg.vocab`, deterministic in `seed`.
///
/// How they are made (all draws from [`Rng::for_stream`]`(seed, TOKEN_STREAM)`):
/// 1. An alphabet of `K = min(vocab, TOKEN_ALPHABET)` distinct ids: the first `K` entries of a
///    Fisher-Yates shuffle of `0..vocab` (done partially, `j = i + below(vocab - i)` for
///    `i in 0..K`), in that shuffled order. That order is a fixed random cycle:
///    `next(alphabet[i]) = alphabet[(i + 1) % K]`.
/// 2. The first token is `alphabet[below(K)]`; then each token is, if
///    `below(TOKEN_NOISE_DENOM) == 0` (1 in 8), a uniformly random alphabet token
///    `alphabet[below(K)]` (noise), else the cycle's successor of the previous token.
///
/// A model learns first that only `K` ids occur (the loss falls from about ln V, 10.8 for
/// GPT-2, towards ln K, 6.9) and then the successor map and in-context copying; the loss floor
/// is the stream's entropy, about `-(7/8) ln(7/8) - (1/8) ln(1/(8K))`, 1.25 nats for K = 1024
/// (slightly less, as noise lands on the successor 1 time in K).
///
/// Returns an empty vector where the count overflows `usize`.
pub fn tokens(cfg: &Config, batch: usize, steps: usize, seed: u64) -> Vec<i32> {
    let Some(count) = steps
        .checked_mul(batch)
        .and_then(|n| n.checked_mul(cfg.seq))
        .and_then(|n| n.checked_add(1))
    else {
        return Vec::new();
    };
    let vocab = cfg.vocab.min(i32::MAX as usize);
    if vocab == 0 {
        return Vec::new();
    }
    let mut rng = Rng::for_stream(seed, TOKEN_STREAM);
    let k = vocab.min(TOKEN_ALPHABET);
    // Partial Fisher-Yates over 0..vocab, kept sparse (vocab may be large).
    let mut swapped = std::collections::HashMap::<usize, usize>::new();
    let mut alphabet = Vec::with_capacity(k);
    for i in 0..k {
        let j = i + rng.below((vocab - i) as u64) as usize;
        let vi = *swapped.get(&i).unwrap_or(&i);
        let vj = *swapped.get(&j).unwrap_or(&j);
        swapped.insert(j, vi);
        alphabet.push(vj as i32);
    }
    let mut out = Vec::with_capacity(count);
    let mut pos = rng.below(k as u64) as usize;
    out.push(alphabet[pos]);
    for _ in 1..count {
        pos = if rng.below(TOKEN_NOISE_DENOM) == 0 {
            rng.below(k as u64) as usize
        } else {
            (pos + 1) % k
        };
        out.push(alphabet[pos]);
    }
    out
}

/// The `step`-th training window of `tokens`: `inputs = tokens[s .. s + batch*seq]` and
/// `targets = tokens[s + 1 .. s + batch*seq + 1]` with `s = w * batch * seq`, both (batch, seq)
/// row-major. `w = step` while the tokens hold that window (as [`tokens`] makes them for
/// `steps` steps); past the end the windows repeat, `w = step % ((len - 1) / (batch*seq))`,
/// as the reference does. Returns two empty vectors where not even one window fits.
pub fn batch(tokens: &[i32], step: usize, batch: usize, seq: usize) -> (Vec<i32>, Vec<i32>) {
    let Some(n) = batch.checked_mul(seq).filter(|&n| n > 0) else {
        return (Vec::new(), Vec::new());
    };
    let windows = tokens.len().saturating_sub(1) / n;
    if windows == 0 {
        return (Vec::new(), Vec::new());
    }
    let start = (step % windows) * n;
    match (
        tokens.get(start..start + n),
        tokens.get(start + 1..start + n + 1),
    ) {
        (Some(x), Some(y)) => (x.to_vec(), y.to_vec()),
        _ => (Vec::new(), Vec::new()),
    }
}

/// The tokens as the reference's tokens file holds them: one `I32` tensor named
/// [`TOKENS_NAME`] of shape `[len]`.
pub fn tokens_tensor(tokens: &[i32]) -> Tensor {
    Tensor::i32(TOKENS_NAME, vec![tokens.len()], tokens)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]
mod tests {
    use super::*;
    use crate::safetensors::Dtype;

    #[test]
    fn configs_validate() {
        Config::gpt2_124m().validate().unwrap();
        Config::tiny().validate().unwrap();
        let bad = Config {
            heads: 5,
            ..Config::tiny()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::HeadsDoNotDivide { .. })
        ));
        let bad = Config {
            padded_vocab: 511,
            ..Config::tiny()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::PaddedVocabTooSmall { .. })
        ));
        for f in 0..6 {
            let mut c = Config::tiny();
            *[
                &mut c.layers,
                &mut c.heads,
                &mut c.channels,
                &mut c.seq,
                &mut c.vocab,
                &mut c.padded_vocab,
            ][f] = 0;
            assert!(matches!(c.validate(), Err(ConfigError::Zero(_))), "{f}");
        }
        let huge = Config {
            channels: usize::MAX / 2,
            heads: 1,
            ..Config::tiny()
        };
        assert!(matches!(huge.validate(), Err(ConfigError::Overflow)));
        assert_eq!(Config::gpt2_124m().head_size(), 64);
    }

    #[test]
    fn metadata_round_trip() {
        let c = Config::gpt2_124m();
        let m = c.metadata();
        let keys: Vec<_> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "layers",
                "heads",
                "channels",
                "seq",
                "vocab",
                "padded_vocab"
            ]
        );
        assert_eq!(Config::from_metadata(&m).unwrap(), c);
        assert!(Config::from_metadata(&m[1..]).is_err());
        let mut bad = m.clone();
        bad[0].1 = "x".into();
        assert_eq!(
            Config::from_metadata(&bad),
            Err(ConfigError::Metadata("layers"))
        );
    }

    #[test]
    fn specs_of_124m() {
        let cfg = Config::gpt2_124m();
        let specs = param_specs(&cfg);
        assert_eq!(specs.len(), 2 + 12 * 12 + 2);
        assert_eq!(
            specs[0],
            ("transformer.wte.weight".to_string(), vec![50304, 768])
        );
        assert_eq!(
            specs[1],
            ("transformer.wpe.weight".to_string(), vec![1024, 768])
        );
        let layer0: Vec<_> = specs[2..14]
            .iter()
            .map(|(n, s)| (n.as_str(), s.clone()))
            .collect();
        assert_eq!(
            layer0,
            [
                ("transformer.h.0.ln_1.weight", vec![768]),
                ("transformer.h.0.ln_1.bias", vec![768]),
                ("transformer.h.0.attn.c_attn.weight", vec![2304, 768]),
                ("transformer.h.0.attn.c_attn.bias", vec![2304]),
                ("transformer.h.0.attn.c_proj.weight", vec![768, 768]),
                ("transformer.h.0.attn.c_proj.bias", vec![768]),
                ("transformer.h.0.ln_2.weight", vec![768]),
                ("transformer.h.0.ln_2.bias", vec![768]),
                ("transformer.h.0.mlp.c_fc.weight", vec![3072, 768]),
                ("transformer.h.0.mlp.c_fc.bias", vec![3072]),
                ("transformer.h.0.mlp.c_proj.weight", vec![768, 3072]),
                ("transformer.h.0.mlp.c_proj.bias", vec![768]),
            ]
        );
        // Layer l occupies 2 + 12 l .. 2 + 12 (l + 1).
        assert_eq!(specs[2 + 12 * 11].0, "transformer.h.11.ln_1.weight");
        assert_eq!(
            specs[145],
            ("transformer.h.11.mlp.c_proj.bias".to_string(), vec![768])
        );
        assert_eq!(
            specs[146],
            ("transformer.ln_f.weight".to_string(), vec![768])
        );
        assert_eq!(specs[147], ("transformer.ln_f.bias".to_string(), vec![768]));
        assert_eq!(num_params(&cfg), 124_475_904);
        // Names unique.
        let mut names: Vec<_> = specs.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), specs.len());
    }

    #[test]
    fn init_kinds() {
        let cfg = Config::gpt2_124m();
        let p = INIT_STD / 24f64.sqrt();
        assert_eq!(
            init_kind(&cfg, "transformer.h.3.attn.c_proj.weight"),
            InitKind::Normal(p)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.h.3.mlp.c_proj.weight"),
            InitKind::Normal(p)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.h.3.mlp.c_fc.weight"),
            InitKind::Normal(0.02)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.h.3.attn.c_attn.weight"),
            InitKind::Normal(0.02)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.wpe.weight"),
            InitKind::Normal(0.02)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.h.3.attn.c_proj.bias"),
            InitKind::Constant(0.0)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.h.3.ln_2.weight"),
            InitKind::Constant(1.0)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.ln_f.weight"),
            InitKind::Constant(1.0)
        );
        assert_eq!(
            init_kind(&cfg, "transformer.ln_f.bias"),
            InitKind::Constant(0.0)
        );
    }

    fn stats(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    }

    #[test]
    fn init_is_deterministic_and_has_the_right_statistics() {
        let cfg = Config {
            padded_vocab: 520,
            ..Config::tiny()
        };
        let a = init_params(&cfg, 1234);
        let b = init_params(&cfg, 1234);
        assert_eq!(a, b, "same seed, same bytes");
        let c = init_params(&cfg, 1235);
        assert_ne!(a[0].data, c[0].data, "another seed, other values");
        let specs = param_specs(&cfg);
        assert_eq!(a.len(), specs.len());
        for (t, (name, shape)) in a.iter().zip(&specs) {
            assert_eq!(&t.name, name);
            assert_eq!(&t.shape, shape);
            assert_eq!(t.dtype, Dtype::F32);
            let v = t.to_f32().unwrap();
            match init_kind(&cfg, name) {
                InitKind::Constant(k) => assert!(v.iter().all(|&x| x == k), "{name}"),
                InitKind::Normal(std) => {
                    let (m, s) = stats(&v);
                    assert!(
                        m.abs() < 4.0 * std / (v.len() as f64).sqrt() + 1e-9,
                        "{name} mean {m}"
                    );
                    assert!((s / std - 1.0).abs() < 0.05, "{name} std {s} vs {std}");
                }
                InitKind::NormalRows { std, rows, cols } => {
                    let (drawn, pad) = v.split_at(rows * cols);
                    assert!(pad.iter().all(|&x| x.to_bits() == 0), "padded rows are +0");
                    assert_eq!(pad.len(), 8 * 128);
                    let (_, s) = stats(drawn);
                    assert!((s / std - 1.0).abs() < 0.05);
                }
            }
        }
        // Distinct tensors draw distinct streams.
        let wpe = a[1].to_f32().unwrap();
        let fc = a[10].to_f32().unwrap();
        assert_ne!(&wpe[..16], &fc[..16]);
        // A pinned value, so an accidental change of the generator shows.
        let first = a[0].to_f32().unwrap()[0];
        let again = init_params(&cfg, 1234)[0].to_f32().unwrap()[0];
        assert_eq!(first.to_bits(), again.to_bits());
    }

    #[test]
    fn generator_is_pinned() {
        // SplitMix64 from state 0: reference outputs.
        let mut s = 0u64;
        assert_eq!(splitmix64(&mut s), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(&mut s), 0x6E78_9E6A_A1B9_65F4);
        let mut r = Rng::new(0);
        let mut r2 = Rng::new(0);
        for _ in 0..100 {
            assert_eq!(r.next_u64(), r2.next_u64());
        }
        let mut r = Rng::new(7);
        let mut sum = 0.0;
        let mut sq = 0.0;
        let n = 200_000;
        for _ in 0..n {
            let z = r.normal();
            assert!(z.is_finite());
            sum += z;
            sq += z * z;
        }
        let mean = sum / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((sq / n as f64 - 1.0).abs() < 0.02);
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
            let u = r.uniform();
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn tokens_are_deterministic_in_range_and_learnable() {
        let cfg = Config::tiny();
        let (b, steps) = (4, 5);
        let t = tokens(&cfg, b, steps, 42);
        assert_eq!(t.len(), steps * b * cfg.seq + 1);
        assert_eq!(t, tokens(&cfg, b, steps, 42));
        assert_ne!(t, tokens(&cfg, b, steps, 43));
        assert!(t.iter().all(|&x| x >= 0 && (x as usize) < cfg.vocab));
        // A longer run starts with the same tokens (the stream does not depend on its length).
        let longer = tokens(&cfg, b, steps + 1, 42);
        assert_eq!(&longer[..t.len()], &t[..]);
        // Mostly a fixed successor map: the most common successor of each token is taken about
        // 7/8 of the time.
        let mut follow = std::collections::HashMap::<(i32, i32), usize>::new();
        let mut from = std::collections::HashMap::<i32, usize>::new();
        for w in t.windows(2) {
            *follow.entry((w[0], w[1])).or_default() += 1;
            *from.entry(w[0]).or_default() += 1;
        }
        let mut best = std::collections::HashMap::<i32, usize>::new();
        for (&(a, _), &n) in &follow {
            let e = best.entry(a).or_default();
            *e = (*e).max(n);
        }
        let hits: usize = best.values().sum();
        let frac = hits as f64 / (t.len() - 1) as f64;
        assert!(frac > 0.8 && frac < 0.95, "{frac}");
    }

    #[test]
    fn tokens_of_gpt2_use_a_1024_alphabet_spread_over_the_vocab() {
        let cfg = Config::gpt2_124m();
        let t = tokens(&cfg, 1, 20, 0);
        assert_eq!(t.len(), 20 * 1024 + 1);
        let distinct: std::collections::HashSet<_> = t.iter().copied().collect();
        assert!(
            distinct.len() <= TOKEN_ALPHABET && distinct.len() > 1000,
            "{}",
            distinct.len()
        );
        assert!(t.iter().all(|&x| x >= 0 && (x as usize) < cfg.vocab));
        assert!(
            distinct.iter().any(|&x| x > 40_000),
            "ids spread over the whole vocabulary"
        );
    }

    #[test]
    fn batch_windows() {
        let toks: Vec<i32> = (0..25).collect();
        let (x, y) = batch(&toks, 0, 2, 3);
        assert_eq!(x, [0, 1, 2, 3, 4, 5]);
        assert_eq!(y, [1, 2, 3, 4, 5, 6]);
        let (x, y) = batch(&toks, 3, 2, 3);
        assert_eq!(x, [18, 19, 20, 21, 22, 23]);
        assert_eq!(y, [19, 20, 21, 22, 23, 24]);
        // Past the end the windows repeat (4 windows here).
        assert_eq!(batch(&toks, 4, 2, 3), batch(&toks, 0, 2, 3));
        assert_eq!(batch(&toks, 7, 2, 3), batch(&toks, 3, 2, 3));
        // Too few tokens, or empty shapes: nothing, no panic.
        assert_eq!(batch(&toks[..6], 0, 2, 3), (vec![], vec![]));
        assert_eq!(batch(&toks, 0, 0, 3), (vec![], vec![]));
        assert_eq!(batch(&[], 0, 1, 1), (vec![], vec![]));
        assert_eq!(batch(&toks, 0, usize::MAX, 2), (vec![], vec![]));
        // With the generator's own tokens: one window per step, in order.
        let cfg = Config::tiny();
        let t = tokens(&cfg, 2, 3, 1);
        let (x2, y2) = batch(&t, 2, 2, cfg.seq);
        assert_eq!(x2.len(), 2 * cfg.seq);
        assert_eq!(&x2[..], &t[2 * 2 * cfg.seq..3 * 2 * cfg.seq]);
        assert_eq!(y2.last(), t.last());
    }

    #[test]
    fn tokens_tensor_round_trips_through_safetensors() {
        let t = tokens(&Config::tiny(), 1, 1, 3);
        let tensor = tokens_tensor(&t);
        assert_eq!(tensor.name, TOKENS_NAME);
        assert_eq!(tensor.shape, [t.len()]);
        assert_eq!(tensor.to_i32().unwrap(), t);
    }
}
