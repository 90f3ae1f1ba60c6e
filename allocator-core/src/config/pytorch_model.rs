//! A model of PyTorch's settings parser, for the tests: what PyTorch does with a
//! string, and which of remat's documented deviations (module docs, "Deviations
//! from PyTorch") the string runs into.
//!
//! It is written index by index after the C++, not after remat's parser, so
//! PyTorch's quirks carry over:
//! * `ConfigTokenizer` (c10/core/AllocatorConfig.h): walks the bytes, makes `,` `:`
//!   `[` `]` tokens, drops bytes for which C's `isspace` holds;
//! * `checkToken` only checks the index: a wrong separator is ignored (recorded
//!   here as [`Deviation::Separator`]);
//! * `toSizeT` / `toDouble` (`size_t` / `double` here) are `std::stoull` /
//!   `std::stod`: the longest numeric prefix, a minus sign wraps, trailing
//!   characters are ignored (recorded as [`Deviation::Number`]); `out_of_range`
//!   (ERANGE) and "no conversion" throw;
//! * the passes: `large_segment_size_mb` first (spec §5.1), then
//!   `AcceleratorAllocatorConfig::parseArgs` (common keys, others skipped with
//!   `skipKey`), then the CUDA hook `CUDAAllocatorConfig::parseArgs` (CUDA keys,
//!   the keys of spec §5.2 marked newest, and "Unrecognized key" for the rest).
//!
//! Not modelled: hexadecimal floats (`std::stod` reads `0x1p-1`; here only the
//! `0` before the `x` is read, and remat rejects them either way).

use std::collections::BTreeSet;

const MIB: u64 = 1 << 20;

/// A reason remat rejects a string PyTorch accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Deviation {
    /// A wrong token where PyTorch's `checkToken` expects `:` or `,`.
    Separator,
    /// A number with trailing characters, or a negative one, that `stoull` /
    /// `stod` read anyway.
    Number,
    /// A size in MiB whose byte count does not fit in 64 bits.
    SizeOverflow,
    /// `backend:cudaMallocAsync`.
    Backend,
}

/// What PyTorch ends up with after accepting a string from the defaults.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Parsed {
    /// Bytes; `u64::MAX` = unlimited.
    pub max_split_size: u64,
    pub roundup: [u64; 16],
    pub gc_threshold: f64,
    pub memory_fraction: f64,
    pub expandable_segments: bool,
    /// The deviations met on the way: remat rejects the string when any is.
    pub deviations: BTreeSet<Deviation>,
}

/// The keys `AcceleratorAllocatorConfig` parses (its `keys_` set).
const ACCELERATOR_KEYS: &[&str] = &[
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
];

/// C's `isspace` in the C locale, applied to bytes.
fn c_isspace(b: u8) -> bool {
    b" \t\n\x0b\x0c\r".contains(&b)
}

/// `ConfigTokenizer`.
fn tokenize(s: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut buffer = Vec::new();
    for &b in s.as_bytes() {
        if b",:[]".contains(&b) {
            if !buffer.is_empty() {
                tokens.push(std::mem::take(&mut buffer));
            }
            tokens.push(vec![b]);
        } else if !c_isspace(b) {
            buffer.push(b);
        }
    }
    if !buffer.is_empty() {
        tokens.push(buffer);
    }
    // Tokens are split at ASCII bytes only, so each is still UTF-8.
    tokens
        .into_iter()
        .map(|t| String::from_utf8_lossy(&t).into_owned())
        .collect()
}

/// `std::stoull(token)`: the value and whether the whole token, without a minus
/// sign, was the number.
fn stoull(token: &str) -> Result<(u64, bool), String> {
    let bytes = token.as_bytes();
    let mut i = 0;
    let negative = match bytes.first() {
        Some(b'-') => {
            i = 1;
            true
        }
        Some(b'+') => {
            i = 1;
            false
        }
        _ => false,
    };
    let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return Err(format!("stoull: no conversion of '{token}'"));
    }
    let magnitude = token[i..i + digits]
        .parse::<u64>()
        .map_err(|_| format!("stoull: '{token}' out of range"))?;
    let value = if negative {
        magnitude.wrapping_neg()
    } else {
        magnitude
    };
    Ok((value, !negative && i + digits == bytes.len()))
}

