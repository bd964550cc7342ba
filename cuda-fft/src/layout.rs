//! The geometry of a transform, checked on the host before anything reaches cuFFT: the
//! kind ([`Transform`] and precision), the shape, the batch, and each side's [`Layout`]
//! (cuFFT's `cufftPlanMany` embedding, stride and distance), from which follow the bytes each
//! view must hold and whether the output is written once per element. Pure functions: the
//! CPU tests exercise every refusal.

use crate::error::{Error, Result};

/// Which transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transform {
    /// Complex to complex (forward or inverse).
    C2C,
    /// Real to complex (forward): `n` reals give `n / 2 + 1` complex numbers along the last
    /// dimension (the Hermitian half).
    R2C,
    /// Complex to real (inverse): the Hermitian half back to `n` reals. cuFFT may overwrite
    /// the input of a C2R transform: this crate treats it as written.
    C2R,
}

/// The sign of the exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `exp(-2 pi i jk / n)` (`CUFFT_FORWARD`).
    Forward,
    /// `exp(+2 pi i jk / n)`, unnormalised (`CUFFT_INVERSE`): inverse(forward(x)) = n x.
    Inverse,
}

/// Half, single or double precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Precision {
    /// `f16` reals, `[f16; 2]` complex numbers (`CUDA_R_16F`, `CUDA_C_16F`; cuFFT's
    /// `cufftXt` plans): every dimension a power of two, a GPU of compute capability 5.3 or
    /// more; computed in half precision (expect about 1e-3 relative error).
    Half,
    /// `f32` reals, `[f32; 2]` complex numbers (`cufftComplex`).
    Single,
    /// `f64` reals, `[f64; 2]` complex numbers (`cufftDoubleComplex`).
    Double,
}

impl Precision {
    /// Bytes of one real.
    pub fn real_bytes(self) -> usize {
        match self {
            Precision::Half => 2,
            Precision::Single => 4,
            Precision::Double => 8,
        }
    }
    /// Bytes of one complex number.
    pub fn complex_bytes(self) -> usize {
        2 * self.real_bytes()
    }
}

/// The element types of transforms: `half::f16`, `f32` and `f64` (their complex numbers are
/// pairs).
pub trait Real: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The precision.
    const PRECISION: Precision;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

impl Real for half::f16 {
    const PRECISION: Precision = Precision::Half;
}
impl Real for f32 {
    const PRECISION: Precision = Precision::Single;
}
impl Real for f64 {
    const PRECISION: Precision = Precision::Double;
}

/// One side's layout in elements of that side (reals or complex numbers), as
/// `cufftPlanMany` takes it: element `(b, i0, i1, i2)` of batch `b` sits at
/// `b * dist + ((i0 * embed[1] + i1) * embed[2] + i2) * stride` (for rank 3; fewer terms for
/// fewer dimensions). `embed[0]` is not used in addressing; `embed[k] >= n[k]` for `k >= 1`,
/// where `n` is this side's logical shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The storage dimensions (`inembed` / `onembed`), one per dimension of the shape.
    pub embed: Vec<usize>,
    /// Elements between two consecutive elements of the last dimension.
    pub stride: usize,
    /// Elements between the first elements of two consecutive transforms of the batch.
    pub dist: usize,
}

impl Layout {
    /// The packed layout of a side whose logical shape is `n`: embed = n, stride 1,
    /// dist = product of n (saturating: a product past `usize` is refused by the geometry's
    /// reach check).
    pub fn packed(n: &[usize]) -> Layout {
        Layout {
            embed: n.to_vec(),
            stride: 1,
            dist: n.iter().fold(1usize, |p, &x| p.saturating_mul(x)),
        }
    }
}

/// A checked transform: what cuFFT is asked to plan, and what each side reaches. Only its
/// constructors make one ([`packed`](Geometry::packed), [`with_layouts`](Geometry::with_layouts)):
/// a plan trusts its geometry for the bytes a transform reads and writes, so the fields are
/// read through methods and never set from outside.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub(crate) transform: Transform,
    pub(crate) precision: Precision,
    /// The real side's shape for R2C and C2R; 1 to 3 dimensions.
    pub(crate) shape: Vec<usize>,
    pub(crate) batch: usize,
    pub(crate) input: Layout,
    pub(crate) output: Layout,
    /// `true` when the layouts were given (`cufftPlanMany` with embeddings); `false` for
    /// packed data (null embeddings).
    pub(crate) advanced: bool,
}

/// The shape of the complex side of an R2C / C2R transform: the last dimension halved, plus
/// one.
pub fn hermitian(shape: &[usize]) -> Vec<usize> {
    let mut h = shape.to_vec();
    if let Some(last) = h.last_mut() {
        *last = *last / 2 + 1;
    }
    h
}

impl Geometry {
    /// The transform.
    pub fn transform(&self) -> Transform {
        self.transform
    }

    /// The precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The transform's shape (the real side's for R2C and C2R).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Transforms in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The input's and the output's layouts.
    pub fn layouts(&self) -> (&Layout, &Layout) {
        (&self.input, &self.output)
    }

