//! A small pickle writer for snapshots: protocol 4, opcode for opcode what
//! CPython's C pickler (`_pickle.c`, the one `pickle.dump` uses) writes for the
//! same object with its memo turned off (`Pickler.fast = True`).
//!
//! Why not serde-pickle: it writes every integer outside the signed 32-bit range
//! as a 9-byte `LONG1`, where CPython writes the shortest two's-complement form.
//! The unpickler of PyTorch's memory_viz page reads a `LONG1` of more than 8 bytes
//! as a `BigInt`, which its size arithmetic cannot mix with numbers, so snapshots
//! with GPU-sized blocks rendered blank. It also has no way to write a tuple from a
//! JSON value, where PyTorch's snapshot holds tuples (`segment_pool_id`).
//!
//! What is written, as CPython does:
//! * `PROTO 4`, then the body in `FRAME`s: a frame is closed after the object
//!   whose pickling brings it to 64 KiB or more, and a frame under 4 bytes is
//!   written without its header. A string of 64 KiB or more is written outside
//!   any frame.
//! * Integers: `BININT1` (0..=255), `BININT2` (256..=65535), `BININT` (the rest of
//!   the signed 32-bit range), else `LONG1` with the fewest little-endian
//!   two's-complement bytes (3 GiB = `0xC0000000` takes 5: its top bit would
//!   otherwise read as a sign).
//! * `NEWTRUE` / `NEWFALSE`; `SHORT_BINUNICODE` under 256 bytes, `BINUNICODE`
//!   under 4 GiB, else `BINUNICODE8`.
//! * Lists: `EMPTY_LIST`, then one item and `APPEND`, or batches of up to 1000
//!   items between `MARK` and `APPENDS`.
//! * Dicts: `EMPTY_DICT`, then one pair and `SETITEM`, or batches of up to 1000
//!   pairs between `MARK` and `SETITEMS`, and one more (empty) batch after a full
//!   one.
//! * Tuples: `EMPTY_TUPLE`; `TUPLE1`/`TUPLE2`/`TUPLE3` after 1 to 3 items; else
//!   `MARK`, the items, `TUPLE`.
//! * No `MEMOIZE`/`BINGET`: the snapshot has no shared or recursive objects, so
//!   the memo would only add bytes. Every opcode used is one the memory_viz
//!   page's unpickler reads.

use std::borrow::Cow;

