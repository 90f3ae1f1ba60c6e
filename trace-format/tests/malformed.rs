//! Malformed input is a typed error naming the line, never a panic.

use proptest::prelude::*;
use remat_trace::{baseline, storage_lifetimes, Instruction, Trace, TraceError};

const OK: &str = r#"{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["a","v"],"TIME":"7"}
{"INSTRUCTION":"MEMORY","MEMORY":"40","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"v"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"v"}
{"ARGS":["a","w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"3"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
"#;

fn err(text: &str) -> TraceError {
    Trace::parse("t", text).expect_err("should be rejected")
}

fn with_line(n: usize, line: &str) -> String {
    let mut lines: Vec<&str> = OK.lines().collect();
    lines[n - 1] = line;
    lines.join("\n")
}

#[test]
fn the_fixture_is_valid() {
    let t = Trace::parse("t", OK).unwrap();
    let b = baseline(&t).unwrap();
    assert_eq!(
        (b.peak_bytes, b.compute_ns, b.constant_bytes),
        (140, 10, 100)
    );
}

#[test]
fn bad_json() {
    let e = err(&with_line(3, "{not json"));
    assert!(matches!(e, TraceError::Json { line: 3, .. }), "{e}");
    let e = err(&with_line(2, "[1,2]"));
    assert!(matches!(e, TraceError::Json { line: 2, .. }), "{e}");
}

#[test]
fn missing_keys() {
    let e = err(&with_line(2, r#"{"INSTRUCTION":"MEMORY","NAME":"w"}"#));
    assert!(
        matches!(
            e,
            TraceError::MissingKey {
                line: 2,
                key: "MEMORY",
                ..
            }
        ),
        "{e}"
    );
    let e = err(&with_line(1, r#"{"NAME":"w"}"#));
    assert!(
        matches!(
            e,
            TraceError::MissingKey {
                line: 1,
                key: "INSTRUCTION",
                ..
            }
        ),
        "{e}"
    );
    let e = err(&with_line(
        3,
        r#"{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"relu","TIME":"7"}"#,
    ));
    assert!(
        matches!(
            e,
            TraceError::MissingKey {
                line: 3,
                key: "RESULT",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn unknown_instruction() {
    let e = err(&with_line(9, r#"{"INSTRUCTION":"FREE","NAME":"a"}"#));
    assert!(
        matches!(e, TraceError::UnknownInstruction { line: 9, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("FREE"));
}

#[test]
fn non_numeric_memory() {
    for bad in [r#""12x""#, r#""-5""#, "null", "1.5", r#""""#] {
        let line = format!(r#"{{"INSTRUCTION":"MEMORY","MEMORY":{bad},"NAME":"w"}}"#);
        let e = err(&with_line(2, &line));
        assert!(
            matches!(
                e,
                TraceError::BadValue {
                    line: 2,
                    key: "MEMORY",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.line(), Some(2));
    }
    let e = err(&with_line(
        3,
        r#"{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["a","v"],"TIME":"fast"}"#,
    ));
    assert!(
        matches!(
            e,
            TraceError::BadValue {
                line: 3,
                key: "TIME",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn numbers_as_json_numbers_are_accepted() {
    let text = OK.replace(r#""MEMORY":"100""#, r#""MEMORY":100"#);
    assert_eq!(
        baseline(&Trace::parse("t", &text).unwrap())
            .unwrap()
            .peak_bytes,
        140
    );
}

#[test]
fn unknown_names() {
    let e = err(&with_line(9, r#"{"INSTRUCTION":"RELEASE","NAME":"zz"}"#));
    assert!(
        matches!(e, TraceError::UnknownName { line: 9, ref name, .. } if name == "zz"),
        "{e}"
    );
    let e = err(&with_line(
        3,
        r#"{"ARGS":["q"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["a","v"],"TIME":"7"}"#,
    ));
    assert!(matches!(e, TraceError::UnknownName { line: 3, .. }), "{e}");
    let e = err(&format!(
        "{OK}{}",
        r#"{"DST":"b","INSTRUCTION":"COPY","SRC":"a"}"#
    ));
    assert!(matches!(e, TraceError::UnknownName { line: 10, .. }), "{e}");
    let e = err(&format!(
        "{OK}{}",
        r#"{"DST":"nope","INSTRUCTION":"COPY_FROM","SRC":"w"}"#
    ));
    assert!(matches!(e, TraceError::UnknownName { line: 10, .. }), "{e}");
}

#[test]
fn structural_violations() {
    // MEMORY for a name that is not pending.
    let e = err(&with_line(
        4,
        r#"{"INSTRUCTION":"MEMORY","MEMORY":"40","NAME":"zz"}"#,
    ));
    assert!(matches!(e, TraceError::Invalid { line: 4, .. }), "{e}");
    // ALIAS index out of range.
    let e = err(&with_line(
        7,
        r#"{"ALIAS":"1","INSTRUCTION":"ALIAS","NAME":"v"}"#,
    ));
    assert!(matches!(e, TraceError::Invalid { line: 7, .. }), "{e}");
    let e = err(&with_line(
        7,
        r#"{"ALIAS":"-2","INSTRUCTION":"ALIAS","NAME":"v"}"#,
    ));
    assert!(matches!(e, TraceError::Invalid { line: 7, .. }), "{e}");
    // MUTATE index out of range.
    let e = err(&with_line(
        8,
        r#"{"ARGS":["a","w"],"INSTRUCTION":"MUTATE","MUTATE":[2],"NAME":"add_","TIME":"3"}"#,
    ));
    assert!(matches!(e, TraceError::Invalid { line: 8, .. }), "{e}");
    // A name bound twice.
    let e = err(&format!(
        "{OK}{}",
        r#"{"DST":"w","INSTRUCTION":"COPY","SRC":"v"}"#
    ));
    assert!(matches!(e, TraceError::Invalid { line: 10, .. }), "{e}");
    // A result that never gets its ALIAS: reported at its CALL.
    let text: Vec<&str> = OK.lines().take(6).collect();
    let e = err(&text.join("\n"));
    assert!(matches!(e, TraceError::Invalid { line: 3, .. }), "{e}");
}

#[test]
fn blank_lines_keep_file_line_numbers() {
    let text = format!(
        "\n\n{}",
        with_line(9, r#"{"INSTRUCTION":"RELEASE","NAME":"zz"}"#)
    );
    assert!(matches!(
        err(&text),
        TraceError::UnknownName { line: 11, .. }
    ));
}

#[test]
fn unchecked_parse_then_replay_reports_the_position() {
    let t = Trace::parse_unchecked(
        "t",
        &with_line(9, r#"{"INSTRUCTION":"RELEASE","NAME":"zz"}"#),
    )
    .unwrap();
    assert!(matches!(
        storage_lifetimes(&t),
        Err(TraceError::UnknownName { line: 9, .. })
    ));
    let t = Trace {
        name: "hand".into(),
        instructions: vec![Instruction::Release { name: "x".into() }],
    };
    assert!(matches!(
        baseline(&t),
        Err(TraceError::UnknownName { line: 1, .. })
    ));
}

#[test]
fn missing_file_is_an_io_error() {
    let e = Trace::load(std::path::Path::new("/nonexistent/resnet32-1.log")).unwrap_err();
    assert!(matches!(e, TraceError::Io { .. }));
    assert_eq!(e.line(), None);
}

proptest! {
    /// Arbitrary text, and arbitrary single-line corruptions of a valid trace,
    /// never panic.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = Trace::parse("t", &text);
    }

    #[test]
    fn corrupted_lines_never_panic(n in 1usize..=9, junk in r#"[{}\[\]":,A-Z_0-9a-z -]{0,60}"#) {
        let _ = Trace::parse("t", &with_line(n, &junk));
    }

    #[test]
    fn shuffled_lines_never_panic(seed in any::<u64>()) {
        let mut lines: Vec<&str> = OK.lines().collect();
        let mut s = seed;
        for i in (1..lines.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lines.swap(i, (s >> 33) as usize % (i + 1));
        }
        if let Ok(t) = Trace::parse("t", &lines.join("\n")) {
            baseline(&t).unwrap();
        }
    }
}
