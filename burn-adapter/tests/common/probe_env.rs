//! Settings of the by-hand probes (`policy_probe.rs`, `ctc_grad.rs`), read from
//! the environment.

/// `key` parsed from the environment, or `default` when it is unset; a value
/// that does not parse stops the probe with its name.
pub fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v} does not parse")),
        Err(_) => default,
    }
}
