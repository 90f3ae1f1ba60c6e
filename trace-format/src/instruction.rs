//! Typed instructions and the line-level JSON parser.

use serde_json::{Map, Value};

use crate::TraceError;

/// An `ANNOTATE` marker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Annotation {
    /// `START`: the measured iteration begins; everything before it is warm-up.
    Start,
    /// `BACKWARD`: the backward pass begins.
    Backward,
    /// Any other annotation text, kept verbatim.
    Other(String),
}

impl Annotation {
    /// The annotation as it is written in a trace (`"START"`, `"BACKWARD"`, …).
    pub fn as_str(&self) -> &str {
        match self {
            Annotation::Start => "START",
            Annotation::Backward => "BACKWARD",
            Annotation::Other(s) => s,
        }
    }

    fn from_str(s: &str) -> Annotation {
        match s {
            "START" => Annotation::Start,
            "BACKWARD" => Annotation::Backward,
            other => Annotation::Other(other.to_string()),
        }
    }
}

/// One line of a trace.
///
/// Names are the trace's own strings (`"x7690"`); a name refers to a tensor, and
/// several names may refer to the same tensor (see [`Instruction::Copy`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Instruction {
    /// `CONSTANT {NAME}`: a parameter or input (pinned, never evictable). Its size
    /// follows in a [`Instruction::Memory`] for the same name.
    Constant {
        /// The new name.
        name: String,
    },
    /// `MEMORY {NAME, MEMORY}`: the size in bytes of the tensor that the preceding
    /// `CONSTANT` or `CALL` result `name` introduced.
    Memory {
        /// The name whose size this is.
        name: String,
        /// Size in bytes.
        bytes: u64,
    },
    /// `CALL {NAME, ARGS, RESULT, TIME}`: an operator. Each result is followed by a
    /// `MEMORY` and an `ALIAS` for it.
    Call {
        /// The operator (`"convolution"`, `"add"`, …) — the trace's `NAME` key.
        op: String,
        /// Argument names (must be bound).
        args: Vec<String>,
        /// Result names (bound once their `MEMORY` and `ALIAS` arrive).
        results: Vec<String>,
        /// Measured cost in nanoseconds.
        time_ns: u64,
    },
    /// `ALIAS {NAME, ALIAS}`: `-1` means the result `name` has a fresh storage;
    /// `k >= 0` means it is a view of the storage of `ARGS[k]` of its `CALL`.
    Alias {
        /// The result name.
        name: String,
        /// `-1` (fresh storage) or the index of the argument it views.
        alias: i64,
    },
    /// `MUTATE {NAME, ARGS, MUTATE, TIME}`: an in-place operator on the arguments
    /// whose indices are listed in `mutate` (no allocation, no release).
    Mutate {
        /// The operator (`"add_"`, …) — the trace's `NAME` key.
        name: String,
        /// Argument names (must be bound).
        args: Vec<String>,
        /// Indices into `args` of the arguments written in place.
        mutate: Vec<usize>,
        /// Measured cost in nanoseconds.
        time_ns: u64,
    },
    /// `COPY {DST, SRC}`: `dst` becomes a new name for `src`'s tensor (one more reference).
    Copy {
        /// The new name.
        dst: String,
        /// An existing name.
        src: String,
    },
    /// `COPY_FROM {DST, SRC}`: the existing name `dst` now names `src`'s tensor; its
    /// old tensor loses a reference.
    CopyFrom {
        /// An existing name, rebound.
        dst: String,
        /// An existing name.
        src: String,
    },
    /// `RELEASE {NAME}`: the name is dropped; its tensor loses a reference.
    Release {
        /// The name dropped.
        name: String,
    },
    /// `ANNOTATE {ANNOTATION}`: a marker.
    Annotate(Annotation),
}

