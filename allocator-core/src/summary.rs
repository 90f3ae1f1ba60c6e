//! `memory_summary()`: the table `torch.cuda.memory_summary()` prints.

use crate::stats::{DeviceStats, Stat, StatArray};

/// `_format_size`: scale by the peak so the columns of a row share a unit.
fn format_size(sz: i64, pref: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (mut sz, mut pref, mut i) = (sz, pref as f64, 0);
    while i + 1 < PREFIXES.len() && pref >= 768.0 * 1024.0 {
        sz /= 1024;
        pref /= 1024.0;
        i += 1;
    }
    format!("{sz:6} {}", PREFIXES[i])
}

/// `_format_count`.
fn format_count(cnt: i64, pref: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let (mut cnt, mut pref, mut i) = (cnt, pref as f64, 0);
    while i + 1 < PREFIXES.len() && pref >= 750.0 * 1000.0 {
        cnt /= 1000;
        pref /= 1000.0;
        i += 1;
    }
    format!("{cnt:7} {} ", PREFIXES[i])
}

fn row(name: &str, s: &Stat, fmt: fn(i64, i64) -> String) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        fmt(s.current, s.peak),
        fmt(s.peak, s.peak),
        fmt(s.allocated, s.allocated),
        fmt(s.freed, s.freed)
    )
}

fn array_rows(lines: &mut Vec<String>, name: &str, arr: &StatArray, fmt: fn(i64, i64) -> String) {
    lines.push(row(name, &arr.all, fmt));
    lines.push(row("      from large pool", &arr.large_pool, fmt));
    lines.push(row("      from small pool", &arr.small_pool, fmt));
    lines.push("-".repeat(75));
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

/// Renders the summary table for one device.
pub(crate) fn memory_summary(s: &DeviceStats, kind: &str, device: usize) -> String {
    // PyTorch's row names say "GPU"; other devices drop the word to keep the width.
    let unit = if kind == "CUDA" { "GPU " } else { "" };
    let mut lines = vec![
        "=".repeat(75),
        format!(
            " {:^73} ",
            format!("remat {kind} memory summary, device ID {device}")
        ),
        "-".repeat(75),
        format!(
            " {:<34} | {:<36} ",
            format!("{kind} OOMs: {}", s.num_ooms),
            format!("device alloc retries: {}", s.num_alloc_retries)
        ),
        "=".repeat(75),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
        "-".repeat(75),
    ];
    array_rows(
        &mut lines,
        "Allocated memory",
        &s.allocated_bytes,
        format_size,
    );
    array_rows(&mut lines, "Active memory", &s.active_bytes, format_size);
    array_rows(
        &mut lines,
        "Requested memory",
        &s.requested_bytes,
        format_size,
    );
    array_rows(
        &mut lines,
        &capitalize(&format!("{unit}reserved memory")),
        &s.reserved_bytes,
        format_size,
    );
    array_rows(
        &mut lines,
        "Non-releasable memory",
        &s.inactive_split_bytes,
        format_size,
    );
    array_rows(&mut lines, "Allocations", &s.allocation, format_count);
    array_rows(&mut lines, "Active allocs", &s.active, format_count);
    array_rows(
        &mut lines,
        &capitalize(&format!("{unit}reserved segments")),
        &s.segment,
        format_count,
    );
    array_rows(
        &mut lines,
        "Non-releasable allocs",
        &s.inactive_split,
        format_count,
    );
    lines.push(row(
        "Oversize allocations",
        &s.oversize_allocations,
        format_count,
    ));
    lines.push(row(
        &format!("Oversize {unit}segments"),
        &s.oversize_segments,
        format_count,
    ));
    lines.push("=".repeat(75));
    let mut out = String::new();
    for l in lines {
        out.push('|');
        out.push_str(&l);
        out.push_str("|\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_peak() {
        assert_eq!(format_size(1024, 1024), "  1024 B  ");
        assert_eq!(format_size(20 << 20, 20 << 20), " 20480 KiB");
        assert_eq!(format_size(2 << 30, 2 << 30), "  2048 MiB");
        assert_eq!(format_count(3, 3), "      3   ");
    }

    #[test]
    fn every_line_has_the_same_width() {
        let mut s = DeviceStats::new(usize::MAX);
        s.allocated_bytes.increase(false, 96 << 20);
        let t = memory_summary(&s, "CUDA", 0);
        assert!(t.contains("GPU reserved memory"));
        assert!(t.contains("Oversize GPU segments"));
        assert!(t.contains("Allocated memory"));
        let sim = memory_summary(&s, "simulated", 0);
        assert!(sim.contains("Reserved memory") && sim.contains("Oversize segments"));
        for l in t.lines().chain(sim.lines()) {
            assert_eq!(l.chars().count(), 77, "line {l:?}");
        }
    }
}
