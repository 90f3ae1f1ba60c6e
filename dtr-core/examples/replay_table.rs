//! Overhead table for one trace: `cargo run --release -p remat-dtr --example
//! replay_table -- <trace> <ratios> <policies> <modes> [REMAT_DTR_CONF text]`, e.g.
//! `-- lstm 0.5,0.4,0.3 remat,dtr logical,physical sampling:off`.
//! Each cell is the overhead (or `oom`/`thrash`) and the replay's wall time.

use remat_dtr::replay::replay_ratio;
use remat_dtr::{BudgetMode, DtrConfig, PolicyKind};
use remat_trace::{find_trace, Trace};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: replay_table <trace> <ratios> <policies> <modes> [conf]");
        std::process::exit(2);
    }
    let trace = Trace::load(&find_trace(&a[1]).unwrap()).unwrap();
    let ratios: Vec<f64> = a[2].split(',').map(|x| x.parse().unwrap()).collect();
    let policies: Vec<PolicyKind> = a[3].split(',').map(|x| x.parse().unwrap()).collect();
    let modes: Vec<BudgetMode> = a[4].split(',').map(|x| x.parse().unwrap()).collect();
    let base = DtrConfig::parse(a.get(5).map(String::as_str).unwrap_or("")).unwrap();
    for m in &modes {
        for p in &policies {
            let mut line = format!("{:9} {:10}", m.name(), p.name());
            for r in &ratios {
                let rep = replay_ratio(&trace, *r, *m, *p, &base).unwrap();
                line += &format!(
                    " {:>6}{:>7.0}ms",
                    if rep.status.name() == "ok" {
                        format!("{:.3}", rep.overhead)
                    } else {
                        rep.status.name().to_string()
                    },
                    rep.wall_ms
                );
            }
            println!("{line}");
        }
    }
}