impl Instruction {
    /// The `INSTRUCTION` key of this instruction (`"CALL"`, `"COPY_FROM"`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Instruction::Constant { .. } => "CONSTANT",
            Instruction::Memory { .. } => "MEMORY",
            Instruction::Call { .. } => "CALL",
            Instruction::Alias { .. } => "ALIAS",
            Instruction::Mutate { .. } => "MUTATE",
            Instruction::Copy { .. } => "COPY",
            Instruction::CopyFrom { .. } => "COPY_FROM",
            Instruction::Release { .. } => "RELEASE",
            Instruction::Annotate(_) => "ANNOTATE",
        }
    }

    /// This instruction as one line of the trace format (a JSON object with the
    /// numbers written as strings, as the DTR logger writes them).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("INSTRUCTION".into(), self.kind().into());
        let s = |v: &str| Value::String(v.to_string());
        let list = |v: &[String]| Value::Array(v.iter().map(|x| s(x)).collect());
        match self {
            Instruction::Constant { name } | Instruction::Release { name } => {
                m.insert("NAME".into(), s(name));
            }
            Instruction::Memory { name, bytes } => {
                m.insert("NAME".into(), s(name));
                m.insert("MEMORY".into(), Value::String(bytes.to_string()));
            }
            Instruction::Call {
                op,
                args,
                results,
                time_ns,
            } => {
                m.insert("NAME".into(), s(op));
                m.insert("ARGS".into(), list(args));
                m.insert("RESULT".into(), list(results));
                m.insert("TIME".into(), Value::String(time_ns.to_string()));
            }
            Instruction::Alias { name, alias } => {
                m.insert("NAME".into(), s(name));
                m.insert("ALIAS".into(), Value::String(alias.to_string()));
            }
            Instruction::Mutate {
                name,
                args,
                mutate,
                time_ns,
            } => {
                m.insert("NAME".into(), s(name));
                m.insert("ARGS".into(), list(args));
                m.insert(
                    "MUTATE".into(),
                    Value::Array(mutate.iter().map(|&i| Value::from(i as u64)).collect()),
                );
                m.insert("TIME".into(), Value::String(time_ns.to_string()));
            }
            Instruction::Copy { dst, src } | Instruction::CopyFrom { dst, src } => {
                m.insert("DST".into(), s(dst));
                m.insert("SRC".into(), s(src));
            }
            Instruction::Annotate(a) => {
                m.insert("ANNOTATION".into(), s(a.as_str()));
            }
        }
        Value::Object(m)
    }

    /// Parses one non-blank line of a trace. `line` is the 1-based line number used
    /// in errors.
    pub fn parse_line(line: usize, text: &str) -> Result<Instruction, TraceError> {
        let value: Value = serde_json::from_str(text).map_err(|e| TraceError::Json {
            line,
            message: e.to_string(),
        })?;
        let Value::Object(obj) = value else {
            return Err(TraceError::Json {
                line,
                message: "expected a JSON object".into(),
            });
        };
        let kind = match obj.get("INSTRUCTION") {
            None => {
                return Err(TraceError::MissingKey {
                    line,
                    instruction: "<line>".into(),
                    key: "INSTRUCTION",
                })
            }
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(TraceError::BadValue {
                    line,
                    instruction: "<line>".into(),
                    key: "INSTRUCTION",
                    expected: "a string",
                    found: other.to_string(),
                })
            }
        };
        let f = Fields {
            line,
            kind,
            obj: &obj,
        };
        Ok(match kind {
            "CONSTANT" => Instruction::Constant {
                name: f.str("NAME")?,
            },
            "MEMORY" => Instruction::Memory {
                name: f.str("NAME")?,
                bytes: f.u64("MEMORY")?,
            },
            "CALL" => Instruction::Call {
                op: f.str("NAME")?,
                args: f.names("ARGS")?,
                results: f.names("RESULT")?,
                time_ns: f.u64("TIME")?,
            },
            "ALIAS" => Instruction::Alias {
                name: f.str("NAME")?,
                alias: f.i64("ALIAS")?,
            },
            "MUTATE" => Instruction::Mutate {
                name: f.str("NAME")?,
                args: f.names("ARGS")?,
                mutate: f.indices("MUTATE")?,
                time_ns: f.u64("TIME")?,
            },
            "COPY" => Instruction::Copy {
                dst: f.str("DST")?,
                src: f.str("SRC")?,
            },
            "COPY_FROM" => Instruction::CopyFrom {
                dst: f.str("DST")?,
                src: f.str("SRC")?,
            },
            "RELEASE" => Instruction::Release {
                name: f.str("NAME")?,
            },
            "ANNOTATE" => Instruction::Annotate(Annotation::from_str(&f.str("ANNOTATION")?)),
            other => {
                return Err(TraceError::UnknownInstruction {
                    line,
                    instruction: other.to_string(),
                })
            }
        })
    }
}

/// Typed access to the keys of one line, with errors that name the line.
struct Fields<'a> {
    line: usize,
    kind: &'a str,
    obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn get(&self, key: &'static str) -> Result<&Value, TraceError> {
        self.obj.get(key).ok_or_else(|| TraceError::MissingKey {
            line: self.line,
            instruction: self.kind.to_string(),
            key,
        })
    }

    fn bad(&self, key: &'static str, expected: &'static str, found: &Value) -> TraceError {
        TraceError::BadValue {
            line: self.line,
            instruction: self.kind.to_string(),
            key,
            expected,
            found: found.to_string(),
        }
    }

    fn str(&self, key: &'static str) -> Result<String, TraceError> {
        match self.get(key)? {
            Value::String(s) => Ok(s.clone()),
            other => Err(self.bad(key, "a string", other)),
        }
    }

    /// A non-negative integer written as a string (`"1728"`) or as a JSON number.
    fn u64(&self, key: &'static str) -> Result<u64, TraceError> {
        let v = self.get(key)?;
        let parsed = match v {
            Value::String(s) => s.trim().parse::<u64>().ok(),
            Value::Number(n) => n.as_u64(),
            _ => None,
        };
        parsed.ok_or_else(|| self.bad(key, "a non-negative integer", v))
    }

    /// An integer written as a string (`"-1"`) or as a JSON number.
    fn i64(&self, key: &'static str) -> Result<i64, TraceError> {
        let v = self.get(key)?;
        let parsed = match v {
            Value::String(s) => s.trim().parse::<i64>().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        };
        parsed.ok_or_else(|| self.bad(key, "an integer", v))
    }

    fn names(&self, key: &'static str) -> Result<Vec<String>, TraceError> {
        let v = self.get(key)?;
        let Value::Array(items) = v else {
            return Err(self.bad(key, "an array of names", v));
        };
        items
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                _ => Err(self.bad(key, "an array of names", v)),
            })
            .collect()
    }

    fn indices(&self, key: &'static str) -> Result<Vec<usize>, TraceError> {
        let v = self.get(key)?;
        let Value::Array(items) = v else {
            return Err(self.bad(key, "an array of argument indices", v));
        };
        items
            .iter()
            .map(|x| {
                let n = match x {
                    Value::Number(n) => n.as_u64(),
                    Value::String(s) => s.trim().parse::<u64>().ok(),
                    _ => None,
                };
                n.and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.bad(key, "an array of argument indices", v))
            })
            .collect()
    }
}