/// `std::stod(token)`: the longest prefix that is a decimal float, `inf`,
/// `infinity` or `nan` (Rust's float grammar is that part of `strtod`'s), with
/// glibc's ERANGE: a finite overflow, or a nonzero value that rounds to zero or
/// to a subnormal (measured with glibc 2.36's `strtod`).
fn stod(token: &str) -> Result<(f64, bool), String> {
    let prefix = (1..=token.len())
        .rev()
        .filter(|&n| token.is_char_boundary(n))
        .map(|n| &token[..n])
        .find(|p| p.parse::<f64>().is_ok())
        .ok_or_else(|| format!("stod: no conversion of '{token}'"))?;
    let value: f64 = prefix
        .parse()
        .map_err(|_| format!("stod: no conversion of '{token}'"))?;
    let lower = prefix.to_ascii_lowercase();
    let named = lower.contains("inf") || lower.contains("nan");
    let mantissa = lower.split('e').next().unwrap_or_default();
    let nonzero_digits = mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b));
    let erange = (value.is_infinite() && !named)
        || (value != 0.0 && !value.is_normal() && value.is_finite())
        || (value == 0.0 && nonzero_digits);
    if erange {
        return Err(format!("stod: '{token}' out of range"));
    }
    Ok((value, prefix.len() == token.len()))
}

struct Model {
    t: Vec<String>,
    deviations: BTreeSet<Deviation>,
    large_segment_mb: u64,
    parsed: Parsed,
}