/// A Python object, as far as snapshots need one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PyObject {
    /// `True` / `False`.
    Bool(bool),
    /// `int` (snapshots hold only values of `u64` or `i64` range).
    Int(i128),
    /// `str`.
    Str(Cow<'static, str>),
    /// `list`.
    List(Vec<PyObject>),
    /// `tuple`.
    Tuple(Vec<PyObject>),
    /// `dict` with string keys, in insertion order.
    Dict(Vec<(&'static str, PyObject)>),
}

impl PyObject {
    /// An `int` from any unsigned integer.
    pub(crate) fn int(n: impl Into<u64>) -> PyObject {
        PyObject::Int(i128::from(n.into()))
    }

    /// An `int` from a `usize`.
    pub(crate) fn usize(n: usize) -> PyObject {
        // usize is at most 64 bits on every supported target.
        PyObject::Int(n as i128)
    }

    /// A `str` from static text.
    pub(crate) fn str(s: &'static str) -> PyObject {
        PyObject::Str(Cow::Borrowed(s))
    }

    /// The object as JSON: tuples become arrays; an integer outside the `u64` and
    /// `i64` ranges (none in a snapshot) becomes the nearest `f64`.
    #[cfg(feature = "serde")]
    pub(crate) fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            PyObject::Bool(b) => Value::Bool(*b),
            PyObject::Int(n) => {
                if let Ok(u) = u64::try_from(*n) {
                    Value::from(u)
                } else if let Ok(i) = i64::try_from(*n) {
                    Value::from(i)
                } else {
                    Value::from(*n as f64)
                }
            }
            PyObject::Str(s) => Value::String(s.to_string()),
            PyObject::List(items) | PyObject::Tuple(items) => {
                Value::Array(items.iter().map(PyObject::to_json).collect())
            }
            PyObject::Dict(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

/// Opcodes (names as in CPython's `pickletools`).
mod op {
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINUNICODE8: u8 = 0x8d;
    pub const EMPTY_LIST: u8 = b']';
    pub const APPEND: u8 = b'a';
    pub const APPENDS: u8 = b'e';
    pub const EMPTY_DICT: u8 = b'}';
    pub const SETITEM: u8 = b's';
    pub const SETITEMS: u8 = b'u';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const TUPLE: u8 = b't';
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
}

/// The protocol written.
pub(crate) const PROTOCOL: u8 = 4;
/// `FRAME` opcode and its 8-byte length.
const FRAME_HEADER_SIZE: usize = 9;
/// A frame is closed at the first object boundary at or past this size.
const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// Frames shorter than this are written without a header.
const FRAME_SIZE_MIN: usize = 4;
/// Items per `APPENDS` / `SETITEMS` batch.
const BATCH_SIZE: usize = 1000;

/// The pickle of `obj` (see the [module docs](self)).
pub(crate) fn dumps(obj: &PyObject) -> Vec<u8> {
    let mut w = Writer {
        out: vec![op::PROTO, PROTOCOL],
        frame_start: None,
    };
    w.save(obj);
    w.write(&[op::STOP]);
    w.commit_frame();
    w.out
}

/// `_pickle.c`'s output buffer with framing on.
struct Writer {
    out: Vec<u8>,
    /// Where the open frame's header sits.
    frame_start: Option<usize>,
}

impl Writer {
    fn write(&mut self, bytes: &[u8]) {
        if self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0; FRAME_HEADER_SIZE]);
        }
        self.out.extend_from_slice(bytes);
    }

    fn commit_frame(&mut self) {
        let Some(start) = self.frame_start.take() else {
            return;
        };
        let len = self.out.len() - start - FRAME_HEADER_SIZE;
        if len >= FRAME_SIZE_MIN {
            self.out[start] = op::FRAME;
            self.out[start + 1..start + FRAME_HEADER_SIZE]
                .copy_from_slice(&(len as u64).to_le_bytes());
        } else {
            self.out.drain(start..start + FRAME_HEADER_SIZE);
        }
    }

    /// After each object: close the frame once it reached the target size.
    fn object_boundary(&mut self) {
        if let Some(start) = self.frame_start {
            if self.out.len() - start - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET {
                self.commit_frame();
            }
        }
    }

    fn save(&mut self, obj: &PyObject) {
        match obj {
            PyObject::Bool(true) => self.write(&[op::NEWTRUE]),
            PyObject::Bool(false) => self.write(&[op::NEWFALSE]),
            PyObject::Int(n) => self.save_int(*n),
            PyObject::Str(s) => self.save_str(s),
            PyObject::List(items) => {
                self.write(&[op::EMPTY_LIST]);
                if let [item] = items.as_slice() {
                    self.save(item);
                    self.write(&[op::APPEND]);
                } else if !items.is_empty() {
                    for batch in items.chunks(BATCH_SIZE) {
                        self.write(&[op::MARK]);
                        for item in batch {
                            self.save(item);
                        }
                        self.write(&[op::APPENDS]);
                    }
                }
            }
            PyObject::Dict(pairs) => {
                self.write(&[op::EMPTY_DICT]);
                if let [(k, v)] = pairs.as_slice() {
                    self.save_str(k);
                    self.save(v);
                    self.write(&[op::SETITEM]);
                } else if !pairs.is_empty() {
                    let mut rest = pairs.as_slice();
                    loop {
                        let (batch, tail) = rest.split_at(rest.len().min(BATCH_SIZE));
                        self.write(&[op::MARK]);
                        for (k, v) in batch {
                            self.save_str(k);
                            self.save(v);
                        }
                        self.write(&[op::SETITEMS]);
                        // CPython stops after a batch that is not full, so a full
                        // last batch is followed by an empty one.
                        if batch.len() < BATCH_SIZE {
                            break;
                        }
                        rest = tail;
                    }
                }
            }
            PyObject::Tuple(items) => match items.len() {
                0 => self.write(&[op::EMPTY_TUPLE]),
                n @ 1..=3 => {
                    for item in items {
                        self.save(item);
                    }
                    self.write(&[[op::TUPLE1, op::TUPLE2, op::TUPLE3][n - 1]]);
                }
                _ => {
                    self.write(&[op::MARK]);
                    for item in items {
                        self.save(item);
                    }
                    self.write(&[op::TUPLE]);
                }
            },
        }
        self.object_boundary();
    }

    fn save_int(&mut self, n: i128) {
        if let Ok(b) = u8::try_from(n) {
            self.write(&[op::BININT1, b]);
        } else if let Ok(h) = u16::try_from(n) {
            let [lo, hi] = h.to_le_bytes();
            self.write(&[op::BININT2, lo, hi]);
        } else if let Ok(i) = i32::try_from(n) {
            let mut buf = [op::BININT; 5];
            buf[1..].copy_from_slice(&i.to_le_bytes());
            self.write(&buf);
        } else {
            let bytes = n.to_le_bytes();
            let len = long_len(&bytes);
            let mut buf = Vec::with_capacity(2 + len);
            // len <= 16: an i128 never needs LONG4.
            buf.extend_from_slice(&[op::LONG1, len as u8]);
            buf.extend_from_slice(&bytes[..len]);
            self.write(&buf);
        }
    }

    fn save_str(&mut self, s: &str) {
        let data = s.as_bytes();
        let len = data.len();
        let mut header = Vec::with_capacity(9);
        if let Ok(short) = u8::try_from(len) {
            header.extend_from_slice(&[op::SHORT_BINUNICODE, short]);
        } else if let Ok(mid) = u32::try_from(len) {
            header.push(op::BINUNICODE);
            header.extend_from_slice(&mid.to_le_bytes());
        } else {
            header.push(op::BINUNICODE8);
            header.extend_from_slice(&(len as u64).to_le_bytes());
        }
        if len >= FRAME_SIZE_TARGET {
            // Large payloads go outside frames: close the open one, write
            // header and data unframed.
            self.commit_frame();
            self.out.extend_from_slice(&header);
            self.out.extend_from_slice(data);
        } else {
            header.extend_from_slice(data);
            self.write(&header);
        }
    }
}

/// The fewest little-endian two's-complement bytes that hold the integer whose
/// full little-endian bytes are `bytes`: drop high bytes that only repeat the
/// sign bit of the byte below them.
fn long_len(bytes: &[u8]) -> usize {
    let mut len = bytes.len();
    while len > 1 {
        let (top, below) = (bytes[len - 1], bytes[len - 2]);
        let redundant = (top == 0x00 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0);
        if !redundant {
            break;
        }
        len -= 1;
    }
    len
}

#[cfg(test)]
pub(crate) mod walker {
    //! An opcode walker for the tests, independent of the writer: it decodes a
    //! pickle into JSON (tuples marked), checks that frames have the length they
    //! announce, and rejects any integer not in the shortest form CPython uses.

    use serde_json::{json, Value};

    /// One opcode: its byte, where it starts, and the integer it pushes, if any.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Op {
        pub code: u8,
        pub pos: usize,
        pub int: Option<i128>,
    }

    /// What the walker saw.
    #[derive(Debug)]
    pub(crate) struct Walk {
        pub protocol: u8,
        pub ops: Vec<Op>,
        /// `(position, length)` of each `FRAME`.
        pub frames: Vec<(usize, usize)>,
        /// The object; a tuple reads as `{"__tuple__": [...]}`.
        pub value: Value,
    }

    fn take<'a>(data: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], String> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= data.len())
            .ok_or(format!("truncated at {pos}"))?;
        let s = &data[*pos..end];
        *pos = end;
        Ok(s)
    }

    fn le(bytes: &[u8]) -> u64 {
        bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
    }

    fn as_json_int(n: i128) -> Value {
        match (u64::try_from(n), i64::try_from(n)) {
            (Ok(u), _) => json!(u),
            (_, Ok(i)) => json!(i),
            _ => json!(n.to_string()),
        }
    }

    /// Walks `data`; `Err` names the first problem and where it is.
    pub(crate) fn walk(data: &[u8]) -> Result<Walk, String> {
        let mut pos = 0;
        let mut stack: Vec<Value> = Vec::new();
        let mut marks: Vec<usize> = Vec::new();
        let mut ops = Vec::new();
        let mut frames = Vec::new();
        let mut frame_end: Option<usize> = None;
        let mut protocol = 0;
        let pop = |stack: &mut Vec<Value>| stack.pop().ok_or("stack underflow".to_owned());
        loop {
            if frame_end == Some(pos) {
                frame_end = None;
            }
            let at = pos;
            let code = take(data, &mut pos, 1)?[0];
            let mut int = None;
            match code {
                0x80 => protocol = take(data, &mut pos, 1)?[0],
                0x95 => {
                    if frame_end.is_some() {
                        return Err(format!("FRAME at {at} inside a frame"));
                    }
                    let len = le(take(data, &mut pos, 8)?) as usize;
                    frames.push((at, len));
                    frame_end = Some(pos + len);
                }
                b'.' => {
                    ops.push(Op { code, pos: at, int });
                    if pos != data.len() {
                        return Err(format!("{} bytes after STOP", data.len() - pos));
                    }
                    if frame_end.is_some_and(|e| e != pos) {
                        return Err("the last frame does not end at STOP".into());
                    }
                    let value = pop(&mut stack)?;
                    return Ok(Walk {
                        protocol,
                        ops,
                        frames,
                        value,
                    });
                }
                b'(' => marks.push(stack.len()),
                0x88 => stack.push(json!(true)),
                0x89 => stack.push(json!(false)),
                b'K' => int = Some(i128::from(take(data, &mut pos, 1)?[0])),
                b'M' => int = Some(i128::from(le(take(data, &mut pos, 2)?))),
                b'J' => {
                    let b = take(data, &mut pos, 4)?;
                    int = Some(i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                }
                0x8a => {
                    let n = usize::from(take(data, &mut pos, 1)?[0]);
                    let b = take(data, &mut pos, n)?;
                    if n == 0 || n > 16 {
                        return Err(format!("LONG1 of {n} bytes at {at}"));
                    }
                    let mut full = if b[n - 1] & 0x80 != 0 {
                        [0xff; 16]
                    } else {
                        [0; 16]
                    };
                    full[..n].copy_from_slice(b);
                    int = Some(i128::from_le_bytes(full));
                }
                0x8c | b'X' | 0x8d => {
                    let width = match code {
                        0x8c => 1,
                        b'X' => 4,
                        _ => 8,
                    };
                    let n = le(take(data, &mut pos, width)?) as usize;
                    let s = std::str::from_utf8(take(data, &mut pos, n)?)
                        .map_err(|e| format!("string at {at}: {e}"))?;
                    stack.push(json!(s));
                }
                b']' => stack.push(json!([])),
                b'}' => stack.push(json!({})),
                b')' => stack.push(json!({ "__tuple__": [] })),
                0x85..=0x87 => {
                    let n = usize::from(code - 0x84);
                    if stack.len() < n {
                        return Err(format!("TUPLE{n} at {at}: stack underflow"));
                    }
                    let items = stack.split_off(stack.len() - n);
                    stack.push(json!({ "__tuple__": items }));
                }
                b't' | b'e' | b'u' => {
                    let mark = marks.pop().ok_or(format!("no MARK for {at}"))?;
                    let items = stack.split_off(mark);
                    if code == b't' {
                        stack.push(json!({ "__tuple__": items }));
                    } else {
                        let target = stack.last_mut().ok_or(format!("no target at {at}"))?;
                        if code == b'e' {
                            let list = target.as_array_mut().ok_or("APPENDS to a non-list")?;
                            list.extend(items);
                        } else {
                            let map = target.as_object_mut().ok_or("SETITEMS to a non-dict")?;
                            if items.len() % 2 != 0 {
                                return Err(format!("odd SETITEMS at {at}"));
                            }
                            for pair in items.chunks(2) {
                                let key = pair[0].as_str().ok_or("non-string key")?;
                                map.insert(key.to_owned(), pair[1].clone());
                            }
                        }
                    }
                }
                b'a' => {
                    let v = pop(&mut stack)?;
                    let list = stack
                        .last_mut()
                        .and_then(Value::as_array_mut)
                        .ok_or("APPEND to a non-list")?;
                    list.push(v);
                }
                b's' => {
                    let v = pop(&mut stack)?;
                    let k = pop(&mut stack)?;
                    let key = k.as_str().ok_or("non-string key")?.to_owned();
                    let map = stack
                        .last_mut()
                        .and_then(Value::as_object_mut)
                        .ok_or("SETITEM to a non-dict")?;
                    map.insert(key, v);
                }
                other => return Err(format!("unexpected opcode {other:#04x} at {at}")),
            }
            if let Some(n) = int {
                let shortest = match n {
                    0..=0xff => b'K',
                    0x100..=0xffff => b'M',
                    _ if i32::try_from(n).is_ok() => b'J',
                    _ => 0x8a,
                };
                if code != shortest {
                    return Err(format!(
                        "integer {n} at {at} written with opcode {code:#04x}, CPython uses \
                         {shortest:#04x}"
                    ));
                }
                if code == 0x8a {
                    // The fewest bytes: the smallest k with -2^(8k-1) <= n < 2^(8k-1).
                    let len = usize::from(data[at + 1]);
                    let fewest = (1..=16usize)
                        .find(|k| {
                            let half = 1i128 << (8 * k - 1).min(126);
                            *k == 16 || (-half..half).contains(&n)
                        })
                        .unwrap_or(16);
                    if len != fewest {
                        return Err(format!(
                            "LONG1 {n} at {at} takes {len} bytes, not the fewest ({fewest})"
                        ));
                    }
                }
                stack.push(as_json_int(n));
            }
            if frame_end.is_some_and(|e| pos > e) {
                return Err(format!("opcode at {at} crosses its frame's end"));
            }
            ops.push(Op { code, pos: at, int });
        }
    }

    /// `v` with the tuple markers replaced by plain arrays (the JSON export's view).
    pub(crate) fn untuple(v: &Value) -> Value {
        match v {
            Value::Object(m) => match m.get("__tuple__") {
                Some(Value::Array(items)) if m.len() == 1 => {
                    Value::Array(items.iter().map(untuple).collect())
                }
                _ => Value::Object(m.iter().map(|(k, v)| (k.clone(), untuple(v))).collect()),
            },
            Value::Array(items) => Value::Array(items.iter().map(untuple).collect()),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::walker::{untuple, walk};
    use super::*;
    use proptest::prelude::*;

    fn int_bytes(n: i128) -> Vec<u8> {
        // PROTO 4, a frame header only when the body is >= 4 bytes, STOP.
        let p = dumps(&PyObject::Int(n));
        let body = if p[2] == 0x95 { &p[11..] } else { &p[2..] };
        body[..body.len() - 1].to_vec()
    }

    /// Encodings printed by CPython 3.11: `pickle.dumps(n, 2)[2:-1].hex()`.
    #[test]
    fn integers_match_cpython() {
        let cases: &[(i128, &str)] = &[
            (0, "4b00"),
            (255, "4bff"),
            (256, "4d0001"),
            (65535, "4dffff"),
            (65536, "4a00000100"),
            (-1, "4affffffff"),
            (-129, "4a7fffffff"),
            (2147483647, "4affffff7f"),
            (-2147483648, "4a00000080"),
            (2147483648, "8a050000008000"),
            (-2147483649, "8a05ffffff7fff"),
            (3 << 30, "8a05000000c000"),
            (4 << 30, "8a050000000001"),
            (0x7f00_0000_0000, "8a0600000000007f"),
            (0x8000_0000_0000, "8a0700000000008000"),
            (i128::from(u64::MAX), "8a09ffffffffffffffff00"),
            (i128::from(i64::MIN), "8a080000000000000080"),
        ];
        for &(n, want) in cases {
            let got: String = int_bytes(n).iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, want, "{n}");
        }
    }

    #[test]
    fn small_objects_match_cpython() {
        // pickle.Pickler(f, 4) with fast = True, dumping
        // {"a": (0, 0), "b": [1], "c": [], "d": 3 << 30, "e": 2**31 - 1, "i": True}.
        let obj = PyObject::Dict(vec![
            (
                "a",
                PyObject::Tuple(vec![PyObject::Int(0), PyObject::Int(0)]),
            ),
            ("b", PyObject::List(vec![PyObject::Int(1)])),
            ("c", PyObject::List(vec![])),
            ("d", PyObject::Int(3 << 30)),
            ("e", PyObject::Int((1 << 31) - 1)),
            ("i", PyObject::Bool(true)),
        ]);
        let want = "8004952d000000000000007d288c01614b004b00868c01625d4b01618c01635d8c01648a\
                    05000000c0008c01654affffff7f8c016988752e";
        let got: String = dumps(&obj).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
        // A body under 4 bytes has no frame: pickle.dumps(True, 4).
        assert_eq!(dumps(&PyObject::Bool(true)), [0x80, 4, 0x88, b'.']);
    }

    #[test]
    fn batches_of_a_thousand() {
        let count = |p: &[u8], code: u8| {
            walk(p)
                .expect("valid")
                .ops
                .iter()
                .filter(|o| o.code == code)
                .count()
        };
        let list = |n: usize| dumps(&PyObject::List((0..n).map(PyObject::usize).collect()));
        assert_eq!((count(&list(1000), b'('), count(&list(1000), b'e')), (1, 1));
        assert_eq!((count(&list(1001), b'('), count(&list(1001), b'e')), (2, 2));
        assert_eq!(count(&list(1001), b'a'), 0);
        let dict = |n: usize| dumps(&PyObject::Dict(vec![("k", PyObject::Int(1)); n]));
        // CPython: a full batch is followed by an empty MARK ... SETITEMS.
        assert_eq!((count(&dict(1000), b'('), count(&dict(1000), b'u')), (2, 2));
        assert_eq!((count(&dict(999), b'('), count(&dict(999), b'u')), (1, 1));
        assert_eq!(count(&dict(1), b's'), 1);
    }

    /// Frame positions and lengths printed by CPython 3.11 for the same objects
    /// (`pickletools.genops` over a `Pickler(f, 4)` with `fast = True`).
    #[test]
    fn frames_match_cpython() {
        let big = PyObject::List(
            (0..40_000u64)
                .map(|i| PyObject::Tuple(vec![PyObject::int(i << 33), PyObject::str("x")]))
                .collect(),
        );
        let w = walk(&dumps(&big)).expect("valid");
        assert_eq!(
            w.frames,
            [
                (2, 65543),
                (65554, 65542),
                (131105, 65536),
                (196650, 65543),
                (262202, 65543),
                (327754, 65543),
                (393306, 65543),
                (458858, 44836)
            ]
        );
        // A string of 64 KiB is written outside any frame; what follows it is
        // too short for a frame of its own.
        let long = "y".repeat(FRAME_SIZE_TARGET);
        let p = dumps(&PyObject::List(vec![
            PyObject::int(7u8),
            PyObject::Str(long.clone().into()),
        ]));
        let w = walk(&p).expect("valid");
        assert_eq!(w.value, serde_json::json!([7, long]));
        assert_eq!(w.frames, [(2, 4)]);
        assert_eq!(p.len(), 65558);
    }

    fn object_strategy() -> impl Strategy<Value = PyObject> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(PyObject::Bool),
            any::<i64>().prop_map(|n| PyObject::Int(n.into())),
            any::<u64>().prop_map(PyObject::int),
            (0u32..64).prop_map(|s| PyObject::int(1u64 << s)),
            "\\PC{0,8}".prop_map(|s| PyObject::Str(s.into())),
        ];
        leaf.prop_recursive(3, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(PyObject::List),
                proptest::collection::vec(inner.clone(), 0..6).prop_map(PyObject::Tuple),
                proptest::collection::vec(
                    (
                        proptest::sample::select(&["a", "b", "size", "é"][..]),
                        inner
                    ),
                    0..6
                )
                .prop_map(PyObject::Dict),
            ]
        })
    }

    fn tuples_marked(o: &PyObject) -> serde_json::Value {
        use serde_json::{json, Value};
        match o {
            PyObject::Tuple(items) => {
                json!({ "__tuple__": items.iter().map(tuples_marked).collect::<Vec<_>>() })
            }
            PyObject::List(items) => Value::Array(items.iter().map(tuples_marked).collect()),
            PyObject::Dict(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), tuples_marked(v)))
                    .collect(),
            ),
            other => other.to_json(),
        }
    }

    proptest! {
        /// Any object reads back the same, every integer in its shortest form, and
        /// serde-pickle (another reader) agrees.
        #[test]
        fn round_trips_through_the_walker(obj in object_strategy()) {
            let p = dumps(&obj);
            let w = walk(&p);
            prop_assert!(w.is_ok(), "{:?}", w.err());
            if let Ok(w) = w {
                prop_assert_eq!(w.protocol, PROTOCOL);
                prop_assert_eq!(&w.value, &tuples_marked(&obj));
                prop_assert_eq!(untuple(&w.value), obj.to_json());
            }
            let other: Result<serde_pickle::Value, _> =
                serde_pickle::value_from_slice(&p, Default::default());
            prop_assert!(other.is_ok(), "serde-pickle: {:?}", other.err());
        }
    }
}