    /// `true` when the layouts were given rather than packed.
    pub fn is_advanced(&self) -> bool {
        self.advanced
    }

    /// A transform of `shape` (1 to 3 dimensions, each at least 1), `batch` at least 1, packed
    /// data.
    pub fn packed(
        transform: Transform,
        precision: Precision,
        shape: &[usize],
        batch: usize,
    ) -> Result<Geometry> {
        check_shape(shape, batch, precision)?;
        let (i, o) = sides(transform, shape);
        Geometry::new(
            transform,
            precision,
            shape,
            batch,
            (Layout::packed(&i), Layout::packed(&o)),
            false,
        )
    }

    /// A transform of `shape` with the layouts given (`cufftPlanMany`'s advanced layout).
    pub fn with_layouts(
        transform: Transform,
        precision: Precision,
        shape: &[usize],
        batch: usize,
        input: Layout,
        output: Layout,
    ) -> Result<Geometry> {
        check_shape(shape, batch, precision)?;
        if precision == Precision::Half {
            // cuFFT's half-precision limits on strided layouts are narrower than the other
            // precisions' and not all are documented: packed data only.
            return Err(Error::shape(
                "layout",
                "half-precision transforms take packed layouts only (Geometry::packed)",
            ));
        }
        Geometry::new(transform, precision, shape, batch, (input, output), true)
    }

    fn new(
        transform: Transform,
        precision: Precision,
        shape: &[usize],
        batch: usize,
        (input, output): (Layout, Layout),
        advanced: bool,
    ) -> Result<Geometry> {
        let (ni, no) = sides(transform, shape);
        check_layout("input", &input, &ni)?;
        check_layout("output", &output, &no)?;
        let g = Geometry {
            transform,
            precision,
            shape: shape.to_vec(),
            batch,
            input,
            output,
            advanced,
        };
        // The output is written once per element; C2R's input is written too.
        injective("output", &g.output, &no, batch)?;
        if transform == Transform::C2R {
            injective("input", &g.input, &ni, batch)?;
        }
        // Every count cuFFT takes as a 64-bit integer, and every byte count, fits.
        g.input_bytes()?;
        g.output_bytes()?;
        Ok(g)
    }

    /// Bytes of one input element.
    pub fn input_element(&self) -> usize {
        match self.transform {
            Transform::R2C => self.precision.real_bytes(),
            _ => self.precision.complex_bytes(),
        }
    }

    /// Bytes of one output element.
    pub fn output_element(&self) -> usize {
        match self.transform {
            Transform::C2R => self.precision.real_bytes(),
            _ => self.precision.complex_bytes(),
        }
    }

    /// The bytes the input layout reaches from its first element.
    pub fn input_bytes(&self) -> Result<u64> {
        let (ni, _) = sides(self.transform, &self.shape);
        reach("input", &self.input, &ni, self.batch, self.input_element())
    }

    /// The bytes the output layout reaches from its first element.
    pub fn output_bytes(&self) -> Result<u64> {
        let (_, no) = sides(self.transform, &self.shape);
        reach(
            "output",
            &self.output,
            &no,
            self.batch,
            self.output_element(),
        )
    }

    /// The direction the transform runs in: `dir` for C2C, forward for R2C, inverse for C2R
    /// (anything else refused).
    pub fn direction(&self, dir: Direction) -> Result<Direction> {
        match (self.transform, dir) {
            (Transform::C2C, d) => Ok(d),
            (Transform::R2C, Direction::Forward) | (Transform::C2R, Direction::Inverse) => Ok(dir),
            (t, d) => Err(Error::Direction {
                why: format!(
                    "{t:?} runs {}, not {d:?}",
                    if t == Transform::R2C {
                        "forward"
                    } else {
                        "inverse"
                    }
                ),
            }),
        }
    }

    /// Checks an execution's views, given as `(address, bytes)`: alignment, length, and how
    /// they share memory. In place (the same address) is allowed for C2C with identical
    /// layouts; any other overlap is refused.
    pub fn check_views(&self, input: (u64, usize), output: (u64, usize)) -> Result<()> {
        self.check_views_reaching(input, output, (self.input_bytes()?, self.output_bytes()?))
    }

