//! A minimal reader and writer for the safetensors format, for `F32` and `I32` tensors.
//!
//! The layout (<https://github.com/huggingface/safetensors>): an 8-byte little-endian header
//! length `N`, then `N` bytes of UTF-8 JSON
//!
//! ```text
//! {"__metadata__": {"key": "value", ...},
//!  "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//! ```
//!
//! then the data, little-endian, with each tensor's `data_offsets` relative to the first byte
//! after the header. [`write()`] puts the tensors in the order given, back to back, and pads the
//! header with spaces to a multiple of 8 bytes (as the format allows), so the data begins
//! 8-byte aligned. [`read()`] accepts any file that follows the format for these two dtypes and
//! refuses, with a typed [`Error`] and never a panic, anything else: a header longer than the
//! file or than [`MAX_HEADER_LEN`], JSON that is not an object of entries, an unknown dtype, a
//! shape whose byte size overflows, offsets out of bounds, overlapping, leaving gaps or not
//! covering the data exactly, or a data length that is not `product(shape) * 4`. It returns the
//! tensors in the order of their data in the file (for a file [`write()`] made, the order given to
//! it) and the metadata sorted by key.
//!
//! Only a little-endian payload is read and written, whatever the host: the bytes are kept as
//! they are in [`Tensor::data`] and converted by [`Tensor::to_f32`] / [`Tensor::to_i32`].

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The longest header [`read()`] accepts, in bytes (as the reference implementation: 100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The key of the free-form string-to-string metadata in the header.
pub const METADATA_KEY: &str = "__metadata__";

/// An element type this module reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// 32-bit IEEE float, `"F32"`.
    F32,
    /// 32-bit signed integer, `"I32"`.
    I32,
}

impl Dtype {
    /// The name the header uses (`"F32"`, `"I32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::I32 => "I32",
        }
    }

    /// The dtype a header name stands for, if it is one of the two this module knows.
    pub fn from_name(name: &str) -> Option<Dtype> {
        match name {
            "F32" => Some(Dtype::F32),
            "I32" => Some(Dtype::I32),
            _ => None,
        }
    }

    /// Bytes per element (4 for both).
    pub fn size(self) -> usize {
        4
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One named tensor: its dtype, shape and raw little-endian bytes (row-major).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// The tensor's name (a key of the header).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first. An empty shape is a scalar (one element).
    pub shape: Vec<usize>,
    /// `product(shape) * 4` bytes, little-endian.
    pub data: Vec<u8>,
}

impl Tensor {
    /// An `F32` tensor holding `values` (row-major). The shape is not checked against the
    /// length here: [`write()`] refuses a tensor whose data does not match its shape, and
    /// [`Tensor::to_f32`] refuses to read one.
    pub fn f32(name: impl Into<String>, shape: Vec<usize>, values: &[f32]) -> Tensor {
        let mut data = Vec::with_capacity(values.len().saturating_mul(4));
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        Tensor {
            name: name.into(),
            dtype: Dtype::F32,
            shape,
            data,
        }
    }

    /// An `I32` tensor holding `values` (row-major); see [`Tensor::f32`].
    pub fn i32(name: impl Into<String>, shape: Vec<usize>, values: &[i32]) -> Tensor {
        let mut data = Vec::with_capacity(values.len().saturating_mul(4));
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        Tensor {
            name: name.into(),
            dtype: Dtype::I32,
            shape,
            data,
        }
    }

    /// The number of elements, `product(shape)`, or `None` where that overflows.
    pub fn numel(&self) -> Option<usize> {
        numel(&self.shape)
    }

