//! Helpers shared by the config module's tests.

use super::{AllocatorConfig, ConfigError};

pub(super) fn cfg(s: &str) -> AllocatorConfig {
    match AllocatorConfig::parse(s) {
        Ok(c) => c,
        Err(e) => panic!("{s:?} should parse: {e}"),
    }
}

pub(super) fn err(s: &str) -> ConfigError {
    match AllocatorConfig::parse(s) {
        Ok(c) => panic!("{s:?} should be rejected, got {c:?}"),
        Err(e) => e,
    }
}

pub(super) fn table(s: &str) -> [usize; 16] {
    cfg(s).roundup_power2_divisions
}

pub(super) fn assert_round_trip(c: &AllocatorConfig) {
    let s = c.to_string();
    match AllocatorConfig::parse(&s) {
        Ok(back) => {
            assert_eq!(
                AllocatorConfig {
                    last_settings: c.last_settings.clone(),
                    ..back
                },
                *c,
                "{s}"
            )
        }
        Err(e) => panic!("{c:?} displays as {s:?}, which fails: {e}"),
    }
}
