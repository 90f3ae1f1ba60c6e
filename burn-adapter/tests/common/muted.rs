//! Run a closure whose Burn reads may panic on a device error, with the
//! panic's message muted: remat's typed error is then read from the device
//! (`DtrDevice::take_error`), which is what the callers report.

/// Run `f`, catching a panic without printing it. The panic hook is
/// process-wide: it is swapped for a silent one for the call and restored
/// after, so a panic on another thread meanwhile is muted too.
pub fn catch_muted<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    got
}