impl Model {
    fn at(&self, i: usize) -> Result<&str, String> {
        self.t
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("Index {i} out of bounds in ConfigTokenizer"))
    }

    /// `checkToken`: asserts the index, ignores the comparison.
    fn check_token(&mut self, i: usize, token: &str) -> Result<(), String> {
        if self.at(i)? != token {
            self.deviations.insert(Deviation::Separator);
        }
        Ok(())
    }

    fn size_t(&mut self, i: usize) -> Result<u64, String> {
        let (value, whole) = stoull(self.at(i)?)?;
        if !whole {
            self.deviations.insert(Deviation::Number);
        }
        Ok(value)
    }

    fn double(&mut self, i: usize) -> Result<f64, String> {
        let (value, whole) = stod(self.at(i)?)?;
        if !whole {
            self.deviations.insert(Deviation::Number);
        }
        Ok(value)
    }

    fn boolean(&self, i: usize) -> Result<bool, String> {
        match self.at(i)? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(format!("Expected 'True' or 'False' but got '{other}'")),
        }
    }

    /// `skipKey`: returns the index of the value token, or of the list's `]`.
    fn skip_key(&mut self, mut i: usize) -> Result<usize, String> {
        i += 1;
        self.check_token(i, ":")?;
        i += 1;
        if self.at(i)? != "[" {
            return Ok(i);
        }
        loop {
            i += 1;
            match self.t.get(i) {
                None => return Err("Expected closing bracket ']'".into()),
                Some(t) if t == "]" => return Ok(i),
                Some(_) => {}
            }
        }
    }

    /// A size in MiB that remat multiplies into bytes.
    fn size_mb(&mut self, i: usize) -> Result<u64, String> {
        let mb = self.size_t(i)?;
        if mb.checked_mul(MIB).is_none() {
            self.deviations.insert(Deviation::SizeOverflow);
        }
        Ok(mb)
    }

    /// The loop every pass shares: one key at a time, then `checkToken(",")`.
    fn pass(
        &mut self,
        mut key_fn: impl FnMut(&mut Self, &str, usize) -> Result<usize, String>,
    ) -> Result<(), String> {
        let mut i = 0;
        while i < self.t.len() {
            let key = self.t[i].clone();
            i = key_fn(self, &key, i)?;
            if i + 1 < self.t.len() {
                i += 1;
                self.check_token(i, ",")?;
            }
            i += 1;
        }
        Ok(())
    }

    fn large_segment_pass(&mut self, key: &str, mut i: usize) -> Result<usize, String> {
        if key != "large_segment_size_mb" {
            return self.skip_key(i);
        }
        i += 1;
        self.check_token(i, ":")?;
        i += 1;
        let mb = self.size_mb(i)?;
        if mb <= 10 {
            return Err("large_segment_size_mb must be > 10 MB".into());
        }
        self.large_segment_mb = mb;
        Ok(i)
    }

    fn accelerator_pass(&mut self, key: &str, mut i: usize) -> Result<usize, String> {
        match key {
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                let mb = self.size_t(i)?;
                if mb < self.large_segment_mb {
                    return Err(format!("{key} too small"));
                }
                if key == "max_split_size_mb" {
                    self.parsed.max_split_size = mb.min(u64::MAX / MIB) * MIB;
                }
            }
            "garbage_collection_threshold" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                let v = self.double(i)?;
                if !(v > 0.0 && v < 1.0) {
                    return Err("garbage_collect_threshold is invalid".into());
                }
                self.parsed.gc_threshold = v;
            }
            "roundup_power2_divisions" => i = self.roundup(i)?,
            "expandable_segments" | "pinned_use_background_threads" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                let b = self.boolean(i)?;
                if key == "expandable_segments" {
                    self.parsed.expandable_segments = b;
                }
            }
            _ => i = self.skip_key(i)?,
        }
        Ok(i)
    }

    /// `parseRoundUpPower2Divisions`, newest.
    fn roundup(&mut self, mut i: usize) -> Result<usize, String> {
        self.parsed.roundup = [0; 16];
        i += 1;
        self.check_token(i, ":")?;
        i += 1;
        if self.at(i)? == "[" {
            let mut first = true;
            let mut last_index = 0usize;
            loop {
                i += 1;
                if i >= self.t.len() || self.t[i] == "]" {
                    break;
                }
                let value_index = i;
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                let value = self.size_t(i)?;
                if !(value == 0 || value.is_power_of_two()) {
                    return Err("the divisions has to be power of 2 or 0".into());
                }
                if self.t[value_index] == ">" {
                    for slot in self.parsed.roundup.iter_mut().skip(last_index + 1) {
                        *slot = value;
                    }
                } else {
                    let boundary = self.size_t(value_index)?;
                    if !boundary.is_power_of_two() {
                        return Err("the intervals have to be power of 2".into());
                    }
                    let index = (63 - boundary.leading_zeros() as usize).min(15);
                    if first {
                        for slot in self.parsed.roundup.iter_mut().take(index) {
                            *slot = value;
                        }
                        first = false;
                    }
                    self.parsed.roundup[index] = value;
                    last_index = index;
                }
                if self.at(i + 1)? != "]" {
                    i += 1;
                    self.check_token(i, ",")?;
                }
            }
            if i >= self.t.len() {
                return Err("Expected closing bracket ']'".into());
            }
        } else {
            let value = self.size_t(i)?;
            if !value.is_power_of_two() {
                return Err("the divisions has to be power of 2".into());
            }
            self.parsed.roundup = [value; 16];
        }
        Ok(i)
    }

    fn cuda_pass(&mut self, key: &str, mut i: usize) -> Result<usize, String> {
        match key {
            "backend" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                match self.at(i)? {
                    "native" => {}
                    "cudaMallocAsync" => {
                        self.deviations.insert(Deviation::Backend);
                    }
                    other => return Err(format!("Unknown allocator backend '{other}'")),
                }
            }
            "release_lock_on_cudamalloc"
            | "release_lock_on_hipmalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_use_hip_host_register"
            | "graph_capture_record_stream_reuse"
            | "pinned_free_catch_all"
            | "throw_on_cudamalloc_oom" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                self.boolean(i)?;
            }
            "pinned_num_register_threads" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                let n = self.size_t(i)?;
                if !n.is_power_of_two() || n > 128 {
                    return Err("Number of register threads".into());
                }
            }
            "pinned_reserve_segment_size_mb" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                if self.size_mb(i)? == 0 {
                    return Err("Pinned reserve segment size has to be greater than 0".into());
                }
            }
            "per_process_memory_fraction" => {
                i += 1;
                self.check_token(i, ":")?;
                i += 1;
                let v = self.double(i)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err("per_process_memory_fraction is invalid".into());
                }
                self.parsed.memory_fraction = v;
            }
            // Parsed in the first pass.
            "large_segment_size_mb" => i = self.skip_key(i)?,
            _ if ACCELERATOR_KEYS.contains(&key) => i = self.skip_key(i)?,
            _ => {
                return Err(format!(
                    "Unrecognized key '{key}' in CUDA allocator config."
                ))
            }
        }
        Ok(i)
    }
}

/// What PyTorch does with `s`: `Err` with the reason it throws, or what it sets
/// and the deviations met.
pub(super) fn parse(s: &str) -> Result<Parsed, String> {
    let mut m = Model {
        t: tokenize(s),
        deviations: BTreeSet::new(),
        large_segment_mb: 20,
        parsed: Parsed {
            max_split_size: u64::MAX,
            roundup: [0; 16],
            gc_threshold: 0.0,
            memory_fraction: 1.0,
            expandable_segments: false,
            deviations: BTreeSet::new(),
        },
    };
    m.pass(Model::large_segment_pass)?;
    m.pass(Model::accelerator_pass)?;
    m.pass(Model::cuda_pass)?;
    m.parsed.deviations = m.deviations;
    Ok(m.parsed)
}
