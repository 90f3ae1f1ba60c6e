//! What the language-model examples (`decoder_lm`, `qwen2_lm`) share around
//! their models: command-line sizes, deterministic weights, parameter bits.
#![allow(dead_code)]

use std::collections::BTreeMap;

use candle_core::{Result, Tensor};
use candle_nn::VarMap;

/// The positive integer after `name` on the command line, or `default`.
pub fn arg(name: &str, default: usize) -> std::result::Result<usize, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|v: &usize| *v > 0)
            .ok_or_else(|| format!("{name} needs a positive integer")),
    }
}

/// Bytes in MiB.
pub fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// Deterministic weights for every variable not `kept` (SplitMix64 seeded by
/// the name, uniform in ±1/√fan-in): the same start for every run.
pub fn seeded_init(varmap: &VarMap, kept: impl Fn(&str) -> bool) -> Result<()> {
    for (name, var) in varmap.data().lock().expect("varmap lock").iter() {
        if kept(name) {
            continue;
        }
        let mut s = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let scale = 1.0 / (var.dims()[var.rank() - 1] as f32).sqrt();
        let v: Vec<f32> = (0..var.elem_count())
            .map(|_| {
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                scale * (2.0 * ((z >> 40) as f32 / (1u64 << 24) as f32) - 1.0)
            })
            .collect();
        var.set(&Tensor::from_vec(v, var.shape(), var.device())?)?;
    }
    Ok(())
}

/// Every variable's bits, by name.
pub fn snapshot(varmap: &VarMap) -> Result<BTreeMap<String, Vec<u32>>> {
    let data = varmap.data().lock().expect("varmap lock");
    data.iter()
        .map(|(k, v)| {
            let bits = v.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            Ok((k.clone(), bits.into_iter().map(f32::to_bits).collect()))
        })
        .collect()
}