    /// The values of an `F32` tensor. Refuses another dtype, and data whose length is not
    /// `product(shape) * 4`.
    pub fn to_f32(&self) -> Result<Vec<f32>, Error> {
        self.check(Dtype::F32)?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The values of an `I32` tensor. Refuses another dtype, and data whose length is not
    /// `product(shape) * 4`.
    pub fn to_i32(&self) -> Result<Vec<i32>, Error> {
        self.check(Dtype::I32)?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn check(&self, want: Dtype) -> Result<(), Error> {
        if self.dtype != want {
            return Err(Error::WrongDtype {
                name: self.name.clone(),
                expected: want,
                found: self.dtype,
            });
        }
        let expected = byte_len(&self.shape, self.dtype).ok_or_else(|| Error::ShapeOverflow {
            name: self.name.clone(),
        })?;
        if expected != self.data.len() as u64 {
            return Err(Error::DataLength {
                name: self.name.clone(),
                expected,
                found: self.data.len() as u64,
            });
        }
        Ok(())
    }
}

/// Why [`read()`] (or a conversion) refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening or reading the file failed (a file shorter than its header says included).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The file is shorter than the 8-byte header length.
    #[error("file of {len} bytes is too short for the 8-byte header length")]
    TooShort {
        /// The file's length.
        len: u64,
    },
    /// The header length is larger than [`MAX_HEADER_LEN`] or than the rest of the file.
    #[error("header length {header_len} exceeds the limit {limit} (file of {file_len} bytes)")]
    HeaderTooLarge {
        /// The header length the file states.
        header_len: u64,
        /// The most it could be (the smaller of the file's rest and [`MAX_HEADER_LEN`]).
        limit: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not valid UTF-8 JSON.
    #[error("header is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The header (or one of its parts) does not have the structure the format prescribes.
    #[error("malformed header: {0}")]
    Header(String),
    /// An entry's dtype is not one this module reads.
    #[error("tensor {name:?}: unknown or unsupported dtype {dtype:?} (F32 and I32 are read)")]
    UnknownDtype {
        /// The tensor's name.
        name: String,
        /// The dtype string found.
        dtype: String,
    },
    /// `product(shape) * 4` overflows.
    #[error("tensor {name:?}: the byte size of its shape overflows")]
    ShapeOverflow {
        /// The tensor's name.
        name: String,
    },
    /// The data length (from the offsets, or of a tensor in memory) is not `product(shape) * 4`.
    #[error("tensor {name:?}: {found} bytes of data where its shape and dtype need {expected}")]
    DataLength {
        /// The tensor's name.
        name: String,
        /// `product(shape) * 4`.
        expected: u64,
        /// The length found.
        found: u64,
    },
    /// An entry's offsets are reversed or end past the data.
    #[error(
        "tensor {name:?}: data offsets [{begin}, {end}) out of bounds of {data_len} data bytes"
    )]
    OffsetsOutOfBounds {
        /// The tensor's name.
        name: String,
        /// First byte.
        begin: u64,
        /// One past the last byte.
        end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// The tensors' data overlap or leave a gap (the data must be covered exactly, in order).
    #[error(
        "tensor {name:?}: data begins at {begin} where the previous tensor ends at {expected}"
    )]
    NotContiguous {
        /// The tensor's name.
        name: String,
        /// Where its data begins.
        begin: u64,
        /// Where it would have to begin.
        expected: u64,
    },
    /// Data bytes no tensor covers follow the last tensor.
    #[error("{unused} bytes of data at the end belong to no tensor")]
    TrailingData {
        /// The bytes left over.
        unused: u64,
    },
    /// A conversion asked for another dtype than the tensor has.
    #[error("tensor {name:?} is {found}, not {expected}")]
    WrongDtype {
        /// The tensor's name.
        name: String,
        /// The dtype asked for.
        expected: Dtype,
        /// The tensor's dtype.
        found: Dtype,
    },
}

/// `product(shape)`, or `None` where it overflows.
fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// `product(shape) * size` in bytes as a `u64`, or `None` where it overflows.
fn byte_len(shape: &[usize], dtype: Dtype) -> Option<u64> {
    let n = numel(shape)?.checked_mul(dtype.size())?;
    u64::try_from(n).ok()
}

