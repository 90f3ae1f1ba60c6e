//! The default device (slot 0) takes the host tier's keys from
//! `REMAT_DTR_CONF`. One test in its own binary: the variable is set before
//! anything reads it, and no other thread reads the environment meanwhile.

use burn_ndarray::NdArray;
use burn_tensor::{Tensor, TensorData};
use remat_burn::{Dtr, DtrDevice};

type B = Dtr<NdArray>;

#[test]
fn remat_dtr_conf_turns_swap_on_for_the_default_device() {
    std::env::set_var(
        "REMAT_DTR_CONF",
        "budget:12000,budget_mode:logical,swap:on,host_budget:200%",
    );
    let device = DtrDevice::<NdArray>::default();
    assert_eq!(device.slot(), 0);
    // Five uploads of 4 000 B (roots) under 12 000 B: two live in the host
    // tier, within its 24 000 B.
    let values: Vec<Vec<f32>> = (0..5)
        .map(|k| (0..1000).map(|i| (i + k) as f32).collect())
        .collect();
    let ts: Vec<Tensor<B, 1>> = values
        .iter()
        .map(|v| Tensor::from_data(TensorData::new(v.clone(), [1000]), &device))
        .collect();
    let gbps = device
        .swap_bandwidth()
        .expect("swap on, bandwidth measured");
    assert!(gbps > 0.0);
    for (t, v) in ts.iter().zip(&values) {
        assert_eq!(&t.clone().into_data().to_vec::<f32>().unwrap(), v);
    }
    let s = device.stats();
    assert!(s.runtime.swap_outs >= 2 && s.runtime.swap_ins >= 2, "{s}");
    assert!(s.runtime.peak_host_bytes <= 24_000, "{s}");
    assert!(device.take_error().is_none());
}
