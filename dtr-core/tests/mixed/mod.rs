//! A synthetic training step with activations of mixed sizes, shared by the
//! tests of the physical budget's online layouts (`online_arena.rs`,
//! `release_at_boundary.rs`): a forward chain of `layers`, a loss, a backward
//! reading each activation in reverse. A caching allocator fragments as its
//! storages are evicted and freed.

use remat_trace::{Trace, TraceBuilder};

/// KiB in bytes.
pub const KIB: u64 = 1 << 10;

/// The forward's activation sizes (bytes), by layer.
pub fn forward_size(i: usize) -> u64 {
    [3u64 << 10, 17 << 10, 9 << 10, 25 << 10, 6 << 10, 600][i % 6] * KIB
}

/// The step, whose backward op `i` makes a gradient of `backward_size(i)`
/// bytes.
pub fn mixed_step(layers: usize, backward_size: impl Fn(usize) -> u64) -> Trace {
    let mut t = TraceBuilder::new("mixed").constant("x", 256 * KIB);
    let mut prev = "x".to_string();
    for i in 0..layers {
        let a = format!("a{i}");
        t = t.call(
            "fwd",
            &[&prev],
            &a,
            forward_size(i),
            1_000 + 300 * (i as u64 % 3),
        );
        prev = a;
    }
    t = t.call("loss", &[&prev], "loss", KIB, 100).backward();
    let mut grad = "loss".to_string();
    for i in (0..layers).rev() {
        let a = format!("a{i}");
        let g = format!("g{i}");
        t = t
            .call("bwd", &[&grad, &a], &g, backward_size(i), 2_000)
            .release(&grad)
            .release(&a);
        grad = g;
    }
    t.release(&grad).build().expect("the step replays")
}