fn invalid_input(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

/// Writes `tensors` (in the order given, data back to back) and `metadata` to `path`.
///
/// Refuses (`InvalidInput`) a tensor whose data length is not `product(shape) * 4`, two
/// tensors of one name, a tensor named `__metadata__` and two metadata entries of one key.
pub fn write(
    path: impl AsRef<Path>,
    tensors: &[Tensor],
    metadata: &[(String, String)],
) -> std::io::Result<()> {
    let file = File::create(path)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write_to(&mut w, tensors, metadata)?;
    w.flush()
}

/// [`write()`] to any writer.
pub fn write_to(
    w: &mut impl Write,
    tensors: &[Tensor],
    metadata: &[(String, String)],
) -> std::io::Result<()> {
    let header = header_bytes(tensors, metadata)?;
    w.write_all(&(header.len() as u64).to_le_bytes())?;
    w.write_all(&header)?;
    for t in tensors {
        w.write_all(&t.data)?;
    }
    Ok(())
}

/// The header's JSON, padded with spaces to a multiple of 8 bytes.
fn header_bytes(tensors: &[Tensor], metadata: &[(String, String)]) -> std::io::Result<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    for (k, _) in metadata {
        if !seen.insert(k.as_str()) {
            return Err(invalid_input(format!("metadata key {k:?} given twice")));
        }
    }
    let mut json = String::from("{");
    // The metadata first, in the order given; always present (possibly empty).
    json.push_str(&serde_json::to_string(METADATA_KEY)?);
    json.push_str(":{");
    for (i, (k, v)) in metadata.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&serde_json::to_string(k)?);
        json.push(':');
        json.push_str(&serde_json::to_string(v)?);
    }
    json.push('}');
    let mut names = std::collections::HashSet::new();
    let mut offset: u64 = 0;
    for t in tensors {
        if t.name == METADATA_KEY {
            return Err(invalid_input(format!(
                "a tensor may not be named {METADATA_KEY:?}"
            )));
        }
        if !names.insert(t.name.as_str()) {
            return Err(invalid_input(format!(
                "tensor name {:?} given twice",
                t.name
            )));
        }
        let len = byte_len(&t.shape, t.dtype)
            .ok_or_else(|| invalid_input(format!("tensor {:?}: shape overflows", t.name)))?;
        if len != t.data.len() as u64 {
            return Err(invalid_input(format!(
                "tensor {:?}: {} bytes of data where shape {:?} of {} needs {}",
                t.name,
                t.data.len(),
                t.shape,
                t.dtype,
                len
            )));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| invalid_input("total data size overflows".to_string()))?;
        json.push(',');
        json.push_str(&serde_json::to_string(&t.name)?);
        json.push_str(":{\"dtype\":\"");
        json.push_str(t.dtype.as_str());
        json.push_str("\",\"shape\":[");
        for (i, d) in t.shape.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&d.to_string());
        }
        json.push_str(&format!("],\"data_offsets\":[{offset},{end}]}}"));
        offset = end;
    }
    json.push('}');
    let mut bytes = json.into_bytes();
    while !bytes.len().is_multiple_of(8) {
        bytes.push(b' ');
    }
    if bytes.len() as u64 > MAX_HEADER_LEN {
        return Err(invalid_input(format!(
            "header of {} bytes exceeds {MAX_HEADER_LEN}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads the tensors and metadata of the file at `path` (see the module's documentation for
/// what is checked). Tensors come in the order of their data; metadata sorted by key.
#[allow(
    clippy::type_complexity,
    reason = "the signature the example's driver uses"
)]
pub fn read(path: impl AsRef<Path>) -> Result<(Vec<Tensor>, Vec<(String, String)>), Error> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    read_from(&mut r, len)
}

/// [`read()`] from any reader that holds exactly `len` bytes (a reader that ends early gives
/// [`Error::Io`]; bytes past `len` are not read).
#[allow(clippy::type_complexity, reason = "as read")]
pub fn read_from(
    r: &mut impl Read,
    len: u64,
) -> Result<(Vec<Tensor>, Vec<(String, String)>), Error> {
    if len < 8 {
        return Err(Error::TooShort { len });
    }
    let mut n = [0u8; 8];
    r.read_exact(&mut n)?;
    let header_len = u64::from_le_bytes(n);
    let limit = (len - 8).min(MAX_HEADER_LEN);
    if header_len > limit {
        return Err(Error::HeaderTooLarge {
            header_len,
            limit,
            file_len: len,
        });
    }
    // header_len <= MAX_HEADER_LEN, which fits in usize on every target this runs on (>= 32 bits).
    let hlen = usize::try_from(header_len).map_err(|_| Error::HeaderTooLarge {
        header_len,
        limit,
        file_len: len,
    })?;
    let mut header = vec![0u8; hlen];
    r.read_exact(&mut header)?;
    let data_len = len - 8 - header_len;
    let (entries, metadata) = parse_header(&header, data_len)?;
    let mut tensors = Vec::with_capacity(entries.len());
    for e in entries {
        // Validated: end - begin == product(shape) * 4 <= data_len <= len, a length this
        // process could open; the conversion still refuses rather than truncates.
        let n = usize::try_from(e.end - e.begin).map_err(|_| Error::ShapeOverflow {
            name: e.name.clone(),
        })?;
        let mut data = Vec::new();
        data.try_reserve_exact(n)
            .map_err(|_| Error::ShapeOverflow {
                name: e.name.clone(),
            })?;
        data.resize(n, 0);
        r.read_exact(&mut data)?;
        tensors.push(Tensor {
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
            data,
        });
    }
    Ok((tensors, metadata))
}

/// One validated header entry.
struct Entry {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    begin: u64,
    end: u64,
}

/// Parses and validates the header against a data section of `data_len` bytes. Entries come
/// sorted by offset, contiguous from 0 to `data_len`.
#[allow(clippy::type_complexity, reason = "private")]
fn parse_header(
    header: &[u8],
    data_len: u64,
) -> Result<(Vec<Entry>, Vec<(String, String)>), Error> {
    let value: serde_json::Value = serde_json::from_slice(header)?;
    let serde_json::Value::Object(map) = value else {
        return Err(Error::Header("the header is not a JSON object".into()));
    };
    let mut metadata = Vec::new();
    let mut entries = Vec::with_capacity(map.len());
    for (name, v) in map {
        if name == METADATA_KEY {
            let serde_json::Value::Object(m) = v else {
                return Err(Error::Header("__metadata__ is not an object".into()));
            };
            for (k, v) in m {
                let serde_json::Value::String(s) = v else {
                    return Err(Error::Header(format!(
                        "__metadata__ value of {k:?} is not a string"
                    )));
                };
                metadata.push((k, s));
            }
            continue;
        }
        entries.push(parse_entry(name, &v)?);
    }
    metadata.sort();
    for e in &entries {
        if e.begin > e.end || e.end > data_len {
            return Err(Error::OffsetsOutOfBounds {
                name: e.name.clone(),
                begin: e.begin,
                end: e.end,
                data_len,
            });
        }
        let expected = byte_len(&e.shape, e.dtype).ok_or_else(|| Error::ShapeOverflow {
            name: e.name.clone(),
        })?;
        if expected != e.end - e.begin {
            return Err(Error::DataLength {
                name: e.name.clone(),
                expected,
                found: e.end - e.begin,
            });
        }
    }
    // Order by data; empty tensors (begin == end) before a non-empty one at the same offset,
    // and by name between equals, so the order never depends on the JSON map's.
    entries.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    let mut expected: u64 = 0;
    for e in &entries {
        if e.begin != expected {
            return Err(Error::NotContiguous {
                name: e.name.clone(),
                begin: e.begin,
                expected,
            });
        }
        expected = e.end;
    }
    if expected != data_len {
        return Err(Error::TrailingData {
            unused: data_len - expected,
        });
    }
    Ok((entries, metadata))
}

fn parse_entry(name: String, v: &serde_json::Value) -> Result<Entry, Error> {
    let serde_json::Value::Object(obj) = v else {
        return Err(Error::Header(format!("entry {name:?} is not an object")));
    };
    for k in obj.keys() {
        if !matches!(k.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(Error::Header(format!(
                "entry {name:?} has an unknown field {k:?}"
            )));
        }
    }
    let dtype = match obj.get("dtype") {
        Some(serde_json::Value::String(s)) => {
            Dtype::from_name(s).ok_or_else(|| Error::UnknownDtype {
                name: name.clone(),
                dtype: s.clone(),
            })?
        }
        _ => {
            return Err(Error::Header(format!(
                "entry {name:?}: dtype missing or not a string"
            )))
        }
    };
    let Some(serde_json::Value::Array(dims)) = obj.get("shape") else {
        return Err(Error::Header(format!(
            "entry {name:?}: shape missing or not an array"
        )));
    };
    let mut shape = Vec::with_capacity(dims.len());
    for d in dims {
        let d = d
            .as_u64()
            .and_then(|d| usize::try_from(d).ok())
            .ok_or_else(|| Error::Header(format!("entry {name:?}: a dimension is not a usize")))?;
        shape.push(d);
    }
    let offsets = match obj.get("data_offsets") {
        Some(serde_json::Value::Array(o)) if o.len() == 2 => o,
        _ => {
            return Err(Error::Header(format!(
                "entry {name:?}: data_offsets is not [begin, end]"
            )));
        }
    };
    let (Some(begin), Some(end)) = (offsets[0].as_u64(), offsets[1].as_u64()) else {
        return Err(Error::Header(format!(
            "entry {name:?}: an offset is not a u64"
        )));
    };
    Ok(Entry {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::type_complexity,
    reason = "tests"
)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn to_bytes(tensors: &[Tensor], metadata: &[(String, String)]) -> Vec<u8> {
        let mut out = Vec::new();
        write_to(&mut out, tensors, metadata).unwrap();
        out
    }

    fn parse(bytes: &[u8]) -> Result<(Vec<Tensor>, Vec<(String, String)>), Error> {
        read_from(&mut Cursor::new(bytes), bytes.len() as u64)
    }

    /// A file with the given header text (not padded) and `data_len` zero bytes of data.
    fn crafted(header: &str, data_len: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data_len));
        out
    }

    fn sample() -> (Vec<Tensor>, Vec<(String, String)>) {
        let a = Tensor::f32(
            "b.weight",
            vec![2, 3],
            &[1.0, -2.5, 3.25, f32::MIN_POSITIVE, 0.0, -0.0],
        );
        let b = Tensor::i32("a.tokens", vec![4], &[0, -1, i32::MAX, i32::MIN]);
        let c = Tensor::f32("scalar", vec![], &[7.0]);
        let d = Tensor::f32("empty", vec![0, 5], &[]);
        let e = Tensor::f32("weird \"name\"\n\u{e9}", vec![1], &[f32::NAN]);
        let meta = vec![
            ("layers".to_string(), "12".to_string()),
            ("channels".to_string(), "768".to_string()),
            (
                "quote\"key".to_string(),
                "value\\with\u{0}escapes".to_string(),
            ),
        ];
        (vec![a, b, c, d, e], meta)
    }

    #[test]
    fn round_trip_in_memory() {
        let (tensors, meta) = sample();
        let bytes = to_bytes(&tensors, &meta);
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        assert_eq!(header_len % 8, 0, "header padded to a multiple of 8");
        let (back, meta_back) = parse(&bytes).unwrap();
        // Order of the data = the order given (the empty tensor sorts before the one that
        // begins at the same offset; here it sits between `scalar` and `weird`).
        let names: Vec<_> = back.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "b.weight",
                "a.tokens",
                "scalar",
                "empty",
                "weird \"name\"\n\u{e9}"
            ]
        );
        assert_eq!(back, tensors);
        let mut sorted = meta.clone();
        sorted.sort();
        assert_eq!(meta_back, sorted);
        assert_eq!(
            back[0].to_f32().unwrap(),
            [1.0, -2.5, 3.25, f32::MIN_POSITIVE, 0.0, -0.0]
        );
        assert_eq!(back[1].to_i32().unwrap(), [0, -1, i32::MAX, i32::MIN]);
        assert!(back[4].to_f32().unwrap()[0].is_nan());
    }

    #[test]
    fn round_trip_file() {
        let (tensors, meta) = sample();
        let dir = std::env::temp_dir().join(format!("gpt2-safetensors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
        write(&path, &tensors, &meta).unwrap();
        let (back, _) = read(&path).unwrap();
        assert_eq!(back, tensors);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn header_is_the_documented_json() {
        let t = Tensor::f32("w", vec![1, 2], &[1.0, 2.0]);
        let bytes = to_bytes(&[t], &[("k".into(), "v".into())]);
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
        assert_eq!(
            text.trim_end(),
            r#"{"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}"#
        );
        assert_eq!(&bytes[8 + n..], [0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
    }

    #[test]
    fn accepts_any_order_and_no_metadata() {
        // Entries listed in another order than their data, no __metadata__.
        let h = r#"{"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let (t, m) = parse(&crafted(h, 8)).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "a");
        assert_eq!(t[1].dtype, Dtype::I32);
        assert!(m.is_empty());
        // An empty file of tensors.
        let (t, _) = parse(&crafted("{}", 0)).unwrap();
        assert!(t.is_empty());
    }

    #[test]
    fn write_refuses_bad_tensors() {
        let short = Tensor::f32("w", vec![2, 2], &[1.0]);
        assert!(write_to(&mut Vec::new(), &[short], &[]).is_err());
        let a = Tensor::f32("w", vec![1], &[1.0]);
        assert!(write_to(&mut Vec::new(), &[a.clone(), a.clone()], &[]).is_err());
        let m = Tensor::f32(METADATA_KEY, vec![1], &[1.0]);
        assert!(write_to(&mut Vec::new(), &[m], &[]).is_err());
        let meta = [
            ("k".to_string(), "1".to_string()),
            ("k".to_string(), "2".to_string()),
        ];
        assert!(write_to(&mut Vec::new(), &[a], &meta).is_err());
        let huge = Tensor {
            name: "h".into(),
            dtype: Dtype::F32,
            shape: vec![usize::MAX, 2],
            data: vec![],
        };
        assert!(write_to(&mut Vec::new(), &[huge], &[]).is_err());
    }

    #[test]
    fn refuses_short_file() {
        assert!(matches!(parse(&[1, 2, 3]), Err(Error::TooShort { len: 3 })));
        assert!(matches!(parse(&[]), Err(Error::TooShort { len: 0 })));
    }

    #[test]
    fn refuses_header_longer_than_file() {
        let mut bytes = 100u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        assert!(matches!(
            parse(&bytes),
            Err(Error::HeaderTooLarge {
                header_len: 100,
                ..
            })
        ));
        // u64::MAX must not overflow anything.
        let bytes = u64::MAX.to_le_bytes().to_vec();
        assert!(matches!(parse(&bytes), Err(Error::HeaderTooLarge { .. })));
    }

    #[test]
    fn refuses_header_over_100mb_even_if_file_is_long() {
        // A reader claiming a 1 TB file: refused before anything is allocated.
        let bytes = (MAX_HEADER_LEN + 1).to_le_bytes();
        let r = read_from(&mut Cursor::new(&bytes[..]), 1 << 40);
        assert!(matches!(
            r,
            Err(Error::HeaderTooLarge {
                limit: MAX_HEADER_LEN,
                ..
            })
        ));
    }

    #[test]
    fn refuses_reader_ending_early() {
        let (tensors, meta) = sample();
        let bytes = to_bytes(&tensors, &meta);
        let r = read_from(
            &mut Cursor::new(&bytes[..bytes.len() - 1]),
            bytes.len() as u64,
        );
        assert!(matches!(r, Err(Error::Io(_))));
    }

    #[test]
    fn refuses_bad_json() {
        assert!(matches!(parse(&crafted("{\"a\":", 0)), Err(Error::Json(_))));
        assert!(matches!(parse(&crafted("{} x", 0)), Err(Error::Json(_))));
        let mut bytes = crafted("{\"\u{e9}\":1}", 0);
        bytes[10] = 0xff; // invalid UTF-8 inside the string
        assert!(matches!(parse(&bytes), Err(Error::Json(_))));
    }

    #[test]
    fn refuses_malformed_structure() {
        for h in [
            "[]",
            "3",
            r#"{"__metadata__":[]}"#,
            r#"{"__metadata__":{"k":1}}"#,
            r#"{"a":1}"#,
            r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":5,"shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":0}}"#,
        ] {
            let r = parse(&crafted(h, 4));
            assert!(matches!(r, Err(Error::Header(_))), "{h}: {r:?}");
        }
    }

    #[test]
    fn refuses_unknown_dtype() {
        for d in ["F16", "BF16", "F64", "I64", "f32", ""] {
            let h = format!(r#"{{"a":{{"dtype":"{d}","shape":[1],"data_offsets":[0,4]}}}}"#);
            let r = parse(&crafted(&h, 4));
            assert!(matches!(r, Err(Error::UnknownDtype { .. })), "{d}: {r:?}");
        }
    }

    #[test]
    fn refuses_offsets_out_of_bounds() {
        let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        assert!(matches!(
            parse(&crafted(h, 4)),
            Err(Error::OffsetsOutOfBounds { .. })
        ));
        let h = r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#;
        assert!(matches!(
            parse(&crafted(h, 8)),
            Err(Error::OffsetsOutOfBounds { .. })
        ));
        let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}}"#;
        assert!(matches!(
            parse(&crafted(h, 4)),
            Err(Error::OffsetsOutOfBounds { .. })
        ));
    }

    #[test]
    fn refuses_length_not_matching_shape() {
        let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#;
        assert!(matches!(
            parse(&crafted(h, 4)),
            Err(Error::DataLength {
                expected: 8,
                found: 4,
                ..
            })
        ));
        let h = r#"{"a":{"dtype":"I32","shape":[],"data_offsets":[0,8]}}"#;
        assert!(matches!(
            parse(&crafted(h, 8)),
            Err(Error::DataLength {
                expected: 4,
                found: 8,
                ..
            })
        ));
    }

    #[test]
    fn refuses_shape_overflow() {
        let h = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}"#;
        assert!(matches!(
            parse(&crafted(h, 4)),
            Err(Error::ShapeOverflow { .. })
        ));
        let h = r#"{"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}}"#;
        assert!(matches!(
            parse(&crafted(h, 4)),
            Err(Error::ShapeOverflow { .. })
        ));
        let h = r#"{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}"#;
        assert!(matches!(parse(&crafted(h, 4)), Err(Error::Header(_))));
    }

    #[test]
    fn refuses_overlap_and_gaps() {
        // Overlap.
        let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(matches!(
            parse(&crafted(h, 8)),
            Err(Error::NotContiguous { .. })
        ));
        // Two tensors on the same bytes.
        let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(matches!(
            parse(&crafted(h, 4)),
            Err(Error::NotContiguous { .. })
        ));
        // Gap between tensors.
        let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
        assert!(matches!(
            parse(&crafted(h, 12)),
            Err(Error::NotContiguous {
                begin: 8,
                expected: 4,
                ..
            })
        ));
        // Not starting at 0.
        let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(matches!(
            parse(&crafted(h, 8)),
            Err(Error::NotContiguous {
                begin: 4,
                expected: 0,
                ..
            })
        ));
        // Bytes after the last tensor.
        let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(matches!(
            parse(&crafted(h, 12)),
            Err(Error::TrailingData { unused: 8 })
        ));
        assert!(matches!(
            parse(&crafted("{}", 1)),
            Err(Error::TrailingData { unused: 1 })
        ));
    }

    #[test]
    fn conversions_check_dtype_and_length() {
        let t = Tensor::i32("t", vec![1], &[3]);
        assert!(matches!(t.to_f32(), Err(Error::WrongDtype { .. })));
        let f = Tensor::f32("f", vec![3], &[1.0]);
        assert!(matches!(
            f.to_f32(),
            Err(Error::DataLength {
                expected: 12,
                found: 4,
                ..
            })
        ));
        assert_eq!(f.numel(), Some(3));
    }

    #[test]
    fn truncations_of_a_valid_file_never_panic() {
        let (tensors, meta) = sample();
        let bytes = to_bytes(&tensors, &meta);
        for cut in 0..bytes.len() {
            assert!(parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Flipping any single header byte gives an error or a valid parse, never a panic.
        let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for i in 0..n {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= x;
                let _ = parse(&b);
            }
        }
    }
}