    /// [`check_views`](Self::check_views) with the bytes each layout reaches already known
    /// (a plan computes them once).
    pub(crate) fn check_views_reaching(
        &self,
        input: (u64, usize),
        output: (u64, usize),
        (need_in, need_out): (u64, u64),
    ) -> Result<()> {
        for (arg, (addr, have), need, elem) in [
            ("input", input, need_in, self.input_element()),
            ("output", output, need_out, self.output_element()),
        ] {
            if !addr.is_multiple_of(elem as u64) {
                return Err(Error::Misaligned {
                    arg,
                    addr,
                    align: elem,
                });
            }
            if need > have as u64 {
                return Err(Error::BufferTooSmall {
                    arg,
                    need,
                    have: have as u64,
                });
            }
        }
        let (i0, i1) = (input.0, input.0 + need_in);
        let (o0, o1) = (output.0, output.0 + need_out);
        let overlap = i0 < o1 && o0 < i1 && need_in > 0 && need_out > 0;
        if overlap {
            let in_place =
                i0 == o0 && self.transform == Transform::C2C && self.input == self.output;
            if !in_place {
                return Err(Error::Overlap {
                    why: format!(
                        "the output [{o0:#x}, {o1:#x}) overlaps the input [{i0:#x}, {i1:#x}): \
                         only a C2C transform runs in place, on the same address with the same \
                         layout"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The logical shapes of the input and output sides.
fn sides(t: Transform, shape: &[usize]) -> (Vec<usize>, Vec<usize>) {
    match t {
        Transform::C2C => (shape.to_vec(), shape.to_vec()),
        Transform::R2C => (shape.to_vec(), hermitian(shape)),
        Transform::C2R => (hermitian(shape), shape.to_vec()),
    }
}

fn check_shape(shape: &[usize], batch: usize, precision: Precision) -> Result<()> {
    if shape.is_empty() || shape.len() > 3 {
        return Err(Error::shape(
            "shape",
            format!("{} dimensions; cuFFT plans 1, 2 or 3", shape.len()),
        ));
    }
    if let Some(i) = shape.iter().position(|&n| n == 0) {
        return Err(Error::shape("shape", format!("dimension {i} is 0")));
    }
    if batch == 0 {
        return Err(Error::shape("batch", "0 transforms"));
    }
    if precision == Precision::Half {
        if let Some(i) = shape.iter().position(|n| !n.is_power_of_two()) {
            return Err(Error::shape(
                "shape",
                format!(
                    "dimension {i} is {}: cuFFT's half-precision transforms take powers of two",
                    shape[i]
                ),
            ));
        }
    }
    for (arg, v) in shape
        .iter()
        .map(|&n| ("shape", n))
        .chain([("batch", batch)])
    {
        if i64::try_from(v).is_err() {
            return Err(Error::shape(arg, format!("{v} exceeds i64")));
        }
    }
    Ok(())
}

fn check_layout(arg: &'static str, l: &Layout, n: &[usize]) -> Result<()> {
    if l.embed.len() != n.len() {
        return Err(Error::shape(
            arg,
            format!(
                "{} embedding dimensions for a {}-dimensional transform",
                l.embed.len(),
                n.len()
            ),
        ));
    }
    for (k, (&e, &nk)) in l.embed.iter().zip(n).enumerate().skip(1) {
        if e < nk {
            return Err(Error::shape(
                arg,
                format!(
                    "embedding dimension {k} is {e}, less than the {nk} elements of that dimension"
                ),
            ));
        }
    }
    if l.stride == 0 {
        return Err(Error::shape(arg, "stride 0"));
    }
    for v in l.embed.iter().chain([&l.stride, &l.dist]) {
        if i64::try_from(*v).is_err() {
            return Err(Error::shape(arg, format!("{v} exceeds i64")));
        }
    }
    Ok(())
}

/// `(count, stride)` of each dimension of a side, the batch first, in elements.
fn dims(l: &Layout, n: &[usize], batch: usize) -> Option<Vec<(u64, u64)>> {
    let mut out = vec![(batch as u64, l.dist as u64)];
    let mut step = l.stride as u64;
    let mut per = Vec::with_capacity(n.len());
    for k in (0..n.len()).rev() {
        per.push((n[k] as u64, step));
        step = step.checked_mul(l.embed[k] as u64)?;
    }
    per.reverse();
    out.extend(per);
    Some(out)
}

/// The bytes a side reaches: (its last element's index + 1) times the element size.
fn reach(arg: &'static str, l: &Layout, n: &[usize], batch: usize, elem: usize) -> Result<u64> {
    let overflow = || Error::shape(arg, "the layout's extent overflows 64 bits");
    let d = dims(l, n, batch).ok_or_else(overflow)?;
    let mut last = 0u64;
    for (count, stride) in d {
        last = (count - 1)
            .checked_mul(stride)
            .and_then(|v| last.checked_add(v))
            .ok_or_else(overflow)?;
    }
    last.checked_add(1)
        .and_then(|v| v.checked_mul(elem as u64))
        .filter(|v| i64::try_from(*v).is_ok())
        .ok_or_else(overflow)
}

/// Refuses a layout that maps two elements to one address (a sufficient test: the
/// dimensions sorted by stride, each stride beyond everything the smaller ones reach).
fn injective(arg: &'static str, l: &Layout, n: &[usize], batch: usize) -> Result<()> {
    let mut d: Vec<(u64, u64)> = dims(l, n, batch)
        .ok_or_else(|| Error::shape(arg, "the layout's extent overflows 64 bits"))?
        .into_iter()
        .filter(|&(count, _)| count > 1)
        .collect();
    d.sort_by_key(|&(count, stride)| (stride, count));
    let mut extent = 0u64;
    for (count, stride) in d {
        if stride <= extent {
            return Err(Error::Overlap {
                why: format!(
                    "{arg}: the layout writes some elements twice (a stride of {stride} \
                     elements within the {} the smaller dimensions reach)",
                    extent + 1
                ),
            });
        }
        extent = extent.saturating_add((count - 1).saturating_mul(stride));
    }
    Ok(())
}
