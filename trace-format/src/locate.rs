//! Finding the trace files, which live outside the repository.

use std::path::{Path, PathBuf};

use crate::Trace;

/// The environment variable that points at a directory of trace files.
pub const TRACES_DIR_ENV: &str = "REMAT_TRACES_DIR";

/// The directory holding the DTR-paper traces, first found of:
///
/// 1. `$REMAT_TRACES_DIR`, if it is set and is a directory;
/// 2. `../shared/traces/dtr-paper` relative to the current directory;
/// 3. `shared/traces/dtr-paper` relative to the current directory;
/// 4. `../shared/traces/dtr-paper` relative to the workspace root (where this
///    crate was compiled).
///
/// `None` if none of them is a directory.
pub fn traces_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(TRACES_DIR_ENV) {
        let dir = PathBuf::from(dir);
        if dir.is_dir() {
            return Some(dir);
        }
    }
    shared_dirs("dtr-paper").into_iter().find(|p| p.is_dir())
}

/// Where `../shared/traces/<kind>` may be: beside the current directory,
/// under it, and beside the workspace root (where this crate was compiled).
fn shared_dirs(kind: &str) -> [PathBuf; 3] {
    [
        PathBuf::from(format!("../shared/traces/{kind}")),
        PathBuf::from(format!("shared/traces/{kind}")),
        PathBuf::from(format!(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces/{}"),
            kind
        )),
    ]
}

/// A test's traces are absent: under `CI=true` a panic naming `what` and
/// where it is looked for (`hint`), else a message on stderr and `None`.
fn absent(test_name: &str, what: &str, hint: &str) -> Option<PathBuf> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test_name}: {what} not found; {hint}");
    }
    eprintln!("skipping {test_name}: {what} not found (set {TRACES_DIR_ENV})");
    None
}

/// The `*.log` files in [`traces_dir`], sorted by file name; empty if there is no
/// traces directory.
pub fn trace_files() -> Vec<PathBuf> {
    traces_dir().map(|dir| log_files(&dir)).unwrap_or_default()
}

/// The `*.log` files in `dir`, sorted by file name; empty if it cannot be read.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    files
}

/// Resolves a trace given as a path to an existing file, or as a short name
/// (`"resnet32"`, matched against [`Trace::name_of`] of the files in
/// [`traces_dir`], then as a file-name prefix). `None` if nothing matches.
pub fn find_trace(name_or_path: &str) -> Option<PathBuf> {
    let as_path = Path::new(name_or_path);
    if as_path.is_file() {
        return Some(as_path.to_path_buf());
    }
    let files = trace_files();
    if let Some(p) = files.iter().find(|p| Trace::name_of(p) == name_or_path) {
        return Some(p.clone());
    }
    files.into_iter().find(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(name_or_path))
    })
}

/// For tests that need the traces: `Some(dir)` when [`traces_dir`] finds them.
///
/// When they are absent: if the environment variable `CI` is `"true"` this panics
/// (a CI run must not silently skip), with a message naming `REMAT_TRACES_DIR`;
/// otherwise it prints `skipping {test_name}: traces not found (set
/// REMAT_TRACES_DIR)` to stderr and returns `None`.
pub fn require_traces(test_name: &str) -> Option<PathBuf> {
    traces_dir().or_else(|| {
        absent(
            test_name,
            "traces",
            &format!(
                "the DTR-paper traces: set {TRACES_DIR_ENV} to the directory holding them \
                 (e.g. shared/traces/dtr-paper)"
            ),
        )
    })
}

/// The directory holding the PyTorch-logged traces (`traces/torch` beside
/// `traces/dtr-paper`), first found of:
///
/// 1. `torch` beside `$REMAT_TRACES_DIR`, if that is set;
/// 2. `../shared/traces/torch` and `shared/traces/torch` relative to the
///    current directory;
/// 3. `../shared/traces/torch` relative to the workspace root.
///
/// `None` if none of them is a directory.
pub fn torch_traces_dir() -> Option<PathBuf> {
    let beside = std::env::var_os(TRACES_DIR_ENV)
        .map(PathBuf::from)
        .and_then(|d| d.parent().map(|p| p.join("torch")));
    (beside.into_iter())
        .chain(shared_dirs("torch"))
        .find(|p| p.is_dir())
}

/// For tests that need one of the PyTorch-logged traces: the `*.log` file in
/// [`torch_traces_dir`] whose name starts with `name` (`"t5_small"` finds
/// `t5_small-20.log`). When it is absent, as [`require_traces`]: a panic under
/// `CI=true`, else a message on stderr and `None`.
pub fn require_torch_trace(test_name: &str, name: &str) -> Option<PathBuf> {
    let prefix = format!("{name}-");
    let found = torch_traces_dir().and_then(|dir| {
        log_files(&dir).into_iter().find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
    });
    found.or_else(|| {
        absent(
            test_name,
            &format!("trace {name}"),
            &format!(
                "the PyTorch-logged traces are looked for in `torch` beside {TRACES_DIR_ENV} \
                 (e.g. shared/traces/torch)"
            ),
        )
    })
}
